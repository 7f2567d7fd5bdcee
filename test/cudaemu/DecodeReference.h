//===- DecodeReference.h - Host reference of a split decode's outputs -----===//
//
// checkDecodeOutputs: the outputs of a split decode kernel for one query
// head (its logits and its split partial records) against a reference in
// double precision computed from the rows the kernel must see:
//  - every slot's logit within 2e-5 (absolute, logits of order 1), -inf
//    for a free slot (an empty row) and `sentinel` left past the head's
//    slots;
//  - the split records merged on the host (M = max m_s, Z = sum z_s
//    e^(m_s - M), out = sum acc_s e^(m_s - M) / Z) within 2e-5 of the
//    softmax-weighted value sum, Z e^M within 2e-5 relative of
//    sum_i e^(l_i), and an empty split's sum 0.
// A difference fails through CHECK (EmuCheck.h), the message led by
// `label`. DecodeBatch holds the rest that the kernel tests share: device
// allocations, head tables, the query rows, the output buffers, and the
// check of every (head, query head), and the check of the merge that the
// last block of each head runs in a decode without statistics
// (checkMergeInLastSplit). Used by DecodeKernelTest.cu and
// KiviDecodeTest.cu.
//
//===----------------------------------------------------------------------===//

#ifndef KVC_TEST_CUDAEMU_DECODEREFERENCE_H
#define KVC_TEST_CUDAEMU_DECODEREFERENCE_H

#include "runtime/kvc_cuda.cuh"
#include "test/cudaemu/EmuCheck.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <vector>

/// The split records of one query head (`records`, the next split's
/// `splitStride` floats on, {m, z, acc[D]} each) merged in double
/// precision: M = max m_s, Z = sum z_s e^(m_s - M), acc = sum acc_s
/// e^(m_s - M), and per channel the sum of the terms' magnitudes. Empty
/// splits (m = -inf) add nothing.
struct HostMerge {
  double m = -INFINITY, z = 0.0;
  std::vector<double> acc, size;
  HostMerge(int D, const float *records, int32_t numSplits,
            int64_t splitStride)
      : acc(D, 0.0), size(D, 0.0) {
    for (int32_t s = 0; s < numSplits; ++s)
      m = std::max(m, static_cast<double>(records[s * splitStride]));
    for (int32_t s = 0; s < numSplits; ++s) {
      const float *r = records + s * splitStride;
      if (r[0] == -INFINITY)
        continue;
      const double f = std::exp(r[0] - m);
      z += r[1] * f;
      for (int c = 0; c < D; ++c) {
        acc[c] += r[2 + c] * f;
        size[c] += std::fabs(r[2 + c] * f);
      }
    }
  }
};

/// The largest differences from the reference that a check saw: of a
/// logit and of an output channel (absolute).
struct DecodeErrors {
  double logit = 0.0, output = 0.0;
  void add(const DecodeErrors &e) {
    logit = std::max(logit, e.logit);
    output = std::max(output, e.output);
  }
};

/// `q`: the query head's D floats; `keys`, `values`: per slot of the head,
/// D channels (empty: free slot); `logits`: the head's row of `stride`;
/// `records`: the query head's record of split 0, the next split's
/// `splitStride` floats on ({m, z, acc[D]} each). Returns the largest
/// differences it saw.
template <typename Row>
DecodeErrors checkDecodeOutputs(const char *label, int D, const float *q,
                                const std::vector<Row> &keys,
                                const std::vector<Row> &values, float scale,
                                const float *logits, int64_t stride,
                                float sentinel, const float *records,
                                int32_t numSplits, int64_t splitStride) {
  const int32_t n = static_cast<int32_t>(keys.size());
  DecodeErrors errors;
  std::vector<double> l(n, -INFINITY);
  double lmax = -INFINITY;
  for (int32_t s = 0; s < n; ++s) {
    if (keys[s].empty())
      continue;
    double dot = 0.0;
    for (int c = 0; c < D; ++c)
      dot += static_cast<double>(q[c]) * keys[s][c];
    l[s] = dot * scale;
    lmax = std::max(lmax, l[s]);
  }
  double z = 0.0;
  std::vector<double> out(D, 0.0);
  for (int32_t s = 0; s < n; ++s) {
    if (keys[s].empty()) {
      CHECK(logits[s] == -INFINITY, "%s: free slot %d has logit %g", label,
            s, logits[s]);
      continue;
    }
    CHECK(std::fabs(logits[s] - l[s]) <= 2e-5,
          "%s: logit of slot %d is %.7g, reference %.7g", label, s, logits[s],
          l[s]);
    errors.logit = std::max(errors.logit, std::fabs(logits[s] - l[s]));
    const double w = std::exp(l[s] - lmax);
    z += w;
    for (int c = 0; c < D; ++c)
      out[c] += w * values[s][c];
  }
  for (int64_t s = n; s < stride; ++s)
    CHECK(logits[s] == sentinel,
          "%s: logit written past the head's slots at %lld", label,
          static_cast<long long>(s));
  for (int32_t s = 0; s < numSplits; ++s) {
    const float *r = records + s * splitStride;
    if (r[0] == -INFINITY)
      CHECK(r[1] == 0.0f, "%s: empty split %d has sum %g", label, s, r[1]);
  }
  const HostMerge merge(D, records, numSplits, splitStride);
  const double bz = merge.z;
  const std::vector<double> &acc = merge.acc;
  const double total = z * std::exp(lmax), merged = bz * std::exp(merge.m);
  CHECK(std::fabs(merged - total) <= 2e-5 * total,
        "%s: sum of e^l is %.9g, reference %.9g", label, merged, total);
  for (int c = 0; c < D; ++c) {
    const double want = out[c] / z, have = acc[c] / bz;
    CHECK(std::fabs(have - want) <= 2e-5,
          "%s: output channel %d is %.7g, reference %.7g", label, c, have,
          want);
    errors.output = std::max(errors.output, std::fabs(have - want));
  }
  return errors;
}

