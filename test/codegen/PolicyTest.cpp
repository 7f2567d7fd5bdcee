//===- PolicyTest.cpp - generated policy libraries vs the oracle ----------===//
//
// Every bundled policy, compiled by kvc_add_policy_library for the geometry
// this executable was built for, runs a prefill over a prompt of 1100 tokens
// (not a multiple of the page size) and a few decode steps on every layer.
// Outputs, kept sets, score state and stored data are compared with a
// reference model of the policy composed from the double-precision oracle
// (test/reference), following the published definitions.
//
// Tolerances: attention outputs 2e-4 absolute (float accumulation over
// ~1100 entries against double); kept sets exactly, except entries whose
// reference score lies within 1e-5 (relative) of the selection boundary;
// accumulated state 1e-3 relative; stored full-precision data exactly the
// input rounded to the element type; KIVI data within half a quantization
// step of its group (bounded by the head's range) plus the element rounding.
//
//===----------------------------------------------------------------------===//

#include "kvc_h2o_cpu.h"
#include "kvc_pyramidkv_small_cpu.h"
#include "kvc_snapkv_cpu.h"
#include "kvc_streaming_llm_cpu.h"
#ifndef KVC_TEST_UNFUSED
#include "kvc_a2sf_cpu.h"
#include "kvc_fp8_cpu.h"
#include "kvc_int8_cpu.h"
#include "kvc_keydiff_cpu.h"
#include "kvc_kivi2_cpu.h"
#include "kvc_kivi4_cpu.h"
#include "kvc_knorm_cpu.h"
#include "kvc_pyramidkv_cpu.h"
#include "kvc_snapkv_kivi2_cpu.h"
#include "kvc_snapkv_maxpool_cpu.h"
#include "kvc_value_aware_cpu.h"
#include "kvc_cam_cpu.h"
#include "kvc_d2o_cpu.h"
#include "kvc_h2o_merge_cpu.h"
#include "kvc_merge_nearest_cpu.h"
#include "kvc_tova_cpu.h"
#include "kvc_adakv_cpu.h"
#include "kvc_pyramidkv_small_adakv_cpu.h"
#include "kvc_rpc_small_cpu.h"
#include "kvc_scissorhands_cpu.h"
#include "kvc_snapkv_global_cpu.h"
#include "kvc_mixed_precision_cpu.h"
#endif
#ifdef KVC_TEST_HEAD_CLASSES
#include "kvc_duo_small_cpu.h"
#endif

#include "runtime/kvc_policy_api.h"
#include "test/reference/PolicyInputs.h"
#include "test/reference/Reference.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <map>
#include <memory>
#include <random>
#include <set>
#include <string>
#include <type_traits>
#include <vector>

namespace ref = kvc::ref;

namespace {

constexpr int kLayers = KVC_TEST_LAYERS;
constexpr int kQHeads = KVC_TEST_Q_HEADS;
constexpr int kKvHeads = KVC_TEST_KV_HEADS;
constexpr int kDim = KVC_TEST_HEAD_DIM;
constexpr int kGroup = kQHeads / kKvHeads;
constexpr int kPrompt = 1100;
constexpr int kDecodeSteps = 4;
constexpr int kPageSize = 32;

/// The larger of two differences, NaN when either is: a NaN output is a
/// failure that std::max would drop (EXPECT_LT(NaN, x) fails).
double worseOf(double worst, double d) {
  return std::isnan(d) || d > worst ? d : worst;
}

double roundToStored(double x) {
#if defined(KVC_TEST_DTYPE_f16)
  return ref::roundToF16(x);
#elif defined(KVC_TEST_DTYPE_bf16)
  return ref::roundToBf16(x);
#else
  return static_cast<double>(static_cast<float>(x));
#endif
}

/// One unit in the last place of the element type, relative.
constexpr double kStoredUlp =
#if defined(KVC_TEST_DTYPE_f16)
    0x1p-10;
#elif defined(KVC_TEST_DTYPE_bf16)
    0x1p-7;
#else
    0x1p-23;
#endif

/// The C entry points of one generated library (their types, those of
/// runtime/kvc_policy_api.h, are checked as the table below is built).
struct Api {
  const char *name;
  kvc_configure_fn configure;
  kvc_workspace_bytes_fn prefillBytes;
  kvc_cpu_prefill_fn prefill;
  kvc_workspace_bytes_fn decodeBytes;
  kvc_cpu_decode_fn decode;
};

#ifndef KVC_TEST_UNFUSED
#define KVC_API(p)                                                             \
  Api {                                                                        \
    #p, kvc_##p##_cpu_configure, kvc_##p##_cpu_prefill_workspace_bytes,        \
        kvc_##p##_cpu_prefill, kvc_##p##_cpu_decode_workspace_bytes,           \
        kvc_##p##_cpu_decode                                                   \
  }
#else
// The unfused pipeline: attention kernels, then the scoring kernels that
// recompute the weights. Both must give exactly what the fused kernels give.
#define KVC_UNFUSED_PREFILL(p)                                                 \
  static_assert(std::is_same_v<decltype(&kvc_##p##_cpu_prefill_scoring),       \
                               kvc_cpu_prefill_scoring_fn>);                   \
  uint64_t p##_prefillBytes(int32_t n) {                                       \
    return std::max(kvc_##p##_cpu_prefill_workspace_bytes(n),                  \
                    kvc_##p##_cpu_prefill_scoring_workspace_bytes(n));         \
  }                                                                            \
  kvc_status_t p##_prefill(kvc_context_t *c, uint64_t s, int32_t l,           \
                           int32_t n, const float *q, const float *k,          \
                           const float *v, const int32_t *pos, float *out,     \
                           void *ws, uint64_t bytes) {                         \
    kvc_status_t st =                                                          \
        kvc_##p##_cpu_prefill(c, s, l, n, q, k, v, pos, out, ws, bytes);       \
    if (st != KVC_STATUS_OK)                                                   \
      return st;                                                               \
    return kvc_##p##_cpu_prefill_scoring(c, s, l, n, q, k, v, pos, ws,        \
                                         bytes);                               \
  }
#define KVC_UNFUSED_DECODE(p)                                                  \
  static_assert(std::is_same_v<decltype(&kvc_##p##_cpu_decode_scoring),        \
                               kvc_cpu_decode_scoring_fn>);                    \
  uint64_t p##_decodeBytes(int32_t n) {                                        \
    return std::max(kvc_##p##_cpu_decode_workspace_bytes(n),                   \
                    kvc_##p##_cpu_decode_scoring_workspace_bytes(n));          \
  }                                                                            \
  kvc_status_t p##_decode(kvc_context_t *c, uint64_t s, int32_t l,            \
                          const float *q, const float *k, const float *v,      \
                          int32_t position, float *out, void *ws,              \
                          uint64_t bytes) {                                    \
    kvc_status_t st =                                                          \
        kvc_##p##_cpu_decode(c, s, l, q, k, v, position, out, ws, bytes);      \
    if (st != KVC_STATUS_OK)                                                   \
      return st;                                                               \
    return kvc_##p##_cpu_decode_scoring(c, s, l, q, position, ws, bytes);      \
  }
