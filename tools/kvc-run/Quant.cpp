//===- Quant.cpp - GGML tensor types and row kernels ----------------------===//
//
// Part of kvc, the KV-cache policy compiler.
//
//===----------------------------------------------------------------------===//
//
// Block formats (32 elements per block; d and m are IEEE halves):
//   Q4_0: d, 16 bytes of nibbles       x = (q - 8) * d
//   Q4_1: d, m, 16 bytes of nibbles    x = q * d + m
//   Q8_0: d, 32 signed bytes           x = q * d
// Within a 4-bit block, byte j holds element j in its low nibble and element
// j + 16 in its high nibble.
//
// Without -ffast-math a compiler may not reorder a float sum, which keeps a
// plain dot product scalar. The kernels either accumulate into independent
// lanes (one per position in a block) summed at the end, or carry an
// `omp simd reduction` pragma (honoured with -fopenmp-simd, no OpenMP
// runtime) that grants the reordering for that loop alone. Either way the
// order is fixed per binary, so results do not depend on the thread count.
//
//===----------------------------------------------------------------------===//

#include "tools/kvc-run/Quant.h"

#include <algorithm>
#include <cstring>

namespace kvc {
namespace run {

namespace {

constexpr size_t kQBlock = 32;
constexpr size_t kHalfBlock = kQBlock / 2;

struct LayoutEntry {
  uint32_t id;
  TypeLayout layout;
};

// Layouts from the GGML type definitions; the quantized K-types are listed
// only so that files containing them can be parsed and rejected by name.
const LayoutEntry kLayouts[] = {
    {0, {"F32", 1, 4}},       {1, {"F16", 1, 2}},
    {2, {"Q4_0", 32, 18}},    {3, {"Q4_1", 32, 20}},
    {6, {"Q5_0", 32, 22}},    {7, {"Q5_1", 32, 24}},
    {8, {"Q8_0", 32, 34}},    {9, {"Q8_1", 32, 36}},
    {10, {"Q2_K", 256, 84}},  {11, {"Q3_K", 256, 110}},
    {12, {"Q4_K", 256, 144}}, {13, {"Q5_K", 256, 176}},
    {14, {"Q6_K", 256, 210}}, {15, {"Q8_K", 256, 292}},
    {24, {"I8", 1, 1}},       {25, {"I16", 1, 2}},
    {26, {"I32", 1, 4}},      {27, {"I64", 1, 8}},
    {28, {"F64", 1, 8}},      {30, {"BF16", 1, 2}},
};

inline uint16_t loadU16(const uint8_t *p) {
  uint16_t v;
  std::memcpy(&v, p, sizeof v);
  return v;
}

inline float loadHalf(const uint8_t *p) { return halfToFloat(loadU16(p)); }

inline float sumLanes(const float (&lanes)[kQBlock]) {
  float sum = 0.0f;
  for (float l : lanes)
    sum += l;
  return sum;
}

} // namespace

const TypeLayout *typeLayout(uint32_t id) {
  for (const LayoutEntry &e : kLayouts)
    if (e.id == id)
      return &e.layout;
  return nullptr;
}

bool isComputeType(GgmlType type) {
  switch (type) {
  case GgmlType::F32:
  case GgmlType::F16:
  case GgmlType::BF16:
  case GgmlType::Q4_0:
  case GgmlType::Q4_1:
  case GgmlType::Q8_0:
    return true;
  default:
    return false;
  }
}

float halfToFloat(uint16_t bits) {
  // Shift exponent and mantissa into float position and rescale by 2^112
  // (the difference of the exponent biases, 127 - 15). The multiply is exact
  // and turns half subnormals into the right normal floats; only infinities
  // and NaNs, whose exponent must stay all ones, need a separate case.
  uint32_t sign = uint32_t(bits & 0x8000u) << 16;
  uint32_t rest = uint32_t(bits & 0x7fffu);
  uint32_t u;
  if (rest >= 0x7c00u) {
    u = sign | 0x7f800000u | ((rest & 0x03ffu) << 13);
  } else {
    uint32_t scaled = rest << 13;
    float f;
    std::memcpy(&f, &scaled, sizeof f);
    f *= 5.192296858534828e33f; // 2^112
    std::memcpy(&u, &f, sizeof u);
    u |= sign;
  }
  float out;
  std::memcpy(&out, &u, sizeof out);
  return out;
}

void dequantizeRow(GgmlType type, const uint8_t *row, float *out, size_t n) {
  switch (type) {
  case GgmlType::F32:
    std::memcpy(out, row, n * sizeof(float));
    return;
  case GgmlType::F16:
    for (size_t i = 0; i < n; ++i)
      out[i] = loadHalf(row + 2 * i);
    return;
  case GgmlType::BF16:
    for (size_t i = 0; i < n; ++i)
      out[i] = bf16ToFloat(loadU16(row + 2 * i));
    return;
  case GgmlType::Q4_0:
    for (size_t b = 0; b < n / kQBlock; ++b, row += 18, out += kQBlock) {
      float d = loadHalf(row);
      const uint8_t *qs = row + 2;
#pragma omp simd
      for (size_t j = 0; j < kHalfBlock; ++j) {
        out[j] = float(int32_t(qs[j] & 0x0f) - 8) * d;
        out[j + kHalfBlock] = float(int32_t(qs[j] >> 4) - 8) * d;
      }
    }
    return;
  case GgmlType::Q4_1:
    for (size_t b = 0; b < n / kQBlock; ++b, row += 20, out += kQBlock) {
      float d = loadHalf(row);
      float m = loadHalf(row + 2);
      const uint8_t *qs = row + 4;
#pragma omp simd
      for (size_t j = 0; j < kHalfBlock; ++j) {
        out[j] = float(int32_t(qs[j] & 0x0f)) * d + m;
        out[j + kHalfBlock] = float(int32_t(qs[j] >> 4)) * d + m;
      }
    }
    return;
  case GgmlType::Q8_0:
    for (size_t b = 0; b < n / kQBlock; ++b, row += 34, out += kQBlock) {
      float d = loadHalf(row);
      const int8_t *qs = reinterpret_cast<const int8_t *>(row + 2);
#pragma omp simd
      for (size_t j = 0; j < kQBlock; ++j)
        out[j] = float(int32_t(qs[j])) * d;
    }
    return;
  default:
    // Callers check isComputeType() when they load a model.
    __builtin_unreachable();
  }
}

float dotRow(GgmlType type, const uint8_t *row, const float *x, size_t n) {
  // Quantized types: each block is expanded to floats in registers and
  // accumulated into one lane per position in the block; the lanes are
  // summed once at the end. Independent lanes vectorize without any
  // reassociation, and this form compiles well with both GCC and Clang.
  float w[kQBlock];
  float lanes[kQBlock] = {};
  float acc = 0.0f;
  switch (type) {
  case GgmlType::F32: {
    for (size_t i = 0; i + kQBlock <= n; i += kQBlock) {
      std::memcpy(w, row + 4 * i, sizeof w);
      acc += dotF32(w, x + i, kQBlock);
    }
    size_t tail = n % kQBlock;
    if (tail) {
      std::memcpy(w, row + 4 * (n - tail), tail * sizeof(float));
      acc += dotF32(w, x + n - tail, tail);
    }
    return acc;
  }
  case GgmlType::F16:
  case GgmlType::BF16:
    for (size_t i = 0; i < n; i += kQBlock) {
      size_t len = std::min(kQBlock, n - i);
      dequantizeRow(type, row + 2 * i, w, len);
      acc += dotF32(w, x + i, len);
    }
    return acc;
  case GgmlType::Q4_0:
    for (size_t b = 0; b < n / kQBlock; ++b, row += 18, x += kQBlock) {
      float d = loadHalf(row);
      const uint8_t *qs = row + 2;
      for (size_t j = 0; j < kHalfBlock; ++j) {
        w[j] = float(int32_t(qs[j] & 0x0f) - 8);
        w[j + kHalfBlock] = float(int32_t(qs[j] >> 4) - 8);
      }
      for (size_t j = 0; j < kQBlock; ++j)
        lanes[j] += w[j] * d * x[j];
    }
    return sumLanes(lanes);
  case GgmlType::Q4_1:
    for (size_t b = 0; b < n / kQBlock; ++b, row += 20, x += kQBlock) {
      float d = loadHalf(row);
      float m = loadHalf(row + 2);
      const uint8_t *qs = row + 4;
      for (size_t j = 0; j < kHalfBlock; ++j) {
        w[j] = float(int32_t(qs[j] & 0x0f));
        w[j + kHalfBlock] = float(int32_t(qs[j] >> 4));
      }
      for (size_t j = 0; j < kQBlock; ++j)
        lanes[j] += (w[j] * d + m) * x[j];
    }
    return sumLanes(lanes);
  case GgmlType::Q8_0:
    for (size_t b = 0; b < n / kQBlock; ++b, row += 34, x += kQBlock) {
      float d = loadHalf(row);
      const int8_t *qs = reinterpret_cast<const int8_t *>(row + 2);
      for (size_t j = 0; j < kQBlock; ++j)
        w[j] = float(int32_t(qs[j]));
      for (size_t j = 0; j < kQBlock; ++j)
        lanes[j] += w[j] * d * x[j];
    }
    return sumLanes(lanes);
  default:
    __builtin_unreachable();
  }
}

float dotF32(const float *a, const float *b, size_t n) {
  float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
  for (size_t i = 0; i < n; ++i)
    sum += a[i] * b[i];
  return sum;
}

void dotF32x4(const float *rows, size_t stride, const float *x, size_t n,
              float out[4]) {
  const float *r0 = rows, *r1 = rows + stride, *r2 = rows + 2 * stride,
              *r3 = rows + 3 * stride;
  float s0 = 0.0f, s1 = 0.0f, s2 = 0.0f, s3 = 0.0f;
#pragma omp simd reduction(+ : s0, s1, s2, s3)
  for (size_t i = 0; i < n; ++i) {
    float xv = x[i];
    s0 += r0[i] * xv;
    s1 += r1[i] * xv;
    s2 += r2[i] * xv;
    s3 += r3[i] * xv;
  }
  out[0] = s0;
  out[1] = s1;
  out[2] = s2;
  out[3] = s3;
}

} // namespace run
} // namespace kvc
