//===- ReferenceTest.cpp - The oracle on hand-computed cases --------------===//
//
// The reference is what everything else is judged by, so it is pinned on
// small cases whose numbers are derived by hand in the comments (never
// copied from the code's output).
//
//===----------------------------------------------------------------------===//

#include "test/reference/Reference.h"

#include "gtest/gtest.h"

#include <cmath>
#include <limits>
#include <random>

namespace {

using namespace kvc::ref;

constexpr double kTol = 1e-12;
const double kInf = std::numeric_limits<double>::infinity();

void expectVector(const Vector &got, const Vector &want, double tol = kTol) {
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i) {
    if (std::isinf(want[i])) {
      EXPECT_EQ(got[i], want[i]) << i;
    } else {
      EXPECT_NEAR(got[i], want[i], tol) << i;
    }
  }
}

//===----------------------------------------------------------------------===//
// Attention and statistics
//===----------------------------------------------------------------------===//

TEST(ReferenceAttention, CausalGqaByHand) {
  // d = 1 (scale 1/sqrt(1) = 1), n = 2, nq = 2, keys 0 and ln 3, values 2
  // and 6. Query head 0 has q = 1: query 0 sees entry 0 only (p = 1);
  // query 1 sees both with weights e^0 : e^ln3 = 1 : 3 -> (1/4, 3/4), output
  // 2/4 + 18/4 = 5. Query head 1 (same kv head: GQA group of 2) has q = 0:
  // query 1 weighs both equally -> output 4.
  std::vector<Matrix> q = {Matrix::fromRows({{1}, {1}}),
                           Matrix::fromRows({{0}, {0}})};
  std::vector<Matrix> k = {Matrix::fromRows({{0}, {std::log(3.0)}})};
  std::vector<Matrix> v = {Matrix::fromRows({{2}, {6}})};
  AttentionResult r = attention(q, k, v);
  ASSERT_EQ(r.probabilities.size(), 2u);
  expectVector(r.probabilities[0].row(0), {1, 0});
  expectVector(r.probabilities[0].row(1), {0.25, 0.75});
  expectVector(r.output[0].row(0), {2});
  expectVector(r.output[0].row(1), {5});
  expectVector(r.probabilities[1].row(1), {0.5, 0.5});
  expectVector(r.output[1].row(1), {4});

  // Statistics of head 0.
  const Matrix &p = r.probabilities[0];
  expectVector(windowMean(p, 1), {0.25, 0.75});
  expectVector(windowMean(p, 2), {(1 + 0.25) / 2, 0.75 / 2});
  expectVector(lastQuery(p), {0.25, 0.75});
  // H2O: sums (1.25, 0.75); entry 0 is seen by 2 queries, entry 1 by 1.
  expectVector(h2oScores(p, false), {1.25, 0.75});
  expectVector(h2oScores(p, true), {0.625, 0.75});
}

TEST(ReferenceAttention, QueriesAreTheLastTokens) {
  // n = 3 entries, nq = 1 query at position 2: it sees all three. d = 2,
  // q = (0, 0) -> uniform 1/3; H2O normalization: 1 query sees each entry.
  std::vector<Matrix> q = {Matrix::fromRows({{0, 0}})};
  std::vector<Matrix> k = {Matrix::fromRows({{1, 0}, {0, 1}, {1, 1}})};
  std::vector<Matrix> v = {Matrix::fromRows({{3, 0}, {0, 3}, {3, 3}})};
  AttentionResult r = attention(q, k, v);
  expectVector(r.probabilities[0].row(0), {1.0 / 3, 1.0 / 3, 1.0 / 3});
  expectVector(r.output[0].row(0), {2, 2});
  expectVector(h2oScores(r.probabilities[0], true),
               {1.0 / 3, 1.0 / 3, 1.0 / 3});
}

