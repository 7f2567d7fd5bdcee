//===- BlockPrimitivesTest.cu - Block-wide selection and compaction -------===//
//
// The block primitives of runtime/kvc_cuda.cuh that the stage kernels build
// on, run on the emulator against host references computed with the
// standard library, for blocks of 256 and 512 threads:
//  - blockSelectKth: the k-th smallest key, for k = 1 (the block-wide
//    minimum) and larger k (radix selection), over 64-bit keys with ties
//    and invalid entries, and over 32-bit positions whose leading bytes are
//    all equal (every lane of a warp counts into the same histogram bin);
//  - forEachRanked and compactIndices: the indices of a predicate in
//    ascending order with their ranks, for n below, at and far above the
//    block size, and n = 0;
//  - selectVictims: exactly `drop` victims, the smallest keys (score,
//    position), ties in index order, for drop = 1 and larger;
//  - copyAsync, commitCopies and waitCopies (the decode kernel's cp.async
//    tiles): waitCopies<1> lands the older of two groups and only it, a
//    barrier after every thread's wait publishes the copies, 16- and 4-byte
//    copies. The emulator lands a copy at the wait that covers it, not
//    before (a kernel that reads a tile too early fails its test); the
//    device may land it any time until then;
//  - PageDivisor (slot -> page and offset without a divide): against / and %
//    for every page size up to 4096, sizes near powers of two up to 2^30
//    and 2^31 - 1, at both sides of page boundaries, 2^31 - 1 and random
//    slots;
//  - the integer KIVI tiles' arithmetic (decodeKiviTiles): KiviDigitScale
//    and KiviDigits (two 15-bit digits within unit / 2^16 of every value
//    up to the bound, for bounds from 0 and subnormals to just under
//    2^127; NaN units beyond and for infinities and NaNs), dot2x16 against
//    the PTX definition of dp2a.lo / dp2a.hi, and the digit and weight
//    layouts (KiviTiles::digitIndex, weightIndex): one entry each, the
//    bytes a shift and a mask give, the pairs a value lane loads; the
//    tensor-core keys' KiviKeyScale (factors of up to 2^22 as three digit
//    bytes of one fused multiply-add) and fragment layout (keyIndex,
//    keyWord, keyDigitByte); and warpSumScattered (each lane the warp sum
//    its lane bits name).
// Exits 1 on the first difference.
//
//===----------------------------------------------------------------------===//

#include "runtime/kvc_cuda.cuh"
#include "test/cudaemu/EmuCheck.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <vector>