/// The device side of a decode kernel test over heads of `slots[h]` slots,
/// G query heads each, D channels, splits of `splitSlots`: zeroed
/// allocations freed together, and the kernel's query rows, logits (rows of
/// the longest head's slots + 3, filled with kSentinel) and split records.
struct DecodeBatch {
  static constexpr float kSentinel = 12345.0f;
  int G, D;
  int32_t heads, splitSlots, numSplits = 0;
  int64_t stride = 0;
  std::vector<void *> allocations;
  float *q = nullptr, *logits = nullptr, *partials = nullptr;

  DecodeBatch(int G, int D, const std::vector<int32_t> &slots,
              int32_t splitSlots)
      : G(G), D(D), heads(static_cast<int32_t>(slots.size())),
        splitSlots(splitSlots) {
    int32_t maxSlots = 0;
    for (int32_t n : slots)
      maxSlots = std::max(maxSlots, n);
    numSplits = (maxSlots + splitSlots - 1) / splitSlots;
    stride = maxSlots + 3;
    const size_t logitCount = static_cast<size_t>(heads) * G * stride;
    logits = static_cast<float *>(alloc(4 * logitCount));
    for (size_t i = 0; i < logitCount; ++i)
      logits[i] = kSentinel;
    partials = static_cast<float *>(
        alloc(4ull * heads * numSplits * G * (D + 2)));
  }
  DecodeBatch(const DecodeBatch &) = delete;
  DecodeBatch &operator=(const DecodeBatch &) = delete;
  ~DecodeBatch() {
    for (void *p : allocations)
      cudaFree(p);
  }

