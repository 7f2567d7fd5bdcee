//===- kvc_cpu.h - CPU building blocks of generated kernels -----*- C++ -*-===//
//
// Header-only building blocks that the C++ emitter composes into policy
// kernels. The generated code folds every policy constant and the geometry
// into template arguments and constants; these functions hold the loops, so
// that each primitive is written (and tested) once.
//
// Layouts: prompt tensors are row-major [token][head][channel]; a score
// buffer of a kv-head is one float per entry (prompt index in prefill, slot
// in decode); query-head scores of a GQA group are G consecutive buffers.
// Free slots carry -infinity wherever a score is read.
//
// Not part of the C ABI: generated libraries include it, engines need not.
//
//===----------------------------------------------------------------------===//

#ifndef KVC_RUNTIME_KVC_CPU_H
#define KVC_RUNTIME_KVC_CPU_H

#include "runtime/kvc_prefill.h"
#include "runtime/kvc_rules.h"
#include "runtime/kvc_runtime.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <new>
#include <numeric>
#include <string>
#include <vector>

namespace kvc::cpu {

constexpr float kNegInf = -std::numeric_limits<float>::infinity();
constexpr float kPosInf = std::numeric_limits<float>::infinity();

/// Dot product of two rows of D floats. Eight independent partial sums let
/// the compiler vectorize without reassociating a single float reduction.
template <int D>
inline float dot(const float *__restrict a, const float *__restrict b) {
  constexpr int L = D % 8 == 0 ? 8 : 1;
  float partial[L] = {};
  for (int c = 0; c < D; c += L)
    for (int u = 0; u < L; ++u)
      partial[u] += a[c + u] * b[c + u];
  float sum = 0.0f;
  for (int u = 0; u < L; ++u)
    sum += partial[u];
  return sum;
}

/// Returns from the enclosing function when a runtime call fails.
#define KVC_CPU_TRY(...)                                                       \
  do {                                                                         \
    kvc_status_t kvc_cpu_status_ = (__VA_ARGS__);                              \
    if (kvc_cpu_status_ != KVC_STATUS_OK)                                      \
      return kvc_cpu_status_;                                                  \
  } while (0)

//===----------------------------------------------------------------------===//
// Element conversion
//===----------------------------------------------------------------------===//

/// IEEE half to float.
inline float halfToFloat(uint16_t h) {
  uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  uint32_t exp = (h >> 10) & 0x1fu;
  uint32_t mant = h & 0x3ffu;
  uint32_t bits;
  if (exp == 0) {
    if (mant == 0) {
      bits = sign;
    } else { // Subnormal: renormalize.
      int e = -1;
      do {
        ++e;
        mant <<= 1;
      } while ((mant & 0x400u) == 0);
      bits = sign | static_cast<uint32_t>(127 - 15 - e) << 23 |
             (mant & 0x3ffu) << 13;
    }
  } else if (exp == 31) {
    bits = sign | 0x7f800000u | mant << 13;
  } else {
    bits = sign | (exp + 127 - 15) << 23 | mant << 13;
  }
  float f;
  std::memcpy(&f, &bits, sizeof f);
  return f;
}

/// bfloat16 to float.
inline float bf16ToFloat(uint16_t b) {
  uint32_t bits = static_cast<uint32_t>(b) << 16;
  float f;
  std::memcpy(&f, &bits, sizeof f);
  return f;
}

/// Decodes one full-precision row of `dim` elements of type `dtype`.
inline void decodeRow(const void *row, kvc_dtype_t dtype, int dim, float *out) {
  switch (dtype) {
  case KVC_DTYPE_F32:
    std::memcpy(out, row, sizeof(float) * dim);
    return;
  case KVC_DTYPE_F16: {
    // Branch-free so that it vectorizes: shifting the exponent and mantissa
    // into float position and scaling by 2^112 rebiases normal numbers and
    // normalizes subnormals exactly; infinities and NaNs are patched.
    const uint16_t *h = static_cast<const uint16_t *>(row);
    for (int c = 0; c < dim; ++c) {
      const uint32_t magnitude = static_cast<uint32_t>(h[c] & 0x7fffu) << 13;
      float f;
      std::memcpy(&f, &magnitude, sizeof f);
      f *= 0x1p112f;
      uint32_t bits;
      std::memcpy(&bits, &f, sizeof bits);
      if ((h[c] & 0x7c00u) == 0x7c00u)
        bits = magnitude | 0x7f800000u;
      bits |= static_cast<uint32_t>(h[c] & 0x8000u) << 16;
      std::memcpy(&out[c], &bits, sizeof bits);
    }
    return;
  }
  case KVC_DTYPE_BF16: {
    const uint16_t *b = static_cast<const uint16_t *>(row);
    for (int c = 0; c < dim; ++c)
      out[c] = bf16ToFloat(b[c]);
    return;
  }
  }
}

//===----------------------------------------------------------------------===//
// A view of one (sequence, layer, kv-head) of the paged cache
//===----------------------------------------------------------------------===//

/// Iterates the live entries of one head page by page. Full-precision pages
/// are decoded straight from pool memory; quantized entries are decoded one
/// at a time into the caller's row buffers through the runtime, so the cache
/// is never expanded in memory.
class HeadView {
public:
  kvc_status_t bind(kvc_context_t *context, uint64_t sequence, int32_t layer,
                    int32_t head) {
    context_ = context;
    sequence_ = sequence;
    layer_ = layer;
    head_ = head;
    KVC_CPU_TRY(kvc_context_config(context, &config_));
    KVC_CPU_TRY(kvc_page_layout(&config_, &layout_));
    KVC_CPU_TRY(kvc_get_metadata(context, sequence, layer, head, &meta_));
    KVC_CPU_TRY(kvc_get_num_entries(context, sequence, layer, head, &live_));
    return KVC_STATUS_OK;
  }