namespace {

template <int kThreads, int kBits>
__global__ void selectKth(const uint64_t *keys, const uint8_t *valid, int32_t n,
                          const int64_t *ks, int32_t numK, uint64_t *out) {
  for (int32_t j = 0; j < numK; ++j) {
    const uint64_t r = kvc::cuda::blockSelectKth<kThreads, kBits>(
        n, ks[j], [&](int32_t i, uint64_t *key) {
          *key = keys[i];
          return valid[i] != 0;
        });
    if (threadIdx.x == 0)
      out[j] = r;
  }
}

template <int kThreads>
__global__ void ranked(const uint8_t *flags, int32_t n, int32_t *list,
                       int32_t *ranks, int32_t *counts) {
  const int32_t total = kvc::cuda::forEachRanked<kThreads>(
      n, [&](int32_t i) { return flags[i] != 0; },
      [&](int32_t i, int32_t rank) {
        list[rank] = i;
        ranks[i] = rank;
      });
  kvc::cuda::compactIndices<kThreads>(
      n, [&](int32_t i) { return flags[i] != 0; }, list + n, &counts[1]);
  if (threadIdx.x == 0)
    counts[0] = total;
}

template <int kThreads>
__global__ void victims(const float *scores, const int32_t *positions,
                        int32_t n, int64_t budget, uint8_t *victim,
                        int32_t *count) {
  const int32_t drop = kvc::cuda::selectVictims<kThreads>(
      scores, positions, n, budget, /*tieRecent=*/true, victim);
  if (threadIdx.x == 0)
    *count = drop;
}

template <int kThreads, int kBits>
void checkSelect(const char *what, const std::vector<uint64_t> &keys,
                 const std::vector<uint8_t> &valid) {
  std::vector<uint64_t> sorted;
  for (size_t i = 0; i < keys.size(); ++i)
    if (valid[i])
      sorted.push_back(keys[i]);
  std::sort(sorted.begin(), sorted.end());
  const int64_t m = static_cast<int64_t>(sorted.size());
  std::vector<int64_t> ks = {1, 2, 3, m / 2, m - 511, m - 1, m};
  ks.erase(std::remove_if(ks.begin(), ks.end(),
                          [&](int64_t k) { return k < 1 || k > m; }),
           ks.end());
  uint64_t *dKeys = upload(keys);
  uint8_t *dValid = upload(valid);
  int64_t *dKs = upload(ks);
  uint64_t *dOut = upload(std::vector<uint64_t>(ks.size(), 0));
  selectKth<kThreads, kBits>
      <<<1, kThreads>>>(dKeys, dValid, static_cast<int32_t>(keys.size()), dKs,
                        static_cast<int32_t>(ks.size()), dOut);
  CHECK(cudaDeviceSynchronize() == cudaSuccess, "%s: launch", what);
  const std::vector<uint64_t> got = download(dOut, ks.size());
  for (size_t j = 0; j < ks.size(); ++j)
    CHECK(got[j] == sorted[ks[j] - 1],
          "%s, %d threads: key %lld of %lld is %llu, expected %llu", what,
          kThreads, static_cast<long long>(ks[j]), static_cast<long long>(m),
          static_cast<unsigned long long>(got[j]),
          static_cast<unsigned long long>(sorted[ks[j] - 1]));
  cudaFree(dKeys);
  cudaFree(dValid);
  cudaFree(dKs);
  cudaFree(dOut);
}

template <int kThreads> void checkRanked(int32_t n, std::mt19937 &rng) {
  std::vector<uint8_t> flags(n);
  std::vector<int32_t> expected;
  for (int32_t i = 0; i < n; ++i) {
    flags[i] = rng() % 3 == 0;
    if (flags[i])
      expected.push_back(i);
  }
  uint8_t *dFlags = upload(flags);
  int32_t *dList = upload(std::vector<int32_t>(2 * n, -1));
  int32_t *dRanks = upload(std::vector<int32_t>(n, -1));
  int32_t *dCounts = upload(std::vector<int32_t>(2, -1));
  ranked<kThreads><<<1, kThreads>>>(dFlags, n, dList, dRanks, dCounts);
  CHECK(cudaDeviceSynchronize() == cudaSuccess, "ranked: launch");
  const std::vector<int32_t> list = download(dList, 2 * n);
  const std::vector<int32_t> ranks = download(dRanks, n);
  const std::vector<int32_t> counts = download(dCounts, 2);
  const int32_t m = static_cast<int32_t>(expected.size());
  CHECK(counts[0] == m && counts[1] == m,
        "ranked, %d threads, n = %d: counts %d and %d, expected %d", kThreads,
        n, counts[0], counts[1], m);
  for (int32_t r = 0; r < m; ++r)
    CHECK(list[r] == expected[r] && list[n + r] == expected[r] &&
              ranks[expected[r]] == r,
          "ranked, %d threads, n = %d: rank %d is %d (compacted %d), "
          "expected %d",
          kThreads, n, r, list[r], list[n + r], expected[r]);
  for (int32_t i = 0; i < n; ++i)
    CHECK(flags[i] || ranks[i] == -1,
          "ranked, %d threads: index %d emitted but not selected", kThreads, i);
  cudaFree(dFlags);
  cudaFree(dList);
  cudaFree(dRanks);
  cudaFree(dCounts);
}

/// kvc::cuda::orderedBits on the host.
uint32_t orderedBits(float x) {
  uint32_t b = 0;
  const float y = x == 0.0f ? 0.0f : x;
  std::memcpy(&b, &y, sizeof b);
  return (b & 0x80000000u) ? ~b : (b | 0x80000000u);
}

/// A budget of `want` entries fewer than the live ones (want <= 0: no
/// victim is due).
template <int kThreads>
void checkVictims(int32_t n, int64_t want, std::mt19937 &rng) {
  // Few distinct scores and repeated positions: ties at the cut.
  std::vector<float> scores(n);
  std::vector<int32_t> positions(n);
  for (int32_t i = 0; i < n; ++i) {
    scores[i] = static_cast<float>(rng() % 7) * 0.25f;
    positions[i] = rng() % 5 == 0 ? KVC_POSITION_NONE
                                  : static_cast<int32_t>(rng() % (n / 2));
  }
  // Host reference: keys (score, position) ascending, ties in index order.
  std::vector<int32_t> live;
  for (int32_t i = 0; i < n; ++i)
    if (positions[i] != KVC_POSITION_NONE)
      live.push_back(i);
  auto key = [&](int32_t i) {
    return static_cast<uint64_t>(orderedBits(scores[i])) << 32 |
           static_cast<uint32_t>(positions[i]);
  };
  std::stable_sort(live.begin(), live.end(),
                   [&](int32_t a, int32_t b) { return key(a) < key(b); });
  const int64_t budget = std::max<int64_t>(0, live.size() - want);
  const int64_t drop =
      static_cast<int64_t>(live.size()) > budget ? live.size() - budget : 0;
  std::vector<uint8_t> expected(n, 0);
  for (int64_t j = 0; j < drop; ++j)
    expected[live[j]] = 1;

  float *dScores = upload(scores);
  int32_t *dPositions = upload(positions);
  uint8_t *dVictim = upload(std::vector<uint8_t>(n, 7));
  int32_t *dCount = upload(std::vector<int32_t>(1, -1));
  victims<kThreads>
      <<<1, kThreads>>>(dScores, dPositions, n, budget, dVictim, dCount);
  CHECK(cudaDeviceSynchronize() == cudaSuccess, "victims: launch");
  const std::vector<uint8_t> got = download(dVictim, n);
  const int32_t count = download(dCount, 1)[0];
  CHECK(count == drop,
        "victims, %d threads, n = %d, budget %lld: %d, "
        "expected %lld",
        kThreads, n, static_cast<long long>(budget), count,
        static_cast<long long>(drop));
  for (int32_t i = 0; i < n; ++i)
    CHECK(got[i] == expected[i],
          "victims, %d threads, n = %d, budget %lld: entry %d (score %g, "
          "position %d) flagged %d, expected %d",
          kThreads, n, static_cast<long long>(budget), i, scores[i],
          positions[i], got[i], expected[i]);
  cudaFree(dScores);
  cudaFree(dPositions);
  cudaFree(dVictim);
  cudaFree(dCount);
}

/// Thread t copies 16 bytes into its own slot of `a` (group 0) and 4 bytes
/// into `b` (group 1), then reports per stage what it sees: [0] its own `a`
/// slot before any wait, [1] after waitCopies<1>, [2] its own `b` after
/// waitCopies<1>, [3] a neighbour's `a` after the barrier, [4] a
/// neighbour's `b` after waitCopies<0> and a barrier.
__global__ void asyncCopies(const uint4 *in, const uint32_t *in4,
                            uint32_t *out) {
  constexpr int kThreads = 64;
  __shared__ __align__(16) uint4 a[kThreads];
  __shared__ uint32_t b[kThreads];
  const int t = threadIdx.x;
  a[t] = make_uint4(0, 0, 0, 0);
  b[t] = 0;
  __syncthreads();
  kvc::cuda::copyAsync<16>(&a[t], &in[t]);
  kvc::cuda::commitCopies();
  kvc::cuda::copyAsync<4>(&b[t], &in4[t]);
  kvc::cuda::commitCopies();
  uint32_t *o = out + 5 * t;
  o[0] = a[t].x;
  kvc::cuda::waitCopies<1>();
  o[1] = a[t].w;
  o[2] = b[t];
  __syncthreads();
  o[3] = a[(t + 1) % kThreads].y;
  kvc::cuda::waitCopies<0>();
  __syncthreads();
  o[4] = b[(t + 5) % kThreads];
}

/// warpSumScattered over one warp: lane l's values in[l kN + x].
template <int kN, int kLow>
__global__ void scatteredSums(const float *in, float *out) {
  const int lane = threadIdx.x;
  float v[kN];
  for (int x = 0; x < kN; ++x)
    v[x] = in[lane * kN + x];
  out[lane] = kvc::cuda::warpSumScattered<kN, kLow>(v, lane);
}

/// Each lane receives the warp sum of the value its bits [kLow, kLow +
/// log2 kN) name; integer values, so that any order of additions is exact.
template <int kN, int kLow> void checkScatteredSums(std::mt19937 &rng) {
  std::vector<float> in(32 * kN);
  for (float &x : in)
    x = static_cast<float>(static_cast<int>(rng() % 2001) - 1000);
  float *dIn = nullptr, *dOut = nullptr;
  cudaMalloc(&dIn, sizeof(float) * in.size());
  cudaMalloc(&dOut, sizeof(float) * 32);
  cudaMemcpy(dIn, in.data(), sizeof(float) * in.size(),
             cudaMemcpyHostToDevice);
  scatteredSums<kN, kLow><<<1, 32>>>(dIn, dOut);
  CHECK(cudaDeviceSynchronize() == cudaSuccess, "scattered sums: launch");
  const std::vector<float> got = download(dOut, 32);
  for (int lane = 0; lane < 32; ++lane) {
    const int x = lane >> kLow & (kN - 1);
    float want = 0.0f;
    for (int l = 0; l < 32; ++l)
      want += in[l * kN + x];
    CHECK(got[lane] == want,
          "warpSumScattered<%d, %d>: lane %d has %g, the sum of value %d is "
          "%g",
          kN, kLow, lane, got[lane], x, want);
  }
  cudaFree(dIn);
  cudaFree(dOut);
}

void checkAsyncCopies() {
  constexpr int kThreads = 64;
  std::vector<uint4> in(kThreads);
  std::vector<uint32_t> in4(kThreads);
  for (int t = 0; t < kThreads; ++t) {
    in[t] = make_uint4(100 + t, 200 + t, 300 + t, 400 + t);
    in4[t] = 500 + t;
  }
  uint4 *dIn = nullptr;
  uint32_t *dIn4 = nullptr, *dOut = nullptr;
  cudaMalloc(&dIn, sizeof(uint4) * kThreads);
  cudaMalloc(&dIn4, sizeof(uint32_t) * kThreads);
  cudaMalloc(&dOut, sizeof(uint32_t) * 5 * kThreads);
  cudaMemcpy(dIn, in.data(), sizeof(uint4) * kThreads, cudaMemcpyHostToDevice);
  cudaMemcpy(dIn4, in4.data(), sizeof(uint32_t) * kThreads,
             cudaMemcpyHostToDevice);
  asyncCopies<<<1, kThreads>>>(dIn, dIn4, dOut);
  CHECK(cudaDeviceSynchronize() == cudaSuccess, "async copies: launch");
  const std::vector<uint32_t> got = download(dOut, 5 * kThreads);
  for (int t = 0; t < kThreads; ++t) {
    const uint32_t *o = &got[5 * t];
    CHECK(o[0] == 0, "async copies: thread %d saw its copy before the wait",
          t);
    CHECK(o[1] == 400u + t, "async copies: thread %d, group 0 after "
          "waitCopies<1>: %u", t, o[1]);
    CHECK(o[2] == 0, "async copies: thread %d, group 1 landed before its "
          "wait", t);
    CHECK(o[3] == 200u + (t + 1) % kThreads,
          "async copies: thread %d, neighbour's 16 bytes: %u", t, o[3]);
    CHECK(o[4] == 500u + (t + 5) % kThreads,
          "async copies: thread %d, neighbour's 4 bytes: %u", t, o[4]);
  }
  cudaFree(dIn);
  cudaFree(dIn4);
  cudaFree(dOut);
}

template <int kThreads> void checkAll(std::mt19937 &rng) {
  // 64-bit keys: random, with ties and invalid entries.
  {
    const int32_t n = 3001;
    std::vector<uint64_t> keys(n);
    std::vector<uint8_t> valid(n);
    for (int32_t i = 0; i < n; ++i) {
      keys[i] = (static_cast<uint64_t>(rng()) << 32 | rng()) >> (rng() % 40);
      if (i % 9 == 0)
        keys[i] = keys[i / 2];
      valid[i] = rng() % 6 != 0;
    }
    checkSelect<kThreads, 64>("64-bit keys", keys, valid);
  }
  // 32-bit positions below 2^12, shuffled: the leading bytes are equal.
  {
    const int32_t n = 4000;
    std::vector<uint64_t> keys(n);
    std::vector<uint8_t> valid(n, 1);
    for (int32_t i = 0; i < n; ++i)
      keys[i] = static_cast<uint64_t>(i);
    std::shuffle(keys.begin(), keys.end(), rng);
    checkSelect<kThreads, 32>("positions", keys, valid);
  }
  for (int32_t n : {0, 5, kThreads, kThreads + 1, 5000})
    checkRanked<kThreads>(n, rng);
  for (int64_t want : {0, 1, 2, 37, 1500})
    checkVictims<kThreads>(3100, want, rng);
}

} // namespace