  /// Device memory the host reads and writes directly: the emulator's,
  /// or managed memory on a GPU (gpu.kernel.*; the tests synchronize
  /// before they look).
  void *alloc(uint64_t bytes) {
    void *p = nullptr;
#if defined(KVC_CUDA_EMULATED)
    CHECK(cudaMalloc(&p, bytes) == cudaSuccess, "cudaMalloc");
#else
    CHECK(cudaMallocManaged(&p, bytes) == cudaSuccess, "cudaMallocManaged");
#endif
    std::memset(p, 0, bytes);
    allocations.push_back(p);
    return p;
  }
  template <typename T> T *copy(const std::vector<T> &host) {
    auto *d = static_cast<T *>(alloc(sizeof(T) * host.size()));
    std::memcpy(d, host.data(), sizeof(T) * host.size());
    return d;
  }
  /// A head of positions.size() slots over `pages` (0: a hole).
  kvc::cuda::HeadTable table(const std::vector<uint64_t> &pages,
                             const std::vector<int32_t> &positions) {
    kvc::cuda::HeadTable t{};
    t.pages = copy(pages);
    t.positions = copy(positions);
    t.numSlots = static_cast<int32_t>(positions.size());
    t.numPages = static_cast<int32_t>(pages.size());
    return t;
  }
  /// The kernel's arguments, with the query rows `hostQ` (heads x G x D).
  kvc::cuda::DecodeSplitArgs
  args(const std::vector<kvc::cuda::HeadTable> &tables,
       const kvc::cuda::PageLayout &layout, const std::vector<float> &hostQ,
       float scale) {
    q = copy(hostQ);
    return kvc::cuda::DecodeSplitArgs{copy(tables), layout,    q,
                                      scale,        splitSlots, numSplits,
                                      stride,       logits,    partials};
  }
  /// Runs `launch(args)` again without a logits row (a decode whose
  /// statistics do not read them, kvc-emit's plain decode): every split
  /// record must be the run's before it, bit for bit, and not one logit
  /// written. Call it after check().
  template <typename Launch>
  void checkWithoutLogits(const char *prefix, kvc::cuda::DecodeSplitArgs args,
                          Launch launch) {
    const size_t records = static_cast<size_t>(heads) * numSplits * G * (D + 2);
    const size_t logitCount = static_cast<size_t>(heads) * G * stride;
    const std::vector<float> withLogits(partials, partials + records);
    std::memset(partials, 0, sizeof(float) * records);
    for (size_t i = 0; i < logitCount; ++i)
      logits[i] = kSentinel;
    args.logits = nullptr;
    launch(args);
    CHECK(cudaDeviceSynchronize() == cudaSuccess, "launch without logits");
    CHECK(std::memcmp(withLogits.data(), partials, sizeof(float) * records) ==
              0,
          "%s: the split records without logits differ from those with them",
          prefix);
    for (size_t i = 0; i < logitCount; ++i)
      CHECK(logits[i] == kSentinel,
            "%s: a logit was stored without a logits row (%zu)", prefix, i);
  }
  /// Runs `launch(args)` again with a merge in the last block of each head
  /// (DecodeSplitArgs::mergeOut, a fresh arrival counter per head), as a
  /// decode without statistics does: the split records must be the run's
  /// before it, bit for bit, and each head's G output rows the records
  /// merged on the host in double precision, within 1e-6 of the larger of 1
  /// and the sum of the terms' magnitudes (the device sums the splits in
  /// float). Call it after check().
  template <typename Launch>
  void checkMergeInLastSplit(const char *prefix,
                             kvc::cuda::DecodeSplitArgs args,
                             const std::vector<kvc::cuda::HeadTable> &tables,
                             Launch launch) {
    const int record = D + 2; // kvc::cuda::partialFloats<D>()
    const size_t records = static_cast<size_t>(heads) * numSplits * G * record;
    const std::vector<float> before(partials, partials + records);
    std::vector<kvc::cuda::HeadTable> counted = tables;
    auto *arrivals = static_cast<int32_t *>(alloc(4ull * heads));
    for (int32_t h = 0; h < heads; ++h)
      counted[h].arrivals = arrivals + h;
    const size_t outputs = static_cast<size_t>(heads) * G * D;
    auto *out = static_cast<float *>(alloc(4 * (outputs + 1)));
    for (size_t i = 0; i <= outputs; ++i)
      out[i] = kSentinel;
    std::memset(partials, 0, sizeof(float) * records);
    args.heads = copy(counted);
    args.mergeOut = out;
    launch(args);
    CHECK(cudaDeviceSynchronize() == cudaSuccess, "launch with the merge");
    CHECK(std::memcmp(before.data(), partials, sizeof(float) * records) == 0,
          "%s: the split records with the merge differ from those without it",
          prefix);
    for (int32_t h = 0; h < heads; ++h) {
      CHECK(arrivals[h] == numSplits, "%s head %d: %d of %d blocks arrived",
            prefix, h, arrivals[h], numSplits);
      for (int g = 0; g < G; ++g) {
        const float *r =
            partials + (static_cast<size_t>(h) * numSplits * G + g) * record;
        const HostMerge merge(D, r, numSplits,
                              static_cast<int64_t>(G) * record);
        const float *row = out + (static_cast<size_t>(h) * G + g) * D;
        for (int c = 0; c < D; ++c) {
          const double want = merge.acc[c] / merge.z;
          CHECK(std::fabs(row[c] - want) <=
                    1e-6 * std::max(1.0, merge.size[c] / merge.z),
                "%s head %d g %d: merged channel %d is %.9g, reference %.9g",
                prefix, h, g, c, row[c], want);
        }
      }
    }
    CHECK(out[outputs] == kSentinel, "%s: the merge wrote past its rows",
          prefix);
  }
  /// checkDecodeOutputs for every (head, query head), labelled
  /// "<prefix> head h g g"; keys[h] and values[h] per slot of head h.
  /// Returns the largest differences over them.
  template <typename Row>
  DecodeErrors check(const char *prefix,
                     const std::vector<std::vector<Row>> &keys,
                     const std::vector<std::vector<Row>> &values, float scale) {
    const int record = D + 2; // kvc::cuda::partialFloats<D>()
    DecodeErrors errors;
    for (int32_t h = 0; h < heads; ++h)
      for (int g = 0; g < G; ++g) {
        char label[128];
        std::snprintf(label, sizeof label, "%s head %d g %d", prefix, h, g);
        const size_t row = static_cast<size_t>(h) * G + g;
        errors.add(checkDecodeOutputs(
            label, D, q + row * D, keys[h], values[h], scale,
            logits + row * stride, stride, kSentinel,
            partials + (static_cast<size_t>(h) * numSplits * G + g) * record,
            numSplits, static_cast<int64_t>(G) * record));
      }
    return errors;
  }
};

#endif // KVC_TEST_CUDAEMU_DECODEREFERENCE_H