KVC_UNFUSED_PREFILL(streaming_llm)
KVC_UNFUSED_DECODE(streaming_llm)
KVC_UNFUSED_PREFILL(h2o)
KVC_UNFUSED_DECODE(h2o)
KVC_UNFUSED_PREFILL(snapkv)
KVC_UNFUSED_PREFILL(pyramidkv_small)
#define KVC_API_UNFUSED_BOTH(p)                                                \
  Api { #p, kvc_##p##_cpu_configure, p##_prefillBytes, p##_prefill,            \
        p##_decodeBytes, p##_decode }
#define KVC_API_UNFUSED_PREFILL(p)                                             \
  Api {                                                                        \
    #p, kvc_##p##_cpu_configure, p##_prefillBytes, p##_prefill,                \
        kvc_##p##_cpu_decode_workspace_bytes, kvc_##p##_cpu_decode             \
  }
#endif

/// What the policy does, from its published definition (the variants the
/// policy files name).
struct Model {
  enum class Score {
    Keep,
    Recency,
    Accumulated,
    Window,
    KeyNorm,
    KeyDiversity,
    ValueAware,
    LastLayer, ///< TOVA: the last query, averaged over every head of the layer.
    Persistence, ///< Scissorhands: steps with a group-mean weight > threshold.
    Periodic     ///< RPC: a decode window every `period` positions.
  } score;
  int sinks = 0, recent = 0;
  int window = 0, poolKernel = 1;
  ref::PoolKind pool = ref::PoolKind::Avg;
  int64_t count = 0;    ///< Uniform budget (0: none).
  int64_t capacity = 0; ///< Pyramid capacity (0: none).
  int beta = 20;
  double decay = 1.0; ///< Of the accumulated attention.
  /// What happens to the prompt entries the prefill selection evicts.
  enum class Merge { None, Nearest, D2O, Cam } merge = Merge::None;
  int camSpan = 4;
  /// AdaKV's share of each head's budget (0: no adaptive allocation).
  double adaptiveAlpha = 0.0;
  /// Head classes (DuoAttention): 1 keeps everything, 0 keeps `count`.
  std::vector<std::vector<int>> headClasses;

  int64_t budgetOf(int layer, int head, int64_t n) const {
    if (!headClasses.empty() && headClasses[layer][head])
      return n;
    return count;
  }
  bool evictsAtDecode = false;
  /// Storage format and the analytic error bound of one stored element.
  enum class Storage {
    Full,
    Kivi2,
    Kivi4,
    Int8,
    Fp8,
    /// Mixed precision: the best `highFraction` of the kept entries by the
    /// selection's scores in int8, the rest int2 per token in groups of
    /// `lowGroup` channels.
    MixedInt8Int2
  } storage = Storage::Full;
  double highFraction = 0.0;
  int lowGroup = 0;
  bool quantized() const { return storage != Storage::Full; }
  /// Scissorhands: weight threshold and the steps counted.
  double threshold = 0.0;
  int history = 0;
  /// RPC: positions between compressions (the selector window is `window`).
  int period = 0;
};

struct Case {
  Api api;
  Model model;
};

std::vector<Case> allCases() {
  Model streaming{Model::Score::Recency, 4, 0};
  streaming.count = 1024;
  streaming.evictsAtDecode = true;
  Model h2o{Model::Score::Accumulated, 0, 512};
  h2o.count = 1024;
  h2o.evictsAtDecode = true;
  Model snapkv{Model::Score::Window, 0, 64, 64, 5, ref::PoolKind::Avg};
  snapkv.count = 1024;
  Model pyramid{Model::Score::Window, 0, 8, 8, 7, ref::PoolKind::Max};
  pyramid.capacity = 2048;
  Model pyramidSmall = pyramid;
  pyramidSmall.capacity = 256;
  Model kivi{Model::Score::Keep};
  kivi.storage = Model::Storage::Kivi2;
  Model snapkvKivi = snapkv;
  snapkvKivi.storage = Model::Storage::Kivi2;
  Model kivi4{Model::Score::Keep};
  kivi4.storage = Model::Storage::Kivi4;
  Model fp8{Model::Score::Keep};
  fp8.storage = Model::Storage::Fp8;
  Model int8{Model::Score::Keep};
  int8.storage = Model::Storage::Int8;
  Model knorm{Model::Score::KeyNorm};
  knorm.count = 1024;
  Model keydiff{Model::Score::KeyDiversity};
  keydiff.count = 1024;
  Model a2sf = h2o;
  a2sf.decay = 0.9;
  Model snapkvMax{Model::Score::Window, 0, 8, 8, 7, ref::PoolKind::Max};
  snapkvMax.count = 1024;
  Model valueAware{Model::Score::ValueAware, 0, 64};
  valueAware.count = 1024;
  Model mergeNearest = snapkv;
  mergeNearest.merge = Model::Merge::Nearest;
  Model h2oMerge = h2o;
  h2oMerge.merge = Model::Merge::Nearest;
  Model d2o = h2o;
  d2o.merge = Model::Merge::D2O;
  Model cam = snapkv;
  cam.merge = Model::Merge::Cam;
  Model tova{Model::Score::LastLayer};
  tova.count = 1024;
  tova.evictsAtDecode = true;
  Model adakv = snapkv;
  adakv.adaptiveAlpha = 0.2;
  Model pyramidAdakv = pyramidSmall;
  pyramidAdakv.adaptiveAlpha = 0.2;
  Model scissorhands{Model::Score::Persistence, 0, 64};
  scissorhands.count = 1024;
  scissorhands.threshold = 1.0 / 1024;
  scissorhands.history = 64;
  scissorhands.evictsAtDecode = true;
  Model rpc{Model::Score::Periodic, 0, 2, 2};
  rpc.count = 1024;
  rpc.period = 2;
  rpc.evictsAtDecode = true;
  Model mixed{Model::Score::Accumulated, 0, 64};
  mixed.count = kPrompt; // Nothing is evicted.
  mixed.storage = Model::Storage::MixedInt8Int2;
  mixed.highFraction = 0.2;
  mixed.lowGroup = 32;
  Model duo = streaming;
  duo.count = 4 + 60;
  duo.headClasses = {{0, 1, 0}, {1, 0, 0}};
#ifdef KVC_TEST_UNFUSED
  return {{KVC_API_UNFUSED_BOTH(streaming_llm), streaming},
          {KVC_API_UNFUSED_BOTH(h2o), h2o},
          {KVC_API_UNFUSED_PREFILL(snapkv), snapkv},
          {KVC_API_UNFUSED_PREFILL(pyramidkv_small), pyramidSmall}};
#else
  return {{KVC_API(streaming_llm), streaming},
          {KVC_API(h2o), h2o},
          {KVC_API(snapkv), snapkv},
          {KVC_API(pyramidkv), pyramid},
          {KVC_API(pyramidkv_small), pyramidSmall},
          {KVC_API(kivi2), kivi},
          {KVC_API(snapkv_kivi2), snapkvKivi},
          {KVC_API(kivi4), kivi4},
          {KVC_API(fp8), fp8},
          {KVC_API(int8), int8},
          {KVC_API(knorm), knorm},
          {KVC_API(keydiff), keydiff},
          {KVC_API(a2sf), a2sf},
          {KVC_API(snapkv_maxpool), snapkvMax},
          {KVC_API(value_aware), valueAware},
          {KVC_API(merge_nearest), mergeNearest},
          {KVC_API(h2o_merge), h2oMerge},
          {KVC_API(d2o), d2o},
          {KVC_API(cam), cam},
          {KVC_API(tova), tova},
          {KVC_API(adakv), adakv},
          {KVC_API(pyramidkv_small_adakv), pyramidAdakv},
          {KVC_API(scissorhands), scissorhands},
          {KVC_API(rpc_small), rpc},
          {KVC_API(mixed_precision), mixed},
#ifdef KVC_TEST_HEAD_CLASSES
          {KVC_API(duo_small), duo},
#endif
  };
#endif
}

/// One cached entry of the reference model.
struct RefEntry {
  int position;
  ref::Vector key, value; // As stored (rounded to the element type).
  double state = 0.0;     // Accumulated attention (H2O), window sum (RPC).
  /// Scissorhands: the group-mean weight of every step the entry saw, the
  /// latest last.
  std::vector<double> weights;
};

/// Scissorhands: the steps among the last `history` whose weight is above
/// `threshold`, and whether a weight lies so close to it (1e-4 relative)
/// that float and double may disagree.
struct PersistenceCount {
  int count = 0;
  bool ambiguous = false;
};
PersistenceCount persistenceCount(const std::vector<double> &weights,
                                  int history, double threshold) {
  PersistenceCount c;
  const int steps = static_cast<int>(weights.size());
  std::vector<ref::Vector> rows;
  for (int t = std::max(0, steps - history); t < steps; ++t) {
    rows.push_back({weights[t]});
    if (std::fabs(weights[t] - threshold) <= 1e-4 * threshold)
      c.ambiguous = true;
  }
  c.count = rows.empty() ? 0
                         : static_cast<int>(
                               ref::scissorhandsCounts(rows, history,
                                                       threshold)[0]);
  return c;
}

using ref::LayerInputs;

LayerInputs makeInputs(std::mt19937 &rng, int tokens, bool structured,
                       int firstPosition) {
  return ref::makeLayerInputs(rng, tokens, kQHeads, kKvHeads, kDim, structured,
                              firstPosition);
}

ref::Matrix headRows(const std::vector<float> &x, int tokens, int heads,
                     int head) {
  ref::Matrix m(tokens, kDim);
  for (int t = 0; t < tokens; ++t)
    for (int c = 0; c < kDim; ++c)
      m.at(t, c) = x[(static_cast<size_t>(t) * heads + head) * kDim + c];
  return m;
}

/// The decayed accumulated attention after every prompt query, one step of
/// the oracle's recurrence per query.
ref::Vector accumulated(const ref::Matrix &p, double decay) {
  ref::Vector state(p.cols, 0.0);
  for (int t = 0; t < p.rows; ++t)
    state = ref::decayedAccumulate(state, p.row(t), decay);
  return state;
}

/// CaM's merged values from its definition, written independently of the
/// kernels: A = the window attention averaged over the group, normalized by
/// its mean over the observed prefix; each evicted value adds p_e * v_e / m
/// to the next m kept entries, p_e = clamp(A_e / mean, 0, 1).
ref::Matrix camExpected(const std::vector<ref::Matrix> &probabilities,
                        const ref::Matrix &values, const std::vector<int> &kept,
                        int window, int span) {
  const int n = values.rows, w = std::min(window, n);
  ref::Vector a(n, 0.0);
  for (const ref::Matrix &p : probabilities) {
    ref::Vector mean = ref::windowMean(p, w);
    for (int i = 0; i < n - w; ++i)
      a[i] += mean[i] / probabilities.size();
  }
  double prefixMean = 0.0;
  for (int i = 0; i < n - w; ++i)
    prefixMean += a[i] / (n - w);
  ref::Matrix merged(static_cast<int>(kept.size()), values.cols);
  for (size_t t = 0; t < kept.size(); ++t)
    for (int c = 0; c < values.cols; ++c)
      merged.at(static_cast<int>(t), c) = values.at(kept[t], c);
  std::set<int> keptSet(kept.begin(), kept.end());
  for (int e = 0; e < n; ++e) {
    if (keptSet.count(e))
      continue;
    const double p =
        prefixMean > 0.0 ? std::clamp(a[e] / prefixMean, 0.0, 1.0) : 0.0;
    int merges = 0;
    for (size_t t = 0; t < kept.size() && merges < span; ++t) {
      if (kept[t] <= e)
        continue;
      ++merges;
      for (int c = 0; c < values.cols; ++c)
        merged.at(static_cast<int>(t), c) += p * values.at(e, c) / span;
    }
  }
  return merged;
}

/// Largest error of one element of `x` stored in `storage`, from the
/// format's definition; `lo`/`hi` bound the values sharing quantization
/// parameters with it.
double storageBound(Model::Storage storage, double x, double lo, double hi,
                    double maxAbs) {
  switch (storage) {
  case Model::Storage::Full:
    return 0.0;
  case Model::Storage::Kivi2:
  case Model::Storage::Kivi4: {
    // Half a step of the record's scale: (range) / levels, widened by the
    // f16 roundings of min (down, up to 2^-10 of it) and of the scale (up,
    // up to 2^-10 of itself).
    const double levels = storage == Model::Storage::Kivi2 ? 3.0 : 15.0;
    const double widen = std::ldexp(1.0, -10);
    const double minAbs = std::max(std::fabs(lo), std::fabs(hi));
    return (hi - lo + minAbs * widen) / levels * (1.0 + widen) / 2.0 + 1e-2;
  }
  case Model::Storage::Int8:
    return maxAbs / 127.0 / 2.0 + 1e-6;
  case Model::Storage::MixedInt8Int2:
    return 0.0; // Per class, in the prefill check.
  case Model::Storage::Fp8:
    // Three mantissa bits: half an ulp is 2^-4 relative; subnormals of the
    // scaled value are spaced 2^-9 apart.
    return std::fabs(x) / 16.0 + maxAbs / 448.0 * std::ldexp(1.0, -10) + 1e-6;
  }
  return 0.0;
}

/// Kept entries of a selection by score, with the score of each entry for
/// the tie tolerance.
struct Selection {
  std::vector<int> kept; // Prompt indices, ascending.
  ref::Vector scores;    // Reference scores (+inf for protected entries).
  /// Integer scores whose ties the tie rule settles: the kept set must
  /// match exactly.
  bool exact = false;
};

/// Expects the kept positions to match, allowing swaps at the boundary.
void expectSameKept(const Selection &expected, const std::set<int> &actual,
                    const std::string &where) {
  std::set<int> want(expected.kept.begin(), expected.kept.end());
  if (want == actual)
    return;
  if (expected.exact) {
    ADD_FAILURE() << where << ": kept sets differ";
    return;
  }
  // The lowest kept reference score is the boundary.
  double boundary = INFINITY;
  for (int i : expected.kept)
    boundary = std::min(boundary, expected.scores[i]);
  double scale = 0.0;
  for (double s : expected.scores)
    if (std::isfinite(s))
      scale = std::max(scale, std::fabs(s));
  auto nearBoundary = [&](int i) {
    return std::fabs(expected.scores[i] - boundary) <= 1e-5 * scale;
  };
  std::vector<int> missing, extra;
  std::set_difference(want.begin(), want.end(), actual.begin(), actual.end(),
                      std::back_inserter(missing));
  std::set_difference(actual.begin(), actual.end(), want.begin(), want.end(),
                      std::back_inserter(extra));
  EXPECT_EQ(missing.size(), extra.size()) << where << ": kept counts differ";
  for (int i : missing)
    EXPECT_TRUE(nearBoundary(i))
        << where << ": entry " << i << " should be kept (score "
        << expected.scores[i] << ", boundary " << boundary << ")";
  for (int i : extra)
    EXPECT_TRUE(i < static_cast<int>(expected.scores.size()) && nearBoundary(i))
        << where << ": entry " << i << " should have been evicted";
}

class GeneratedPolicyTest
    : public ::testing::TestWithParam<std::tuple<int, bool>> {
protected:
  void SetUp() override {
    test = allCases()[std::get<0>(GetParam())];
    structured = std::get<1>(GetParam());
    kvc_config_t config{};
    test.api.configure(&config);
    ASSERT_EQ(config.num_layers, kLayers);
    ASSERT_EQ(config.num_q_heads, kQHeads);
    ASSERT_EQ(config.num_kv_heads, kKvHeads);
    ASSERT_EQ(config.head_dim, kDim);
    config.page_size = kPageSize;
    config.num_pages = kLayers * kKvHeads * ((kPrompt + 64) / kPageSize + 2);
    config.max_sequences = 1;
    config.memory = KVC_MEMORY_HOST;
    uint64_t bytes = 0;
    ASSERT_EQ(kvc_pool_bytes_required(&config, &bytes), KVC_STATUS_OK)
        << kvc_last_error();
    poolBytes = bytes;
    pool.reset(static_cast<char *>(
        std::aligned_alloc(KVC_POOL_ALIGNMENT,
                           (bytes + KVC_POOL_ALIGNMENT - 1) /
                               KVC_POOL_ALIGNMENT * KVC_POOL_ALIGNMENT)));
    ASSERT_EQ(kvc_context_create(&config, pool.get(), bytes, &context),
              KVC_STATUS_OK)
        << kvc_last_error();
    ASSERT_EQ(kvc_sequence_add(context, 0), KVC_STATUS_OK);
    this->config = config;
  }
  void TearDown() override { kvc_context_destroy(context); }

  /// Live positions of one head and the slot of each.
  std::map<int, int> livePositions(int layer, int head) {
    kvc_metadata_t meta{};
    EXPECT_EQ(kvc_get_metadata(context, 0, layer, head, &meta), KVC_STATUS_OK);
    std::map<int, int> live;
    for (int s = 0; s < meta.num_slots; ++s)
      if (meta.position[s] != KVC_POSITION_NONE)
        live[meta.position[s]] = s;
    return live;
  }

  /// The selection the reference model makes after prefill.
  Selection prefillSelection(const std::vector<ref::Matrix> &probabilities,
                             const ref::Matrix &keys,
                             const ref::Matrix &values, int layer,
                             int head) {
    const Model &m = test.model;
    Selection sel;
    const int n = kPrompt;
    if (m.score == Model::Score::Keep || m.score == Model::Score::Periodic) {
      for (int i = 0; i < n; ++i)
        sel.kept.push_back(i);
      sel.scores.assign(n, INFINITY);
      return sel;
    }
    ref::Vector reduced;
    if (m.score == Model::Score::Recency) {
      for (int i = 0; i < n; ++i)
        reduced.push_back(i);
    } else if (m.score == Model::Score::KeyNorm) {
      reduced = ref::keyNormScores(keys);
    } else if (m.score == Model::Score::KeyDiversity) {
      reduced = ref::keyDiversityScores(keys);
    } else if (m.score == Model::Score::Persistence) {
      std::vector<std::vector<double>> weights = groupMeanWeights(
          probabilities, n - m.history);
      bool ambiguous = false;
      for (int i = 0; i < n; ++i) {
        PersistenceCount c =
            persistenceCount(weights[i], m.history, m.threshold);
        reduced.push_back(c.count);
        ambiguous |= c.ambiguous;
      }
      sel.exact = !ambiguous;
    } else {
      std::vector<ref::Vector> perQuery;
      for (const ref::Matrix &p : probabilities) {
        if (m.score == Model::Score::Accumulated ||
            m.score == Model::Score::ValueAware) {
          perQuery.push_back(accumulated(p, m.decay));
          continue;
        }
        // SnapKV: window mean over the prefix, pooled over the prefix.
        const int w = std::min(m.window, n);
        ref::Vector mean = ref::windowMean(p, w);
        ref::Vector prefix(mean.begin(), mean.end() - w);
        ref::Vector pooled = ref::pool1d(prefix, m.poolKernel, m.pool);
        pooled.resize(n, 0.0);
        perQuery.push_back(pooled);
      }
      reduced = ref::groupReduce(perQuery, 1, ref::ReduceKind::Mean)[0];
      if (m.score == Model::Score::ValueAware)
        for (int i = 0; i < n; ++i) {
          double l1 = 0.0;
          for (int c = 0; c < kDim; ++c)
            l1 += std::fabs(values.at(i, c));
          reduced[i] *= l1;
        }
    }
    sel.scores = ref::protect(reduced, m.sinks, m.recent);
    sel.kept = ref::topK(sel.scores, static_cast<int>(budgetOf(layer, head)));
    return sel;
  }

  /// Per entry, the group-mean weight of every prompt query from `first`
  /// on that sees it (Scissorhands' history).
  static std::vector<std::vector<double>>
  groupMeanWeights(const std::vector<ref::Matrix> &probabilities, int first) {
    const int n = probabilities[0].cols;
    std::vector<std::vector<double>> weights(n);
    for (int t = std::max(0, first); t < n; ++t)
      for (int i = 0; i <= t; ++i) {
        double p = 0.0;
        for (const ref::Matrix &pg : probabilities)
          p += pg.at(t, i) / probabilities.size();
        weights[i].push_back(p);
      }
    return weights;
  }

  /// The budget of one head after prefill.
  int64_t budgetOf(int layer, int head) const {
    const Model &m = test.model;
    return m.count ? ref::uniformBudget(kPrompt, m.budgetOf(layer, head, kPrompt))
                   : ref::pyramidBudgets(m.capacity, m.window, m.beta, kPrompt,
                                         kLayers)
                         .total[layer];
  }

  /// The selections of every head of a layer: per head, or across heads
  /// for TOVA (one layer-wide score) and AdaKV (budgets moved between heads).
  std::vector<Selection>
  layerSelections(const std::vector<ref::AttentionResult> &atts,
                  const std::vector<ref::Matrix> &keys,
                  const std::vector<ref::Matrix> &values, int layer) {
    const Model &m = test.model;
    std::vector<Selection> sels(kKvHeads);
    if (m.score == Model::Score::LastLayer) {
      ref::Vector layerScore(kPrompt, 0.0);
      for (const ref::AttentionResult &att : atts)
        for (const ref::Matrix &p : att.probabilities)
          for (int i = 0; i < kPrompt; ++i)
            layerScore[i] += p.at(kPrompt - 1, i) / kQHeads;
      for (int h = 0; h < kKvHeads; ++h) {
        sels[h].scores = ref::protect(layerScore, m.sinks, m.recent);
        sels[h].kept =
            ref::topK(sels[h].scores, static_cast<int>(budgetOf(layer, h)));
      }
      return sels;
    }
    for (int h = 0; h < kKvHeads; ++h)
      sels[h] = prefillSelection(atts[h].probabilities, keys[h], values[h],
                                 layer, h);
    if (m.adaptiveAlpha > 0.0) {
      std::vector<ref::Vector> scores;
      for (const Selection &sel : sels)
        scores.push_back(sel.scores);
      std::vector<std::vector<int>> kept = ref::adaKvSelect(
          scores, static_cast<int>(budgetOf(layer, 0)), m.adaptiveAlpha);
      for (int h = 0; h < kKvHeads; ++h)
        sels[h].kept = kept[h];
    }
    return sels;
  }

  Case test;
  bool structured = false;
  kvc_config_t config{};
  struct Free {
    void operator()(char *p) const { std::free(p); }
  };
  std::unique_ptr<char, Free> pool;
  uint64_t poolBytes = 0;
  kvc_context_t *context = nullptr;
};

TEST_P(GeneratedPolicyTest, PrefillAndDecodeMatchTheOracle) {
  std::mt19937 rng(1234 + std::get<0>(GetParam()) * 7 + structured);
  const Model &m = test.model;
  // Reference caches per (layer, kv-head).
  std::vector<std::vector<std::vector<RefEntry>>> cache(
      kLayers, std::vector<std::vector<RefEntry>>(kKvHeads));

  std::vector<int32_t> positions(kPrompt);
  for (int i = 0; i < kPrompt; ++i)
    positions[i] = i;
  std::vector<char> workspace(test.api.prefillBytes(kPrompt));
  for (int layer = 0; layer < kLayers; ++layer) {
    LayerInputs in = makeInputs(rng, kPrompt, structured, 0);
    std::vector<float> out(in.q.size());
    ASSERT_EQ(test.api.prefill(context, 0, layer, kPrompt, in.q.data(),
                               in.k.data(), in.v.data(), positions.data(),
                               out.data(), workspace.data(), workspace.size()),
              KVC_STATUS_OK)
        << kvc_last_error();
    std::vector<ref::AttentionResult> atts;
    std::vector<ref::Matrix> headKeys, headValues;
    for (int h = 0; h < kKvHeads; ++h) {
      std::vector<ref::Matrix> queries;
      for (int g = 0; g < kGroup; ++g)
        queries.push_back(headRows(in.q, kPrompt, kQHeads, h * kGroup + g));
      headKeys.push_back(headRows(in.k, kPrompt, kKvHeads, h));
      headValues.push_back(headRows(in.v, kPrompt, kKvHeads, h));
      atts.push_back(ref::attention(queries, {headKeys[h]}, {headValues[h]}));
    }
    std::vector<Selection> sels =
        layerSelections(atts, headKeys, headValues, layer);
    for (int h = 0; h < kKvHeads; ++h) {
      const ref::AttentionResult &att = atts[h];
      const ref::Matrix &keys = headKeys[h];
      const ref::Matrix &values = headValues[h];
      std::string where = std::string(test.api.name) + " layer " +
                          std::to_string(layer) + " head " + std::to_string(h);
      // Outputs of every prompt query.
      double worst = 0.0;
      for (int g = 0; g < kGroup; ++g)
        for (int t = 0; t < kPrompt; ++t)
          for (int c = 0; c < kDim; ++c)
            worst = worseOf(
                worst,
                std::fabs(att.output[g].at(t, c) -
                          out[(static_cast<size_t>(t) * kQHeads + h * kGroup +
                               g) * kDim + c]));
      EXPECT_LT(worst, 2e-4) << where << ": prefill output";

      // Kept set.
      const Selection &sel = sels[h];
      std::map<int, int> live = livePositions(layer, h);
      std::set<int> actual;
      for (auto &[pos, slot] : live)
        actual.insert(pos);
      expectSameKept(sel, actual, where + " prefill");

      // What the kept entries hold after the policy's merge.
      ref::Matrix expectedKeys(kPrompt, kDim), expectedValues(kPrompt, kDim);
      expectedKeys.data = keys.data;
      expectedValues.data = values.data;
      if (m.merge != Model::Merge::None) {
        std::vector<int> kept;
        for (int pos : actual)
          kept.push_back(pos);
        ref::Matrix mergedKeys, mergedValues;
        if (m.merge == Model::Merge::Nearest) {
          mergedValues = ref::mergeIntoNearest(keys, values, kept);
        } else if (m.merge == Model::Merge::D2O) {
          ref::D2OResult r = ref::d2oMerge(keys, values, kept, 0.0, 0.5, 0.5);
          mergedKeys = r.keys;
          mergedValues = r.values;
        } else {
          mergedValues = camExpected(att.probabilities, values, kept,
                                     m.window, m.camSpan);
        }
        for (size_t t = 0; t < kept.size(); ++t)
          for (int c = 0; c < kDim; ++c) {
            expectedValues.at(kept[t], c) = mergedValues.at(t, c);
            if (m.merge == Model::Merge::D2O)
              expectedKeys.at(kept[t], c) = mergedKeys.at(t, c);
          }
      }

      // The group mean of the accumulated attention of every entry.
      ref::Vector groupState;
      if (m.score == Model::Score::Accumulated) {
        groupState.assign(kPrompt, 0.0);
        for (int g = 0; g < kGroup; ++g) {
          ref::Vector acc = accumulated(att.probabilities[g], m.decay);
          for (int i = 0; i < kPrompt; ++i)
            groupState[i] += acc[i] / kGroup;
        }
      }
      std::vector<std::vector<double>> persistenceWeights;
      if (m.score == Model::Score::Persistence)
        persistenceWeights =
            groupMeanWeights(att.probabilities, kPrompt - m.history);

      // Stored data and accumulated state of every live entry.
      kvc_metadata_t meta{};
      ASSERT_EQ(kvc_get_metadata(context, 0, layer, h, &meta), KVC_STATUS_OK);
      double keyLo = INFINITY, keyHi = -INFINITY;
      for (double x : keys.data) {
        keyLo = std::min(keyLo, x);
        keyHi = std::max(keyHi, x);
      }
      // Mixed precision: which kept entries the definition puts in the high
      // class (the ceil(f * kept) best by score, ties to the more recent),
      // and which are too close to the cutoff score to tell.
      std::set<int> high, unclear;
      if (m.storage == Model::Storage::MixedInt8Int2) {
        std::vector<int> order(actual.begin(), actual.end());
        std::sort(order.begin(), order.end(), [&](int a, int b) {
          if (sel.scores[a] != sel.scores[b])
            return sel.scores[a] > sel.scores[b];
          return a > b;
        });
        const size_t count = static_cast<size_t>(
            std::ceil(m.highFraction * order.size() - 1e-9));
        high.insert(order.begin(), order.begin() + count);
        const double cutoff = sel.scores[order[count - 1]];
        for (int pos : order)
          if (std::isfinite(cutoff) &&
              std::fabs(sel.scores[pos] - cutoff) <= 1e-4 * std::fabs(cutoff))
            unclear.insert(pos);
      }
      std::vector<float> key(kDim), value(kDim);
      for (auto &[pos, slot] : live) {
        ASSERT_EQ(kvc_read_entry(context, 0, layer, h, slot, kDim, key.data(),
                                 value.data()),
                  KVC_STATUS_OK);
        if (m.storage == Model::Storage::MixedInt8Int2) {
          const bool isHigh = high.count(pos) > 0;
          if (!unclear.count(pos)) {
            EXPECT_EQ(meta.key_format[slot],
                      isHigh ? KVC_FORMAT_INT8 : KVC_FORMAT_INT2)
                << where << " class of " << pos;
          }
          const bool storedHigh = meta.key_format[slot] == KVC_FORMAT_INT8;
          EXPECT_EQ(meta.value_format[slot], meta.key_format[slot]);
          // int8: half a step of max|x| / 127; int2: half a step of the
          // group's record (the range / 3, min and scale as f16).
          for (const auto *rows : {&keys, &values}) {
            const std::vector<float> &stored = rows == &keys ? key : value;
            for (int first = 0; first < kDim; first += m.lowGroup) {
              double amax = 0.0;
              for (int c = 0; c < kDim; ++c)
                amax = std::max(amax, std::fabs(rows->at(pos, c)));
              ref::Vector group;
              for (int c = first; c < first + m.lowGroup; ++c)
                group.push_back(rows->at(pos, c));
              const double bound =
                  storedHigh ? amax / 127.0 / 2.0 + 1e-6
                             : ref::quantizeAsymRecord(group, 2).scale / 2.0 +
                                   1e-5;
              for (int c = first; c < first + m.lowGroup; ++c)
                ASSERT_LE(std::fabs(stored[c] - rows->at(pos, c)), bound)
                    << where << (rows == &keys ? " key " : " value ") << pos
                    << " channel " << c;
            }
          }
        }
        RefEntry e{pos, ref::Vector(kDim), ref::Vector(kDim)};
        double valueLo = INFINITY, valueHi = -INFINITY, keyAbs = 0.0,
               valueAbs = 0.0;
        for (int c = 0; c < kDim; ++c) {
          valueLo = std::min(valueLo, values.at(pos, c));
          valueHi = std::max(valueHi, values.at(pos, c));
          keyAbs = std::max(keyAbs, std::fabs(keys.at(pos, c)));
          valueAbs = std::max(valueAbs, std::fabs(values.at(pos, c)));
        }
        for (int c = 0; c < kDim; ++c) {
          if (m.merge != Model::Merge::None) {
            // Merged rows are sums computed in float against double: one
            // rounding step of the element type either way.
            const double ek = roundToStored(expectedKeys.at(pos, c));
            const double ev = roundToStored(expectedValues.at(pos, c));
            ASSERT_NEAR(key[c], ek,
                        1.5 * kStoredUlp * std::max(1.0, std::fabs(ek)) + 1e-6)
                << where << " merged key " << pos;
            ASSERT_NEAR(value[c], ev,
                        1.5 * kStoredUlp * std::max(1.0, std::fabs(ev)) + 1e-6)
                << where << " merged value " << pos;
          } else if (m.storage == Model::Storage::MixedInt8Int2) {
            // Checked above, per class.
          } else if (!m.quantized()) {
            ASSERT_EQ(key[c], roundToStored(keys.at(pos, c)))
                << where << " key " << pos;
            ASSERT_EQ(value[c], roundToStored(values.at(pos, c)))
                << where << " value " << pos;
          } else {
            EXPECT_LE(std::fabs(key[c] - keys.at(pos, c)),
                      storageBound(m.storage, keys.at(pos, c), keyLo, keyHi,
                                   keyAbs))
                << where << " key " << pos;
            EXPECT_LE(std::fabs(value[c] - values.at(pos, c)),
                      storageBound(m.storage, values.at(pos, c), valueLo,
                                   valueHi, valueAbs))
                << where << " value " << pos;
          }
          e.key[c] = key[c];
          e.value[c] = value[c];
        }
        if (m.score == Model::Score::Accumulated) {
          const double state = groupState[pos];
          EXPECT_NEAR(meta.score[slot], state, 1e-3 * std::max(1.0, state))
              << where << " state " << pos;
          e.state = state;
        }
        if (m.score == Model::Score::Persistence) {
          e.weights = persistenceWeights[pos];
          PersistenceCount c =
              persistenceCount(e.weights, m.history, m.threshold);
          // Bit a: the query a steps before the last.
          const int steps = static_cast<int>(e.weights.size());
          for (int a = 0; a < 64; ++a) {
            const bool bit = (meta.history[slot] >> a) & 1u;
            const bool want =
                a < steps && e.weights[steps - 1 - a] > m.threshold;
            if (!c.ambiguous) {
              EXPECT_EQ(bit, want) << where << " history bit " << a
                                   << " of " << pos;
            }
          }
        }
        cache[layer][h].push_back(e);
      }
    }
  }

  // Decode steps.
  for (int step = 0; step < kDecodeSteps; ++step) {
    const int32_t position = kPrompt + step;
    for (int layer = 0; layer < kLayers; ++layer) {
      LayerInputs in = makeInputs(rng, 1, structured, position);
      // The workspace is sized by the largest head of the layer.
      int32_t slots = 0;
      for (int h = 0; h < kKvHeads; ++h) {
        int32_t headSlots = 0;
        ASSERT_EQ(kvc_get_num_slots(context, 0, layer, h, &headSlots),
                  KVC_STATUS_OK);
        slots = std::max(slots, headSlots);
      }
      std::vector<char> ws(test.api.decodeBytes(slots + 2 * kPageSize));
      std::vector<float> out(in.q.size());
      ASSERT_EQ(test.api.decode(context, 0, layer, in.q.data(), in.k.data(),
                                in.v.data(), position, out.data(), ws.data(),
                                ws.size()),
                KVC_STATUS_OK)
          << kvc_last_error();
      std::vector<ref::AttentionResult> atts(kKvHeads);
      auto whereOf = [&](int h) {
        return std::string(test.api.name) + " step " + std::to_string(step) +
               " layer " + std::to_string(layer) + " head " +
               std::to_string(h);
      };
      for (int h = 0; h < kKvHeads; ++h) {
        std::string where = whereOf(h);
        std::vector<RefEntry> &entries = cache[layer][h];
        // The new entry, as stored. KIVI keeps it in the full-precision
        // residual window, so it is rounded like full storage.
        RefEntry fresh{position, ref::Vector(kDim), ref::Vector(kDim)};
        for (int c = 0; c < kDim; ++c) {
          fresh.key[c] = roundToStored(in.k[h * kDim + c]);
          fresh.value[c] = roundToStored(in.v[h * kDim + c]);
        }
        entries.push_back(fresh);
        if (m.quantized()) {
          // Quantized storage: attend over what the runtime stores now.
          std::map<int, int> live = livePositions(layer, h);
          std::vector<float> key(kDim), value(kDim);
          for (RefEntry &e : entries) {
            ASSERT_EQ(kvc_read_entry(context, 0, layer, h, live.at(e.position),
                                     kDim, key.data(), value.data()),
                      KVC_STATUS_OK);
            for (int c = 0; c < kDim; ++c) {
              e.key[c] = key[c];
              e.value[c] = value[c];
            }
          }
        }
        ref::Matrix keys(static_cast<int>(entries.size()), kDim);
        ref::Matrix values(static_cast<int>(entries.size()), kDim);
        for (size_t i = 0; i < entries.size(); ++i)
          for (int c = 0; c < kDim; ++c) {
            keys.at(i, c) = entries[i].key[c];
            values.at(i, c) = entries[i].value[c];
          }
        std::vector<ref::Matrix> queries;
        for (int g = 0; g < kGroup; ++g) {
          ref::Matrix qm(1, kDim);
          for (int c = 0; c < kDim; ++c)
            qm.at(0, c) = in.q[(h * kGroup + g) * kDim + c];
          queries.push_back(qm);
        }
        atts[h] = ref::attention(queries, {keys}, {values});
        double worst = 0.0;
        for (int g = 0; g < kGroup; ++g)
          for (int c = 0; c < kDim; ++c)
            worst = worseOf(worst,
                            std::fabs(atts[h].output[g].at(0, c) -
                                      out[(h * kGroup + g) * kDim + c]));
        EXPECT_LT(worst, 2e-4) << where << ": decode output";
      }

      // TOVA: the new query's weights averaged over every head of the layer
      // (every head holds the same entries, in the same order).
      ref::Vector layerScore(cache[layer][0].size(), 0.0);
      if (m.score == Model::Score::LastLayer)
        for (int h = 0; h < kKvHeads; ++h) {
          ASSERT_EQ(cache[layer][h].size(), layerScore.size());
          for (const ref::Matrix &p : atts[h].probabilities)
            for (size_t i = 0; i < layerScore.size(); ++i)
              layerScore[i] += p.at(0, static_cast<int>(i)) / kQHeads;
        }

      for (int h = 0; h < kKvHeads; ++h) {
        std::string where = whereOf(h);
        std::vector<RefEntry> &entries = cache[layer][h];
        const ref::AttentionResult &att = atts[h];
        // The reference policy's decode-time eviction.
        if (m.evictsAtDecode) {
          ref::Vector base(entries.size());
          bool ambiguous = false;
          for (size_t i = 0; i < entries.size(); ++i) {
            double groupMean = 0.0;
            for (int g = 0; g < kGroup; ++g)
              groupMean += att.probabilities[g].at(0, i) / kGroup;
            if (m.score == Model::Score::Persistence) {
              entries[i].weights.push_back(groupMean);
              PersistenceCount c = persistenceCount(entries[i].weights,
                                                    m.history, m.threshold);
              base[i] = c.count;
              ambiguous |= c.ambiguous;
            } else if (m.score == Model::Score::Periodic) {
              // RPC: the selector window sums the queries of the last
              // `window` positions of each period; the window's own
              // entries score 0.
              const int phase = position % m.period;
              if (phase == m.period - m.window)
                entries[i].state = 0.0;
              if (phase >= m.period - m.window)
                entries[i].state += groupMean;
              base[i] = entries[i].position > position - m.window
                            ? 0.0
                            : entries[i].state / m.window;
            } else if (m.score == Model::Score::LastLayer) {
              base[i] = layerScore[i];
            } else if (m.score == Model::Score::Accumulated) {
              double p = 0.0;
              for (int g = 0; g < kGroup; ++g)
                p += att.probabilities[g].at(0, i) / kGroup;
              entries[i].state = ref::decayedAccumulate(
                  {entries[i].state}, {p}, m.decay)[0];
              base[i] = entries[i].state;
            } else {
              base[i] = entries[i].position;
            }
          }
          // Entries are in position order, so index-based protection is
          // position-based protection.
          std::vector<size_t> order(entries.size());
          for (size_t i = 0; i < order.size(); ++i)
            order[i] = i;
          std::sort(order.begin(), order.end(), [&](size_t a, size_t b) {
            return entries[a].position < entries[b].position;
          });
          std::vector<RefEntry> sorted;
          ref::Vector sortedBase;
          for (size_t i : order) {
            sorted.push_back(entries[i]);
            sortedBase.push_back(base[i]);
          }
          entries = sorted;
          Selection sel;
          sel.scores = ref::protect(sortedBase, m.sinks, m.recent);
          sel.exact = m.score == Model::Score::Persistence && !ambiguous;
          // RPC compresses only after the last position of a period.
          const bool acts = m.score != Model::Score::Periodic ||
                            (position + 1) % m.period == 0;
          sel.kept = ref::topK(
              sel.scores,
              static_cast<int>(std::min<int64_t>(
                  acts ? m.budgetOf(layer, h, entries.size())
                       : static_cast<int64_t>(entries.size()),
                  entries.size())));
          std::map<int, int> live = livePositions(layer, h);
          std::set<int> actualIdx;
          for (size_t i = 0; i < entries.size(); ++i)
            if (live.count(entries[i].position))
              actualIdx.insert(static_cast<int>(i));
          EXPECT_EQ(live.size(), actualIdx.size())
              << where << ": the runtime holds an entry the reference lacks";
          expectSameKept(sel, actualIdx, where);
          std::vector<RefEntry> kept;
          for (size_t i = 0; i < entries.size(); ++i)
            if (actualIdx.count(static_cast<int>(i)))
              kept.push_back(entries[i]);
          entries = kept;
          if (m.score == Model::Score::Accumulated) {
            kvc_metadata_t meta{};
            ASSERT_EQ(kvc_get_metadata(context, 0, layer, h, &meta),
                      KVC_STATUS_OK);
            for (const RefEntry &e : entries)
              EXPECT_NEAR(meta.score[live.at(e.position)], e.state,
                          1e-3 * std::max(1.0, e.state))
                  << where << " state " << e.position;
          }
        } else {
          EXPECT_EQ(livePositions(layer, h).size(), entries.size())
              << where << ": no eviction at decode";
        }
      }
    }
  }
}

std::string caseName(
    const ::testing::TestParamInfo<std::tuple<int, bool>> &info) {
  return std::string(allCases()[std::get<0>(info.param)].api.name) +
         (std::get<1>(info.param) ? "_structured" : "_random");
}

INSTANTIATE_TEST_SUITE_P(
    Policies, GeneratedPolicyTest,
    ::testing::Combine(::testing::Range(0, static_cast<int>(allCases().size())),
                       ::testing::Bool()),
    caseName);

#ifndef KVC_TEST_UNFUSED
/// SnapKV's score of every prompt entry of one kv-head: the window mean of
/// the last `window` queries over the prefix, average-pooled, the group
/// mean, the window itself protected.
ref::Vector snapkvScores(const std::vector<ref::Matrix> &probabilities,
                         int window, int kernel) {
  const int n = probabilities[0].cols, w = std::min(window, n);
  std::vector<ref::Vector> perQuery;
  for (const ref::Matrix &p : probabilities) {
    ref::Vector mean = ref::windowMean(p, w);
    ref::Vector prefix(mean.begin(), mean.end() - w);
    ref::Vector pooled = ref::pool1d(prefix, kernel, ref::PoolKind::Avg);
    pooled.resize(n, 0.0);
    perQuery.push_back(pooled);
  }
  return ref::protect(ref::groupReduce(perQuery, 1, ref::ReduceKind::Mean)[0],
                      0, w);
}

/// policies/snapkv_global.mlir: the prefill of every layer keeps every
/// entry and stores its SnapKV score; the select kernel then keeps
/// 1024 x layers x kv-heads entries by one top-k over all of them (the
/// oracle's globalTopK), so heads end with different counts.
TEST(GlobalBudget, OneSelectionOverEveryLayerAndHead) {
  for (bool structured : {false, true}) {
    SCOPED_TRACE(structured ? "structured" : "random");
    kvc_config_t config{};
    kvc_snapkv_global_cpu_configure(&config);
    config.page_size = kPageSize;
    config.num_pages = kLayers * kKvHeads * (kPrompt / kPageSize + 2);
    config.max_sequences = 1;
    config.memory = KVC_MEMORY_HOST;
    uint64_t bytes = 0;
    ASSERT_EQ(kvc_pool_bytes_required(&config, &bytes), KVC_STATUS_OK);
    std::unique_ptr<char, void (*)(void *)> pool(
        static_cast<char *>(std::aligned_alloc(
            KVC_POOL_ALIGNMENT, (bytes + 255) / 256 * 256)),
        std::free);
    kvc_context_t *context = nullptr;
    ASSERT_EQ(kvc_context_create(&config, pool.get(), bytes, &context),
              KVC_STATUS_OK);
    ASSERT_EQ(kvc_sequence_add(context, 0), KVC_STATUS_OK);
    std::mt19937 rng(77 + structured);
    std::vector<int32_t> positions(kPrompt);
    for (int i = 0; i < kPrompt; ++i)
      positions[i] = i;
    std::vector<char> ws(kvc_snapkv_global_cpu_prefill_workspace_bytes(kPrompt));
    // Per (layer, head), in the order layer * kKvHeads + h.
    std::vector<ref::Vector> scores;
    std::vector<LayerInputs> inputs;
    for (int layer = 0; layer < kLayers; ++layer) {
      LayerInputs in = makeInputs(rng, kPrompt, structured, 0);
      std::vector<float> out(in.q.size());
      ASSERT_EQ(kvc_snapkv_global_cpu_prefill(
                    context, 0, layer, kPrompt, in.q.data(), in.k.data(),
                    in.v.data(), positions.data(), out.data(), ws.data(),
                    ws.size()),
                KVC_STATUS_OK)
          << kvc_last_error();
      for (int h = 0; h < kKvHeads; ++h) {
        std::vector<ref::Matrix> queries;
        for (int g = 0; g < kGroup; ++g)
          queries.push_back(headRows(in.q, kPrompt, kQHeads, h * kGroup + g));
        ref::AttentionResult att =
            ref::attention(queries, {headRows(in.k, kPrompt, kKvHeads, h)},
                           {headRows(in.v, kPrompt, kKvHeads, h)});
        scores.push_back(snapkvScores(att.probabilities, 64, 5));
        // Nothing is evicted before the selection; each entry holds its
        // score.
        kvc_metadata_t meta{};
        ASSERT_EQ(kvc_get_metadata(context, 0, layer, h, &meta),
                  KVC_STATUS_OK);
        int live = 0;
        for (int s = 0; s < meta.num_slots; ++s) {
          if (meta.position[s] == KVC_POSITION_NONE)
            continue;
          ++live;
          const double want = scores.back()[meta.position[s]];
          if (std::isinf(want))
            EXPECT_TRUE(std::isinf(meta.score[s]) && meta.score[s] > 0);
          else
            EXPECT_NEAR(meta.score[s], want, 1e-4 * std::max(want, 1e-3))
                << "layer " << layer << " head " << h << " position "
                << meta.position[s];
        }
        EXPECT_EQ(live, kPrompt);
      }
      inputs.push_back(in);
    }

    std::vector<char> selectWs(
        kvc_snapkv_global_cpu_select_workspace_bytes(kPrompt));
    EXPECT_EQ(kvc_snapkv_global_cpu_select(context, 0, kPrompt,
                                           selectWs.data(),
                                           selectWs.size() - 1),
              KVC_STATUS_BUFFER_TOO_SMALL);
    ASSERT_EQ(kvc_snapkv_global_cpu_select(context, 0, kPrompt,
                                           selectWs.data(), selectWs.size()),
              KVC_STATUS_OK)
        << kvc_last_error();

    const int64_t total = int64_t{1024} * kLayers * kKvHeads;
    std::vector<std::vector<int>> want = ref::globalTopK(scores, total);
    // The global boundary: entries whose score is within float rounding of
    // the lowest kept score may swap with one another.
    double boundary = INFINITY, scale = 0.0;
    for (size_t lh = 0; lh < want.size(); ++lh) {
      for (int i : want[lh])
        boundary = std::min(boundary, scores[lh][i]);
      for (double x : scores[lh])
        if (std::isfinite(x))
          scale = std::max(scale, x);
    }
    int64_t kept = 0;
    std::set<int> counts;
    for (int layer = 0; layer < kLayers; ++layer)
      for (int h = 0; h < kKvHeads; ++h) {
        const size_t lh = static_cast<size_t>(layer) * kKvHeads + h;
        kvc_metadata_t meta{};
        ASSERT_EQ(kvc_get_metadata(context, 0, layer, h, &meta),
                  KVC_STATUS_OK);
        std::set<int> actual;
        for (int s = 0; s < meta.num_slots; ++s)
          if (meta.position[s] != KVC_POSITION_NONE)
            actual.insert(meta.position[s]);
        std::set<int> expected(want[lh].begin(), want[lh].end());
        for (int i = 0; i < kPrompt; ++i)
          if (actual.count(i) != expected.count(i)) {
            EXPECT_LE(std::fabs(scores[lh][i] - boundary), 1e-5 * scale)
                << "layer " << layer << " head " << h << " entry " << i
                << (actual.count(i) ? " kept" : " evicted")
                << " against the oracle";
          }
        kept += static_cast<int64_t>(actual.size());
        counts.insert(static_cast<int>(actual.size()));
        // The window is always kept.
        for (int i = kPrompt - 64; i < kPrompt; ++i)
          EXPECT_TRUE(actual.count(i)) << "window entry " << i;
      }
    EXPECT_EQ(kept, std::min<int64_t>(total, int64_t{kPrompt} * kLayers *
                                                  kKvHeads));
    if (kLayers * kKvHeads > 1) {
      EXPECT_GT(counts.size(), 1u) << "heads should end with different counts";
    }
    kvc_context_destroy(context);
  }
}

/// Bad input to a generated entry point is reported, not crashed on.
TEST(GeneratedPolicyErrors, ValidatesItsInputs) {
  kvc_config_t config{};
  kvc_snapkv_cpu_configure(&config);
  config.page_size = kPageSize;
  config.num_pages = 8;
  config.max_sequences = 1;
  config.memory = KVC_MEMORY_HOST;
  uint64_t bytes = 0;
  ASSERT_EQ(kvc_pool_bytes_required(&config, &bytes), KVC_STATUS_OK);
  std::unique_ptr<char, void (*)(void *)> pool(
      static_cast<char *>(std::aligned_alloc(
          KVC_POOL_ALIGNMENT, (bytes + 255) / 256 * 256)),
      std::free);
  kvc_context_t *context = nullptr;
  ASSERT_EQ(kvc_context_create(&config, pool.get(), bytes, &context),
            KVC_STATUS_OK);
  ASSERT_EQ(kvc_sequence_add(context, 0), KVC_STATUS_OK);
  std::vector<float> q(kQHeads * kDim * 4), k(kKvHeads * kDim * 4), v = k,
      out = q;
  std::vector<int32_t> positions{0, 1, 2, 3};
  std::vector<char> ws(kvc_snapkv_cpu_prefill_workspace_bytes(4));

  EXPECT_EQ(kvc_snapkv_cpu_prefill(context, 0, 0, 4, nullptr, k.data(),
                                   v.data(), positions.data(), out.data(),
                                   ws.data(), ws.size()),
            KVC_STATUS_NULL_POINTER);
  EXPECT_STREQ(kvc_last_error(), "kvc_snapkv_cpu_prefill: null argument");
  EXPECT_EQ(kvc_snapkv_cpu_prefill(context, 0, kLayers, 4, q.data(), k.data(),
                                   v.data(), positions.data(), out.data(),
                                   ws.data(), ws.size()),
            KVC_STATUS_OUT_OF_RANGE);
  EXPECT_STREQ(kvc_last_error(),
               "kvc_snapkv_cpu_prefill: layer out of range");
  EXPECT_EQ(kvc_snapkv_cpu_prefill(context, 0, 0, 4, q.data(), k.data(),
                                   v.data(), positions.data(), out.data(),
                                   ws.data(), ws.size() - 1),
            KVC_STATUS_BUFFER_TOO_SMALL);
  // A valid call, then a second prefill of the same layer is refused and
  // leaves the cache as it was.
  ASSERT_EQ(kvc_snapkv_cpu_prefill(context, 0, 0, 4, q.data(), k.data(),
                                   v.data(), positions.data(), out.data(),
                                   ws.data(), ws.size()),
            KVC_STATUS_OK)
      << kvc_last_error();
  EXPECT_EQ(kvc_snapkv_cpu_prefill(context, 0, 0, 4, q.data(), k.data(),
                                   v.data(), positions.data(), out.data(),
                                   ws.data(), ws.size()),
            KVC_STATUS_INVALID_ARGUMENT);
  EXPECT_STREQ(kvc_last_error(),
               "kvc_snapkv_cpu_prefill: prefill needs an empty cache");
  int32_t live = 0;
  ASSERT_EQ(kvc_get_num_entries(context, 0, 0, 0, &live), KVC_STATUS_OK);
  EXPECT_EQ(live, 4);
  // A context of another geometry is rejected.
  kvc_config_t other = config;
  other.head_dim = kDim * 2;
  uint64_t otherBytes = 0;
  ASSERT_EQ(kvc_pool_bytes_required(&other, &otherBytes), KVC_STATUS_OK);
  std::unique_ptr<char, void (*)(void *)> otherPool(
      static_cast<char *>(std::aligned_alloc(
          KVC_POOL_ALIGNMENT, (otherBytes + 255) / 256 * 256)),
      std::free);
  kvc_context_t *otherContext = nullptr;
  ASSERT_EQ(kvc_context_create(&other, otherPool.get(), otherBytes,
                               &otherContext),
            KVC_STATUS_OK);
  ASSERT_EQ(kvc_sequence_add(otherContext, 0), KVC_STATUS_OK);
  EXPECT_EQ(kvc_snapkv_cpu_prefill(otherContext, 0, 0, 4, q.data(), k.data(),
                                   v.data(), positions.data(), out.data(),
                                   ws.data(), ws.size()),
            KVC_STATUS_GEOMETRY_MISMATCH);
  kvc_context_destroy(otherContext);
  kvc_context_destroy(context);
}
#endif

} // namespace
