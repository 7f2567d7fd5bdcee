//===- BatchTest.cpp - the batch decode entry point of generated policies -===//
//
// kvc_<p>_cpu_decode_batch steps several sequences of different lengths in
// one call. It must give exactly what one kvc_<p>_cpu_decode call per
// sequence gives (outputs byte for byte, the same kept entries and score
// state), read row b of q, k, v and write row b of out for sequence b, and
// check its arguments before any sequence takes its step. A step whose
// appends do not fit the pool fails and leaves every cache as it was, in
// the single-sequence entry and in the batch. So does a prefill that the
// pool holds for some heads and not the next: it empties the layer again,
// and once pages are free the same prefill gives what a context that
// never failed gives.
//
//===----------------------------------------------------------------------===//

#include "kvc_h2o_cpu.h"
#include "runtime/kvc_policy_api.h"

#include <gtest/gtest.h>

#include <cstdlib>
#include <cstring>
#include <memory>
#include <numeric>
#include <random>
#include <string>
#include <type_traits>
#include <vector>

namespace {

// The batch entry point and its workspace query have the types of
// runtime/kvc_policy_api.h.
static_assert(std::is_same_v<decltype(&kvc_h2o_cpu_decode_batch),
                             kvc_cpu_decode_batch_fn>);
static_assert(std::is_same_v<decltype(&kvc_h2o_cpu_decode_batch_workspace_bytes),
                             kvc_batch_workspace_bytes_fn>);

constexpr int kQHeads = KVC_TEST_Q_HEADS;
constexpr int kKvHeads = KVC_TEST_KV_HEADS;
constexpr int kDim = KVC_TEST_HEAD_DIM;
constexpr int kPageSize = 32;
/// H2O keeps 1024 entries: the first sequence evicts at every step.
const std::vector<uint64_t> kSequences{7, 2, 11};
const std::vector<int32_t> kPrompts{1030, 300, 5};

/// A host context of the policy's geometry over its own pool.
struct HostContext {
  std::unique_ptr<char, void (*)(void *)> pool{nullptr, std::free};
  kvc_context_t *context = nullptr;