TEST(ReferenceStatistics, DecayAndPersistence) {
  // s = 0.5 * (1, 2) + (0.5, 0.25) = (1, 1.25).
  expectVector(decayedAccumulate({1, 2}, {0.5, 0.25}, 0.5), {1.0, 1.25});
  // A fresh entry (no state yet) starts at p.
  expectVector(decayedAccumulate({1}, {0.5, 0.25}, 0.5), {1.0, 0.25});
  // Steps: (0.5, 0.1, 0.4), (0.2, 0.6, 0.2), (0.7, 0.2, 0.1), threshold 0.3.
  // Above threshold: step0 (T, F, T), step1 (F, T, F), step2 (T, F, F).
  std::vector<Vector> history = {
      {0.5, 0.1, 0.4}, {0.2, 0.6, 0.2}, {0.7, 0.2, 0.1}};
  expectVector(scissorhandsCounts(history, 2, 0.3), {1, 1, 0});
  expectVector(scissorhandsCounts(history, 3, 0.3), {2, 1, 1});
}

//===----------------------------------------------------------------------===//
// Score transforms
//===----------------------------------------------------------------------===//

TEST(ReferenceScores, Pooling) {
  // Avg, kernel 3, zero padding counted: (0+3+6)/3 = 3, (3+6+9)/3 = 6,
  // (6+9+12)/3 = 9, (9+12+0)/3 = 7.
  expectVector(pool1d({3, 6, 9, 12}, 3, PoolKind::Avg), {3, 6, 9, 7});
  // Kernel 5 over three 5s: every window holds 15 -> 15 / 5 = 3.
  expectVector(pool1d({5, 5, 5}, 5, PoolKind::Avg), {3, 3, 3});
  // Max pads with -inf, so edges see only real values.
  expectVector(pool1d({1, 5, 2, 0}, 3, PoolKind::Max), {5, 5, 5, 2});
  expectVector(pool1d({-1, -2, -3}, 3, PoolKind::Max), {-1, -1, -2});
  // Kernel 1 is the identity.
  expectVector(pool1d({4, 2}, 1, PoolKind::Avg), {4, 2});
}

TEST(ReferenceScores, GroupReductionAndNormalization) {
  // 4 query heads, 2 kv heads: groups {0, 1} and {2, 3}.
  std::vector<Vector> heads = {{1, 2}, {3, 4}, {5, 0}, {1, 1}};
  auto mean = groupReduce(heads, 2, ReduceKind::Mean);
  expectVector(mean[0], {2, 3});
  expectVector(mean[1], {3, 0.5});
  auto max = groupReduce(heads, 2, ReduceKind::Max);
  expectVector(max[0], {3, 4});
  expectVector(max[1], {5, 1});
  // z-score of (1, 2, 3, 4): mean 2.5, population variance (2.25 + 0.25 +
  // 0.25 + 2.25) / 4 = 1.25.
  double sd = std::sqrt(1.25);
  expectVector(zscore({1, 2, 3, 4}),
               {-1.5 / sd, -0.5 / sd, 0.5 / sd, 1.5 / sd});
  expectVector(zscore({7, 7, 7}), {0, 0, 0});
  expectVector(weightedSum({1, 2}, 0.5, {4, 8}, 0.25), {1.5, 3});
}

TEST(ReferenceScores, KeyAndValueGeometry) {
  Matrix keys = Matrix::fromRows({{3, 4}, {0, 0}});
  expectVector(keyNormScores(keys), {-5, 0});
  // KeyDiff: unit keys (1,0), (0,1), (1,0) -> mean (2/3, 1/3), norm
  // sqrt(5)/3. cos((1,0), m) = (2/3) / (sqrt(5)/3) = 2/sqrt(5); cos((0,2),
  // m) = 1/sqrt(5).
  Matrix diverse = Matrix::fromRows({{1, 0}, {0, 2}, {1, 0}});
  expectVector(keyDiversityScores(diverse),
               {-2 / std::sqrt(5.0), -1 / std::sqrt(5.0), -2 / std::sqrt(5.0)});
  Matrix values = Matrix::fromRows({{3, 4}, {1, 0}});
  expectVector(valueNorms(values), {5, 1});
  expectVector(valueAwareScores({0.5, 2}, values), {2.5, 2});
  expectVector(protect({1, 2, 3, 4, 5}, 1, 2), {kInf, 2, 3, kInf, kInf});
}

