//===- Context.cpp - Paged per-head KV storage ----------------------------===//
//
// The context: pool accounting, per (sequence, layer, kv-head) page tables,
// per-slot metadata, appends with slot reuse, eviction that returns empty
// pages to the pool, compaction, and the KIVI residual window.
//
// All bookkeeping lives in host memory and names pages by index, so the same
// code serves host and device pools; only the data paths dereference the
// pool, and they refuse device pools. KIVI appends record the staging and
// quantization they imply (KiviWork) on every pool; the runtime performs it
// on host pools, kernels on device pools.
//
// Transactions: every mutating entry point validates everything and performs
// every host allocation it needs before it changes anything, so a failure
// (including std::bad_alloc) leaves the context as it was.
//
//===----------------------------------------------------------------------===//

#include "runtime/Formats.h"
#include "runtime/Support.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <optional>
#include <unordered_map>
#include <vector>

using namespace kvc::rt;

#define KVC_CHECK(expr)                                                        \
  do {                                                                         \
    if (kvc_status_t kvcCheckStatus = (expr))                                  \
      return kvcCheckStatus;                                                   \
  } while (false)

namespace {

constexpr uint64_t kRegionAlignment = 16;

uint64_t alignUp(uint64_t value, uint64_t alignment) {
  return (value + alignment - 1) / alignment * alignment;
}

/// The data work of the latest KIVI append of a head (kvc_kivi_work_t).
struct KiviWork {
  std::vector<kvc_kivi_row_t> values;
  std::vector<int32_t> blockBegin{0};
  std::vector<kvc_kivi_row_t> members;
  std::vector<kvc_kivi_row_t> stages;

  void clear() {
    values.clear();
    blockBegin.assign(1, 0);
    members.clear();
    stages.clear();
  }
};

/// v.reserve(n), without the call when the capacity suffices: a decode
/// step's appends reserve the same room for every head at every step.
template <typename T>
inline void reserveAtLeast(std::vector<T> &v, size_t n) {
  if (v.capacity() < n)
    v.reserve(n);
}

/// Where the next `count` entries of a head go, computed without changing
/// anything: the slots in order and the page-table entries to map.
struct AppendPlan {
  std::vector<int32_t> slots;
  /// Table indices that need a fresh pool page (holes, then new entries).
  std::vector<int32_t> newPages;
  size_t tableSize = 0;
};

/// An append planned and ready to commit (prepareAppend).
struct PreparedAppend {
  AppendPlan plan;
  std::optional<KiviWork> work;
};

/// Bookkeeping of one (sequence, layer, kv-head).
struct HeadState {
  /// Pool page id of each page-table entry; -1 marks a hole left by a page
  /// that eviction returned to the pool (closed by compaction).
  std::vector<int32_t> pages;
  /// Live entries per page-table entry.
  std::vector<int32_t> pageLive;
  /// Per-slot metadata (length pages.size() * page_size).
  std::vector<int32_t> position;
  std::vector<float> score;
  std::vector<float> weight;
  /// Per-step bits of a policy statistic, the latest step in bit 0.
  std::vector<uint64_t> history;
  std::vector<uint8_t> keyFormat;
  std::vector<uint8_t> valueFormat;
  /// KIVI: index of the entry in this head's append order, per slot.
  std::vector<int64_t> appendIndex;
  int32_t live = 0;
  int32_t budget = -1;

  // KIVI residual window. Entry a (in append order) owns residual row
  // a % R while a >= appended - R; `residualSlot` maps each row to the slot
  // of its entry (-1 once evicted or before use).
  int64_t appended = 0;
  int64_t keysFlushed = 0;
  std::vector<int32_t> residualSlot;
  /// First slot of the block receiving appends, or -1; `openFill` slots of
  /// it have been handed out.
  int32_t openBlock = -1;
  int32_t openFill = 0;
  /// Bit i set: page-table entry i may hold a free unit. Every mapped page
  /// with a free unit has its bit set (kvc_pool_check verifies it), so an
  /// append searches the set bits only, lowest first. Set by whatever
  /// frees a slot or maps a page; cleared by the appends that find the page
  /// without one (the bits are a cache of that search, not state).
  mutable std::vector<uint64_t> openPages;
  KiviWork work;
  /// Changes of `work` (kvc_kivi_work_t::serial): each append records a new
  /// record, each kvc_evict of some entry and each kvc_compact clears it.
  uint64_t workSerial = 0;
};

struct Sequence {
  /// Index into the residual region (0 .. max_sequences-1).
  int32_t index = 0;
  std::vector<HeadState> heads;
  /// Per layer: the backend record attached to it (all NULL: none).
  std::vector<kvc_attachment_t> attachments;
};

bool isAttached(const kvc_attachment_t &a) {
  return a.data || a.flush || a.release;
}

/// Releases every record attached to a sequence, without flushing.
void releaseAttachments(Sequence &seq) {
  for (kvc_attachment_t &a : seq.attachments) {
    kvc_attachment_t taken = a;
    a = kvc_attachment_t{};
    if (taken.release)
      taken.release(taken.data);
  }
}

/// Layout of the pages of `format` under a configuration, computed without
/// validating it.
kvc_page_layout_t computeClassLayout(const kvc_config_t &c, int32_t format) {
  kvc_page_layout_t l{};
  uint64_t d = static_cast<uint64_t>(c.head_dim);
  uint64_t p = static_cast<uint64_t>(c.page_size);
  uint64_t e = dtypeBytes(c.dtype);
  switch (format) {
  case KVC_FORMAT_FULL:
    l.key_stride = l.value_stride = d * e;
    break;
  case KVC_FORMAT_INT8:
  case KVC_FORMAT_FP8_E4M3:
    l.key_stride = l.value_stride = d;
    l.key_param_stride = l.value_param_stride = sizeof(float);
    break;
  case KVC_FORMAT_INT2:
  case KVC_FORMAT_INT4: {
    uint64_t g = static_cast<uint64_t>(c.group_size);
    l.key_stride = l.value_stride = d * tokenGroupBits(format) / 8;
    l.key_param_stride = l.value_param_stride =
        g ? sizeof(AsymRecord) * (d / g) : 0;
    break;
  }
  case KVC_FORMAT_KIVI_INT2:
  case KVC_FORMAT_KIVI_INT4: {
    uint64_t g = static_cast<uint64_t>(c.group_size);
    l.key_stride = l.value_stride = d * kiviBits(format) / 8;
    l.key_param_stride = sizeof(AsymRecord) * d;
    l.value_param_stride = g ? sizeof(AsymRecord) * (d / g) : 0;
    l.residual_bytes =
        alignUp(2 * static_cast<uint64_t>(c.residual_length) * d * e,
                KVC_POOL_ALIGNMENT);
    break;
  }
  }
  l.key_offset = 0;
  l.value_offset = alignUp(p * l.key_stride, kRegionAlignment);
  uint64_t end = l.value_offset + p * l.value_stride;
  l.key_param_offset = alignUp(end, kRegionAlignment);
  uint64_t keyRecords = kiviBits(format) && c.group_size > 0
                            ? p / static_cast<uint64_t>(c.group_size)
                            : p;
  end = l.key_param_offset + keyRecords * l.key_param_stride;
  l.value_param_offset = alignUp(end, kRegionAlignment);
  end = l.value_param_offset + p * l.value_param_stride;
  l.page_bytes = alignUp(end, KVC_POOL_ALIGNMENT);
  l.residual_offset = 0;
  l.pages_offset = static_cast<uint64_t>(c.max_sequences) *
                   static_cast<uint64_t>(c.num_layers) *
                   static_cast<uint64_t>(c.num_kv_heads) * l.residual_bytes;
  return l;
}

/// Layout of a configuration's (high) pages.
kvc_page_layout_t computeLayout(const kvc_config_t &c) {
  return computeClassLayout(c, c.format);
}

/// Layout of the low pages of a mixed-precision configuration: offsets
/// within a low page, page_bytes its stride inside a pool page.
kvc_page_layout_t computeLowLayout(const kvc_config_t &c) {
  kvc_page_layout_t l = computeClassLayout(c, c.low_format);
  l.pages_offset = computeLayout(c).pages_offset;
  return l;
}

/// Low pages per pool page (0 when a low page does not fit).
int32_t lowPagesPerPage(const kvc_config_t &c) {
  return static_cast<int32_t>(computeLayout(c).page_bytes /
                              computeLowLayout(c).page_bytes);
}

kvc_status_t validateConfig(const char *name, const kvc_config_t *c) {
  if (!c)
    return fail(KVC_STATUS_NULL_POINTER, "%s: config is NULL", name);
  struct Positive {
    const char *field;
    int32_t value;
  } positives[] = {
      {"num_layers", c->num_layers},      {"num_q_heads", c->num_q_heads},
      {"num_kv_heads", c->num_kv_heads},  {"head_dim", c->head_dim},
      {"page_size", c->page_size},        {"num_pages", c->num_pages},
      {"max_sequences", c->max_sequences}};
  for (const Positive &p : positives)
    if (p.value <= 0)
      return fail(KVC_STATUS_INVALID_ARGUMENT, "%s: %s must be > 0 (got %d)",
                  name, p.field, p.value);
  if (c->dtype < KVC_DTYPE_F32 || c->dtype > KVC_DTYPE_BF16)
    return fail(KVC_STATUS_INVALID_ARGUMENT, "%s: unknown dtype %d", name,
                static_cast<int>(c->dtype));
  if (c->format < KVC_FORMAT_FULL || c->format > KVC_FORMAT_KIVI_INT4)
    return fail(KVC_STATUS_INVALID_ARGUMENT, "%s: unknown format %d", name,
                static_cast<int>(c->format));
  if (c->memory != KVC_MEMORY_HOST && c->memory != KVC_MEMORY_DEVICE)
    return fail(KVC_STATUS_INVALID_ARGUMENT, "%s: unknown memory kind %d", name,
                static_cast<int>(c->memory));
  if (c->num_q_heads % c->num_kv_heads != 0)
    return fail(KVC_STATUS_GEOMETRY_MISMATCH,
                "%s: num_q_heads %d is not a multiple of num_kv_heads %d", name,
                c->num_q_heads, c->num_kv_heads);
  if (c->head_dim % 2 != 0)
    return fail(KVC_STATUS_GEOMETRY_MISMATCH, "%s: head_dim %d is odd", name,
                c->head_dim);
  if (int bits = kiviBits(c->format)) {
    int32_t g = c->group_size, r = c->residual_length;
    if (g <= 0 || c->head_dim % g != 0)
      return fail(KVC_STATUS_GEOMETRY_MISMATCH,
                  "%s: KIVI group %d does not divide head_dim %d", name, g,
                  c->head_dim);
    if (c->page_size % g != 0)
      return fail(KVC_STATUS_GEOMETRY_MISMATCH,
                  "%s: KIVI group %d does not divide page_size %d", name, g,
                  c->page_size);
    if (r <= 0 || r % g != 0)
      return fail(KVC_STATUS_GEOMETRY_MISMATCH,
                  "%s: KIVI residual %d is not a positive multiple of group "
                  "%d",
                  name, r, g);
    if ((static_cast<int64_t>(c->head_dim) * bits) % 8 != 0)
      return fail(KVC_STATUS_GEOMETRY_MISMATCH,
                  "%s: head_dim %d does not pack into whole bytes at %d bits",
                  name, c->head_dim, bits);
  }
  if (c->low_format != KVC_FORMAT_FULL) {
    int bits = tokenGroupBits(c->low_format);
    if (!bits)
      return fail(KVC_STATUS_INVALID_ARGUMENT,
                  "%s: low_format %d is not KVC_FORMAT_INT2 or "
                  "KVC_FORMAT_INT4",
                  name, static_cast<int>(c->low_format));
    if (kiviBits(c->format))
      return fail(KVC_STATUS_INVALID_ARGUMENT,
                  "%s: a mixed-precision context's high format must be FULL, "
                  "INT8 or FP8_E4M3, not KIVI",
                  name);
    int32_t g = c->group_size;
    if (g <= 0 || c->head_dim % g != 0)
      return fail(KVC_STATUS_GEOMETRY_MISMATCH,
                  "%s: low-class group %d does not divide head_dim %d", name,
                  g, c->head_dim);
    if ((static_cast<int64_t>(c->head_dim) * bits) % 8 != 0)
      return fail(KVC_STATUS_GEOMETRY_MISMATCH,
                  "%s: head_dim %d does not pack into whole bytes at %d bits",
                  name, c->head_dim, bits);
    if (lowPagesPerPage(*c) < 1)
      return fail(KVC_STATUS_GEOMETRY_MISMATCH,
                  "%s: a low page (%llu bytes) does not fit in a pool page "
                  "(%llu bytes)",
                  name,
                  static_cast<unsigned long long>(
                      computeLowLayout(*c).page_bytes),
                  static_cast<unsigned long long>(computeLayout(*c).page_bytes));
    if (static_cast<int64_t>(c->num_pages) * lowPagesPerPage(*c) >
        std::numeric_limits<int32_t>::max() - c->num_pages)
      return fail(KVC_STATUS_INVALID_ARGUMENT,
                  "%s: too many low pages for 32-bit page ids", name);
  }
  // Slot numbers, page ids and byte sizes must not overflow.
  int64_t slots = static_cast<int64_t>(c->num_pages) * c->page_size;
  if (slots > std::numeric_limits<int32_t>::max())
    return fail(KVC_STATUS_INVALID_ARGUMENT,
                "%s: num_pages * page_size exceeds 2^31-1 slots", name);
  kvc_page_layout_t l = computeLayout(*c);
  long double total = static_cast<long double>(l.pages_offset) +
                      static_cast<long double>(l.page_bytes) * c->num_pages;
  if (total >
      static_cast<long double>(std::numeric_limits<uint64_t>::max() / 2))
    return fail(KVC_STATUS_INVALID_ARGUMENT, "%s: pool size overflows", name);
  return KVC_STATUS_OK;
}

} // namespace

