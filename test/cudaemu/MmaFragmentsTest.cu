//===- MmaFragmentsTest.cu - The mma.sync wrappers against matrix products ===//
//
// The tensor-core products of runtime/kvc_cuda.cuh that the decode and
// prefill kernels build on, each against a product of whole matrices
// formed here, with the operands placed in the lanes' registers by the
// fragment layouts of the PTX ISA (written out below, not taken from the
// kernels):
//  - mmaK8 (m16n8k8) and mmaK16 (m16n8k16), f16 and bf16 operands, float
//    accumulators; mmaK16Split (lo * hi + hi * lo + hi * hi of split
//    operands), mmaK16SplitColumns (the same A split products into two
//    accumulators, each with its B) and mmaK32U8 (m16n8k32, unsigned
//    bytes, 32-bit sums);
//  - a warp's run of products into one accumulator and into several,
//    with shuffles between them, in four warps of a block at once (each
//    warp's operands its own).
// The operands are small integers (bytes for mmaK32U8), so that every
// product and sum is exact in float whatever order the tensor cores take:
// a result that differs by any amount names a misplaced element, printed
// with its warp, row and column. Then, on the emulator only, operands of
// every magnitude: its products are mmaK8Products' order of sums, bit for
// bit, which a batched exchange (mmaEmulatedColumns) must keep; on a GPU those
// results lie within a relative 2^-20 of the same sums in double.
// Built for the emulator (cudaemu.mma-fragments, and again with blocks
// shuffled and threads reversed, where another lane forms a warp's
// products) and for a GPU (gpu.kernel.mma-fragments). Exits 1 on the first
// difference.
//
//===----------------------------------------------------------------------===//

#include "runtime/kvc_cuda.cuh"
#include "test/cudaemu/EmuCheck.h"

#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <vector>