TEST(ReferenceScores, ExpectedAttentionAndKeyformer) {
  // d = 2 (sqrt 2), mu = (sqrt 2, 0), Sigma = 0: logits k_i . mu / sqrt 2 =
  // k_i0 -> keys (0, 5) and (ln 3, 1) give logits 0 and ln 3 -> softmax
  // (1/4, 3/4); value norms 4 and 2 -> scores (1, 1.5).
  Matrix keys = Matrix::fromRows({{0, 5}, {std::log(3.0), 1}});
  Matrix values = Matrix::fromRows({{0, 4}, {2, 0}});
  Matrix zero(2, 2, 0.0);
  expectVector(expectedAttentionScores(keys, values, {std::sqrt(2.0), 0}, zero),
               {1, 1.5});
  // mu = 0, Sigma = 2 I: logits 1/2 k^T (2I) k / 2 = |k|^2 / 2: keys (1, 1)
  // and (0, 0) give 1 and 0 -> softmax (e / (e + 1), 1 / (e + 1)).
  Matrix sigma = Matrix::fromRows({{2, 0}, {0, 2}});
  Matrix k2 = Matrix::fromRows({{1, 1}, {0, 0}});
  Matrix unitValues = Matrix::fromRows({{1, 0}, {0, 1}});
  double e = std::exp(1.0);
  expectVector(expectedAttentionScores(k2, unitValues, {0, 0}, sigma),
               {e / (e + 1), 1 / (e + 1)});
  // Keyformer: logits (0, 0), noise (ln 3, 0), tau 1 -> (3/4, 1/4); with
  // tau 2 the perturbation halves: (ln 3 / 2, 0) -> (sqrt 3, 1) / (sqrt 3 +
  // 1).
  expectVector(keyformerStep({0, 0}, {std::log(3.0), 0}, 1.0), {0.75, 0.25});
  double s3 = std::sqrt(3.0);
  expectVector(keyformerStep({0, 0}, {std::log(3.0), 0}, 2.0),
               {s3 / (s3 + 1), 1 / (s3 + 1)});
}

//===----------------------------------------------------------------------===//
// Selection and budgets
//===----------------------------------------------------------------------===//

TEST(ReferenceSelection, TopKTiesGoToTheMoreRecentEntry) {
  // Three entries tie at 3 (indices 1, 2, 4): k = 2 keeps 4 and 2.
  EXPECT_EQ(topK({1, 3, 3, 2, 3}, 2), (std::vector<int>{2, 4}));
  EXPECT_EQ(topK({1, 3, 3, 2, 3}, 4), (std::vector<int>{1, 2, 3, 4}));
  EXPECT_EQ(topK({5, 5, 5}, 1), (std::vector<int>{2}));
  EXPECT_EQ(topK({1, 2}, 0), (std::vector<int>{}));
  EXPECT_EQ(topK({1, 2}, 10), (std::vector<int>{0, 1}));
  // Protected entries always survive.
  EXPECT_EQ(topK(protect({9, 0, 0, 9, 0}, 1, 1), 2), (std::vector<int>{0, 4}));
}

TEST(ReferenceBudgets, Uniform) {
  EXPECT_EQ(uniformBudget(100, 30), 30);
  EXPECT_EQ(uniformBudget(10, 30), 10);
  // int(n * (1 - ratio)) in double: 10 * 0.7 rounds to exactly 7.0; 7 * 0.5
  // = 3.5 -> 3; 1 - 0.9 = 0.09999999999999998, times 10 = 0.9999999999999998
  // -> 0 (no epsilon, as in the reference lib).
  EXPECT_EQ(uniformBudgetFromRatio(10, 0.3), 7);
  EXPECT_EQ(uniformBudgetFromRatio(7, 0.5), 3);
  EXPECT_EQ(uniformBudgetFromRatio(10, 0.9), 0);
  EXPECT_EQ(uniformBudgetFromRatio(10, 0.0), 10);
}