/// The opaque context of the ABI.
struct kvc_context {
  kvc_config_t config{};
  kvc_page_layout_t layout{};
  uint8_t *pool = nullptr;
  /// Slots handed out together: 1, or G for KIVI (key blocks).
  int32_t unit = 1;
  /// Free pool pages; capacity num_pages, so pushes never allocate.
  std::vector<int32_t> freePages;

  // Mixed precision. Page ids name the pages of page tables: a high page is
  // its pool page id (0 .. num_pages-1); the low page `sub` of pool page q
  // is num_pages + q * lowPerPage + sub.
  kvc_page_layout_t lowLayout{};
  int32_t lowPerPage = 0;
  /// Free low pages of pool pages that serve the low class (capacity
  /// num_pages * lowPerPage); a pool page serves it while lowUsed > 0.
  std::vector<int32_t> lowFree;
  std::vector<int32_t> lowUsed;
  std::unordered_map<uint64_t, Sequence> sequences;
  /// Which residual indices are taken.
  std::vector<uint8_t> sequenceIndexUsed;
  /// The appends of the call in progress (kvc_append: one; kvc_append_step:
  /// one per head of the batch), kept between calls so that a decode step
  /// allocates nothing once the lists have grown.
  std::vector<PreparedAppend> prepared;
  /// kvc_append_step: the batch's sequences, looked up once, and sorted
  /// (to find one that appears twice).
  std::vector<Sequence *> stepSequences, stepSorted;
  /// Whether the format is a KIVI one (kiviBits(config.format) != 0).
  bool kivi = false;

  bool isHost() const { return config.memory == KVC_MEMORY_HOST; }
  bool isKivi() const { return kivi; }
  int32_t headsPerSequence() const {
    return config.num_layers * config.num_kv_heads;
  }
  int32_t slotCapacity() const { return config.num_pages * config.page_size; }

  bool hasLowClass() const { return config.low_format != KVC_FORMAT_FULL; }
  bool isLowPage(int32_t id) const { return id >= config.num_pages; }
  /// The pool page holding page `id`.
  int32_t poolPageOf(int32_t id) const {
    return isLowPage(id) ? (id - config.num_pages) / lowPerPage : id;
  }
  const kvc_page_layout_t &layoutOf(int32_t id) const {
    return isLowPage(id) ? lowLayout : layout;
  }
  /// The kvc_format_t of the entries of page `id`.
  int32_t formatOf(int32_t id) const {
    return isLowPage(id) ? config.low_format : config.format;
  }
  uint64_t pageOffset(int32_t id) const {
    uint64_t offset = layout.pages_offset +
                      static_cast<uint64_t>(poolPageOf(id)) * layout.page_bytes;
    if (isLowPage(id))
      offset += static_cast<uint64_t>((id - config.num_pages) % lowPerPage) *
                lowLayout.page_bytes;
    return offset;
  }
  uint8_t *pageBase(int32_t id) const { return pool + pageOffset(id); }

  /// Pages of a class that can still be taken.
  int64_t pagesAvailable(bool low) const {
    int64_t pages = static_cast<int64_t>(freePages.size());
    return low ? static_cast<int64_t>(lowFree.size()) + pages * lowPerPage
               : pages;
  }
  /// Takes a page of a class (the caller checked pagesAvailable); never
  /// allocates: every list has its capacity from the start.
  int32_t takePage(bool low) {
    if (!low || lowFree.empty()) {
      int32_t q = freePages.back();
      freePages.pop_back();
      if (!low)
        return q;
      for (int32_t sub = lowPerPage - 1; sub >= 0; --sub)
        lowFree.push_back(config.num_pages + q * lowPerPage + sub);
    }
    int32_t id = lowFree.back();
    lowFree.pop_back();
    ++lowUsed[poolPageOf(id)];
    return id;
  }
  /// Returns a page to its class; a pool page whose low pages are all free
  /// goes back to the pool.
  void releasePage(int32_t id) {
    if (!isLowPage(id)) {
      freePages.push_back(id);
      return;
    }
    int32_t q = poolPageOf(id);
    lowFree.push_back(id);
    if (--lowUsed[q] > 0)
      return;
    lowFree.erase(std::remove_if(lowFree.begin(), lowFree.end(),
                                 [&](int32_t x) { return poolPageOf(x) == q; }),
                  lowFree.end());
    freePages.push_back(q);
  }
  /// Residual row `row` of head `headIndex` of the sequence at `seqIndex`:
  /// keys first (R rows), then values (R rows).
  uint8_t *residualKey(int32_t seqIndex, int32_t headIndex, int64_t row) const {
    uint64_t rowBytes =
        static_cast<uint64_t>(config.head_dim) * dtypeBytes(config.dtype);
    uint64_t head = static_cast<uint64_t>(seqIndex) * headsPerSequence() +
                    static_cast<uint64_t>(headIndex);
    return pool + layout.residual_offset + head * layout.residual_bytes +
           static_cast<uint64_t>(row) * rowBytes;
  }
  uint8_t *residualValue(int32_t seqIndex, int32_t headIndex,
                         int64_t row) const {
    uint64_t rowBytes =
        static_cast<uint64_t>(config.head_dim) * dtypeBytes(config.dtype);
    return residualKey(seqIndex, headIndex, row) +
           static_cast<uint64_t>(config.residual_length) * rowBytes;
  }
};

