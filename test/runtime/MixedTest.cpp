//===- MixedTest.cpp - Mixed-precision page classes -----------------------===//
//
// A context with a low_format keeps two page classes: high pages are pool
// pages, low pages are sub-pages of pool pages. These tests check the
// layout against the documented formulas, that low entries take only the
// bytes of their format, that every page returns to the pool, that
// compaction never mixes classes, and that the data survives, against an
// independent model (expected codes computed here from the definition of
// per-token grouped asymmetric quantization).
//
//===----------------------------------------------------------------------===//

#include "TestSupport.h"
#include "test/reference/Reference.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <set>

using namespace kvc::test;

namespace {

/// int8 high class, int2 low class in groups of 4 channels, head_dim 8.
kvc_config_t mixedConfig(int32_t low = KVC_FORMAT_INT2) {
  kvc_config_t c = smallConfig(KVC_FORMAT_INT8);
  c.low_format = low;
  c.group_size = 4;
  return c;
}

uint64_t alignUp(uint64_t x, uint64_t a) { return (x + a - 1) / a * a; }

/// What a low page stores for x: per group of g channels, the reference's
/// record (quantizeAsymRecord: f16 min and scale) and its codes,
/// dequantized.
std::vector<float> expectedLow(const std::vector<float> &x, int g, int bits) {
  std::vector<float> out;
  for (size_t first = 0; first < x.size(); first += g) {
    kvc::ref::AsymGroup group = kvc::ref::quantizeAsymRecord(
        kvc::ref::Vector(x.begin() + first, x.begin() + first + g), bits);
    for (double v : kvc::ref::dequantizeAsym(group))
      out.push_back(static_cast<float>(v));
  }
  return out;
}

std::vector<float> ramp(int32_t d, float base) {
  std::vector<float> v(d);
  for (int32_t i = 0; i < d; ++i)
    v[i] = base + 0.37f * static_cast<float>((i * 5) % d) - 0.9f;
  return v;
}

TEST(Mixed, LayoutFollowsTheDocumentedFormulas) {
  kvc_config_t c = mixedConfig();
  c.head_dim = 64;
  c.page_size = 16;
  c.group_size = 32;
  kvc_page_layout_t high, low;
  int32_t perPage = 0;
  ASSERT_EQ(kvc_page_layout(&c, &high), KVC_STATUS_OK) << kvc_last_error();
  ASSERT_EQ(kvc_low_page_layout(&c, &low, &perPage), KVC_STATUS_OK)
      << kvc_last_error();
  // High: int8 rows of 64 bytes and one float scale per row and slot.
  EXPECT_EQ(high.key_stride, 64u);
  EXPECT_EQ(high.page_bytes, alignUp(16 * 64 * 2 + 16 * 4 * 2, 256));
  // Low: 64 channels at 2 bits = 16 bytes per row, 2 groups of {scale,
  // min} (two f16 each) = 8 bytes per record, for keys and values.
  EXPECT_EQ(low.key_stride, 16u);
  EXPECT_EQ(low.value_stride, 16u);
  EXPECT_EQ(low.key_param_stride, 8u);
  EXPECT_EQ(low.value_param_stride, 8u);
  EXPECT_EQ(low.page_bytes, alignUp(16 * 16 * 2 + 16 * 8 * 2, 256));
  EXPECT_EQ(low.page_bytes % KVC_POOL_ALIGNMENT, 0u);
  EXPECT_EQ(low.pages_offset, high.pages_offset);
  EXPECT_EQ(perPage, static_cast<int32_t>(high.page_bytes / low.page_bytes));
  EXPECT_EQ(perPage, 3); // 2304 / 768

  // Without a low class there is no low layout.
  kvc_config_t one = smallConfig(KVC_FORMAT_INT8);
  EXPECT_EQ(kvc_low_page_layout(&one, &low, &perPage), KVC_STATUS_UNSUPPORTED);
}

TEST(Mixed, InvalidConfigurationsAreRejected) {
  kvc_config_t c = mixedConfig(KVC_FORMAT_KIVI_INT2);
  kvc_page_layout_t l;
  EXPECT_EQ(kvc_page_layout(&c, &l), KVC_STATUS_INVALID_ARGUMENT);
  EXPECT_NE(std::string(kvc_last_error()).find("low_format 3"),
            std::string::npos)
      << kvc_last_error();
  c = mixedConfig();
  c.format = KVC_FORMAT_KIVI_INT2;
  c.page_size = 8;
  EXPECT_EQ(kvc_page_layout(&c, &l), KVC_STATUS_INVALID_ARGUMENT);
  c = mixedConfig();
  c.group_size = 3;
  EXPECT_EQ(kvc_page_layout(&c, &l), KVC_STATUS_GEOMETRY_MISMATCH);
  // Groups of one channel: 8 bytes of parameters per channel, more than
  // an int8 page holds.
  c = mixedConfig();
  c.group_size = 1;
  EXPECT_EQ(kvc_page_layout(&c, &l), KVC_STATUS_GEOMETRY_MISMATCH);
  EXPECT_NE(std::string(kvc_last_error()).find("does not fit"),
            std::string::npos)
      << kvc_last_error();
  // The main format is never a low one.
  c = smallConfig(KVC_FORMAT_FULL);
  c.format = KVC_FORMAT_INT2;
  EXPECT_EQ(kvc_page_layout(&c, &l), KVC_STATUS_INVALID_ARGUMENT);
}

TEST(Mixed, LowEntriesTakeTheBytesOfTheirFormat) {
  kvc_config_t c = mixedConfig();
  c.head_dim = 64;
  c.page_size = 16;
  c.group_size = 32;
  c.num_pages = 16;
  c.num_layers = 1;
  c.num_kv_heads = 1;
  c.num_q_heads = 1;
  Fixture f(c);
  int32_t perPage = 0;
  kvc_page_layout_t low;
  ASSERT_EQ(kvc_low_page_layout(&c, &low, &perPage), KVC_STATUS_OK);
  ASSERT_EQ(kvc_sequence_add(f.ctx, 1), KVC_STATUS_OK);
  // 5 low pages' worth of entries (80) and 1 high page (16).
  const int32_t d = c.head_dim, nLow = 80, nHigh = 16;
  std::vector<float> keys, values;
  for (int32_t i = 0; i < nLow; ++i) {
    auto k = ramp(d, 0.01f * i), v = ramp(d, -0.02f * i);
    keys.insert(keys.end(), k.begin(), k.end());
    values.insert(values.end(), v.begin(), v.end());
  }
  std::vector<int32_t> positions(nLow), slots(nLow);
  for (int32_t i = 0; i < nLow; ++i)
    positions[i] = i;
  ASSERT_EQ(kvc_append_format(f.ctx, 1, 0, 0, KVC_FORMAT_INT2, nLow, d,
                              keys.data(), values.data(), positions.data(),
                              slots.data()),
            KVC_STATUS_OK)
      << kvc_last_error();
  ASSERT_EQ(kvc_append(f.ctx, 1, 0, 0, nHigh, d, keys.data(), values.data(),
                       positions.data(), slots.data()),
            KVC_STATUS_OK)
      << kvc_last_error();
  kvc_pool_stats_t s;
  ASSERT_EQ(kvc_pool_stats(f.ctx, &s), KVC_STATUS_OK);
  const int32_t lowPool = (5 + perPage - 1) / perPage; // 3 for perPage 2
  EXPECT_EQ(s.low_pages_used, 5);
  EXPECT_EQ(s.low_pool_pages, lowPool);
  EXPECT_EQ(s.mapped_pages, lowPool + 1);
  EXPECT_EQ(s.free_pages, c.num_pages - lowPool - 1);
  EXPECT_EQ(s.live_entries, nLow + nHigh);
  EXPECT_EQ(kvc_pool_check(f.ctx), KVC_STATUS_OK) << kvc_last_error();

  // Page classes and addresses: low pages of one pool page are
  // page_bytes of the low layout apart.
  int32_t numPages = 0;
  ASSERT_EQ(kvc_get_num_pages(f.ctx, 1, 0, 0, &numPages), KVC_STATUS_OK);
  ASSERT_EQ(numPages, 6);
  std::map<int32_t, std::set<uint64_t>> subOffsets;
  for (int32_t page = 0; page < numPages; ++page) {
    int32_t format = -2, poolPage = -2;
    uint64_t offset = 0;
    ASSERT_EQ(kvc_get_page_format(f.ctx, 1, 0, 0, page, &format),
              KVC_STATUS_OK);
    ASSERT_EQ(kvc_get_page(f.ctx, 1, 0, 0, page, &poolPage, &offset, nullptr),
              KVC_STATUS_OK);
    EXPECT_EQ(format, page < 5 ? KVC_FORMAT_INT2 : KVC_FORMAT_INT8);
    if (format == KVC_FORMAT_INT2)
      subOffsets[poolPage].insert(offset);
  }
  EXPECT_EQ(static_cast<int32_t>(subOffsets.size()), lowPool);
  kvc_page_layout_t high;
  ASSERT_EQ(kvc_page_layout(&c, &high), KVC_STATUS_OK);
  for (auto &[poolPage, offsets] : subOffsets) {
    uint64_t base = high.pages_offset + poolPage * high.page_bytes;
    int32_t sub = 0;
    for (uint64_t offset : offsets)
      EXPECT_EQ(offset, base + (sub++) * low.page_bytes);
  }

  // Metadata formats, and the data against the definition.
  kvc_metadata_t m;
  ASSERT_EQ(kvc_get_metadata(f.ctx, 1, 0, 0, &m), KVC_STATUS_OK);
  for (int32_t slot = 0; slot < nLow; ++slot) {
    EXPECT_EQ(m.key_format[slot], KVC_FORMAT_INT2);
    EXPECT_EQ(m.value_format[slot], KVC_FORMAT_INT2);
    std::vector<float> k(d), v(d);
    ASSERT_EQ(kvc_read_entry(f.ctx, 1, 0, 0, slot, d, k.data(), v.data()),
              KVC_STATUS_OK);
    std::vector<float> key(keys.begin() + slot * d,
                           keys.begin() + (slot + 1) * d);
    std::vector<float> value(values.begin() + slot * d,
                             values.begin() + (slot + 1) * d);
    auto ek = expectedLow(key, c.group_size, 2);
    auto ev = expectedLow(value, c.group_size, 2);
    for (int32_t i = 0; i < d; ++i) {
      ASSERT_NEAR(k[i], ek[i], 1e-5f) << "slot " << slot << " channel " << i;
      ASSERT_NEAR(v[i], ev[i], 1e-5f) << "slot " << slot << " channel " << i;
    }
  }
  EXPECT_EQ(m.key_format[nLow], KVC_FORMAT_INT8);

  // Evicting every entry of the low pages returns their pool pages.
  std::vector<int32_t> lowSlots(nLow);
  for (int32_t i = 0; i < nLow; ++i)
    lowSlots[i] = i;
  ASSERT_EQ(kvc_evict(f.ctx, 1, 0, 0, nLow, lowSlots.data()), KVC_STATUS_OK);
  ASSERT_EQ(kvc_pool_stats(f.ctx, &s), KVC_STATUS_OK);
  EXPECT_EQ(s.low_pool_pages, 0);
  EXPECT_EQ(s.low_pages_used, 0);
  EXPECT_EQ(s.free_pages, c.num_pages - 1);
  EXPECT_EQ(kvc_pool_check(f.ctx), KVC_STATUS_OK) << kvc_last_error();
}

TEST(Mixed, AppendFormatChecksItsArguments) {
  Fixture f(mixedConfig());
  ASSERT_EQ(kvc_sequence_add(f.ctx, 1), KVC_STATUS_OK);
  const int32_t d = f.config.head_dim;
  std::vector<float> k(d, 0.5f), v(d, 0.25f);
  int32_t position = 0;
  Snapshot before = snapshot(f.ctx, {1});
  EXPECT_EQ(kvc_append_format(f.ctx, 1, 0, 0, KVC_FORMAT_INT4, 1, d, k.data(),
                              v.data(), &position, nullptr),
            KVC_STATUS_INVALID_ARGUMENT);
  EXPECT_NE(std::string(kvc_last_error()).find("low format 5"),
            std::string::npos)
      << kvc_last_error();
  k[3] = NAN;
  EXPECT_EQ(kvc_append_format(f.ctx, 1, 0, 0, KVC_FORMAT_INT2, 1, d, k.data(),
                              v.data(), &position, nullptr),
            KVC_STATUS_INVALID_ARGUMENT);
  EXPECT_TRUE(snapshot(f.ctx, {1}) == before);
  // A context with one class has no other format to append in.
  Fixture one(smallConfig(KVC_FORMAT_INT8));
  ASSERT_EQ(kvc_sequence_add(one.ctx, 1), KVC_STATUS_OK);
  k[3] = 0.0f;
  EXPECT_EQ(kvc_append_format(one.ctx, 1, 0, 0, KVC_FORMAT_INT2, 1, d, k.data(),
                              v.data(), &position, nullptr),
            KVC_STATUS_INVALID_ARGUMENT);
  EXPECT_EQ(kvc_append_format(one.ctx, 1, 0, 0, KVC_FORMAT_INT8, 1, d, k.data(),
                              v.data(), &position, nullptr),
            KVC_STATUS_OK);
}

/// Random appends in both classes, evictions, compactions and sequence
/// removals against a model of every entry; the pool invariants and the
/// data are checked after every step.
/// (high format, low format): int8 + int2 (3 low pages per pool page at
/// this geometry) and f32 + int4 (6).
class MixedCycles
    : public ::testing::TestWithParam<std::pair<int32_t, int32_t>> {};

TEST_P(MixedCycles, ClassesStaySeparateAndDataIntact) {
  const auto [highFormat, lowFormat] = GetParam();
  const int bits = lowFormat == KVC_FORMAT_INT2 ? 2 : 4;
  kvc_config_t c = mixedConfig(lowFormat);
  c.format = highFormat;
  c.head_dim = 64;
  c.page_size = 16;
  c.group_size = 32;
  c.num_pages = 10;
  Fixture f(c);
  int32_t perPage = 0;
  kvc_page_layout_t low;
  ASSERT_EQ(kvc_low_page_layout(&c, &low, &perPage), KVC_STATUS_OK);
  ASSERT_EQ(perPage, highFormat == KVC_FORMAT_INT8 ? 3 : 6);
  const double highTolerance =
      highFormat == KVC_FORMAT_INT8 ? 1.0 / 254 + 1e-6 : 0.0;
  const int32_t d = c.head_dim, p = c.page_size;
  std::mt19937 rng(77 + lowFormat);
  std::uniform_real_distribution<float> unit(-1.0f, 1.0f);
  struct Entry {
    int32_t position;
    bool low;
    std::vector<float> key, value;
  };
  using Head = std::tuple<uint64_t, int32_t, int32_t>;
  std::map<Head, std::map<int32_t, Entry>> model;
  std::vector<uint64_t> sequences = {1, 2};
  for (uint64_t s : sequences)
    ASSERT_EQ(kvc_sequence_add(f.ctx, s), KVC_STATUS_OK);
  int32_t nextPosition = 0;
  int64_t lowAppends = 0, compactMoves = 0, exhausted = 0;

  auto verify = [&] {
    ASSERT_EQ(kvc_pool_check(f.ctx), KVC_STATUS_OK) << kvc_last_error();
    for (auto &[head, entries] : model) {
      auto [s, l, h] = head;
      kvc_metadata_t m;
      ASSERT_EQ(kvc_get_metadata(f.ctx, s, l, h, &m), KVC_STATUS_OK);
      int32_t live = 0;
      for (int32_t slot = 0; slot < m.num_slots; ++slot)
        live += m.position[slot] != KVC_POSITION_NONE;
      ASSERT_EQ(live, static_cast<int32_t>(entries.size()));
      for (auto &[slot, e] : entries) {
        ASSERT_EQ(m.position[slot], e.position);
        int32_t format = -1;
        ASSERT_EQ(kvc_get_page_format(f.ctx, s, l, h, slot / p, &format),
                  KVC_STATUS_OK);
        ASSERT_EQ(format, e.low ? lowFormat : highFormat);
        ASSERT_EQ(m.key_format[slot], format);
        std::vector<float> k(d), v(d);
        ASSERT_EQ(kvc_read_entry(f.ctx, s, l, h, slot, d, k.data(), v.data()),
                  KVC_STATUS_OK);
        if (e.low) {
          auto ek = expectedLow(e.key, c.group_size, bits);
          auto ev = expectedLow(e.value, c.group_size, bits);
          for (int32_t i = 0; i < d; ++i) {
            ASSERT_NEAR(k[i], ek[i], 1e-5f);
            ASSERT_NEAR(v[i], ev[i], 1e-5f);
          }
        } else {
          for (int32_t i = 0; i < d; ++i) {
            ASSERT_NEAR(k[i], e.key[i], highTolerance);
            ASSERT_NEAR(v[i], e.value[i], highTolerance);
          }
        }
      }
    }
  };

  for (int iter = 0; iter < 3000; ++iter) {
    uint64_t s = sequences[rng() % sequences.size()];
    int32_t l = static_cast<int32_t>(rng() % c.num_layers);
    int32_t h = static_cast<int32_t>(rng() % c.num_kv_heads);
    auto &entries = model[{s, l, h}];
    int action = static_cast<int>(rng() % 100);
    if (action < 50) {
      const bool lowClass = rng() % 2 == 0;
      int32_t n = 1 + static_cast<int32_t>(rng() % 20);
      std::vector<float> keys(static_cast<size_t>(n) * d), values(keys.size());
      for (float &x : keys)
        x = unit(rng);
      for (float &x : values)
        x = unit(rng);
      std::vector<int32_t> positions(n), slots(n);
      for (int32_t &x : positions)
        x = nextPosition++;
      kvc_status_t st = kvc_append_format(
          f.ctx, s, l, h, lowClass ? lowFormat : highFormat, n, d,
          keys.data(), values.data(), positions.data(), slots.data());
      if (st == KVC_STATUS_POOL_EXHAUSTED) {
        ++exhausted;
        continue;
      }
      ASSERT_EQ(st, KVC_STATUS_OK) << kvc_last_error();
      lowAppends += lowClass;
      for (int32_t i = 0; i < n; ++i) {
        ASSERT_EQ(entries.count(slots[i]), 0u);
        entries[slots[i]] = {
            positions[i], lowClass,
            std::vector<float>(keys.begin() + i * d, keys.begin() + (i + 1) * d),
            std::vector<float>(values.begin() + i * d,
                               values.begin() + (i + 1) * d)};
      }
    } else if (action < 85) {
      if (entries.empty())
        continue;
      std::vector<int32_t> live;
      for (auto &[slot, e] : entries)
        live.push_back(slot);
      std::shuffle(live.begin(), live.end(), rng);
      live.resize(1 + rng() % live.size());
      ASSERT_EQ(kvc_evict(f.ctx, s, l, h, static_cast<int32_t>(live.size()),
                          live.data()),
                KVC_STATUS_OK)
          << kvc_last_error();
      for (int32_t slot : live)
        entries.erase(slot);
    } else if (action < 97) {
      std::vector<kvc_move_t> moves(256);
      int32_t numMoves = 0, released = 0;
      ASSERT_EQ(kvc_compact(f.ctx, s, l, h, 0.75f, moves.data(), 256,
                            &numMoves, &released),
                KVC_STATUS_OK)
          << kvc_last_error();
      std::map<int32_t, Entry> renumbered;
      std::map<int32_t, int32_t> to;
      for (int32_t i = 0; i < numMoves; ++i)
        to[moves[i].from_slot] = moves[i].to_slot;
      compactMoves += numMoves;
      for (auto &[slot, e] : entries) {
        auto it = to.find(slot);
        renumbered[it == to.end() ? slot : it->second] = e;
      }
      entries = std::move(renumbered);
    } else {
      ASSERT_EQ(kvc_sequence_remove(f.ctx, s), KVC_STATUS_OK);
      ASSERT_EQ(kvc_sequence_add(f.ctx, s), KVC_STATUS_OK);
      for (auto &[head, e] : model)
        if (std::get<0>(head) == s)
          e.clear();
    }
    verify();
    if (HasFatalFailure())
      return;
  }
  // The walk exercised what it is meant to.
  EXPECT_GT(lowAppends, 100);
  EXPECT_GT(compactMoves, 20);
  EXPECT_GT(exhausted, 0);
  for (uint64_t s : sequences)
    ASSERT_EQ(kvc_sequence_remove(f.ctx, s), KVC_STATUS_OK);
  kvc_pool_stats_t stats;
  ASSERT_EQ(kvc_pool_stats(f.ctx, &stats), KVC_STATUS_OK);
  EXPECT_EQ(stats.free_pages, c.num_pages);
  EXPECT_EQ(stats.low_pool_pages, 0);
}

INSTANTIATE_TEST_SUITE_P(
    Classes, MixedCycles,
    ::testing::Values(std::make_pair<int32_t, int32_t>(KVC_FORMAT_INT8,
                                                       KVC_FORMAT_INT2),
                      std::make_pair<int32_t, int32_t>(KVC_FORMAT_FULL,
                                                       KVC_FORMAT_INT4)));

} // namespace
