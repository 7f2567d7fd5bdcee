//===- FidelityTest.cpp - hand-worked cases of every bundled policy -------===//
//
// Each bundled policy, scaled down to a few entries (test/fidelity/policies),
// runs on inputs chosen so that its answer can be worked out by hand from
// the definition its policy file states: one-hot or orthogonal keys, queries
// aligned with chosen keys, distinct key norms, values on a quantization
// grid. The expected kept sets, score states and stored values are written
// here from those definitions, with the derivation in comments; nothing is
// computed by the reference oracle or taken from kvc's output.
//
// Notation: d = head dim, logits q.k / sqrt(d); with d = 4 a query (4,0,0,0)
// and a key (a,0,0,0) give the logit 2a. E = e^logit. "Uniform" means a zero
// query: every visible entry gets 1/(t+1) from query t.
//
//===----------------------------------------------------------------------===//

#include "kvc_a2sf_cpu.h"
#include "kvc_adakv_cpu.h"
#include "kvc_cam_cpu.h"
#include "kvc_d2o_cpu.h"
#include "kvc_duo_attention_cpu.h"
#include "kvc_fp8_cpu.h"
#include "kvc_h2o_cpu.h"
#include "kvc_h2o_merge_cpu.h"
#include "kvc_int8_cpu.h"
#include "kvc_keydiff_cpu.h"
#include "kvc_kivi2_cpu.h"
#include "kvc_kivi4_cpu.h"
#include "kvc_knorm_cpu.h"
#include "kvc_merge_nearest_cpu.h"
#include "kvc_mixed_precision_cpu.h"
#include "kvc_pyramidkv_adakv_cpu.h"
#include "kvc_pyramidkv_cpu.h"
#include "kvc_rpc_cpu.h"
#include "kvc_scissorhands_cpu.h"
#include "kvc_snapkv_cpu.h"
#include "kvc_snapkv_global_cpu.h"
#include "kvc_snapkv_kivi2_cpu.h"
#include "kvc_snapkv_maxpool_cpu.h"
#include "kvc_streaming_llm_cpu.h"
#include "kvc_tova_cpu.h"
#include "kvc_value_aware_cpu.h"
#include "runtime/kvc_policy_api.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <map>
#include <memory>
#include <vector>

namespace {

using Vec = std::vector<float>;

/// The C entry points of one generated library.
struct Api {
  kvc_configure_fn configure;
  kvc_workspace_bytes_fn prefillBytes;
  kvc_cpu_prefill_fn prefill;
  kvc_workspace_bytes_fn decodeBytes;
  kvc_cpu_decode_fn decode;
};

#define KVC_API(p)                                                             \
  Api {                                                                        \
    kvc_##p##_cpu_configure, kvc_##p##_cpu_prefill_workspace_bytes,            \
        kvc_##p##_cpu_prefill, kvc_##p##_cpu_decode_workspace_bytes,           \
        kvc_##p##_cpu_decode                                                   \
  }

/// Rows of one layer's q, k or v: [token][head][dim].
struct Rows {
  int tokens, heads, dim;
  Vec data;
  Rows(int tokens, int heads, int dim)
      : tokens(tokens), heads(heads), dim(dim),
        data(static_cast<size_t>(tokens) * heads * dim, 0.0f) {}
  void set(int t, int h, const Vec &x) {
    std::copy(x.begin(), x.end(), data.begin() + (t * heads + h) * dim);
  }
  /// Sets the same row for every head.
  void setAll(int t, const Vec &x) {
    for (int h = 0; h < heads; ++h)
      set(t, h, x);
  }
  Vec row(int t, int h) const {
    auto b = data.begin() + (t * heads + h) * dim;
    return Vec(b, b + dim);
  }
};

/// A one-sequence context over a host pool, for one generated library.
class Cache {
public:
  explicit Cache(const Api &api, int pageSize = 8) : api(api) {
    api.configure(&config);
    config.page_size = pageSize;
    config.num_pages = config.num_layers * config.num_kv_heads * 8;
    config.max_sequences = 1;
    config.memory = KVC_MEMORY_HOST;
    uint64_t bytes = 0;
    EXPECT_EQ(kvc_pool_bytes_required(&config, &bytes), KVC_STATUS_OK)
        << kvc_last_error();
    pool.reset(static_cast<char *>(std::aligned_alloc(
        KVC_POOL_ALIGNMENT, (bytes + KVC_POOL_ALIGNMENT - 1) /
                                KVC_POOL_ALIGNMENT * KVC_POOL_ALIGNMENT)));
    EXPECT_EQ(kvc_context_create(&config, pool.get(), bytes, &context),
              KVC_STATUS_OK)
        << kvc_last_error();
    EXPECT_EQ(kvc_sequence_add(context, 0), KVC_STATUS_OK);
  }
  ~Cache() { kvc_context_destroy(context); }

  kvc_context_t *handle() const { return context; }
  int qHeads() const { return config.num_q_heads; }
  int kvHeads() const { return config.num_kv_heads; }
  int dim() const { return config.head_dim; }

  /// Prefill of one layer with positions 0 .. n-1.
  kvc_status_t prefill(int layer, const Rows &q, const Rows &k, const Rows &v,
                       Vec *out = nullptr) {
    const int n = q.tokens;
    std::vector<int32_t> positions(n);
    for (int i = 0; i < n; ++i)
      positions[i] = i;
    Vec o(static_cast<size_t>(n) * qHeads() * dim());
    std::vector<char> ws(api.prefillBytes(n));
    kvc_status_t st =
        api.prefill(context, 0, layer, n, q.data.data(), k.data.data(),
                    v.data.data(), positions.data(), o.data(), ws.data(),
                    ws.size());
    if (out)
      *out = o;
    return st;
  }

  /// One decode step of one layer (one token in q, k, v).
  kvc_status_t decode(int layer, const Rows &q, const Rows &k, const Rows &v,
                      int position, Vec *out = nullptr) {
    int32_t slots = 0;
    for (int h = 0; h < kvHeads(); ++h) {
      int32_t s = 0;
      kvc_get_num_slots(context, 0, layer, h, &s);
      slots = std::max(slots, s);
    }
    std::vector<char> ws(api.decodeBytes(slots + 2 * config.page_size));
    Vec o(static_cast<size_t>(qHeads()) * dim());
    kvc_status_t st =
        api.decode(context, 0, layer, q.data.data(), k.data.data(),
                   v.data.data(), position, o.data(), ws.data(), ws.size());
    if (out)
      *out = o;
    return st;
  }

  /// Live original positions of one head, ascending.
  std::vector<int> kept(int layer, int head) {
    std::vector<int> positions;
    for (auto &[pos, slot] : live(layer, head))
      positions.push_back(pos);
    return positions;
  }

  Vec key(int layer, int head, int position) {
    return read(layer, head, position, true);
  }
  Vec value(int layer, int head, int position) {
    return read(layer, head, position, false);
  }
  /// The policy's score state of one entry.
  float score(int layer, int head, int position) {
    kvc_metadata_t meta{};
    EXPECT_EQ(kvc_get_metadata(context, 0, layer, head, &meta), KVC_STATUS_OK);
    return meta.score[slotOf(layer, head, position)];
  }
  /// The importance bits of one entry (bit 0: the latest step).
  uint64_t history(int layer, int head, int position) {
    kvc_metadata_t meta{};
    EXPECT_EQ(kvc_get_metadata(context, 0, layer, head, &meta), KVC_STATUS_OK);
    return meta.history[slotOf(layer, head, position)];
  }
  int keyFormat(int layer, int head, int position) {
    kvc_metadata_t meta{};
    EXPECT_EQ(kvc_get_metadata(context, 0, layer, head, &meta), KVC_STATUS_OK);
    return meta.key_format[slotOf(layer, head, position)];
  }
  int valueFormat(int layer, int head, int position) {
    kvc_metadata_t meta{};
    EXPECT_EQ(kvc_get_metadata(context, 0, layer, head, &meta), KVC_STATUS_OK);
    return meta.value_format[slotOf(layer, head, position)];
  }

private:
  std::map<int, int> live(int layer, int head) {
    kvc_metadata_t meta{};
    EXPECT_EQ(kvc_get_metadata(context, 0, layer, head, &meta), KVC_STATUS_OK);
    std::map<int, int> m;
    for (int s = 0; s < meta.num_slots; ++s)
      if (meta.position[s] != KVC_POSITION_NONE)
        m[meta.position[s]] = s;
    return m;
  }
  int slotOf(int layer, int head, int position) {
    std::map<int, int> m = live(layer, head);
    auto it = m.find(position);
    EXPECT_NE(it, m.end()) << "position " << position << " is not live";
    return it == m.end() ? 0 : it->second;
  }
  Vec read(int layer, int head, int position, bool wantKey) {
    Vec k(dim()), v(dim());
    EXPECT_EQ(kvc_read_entry(context, 0, layer, head,
                             slotOf(layer, head, position), dim(), k.data(),
                             v.data()),
              KVC_STATUS_OK)
        << kvc_last_error();
    return wantKey ? k : v;
  }

