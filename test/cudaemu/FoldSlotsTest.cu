//===- FoldSlotsTest.cu - The decode fold's per-slot statistics ----------===//
//
// The slot work of the generated decodeFold kernel (runtime/kvc_cuda.cuh),
// run on the emulator for G = 1, 4 and 8 and checked against host
// references computed here from the definitions, with M and 1/Z given:
//  - foldAccumulated (state <- decay * state + reduce_g p_g, sum, mean and
//    max), foldPersistence (bits <- bits << 1 | (reduce_g p_g > threshold)),
//    foldWindowSum (state <- state, or 0 at a restart, + mean_g p_g) on the
//    live slots only, and writeProbabilities (p_g = e^(l_g - M_g) / Z_g, 0
//    for a free slot's logit -infinity) on every slot of the range; slots
//    past the head's numSlots and the rows' padding keep their sentinel.
//    Heads of 3001 slots in one block (several passes of foldUnroll<G>()
//    slots per thread at every G), in splits of 513 and 256, and of 100
//    slots in one split; and heads of 700 free slots whose M is -inf and
//    1/Z 0 (as splitStatistics leaves them), whose weights are all 0;
//  - forSlotLines (the lines prefetchSlotLines asks L2 for): over every
//    thread of a block, each 128-byte line of the range's elements of each
//    array row is named exactly once, by an address inside the range; none
//    for an empty range or a null array; firstPasses, the slots of a
//    block's first kFoldAhead passes (what the fold kernel asks L2 for);
//  - the fold's L2 requests over a block's whole range (the emulator's
//    prefetch log): prefetchSlotLines over firstPasses, then foldSlots
//    (under foldAccumulated, 4-byte state, and foldPersistence, 8-byte
//    bits), ask for each line of the range's positions, values and G logit
//    rows exactly once, by an address in the range, at G = 1, 4 and 8,
//    for ranges shorter and longer than the first passes (on the
//    emulator only);
//  - discardRowLines (the fold's logits leaving L2): over rows that start
//    on a line and off one, the lines wholly inside each row's range are
//    discarded (0xff bytes on the emulator), each once; every other float
//    keeps its value, the lines a range shares with its neighbours
//    included;
//  - the merge of a head's split records by the fold blocks
//    (splitStatistics, then mergeOutput's part blockIdx.y of gridDim.y)
//    for 1 to 64 splits, some of them empty, cut in 1, 2, 3, 5 and as
//    many parts as splits (both of mergeOutput's ways: an entry's splits
//    by one thread, or spread over several): every output entry of the
//    head written, within a relative 1e-5 of a double-precision merge,
//    and nothing outside the head's rows;
//  - planFold: at least one block a head, at most the attention's splits
//    and as many as one wave of kFoldBlocksPerSM blocks a SM holds (for
//    more than one block a head), ranges of whole 32-slot multiples that
//    cover the head, and the plans of the benchmark's cells on 132 SMs;
//  - planSplits, the attention's splits: by length without a wave (a
//    split per 256 slots, 1 to 64), and with one the most splits, at most
//    the length's, whose modelled time (waves x slots a split) lies within
//    1/16 of the least over every count: exact plans of 4k cells (924
//    blocks at once: 7 blocks of the G = 1 decode on 132 SMs; 528: 4 of
//    the tensor-core decode at head dim 128, 396: 3 of it with the query
//    in registers), of the benchmark's cells that
//    docs/codegen-cuda.md lists, and the properties over a grid of shapes;
//    residentBlocks: the emulated SM's blocks (2,048 threads, at most 32).
// Float results within a relative 1e-6 of the reference (the device code
// and the reference are the same float expressions; a compiler may contract
// a multiply-add differently); a persistence bit may differ only where the
// reference weight lies within 1e-6 of the threshold. Exits 1 on the first
// difference.
//
//===----------------------------------------------------------------------===//

#include "runtime/kvc_cuda.cuh"
#include "test/cudaemu/EmuCheck.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <tuple>
#include <utility>
#include <vector>