void checkPageDivisor(std::mt19937 &rng) {
  std::vector<int32_t> sizes;
  for (int32_t d = 1; d <= 4096; ++d)
    sizes.push_back(d);
  for (int k = 12; k <= 30; ++k)
    for (int32_t delta = -3; delta <= 3; ++delta)
      sizes.push_back((int32_t{1} << k) + delta);
  sizes.push_back(INT32_MAX - 1);
  sizes.push_back(INT32_MAX);
  std::uniform_int_distribution<int32_t> any(0, INT32_MAX);
  for (int32_t d : sizes) {
    const kvc::cuda::PageDivisor div = kvc::cuda::PageDivisor::of(d);
    std::vector<int32_t> slots = {0, 1, INT32_MAX, INT32_MAX - 1};
    for (int32_t p : {int32_t{1}, int32_t{2}, int32_t{3}, INT32_MAX / d,
                      INT32_MAX / d - 1, INT32_MAX / d / 2})
      for (int32_t delta : {-1, 0, 1}) {
        const int64_t slot = static_cast<int64_t>(p) * d + delta;
        if (slot >= 0 && slot <= INT32_MAX)
          slots.push_back(static_cast<int32_t>(slot));
      }
    for (int i = 0; i < 64; ++i)
      slots.push_back(any(rng));
    for (int32_t slot : slots) {
      CHECK(div.page(slot) == slot / d && div.offset(slot) == slot % d,
            "PageDivisor(%d): slot %d gives page %d offset %d, want %d %d", d,
            slot, div.page(slot), div.offset(slot), slot / d, slot % d);
    }
  }
  std::printf("page divisor: %zu sizes ok\n", sizes.size());
}

