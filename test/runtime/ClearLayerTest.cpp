//===- ClearLayerTest.cpp - kvc_clear_layer --------------------------------===//
//
// kvc_clear_layer empties one layer of a sequence as if the sequence were
// new: against a twin context that never filled that layer, the entries,
// slots, metadata, data and free pages are the same (only the pool's page
// ids differ), before and after the same appends into the cleared layer
// (KIVI: the residual window and the key blocks start again); the other
// layer and the other sequence are untouched, a budget stays, and a record
// attached to the layer is released without a flush.
//
//===----------------------------------------------------------------------===//

#include "runtime/kvc_runtime.h"
#include "test/runtime/TestSupport.h"

#include "gtest/gtest.h"

#include <random>
#include <string>
#include <vector>

namespace {

using namespace kvc::test;

/// A snapshot without the pool's page ids and offsets, which depend on the
/// order in which pages were taken and given back.
Snapshot withoutPageIds(Snapshot s) {
  for (HeadSnapshot &h : s.heads) {
    h.pages.assign(h.pages.size(), 0);
    h.pageOffsets.assign(h.pageOffsets.size(), 0);
  }
  return s;
}

/// Appends `count` entries at positions from `first` to every kv-head of
/// (sequence, layer), rows drawn from `rng`.
void appendRows(kvc_context_t *ctx, const kvc_config_t &c, uint64_t sequence,
                int32_t layer, int32_t count, int32_t first,
                std::mt19937 &rng) {
  std::vector<int32_t> positions(count);
  for (int32_t i = 0; i < count; ++i)
    positions[i] = first + i;
  for (int32_t head = 0; head < c.num_kv_heads; ++head) {
    std::vector<float> k = gaussian(rng, size_t(count) * c.head_dim);
    std::vector<float> v = gaussian(rng, size_t(count) * c.head_dim);
    ASSERT_EQ(kvc_append(ctx, sequence, layer, head, count, c.head_dim,
                         k.data(), v.data(), positions.data(), nullptr),
              KVC_STATUS_OK)
        << kvc_last_error();
  }
}

class ClearLayer : public ::testing::TestWithParam<kvc_format_t> {};

TEST_P(ClearLayer, LeavesTheLayerAsANewSequencesAndTheRestAsItWas) {
  const kvc_config_t c = smallConfig(GetParam());
  Fixture cleared(c), twin(c);
  for (Fixture *f : {&cleared, &twin}) {
    ASSERT_EQ(kvc_sequence_add(f->ctx, 1), KVC_STATUS_OK);
    ASSERT_EQ(kvc_sequence_add(f->ctx, 2), KVC_STATUS_OK);
  }
  // The same rows in both contexts: layer 1 of sequence 1 and layer 0 of
  // sequence 2; only `cleared` fills layer 0 of sequence 1 (and evicts one
  // entry of it), then clears it.
  std::mt19937 a(7), b(7), filler(11);
  appendRows(cleared.ctx, c, 1, 1, 13, 0, a);
  appendRows(twin.ctx, c, 1, 1, 13, 0, b);
  appendRows(cleared.ctx, c, 1, 0, 21, 0, filler);
  const int32_t victim = 3;
  ASSERT_EQ(kvc_evict(cleared.ctx, 1, 0, 1, 1, &victim), KVC_STATUS_OK);
  appendRows(cleared.ctx, c, 2, 0, 9, 0, a);
  appendRows(twin.ctx, c, 2, 0, 9, 0, b);
  ASSERT_EQ(kvc_set_budget(cleared.ctx, 1, 0, 0, 21), KVC_STATUS_OK)
      << kvc_last_error();
  ASSERT_EQ(kvc_set_budget(twin.ctx, 1, 0, 0, 21), KVC_STATUS_OK);

  ASSERT_EQ(kvc_clear_layer(cleared.ctx, 1, 0), KVC_STATUS_OK)
      << kvc_last_error();
  EXPECT_STREQ(kvc_last_error(), "");
  EXPECT_EQ(kvc_pool_check(cleared.ctx), KVC_STATUS_OK) << kvc_last_error();
  EXPECT_TRUE(withoutPageIds(snapshot(cleared.ctx, {1, 2})) ==
              withoutPageIds(snapshot(twin.ctx, {1, 2})))
      << "after the clear";

  // The same appends into the cleared layer as into the twin's new one:
  // the same slots, formats (KIVI: blocks and window from the start) and
  // data. The budget of 21 still caps head 0.
  appendRows(cleared.ctx, c, 1, 0, 12, 40, a);
  appendRows(twin.ctx, c, 1, 0, 12, 40, b);
  EXPECT_EQ(kvc_pool_check(cleared.ctx), KVC_STATUS_OK) << kvc_last_error();
  EXPECT_TRUE(withoutPageIds(snapshot(cleared.ctx, {1, 2})) ==
              withoutPageIds(snapshot(twin.ctx, {1, 2})))
      << "after the appends into the cleared layer";
  std::vector<int32_t> positions(10);
  for (int32_t i = 0; i < 10; ++i)
    positions[i] = 52 + i;
  std::vector<float> rows(10 * size_t(c.head_dim), 0.25f);
  for (Fixture *f : {&cleared, &twin})
    EXPECT_EQ(kvc_append(f->ctx, 1, 0, 0, 10, c.head_dim, rows.data(),
                         rows.data(), positions.data(), nullptr),
              KVC_STATUS_OVER_BUDGET)
        << "12 live + 10 new entries over the budget of 21";
}

INSTANTIATE_TEST_SUITE_P(Formats, ClearLayer,
                         ::testing::Values(KVC_FORMAT_FULL, KVC_FORMAT_INT8,
                                           KVC_FORMAT_KIVI_INT2),
                         [](const ::testing::TestParamInfo<kvc_format_t> &p) {
                           return std::string(
                               p.param == KVC_FORMAT_FULL   ? "Full"
                               : p.param == KVC_FORMAT_INT8 ? "Int8"
                                                            : "Kivi2");
                         });

struct Released {
  int flushes = 0, releases = 0;
};

TEST(ClearLayer, ReleasesTheLayersRecordWithoutAFlush) {
  const kvc_config_t c = smallConfig();
  Fixture f(c);
  ASSERT_EQ(kvc_sequence_add(f.ctx, 1), KVC_STATUS_OK);
  std::mt19937 rng(3);
  appendRows(f.ctx, c, 1, 0, 5, 0, rng);
  Released layer0, layer1;
  auto attach = [&](int32_t layer, Released &r) {
    kvc_attachment_t a{};
    a.data = &r;
    a.flush = [](void *data, kvc_context_t *, uint64_t, int32_t) {
      ++static_cast<Released *>(data)->flushes;
      return KVC_STATUS_OK;
    };
    a.release = [](void *data) { ++static_cast<Released *>(data)->releases; };
    ASSERT_EQ(kvc_attach(f.ctx, 1, layer, &a), KVC_STATUS_OK);
  };
  attach(0, layer0);
  attach(1, layer1);
  ASSERT_EQ(kvc_clear_layer(f.ctx, 1, 0), KVC_STATUS_OK) << kvc_last_error();
  EXPECT_EQ(layer0.flushes, 0);
  EXPECT_EQ(layer0.releases, 1);
  EXPECT_EQ(layer1.flushes, 0);
  EXPECT_EQ(layer1.releases, 0);
  kvc_attachment_t left{};
  ASSERT_EQ(kvc_detach(f.ctx, 1, 0, &left), KVC_STATUS_OK);
  EXPECT_EQ(left.data, nullptr) << "the cleared layer keeps no record";
  int32_t entries = -1;
  ASSERT_EQ(kvc_get_num_entries(f.ctx, 1, 0, 0, &entries), KVC_STATUS_OK);
  EXPECT_EQ(entries, 0);
  EXPECT_EQ(layer1.flushes, 0);
}

} // namespace
