//===- PrefillKernelTest.cu - The prefill kernels alone -------------------===//
//
// The two bodies of prefillAttention (runtime/kvc_cuda.cuh) on the
// emulator, each through a kernel of this test, against causal attention
// computed in double precision on the host:
//  - prefillAttentionTiles (CUDA cores, KVC_CUDA_PREFILL_MMA=0);
//  - prefillAttentionMma (tensor cores, what kvc ships): float operands
//    split into bf16 hi and lo parts, mma.sync as the emulator computes it
//    from the PTX fragment layout.
// Prompts of 1 token, of fewer tokens than a key tile, and of several query
// tiles of both bodies with a partial last one, inputs aligned to 16 bytes
// (float4 reads) and not (float reads: the emulator checks their values; a
// float4 read of an unaligned row would fault on a GPU only); head dim 32,
// 64 and 128;
// groups of 1, 2 and 4 query heads per kv-head, with two kv-heads (so a
// query head must read its own group's keys). Every output channel and
// every log-sum-exp must be within the body's tolerance of the reference,
// absolute. A run with no output buffer must write the same log-sum-exps.
// Exits 1 on the first difference.
//
// Tolerances: outputs are weighted means of values in [-1, 1]; logits are
// a few units in magnitude. Float sums in another order than the
// reference's stay within about 1e-6 (kTilesTolerance: 5e-6; measured at
// most 1.0e-6). The split operands of the tensor-core body carry about
// 2^-16 of relative error each, so a logit of D products moves by about
// 1e-5 (kMmaTolerance: 5e-5; measured at most 1.2e-5). Taking the hi parts
// only (one bf16 product instead of three) misses kMmaTolerance by about
// two orders of magnitude: the test checks the split.
//
// The two bodies of prefillColumnStats (prefillColumnStatsTiles and
// prefillColumnStatsMma) on the same inputs, with the reference's
// log-sum-exps, against statistics computed in double: SnapKV-style window
// means with the last query's weights, H2O-style decayed sums, Scissorhands-
// style importance bits under each group reduction, a window longer than
// the prompt, a history longer than it, a prompt of many query steps, and
// a decay of 0.
// Means, weights and sums must be within kStatsTilesTolerance (1e-4;
// measured at most 1.5e-6) or kStatsMmaTolerance (1e-4; measured at most
// 1.9e-5) relative to max(|want|, 1e-3); bits must be equal except where
// the reference's reduced weight is within 1e-4 (relative) of the threshold
// (the counts are printed: 1 of 2586 set bits in these cases).
//
//===----------------------------------------------------------------------===//

#include "runtime/kvc_cuda.cuh"
#include "test/cudaemu/EmuCheck.h"

#include <cmath>
#include <cstdio>
#include <random>
#include <vector>

