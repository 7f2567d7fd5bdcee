//===- AppendStepTest.cpp - kvc_append_step against kvc_append per head --===//
//
// Two contexts of the same configuration see the same history: one appends
// a decode step through kvc_append on every head of the batch in order, the
// other through one kvc_append_step. Every slot, page-table length, page
// table, metadata array, entry (host pools) and KIVI work record must
// agree, through evictions that free slots and pages in between. Bad
// inputs fail with their message and change nothing.
//
//===----------------------------------------------------------------------===//

#include "runtime/kvc_runtime.h"
#include "test/runtime/TestSupport.h"

#include "gtest/gtest.h"

#include <algorithm>
#include <random>
#include <string>
#include <vector>

namespace {

using namespace kvc::test;

struct StepCase {
  kvc_format_t format;
  kvc_memory_t memory;
};

class AppendStep : public ::testing::TestWithParam<StepCase> {};

/// The KIVI work record of one head, as comparable values.
std::vector<int64_t> kiviWork(kvc_context_t *ctx, uint64_t seq, int32_t layer,
                              int32_t head) {
  kvc_kivi_work_t w{};
  EXPECT_EQ(kvc_kivi_pending_work(ctx, seq, layer, head, &w), KVC_STATUS_OK)
      << kvc_last_error();
  std::vector<int64_t> out = {w.num_values, w.num_key_blocks, w.num_stages};
  for (int32_t r = 0; r < w.residual_length; ++r)
    out.push_back(w.residual_slot[r]);
  auto rows = [&](const kvc_kivi_row_t *p, int32_t n) {
    for (int32_t i = 0; i < n; ++i) {
      out.push_back(p[i].slot);
      out.push_back(p[i].residual_row);
      out.push_back(p[i].input);
    }
  };
  rows(w.values, w.num_values);
  for (int32_t b = 0; b <= w.num_key_blocks; ++b)
    out.push_back(w.key_block_begin[b]);
  rows(w.key_members, w.key_block_begin[w.num_key_blocks]);
  rows(w.stages, w.num_stages);
  return out;
}

TEST_P(AppendStep, MatchesAppendOnEveryHead) {
  const StepCase param = GetParam();
  const bool kivi = param.format == KVC_FORMAT_KIVI_INT2 ||
                    param.format == KVC_FORMAT_KIVI_INT4;
  kvc_config_t c = smallConfig(param.format);
  c.memory = param.memory;
  c.num_kv_heads = 3;
  c.num_q_heads = 6;
  c.num_pages = 256;
  c.max_sequences = 5;
  Fixture perHead(c), stepped(c);
  const std::vector<uint64_t> sequences = {7, 11, 13, 17, 19};
  for (uint64_t seq : sequences) {
    ASSERT_EQ(kvc_sequence_add(perHead.ctx, seq), KVC_STATUS_OK);
    ASSERT_EQ(kvc_sequence_add(stepped.ctx, seq), KVC_STATUS_OK);
  }
  const bool host = c.memory == KVC_MEMORY_HOST;
  const int32_t kv = c.num_kv_heads, d = c.head_dim;
  std::mt19937 rng(97 + 10 * param.format + param.memory);
  int64_t steps = 0, evictions = 0;
  for (int32_t iter = 0; iter < 300; ++iter) {
    const int32_t layer = static_cast<int32_t>(rng() % c.num_layers);
    // A random batch of distinct sequences in a random order.
    std::vector<uint64_t> batch = sequences;
    std::shuffle(batch.begin(), batch.end(), rng);
    batch.resize(1 + rng() % sequences.size());
    const int32_t n = static_cast<int32_t>(batch.size());
    std::vector<int32_t> positions(n);
    for (int32_t &p : positions)
      p = static_cast<int32_t>(rng() % 100000);
    std::vector<float> keys, values;
    if (host) {
      keys = gaussian(rng, static_cast<size_t>(n) * kv * d);
      values = gaussian(rng, static_cast<size_t>(n) * kv * d);
    }
    std::vector<int32_t> expectSlots(n * kv), expectPages(n * kv);
    for (int32_t b = 0; b < n; ++b)
      for (int32_t h = 0; h < kv; ++h) {
        const int32_t i = b * kv + h;
        ASSERT_EQ(kvc_append(perHead.ctx, batch[b], layer, h, 1, d,
                             host ? &keys[i * d] : nullptr,
                             host ? &values[i * d] : nullptr, &positions[b],
                             &expectSlots[i]),
                  KVC_STATUS_OK)
            << kvc_last_error();
        ASSERT_EQ(kvc_get_num_pages(perHead.ctx, batch[b], layer, h,
                                    &expectPages[i]),
                  KVC_STATUS_OK);
      }
    std::vector<int32_t> slots(n * kv, -1), pages(n * kv, -1);
    ASSERT_EQ(kvc_append_step(stepped.ctx, layer, n, batch.data(), d,
                              host ? keys.data() : nullptr,
                              host ? values.data() : nullptr,
                              positions.data(), slots.data(), pages.data()),
              KVC_STATUS_OK)
        << kvc_last_error();
    ++steps;
    ASSERT_EQ(slots, expectSlots) << "iteration " << iter;
    ASSERT_EQ(pages, expectPages) << "iteration " << iter;
    for (int32_t b = 0; kivi && b < n; ++b)
      for (int32_t h = 0; h < kv; ++h) {
        ASSERT_EQ(kiviWork(stepped.ctx, batch[b], layer, h),
                  kiviWork(perHead.ctx, batch[b], layer, h))
            << "iteration " << iter << ", sequence " << batch[b] << ", head "
            << h;
      }
    // Evict a few random live entries from both, so that later steps reuse
    // slots and pages.
    const int32_t rounds = n * kv / 4 + static_cast<int32_t>(rng() % 3);
    for (int32_t e = 0; e < rounds; ++e) {
      const uint64_t seq = sequences[rng() % sequences.size()];
      const int32_t l = static_cast<int32_t>(rng() % c.num_layers);
      const int32_t h = static_cast<int32_t>(rng() % kv);
      kvc_metadata_t m;
      ASSERT_EQ(kvc_get_metadata(perHead.ctx, seq, l, h, &m), KVC_STATUS_OK);
      std::vector<int32_t> live;
      for (int32_t s = 0; s < m.num_slots; ++s)
        if (m.position[s] != KVC_POSITION_NONE)
          live.push_back(s);
      if (live.empty())
        continue;
      // Several at once now and then, so that whole pages empty.
      std::shuffle(live.begin(), live.end(), rng);
      live.resize(std::min<size_t>(live.size(), 1 + rng() % 6));
      const int32_t count = static_cast<int32_t>(live.size());
      ASSERT_EQ(kvc_evict(perHead.ctx, seq, l, h, count, live.data()),
                KVC_STATUS_OK);
      ASSERT_EQ(kvc_evict(stepped.ctx, seq, l, h, count, live.data()),
                KVC_STATUS_OK);
      evictions += count;
    }
    ASSERT_EQ(kvc_pool_check(stepped.ctx), KVC_STATUS_OK)
        << "iteration " << iter << ": " << kvc_last_error();
    if (iter % 25 == 0) {
      ASSERT_TRUE(snapshot(stepped.ctx, sequences) ==
                  snapshot(perHead.ctx, sequences))
          << "iteration " << iter;
    }
  }
  ASSERT_TRUE(snapshot(stepped.ctx, sequences) ==
              snapshot(perHead.ctx, sequences));
  kvc_pool_stats_t s{};
  ASSERT_EQ(kvc_pool_stats(stepped.ctx, &s), KVC_STATUS_OK);
  std::printf("[ measured ] %lld steps, %lld evictions, %lld pages mapped at "
              "the end\n",
              static_cast<long long>(steps), static_cast<long long>(evictions),
              static_cast<long long>(s.mapped_pages));
  EXPECT_GT(evictions, 100);
}

std::string caseName(const ::testing::TestParamInfo<StepCase> &info) {
  static const char *const formats[] = {"Full", "Int8", "Fp8", "Kivi2",
                                        "Kivi4"};
  return std::string(formats[info.param.format]) +
         (info.param.memory == KVC_MEMORY_HOST ? "Host" : "Device");
}

INSTANTIATE_TEST_SUITE_P(
    Pools, AppendStep,
    ::testing::Values(StepCase{KVC_FORMAT_FULL, KVC_MEMORY_HOST},
                      StepCase{KVC_FORMAT_INT8, KVC_MEMORY_HOST},
                      StepCase{KVC_FORMAT_KIVI_INT2, KVC_MEMORY_HOST},
                      StepCase{KVC_FORMAT_FULL, KVC_MEMORY_DEVICE},
                      StepCase{KVC_FORMAT_FP8_E4M3, KVC_MEMORY_DEVICE},
                      StepCase{KVC_FORMAT_KIVI_INT4, KVC_MEMORY_DEVICE}),
    caseName);

/// A populated host context for the failure cases.
struct Populated {
  Fixture f;
  std::vector<uint64_t> sequences = {1, 2, 3};
  explicit Populated(const kvc_config_t &c) : f(c) {
    for (uint64_t seq : sequences) {
      EXPECT_EQ(kvc_sequence_add(f.ctx, seq), KVC_STATUS_OK);
      for (int32_t h = 0; h < c.num_kv_heads; ++h) {
        std::vector<float> k(3 * c.head_dim, 0.5f), v(3 * c.head_dim, -0.5f);
        const int32_t pos[3] = {0, 1, 2};
        EXPECT_EQ(kvc_append(f.ctx, seq, 1, h, 3, c.head_dim, k.data(),
                             v.data(), pos, nullptr),
                  KVC_STATUS_OK)
            << kvc_last_error();
      }
    }
  }
};

#define EXPECT_STEP_FAILS(call, code, fragment)                                \
  do {                                                                         \
    const Snapshot before = snapshot(p.f.ctx, p.sequences);                    \
    const kvc_status_t status = (call);                                        \
    EXPECT_EQ(status, code) << #call << ": " << kvc_last_error();              \
    EXPECT_NE(std::string(kvc_last_error()).find(fragment),                    \
              std::string::npos)                                               \
        << "message: " << kvc_last_error();                                    \
    EXPECT_TRUE(snapshot(p.f.ctx, p.sequences) == before)                      \
        << #call << " changed the context";                                    \
  } while (false)

TEST(AppendStepErrors, BadInputsChangeNothing) {
  kvc_config_t c = smallConfig();
  Populated p(c);
  const int32_t d = c.head_dim, kv = c.num_kv_heads;
  std::vector<float> k(3 * kv * d, 1.0f), v(3 * kv * d, 2.0f);
  std::vector<int32_t> slots(3 * kv), pages(3 * kv);
  const int32_t positions[3] = {5, 6, 7};
  const uint64_t seqs[3] = {1, 2, 3};
  // The call with the arguments that vary by case; the values rows are
  // always given.
  auto step = [&](int32_t layer, int32_t batch, const uint64_t *sequences,
                  int32_t dim, const float *keys, const int32_t *at,
                  int32_t *out) {
    return kvc_append_step(p.f.ctx, layer, batch, sequences, dim, keys,
                           v.data(), at, out, nullptr);
  };
  const float *keys = k.data();
  int32_t *out = slots.data();
  EXPECT_STEP_FAILS(step(1, 0, seqs, d, keys, positions, out),
                    KVC_STATUS_INVALID_ARGUMENT, "batch must be > 0");
  EXPECT_STEP_FAILS(step(2, 3, seqs, d, keys, positions, out),
                    KVC_STATUS_OUT_OF_RANGE, "layer 2 out of range");
  EXPECT_STEP_FAILS(step(1, 3, nullptr, d, keys, positions, out),
                    KVC_STATUS_NULL_POINTER, "sequences is NULL");
  EXPECT_STEP_FAILS(step(1, 3, seqs, d, keys, positions, nullptr),
                    KVC_STATUS_NULL_POINTER, "slots is NULL");
  EXPECT_STEP_FAILS(step(1, 3, seqs, d + 1, keys, positions, out),
                    KVC_STATUS_GEOMETRY_MISMATCH, "does not match head_dim");
  EXPECT_STEP_FAILS(step(1, 3, seqs, d, nullptr, positions, out),
                    KVC_STATUS_NULL_POINTER, "keys is NULL");
  const int32_t negative[3] = {5, -1, 7};
  EXPECT_STEP_FAILS(step(1, 3, seqs, d, keys, negative, out),
                    KVC_STATUS_INVALID_ARGUMENT, "positions[1] = -1");
  const uint64_t unknown[3] = {1, 2, 99};
  EXPECT_STEP_FAILS(step(1, 3, unknown, d, keys, positions, out),
                    KVC_STATUS_OUT_OF_RANGE,
                    "unknown sequence 99 (batch index 2)");
  const uint64_t twice[3] = {2, 1, 2};
  EXPECT_STEP_FAILS(step(1, 3, twice, d, keys, positions, out),
                    KVC_STATUS_INVALID_ARGUMENT,
                    "sequence 2 appears twice in the batch (index 2)");
  // The last head of the last sequence is at its budget: the heads before
  // it get nothing either.
  ASSERT_EQ(kvc_set_budget(p.f.ctx, 3, 1, kv - 1, 3), KVC_STATUS_OK);
  EXPECT_STEP_FAILS(step(1, 3, seqs, d, keys, positions, out),
                    KVC_STATUS_OVER_BUDGET,
                    "sequence 3, kv head 1: 3 live + 1 new entry exceed the "
                    "budget 3");
  ASSERT_EQ(kvc_set_budget(p.f.ctx, 3, 1, kv - 1, -1), KVC_STATUS_OK);
  // The same batch then succeeds.
  ASSERT_EQ(kvc_append_step(p.f.ctx, 1, 3, seqs, d, k.data(), v.data(),
                            positions, slots.data(), pages.data()),
            KVC_STATUS_OK)
      << kvc_last_error();
  for (int32_t i = 0; i < 3 * kv; ++i) {
    EXPECT_EQ(slots[i], 3) << i; // after the three prompt entries
    EXPECT_EQ(pages[i], 1) << i;
  }
}

TEST(AppendStepErrors, KiviBudgetFailureAppendsNothing) {
  // A KIVI append advances the head's residual window and records its
  // work; a batch refused by its last head's budget must leave the heads
  // before it untouched, window and work record included.
  kvc_config_t c = smallConfig(KVC_FORMAT_KIVI_INT2);
  Populated p(c);
  const int32_t d = c.head_dim, kv = c.num_kv_heads;
  std::vector<float> k(3 * kv * d, 1.0f), v(3 * kv * d, 2.0f);
  std::vector<int32_t> slots(3 * kv);
  const int32_t positions[3] = {5, 6, 7};
  const uint64_t seqs[3] = {1, 2, 3};
  ASSERT_EQ(kvc_set_budget(p.f.ctx, 3, 1, kv - 1, 3), KVC_STATUS_OK);
  const std::vector<int64_t> work = kiviWork(p.f.ctx, 1, 1, 0);
  EXPECT_STEP_FAILS(kvc_append_step(p.f.ctx, 1, 3, seqs, d, k.data(),
                                    v.data(), positions, slots.data(),
                                    nullptr),
                    KVC_STATUS_OVER_BUDGET, "exceed the budget 3");
  EXPECT_EQ(kiviWork(p.f.ctx, 1, 1, 0), work);
}

TEST(AppendStepErrors, DevicePoolsTakeNoData) {
  kvc_config_t c = smallConfig();
  c.memory = KVC_MEMORY_DEVICE;
  Fixture f(c);
  ASSERT_EQ(kvc_sequence_add(f.ctx, 4), KVC_STATUS_OK);
  std::vector<float> k(c.num_kv_heads * c.head_dim, 1.0f);
  std::vector<int32_t> slots(c.num_kv_heads);
  const uint64_t seq = 4;
  const int32_t position = 0;
  EXPECT_EQ(kvc_append_step(f.ctx, 0, 1, &seq, c.head_dim, k.data(), nullptr,
                            &position, slots.data(), nullptr),
            KVC_STATUS_UNSUPPORTED);
  EXPECT_NE(std::string(kvc_last_error()).find("device pools take no data"),
            std::string::npos)
      << kvc_last_error();
  int32_t entries = -1;
  ASSERT_EQ(kvc_get_num_entries(f.ctx, seq, 0, 0, &entries), KVC_STATUS_OK);
  EXPECT_EQ(entries, 0);
}

TEST(AppendStepErrors, ExhaustedPoolChangesNothing) {
  // Every head of the batch needs a new page and the pool has fewer than
  // the batch needs: no head takes one.
  kvc_config_t c = smallConfig();
  c.num_pages = 11; // 3 sequences x 2 heads of layer 1: 6 pages used
  Populated p(c);
  const int32_t d = c.head_dim, kv = c.num_kv_heads;
  // Fill layer 1's pages (4 slots each) so that the next step needs a new
  // page on every head.
  for (uint64_t seq : p.sequences)
    for (int32_t h = 0; h < kv; ++h) {
      std::vector<float> x(d, 0.25f);
      const int32_t pos = 3;
      ASSERT_EQ(kvc_append(p.f.ctx, seq, 1, h, 1, d, x.data(), x.data(), &pos,
                           nullptr),
                KVC_STATUS_OK)
          << kvc_last_error();
    }
  std::vector<float> k(3 * kv * d, 1.0f), v(3 * kv * d, 2.0f);
  std::vector<int32_t> slots(3 * kv);
  const int32_t positions[3] = {4, 4, 4};
  const uint64_t seqs[3] = {1, 2, 3};
  EXPECT_STEP_FAILS(kvc_append_step(p.f.ctx, 1, 3, seqs, d, k.data(),
                                    v.data(), positions, slots.data(),
                                    nullptr),
                    KVC_STATUS_POOL_EXHAUSTED, "6 new pages needed, 5 free");
}

} // namespace
