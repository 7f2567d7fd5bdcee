//===- KvCache.h - The engine's key/value cache interface -------*- C++ -*-===//
//
// Part of kvc, the KV-cache policy compiler.
//
//===----------------------------------------------------------------------===//
//
// kvc-run keeps its keys and values behind this interface, and attention is
// a method of the cache rather than of the model: a compressed cache reads
// its own storage format and computes the statistics its policy needs in the
// same pass over the entries, so the model only hands over queries, keys and
// values and receives attention outputs. FullKvCache keeps every entry in
// f32 and is the reference the compressed caches are measured against.
//
//===----------------------------------------------------------------------===//

#ifndef KVC_TOOLS_KVCRUN_KVCACHE_H
#define KVC_TOOLS_KVCRUN_KVCACHE_H

#include <cstddef>
#include <vector>

namespace kvc {
namespace run {

class ThreadPool;

/// Shape of the attention the cache serves.
struct KvGeometry {
  int numLayers = 0;
  /// Query heads; a multiple of numKvHeads (grouped-query attention).
  int numHeads = 0;
  int numKvHeads = 0;
  int headDim = 0;

  int groupSize() const { return numHeads / numKvHeads; }
  size_t queryFloats() const { return size_t(numHeads) * size_t(headDim); }
  size_t kvFloats() const { return size_t(numKvHeads) * size_t(headDim); }
};

/// The key/value cache of one sequence. Keys arrive with their rotary
/// embedding applied. Vectors are head-major: head h occupies floats
/// [h * headDim, (h + 1) * headDim). Query head h reads kv head
/// h / groupSize().
class KvCache {
public:
  explicit KvCache(const KvGeometry &geometry) : geometry_(geometry) {}
  virtual ~KvCache();

  const KvGeometry &geometry() const { return geometry_; }

  /// Adds one token's keys and values (kvFloats() each) to `layer`.
  virtual void append(int layer, const float *k, const float *v) = 0;

  /// Writes to `out` (queryFloats()) the softmax attention of one token's
  /// queries `q` (queryFloats(), not yet scaled) over the entries of
  /// `layer`, with scale 1/sqrt(headDim).
  virtual void attention(int layer, const float *q, float *out) = 0;

  /// Processes `n` consecutive tokens of a prompt for `layer`: token t is
  /// appended and then attends to everything before it and itself, exactly
  /// as n calls of append() and attention() would. Caches override this to
  /// run the tokens in parallel.
  virtual void appendAndAttend(int layer, size_t n, const float *q,
                               const float *k, const float *v, float *out);

  /// Number of entries `layer` holds (the largest over its heads, for caches
  /// that keep different numbers per head).
  virtual size_t size(int layer) const = 0;

  /// Bytes of key/value storage in use, over all layers and heads.
  virtual size_t bytes() const = 0;

  /// Drops every entry, to start a new sequence.
  virtual void clear() = 0;

private:
  KvGeometry geometry_;
};

/// Keeps every key and value in f32. Attention splits the entries of each
/// kv head into fixed chunks processed in parallel and merged exactly by
/// their log-sum-exp, so results do not depend on the thread count.
class FullKvCache final : public KvCache {
public:
  /// `pool` runs the parallel loops and must outlive the cache.
  FullKvCache(const KvGeometry &geometry, ThreadPool &pool);

  void append(int layer, const float *k, const float *v) override;
  void attention(int layer, const float *q, float *out) override;
  void appendAndAttend(int layer, size_t n, const float *q, const float *k,
                       const float *v, float *out) override;
  size_t size(int layer) const override;
  size_t bytes() const override;
  void clear() override;

private:
  /// Attention of `q` over the first `count` entries of `layer`, on the
  /// calling thread only.
  void attendPrefix(int layer, const float *q, size_t count, float *out,
                    std::vector<float> &scratch) const;

  ThreadPool &pool_;
  /// keys_[layer * numKvHeads + head] holds that head's keys, entry-major.
  std::vector<std::vector<float>> keys_;
  std::vector<std::vector<float>> values_;
  std::vector<size_t> sizes_;
};

} // namespace run
} // namespace kvc

#endif // KVC_TOOLS_KVCRUN_KVCACHE_H