namespace {

using kvc::cuda::MmaElement;
using kvc::cuda::Storage;

constexpr int kWarps = 4;
constexpr int kM = 16, kN = 8;

/// The operation a launch runs.
enum class Op { K8, K16, K16Split, K16SplitColumns, Run };

/// Operand element (r, c) of a row-major matrix of `cols` columns.
__device__ inline float at(const float *m, int cols, int r, int c) {
  return m[r * cols + c];
}

/// A's register i of lane (g, t) for a k = 8 or k = 16 product: the pair
/// (row g + 8 (i % 2), columns 2t + 8 (i / 2) and the next).
template <Storage S>
__device__ uint32_t fragmentA(const float *a, int k, int g, int t, int i) {
  const int r = g + 8 * (i % 2), c = 2 * t + 8 * (i / 2);
  return MmaElement<S>::pack(at(a, k, r, c), at(a, k, r, c + 1));
}

/// B's register i of lane (g, t): the pair (rows 2t + 8i and the next,
/// column g) of the k x 8 matrix b.
template <Storage S>
__device__ uint32_t fragmentB(const float *b, int g, int t, int i) {
  const int r = 2 * t + 8 * i;
  return MmaElement<S>::pack(at(b, kN, r, g), at(b, kN, r + 1, g));
}

/// Per warp w: A (16 x k) at a + w 16 k, B (k x 8) at b + w 8 k, C (16 x 8)
/// at c + w 128; for K16Split, the lo parts at a2 and b2; for
/// K16SplitColumns the same with two B per warp (B_j at b + (2 w + j) 128,
/// into accumulator j) and A at a + 2 w 256; for Run, `count`
/// products of operand sets one after the other (A_j at a + (w count + j)
/// 256, B_j likewise with 128), adding to accumulator j % 2 with a shuffle
/// between products; results (16 x 8 per accumulator) at out.
template <Op kOp, Storage S>
__global__ void mmaKernel(const float *a, const float *a2, const float *b,
                          const float *b2, const float *c, float *out,
                          int count) {
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const int g = lane / 4, t = lane % 4;
  float acc[2][4];
  for (int x = 0; x < 2; ++x)
    for (int i = 0; i < 4; ++i) {
      const int r = g + 8 * (i / 2), col = 2 * t + i % 2;
      acc[x][i] = c[(warp * 2 + x) * kM * kN + r * kN + col];
    }
  if constexpr (kOp == Op::K8) {
    const float *wa = a + warp * kM * 8, *wb = b + warp * 8 * kN;
    kvc::cuda::mmaK8<S>(acc[0], fragmentA<S>(wa, 8, g, t, 0),
                        fragmentA<S>(wa, 8, g, t, 1),
                        fragmentB<S>(wb, g, t, 0));
  } else if constexpr (kOp == Op::K16) {
    const float *wa = a + warp * kM * 16, *wb = b + warp * 16 * kN;
    uint32_t fa[4];
    for (int i = 0; i < 4; ++i)
      fa[i] = fragmentA<S>(wa, 16, g, t, i);
    kvc::cuda::mmaK16<S>(acc[0], fa, fragmentB<S>(wb, g, t, 0),
                         fragmentB<S>(wb, g, t, 1));
  } else if constexpr (kOp == Op::K16Split) {
    const float *hiA = a + warp * kM * 16, *loA = a2 + warp * kM * 16;
    const float *hiB = b + warp * 16 * kN, *loB = b2 + warp * 16 * kN;
    uint32_t fh[4], fl[4];
    for (int i = 0; i < 4; ++i) {
      fh[i] = fragmentA<Storage::BF16>(hiA, 16, g, t, i);
      fl[i] = fragmentA<Storage::BF16>(loA, 16, g, t, i);
    }
    kvc::cuda::mmaK16Split(acc[0], fh, fl,
                           fragmentB<Storage::BF16>(hiB, g, t, 0),
                           fragmentB<Storage::BF16>(hiB, g, t, 1),
                           fragmentB<Storage::BF16>(loB, g, t, 0),
                           fragmentB<Storage::BF16>(loB, g, t, 1));
  } else if constexpr (kOp == Op::K16SplitColumns) {
    const float *hiA = a + 2 * warp * kM * 16, *loA = a2 + 2 * warp * kM * 16;
    uint32_t fh[4], fl[4];
    for (int i = 0; i < 4; ++i) {
      fh[i] = fragmentA<Storage::BF16>(hiA, 16, g, t, i);
      fl[i] = fragmentA<Storage::BF16>(loA, 16, g, t, i);
    }
    uint32_t bh0[2], bh1[2], bl0[2], bl1[2];
    for (int j = 0; j < 2; ++j) {
      const float *hiB = b + (2 * warp + j) * 16 * kN,
                  *loB = b2 + (2 * warp + j) * 16 * kN;
      bh0[j] = fragmentB<Storage::BF16>(hiB, g, t, 0);
      bh1[j] = fragmentB<Storage::BF16>(hiB, g, t, 1);
      bl0[j] = fragmentB<Storage::BF16>(loB, g, t, 0);
      bl1[j] = fragmentB<Storage::BF16>(loB, g, t, 1);
    }
    kvc::cuda::mmaK16SplitColumns<2>(acc, 0, fh, fl, bh0, bh1, bl0, bl1);
  } else if constexpr (kOp == Op::Run) {
    for (int j = 0; j < count; ++j) {
      const float *wa = a + (warp * count + j) * kM * 16;
      const float *wb = b + (warp * count + j) * 16 * kN;
      uint32_t fa[4];
      for (int i = 0; i < 4; ++i)
        fa[i] = fragmentA<S>(wa, 16, g, t, i);
      const uint32_t b0 = fragmentB<S>(wb, g, t, 0),
                     b1 = fragmentB<S>(wb, g, t, 1);
      kvc::cuda::mmaK16<S>(acc[j % 2], fa, b0, b1);
      // A collective of another kind between two products (each lane its
      // own value back).
      acc[j % 2][1] = __shfl_sync(0xffffffffu, acc[j % 2][1], lane);
    }
  }
  // Both accumulators (the second stays C but for Run).
  for (int x = 0; x < 2; ++x)
    for (int i = 0; i < 4; ++i) {
      const int r = g + 8 * (i / 2), col = 2 * t + i % 2;
      out[(warp * 2 + x) * kM * kN + r * kN + col] = acc[x][i];
    }
}

/// mmaK32U8 per warp w: A (16 x 32 bytes) at a + w 512, B (32 x 8) at
/// b + w 256, C at c + w 128.
__global__ void mmaU8Kernel(const uint8_t *a, const uint8_t *b,
                            const int32_t *c, int32_t *out) {
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const int g = lane / 4, t = lane % 4;
  const uint8_t *wa = a + warp * kM * 32, *wb = b + warp * 32 * kN;
  // A's register i: row g + 8 (i % 2), columns 4t + 16 (i / 2) .. +3, the
  // first in the low byte; B's register i: rows 4t + 16i .. +3, column g.
  uint32_t fa[4], fb[2];
  for (int i = 0; i < 4; ++i) {
    const int r = g + 8 * (i % 2), col = 4 * t + 16 * (i / 2);
    fa[i] = 0;
    for (int e = 0; e < 4; ++e)
      fa[i] |= uint32_t{wa[r * 32 + col + e]} << (8 * e);
  }
  for (int i = 0; i < 2; ++i) {
    const int r = 4 * t + 16 * i;
    fb[i] = 0;
    for (int e = 0; e < 4; ++e)
      fb[i] |= uint32_t{wb[(r + e) * kN + g]} << (8 * e);
  }
  int32_t acc[4];
  for (int i = 0; i < 4; ++i)
    acc[i] = c[warp * kM * kN + (g + 8 * (i / 2)) * kN + 2 * t + i % 2];
  kvc::cuda::mmaK32U8(acc, fa, fb[0], fb[1]);
  for (int i = 0; i < 4; ++i)
    out[warp * kM * kN + (g + 8 * (i / 2)) * kN + 2 * t + i % 2] = acc[i];
}

/// Values the element type holds exactly: integers in [-range, range],
/// or (wide) normal numbers of either sign from 2^-13 to 8 with the type's
/// precision.
template <Storage S>
std::vector<float> operands(std::mt19937 &rng, size_t n, int range,
                            bool wide) {
  std::vector<float> v(n);
  std::uniform_int_distribution<int> small(-range, range);
  std::uniform_real_distribution<float> mantissa(0.5f, 1.0f);
  std::uniform_int_distribution<int> exponent(-12, 3), sign(0, 1);
  const int bits = S == Storage::BF16 ? 8 : 11;
  for (float &x : v) {
    if (!wide) {
      x = static_cast<float>(small(rng));
      continue;
    }
    const int e = exponent(rng);
    x = std::ldexp(std::nearbyint(std::ldexp(mantissa(rng), bits)), e - bits);
    if (sign(rng))
      x = -x;
  }
  return v;
}

/// One product of a warp: A (16 x k) and B (k x 8) at matrix `index` of
/// their arrays ([warp][index] order, `perWarp` each), into accumulator
/// `acc` (0 or 1).
struct Product {
  const std::vector<float> *a, *b;
  int index, acc;
};

/// The accumulators ([warp][acc][16][8]) after the products, in double
/// (every sum exact for integer operands), with the magnitude of each
/// (|C| + the sum of |a b|) in `scale`.
std::vector<double> reference(const std::vector<float> &c,
                              const std::vector<Product> &products, int k,
                              int perWarp, std::vector<double> &scale) {
  std::vector<double> out(c.begin(), c.end());
  scale.assign(c.size(), 0.0);
  for (size_t i = 0; i < c.size(); ++i)
    scale[i] = std::fabs(c[i]);
  for (int w = 0; w < kWarps; ++w)
    for (const Product &p : products) {
      const float *a = p.a->data() + (w * perWarp + p.index) * kM * k;
      const float *b = p.b->data() + (w * perWarp + p.index) * k * kN;
      for (int r = 0; r < kM; ++r)
        for (int n = 0; n < kN; ++n) {
          const size_t at = ((w * 2 + p.acc) * kM + r) * kN + n;
          for (int x = 0; x < k; ++x) {
            out[at] += double(a[r * k + x]) * b[x * kN + n];
            scale[at] += std::fabs(double(a[r * k + x]) * b[x * kN + n]);
          }
        }
    }
  return out;
}

/// The same in the emulator's float order: per product and half of 8 k,
/// per output, the pairs' products added, each pair to a sum from 0, then
/// the sum to the accumulator.
std::vector<float> emulatorOrder(const std::vector<float> &c,
                                 const std::vector<Product> &products, int k,
                                 int perWarp) {
  std::vector<float> out(c);
  for (int w = 0; w < kWarps; ++w)
    for (const Product &p : products) {
      const float *a = p.a->data() + (w * perWarp + p.index) * kM * k;
      const float *b = p.b->data() + (w * perWarp + p.index) * k * kN;
      for (int h = 0; h < k / 8; ++h)
        for (int r = 0; r < kM; ++r)
          for (int n = 0; n < kN; ++n) {
            float sum = 0.0f;
            for (int s = 0; s < 4; ++s) {
              const int x = 8 * h + 2 * s;
              const float p0 = a[r * k + x] * b[x * kN + n];
              const float p1 = a[r * k + x + 1] * b[(x + 1) * kN + n];
              const float pair = p0 + p1;
              sum += pair;
            }
            out[((w * 2 + p.acc) * kM + r) * kN + n] += sum;
          }
    }
  return out;
}

template <Op kOp, Storage S>
std::vector<float> run(const std::vector<float> &a,
                       const std::vector<float> &a2,
                       const std::vector<float> &b,
                       const std::vector<float> &b2,
                       const std::vector<float> &c, int count) {
  float *da = upload(a), *da2 = upload(a2), *db = upload(b),
        *db2 = upload(b2), *dc = upload(c);
  float *dout = upload(std::vector<float>(c.size(), 0.0f));
  mmaKernel<kOp, S><<<1, 32 * kWarps>>>(da, da2, db, db2, dc, dout, count);
  CHECK(cudaGetLastError() == cudaSuccess, "mma kernel launch");
  CHECK(cudaDeviceSynchronize() == cudaSuccess, "mma kernel");
  std::vector<float> out = download(dout, c.size());
  for (float *p : {da, da2, db, db2, dc, dout})
    cudaFree(p);
  return out;
}

/// Every accumulator element within `relative` of its magnitude of the
/// reference (0: exactly).
void compare(const char *what, const std::vector<float> &got,
             const std::vector<double> &want,
             const std::vector<double> &scale, double relative) {
  for (size_t i = 0; i < want.size(); ++i) {
    const int w = static_cast<int>(i / (2 * kM * kN)),
              acc = static_cast<int>(i / (kM * kN) % 2),
              r = static_cast<int>(i / kN % kM), n = static_cast<int>(i % kN);
    CHECK(std::fabs(got[i] - want[i]) <= relative * scale[i],
          "%s: warp %d, accumulator %d, row %d, column %d: %.9g, want %.9g",
          what, w, acc, r, n, got[i], want[i]);
  }
}

/// The emulator's results bit for bit (no check on a GPU).
void compareOrder(const char *what, const std::vector<float> &got,
                  const std::vector<float> &want) {
#if defined(KVC_CUDA_EMULATED)
  for (size_t i = 0; i < want.size(); ++i)
    CHECK(std::memcmp(&got[i], &want[i], sizeof(float)) == 0,
          "%s, emulator order: element %zu: %.9g, want %.9g", what, i,
          got[i], want[i]);
#else
  (void)what;
  (void)got;
  (void)want;
#endif
}

/// 2^-18 of the magnitude: a few roundings of float sums over k = 16 (the
/// tensor cores' order of sums is not the emulator's).
constexpr double kWideTolerance = 0x1p-18;

template <Storage S>
void checkProducts(std::mt19937 &rng, const char *type, bool wide) {
  char what[128];
  const int range = wide ? 0 : 8;
  const double tolerance = wide ? kWideTolerance : 0.0;
  std::vector<double> scale;
  for (const int k : {8, 16}) {
    const auto a = operands<S>(rng, kWarps * kM * k, range, wide);
    const auto b = operands<S>(rng, kWarps * k * kN, range, wide);
    const auto c = operands<S>(rng, kWarps * 2 * kM * kN, 1000, wide);
    const auto got = k == 8 ? run<Op::K8, S>(a, {}, b, {}, c, 1)
                            : run<Op::K16, S>(a, {}, b, {}, c, 1);
    std::snprintf(what, sizeof what, "mmaK%d<%s>, %s operands", k, type,
                  wide ? "wide" : "integer");
    const std::vector<Product> one = {{&a, &b, 0, 0}};
    compare(what, got, reference(c, one, k, 1, scale), scale, tolerance);
    compareOrder(what, got, emulatorOrder(c, one, k, 1));
  }
  // Seven products in a row, alternately into two accumulators, with a
  // shuffle between them.
  constexpr int kRun = 7;
  const auto a = operands<S>(rng, kWarps * kRun * kM * 16, range, wide);
  const auto b = operands<S>(rng, kWarps * kRun * 16 * kN, range, wide);
  const auto c = operands<S>(rng, kWarps * 2 * kM * kN, 1000, wide);
  const auto got = run<Op::Run, S>(a, {}, b, {}, c, kRun);
  std::vector<Product> products;
  for (int j = 0; j < kRun; ++j)
    products.push_back({&a, &b, j, j % 2});
  std::snprintf(what, sizeof what, "%d mmaK16<%s> in a row, %s operands",
                kRun, type, wide ? "wide" : "integer");
  compare(what, got, reference(c, products, 16, kRun, scale), scale,
          tolerance);
  compareOrder(what, got, emulatorOrder(c, products, 16, kRun));
}

void checkSplit(std::mt19937 &rng, bool wide) {
  const int range = wide ? 0 : 8;
  std::vector<double> scale;
  const auto hiA = operands<Storage::BF16>(rng, kWarps * kM * 16, range, wide);
  const auto loA = operands<Storage::BF16>(rng, kWarps * kM * 16, range, wide);
  const auto hiB = operands<Storage::BF16>(rng, kWarps * 16 * kN, range, wide);
  const auto loB = operands<Storage::BF16>(rng, kWarps * 16 * kN, range, wide);
  const auto c = operands<Storage::BF16>(rng, kWarps * 2 * kM * kN, 1000, wide);
  const auto got =
      run<Op::K16Split, Storage::BF16>(hiA, loA, hiB, loB, c, 1);
  // lo * hi, hi * lo, hi * hi, in that order; lo * lo left out.
  const std::vector<Product> products = {
      {&loA, &hiB, 0, 0}, {&hiA, &loB, 0, 0}, {&hiA, &hiB, 0, 0}};
  const char *what =
      wide ? "mmaK16Split, wide operands" : "mmaK16Split, integer operands";
  compare(what, got, reference(c, products, 16, 1, scale), scale,
          wide ? kWideTolerance : 0.0);
  compareOrder(what, got, emulatorOrder(c, products, 16, 1));
}

/// mmaK16SplitColumns into both accumulators: one A (hi, lo) per warp,
/// stored twice so that the reference pairs it with either B.
void checkSplitColumns(std::mt19937 &rng, bool wide) {
  const int range = wide ? 0 : 8;
  std::vector<double> scale;
  auto twice = [](const std::vector<float> &x) {
    std::vector<float> y;
    for (int w = 0; w < kWarps; ++w)
      for (int j = 0; j < 2; ++j)
        y.insert(y.end(), x.begin() + w * kM * 16,
                 x.begin() + (w + 1) * kM * 16);
    return y;
  };
  using S = Storage;
  const auto hiA = twice(operands<S::BF16>(rng, kWarps * kM * 16, range, wide));
  const auto loA = twice(operands<S::BF16>(rng, kWarps * kM * 16, range, wide));
  const auto hiB = operands<S::BF16>(rng, kWarps * 2 * 16 * kN, range, wide);
  const auto loB = operands<S::BF16>(rng, kWarps * 2 * 16 * kN, range, wide);
  const auto c = operands<S::BF16>(rng, kWarps * 2 * kM * kN, 1000, wide);
  const auto got =
      run<Op::K16SplitColumns, Storage::BF16>(hiA, loA, hiB, loB, c, 1);
  std::vector<Product> products;
  for (int j = 0; j < 2; ++j)
    for (const Product &p : std::vector<Product>{{&loA, &hiB, j, j},
                                                 {&hiA, &loB, j, j},
                                                 {&hiA, &hiB, j, j}})
      products.push_back(p);
  const char *what = wide ? "mmaK16SplitColumns<2>, wide operands"
                          : "mmaK16SplitColumns<2>, integer operands";
  compare(what, got, reference(c, products, 16, 2, scale), scale,
          wide ? kWideTolerance : 0.0);
  compareOrder(what, got, emulatorOrder(c, products, 16, 2));
}

void checkBytes(std::mt19937 &rng) {
  std::uniform_int_distribution<int> byte(0, 255);
  std::uniform_int_distribution<int32_t> start(-(1 << 24), 1 << 24);
  std::vector<uint8_t> a(kWarps * kM * 32), b(kWarps * 32 * kN);
  std::vector<int32_t> c(kWarps * kM * kN);
  for (uint8_t &x : a)
    x = static_cast<uint8_t>(byte(rng));
  for (uint8_t &x : b)
    x = static_cast<uint8_t>(byte(rng));
  // Some rows and columns of extremes: all 255, all 0.
  for (int x = 0; x < 32; ++x) {
    a[3 * 32 + x] = 255;
    b[x * kN + 5] = 255;
    a[(kM + 9) * 32 + x] = 0;
  }
  for (int32_t &x : c)
    x = start(rng);
  uint8_t *da = upload(a), *db = upload(b);
  int32_t *dc = upload(c), *dout = upload(std::vector<int32_t>(c.size(), 0));
  mmaU8Kernel<<<1, 32 * kWarps>>>(da, db, dc, dout);
  CHECK(cudaGetLastError() == cudaSuccess, "mmaK32U8 kernel launch");
  CHECK(cudaDeviceSynchronize() == cudaSuccess, "mmaK32U8 kernel");
  const std::vector<int32_t> got = download(dout, c.size());
  cudaFree(da);
  cudaFree(db);
  cudaFree(dc);
  cudaFree(dout);
  for (int w = 0; w < kWarps; ++w)
    for (int r = 0; r < kM; ++r)
      for (int n = 0; n < kN; ++n) {
        int64_t want = c[(w * kM + r) * kN + n];
        for (int x = 0; x < 32; ++x)
          want += int64_t{a[(w * kM + r) * 32 + x]} * b[(w * 32 + x) * kN + n];
        const int32_t have = got[(w * kM + r) * kN + n];
        CHECK(have == want,
              "mmaK32U8: warp %d, row %d, column %d: %d, want %lld", w, r, n,
              have, static_cast<long long>(want));
      }
}

} // namespace

int main() {
  if (const int skip = skipWithoutDevice("the mma fragments test"))
    return skip;
  std::mt19937 rng(20261202);
  int cases = 0;
  for (const bool wide : {false, true}) {
    checkProducts<Storage::F16>(rng, "f16", wide);
    checkProducts<Storage::BF16>(rng, "bf16", wide);
    checkSplit(rng, wide);
    checkSplitColumns(rng, wide);
    cases += 8;
  }
  checkBytes(rng);
  ++cases;
  std::printf("mma fragments: %d cases of %d warps passed\n", cases, kWarps);
  return 0;
}