TEST(ReferenceBudgets, PyramidTables) {
  // C = 128, W = 8, beta = 20, N = 4 layers; C - W = 120.
  // L = 1000: min = 120 // 20 = 6, max = 240 - 6 = 234 < L - W = 992;
  // step = (234 - 6) // 3 = 76 -> 234, 158, 82, 6 (sum 480 = 4 x 120).
  PyramidBudgets b = pyramidBudgets(128, 8, 20, 1000, 4);
  EXPECT_EQ(b.branch, PyramidBudgets::Branch::Pyramid);
  EXPECT_EQ(b.selected, (std::vector<int64_t>{234, 158, 82, 6}));
  EXPECT_EQ(b.total, (std::vector<int64_t>{242, 166, 90, 14}));

  // L = 241: max 234 >= L - W = 233 -> max = 233, min = 240 - 233 = 7;
  // step = (233 - 7) // 3 = 75 -> 233, 158, 83, 8.
  b = pyramidBudgets(128, 8, 20, 241, 4);
  EXPECT_EQ(b.branch, PyramidBudgets::Branch::Pyramid);
  EXPECT_EQ(b.selected, (std::vector<int64_t>{233, 158, 83, 8}));
  EXPECT_EQ(b.total, (std::vector<int64_t>{241, 166, 91, 16}));

  // Fallback 1: L = 100 < C = 128: no compression, every layer keeps 100.
  b = pyramidBudgets(128, 8, 20, 100, 4);
  EXPECT_EQ(b.branch, PyramidBudgets::Branch::NoCompression);
  EXPECT_EQ(b.total, (std::vector<int64_t>{100, 100, 100, 100}));

  // Fallback 2: C <= L = 200 < 2 (C - W) = 240: plain SnapKV, every layer
  // selects C - W = 120 and keeps 128 with its window.
  b = pyramidBudgets(128, 8, 20, 200, 4);
  EXPECT_EQ(b.branch, PyramidBudgets::Branch::Uniform);
  EXPECT_EQ(b.selected, (std::vector<int64_t>{120, 120, 120, 120}));
  EXPECT_EQ(b.total, (std::vector<int64_t>{128, 128, 128, 128}));

  // L = 240 is the first pyramid length: max = 234 >= 232 -> max = 232,
  // min = 8, step = 224 // 3 = 74 -> 232, 158, 84, 10.
  b = pyramidBudgets(128, 8, 20, 240, 4);
  EXPECT_EQ(b.selected, (std::vector<int64_t>{232, 158, 84, 10}));

  // 32 layers, C = 512, W = 32, beta = 20, L = 4096: C - W = 480,
  // min = 24, max = 936, step = 912 // 31 = 29 -> layer 31 keeps
  // 936 - 899 = 37.
  b = pyramidBudgets(512, 32, 20, 4096, 32);
  EXPECT_EQ(b.selected.front(), 936);
  EXPECT_EQ(b.selected[1], 907);
  EXPECT_EQ(b.selected.back(), 37);
}

TEST(ReferenceBudgets, AdaKvHandWorked) {
  // 2 heads, C = 5 (layer budget 10), alpha = 0.4: share floor(2.0) = 2.
  // Head 1 keeps its best two (indices 0, 1); head 0 keeps 0, 1, then the
  // global top 6 of the rest are all head 0's (8, 7, 6, 5, 4, 3 at indices
  // 2..7).
  std::vector<Vector> scores = {{10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0, 0},
                                {0.5, 0.4, 0.3, 0.2, 0.1, 0, 0, 0, 0, 0, 0, 0}};
  auto kept = adaKvSelect(scores, 5, 0.4);
  EXPECT_EQ(kept[0], (std::vector<int>{0, 1, 2, 3, 4, 5, 6, 7}));
  EXPECT_EQ(kept[1], (std::vector<int>{0, 1}));
}