  int32_t numSlots() const { return meta_.num_slots; }
  int32_t numLive() const { return live_; }
  const int32_t *positions() const { return meta_.position; }
  float *scoreState() const { return meta_.score; }
  uint64_t *history() const { return meta_.history; }
  bool isLive(int32_t slot) const {
    return meta_.position[slot] != KVC_POSITION_NONE;
  }

  /// Entries of one tile: at most kTileEntries live entries, decoded.
  static constexpr int32_t kTileEntries = 64;

  /// Calls fn(count, slots, keys, values) for the live entries of the head
  /// in slot order, a tile of at most kTileEntries entries at a time: keys
  /// and values are decoded into the caller's tiles (kTileEntries x
  /// head_dim floats each), so the cache is never expanded beyond a tile.
  template <typename Fn>
  kvc_status_t forEachTile(float *keyTile, float *valueTile, int32_t *slotTile,
                           Fn &&fn) const {
    const int32_t pageSize = config_.page_size;
    const int32_t dim = config_.head_dim;
    const bool direct = config_.format == KVC_FORMAT_FULL;
    const kvc_dtype_t dtype = static_cast<kvc_dtype_t>(config_.dtype);
    int32_t count = 0;
    for (int32_t slot0 = 0; slot0 < meta_.num_slots; slot0 += pageSize) {
      const char *page = nullptr;
      if (direct) {
        void *address = nullptr;
        KVC_CPU_TRY(kvc_get_page(context_, sequence_, layer_, head_,
                                 slot0 / pageSize, nullptr, nullptr,
                                 &address));
        page = static_cast<const char *>(address);
      }
      for (int32_t o = 0; o < pageSize; ++o) {
        int32_t slot = slot0 + o;
        if (slot >= meta_.num_slots || !isLive(slot))
          continue;
        float *keyRow = keyTile + static_cast<int64_t>(count) * dim;
        float *valueRow = valueTile + static_cast<int64_t>(count) * dim;
        if (direct) {
          decodeRow(page + layout_.key_offset + o * layout_.key_stride, dtype,
                    dim, keyRow);
          decodeRow(page + layout_.value_offset + o * layout_.value_stride,
                    dtype, dim, valueRow);
        } else {
          KVC_CPU_TRY(kvc_read_entry(context_, sequence_, layer_, head_, slot,
                                     dim, keyRow, valueRow));
        }
        slotTile[count++] = slot;
        if (count == kTileEntries) {
          fn(count, static_cast<const int32_t *>(slotTile),
             static_cast<const float *>(keyTile),
             static_cast<const float *>(valueTile));
          count = 0;
        }
      }
    }
    if (count > 0)
      fn(count, static_cast<const int32_t *>(slotTile),
         static_cast<const float *>(keyTile),
         static_cast<const float *>(valueTile));
    return KVC_STATUS_OK;
  }

private:
  kvc_context_t *context_ = nullptr;
  uint64_t sequence_ = 0;
  int32_t layer_ = 0, head_ = 0, live_ = 0;
  kvc_config_t config_{};
  kvc_page_layout_t layout_{};
  kvc_metadata_t meta_{};
};

/// The appends of one decode step: one entry at positions[b] in each of the
/// `heads` kv-heads of `batch` sequences, kv-head h of sequence b from row
/// b * heads + h of k and v (dim floats each), before any head computes.
/// One kvc_append_step, so all or nothing: when the pool or a budget
/// cannot take every entry, no head appends (KIVI heads included, whose
/// appends also advance the residual window) and the call fails with the
/// runtime's status and message.
inline kvc_status_t appendStep(kvc_context_t *context, int32_t batch,
                               const uint64_t *sequences, int32_t layer,
                               int32_t heads, int32_t dim, const float *k,
                               const float *v, const int32_t *positions) {
  std::vector<int32_t> newSlots;
  try {
    newSlots.resize(static_cast<size_t>(batch) * heads);
  } catch (const std::bad_alloc &) {
    return kvc_report_error(KVC_STATUS_OUT_OF_MEMORY,
                            "kvc cpu: host allocation failed");
  }
  return kvc_append_step(context, layer, batch, sequences, dim, k, v,
                         positions, newSlots.data(), nullptr);
}

//===----------------------------------------------------------------------===//
// Attention passes
//===----------------------------------------------------------------------===//

/// Reduction kinds over heads.
enum class Reduce { Mean, Max, Sum };

/// Importance bits of prefill queries (kvc.attn_persistence): bit a of
/// bits[i] is set when query n - 1 - a (one of the last `history` <= 64)
/// gave entry i a group-reduced weight above `threshold`; `row` is scratch
/// of n floats.
struct PersistenceBits {
  int32_t history;
  float threshold;
  Reduce reduce;
  uint64_t *bits;
  float *row;
};

/// Causal prefill attention of the G query heads of one kv-head over n
/// prompt tokens, with the statistics folded in on the way:
///  - `window` > 0: windowProbs[g * n + i] = mean over the last
///    w = min(window, n) queries of p_{q,i} for the entries before the
///    window, 0 for the w window entries themselves;
///  - `lastProbs` != nullptr: lastProbs[g * n + i] = p_{n-1,i}, the weights
///    of the last query over every entry (itself included);
///  - `accumulated` != nullptr: accumulated[g * n + i] = the decayed sum
///    over all queries t of decay^(n-1-t) * p_{t,i}, i.e. the state
///    s <- decay * s + p_t after the last prompt query.
///  - `persistence` != nullptr: see PersistenceBits.
/// q rows: q + t * qStride + g * D; k, v rows: k + t * kvStride. out rows
/// like q; a null `out` skips the weighted sum of values (scoring only).
/// `logits` is scratch of n floats.
template <int G, int D>
void prefillAttention(int32_t n, const float *q, int64_t qStride,
                      const float *k, const float *v, int64_t kvStride,
                      float scale, float *out, int32_t window,
                      float *windowProbs, float *lastProbs,
                      float *accumulated, float decay, float *logits,
                      const PersistenceBits *persistence = nullptr) {
  const int32_t w = std::min(window, n);
  if (windowProbs)
    std::fill(windowProbs, windowProbs + static_cast<int64_t>(G) * n, 0.0f);
  if (accumulated)
    std::fill(accumulated, accumulated + static_cast<int64_t>(G) * n, 0.0f);
  if (persistence)
    std::fill(persistence->bits, persistence->bits + n, uint64_t{0});
  for (int32_t t = 0; t < n; ++t) {
    const float age = decay == 1.0f ? 1.0f : std::pow(decay, float(n - 1 - t));
    // Queries of the persistence history reduce their group's weights.
    float *row = persistence && n - 1 - t < persistence->history
                     ? persistence->row
                     : nullptr;
    if (row)
      std::fill(row, row + t + 1,
                persistence->reduce == Reduce::Max ? kNegInf : 0.0f);
    for (int g = 0; g < G; ++g) {
      const float *qr = q + t * qStride + g * D;
      float m = kNegInf;
      for (int32_t i = 0; i <= t; ++i) {
        logits[i] = dot<D>(qr, k + i * kvStride) * scale;
        m = std::max(m, logits[i]);
      }
      float z = 0.0f;
      for (int32_t i = 0; i <= t; ++i) {
        logits[i] = std::exp(logits[i] - m);
        z += logits[i];
      }
      const float inv = 1.0f / z;
      float acc[D] = {};
      for (int32_t i = 0; i <= t; ++i) {
        const float p = logits[i] * inv;
        if (out) {
          const float *vr = v + i * kvStride;
          for (int c = 0; c < D; ++c)
            acc[c] += p * vr[c];
        }
        if (accumulated)
          accumulated[g * n + i] += p * age;
        if (windowProbs && t >= n - w && i < n - w)
          windowProbs[g * n + i] += p / w;
        if (lastProbs && t == n - 1)
          lastProbs[g * n + i] = p;
        if (row)
          row[i] = persistence->reduce == Reduce::Max ? std::max(row[i], p)
                                                      : row[i] + p;
      }
      if (out)
        std::memcpy(out + t * qStride + g * D, acc, sizeof acc);
    }
    if (row) {
      const uint64_t bit = uint64_t{1} << (n - 1 - t);
      const float divisor = persistence->reduce == Reduce::Mean ? G : 1;
      for (int32_t i = 0; i <= t; ++i)
        if (row[i] / divisor > persistence->threshold)
          persistence->bits[i] |= bit;
    }
  }
}

/// Decode attention of the G query heads of one kv-head over every live
/// entry, in one pass over keys and values (online softmax, a tile of
/// entries at a time). Writes the output rows (skipped when `out` is null:
/// scoring only) and, when `probs` is given, the normalized weight
/// probs[g * slots + s] of every slot (0 for free slots). `logits` is
/// scratch of G * slots floats.
template <int G, int D>
kvc_status_t decodeAttention(const HeadView &head, const float *q,
                             float scale, float *out, float *probs,
                             float *logits) {
  constexpr int32_t T = HeadView::kTileEntries;
  const int32_t slots = head.numSlots();
  float m[G], z[G];
  alignas(64) float acc[G][D];
  alignas(64) float keyTile[T * D], valueTile[T * D];
  int32_t slotTile[T];
  float tileLogits[G][T];
  for (int g = 0; g < G; ++g) {
    m[g] = kNegInf;
    z[g] = 0.0f;
    std::fill(acc[g], acc[g] + D, 0.0f);
  }
  std::fill(logits, logits + static_cast<int64_t>(G) * slots, kNegInf);
  KVC_CPU_TRY(head.forEachTile(
      keyTile, valueTile, slotTile,
      [&](int32_t count, const int32_t *tileSlots, const float *keys,
          const float *values) {
        for (int g = 0; g < G; ++g) {
          const float *__restrict qr = q + g * D;
          float *__restrict l = tileLogits[g];
          float tileMax = kNegInf;
          for (int32_t j = 0; j < count; ++j) {
            l[j] = dot<D>(qr, keys + j * D) * scale;
            tileMax = std::max(tileMax, l[j]);
          }
          for (int32_t j = 0; j < count; ++j)
            logits[g * slots + tileSlots[j]] = l[j];
          // Rescale what was accumulated before this tile once per tile.
          const float newMax = std::max(m[g], tileMax);
          const float r = std::exp(m[g] - newMax);
          m[g] = newMax;
          z[g] *= r;
          float *__restrict a = acc[g];
          if (out)
            for (int c = 0; c < D; ++c)
              a[c] *= r;
          for (int32_t j = 0; j < count; ++j) {
            const float e = std::exp(l[j] - newMax);
            z[g] += e;
            if (!out)
              continue;
            const float *__restrict vr = values + j * D;
            for (int c = 0; c < D; ++c)
              a[c] += e * vr[c];
          }
        }
      }));
  for (int g = 0; g < G; ++g) {
    const float inv = z[g] > 0.0f ? 1.0f / z[g] : 0.0f;
    if (out)
      for (int c = 0; c < D; ++c)
        out[g * D + c] = acc[g][c] * inv;
    if (!probs)
      continue;
    for (int32_t s = 0; s < slots; ++s)
      probs[g * slots + s] = logits[g * slots + s] == kNegInf
                                 ? 0.0f
                                 : std::exp(logits[g * slots + s] - m[g]) * inv;
  }
  return KVC_STATUS_OK;
}

//===----------------------------------------------------------------------===//
// Score transforms
//===----------------------------------------------------------------------===//

/// out[i] = reduce over g of in[g * n + i].
inline void groupReduce(const float *in, int32_t groups, int32_t n, Reduce kind,
                        float *out) {
  for (int32_t i = 0; i < n; ++i) {
    float r = kind == Reduce::Max ? kNegInf : 0.0f;
    for (int32_t g = 0; g < groups; ++g) {
      const float x = in[static_cast<int64_t>(g) * n + i];
      r = kind == Reduce::Max ? std::max(r, x) : r + x;
    }
    out[i] = kind == Reduce::Mean ? r / groups : r;
  }
}

/// The weight of slot s reduced over the `groups` query-head rows of
/// probs (row g at probs + g * slots).
inline float reduceSlot(const float *probs, int32_t groups, int32_t slots,
                        int32_t s, Reduce kind) {
  float r = kind == Reduce::Max ? kNegInf : 0.0f;
  for (int32_t g = 0; g < groups; ++g) {
    const float p = probs[static_cast<int64_t>(g) * slots + s];
    r = kind == Reduce::Max ? std::max(r, p) : r + p;
  }
  return kind == Reduce::Mean ? r / groups : r;
}

/// Folds this step's probabilities into the running per-entry state:
/// state[s] <- decay * state[s] + reduce_g(probs[g * slots + s]) for live
/// slots.
inline void foldAccumulated(const HeadView &head, const float *probs,
                            int32_t groups, float decay, Reduce kind) {
  const int32_t slots = head.numSlots();
  float *state = head.scoreState();
  for (int32_t s = 0; s < slots; ++s)
    if (head.isLive(s))
      state[s] = decay * state[s] + reduceSlot(probs, groups, slots, s, kind);
}

/// Shifts one decode step into every live entry's importance bits: bit 0
/// is set when the group-reduced weight of the current query exceeds
/// `threshold` (kvc.attn_persistence).
inline void foldPersistence(const HeadView &head, const float *probs,
                            int32_t groups, float threshold, Reduce kind) {
  const int32_t slots = head.numSlots();
  uint64_t *bits = head.history();
  for (int32_t s = 0; s < slots; ++s)
    if (head.isLive(s))
      bits[s] = (bits[s] << 1) |
                (reduceSlot(probs, groups, slots, s, kind) > threshold ? 1u
                                                                       : 0u);
}

/// Number of set bits among the lowest `history` bits of `bits`.
inline int32_t countRecentBits(uint64_t bits, int32_t history) {
  if (history < 64)
    bits &= (uint64_t{1} << history) - 1;
  int32_t count = 0;
  for (; bits; bits &= bits - 1)
    ++count;
  return count;
}

/// Adds the group-mean weights of the current decode query to every live
/// entry's score state, starting from 0 when `restart` (the first query of
/// a periodic phase's window).
inline void foldWindowSum(const HeadView &head, const float *probs,
                          int32_t groups, bool restart) {
  const int32_t slots = head.numSlots();
  float *state = head.scoreState();
  for (int32_t s = 0; s < slots; ++s)
    if (head.isLive(s))
      state[s] = (restart ? 0.0f : state[s]) +
                 reduceSlot(probs, groups, slots, s, Reduce::Mean);
}

/// 1-D average pooling along n tokens with an odd kernel, stride 1, zero
/// "same" padding counted in the divisor.
inline void poolAvg(const float *in, int32_t n, int32_t kernel, float *out) {
  const int32_t half = kernel / 2;
  for (int32_t i = 0; i < n; ++i) {
    float sum = 0.0f;
    for (int32_t j = std::max(0, i - half); j <= std::min(n - 1, i + half); ++j)
      sum += in[j];
    out[i] = sum / kernel;
  }
}

/// 1-D max pooling along n tokens with an odd kernel, stride 1, -infinity
/// "same" padding.
inline void poolMax(const float *in, int32_t n, int32_t kernel, float *out) {
  const int32_t half = kernel / 2;
  for (int32_t i = 0; i < n; ++i) {
    float m = kNegInf;
    for (int32_t j = std::max(0, i - half); j <= std::min(n - 1, i + half); ++j)
      m = std::max(m, in[j]);
    out[i] = m;
  }
}

/// Normalization kinds.
enum class Normalize { ZScore, Sum, Max };

/// Normalizes the live entries of one score buffer (population standard
/// deviation; a zero deviation, sum or maximum leaves zeros).
inline void normalize(const float *in, const int32_t *positions, int32_t n,
                      Normalize kind, float *out) {
  double sum = 0.0, sq = 0.0, mx = -INFINITY;
  int32_t live = 0;
  for (int32_t i = 0; i < n; ++i) {
    if (positions[i] == KVC_POSITION_NONE)
      continue;
    ++live;
    sum += in[i];
    sq += static_cast<double>(in[i]) * in[i];
    mx = std::max(mx, static_cast<double>(in[i]));
  }
  const double mean = live ? sum / live : 0.0;
  const double sd =
      live ? std::sqrt(std::max(0.0, sq / live - mean * mean)) : 0.0;
  for (int32_t i = 0; i < n; ++i) {
    double x = in[i];
    switch (kind) {
    case Normalize::ZScore:
      x = sd > 0.0 ? (x - mean) / sd : 0.0;
      break;
    case Normalize::Sum:
      x = sum != 0.0 ? x / sum : 0.0;
      break;
    case Normalize::Max:
      x = mx != 0.0 ? x / mx : 0.0;
      break;
    }
    out[i] = static_cast<float>(x);
  }
}

/// Sets the score of the `sinks` oldest and the `recent` newest live
/// entries (by original position) to +infinity.
inline void protect(const float *in, const int32_t *positions, int32_t n,
                    int32_t sinks, int32_t recent, float *out,
                    int32_t *scratch) {
  int32_t live = 0;
  for (int32_t i = 0; i < n; ++i)
    if (positions[i] != KVC_POSITION_NONE)
      scratch[live++] = positions[i];
  std::memmove(out, in, sizeof(float) * n);
  if (live == 0)
    return;
  int32_t lowCut = std::numeric_limits<int32_t>::min();
  int32_t highCut = std::numeric_limits<int32_t>::max();
  if (sinks > 0) {
    const int32_t k = std::min(sinks, live) - 1;
    std::nth_element(scratch, scratch + k, scratch + live);
    lowCut = scratch[k]; // Positions <= lowCut are sinks.
  }
  if (recent > 0) {
    const int32_t k = live - std::min(recent, live);
    std::nth_element(scratch, scratch + k, scratch + live);
    highCut = scratch[k]; // Positions >= highCut are recent.
  }
  for (int32_t i = 0; i < n; ++i) {
    if (positions[i] == KVC_POSITION_NONE)
      continue;
    if ((sinks > 0 && positions[i] <= lowCut) ||
        (recent > 0 && positions[i] >= highCut))
      out[i] = kPosInf;
  }
}

/// Key and value features of a prompt: ||k_i||_2, ||v_i||_p.
inline void rowNorms(const float *rows, int64_t stride, int32_t n, int dim,
                     int p, float *out) {
  for (int32_t i = 0; i < n; ++i) {
    double s = 0.0;
    for (int c = 0; c < dim; ++c) {
      const double x = rows[i * stride + c];
      s += p == 1 ? std::fabs(x) : x * x;
    }
    out[i] = static_cast<float>(p == 1 ? s : std::sqrt(s));
  }
}

/// KeyDiff: -cos(k_i, mean_j k_j / ||k_j||) over n prompt keys.
inline void keyDiversity(const float *rows, int64_t stride, int32_t n, int dim,
                         float *out) {
  std::vector<double> mean(dim, 0.0);
  for (int32_t i = 0; i < n; ++i) {
    double norm = 0.0;
    for (int c = 0; c < dim; ++c)
      norm += static_cast<double>(rows[i * stride + c]) * rows[i * stride + c];
    norm = std::sqrt(norm);
    if (norm == 0.0)
      continue;
    for (int c = 0; c < dim; ++c)
      mean[c] += rows[i * stride + c] / norm;
  }
  for (int c = 0; c < dim; ++c)
    mean[c] /= std::max<int32_t>(n, 1);
  double meanNorm = 0.0;
  for (int c = 0; c < dim; ++c)
    meanNorm += mean[c] * mean[c];
  meanNorm = std::sqrt(meanNorm);
  for (int32_t i = 0; i < n; ++i) {
    double dot = 0.0, norm = 0.0;
    for (int c = 0; c < dim; ++c) {
      dot += rows[i * stride + c] * mean[c];
      norm += static_cast<double>(rows[i * stride + c]) * rows[i * stride + c];
    }
    const double denom = std::sqrt(norm) * meanNorm;
    out[i] = static_cast<float>(denom > 0.0 ? -dot / denom : 0.0);
  }
}

//===----------------------------------------------------------------------===//
// Budgets and selection
//===----------------------------------------------------------------------===//

/// PyramidKV integer budget of `layer` for a prompt of `length` tokens,
/// window entries included.
inline int64_t pyramidBudget(int64_t capacity, int64_t window, int64_t beta,
                             int64_t layers, int64_t layer, int64_t length) {
  if (length < capacity)
    return length;
  const int64_t c = capacity - window;
  if (length < 2 * c)
    return c + window;
  int64_t lo = c / beta;
  int64_t hi = 2 * c - lo;
  if (hi >= length - window) {
    hi = length - window;
    lo = 2 * c - hi;
  }
  const int64_t step = layers > 1 ? (hi - lo) / (layers - 1) : 0;
  return hi - layer * step + window;
}

/// Marks in `victims` (count written to *numVictims) the live entries
/// outside the top `budget` by score. Ties keep the more recent entry when
/// `tieRecent`, the older one otherwise. `order` is scratch of n ints.
inline void selectVictims(const float *scores, const int32_t *positions,
                          int32_t n, int64_t budget, bool tieRecent,
                          int32_t *order, int32_t *victims,
                          int32_t *numVictims) {
  int32_t live = 0;
  for (int32_t i = 0; i < n; ++i)
    if (positions[i] != KVC_POSITION_NONE)
      order[live++] = i;
  const int64_t drop = live > budget ? live - budget : 0;
  *numVictims = static_cast<int32_t>(drop);
  if (drop == 0)
    return;
  // The first `drop` entries of this order are the victims.
  auto worse = [&](int32_t a, int32_t b) {
    if (scores[a] != scores[b])
      return scores[a] < scores[b];
    return tieRecent ? positions[a] < positions[b]
                     : positions[a] > positions[b];
  };
  std::partial_sort(order, order + drop, order + live, worse);
  std::copy(order, order + drop, victims);
  std::sort(victims, victims + drop);
}

/// Mixed precision of a prefill gather: sets high[i] = 1 for the
/// rules::highPrecisionCount(kept, fraction) prompt entries that are not among the
/// `numVictims` (ascending) victims and rank highest by `scores`, ties
/// going to the more recent position, and 0 for every other entry. Returns
/// that count. `order` is scratch of n ints.
inline int32_t markHighPrecision(const float *scores, const int32_t *positions,
                                 int32_t n, const int32_t *victims,
                                 int32_t numVictims, double fraction,
                                 int32_t *order, int32_t *high) {
  int32_t kept = 0;
  for (int32_t i = 0, next = 0; i < n; ++i) {
    high[i] = 0;
    if (next < numVictims && victims[next] == i) {
      ++next;
      continue;
    }
    order[kept++] = i;
  }
  const int32_t count = rules::highPrecisionCount(kept, fraction);
  auto better = [&](int32_t a, int32_t b) {
    if (scores[a] != scores[b])
      return scores[a] > scores[b];
    return positions[a] > positions[b];
  };
  std::partial_sort(order, order + count, order + kept, better);
  for (int32_t j = 0; j < count; ++j)
    high[order[j]] = 1;
  return count;
}

//===----------------------------------------------------------------------===//
// Merges of evicted prompt entries into kept ones
//
// The kept entries are the `kept` rows of keptKeys/keptValues (contiguous,
// head_dim floats each), taken from prompt rows keptIndex[] (ascending); the
// evicted entries are prompt rows victims[] (ascending) of keys/values (row
// stride `stride`). Similarities are cosines computed in double precision;
// a tie goes to the later kept entry.
//===----------------------------------------------------------------------===//

/// Weight rules of merge-into-nearest.
enum class MergeWeight { SimNorm, Similarity, Uniform };

namespace detail {
inline double rowNorm(const float *row, int dim) {
  double s = 0.0;
  for (int c = 0; c < dim; ++c)
    s += static_cast<double>(row[c]) * row[c];
  return std::sqrt(s);
}

/// The kept entry most cosine-similar to `key`, and that similarity.
inline std::pair<int32_t, double> nearestKept(const float *key,
                                              const float *keptKeys,
                                              const double *keptNorms,
                                              int32_t kept, int dim) {
  const double keyNorm = rowNorm(key, dim);
  int32_t best = -1;
  double bestSim = -INFINITY;
  for (int32_t t = 0; t < kept; ++t) {
    double dotProduct = 0.0;
    for (int c = 0; c < dim; ++c)
      dotProduct += static_cast<double>(key[c]) * keptKeys[t * dim + c];
    const double denom = keyNorm * keptNorms[t];
    const double sim = denom > 0.0 ? dotProduct / denom : 0.0;
    if (best < 0 || sim >= bestSim) {
      best = t;
      bestSim = sim;
    }
  }
  return {best, bestSim};
}
} // namespace detail

/// Merge into nearest: each evicted value goes to the kept entry with the
/// most similar key, weight w by `rule` (SimNorm: max(sim, 0) * |v_e| /
/// (|v_e| + |v_t|) with the kept value's original norm); then v_t <- (v_t +
/// sum w v_e) / (1 + sum w). Keys are unchanged. `scratch` holds
/// kept * (head_dim + 3) doubles.
inline void mergeNearest(const float *keys, const float *values,
                         int64_t stride, const int32_t *victims,
                         int32_t numVictims, float *keptKeys,
                         float *keptValues, int32_t kept, int dim,
                         MergeWeight rule, double *scratch) {
  double *keyNorms = scratch, *valueNorms = scratch + kept,
         *weights = scratch + 2 * kept, *sums = scratch + 3 * kept;
  for (int32_t t = 0; t < kept; ++t) {
    keyNorms[t] = detail::rowNorm(keptKeys + t * dim, dim);
    valueNorms[t] = detail::rowNorm(keptValues + t * dim, dim);
    weights[t] = 0.0;
  }
  std::fill(sums, sums + static_cast<int64_t>(kept) * dim, 0.0);
  for (int32_t j = 0; j < numVictims; ++j) {
    const float *key = keys + victims[j] * stride;
    const float *value = values + victims[j] * stride;
    auto [t, sim] =
        detail::nearestKept(key, keptKeys, keyNorms, kept, dim);
    if (t < 0)
      continue;
    double w = 1.0;
    if (rule != MergeWeight::Uniform)
      w = std::max(sim, 0.0);
    if (rule == MergeWeight::SimNorm) {
      const double ne = detail::rowNorm(value, dim), nt = valueNorms[t];
      w = ne + nt > 0.0 ? w * ne / (ne + nt) : 0.0;
    }
    weights[t] += w;
    for (int c = 0; c < dim; ++c)
      sums[t * dim + c] += w * value[c];
  }
  for (int32_t t = 0; t < kept; ++t)
    for (int c = 0; c < dim; ++c)
      keptValues[t * dim + c] = static_cast<float>(
          (keptValues[t * dim + c] + sums[t * dim + c]) / (1.0 + weights[t]));
}

/// D2O: each evicted key finds its most similar kept key with similarity
/// s_e; the threshold becomes tau <- alpha * tau + beta * mean_e s_e; the
/// evicted entries with s_e >= tau merge into their target as the weighted
/// mean of keys and values, weight exp(s_e) for merged entries and exp(1)
/// for the kept entry itself. Returns the new threshold. `scratch` holds
/// kept * (2 * head_dim + 2) + numVictims * 2 doubles.
inline double mergeD2O(const float *keys, const float *values, int64_t stride,
                       const int32_t *victims, int32_t numVictims,
                       float *keptKeys, float *keptValues, int32_t kept,
                       int dim, double threshold, double alpha, double beta,
                       double *scratch) {
  if (numVictims == 0)
    return threshold;
  double *keyNorms = scratch, *weights = scratch + kept,
         *keySums = scratch + 2 * kept,
         *valueSums = keySums + static_cast<int64_t>(kept) * dim,
         *sims = valueSums + static_cast<int64_t>(kept) * dim,
         *targets = sims + numVictims;
  double meanSim = 0.0;
  for (int32_t t = 0; t < kept; ++t)
    keyNorms[t] = detail::rowNorm(keptKeys + t * dim, dim);
  for (int32_t j = 0; j < numVictims; ++j) {
    auto [t, sim] = detail::nearestKept(keys + victims[j] * stride, keptKeys,
                                        keyNorms, kept, dim);
    targets[j] = t;
    sims[j] = sim;
    meanSim += sim / numVictims;
  }
  const double tau = alpha * threshold + beta * meanSim;
  const double self = std::exp(1.0);
  for (int32_t t = 0; t < kept; ++t) {
    weights[t] = self;
    for (int c = 0; c < dim; ++c) {
      keySums[t * dim + c] = self * keptKeys[t * dim + c];
      valueSums[t * dim + c] = self * keptValues[t * dim + c];
    }
  }
  for (int32_t j = 0; j < numVictims; ++j) {
    const int32_t t = static_cast<int32_t>(targets[j]);
    if (t < 0 || sims[j] < tau)
      continue;
    const double w = std::exp(sims[j]);
    weights[t] += w;
    for (int c = 0; c < dim; ++c) {
      keySums[t * dim + c] += w * keys[victims[j] * stride + c];
      valueSums[t * dim + c] += w * values[victims[j] * stride + c];
    }
  }
  for (int32_t t = 0; t < kept; ++t)
    for (int c = 0; c < dim; ++c) {
      keptKeys[t * dim + c] =
          static_cast<float>(keySums[t * dim + c] / weights[t]);
      keptValues[t * dim + c] =
          static_cast<float>(valueSums[t * dim + c] / weights[t]);
    }
  return tau;
}

/// CaM: each evicted value is added, times p_e / m, to the next `m` kept
/// entries after it (fewer at the end), with p_e = clamp(A_e / mean(A), 0,
/// 1) the expected value of CaM's Bernoulli mask, the mean taken over the
/// `observed` first entries (those the attention window scores). `attention`
/// holds A for the n prompt entries. Values only.
inline void mergeCam(const float *values, int64_t stride,
                     const float *attention, int32_t observed,
                     const int32_t *victims, int32_t numVictims,
                     const int32_t *keptIndex, float *keptValues,
                     int32_t kept, int dim, int32_t m) {
  double windowMean = 0.0;
  for (int32_t i = 0; i < observed; ++i)
    windowMean += static_cast<double>(attention[i]) / observed;
  int32_t first = 0; // The first kept entry after the current victim.
  for (int32_t j = 0; j < numVictims; ++j) {
    const int32_t e = victims[j];
    const double p =
        windowMean > 0.0 ? std::clamp(attention[e] / windowMean, 0.0, 1.0)
                         : 0.0;
    while (first < kept && keptIndex[first] <= e)
      ++first;
    for (int32_t t = first; t < std::min(kept, first + m); ++t)
      for (int c = 0; c < dim; ++c)
        keptValues[t * dim + c] +=
            static_cast<float>(p * values[e * stride + c] / m);
  }
}

//===----------------------------------------------------------------------===//
// Budgets across the heads of a layer
//===----------------------------------------------------------------------===//

/// AdaKV's per-head budgets: every head first keeps its top floor(alpha *
/// budget) entries, then the rest of the layer's heads * budget entries go
/// to the highest remaining scores of any head (ties: the later entry, then
/// the later head). scores[h * stride + i] is the score of entry i of head
/// h, for the entries whose positions[h * positionStride + i] is a live
/// position (positionStride 0: all heads share one array). Writes the number
/// each head keeps. `order` is scratch of heads * stride ints.
inline void adaptiveBudgets(const float *scores, const int32_t *positions,
                            int64_t positionStride, int32_t heads, int32_t n,
                            int64_t stride, int64_t budget, double alpha,
                            int64_t *perHead, int64_t *order) {
  const int64_t share = static_cast<int64_t>(std::floor(alpha * budget));
  int64_t remaining = heads * budget, candidates = 0;
  for (int32_t h = 0; h < heads; ++h) {
    // The head's live entries, best first.
    int64_t *mine = order + candidates;
    int64_t live = 0;
    for (int32_t i = 0; i < n; ++i)
      if (positions[h * positionStride + i] != KVC_POSITION_NONE)
        mine[live++] = h * stride + i;
    std::sort(mine, mine + live, [&](int64_t a, int64_t b) {
      if (scores[a] != scores[b])
        return scores[a] > scores[b];
      return a > b;
    });
    perHead[h] = std::min(share, live);
    remaining -= perHead[h];
    // What is left of this head competes globally.
    std::memmove(order + candidates, mine + perHead[h],
                 sizeof(int64_t) * (live - perHead[h]));
    candidates += live - perHead[h];
  }
  const int64_t picks = std::max<int64_t>(0, std::min(remaining, candidates));
  std::partial_sort(order, order + picks, order + candidates,
                    [&](int64_t a, int64_t b) {
                      if (scores[a] != scores[b])
                        return scores[a] > scores[b];
                      if (a % stride != b % stride)
                        return a % stride > b % stride;
                      return a > b;
                    });
  for (int64_t j = 0; j < picks; ++j)
    ++perHead[order[j] / stride];
}

} // namespace kvc::cpu

#endif // KVC_RUNTIME_KVC_CPU_H
