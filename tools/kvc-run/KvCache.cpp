//===- KvCache.cpp - The engine's key/value cache -------------------------===//
//
// Part of kvc, the KV-cache policy compiler.
//
//===----------------------------------------------------------------------===//

#include "tools/kvc-run/KvCache.h"

#include "tools/kvc-run/Quant.h"
#include "tools/kvc-run/ThreadPool.h"

#include <algorithm>
#include <cmath>
#include <limits>

namespace kvc {
namespace run {

namespace {

/// Entries per split of a kv head. Fixed (not derived from the thread
/// count) so the summation order, hence the result, is always the same.
constexpr size_t kChunk = 256;

/// Computes the partial attention of the `group` query heads `q` (each
/// headDim floats) over entries [begin, end) of one kv head. For each head,
/// `partial` receives [max score, sum of exp(score - max), exp-weighted sum
/// of the values (headDim floats)], the state two chunks merge from.
void chunkAttention(const float *keys, const float *values, size_t begin,
                    size_t end, const float *q, int group, int headDim,
                    float scale, float *scores, float *partial) {
  size_t len = end - begin;
  size_t hd = size_t(headDim);
  // Four keys at a time against each query head of the group: the keys stay
  // in L1 across the group, and each query load serves four keys.
  size_t e = 0;
  for (; e + 4 <= len; e += 4) {
    const float *k = keys + (begin + e) * hd;
    for (int g = 0; g < group; ++g) {
      float *s = scores + size_t(g) * len + e;
      dotF32x4(k, hd, q + size_t(g) * hd, hd, s);
      for (size_t i = 0; i < 4; ++i)
        s[i] *= scale;
    }
  }
  for (; e < len; ++e) {
    const float *k = keys + (begin + e) * hd;
    for (int g = 0; g < group; ++g)
      scores[size_t(g) * len + e] = dotF32(q + size_t(g) * hd, k, hd) * scale;
  }
  for (int g = 0; g < group; ++g) {
    float *s = scores + size_t(g) * len;
    float *p = partial + size_t(g) * (hd + 2);
    float m = *std::max_element(s, s + len);
    float sum = 0.0f;
    for (size_t j = 0; j < len; ++j) {
      s[j] = std::exp(s[j] - m);
      sum += s[j];
    }
    p[0] = m;
    p[1] = sum;
    std::fill(p + 2, p + 2 + hd, 0.0f);
  }
  for (size_t j = 0; j < len; ++j) {
    const float *v = values + (begin + j) * hd;
    for (int g = 0; g < group; ++g) {
      float w = scores[size_t(g) * len + j];
      float *acc = partial + size_t(g) * (hd + 2) + 2;
      for (size_t d = 0; d < hd; ++d)
        acc[d] += w * v[d];
    }
  }
}

/// Combines the per-chunk partials of one query head: rescale each chunk to
/// the global maximum, then normalize once.
void mergePartials(const float *partials, size_t numChunks, size_t stride,
                   int headDim, float *out) {
  size_t hd = size_t(headDim);
  float m = -std::numeric_limits<float>::infinity();
  for (size_t c = 0; c < numChunks; ++c)
    m = std::max(m, partials[c * stride]);
  float total = 0.0f;
  std::fill(out, out + hd, 0.0f);
  for (size_t c = 0; c < numChunks; ++c) {
    const float *p = partials + c * stride;
    float w = std::exp(p[0] - m);
    total += w * p[1];
    for (size_t d = 0; d < hd; ++d)
      out[d] += w * p[2 + d];
  }
  float inv = 1.0f / total;
  for (size_t d = 0; d < hd; ++d)
    out[d] *= inv;
}

} // namespace

KvCache::~KvCache() = default;

void KvCache::appendAndAttend(int layer, size_t n, const float *q,
                              const float *k, const float *v, float *out) {
  const KvGeometry &g = geometry();
  for (size_t t = 0; t < n; ++t) {
    append(layer, k + t * g.kvFloats(), v + t * g.kvFloats());
    attention(layer, q + t * g.queryFloats(), out + t * g.queryFloats());
  }
}

FullKvCache::FullKvCache(const KvGeometry &geometry, ThreadPool &pool)
    : KvCache(geometry), pool_(pool) {
  size_t slots = size_t(geometry.numLayers) * size_t(geometry.numKvHeads);
  keys_.resize(slots);
  values_.resize(slots);
  sizes_.assign(size_t(geometry.numLayers), 0);
}

void FullKvCache::append(int layer, const float *k, const float *v) {
  const KvGeometry &g = geometry();
  size_t hd = size_t(g.headDim);
  for (int h = 0; h < g.numKvHeads; ++h) {
    size_t slot = size_t(layer) * size_t(g.numKvHeads) + size_t(h);
    keys_[slot].insert(keys_[slot].end(), k + h * hd, k + (h + 1) * hd);
    values_[slot].insert(values_[slot].end(), v + h * hd, v + (h + 1) * hd);
  }
  ++sizes_[size_t(layer)];
}

void FullKvCache::attendPrefix(int layer, const float *q, size_t count,
                               float *out, std::vector<float> &scratch) const {
  const KvGeometry &g = geometry();
  int group = g.groupSize();
  size_t hd = size_t(g.headDim);
  size_t stride = hd + 2;
  size_t numChunks = (count + kChunk - 1) / kChunk;
  float scale = 1.0f / std::sqrt(float(g.headDim));
  size_t partialFloats = numChunks * size_t(group) * stride;
  scratch.resize(partialFloats + size_t(group) * kChunk);
  float *partials = scratch.data();
  float *scores = partials + partialFloats;
  for (int kh = 0; kh < g.numKvHeads; ++kh) {
    size_t slot = size_t(layer) * size_t(g.numKvHeads) + size_t(kh);
    const float *qg = q + size_t(kh) * size_t(group) * hd;
    for (size_t c = 0; c < numChunks; ++c)
      chunkAttention(keys_[slot].data(), values_[slot].data(), c * kChunk,
                     std::min(count, (c + 1) * kChunk), qg, group, g.headDim,
                     scale, scores, partials + c * size_t(group) * stride);
    // Partials are chunk-major; head g of chunk c sits at
    // (c * group + g) * stride.
    for (int gi = 0; gi < group; ++gi)
      mergePartials(partials + size_t(gi) * stride, numChunks,
                    size_t(group) * stride, g.headDim,
                    out + (size_t(kh) * size_t(group) + size_t(gi)) * hd);
  }
}

void FullKvCache::attention(int layer, const float *q, float *out) {
  const KvGeometry &g = geometry();
  size_t count = sizes_[size_t(layer)];
  int group = g.groupSize();
  size_t hd = size_t(g.headDim);
  size_t stride = hd + 2;
  size_t numChunks = (count + kChunk - 1) / kChunk;
  size_t units = size_t(g.numKvHeads) * numChunks;
  float scale = 1.0f / std::sqrt(float(g.headDim));
  // One unit is one chunk of one kv head; partials are unit-major.
  std::vector<float> partials(units * size_t(group) * stride);
  pool_.parallelFor(units, [&](size_t begin, size_t end) {
    std::vector<float> scores(size_t(group) * kChunk);
    for (size_t u = begin; u < end; ++u) {
      size_t kh = u / numChunks;
      size_t c = u % numChunks;
      size_t slot = size_t(layer) * size_t(g.numKvHeads) + kh;
      chunkAttention(keys_[slot].data(), values_[slot].data(), c * kChunk,
                     std::min(count, (c + 1) * kChunk),
                     q + kh * size_t(group) * hd, group, g.headDim, scale,
                     scores.data(),
                     partials.data() + u * size_t(group) * stride);
    }
  });
  for (int kh = 0; kh < g.numKvHeads; ++kh)
    for (int gi = 0; gi < group; ++gi)
      mergePartials(partials.data() +
                        (size_t(kh) * numChunks * size_t(group) + size_t(gi)) *
                            stride,
                    numChunks, size_t(group) * stride, g.headDim,
                    out + (size_t(kh) * size_t(group) + size_t(gi)) * hd);
}

void FullKvCache::appendAndAttend(int layer, size_t n, const float *q,
                                  const float *k, const float *v, float *out) {
  const KvGeometry &g = geometry();
  size_t base = sizes_[size_t(layer)];
  for (size_t t = 0; t < n; ++t)
    append(layer, k + t * g.kvFloats(), v + t * g.kvFloats());
  // Token t attends to base + t + 1 entries, so work grows along the batch.
  // Visiting tokens as 0, n-1, 1, n-2, ... gives every contiguous range of
  // the loop about the same amount of work.
  pool_.parallelFor(n, [&](size_t begin, size_t end) {
    std::vector<float> scratch;
    for (size_t i = begin; i < end; ++i) {
      size_t t = (i % 2 == 0) ? i / 2 : n - 1 - i / 2;
      attendPrefix(layer, q + t * g.queryFloats(), base + t + 1,
                   out + t * g.queryFloats(), scratch);
    }
  });
}

size_t FullKvCache::size(int layer) const { return sizes_[size_t(layer)]; }

size_t FullKvCache::bytes() const {
  size_t total = 0;
  for (size_t s = 0; s < keys_.size(); ++s)
    total += (keys_[s].size() + values_[s].size()) * sizeof(float);
  return total;
}

void FullKvCache::clear() {
  for (auto &k : keys_)
    k.clear();
  for (auto &v : values_)
    v.clear();
  std::fill(sizes_.begin(), sizes_.end(), 0);
}

} // namespace run
} // namespace kvc