namespace {

/// A resolved (sequence, layer, head) reference.
struct HeadRef {
  Sequence *sequence = nullptr;
  HeadState *head = nullptr;
  int32_t headIndex = 0;
};

kvc_status_t lookupHead(const char *name, const kvc_context *ctx,
                        uint64_t sequence, int32_t layer, int32_t head,
                        HeadRef &out) {
  if (!ctx)
    return fail(KVC_STATUS_NULL_POINTER, "%s: context is NULL", name);
  auto it = const_cast<kvc_context *>(ctx)->sequences.find(sequence);
  if (it == ctx->sequences.end())
    return fail(KVC_STATUS_OUT_OF_RANGE, "%s: unknown sequence %llu", name,
                static_cast<unsigned long long>(sequence));
  if (layer < 0 || layer >= ctx->config.num_layers)
    return fail(KVC_STATUS_OUT_OF_RANGE, "%s: layer %d out of range [0, %d)",
                name, layer, ctx->config.num_layers);
  if (head < 0 || head >= ctx->config.num_kv_heads)
    return fail(KVC_STATUS_OUT_OF_RANGE, "%s: kv head %d out of range [0, %d)",
                name, head, ctx->config.num_kv_heads);
  out.sequence = &it->second;
  out.headIndex = layer * ctx->config.num_kv_heads + head;
  out.head = &it->second.heads[out.headIndex];
  return KVC_STATUS_OK;
}

/// Settles the record attached to (sequence, layer) before the host
/// bookkeeping it shadows is read or changed: detaches it, flushes it and
/// releases it (kvc_attachment_t).
kvc_status_t settle(kvc_context *ctx, uint64_t sequence, const HeadRef &ref,
                    int32_t layer) {
  kvc_attachment_t &slot = ref.sequence->attachments[layer];
  if (!isAttached(slot))
    return KVC_STATUS_OK;
  const kvc_attachment_t taken = slot;
  slot = kvc_attachment_t{};
  const kvc_status_t status =
      taken.flush ? taken.flush(taken.data, ctx, sequence, layer)
                  : KVC_STATUS_OK;
  if (taken.release)
    taken.release(taken.data);
  return status;
}

/// settle() for a query: the context is logically unchanged (the host
/// bookkeeping only catches up with what the attached record holds), so
/// the accessors keep their const context.
kvc_status_t settleForQuery(const kvc_context *ctx, uint64_t sequence,
                            const HeadRef &ref, int32_t layer) {
  return settle(const_cast<kvc_context *>(ctx), sequence, ref, layer);
}

/// lookupHead() of a query, then settleForQuery(): the head as its
/// attached record (if any) leaves it.
kvc_status_t lookupSettledHead(const char *name, const kvc_context *ctx,
                               uint64_t sequence, int32_t layer, int32_t head,
                               HeadRef &ref) {
  KVC_CHECK(lookupHead(name, ctx, sequence, layer, head, ref));
  return settleForQuery(ctx, sequence, ref, layer);
}

/// Settles every record attached to the context (for the pool-wide
/// queries).
kvc_status_t settleAll(const kvc_context *ctx) {
  kvc_context *mutableCtx = const_cast<kvc_context *>(ctx);
  for (auto &entry : mutableCtx->sequences) {
    HeadRef ref;
    ref.sequence = &entry.second;
    for (int32_t layer = 0; layer < ctx->config.num_layers; ++layer)
      KVC_CHECK(settle(mutableCtx, entry.first, ref, layer));
  }
  return KVC_STATUS_OK;
}

/// The page id of page-table entry `page` of a head (-1 for a hole).
kvc_status_t lookupPage(const char *name, const kvc_context *ctx,
                        uint64_t sequence, int32_t layer, int32_t head,
                        int32_t page, int32_t &id) {
  HeadRef ref;
  KVC_CHECK(lookupSettledHead(name, ctx, sequence, layer, head, ref));
  int32_t size = static_cast<int32_t>(ref.head->pages.size());
  if (page < 0 || page >= size)
    return fail(KVC_STATUS_OUT_OF_RANGE, "%s: page %d out of range [0, %d)",
                name, page, size);
  id = ref.head->pages[page];
  return KVC_STATUS_OK;
}

kvc_status_t checkLiveSlot(const char *name, const kvc_context *ctx,
                           const HeadState &h, int32_t slot) {
  int64_t slots = static_cast<int64_t>(h.pages.size()) * ctx->config.page_size;
  if (slot < 0 || slot >= slots)
    return fail(KVC_STATUS_OUT_OF_RANGE, "%s: slot %d out of range [0, %lld)",
                name, slot, static_cast<long long>(slots));
  if (h.position[slot] == KVC_POSITION_NONE)
    return fail(KVC_STATUS_OUT_OF_RANGE, "%s: slot %d is free", name, slot);
  return KVC_STATUS_OK;
}

kvc_status_t checkDim(const char *name, const kvc_context *ctx, int32_t dim) {
  if (dim != ctx->config.head_dim)
    return fail(KVC_STATUS_GEOMETRY_MISMATCH,
                "%s: dim %d does not match head_dim %d", name, dim,
                ctx->config.head_dim);
  return KVC_STATUS_OK;
}

kvc_status_t checkFloatArray(const char *name, const char *what,
                             const float *p) {
  if (!p)
    return fail(KVC_STATUS_NULL_POINTER, "%s: %s is NULL", name, what);
  if (!isAligned<float>(p))
    return fail(KVC_STATUS_MISALIGNED, "%s: %s is not 4-byte aligned", name,
                what);
  return KVC_STATUS_OK;
}

kvc_status_t checkFinite(const char *name, const char *what, const float *p,
                         int64_t n) {
  for (int64_t i = 0; i < n; ++i)
    if (!std::isfinite(p[i]))
      return fail(KVC_STATUS_INVALID_ARGUMENT, "%s: %s[%lld] is not finite",
                  name, what, static_cast<long long>(i));
  return KVC_STATUS_OK;
}

/// True when every slot of the unit starting at `first` is free and it is not
/// the KIVI block still receiving appends.
bool unitIsFree(const kvc_context *ctx, const HeadState &h, int32_t first) {
  if (first == h.openBlock)
    return false;
  for (int32_t s = first; s < first + ctx->unit; ++s)
    if (h.position[s] != KVC_POSITION_NONE)
      return false;
  return true;
}

bool unitHasLive(const kvc_context *ctx, const HeadState &h, int32_t first) {
  for (int32_t s = first; s < first + ctx->unit; ++s)
    if (h.position[s] != KVC_POSITION_NONE)
      return true;
  return false;
}

/// Marks page-table entry `page` of `h` as one that may hold a free unit.
void markOpen(const HeadState &h, size_t page) {
  h.openPages[page / 64] |= uint64_t{1} << (page % 64);
}

/// Grows the per-slot metadata of `h` to `tableSize` pages. Callers reserve
/// first, so this never throws after the commit point.
void resizeTable(const kvc_context *ctx, HeadState &h, size_t tableSize) {
  size_t slots = tableSize * static_cast<size_t>(ctx->config.page_size);
  // New entries are holes (a mapping marks them); bits of entries past the
  // end may stay set, which costs a look, never a missed unit.
  h.openPages.resize((tableSize + 63) / 64, 0);
  h.pages.resize(tableSize, -1);
  h.pageLive.resize(tableSize, 0);
  h.position.resize(slots, KVC_POSITION_NONE);
  h.score.resize(slots, 0.0f);
  h.weight.resize(slots, 0.0f);
  h.history.resize(slots, 0);
  h.keyFormat.resize(slots, KVC_FORMAT_FULL);
  h.valueFormat.resize(slots, KVC_FORMAT_FULL);
  h.appendIndex.resize(slots, -1);
}

/// Copies the metadata of slot `from` of `src` to slot `to` of `dst`.
void copySlotMetadata(const HeadState &src, int32_t from, HeadState &dst,
                      int32_t to) {
  dst.position[to] = src.position[from];
  dst.score[to] = src.score[from];
  dst.weight[to] = src.weight[from];
  dst.history[to] = src.history[from];
  dst.keyFormat[to] = src.keyFormat[from];
  dst.valueFormat[to] = src.valueFormat[from];
  dst.appendIndex[to] = src.appendIndex[from];
}

/// Reserves room for `tableSize` page-table entries and their slots'
/// metadata, so that resizeTable to that size cannot throw. Capacity grows
/// by half at least, as the vectors' own growth would: a head that gains
/// one page per page_size appends does not copy its metadata each time.
void reserveTable(const kvc_context *ctx, HeadState &h, size_t tableSize) {
  if (tableSize > h.pages.capacity())
    tableSize =
        std::max(tableSize, h.pages.capacity() + h.pages.capacity() / 2);
  size_t slots = tableSize * static_cast<size_t>(ctx->config.page_size);
  h.openPages.reserve((tableSize + 63) / 64);
  h.pages.reserve(tableSize);
  h.pageLive.reserve(tableSize);
  h.position.reserve(slots);
  h.score.reserve(slots);
  h.weight.reserve(slots);
  h.history.reserve(slots);
  h.keyFormat.reserve(slots);
  h.valueFormat.reserve(slots);
  h.appendIndex.reserve(slots);
}

/// Releases trailing holes of the page table.
void trimTable(const kvc_context *ctx, HeadState &h) {
  size_t size = h.pages.size();
  while (size > 0 && h.pages[size - 1] < 0)
    --size;
  if (size != h.pages.size())
    resizeTable(ctx, h, size);
}

//===----------------------------------------------------------------------===//
// Entry data (host pools)
//===----------------------------------------------------------------------===//

/// Where a slot's bytes are: its page, the layout and format of that page's
/// class, and the slot's offset in the page.
struct SlotAddress {
  uint8_t *page;
  const kvc_page_layout_t *layout;
  int32_t format;
  int32_t offset;
};

SlotAddress slotAddress(const kvc_context *ctx, const HeadState &h,
                        int32_t slot) {
  int32_t p = ctx->config.page_size;
  int32_t id = h.pages[slot / p];
  return {ctx->pageBase(id), &ctx->layoutOf(id), ctx->formatOf(id), slot % p};
}

/// The parameter record of a slot's key (a KIVI block's: that of its
/// block): float scales (INT8, FP8) or AsymRecords (the asymmetric formats).
uint8_t *keyParams(const kvc_context *ctx, SlotAddress a) {
  uint64_t record =
      ctx->isKivi() ? static_cast<uint64_t>(a.offset / ctx->config.group_size)
                    : static_cast<uint64_t>(a.offset);
  return a.page + a.layout->key_param_offset +
         record * a.layout->key_param_stride;
}

uint8_t *valueParams(const kvc_context *, SlotAddress a) {
  return a.page + a.layout->value_param_offset +
         static_cast<uint64_t>(a.offset) * a.layout->value_param_stride;
}

AsymRecord *asymRecords(uint8_t *params) {
  return reinterpret_cast<AsymRecord *>(params);
}
float *floatParam(uint8_t *params) { return reinterpret_cast<float *>(params); }

uint8_t *keyRow(const kvc_context *, SlotAddress a) {
  return a.page + a.layout->key_offset +
         static_cast<uint64_t>(a.offset) * a.layout->key_stride;
}

uint8_t *valueRow(const kvc_context *, SlotAddress a) {
  return a.page + a.layout->value_offset +
         static_cast<uint64_t>(a.offset) * a.layout->value_stride;
}

/// Encodes one vector into a row of a per-token format (FULL, INT8, FP8, and
/// the grouped INT2/INT4 of a low page); `codes` is head_dim bytes of
/// scratch.
void encodeRow(const kvc_context *ctx, int32_t format, const float *x,
               uint8_t *row, uint8_t *param, uint8_t *codes) {
  const kvc_config_t &c = ctx->config;
  if (int bits = tokenGroupBits(format)) {
    kiviQuantizeValue(x, c.head_dim, c.group_size, bits, row,
                      asymRecords(param), codes);
    return;
  }
  switch (format) {
  case KVC_FORMAT_FULL:
    storeElements(c.dtype, x, c.head_dim, row);
    break;
  case KVC_FORMAT_INT8:
    quantizeInt8(x, c.head_dim, reinterpret_cast<int8_t *>(row),
                 floatParam(param));
    break;
  case KVC_FORMAT_FP8_E4M3:
    quantizeFp8(x, c.head_dim, row, floatParam(param));
    break;
  default:
    break;
  }
}

void decodeRow(const kvc_context *ctx, int32_t format, const uint8_t *row,
               uint8_t *params, float *x) {
  const kvc_config_t &c = ctx->config;
  if (int bits = tokenGroupBits(format)) {
    kiviDequantizeValue(row, c.head_dim, c.group_size, bits,
                        asymRecords(params), x);
    return;
  }
  const float *param = floatParam(params);
  switch (format) {
  case KVC_FORMAT_FULL:
    loadElements(c.dtype, row, c.head_dim, x);
    break;
  case KVC_FORMAT_INT8:
    for (int32_t i = 0; i < c.head_dim; ++i)
      x[i] =
          static_cast<float>(reinterpret_cast<const int8_t *>(row)[i]) * *param;
    break;
  case KVC_FORMAT_FP8_E4M3:
    for (int32_t i = 0; i < c.head_dim; ++i)
      x[i] = kvc_fp8_e4m3_to_f32(row[i]) * *param;
    break;
  default:
    break;
  }
}

/// Working memory of the data paths, allocated before a call commits so
/// that the commit itself never allocates.
struct Scratch {
  std::vector<float> floats;    // G x head_dim
  std::vector<float> column;    // G
  std::vector<uint8_t> codes;   // G x head_dim
  std::vector<uint8_t> packed;  // G x key row
  std::vector<int32_t> members; // G