/// The values a scale of `bound` is checked on: 0, the bound and its
/// neighbours below (both signs), the least subnormal, and 2,000 random
/// values within the bound.
std::vector<float> valuesUnder(float bound, std::mt19937 &rng) {
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  std::vector<float> xs = {0.0f,
                           bound,
                           -bound,
                           bound * 0.5f,
                           std::nextafter(bound, 0.0f),
                           -std::nextafter(bound, 0.0f),
                           0x1p-149f,
                           -0x1p-149f};
  for (int i = 0; i < 2000; ++i)
    xs.push_back(bound * u(rng));
  return xs;
}

/// KiviDigitScale and KiviDigits over values up to `bound`.
void checkDigitsUnder(float bound, std::mt19937 &rng) {
  const kvc::cuda::KiviDigitScale k(
      __float_as_uint(std::fabs(bound)));
  if (!(std::fabs(bound) < 0x1p127f)) {
    CHECK(std::isnan(k.unit) && k.scale == 0.0f,
          "bound %g: unit %g, scale %g, want NaN and 0", bound, k.unit,
          k.scale);
    return;
  }
  CHECK(static_cast<double>(k.unit) * k.scale == 1.0,
        "bound %g: unit %g times scale %g is not 1", bound, k.unit, k.scale);
  // The unit is the bound's power of two over 2^13 (2^-126 at the least).
  const double want =
      std::max(std::ldexp(1.0, std::ilogb(std::max(bound, 0x1p-126f)) - 13),
               0x1p-126);
  CHECK(k.unit == want || (bound < 0x1p-113f && k.unit == 0x1p-126f),
        "bound %g: unit %g, want %g", bound, k.unit, want);
  for (float x : valuesUnder(bound, rng)) {
    const kvc::cuda::KiviDigits d(x, k.scale);
    CHECK(std::abs(d.d0) <= 16384 && std::abs(d.d1) <= 16384,
          "bound %g, x %.9g: digits %d %d beyond 15 bits", bound, x, d.d0,
          d.d1);
    const double back = static_cast<double>(k.unit) *
                        (d.d0 + static_cast<double>(d.d1) / 32768.0);
    CHECK(std::fabs(back - x) <= static_cast<double>(k.unit) / 65536.0,
          "bound %g, x %.9g: digits %d %d give %.12g", bound, x, d.d0, d.d1,
          back);
  }
}

