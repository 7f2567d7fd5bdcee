//===- PoolTest.cpp - Pages, page tables, eviction, compaction, KIVI ------===//
//
// Hand-worked layouts and compactions, a long randomized run of appends,
// evictions, compactions and sequence churn checked against a model of what
// every head should hold, the KIVI residual window against the reference's
// simulation, and bookkeeping-only device pools.
//
//===----------------------------------------------------------------------===//

#include "runtime/kvc_runtime.h"
#include "test/reference/Reference.h"
#include "test/runtime/TestSupport.h"

#include "gtest/gtest.h"

#include <cmath>
#include <cstdio>
#include <cstring>
#include <map>
#include <numeric>
#include <random>
#include <set>
#include <tuple>

namespace {

using namespace kvc::test;

std::vector<int32_t> iota(int32_t n, int32_t start = 0) {
  std::vector<int32_t> v(static_cast<size_t>(n));
  std::iota(v.begin(), v.end(), start);
  return v;
}

/// Appends n entries with key[c] = 100 * position + c and value[c] =
/// -(100 * position + c); returns the slots.
std::vector<int32_t> appendCounting(kvc_context_t *ctx, uint64_t seq,
                                    int32_t layer, int32_t head, int32_t d,
                                    const std::vector<int32_t> &positions) {
  int32_t n = static_cast<int32_t>(positions.size());
  std::vector<float> keys(static_cast<size_t>(n) * d), values(keys.size());
  for (int32_t i = 0; i < n; ++i)
    for (int32_t c = 0; c < d; ++c) {
      keys[i * d + c] = 100.0f * positions[i] + c;
      values[i * d + c] = -(100.0f * positions[i] + c);
    }
  std::vector<int32_t> slots(static_cast<size_t>(n), -1);
  EXPECT_EQ(kvc_append(ctx, seq, layer, head, n, d, keys.data(), values.data(),
                       positions.data(), slots.data()),
            KVC_STATUS_OK)
      << kvc_last_error();
  return slots;
}

/// Checks that `slot` holds the entry appendCounting wrote for `position`.
void expectCountingEntry(kvc_context_t *ctx, uint64_t seq, int32_t layer,
                         int32_t head, int32_t d, int32_t slot,
                         int32_t position) {
  kvc_metadata_t m;
  ASSERT_EQ(kvc_get_metadata(ctx, seq, layer, head, &m), KVC_STATUS_OK);
  ASSERT_LT(slot, m.num_slots);
  EXPECT_EQ(m.position[slot], position);
  std::vector<float> k(d), v(d);
  ASSERT_EQ(kvc_read_entry(ctx, seq, layer, head, slot, d, k.data(), v.data()),
            KVC_STATUS_OK)
      << kvc_last_error();
  for (int32_t c = 0; c < d; ++c) {
    EXPECT_EQ(k[c], 100.0f * position + c) << "slot " << slot;
    EXPECT_EQ(v[c], -(100.0f * position + c)) << "slot " << slot;
  }
}

//===----------------------------------------------------------------------===//
// Layouts
//===----------------------------------------------------------------------===//

TEST(Layout, HandComputedOffsets) {
  // FULL f16, d = 8, 4 slots: rows of 8 * 2 = 16 bytes; values start at
  // 4 * 16 = 64; 128 bytes of data round up to one 256-byte page.
  kvc_config_t c = smallConfig();
  c.dtype = KVC_DTYPE_F16;
  kvc_page_layout_t l;
  ASSERT_EQ(kvc_page_layout(&c, &l), KVC_STATUS_OK);
  EXPECT_EQ(l.key_offset, 0u);
  EXPECT_EQ(l.key_stride, 16u);
  EXPECT_EQ(l.value_offset, 64u);
  EXPECT_EQ(l.value_stride, 16u);
  EXPECT_EQ(l.key_param_stride, 0u);
  EXPECT_EQ(l.page_bytes, 256u);
  EXPECT_EQ(l.pages_offset, 0u);
  uint64_t bytes = 0;
  ASSERT_EQ(kvc_pool_bytes_required(&c, &bytes), KVC_STATUS_OK);
  EXPECT_EQ(bytes, 32u * 256u);

  // KIVI int4, d = 8, G = 4, R = 8, 8 slots, f32:
  //  key rows 8 * 4 / 8 = 4 bytes -> 32 bytes; values at 32 .. 64;
  //  key records: 8 / 4 = 2 blocks x 8 channels x {scale, min} (two f16,
  //  4 bytes) = 2 x 32 at 64 .. 128; value records: 8 slots x 2
  //  groups x 4 bytes = 8 x 8 at 128 .. 192 -> page 256 bytes.
  //  Residual: 2 x R x d x 4 = 512 bytes per head; 4 sequences x 2 layers x
  //  2 heads = 16 heads -> pages start at 8192.
  c = smallConfig(KVC_FORMAT_KIVI_INT4);
  ASSERT_EQ(kvc_page_layout(&c, &l), KVC_STATUS_OK);
  EXPECT_EQ(l.key_stride, 4u);
  EXPECT_EQ(l.value_offset, 32u);
  EXPECT_EQ(l.key_param_offset, 64u);
  EXPECT_EQ(l.key_param_stride, 32u);
  EXPECT_EQ(l.value_param_offset, 128u);
  EXPECT_EQ(l.value_param_stride, 8u);
  EXPECT_EQ(l.page_bytes, 256u);
  EXPECT_EQ(l.residual_bytes, 512u);
  EXPECT_EQ(l.pages_offset, 8192u);
  ASSERT_EQ(kvc_pool_bytes_required(&c, &bytes), KVC_STATUS_OK);
  EXPECT_EQ(bytes, 8192u + 32u * 256u);

  // INT8, d = 8, 4 slots: rows of 8 bytes (32 per region), one float scale
  // per slot for keys (at 64) and values (at 80); 96 bytes -> 256.
  c = smallConfig(KVC_FORMAT_INT8);
  ASSERT_EQ(kvc_page_layout(&c, &l), KVC_STATUS_OK);
  EXPECT_EQ(l.value_offset, 32u);
  EXPECT_EQ(l.key_param_offset, 64u);
  EXPECT_EQ(l.value_param_offset, 80u);
  EXPECT_EQ(l.page_bytes, 256u);
}

TEST(Layout, BytesInPagesFollowTheDocumentedLayout) {
  kvc_config_t c = smallConfig(KVC_FORMAT_INT8);
  Fixture f(c);
  kvc_page_layout_t l;
  ASSERT_EQ(kvc_page_layout(&c, &l), KVC_STATUS_OK);
  ASSERT_EQ(kvc_sequence_add(f.ctx, 9), KVC_STATUS_OK);
  // Slot 1 of the first page: key (127, -64, 0, ...) has scale 1.
  float key[8] = {0}, value[8] = {0};
  int32_t pos[2] = {0, 1}, slots[2];
  float keys[16] = {0}, values[16] = {0};
  key[0] = 127.0f;
  key[1] = -64.0f;
  value[2] = 12.7f;
  std::memcpy(keys + 8, key, sizeof(key));
  std::memcpy(values + 8, value, sizeof(value));
  ASSERT_EQ(kvc_append(f.ctx, 9, 1, 1, 2, 8, keys, values, pos, slots),
            KVC_STATUS_OK);
  ASSERT_EQ(slots[1], 1);
  void *page = nullptr;
  uint64_t offset = 0;
  ASSERT_EQ(kvc_get_page(f.ctx, 9, 1, 1, 0, nullptr, &offset, &page),
            KVC_STATUS_OK);
  EXPECT_EQ(static_cast<uint8_t *>(f.pool->data) + offset, page);
  const auto *bytes = static_cast<const uint8_t *>(page);
  const int8_t *keyRow =
      reinterpret_cast<const int8_t *>(bytes + l.key_offset + 1 * l.key_stride);
  EXPECT_EQ(keyRow[0], 127);
  EXPECT_EQ(keyRow[1], -64);
  float keyScale, valueScale;
  std::memcpy(&keyScale, bytes + l.key_param_offset + 4, 4);
  std::memcpy(&valueScale, bytes + l.value_param_offset + 4, 4);
  EXPECT_EQ(keyScale, 1.0f);
  EXPECT_FLOAT_EQ(valueScale, 0.1f);
  const int8_t *valueRow = reinterpret_cast<const int8_t *>(
      bytes + l.value_offset + 1 * l.value_stride);
  EXPECT_EQ(valueRow[2], 127);
}

//===----------------------------------------------------------------------===//
// Eviction, reuse, compaction
//===----------------------------------------------------------------------===//

TEST(Pages, EvictionReturnsPagesAndSlotsAreReused) {
  Fixture f(smallConfig());
  const int32_t d = 8;
  ASSERT_EQ(kvc_sequence_add(f.ctx, 1), KVC_STATUS_OK);
  std::vector<int32_t> slots = appendCounting(f.ctx, 1, 0, 0, d, iota(8));
  EXPECT_EQ(slots, iota(8));
  kvc_pool_stats_t s;
  ASSERT_EQ(kvc_pool_stats(f.ctx, &s), KVC_STATUS_OK);
  EXPECT_EQ(s.free_pages, 30);
  int32_t firstPage = -1;
  ASSERT_EQ(kvc_get_page(f.ctx, 1, 0, 0, 0, &firstPage, nullptr, nullptr),
            KVC_STATUS_OK);

  // Emptying page 0 returns it at once; slots 4..7 keep their numbers.
  std::vector<int32_t> evict = {0, 1, 2, 3};
  ASSERT_EQ(kvc_evict(f.ctx, 1, 0, 0, 4, evict.data()), KVC_STATUS_OK);
  ASSERT_EQ(kvc_pool_stats(f.ctx, &s), KVC_STATUS_OK);
  EXPECT_EQ(s.free_pages, 31);
  int32_t hole = 0, numPages = 0;
  ASSERT_EQ(kvc_get_num_pages(f.ctx, 1, 0, 0, &numPages), KVC_STATUS_OK);
  EXPECT_EQ(numPages, 2);
  uint64_t offset = 0;
  void *address = &hole;
  ASSERT_EQ(kvc_get_page(f.ctx, 1, 0, 0, 0, &hole, &offset, &address),
            KVC_STATUS_OK);
  EXPECT_EQ(hole, -1);
  EXPECT_EQ(offset, UINT64_MAX);
  EXPECT_EQ(address, nullptr);
  expectCountingEntry(f.ctx, 1, 0, 0, d, 5, 5);

  // Evict one slot of the remaining page: the next append takes that slot
  // (lowest free slot of a mapped page) before mapping the hole again.
  int32_t six = 6;
  ASSERT_EQ(kvc_evict(f.ctx, 1, 0, 0, 1, &six), KVC_STATUS_OK);
  EXPECT_EQ(appendCounting(f.ctx, 1, 0, 0, d, {100}), std::vector<int32_t>{6});
  expectCountingEntry(f.ctx, 1, 0, 0, d, 6, 100);
  // The next one maps the hole with the page just freed (LIFO free list).
  EXPECT_EQ(appendCounting(f.ctx, 1, 0, 0, d, {101}), std::vector<int32_t>{0});
  int32_t reused = -1;
  ASSERT_EQ(kvc_get_page(f.ctx, 1, 0, 0, 0, &reused, nullptr, nullptr),
            KVC_STATUS_OK);
  EXPECT_EQ(reused, firstPage);
  EXPECT_EQ(kvc_pool_check(f.ctx), KVC_STATUS_OK) << kvc_last_error();

  // Evicting the last page trims the table.
  std::vector<int32_t> rest = {4, 5, 6, 7};
  ASSERT_EQ(kvc_evict(f.ctx, 1, 0, 0, 4, rest.data()), KVC_STATUS_OK);
  ASSERT_EQ(kvc_get_num_pages(f.ctx, 1, 0, 0, &numPages), KVC_STATUS_OK);
  EXPECT_EQ(numPages, 1);
  ASSERT_EQ(kvc_sequence_remove(f.ctx, 1), KVC_STATUS_OK);
  ASSERT_EQ(kvc_pool_stats(f.ctx, &s), KVC_STATUS_OK);
  EXPECT_EQ(s.free_pages, 32);
  EXPECT_EQ(kvc_pool_check(f.ctx), KVC_STATUS_OK) << kvc_last_error();
}

TEST(Pages, HeadsHoldDifferentCounts) {
  Fixture f(smallConfig());
  ASSERT_EQ(kvc_sequence_add(f.ctx, 3), KVC_STATUS_OK);
  // Layer 0 head 0: 9 entries (3 pages); layer 1 head 1: 1 entry (1 page).
  appendCounting(f.ctx, 3, 0, 0, 8, iota(9));
  appendCounting(f.ctx, 3, 1, 1, 8, {0});
  int32_t n00 = 0, n11 = 0, n01 = 0, pages = 0;
  kvc_get_num_entries(f.ctx, 3, 0, 0, &n00);
  kvc_get_num_entries(f.ctx, 3, 1, 1, &n11);
  kvc_get_num_entries(f.ctx, 3, 0, 1, &n01);
  EXPECT_EQ(n00, 9);
  EXPECT_EQ(n11, 1);
  EXPECT_EQ(n01, 0);
  kvc_get_num_pages(f.ctx, 3, 0, 0, &pages);
  EXPECT_EQ(pages, 3);
  kvc_pool_stats_t s;
  kvc_pool_stats(f.ctx, &s);
  EXPECT_EQ(s.mapped_pages, 4); // memory follows the counts, no padding
  int32_t pageIndex, pageOffset, poolPage;
  ASSERT_EQ(kvc_get_slot_location(f.ctx, 3, 0, 0, 6, &pageIndex, &pageOffset,
                                  &poolPage),
            KVC_STATUS_OK);
  EXPECT_EQ(pageIndex, 1);
  EXPECT_EQ(pageOffset, 2);
  int32_t expectedPool = -1;
  kvc_get_page(f.ctx, 3, 0, 0, 1, &expectedPool, nullptr, nullptr);
  EXPECT_EQ(poolPage, expectedPool);
}

TEST(Pages, CompactionHandWorked) {
  kvc_config_t c = smallConfig();
  c.num_layers = 1;
  c.num_kv_heads = c.num_q_heads = 1;
  Fixture f(c);
  const int32_t d = 8;
  ASSERT_EQ(kvc_sequence_add(f.ctx, 0), KVC_STATUS_OK);
  appendCounting(f.ctx, 0, 0, 0, d, iota(12));
  // Kernel-owned metadata of every entry: score 10 * position, merge weight
  // position + 1, history bits 1 << position; it must follow its entry.
  {
    kvc_metadata_t m;
    ASSERT_EQ(kvc_get_metadata(f.ctx, 0, 0, 0, &m), KVC_STATUS_OK);
    for (int32_t s = 0; s < 12; ++s) {
      EXPECT_EQ(m.history[s], 0u) << "fresh entries have no history";
      m.score[s] = 10.0f * s;
      m.weight[s] = s + 1.0f;
      m.history[s] = uint64_t{1} << s;
    }
  }
  // Leave page 0 full, page 1 with slot 5, page 2 with slots 8 and 9.
  std::vector<int32_t> evict = {4, 6, 7, 10, 11};
  ASSERT_EQ(kvc_evict(f.ctx, 0, 0, 0, 5, evict.data()), KVC_STATUS_OK);
  int32_t page1 = -1, page2 = -1;
  kvc_get_page(f.ctx, 0, 0, 0, 1, &page1, nullptr, nullptr);
  kvc_get_page(f.ctx, 0, 0, 0, 2, &page2, nullptr, nullptr);

  // Occupancy limit 0.5 (2 of 4): candidates page 1 (1 live) and page 2
  // (2 live). Free room: 3 (page 1) + 2 (page 2) = 5 slots.
  //  - page 1: moves 1 <= 5 - 3 = 2 -> released; room left 2.
  //  - page 2: moves 1 + 2 = 3 > 2 - 2 = 0 -> kept.
  // Slot 5 goes to the lowest free slot of a kept page: 10 (page 2).
  // Closing the hole maps page 2 to table entry 1: 8 -> 4, 9 -> 5, 10 -> 6.
  kvc_move_t moves[3];
  int32_t numMoves = 0, released = 0;
  ASSERT_EQ(kvc_compact(f.ctx, 0, 0, 0, 0.5f, moves, 3, &numMoves, &released),
            KVC_STATUS_OK)
      << kvc_last_error();
  EXPECT_EQ(released, 1);
  ASSERT_EQ(numMoves, 3);
  EXPECT_EQ(moves[0].from_slot, 8);
  EXPECT_EQ(moves[0].to_slot, 4);
  EXPECT_EQ(moves[0].copy_data, 0);
  EXPECT_EQ(moves[1].from_slot, 9);
  EXPECT_EQ(moves[1].to_slot, 5);
  EXPECT_EQ(moves[1].copy_data, 0);
  EXPECT_EQ(moves[2].from_slot, 5);
  EXPECT_EQ(moves[2].to_slot, 6);
  EXPECT_EQ(moves[2].copy_data, 1);
  EXPECT_EQ(moves[2].from_page, page1);
  EXPECT_EQ(moves[2].from_offset, 1);
  EXPECT_EQ(moves[2].to_page, page2);
  EXPECT_EQ(moves[2].to_offset, 2);
  int32_t pages = 0, entries = 0;
  kvc_get_num_pages(f.ctx, 0, 0, 0, &pages);
  kvc_get_num_entries(f.ctx, 0, 0, 0, &entries);
  EXPECT_EQ(pages, 2);
  EXPECT_EQ(entries, 7);
  for (int32_t s = 0; s < 4; ++s)
    expectCountingEntry(f.ctx, 0, 0, 0, d, s, s);
  expectCountingEntry(f.ctx, 0, 0, 0, d, 4, 8);
  expectCountingEntry(f.ctx, 0, 0, 0, d, 5, 9);
  expectCountingEntry(f.ctx, 0, 0, 0, d, 6, 5);
  {
    kvc_metadata_t m;
    ASSERT_EQ(kvc_get_metadata(f.ctx, 0, 0, 0, &m), KVC_STATUS_OK);
    for (int32_t slot : {0, 1, 2, 3, 4, 5, 6}) {
      const int32_t pos = m.position[slot];
      EXPECT_EQ(m.score[slot], 10.0f * pos) << "slot " << slot;
      EXPECT_EQ(m.weight[slot], pos + 1.0f) << "slot " << slot;
      EXPECT_EQ(m.history[slot], uint64_t{1} << pos) << "slot " << slot;
    }
    EXPECT_EQ(m.history[7], 0u) << "a free slot has no history";
  }
  kvc_pool_stats_t s;
  kvc_pool_stats(f.ctx, &s);
  EXPECT_EQ(s.free_pages, 30);
  EXPECT_EQ(kvc_pool_check(f.ctx), KVC_STATUS_OK) << kvc_last_error();
}

TEST(Pages, CompactionWithTooFewMovesChangesNothing) {
  kvc_config_t c = smallConfig();
  Fixture f(c);
  ASSERT_EQ(kvc_sequence_add(f.ctx, 0), KVC_STATUS_OK);
  appendCounting(f.ctx, 0, 0, 0, 8, iota(12));
  std::vector<int32_t> evict = {4, 6, 7, 10, 11};
  ASSERT_EQ(kvc_evict(f.ctx, 0, 0, 0, 5, evict.data()), KVC_STATUS_OK);
  Snapshot before = snapshot(f.ctx, {0});
  kvc_move_t moves[2];
  int32_t numMoves = 0, released = -7;
  EXPECT_EQ(kvc_compact(f.ctx, 0, 0, 0, 0.5f, moves, 2, &numMoves, &released),
            KVC_STATUS_BUFFER_TOO_SMALL);
  EXPECT_EQ(numMoves, 3);
  EXPECT_EQ(released, -7);
  EXPECT_NE(std::string(kvc_last_error()).find("nothing was changed"),
            std::string::npos);
  EXPECT_TRUE(snapshot(f.ctx, {0}) == before);
}

TEST(Pages, BudgetsCapAppends) {
  Fixture f(smallConfig());
  ASSERT_EQ(kvc_sequence_add(f.ctx, 0), KVC_STATUS_OK);
  ASSERT_EQ(kvc_set_budget(f.ctx, 0, 0, 1, 5), KVC_STATUS_OK);
  appendCounting(f.ctx, 0, 0, 1, 8, iota(4));
  Snapshot before = snapshot(f.ctx, {0});
  std::vector<float> kv(16, 0.5f);
  int32_t pos[2] = {4, 5};
  EXPECT_EQ(
      kvc_append(f.ctx, 0, 0, 1, 2, 8, kv.data(), kv.data(), pos, nullptr),
      KVC_STATUS_OVER_BUDGET);
  EXPECT_TRUE(snapshot(f.ctx, {0}) == before);
  // One more fits; other heads are not capped.
  EXPECT_EQ(
      kvc_append(f.ctx, 0, 0, 1, 1, 8, kv.data(), kv.data(), pos, nullptr),
      KVC_STATUS_OK);
  EXPECT_EQ(
      kvc_append(f.ctx, 0, 0, 0, 2, 8, kv.data(), kv.data(), pos, nullptr),
      KVC_STATUS_OK);
  // 32 pages x 4 slots = 128 slots: a budget of 129 can never be held.
  EXPECT_EQ(kvc_set_budget(f.ctx, 0, 0, 1, 129),
            KVC_STATUS_BUDGET_OVER_CAPACITY);
  EXPECT_EQ(kvc_set_budget(f.ctx, 0, 0, 1, 128), KVC_STATUS_OK);
  EXPECT_EQ(kvc_set_budget(f.ctx, 0, 0, 1, 4), KVC_STATUS_INVALID_ARGUMENT);
  EXPECT_EQ(kvc_set_budget(f.ctx, 0, 0, 1, -1), KVC_STATUS_OK);
}

//===----------------------------------------------------------------------===//
// Randomized accounting
//===----------------------------------------------------------------------===//

struct ModelEntry {
  int32_t position;
  std::vector<float> key, value;
};

using HeadKey = std::tuple<uint64_t, int32_t, int32_t>;

class RandomCycles : public ::testing::TestWithParam<kvc_format_t> {};

/// Largest error a stored element may show for data in [-1, 1].
double tolerance(kvc_format_t format, float x) {
  switch (format) {
  case KVC_FORMAT_FULL:
    return 0.0;
  case KVC_FORMAT_INT8:
    return 1.0 / 254 + 1e-6; // scale <= 1/127, half a step
  case KVC_FORMAT_FP8_E4M3:
    return std::ldexp(std::fabs(x), -4) + std::ldexp(1.0 / 448, -10) + 1e-7;
  case KVC_FORMAT_KIVI_INT4:
  case KVC_FORMAT_INT4:
    return 2.0 / 15 / 2 + 1e-5; // range <= 2, 15 steps
  case KVC_FORMAT_KIVI_INT2:
  case KVC_FORMAT_INT2:
    return 2.0 / 3 / 2 + 1e-5;
  }
  return 0.0;
}

TEST_P(RandomCycles, EveryPageAccountedAndDataIntact) {
  const kvc_format_t format = GetParam();
  kvc_config_t c = smallConfig(format);
  c.num_pages = format == KVC_FORMAT_FULL || format == KVC_FORMAT_INT8 ||
                        format == KVC_FORMAT_FP8_E4M3
                    ? 26
                    : 20;
  c.max_sequences = 3;
  Fixture f(c);
  const int32_t d = c.head_dim;
  std::mt19937 rng(1234 + format);
  std::uniform_real_distribution<float> unit(-1.0f, 1.0f);
  std::map<HeadKey, std::map<int32_t, ModelEntry>> model;
  std::map<HeadKey, int32_t> nextPosition;
  std::vector<uint64_t> sequences = {10, 20, 30};
  auto budgetOf = [](uint64_t seq, int32_t layer, int32_t head) {
    return static_cast<int32_t>(
        6 + ((seq / 10 * 7 + layer * 3 + head * 5) % 4) * 6);
  };
  auto addSequence = [&](uint64_t seq) {
    ASSERT_EQ(kvc_sequence_add(f.ctx, seq), KVC_STATUS_OK);
    for (int32_t l = 0; l < c.num_layers; ++l)
      for (int32_t h = 0; h < c.num_kv_heads; ++h) {
        ASSERT_EQ(kvc_set_budget(f.ctx, seq, l, h, budgetOf(seq, l, h)),
                  KVC_STATUS_OK);
        model[{seq, l, h}].clear();
      }
  };
  for (uint64_t seq : sequences)
    addSequence(seq);

  auto verifyData = [&] {
    double runtimeSum = 0, modelSum = 0, allowed = 0;
    for (auto &[key, entries] : model) {
      auto [seq, l, h] = key;
      kvc_metadata_t m;
      ASSERT_EQ(kvc_get_metadata(f.ctx, seq, l, h, &m), KVC_STATUS_OK);
      int32_t live = 0;
      for (int32_t s = 0; s < m.num_slots; ++s)
        live += m.position[s] != KVC_POSITION_NONE;
      ASSERT_EQ(live, static_cast<int32_t>(entries.size()));
      for (auto &[slot, e] : entries) {
        ASSERT_EQ(m.position[slot], e.position);
        std::vector<float> k(d), v(d);
        ASSERT_EQ(kvc_read_entry(f.ctx, seq, l, h, slot, d, k.data(), v.data()),
                  KVC_STATUS_OK);
        for (int32_t i = 0; i < d; ++i) {
          ASSERT_LE(std::fabs(k[i] - e.key[i]), tolerance(format, e.key[i]));
          ASSERT_LE(std::fabs(v[i] - e.value[i]),
                    tolerance(format, e.value[i]));
          runtimeSum += k[i] + v[i];
          modelSum += e.key[i] + e.value[i];
          allowed +=
              tolerance(format, e.key[i]) + tolerance(format, e.value[i]);
        }
      }
    }
    // Checksum over everything that is cached.
    EXPECT_LE(std::fabs(runtimeSum - modelSum), allowed + 1e-3);
  };

  int64_t pagesTaken = 0, exhausted = 0, overBudget = 0, compactions = 0;
  for (int iter = 0; iter < 6000; ++iter) {
    uint64_t seq = sequences[rng() % sequences.size()];
    int32_t l = static_cast<int32_t>(rng() % c.num_layers);
    int32_t h = static_cast<int32_t>(rng() % c.num_kv_heads);
    auto &entries = model[{seq, l, h}];
    kvc_pool_stats_t before;
    ASSERT_EQ(kvc_pool_stats(f.ctx, &before), KVC_STATUS_OK);
    int action = static_cast<int>(rng() % 100);
    if (action < 45) {
      int32_t n = 1 + static_cast<int32_t>(rng() % 5);
      std::vector<float> keys(static_cast<size_t>(n) * d), values(keys.size());
      for (float &x : keys)
        x = unit(rng);
      for (float &x : values)
        x = unit(rng);
      std::vector<int32_t> positions(n), slots(n);
      for (int32_t &p : positions)
        p = nextPosition[{seq, l, h}]++;
      bool fullCheck = iter % 10 == 0;
      Snapshot snap;
      if (fullCheck)
        snap = snapshot(f.ctx, sequences);
      // One entry in a format of single-slot units goes to the lowest free
      // slot of a page holding live entries, else to the first slot of the
      // lowest empty page-table entry (a hole), else to a new page.
      const bool singleSlotUnits = format == KVC_FORMAT_FULL ||
                                   format == KVC_FORMAT_INT8 ||
                                   format == KVC_FORMAT_FP8_E4M3;
      int32_t expectedSlot = -1;
      if (n == 1 && singleSlotUnits) {
        kvc_metadata_t m;
        ASSERT_EQ(kvc_get_metadata(f.ctx, seq, l, h, &m), KVC_STATUS_OK);
        const int32_t p = c.page_size;
        auto pageLive = [&](int32_t page) {
          int32_t live = 0;
          for (int32_t k = 0; k < p; ++k)
            live += m.position[page * p + k] != KVC_POSITION_NONE;
          return live;
        };
        for (int32_t slot = 0; slot < m.num_slots && expectedSlot < 0; ++slot)
          if (m.position[slot] == KVC_POSITION_NONE && pageLive(slot / p) > 0)
            expectedSlot = slot;
        for (int32_t page = 0; page < m.num_slots / p && expectedSlot < 0;
             ++page)
          if (pageLive(page) == 0)
            expectedSlot = page * p;
        if (expectedSlot < 0)
          expectedSlot = m.num_slots;
      }
      kvc_status_t st =
          kvc_append(f.ctx, seq, l, h, n, d, keys.data(), values.data(),
                     positions.data(), slots.data());
      if (st == KVC_STATUS_OK) {
        if (expectedSlot >= 0) {
          ASSERT_EQ(slots[0], expectedSlot) << "iteration " << iter;
        }
        for (int32_t i = 0; i < n; ++i) {
          ASSERT_EQ(entries.count(slots[i]), 0u) << "slot handed out twice";
          entries[slots[i]] = {
              positions[i],
              std::vector<float>(keys.begin() + i * d,
                                 keys.begin() + (i + 1) * d),
              std::vector<float>(values.begin() + i * d,
                                 values.begin() + (i + 1) * d)};
        }
        kvc_pool_stats_t after;
        kvc_pool_stats(f.ctx, &after);
        pagesTaken += before.free_pages - after.free_pages;
      } else {
        ASSERT_TRUE(st == KVC_STATUS_POOL_EXHAUSTED ||
                    st == KVC_STATUS_OVER_BUDGET)
            << kvc_status_string(st) << ": " << kvc_last_error();
        exhausted += st == KVC_STATUS_POOL_EXHAUSTED;
        overBudget += st == KVC_STATUS_OVER_BUDGET;
        if (fullCheck) {
          ASSERT_TRUE(snapshot(f.ctx, sequences) == snap)
              << "failed append changed state";
        }
        kvc_pool_stats_t after;
        kvc_pool_stats(f.ctx, &after);
        ASSERT_EQ(std::memcmp(&before, &after, sizeof(before)), 0);
      }
    } else if (action < 75) {
      if (entries.empty())
        continue;
      std::vector<int32_t> live;
      for (auto &[slot, e] : entries)
        live.push_back(slot);
      std::shuffle(live.begin(), live.end(), rng);
      live.resize(1 + rng() % ((live.size() + 1) / 2));
      ASSERT_EQ(kvc_evict(f.ctx, seq, l, h, static_cast<int32_t>(live.size()),
                          live.data()),
                KVC_STATUS_OK)
          << kvc_last_error();
      for (int32_t slot : live)
        entries.erase(slot);
    } else if (action < 90) {
      const float limits[] = {0.25f, 0.5f, 0.75f, 1.0f};
      std::vector<kvc_move_t> moves(512);
      int32_t numMoves = 0, released = 0;
      ASSERT_EQ(kvc_compact(f.ctx, seq, l, h, limits[rng() % 4], moves.data(),
                            512, &numMoves, &released),
                KVC_STATUS_OK)
          << kvc_last_error();
      std::map<int32_t, ModelEntry> moved;
      std::map<int32_t, int32_t> destination;
      for (int32_t i = 0; i < numMoves; ++i)
        destination[moves[i].from_slot] = moves[i].to_slot;
      for (auto &[slot, e] : entries) {
        auto it = destination.find(slot);
        int32_t to = it == destination.end() ? slot : it->second;
        ASSERT_EQ(moved.count(to), 0u);
        moved[to] = e;
      }
      entries = std::move(moved);
      compactions += released;
    } else if (action < 95) {
      if (entries.empty())
        continue;
      auto it = entries.begin();
      std::advance(it, rng() % entries.size());
      std::vector<float> value(d);
      for (float &x : value)
        x = unit(rng);
      ASSERT_EQ(kvc_write_entry(f.ctx, seq, l, h, it->first, d, nullptr,
                                value.data()),
                KVC_STATUS_OK)
          << kvc_last_error();
      it->second.value = value;
    } else {
      ASSERT_EQ(kvc_sequence_remove(f.ctx, seq), KVC_STATUS_OK);
      addSequence(seq);
    }
    ASSERT_EQ(kvc_pool_check(f.ctx), KVC_STATUS_OK)
        << "iteration " << iter << ": " << kvc_last_error();
    kvc_pool_stats_t s;
    ASSERT_EQ(kvc_pool_stats(f.ctx, &s), KVC_STATUS_OK);
    ASSERT_EQ(s.free_pages + s.mapped_pages, c.num_pages);
    int64_t live = 0;
    for (auto &[key, e] : model)
      live += static_cast<int64_t>(e.size());
    ASSERT_EQ(s.live_entries, live);
    if (iter % 100 == 0)
      verifyData();
  }
  verifyData();
  std::printf("[ measured ] %lld pages taken from a pool of %d, %lld "
              "exhausted / %lld over-budget appends, %lld pages released by "
              "compaction\n",
              static_cast<long long>(pagesTaken), c.num_pages,
              static_cast<long long>(exhausted),
              static_cast<long long>(overBudget),
              static_cast<long long>(compactions));
  // Pages were recycled many times over, and every outcome was exercised.
  EXPECT_GT(pagesTaken, 4 * c.num_pages);
  EXPECT_GT(exhausted, 0);
  EXPECT_GT(overBudget, 0);
  EXPECT_GT(compactions, 0);
}

std::string formatName(const ::testing::TestParamInfo<kvc_format_t> &info) {
  static const char *const names[] = {"Full", "Int8", "Fp8", "Kivi2", "Kivi4"};
  return names[info.param];
}

INSTANTIATE_TEST_SUITE_P(Formats, RandomCycles,
                         ::testing::Values(KVC_FORMAT_FULL, KVC_FORMAT_INT8,
                                           KVC_FORMAT_FP8_E4M3,
                                           KVC_FORMAT_KIVI_INT4,
                                           KVC_FORMAT_KIVI_INT2),
                         formatName);

//===----------------------------------------------------------------------===//
// Full-precision element types
//===----------------------------------------------------------------------===//

TEST(ElementTypes, HalfPrecisionPagesRound) {
  for (kvc_dtype_t dtype : {KVC_DTYPE_F16, KVC_DTYPE_BF16}) {
    kvc_config_t c = smallConfig();
    c.dtype = dtype;
    Fixture f(c);
    ASSERT_EQ(kvc_sequence_add(f.ctx, 0), KVC_STATUS_OK);
    std::mt19937 rng(5);
    std::vector<float> keys = gaussian(rng, 8 * 8), values = gaussian(rng, 64);
    std::vector<int32_t> pos = iota(8);
    ASSERT_EQ(kvc_append(f.ctx, 0, 1, 0, 8, 8, keys.data(), values.data(),
                         pos.data(), nullptr),
              KVC_STATUS_OK);
    for (int32_t s = 0; s < 8; ++s) {
      std::vector<float> k(8), v(8);
      ASSERT_EQ(kvc_read_entry(f.ctx, 0, 1, 0, s, 8, k.data(), v.data()),
                KVC_STATUS_OK);
      for (int i = 0; i < 8; ++i) {
        double expectK = dtype == KVC_DTYPE_F16
                             ? kvc::ref::roundToF16(keys[s * 8 + i])
                             : kvc::ref::roundToBf16(keys[s * 8 + i]);
        double expectV = dtype == KVC_DTYPE_F16
                             ? kvc::ref::roundToF16(values[s * 8 + i])
                             : kvc::ref::roundToBf16(values[s * 8 + i]);
        EXPECT_EQ(k[i], expectK);
        EXPECT_EQ(v[i], expectV);
      }
    }
  }
}

//===----------------------------------------------------------------------===//
// KIVI
//===----------------------------------------------------------------------===//

kvc::ref::Matrix toMatrix(const std::vector<float> &x, int rows, int cols) {
  kvc::ref::Matrix m(rows, cols);
  for (int i = 0; i < rows * cols; ++i)
    m.data[i] = x[i];
  return m;
}

class Kivi : public ::testing::TestWithParam<std::tuple<int, bool>> {};

TEST_P(Kivi, MatchesReferenceSimulation) {
  auto [bits, oneByOne] = GetParam();
  kvc_config_t c =
      smallConfig(bits == 2 ? KVC_FORMAT_KIVI_INT2 : KVC_FORMAT_KIVI_INT4);
  Fixture f(c); // d = 8, G = 4, R = 8, 8 slots per page
  const int d = 8, n = 21;
  ASSERT_EQ(kvc_sequence_add(f.ctx, 0), KVC_STATUS_OK);
  std::mt19937 rng(bits * 10 + oneByOne);
  std::vector<float> keys = gaussian(rng, n * d), values = gaussian(rng, n * d);
  std::vector<int32_t> pos = iota(n);
  if (oneByOne) {
    for (int i = 0; i < n; ++i)
      ASSERT_EQ(kvc_append(f.ctx, 0, 1, 1, 1, d, &keys[i * d], &values[i * d],
                           &pos[i], nullptr),
                KVC_STATUS_OK)
          << kvc_last_error();
  } else {
    ASSERT_EQ(kvc_append(f.ctx, 0, 1, 1, n, d, keys.data(), values.data(),
                         pos.data(), nullptr),
              KVC_STATUS_OK);
  }
  // 21 appends with R = 8: keys of entries 0..15 were flushed (two windows),
  // 16..20 are still full precision; values of 0..12 (all but the last 8)
  // are quantized.
  kvc::ref::KiviCache ref = kvc::ref::kiviSimulate(
      toMatrix(keys, n, d), toMatrix(values, n, d), 4, 8, bits);
  kvc_metadata_t m;
  ASSERT_EQ(kvc_get_metadata(f.ctx, 0, 1, 1, &m), KVC_STATUS_OK);
  ASSERT_EQ(m.num_slots, 24);
  for (int i = 0; i < n; ++i) {
    EXPECT_EQ(m.position[i], i);
    EXPECT_EQ(m.key_format[i] != KVC_FORMAT_FULL, i < 16) << i;
    EXPECT_EQ(m.value_format[i] != KVC_FORMAT_FULL, i < 13) << i;
    EXPECT_EQ(ref.keyQuantized[i], i < 16);
    EXPECT_EQ(ref.valueQuantized[i], i < 13);
    std::vector<float> k(d), v(d);
    ASSERT_EQ(kvc_read_entry(f.ctx, 0, 1, 1, i, d, k.data(), v.data()),
              KVC_STATUS_OK);
    for (int j = 0; j < d; ++j) {
      EXPECT_NEAR(k[j], ref.keys.at(i, j), 1e-5) << i << "," << j;
      EXPECT_NEAR(v[j], ref.values.at(i, j), 1e-5) << i << "," << j;
    }
  }
  EXPECT_EQ(kvc_pool_check(f.ctx), KVC_STATUS_OK) << kvc_last_error();
}

INSTANTIATE_TEST_SUITE_P(Bits, Kivi,
                         ::testing::Combine(::testing::Values(2, 4),
                                            ::testing::Bool()));

TEST(KiviWindow, EvictedEntriesLeaveTheirBlock) {
  kvc_config_t c = smallConfig(KVC_FORMAT_KIVI_INT4);
  Fixture f(c);
  const int d = 8;
  ASSERT_EQ(kvc_sequence_add(f.ctx, 0), KVC_STATUS_OK);
  std::mt19937 rng(99);
  std::vector<float> keys = gaussian(rng, 8 * d), values = gaussian(rng, 8 * d);
  std::vector<int32_t> pos = iota(8);
  ASSERT_EQ(kvc_append(f.ctx, 0, 0, 0, 6, d, keys.data(), values.data(),
                       pos.data(), nullptr),
            KVC_STATUS_OK);
  int32_t victim = 1;
  ASSERT_EQ(kvc_evict(f.ctx, 0, 0, 0, 1, &victim), KVC_STATUS_OK);
  // Two more appends complete the window of R = 8: the flush quantizes
  // block 0 over its live tokens {0, 2, 3} and block 1 over {4..7}.
  ASSERT_EQ(kvc_append(f.ctx, 0, 0, 0, 2, d, &keys[6 * d], &values[6 * d],
                       &pos[6], nullptr),
            KVC_STATUS_OK);
  // A new entry must not land in the evicted slot 1: KIVI hands out whole
  // blocks, and block 0 is quantized.
  std::vector<float> extra = gaussian(rng, d);
  int32_t extraPos = 8, extraSlot = -1;
  ASSERT_EQ(kvc_append(f.ctx, 0, 0, 0, 1, d, extra.data(), extra.data(),
                       &extraPos, &extraSlot),
            KVC_STATUS_OK);
  EXPECT_EQ(extraSlot, 8);
  std::vector<std::vector<int>> blocks = {{0, 2, 3}, {4, 5, 6, 7}};
  for (const auto &block : blocks) {
    std::vector<float> rows;
    for (int t : block)
      rows.insert(rows.end(), keys.begin() + t * d, keys.begin() + (t + 1) * d);
    kvc::ref::Matrix restored = kvc::ref::kiviDequantizeKeys(
        kvc::ref::kiviQuantizeKeys(
            toMatrix(rows, static_cast<int>(block.size()), d), 4),
        static_cast<int>(block.size()));
    for (size_t t = 0; t < block.size(); ++t) {
      std::vector<float> k(d), v(d);
      ASSERT_EQ(kvc_read_entry(f.ctx, 0, 0, 0, block[t], d, k.data(), v.data()),
                KVC_STATUS_OK);
      for (int j = 0; j < d; ++j) {
        EXPECT_NEAR(k[j], restored.at(static_cast<int>(t), j), 1e-5);
        // Values of the last R = 8 appends are still exact... except entry
        // 0, whose value was quantized when entry 8 arrived.
        if (block[t] != 0) {
          EXPECT_EQ(v[j], values[block[t] * d + j]);
        }
      }
    }
  }
  kvc_metadata_t m;
  ASSERT_EQ(kvc_get_metadata(f.ctx, 0, 0, 0, &m), KVC_STATUS_OK);
  EXPECT_EQ(m.value_format[0], KVC_FORMAT_KIVI_INT4);
  EXPECT_EQ(m.value_format[2], KVC_FORMAT_FULL);
  EXPECT_EQ(kvc_pool_check(f.ctx), KVC_STATUS_OK) << kvc_last_error();
}

TEST(KiviWindow, HalfPrecisionResidualAndRewrites) {
  for (kvc_dtype_t dtype : {KVC_DTYPE_F16, KVC_DTYPE_BF16}) {
    kvc_config_t c = smallConfig(KVC_FORMAT_KIVI_INT4);
    c.dtype = dtype;
    Fixture f(c);
    const int d = 8, n = 12;
    ASSERT_EQ(kvc_sequence_add(f.ctx, 0), KVC_STATUS_OK);
    std::mt19937 rng(dtype);
    std::vector<float> keys = gaussian(rng, n * d),
                       values = gaussian(rng, n * d);
    std::vector<int32_t> pos = iota(n);
    ASSERT_EQ(kvc_append(f.ctx, 0, 0, 1, n, d, keys.data(), values.data(),
                         pos.data(), nullptr),
              KVC_STATUS_OK);
    // The residual window stores the element type, so the oracle sees the
    // inputs rounded to it.
    std::vector<float> rk = keys, rv = values;
    for (size_t i = 0; i < rk.size(); ++i) {
      rk[i] = static_cast<float>(dtype == KVC_DTYPE_F16
                                     ? kvc::ref::roundToF16(keys[i])
                                     : kvc::ref::roundToBf16(keys[i]));
      rv[i] = static_cast<float>(dtype == KVC_DTYPE_F16
                                     ? kvc::ref::roundToF16(values[i])
                                     : kvc::ref::roundToBf16(values[i]));
    }
    kvc::ref::KiviCache ref =
        kvc::ref::kiviSimulate(toMatrix(rk, n, d), toMatrix(rv, n, d), 4, 8, 4);
    for (int i = 0; i < n; ++i) {
      std::vector<float> k(d), v(d);
      ASSERT_EQ(kvc_read_entry(f.ctx, 0, 0, 1, i, d, k.data(), v.data()),
                KVC_STATUS_OK);
      for (int j = 0; j < d; ++j) {
        EXPECT_NEAR(k[j], ref.keys.at(i, j), 1e-5) << i;
        EXPECT_NEAR(v[j], ref.values.at(i, j), 1e-5) << i;
      }
      // Writing back what was read re-encodes to the same bytes: a
      // quantized key uses its block's parameters, so it lands on its code.
      ASSERT_EQ(kvc_write_entry(f.ctx, 0, 0, 1, i, d, k.data(), v.data()),
                KVC_STATUS_OK);
      std::vector<float> k2(d), v2(d);
      ASSERT_EQ(kvc_read_entry(f.ctx, 0, 0, 1, i, d, k2.data(), v2.data()),
                KVC_STATUS_OK);
      for (int j = 0; j < d; ++j) {
        EXPECT_NEAR(k2[j], k[j], 1e-6) << i;
        EXPECT_NEAR(v2[j], v[j], 1e-6) << i;
      }
    }
  }
}

//===----------------------------------------------------------------------===//
// Device pools: bookkeeping only
//===----------------------------------------------------------------------===//

TEST(DevicePool, BookkeepingWithoutTouchingMemory) {
  kvc_config_t c = smallConfig(KVC_FORMAT_FP8_E4M3);
  c.memory = KVC_MEMORY_DEVICE;
  uint64_t bytes = 0;
  ASSERT_EQ(kvc_pool_bytes_required(&c, &bytes), KVC_STATUS_OK);
  // An address no host code may touch: any dereference would crash.
  void *fake = reinterpret_cast<void *>(uintptr_t{1} << 44);
  kvc_context_t *ctx = nullptr;
  ASSERT_EQ(kvc_context_create(&c, fake, bytes, &ctx), KVC_STATUS_OK);
  ASSERT_EQ(kvc_sequence_add(ctx, 5), KVC_STATUS_OK);
  std::vector<int32_t> pos = iota(10), slots(10);
  ASSERT_EQ(kvc_append(ctx, 5, 0, 0, 10, 8, nullptr, nullptr, pos.data(),
                       slots.data()),
            KVC_STATUS_OK)
      << kvc_last_error();
  EXPECT_EQ(slots, iota(10));
  kvc_page_layout_t l;
  ASSERT_EQ(kvc_page_layout(&c, &l), KVC_STATUS_OK);
  int32_t id = -1;
  uint64_t offset = 0;
  void *address = nullptr;
  ASSERT_EQ(kvc_get_page(ctx, 5, 0, 0, 2, &id, &offset, &address),
            KVC_STATUS_OK);
  EXPECT_EQ(offset, l.pages_offset + static_cast<uint64_t>(id) * l.page_bytes);
  EXPECT_EQ(address, static_cast<uint8_t *>(fake) + offset);
  float k[8], v[8];
  EXPECT_EQ(kvc_read_entry(ctx, 5, 0, 0, 0, 8, k, v), KVC_STATUS_UNSUPPORTED);
  EXPECT_EQ(kvc_append(ctx, 5, 0, 0, 1, 8, k, v, pos.data(), nullptr),
            KVC_STATUS_UNSUPPORTED);
  // Compaction reports the copy the engine must do on the device.
  std::vector<int32_t> evict = {0, 1, 2, 3, 5, 6, 7};
  ASSERT_EQ(kvc_evict(ctx, 5, 0, 0, 7, evict.data()), KVC_STATUS_OK);
  int32_t page2 = -1;
  kvc_get_page(ctx, 5, 0, 0, 2, &page2, nullptr, nullptr);
  kvc_move_t moves[4];
  int32_t numMoves = 0, released = 0;
  EXPECT_EQ(kvc_compact(ctx, 5, 0, 0, 0.5f, nullptr, 0, &numMoves, &released),
            KVC_STATUS_NULL_POINTER);
  ASSERT_EQ(kvc_compact(ctx, 5, 0, 0, 0.5f, moves, 4, &numMoves, &released),
            KVC_STATUS_OK)
      << kvc_last_error();
  // Live: slot 4 (page 1, alone) and slots 8, 9 (page 2). Page 1 empties
  // into slot 10 of page 2, which then becomes table entry 0.
  EXPECT_EQ(released, 1);
  ASSERT_EQ(numMoves, 3);
  EXPECT_EQ(moves[0].from_slot, 8);
  EXPECT_EQ(moves[0].to_slot, 0);
  EXPECT_EQ(moves[2].from_slot, 4);
  EXPECT_EQ(moves[2].to_slot, 2);
  EXPECT_EQ(moves[2].copy_data, 1);
  EXPECT_EQ(moves[2].to_page, page2);
  EXPECT_EQ(moves[2].to_offset, 2);
  EXPECT_EQ(kvc_pool_check(ctx), KVC_STATUS_OK) << kvc_last_error();
  kvc_context_destroy(ctx);

  // KIVI device pools are accepted: appends record the work for kernels
  // (KiviDeviceTest.cpp).
  c = smallConfig(KVC_FORMAT_KIVI_INT2);
  c.memory = KVC_MEMORY_DEVICE;
  ASSERT_EQ(kvc_pool_bytes_required(&c, &bytes), KVC_STATUS_OK);
}

} // namespace