  /// Sized for the data paths of `ctx`, or empty where `needed` is false.
  Scratch(const kvc_context *ctx, bool needed) {
    if (!needed)
      return;
    size_t g = ctx->isKivi() ? static_cast<size_t>(ctx->config.group_size) : 1;
    size_t d = static_cast<size_t>(ctx->config.head_dim);
    floats.resize(g * d);
    column.resize(g);
    codes.resize(g * d);
    packed.resize(g * ctx->layout.key_stride);
    members.resize(g);
  }
};

/// KIVI: where the full-precision row of the entry in `slot` is, for an
/// append call whose first entry got append index `firstAppended`.
kvc_kivi_row_t kiviSource(const kvc_context *ctx, const HeadState &h,
                          int32_t slot, int64_t firstAppended) {
  int64_t a = h.appendIndex[slot];
  return {slot, static_cast<int32_t>(a % ctx->config.residual_length),
          a >= firstAppended ? static_cast<int32_t>(a - firstAppended) : -1};
}

/// KIVI: quantizes the value of the entry in `slot` from its residual row
/// (host pools) and records the work.
void kiviFlushValue(const kvc_context *ctx, const Sequence &seq,
                    int32_t headIndex, HeadState &h, int32_t slot,
                    int64_t firstAppended, Scratch &scratch) {
  const kvc_config_t &c = ctx->config;
  h.work.values.push_back(kiviSource(ctx, h, slot, firstAppended));
  h.valueFormat[slot] = static_cast<uint8_t>(c.format);
  if (!ctx->isHost())
    return;
  int64_t row = h.appendIndex[slot] % c.residual_length;
  float *value = scratch.floats.data();
  loadElements(c.dtype, ctx->residualValue(seq.index, headIndex, row),
               c.head_dim, value);
  SlotAddress a = slotAddress(ctx, h, slot);
  kiviQuantizeValue(value, c.head_dim, c.group_size, kiviBits(c.format),
                    valueRow(ctx, a), asymRecords(valueParams(ctx, a)),
                    scratch.codes.data());
}

/// KIVI: quantizes the keys of the last R appended entries, one block of G
/// slots at a time (each block holds only entries of this window because
/// blocks are filled in append order and R is a multiple of G). Host pools
/// only touch the bytes; every pool records the blocks.
void kiviFlushKeys(const kvc_context *ctx, const Sequence &seq,
                   int32_t headIndex, HeadState &h, int64_t firstAppended,
                   Scratch &scratch) {
  const kvc_config_t &c = ctx->config;
  const int32_t r = c.residual_length, g = c.group_size, d = c.head_dim;
  const int bits = kiviBits(c.format);
  const size_t row = ctx->layout.key_stride;
  int32_t *members = scratch.members.data();
  for (int64_t start = h.keysFlushed; start < h.keysFlushed + r; start += g) {
    // Live members of the block that entries start .. start+G-1 were given
    // (evicted ones left the block; their residual rows say -1).
    int count = 0;
    for (int64_t a = start; a < start + g; ++a)
      if (int32_t slot = h.residualSlot[a % r]; slot >= 0)
        members[count++] = slot;
    if (count == 0)
      continue;
    for (int t = 0; t < count; ++t) {
      h.work.members.push_back(kiviSource(ctx, h, members[t], firstAppended));
      h.keyFormat[members[t]] = static_cast<uint8_t>(c.format);
    }
    h.work.blockBegin.push_back(static_cast<int32_t>(h.work.members.size()));
    if (!ctx->isHost())
      continue;
    for (int t = 0; t < count; ++t)
      loadElements(
          c.dtype,
          ctx->residualKey(seq.index, headIndex, h.appendIndex[members[t]] % r),
          d, &scratch.floats[static_cast<size_t>(t) * d]);
    AsymRecord *records =
        asymRecords(keyParams(ctx, slotAddress(ctx, h, members[0])));
    kiviQuantizeKeys(scratch.floats.data(), count, d, bits,
                     scratch.packed.data(), row, records, scratch.column.data(),
                     scratch.codes.data());
    for (int t = 0; t < count; ++t)
      std::memcpy(keyRow(ctx, slotAddress(ctx, h, members[t])),
                  &scratch.packed[static_cast<size_t>(t) * row], row);
  }
  h.keysFlushed += r;
}

void readEntry(const kvc_context *ctx, const Sequence &seq, int32_t headIndex,
               const HeadState &h, int32_t slot, float *key, float *value) {
  const kvc_config_t &c = ctx->config;
  SlotAddress a = slotAddress(ctx, h, slot);
  if (!ctx->isKivi()) {
    if (key)
      decodeRow(ctx, a.format, keyRow(ctx, a), keyParams(ctx, a), key);
    if (value)
      decodeRow(ctx, a.format, valueRow(ctx, a), valueParams(ctx, a), value);
    return;
  }
  int bits = kiviBits(c.format);
  int64_t row = h.appendIndex[slot] % c.residual_length;
  if (key) {
    if (h.keyFormat[slot] == KVC_FORMAT_FULL)
      loadElements(c.dtype, ctx->residualKey(seq.index, headIndex, row),
                   c.head_dim, key);
    else
      kiviDequantizeKeyRow(keyRow(ctx, a), c.head_dim, bits,
                           asymRecords(keyParams(ctx, a)), key);
  }
  if (value) {
    if (h.valueFormat[slot] == KVC_FORMAT_FULL)
      loadElements(c.dtype, ctx->residualValue(seq.index, headIndex, row),
                   c.head_dim, value);
    else
      kiviDequantizeValue(valueRow(ctx, a), c.head_dim, c.group_size, bits,
                          asymRecords(valueParams(ctx, a)), value);
  }
}

void writeEntry(const kvc_context *ctx, const Sequence &seq, int32_t headIndex,
                HeadState &h, int32_t slot, const float *key,
                const float *value, Scratch &scratch) {
  const kvc_config_t &c = ctx->config;
  SlotAddress a = slotAddress(ctx, h, slot);
  if (!ctx->isKivi()) {
    if (key)
      encodeRow(ctx, a.format, key, keyRow(ctx, a), keyParams(ctx, a),
                scratch.codes.data());
    if (value)
      encodeRow(ctx, a.format, value, valueRow(ctx, a), valueParams(ctx, a),
                scratch.codes.data());
    return;
  }
  int bits = kiviBits(c.format);
  int64_t row = h.appendIndex[slot] % c.residual_length;
  if (key) {
    if (h.keyFormat[slot] == KVC_FORMAT_FULL)
      storeElements(c.dtype, key, c.head_dim,
                    ctx->residualKey(seq.index, headIndex, row));
    else
      kiviEncodeKeyRow(key, c.head_dim, bits, asymRecords(keyParams(ctx, a)),
                       keyRow(ctx, a), scratch.codes.data());
  }
  if (value) {
    if (h.valueFormat[slot] == KVC_FORMAT_FULL)
      storeElements(c.dtype, value, c.head_dim,
                    ctx->residualValue(seq.index, headIndex, row));
    else
      kiviQuantizeValue(value, c.head_dim, c.group_size, bits, valueRow(ctx, a),
                        asymRecords(valueParams(ctx, a)), scratch.codes.data());
  }
}

/// Copies the bytes of the unit starting at `from` (in page `fromPage`) to
/// the unit starting at `to` (in page `toPage`): rows and parameter records.
void copyUnitData(const kvc_context *ctx, int32_t fromPage, int32_t fromOffset,
                  int32_t toPage, int32_t toOffset) {
  // Compaction moves entries between pages of one class only.
  const kvc_page_layout_t &l = ctx->layoutOf(fromPage);
  uint8_t *src = ctx->pageBase(fromPage), *dst = ctx->pageBase(toPage);
  uint64_t n = static_cast<uint64_t>(ctx->unit);
  uint64_t so = static_cast<uint64_t>(fromOffset);
  uint64_t dof = static_cast<uint64_t>(toOffset);
  std::memcpy(dst + l.key_offset + dof * l.key_stride,
              src + l.key_offset + so * l.key_stride, n * l.key_stride);
  std::memcpy(dst + l.value_offset + dof * l.value_stride,
              src + l.value_offset + so * l.value_stride, n * l.value_stride);
  std::memcpy(dst + l.value_param_offset + dof * l.value_param_stride,
              src + l.value_param_offset + so * l.value_param_stride,
              n * l.value_param_stride);
  if (ctx->isKivi()) {
    uint64_t g = static_cast<uint64_t>(ctx->config.group_size);
    std::memcpy(dst + l.key_param_offset + dof / g * l.key_param_stride,
                src + l.key_param_offset + so / g * l.key_param_stride,
                l.key_param_stride);
  } else {
    std::memcpy(dst + l.key_param_offset + dof * l.key_param_stride,
                src + l.key_param_offset + so * l.key_param_stride,
                n * l.key_param_stride);
  }
}

/// Marks a slot free and returns its page to the pool when it empties (the
/// page holding the open KIVI block stays: appends will fill it).
void freeSlot(kvc_context *ctx, HeadState &h, int32_t slot) {
  int32_t p = ctx->config.page_size;
  if (ctx->isKivi()) {
    int32_t r = ctx->config.residual_length;
    int64_t a = h.appendIndex[slot];
    if (a >= h.appended - r && h.residualSlot[a % r] == slot)
      h.residualSlot[a % r] = -1;
  }
  h.position[slot] = KVC_POSITION_NONE;
  h.score[slot] = 0.0f;
  h.weight[slot] = 0.0f;
  h.history[slot] = 0;
  h.keyFormat[slot] = KVC_FORMAT_FULL;
  h.valueFormat[slot] = KVC_FORMAT_FULL;
  h.appendIndex[slot] = -1;
  --h.live;
  int32_t page = slot / p;
  markOpen(h, static_cast<size_t>(page));
  if (--h.pageLive[page] == 0 &&
      !(h.openBlock >= 0 && h.openBlock / p == page)) {
    ctx->releasePage(h.pages[page]);
    h.pages[page] = -1;
  }
}

//===----------------------------------------------------------------------===//
// Append planning
//===----------------------------------------------------------------------===//

void planAppend(const kvc_context *ctx, const HeadState &h, int32_t count,
                bool low, AppendPlan &plan) {
  const int32_t p = ctx->config.page_size, u = ctx->unit;
  reserveAtLeast(plan.slots, static_cast<size_t>(count));
  plan.tableSize = h.pages.size();
  auto need = [&] { return count - static_cast<int32_t>(plan.slots.size()); };
  auto takeUnit = [&](int32_t first) {
    for (int32_t s = first; s < first + u && need() > 0; ++s)
      plan.slots.push_back(s);
  };
  // 1. The rest of the open KIVI block.
  if (h.openBlock >= 0)
    for (int32_t s = h.openBlock + h.openFill;
         s < h.openBlock + u && need() > 0; ++s)
      plan.slots.push_back(s);
  // 2. Free units of mapped pages, lowest first (slot reuse): the pages
  // whose bit in openPages is set; a page found without a free unit loses
  // its bit.
  for (size_t w = 0; w < h.openPages.size() && need() > 0; ++w)
    for (uint64_t bits = h.openPages[w]; bits != 0 && need() > 0;
         bits &= bits - 1) {
      const size_t page = 64 * w + static_cast<size_t>(__builtin_ctzll(bits));
      bool freeUnit = false;
      if (page < h.pages.size() && h.pages[page] >= 0 &&
          h.pageLive[page] < p) {
        const bool classMatches = ctx->isLowPage(h.pages[page]) == low;
        const int32_t end = static_cast<int32_t>(page + 1) * p;
        int32_t first = static_cast<int32_t>(page) * p;
        if (u == 1) {
          // Skip live slots eight at a time (one vector compare): a decode
          // step's append lands behind the page's live entries.
          const int32_t *position = h.position.data();
          for (; first + 8 <= end; first += 8) {
            bool free = false;
            for (int32_t i = 0; i < 8; ++i)
              free |= position[first + i] == KVC_POSITION_NONE;
            if (free)
              break;
          }
        }
        for (; first < end && need() > 0; first += u)
          if (unitIsFree(ctx, h, first)) {
            freeUnit = true;
            if (!classMatches)
              break;
            takeUnit(first);
          }
      }
      if (!freeUnit)
        h.openPages[w] &= ~(uint64_t{1} << (page % 64));
    }
  // 3. Holes, then new page-table entries.
  for (size_t page = 0; need() > 0; ++page) {
    if (page < h.pages.size() && h.pages[page] >= 0)
      continue;
    plan.newPages.push_back(static_cast<int32_t>(page));
    plan.tableSize = std::max(plan.tableSize, page + 1);
    for (int32_t first = static_cast<int32_t>(page) * p;
         first < static_cast<int32_t>(page + 1) * p && need() > 0; first += u)
      takeUnit(first);
  }
}

} // namespace

//===----------------------------------------------------------------------===//
// Sizing and lifetime
//===----------------------------------------------------------------------===//

extern "C" kvc_status_t kvc_page_layout(const kvc_config_t *config,
                                        kvc_page_layout_t *layout) {
  return guarded("kvc_page_layout", [&] {
    KVC_CHECK(validateConfig("kvc_page_layout", config));
    if (!layout)
      return fail(KVC_STATUS_NULL_POINTER, "kvc_page_layout: layout is NULL");
    *layout = computeLayout(*config);
    return KVC_STATUS_OK;
  });
}

extern "C" kvc_status_t kvc_low_page_layout(const kvc_config_t *config,
                                            kvc_page_layout_t *layout,
                                            int32_t *pages_per_page) {
  const char *name = "kvc_low_page_layout";
  return guarded(name, [&] {
    KVC_CHECK(validateConfig(name, config));
    if (!layout)
      return fail(KVC_STATUS_NULL_POINTER, "%s: layout is NULL", name);
    if (config->low_format == KVC_FORMAT_FULL)
      return fail(KVC_STATUS_UNSUPPORTED,
                  "%s: the configuration has no low_format", name);
    *layout = computeLowLayout(*config);
    if (pages_per_page)
      *pages_per_page = lowPagesPerPage(*config);
    return KVC_STATUS_OK;
  });
}

extern "C" kvc_status_t kvc_pool_bytes_required(const kvc_config_t *config,
                                                uint64_t *bytes) {
  return guarded("kvc_pool_bytes_required", [&] {
    KVC_CHECK(validateConfig("kvc_pool_bytes_required", config));
    if (!bytes)
      return fail(KVC_STATUS_NULL_POINTER,
                  "kvc_pool_bytes_required: bytes is NULL");
    kvc_page_layout_t l = computeLayout(*config);
    *bytes = l.pages_offset +
             l.page_bytes * static_cast<uint64_t>(config->num_pages);
    return KVC_STATUS_OK;
  });
}

extern "C" kvc_status_t kvc_context_create(const kvc_config_t *config,
                                           void *pool, uint64_t pool_bytes,
                                           kvc_context_t **context) {
  const char *name = "kvc_context_create";
  return guarded(name, [&] {
    KVC_CHECK(validateConfig(name, config));
    if (!pool)
      return fail(KVC_STATUS_NULL_POINTER, "%s: pool is NULL", name);
    if (!context)
      return fail(KVC_STATUS_NULL_POINTER, "%s: context is NULL", name);
    if (reinterpret_cast<uintptr_t>(pool) % KVC_POOL_ALIGNMENT != 0)
      return fail(KVC_STATUS_MISALIGNED, "%s: pool is not aligned to %d bytes",
                  name, KVC_POOL_ALIGNMENT);
    kvc_page_layout_t layout = computeLayout(*config);
    uint64_t required =
        layout.pages_offset +
        layout.page_bytes * static_cast<uint64_t>(config->num_pages);
    if (pool_bytes < required)
      return fail(KVC_STATUS_BUFFER_TOO_SMALL,
                  "%s: pool has %llu bytes, the configuration needs %llu", name,
                  static_cast<unsigned long long>(pool_bytes),
                  static_cast<unsigned long long>(required));
    auto *ctx = new kvc_context();
    ctx->config = *config;
    ctx->layout = layout;
    ctx->pool = static_cast<uint8_t *>(pool);
    ctx->kivi = kiviBits(config->format) != 0;
    ctx->unit = ctx->isKivi() ? config->group_size : 1;
    try {
      if (ctx->hasLowClass()) {
        ctx->lowLayout = computeLowLayout(*config);
        ctx->lowPerPage = lowPagesPerPage(*config);
        ctx->lowFree.reserve(static_cast<size_t>(config->num_pages) *
                             static_cast<size_t>(ctx->lowPerPage));
        ctx->lowUsed.assign(static_cast<size_t>(config->num_pages), 0);
      }
      ctx->freePages.reserve(static_cast<size_t>(config->num_pages));
      // Pages come off the back: hand out 0, 1, 2, ... first.
      for (int32_t page = config->num_pages - 1; page >= 0; --page)
        ctx->freePages.push_back(page);
      ctx->sequenceIndexUsed.assign(static_cast<size_t>(config->max_sequences),
                                    0);
    } catch (...) {
      delete ctx;
      throw;
    }
    *context = ctx;
    return KVC_STATUS_OK;
  });
}

extern "C" kvc_status_t kvc_context_destroy(kvc_context_t *context) {
  return guarded("kvc_context_destroy", [&] {
    if (context)
      for (auto &entry : context->sequences)
        releaseAttachments(entry.second);
    delete context;
    return KVC_STATUS_OK;
  });
}

extern "C" kvc_status_t kvc_context_config(const kvc_context_t *context,
                                           kvc_config_t *config) {
  return guarded("kvc_context_config", [&] {
    if (!context || !config)
      return fail(KVC_STATUS_NULL_POINTER, "kvc_context_config: %s is NULL",
                  context ? "config" : "context");
    *config = context->config;
    return KVC_STATUS_OK;
  });
}

//===----------------------------------------------------------------------===//
// Sequences
//===----------------------------------------------------------------------===//

extern "C" kvc_status_t kvc_sequence_add(kvc_context_t *ctx,
                                         uint64_t sequence) {
  const char *name = "kvc_sequence_add";
  return guarded(name, [&] {
    if (!ctx)
      return fail(KVC_STATUS_NULL_POINTER, "%s: context is NULL", name);
    if (ctx->sequences.count(sequence))
      return fail(KVC_STATUS_ALREADY_EXISTS, "%s: sequence %llu exists", name,
                  static_cast<unsigned long long>(sequence));
    auto freeIndex = std::find(ctx->sequenceIndexUsed.begin(),
                               ctx->sequenceIndexUsed.end(), 0);
    if (freeIndex == ctx->sequenceIndexUsed.end())
      return fail(KVC_STATUS_POOL_EXHAUSTED,
                  "%s: all %d sequences of the context are in use", name,
                  ctx->config.max_sequences);
    Sequence seq;
    seq.index =
        static_cast<int32_t>(freeIndex - ctx->sequenceIndexUsed.begin());
    seq.heads.resize(static_cast<size_t>(ctx->headsPerSequence()));
    seq.attachments.assign(static_cast<size_t>(ctx->config.num_layers),
                           kvc_attachment_t{});
    if (ctx->isKivi())
      for (HeadState &h : seq.heads)
        h.residualSlot.assign(static_cast<size_t>(ctx->config.residual_length),
                              -1);
    ctx->sequences.emplace(sequence, std::move(seq));
    *freeIndex = 1;
    return KVC_STATUS_OK;
  });
}