  Api api;
  kvc_config_t config{};
  struct Free {
    void operator()(char *p) const { std::free(p); }
  };
  std::unique_ptr<char, Free> pool;
  kvc_context_t *context = nullptr;
};

using Kept = std::vector<int>;

void expectRow(const Vec &actual, const std::vector<double> &expected,
               double tolerance, const char *what, int position) {
  ASSERT_EQ(actual.size(), expected.size());
  for (size_t c = 0; c < expected.size(); ++c)
    EXPECT_NEAR(actual[c], expected[c], tolerance)
        << what << " of position " << position << ", channel " << c;
}

/// Stored rows must be the input bit for bit (f32 full storage).
void expectExact(Cache &cache, int layer, int head, const Rows &k,
                 const Rows &v, const Kept &positions, int tokenOffset = 0) {
  for (int p : positions) {
    EXPECT_EQ(cache.key(layer, head, p), k.row(p - tokenOffset, head))
        << "key of position " << p;
    EXPECT_EQ(cache.value(layer, head, p), v.row(p - tokenOffset, head))
        << "value of position " << p;
  }
}

Vec e(int c, float scale = 1.0f, int d = 4) {
  Vec x(d, 0.0f);
  x[c] = scale;
  return x;
}

double relTol(double x) { return 1e-5 * std::max(1.0, std::fabs(x)); }

//===----------------------------------------------------------------------===//
// StreamingLLM and DuoAttention: positions only
//===----------------------------------------------------------------------===//

// s = 2 sinks, budget 6, so r = 4 recent entries. A 10-token prompt keeps
// {0,1} + {6,7,8,9}; every decode step appends one entry and drops the
// oldest non-sink.
TEST(StreamingLLM, KeepsSinksAndRecentAndDropsTheOldestNonSinkAtDecode) {
  Cache cache(KVC_API(streaming_llm));
  const int n = 10;
  Rows q(n, 2, 4), k(n, 1, 4), v(n, 1, 4);
  for (int t = 0; t < n; ++t) {
    q.setAll(t, {1, 0, 0, 0});
    k.set(t, 0, {float(t), 1, 0, 0});
    v.set(t, 0, {1, float(t), -float(t), 0.5f});
  }
  ASSERT_EQ(cache.prefill(0, q, k, v), KVC_STATUS_OK) << kvc_last_error();
  EXPECT_EQ(cache.kept(0, 0), (Kept{0, 1, 6, 7, 8, 9}));
  expectExact(cache, 0, 0, k, v, {0, 1, 6, 7, 8, 9});

  // Step at 10: {0,1,6..10} is 7 > 6, the oldest non-sink (6) goes.
  // Step at 11: 7 goes.
  const Kept after[] = {{0, 1, 7, 8, 9, 10}, {0, 1, 8, 9, 10, 11}};
  for (int step = 0; step < 2; ++step) {
    Rows dq(1, 2, 4), dk(1, 1, 4), dv(1, 1, 4);
    dq.setAll(0, {1, 0, 0, 0});
    dk.set(0, 0, {0, 0, 1, float(step)});
    dv.set(0, 0, {2, 2, float(step), 1});
    ASSERT_EQ(cache.decode(0, dq, dk, dv, n + step), KVC_STATUS_OK)
        << kvc_last_error();
    EXPECT_EQ(cache.kept(0, 0), after[step]) << "after step " << step;
    EXPECT_EQ(cache.value(0, 0, n + step), dv.row(0, 0));
    EXPECT_EQ(cache.key(0, 0, n + step), dk.row(0, 0));
  }
  expectExact(cache, 0, 0, k, v, {0, 1, 8, 9});
}

// Head table [[1], [0]]: layer 0 is a retrieval head (keeps everything),
// layer 1 a streaming head (2 sinks + 4 recent).
TEST(DuoAttention, RetrievalHeadKeepsAllStreamingHeadKeepsSinksAndRecent) {
  Cache cache(KVC_API(duo_attention));
  const int n = 10;
  Rows q(n, 2, 4), k(n, 1, 4), v(n, 1, 4);
  for (int t = 0; t < n; ++t) {
    q.setAll(t, {0, 1, 0, 0});
    k.set(t, 0, {1, float(t), 0, 0});
    v.set(t, 0, {float(t), 0, 1, -1});
  }
  for (int layer = 0; layer < 2; ++layer)
    ASSERT_EQ(cache.prefill(layer, q, k, v), KVC_STATUS_OK)
        << kvc_last_error();
  EXPECT_EQ(cache.kept(0, 0), (Kept{0, 1, 2, 3, 4, 5, 6, 7, 8, 9}));
  EXPECT_EQ(cache.kept(1, 0), (Kept{0, 1, 6, 7, 8, 9}));
  expectExact(cache, 0, 0, k, v, cache.kept(0, 0));
  expectExact(cache, 1, 0, k, v, cache.kept(1, 0));

  Rows dq(1, 2, 4), dk(1, 1, 4), dv(1, 1, 4);
  dq.setAll(0, {0, 1, 0, 0});
  dk.set(0, 0, {1, 10, 0, 0});
  dv.set(0, 0, {10, 0, 1, -1});
  for (int layer = 0; layer < 2; ++layer)
    ASSERT_EQ(cache.decode(layer, dq, dk, dv, n), KVC_STATUS_OK)
        << kvc_last_error();
  EXPECT_EQ(cache.kept(0, 0), (Kept{0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10}));
  EXPECT_EQ(cache.kept(1, 0), (Kept{0, 1, 7, 8, 9, 10}));
}

//===----------------------------------------------------------------------===//
// H2O and A2SF: accumulated attention
//===----------------------------------------------------------------------===//

// The H2O input (n = 12, d = 4): heavy hitters 3 and 6 have the key
// (4,0,0,0), every other key has channel 0 = 0. Query head 0 is (4,0,0,0) at
// every token (logit 8 on a heavy hitter, 0 elsewhere; E = e^8); query head
// 1 is zero (uniform). Head 0's weight on entry i from query t (i <= t):
//   t < 3:      1/(t+1) (no heavy hitter visible yet)
//   3 <= t < 6: E/(E+t) on 3, 1/(E+t) on the t others
//   t >= 6:     E/(2E+t-1) on 3 and 6, 1/(2E+t-1) on the t-1 others
double h2oHead0(int t, int i) {
  const double E = std::exp(8.0);
  const bool heavy = i == 3 || i == 6;
  if (t < 3)
    return 1.0 / (t + 1);
  if (t < 6)
    return heavy ? E / (E + t) : 1.0 / (E + t);
  return heavy ? E / (2 * E + t - 1) : 1.0 / (2 * E + t - 1);
}

/// Accumulated attention after the 12 prompt queries, mean over the group:
/// s_i = 1/2 sum_{t=i}^{11} gamma^(11-t) (head0(t,i) + 1/(t+1)).
double h2oPromptScore(int i, double gamma) {
  double s = 0.0;
  for (int t = i; t < 12; ++t)
    s += std::pow(gamma, 11 - t) * 0.5 * (h2oHead0(t, i) + 1.0 / (t + 1));
  return s;
}

struct H2OInput {
  Rows q{12, 2, 4}, k{12, 1, 4}, v{12, 1, 4};
  /// `mergeKeys`: the keys of the merge cases (channels 1-3 give the
  /// similarities; channel 0, which alone meets the queries, is unchanged).
  explicit H2OInput(bool mergeKeys = false) {
    for (int t = 0; t < 12; ++t) {
      q.set(t, 0, {4, 0, 0, 0});
      q.set(t, 1, {0, 0, 0, 0});
      v.set(t, 0, {float(t), 1, -0.5f * t, 0.25f});
    }
    k.set(3, 0, {4, 0, 0, 0});
    k.set(6, 0, {4, 0, 0, 0});
    if (!mergeKeys)
      return;
    const std::vector<Vec> keys = {
        {0, 1, 0, 0},  {0, 2, 0, 0}, {0, 0, 3, 0}, {4, 0, 0, 0},
        {0, 0, 0, -1}, {0, 0, 0, 2}, {4, 0, 0, 3}, {0, 3, 4, 0},
        {0, -1, 0, 0}, {0, 0, 1, 0}, {0, 0, 0, 1}, {0, 0, 0, 0}};
    const std::vector<Vec> values = {
        {1, 0, 0, 0}, {0, 3, 0, 0},  {0, 0, 0, 2}, {0, 0, 5, 0},
        {9, 9, 9, 9}, {0, 0, 1, 0},  {0, 5, 0, 0}, {6, 0, 0, 0},
        {-9, 0, 0, 0}, {0, 0, 2, 0}, {0, 1, 0, 0}, {1, 1, 1, 1}};
    for (int t = 0; t < 12; ++t) {
      k.set(t, 0, keys[t]);
      v.set(t, 0, values[t]);
    }
  }
};

/// The decode token of the H2O cases: position 12, zero key (channel 0 = 0).
struct H2OStep {
  Rows q{1, 2, 4}, k{1, 1, 4}, v{1, 1, 4};
  H2OStep() {
    q.set(0, 0, {4, 0, 0, 0});
    v.set(0, 0, {12, 1, -6, 0.25f});
  }
};

/// Checks the H2O/A2SF prefill kept set and state, then one decode step:
/// {0,3,6,9,10,11} + 12 is 7 > 6. The step's weights are, head 0,
/// E/(2E+5) on 3 and 6 and 1/(2E+5) on the 5 others; head 1 1/7 each; the
/// state becomes gamma * s + (head0 + head1) / 2. Of the unprotected
/// {0,3,6,9} (10, 11, 12 are the 3 recent), 9 has the least state (only
/// queries 9..12 saw it) and goes.
/// `stored` holds the values of 0, 3, 6, 9, 10, 11 as the prefill left
/// them (merged where the policy merges).
void checkAccumulating(Cache &cache, double gamma, const Kept &stateChecked,
                       const Kept &stateCheckedAfterStep,
                       const std::vector<std::vector<double>> &stored) {
  // Prefill: 9, 10, 11 are protected; of the rest, heavy hitters 3 and 6
  // have state ~ (E/(E+t) + ...)/2 > 1, and entry 0 out-scores every other
  // entry because it saw every query with at least the weight each other
  // light entry got (1 from query 0, 1/2 from query 1, ...).
  EXPECT_EQ(cache.kept(0, 0), (Kept{0, 3, 6, 9, 10, 11}));
  for (int i : stateChecked)
    EXPECT_NEAR(cache.score(0, 0, i), h2oPromptScore(i, gamma),
                relTol(h2oPromptScore(i, gamma)))
        << "state of " << i;

  H2OStep step;
  Vec out;
  ASSERT_EQ(cache.decode(0, step.q, step.k, step.v, 12, &out), KVC_STATUS_OK)
      << kvc_last_error();
  EXPECT_EQ(cache.kept(0, 0), (Kept{0, 3, 6, 10, 11, 12}));
  const double E = std::exp(8.0);
  auto stepWeight = [&](int i) {
    const double head0 = (i == 3 || i == 6) ? E / (2 * E + 5) : 1 / (2 * E + 5);
    return 0.5 * (head0 + 1.0 / 7);
  };
  for (int i : stateCheckedAfterStep) {
    const double prompt = i < 12 ? h2oPromptScore(i, gamma) : 0.0;
    const double want = gamma * prompt + stepWeight(i);
    EXPECT_NEAR(cache.score(0, 0, i), want, relTol(want))
        << "state of " << i << " after the step";
  }
  // Query head 1 is uniform over the 7 entries attended before the
  // eviction: its output is the mean of their values.
  std::vector<double> mean(4, 0.0);
  for (int j = 0; j < 7; ++j)
    for (int c = 0; c < 4; ++c)
      mean[c] += (j < 6 ? stored[j][c] : step.v.row(0, 0)[c]) / 7.0;
  for (int c = 0; c < 4; ++c)
    EXPECT_NEAR(out[4 + c], mean[c], 1e-5) << "head 1 output channel " << c;
}

std::vector<std::vector<double>> inputValues(const H2OInput &in,
                                             const Kept &positions) {
  std::vector<std::vector<double>> rows;
  for (int p : positions) {
    Vec r = in.v.row(p, 0);
    rows.emplace_back(r.begin(), r.end());
  }
  return rows;
}

TEST(H2O, KeepsPlantedHeavyHittersAndAccumulatesAtDecode) {
  Cache cache(KVC_API(h2o));
  H2OInput in;
  ASSERT_EQ(cache.prefill(0, in.q, in.k, in.v), KVC_STATUS_OK)
      << kvc_last_error();
  // s_3 = 1/2 (sum_{t=3..5} E/(E+t) + sum_{t=6..11} E/(2E+t-1)
  //            + sum_{t=3..11} 1/(t+1)) ~ 1/2 (3 + 3 + (H_12 - H_3))
  //      = 1/2 (6 + 3.1032 - 1.8333) = 3.635.
  EXPECT_NEAR(cache.score(0, 0, 3), 3.635, 0.005);
  expectExact(cache, 0, 0, in.k, in.v, {0, 3, 6, 9, 10, 11});
  checkAccumulating(cache, 1.0, {0, 3, 6, 9, 10, 11}, {0, 3, 6, 10, 11, 12},
                    inputValues(in, {0, 3, 6, 9, 10, 11}));
}

TEST(A2SF, DecaysAccumulatedAttentionAndAccumulatesAtDecode) {
  Cache cache(KVC_API(a2sf));
  H2OInput in;
  ASSERT_EQ(cache.prefill(0, in.q, in.k, in.v), KVC_STATUS_OK)
      << kvc_last_error();
  // Entry 0 saw query 0 with weight 1, but 11 steps ago: head 1 gives
  // 0.9^11 * 1 = 0.3138 where H2O would count 1.
  expectExact(cache, 0, 0, in.k, in.v, {0, 3, 6, 9, 10, 11});
  checkAccumulating(cache, 0.9, {0, 3, 6, 9, 10, 11}, {0, 3, 6, 10, 11, 12},
                    inputValues(in, {0, 3, 6, 9, 10, 11}));
}

//===----------------------------------------------------------------------===//
// TOVA: the last query, averaged over every head of the layer
//===----------------------------------------------------------------------===//

// Two kv-heads, one query head each, n = 8, budget 6. Keys (channel 0):
// both heads -2 at 0 and 3 (logit -4 under the last query (4,0,0,0)); head
// 0 +2 at 2, head 1 +2 at 5 (logit +4); 0 elsewhere. Both heads' softmax
// normalizer is Z = e^4 + 5 + 2e^-4, so the layer score (mean of the two
// heads) is e^-4/Z at 0 and 3, (e^4 + 1)/(2Z) at 2 and 5, 1/Z elsewhere: 0
// and 3 go, in both heads. The earlier prompt queries (-4,0,0,0) favour 0
// and 3, which TOVA ignores.
TEST(TOVA, KeepsWhatTheLastQueryAttendsInEveryHeadAndEvictsOnePerStep) {
  Cache cache(KVC_API(tova));
  const int n = 8;
  Rows q(n, 2, 4), k(n, 2, 4), v(n, 2, 4);
  for (int t = 0; t < n; ++t) {
    q.setAll(t, {t == n - 1 ? 4.0f : -4.0f, 0, 0, 0});
    for (int h = 0; h < 2; ++h)
      v.set(t, h, {float(t), float(h), 1, -1});
  }
  for (int h = 0; h < 2; ++h) {
    k.set(0, h, {-2, 0, 0, 0});
    k.set(3, h, {-2, 0, 0, 0});
  }
  k.set(2, 0, {2, 0, 0, 0});
  k.set(5, 1, {2, 0, 0, 0});
  ASSERT_EQ(cache.prefill(0, q, k, v), KVC_STATUS_OK) << kvc_last_error();
  for (int h = 0; h < 2; ++h) {
    EXPECT_EQ(cache.kept(0, h), (Kept{1, 2, 4, 5, 6, 7})) << "head " << h;
    expectExact(cache, 0, h, k, v, {1, 2, 4, 5, 6, 7});
  }

  // Step at 8 (zero keys): head 0's query (-4,0,0,0) gives 2 the logit -4,
  // head 1's (4,0,0,0) gives 5 the logit +4. Layer score of 2:
  // (e^-4/(e^-4+6) + 1/(e^4+6))/2 = 0.0015, the lowest (the others get at
  // least (1/(e^-4+6) + 1/(e^4+6))/2 = 0.088): 2 goes from both heads.
  Rows dq(1, 2, 4), dk(1, 2, 4), dv(1, 2, 4);
  dq.set(0, 0, {-4, 0, 0, 0});
  dq.set(0, 1, {4, 0, 0, 0});
  ASSERT_EQ(cache.decode(0, dq, dk, dv, 8), KVC_STATUS_OK) << kvc_last_error();
  for (int h = 0; h < 2; ++h)
    EXPECT_EQ(cache.kept(0, h), (Kept{1, 4, 5, 6, 7, 8})) << "head " << h;

  // Step at 9 with zero queries: every entry gets 1/7 in every head, an
  // exact tie, which `tie recent` breaks against the oldest (1).
  Rows zq(1, 2, 4);
  ASSERT_EQ(cache.decode(0, zq, dk, dv, 9), KVC_STATUS_OK) << kvc_last_error();
  for (int h = 0; h < 2; ++h)
    EXPECT_EQ(cache.kept(0, h), (Kept{4, 5, 6, 7, 8, 9})) << "head " << h;
}

//===----------------------------------------------------------------------===//
// SnapKV family: the observation window
//===----------------------------------------------------------------------===//

// The SnapKV input (n = 12, window w = 4: queries 8..11, prefix 0..7):
// window queries of head 0 are (4,0,0,0); key 3 is (3,0,0,0) (logit 6,
// E = e^6), every other key has channel 0 = 0. Query head 1 is zero. For
// window query t, head 0 gives E/(E+t) to 3 and 1/(E+t) to the others:
//   a_T = 1/4 sum_{t=8..11} E/(E+t),  a_o = 1/4 sum 1/(E+t),
//   a_u = 1/4 (1/9 + 1/10 + 1/11 + 1/12) (head 1, every prefix entry).
// Average pooling, kernel 3, zero padding (window entries count 0):
//   head 0: 2,3,4 -> (a_T + 2a_o)/3; 1,5,6 -> a_o; 0,7 -> 2a_o/3
//   head 1: 1..6 -> a_u; 0,7 -> 2a_u/3
// Budget 7 = the 4 window entries + the 3 best: {2,3,4}.
struct SnapInput {
  Rows q{12, 2, 4}, k{12, 1, 4}, v{12, 1, 4};
  SnapInput() {
    for (int t = 0; t < 12; ++t) {
      // Before the window, head 0 looks at channel 3 instead.
      q.set(t, 0, t >= 8 ? Vec{4, 0, 0, 0} : Vec{0, 0, 0, 4});
      v.set(t, 0, {float(t), -1, 0.5f, 2});
    }
    k.set(3, 0, {3, 0, 0, 0});
  }
};

TEST(SnapKV, KeepsWhatTheObservationWindowAttendsTo) {
  Cache cache(KVC_API(snapkv));
  SnapInput in;
  // Entry 6 is what the early queries attend to (key (0,0,0,3) meets their
  // (0,0,0,4)); the window does not look at it, so SnapKV drops it.
  in.k.set(6, 0, {0, 0, 0, 3});
  ASSERT_EQ(cache.prefill(0, in.q, in.k, in.v), KVC_STATUS_OK)
      << kvc_last_error();
  EXPECT_EQ(cache.kept(0, 0), (Kept{2, 3, 4, 8, 9, 10, 11}));
  expectExact(cache, 0, 0, in.k, in.v, {2, 3, 4, 8, 9, 10, 11});
  // No eviction at decode: the cache grows.
  Rows dq(1, 2, 4), dk(1, 1, 4), dv(1, 1, 4);
  ASSERT_EQ(cache.decode(0, dq, dk, dv, 12), KVC_STATUS_OK) << kvc_last_error();
  EXPECT_EQ(cache.kept(0, 0), (Kept{2, 3, 4, 8, 9, 10, 11, 12}));
}

// Max pooling: key 1 is (3,0,0,0) (logit 6), key 5 is (2,0,0,0) (logit 4).
// Head 0's window means a1 on 1, a2 on 5, a_o elsewhere (a1 > a2 > a_o).
// Max pooling of kernel 3 copies a1 to {0,1,2} and a2 to {4,5,6}, a_o to 3
// and 7; head 1 (uniform) is a_u everywhere. Budget 8 = 4 window + 4: {0,1,2}
// and one of {4,5,6}, whose scores are the same number (a copy of a2 plus
// a_u): the tie goes to the most recent, 6.
TEST(SnapKVMaxPool, MaxPoolingSpreadsThePeakAndTiesGoToTheRecent) {
  Cache cache(KVC_API(snapkv_maxpool));
  SnapInput in;
  in.k.set(3, 0, {0, 0, 0, 0});
  in.k.set(1, 0, {3, 0, 0, 0});
  in.k.set(5, 0, {2, 0, 0, 0});
  ASSERT_EQ(cache.prefill(0, in.q, in.k, in.v), KVC_STATUS_OK)
      << kvc_last_error();
  EXPECT_EQ(cache.kept(0, 0), (Kept{0, 1, 2, 6, 8, 9, 10, 11}));
  expectExact(cache, 0, 0, in.k, in.v, {0, 1, 2, 6, 8, 9, 10, 11});
}

// PyramidKV, 2 layers, n = 20 (window 16..19, prefix 0..15), C = 12,
// W = 4, beta = 4: min = (C-W)//beta = 2, max = 2(C-W) - min = 14 (< L-W =
// 16, no clamp), step = (14-2)//1 = 12: layer 0 selects 14 (keeps 18),
// layer 1 selects 2 (keeps 6). L = 20 >= 2(C-W) = 16: the pyramid branch.
// Input (both layers): head 0 window queries (4,0,0,0); keys 0,1,2 are
// (-2,0,0,0) (logit -4), key 10 is (3,0,0,0) (logit 6), others 0; head 1
// uniform. Max pooling (kernel 3): 0 and 1 see only negative keys (lowest),
// 9,10,11 copy the peak, the rest a_o.
TEST(PyramidKV, LayerBudgetsShrinkWithDepth) {
  Cache cache(KVC_API(pyramidkv));
  const int n = 20;
  Rows q(n, 2, 4), k(n, 1, 4), v(n, 1, 4);
  for (int t = 0; t < n; ++t) {
    q.set(t, 0, {4, 0, 0, 0});
    v.set(t, 0, {float(t), 0, 1, 0});
  }
  for (int i : {0, 1, 2})
    k.set(i, 0, {-2, 0, 0, 0});
  k.set(10, 0, {3, 0, 0, 0});
  for (int layer = 0; layer < 2; ++layer)
    ASSERT_EQ(cache.prefill(layer, q, k, v), KVC_STATUS_OK)
        << kvc_last_error();
  // Layer 0 drops the two lowest, 0 and 1.
  Kept layer0;
  for (int i = 2; i < n; ++i)
    layer0.push_back(i);
  EXPECT_EQ(cache.kept(0, 0), layer0);
  // Layer 1 keeps 2 of the plateau {9,10,11} (equal scores): the recent 10,
  // 11.
  EXPECT_EQ(cache.kept(1, 0), (Kept{10, 11, 16, 17, 18, 19}));
  expectExact(cache, 1, 0, k, v, {10, 11, 16, 17, 18, 19});
}

// AdaKV, 2 kv-heads (one query head each), n = 16 (window 12..15, prefix
// 0..11), C = 10: each head first keeps its floor(0.2 * 10) = 2 best (window
// entries, +inf), then the layer's 20 - 4 = 16 remaining slots go to the
// best remaining scores of either head: the 4 other window entries, then
//   head 0 (query (4,0,0,0), key 0 = (3,0,0,0)): pooled (a_T + a_o)/3 at 0,
//     (a_T + 2a_o)/3 at 1 (~0.33), ~a_o (~0.002) elsewhere;
//   head 1 (uniform, a_u ~ 0.074): a_u at 1..10, 2a_u/3 at 0 and 11.
// 4 + 2 + 10 = 16: head 0 keeps {0,1} + window (6 entries), head 1 keeps
// {1..10} + window (14): concentrated heads give budget to dispersed ones.
TEST(AdaKV, MovesBudgetFromConcentratedToDispersedHeads) {
  Cache cache(KVC_API(adakv));
  const int n = 16;
  Rows q(n, 2, 4), k(n, 2, 4), v(n, 2, 4);
  for (int t = 0; t < n; ++t) {
    q.set(t, 0, {4, 0, 0, 0});
    for (int h = 0; h < 2; ++h)
      v.set(t, h, {float(t), float(h), 0, 0});
  }
  k.set(0, 0, {3, 0, 0, 0});
  ASSERT_EQ(cache.prefill(0, q, k, v), KVC_STATUS_OK) << kvc_last_error();
  EXPECT_EQ(cache.kept(0, 0), (Kept{0, 1, 12, 13, 14, 15}));
  EXPECT_EQ(cache.kept(0, 1),
            (Kept{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 12, 13, 14, 15}));
  expectExact(cache, 0, 0, k, v, cache.kept(0, 0));
  expectExact(cache, 0, 1, k, v, cache.kept(0, 1));
}

// PyramidKV + AdaKV: the pyramid gives 18 (layer 0) and 6 (layer 1) per
// head (see PyramidKV above), AdaKV splits 36 and 12 between 2 heads.
// Head 0: keys 0 and 15 are (3,0,0,0) (logit 6), 5..10 are (-2,0,0,0)
// (logit -4). Max pooling (kernel 3): a_T at {0,1,14,15}, a_neg at
// {6,7,8,9} (every neighbour negative), a_o at the 8 others. Head 1 is
// uniform: a_u (~0.055) at all 16, between a_T (~0.5) and a_o (~0.001).
//   Layer 1: 1 per head first (window), then 10 = 6 window + 4: head 0's
//     {0,1,14,15}. Head 0 keeps 8, head 1 only its window (4).
//   Layer 0: 3 per head first, then 30 = 2 window + 4 (head 0's a_T) + 16
//     (head 1's a_u) + 8 (head 0's a_o): head 0 drops {6,7,8,9} (16 kept),
//     head 1 keeps all 20.
TEST(PyramidKVAdaKV, PyramidLayerBudgetsSplitAdaptivelyBetweenHeads) {
  Cache cache(KVC_API(pyramidkv_adakv));
  const int n = 20;
  Rows q(n, 2, 4), k(n, 2, 4), v(n, 2, 4);
  for (int t = 0; t < n; ++t) {
    q.set(t, 0, {4, 0, 0, 0});
    for (int h = 0; h < 2; ++h)
      v.set(t, h, {float(t), float(h), 0, 0});
  }
  k.set(0, 0, {3, 0, 0, 0});
  k.set(15, 0, {3, 0, 0, 0});
  for (int i = 5; i <= 10; ++i)
    k.set(i, 0, {-2, 0, 0, 0});
  for (int layer = 0; layer < 2; ++layer)
    ASSERT_EQ(cache.prefill(layer, q, k, v), KVC_STATUS_OK)
        << kvc_last_error();
  EXPECT_EQ(cache.kept(0, 0),
            (Kept{0, 1, 2, 3, 4, 5, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19}));
  Kept all;
  for (int i = 0; i < n; ++i)
    all.push_back(i);
  EXPECT_EQ(cache.kept(0, 1), all);
  EXPECT_EQ(cache.kept(1, 0), (Kept{0, 1, 14, 15, 16, 17, 18, 19}));
  EXPECT_EQ(cache.kept(1, 1), (Kept{16, 17, 18, 19}));
  expectExact(cache, 1, 0, k, v, cache.kept(1, 0));
}

//===----------------------------------------------------------------------===//
// Key and value geometry: Knorm, KeyDiff, value-aware
//===----------------------------------------------------------------------===//

// Knorm keeps the 5 lowest key norms. Norms (Pythagorean keys):
//   0: (3,4,0,0) 5   1: (1,0,0,0) 1   2: (0,0,6,8) 10   3: (2,0,0,0) 2
//   4: (0,0,0,7) 7   5: (0,0,0,3) 3   6: (2,4,4,0) 6    7: (4,0,0,0) 4
// Lowest five: 1, 3, 5, 7, 0.
TEST(Knorm, KeepsTheLowestKeyNorms) {
  Cache cache(KVC_API(knorm));
  const std::vector<Vec> keys = {{3, 4, 0, 0}, {1, 0, 0, 0}, {0, 0, 6, 8},
                                 {2, 0, 0, 0}, {0, 0, 0, 7}, {0, 0, 0, 3},
                                 {2, 4, 4, 0}, {4, 0, 0, 0}};
  Rows q(8, 2, 4), k(8, 1, 4), v(8, 1, 4);
  for (int t = 0; t < 8; ++t) {
    q.setAll(t, {1, 1, 1, 1});
    k.set(t, 0, keys[t]);
    v.set(t, 0, {float(t), 2, -3, 0.125f});
  }
  ASSERT_EQ(cache.prefill(0, q, k, v), KVC_STATUS_OK) << kvc_last_error();
  EXPECT_EQ(cache.kept(0, 0), (Kept{0, 1, 3, 5, 7}));
  expectExact(cache, 0, 0, k, v, {0, 1, 3, 5, 7});
  Rows dq(1, 2, 4), dk(1, 1, 4), dv(1, 1, 4);
  dk.set(0, 0, {9, 9, 9, 9});
  ASSERT_EQ(cache.decode(0, dq, dk, dv, 8), KVC_STATUS_OK) << kvc_last_error();
  EXPECT_EQ(cache.kept(0, 0), (Kept{0, 1, 3, 5, 7, 8})) << "after_prefill only";
}

// KeyDiff: 5 keys along e0 (0,1,3,5,7: norms 1..5), 2 along e1 (4: 2,
// 6: 0.5), the outlier 2 along e2 (norm 9, which Knorm would drop). Mean of
// unit keys m = (5 e0 + 2 e1 + e2)/8, |8m| = sqrt(30): score -cos = -5/sqrt30
// (e0), -2/sqrt30 (e1), -1/sqrt30 (outlier). Budget 3: {2, 4, 6}.
TEST(KeyDiff, KeepsTheOutlierKeyAndTheLeastTypical) {
  Cache cache(KVC_API(keydiff));
  const std::vector<Vec> keys = {e(0, 1), e(0, 2), e(2, 9),   e(0, 3),
                                 e(1, 2), e(0, 4), e(1, 0.5f), e(0, 5)};
  Rows q(8, 2, 4), k(8, 1, 4), v(8, 1, 4);
  for (int t = 0; t < 8; ++t) {
    q.setAll(t, {1, 0, 0, 0});
    k.set(t, 0, keys[t]);
    v.set(t, 0, {float(t), 0, 0, 1});
  }
  ASSERT_EQ(cache.prefill(0, q, k, v), KVC_STATUS_OK) << kvc_last_error();
  EXPECT_EQ(cache.kept(0, 0), (Kept{2, 4, 6}));
  expectExact(cache, 0, 0, k, v, {2, 4, 6});
}

// Value-aware: zero queries, so both heads are uniform and the accumulated
// attention of entry i over the 8 prompt queries is s_i = sum_{t=i}^{7}
// 1/(t+1) = H_8 - H_i (H_8 = 761/280): 2.7179, 1.7179, 1.2179, 0.8845,
// 0.6345, 0.4345 for i = 0..5. Value L1 norms 0.1, 1, 1, 1, 2, 1 give the
// products 0.2718, 1.7179, 1.2179, 0.8845, 1.2690, 0.4345. 6 and 7 are
// protected; the 3 best of 0..5 are 1, 4, 2. Entry 0, the most attended,
// goes because its value is tiny.
TEST(ValueAware, ValueNormReordersAttention) {
  Cache cache(KVC_API(value_aware));
  const std::vector<Vec> values = {
      {0.1f, 0, 0, 0}, {0.25f, -0.25f, 0.25f, -0.25f}, {0, 1, 0, 0},
      {0, 0, -1, 0},   {1, 0, 0, -1},                  {0, 0, 0, 1},
      {3, 3, 3, 3},    {-1, 2, 0, 0}};
  Rows q(8, 2, 4), k(8, 1, 4), v(8, 1, 4);
  for (int t = 0; t < 8; ++t) {
    k.set(t, 0, {float(t), 1, 0, 0});
    v.set(t, 0, values[t]);
  }
  ASSERT_EQ(cache.prefill(0, q, k, v), KVC_STATUS_OK) << kvc_last_error();
  EXPECT_EQ(cache.kept(0, 0), (Kept{1, 2, 4, 6, 7}));
  expectExact(cache, 0, 0, k, v, {1, 2, 4, 6, 7});
  // The carried state is the accumulated attention H_8 - H_i.
  auto harmonic = [](int m) {
    double h = 0;
    for (int j = 1; j <= m; ++j)
      h += 1.0 / j;
    return h;
  };
  for (int i : {1, 2, 4, 6, 7})
    EXPECT_NEAR(cache.score(0, 0, i), harmonic(8) - harmonic(i), 1e-5)
        << "state of " << i;
}

//===----------------------------------------------------------------------===//
// Storage: int8, fp8, KIVI
//===----------------------------------------------------------------------===//

// int8 per token: s = max|x| / 127, q = rne(x / s).
//   key 0 (63.5, -1.3, 2.3, 0.7): s = 0.5; x/s = 127, -2.6, 4.6, 1.4 ->
//     127, -3, 5, 1 -> (63.5, -1.5, 2.5, 0.5).
//   key 1 (-127, 0.4, 50.2, 1): s = 1 -> (-127, 0, 50, 1).
//   value 0 zero: scale 0, stays 0.
//   value 1 (1, -0.49, 0.25, 0.126): s = 1/127; x/s = 127, -62.23, 31.75,
//     16.002 -> (1, -62/127, 32/127, 16/127).
TEST(Int8, StoresSymmetricPerTokenCodes) {
  Cache cache(KVC_API(int8));
  Rows q(2, 2, 4), k(2, 1, 4), v(2, 1, 4);
  k.set(0, 0, {63.5f, -1.3f, 2.3f, 0.7f});
  k.set(1, 0, {-127, 0.4f, 50.2f, 1});
  v.set(1, 0, {1, -0.49f, 0.25f, 0.126f});
  ASSERT_EQ(cache.prefill(0, q, k, v), KVC_STATUS_OK) << kvc_last_error();
  EXPECT_EQ(cache.kept(0, 0), (Kept{0, 1}));
  expectRow(cache.key(0, 0, 0), {63.5, -1.5, 2.5, 0.5}, 1e-6, "key", 0);
  expectRow(cache.key(0, 0, 1), {-127, 0, 50, 1}, 1e-5, "key", 1);
  expectRow(cache.value(0, 0, 0), {0, 0, 0, 0}, 0, "value", 0);
  expectRow(cache.value(0, 0, 1), {1, -62.0 / 127, 32.0 / 127, 16.0 / 127},
            1e-6, "value", 1);
  EXPECT_EQ(cache.keyFormat(0, 0, 0), KVC_FORMAT_INT8);
  // The error bound s/2 on every element.
  for (int t = 0; t < 2; ++t)
    for (bool isKey : {true, false}) {
      Vec x = isKey ? k.row(t, 0) : v.row(t, 0);
      Vec got = isKey ? cache.key(0, 0, t) : cache.value(0, 0, t);
      float amax = 0;
      for (float a : x)
        amax = std::max(amax, std::fabs(a));
      for (int c = 0; c < 4; ++c)
        EXPECT_LE(std::fabs(got[c] - x[c]), amax / 127 / 2 + 1e-6);
    }
  // A decode entry is stored in the same format: (10,0,0,0) -> s = 10/127.
  Rows dq(1, 2, 4), dk(1, 1, 4), dv(1, 1, 4);
  dk.set(0, 0, {10, 0, 0, 0});
  dv.set(0, 0, {0, 0, -4, 0});
  ASSERT_EQ(cache.decode(0, dq, dk, dv, 2), KVC_STATUS_OK) << kvc_last_error();
  expectRow(cache.key(0, 0, 2), {10, 0, 0, 0}, 1e-5, "key", 2);
  expectRow(cache.value(0, 0, 2), {0, 0, -4, 0}, 1e-5, "value", 2);
}

// fp8 e4m3 per token: s = max|x| / 448, q = e4m3(x / s) (3 mantissa bits).
//   key 0 (7, 1, 1.1, -0.3): s = 1/64; x/s = 448, 64, 70.4, -19.2. In
//     [64,128) codes are 8 apart: 70.4 -> 72 (1.125); in [16,32) 2 apart:
//     -19.2 -> -20 (-0.3125).
//   key 1 (0.01, -7, 0, 3): s = 1/64; 0.64 in [0.5,1), 1/16 apart ->
//     0.625 (0.009765625); -448; 0; 192 = 1.5 * 2^7 exact.
//   value 0 (-14, 3.3, 0.2, 14): s = 1/32; -448, 105.6 -> 104 (3.25),
//     6.4 in [4,8), 0.5 apart -> 6.5 (0.203125), 448.
//   value 1 zero: stays 0.
TEST(Fp8, StoresE4M3PerTokenCodes) {
  Cache cache(KVC_API(fp8));
  Rows q(2, 2, 4), k(2, 1, 4), v(2, 1, 4);
  k.set(0, 0, {7, 1, 1.1f, -0.3f});
  k.set(1, 0, {0.01f, -7, 0, 3});
  v.set(0, 0, {-14, 3.3f, 0.2f, 14});
  ASSERT_EQ(cache.prefill(0, q, k, v), KVC_STATUS_OK) << kvc_last_error();
  expectRow(cache.key(0, 0, 0), {7, 1, 1.125, -0.3125}, 1e-6, "key", 0);
  expectRow(cache.key(0, 0, 1), {0.009765625, -7, 0, 3}, 1e-6, "key", 1);
  expectRow(cache.value(0, 0, 0), {-14, 3.25, 0.203125, 14}, 1e-6, "value",
            0);
  expectRow(cache.value(0, 0, 1), {0, 0, 0, 0}, 0, "value", 1);
  EXPECT_EQ(cache.valueFormat(0, 0, 0), KVC_FORMAT_FP8_E4M3);
  // Decode: (0.5, 0.25, -0.125, 1): s = 1/448, codes 224, 112, -56, 448,
  // all exact in e4m3.
  Rows dq(1, 2, 4), dk(1, 1, 4), dv(1, 1, 4);
  dk.set(0, 0, {0.5f, 0.25f, -0.125f, 1});
  ASSERT_EQ(cache.decode(0, dq, dk, dv, 2), KVC_STATUS_OK) << kvc_last_error();
  expectRow(cache.key(0, 0, 2), {0.5, 0.25, -0.125, 1}, 1e-6, "key", 2);
}

/// KIVI's analytic bound: every element of a quantized group is within
/// (max - min) / (2^b - 1) / 2 of its input.
void expectKiviBound(const Vec &got, const Vec &input, double lo, double hi,
                     int bits, const char *what, int position, int c) {
  // Half a step of the stored scale: the range over 2^bits - 1, widened
  // by the f16 roundings of min (down) and scale (up), 2^-10 each.
  const double widen = std::ldexp(1.0, -10);
  const double range = hi - lo + std::max(std::fabs(lo), std::fabs(hi)) * widen;
  EXPECT_LE(std::fabs(got[c] - input[c]),
            range / ((1 << bits) - 1) * (1.0 + widen) / 2 + 1e-6)
      << what << " of position " << position << " channel " << c;
}

// KIVI-2, G = 4, R = 8, d = 8, n = 12. Keys: once 8 unflushed keys exist
// they are quantized per channel over blocks of 4 tokens ({0..3}, {4..7});
// 8..11 stay full. Values: an entry's value is quantized when the 8th newer
// entry arrives, so values 0..3 are quantized, 4..11 are full. 2 bits:
// scale = (max - min) / 3, code = rne((x - min) / scale); min and scale
// are stored as f16 (min rounded down, scale up), which every min and
// scale below is exactly.
TEST(Kivi2, QuantizesKeysPerChannelAndValuesPerTokenOutsideTheResidual) {
  Cache cache(KVC_API(kivi2), 8);
  const int n = 12;
  Rows q(n, 2, 8), k(n, 1, 8), v(n, 1, 8);
  // Block {0..3}, per channel: c0 {0,1,2,3}, c2 {4..7}, c3 {-1..-4}, c7
  // {5,5,5,8}: min + scale 1, exact. c1, c5, c6 constant: scale 0, the min.
  // c4 {0.4, 1.6, 3, 0}: min 0, scale 1, codes 0, 2, 3, 0.
  k.set(0, 0, {0, 1, 4, -1, 0.4f, 2, 0, 5});
  k.set(1, 0, {1, 1, 5, -2, 1.6f, 2, 0, 5});
  k.set(2, 0, {2, 1, 6, -3, 3, 2, 0, 5});
  k.set(3, 0, {3, 1, 7, -4, 0, 2, 0, 8});
  // Block {4..7}: c0 {0,3,0,0} exact; c4 {2.4,0,0,6}: scale 2, 2.4 -> code
  // rne(1.2) = 1 -> 2.
  k.set(4, 0, {0, 0, 0, 0, 2.4f, 0, 0, 0});
  k.set(5, 0, {3, 0, 0, 0, 0, 0, 0, 0});
  k.set(7, 0, {0, 0, 0, 0, 6, 0, 0, 0});
  // Keys 8..11: c0 = t - 8, c1 {0.5, 1.4, 0.5, 3.5} (quantized later).
  for (int t = 8; t < 12; ++t)
    k.set(t, 0, {float(t - 8), t == 9 ? 1.4f : t == 11 ? 3.5f : 0.5f, 0, 0,
                 0, 0, 0, 0.125f * t});
  // Values, groups of 4 channels:
  //   0: (0,1,2,3 | 10,10,10,10) exact.
  //   1: (0.5,0.75,3.5,2.25 | -3,0.5,3,1): g0 min 0.5 scale 1, codes
  //      0,0,3,2 -> 0.5,0.5,3.5,2.5; g1 min -3 scale 2, codes 0,2,3,2 ->
  //      -3,1,3,1.
  //   2: constant groups, exact.
  //   3: (-1,0,2,0.9 | 7,4.2,1,5.5): g0 min -1 scale 1 -> -1,0,2,1; g1 min
  //      1 scale 2, codes 3,2,0,2 -> 7,5,1,5.
  //   4: (0,3,1.2,2 | 5,5,5,5), quantized after the first decode step:
  //      0,3,1,2 | 5,5,5,5.
  v.set(0, 0, {0, 1, 2, 3, 10, 10, 10, 10});
  v.set(1, 0, {0.5f, 0.75f, 3.5f, 2.25f, -3, 0.5f, 3, 1});
  v.set(2, 0, {1, 1, 1, 1, 0, 0, 0, 0});
  v.set(3, 0, {-1, 0, 2, 0.9f, 7, 4.2f, 1, 5.5f});
  v.set(4, 0, {0, 3, 1.2f, 2, 5, 5, 5, 5});
  v.set(5, 0, {0, 1, 2, 3, 0, 1, 2, 3});
  v.set(6, 0, {3, 2, 1, 0, -3, -2, -1, 0});
  v.set(7, 0, {1, 1, 1, 1, 1, 1, 1, 1});
  for (int t = 8; t < 12; ++t)
    v.set(t, 0, {0.3f * t, -0.1f, 0.7f, 1, 2, 3, 4, 5});
  ASSERT_EQ(cache.prefill(0, q, k, v), KVC_STATUS_OK) << kvc_last_error();
  EXPECT_EQ(cache.kept(0, 0).size(), 12u);

  const std::vector<std::vector<double>> keys = {
      {0, 1, 4, -1, 0, 2, 0, 5}, {1, 1, 5, -2, 2, 2, 0, 5},
      {2, 1, 6, -3, 3, 2, 0, 5}, {3, 1, 7, -4, 0, 2, 0, 8},
      {0, 0, 0, 0, 2, 0, 0, 0},  {3, 0, 0, 0, 0, 0, 0, 0},
      {0, 0, 0, 0, 0, 0, 0, 0},  {0, 0, 0, 0, 6, 0, 0, 0}};
  for (int t = 0; t < 8; ++t) {
    expectRow(cache.key(0, 0, t), keys[t], 1e-6, "key", t);
    EXPECT_EQ(cache.keyFormat(0, 0, t), KVC_FORMAT_KIVI_INT2) << t;
  }
  for (int t = 8; t < 12; ++t) {
    EXPECT_EQ(cache.key(0, 0, t), k.row(t, 0)) << "full key " << t;
    EXPECT_EQ(cache.keyFormat(0, 0, t), KVC_FORMAT_FULL) << t;
  }
  const std::vector<std::vector<double>> values = {
      {0, 1, 2, 3, 10, 10, 10, 10},
      {0.5, 0.5, 3.5, 2.5, -3, 1, 3, 1},
      {1, 1, 1, 1, 0, 0, 0, 0},
      {-1, 0, 2, 1, 7, 5, 1, 5}};
  for (int t = 0; t < 4; ++t) {
    expectRow(cache.value(0, 0, t), values[t], 1e-6, "value", t);
    EXPECT_EQ(cache.valueFormat(0, 0, t), KVC_FORMAT_KIVI_INT2) << t;
  }
  for (int t = 4; t < 12; ++t) {
    EXPECT_EQ(cache.value(0, 0, t), v.row(t, 0)) << "full value " << t;
    EXPECT_EQ(cache.valueFormat(0, 0, t), KVC_FORMAT_FULL) << t;
  }
  // The bound, on every quantized element: keys per channel of a block,
  // values per group of 4 channels.
  for (int t = 0; t < 8; ++t) {
    Vec got = cache.key(0, 0, t);
    for (int c = 0; c < 8; ++c) {
      double lo = INFINITY, hi = -INFINITY;
      for (int u = t / 4 * 4; u < t / 4 * 4 + 4; ++u) {
        lo = std::min<double>(lo, k.row(u, 0)[c]);
        hi = std::max<double>(hi, k.row(u, 0)[c]);
      }
      expectKiviBound(got, k.row(t, 0), lo, hi, 2, "key", t, c);
    }
  }
  for (int t = 0; t < 4; ++t) {
    Vec got = cache.value(0, 0, t), x = v.row(t, 0);
    for (int c = 0; c < 8; ++c) {
      auto g = x.begin() + c / 4 * 4;
      expectKiviBound(got, x, *std::min_element(g, g + 4),
                      *std::max_element(g, g + 4), 2, "value", t, c);
    }
  }

  // Decode 12..15. At 12 the value of 4 (8 entries older) is quantized;
  // at 15 the 8 unflushed keys 8..15 are quantized as blocks {8..11} and
  // {12..15}, and the values of 5, 6, 7 (on the grid: exact) too.
  //   block {8..11}: c0 {0,1,2,3} exact; c1 {0.5,1.4,0.5,3.5}: min 0.5,
  //     scale 1, 1.4 -> code 1 -> 1.5; c7 {1,1.125,1.25,1.375}: min 1,
  //     scale 0.125, all on the grid.
  //   block {12..15}: c2 = t - 12 exact, c0 {0,1.5,0,0}: min 0, scale
  //     0.5, code 3 -> 1.5.
  for (int t = 12; t < 16; ++t) {
    Rows dq(1, 2, 8), dk(1, 1, 8), dv(1, 1, 8);
    dk.set(0, 0, {t == 13 ? 1.5f : 0.0f, 0, float(t - 12), 0, 0, 0, 0, 0});
    dv.set(0, 0, {float(t), 0, 0, 0, 1, 1, 1, 1});
    ASSERT_EQ(cache.decode(0, dq, dk, dv, t), KVC_STATUS_OK)
        << kvc_last_error();
    if (t == 12) {
      expectRow(cache.value(0, 0, 4), {0, 3, 1, 2, 5, 5, 5, 5}, 1e-6,
                "value", 4);
      EXPECT_EQ(cache.valueFormat(0, 0, 5), KVC_FORMAT_FULL);
      EXPECT_EQ(cache.keyFormat(0, 0, 12), KVC_FORMAT_FULL);
    }
  }
  EXPECT_EQ(cache.kept(0, 0).size(), 16u);
  expectRow(cache.key(0, 0, 9), {1, 1.5, 0, 0, 0, 0, 0, 1.125}, 1e-6, "key",
            9);
  expectRow(cache.key(0, 0, 11), {3, 3.5, 0, 0, 0, 0, 0, 1.375}, 1e-6, "key",
            11);
  expectRow(cache.key(0, 0, 13), {1.5, 0, 1, 0, 0, 0, 0, 0}, 1e-6, "key", 13);
  for (int t = 8; t < 16; ++t)
    EXPECT_EQ(cache.keyFormat(0, 0, t), KVC_FORMAT_KIVI_INT2) << t;
  for (int t = 5; t < 8; ++t) {
    Vec row = v.row(t, 0);
    expectRow(cache.value(0, 0, t), std::vector<double>(row.begin(), row.end()),
              1e-6, "value", t);
  }
  EXPECT_EQ(cache.valueFormat(0, 0, 7), KVC_FORMAT_KIVI_INT2);
  EXPECT_EQ(cache.valueFormat(0, 0, 8), KVC_FORMAT_FULL);
}

// KIVI-4, G = 4, R = 8, n = 12: keys 0..7 and values 0..3 quantized, scale
// = (max - min) / 15 (every min and scale below an f16, as stored).
//   key block {0..3}: c0 {0,15,7.3,2.6}: min 0, scale 1, codes 0,15,7,3; c2
//     {-1,0.6,2.75,1.2}: min -1, scale 0.25, (x+1)/0.25 = 0, 6.4, 15, 8.8
//     -> 0, 6, 15, 9 -> -1, 0.5, 2.75, 1.25.
//   key block {4..7}: c0 {1,2,3,16}: min 1, scale 1, exact.
//   values: 0 (0,15,7.3,2.6 | 0..) -> (0,15,7,3 | 0..); 1 (-1,0.6,2.75,1.2 |
//     8,8,8,8) -> (-1,0.5,2.75,1.25 | 8..); 2 (0,1.5,2.25,3.75 |
//     4,5.5,6.25,7.75): scale 0.25, codes 0,6,9,15, exact; 3 constant
//     groups.
TEST(Kivi4, QuantizesWithSixteenLevels) {
  Cache cache(KVC_API(kivi4), 8);
  const int n = 12;
  Rows q(n, 2, 8), k(n, 1, 8), v(n, 1, 8);
  const std::vector<Vec> blockKeys = {{0, 1, -1, 0, 0, 0, 0, 0},
                                     {15, 1, 0.6f, 0, 0, 0, 0, 0},
                                     {7.3f, 1, 2.75f, 0, 0, 0, 0, 0},
                                     {2.6f, 1, 1.2f, 0, 0, 0, 0, 0}};
  for (int t = 0; t < 4; ++t)
    k.set(t, 0, blockKeys[t]);
  for (int t = 4; t < 8; ++t)
    k.set(t, 0, {t == 7 ? 16.0f : float(t - 3), 0, 0, 0, 0, 0, 0, 0});
  v.set(0, 0, {0, 15, 7.3f, 2.6f, 0, 0, 0, 0});
  v.set(1, 0, {-1, 0.6f, 2.75f, 1.2f, 8, 8, 8, 8});
  v.set(2, 0, {0, 1.5f, 2.25f, 3.75f, 4, 5.5f, 6.25f, 7.75f});
  v.set(3, 0, {5, 5, 5, 5, -5, -5, -5, -5});
  for (int t = 4; t < n; ++t)
    v.set(t, 0, {float(t), 0.5f, 0, 0, 0, 0, 0, -1});
  ASSERT_EQ(cache.prefill(0, q, k, v), KVC_STATUS_OK) << kvc_last_error();
  const std::vector<std::vector<double>> keys = {{0, 1, -1, 0, 0, 0, 0, 0},
                                                 {15, 1, 0.5, 0, 0, 0, 0, 0},
                                                 {7, 1, 2.75, 0, 0, 0, 0, 0},
                                                 {3, 1, 1.25, 0, 0, 0, 0, 0}};
  for (int t = 0; t < 4; ++t)
    expectRow(cache.key(0, 0, t), keys[t], 1e-5, "key", t);
  for (int t = 4; t < 8; ++t)
    expectRow(cache.key(0, 0, t),
              {t == 7 ? 16.0 : double(t - 3), 0, 0, 0, 0, 0, 0, 0}, 1e-5,
              "key", t);
  const std::vector<std::vector<double>> values = {
      {0, 15, 7, 3, 0, 0, 0, 0},
      {-1, 0.5, 2.75, 1.25, 8, 8, 8, 8},
      {0, 1.5, 2.25, 3.75, 4, 5.5, 6.25, 7.75},
      {5, 5, 5, 5, -5, -5, -5, -5}};
  for (int t = 0; t < 4; ++t) {
    expectRow(cache.value(0, 0, t), values[t], 1e-5, "value", t);
    EXPECT_EQ(cache.valueFormat(0, 0, t), KVC_FORMAT_KIVI_INT4) << t;
  }
  EXPECT_EQ(cache.valueFormat(0, 0, 4), KVC_FORMAT_FULL);
  EXPECT_EQ(cache.keyFormat(0, 0, 7), KVC_FORMAT_KIVI_INT4);
  EXPECT_EQ(cache.keyFormat(0, 0, 8), KVC_FORMAT_FULL);
}

// SnapKV + KIVI-2, n = 16 (window 12..15, prefix 0..11), d = 8 (logit scale
// 1/sqrt(8)). Head 0's window queries (4,0,...) meet key 3 (channel 0 = 3)
// and, weaker, key 8 (channel 0 = 2); head 1 is uniform. Average pooling
// of kernel 3: {2,3,4} get (a1 + 2a_o)/3, {7,8,9} (a2 + 2a_o)/3, the rest
// at most a_o. Budget 10 = 4 window + {2,3,4,7,8,9}. The 10 kept entries
// are written in order: when the 8th arrives, keys 2,3,4,7 | 8,9,12,13 are
// quantized as two blocks; 14, 15 stay full. Values of the first two kept
// (2 and 3) have 8 newer entries and are quantized.
TEST(SnapKVKivi2, EvictsThenQuantizesTheKeptEntries) {
  Cache cache(KVC_API(snapkv_kivi2), 8);
  const int n = 16;
  Rows q(n, 2, 8), k(n, 1, 8), v(n, 1, 8);
  for (int t = 0; t < n; ++t) {
    if (t >= 12)
      q.set(t, 0, {4, 0, 0, 0, 0, 0, 0, 0});
    v.set(t, 0, {float(t), 1, 2, 3, 0, 0, 0, -1});
  }
  // Block {2,3,4,7}: c0 {0,3,0,0} exact, c1 {0,1,2,3} exact, c7
  // {0.4,0,2.9,3}: min 0, scale 1 -> 0,0,3,3.
  k.set(2, 0, {0, 0, 0, 0, 0, 0, 0, 0.4f});
  k.set(3, 0, {3, 1, 0, 0, 0, 0, 0, 0});
  k.set(4, 0, {0, 2, 0, 0, 0, 0, 0, 2.9f});
  k.set(7, 0, {0, 3, 0, 0, 0, 0, 0, 3});
  // Block {8,9,12,13}: c0 {2,0,0,0}: scale 2/3, stored as the f16 above
  // it, 1366/2048 = 0.6669921875; codes 3,0,0,0 -> 2.0009765625,0,0,0;
  // c1 {-1,-1,-1,2}: exact.
  k.set(8, 0, {2, -1, 0, 0, 0, 0, 0, 0});
  k.set(9, 0, {0, -1, 0, 0, 0, 0, 0, 0});
  k.set(12, 0, {0, -1, 0, 0, 0, 0, 0, 0});
  k.set(13, 0, {0, 2, 0, 0, 0, 0, 0, 0});
  k.set(14, 0, {0, 0.3f, 0, 0, 0, 0, 0, 0.7f});
  // Values 2 (0,1,2,3 | 0.2,0,0,1.5): g1 min 0, scale 0.5, 0.2 -> code 0.
  // Value 3 (3,3,3,3 | -1,1,0.2,-0.6): g1 min -1, scale 2/3 stored as
  // 0.6669921875, (x+1)/scale = 0, 2.999, 1.80, 0.60 -> codes 0,3,2,1 ->
  // -1, 1.0009765625, 0.333984375, -0.3330078125.
  v.set(2, 0, {0, 1, 2, 3, 0.2f, 0, 0, 1.5f});
  v.set(3, 0, {3, 3, 3, 3, -1, 1, 0.2f, -0.6f});
  ASSERT_EQ(cache.prefill(0, q, k, v), KVC_STATUS_OK) << kvc_last_error();
  EXPECT_EQ(cache.kept(0, 0), (Kept{2, 3, 4, 7, 8, 9, 12, 13, 14, 15}));
  const std::map<int, std::vector<double>> keys = {
      {2, {0, 0, 0, 0, 0, 0, 0, 0}},  {3, {3, 1, 0, 0, 0, 0, 0, 0}},
      {4, {0, 2, 0, 0, 0, 0, 0, 3}},  {7, {0, 3, 0, 0, 0, 0, 0, 3}},
      {8, {2.0009765625, -1, 0, 0, 0, 0, 0, 0}},
      {9, {0, -1, 0, 0, 0, 0, 0, 0}},
      {12, {0, -1, 0, 0, 0, 0, 0, 0}}, {13, {0, 2, 0, 0, 0, 0, 0, 0}}};
  for (auto &[pos, row] : keys) {
    expectRow(cache.key(0, 0, pos), row, 1e-6, "key", pos);
    EXPECT_EQ(cache.keyFormat(0, 0, pos), KVC_FORMAT_KIVI_INT2) << pos;
  }
  for (int pos : {14, 15}) {
    EXPECT_EQ(cache.key(0, 0, pos), k.row(pos, 0)) << pos;
    EXPECT_EQ(cache.keyFormat(0, 0, pos), KVC_FORMAT_FULL) << pos;
  }
  expectRow(cache.value(0, 0, 2), {0, 1, 2, 3, 0, 0, 0, 1.5}, 1e-6, "value",
            2);
  expectRow(cache.value(0, 0, 3),
            {3, 3, 3, 3, -1, 1.0009765625, 0.333984375, -0.3330078125},
            1e-6, "value", 3);
  for (int pos : {2, 3})
    EXPECT_EQ(cache.valueFormat(0, 0, pos), KVC_FORMAT_KIVI_INT2) << pos;
  for (int pos : {4, 7, 8, 9, 12, 13, 14, 15}) {
    EXPECT_EQ(cache.value(0, 0, pos), v.row(pos, 0)) << pos;
    EXPECT_EQ(cache.valueFormat(0, 0, pos), KVC_FORMAT_FULL) << pos;
  }
}

//===----------------------------------------------------------------------===//
// Merges
//===----------------------------------------------------------------------===//

/// (1 + sum w) v_t' = v_t + sum w v_e, the conservation a merge defines.
void expectConserved(const Vec &merged, double totalWeight,
                     const std::vector<double> &weightedSum, int position) {
  for (size_t c = 0; c < weightedSum.size(); ++c)
    EXPECT_NEAR(totalWeight * merged[c], weightedSum[c], 1e-5)
        << "weighted sum of position " << position << ", channel " << c;
}

// Merge into nearest on the SnapKV selection (kept {2,3,4,8..11}, see
// SnapInput; channel 0 alone meets the queries). Keys (channels 1-3 set the
// cosines): kept 2 (0,2,0,0), 3 (3,0,0,0), 4 (0,0,1,0), 8..11 zero.
//   e0 (0,3,4,0): cos 3/5 with 2, 4/5 with 4 -> 4, sim 0.8.
//   e1 (0,4,0,3): cos 4/5 with 2 -> 2, sim 0.8.
//   e5 (0,0,0,1), e6 (0,-1,0,0): best cos 0 -> weight 0.
//   e7 (0,0,5,0): cos 1 with 4 -> 4, sim 1.
// Weights w = sim * |v_e| / (|v_e| + |v_t|):
//   into 2 (|v_2| = 1): e1 |v| = 3: w = 0.8 * 3/4 = 0.6;
//     v_2' = ((1,0,0,0) + 0.6 (0,3,0,0)) / 1.6 = (0.625, 1.125, 0, 0).
//   into 4 (|v_4| = 2): e0 |v| = 2: w = 0.8 * 2/4 = 0.4; e7 |v| = 6:
//     w = 6/8 = 0.75; v_4' = ((0,0,2,0) + 0.4 (2,0,0,0) + 0.75 (0,0,0,6))
//     / 2.15 = (0.8, 0, 2, 4.5) / 2.15.
TEST(MergeNearest, FoldsEvictedValuesIntoTheMostSimilarKeptEntry) {
  Cache cache(KVC_API(merge_nearest));
  SnapInput in;
  const std::vector<Vec> keys = {{0, 3, 4, 0}, {0, 4, 0, 3}, {0, 2, 0, 0},
                                 {3, 0, 0, 0}, {0, 0, 1, 0}, {0, 0, 0, 1},
                                 {0, -1, 0, 0}, {0, 0, 5, 0}};
  const std::vector<Vec> values = {{2, 0, 0, 0},  {0, 3, 0, 0}, {1, 0, 0, 0},
                                   {0, 0, 0, -1}, {0, 0, 2, 0}, {5, 5, 5, 5},
                                   {-7, 0, 0, 0}, {0, 0, 0, 6}};
  for (int t = 0; t < 8; ++t) {
    in.k.set(t, 0, keys[t]);
    in.v.set(t, 0, values[t]);
  }
  ASSERT_EQ(cache.prefill(0, in.q, in.k, in.v), KVC_STATUS_OK)
      << kvc_last_error();
  EXPECT_EQ(cache.kept(0, 0), (Kept{2, 3, 4, 8, 9, 10, 11}));
  expectRow(cache.value(0, 0, 2), {0.625, 1.125, 0, 0}, 1e-6, "merged value",
            2);
  expectRow(cache.value(0, 0, 4), {0.8 / 2.15, 0, 2 / 2.15, 4.5 / 2.15}, 1e-6,
            "merged value", 4);
  expectConserved(cache.value(0, 0, 2), 1.6, {1, 1.8, 0, 0}, 2);
  expectConserved(cache.value(0, 0, 4), 2.15, {0.8, 0, 2, 4.5}, 4);
  // Keys are never changed; entries that received nothing keep their value.
  for (int p : {2, 3, 4, 8, 9, 10, 11})
    EXPECT_EQ(cache.key(0, 0, p), in.k.row(p, 0)) << p;
  expectExact(cache, 0, 0, in.k, in.v, {3, 8, 9, 10, 11});
}

// H2O + merge: the H2O selection (kept {0,3,6,9,10,11}, see H2OInput) with
// the merge keys. Evicted -> best cosine among kept keys:
//   e1 (0,2,0,0) -> 0 (0,1,0,0), sim 1; e2 (0,0,3,0) -> 9 (0,0,1,0), 1;
//   e5 (0,0,0,2) -> 10 (0,0,0,1), 1 (0.6 with 6 = (4,0,0,3));
//   e7 (0,3,4,0) -> 9, 0.8 (0.6 with 0); e4, e8: best 0 -> weight 0.
// Weights: into 0 (|v_0| = 1): e1 |v| = 3, w = 0.75: v_0' = (1, 2.25, 0, 0)
//   / 1.75 = (4/7, 9/7, 0, 0).
// into 9 (|v_9| = 2): e2 |v| = 2, w = 0.5; e7 |v| = 6, w = 0.8 * 6/8 = 0.6:
//   v_9' = ((0,0,2,0) + 0.5 (0,0,0,2) + 0.6 (6,0,0,0)) / 2.1.
// into 10 (|v_10| = 1): e5 |v| = 1, w = 0.5: v_10' = (0, 1, 0.5, 0) / 1.5.
TEST(H2OMerge, MergesThePromptEvictionsAndEvictsAtDecode) {
  Cache cache(KVC_API(h2o_merge));
  H2OInput in(true);
  ASSERT_EQ(cache.prefill(0, in.q, in.k, in.v), KVC_STATUS_OK)
      << kvc_last_error();
  EXPECT_EQ(cache.kept(0, 0), (Kept{0, 3, 6, 9, 10, 11}));
  expectRow(cache.value(0, 0, 0), {4.0 / 7, 9.0 / 7, 0, 0}, 1e-6,
            "merged value", 0);
  expectRow(cache.value(0, 0, 9), {3.6 / 2.1, 0, 2 / 2.1, 1 / 2.1}, 1e-6,
            "merged value", 9);
  expectRow(cache.value(0, 0, 10), {0, 1 / 1.5, 0.5 / 1.5, 0}, 1e-6,
            "merged value", 10);
  expectConserved(cache.value(0, 0, 9), 2.1, {3.6, 0, 2, 1}, 9);
  expectExact(cache, 0, 0, in.k, in.v, {3, 6, 11});
  for (int p : {0, 9, 10})
    EXPECT_EQ(cache.key(0, 0, p), in.k.row(p, 0)) << p;
  // Decode: as H2O (channel 0 of every light key is 0, so the weights are
  // those of the H2O case): 9 goes. Query head 1 averages the merged values.
  checkAccumulating(cache, 1.0, {3, 6, 11}, {3, 6, 11, 12},
                    {{4.0 / 7, 9.0 / 7, 0, 0},
                     {0, 0, 5, 0},
                     {0, 5, 0, 0},
                     {3.6 / 2.1, 0, 2 / 2.1, 1 / 2.1},
                     {0, 1 / 1.5, 0.5 / 1.5, 0},
                     {1, 1, 1, 1}});
}

// D2O on the same selection and keys. Max similarities of the evicted
// (1, 2, 4, 5, 7, 8): 1, 1, 0, 1, 0.8, 0; tau = 0.5 * 0 + 0.5 * 3.8/6 =
// 0.3167, so 1, 2, 5, 7 merge and 4, 8 are dropped. Weighted means, weight
// e^sim for the merged and e^1 for the kept entry:
//   0 <- 1: k = (k_0 + k_1)/2 = (0,1.5,0,0), v = (v_0 + v_1)/2 = (0.5,1.5,0,0)
//   10 <- 5: k = (0,0,0,1.5), v = (0, 0.5, 0.5, 0)
//   9 <- 2, 7: W = 2e + e^0.8; k = (e k_9 + e k_2 + e^0.8 k_7)/W =
//     (0, 3e^0.8, 4e + 4e^0.8, 0)/W; v = (e v_9 + e v_2 + e^0.8 v_7)/W =
//     (6e^0.8, 0, 2e, 2e)/W.
TEST(D2O, MergesAboveTheAdaptiveThresholdAndEvictsAtDecode) {
  Cache cache(KVC_API(d2o));
  H2OInput in(true);
  ASSERT_EQ(cache.prefill(0, in.q, in.k, in.v), KVC_STATUS_OK)
      << kvc_last_error();
  EXPECT_EQ(cache.kept(0, 0), (Kept{0, 3, 6, 9, 10, 11}));
  const double e1 = std::exp(1.0), e08 = std::exp(0.8), W = 2 * e1 + e08;
  expectRow(cache.key(0, 0, 0), {0, 1.5, 0, 0}, 1e-6, "merged key", 0);
  expectRow(cache.value(0, 0, 0), {0.5, 1.5, 0, 0}, 1e-6, "merged value", 0);
  expectRow(cache.key(0, 0, 10), {0, 0, 0, 1.5}, 1e-6, "merged key", 10);
  expectRow(cache.value(0, 0, 10), {0, 0.5, 0.5, 0}, 1e-6, "merged value",
            10);
  expectRow(cache.key(0, 0, 9), {0, 3 * e08 / W, (4 * e1 + 4 * e08) / W, 0},
            1e-6, "merged key", 9);
  expectRow(cache.value(0, 0, 9), {6 * e08 / W, 0, 2 * e1 / W, 2 * e1 / W},
            1e-6, "merged value", 9);
  expectConserved(cache.value(0, 0, 9), W, {6 * e08, 0, 2 * e1, 2 * e1}, 9);
  // 4 and 8 fall below tau: 11 (their nearest, at similarity 0) is as it
  // was; 3 and 6 received nothing.
  expectExact(cache, 0, 0, in.k, in.v, {3, 6, 11});
  // Decode attends over the merged keys (channel 0 still 0) and values.
  checkAccumulating(cache, 1.0, {3, 6, 11}, {3, 6, 11, 12},
                    {{0.5, 1.5, 0, 0},
                     {0, 0, 5, 0},
                     {0, 5, 0, 0},
                     {6 * e08 / W, 0, 2 * e1 / W, 2 * e1 / W},
                     {0, 0.5, 0.5, 0},
                     {1, 1, 1, 1}});
}

// CaM on the SnapKV selection (kept {2,3,4,8..11}, evicted {0,1,5,6,7}).
// A = the window attention (before pooling) averaged over the group:
// (a_o + a_u)/2 on every evicted entry (none is 3), mean over the observed
// prefix 0..7 Abar = ((a_T + 7a_o)/8 + a_u)/2, so every evicted entry has
// p = clamp((a_o + a_u) / (2 Abar), 0, 1). With E = e^6: a_T = 0.97700,
// a_o = 0.0024217, a_u = 0.096338, Abar = 0.110291, p = 0.44772. Each adds p v_e / 4 to
// the next 4 kept entries after it: 0, 1 -> 2,3,4,8; 5, 6, 7 -> 8,9,10,11.
// With v = (1,1,1,1) on the kept entries and v_0 = (4,0,0,0), v_1 =
// (0,4,0,0), v_5 = (0,0,4,0), v_6 = (0,0,0,4), v_7 = (4,4,4,4):
//   2, 3, 4: (1+p, 1+p, 1, 1); 8: (1+2p, ...); 9, 10, 11: (1+p, 1+p, 1+2p,
//   1+2p). In all, p * sum v_e = 8p per channel is added.
TEST(CaM, MergesEvictedValuesIntoTheFollowingKeptEntries) {
  Cache cache(KVC_API(cam));
  SnapInput in;
  for (int t = 0; t < 12; ++t)
    in.v.set(t, 0, {1, 1, 1, 1});
  in.v.set(0, 0, {4, 0, 0, 0});
  in.v.set(1, 0, {0, 4, 0, 0});
  in.v.set(5, 0, {0, 0, 4, 0});
  in.v.set(6, 0, {0, 0, 0, 4});
  in.v.set(7, 0, {4, 4, 4, 4});
  ASSERT_EQ(cache.prefill(0, in.q, in.k, in.v), KVC_STATUS_OK)
      << kvc_last_error();
  EXPECT_EQ(cache.kept(0, 0), (Kept{2, 3, 4, 8, 9, 10, 11}));
  const double E = std::exp(6.0);
  double aT = 0, aO = 0, aU = 0;
  for (int t = 8; t < 12; ++t) {
    aT += E / (E + t) / 4;
    aO += 1 / (E + t) / 4;
    aU += 1.0 / (t + 1) / 4;
  }
  const double mean = ((aT + 7 * aO) / 8 + aU) / 2;
  const double p = std::clamp((aO + aU) / 2 / mean, 0.0, 1.0);
  EXPECT_NEAR(p, 0.44772, 0.00001);
  for (int pos : {2, 3, 4})
    expectRow(cache.value(0, 0, pos), {1 + p, 1 + p, 1, 1}, 1e-5,
              "merged value", pos);
  expectRow(cache.value(0, 0, 8), {1 + 2 * p, 1 + 2 * p, 1 + 2 * p, 1 + 2 * p},
            1e-5, "merged value", 8);
  for (int pos : {9, 10, 11})
    expectRow(cache.value(0, 0, pos), {1 + p, 1 + p, 1 + 2 * p, 1 + 2 * p},
              1e-5, "merged value", pos);
  // Conservation: the kept values gained p * sum of the evicted values.
  std::vector<double> gained(4, 0.0);
  for (int pos : {2, 3, 4, 8, 9, 10, 11}) {
    Vec got = cache.value(0, 0, pos);
    for (int c = 0; c < 4; ++c)
      gained[c] += got[c] - 1.0;
  }
  for (int c = 0; c < 4; ++c)
    EXPECT_NEAR(gained[c], 8 * p, 1e-5) << "channel " << c;
  for (int pos : {2, 3, 4, 8, 9, 10, 11})
    EXPECT_EQ(cache.key(0, 0, pos), in.k.row(pos, 0)) << pos;
}

//===----------------------------------------------------------------------===//
// Scissorhands: persistence of importance
//===----------------------------------------------------------------------===//

// Threshold 0.1 on the group-mean weight, history 4 steps, recent 2, budget
// 6; n = 10, d = 4, E = e^8. Query head 1 is zero (uniform 1/(t+1)); query
// head 0 is (4,0,0,0) except (0,0,4,0) at t = 2 and (0,4,0,0) at t = 8.
// Keys: 3 and 6 are (4,0,0,0) (heavy hitters), 1 is (0,4,0,0), 0 is
// (0,0,4,0), the rest (0,0,0,1). The history is queries t = 6..9:
//   t = 6, 7, 9: head 0 gives E/(2E+t-1) ~ 0.4992 to 3 and 6; their group
//     mean ~ (0.4992 + 1/(t+1))/2 ~ 0.30 > 0.1. Every other entry gets
//     ~(1/(2E) + 1/(t+1))/2 <= 1/14 < 0.1.
//   t = 8: head 0 gives E/(E+8) ~ 0.9973 to entry 1: mean ~ 0.554 > 0.1;
//     3 and 6 fall to (1/(E+8) + 1/9)/2 ~ 0.056 < 0.1.
// Counts: 3 -> 3 (t = 6, 7, 9), 6 -> 3, 1 -> 1 (t = 8), all others 0;
// entry 0's moment of importance (t = 2) is outside the history. Keep:
// protected 8, 9; then 3, 6, 1; one of the count-0 entries {0,2,4,5,7},
// the most recent (7). Bits (bit a: query 9 - a): 3 and 6 = 0b1101 = 13,
// 1 = 0b0010 = 2.
TEST(Scissorhands, CountsImportantStepsWithinTheHistoryOnly) {
  Cache cache(KVC_API(scissorhands));
  const int n = 10;
  Rows q(n, 2, 4), k(n, 1, 4), v(n, 1, 4);
  for (int t = 0; t < n; ++t) {
    q.set(t, 0, t == 2 ? e(2, 4) : t == 8 ? e(1, 4) : e(0, 4));
    k.set(t, 0, t == 3 || t == 6 ? e(0, 4)
                : t == 1         ? e(1, 4)
                : t == 0         ? e(2, 4)
                                 : e(3));
    v.set(t, 0, {float(t), 1, 0, -1});
  }
  ASSERT_EQ(cache.prefill(0, q, k, v), KVC_STATUS_OK) << kvc_last_error();
  EXPECT_EQ(cache.kept(0, 0), (Kept{1, 3, 6, 7, 8, 9}));
  EXPECT_EQ(cache.history(0, 0, 3), 13u);
  EXPECT_EQ(cache.history(0, 0, 6), 13u);
  EXPECT_EQ(cache.history(0, 0, 1), 2u);
  for (int pos : {7, 8, 9})
    EXPECT_EQ(cache.history(0, 0, pos), 0u) << pos;
  expectExact(cache, 0, 0, k, v, {1, 3, 6, 7, 8, 9});

  // Step at 10: head 0 (4,0,0,0) gives 3 and 6 E/(2E+5) ~ 0.4996, head 1
  // 1/7: mean ~ 0.32 > 0.1; the others ~ 0.0715. History t = 7..10:
  // 3 -> 3, 6 -> 3, 1 -> 1 (t = 8), 7, 8, 9, 10 -> 0. Protected 9, 10; the
  // budget of 6 drops the oldest count-0 entry, 7.
  Rows dq(1, 2, 4), dk(1, 1, 4), dv(1, 1, 4);
  dq.set(0, 0, e(0, 4));
  dk.set(0, 0, e(3));
  dv.set(0, 0, {10, 1, 0, -1});
  ASSERT_EQ(cache.decode(0, dq, dk, dv, 10), KVC_STATUS_OK)
      << kvc_last_error();
  EXPECT_EQ(cache.kept(0, 0), (Kept{1, 3, 6, 8, 9, 10}));
  EXPECT_EQ(cache.history(0, 0, 3), 27u); // 0b11011
  EXPECT_EQ(cache.history(0, 0, 1), 4u);  // 0b00100
  EXPECT_EQ(cache.history(0, 0, 10), 0u);

  // Step at 11: head 0 (0,4,0,0) gives entry 1 E/(E+6) ~ 0.998: mean ~ 0.57;
  // 3 and 6 drop to ~ 0.0716. History t = 8..11: 1 -> 2 (t = 8, 11),
  // 3 -> 2 (t = 9, 10), 6 -> 2, 8..11 -> 0. Protected 10, 11; the oldest
  // count-0 entry, 8, goes.
  dq.set(0, 0, e(1, 4));
  dv.set(0, 0, {11, 1, 0, -1});
  ASSERT_EQ(cache.decode(0, dq, dk, dv, 11), KVC_STATUS_OK)
      << kvc_last_error();
  EXPECT_EQ(cache.kept(0, 0), (Kept{1, 3, 6, 9, 10, 11}));
  EXPECT_EQ(cache.history(0, 0, 1), 9u);  // 0b1001
  EXPECT_EQ(cache.history(0, 0, 3), 54u); // 0b110110
  EXPECT_EQ(cache.history(0, 0, 6), 54u);
  expectExact(cache, 0, 0, k, v, {1, 3, 6, 9});
}

//===----------------------------------------------------------------------===//
// RPC: periodic compression with a selector window
//===----------------------------------------------------------------------===//

// Period 4, selector window 2, recent 2, budget 4; n = 6, d = 4, E = e^8.
// The phase runs after positions p with (p + 1) % 4 == 0 and its window is
// the queries at p % 4 in {2, 3}. Query head 1 is zero (uniform); query
// head 0 alternates (4,0,0,0) (at p % 4 == 2) and (0,4,0,0) (at p % 4 ==
// 3). Keys: 2 is (4,0,0,0), 4 is (0,4,0,0), all others (0,0,0,1).
// Window sum (the score state) after a window with c entries visible to its
// first query and c + 1 to its second:
//   entry 2: (E/(E+c-1) + 1/c)/2 + (1/(E+c) + 1/(c+1))/2
//   entry 4: (1/(E+c-1) + 1/c)/2 + (E/(E+c) + 1/(c+1))/2
//   others:  (1/(E+c-1) + 1/c)/2 + (1/(E+c) + 1/(c+1))/2
// so 2 and 4 are kept with the protected last two positions.
double rpcQuery(int c, bool aligned) {
  const double big = std::exp(8.0);
  return ((aligned ? big : 1.0) / (big + c - 1) + 1.0 / c) / 2;
}

TEST(RPC, CompressesEveryPeriodByTheSelectorWindow) {
  Cache cache(KVC_API(rpc));
  const int n = 6;
  Rows q(n, 2, 4), k(n, 1, 4), v(n, 1, 4);
  for (int t = 0; t < n; ++t) {
    q.set(t, 0, e(0, 4));
    k.set(t, 0, t == 2 ? e(0, 4) : t == 4 ? e(1, 4) : e(3));
    v.set(t, 0, {float(t), 0, 1, 0});
  }
  // No compression at prefill: RPC compresses generated positions.
  ASSERT_EQ(cache.prefill(0, q, k, v), KVC_STATUS_OK) << kvc_last_error();
  EXPECT_EQ(cache.kept(0, 0), (Kept{0, 1, 2, 3, 4, 5}));

  auto step = [&](int position) {
    Rows dq(1, 2, 4), dk(1, 1, 4), dv(1, 1, 4);
    dq.set(0, 0, position % 4 == 3 ? e(1, 4) : e(0, 4));
    dk.set(0, 0, e(3));
    dv.set(0, 0, {float(position), 0, 1, 0});
    ASSERT_EQ(cache.decode(0, dq, dk, dv, position), KVC_STATUS_OK)
        << kvc_last_error();
  };
  // Position 6 opens the window (7 entries visible): no compression yet.
  step(6);
  EXPECT_EQ(cache.kept(0, 0), (Kept{0, 1, 2, 3, 4, 5, 6}));
  EXPECT_NEAR(cache.score(0, 0, 2), rpcQuery(7, true), relTol(1.0));
  EXPECT_NEAR(cache.score(0, 0, 4), rpcQuery(7, false), relTol(1.0));
  // Position 7 closes it (8 entries) and compresses 8 -> 4.
  step(7);
  EXPECT_EQ(cache.kept(0, 0), (Kept{2, 4, 6, 7}));
  EXPECT_NEAR(cache.score(0, 0, 2), rpcQuery(7, true) + rpcQuery(8, false),
              relTol(1.0));
  EXPECT_NEAR(cache.score(0, 0, 4), rpcQuery(7, false) + rpcQuery(8, true),
              relTol(1.0));
  // Positions 8 and 9 are outside the window: nothing folds or compresses.
  step(8);
  step(9);
  EXPECT_EQ(cache.kept(0, 0), (Kept{2, 4, 6, 7, 8, 9}));
  EXPECT_NEAR(cache.score(0, 0, 2), rpcQuery(7, true) + rpcQuery(8, false),
              relTol(1.0));
  // Position 10 restarts the window sum (7 entries visible): the last
  // period's sum is gone.
  step(10);
  EXPECT_NEAR(cache.score(0, 0, 2), rpcQuery(7, true), relTol(1.0));
  // Position 11 compresses 8 -> 4 again: 2 and 4 win over 6..9.
  step(11);
  EXPECT_EQ(cache.kept(0, 0), (Kept{2, 4, 10, 11}));
  expectExact(cache, 0, 0, k, v, {2, 4});
}

//===----------------------------------------------------------------------===//
// Global budget over SnapKV scores
//===----------------------------------------------------------------------===//

// Window 2, no pooling, recent 2 protected, 4 entries per head on average:
// 8 over both layers; n = 6 per layer, d = 4, E = e^8. Query head 1 is zero
// (uniform) in both layers. Layer 0: query head 0 is (4,0,0,0) and entry 1
// the only key along it; layer 1: query head 0 is zero too. The window is
// queries 4 (5 entries visible) and 5 (6 visible); scores are the group
// mean of their mean weight:
//   layer 0, entry 1:    ((E/(E+4) + 1/5)/2 + (E/(E+5) + 1/6)/2) / 2 ~ 0.591
//   layer 0, 0, 2, 3:    ((1/(E+4) + 1/5)/2 + (1/(E+5) + 1/6)/2) / 2 ~ 0.092
//   layer 1, 0 .. 3:     (1/5 + 1/6) / 2 ~ 0.183 (equal, bit for bit)
// The 4 window entries are kept; the other 4 places go to layer 0's entry
// 1, then layer 1's 3, 2, 1 (ties toward the recent entry). Layer 0 ends
// with 3 entries, layer 1 with 5: one selection over both layers.
TEST(SnapKVGlobal, OneTopKOverEveryLayerMovesBudgetToTheSpreadLayer) {
  Cache cache(KVC_API(snapkv_global));
  const int n = 6;
  const double big = std::exp(8.0);
  for (int layer = 0; layer < 2; ++layer) {
    Rows q(n, 2, 4), k(n, 1, 4), v(n, 1, 4);
    for (int t = 0; t < n; ++t) {
      if (layer == 0)
        q.set(t, 0, e(0, 4));
      k.set(t, 0, t == 1 ? e(0, 4) : e(3));
      v.set(t, 0, {float(t), float(layer), 0, 1});
    }
    ASSERT_EQ(cache.prefill(layer, q, k, v), KVC_STATUS_OK)
        << kvc_last_error();
    // The prefill keeps everything and stores the scores.
    EXPECT_EQ(cache.kept(layer, 0), (Kept{0, 1, 2, 3, 4, 5}));
  }
  const double heavy =
      ((big / (big + 4) + 0.2) / 2 + (big / (big + 5) + 1.0 / 6) / 2) / 2;
  const double light =
      ((1 / (big + 4) + 0.2) / 2 + (1 / (big + 5) + 1.0 / 6) / 2) / 2;
  const double uniform = (0.2 + 1.0 / 6) / 2;
  EXPECT_NEAR(cache.score(0, 0, 1), heavy, relTol(heavy));
  for (int i : {0, 2, 3}) {
    EXPECT_NEAR(cache.score(0, 0, i), light, relTol(light)) << i;
    EXPECT_NEAR(cache.score(1, 0, i), uniform, relTol(uniform)) << i;
  }
  EXPECT_TRUE(std::isinf(cache.score(0, 0, 4)));
  EXPECT_TRUE(std::isinf(cache.score(1, 0, 5)));

  std::vector<char> ws(kvc_snapkv_global_cpu_select_workspace_bytes(n));
  ASSERT_EQ(kvc_snapkv_global_cpu_select(cache.handle(), 0, n, ws.data(),
                                         ws.size()),
            KVC_STATUS_OK)
      << kvc_last_error();
  EXPECT_EQ(cache.kept(0, 0), (Kept{1, 4, 5}));
  EXPECT_EQ(cache.kept(1, 0), (Kept{1, 2, 3, 4, 5}));
  EXPECT_EQ(cache.value(1, 0, 2), (Vec{2, 1, 0, 1}));
}

} // namespace