namespace {

constexpr int kThreads = kvc::cuda::kFoldThreads;

/// The slot work of a fold block over the range foldRange gives it, with
/// the merged M and 1/Z of the G query heads taken from `maxIn`, `invIn`.
template <int G>
__global__ void __launch_bounds__(kThreads)
    foldBlock(const int32_t *positions, float *state, uint64_t *bits,
              float *window, const float *logits, float *probs, int64_t stride,
              int32_t numSlots, int32_t slotsPerSplit, const float *maxIn,
              const float *invIn, float decay, float threshold,
              kvc::cuda::Reduce kind, bool restart) {
  __shared__ float maxLogit[G], invSum[G];
  if (threadIdx.x < G) {
    maxLogit[threadIdx.x] = maxIn[threadIdx.x];
    invSum[threadIdx.x] = invIn[threadIdx.x];
  }
  __syncthreads();
  const kvc::cuda::SlotRange r =
      kvc::cuda::foldRange(numSlots, slotsPerSplit, blockIdx.y);
  kvc::cuda::foldAccumulated<G, kThreads>(positions, state, r, logits, stride,
                                          maxLogit, invSum, decay, kind);
  kvc::cuda::foldPersistence<G, kThreads>(positions, bits, r, logits, stride,
                                          maxLogit, invSum, threshold, kind);
  kvc::cuda::foldWindowSum<G, kThreads>(positions, window, r, logits, stride,
                                        maxLogit, invSum, restart);
  kvc::cuda::writeProbabilities<G, kThreads>(logits, stride, r, maxLogit,
                                             invSum, probs);
}

/// Each thread's lines of forSlotLines over positions, state, `rows` logit
/// rows and a null array: out[thread * perThread + k], counts[thread].
__global__ void __launch_bounds__(kThreads)
    slotLines(int32_t first, int32_t last, const int32_t *positions,
              const float *state, const float *logits, int32_t rows,
              int64_t stride, uintptr_t *out, int32_t perThread,
              int32_t *counts) {
  int32_t count = 0;
  kvc::cuda::forSlotLines<kThreads>(
      kvc::cuda::SlotRange{first, last},
      {kvc::cuda::slotArray(positions), kvc::cuda::slotArray(state),
       kvc::cuda::slotArray(static_cast<const uint64_t *>(nullptr)),
       kvc::cuda::slotArray(logits, rows, stride)},
      [&](const char *address) {
        if (count < perThread)
          out[threadIdx.x * perThread + count] =
              reinterpret_cast<uintptr_t>(address);
        ++count;
      });
  counts[threadIdx.x] = count;
}

/// discardRowLines over slots [first, last) of `rows` logit rows.
__global__ void __launch_bounds__(kThreads)
    discardLines(float *logits, int32_t rows, int64_t stride, int32_t first,
                 int32_t last) {
  kvc::cuda::discardRowLines<kThreads>(logits, rows, stride,
                                       kvc::cuda::SlotRange{first, last});
}

/// The fold block's slots of its first passes over [first, last).
template <int G>
__global__ void firstPassesOf(int32_t first, int32_t last, int32_t *out) {
  const kvc::cuda::SlotRange r =
      kvc::cuda::firstPasses<G, kThreads>(kvc::cuda::SlotRange{first, last});
  if (threadIdx.x == 0) {
    out[0] = r.first;
    out[1] = r.last;
  }
}

/// What a fold kernel asks L2 for over the range foldRange gives the
/// block, in the order the kernel asks: the lines of its first passes
/// (prefetchSlotLines over firstPasses), then foldSlots's, over the
/// positions, `values` (the 4-byte state of foldAccumulated or the 8-byte
/// bits of foldPersistence) and the G logit rows.
template <int G, typename T>
__global__ void __launch_bounds__(kThreads)
    foldRequests(const int32_t *positions, T *values, const float *logits,
                 int64_t stride, int32_t numSlots, int32_t slotsPerBlock) {
  __shared__ float maxLogit[G], invSum[G];
  if (threadIdx.x < G) {
    maxLogit[threadIdx.x] = 0.0f;
    invSum[threadIdx.x] = 1.0f;
  }
  __syncthreads();
  const kvc::cuda::SlotRange r =
      kvc::cuda::foldRange(numSlots, slotsPerBlock, blockIdx.y);
  kvc::cuda::prefetchSlotLines<kThreads>(
      kvc::cuda::firstPasses<G, kThreads>(r),
      {kvc::cuda::slotArray(positions), kvc::cuda::slotArray(values),
       kvc::cuda::slotArray(logits, G, stride)});
  if constexpr (sizeof(T) == 8)
    kvc::cuda::foldPersistence<G, kThreads>(positions, values, r, logits,
                                            stride, maxLogit, invSum, 0.5f,
                                            kvc::cuda::Reduce::Sum);
  else
    kvc::cuda::foldAccumulated<G, kThreads>(positions, values, r, logits,
                                            stride, maxLogit, invSum, 1.0f,
                                            kvc::cuda::Reduce::Sum);
}

/// The fold kernel's merge of head `h`'s split records: part blockIdx.y of
/// gridDim.y of the output rows, and M and 1/Z per query head (written by
/// part 0).
template <int G, int D>
__global__ void __launch_bounds__(kThreads)
    mergeParts(const float *partials, int32_t numSplits, int32_t h,
               float *out, float *stats) {
  __shared__ float maxLogit[G], invSum[G];
  kvc::cuda::splitStatistics<G, D>(partials, numSplits, h, maxLogit, invSum);
  kvc::cuda::mergeOutput<G, D, kThreads>(partials, numSplits, h, out,
                                         maxLogit, invSum, blockIdx.y,
                                         gridDim.y);
  if (blockIdx.y == 0 && threadIdx.x < G) {
    stats[2 * threadIdx.x] = maxLogit[threadIdx.x];
    stats[2 * threadIdx.x + 1] = invSum[threadIdx.x];
  }
}

bool near(float got, float want) {
  return std::fabs(got - want) <= 1e-6f * std::max(1.0f, std::fabs(want));
}

/// `freeHead`: every slot of the head free, M = -inf and 1/Z = 0 for each
/// query head, as splitStatistics leaves a head of free slots.
template <int G>
void checkFold(std::mt19937 &rng, int32_t numSlots, int32_t slotsPerSplit,
               kvc::cuda::Reduce kind, bool restart, bool freeHead = false) {
  // Rows `stride` apart with padding, and slots past numSlots, that no
  // helper may touch.
  const int32_t capacity = numSlots + 19;
  const int64_t stride = capacity + 37;
  const float kSentinel = -12345.0f;
  std::uniform_real_distribution<float> logit(-8.0f, 2.0f), unit(0.0f, 1.0f);
  std::vector<int32_t> positions(capacity, KVC_POSITION_NONE);
  std::vector<float> state(capacity), window(capacity);
  std::vector<uint64_t> bits(capacity);
  std::vector<float> logits(G * stride, kSentinel);
  for (int32_t s = 0; s < capacity; ++s) {
    if (s < numSlots && rng() % 5 != 0 && !freeHead)
      positions[s] = s;
    state[s] = unit(rng);
    window[s] = unit(rng);
    bits[s] = 0x9e3779b97f4a7c15ull * (s + 1);
    if (s < numSlots)
      for (int g = 0; g < G; ++g)
        logits[g * stride + s] = positions[s] == KVC_POSITION_NONE
                                     ? kvc::cuda::kNegInf
                                     : logit(rng);
  }
  std::vector<float> maxLogit(G), invSum(G);
  for (int g = 0; g < G; ++g) {
    maxLogit[g] = freeHead ? kvc::cuda::kNegInf : 2.0f + unit(rng);
    invSum[g] = freeHead ? 0.0f : 1.0f / (1.0f + 50.0f * unit(rng));
  }
  const float decay = 0.9f;
  // A threshold near the middle of the weights the slots get.
  const float threshold = 0.002f;

  const int32_t splits = (numSlots + slotsPerSplit - 1) / slotsPerSplit;
  int32_t *dPositions = upload(positions);
  float *dState = upload(state), *dWindow = upload(window);
  uint64_t *dBits = upload(bits);
  float *dLogits = upload(logits);
  float *dProbs = upload(std::vector<float>(G * stride, kSentinel));
  float *dMax = upload(maxLogit), *dInv = upload(invSum);
  foldBlock<G><<<dim3(1, splits), kThreads>>>(
      dPositions, dState, dBits, dWindow, dLogits, dProbs, stride, numSlots,
      slotsPerSplit, dMax, dInv, decay, threshold, kind, restart);
  CHECK(cudaDeviceSynchronize() == cudaSuccess, "foldBlock");
  const std::vector<float> gotState = download(dState, capacity);
  const std::vector<float> gotWindow = download(dWindow, capacity);
  const std::vector<uint64_t> gotBits = download(dBits, capacity);
  const std::vector<float> gotProbs = download(dProbs, G * stride);

  for (int32_t s = 0; s < capacity; ++s) {
    char what[96];
    std::snprintf(what, sizeof what, "G %d, %d %sslots, splits of %d, slot %d",
                  G, numSlots, freeHead ? "free " : "", slotsPerSplit, s);
    float p[G];
    for (int g = 0; g < G; ++g) {
      const float l = s < numSlots ? logits[g * stride + s] : kSentinel;
      p[g] = l == kvc::cuda::kNegInf
                 ? 0.0f
                 : std::exp(l - maxLogit[g]) * invSum[g];
    }
    for (int g = 0; g < G; ++g) {
      const float want = s < numSlots ? p[g] : kSentinel;
      CHECK(near(gotProbs[g * stride + s], want),
            "probability of head %d: %g, want %g; %s", g,
            gotProbs[g * stride + s], want, what);
    }
    float reduced = kind == kvc::cuda::Reduce::Max ? kvc::cuda::kNegInf : 0.0f,
          mean = 0.0f;
    for (int g = 0; g < G; ++g) {
      reduced = kind == kvc::cuda::Reduce::Max ? std::max(reduced, p[g])
                                               : reduced + p[g];
      mean += p[g];
    }
    if (kind == kvc::cuda::Reduce::Mean)
      reduced /= G;
    mean /= G;
    const bool live = positions[s] != KVC_POSITION_NONE;
    const float wantState = live ? decay * state[s] + reduced : state[s];
    const float wantWindow =
        live ? (restart ? 0.0f : window[s]) + mean : window[s];
    const uint64_t wantBits =
        live ? bits[s] << 1 | (reduced > threshold ? 1u : 0u) : bits[s];
    CHECK(near(gotState[s], wantState), "state %g, want %g; %s", gotState[s],
          wantState, what);
    CHECK(near(gotWindow[s], wantWindow), "window sum %g, want %g; %s",
          gotWindow[s], wantWindow, what);
    CHECK(gotBits[s] == wantBits ||
              (live && std::fabs(reduced - threshold) < 1e-6f &&
               (gotBits[s] ^ wantBits) == 1),
          "bits %llx, want %llx; %s",
          static_cast<unsigned long long>(gotBits[s]),
          static_cast<unsigned long long>(wantBits), what);
  }
  for (int g = 0; g < G; ++g)
    for (int64_t s = capacity; s < stride; ++s)
      CHECK(gotProbs[g * stride + s] == kSentinel,
            "row padding of head %d written at %lld", g,
            static_cast<long long>(s));
  for (void *d : {static_cast<void *>(dPositions), static_cast<void *>(dState),
                  static_cast<void *>(dWindow), static_cast<void *>(dBits),
                  static_cast<void *>(dLogits), static_cast<void *>(dProbs),
                  static_cast<void *>(dMax), static_cast<void *>(dInv)})
    cudaFree(d);
}

/// The lines of [first, last) of each row, as forSlotLines must name them.
void addLines(std::vector<uintptr_t> &want, const void *base, int32_t bytes,
              int64_t rowStart, int32_t first, int32_t last) {
  if (last <= first)
    return;
  const uintptr_t lo = reinterpret_cast<uintptr_t>(base) +
                       (rowStart + first) * static_cast<uintptr_t>(bytes);
  const uintptr_t hi = reinterpret_cast<uintptr_t>(base) +
                       (rowStart + last) * static_cast<uintptr_t>(bytes) - 1;
  want.push_back(lo);
  for (uintptr_t line = lo / 128 + 1; line <= hi / 128; ++line)
    want.push_back(line * 128);
}

void checkLines(int32_t first, int32_t last, int32_t rows) {
  const int32_t capacity = 5000;
  const int64_t stride = capacity + 13;
  int32_t *positions = upload(std::vector<int32_t>(capacity));
  float *state = upload(std::vector<float>(capacity));
  float *logits = upload(std::vector<float>(rows * stride));
  const int32_t perThread = 64;
  uintptr_t *out = upload(std::vector<uintptr_t>(kThreads * perThread));
  int32_t *counts = upload(std::vector<int32_t>(kThreads));
  slotLines<<<1, kThreads>>>(first, last, positions, state, logits, rows,
                             stride, out, perThread, counts);
  CHECK(cudaDeviceSynchronize() == cudaSuccess, "slotLines");
  const std::vector<uintptr_t> got = download(out, kThreads * perThread);
  const std::vector<int32_t> gotCounts = download(counts, kThreads);

  std::vector<uintptr_t> want;
  addLines(want, positions, 4, 0, first, last);
  addLines(want, state, 4, 0, first, last);
  for (int32_t row = 0; row < rows; ++row)
    addLines(want, logits, 4, row * stride, first, last);
  std::vector<uintptr_t> named;
  for (int t = 0; t < kThreads; ++t) {
    CHECK(gotCounts[t] <= perThread, "thread %d named %d lines", t,
          gotCounts[t]);
    named.insert(named.end(), got.begin() + t * perThread,
                 got.begin() + t * perThread + gotCounts[t]);
  }
  // The threads share the lines evenly (they take them in turn).
  const auto [fewest, most] =
      std::minmax_element(gotCounts.begin(), gotCounts.end());
  CHECK(*most - *fewest <= 1, "lines per thread from %d to %d", *fewest,
        *most);
  std::sort(named.begin(), named.end());
  std::sort(want.begin(), want.end());
  CHECK(named == want,
        "slots [%d, %d), %d logit rows: %zu lines named, %zu expected", first,
        last, rows, named.size(), want.size());
  for (void *d : {static_cast<void *>(positions), static_cast<void *>(state),
                  static_cast<void *>(logits), static_cast<void *>(out),
                  static_cast<void *>(counts)})
    cudaFree(d);
}

/// discardRowLines over slots [first, last) of `rows` rows `stride` floats
/// apart (rows that start off a line, as a stride that is not a multiple
/// of 32 leaves them): the lines wholly inside a row's range become 0xff
/// bytes on the emulator (on a device their contents are indeterminate,
/// and not checked), every other float keeps its value: the lines a row's
/// range shares with the slots before or after it, the slots outside the
/// ranges and the allocation's tail. The number of lines discarded is
/// what the ranges hold.
void checkDiscard(int32_t first, int32_t last, int32_t rows, int64_t stride) {
  const int64_t size = std::max<int64_t>(rows * stride + 64, 1);
  std::vector<float> before(size);
  for (int64_t i = 0; i < size; ++i)
    before[i] = static_cast<float>(i) + 0.5f;
  float *d = upload(before);
  discardLines<<<1, kThreads>>>(d, rows, stride, first, last);
  CHECK(cudaDeviceSynchronize() == cudaSuccess, "discardLines");
  const std::vector<float> after = download(d, size);
  const uintptr_t base = reinterpret_cast<uintptr_t>(d);
  auto discarded = [&](int64_t i) {
    const uintptr_t line = (base + i * 4) / 128 * 128;
    for (int32_t row = 0; row < rows; ++row)
      if (first < last && line >= base + (row * stride + first) * 4 &&
          line + 128 <= base + (row * stride + last) * 4)
        return true;
    return false;
  };
  int64_t gone = 0;
  for (int64_t i = 0; i < size; ++i) {
    uint32_t bits = 0;
    std::memcpy(&bits, &after[i], 4);
    if (discarded(i)) {
      ++gone;
#if defined(KVC_CUDA_EMULATED)
      CHECK(!kvc::cuda::kDiscardLogits || bits == 0xffffffffu,
            "slots [%d, %d) of %d rows: float %lld of a discarded line "
            "reads %g",
            first, last, rows, static_cast<long long>(i), after[i]);
#endif
    } else {
      CHECK(after[i] == before[i],
            "slots [%d, %d) of %d rows: float %lld outside the discarded "
            "lines reads %g, was %g",
            first, last, rows, static_cast<long long>(i), after[i],
            before[i]);
    }
  }
  // Whole lines of a row's range: from its first line boundary to its
  // last.
  int64_t want = 0;
  for (int32_t row = 0; row < rows && first < last; ++row) {
    const uintptr_t lo = (base + (row * stride + first) * 4 + 127) / 128;
    const uintptr_t hi = (base + (row * stride + last) * 4) / 128;
    want += hi > lo ? static_cast<int64_t>(hi - lo) : 0;
  }
  CHECK(gone == want * 32, "slots [%d, %d) of %d rows: %lld floats in "
        "discarded lines, want %lld", first, last, rows,
        static_cast<long long>(gone), static_cast<long long>(want * 32));
  cudaFree(d);
}

template <int G, int D>
void checkMerge(std::mt19937 &rng, int32_t numSplits, int32_t parts) {
  constexpr int kRecord = kvc::cuda::partialFloats<D>();
  const int32_t heads = 2, h = 1;
  const float kSentinel = -12345.0f;
  std::uniform_real_distribution<float> value(-1.0f, 1.0f), logit(-6.0f, 6.0f);
  // Split s of head h, query head g: {m, z, acc[D]}; every third split
  // empty (m = -inf, as a split of free slots leaves it).
  std::vector<float> partials(static_cast<size_t>(heads) * numSplits * G *
                              kRecord);
  for (float &x : partials)
    x = value(rng);
  for (int32_t s = 0; s < numSplits; ++s)
    for (int g = 0; g < G; ++g) {
      float *record =
          &partials[((static_cast<size_t>(h) * numSplits + s) * G + g) *
                    kRecord];
      const bool empty = s % 3 == 2;
      record[0] = empty ? kvc::cuda::kNegInf : logit(rng);
      record[1] = empty ? 0.0f : 1.0f + 20.0f * (value(rng) + 1.0f);
    }
  float *dPartials = upload(partials);
  float *dOut = upload(std::vector<float>(heads * G * D, kSentinel));
  float *dStats = upload(std::vector<float>(2 * G, kSentinel));
  mergeParts<G, D><<<dim3(1, parts), kThreads>>>(dPartials, numSplits, h,
                                                 dOut, dStats);
  CHECK(cudaDeviceSynchronize() == cudaSuccess, "mergeParts");
  const std::vector<float> out = download(dOut, heads * G * D);
  const std::vector<float> stats = download(dStats, 2 * G);
  for (int g = 0; g < G; ++g) {
    double m = -INFINITY;
    for (int32_t s = 0; s < numSplits; ++s)
      m = std::max<double>(
          m, partials[((static_cast<size_t>(h) * numSplits + s) * G + g) *
                      kRecord]);
    double z = 0.0;
    std::vector<double> acc(D, 0.0);
    for (int32_t s = 0; s < numSplits; ++s) {
      const float *record =
          &partials[((static_cast<size_t>(h) * numSplits + s) * G + g) *
                    kRecord];
      if (record[0] == kvc::cuda::kNegInf)
        continue;
      const double f = std::exp(static_cast<double>(record[0]) - m);
      z += record[1] * f;
      for (int c = 0; c < D; ++c)
        acc[c] += record[2 + c] * f;
    }
    char what[96];
    std::snprintf(what, sizeof what, "G %d, D %d, %d splits in %d parts, head %d",
                  G, D, numSplits, parts, g);
    CHECK(stats[2 * g] == static_cast<float>(m), "M %g, want %g; %s",
          stats[2 * g], m, what);
    CHECK(std::fabs(stats[2 * g + 1] - 1.0 / z) <= 1e-5 / z,
          "1/Z %g, want %g; %s", stats[2 * g + 1], 1.0 / z, what);
    for (int c = 0; c < D; ++c) {
      const double want = acc[c] / z;
      const float got = out[(h * G + g) * D + c];
      CHECK(std::fabs(got - want) <= 1e-5 * (1.0 + std::fabs(want)),
            "output channel %d: %g, want %g; %s", c, got, want, what);
    }
  }
  for (int i = 0; i < G * D; ++i)
    CHECK(out[i] == kSentinel, "head 0's output written at %d", i);
  for (void *d : {static_cast<void *>(dPartials), static_cast<void *>(dOut),
                  static_cast<void *>(dStats)})
    cudaFree(d);
}

template <int G> void checkFirstPasses(int32_t first, int32_t last) {
  int32_t *d = upload(std::vector<int32_t>(2, -1));
  firstPassesOf<G><<<1, kThreads>>>(first, last, d);
  CHECK(cudaDeviceSynchronize() == cudaSuccess, "firstPassesOf");
  const std::vector<int32_t> got = download(d, 2);
  const int32_t passes =
      kvc::cuda::kFoldAhead * kThreads * kvc::cuda::foldUnroll<G>();
  const int32_t wantLast = std::min(last, first + passes);
  CHECK(got[0] == first && got[1] == wantLast,
        "first passes of [%d, %d) at G %d: [%d, %d), want [%d, %d)", first,
        last, G, got[0], got[1], first, wantLast);
  cudaFree(d);
}

#if defined(KVC_CUDA_EMULATED)
/// The L2 requests of the fold blocks over a head of `numSlots` slots in
/// ranges of `slotsPerBlock` (foldRequests, values of type T): each line of
/// each block's range named once, as addLines names them. Only the
/// emulator logs them (on a device they leave no trace).
template <int G, typename T>
void checkRequests(int32_t numSlots, int32_t slotsPerBlock) {
  const int32_t capacity = numSlots + 19;
  const int64_t stride = capacity + 37; // rows that start mid-line
  int32_t *positions = upload(std::vector<int32_t>(capacity, 0));
  T *values = upload(std::vector<T>(capacity));
  float *logits = upload(std::vector<float>(G * stride, 0.0f));
  const int32_t blocks = (numSlots + slotsPerBlock - 1) / slotsPerBlock;
  std::vector<const void *> log;
  kvc::emu::setPrefetchLog(&log);
  foldRequests<G, T><<<dim3(1, blocks), kThreads>>>(
      positions, values, logits, stride, numSlots, slotsPerBlock);
  const bool ran = cudaDeviceSynchronize() == cudaSuccess;
  kvc::emu::setPrefetchLog(nullptr);
  CHECK(ran, "foldRequests");

  std::vector<uintptr_t> want;
  for (int32_t b = 0; b < blocks; ++b) {
    const int32_t first = b * slotsPerBlock;
    const int32_t last = std::min(numSlots, first + slotsPerBlock);
    addLines(want, positions, 4, 0, first, last);
    addLines(want, values, sizeof(T), 0, first, last);
    for (int g = 0; g < G; ++g)
      addLines(want, logits, 4, g * stride, first, last);
  }
  std::vector<uintptr_t> got;
  for (const void *address : log)
    got.push_back(reinterpret_cast<uintptr_t>(address));
  std::sort(got.begin(), got.end());
  std::sort(want.begin(), want.end());
  const auto repeated = std::adjacent_find(got.begin(), got.end());
  CHECK(repeated == got.end(),
        "G %d, %zu-byte values, %d slots in ranges of %d: address %#llx "
        "asked for twice",
        G, sizeof(T), numSlots, slotsPerBlock,
        static_cast<unsigned long long>(
            repeated == got.end() ? 0 : *repeated));
  CHECK(got == want,
        "G %d, %zu-byte values, %d slots in ranges of %d: %zu lines asked "
        "for, %zu expected",
        G, sizeof(T), numSlots, slotsPerBlock, got.size(), want.size());
  for (void *d : {static_cast<void *>(positions), static_cast<void *>(values),
                  static_cast<void *>(logits)})
    cudaFree(d);
}
#endif

/// planFold's plan for `heads` heads of `maxSlots` slots on `sms` SMs: the
/// properties every plan has, and `want` (blocks, slots per block) where
/// given.
template <int G>
void checkPlan(int32_t heads, int32_t maxSlots, int32_t sms,
               kvc::cuda::FoldPlan want = {0, 0}) {
  const kvc::cuda::SplitPlan split =
      kvc::cuda::planSplits(maxSlots, 64, 256, heads, 0);
  const kvc::cuda::FoldPlan plan =
      kvc::cuda::planFold<G>(split, heads, maxSlots, sms);
  char what[96];
  std::snprintf(what, sizeof what,
                "G %d, %d heads of %d slots, %d SMs: %d blocks of %d", G,
                heads, maxSlots, sms, plan.blocks, plan.slotsPerBlock);
  CHECK(plan.blocks >= 1 && plan.blocks <= split.splits,
        "blocks outside [1, %d splits]; %s", split.splits, what);
  CHECK(plan.blocks == 1 ||
            static_cast<int64_t>(plan.blocks) * heads <=
                static_cast<int64_t>(sms) * kvc::cuda::kFoldBlocksPerSM,
        "more than one wave; %s", what);
  CHECK(plan.slotsPerBlock % 32 == 0 && plan.slotsPerBlock >= 32,
        "a range not of whole 32-slot multiples; %s", what);
  CHECK(static_cast<int64_t>(plan.blocks) * plan.slotsPerBlock >= maxSlots,
        "the ranges miss slots; %s", what);
  CHECK(plan.blocks == 1 ||
            static_cast<int64_t>(plan.blocks - 1) * plan.slotsPerBlock <
                maxSlots,
        "an empty last range; %s", what);
  if (want.blocks)
    CHECK(plan.blocks == want.blocks &&
              plan.slotsPerBlock == want.slotsPerBlock,
          "want %d blocks of %d; %s", want.blocks, want.slotsPerBlock, what);
}

/// The modelled time of `splits` splits (planSplits): waves of heads x
/// splits blocks, `wave` at once, times the slots of a split.
int64_t splitModel(int32_t heads, int32_t maxSlots, int64_t wave,
                   int32_t splits) {
  const int64_t blocks = static_cast<int64_t>(heads) * splits;
  return (blocks + wave - 1) / wave * ((maxSlots + splits - 1) / splits);
}

/// planSplits's plan for `heads` heads of `maxSlots` slots with `wave`
/// blocks at once: the properties every plan has, and `want` (splits,
/// slots a split) where given.
void checkSplits(int32_t heads, int32_t maxSlots, int64_t wave,
                 kvc::cuda::SplitPlan want = {0, 0}) {
  const kvc::cuda::SplitPlan plan =
      kvc::cuda::planSplits(maxSlots, 64, 256, heads, wave);
  const int32_t byLength =
      std::clamp((maxSlots + 255) / 256, int32_t{1}, int32_t{64});
  char what[112];
  std::snprintf(what, sizeof what,
                "%d heads of %d slots, %lld blocks at once: %d splits of %d",
                heads, maxSlots, static_cast<long long>(wave), plan.splits,
                plan.slotsPerSplit);
  CHECK(plan.splits >= 1 && plan.splits <= byLength,
        "splits outside [1, %d]; %s", byLength, what);
  CHECK(plan.slotsPerSplit == std::max(1, (maxSlots + plan.splits - 1) /
                                              plan.splits),
        "not the shortest equal splits; %s", what);
  if (wave <= 0 || static_cast<int64_t>(heads) * byLength <= wave)
    CHECK(plan.splits == byLength, "not the length's %d splits; %s",
          byLength, what);
  if (wave > 0 && maxSlots > 0) {
    int64_t least = splitModel(heads, maxSlots, wave, byLength);
    for (int32_t s = 1; s < byLength; ++s)
      least = std::min(least, splitModel(heads, maxSlots, wave, s));
    const int64_t model = splitModel(heads, maxSlots, wave, plan.splits);
    CHECK(16 * model <= 17 * least, "model %lld, least %lld; %s",
          static_cast<long long>(model), static_cast<long long>(least), what);
    for (int32_t s = plan.splits + 1; s <= byLength; ++s)
      CHECK(16 * splitModel(heads, maxSlots, wave, s) > 17 * least,
            "%d splits are within 1/16 of the least too; %s", s, what);
  }
  if (want.splits)
    CHECK(plan.splits == want.splits &&
              plan.slotsPerSplit == want.slotsPerSplit,
          "want %d splits of %d; %s", want.splits, want.slotsPerSplit, what);
}

__global__ void emptyKernel(int) {}

/// residentBlocks of kThreads threads, asked twice (the second answer from
/// its cache): `want` both times.
template <int kThreads> void checkResident(int32_t want) {
  int32_t first = -1, second = -1;
  const kvc_status_t asked =
      kvc::cuda::residentBlocks<&emptyKernel, kThreads>("fold-slots", &first);
  const kvc_status_t cached =
      kvc::cuda::residentBlocks<&emptyKernel, kThreads>("fold-slots", &second);
  CHECK(asked == KVC_STATUS_OK && cached == KVC_STATUS_OK,
        "residentBlocks of %d threads failed", kThreads);
  CHECK(first == want && second == want,
        "resident blocks of %d threads: %d and %d, want %d", kThreads, first,
        second, want);
}

} // namespace