extern "C" kvc_status_t kvc_sequence_remove(kvc_context_t *ctx,
                                            uint64_t sequence) {
  const char *name = "kvc_sequence_remove";
  return guarded(name, [&] {
    if (!ctx)
      return fail(KVC_STATUS_NULL_POINTER, "%s: context is NULL", name);
    auto it = ctx->sequences.find(sequence);
    if (it == ctx->sequences.end())
      return fail(KVC_STATUS_OUT_OF_RANGE, "%s: unknown sequence %llu", name,
                  static_cast<unsigned long long>(sequence));
    releaseAttachments(it->second);
    // freePages has capacity for every page, so these pushes cannot throw.
    for (HeadState &h : it->second.heads)
      for (int32_t page : h.pages)
        if (page >= 0)
          ctx->releasePage(page);
    ctx->sequenceIndexUsed[static_cast<size_t>(it->second.index)] = 0;
    ctx->sequences.erase(it);
    return KVC_STATUS_OK;
  });
}

extern "C" kvc_status_t kvc_clear_layer(kvc_context_t *ctx,
                                        uint64_t sequence, int32_t layer) {
  const char *name = "kvc_clear_layer";
  return guarded(name, [&] {
    // The sequence and the layer (kv-head 0 exists in every geometry).
    HeadRef ref;
    KVC_CHECK(lookupHead(name, ctx, sequence, layer, 0, ref));
    Sequence &seq = *ref.sequence;
    // The fresh heads first (a head's state allocates); nothing below can
    // fail: they take the old residual rows (reset), and freePages has room
    // for every page.
    const int32_t kvHeads = ctx->config.num_kv_heads;
    std::vector<HeadState> fresh(static_cast<size_t>(kvHeads));
    kvc_attachment_t taken = seq.attachments[static_cast<size_t>(layer)];
    seq.attachments[static_cast<size_t>(layer)] = kvc_attachment_t{};
    if (taken.release)
      taken.release(taken.data);
    for (int32_t head = 0; head < kvHeads; ++head) {
      HeadState &h = seq.heads[static_cast<size_t>(layer) * kvHeads + head];
      for (int32_t page : h.pages)
        if (page >= 0)
          ctx->releasePage(page);
      HeadState &f = fresh[static_cast<size_t>(head)];
      f.budget = h.budget;
      f.residualSlot.swap(h.residualSlot);
      std::fill(f.residualSlot.begin(), f.residualSlot.end(), -1);
      // A KIVI work record read before the clear is stale.
      f.workSerial = h.workSerial + 1;
      std::swap(h, f);
    }
    return KVC_STATUS_OK;
  });
}

extern "C" kvc_status_t kvc_set_budget(kvc_context_t *ctx, uint64_t sequence,
                                       int32_t layer, int32_t head,
                                       int32_t budget) {
  const char *name = "kvc_set_budget";
  return guarded(name, [&] {
    HeadRef ref;
    KVC_CHECK(lookupHead(name, ctx, sequence, layer, head, ref));
    KVC_CHECK(settle(ctx, sequence, ref, layer));
    if (budget < -1)
      return fail(KVC_STATUS_INVALID_ARGUMENT,
                  "%s: budget must be >= 0 or -1 (got %d)", name, budget);
    if (budget > ctx->slotCapacity())
      return fail(KVC_STATUS_BUDGET_OVER_CAPACITY,
                  "%s: budget %d exceeds the pool's %d slots", name, budget,
                  ctx->slotCapacity());
    if (budget >= 0 && budget < ref.head->live)
      return fail(KVC_STATUS_INVALID_ARGUMENT,
                  "%s: budget %d is below the %d live entries; evict first",
                  name, budget, ref.head->live);
    ref.head->budget = budget;
    return KVC_STATUS_OK;
  });
}

//===----------------------------------------------------------------------===//
// Append and evict
//===----------------------------------------------------------------------===//

namespace {

/// The checks of an append's arguments that do not depend on the head:
/// `count` entries of `dim` elements per head, `heads` heads (kvc_append:
/// 1), into pages of `format`'s class.
kvc_status_t checkAppendArguments(const char *name, const kvc_context *ctx,
                                  int32_t format, int32_t count, int32_t dim,
                                  int64_t heads, const float *keys,
                                  const float *values,
                                  const int32_t *positions,
                                  int64_t numPositions, const int32_t *slots) {
  const bool low = format != ctx->config.format;
  if (low && (!ctx->hasLowClass() || format != ctx->config.low_format))
    return fail(KVC_STATUS_INVALID_ARGUMENT,
                "%s: format %d is neither the context's format %d nor its "
                "low format %d",
                name, static_cast<int>(format),
                static_cast<int>(ctx->config.format),
                static_cast<int>(ctx->config.low_format));
  if (count <= 0)
    return fail(KVC_STATUS_INVALID_ARGUMENT, "%s: count must be > 0 (got %d)",
                name, count);
  KVC_CHECK(checkDim(name, ctx, dim));
  if (!positions)
    return fail(KVC_STATUS_NULL_POINTER, "%s: positions is NULL", name);
  if (!isAligned<int32_t>(positions) || (slots && !isAligned<int32_t>(slots)))
    return fail(KVC_STATUS_MISALIGNED,
                "%s: positions/slots are not 4-byte aligned", name);
  const int64_t elements = heads * count * dim;
  if (ctx->isHost()) {
    KVC_CHECK(checkFloatArray(name, "keys", keys));
    KVC_CHECK(checkFloatArray(name, "values", values));
    if (format != KVC_FORMAT_FULL) {
      // A NaN or infinity would poison a whole quantization group.
      KVC_CHECK(checkFinite(name, "keys", keys, elements));
      KVC_CHECK(checkFinite(name, "values", values, elements));
    }
  } else if (keys || values) {
    return fail(KVC_STATUS_UNSUPPORTED,
                "%s: device pools take no data (kernels write it); pass "
                "NULL keys and values",
                name);
  }
  for (int64_t i = 0; i < numPositions; ++i)
    if (positions[i] < 0)
      return fail(KVC_STATUS_INVALID_ARGUMENT,
                  "%s: positions[%lld] = %d is negative", name,
                  static_cast<long long>(i), positions[i]);
  return KVC_STATUS_OK;
}

/// Plans an append of `count` entries into pages of one class of `h` and
/// allocates what its commit needs (the table's capacity, the KIVI work
/// record), changing nothing the caller can observe. The caller checked
/// the budget and checks the plan's new pages against the pool.
void prepareAppend(const kvc_context *ctx, HeadState &h, int32_t count,
                   bool low, PreparedAppend &prepared) {
  AppendPlan &plan = prepared.plan;
  plan.slots.clear();
  plan.newPages.clear();
  planAppend(ctx, h, count, low, plan);
  if (plan.tableSize != h.pages.size())
    reserveTable(ctx, h, plan.tableSize);
  if (!ctx->isKivi()) {
    prepared.work.reset();
  } else {
    // Bounds: one value per entry; the keys flushed in this call are at
    // most the R - 1 unflushed ones plus the new entries, (count + R) / G
    // blocks. The record's vectors are those of the head's record before
    // the last commit that used `prepared` (commitAppend swaps them), so a
    // decode step's append allocates nothing once they have the room.
    const size_t r = static_cast<size_t>(ctx->config.residual_length);
    const size_t g = static_cast<size_t>(ctx->config.group_size);
    const size_t n = static_cast<size_t>(count);
    if (prepared.work)
      prepared.work->clear();
    else
      prepared.work.emplace();
    reserveAtLeast(prepared.work->values, n);
    reserveAtLeast(prepared.work->members, n + r);
    reserveAtLeast(prepared.work->blockBegin, (n + r) / g + 2);
    reserveAtLeast(prepared.work->stages, std::min(n, r));
  }
}

/// Commits a prepared append of `count` entries of `format` to head
/// `ref`: maps its new pages, writes the metadata and, on host pools, the
/// data (`keys`, `values`: count x dim rows, or NULL on device pools).
/// Nothing here can fail.
void commitAppend(kvc_context *ctx, const HeadRef &ref, int32_t format,
                  bool low, int32_t count, int32_t dim, const float *keys,
                  const float *values, const int32_t *positions,
                  PreparedAppend &prepared, int32_t *slots,
                  Scratch &scratch) {
  HeadState &h = *ref.head;
  const AppendPlan &plan = prepared.plan;
  if (plan.tableSize != h.pages.size())
    resizeTable(ctx, h, plan.tableSize);
  for (int32_t page : plan.newPages) {
    h.pages[page] = ctx->takePage(low);
    markOpen(h, static_cast<size_t>(page));
  }
  const kvc_config_t &c = ctx->config;
  const int32_t p = c.page_size;
  const int64_t firstAppended = h.appended;
  if (ctx->isKivi()) {
    std::swap(h.work, *prepared.work);
    ++h.workSerial;
  }
  for (int32_t i = 0; i < count; ++i) {
    int32_t slot = plan.slots[i];
    h.position[slot] = positions[i];
    h.score[slot] = 0.0f;
    h.weight[slot] = 1.0f;
    h.history[slot] = 0;
    h.keyFormat[slot] = static_cast<uint8_t>(format);
    h.valueFormat[slot] = static_cast<uint8_t>(format);
    ++h.pageLive[slot / p];
    ++h.live;
    if (slots)
      slots[i] = slot;
    const float *key = keys ? keys + static_cast<int64_t>(i) * dim : nullptr;
    const float *value =
        values ? values + static_cast<int64_t>(i) * dim : nullptr;
    if (!ctx->isKivi()) {
      if (ctx->isHost())
        writeEntry(ctx, *ref.sequence, ref.headIndex, h, slot, key, value,
                   scratch);
      continue;
    }
    // KIVI: track the open block, slide the value window, stage the new
    // entry in full precision, flush keys every R appends.
    const int32_t r = c.residual_length, g = c.group_size;
    if (slot % g == 0 && slot != h.openBlock) {
      h.openBlock = slot;
      h.openFill = 0;
    }
    if (++h.openFill == g)
      h.openBlock = -1;
    int64_t a = h.appended;
    if (a >= r) {
      int32_t old = h.residualSlot[a % r];
      if (old >= 0)
        kiviFlushValue(ctx, *ref.sequence, ref.headIndex, h, old,
                       firstAppended, scratch);
    }
    h.appendIndex[slot] = a;
    h.residualSlot[a % r] = slot;
    h.keyFormat[slot] = KVC_FORMAT_FULL;
    h.valueFormat[slot] = KVC_FORMAT_FULL;
    if (ctx->isHost()) {
      storeElements(c.dtype, key, dim,
                    ctx->residualKey(ref.sequence->index, ref.headIndex,
                                     a % r));
      storeElements(c.dtype, value, dim,
                    ctx->residualValue(ref.sequence->index, ref.headIndex,
                                       a % r));
    }
    ++h.appended;
    if (h.appended - h.keysFlushed == r)
      kiviFlushKeys(ctx, *ref.sequence, ref.headIndex, h, firstAppended,
                    scratch);
  }
  // KIVI: the entries of this call that end in the residual window (an
  // earlier one's row was taken again by a later one of the same call).
  if (ctx->isKivi()) {
    const int64_t r = c.residual_length;
    for (int32_t i = 0; i < count; ++i)
      if (firstAppended + i >= h.appended - r)
        h.work.stages.push_back(
            {plan.slots[i], static_cast<int32_t>((firstAppended + i) % r),
             i});
  }
}

/// kvc_append and kvc_append_format: appends into pages of `format`'s class.
kvc_status_t appendEntries(const char *name, kvc_context_t *ctx,
                           uint64_t sequence, int32_t layer, int32_t head,
                           int32_t format, int32_t count, int32_t dim,
                           const float *keys, const float *values,
                           const int32_t *positions, int32_t *slots) {
  return guarded(name, [&] {
    HeadRef ref;
    KVC_CHECK(lookupHead(name, ctx, sequence, layer, head, ref));
    KVC_CHECK(settle(ctx, sequence, ref, layer));
    HeadState &h = *ref.head;
    KVC_CHECK(checkAppendArguments(name, ctx, format, count, dim, 1, keys,
                                   values, positions, count, slots));
    const bool low = format != ctx->config.format;
    if (h.budget >= 0 && static_cast<int64_t>(h.live) + count > h.budget)
      return fail(KVC_STATUS_OVER_BUDGET,
                  "%s: %d live + %d new entries exceed the budget %d", name,
                  h.live, count, h.budget);
    if (ctx->prepared.empty())
      ctx->prepared.resize(1);
    PreparedAppend &prepared = ctx->prepared[0];
    prepareAppend(ctx, h, count, low, prepared);
    const AppendPlan &plan = prepared.plan;
    if (static_cast<int64_t>(plan.newPages.size()) > ctx->pagesAvailable(low))
      return fail(KVC_STATUS_POOL_EXHAUSTED,
                  "%s: %zu new %spages needed, %lld free", name,
                  plan.newPages.size(), low ? "low " : "",
                  static_cast<long long>(ctx->pagesAvailable(low)));
    // Device pools of full-precision entries write no data here.
    Scratch scratch(ctx, ctx->isHost() || ctx->isKivi());
    // Commit: nothing below can fail.
    commitAppend(ctx, ref, format, low, count, dim, keys, values, positions,
                 prepared, slots, scratch);
    return KVC_STATUS_OK;
  });
}

} // namespace

