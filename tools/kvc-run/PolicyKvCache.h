//===- PolicyKvCache.h - A KV cache managed by a compiled policy -*- C++ -*-===//
//
// Part of kvc, the KV-cache policy compiler.
//
//===----------------------------------------------------------------------===//
//
// PolicyKvCache keeps the model's keys and values in the kvc runtime, in a
// pool this object owns, and hands attention to a policy library compiled by
// kvc: a whole prompt goes to the library's prefill (causal attention, then
// the policy's scoring and selection, and the gather of the kept entries
// into the runtime's pages), every later token to its decode (append, one
// pass of attention that also updates the policy's statistics, eviction).
// Heads and layers may end up holding different numbers of entries; bytes()
// counts what is really kept.
//
//===----------------------------------------------------------------------===//

#ifndef KVC_TOOLS_KVCRUN_POLICYKVCACHE_H
#define KVC_TOOLS_KVCRUN_POLICYKVCACHE_H

#include "tools/kvc-run/KvCache.h"
#include "tools/kvc-run/PolicyLibrary.h"

#include <cstdint>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

namespace kvc {
namespace run {

/// A failure reported by the kvc runtime or a policy library, with the
/// runtime's message.
class PolicyError : public std::runtime_error {
public:
  explicit PolicyError(const std::string &message)
      : std::runtime_error(message) {}
};

class PolicyKvCache final : public KvCache {
public:
  /// Creates the runtime context for `library`, whose compiled geometry
  /// must be `geometry`, with a pool large enough for one sequence of
  /// `maxTokens` tokens in every layer and head without eviction. Throws
  /// PolicyError when the geometry differs or the runtime refuses.
  PolicyKvCache(const KvGeometry &geometry, const PolicyLibrary &library,
                size_t maxTokens);
  ~PolicyKvCache() override;
  PolicyKvCache(const PolicyKvCache &) = delete;
  PolicyKvCache &operator=(const PolicyKvCache &) = delete;

  /// Stashes the token's keys and values; the following attention() on the
  /// same layer passes them to the policy's decode, which appends them.
  void append(int layer, const float *k, const float *v) override;
  /// Runs the policy's decode for the token stashed by append().
  void attention(int layer, const float *q, float *out) override;
  /// On an empty layer, runs the policy's prefill over the `n` tokens at
  /// once (its scoring needs the whole prompt); on a non-empty layer, n
  /// decode steps.
  void appendAndAttend(int layer, size_t n, const float *q, const float *k,
                       const float *v, float *out) override;
  size_t size(int layer) const override;
  /// Key and value bytes of the live entries, from the runtime's page
  /// layout: rows and per-entry quantization parameters (per-block
  /// parameters shared out over their block); a KIVI entry still in the
  /// full-precision residual window counts at full precision.
  size_t bytes() const override;
  void clear() override;

  const PolicyLibrary &library() const { return library_; }
  /// Live entries of one (layer, kv-head).
  int32_t numEntries(int layer, int head) const;
  /// Live entries over all layers and heads.
  size_t totalEntries() const;
  /// Bytes one entry takes in this cache's page format, once quantized
  /// (see bytes()).
  /// Bytes of one cached entry; for mixed precision, the mean over the
  /// entries cached now.
  double bytesPerEntry() const;

private:
  /// Throws PolicyError describing `what` with the runtime's last error
  /// unless `status` is KVC_STATUS_OK.
  void check(kvc_status_t status, const char *what) const;
  void decodeOne(int layer, const float *q, const float *k, const float *v,
                 float *out);

  const PolicyLibrary &library_;
  kvc_config_t config_{};
  kvc_page_layout_t layout_{};
  double bytesPerEntry_ = 0.0;
  /// Mixed precision: bytes of an entry of the low page class.
  double lowBytesPerEntry_ = 0.0;
  /// Bytes of one full-precision key or value row.
  double fullRowBytes_ = 0.0;
  /// The pool, over-allocated by KVC_POOL_ALIGNMENT to align its start.
  std::unique_ptr<char[]> poolStorage_;
  kvc_context_t *context_ = nullptr;
  static constexpr uint64_t kSequence = 0;
  std::vector<uint64_t> workspace_;
  uint64_t decodeWorkspaceBytes_ = 0;
  /// Position the next token of each layer gets.
  std::vector<int32_t> nextPosition_;
  /// Keys and values of the token append() stashed, per layer.
  std::vector<std::vector<float>> pendingK_, pendingV_;
  std::vector<bool> pending_;
  std::vector<int32_t> positions_;
};

} // namespace run
} // namespace kvc

#endif // KVC_TOOLS_KVCRUN_POLICYKVCACHE_H