int main() {
  if (const int skip = skipWithoutDevice("the fold slots test"))
    return skip;
  std::mt19937 rng(20261127);
  int cases = 0;
  for (kvc::cuda::Reduce kind :
       {kvc::cuda::Reduce::Sum, kvc::cuda::Reduce::Mean,
        kvc::cuda::Reduce::Max}) {
    for (const auto &[numSlots, slotsPerSplit, restart] :
         {std::tuple{3001, 3001, false}, std::tuple{3001, 513, true},
          std::tuple{3001, 256, false}, std::tuple{100, 256, true}}) {
      checkFold<1>(rng, numSlots, slotsPerSplit, kind, restart);
      checkFold<4>(rng, numSlots, slotsPerSplit, kind, restart);
      checkFold<8>(rng, numSlots, slotsPerSplit, kind, restart);
      cases += 3;
    }
    // A head of free slots: every weight 0, not a NaN.
    checkFold<1>(rng, 700, 256, kind, false, true);
    checkFold<4>(rng, 700, 256, kind, false, true);
    checkFold<8>(rng, 700, 256, kind, true, true);
    cases += 3;
  }
  for (const auto &[first, last, rows] :
       {std::tuple{0, 513, 4}, std::tuple{5, 518, 8}, std::tuple{37, 38, 1},
        std::tuple{1000, 4000, 8}, std::tuple{100, 100, 4},
        std::tuple{3, 33, 0}}) {
    checkLines(first, last, rows);
    ++cases;
  }
  // Discards: rows off their lines (stride 5013), on them (4128), one
  // slot, an empty range, a range of one row's whole length, none.
  for (const auto &[first, last, rows, stride] :
       {std::tuple{0, 513, 4, int64_t{5013}},
        std::tuple{5, 518, 8, int64_t{5013}},
        std::tuple{37, 38, 1, int64_t{5013}},
        std::tuple{1000, 4000, 8, int64_t{5013}},
        std::tuple{100, 100, 4, int64_t{5013}},
        std::tuple{0, 4128, 8, int64_t{4128}},
        std::tuple{4128, 8256, 1, int64_t{8256}},
        std::tuple{3, 33, 0, int64_t{5013}}}) {
    checkDiscard(first, last, rows, stride);
    ++cases;
  }
  for (const auto &[first, last] :
       {std::pair{0, 3001}, std::pair{513, 1026}, std::pair{7, 7},
        std::pair{100, 356}}) {
    checkFirstPasses<1>(first, last);
    checkFirstPasses<4>(first, last);
    checkFirstPasses<8>(first, last);
    cases += 3;
  }
#if defined(KVC_CUDA_EMULATED)
  // One block of 9,001 slots (several passes past the first ones at every
  // G), ranges of 4,128 (planFold's at batch 8 and 32k) and 513 slots, and
  // a head shorter than one pass.
  for (const auto &[numSlots, slotsPerBlock] :
       {std::pair{9001, 9001}, std::pair{9001, 4128}, std::pair{3001, 513},
        std::pair{100, 4128}}) {
    checkRequests<1, float>(numSlots, slotsPerBlock);
    checkRequests<4, float>(numSlots, slotsPerBlock);
    checkRequests<8, float>(numSlots, slotsPerBlock);
    checkRequests<4, uint64_t>(numSlots, slotsPerBlock);
    checkRequests<8, uint64_t>(numSlots, slotsPerBlock);
    cases += 5;
  }
#endif
  for (const auto &[numSplits, parts] :
       {std::pair{1, 1}, std::pair{7, 1}, std::pair{7, 3}, std::pair{7, 7},
        std::pair{64, 1}, std::pair{64, 2}, std::pair{64, 5},
        std::pair{64, 64}}) {
    checkMerge<1, 64>(rng, numSplits, parts);
    checkMerge<4, 128>(rng, numSplits, parts);
    checkMerge<8, 128>(rng, numSplits, parts);
    cases += 3;
  }
  // The benchmark's cells on 132 SMs (8 kv-heads a sequence): batch 32 and
  // 8 at 32k, batch 1 at 32k and 4k; a short head; then the properties over
  // a grid of shapes.
  checkPlan<1>(256, 32769, 132, {2, 16416});
  checkPlan<4>(256, 32769, 132, {2, 16416});
  checkPlan<4>(64, 32769, 132, {8, 4128});
  checkPlan<8>(64, 32769, 132, {8, 4128});
  checkPlan<1>(8, 32769, 132, {33, 1024});
  checkPlan<8>(8, 32769, 132, {61, 544});
  checkPlan<1>(8, 4097, 132, {5, 832});
  checkPlan<4>(3, 100, 132, {1, 128});
  cases += 8;
  for (int32_t heads : {1, 3, 8, 64, 256, 1000})
    for (int32_t slots : {1, 31, 256, 1000, 4097, 32769, 131072})
      for (int32_t sms : {1, 108, 132}) {
        checkPlan<1>(heads, slots, sms);
        checkPlan<4>(heads, slots, sms);
        checkPlan<8>(heads, slots, sms);
        cases += 3;
      }
  // Batch 8 at 4k (64 heads): 1,024 blocks by length, 2 waves of 924
  // (G = 1) or 3 of 396 (the tensor cores, query in registers); batch 32
  // at 4k and batch 1 at 32k keep the length's splits; no wave: by length.
  checkSplits(64, 4096, 924, {14, 293});
  checkSplits(64, 4096, 396, {12, 342});
  checkSplits(256, 4096, 396, {16, 256});
  checkSplits(8, 32768, 924, {64, 512});
  checkSplits(64, 4096, 0, {16, 256});
  checkSplits(1, 0, 132, {1, 1});
  // The benchmark's cells (a step's append makes 4k 65 pages of 64, 32k
  // 513) whose plans docs/codegen-cuda.md lists, and one that keeps them.
  checkSplits(64, 4160, 924, {14, 298});
  checkSplits(64, 32832, 924, {57, 576});
  checkSplits(8, 32832, 396, {49, 671});
  checkSplits(8, 32832, 528, {64, 513});
  checkSplits(64, 4160, 660, {10, 416});
  checkSplits(64, 32832, 660, {61, 539});
  checkSplits(64, 4160, 528, {16, 260});
  checkSplits(64, 4160, 396, {17, 245});
  cases += 14;
  for (int32_t heads : {1, 3, 8, 64, 256, 1000})
    for (int32_t slots : {1, 255, 257, 1000, 4096, 4097, 16384, 32769})
      for (int64_t wave : {0, 132, 396, 528, 924, 4224}) {
        checkSplits(heads, slots, wave);
        ++cases;
      }
  checkResident<128>(16);
  checkResident<256>(8);
  checkResident<1024>(2);
  cases += 3;
  std::printf("fold slots: %d cases ok\n", cases);
  return 0;
}