extern "C" kvc_status_t kvc_append(kvc_context_t *ctx, uint64_t sequence,
                                   int32_t layer, int32_t head, int32_t count,
                                   int32_t dim, const float *keys,
                                   const float *values,
                                   const int32_t *positions, int32_t *slots) {
  return appendEntries("kvc_append", ctx, sequence, layer, head,
                       ctx ? ctx->config.format : 0, count, dim, keys, values,
                       positions, slots);
}

extern "C" kvc_status_t kvc_append_format(kvc_context_t *ctx,
                                          uint64_t sequence, int32_t layer,
                                          int32_t head, int32_t format,
                                          int32_t count, int32_t dim,
                                          const float *keys,
                                          const float *values,
                                          const int32_t *positions,
                                          int32_t *slots) {
  return appendEntries("kvc_append_format", ctx, sequence, layer, head, format,
                       count, dim, keys, values, positions, slots);
}

extern "C" kvc_status_t kvc_append_step(kvc_context_t *ctx, int32_t layer,
                                        int32_t batch,
                                        const uint64_t *sequences,
                                        int32_t dim, const float *keys,
                                        const float *values,
                                        const int32_t *positions,
                                        int32_t *slots, int32_t *num_pages) {
  const char *name = "kvc_append_step";
  return guarded(name, [&] {
    if (!ctx)
      return fail(KVC_STATUS_NULL_POINTER, "%s: context is NULL", name);
    if (batch <= 0)
      return fail(KVC_STATUS_INVALID_ARGUMENT,
                  "%s: batch must be > 0 (got %d)", name, batch);
    if (!sequences || !slots)
      return fail(KVC_STATUS_NULL_POINTER, "%s: %s is NULL", name,
                  sequences ? "slots" : "sequences");
    if (layer < 0 || layer >= ctx->config.num_layers)
      return fail(KVC_STATUS_OUT_OF_RANGE, "%s: layer %d out of range [0, %d)",
                  name, layer, ctx->config.num_layers);
    if (num_pages && !isAligned<int32_t>(num_pages))
      return fail(KVC_STATUS_MISALIGNED, "%s: num_pages is not 4-byte aligned",
                  name);
    const int32_t kvHeads = ctx->config.num_kv_heads;
    const int32_t format = ctx->config.format;
    KVC_CHECK(checkAppendArguments(name, ctx, format, 1, dim,
                                   static_cast<int64_t>(batch) * kvHeads, keys,
                                   values, positions, batch, slots));
    // Each sequence once, looked up once.
    std::vector<Sequence *> &found = ctx->stepSequences;
    found.resize(static_cast<size_t>(batch));
    for (int32_t b = 0; b < batch; ++b) {
      auto it = ctx->sequences.find(sequences[b]);
      if (it == ctx->sequences.end())
        return fail(KVC_STATUS_OUT_OF_RANGE,
                    "%s: unknown sequence %llu (batch index %d)", name,
                    static_cast<unsigned long long>(sequences[b]), b);
      found[b] = &it->second;
    }
    std::vector<Sequence *> &sorted = ctx->stepSorted;
    sorted.assign(found.begin(), found.end());
    std::sort(sorted.begin(), sorted.end());
    if (std::adjacent_find(sorted.begin(), sorted.end()) != sorted.end())
      for (int32_t b = 1; b < batch; ++b)
        if (std::find(found.begin(), found.begin() + b, found[b]) !=
            found.begin() + b)
          return fail(KVC_STATUS_INVALID_ARGUMENT,
                      "%s: sequence %llu appears twice in the batch "
                      "(index %d)",
                      name, static_cast<unsigned long long>(sequences[b]), b);
    for (int32_t b = 0; b < batch; ++b) {
      HeadRef ref;
      ref.sequence = found[b];
      KVC_CHECK(settle(ctx, sequences[b], ref, layer));
    }
    // Plan every head; all or nothing: the budgets and the pool are checked
    // for the whole batch before anything changes.
    const size_t heads = static_cast<size_t>(batch) * kvHeads;
    if (ctx->prepared.size() < heads)
      ctx->prepared.resize(heads);
    int64_t newPages = 0;
    for (int32_t b = 0; b < batch; ++b)
      for (int32_t head = 0; head < kvHeads; ++head) {
        HeadState &h = found[b]->heads[layer * kvHeads + head];
        if (h.budget >= 0 && h.live >= h.budget)
          return fail(KVC_STATUS_OVER_BUDGET,
                      "%s: sequence %llu, kv head %d: %d live + 1 new entry "
                      "exceed the budget %d",
                      name, static_cast<unsigned long long>(sequences[b]),
                      head, h.live, h.budget);
        PreparedAppend &prepared = ctx->prepared[b * kvHeads + head];
        prepareAppend(ctx, h, 1, false, prepared);
        newPages += static_cast<int64_t>(prepared.plan.newPages.size());
      }
    if (newPages > ctx->pagesAvailable(false))
      return fail(KVC_STATUS_POOL_EXHAUSTED,
                  "%s: %lld new pages needed, %lld free", name,
                  static_cast<long long>(newPages),
                  static_cast<long long>(ctx->pagesAvailable(false)));
    Scratch scratch(ctx, ctx->isHost() || ctx->isKivi());
    // Commit: nothing below can fail.
    for (int32_t b = 0; b < batch; ++b)
      for (int32_t head = 0; head < kvHeads; ++head) {
        const size_t i = static_cast<size_t>(b) * kvHeads + head;
        HeadRef ref;
        ref.sequence = found[b];
        ref.headIndex = layer * kvHeads + head;
        ref.head = &found[b]->heads[ref.headIndex];
        const int64_t row = static_cast<int64_t>(i) * dim;
        commitAppend(ctx, ref, format, false, 1, dim,
                     keys ? keys + row : nullptr,
                     values ? values + row : nullptr, &positions[b],
                     ctx->prepared[i], &slots[i], scratch);
        if (num_pages)
          num_pages[i] = static_cast<int32_t>(ref.head->pages.size());
      }
    return KVC_STATUS_OK;
  });
}

extern "C" kvc_status_t kvc_evict(kvc_context_t *ctx, uint64_t sequence,
                                  int32_t layer, int32_t head, int32_t count,
                                  const int32_t *slots) {
  const char *name = "kvc_evict";
  return guarded(name, [&] {
    HeadRef ref;
    KVC_CHECK(lookupHead(name, ctx, sequence, layer, head, ref));
    KVC_CHECK(settle(ctx, sequence, ref, layer));
    HeadState &h = *ref.head;
    if (count < 0)
      return fail(KVC_STATUS_INVALID_ARGUMENT,
                  "%s: count must be >= 0 (got %d)", name, count);
    if (count == 0)
      return KVC_STATUS_OK;
    if (!slots)
      return fail(KVC_STATUS_NULL_POINTER, "%s: slots is NULL", name);
    if (!isAligned<int32_t>(slots))
      return fail(KVC_STATUS_MISALIGNED, "%s: slots is not 4-byte aligned",
                  name);
    for (int32_t i = 0; i < count; ++i)
      KVC_CHECK(checkLiveSlot(name, ctx, h, slots[i]));
    if (count == 1) {
      // A decode step's victim: nothing to order or deduplicate.
      freeSlot(ctx, h, slots[0]);
    } else {
      std::vector<int32_t> sorted(slots, slots + count);
      std::sort(sorted.begin(), sorted.end());
      if (std::adjacent_find(sorted.begin(), sorted.end()) != sorted.end())
        return fail(KVC_STATUS_INVALID_ARGUMENT,
                    "%s: slots contain duplicates", name);
      for (int32_t slot : sorted)
        freeSlot(ctx, h, slot);
    }
    trimTable(ctx, h);
    h.work.clear();
    ++h.workSerial;
    return KVC_STATUS_OK;
  });
}

//===----------------------------------------------------------------------===//
// Compaction
//===----------------------------------------------------------------------===//

