//===- Reference.h - Double-precision oracle for kvc primitives -*- C++ -*-===//
//
// Straightforward implementations of every policy primitive of
// shared/design/POLICIES.md and of every storage format of the runtime.
// Written for clarity, not speed, in double precision; generated kernels and
// the runtime are tested against these. Nothing here calls runtime code: the
// oracle must stay independent of what it checks.
//
// Conventions: a Matrix is row-major; per (layer, kv-head) a cache holds n
// entries (rows of keys/values, head dim d); queries are the last nq tokens
// of the sequence, so query j sits at position n - nq + j and, with causal
// masking, sees entries 0 .. n - nq + j.
//
//===----------------------------------------------------------------------===//

#ifndef KVC_TEST_REFERENCE_REFERENCE_H
#define KVC_TEST_REFERENCE_REFERENCE_H

#include <cstddef>
#include <cstdint>
#include <vector>

namespace kvc::ref {

/// A vector of per-entry (or per-channel) values.
using Vector = std::vector<double>;

/// Dense row-major matrix.
struct Matrix {
  int rows = 0;
  int cols = 0;
  std::vector<double> data;

  Matrix() = default;
  Matrix(int rows, int cols, double fill = 0.0);
  /// Builds a matrix from rows given inline (all of equal length).
  static Matrix fromRows(const std::vector<Vector> &rows);