namespace {

constexpr double kTilesTolerance = 5e-6;
constexpr double kMmaTolerance = 5e-5;
constexpr double kStatsTilesTolerance = 1e-4;
constexpr double kStatsMmaTolerance = 1e-4;

template <int G, int D>
__global__ void tilesOnly(int32_t n, const float *q, const float *k,
                          const float *v, float scale, float *out, float *lse) {
  kvc::cuda::prefillAttentionTiles<G, D>(n, q, k, v, scale, out, lse);
}

template <int G, int D>
__global__ void mmaOnly(int32_t n, const float *q, const float *k,
                        const float *v, float scale, float *out, float *lse) {
  kvc::cuda::prefillAttentionMma<G, D>(n, q, k, v, scale, out, lse);
}

template <int G, int D>
__global__ void statsTilesOnly(int32_t n, int32_t kvHeads, const float *q,
                               const float *k, float scale, const float *lse,
                               int32_t window, float *windowProbs,
                               float *lastProbs, float *accumulated,
                               float decay,
                               kvc::cuda::PersistenceBits persistence) {
  kvc::cuda::prefillColumnStatsTiles<G, D>(n, kvHeads, q, k, scale, lse,
                                           window, windowProbs, lastProbs,
                                           accumulated, decay, persistence);
}

template <int G, int D>
__global__ void statsMmaOnly(int32_t n, int32_t kvHeads, const float *q,
                             const float *k, float scale, const float *lse,
                             int32_t window, float *windowProbs,
                             float *lastProbs, float *accumulated, float decay,
                             kvc::cuda::PersistenceBits persistence) {
  kvc::cuda::prefillColumnStatsMma<G, D>(n, kvHeads, q, k, scale, lse, window,
                                         windowProbs, lastProbs, accumulated,
                                         decay, persistence);
}

/// Causal attention in double: out[t][h][c] and lse[h][t] (natural log).
void reference(int32_t n, int32_t qHeads, int G, int D, const std::vector<float> &q,
               const std::vector<float> &k, const std::vector<float> &v,
               double scale, std::vector<double> &out, std::vector<double> &lse) {
  const int32_t kvHeads = qHeads / G;
  out.assign(static_cast<size_t>(n) * qHeads * D, 0.0);
  lse.assign(static_cast<size_t>(qHeads) * n, 0.0);
  std::vector<double> logits(n);
  for (int32_t h = 0; h < qHeads; ++h)
    for (int32_t t = 0; t < n; ++t) {
      const float *qr = &q[(static_cast<size_t>(t) * qHeads + h) * D];
      double mx = -HUGE_VAL;
      for (int32_t j = 0; j <= t; ++j) {
        const float *kr = &k[(static_cast<size_t>(j) * kvHeads + h / G) * D];
        double dot = 0.0;
        for (int c = 0; c < D; ++c)
          dot += static_cast<double>(qr[c]) * kr[c];
        logits[j] = dot * scale;
        mx = std::max(mx, logits[j]);
      }
      double z = 0.0;
      for (int32_t j = 0; j <= t; ++j)
        z += std::exp(logits[j] - mx);
      double *o = &out[(static_cast<size_t>(t) * qHeads + h) * D];
      for (int32_t j = 0; j <= t; ++j) {
        const double p = std::exp(logits[j] - mx) / z;
        const float *vr = &v[(static_cast<size_t>(j) * kvHeads + h / G) * D];
        for (int c = 0; c < D; ++c)
          o[c] += p * vr[c];
      }
      lse[static_cast<size_t>(h) * n + t] = mx + std::log(z);
    }
}

enum class Body { Tiles, Mma };

/// `count` floats uniform in [-amplitude, amplitude].
std::vector<float> uniform(std::mt19937 &rng, size_t count, float amplitude) {
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  std::vector<float> out(count);
  for (float &x : out)
    x = amplitude * u(rng);
  return out;
}

/// A device copy of `host` that starts `skip` floats into its allocation:
/// skip = 1 makes rows miss 16-byte alignment, so the kernels read them one
/// float at a time instead of as float4.
float *uploadAt(const std::vector<float> &host, int skip) {
  std::vector<float> padded(skip, 0.0f);
  padded.insert(padded.end(), host.begin(), host.end());
  return upload(padded) + skip;
}

template <int G, int D>
void check(std::mt19937 &rng, int32_t n, Body body, int skip) {
  constexpr int32_t kKvHeads = 2, kQHeads = kKvHeads * G;
  const char *name = body == Body::Tiles ? "prefillAttentionTiles"
                                         : "prefillAttentionMma";
  const double tolerance =
      body == Body::Tiles ? kTilesTolerance : kMmaTolerance;
  // Logits up to about 4 / sqrt(D) * D / 3 in magnitude: softmaxes that
  // are neither flat nor one-hot.
  const std::vector<float> q = uniform(rng, size_t(n) * kQHeads * D, 2.0f);
  const std::vector<float> k = uniform(rng, size_t(n) * kKvHeads * D, 2.0f);
  const std::vector<float> v = uniform(rng, k.size(), 1.0f);
  const float scale = 1.0f / std::sqrt(static_cast<float>(D));
  std::vector<double> wantOut, wantLse;
  reference(n, kQHeads, G, D, q, k, v, scale, wantOut, wantLse);

  float *dq = uploadAt(q, skip), *dk = uploadAt(k, skip),
        *dv = uploadAt(v, skip);
  float *dout = upload(std::vector<float>(q.size(), NAN));
  float *dlse = upload(std::vector<float>(static_cast<size_t>(kQHeads) * n, NAN));
  float *dlse2 =
      upload(std::vector<float>(static_cast<size_t>(kQHeads) * n, NAN));
  const int tile = body == Body::Tiles ? kvc::cuda::kPrefillTilesQueryTile
                                       : kvc::cuda::kPrefillMmaQueryTile;
  const dim3 grid((n + tile - 1) / tile, kQHeads);
  auto launch = [&](float *out, float *lse) {
    if (body == Body::Tiles)
      tilesOnly<G, D><<<grid, kvc::cuda::kPrefillThreads>>>(n, dq, dk, dv,
                                                            scale, out, lse);
    else
      mmaOnly<G, D><<<grid, kvc::cuda::kPrefillThreads>>>(n, dq, dk, dv,
                                                          scale, out, lse);
    CHECK(cudaGetLastError() == cudaSuccess, "%s launch", name);
  };
  launch(dout, dlse);
  launch(nullptr, dlse2);
  const std::vector<float> out = download(dout, q.size());
  const std::vector<float> lse = download(dlse, wantLse.size());
  const std::vector<float> lse2 = download(dlse2, wantLse.size());

  double worstOut = 0.0, worstLse = 0.0;
  for (size_t i = 0; i < out.size(); ++i) {
    const double err = std::fabs(out[i] - wantOut[i]);
    CHECK(err <= tolerance,
          "%s G=%d D=%d n=%d: output %zu (token %zu, head %zu, channel %zu) "
          "%.9g, want %.9g",
          name, G, D, n, i, i / (kQHeads * D), i / D % kQHeads, i % D, out[i],
          wantOut[i]);
    worstOut = std::max(worstOut, err);
  }
  for (size_t i = 0; i < lse.size(); ++i) {
    const double err = std::fabs(lse[i] - wantLse[i]);
    CHECK(err <= tolerance,
          "%s G=%d D=%d n=%d: lse of head %zu, token %zu %.9g, want %.9g",
          name, G, D, n, i / n, i % n, lse[i], wantLse[i]);
    CHECK(lse2[i] == lse[i],
          "%s G=%d D=%d n=%d: lse %zu without an output %.9g, with %.9g", name,
          G, D, n, i, lse2[i], lse[i]);
    worstLse = std::max(worstLse, err);
  }
  std::printf("%-22s G=%d D=%-3d n=%-4d%s max |out err| %.2e, max |lse "
              "err| %.2e\n",
              name, G, D, n, skip ? " (unaligned)" : "", worstOut, worstLse);
  cudaFree(dq - skip);
  cudaFree(dk - skip);
  cudaFree(dv - skip);
  cudaFree(dout);
  cudaFree(dlse);
  cudaFree(dlse2);
}

/// The statistics a column-statistics run computes (null buffers: not).
struct StatsCase {
  int32_t window;   // 0: no window statistics
  bool last;        // kvc.attn_last
  bool accumulated; // decayed sum over every query
  float decay;
  int32_t history;  // 0: no importance bits
  kvc::cuda::Reduce reduce;
  float threshold;
};

const char *reduceName(kvc::cuda::Reduce r) {
  return r == kvc::cuda::Reduce::Max   ? "max"
         : r == kvc::cuda::Reduce::Sum ? "sum"
                                       : "mean";
}

/// prefillColumnStats's body against the double-precision statistics of
/// the same log-sum-exps: window means, last-query weights and decayed sums
/// within the body's tolerance relative to max(|want|, kStatsFloor); the
/// importance bits equal, except where the reference's group-reduced
/// weight lies within kBitsMargin (relative) of the threshold.
template <int G, int D>
void checkStats(std::mt19937 &rng, int32_t n, Body body, const StatsCase &c,
                int skip) {
  using kvc::cuda::Reduce;
  constexpr int32_t kKvHeads = 2, kQHeads = kKvHeads * G;
  constexpr double kStatsFloor = 1e-3, kBitsMargin = 1e-4;
  const char *name = body == Body::Tiles ? "prefillColumnStatsTiles"
                                         : "prefillColumnStatsMma";
  const double tolerance =
      body == Body::Tiles ? kStatsTilesTolerance : kStatsMmaTolerance;
  const std::vector<float> q = uniform(rng, size_t(n) * kQHeads * D, 2.0f);
  const std::vector<float> k = uniform(rng, size_t(n) * kKvHeads * D, 2.0f);
  const float scale = 1.0f / std::sqrt(static_cast<float>(D));
  std::vector<double> unusedOut, lse64;
  reference(n, kQHeads, G, D, q, k, std::vector<float>(k.size(), 0.0f), scale,
            unusedOut, lse64);
  std::vector<float> lse(lse64.begin(), lse64.end());

  // p[(head * n + t) * n + j] in double, from the float log-sum-exps.
  std::vector<double> p(static_cast<size_t>(kQHeads) * n * n, 0.0);
  for (int32_t hq = 0; hq < kQHeads; ++hq)
    for (int32_t t = 0; t < n; ++t)
      for (int32_t j = 0; j <= t; ++j) {
        double dot = 0.0;
        for (int ch = 0; ch < D; ++ch)
          dot += static_cast<double>(
                     q[(static_cast<size_t>(t) * kQHeads + hq) * D + ch]) *
                 k[(static_cast<size_t>(j) * kKvHeads + hq / G) * D + ch];
        p[(static_cast<size_t>(hq) * n + t) * n + j] =
            std::exp(dot * scale - lse[static_cast<size_t>(hq) * n + t]);
      }
  const int32_t w = std::min(c.window, n);
  std::vector<double> wantWindow(static_cast<size_t>(kQHeads) * n, 0.0),
      wantLast(wantWindow.size(), 0.0), wantAcc(wantWindow.size(), 0.0);
  for (int32_t hq = 0; hq < kQHeads; ++hq)
    for (int32_t j = 0; j < n; ++j) {
      const size_t at = static_cast<size_t>(hq) * n + j;
      const double *pj = &p[static_cast<size_t>(hq) * n * n + j];
      for (int32_t t = j; t < n; ++t) {
        const double x = pj[static_cast<size_t>(t) * n];
        wantAcc[at] += std::pow(static_cast<double>(c.decay), n - 1 - t) * x;
        if (t >= n - w && j < n - w)
          wantWindow[at] += x / w;
      }
      wantLast[at] = pj[static_cast<size_t>(n - 1) * n];
    }

  float *dq = uploadAt(q, skip), *dk = uploadAt(k, skip),
        *dlse = upload(lse);
  const std::vector<float> nans(wantWindow.size(), NAN);
  float *dWindow = c.window ? upload(nans) : nullptr;
  float *dLast = c.last ? upload(nans) : nullptr;
  float *dAcc = c.accumulated ? upload(nans) : nullptr;
  uint64_t *dBits =
      c.history ? upload(std::vector<uint64_t>(static_cast<size_t>(kKvHeads) * n,
                                               0x5a5a5a5a5a5a5a5aull))
                : nullptr;
  const kvc::cuda::PersistenceBits persistence{c.history, c.threshold,
                                               c.reduce, dBits};
  const dim3 grid((n + kvc::cuda::kKeyTile - 1) / kvc::cuda::kKeyTile,
                  kKvHeads);
  if (body == Body::Tiles)
    statsTilesOnly<G, D><<<grid, kvc::cuda::kPrefillThreads>>>(
        n, kKvHeads, dq, dk, scale, dlse, c.window, dWindow, dLast, dAcc,
        c.decay, persistence);
  else
    statsMmaOnly<G, D><<<grid, kvc::cuda::kPrefillThreads>>>(
        n, kKvHeads, dq, dk, scale, dlse, c.window, dWindow, dLast, dAcc,
        c.decay, persistence);
  CHECK(cudaGetLastError() == cudaSuccess, "%s launch", name);

  double worst = 0.0;
  auto compare = [&](const float *d, const std::vector<double> &want,
                     const char *what) {
    if (!d)
      return;
    const std::vector<float> got = download(d, want.size());
    for (size_t i = 0; i < want.size(); ++i) {
      const double err = std::fabs(got[i] - want[i]) /
                         std::max(std::fabs(want[i]), kStatsFloor);
      CHECK(err <= tolerance,
            "%s G=%d D=%d n=%d: %s of head %zu, entry %zu %.9g, want %.9g",
            name, G, D, n, what, i / n, i % n, got[i], want[i]);
      worst = std::max(worst, err);
    }
  };
  compare(dWindow, wantWindow, "window mean");
  compare(dLast, wantLast, "last-query weight");
  compare(dAcc, wantAcc, "decayed sum");
  int32_t nearThreshold = 0, setBits = 0;
  if (dBits) {
    const std::vector<uint64_t> bits =
        download(dBits, static_cast<size_t>(kKvHeads) * n);
    for (int32_t h = 0; h < kKvHeads; ++h)
      for (int32_t j = 0; j < n; ++j) {
        uint64_t want = 0, loose = 0;
        for (int32_t a = 0; a < std::min(c.history, n); ++a) {
          const int32_t t = n - 1 - a;
          if (j > t)
            break;
          double r = c.reduce == Reduce::Max ? -HUGE_VAL : 0.0;
          for (int g = 0; g < G; ++g) {
            const double x =
                p[(static_cast<size_t>(h * G + g) * n + t) * n + j];
            r = c.reduce == Reduce::Max ? std::max(r, x) : r + x;
          }
          if (c.reduce == Reduce::Mean)
            r /= G;
          if (r > c.threshold)
            want |= uint64_t{1} << a;
          if (std::fabs(r - c.threshold) <= kBitsMargin * c.threshold)
            loose |= uint64_t{1} << a;
        }
        const uint64_t got = bits[static_cast<size_t>(h) * n + j];
        CHECK((got & ~loose) == (want & ~loose),
              "%s G=%d D=%d n=%d: importance bits of kv-head %d, entry %d "
              "%016llx, want %016llx (bits within the margin: %016llx)",
              name, G, D, n, h, j, static_cast<unsigned long long>(got),
              static_cast<unsigned long long>(want),
              static_cast<unsigned long long>(loose));
        nearThreshold += __builtin_popcountll(loose);
        setBits += __builtin_popcountll(want);
      }
  }
  std::printf("%-24s G=%d D=%-3d n=%-4d%s window %d%s%s, decay %.2f, "
              "history %d %s: max rel err %.2e",
              name, G, D, n, skip ? " (unaligned)" : "", c.window,
              c.last ? ", last" : "",
              c.accumulated ? ", accumulated" : "", c.decay, c.history,
              reduceName(c.reduce), worst);
  if (dBits)
    std::printf(", %d bits set, %d within the margin", setBits, nearThreshold);
  std::printf("\n");
  cudaFree(dq - skip);
  cudaFree(dk - skip);
  cudaFree(dlse);
  cudaFree(dWindow);
  cudaFree(dLast);
  cudaFree(dAcc);
  cudaFree(dBits);
}

template <int G, int D>
void checkStatsBoth(std::mt19937 &rng, int32_t n, const StatsCase &c,
                    int skip = 0) {
  // Both bodies see the same inputs.
  std::mt19937 again = rng;
  checkStats<G, D>(rng, n, Body::Tiles, c, skip);
  checkStats<G, D>(again, n, Body::Mma, c, skip);
}

template <int G, int D>
void checkBoth(std::mt19937 &rng, int32_t n, int skip = 0) {
  check<G, D>(rng, n, Body::Tiles, skip);
  check<G, D>(rng, n, Body::Mma, skip);
}

} // namespace