TEST(ReferenceBudgets, AdaKvProperties) {
  std::mt19937 rng(3);
  std::exponential_distribution<double> dist(1.0);
  for (int trial = 0; trial < 50; ++trial) {
    const int heads = 8, n = 64, c = 16;
    std::vector<Vector> scores(heads, Vector(n));
    for (int h = 0; h < heads; ++h)
      for (double &x : scores[h])
        x = dist(rng) * (h + 1) * (h + 1); // heads differ in scale
    auto kept = adaKvSelect(scores, c, 0.2);
    size_t total = 0;
    for (int h = 0; h < heads; ++h) {
      EXPECT_GE(kept[h].size(), 3u); // floor(0.2 * 16) = 3
      total += kept[h].size();
      // A head's top three are always among its kept entries.
      for (int i : topK(scores[h], 3))
        EXPECT_TRUE(std::binary_search(kept[h].begin(), kept[h].end(), i));
    }
    EXPECT_EQ(total, static_cast<size_t>(heads * c));
  }
}

TEST(ReferenceBudgets, GlobalAndHeadClasses) {
  // Scores of two heads; a global budget of 4 takes 9, 8, 7 and then one of
  // the two 5s: the tie goes to the larger entry index (head 1's index 2).
  std::vector<Vector> scores = {{9, 5, 1}, {8, 7, 5}};
  auto kept = globalTopK(scores, 4);
  EXPECT_EQ(kept[0], (std::vector<int>{0}));
  EXPECT_EQ(kept[1], (std::vector<int>{0, 1, 2}));
  // Equal scores and indices: the later head wins.
  auto tie = globalTopK({{1, 1}, {1, 1}}, 1);
  EXPECT_TRUE(tie[0].empty());
  EXPECT_EQ(tie[1], (std::vector<int>{1}));
  EXPECT_EQ(headClassKeep(6, true, 1, 2), (std::vector<int>{0, 1, 2, 3, 4, 5}));
  EXPECT_EQ(headClassKeep(6, false, 1, 2), (std::vector<int>{0, 4, 5}));
}

//===----------------------------------------------------------------------===//
// Merges
//===----------------------------------------------------------------------===//

TEST(ReferenceMerge, IntoNearest) {
  // Kept keys k0 = (1, 0), k1 = (0, 1). Evicted k2 = (1, 1): cos 1/sqrt(2)
  // to both, the tie goes to the larger index, k1. Evicted k3 = (-1, 0):
  // cos -1 and 0 -> k1 with sim 0, so weight 0.
  // v1 = (0, 2), v2 = (6, 0): w = (1/sqrt 2) * 6 / (6 + 2) = 3 / (4 sqrt 2);
  // v1' = ((0, 2) + w (6, 0)) / (1 + w).
  Matrix keys = Matrix::fromRows({{1, 0}, {0, 1}, {1, 1}, {-1, 0}});
  Matrix values = Matrix::fromRows({{2, 0}, {0, 2}, {6, 0}, {5, 5}});
  Matrix merged = mergeIntoNearest(keys, values, {0, 1});
  double w = 3 / (4 * std::sqrt(2.0));
  expectVector(merged.row(0), {2, 0});
  expectVector(merged.row(1), {6 * w / (1 + w), 2 / (1 + w)});
}

TEST(ReferenceMerge, D2OThreshold) {
  // Kept k0 = (1, 0), k1 = (0, 1); evicted k2 = (1, 0) (sim 1 to k0) and
  // k3 = (3, 4) (cos 0.6 to k0, 0.8 to k1 -> k1). Mean sim = 0.9.
  Matrix keys = Matrix::fromRows({{1, 0}, {0, 1}, {1, 0}, {3, 4}});
  Matrix values = Matrix::fromRows({{2, 0}, {0, 2}, {0, 4}, {1, 1}});
  // tau 0.8 -> 0.5 * 0.8 + 0.5 * 0.9 = 0.85: k2 merges (1 >= 0.85), k3
  // (0.8) is dropped. k0' = (e k0 + e k2) / 2e = (1, 0); v0' = ((2,0) +
  // (0,4)) / 2 = (1, 2).
  D2OResult r = d2oMerge(keys, values, {0, 1}, 0.8);
  EXPECT_NEAR(r.threshold, 0.85, kTol);
  EXPECT_EQ(r.mergedInto, (std::vector<int>{0, -1}));
  expectVector(r.keys.row(0), {1, 0});
  expectVector(r.values.row(0), {1, 2});
  expectVector(r.keys.row(1), {0, 1});
  expectVector(r.values.row(1), {0, 2});
  // tau 0.6 -> 0.3 + 0.45 = 0.75: k3 merges into k1 with weight e^0.8
  // against e for k1 itself.
  r = d2oMerge(keys, values, {0, 1}, 0.6);
  EXPECT_NEAR(r.threshold, 0.75, kTol);
  EXPECT_EQ(r.mergedInto, (std::vector<int>{0, 1}));
  double e = std::exp(1.0), w = std::exp(0.8);
  expectVector(r.keys.row(1), {3 * w / (e + w), (e + 4 * w) / (e + w)});
  expectVector(r.values.row(1), {w / (e + w), (2 * e + w) / (e + w)});
}