extern "C" kvc_status_t kvc_compact(kvc_context_t *ctx, uint64_t sequence,
                                    int32_t layer, int32_t head,
                                    float max_occupancy, kvc_move_t *moves,
                                    int32_t max_moves, int32_t *num_moves,
                                    int32_t *pages_released) {
  const char *name = "kvc_compact";
  return guarded(name, [&] {
    HeadRef ref;
    KVC_CHECK(lookupHead(name, ctx, sequence, layer, head, ref));
    KVC_CHECK(settle(ctx, sequence, ref, layer));
    if (!(max_occupancy >= 0.0f && max_occupancy <= 1.0f))
      return fail(KVC_STATUS_INVALID_ARGUMENT,
                  "%s: max_occupancy must be in [0, 1]", name);
    if (max_moves < 0)
      return fail(KVC_STATUS_INVALID_ARGUMENT, "%s: max_moves is negative",
                  name);
    if (!num_moves || !pages_released)
      return fail(KVC_STATUS_NULL_POINTER,
                  "%s: num_moves and pages_released are required", name);
    if (!ctx->isHost() && !moves)
      return fail(KVC_STATUS_NULL_POINTER,
                  "%s: device pools need the moves array: the engine copies "
                  "the data",
                  name);
    if (moves && !isAligned<kvc_move_t>(moves))
      return fail(KVC_STATUS_MISALIGNED, "%s: moves is misaligned", name);

    const int32_t p = ctx->config.page_size, u = ctx->unit;
    // Work on a copy of the head so that a too-small moves array (or a
    // failed allocation) leaves the original untouched.
    HeadState h = *ref.head;
    const std::vector<int32_t> oldPages = h.pages;
    std::vector<int32_t> origin(h.position.size(), -1);
    std::vector<uint8_t> copied(h.position.size(), 0);
    for (size_t s = 0; s < h.position.size(); ++s)
      if (h.position[s] != KVC_POSITION_NONE)
        origin[s] = static_cast<int32_t>(s);

    // Units with live entries and free units per mapped page.
    const int32_t tableSize = static_cast<int32_t>(h.pages.size());
    const int32_t openPage = h.openBlock >= 0 ? h.openBlock / p : -1;
    std::vector<int32_t> liveUnits(tableSize, 0), freeUnits(tableSize, 0);
    std::vector<int32_t> candidates;
    for (int32_t page = 0; page < tableSize; ++page) {
      if (h.pages[page] < 0)
        continue;
      for (int32_t first = page * p; first < (page + 1) * p; first += u) {
        if (unitHasLive(ctx, h, first))
          ++liveUnits[page];
        else if (unitIsFree(ctx, h, first))
          ++freeUnits[page];
      }
      if (page != openPage && h.pageLive[page] > 0 &&
          h.pageLive[page] <= max_occupancy * p)
        candidates.push_back(page);
    }
    // Sparsest first; release a page when the pages of its class that stay
    // have free units for everything of that class released so far plus
    // this page (entries never change class).
    std::stable_sort(
        candidates.begin(), candidates.end(),
        [&](int32_t a, int32_t b) { return h.pageLive[a] < h.pageLive[b]; });
    std::vector<uint8_t> released(tableSize, 0);
    auto classOf = [&](int32_t page) {
      return ctx->isLowPage(h.pages[page]) ? 1 : 0;
    };
    int64_t toMove[2] = {0, 0}, room[2] = {0, 0};
    for (int32_t page = 0; page < tableSize; ++page)
      if (h.pages[page] >= 0)
        room[classOf(page)] += freeUnits[page];
    for (int32_t page : candidates) {
      const int k = classOf(page);
      if (toMove[k] + liveUnits[page] <= room[k] - freeUnits[page]) {
        released[page] = 1;
        toMove[k] += liveUnits[page];
        room[k] -= freeUnits[page];
      }
    }
    // Move live units out of released pages into the lowest free units of
    // their class.
    int32_t destPage[2] = {0, 0}, destFirst[2] = {0, 0};
    auto nextFreeUnit = [&](int k) -> int32_t {
      int32_t &dp = destPage[k], &df = destFirst[k];
      for (; dp < tableSize; ++dp, df = dp * p) {
        if (h.pages[dp] < 0 || released[dp] || classOf(dp) != k)
          continue;
        if (df < dp * p)
          df = dp * p;
        for (; df < (dp + 1) * p; df += u)
          if (unitIsFree(ctx, h, df))
            return df;
      }
      return -1;
    };
    struct UnitCopy {
      int32_t fromPage, fromOffset, toPage, toOffset;
    };
    std::vector<UnitCopy> unitCopies;
    int32_t releasedCount = 0;
    for (int32_t page = 0; page < tableSize; ++page) {
      if (!released[page])
        continue;
      for (int32_t first = page * p; first < (page + 1) * p; first += u) {
        if (!unitHasLive(ctx, h, first))
          continue;
        int32_t to = nextFreeUnit(classOf(page));
        if (to < 0)
          return fail(KVC_STATUS_INTERNAL,
                      "%s: compaction plan ran out of room", name);
        unitCopies.push_back(
            {h.pages[page], first % p, h.pages[to / p], to % p});
        for (int32_t k = 0; k < u; ++k) {
          int32_t from = first + k, dst = to + k;
          copySlotMetadata(h, from, h, dst);
          origin[dst] = origin[from];
          copied[dst] = origin[from] >= 0;
          if (h.position[from] != KVC_POSITION_NONE) {
            ++h.pageLive[dst / p];
            if (ctx->isKivi()) {
              int32_t r = ctx->config.residual_length;
              int64_t a = h.appendIndex[from];
              if (h.residualSlot[a % r] == from)
                h.residualSlot[a % r] = dst;
            }
          }
          h.position[from] = KVC_POSITION_NONE;
          h.appendIndex[from] = -1;
          origin[from] = -1;
        }
      }
      h.pageLive[page] = 0;
      ++releasedCount;
    }
    // Close the holes: mapped pages move to the front of the table.
    std::vector<int32_t> pageDest(tableSize, -1);
    int32_t newSize = 0;
    for (int32_t page = 0; page < tableSize; ++page)
      if (h.pages[page] >= 0 && !released[page])
        pageDest[page] = newSize++;
    HeadState packed = h;
    resizeTable(ctx, packed, 0);
    resizeTable(ctx, packed, static_cast<size_t>(newSize));
    std::vector<int32_t> newOrigin(static_cast<size_t>(newSize) * p, -1);
    std::vector<uint8_t> newCopied(static_cast<size_t>(newSize) * p, 0);
    for (int32_t page = 0; page < tableSize; ++page) {
      int32_t to = pageDest[page];
      if (to < 0)
        continue;
      packed.pages[to] = h.pages[page];
      markOpen(packed, static_cast<size_t>(to));
      packed.pageLive[to] = h.pageLive[page];
      for (int32_t k = 0; k < p; ++k) {
        int32_t from = page * p + k, dst = to * p + k;
        copySlotMetadata(h, from, packed, dst);
        newOrigin[dst] = origin[from];
        newCopied[dst] = copied[from];
      }
    }
    if (h.openBlock >= 0)
      packed.openBlock = pageDest[h.openBlock / p] * p + h.openBlock % p;
    if (ctx->isKivi())
      for (int32_t &slot : packed.residualSlot)
        if (slot >= 0)
          slot = pageDest[slot / p] * p + slot % p;

    std::vector<kvc_move_t> report;
    for (int32_t s = 0; s < newSize * p; ++s) {
      int32_t from = newOrigin[s];
      // A unit that left a released page can land on its old slot number
      // once the holes close; its bytes still moved.
      if (from < 0 || (from == s && !newCopied[s]))
        continue;
      report.push_back({from, s, newCopied[s], oldPages[from / p], from % p,
                        packed.pages[s / p], s % p});
    }
    if (moves && static_cast<int32_t>(report.size()) > max_moves) {
      *num_moves = static_cast<int32_t>(report.size());
      return fail(KVC_STATUS_BUFFER_TOO_SMALL,
                  "%s: %zu moves do not fit in %d; nothing was changed", name,
                  report.size(), max_moves);
    }

    // Commit: copy bytes on host pools (sources are released pages that no
    // destination overlaps, so the order does not matter), free the pages.
    if (ctx->isHost())
      for (const UnitCopy &m : unitCopies)
        copyUnitData(ctx, m.fromPage, m.fromOffset, m.toPage, m.toOffset);
    for (int32_t page = 0; page < tableSize; ++page)
      if (released[page])
        ctx->releasePage(h.pages[page]);
    packed.work.clear();
    ++packed.workSerial;
    *ref.head = std::move(packed);
    if (moves)
      std::copy(report.begin(), report.end(), moves);
    *num_moves = static_cast<int32_t>(report.size());
    *pages_released = releasedCount;
    return KVC_STATUS_OK;
  });
}

//===----------------------------------------------------------------------===//
// Accessors
//===----------------------------------------------------------------------===//

namespace {

/// An accessor of one count of a head (after its attached record settles),
/// stored in `*out` (named `what` when NULL).
template <typename Count>
kvc_status_t headCount(const char *name, const char *what,
                       const kvc_context_t *ctx, uint64_t sequence,
                       int32_t layer, int32_t head, int32_t *out,
                       Count count) {
  return guarded(name, [&] {
    HeadRef ref;
    KVC_CHECK(lookupSettledHead(name, ctx, sequence, layer, head, ref));
    if (!out)
      return fail(KVC_STATUS_NULL_POINTER, "%s: %s is NULL", name, what);
    *out = static_cast<int32_t>(count(*ref.head));
    return KVC_STATUS_OK;
  });
}

} // namespace

extern "C" kvc_status_t kvc_get_num_entries(const kvc_context_t *ctx,
                                            uint64_t sequence, int32_t layer,
                                            int32_t head,
                                            int32_t *num_entries) {
  return headCount("kvc_get_num_entries", "num_entries", ctx, sequence, layer,
                   head, num_entries,
                   [](const HeadState &h) { return h.live; });
}

extern "C" kvc_status_t kvc_get_num_slots(const kvc_context_t *ctx,
                                          uint64_t sequence, int32_t layer,
                                          int32_t head, int32_t *num_slots) {
  return headCount("kvc_get_num_slots", "num_slots", ctx, sequence, layer,
                   head, num_slots,
                   [](const HeadState &h) { return h.position.size(); });
}

extern "C" kvc_status_t kvc_get_num_pages(const kvc_context_t *ctx,
                                          uint64_t sequence, int32_t layer,
                                          int32_t head, int32_t *num_pages) {
  return headCount("kvc_get_num_pages", "num_pages", ctx, sequence, layer,
                   head, num_pages,
                   [](const HeadState &h) { return h.pages.size(); });
}

extern "C" kvc_status_t kvc_get_page(const kvc_context_t *ctx,
                                     uint64_t sequence, int32_t layer,
                                     int32_t head, int32_t page,
                                     int32_t *pool_page, uint64_t *byte_offset,
                                     void **address) {
  const char *name = "kvc_get_page";
  return guarded(name, [&] {
    int32_t id = -1;
    KVC_CHECK(lookupPage(name, ctx, sequence, layer, head, page, id));
    if (pool_page)
      *pool_page = id < 0 ? -1 : ctx->poolPageOf(id);
    if (byte_offset)
      *byte_offset = id < 0 ? UINT64_MAX : ctx->pageOffset(id);
    if (address)
      *address = id < 0 ? nullptr : ctx->pageBase(id);
    return KVC_STATUS_OK;
  });
}

extern "C" kvc_status_t kvc_get_slot_location(const kvc_context_t *ctx,
                                              uint64_t sequence, int32_t layer,
                                              int32_t head, int32_t slot,
                                              int32_t *page_index,
                                              int32_t *page_offset,
                                              int32_t *pool_page) {
  const char *name = "kvc_get_slot_location";
  return guarded(name, [&] {
    HeadRef ref;
    KVC_CHECK(lookupSettledHead(name, ctx, sequence, layer, head, ref));
    int32_t slots = static_cast<int32_t>(ref.head->position.size());
    if (slot < 0 || slot >= slots)
      return fail(KVC_STATUS_OUT_OF_RANGE, "%s: slot %d out of range [0, %d)",
                  name, slot, slots);
    int32_t p = ctx->config.page_size;
    if (page_index)
      *page_index = slot / p;
    if (page_offset)
      *page_offset = slot % p;
    if (pool_page) {
      int32_t id = ref.head->pages[slot / p];
      *pool_page = id < 0 ? -1 : ctx->poolPageOf(id);
    }
    return KVC_STATUS_OK;
  });
}

extern "C" kvc_status_t kvc_get_page_format(const kvc_context_t *ctx,
                                            uint64_t sequence, int32_t layer,
                                            int32_t head, int32_t page,
                                            int32_t *format) {
  const char *name = "kvc_get_page_format";
  return guarded(name, [&] {
    int32_t id = -1;
    KVC_CHECK(lookupPage(name, ctx, sequence, layer, head, page, id));
    if (!format)
      return fail(KVC_STATUS_NULL_POINTER, "%s: format is NULL", name);
    *format = id < 0 ? -1 : ctx->formatOf(id);
    return KVC_STATUS_OK;
  });
}

extern "C" kvc_status_t kvc_get_metadata(kvc_context_t *ctx, uint64_t sequence,
                                         int32_t layer, int32_t head,
                                         kvc_metadata_t *metadata) {
  const char *name = "kvc_get_metadata";
  return guarded(name, [&] {
    HeadRef ref;
    KVC_CHECK(lookupHead(name, ctx, sequence, layer, head, ref));
    KVC_CHECK(settle(ctx, sequence, ref, layer));
    if (!metadata)
      return fail(KVC_STATUS_NULL_POINTER, "%s: metadata is NULL", name);
    HeadState &h = *ref.head;
    metadata->num_slots = static_cast<int32_t>(h.position.size());
    metadata->position = h.position.data();
    metadata->score = h.score.data();
    metadata->weight = h.weight.data();
    metadata->history = h.history.data();
    metadata->key_format = h.keyFormat.data();
    metadata->value_format = h.valueFormat.data();
    return KVC_STATUS_OK;
  });
}

extern "C" kvc_status_t kvc_attach(kvc_context_t *ctx, uint64_t sequence,
                                   int32_t layer,
                                   const kvc_attachment_t *attachment) {
  const char *name = "kvc_attach";
  return guarded(name, [&] {
    HeadRef ref;
    KVC_CHECK(lookupHead(name, ctx, sequence, layer, 0, ref));
    if (!attachment)
      return fail(KVC_STATUS_NULL_POINTER, "%s: attachment is NULL", name);
    KVC_CHECK(settle(ctx, sequence, ref, layer));
    ref.sequence->attachments[layer] = *attachment;
    return KVC_STATUS_OK;
  });
}

extern "C" kvc_status_t kvc_detach(kvc_context_t *ctx, uint64_t sequence,
                                   int32_t layer,
                                   kvc_attachment_t *attachment) {
  const char *name = "kvc_detach";
  return guarded(name, [&] {
    HeadRef ref;
    KVC_CHECK(lookupHead(name, ctx, sequence, layer, 0, ref));
    if (!attachment)
      return fail(KVC_STATUS_NULL_POINTER, "%s: attachment is NULL", name);
    *attachment = ref.sequence->attachments[layer];
    ref.sequence->attachments[layer] = kvc_attachment_t{};
    return KVC_STATUS_OK;
  });
}

namespace {

/// The KIVI record of head `ref` (kvc_kivi_work_t).
void fillKiviWork(const kvc_context *ctx, const HeadRef &ref,
                  kvc_kivi_work_t &work) {
  const HeadState &h = *ref.head;
  const KiviWork &w = h.work;
  uint8_t *residual = ctx->residualKey(ref.sequence->index, ref.headIndex, 0);
  work.residual = residual;
  work.residual_offset = static_cast<uint64_t>(residual - ctx->pool);
  work.residual_length = ctx->config.residual_length;
  work.residual_slot = h.residualSlot.data();
  work.num_values = static_cast<int32_t>(w.values.size());
  work.values = w.values.data();
  work.num_key_blocks = static_cast<int32_t>(w.blockBegin.size()) - 1;
  work.key_block_begin = w.blockBegin.data();
  work.key_members = w.members.data();
  work.num_stages = static_cast<int32_t>(w.stages.size());
  work.stages = w.stages.data();
  work.serial = h.workSerial;
  work.num_slots = static_cast<int32_t>(h.position.size());
  work.key_format = h.keyFormat.data();
  work.value_format = h.valueFormat.data();
  work.num_pages = static_cast<int32_t>(h.pages.size());
  work.pages = h.pages.data();
}

} // namespace

extern "C" kvc_status_t kvc_kivi_pending_work(const kvc_context_t *ctx,
                                              uint64_t sequence, int32_t layer,
                                              int32_t head,
                                              kvc_kivi_work_t *work) {
  const char *name = "kvc_kivi_pending_work";
  return guarded(name, [&] {
    HeadRef ref;
    KVC_CHECK(lookupSettledHead(name, ctx, sequence, layer, head, ref));
    if (!work)
      return fail(KVC_STATUS_NULL_POINTER, "%s: work is NULL", name);
    if (!ctx->isKivi())
      return fail(KVC_STATUS_UNSUPPORTED, "%s: the context's format is not KIVI",
                  name);
    fillKiviWork(ctx, ref, *work);
    return KVC_STATUS_OK;
  });
}