/// KiviKeyScale and the fixed-point key factors of decodeKiviTiles at G = 1
/// (tileKeyLogit): fmaf(x, scale, 1.5 2^23) holds X + 2^22 in bytes 0, 1,
/// 2 of its bits, X within 1/2 of x scale and |X| <= 2^22 for |x| up to the
/// bound (byte 2 at most 128).
void checkKeyFactorsUnder(float bound, std::mt19937 &rng) {
  const kvc::cuda::KiviKeyScale k(__float_as_uint(std::fabs(bound)));
  if (!(std::fabs(bound) < 0x1p127f)) {
    CHECK(std::isnan(k.unit) && k.scale == 0.0f,
          "key bound %g: unit %g, scale %g, want NaN and 0", bound, k.unit,
          k.scale);
    return;
  }
  // The unit is the bound's power of two over 2^21 (2^-126 at the least).
  const double want =
      std::max(std::ldexp(1.0, std::ilogb(std::max(bound, 0x1p-126f)) - 21),
               0x1p-126);
  CHECK(static_cast<double>(k.unit) * k.scale == 1.0 &&
            (k.unit == want || (bound < 0x1p-105f && k.unit == 0x1p-126f)),
        "key bound %g: unit %g, scale %g, want unit %g", bound, k.unit,
        k.scale, want);
  for (float x : valuesUnder(bound, rng)) {
    const uint32_t bits = __float_as_uint(std::fmaf(x, k.scale, 12582912.0f));
    const int64_t d0 = bits & 0xffu, d1 = bits >> 8 & 0xffu,
                  d2 = bits >> 16 & 0xffu;
    const int64_t fixed = d0 + 256 * d1 + 65536 * d2 - (1 << 22);
    const double exact = static_cast<double>(x) * k.scale;
    CHECK(d2 <= 128 && std::llabs(fixed) <= (1 << 22) &&
              std::fabs(static_cast<double>(fixed) - exact) <= 0.5,
          "key bound %g, x %.9g: digits %lld %lld %lld give %lld, want %.3f",
          bound, x, static_cast<long long>(d0), static_cast<long long>(d1),
          static_cast<long long>(d2), static_cast<long long>(fixed), exact);
  }
}