  explicit HostContext(int32_t numPages = 4 * kKvHeads * 40) {
    kvc_config_t config{};
    kvc_h2o_cpu_configure(&config);
    config.page_size = kPageSize;
    config.num_pages = numPages;
    config.max_sequences = 4;
    config.memory = KVC_MEMORY_HOST;
    uint64_t bytes = 0;
    EXPECT_EQ(kvc_pool_bytes_required(&config, &bytes), KVC_STATUS_OK);
    const uint64_t rounded = (bytes + KVC_POOL_ALIGNMENT - 1) /
                             KVC_POOL_ALIGNMENT * KVC_POOL_ALIGNMENT;
    pool.reset(static_cast<char *>(
        std::aligned_alloc(KVC_POOL_ALIGNMENT, rounded)));
    EXPECT_EQ(kvc_context_create(&config, pool.get(), bytes, &context),
              KVC_STATUS_OK);
  }
  ~HostContext() { kvc_context_destroy(context); }
};

std::vector<float> randomRows(std::mt19937 &rng, size_t count) {
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> x(count);
  for (float &e : x)
    e = normal(rng);
  return x;
}

/// Prefills layer 0 of every sequence of `kSequences` with the same inputs
/// in both contexts.
void prefillBoth(kvc_context_t *a, kvc_context_t *b, std::mt19937 &rng) {
  for (size_t s = 0; s < kSequences.size(); ++s) {
    const int32_t n = kPrompts[s];
    std::vector<float> q = randomRows(rng, size_t(n) * kQHeads * kDim);
    std::vector<float> k = randomRows(rng, size_t(n) * kKvHeads * kDim);
    std::vector<float> v = randomRows(rng, size_t(n) * kKvHeads * kDim);
    std::vector<int32_t> positions(n);
    for (int32_t i = 0; i < n; ++i)
      positions[i] = i;
    std::vector<float> out(q.size());
    std::vector<char> ws(kvc_h2o_cpu_prefill_workspace_bytes(n));
    for (kvc_context_t *c : {a, b}) {
      ASSERT_EQ(kvc_sequence_add(c, kSequences[s]), KVC_STATUS_OK);
      ASSERT_EQ(kvc_h2o_cpu_prefill(c, kSequences[s], 0, n, q.data(),
                                    k.data(), v.data(), positions.data(),
                                    out.data(), ws.data(), ws.size()),
                KVC_STATUS_OK)
          << kvc_last_error();
    }
  }
}

/// The slots, positions and score state of every head of `sequence`.
void expectSameCache(kvc_context_t *a, kvc_context_t *b, uint64_t sequence,
                     const std::string &where) {
  for (int h = 0; h < kKvHeads; ++h) {
    kvc_metadata_t ma, mb;
    ASSERT_EQ(kvc_get_metadata(a, sequence, 0, h, &ma), KVC_STATUS_OK);
    ASSERT_EQ(kvc_get_metadata(b, sequence, 0, h, &mb), KVC_STATUS_OK);
    ASSERT_EQ(ma.num_slots, mb.num_slots) << where << " head " << h;
    EXPECT_EQ(0, std::memcmp(ma.position, mb.position,
                             sizeof(int32_t) * ma.num_slots))
        << where << " head " << h << ": positions";
    EXPECT_EQ(0,
              std::memcmp(ma.score, mb.score, sizeof(float) * ma.num_slots))
        << where << " head " << h << ": score state";
  }
}

int32_t entries(kvc_context_t *c, uint64_t sequence) {
  int32_t total = 0;
  for (int h = 0; h < kKvHeads; ++h) {
    int32_t n = 0;
    EXPECT_EQ(kvc_get_num_entries(c, sequence, 0, h, &n), KVC_STATUS_OK);
    total += n;
  }
  return total;
}

TEST(GeneratedPolicyBatch, MatchesOneSequenceAtATime) {
  std::mt19937 rng(20261122);
  HostContext batched, single;
  prefillBoth(batched.context, single.context, rng);
  const int32_t batch = static_cast<int32_t>(kSequences.size());
  const size_t qRow = size_t(kQHeads) * kDim, kvRow = size_t(kKvHeads) * kDim;
  std::vector<char> ws(
      kvc_h2o_cpu_decode_batch_workspace_bytes(batch, 1024 + 2 * kPageSize));
  for (int step = 0; step < 3; ++step) {
    std::vector<float> q = randomRows(rng, batch * qRow);
    std::vector<float> k = randomRows(rng, batch * kvRow);
    std::vector<float> v = randomRows(rng, batch * kvRow);
    std::vector<int32_t> positions(batch);
    for (int32_t b = 0; b < batch; ++b)
      positions[b] = kPrompts[b] + step;
    std::vector<float> outBatch(q.size(), -1.0f), outSingle(q.size(), -2.0f);
    ASSERT_EQ(kvc_h2o_cpu_decode_batch(batched.context, batch,
                                       kSequences.data(), 0, q.data(),
                                       k.data(), v.data(), positions.data(),
                                       outBatch.data(), ws.data(), ws.size()),
              KVC_STATUS_OK)
        << kvc_last_error();
    for (int32_t b = 0; b < batch; ++b)
      ASSERT_EQ(kvc_h2o_cpu_decode(single.context, kSequences[b], 0,
                                   q.data() + b * qRow, k.data() + b * kvRow,
                                   v.data() + b * kvRow, positions[b],
                                   outSingle.data() + b * qRow, ws.data(),
                                   ws.size()),
                KVC_STATUS_OK)
          << kvc_last_error();
    EXPECT_EQ(0, std::memcmp(outBatch.data(), outSingle.data(),
                             sizeof(float) * outBatch.size()))
        << "step " << step << ": outputs";
    for (uint64_t s : kSequences)
      expectSameCache(batched.context, single.context, s,
                      "step " + std::to_string(step) + " sequence " +
                          std::to_string(s));
  }
  // The long sequence stays at its budget, the others grow by a step each.
  EXPECT_EQ(entries(batched.context, 7), 1024 * kKvHeads);
  EXPECT_EQ(entries(batched.context, 2), (300 + 3) * kKvHeads);
  EXPECT_EQ(entries(batched.context, 11), (5 + 3) * kKvHeads);
}

TEST(GeneratedPolicyBatch, ChecksItsArgumentsBeforeAnyStep) {
  std::mt19937 rng(7);
  HostContext a, b;
  prefillBoth(a.context, b.context, rng);
  std::vector<float> q = randomRows(rng, 4 * size_t(kQHeads) * kDim);
  std::vector<float> k = randomRows(rng, 4 * size_t(kKvHeads) * kDim), v = k;
  std::vector<float> out(q.size());
  std::vector<int32_t> positions{1030, 300, 5, 9};
  std::vector<char> ws(
      kvc_h2o_cpu_decode_batch_workspace_bytes(4, 1024 + 2 * kPageSize));
  auto call = [&](int32_t batch, const uint64_t *sequences, uint64_t bytes) {
    return kvc_h2o_cpu_decode_batch(a.context, batch, sequences, 0, q.data(),
                                    k.data(), v.data(), positions.data(),
                                    out.data(), ws.data(), bytes);
  };
  const int32_t before = entries(a.context, 7) + entries(a.context, 2);

  const uint64_t twice[] = {7, 2, 7};
  EXPECT_EQ(call(3, twice, ws.size()), KVC_STATUS_INVALID_ARGUMENT);
  EXPECT_STREQ(kvc_last_error(),
               "kvc_h2o_cpu_decode_batch: sequence 7 appears twice in the "
               "batch (index 2)");
  EXPECT_EQ(call(0, kSequences.data(), ws.size()),
            KVC_STATUS_INVALID_ARGUMENT);
  EXPECT_STREQ(kvc_last_error(), "kvc_h2o_cpu_decode_batch: the batch is empty");
  EXPECT_EQ(call(3, nullptr, ws.size()), KVC_STATUS_NULL_POINTER);
  EXPECT_STREQ(kvc_last_error(), "kvc_h2o_cpu_decode_batch: null argument");
  // An unknown sequence after two known ones: neither known one steps.
  const uint64_t unknown[] = {7, 2, 99};
  EXPECT_NE(call(3, unknown, ws.size()), KVC_STATUS_OK);
  EXPECT_EQ(entries(a.context, 7) + entries(a.context, 2), before);
  // A workspace that fits the short sequences but not the long one.
  const uint64_t small =
      kvc_h2o_cpu_decode_batch_workspace_bytes(3, 300 + 2 * kPageSize);
  EXPECT_EQ(call(3, kSequences.data(), small), KVC_STATUS_BUFFER_TOO_SMALL);
  EXPECT_STREQ(kvc_last_error(),
               "kvc_h2o_cpu_decode_batch: workspace smaller than "
               "kvc_h2o_cpu_decode_workspace_bytes(slots + page_size)");
  EXPECT_EQ(entries(a.context, 7) + entries(a.context, 2), before);
  // The same arguments with a large enough workspace step every sequence.
  EXPECT_EQ(call(3, kSequences.data(), ws.size()), KVC_STATUS_OK)
      << kvc_last_error();
  EXPECT_EQ(entries(a.context, 2), (300 + 1) * kKvHeads);
}

/// Slots, positions and live scores of every head of layer 0 of a
/// sequence.
struct CacheImage {
  std::vector<int32_t> slots;
  std::vector<std::vector<int32_t>> positions;
  std::vector<std::vector<float>> scores;
};

CacheImage image(kvc_context_t *c, uint64_t sequence) {
  CacheImage im;
  for (int h = 0; h < kKvHeads; ++h) {
    kvc_metadata_t m;
    EXPECT_EQ(kvc_get_metadata(c, sequence, 0, h, &m), KVC_STATUS_OK);
    im.slots.push_back(m.num_slots);
    im.positions.emplace_back(m.position, m.position + m.num_slots);
    std::vector<float> live;
    for (int32_t s = 0; s < m.num_slots; ++s)
      if (m.position[s] != KVC_POSITION_NONE)
        live.push_back(m.score[s]);
    im.scores.push_back(live);
  }
  return im;
}

void expectImage(kvc_context_t *c, uint64_t sequence, const CacheImage &was,
                 const std::string &where) {
  const CacheImage now = image(c, sequence);
  EXPECT_EQ(now.slots, was.slots) << where << ": slots";
  EXPECT_EQ(now.positions, was.positions) << where << ": positions";
  EXPECT_EQ(now.scores, was.scores) << where << ": score state";
}

TEST(GeneratedPolicyBatch, AFullPoolChangesNothing) {
  // Sequence 7 fills one page per head (its next step needs a page per
  // head), sequence 2 has room in its pages; the pool has one page fewer
  // than sequence 7's step needs.
  HostContext a(3 * kKvHeads - 1);
  std::mt19937 rng(11);
  auto prefill = [&](uint64_t sequence, int32_t n) {
    std::vector<float> q = randomRows(rng, size_t(n) * kQHeads * kDim);
    std::vector<float> k = randomRows(rng, size_t(n) * kKvHeads * kDim), v = k;
    std::vector<int32_t> positions(n);
    std::iota(positions.begin(), positions.end(), 0);
    std::vector<float> out(q.size());
    std::vector<char> ws(kvc_h2o_cpu_prefill_workspace_bytes(n));
    ASSERT_EQ(kvc_sequence_add(a.context, sequence), KVC_STATUS_OK);
    ASSERT_EQ(kvc_h2o_cpu_prefill(a.context, sequence, 0, n, q.data(),
                                  k.data(), v.data(), positions.data(),
                                  out.data(), ws.data(), ws.size()),
              KVC_STATUS_OK)
        << kvc_last_error();
  };
  prefill(7, kPageSize);
  prefill(2, 5);
  kvc_pool_stats_t stats;
  ASSERT_EQ(kvc_pool_stats(a.context, &stats), KVC_STATUS_OK);
  ASSERT_EQ(stats.free_pages, kKvHeads - 1);
  const CacheImage long0 = image(a.context, 7), short0 = image(a.context, 2);

  std::vector<float> q = randomRows(rng, 2 * size_t(kQHeads) * kDim);
  std::vector<float> k = randomRows(rng, 2 * size_t(kKvHeads) * kDim), v = k;
  std::vector<float> out(q.size(), 0.5f);
  std::vector<char> ws(kvc_h2o_cpu_decode_batch_workspace_bytes(2, 4 * kPageSize));
  // Every head of sequence 7 needs a page, the pool has one fewer: the
  // step's one kvc_append_step refuses them all.
  const std::string exhausted =
      "kvc_append_step: " + std::to_string(kKvHeads) +
      " new pages needed, " + std::to_string(kKvHeads - 1) + " free";

  // One sequence: no head gets a page.
  EXPECT_EQ(kvc_h2o_cpu_decode(a.context, 7, 0, q.data(), k.data(), v.data(),
                               kPageSize, out.data(), ws.data(), ws.size()),
            KVC_STATUS_POOL_EXHAUSTED);
  EXPECT_EQ(kvc_last_error(), exhausted);
  expectImage(a.context, 7, long0, "after the failed step");
  ASSERT_EQ(kvc_pool_stats(a.context, &stats), KVC_STATUS_OK);
  EXPECT_EQ(stats.free_pages, kKvHeads - 1) << "after the failed step";

  // A batch whose first sequence fits: it appends nothing either.
  const uint64_t sequences[2] = {2, 7};
  const int32_t positions[2] = {5, kPageSize};
  EXPECT_EQ(kvc_h2o_cpu_decode_batch(a.context, 2, sequences, 0, q.data(),
                                     k.data(), v.data(), positions,
                                     out.data(), ws.data(), ws.size()),
            KVC_STATUS_POOL_EXHAUSTED);
  EXPECT_EQ(kvc_last_error(), exhausted);
  expectImage(a.context, 2, short0, "after the failed batch");
  expectImage(a.context, 7, long0, "after the failed batch");
  for (float x : out)
    ASSERT_EQ(x, 0.5f) << "a failed step wrote its output";
  ASSERT_EQ(kvc_pool_stats(a.context, &stats), KVC_STATUS_OK);
  EXPECT_EQ(stats.free_pages, kKvHeads - 1) << "after the failed batch";
  EXPECT_EQ(kvc_pool_check(a.context), KVC_STATUS_OK);

  // Without sequence 2 the pool has room: the same batch minus it steps.
  ASSERT_EQ(kvc_sequence_remove(a.context, 2), KVC_STATUS_OK);
  EXPECT_EQ(kvc_h2o_cpu_decode_batch(a.context, 1, sequences + 1, 0, q.data(),
                                     k.data(), v.data(), positions + 1,
                                     out.data(), ws.data(), ws.size()),
            KVC_STATUS_OK)
      << kvc_last_error();
  EXPECT_EQ(entries(a.context, 7), (kPageSize + 1) * kKvHeads);
}

TEST(GeneratedPolicyBatch, APrefillThatExhaustsThePoolLeavesTheLayerEmpty) {
  // Sequence 3's prompt takes one page per head; then one page fewer than
  // kv-heads is free, so sequence 4's prefill appends every head but the
  // last (none with one kv-head) before the pool runs out.
  HostContext a(2 * kKvHeads - 1), twin;
  std::mt19937 rng(31);
  const int32_t n = 5;
  std::vector<float> q = randomRows(rng, size_t(n) * kQHeads * kDim);
  std::vector<float> k = randomRows(rng, size_t(n) * kKvHeads * kDim);
  std::vector<float> v = randomRows(rng, size_t(n) * kKvHeads * kDim);
  std::vector<int32_t> positions(n);
  std::iota(positions.begin(), positions.end(), 0);
  std::vector<float> out(q.size(), 0.5f), twinOut(q.size(), -0.5f);
  std::vector<char> ws(kvc_h2o_cpu_prefill_workspace_bytes(n));
  auto prefill = [&](kvc_context_t *c, uint64_t sequence, float *o) {
    return kvc_h2o_cpu_prefill(c, sequence, 0, n, q.data(), k.data(),
                               v.data(), positions.data(), o, ws.data(),
                               ws.size());
  };
  for (uint64_t s : {3, 4})
    ASSERT_EQ(kvc_sequence_add(a.context, s), KVC_STATUS_OK);
  ASSERT_EQ(prefill(a.context, 3, out.data()), KVC_STATUS_OK)
      << kvc_last_error();
  kvc_pool_stats_t stats;
  ASSERT_EQ(kvc_pool_stats(a.context, &stats), KVC_STATUS_OK);
  ASSERT_EQ(stats.free_pages, kKvHeads - 1);

  EXPECT_EQ(prefill(a.context, 4, out.data()), KVC_STATUS_POOL_EXHAUSTED);
  EXPECT_STREQ(kvc_last_error(), "kvc_append: 1 new pages needed, 0 free");
  EXPECT_EQ(entries(a.context, 4), 0) << "the failed prefill left entries";
  for (int h = 0; h < kKvHeads; ++h) {
    int32_t pages = -1;
    ASSERT_EQ(kvc_get_num_pages(a.context, 4, 0, h, &pages), KVC_STATUS_OK);
    EXPECT_EQ(pages, 0) << "head " << h;
  }
  ASSERT_EQ(kvc_pool_stats(a.context, &stats), KVC_STATUS_OK);
  EXPECT_EQ(stats.free_pages, kKvHeads - 1) << "after the failed prefill";
  EXPECT_EQ(kvc_pool_check(a.context), KVC_STATUS_OK) << kvc_last_error();

  // Once sequence 3 is gone, the prefill called again is the twin's.
  ASSERT_EQ(kvc_sequence_remove(a.context, 3), KVC_STATUS_OK);
  ASSERT_EQ(prefill(a.context, 4, out.data()), KVC_STATUS_OK)
      << kvc_last_error();
  ASSERT_EQ(kvc_sequence_add(twin.context, 4), KVC_STATUS_OK);
  ASSERT_EQ(prefill(twin.context, 4, twinOut.data()), KVC_STATUS_OK)
      << kvc_last_error();
  EXPECT_EQ(0, std::memcmp(out.data(), twinOut.data(),
                           sizeof(float) * out.size()))
      << "outputs";
  expectSameCache(a.context, twin.context, 4, "after the prefill called again");
  EXPECT_EQ(entries(a.context, 4), n * kKvHeads);
}

} // namespace