namespace {

//===----------------------------------------------------------------------===//
// Selection under a budget shared by several heads
//===----------------------------------------------------------------------===//

// Six candidates of two heads; keep 3. Scores 0.5 (head 1, position 7),
// then a tie at 0.25 between (head 0, position 2), (head 0, position 5) and
// (head 1, position 5): the recent rule keeps position 5 of both heads over
// position 2; the rest are victims sorted by head, then slot.
TEST(Select, SharedBudgetKeepsTheBestAndGroupsVictimsByHead) {
  std::vector<kvc_candidate_t> c = {
      {0.25f, 2, 0, 9}, {0.5f, 7, 1, 0},  {0.1f, 9, 1, 4},
      {0.25f, 5, 0, 3}, {0.25f, 5, 1, 6}, {-1.0f, 1, 0, 1}};
  ASSERT_EQ(kvc_select_candidates(c.data(), 6, 3, 1), KVC_STATUS_OK);
  std::set<std::pair<int, int>> kept;
  for (int i = 0; i < 3; ++i)
    kept.insert({c[i].head, c[i].position});
  EXPECT_EQ(kept, (std::set<std::pair<int, int>>{{1, 7}, {0, 5}, {1, 5}}));
  // Victims: head 0 slots 1, 9; head 1 slot 4.
  EXPECT_EQ(c[3].head, 0);
  EXPECT_EQ(c[3].slot, 1);
  EXPECT_EQ(c[4].head, 0);
  EXPECT_EQ(c[4].slot, 9);
  EXPECT_EQ(c[5].head, 1);
  EXPECT_EQ(c[5].slot, 4);

  // The older rule keeps position 2 over both positions 5, then the later
  // head breaks the tie between the two positions 5.
  std::vector<kvc_candidate_t> d = {
      {0.25f, 2, 0, 9}, {0.5f, 7, 1, 0}, {0.25f, 5, 0, 3}, {0.25f, 5, 1, 6}};
  ASSERT_EQ(kvc_select_candidates(d.data(), 4, 3, 0), KVC_STATUS_OK);
  EXPECT_EQ(d[3].head, 0);
  EXPECT_EQ(d[3].position, 5);

  // keep is clamped; errors are reported.
  EXPECT_EQ(kvc_select_candidates(d.data(), 4, 10, 1), KVC_STATUS_OK);
  EXPECT_EQ(kvc_select_candidates(nullptr, 0, 0, 1), KVC_STATUS_OK);
  EXPECT_EQ(kvc_select_candidates(nullptr, 2, 1, 1), KVC_STATUS_NULL_POINTER);
  EXPECT_EQ(kvc_select_candidates(d.data(), -1, 1, 1),
            KVC_STATUS_INVALID_ARGUMENT);
  EXPECT_STREQ(kvc_last_error(), "kvc_select_candidates: negative count");
}

} // namespace