/// A code layout's digit and weight indices (KiviTiles at int2 or int4).
template <int kBits, int D> void checkKiviLayout(std::mt19937 &rng) {
  using Tiles = kvc::cuda::KiviTiles<1, D, kBits, 32, KVC_DTYPE_F16, 128>;
  std::vector<int> seen(2 * D, 0);
  std::vector<uint32_t> words(D * kBits / 32);
  for (uint32_t &w : words)
    w = static_cast<uint32_t>(rng());
  for (int c = 0; c < D; ++c) {
    for (int digit = 0; digit < 2; ++digit) {
      const int i = Tiles::digitIndex(c, digit);
      CHECK(i >= 0 && i < 2 * D && seen[i]++ == 0,
            "int%d D=%d: digit %d of channel %d at %d, taken or outside",
            kBits, D, digit, c, i);
    }
    // The run j = c % kCodesPerByte of c's word holds code c in byte
    // k = digitIndex(c, 0) % 4, and digit 1 sits 4 entries after digit 0.
    const uint32_t word = words[c / Tiles::kCodesPerWord];
    const uint32_t run =
        (word >> (c % Tiles::kCodesPerByte * kBits)) & Tiles::kByteMask;
    const int k = Tiles::digitIndex(c, 0) % 4;
    const uint32_t code =
        word >> (c % Tiles::kCodesPerWord * kBits) & ((1u << kBits) - 1);
    CHECK((run >> (8 * k) & 0xffu) == code &&
              Tiles::digitIndex(c, 1) == Tiles::digitIndex(c, 0) + 4,
          "int%d D=%d: channel %d is not in byte %d of its run", kBits, D, c,
          k);
  }
  std::vector<int> slot(64, 0);
  for (int r = 0; r < 32; ++r)
    for (int digit = 0; digit < 2; ++digit) {
      const int i = Tiles::weightIndex(r, digit);
      CHECK(i >= 0 && i < 64 && slot[i]++ == 0,
            "D=%d: weight digit %d of slot %d at %d, taken or outside", D,
            digit, r, i);
    }
  for (int sub = 0; sub < Tiles::kSlotsPerStep; ++sub)
    for (int p = 0; p < Tiles::kPairsPerLane; ++p) {
      const int r0 = sub + 2 * p * Tiles::kSlotsPerStep,
                r1 = r0 + Tiles::kSlotsPerStep;
      const int at = 4 * (sub * Tiles::kPairsPerLane + p);
      CHECK(Tiles::weightIndex(r0, 0) == at &&
                Tiles::weightIndex(r1, 0) == at + 1 &&
                Tiles::weightIndex(r0, 1) == at + 2 &&
                Tiles::weightIndex(r1, 1) == at + 3,
            "D=%d: slots %d and %d are not pair %d's", D, r0, r1, at / 4);
    }
  // The key fragments of mmaK32U8 (keyIndex, keyWord): k 4t + 16 half + i
  // of step ks, entry 8t + 4 half + i, is byte i of key word keyWord(ks, t,
  // half) shifted by kBits (t % kCodesPerByte) and masked; the G = 1
  // tiles' digit bytes (keyDigitByte) take each of the 3 D bytes once, per
  // step 32 a digit in keyIndex order.
  std::vector<int> entries(D, 0), bytes(3 * D, 0);
  for (int c = 0; c < D; ++c) {
    const int e = Tiles::keyIndex(c);
    CHECK(e / 32 == c / 32 && entries[e]++ == 0,
          "int%d D=%d: channel %d at key entry %d, taken or in another step",
          kBits, D, c, e);
    const int t = e % 32 / 8, half = e % 8 / 4, i = e % 4;
    const uint32_t word = words[Tiles::keyWord(c / 32, t, half)];
    const uint32_t run =
        word >> (t % Tiles::kCodesPerByte * kBits) & Tiles::kByteMask;
    const uint32_t code =
        words[c / Tiles::kCodesPerWord] >> (c % Tiles::kCodesPerWord * kBits) &
        ((1u << kBits) - 1);
    CHECK((run >> (8 * i) & 0xffu) == code,
          "int%d D=%d: channel %d is not byte %d of lane %d's half %d", kBits,
          D, c, i, t, half);
    for (int digit = 0; digit < 3; ++digit) {
      const int at = Tiles::keyDigitByte(c, digit);
      CHECK(at == (c / 32 * 3 + digit) * 32 + e % 32 && bytes[at]++ == 0,
            "int%d D=%d: digit %d of channel %d at byte %d", kBits, D, digit,
            c, at);
    }
  }
}

