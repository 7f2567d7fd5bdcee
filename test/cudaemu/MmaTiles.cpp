//===- MmaTiles.cpp - The arithmetic of the emulated mma.sync -------------===//
//
// sumMmaTiles (MmaTiles.h): the sums of an emulated mma.sync's tiles, in
// the order of one lane's mmaK8Products (runtime/kvc_cuda.cuh). Built
// without contraction of multiplies and adds, as the emulated sources are,
// so that the AVX2 clone and the baseline give the same bits.
//
//===----------------------------------------------------------------------===//

#include "MmaTiles.h"

#include "kvc_cuda_emu.h"

#include <cstring>

namespace kvc::emu {
namespace {
constexpr int kWarpSize = 32;
} // namespace

__attribute__((target_clones("avx2", "default"))) void
sumMmaTiles(const uint64_t *words, int accumulators, int products, int halves,
            float *tiles) {
  const auto lo = [](uint64_t x) {
    float f;
    const uint32_t bits = static_cast<uint32_t>(x);
    std::memcpy(&f, &bits, sizeof f);
    return f;
  };
  const auto hi = [&](uint64_t x) { return lo(x >> 32); };
  const int a0 = 2 * accumulators, b0 = a0 + 4 * products;
  auto *tile = reinterpret_cast<float(*)[16][8]>(tiles);
  for (int l = 0; l < kWarpSize; ++l) {
    const uint64_t *x = words + l * kPublishWords;
    const int row = l / 4, col = 2 * (l % 4);
    for (int j = 0; j < accumulators; ++j) {
      tile[j][row][col] = lo(x[2 * j]);
      tile[j][row][col + 1] = hi(x[2 * j]);
      tile[j][row + 8][col] = lo(x[2 * j + 1]);
      tile[j][row + 8][col + 1] = hi(x[2 * j + 1]);
    }
  }
  // A_i (16 x 16) once for every accumulator.
  constexpr int kMaxProducts = kPublishWords / 6;
  float A[kMaxProducts][16][16];
  for (int l = 0; l < kWarpSize; ++l) {
    const int row = l / 4, k = 2 * (l % 4);
    for (int i = 0; i < products; ++i) {
      const uint64_t *x = words + l * kPublishWords + a0 + 4 * i;
      A[i][row][k] = lo(x[0]);
      A[i][row][k + 1] = hi(x[0]);
      A[i][row + 8][k] = lo(x[1]);
      A[i][row + 8][k + 1] = hi(x[1]);
      A[i][row][k + 8] = lo(x[2]);
      A[i][row][k + 9] = hi(x[2]);
      A[i][row + 8][k + 8] = lo(x[3]);
      A[i][row + 8][k + 9] = hi(x[3]);
    }
  }
  for (int j = 0; j < accumulators; ++j)
    for (int i = 0; i < products; ++i) {
      float B[16][8];
      for (int l = 0; l < kWarpSize; ++l) {
        const uint64_t *x =
            words + l * kPublishWords + b0 + 2 * (j * products + i);
        const int n = l / 4, k = 2 * (l % 4);
        B[k][n] = lo(x[0]);
        B[k + 1][n] = hi(x[0]);
        B[k + 8][n] = lo(x[1]);
        B[k + 9][n] = hi(x[1]);
      }
      // Per half, per row: the sum of the pairs' products (each pair's two
      // products added, then the pair to the sum), then the sum to C, as
      // one lane's mmaK8Products does.
      for (int h = 0; h < halves; ++h)
        for (int row = 0; row < 16; ++row) {
          float sum[8] = {};
          for (int s = 0; s < 4; ++s) {
            const int k = 8 * h + 2 * s;
            for (int n = 0; n < 8; ++n)
              sum[n] += A[i][row][k] * B[k][n] + A[i][row][k + 1] * B[k + 1][n];
          }
          for (int n = 0; n < 8; ++n)
            tile[j][row][n] += sum[n];
        }
    }
}

} // namespace kvc::emu