extern "C" kvc_status_t kvc_kivi_step_work(const kvc_context_t *ctx,
                                           int32_t layer, int32_t batch,
                                           const uint64_t *sequences,
                                           kvc_kivi_work_t *works) {
  const char *name = "kvc_kivi_step_work";
  return guarded(name, [&] {
    if (!ctx)
      return fail(KVC_STATUS_NULL_POINTER, "%s: context is NULL", name);
    if (!sequences || !works)
      return fail(KVC_STATUS_NULL_POINTER, "%s: %s is NULL", name,
                  sequences ? "works" : "sequences");
    if (batch <= 0)
      return fail(KVC_STATUS_INVALID_ARGUMENT,
                  "%s: batch must be > 0 (got %d)", name, batch);
    if (layer < 0 || layer >= ctx->config.num_layers)
      return fail(KVC_STATUS_OUT_OF_RANGE, "%s: layer %d out of range [0, %d)",
                  name, layer, ctx->config.num_layers);
    // Every sequence is looked up and settled before any record is written.
    auto find = [&](int32_t b) {
      return const_cast<kvc_context *>(ctx)->sequences.find(sequences[b]);
    };
    for (int32_t b = 0; b < batch; ++b) {
      auto it = find(b);
      if (it == ctx->sequences.end())
        return fail(KVC_STATUS_OUT_OF_RANGE,
                    "%s: unknown sequence %llu (batch index %d)", name,
                    static_cast<unsigned long long>(sequences[b]), b);
      HeadRef ref;
      ref.sequence = &it->second;
      KVC_CHECK(settleForQuery(ctx, sequences[b], ref, layer));
    }
    if (!ctx->isKivi())
      return fail(KVC_STATUS_UNSUPPORTED, "%s: the context's format is not KIVI",
                  name);
    const int32_t kvHeads = ctx->config.num_kv_heads;
    for (int32_t b = 0; b < batch; ++b) {
      Sequence &seq = find(b)->second;
      for (int32_t head = 0; head < kvHeads; ++head) {
        HeadRef ref;
        ref.sequence = &seq;
        ref.headIndex = layer * kvHeads + head;
        ref.head = &seq.heads[ref.headIndex];
        fillKiviWork(ctx, ref, works[static_cast<int64_t>(b) * kvHeads + head]);
      }
    }
    return KVC_STATUS_OK;
  });
}

extern "C" kvc_status_t kvc_read_entry(const kvc_context_t *ctx,
                                       uint64_t sequence, int32_t layer,
                                       int32_t head, int32_t slot, int32_t dim,
                                       float *key, float *value) {
  const char *name = "kvc_read_entry";
  return guarded(name, [&] {
    HeadRef ref;
    KVC_CHECK(lookupSettledHead(name, ctx, sequence, layer, head, ref));
    if (!ctx->isHost())
      return fail(KVC_STATUS_UNSUPPORTED,
                  "%s: the runtime does not dereference device pools", name);
    KVC_CHECK(checkDim(name, ctx, dim));
    KVC_CHECK(checkFloatArray(name, "key", key));
    KVC_CHECK(checkFloatArray(name, "value", value));
    KVC_CHECK(checkLiveSlot(name, ctx, *ref.head, slot));
    readEntry(ctx, *ref.sequence, ref.headIndex, *ref.head, slot, key, value);
    return KVC_STATUS_OK;
  });
}

extern "C" kvc_status_t kvc_write_entry(kvc_context_t *ctx, uint64_t sequence,
                                        int32_t layer, int32_t head,
                                        int32_t slot, int32_t dim,
                                        const float *key, const float *value) {
  const char *name = "kvc_write_entry";
  return guarded(name, [&] {
    HeadRef ref;
    KVC_CHECK(lookupHead(name, ctx, sequence, layer, head, ref));
    KVC_CHECK(settle(ctx, sequence, ref, layer));
    if (!ctx->isHost())
      return fail(KVC_STATUS_UNSUPPORTED,
                  "%s: the runtime does not dereference device pools", name);
    KVC_CHECK(checkDim(name, ctx, dim));
    if (!key && !value)
      return fail(KVC_STATUS_NULL_POINTER, "%s: key and value are both NULL",
                  name);
    if (key)
      KVC_CHECK(checkFloatArray(name, "key", key));
    if (value)
      KVC_CHECK(checkFloatArray(name, "value", value));
    if (ctx->config.format != KVC_FORMAT_FULL || ctx->hasLowClass()) {
      if (key)
        KVC_CHECK(checkFinite(name, "key", key, dim));
      if (value)
        KVC_CHECK(checkFinite(name, "value", value, dim));
    }
    KVC_CHECK(checkLiveSlot(name, ctx, *ref.head, slot));
    Scratch scratch(ctx, true);
    writeEntry(ctx, *ref.sequence, ref.headIndex, *ref.head, slot, key, value,
               scratch);
    return KVC_STATUS_OK;
  });
}

//===----------------------------------------------------------------------===//
// Pool accounting
//===----------------------------------------------------------------------===//

extern "C" kvc_status_t kvc_pool_stats(const kvc_context_t *ctx,
                                       kvc_pool_stats_t *stats) {
  return guarded("kvc_pool_stats", [&] {
    if (!ctx || !stats)
      return fail(KVC_STATUS_NULL_POINTER, "kvc_pool_stats: %s is NULL",
                  ctx ? "stats" : "context");
    KVC_CHECK(settleAll(ctx));
    kvc_pool_stats_t s{};
    s.total_pages = ctx->config.num_pages;
    s.free_pages = static_cast<int32_t>(ctx->freePages.size());
    s.num_sequences = static_cast<int32_t>(ctx->sequences.size());
    for (const auto &entry : ctx->sequences)
      for (const HeadState &h : entry.second.heads) {
        s.live_entries += h.live;
        for (int32_t page : h.pages)
          s.mapped_pages += page >= 0 && !ctx->isLowPage(page);
      }
    for (int32_t used : ctx->lowUsed) {
      s.low_pool_pages += used > 0;
      s.low_pages_used += used;
    }
    s.mapped_pages += s.low_pool_pages;
    *stats = s;
    return KVC_STATUS_OK;
  });
}

extern "C" kvc_status_t kvc_pool_check(const kvc_context_t *ctx) {
  const char *name = "kvc_pool_check";
  return guarded(name, [&] {
    if (!ctx)
      return fail(KVC_STATUS_NULL_POINTER, "%s: context is NULL", name);
    KVC_CHECK(settleAll(ctx));
    const int32_t n = ctx->config.num_pages, p = ctx->config.page_size;
    const int32_t k = ctx->lowPerPage;
    std::vector<int32_t> owners(static_cast<size_t>(n), 0);
    for (int32_t page : ctx->freePages) {
      if (page < 0 || page >= n)
        return fail(KVC_STATUS_INTERNAL, "%s: free page id %d invalid", name,
                    page);
      ++owners[page];
    }
    // Low pages: each is free or in exactly one table, and a pool page
    // serving the low class counts as one owner.
    const int64_t lowIds = static_cast<int64_t>(n) * k;
    std::vector<int32_t> lowOwners(static_cast<size_t>(lowIds), 0);
    std::vector<int32_t> lowInTables(static_cast<size_t>(n), 0);
    for (int32_t id : ctx->lowFree) {
      if (id < n || id - n >= lowIds)
        return fail(KVC_STATUS_INTERNAL, "%s: free low page id %d invalid",
                    name, id);
      ++lowOwners[id - n];
    }
    for (const auto &entry : ctx->sequences) {
      for (size_t hi = 0; hi < entry.second.heads.size(); ++hi) {
        const HeadState &h = entry.second.heads[hi];
        size_t slots = h.pages.size() * static_cast<size_t>(p);
        if (h.position.size() != slots || h.score.size() != slots ||
            h.history.size() != slots ||
            h.pageLive.size() != h.pages.size())
          return fail(KVC_STATUS_INTERNAL,
                      "%s: metadata length mismatch in head %zu", name, hi);
        if (!h.pages.empty() && h.pages.back() < 0)
          return fail(KVC_STATUS_INTERNAL, "%s: trailing hole in head %zu",
                      name, hi);
        int32_t live = 0;
        for (size_t page = 0; page < h.pages.size(); ++page) {
          int32_t pageLive = 0;
          for (int32_t k = 0; k < p; ++k)
            pageLive += h.position[page * p + k] != KVC_POSITION_NONE;
          if (h.pages[page] < 0) {
            if (pageLive != 0)
              return fail(KVC_STATUS_INTERNAL,
                          "%s: live entries in a hole of head %zu", name, hi);
            continue;
          }
          const int32_t id = h.pages[page];
          if (id >= n + lowIds)
            return fail(KVC_STATUS_INTERNAL, "%s: page id %d invalid", name,
                        id);
          if (ctx->isLowPage(id)) {
            ++lowOwners[id - n];
            ++lowInTables[ctx->poolPageOf(id)];
            for (size_t s = page * p; s < (page + 1) * p; ++s)
              if (h.position[s] != KVC_POSITION_NONE &&
                  h.keyFormat[s] != ctx->config.low_format)
                return fail(KVC_STATUS_INTERNAL,
                            "%s: slot %zu of a low page of head %zu has "
                            "format %d",
                            name, s, hi, h.keyFormat[s]);
          } else {
            ++owners[id];
          }
          // Eviction must return an emptied page at once; only the page
          // of the KIVI block still being filled may be empty.
          bool holdsOpenBlock =
              h.openBlock >= 0 && h.openBlock / p == static_cast<int32_t>(page);
          if (pageLive == 0 && !holdsOpenBlock)
            return fail(KVC_STATUS_INTERNAL,
                        "%s: empty page %zu of head %zu is still mapped", name,
                        page, hi);
          if (pageLive != h.pageLive[page])
            return fail(KVC_STATUS_INTERNAL,
                        "%s: live count of page %zu of head %zu is %d, "
                        "recorded %d",
                        name, page, hi, pageLive, h.pageLive[page]);
          // Appends search for free units in the pages marked open only.
          const bool open =
              page / 64 < h.openPages.size() &&
              (h.openPages[page / 64] >> (page % 64) & 1) != 0;
          if (!open)
            for (int32_t first = static_cast<int32_t>(page) * p;
                 first < static_cast<int32_t>(page + 1) * p;
                 first += ctx->unit)
              if (unitIsFree(ctx, h, first))
                return fail(KVC_STATUS_INTERNAL,
                            "%s: page %zu of head %zu has a free unit but "
                            "is not marked open",
                            name, page, hi);
          live += pageLive;
        }
        if (live != h.live)
          return fail(KVC_STATUS_INTERNAL, "%s: head %zu live %d, recorded %d",
                      name, hi, live, h.live);
        if (ctx->isKivi()) {
          int32_t r = ctx->config.residual_length;
          for (int32_t row = 0; row < r; ++row) {
            int32_t slot = h.residualSlot[row];
            if (slot < 0)
              continue;
            if (static_cast<size_t>(slot) >= slots ||
                h.position[slot] == KVC_POSITION_NONE ||
                h.appendIndex[slot] % r != row ||
                h.appendIndex[slot] < h.appended - r)
              return fail(KVC_STATUS_INTERNAL,
                          "%s: residual row %d of head %zu is stale", name, row,
                          hi);
          }
        }
      }
    }
    for (int32_t q = 0; q < n && k > 0; ++q) {
      // lowOwners counts the free list and the tables together.
      const int32_t used = lowInTables[q];
      int32_t free = -used;
      for (int32_t sub = 0; sub < k; ++sub) {
        int32_t refs = lowOwners[static_cast<size_t>(q) * k + sub];
        if (refs > 1)
          return fail(KVC_STATUS_INTERNAL,
                      "%s: low page %d of pool page %d is referenced %d "
                      "times",
                      name, sub, q, refs);
        free += refs;
      }
      if (used != ctx->lowUsed[q])
        return fail(KVC_STATUS_INTERNAL,
                    "%s: pool page %d has %d low pages in tables, %d counted",
                    name, q, used, ctx->lowUsed[q]);
      if (used > 0 && used + free != k)
        return fail(KVC_STATUS_INTERNAL,
                    "%s: pool page %d has %d low pages used and %d free of %d",
                    name, q, used, free, k);
      if (used == 0 && free != 0)
        return fail(KVC_STATUS_INTERNAL,
                    "%s: pool page %d has free low pages but none used", name,
                    q);
      owners[q] += used > 0;
    }
    for (int32_t page = 0; page < n; ++page)
      if (owners[page] != 1)
        return fail(KVC_STATUS_INTERNAL,
                    "%s: page %d is referenced %d times (free list + tables)",
                    name, page, owners[page]);
    return KVC_STATUS_OK;
  });
}