  double &at(int r, int c) {
    return data[static_cast<std::size_t>(r) * cols + c];
  }
  double at(int r, int c) const {
    return data[static_cast<std::size_t>(r) * cols + c];
  }
  /// Copy of row r.
  Vector row(int r) const;
};

//===----------------------------------------------------------------------===//
// Attention and attention statistics
//===----------------------------------------------------------------------===//

/// Output and probabilities of causal attention for every query head.
struct AttentionResult {
  /// Per query head: nq x d outputs.
  std::vector<Matrix> output;
  /// Per query head: nq x n probabilities p_{q,i} (0 where masked).
  std::vector<Matrix> probabilities;
};

/// Causal attention with grouped-query heads: query head h reads kv head
/// h / (numQHeads / numKvHeads); scores are q.k / sqrt(d).
AttentionResult attention(const std::vector<Matrix> &queries,
                          const std::vector<Matrix> &keys,
                          const std::vector<Matrix> &values);

/// Mean over the last w queries of p_{q,i} (divides by w; masked
/// probabilities count as 0, as in SnapKV's observation window).
Vector windowMean(const Matrix &probabilities, int w);

/// p of the last query (TOVA).
Vector lastQuery(const Matrix &probabilities);

/// One step of the decayed accumulated statistic: s <- gamma * s + p (A2SF;
/// gamma = 1 is plain H2O accumulation).
Vector decayedAccumulate(const Vector &state, const Vector &p, double gamma);

/// H2O observed-attention score: sum over all queries of p_{q,i}; with
/// `normalize` divided by the number of queries that can see entry i
/// (n - i for a full prefill), the reference-lib variant.
Vector h2oScores(const Matrix &probabilities, bool normalize);

/// Scissorhands persistence: for each entry, the number of the last
/// `window` steps of `history` (history[t][i] = p_{t,i}) in which p_{t,i}
/// exceeded `threshold`.
Vector scissorhandsCounts(const std::vector<Vector> &history, int window,
                          double threshold);

//===----------------------------------------------------------------------===//
// Score transforms
//===----------------------------------------------------------------------===//

/// Pooling kinds of 1-D score smoothing.
enum class PoolKind { Avg, Max };

/// 1-D pooling along tokens: odd kernel, stride 1, "same" padding of
/// kernel / 2 on each side. Avg counts the zero padding in the divisor
/// (torch avg_pool1d's count_include_pad=True, SnapKV's reference-lib
/// behaviour: every output divides by `kernel`); Max pads with -infinity.
Vector pool1d(const Vector &scores, int kernel, PoolKind kind);

/// Reductions over the query heads of a GQA group.
enum class ReduceKind { Mean, Max };

/// Reduces per-query-head scores (numQHeads vectors) to per-kv-head scores;
/// group g holds query heads g * G .. g * G + G - 1.
std::vector<Vector> groupReduce(const std::vector<Vector> &perQueryHead,
                                int numKvHeads, ReduceKind kind);

/// z-score: (x - mean) / std with the population standard deviation; all
/// zeros when the standard deviation is 0.
Vector zscore(const Vector &scores);

/// a * wa + b * wb elementwise.
Vector weightedSum(const Vector &a, double wa, const Vector &b, double wb);

/// Knorm: -||k_i||_2.
Vector keyNormScores(const Matrix &keys);

/// KeyDiff: -cos(k_i, m) with m = mean_j k_j / ||k_j|| (zero keys add 0).
Vector keyDiversityScores(const Matrix &keys);

/// ||v_i||_2.
Vector valueNorms(const Matrix &values);

/// Value-aware score (VATP): score_i * ||v_i||_2.
Vector valueAwareScores(const Vector &scores, const Matrix &values);

/// Expected attention: softmax_i(k_i . mu / sqrt(d) + 1/2 k_i^T Sigma k_i /
/// d) * ||v_i|| for future-query statistics mu (d) and Sigma (d x d).
Vector expectedAttentionScores(const Matrix &keys, const Matrix &values,
                               const Vector &mu, const Matrix &sigma);

/// One Keyformer step: softmax_i((logit_i + noise_i) / tau), where `noise`
/// holds the Gumbel samples (passed in so that the result is reproducible);
/// accumulate steps with decayedAccumulate(state, p, 1).
Vector keyformerStep(const Vector &logits, const Vector &noise, double tau);

/// Sinks (the first `sinks` entries) and the `recent` last entries get
/// +infinity so that no budget can evict them.
Vector protect(const Vector &scores, int sinks, int recent);

//===----------------------------------------------------------------------===//
// Selection and budgets
//===----------------------------------------------------------------------===//

/// Indices of the k highest scores, sorted ascending. Ties are broken
/// toward the more recent entry (the larger index). k >= n keeps all.
std::vector<int> topK(const Vector &scores, int k);

/// Uniform budget as a count: min(n, count).
int64_t uniformBudget(int64_t n, int64_t count);

/// Uniform budget as a compression ratio: the reference lib's
/// int(n * (1 - ratio)), i.e. floor((1 - ratio) * n) evaluated in double
/// precision with no epsilon (so ratio 0.3 of n = 10 gives 7).
int64_t uniformBudgetFromRatio(int64_t n, double ratio);

/// PyramidKV budgets (factory integer form) for every layer.
struct PyramidBudgets {
  /// Which branch applied.
  enum class Branch {
    NoCompression, ///< L < C: every layer keeps all L entries.
    Uniform,       ///< L < 2(C - W): every layer keeps C (= C - W + W).
    Pyramid,       ///< The pyramid; max clamped to L - W when needed.
  } branch;
  /// Entries each layer selects outside the window.
  std::vector<int64_t> selected;
  /// Entries each layer keeps in total (selected + W; L when uncompressed).
  std::vector<int64_t> total;
};

/// C capacity per layer, W window, beta, L prompt length, N layers:
/// min = (C-W)//beta; max = 2(C-W) - min; if max >= L-W then max = L-W and
/// min = 2(C-W) - max; step = (max-min)//(N-1) (0 when N = 1);
/// selected_l = max - l * step.
PyramidBudgets pyramidBudgets(int64_t capacity, int64_t window, int64_t beta,
                              int64_t promptLength, int numLayers);

/// AdaKV: each head first keeps its top floor(alpha * C) entries, then the
/// rest of the layer budget H * C goes to a global top-k over the remaining
/// (head, entry) scores (ties: larger entry index, then larger head). Returns
/// per head the kept indices, ascending. Heads with fewer entries than their
/// share keep everything.
std::vector<std::vector<int>> adaKvSelect(const std::vector<Vector> &scores,
                                          int budgetPerHead, double alpha);

/// Global selection (KVzip style): one top-k over the scores of every
/// (layer, head), ties toward the larger entry index, then the later head in
/// the list. Returns the kept indices of each head, ascending.
std::vector<std::vector<int>> globalTopK(const std::vector<Vector> &scores,
                                         int64_t total);

/// Head classes (DuoAttention, RazorAttention): a retrieval head keeps all
/// n entries; a streaming head keeps the `sinks` first and `recent` last.
std::vector<int> headClassKeep(int n, bool retrieval, int sinks, int recent);

//===----------------------------------------------------------------------===//
// Merges
//===----------------------------------------------------------------------===//

/// Cosine similarity (0 when either vector is zero).
double cosine(const Vector &a, const Vector &b);

/// Merge into nearest (reference lib): every evicted entry e (not in
/// `kept`) goes to the kept entry t with the most cosine-similar key (ties:
/// larger index) with weight w = max(sim, 0) * ||v_e|| / (||v_e|| + ||v_t||)
/// using the kept value's original norm; then v_t <- (v_t + sum w v_e) /
/// (1 + sum w). Keys are unchanged. Returns the |kept| x d merged values in
/// the order of `kept`.
Matrix mergeIntoNearest(const Matrix &keys, const Matrix &values,
                        const std::vector<int> &kept);

/// Result of a D2O merge step.
struct D2OResult {
  Matrix keys;            ///< |kept| x d merged keys, in the order of `kept`.
  Matrix values;          ///< |kept| x d merged values.
  double threshold = 0.0; ///< Updated EMA threshold.
  std::vector<int> mergedInto; ///< Per evicted entry (ascending): index into
                               ///< kept, or -1 when dropped.
};

/// D2O: each evicted key finds its most similar kept key (cosine, ties to
/// the larger index) with similarity s_e; the threshold becomes tau <- alpha
/// * tau + beta * mean_e s_e (unchanged with nothing evicted); evicted
/// entries with s_e >= the new tau merge into their target as a weighted
/// mean of keys and values with weights exp(s_e) for merged entries and
/// exp(1) for the kept entry (its similarity to itself).
D2OResult d2oMerge(const Matrix &keys, const Matrix &values,
                   const std::vector<int> &kept, double threshold,
                   double alpha = 0.5, double beta = 0.5);

/// CaM: each evicted entry e (ascending) is merged into the next m kept
/// entries after it (fewer at the end) with probability p_e = clamp(A_e /
/// mean(A over the last `window` entries), 0, 1): v_t += mask * v_e / m,
/// where mask = 1 if draws[e] < p_e else 0 when `draws` (one uniform number
/// per entry) is given, and mask = p_e (the expectation) otherwise. Values
/// only; returns the |kept| x d merged values.
Matrix camMerge(const Matrix &values, const std::vector<int> &kept,
                const Vector &attention, int window, int m,
                const Vector *draws = nullptr);

//===----------------------------------------------------------------------===//
// Storage formats
//===----------------------------------------------------------------------===//

/// One asymmetric uniform group: codes in [0, 2^bits - 1].
struct AsymGroup {
  std::vector<int> codes;
  double scale = 0.0;
  double min = 0.0;
};

/// scale = (max - min) / (2^bits - 1); code = round-half-even((x - min) /
/// scale) clamped (0 when scale = 0).
AsymGroup quantizeAsym(const Vector &x, int bits);

/// The largest f16 value <= x and the smallest >= x, both clamped to
/// +-65504.
double f16Below(double x);
double f16Above(double x);

/// quantizeAsym with the parameters a page stores (kvc_runtime.h, at
/// kvc_kivi_quantize_value): min = f16Below(least value), scale =
/// f16Above((max - min) / (2^bits - 1) in float32 arithmetic), codes from
/// those. KIVI keys and values and the INT2/INT4 class use it.
AsymGroup quantizeAsymRecord(const Vector &x, int bits);

/// x = code * scale + min.
Vector dequantizeAsym(const AsymGroup &group);

/// Packs codes of `bits` bits, least significant bits first within a byte.
std::vector<uint8_t> packCodes(const std::vector<int> &codes, int bits);

/// KIVI keys of one block (tokens x d): per-channel groups over the tokens.
struct KiviKeyBlock {
  std::vector<int> codes; ///< tokens x d, row-major.
  Vector scales;          ///< d.
  Vector mins;            ///< d.
};
KiviKeyBlock kiviQuantizeKeys(const Matrix &keys, int bits);
Matrix kiviDequantizeKeys(const KiviKeyBlock &block, int tokens);

/// KIVI value of one token: groups of `group` channels.
struct KiviValue {
  std::vector<int> codes; ///< d.
  Vector scales;          ///< d / group.
  Vector mins;            ///< d / group.
};
KiviValue kiviQuantizeValue(const Vector &value, int group, int bits);
Vector kiviDequantizeValue(const KiviValue &value, int group);

/// What a KIVI cache holds after appending `keys`/`values` row by row (no
/// eviction): keys are quantized a block of R at a time (R/G blocks of G
/// tokens each) once R have accumulated since the last flush; the value of
/// an entry is quantized once R newer entries exist. Dequantized contents.
struct KiviCache {
  Matrix keys;
  Matrix values;
  std::vector<bool> keyQuantized;
  std::vector<bool> valueQuantized;
};
KiviCache kiviSimulate(const Matrix &keys, const Matrix &values, int group,
                       int residual, int bits);

/// int8 symmetric per vector: scale = max|x| / 127, q = round-half-even(x /
/// scale) in [-127, 127] (all 0 with scale 0 for a zero vector).
struct Int8Vector {
  std::vector<int> q;
  double scale = 0.0;
};
Int8Vector quantizeInt8(const Vector &x);
Vector dequantizeInt8(const Int8Vector &v);

/// Value of an fp8 e4m3 code (bias 7, no infinity, 0x7f / 0xff NaN).
double fp8E4M3Decode(uint8_t code);
/// Nearest e4m3 code by exhaustive search over all finite codes; ties go to
/// the code with an even mantissa; |x| beyond 448 saturates.
uint8_t fp8E4M3Encode(double x);

/// fp8 per vector: scale = max|x| / 448 (1 for a zero vector).
struct Fp8Vector {
  std::vector<uint8_t> q;
  double scale = 1.0;
};
Fp8Vector quantizeFp8(const Vector &x);
Vector dequantizeFp8(const Fp8Vector &v);

/// x rounded to the nearest binary16 value (ties to even), overflowing to
/// +-infinity at 65520.
double roundToF16(double x);
/// x rounded to the nearest bfloat16 value (ties to even).
double roundToBf16(double x);

} // namespace kvc::ref

#endif // KVC_TEST_REFERENCE_REFERENCE_H