void checkKiviArithmetic(std::mt19937 &rng) {
  for (float bound : {0.0f, 0x1p-149f, 0x1p-130f, 0x1p-126f, 0x1p-113f,
                      1e-30f, 1e-3f, 0.75f, 1.0f, 3.99f, 4.0f, 1000.0f,
                      1e30f, 0x1.fffffep126f, 0x1p127f, 3e38f, INFINITY,
                      NAN})
  {
    checkDigitsUnder(bound, rng);
    checkKeyFactorsUnder(bound, rng);
  }
  std::uniform_int_distribution<uint32_t> any;
  for (int i = 0; i < 10000; ++i) {
    const uint32_t a = any(rng), b = any(rng);
    const int32_t acc = static_cast<int32_t>(any(rng) >> 2);
    const int64_t a0 = static_cast<int16_t>(a),
                  a1 = static_cast<int16_t>(a >> 16);
    const int64_t lo = a0 * static_cast<int8_t>(b) +
                       a1 * static_cast<int8_t>(b >> 8),
                  hi = a0 * static_cast<int8_t>(b >> 16) +
                       a1 * static_cast<int8_t>(b >> 24);
    CHECK(kvc::cuda::dot2x16<true>(a, b, acc) == acc + lo &&
              kvc::cuda::dot2x16<false>(a, b, acc) == acc + hi,
          "dot2x16(%08x, %08x, %d): %d %d, want %lld %lld", a, b, acc,
          kvc::cuda::dot2x16<true>(a, b, acc),
          kvc::cuda::dot2x16<false>(a, b, acc),
          static_cast<long long>(acc + lo), static_cast<long long>(acc + hi));
  }
  checkKiviLayout<2, 128>(rng);
  checkKiviLayout<4, 128>(rng);
  checkKiviLayout<2, 64>(rng);
  checkKiviLayout<4, 32>(rng);
  // The value groups' offsets: head dim 128 and 64 in groups of 32, 128 in
  // groups of 64, one group; and a wider spread.
  checkScatteredSums<4, 2>(rng);
  checkScatteredSums<2, 2>(rng);
  checkScatteredSums<2, 3>(rng);
  checkScatteredSums<1, 2>(rng);
  checkScatteredSums<8, 1>(rng);
  std::printf("KIVI digits, dp2a, layouts and scattered sums: ok\n");
}

int main() {
  std::mt19937 rng(20261122);
  checkPageDivisor(rng);
  checkKiviArithmetic(rng);
  checkAll<256>(rng);
  checkAll<512>(rng);
  checkAsyncCopies();
  std::printf("block primitives: ok\n");
  return 0;
}
