//===- PolicyKvCache.cpp - A KV cache managed by a compiled policy --------===//
//
// Part of kvc, the KV-cache policy compiler.
//
//===----------------------------------------------------------------------===//

#include "tools/kvc-run/PolicyKvCache.h"

#include <algorithm>
#include <cstring>
#include <limits>

namespace kvc {
namespace run {

namespace {

/// Entry slots per page. A multiple of every KIVI group the bundled
/// policies use; rounded up to the policy's group otherwise.
constexpr int32_t kPageSize = 64;

std::string describeGeometry(int layers, int qHeads, int kvHeads, int dim) {
  return std::to_string(layers) + " layers, " + std::to_string(qHeads) +
         " query heads, " + std::to_string(kvHeads) + " kv heads of " +
         std::to_string(dim);
}

} // namespace

PolicyKvCache::PolicyKvCache(const KvGeometry &geometry,
                             const PolicyLibrary &library, size_t maxTokens)
    : KvCache(geometry), library_(library) {
  library_.configure(&config_);
  if (config_.num_layers != geometry.numLayers ||
      config_.num_q_heads != geometry.numHeads ||
      config_.num_kv_heads != geometry.numKvHeads ||
      config_.head_dim != geometry.headDim)
    throw PolicyError(
        std::string("policy '") + library_.name + "' was compiled for " +
        describeGeometry(config_.num_layers, config_.num_q_heads,
                         config_.num_kv_heads, config_.head_dim) +
        " but the model has " +
        describeGeometry(geometry.numLayers, geometry.numHeads,
                         geometry.numKvHeads, geometry.headDim));
  if (maxTokens == 0 ||
      maxTokens >= size_t(std::numeric_limits<int32_t>::max()) / 2)
    throw PolicyError("a policy cache needs between 1 and 2^30 tokens");

  bool kivi = config_.format == KVC_FORMAT_KIVI_INT2 ||
              config_.format == KVC_FORMAT_KIVI_INT4;
  int32_t pageSize = kPageSize;
  if (kivi && config_.group_size > 0 && pageSize % config_.group_size != 0)
    pageSize = (pageSize / config_.group_size + 1) * config_.group_size;
  // Appends take the lowest free slot, so a head never needs more slots
  // than the most entries it holds at once: every token, plus the one a
  // decode step appends before it evicts.
  int64_t pagesPerHead = int64_t(maxTokens + 1 + size_t(pageSize) - 1) /
                             pageSize + 1;
  int64_t numPages = pagesPerHead * geometry.numLayers * geometry.numKvHeads;
  if (numPages > std::numeric_limits<int32_t>::max())
    throw PolicyError("the policy cache for " + std::to_string(maxTokens) +
                      " tokens needs more pages than the runtime addresses");
  config_.page_size = pageSize;
  config_.num_pages = int32_t(numPages);
  config_.max_sequences = 1;
  config_.memory = KVC_MEMORY_HOST;

  check(kvc_page_layout(&config_, &layout_), "kvc_page_layout");
  bytesPerEntry_ = double(layout_.key_stride + layout_.value_stride +
                          layout_.value_param_stride);
  size_t elementBytes = config_.dtype == KVC_DTYPE_F32 ? 4 : 2;
  fullRowBytes_ = double(size_t(config_.head_dim) * elementBytes);
  if (kivi)
    bytesPerEntry_ +=
        double(layout_.key_param_stride) / double(config_.group_size);
  else
    bytesPerEntry_ += double(layout_.key_param_stride);
  if (config_.low_format != KVC_FORMAT_FULL) {
    // Mixed precision: entries of the low page class take its row and
    // parameter bytes.
    kvc_page_layout_t low;
    check(kvc_low_page_layout(&config_, &low, nullptr),
          "kvc_low_page_layout");
    lowBytesPerEntry_ = double(low.key_stride + low.value_stride +
                               low.key_param_stride + low.value_param_stride);
  }

  uint64_t poolBytes = 0;
  check(kvc_pool_bytes_required(&config_, &poolBytes),
        "kvc_pool_bytes_required");
  poolStorage_.reset(new char[poolBytes + KVC_POOL_ALIGNMENT]);
  char *pool = poolStorage_.get();
  pool += (KVC_POOL_ALIGNMENT -
           reinterpret_cast<uintptr_t>(pool) % KVC_POOL_ALIGNMENT) %
          KVC_POOL_ALIGNMENT;
  check(kvc_context_create(&config_, pool, poolBytes, &context_),
        "kvc_context_create");
  check(kvc_sequence_add(context_, kSequence), "kvc_sequence_add");

  decodeWorkspaceBytes_ =
      library_.decodeWorkspaceBytes(int32_t(pagesPerHead * pageSize + pageSize));
  workspace_.resize((decodeWorkspaceBytes_ + 7) / 8);

  size_t layers = size_t(geometry.numLayers);
  nextPosition_.assign(layers, 0);
  pendingK_.assign(layers, std::vector<float>(geometry.kvFloats()));
  pendingV_.assign(layers, std::vector<float>(geometry.kvFloats()));
  pending_.assign(layers, false);
}

PolicyKvCache::~PolicyKvCache() { kvc_context_destroy(context_); }

void PolicyKvCache::check(kvc_status_t status, const char *what) const {
  if (status == KVC_STATUS_OK)
    return;
  throw PolicyError(std::string("policy '") + library_.name + "': " + what +
                    " failed with " + kvc_status_string(status) + ": " +
                    kvc_last_error());
}

void PolicyKvCache::append(int layer, const float *k, const float *v) {
  size_t l = size_t(layer);
  if (pending_[l])
    throw PolicyError(std::string("policy '") + library_.name +
                      "': two appends to layer " + std::to_string(layer) +
                      " without an attention between them");
  size_t kv = geometry().kvFloats();
  std::copy(k, k + kv, pendingK_[l].begin());
  std::copy(v, v + kv, pendingV_[l].begin());
  pending_[l] = true;
}

void PolicyKvCache::attention(int layer, const float *q, float *out) {
  size_t l = size_t(layer);
  if (!pending_[l])
    throw PolicyError(std::string("policy '") + library_.name +
                      "': attention on layer " + std::to_string(layer) +
                      " without the token's keys and values (the policy's "
                      "decode appends them)");
  pending_[l] = false;
  decodeOne(layer, q, pendingK_[l].data(), pendingV_[l].data(), out);
}

void PolicyKvCache::decodeOne(int layer, const float *q, const float *k,
                              const float *v, float *out) {
  int32_t position = nextPosition_[size_t(layer)];
  check(library_.decode(context_, kSequence, layer, q, k, v, position, out,
                        workspace_.data(), workspace_.size() * 8),
        "decode");
  ++nextPosition_[size_t(layer)];
}

void PolicyKvCache::appendAndAttend(int layer, size_t n, const float *q,
                                    const float *k, const float *v,
                                    float *out) {
  if (n == 0)
    return;
  if (pending_[size_t(layer)])
    throw PolicyError(std::string("policy '") + library_.name +
                      "': a prompt batch on layer " + std::to_string(layer) +
                      " while a decode token is pending");
  bool empty = true;
  for (int h = 0; h < geometry().numKvHeads && empty; ++h)
    empty = numEntries(layer, h) == 0;
  if (!empty) {
    // Tokens after the first batch: the policy sees them one decode step
    // at a time, as it would during generation.
    size_t qs = geometry().queryFloats(), kvs = geometry().kvFloats();
    for (size_t t = 0; t < n; ++t)
      decodeOne(layer, q + t * qs, k + t * kvs, v + t * kvs, out + t * qs);
    return;
  }
  if (n > size_t(std::numeric_limits<int32_t>::max() / 2))
    throw PolicyError("prompt too long for a policy cache");
  int32_t first = nextPosition_[size_t(layer)];
  positions_.resize(n);
  for (size_t t = 0; t < n; ++t)
    positions_[t] = first + int32_t(t);
  uint64_t bytes = library_.prefillWorkspaceBytes(int32_t(n));
  if (workspace_.size() * 8 < bytes)
    workspace_.resize((bytes + 7) / 8);
  check(library_.prefill(context_, kSequence, layer, int32_t(n), q, k, v,
                         positions_.data(), out, workspace_.data(),
                         workspace_.size() * 8),
        "prefill");
  nextPosition_[size_t(layer)] = first + int32_t(n);
  if (library_.select && layer == geometry().numLayers - 1) {
    // A global budget: one selection over every layer's stored scores,
    // once the last layer's prompt is in.
    bytes = library_.selectWorkspaceBytes(int32_t(n));
    if (workspace_.size() * 8 < bytes)
      workspace_.resize((bytes + 7) / 8);
    check(library_.select(context_, kSequence, int32_t(n), workspace_.data(),
                          workspace_.size() * 8),
          "select");
  }
}

int32_t PolicyKvCache::numEntries(int layer, int head) const {
  int32_t entries = 0;
  check(kvc_get_num_entries(context_, kSequence, layer, head, &entries),
        "kvc_get_num_entries");
  return entries;
}

size_t PolicyKvCache::size(int layer) const {
  int32_t most = 0;
  for (int h = 0; h < geometry().numKvHeads; ++h)
    most = std::max(most, numEntries(layer, h));
  return size_t(most);
}

size_t PolicyKvCache::totalEntries() const {
  size_t total = 0;
  for (int l = 0; l < geometry().numLayers; ++l)
    for (int h = 0; h < geometry().numKvHeads; ++h)
      total += size_t(numEntries(l, h));
  return total;
}

double PolicyKvCache::bytesPerEntry() const {
  if (config_.low_format == KVC_FORMAT_FULL)
    return bytesPerEntry_;
  size_t entries = totalEntries();
  return entries ? double(bytes()) / double(entries) : bytesPerEntry_;
}

size_t PolicyKvCache::bytes() const {
  bool kivi = config_.format == KVC_FORMAT_KIVI_INT2 ||
              config_.format == KVC_FORMAT_KIVI_INT4;
  double total = 0.0;
  for (int l = 0; l < geometry().numLayers; ++l) {
    for (int h = 0; h < geometry().numKvHeads; ++h) {
      if (!kivi && config_.low_format == KVC_FORMAT_FULL) {
        total += double(numEntries(l, h)) * bytesPerEntry_;
        continue;
      }
      if (!kivi) {
        kvc_metadata_t meta;
        check(kvc_get_metadata(context_, kSequence, l, h, &meta),
              "kvc_get_metadata");
        for (int32_t s = 0; s < meta.num_slots; ++s)
          if (meta.position[s] != KVC_POSITION_NONE)
            total += meta.key_format[s] == config_.low_format
                         ? lowBytesPerEntry_
                         : bytesPerEntry_;
        continue;
      }
      // KIVI entries in the residual window are still full precision (the
      // metadata reports them as FULL): their key or value row counts at
      // full size, the others at their packed size plus parameters.
      kvc_metadata_t meta;
      check(kvc_get_metadata(context_, kSequence, l, h, &meta),
            "kvc_get_metadata");
      double keyBytes = double(layout_.key_stride) +
                        double(layout_.key_param_stride) /
                            double(config_.group_size);
      double valueBytes =
          double(layout_.value_stride + layout_.value_param_stride);
      for (int32_t s = 0; s < meta.num_slots; ++s) {
        if (meta.position[s] == KVC_POSITION_NONE)
          continue;
        total += meta.key_format[s] == KVC_FORMAT_FULL ? fullRowBytes_
                                                        : keyBytes;
        total += meta.value_format[s] == KVC_FORMAT_FULL ? fullRowBytes_
                                                          : valueBytes;
      }
    }
  }
  return size_t(total + 0.5);
}

void PolicyKvCache::clear() {
  check(kvc_sequence_remove(context_, kSequence), "kvc_sequence_remove");
  check(kvc_sequence_add(context_, kSequence), "kvc_sequence_add");
  std::fill(nextPosition_.begin(), nextPosition_.end(), 0);
  std::fill(pending_.begin(), pending_.end(), false);
}

} // namespace run
} // namespace kvc