// Mixed precision (fidelity/policies/mixed_precision.mlir): 8 entries,
// d = 8, H2O's accumulated attention averaged over the 2 query heads,
// entry 7 protected, the best ceil(0.375 * 8) = 3 kept in int8, the rest in
// int2 per token over one group of 8 channels.
// Head 1's queries are zero: query t gives 1/(t+1) to each of 0..t. Head
// 0's queries t >= 4 are (c, 0, ...) with c * 127 / sqrt(8) = 8, and only
// key 4 has a channel 0 (127): they give entry 4 E/(E+t), E = e^8, and
// every other visible entry 1/(E+t); queries t < 4 are zero.
//   s_0 = 1/2 (H_4 + sum_{t=4..7} 1/(E+t) + H_8) = 1/2 (2.0833 + 0.0013 +
//         2.7179) = 2.4013
//   s_4 = 1/2 (sum_{t=4..7} E/(E+t) + 1/5 + 1/6 + 1/7 + 1/8)
//       = 1/2 (3.9926 + 0.6345) = 2.3136
//   s_1 = 1/2 (H_4 - 1 + 0.0013 + H_8 - 1) = 1.4013, and s_2 < s_1, ...
// So the high class is {7 (protected), 0, 4}; {1, 2, 3, 5, 6} are int2.
// int2 per token: min, scale = (max - min) / 3, code = rne((x - min) /
// scale); the low rows below have min 0 and max 3 (scale 1), so x' =
// rne(x): 0.4 -> 0, 1.6 -> 2, 2.9 -> 3, 0.1 -> 0. The high rows are
// integers with max |x| = 127 (int8 scale 1): stored exactly.
TEST(MixedPrecision, KeepsTheBestRankedInInt8AndTheRestInInt2) {
  Cache cache(KVC_API(mixed_precision));
  Rows q(8, 2, 8), k(8, 1, 8), v(8, 1, 8);
  const float c = static_cast<float>(8.0 * std::sqrt(8.0) / 127.0);
  for (int t = 4; t < 8; ++t)
    q.set(t, 0, {c, 0, 0, 0, 0, 0, 0, 0});
  k.set(4, 0, {127, 0, 0, 0, 0, 0, 0, 0});
  for (int t : {0, 7})
    k.set(t, 0, {0, 127, -5, 3, 0, 0, 0, 1});
  for (int t : {1, 2, 3, 5, 6})
    k.set(t, 0, {0, 3, 1, 2, 0.4f, 1.6f, 2.9f, 0.1f});
  const Vec highValue = {127, -3, 5, 0, 1, -127, 2, 9};
  const Vec lowValue = {0, 0.4f, 1.6f, 3, 2.9f, 1, 2, 0.1f};
  for (int t = 0; t < 8; ++t)
    v.set(t, 0, (t == 0 || t == 4 || t == 7) ? highValue : lowValue);
  ASSERT_EQ(cache.prefill(0, q, k, v), KVC_STATUS_OK) << kvc_last_error();
  EXPECT_EQ(cache.kept(0, 0), (Kept{0, 1, 2, 3, 4, 5, 6, 7}));
  EXPECT_NEAR(cache.score(0, 0, 0), 2.4013, 0.0005);
  EXPECT_NEAR(cache.score(0, 0, 4), 2.3136, 0.0005);
  EXPECT_NEAR(cache.score(0, 0, 1), 1.4013, 0.0005);
  const Vec lowKey = {0, 3, 1, 2, 0, 2, 3, 0};
  const Vec lowStored = {0, 0, 2, 3, 3, 1, 2, 0};
  for (int t = 0; t < 8; ++t) {
    const bool high = t == 0 || t == 4 || t == 7;
    EXPECT_EQ(cache.keyFormat(0, 0, t), high ? KVC_FORMAT_INT8 : KVC_FORMAT_INT2)
        << "key format of " << t;
    EXPECT_EQ(cache.valueFormat(0, 0, t), cache.keyFormat(0, 0, t));
    const Vec keyRow = high ? k.row(t, 0) : lowKey;
    const Vec &valueRow = high ? highValue : lowStored;
    const std::vector<double> wantKey(keyRow.begin(), keyRow.end());
    const std::vector<double> wantValue(valueRow.begin(), valueRow.end());
    expectRow(cache.key(0, 0, t), wantKey, 1e-5, "key", t);
    expectRow(cache.value(0, 0, t), wantValue, 1e-5, "value", t);
  }
  // A decode entry is int8 (the storage format); zero queries attend
  // uniformly, so the output is the mean of the 9 stored values.
  Rows dq(1, 2, 8), dk(1, 1, 8), dv(1, 1, 8);
  dv.set(0, 0, {9, 0, 0, 0, 0, 0, 0, -127});
  Vec out;
  ASSERT_EQ(cache.decode(0, dq, dk, dv, 8, &out), KVC_STATUS_OK)
      << kvc_last_error();
  EXPECT_EQ(cache.keyFormat(0, 0, 8), KVC_FORMAT_INT8);
  for (int ch = 0; ch < 8; ++ch) {
    const double mean =
        (3 * highValue[ch] + 5 * lowStored[ch] + dv.row(0, 0)[ch]) / 9.0;
    EXPECT_NEAR(out[ch], mean, 1e-4) << "head 0 output channel " << ch;
    EXPECT_NEAR(out[8 + ch], mean, 1e-4) << "head 1 output channel " << ch;
  }
}