TEST(ReferenceMerge, CaM) {
  // d = 1, values 1..5, entry 1 evicted. A = (0.1, 0.2, 0.1, 0.3, 0.5),
  // window 2 -> mean(0.3, 0.5) = 0.4, p = 0.2 / 0.4 = 0.5. m = 2: the next
  // kept entries after 1 are 2 and 3; each gets mask * v1 / m.
  Matrix values = Matrix::fromRows({{1}, {2}, {3}, {4}, {5}});
  Vector attention = {0.1, 0.2, 0.1, 0.3, 0.5};
  std::vector<int> kept = {0, 2, 3, 4};
  // Expectation: mask 0.5 -> += 0.5 * 2 / 2 = 0.5.
  Matrix expected = camMerge(values, kept, attention, 2, 2);
  expectVector(expected.data, {1, 3.5, 4.5, 5});
  // Draw 0.3 < 0.5 merges fully (+1); draw 0.7 does not.
  Vector draws = {0, 0.3, 0, 0, 0};
  expectVector(camMerge(values, kept, attention, 2, 2, &draws).data,
               {1, 4, 5, 5});
  draws[1] = 0.7;
  expectVector(camMerge(values, kept, attention, 2, 2, &draws).data,
               {1, 3, 4, 5});
  // p clamps to 1: A_1 = 2 -> += 2 / 2 = 1 for entries 2 and 3.
  attention[1] = 2;
  expectVector(camMerge(values, kept, attention, 2, 2).data, {1, 4, 5, 5});
}

//===----------------------------------------------------------------------===//
// Formats
//===----------------------------------------------------------------------===//

TEST(ReferenceFormats, HandValues) {
  EXPECT_EQ(fp8E4M3Encode(1.0), 0x38);
  EXPECT_EQ(fp8E4M3Encode(-448.0), 0xFE);
  EXPECT_EQ(fp8E4M3Encode(1000.0), 0x7E);
  EXPECT_EQ(fp8E4M3Encode(1.0625), 0x38);
  EXPECT_EQ(fp8E4M3Encode(1.1875), 0x3A);
  EXPECT_EQ(fp8E4M3Decode(0x77), 240.0);
  EXPECT_EQ(roundToF16(65520.0), kInf);
  EXPECT_EQ(roundToF16(65519.0), 65504.0);
  EXPECT_EQ(roundToF16(1.0 + std::ldexp(3.0, -11)), 1.0 + std::ldexp(1.0, -9));
  EXPECT_EQ(roundToBf16(1.0 + std::ldexp(1.0, -8)), 1.0);
  // KIVI simulation: R = 4, G = 2, 5 entries -> keys 0..3 flushed, value 0
  // quantized (only 5 - 4 = 1 entry is older than the window).
  Matrix k(5, 2, 1.0), v(5, 2, 1.0);
  KiviCache c = kiviSimulate(k, v, 2, 4, 2);
  EXPECT_EQ(c.keyQuantized, (std::vector<bool>{true, true, true, true, false}));
  EXPECT_EQ(c.valueQuantized,
            (std::vector<bool>{true, false, false, false, false}));
  Int8Vector q = quantizeInt8({127, -64, 0.5, 1.5, -2.5});
  EXPECT_EQ(q.q, (std::vector<int>{127, -64, 0, 2, -2}));
}

} // namespace
