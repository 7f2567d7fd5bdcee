//===- Reference.cpp - Double-precision oracle for kvc primitives ---------===//
//
// Each function follows its definition in POLICIES.md as literally as
// possible; loops over indices rather than clever vectorization, because the
// point is to be obviously right.
//
//===----------------------------------------------------------------------===//

#include "test/reference/Reference.h"

#include <algorithm>
#include <cassert>
#include <cmath>
#include <limits>
#include <numeric>
#include <utility>

namespace kvc::ref {

namespace {

constexpr double kInfinity = std::numeric_limits<double>::infinity();

double dot(const Vector &a, const Vector &b) {
  double sum = 0.0;
  for (size_t i = 0; i < a.size(); ++i)
    sum += a[i] * b[i];
  return sum;
}

double norm(const Vector &a) { return std::sqrt(dot(a, a)); }

/// a.b over n elements, in four interleaved partial sums (so that the
/// compiler may vectorize them) added at the end.
double dotRows(const double *a, const double *b, int n) {
  double partial[4] = {0.0, 0.0, 0.0, 0.0};
  int c = 0;
  for (; c + 4 <= n; c += 4)
    for (int l = 0; l < 4; ++l)
      partial[l] += a[c + l] * b[c + l];
  for (; c < n; ++c)
    partial[0] += a[c] * b[c];
  return (partial[0] + partial[1]) + (partial[2] + partial[3]);
}

/// Round half to even, written out so it does not depend on the FPU mode.
double roundHalfEven(double x) {
  double floor = std::floor(x);
  double diff = x - floor;
  if (diff > 0.5)
    return floor + 1.0;
  if (diff < 0.5)
    return floor;
  return std::fmod(floor, 2.0) == 0.0 ? floor : floor + 1.0;
}

/// Rounds to a binary floating-point format with `precision` significand
/// bits (implicit bit included), smallest normal exponent `minExponent`, and
/// largest finite value `maxFinite` (larger results become infinity).
double roundBinary(double x, int precision, int minExponent, double maxFinite) {
  if (x == 0.0 || !std::isfinite(x))
    return x;
  double magnitude = std::fabs(x);
  int exponent;
  std::frexp(magnitude, &exponent); // magnitude = f * 2^exponent, f in [.5,1)
  int lead = std::max(exponent - 1, minExponent);
  double quantum = std::ldexp(1.0, lead - (precision - 1));
  double rounded = roundHalfEven(magnitude / quantum) * quantum;
  if (rounded > maxFinite)
    rounded = kInfinity;
  return x < 0 ? -rounded : rounded;
}

} // namespace

//===----------------------------------------------------------------------===//
// Matrix
//===----------------------------------------------------------------------===//

Matrix::Matrix(int rows, int cols, double fill)
    : rows(rows), cols(cols),
      data(static_cast<size_t>(rows) * static_cast<size_t>(cols), fill) {}

Matrix Matrix::fromRows(const std::vector<Vector> &rows) {
  Matrix m(static_cast<int>(rows.size()),
           rows.empty() ? 0 : static_cast<int>(rows[0].size()));
  for (int r = 0; r < m.rows; ++r) {
    assert(static_cast<int>(rows[r].size()) == m.cols && "ragged rows");
    for (int c = 0; c < m.cols; ++c)
      m.at(r, c) = rows[r][c];
  }
  return m;
}

Vector Matrix::row(int r) const {
  return Vector(data.begin() + static_cast<std::ptrdiff_t>(r) * cols,
                data.begin() + static_cast<std::ptrdiff_t>(r + 1) * cols);
}

//===----------------------------------------------------------------------===//
// Attention and statistics
//===----------------------------------------------------------------------===//

AttentionResult attention(const std::vector<Matrix> &queries,
                          const std::vector<Matrix> &keys,
                          const std::vector<Matrix> &values) {
  const int numQ = static_cast<int>(queries.size());
  const int numKv = static_cast<int>(keys.size());
  assert(numKv > 0 && numQ % numKv == 0 && "GQA needs whole groups");
  const int groupSize = numQ / numKv;
  AttentionResult result;
  for (int h = 0; h < numQ; ++h) {
    const Matrix &q = queries[h];
    const Matrix &k = keys[h / groupSize];
    const Matrix &v = values[h / groupSize];
    const int nq = q.rows, n = k.rows, d = k.cols;
    Matrix p(nq, n), out(nq, d);
    Vector logits(static_cast<size_t>(n)), weights(static_cast<size_t>(n));
    for (int j = 0; j < nq; ++j) {
      const int visible = n - nq + j; // Last entry query j may see.
      const double *qRow = &q.data[static_cast<size_t>(j) * d];
      double maxLogit = -kInfinity;
      for (int i = 0; i <= visible; ++i) {
        const double *kRow = &k.data[static_cast<size_t>(i) * d];
        logits[i] = dotRows(qRow, kRow, d) / std::sqrt(double(d));
        maxLogit = std::max(maxLogit, logits[i]);
      }
      double sum = 0.0;
      for (int i = 0; i <= visible; ++i) {
        weights[i] = std::exp(logits[i] - maxLogit);
        sum += weights[i];
      }
      for (int i = 0; i <= visible; ++i)
        p.at(j, i) = weights[i] / sum;
      // out[j][c] = sum over i of p[j][i] v[i][c], each sum taken in order
      // of i; the entries are the outer loop so that v is read by rows.
      double *outRow = &out.data[static_cast<size_t>(j) * d];
      for (int i = 0; i <= visible; ++i) {
        const double weight = p.at(j, i);
        const double *vRow = &v.data[static_cast<size_t>(i) * d];
        for (int c = 0; c < d; ++c)
          outRow[c] += weight * vRow[c];
      }
    }
    result.probabilities.push_back(std::move(p));
    result.output.push_back(std::move(out));
  }
  return result;
}

Vector windowMean(const Matrix &probabilities, int w) {
  assert(w > 0 && w <= probabilities.rows);
  Vector mean(static_cast<size_t>(probabilities.cols), 0.0);
  for (int j = probabilities.rows - w; j < probabilities.rows; ++j)
    for (int i = 0; i < probabilities.cols; ++i)
      mean[i] += probabilities.at(j, i) / w;
  return mean;
}

Vector lastQuery(const Matrix &probabilities) {
  return probabilities.row(probabilities.rows - 1);
}

Vector decayedAccumulate(const Vector &state, const Vector &p, double gamma) {
  Vector next(p.size());
  for (size_t i = 0; i < p.size(); ++i)
    next[i] = gamma * (i < state.size() ? state[i] : 0.0) + p[i];
  return next;
}

Vector h2oScores(const Matrix &probabilities, bool normalize) {
  const int nq = probabilities.rows, n = probabilities.cols;
  Vector scores(static_cast<size_t>(n), 0.0);
  for (int j = 0; j < nq; ++j)
    for (int i = 0; i < n; ++i)
      scores[i] += probabilities.at(j, i);
  if (normalize)
    for (int i = 0; i < n; ++i) {
      // Queries j with n - nq + j >= i see entry i.
      int seeing = std::min(nq, n - i);
      scores[i] /= seeing;
    }
  return scores;
}

Vector scissorhandsCounts(const std::vector<Vector> &history, int window,
                          double threshold) {
  const int steps = static_cast<int>(history.size());
  const size_t n = history.empty() ? 0 : history.back().size();
  Vector counts(n, 0.0);
  for (int t = std::max(0, steps - window); t < steps; ++t)
    for (size_t i = 0; i < n && i < history[t].size(); ++i)
      if (history[t][i] > threshold)
        counts[i] += 1.0;
  return counts;
}

//===----------------------------------------------------------------------===//
// Score transforms
//===----------------------------------------------------------------------===//

Vector pool1d(const Vector &scores, int kernel, PoolKind kind) {
  assert(kernel > 0 && kernel % 2 == 1 && "odd kernel");
  const int n = static_cast<int>(scores.size()), half = kernel / 2;
  Vector out(scores.size());
  for (int i = 0; i < n; ++i) {
    double sum = 0.0, best = -kInfinity;
    for (int j = i - half; j <= i + half; ++j) {
      bool inside = j >= 0 && j < n;
      sum += inside ? scores[j] : 0.0; // zero padding
      best = std::max(best, inside ? scores[j] : -kInfinity);
    }
    out[i] = kind == PoolKind::Avg ? sum / kernel : best;
  }
  return out;
}

std::vector<Vector> groupReduce(const std::vector<Vector> &perQueryHead,
                                int numKvHeads, ReduceKind kind) {
  const int numQ = static_cast<int>(perQueryHead.size());
  assert(numKvHeads > 0 && numQ % numKvHeads == 0);
  const int groupSize = numQ / numKvHeads;
  std::vector<Vector> out;
  for (int g = 0; g < numKvHeads; ++g) {
    Vector reduced = perQueryHead[g * groupSize];
    for (int h = g * groupSize + 1; h < (g + 1) * groupSize; ++h)
      for (size_t i = 0; i < reduced.size(); ++i)
        reduced[i] = kind == ReduceKind::Max
                         ? std::max(reduced[i], perQueryHead[h][i])
                         : reduced[i] + perQueryHead[h][i];
    if (kind == ReduceKind::Mean)
      for (double &x : reduced)
        x /= groupSize;
    out.push_back(reduced);
  }
  return out;
}

Vector zscore(const Vector &scores) {
  const double n = static_cast<double>(scores.size());
  double mean = std::accumulate(scores.begin(), scores.end(), 0.0) / n;
  double var = 0.0;
  for (double x : scores)
    var += (x - mean) * (x - mean) / n;
  double sd = std::sqrt(var);
  Vector out(scores.size(), 0.0);
  if (sd > 0.0)
    for (size_t i = 0; i < scores.size(); ++i)
      out[i] = (scores[i] - mean) / sd;
  return out;
}

Vector weightedSum(const Vector &a, double wa, const Vector &b, double wb) {
  Vector out(a.size());
  for (size_t i = 0; i < a.size(); ++i)
    out[i] = wa * a[i] + wb * b[i];
  return out;
}

Vector keyNormScores(const Matrix &keys) {
  Vector out(static_cast<size_t>(keys.rows));
  for (int i = 0; i < keys.rows; ++i)
    out[i] = -norm(keys.row(i));
  return out;
}

Vector keyDiversityScores(const Matrix &keys) {
  Vector mean(static_cast<size_t>(keys.cols), 0.0);
  for (int i = 0; i < keys.rows; ++i) {
    Vector k = keys.row(i);
    double length = norm(k);
    if (length == 0.0)
      continue;
    for (int c = 0; c < keys.cols; ++c)
      mean[c] += k[c] / length / keys.rows;
  }
  Vector out(static_cast<size_t>(keys.rows));
  for (int i = 0; i < keys.rows; ++i)
    out[i] = -cosine(keys.row(i), mean);
  return out;
}

Vector valueNorms(const Matrix &values) {
  Vector out(static_cast<size_t>(values.rows));
  for (int i = 0; i < values.rows; ++i)
    out[i] = norm(values.row(i));
  return out;
}

Vector valueAwareScores(const Vector &scores, const Matrix &values) {
  Vector norms = valueNorms(values);
  Vector out(scores.size());
  for (size_t i = 0; i < scores.size(); ++i)
    out[i] = scores[i] * norms[i];
  return out;
}

Vector expectedAttentionScores(const Matrix &keys, const Matrix &values,
                               const Vector &mu, const Matrix &sigma) {
  const int n = keys.rows, d = keys.cols;
  Vector logits(static_cast<size_t>(n));
  for (int i = 0; i < n; ++i) {
    Vector k = keys.row(i);
    double quadratic = 0.0;
    for (int a = 0; a < d; ++a)
      for (int b = 0; b < d; ++b)
        quadratic += k[a] * sigma.at(a, b) * k[b];
    logits[i] = dot(k, mu) / std::sqrt(double(d)) + 0.5 * quadratic / d;
  }
  double maxLogit = *std::max_element(logits.begin(), logits.end());
  double sum = 0.0;
  for (double l : logits)
    sum += std::exp(l - maxLogit);
  Vector norms = valueNorms(values);
  Vector scores(static_cast<size_t>(n));
  for (int i = 0; i < n; ++i)
    scores[i] = std::exp(logits[i] - maxLogit) / sum * norms[i];
  return scores;
}

Vector keyformerStep(const Vector &logits, const Vector &noise, double tau) {
  Vector perturbed(logits.size());
  for (size_t i = 0; i < logits.size(); ++i)
    perturbed[i] = (logits[i] + noise[i]) / tau;
  double maxValue = *std::max_element(perturbed.begin(), perturbed.end());
  double sum = 0.0;
  for (double x : perturbed)
    sum += std::exp(x - maxValue);
  Vector p(logits.size());
  for (size_t i = 0; i < logits.size(); ++i)
    p[i] = std::exp(perturbed[i] - maxValue) / sum;
  return p;
}

Vector protect(const Vector &scores, int sinks, int recent) {
  Vector out = scores;
  const int n = static_cast<int>(scores.size());
  for (int i = 0; i < n; ++i)
    if (i < sinks || i >= n - recent)
      out[i] = kInfinity;
  return out;
}

//===----------------------------------------------------------------------===//
// Selection and budgets
//===----------------------------------------------------------------------===//

std::vector<int> topK(const Vector &scores, int k) {
  const int n = static_cast<int>(scores.size());
  std::vector<int> order(static_cast<size_t>(n));
  std::iota(order.begin(), order.end(), 0);
  // Higher score first; among equal scores the larger index first.
  std::sort(order.begin(), order.end(), [&](int a, int b) {
    if (scores[a] != scores[b])
      return scores[a] > scores[b];
    return a > b;
  });
  order.resize(static_cast<size_t>(std::clamp(k, 0, n)));
  std::sort(order.begin(), order.end());
  return order;
}

int64_t uniformBudget(int64_t n, int64_t count) { return std::min(n, count); }

int64_t uniformBudgetFromRatio(int64_t n, double ratio) {
  return static_cast<int64_t>(static_cast<double>(n) * (1.0 - ratio));
}

PyramidBudgets pyramidBudgets(int64_t capacity, int64_t window, int64_t beta,
                              int64_t promptLength, int numLayers) {
  const int64_t c = capacity, w = window, l = promptLength;
  PyramidBudgets b;
  if (l < c) {
    b.branch = PyramidBudgets::Branch::NoCompression;
    b.selected.assign(numLayers, l - w);
    b.total.assign(numLayers, l);
    return b;
  }
  if (l < 2 * (c - w)) {
    b.branch = PyramidBudgets::Branch::Uniform;
    b.selected.assign(numLayers, c - w);
    b.total.assign(numLayers, c);
    return b;
  }
  b.branch = PyramidBudgets::Branch::Pyramid;
  // Python's // on non-negative operands is plain integer division here.
  int64_t minNum = (c - w) / beta;
  int64_t maxNum = 2 * (c - w) - minNum;
  if (maxNum >= l - w) {
    maxNum = l - w;
    minNum = 2 * (c - w) - maxNum;
  }
  int64_t step = numLayers > 1 ? (maxNum - minNum) / (numLayers - 1) : 0;
  for (int layer = 0; layer < numLayers; ++layer) {
    b.selected.push_back(maxNum - layer * step);
    b.total.push_back(maxNum - layer * step + w);
  }
  return b;
}

std::vector<std::vector<int>> adaKvSelect(const std::vector<Vector> &scores,
                                          int budgetPerHead, double alpha) {
  const int numHeads = static_cast<int>(scores.size());
  const int share = static_cast<int>(std::floor(alpha * budgetPerHead));
  std::vector<std::vector<bool>> keep(numHeads);
  int64_t kept = 0;
  for (int h = 0; h < numHeads; ++h) {
    keep[h].assign(scores[h].size(), false);
    for (int i : topK(scores[h], share)) {
      keep[h][i] = true;
      ++kept;
    }
  }
  // Global top-k over every entry not yet kept.
  struct Candidate {
    double score;
    int index;
    int head;
  };
  std::vector<Candidate> rest;
  for (int h = 0; h < numHeads; ++h)
    for (int i = 0; i < static_cast<int>(scores[h].size()); ++i)
      if (!keep[h][i])
        rest.push_back({scores[h][i], i, h});
  std::sort(rest.begin(), rest.end(),
            [](const Candidate &a, const Candidate &b) {
              if (a.score != b.score)
                return a.score > b.score;
              if (a.index != b.index)
                return a.index > b.index;
              return a.head > b.head;
            });
  int64_t remaining = static_cast<int64_t>(numHeads) * budgetPerHead - kept;
  for (size_t j = 0; j < rest.size() && remaining > 0; ++j, --remaining)
    keep[rest[j].head][rest[j].index] = true;
  std::vector<std::vector<int>> result(numHeads);
  for (int h = 0; h < numHeads; ++h)
    for (int i = 0; i < static_cast<int>(keep[h].size()); ++i)
      if (keep[h][i])
        result[h].push_back(i);
  return result;
}

std::vector<std::vector<int>> globalTopK(const std::vector<Vector> &scores,
                                         int64_t total) {
  struct Candidate {
    double score;
    int index;
    int head;
  };
  std::vector<Candidate> all;
  for (int h = 0; h < static_cast<int>(scores.size()); ++h)
    for (int i = 0; i < static_cast<int>(scores[h].size()); ++i)
      all.push_back({scores[h][i], i, h});
  std::sort(all.begin(), all.end(), [](const Candidate &a, const Candidate &b) {
    if (a.score != b.score)
      return a.score > b.score;
    if (a.index != b.index)
      return a.index > b.index;
    return a.head > b.head;
  });
  std::vector<std::vector<int>> kept(scores.size());
  for (int64_t j = 0; j < total && j < static_cast<int64_t>(all.size()); ++j)
    kept[all[j].head].push_back(all[j].index);
  for (std::vector<int> &k : kept)
    std::sort(k.begin(), k.end());
  return kept;
}

std::vector<int> headClassKeep(int n, bool retrieval, int sinks, int recent) {
  std::vector<int> kept;
  for (int i = 0; i < n; ++i)
    if (retrieval || i < sinks || i >= n - recent)
      kept.push_back(i);
  return kept;
}

//===----------------------------------------------------------------------===//
// Merges
//===----------------------------------------------------------------------===//

double cosine(const Vector &a, const Vector &b) {
  double na = norm(a), nb = norm(b);
  if (na == 0.0 || nb == 0.0)
    return 0.0;
  return dot(a, b) / (na * nb);
}

namespace {

std::vector<int> complement(int n, const std::vector<int> &kept) {
  std::vector<bool> isKept(static_cast<size_t>(n), false);
  for (int i : kept)
    isKept[i] = true;
  std::vector<int> evicted;
  for (int i = 0; i < n; ++i)
    if (!isKept[i])
      evicted.push_back(i);
  return evicted;
}

/// Position in `kept` of the kept key most similar to `key` (ties: the
/// larger entry index), and that similarity.
std::pair<int, double> nearestKept(const Matrix &keys,
                                   const std::vector<int> &kept,
                                   const Vector &key) {
  int best = -1;
  double bestSim = -kInfinity;
  for (size_t t = 0; t < kept.size(); ++t) {
    double sim = cosine(key, keys.row(kept[t]));
    if (best < 0 || sim > bestSim || (sim == bestSim && kept[t] > kept[best])) {
      best = static_cast<int>(t);
      bestSim = sim;
    }
  }
  return {best, bestSim};
}

} // namespace

Matrix mergeIntoNearest(const Matrix &keys, const Matrix &values,
                        const std::vector<int> &kept) {
  const int d = values.cols;
  Matrix sums(static_cast<int>(kept.size()), d, 0.0);
  Vector weightSums(kept.size(), 0.0);
  for (int e : complement(keys.rows, kept)) {
    auto [t, sim] = nearestKept(keys, kept, keys.row(e));
    if (t < 0)
      continue;
    double ne = norm(values.row(e)), nt = norm(values.row(kept[t]));
    double w = ne + nt > 0.0 ? std::max(sim, 0.0) * ne / (ne + nt) : 0.0;
    weightSums[t] += w;
    for (int c = 0; c < d; ++c)
      sums.at(t, c) += w * values.at(e, c);
  }
  Matrix merged(static_cast<int>(kept.size()), d);
  for (size_t t = 0; t < kept.size(); ++t)
    for (int c = 0; c < d; ++c)
      merged.at(static_cast<int>(t), c) =
          (values.at(kept[t], c) + sums.at(static_cast<int>(t), c)) /
          (1.0 + weightSums[t]);
  return merged;
}

D2OResult d2oMerge(const Matrix &keys, const Matrix &values,
                   const std::vector<int> &kept, double threshold, double alpha,
                   double beta) {
  const int d = keys.cols, numKept = static_cast<int>(kept.size());
  std::vector<int> evicted = complement(keys.rows, kept);
  std::vector<std::pair<int, double>> targets;
  double meanSim = 0.0;
  for (int e : evicted) {
    targets.push_back(nearestKept(keys, kept, keys.row(e)));
    meanSim += targets.back().second / evicted.size();
  }
  D2OResult result;
  result.threshold =
      evicted.empty() ? threshold : alpha * threshold + beta * meanSim;
  // Weighted sums start with the kept entry itself at weight e = exp(1).
  Matrix keySums(numKept, d), valueSums(numKept, d);
  Vector weightSums(static_cast<size_t>(numKept), std::exp(1.0));
  for (int t = 0; t < numKept; ++t)
    for (int c = 0; c < d; ++c) {
      keySums.at(t, c) = std::exp(1.0) * keys.at(kept[t], c);
      valueSums.at(t, c) = std::exp(1.0) * values.at(kept[t], c);
    }
  for (size_t j = 0; j < evicted.size(); ++j) {
    auto [t, sim] = targets[j];
    if (t < 0 || sim < result.threshold) {
      result.mergedInto.push_back(-1);
      continue;
    }
    result.mergedInto.push_back(t);
    double w = std::exp(sim);
    weightSums[t] += w;
    for (int c = 0; c < d; ++c) {
      keySums.at(t, c) += w * keys.at(evicted[j], c);
      valueSums.at(t, c) += w * values.at(evicted[j], c);
    }
  }
  result.keys = Matrix(numKept, d);
  result.values = Matrix(numKept, d);
  for (int t = 0; t < numKept; ++t)
    for (int c = 0; c < d; ++c) {
      result.keys.at(t, c) = keySums.at(t, c) / weightSums[t];
      result.values.at(t, c) = valueSums.at(t, c) / weightSums[t];
    }
  return result;
}

Matrix camMerge(const Matrix &values, const std::vector<int> &kept,
                const Vector &attention, int window, int m,
                const Vector *draws) {
  const int n = values.rows, d = values.cols;
  double windowMean = 0.0;
  for (int i = n - window; i < n; ++i)
    windowMean += attention[i] / window;
  std::vector<int> sortedKept = kept;
  std::sort(sortedKept.begin(), sortedKept.end());
  Matrix merged(static_cast<int>(kept.size()), d);
  for (size_t t = 0; t < kept.size(); ++t)
    for (int c = 0; c < d; ++c)
      merged.at(static_cast<int>(t), c) = values.at(kept[t], c);
  for (int e : complement(n, kept)) {
    double p = windowMean > 0.0
                   ? std::clamp(attention[e] / windowMean, 0.0, 1.0)
                   : 0.0;
    double mask = draws ? ((*draws)[e] < p ? 1.0 : 0.0) : p;
    int merges = 0;
    for (int target : sortedKept) {
      if (target <= e)
        continue;
      if (merges++ == m)
        break;
      int t = static_cast<int>(std::find(kept.begin(), kept.end(), target) -
                               kept.begin());
      for (int c = 0; c < d; ++c)
        merged.at(t, c) += mask * values.at(e, c) / m;
    }
  }
  return merged;
}

//===----------------------------------------------------------------------===//
// Storage formats
//===----------------------------------------------------------------------===//

AsymGroup quantizeAsym(const Vector &x, int bits) {
  AsymGroup g;
  double lo = *std::min_element(x.begin(), x.end());
  double hi = *std::max_element(x.begin(), x.end());
  const int levels = (1 << bits) - 1;
  g.scale = (hi - lo) / levels;
  g.min = lo;
  for (double v : x) {
    int code = 0;
    if (g.scale > 0.0)
      code = static_cast<int>(
          std::clamp(roundHalfEven((v - lo) / g.scale), 0.0, double(levels)));
    g.codes.push_back(code);
  }
  return g;
}

namespace {

/// x rounded down (`up` false) or up to a multiple of the f16 spacing at
/// x, then clamped to +-65504.
double f16Directed(double x, bool up) {
  // An f16 has 11 significant bits down to 2^-14 (x = m 2^e with 1/2 <=
  // |m| < 1, so a spacing of 2^(e - 11)); below, a fixed spacing of 2^-24.
  int e = 0;
  std::frexp(x, &e);
  const double spacing = std::ldexp(1.0, std::max(e - 11, -24));
  const double units = x / spacing;
  const double r = (up ? std::ceil(units) : std::floor(units)) * spacing;
  return std::clamp(r, -65504.0, 65504.0);
}

} // namespace

double f16Below(double x) { return f16Directed(x, false); }

double f16Above(double x) { return f16Directed(x, true); }

AsymGroup quantizeAsymRecord(const Vector &x, int bits) {
  AsymGroup g;
  const double lo = *std::min_element(x.begin(), x.end());
  const double hi = *std::max_element(x.begin(), x.end());
  const int levels = (1 << bits) - 1;
  g.min = f16Below(lo);
  // The quotient as float32 arithmetic gives it, before the rounding up.
  g.scale = f16Above(static_cast<float>(static_cast<float>(hi) -
                                        static_cast<float>(g.min)) /
                     static_cast<float>(levels));
  for (double v : x) {
    int code = 0;
    if (g.scale > 0.0)
      code = static_cast<int>(std::clamp(
          roundHalfEven((v - g.min) / g.scale), 0.0, double(levels)));
    g.codes.push_back(code);
  }
  return g;
}

Vector dequantizeAsym(const AsymGroup &group) {
  Vector out;
  for (int code : group.codes)
    out.push_back(code * group.scale + group.min);
  return out;
}

std::vector<uint8_t> packCodes(const std::vector<int> &codes, int bits) {
  // Written as a bit stream: bit b of the stream is bit b % 8 of byte b / 8,
  // and code j occupies stream bits j*bits .. j*bits + bits - 1, low first.
  std::vector<uint8_t> bytes((codes.size() * bits + 7) / 8, 0);
  size_t streamBit = 0;
  for (int code : codes)
    for (int b = 0; b < bits; ++b, ++streamBit)
      if ((code >> b) & 1)
        bytes[streamBit / 8] =
            static_cast<uint8_t>(bytes[streamBit / 8] + (1 << (streamBit % 8)));
  return bytes;
}

KiviKeyBlock kiviQuantizeKeys(const Matrix &keys, int bits) {
  KiviKeyBlock block;
  block.codes.assign(static_cast<size_t>(keys.rows) * keys.cols, 0);
  for (int c = 0; c < keys.cols; ++c) {
    Vector channel;
    for (int t = 0; t < keys.rows; ++t)
      channel.push_back(keys.at(t, c));
    AsymGroup g = quantizeAsymRecord(channel, bits);
    block.scales.push_back(g.scale);
    block.mins.push_back(g.min);
    for (int t = 0; t < keys.rows; ++t)
      block.codes[static_cast<size_t>(t) * keys.cols + c] = g.codes[t];
  }
  return block;
}

Matrix kiviDequantizeKeys(const KiviKeyBlock &block, int tokens) {
  const int d = static_cast<int>(block.scales.size());
  Matrix keys(tokens, d);
  for (int t = 0; t < tokens; ++t)
    for (int c = 0; c < d; ++c)
      keys.at(t, c) =
          block.codes[static_cast<size_t>(t) * d + c] * block.scales[c] +
          block.mins[c];
  return keys;
}

KiviValue kiviQuantizeValue(const Vector &value, int group, int bits) {
  KiviValue v;
  for (size_t start = 0; start < value.size(); start += group) {
    Vector part(value.begin() + start, value.begin() + start + group);
    AsymGroup g = quantizeAsymRecord(part, bits);
    v.scales.push_back(g.scale);
    v.mins.push_back(g.min);
    v.codes.insert(v.codes.end(), g.codes.begin(), g.codes.end());
  }
  return v;
}

Vector kiviDequantizeValue(const KiviValue &value, int group) {
  Vector out;
  for (size_t c = 0; c < value.codes.size(); ++c)
    out.push_back(value.codes[c] * value.scales[c / group] +
                  value.mins[c / group]);
  return out;
}

KiviCache kiviSimulate(const Matrix &keys, const Matrix &values, int group,
                       int residual, int bits) {
  const int n = keys.rows, d = keys.cols;
  KiviCache cache;
  cache.keys = keys;
  cache.values = values;
  cache.keyQuantized.assign(static_cast<size_t>(n), false);
  cache.valueQuantized.assign(static_cast<size_t>(n), false);
  // Keys: every complete window of R appends is quantized in blocks of G.
  for (int start = 0; start + residual <= n; start += residual)
    for (int b = start; b < start + residual; b += group) {
      Matrix block(group, d);
      for (int t = 0; t < group; ++t)
        for (int c = 0; c < d; ++c)
          block.at(t, c) = keys.at(b + t, c);
      Matrix restored =
          kiviDequantizeKeys(kiviQuantizeKeys(block, bits), group);
      for (int t = 0; t < group; ++t) {
        for (int c = 0; c < d; ++c)
          cache.keys.at(b + t, c) = restored.at(t, c);
        cache.keyQuantized[b + t] = true;
      }
    }
  // Values: all but the R most recent are quantized per token.
  for (int i = 0; i < n - residual; ++i) {
    Vector restored = kiviDequantizeValue(
        kiviQuantizeValue(values.row(i), group, bits), group);
    for (int c = 0; c < d; ++c)
      cache.values.at(i, c) = restored[c];
    cache.valueQuantized[i] = true;
  }
  return cache;
}

Int8Vector quantizeInt8(const Vector &x) {
  Int8Vector v;
  double amax = 0.0;
  for (double e : x)
    amax = std::max(amax, std::fabs(e));
  v.scale = amax / 127.0;
  for (double e : x)
    v.q.push_back(amax == 0.0
                      ? 0
                      : static_cast<int>(std::clamp(
                            roundHalfEven(e / v.scale + 0.0), -127.0, 127.0)));
  return v;
}

Vector dequantizeInt8(const Int8Vector &v) {
  Vector out;
  for (int q : v.q)
    out.push_back(q * v.scale);
  return out;
}

double fp8E4M3Decode(uint8_t code) {
  const int exponent = (code >> 3) & 0xf, mantissa = code & 0x7;
  double magnitude;
  if (exponent == 15 && mantissa == 7)
    magnitude = std::numeric_limits<double>::quiet_NaN();
  else if (exponent == 0)
    magnitude = std::ldexp(mantissa / 8.0, -6);
  else
    magnitude = std::ldexp(1.0 + mantissa / 8.0, exponent - 7);
  return (code & 0x80) ? -magnitude : magnitude;
}

uint8_t fp8E4M3Encode(double x) {
  if (std::isnan(x))
    return 0x7f;
  const uint8_t sign = std::signbit(x) ? 0x80 : 0x00;
  const double magnitude = std::fabs(x);
  if (magnitude >= 448.0)
    return sign | 0x7e;
  int best = 0;
  double bestError = kInfinity;
  for (int code = 0; code <= 0x7e; ++code) {
    double error =
        std::fabs(fp8E4M3Decode(static_cast<uint8_t>(code)) - magnitude);
    // Codes ascend in value, so an equal error means a tie between two
    // neighbours: keep the one with the even mantissa.
    if (error < bestError || (error == bestError && (code & 1) == 0)) {
      best = code;
      bestError = error;
    }
  }
  return sign | static_cast<uint8_t>(best);
}

Fp8Vector quantizeFp8(const Vector &x) {
  Fp8Vector v;
  double amax = 0.0;
  for (double e : x)
    amax = std::max(amax, std::fabs(e));
  v.scale = amax > 0.0 ? amax / 448.0 : 1.0;
  for (double e : x)
    v.q.push_back(fp8E4M3Encode(e / v.scale));
  return v;
}

Vector dequantizeFp8(const Fp8Vector &v) {
  Vector out;
  for (uint8_t q : v.q)
    out.push_back(fp8E4M3Decode(q) * v.scale);
  return out;
}

double roundToF16(double x) {
  return roundBinary(x, /*precision=*/11, /*minExponent=*/-14,
                     /*maxFinite=*/65504.0);
}

double roundToBf16(double x) {
  return roundBinary(x, /*precision=*/8, /*minExponent=*/-126,
                     /*maxFinite=*/std::ldexp(2.0 - std::ldexp(1.0, -7), 127));
}

} // namespace kvc::ref