int main() {
  if (const int skip = skipWithoutDevice("the prefill kernel test"))
    return skip;
  std::mt19937 rng(20261123);
  checkBoth<1, 32>(rng, 1);
  checkBoth<1, 32>(rng, 21);
  checkBoth<2, 64>(rng, 150);
  checkBoth<4, 128>(rng, 131);
  checkBoth<1, 128>(rng, 70);
  checkBoth<2, 64>(rng, 100, 1);
  using kvc::cuda::Reduce;
  // SnapKV-style window with the last query; H2O-style decayed sums with
  // Scissorhands-style bits; a history longer than the prompt; bits alone;
  // a window over the whole prompt (every mean 0); a long prompt.
  checkStatsBoth<1, 32>(rng, 90, {16, true, false, 1.0f, 0, Reduce::Mean, 0});
  checkStatsBoth<2, 64>(rng, 150,
                        {0, false, true, 0.9f, 20, Reduce::Mean, 0.02f});
  checkStatsBoth<4, 128>(rng, 50,
                         {30, true, true, 1.0f, 64, Reduce::Max, 0.04f});
  checkStatsBoth<2, 32>(rng, 40, {64, false, false, 1.0f, 0, Reduce::Mean, 0});
  // Many steps of 32 queries before the window (the decayed sum alone).
  checkStatsBoth<1, 64>(rng, 300,
                        {8, true, true, 0.99f, 0, Reduce::Mean, 0});
  checkStatsBoth<3, 64>(rng, 77, {0, false, false, 1.0f, 33, Reduce::Sum,
                                  0.1f});
  checkStatsBoth<2, 64>(rng, 100,
                        {16, true, true, 1.0f, 10, Reduce::Mean, 0.02f}, 1);
  // Decay 0: the decayed sum is the last query's weights.
  checkStatsBoth<1, 32>(rng, 45, {0, true, true, 0.0f, 0, Reduce::Mean, 0});
  std::printf("prefill kernel: ok\n");
  return 0;
}
