//===- Quant.h - GGML tensor types and row kernels --------------*- C++ -*-===//
//
// Part of kvc, the KV-cache policy compiler.
//
//===----------------------------------------------------------------------===//
//
// The tensor element types a GGUF file may declare, their block layouts, and
// the two kernels the engine runs over weight rows: dequantize a row into
// floats, and dot a quantized row with a float vector without expanding it.
// The kernels are written so that -O3 vectorizes them for whatever baseline
// the compiler targets; no -march is needed.
//
//===----------------------------------------------------------------------===//

#ifndef KVC_TOOLS_KVCRUN_QUANT_H
#define KVC_TOOLS_KVCRUN_QUANT_H

#include <cstddef>
#include <cstdint>
#include <cstring>

namespace kvc {
namespace run {

/// GGML element types, numbered as in GGUF tensor infos. Only the types with
/// a known block layout are listed; see typeLayout().
enum class GgmlType : uint32_t {
  F32 = 0,
  F16 = 1,
  Q4_0 = 2,
  Q4_1 = 3,
  Q5_0 = 6,
  Q5_1 = 7,
  Q8_0 = 8,
  Q8_1 = 9,
  Q2_K = 10,
  Q3_K = 11,
  Q4_K = 12,
  Q5_K = 13,
  Q6_K = 14,
  Q8_K = 15,
  I8 = 24,
  I16 = 25,
  I32 = 26,
  I64 = 27,
  F64 = 28,
  BF16 = 30,
};

/// Storage layout of a type: `blockElems` elements are stored together in
/// `blockBytes` bytes.
struct TypeLayout {
  const char *name;
  uint32_t blockElems;
  uint32_t blockBytes;
};

/// Returns the layout of type id `id`, or null for an id kvc-run does not
/// know (a tensor of such a type cannot even be located in the file).
const TypeLayout *typeLayout(uint32_t id);

/// True when the row kernels below accept `type`.
bool isComputeType(GgmlType type);

/// Converts an IEEE half-precision value (as bits) to float, exactly.
float halfToFloat(uint16_t bits);

/// Converts a bfloat16 value (as bits) to float, exactly.
inline float bf16ToFloat(uint16_t bits) {
  uint32_t u = uint32_t(bits) << 16;
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}

/// Writes the `n` elements of a row of type `type` starting at `row` to
/// `out` as floats. `n` must be a multiple of the type's block size.
void dequantizeRow(GgmlType type, const uint8_t *row, float *out, size_t n);

/// Returns the dot product of a row of `n` elements of type `type` with the
/// float vector `x`, computed block by block from the quantized data.
float dotRow(GgmlType type, const uint8_t *row, const float *x, size_t n);

/// Returns the dot product of two float vectors of length `n`.
float dotF32(const float *a, const float *b, size_t n);

/// Computes out[r] = dot(rows[r], x) for four consecutive float rows of
/// length `n` spaced `stride` floats apart; loads `x` once for all four.
void dotF32x4(const float *rows, size_t stride, const float *x, size_t n,
              float out[4]);

} // namespace run
} // namespace kvc

#endif // KVC_TOOLS_KVCRUN_QUANT_H
