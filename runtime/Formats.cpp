//===- Formats.cpp - Element conversions and quantizers -------------------===//
//
// f16/bf16/fp8-e4m3 conversions (round to nearest even, done on the bit
// patterns so that the result never depends on the host's FPU modes beyond
// the default rounding), bit packing, and the quantizers behind the page
// formats. The exported C functions validate and forward to the C++ bodies.
//
//===----------------------------------------------------------------------===//

#include "runtime/Formats.h"
#include "runtime/kvc_rules.h"
#include "runtime/Support.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

using namespace kvc::rt;

namespace {

uint32_t floatBits(float value) {
  uint32_t bits;
  std::memcpy(&bits, &value, sizeof(bits));
  return bits;
}

float bitsFloat(uint32_t bits) {
  float value;
  std::memcpy(&value, &bits, sizeof(value));
  return value;
}

// Round-to-nearest-even of a non-negative float to an integer. std::nearbyint
// follows the current rounding mode, which the runtime never changes; the
// explicit version keeps the result independent of it.
float roundEven(float x) {
  float floor = std::floor(x);
  float diff = x - floor;
  if (diff > 0.5f)
    return floor + 1.0f;
  if (diff < 0.5f)
    return floor;
  return std::fmod(floor, 2.0f) == 0.0f ? floor : floor + 1.0f;
}

} // namespace

//===----------------------------------------------------------------------===//
// Conversions
//===----------------------------------------------------------------------===//

extern "C" uint16_t kvc_f32_to_f16(float value) {
  uint32_t x = floatBits(value);
  uint16_t sign = static_cast<uint16_t>((x >> 16) & 0x8000u);
  uint32_t magnitude = x & 0x7fffffffu;
  if (magnitude > 0x7f800000u) // NaN: keep it a (quiet) NaN.
    return sign | 0x7e00u;
  if (magnitude >= 0x477ff000u) // >= 65520 rounds to infinity under RNE.
    return sign | 0x7c00u;
  if (magnitude >= 0x38800000u) { // Normal binary16 range (>= 2^-14).
    // Drop 13 mantissa bits with round-half-to-even, then rebias 127 -> 15.
    uint32_t rounded = magnitude + 0xfffu + ((magnitude >> 13) & 1u);
    return sign | static_cast<uint16_t>((rounded - (112u << 23)) >> 13);
  }
  // Subnormal: count units of 2^-24. Scaling by a power of two is exact; a
  // result of 1024 is the smallest normal, whose encoding is also 0x400.
  float units = roundEven(bitsFloat(magnitude) * 16777216.0f);
  return sign | static_cast<uint16_t>(units);
}

extern "C" float kvc_f16_to_f32(uint16_t bits) {
  uint32_t sign = static_cast<uint32_t>(bits & 0x8000u) << 16;
  uint32_t exponent = (bits >> 10) & 0x1fu;
  uint32_t mantissa = bits & 0x3ffu;
  if (exponent == 0) {
    float magnitude = static_cast<float>(mantissa) * (1.0f / 16777216.0f);
    return sign ? -magnitude : magnitude;
  }
  if (exponent == 31)
    return bitsFloat(sign | 0x7f800000u | (mantissa << 13));
  return bitsFloat(sign | ((exponent + 112u) << 23) | (mantissa << 13));
}

extern "C" uint16_t kvc_f32_to_bf16(float value) {
  uint32_t x = floatBits(value);
  if ((x & 0x7fffffffu) > 0x7f800000u)
    return static_cast<uint16_t>((x >> 16) | 0x40u);
  // Overflow past the largest bf16 carries into the exponent and yields
  // infinity, which is the RNE result.
  uint32_t rounded = x + 0x7fffu + ((x >> 16) & 1u);
  return static_cast<uint16_t>(rounded >> 16);
}

extern "C" float kvc_bf16_to_f32(uint16_t bits) {
  return bitsFloat(static_cast<uint32_t>(bits) << 16);
}

extern "C" uint8_t kvc_f32_to_fp8_e4m3(float value) {
  uint32_t x = floatBits(value);
  uint8_t sign = static_cast<uint8_t>((x >> 24) & 0x80u);
  uint32_t magnitude = x & 0x7fffffffu;
  if (magnitude > 0x7f800000u)
    return 0x7f;
  float a = bitsFloat(magnitude);
  if (a >= 448.0f) // Saturate, infinity included: e4m3 has no infinity.
    return sign | 0x7e;
  if (a < 0.015625f) { // Below 2^-6: subnormals in units of 2^-9.
    float units = roundEven(a * 512.0f);
    return sign | static_cast<uint8_t>(units); // 8 units = 0x08, min normal.
  }
  // Keep 3 mantissa bits with round-half-to-even; rebias 127 -> 7. Values
  // below 448 never round past 448, so the NaN code 0x7f cannot appear.
  uint32_t rounded = magnitude + 0x7ffffu + ((magnitude >> 20) & 1u);
  return sign | static_cast<uint8_t>((rounded >> 20) - (120u << 3));
}

extern "C" float kvc_fp8_e4m3_to_f32(uint8_t bits) {
  uint32_t exponent = (bits >> 3) & 0xfu;
  uint32_t mantissa = bits & 0x7u;
  float magnitude;
  if (exponent == 15 && mantissa == 7)
    magnitude = std::numeric_limits<float>::quiet_NaN();
  else if (exponent == 0)
    magnitude = static_cast<float>(mantissa) * (1.0f / 512.0f);
  else
    magnitude = bitsFloat(((exponent + 120u) << 23) | (mantissa << 20));
  return (bits & 0x80u) ? -magnitude : magnitude;
}

//===----------------------------------------------------------------------===//
// C++ bodies
//===----------------------------------------------------------------------===//

namespace kvc::rt {

size_t dtypeBytes(int32_t dtype) { return dtype == KVC_DTYPE_F32 ? 4 : 2; }

int kiviBits(int32_t format) {
  if (format == KVC_FORMAT_KIVI_INT2)
    return 2;
  if (format == KVC_FORMAT_KIVI_INT4)
    return 4;
  return 0;
}

int tokenGroupBits(int32_t format) {
  if (format == KVC_FORMAT_INT2)
    return 2;
  if (format == KVC_FORMAT_INT4)
    return 4;
  return 0;
}

void storeElements(int32_t dtype, const float *in, int64_t n, void *out) {
  if (dtype == KVC_DTYPE_F32) {
    std::memcpy(out, in, static_cast<size_t>(n) * sizeof(float));
    return;
  }
  auto *bytes = static_cast<uint8_t *>(out);
  for (int64_t i = 0; i < n; ++i) {
    uint16_t h =
        dtype == KVC_DTYPE_F16 ? kvc_f32_to_f16(in[i]) : kvc_f32_to_bf16(in[i]);
    std::memcpy(bytes + 2 * i, &h, 2);
  }
}

void loadElements(int32_t dtype, const void *in, int64_t n, float *out) {
  if (dtype == KVC_DTYPE_F32) {
    std::memcpy(out, in, static_cast<size_t>(n) * sizeof(float));
    return;
  }
  const auto *bytes = static_cast<const uint8_t *>(in);
  for (int64_t i = 0; i < n; ++i) {
    uint16_t h;
    std::memcpy(&h, bytes + 2 * i, 2);
    out[i] = dtype == KVC_DTYPE_F16 ? kvc_f16_to_f32(h) : kvc_bf16_to_f32(h);
  }
}

void packBits(const uint8_t *codes, int64_t n, int bits, uint8_t *packed) {
  int64_t bytes = (n * bits + 7) / 8;
  std::memset(packed, 0, static_cast<size_t>(bytes));
  for (int64_t j = 0; j < n; ++j) {
    int64_t bit = j * bits;
    packed[bit / 8] |= static_cast<uint8_t>(codes[j] << (bit % 8));
  }
}

void unpackBits(const uint8_t *packed, int64_t n, int bits, uint8_t *codes) {
  uint8_t mask = static_cast<uint8_t>((1u << bits) - 1u);
  for (int64_t j = 0; j < n; ++j) {
    int64_t bit = j * bits;
    codes[j] = static_cast<uint8_t>((packed[bit / 8] >> (bit % 8)) & mask);
  }
}

uint8_t encodeAsym(float x, int bits, float scale, float min) {
  if (!(scale > 0.0f))
    return 0;
  float maxCode = static_cast<float>((1 << bits) - 1);
  float code = roundEven(std::max((x - min) / scale, 0.0f));
  return static_cast<uint8_t>(std::min(code, maxCode));
}

namespace {
/// The least and greatest of x[0 .. n) (both 0 when n is 0).
void valueRange(const float *x, int64_t n, float &lo, float &hi) {
  lo = n > 0 ? x[0] : 0.0f;
  hi = lo;
  for (int64_t i = 1; i < n; ++i) {
    lo = std::min(lo, x[i]);
    hi = std::max(hi, x[i]);
  }
}
} // namespace

void quantizeAsym(const float *x, int64_t n, int bits, uint8_t *codes,
                  float *scale, float *min) {
  float lo, hi;
  valueRange(x, n, lo, hi);
  *scale = (hi - lo) / static_cast<float>((1 << bits) - 1);
  *min = lo;
  for (int64_t i = 0; i < n; ++i)
    codes[i] = encodeAsym(x[i], bits, *scale, lo);
}

void quantizeInt8(const float *x, int64_t n, int8_t *q, float *scale) {
  float amax = 0.0f;
  for (int64_t i = 0; i < n; ++i)
    amax = std::max(amax, std::fabs(x[i]));
  *scale = amax / 127.0f;
  for (int64_t i = 0; i < n; ++i) {
    if (amax == 0.0f) {
      q[i] = 0;
      continue;
    }
    float r = roundEven(std::fabs(x[i]) / *scale);
    r = std::min(r, 127.0f);
    q[i] = static_cast<int8_t>(x[i] < 0.0f ? -r : r);
  }
}

void quantizeFp8(const float *x, int64_t n, uint8_t *q, float *scale) {
  float amax = 0.0f;
  for (int64_t i = 0; i < n; ++i)
    amax = std::max(amax, std::fabs(x[i]));
  // A zero vector keeps scale 1 so that dequantization stays finite.
  *scale = amax > 0.0f ? amax / 448.0f : 1.0f;
  for (int64_t i = 0; i < n; ++i)
    q[i] = kvc_f32_to_fp8_e4m3(x[i] / *scale);
}

uint16_t f16Floor(float x) {
  return static_cast<uint16_t>(kvc::rules::f16Directed(floatBits(x), false));
}

uint16_t f16Ceil(float x) {
  return static_cast<uint16_t>(kvc::rules::f16Directed(floatBits(x), true));
}

float f16Float(uint16_t bits) { return kvc_f16_to_f32(bits); }

AsymRecord quantizeAsymRecord(const float *x, int64_t n, int bits,
                              uint8_t *codes) {
  float lo, hi;
  valueRange(x, n, lo, hi);
  AsymRecord r;
  r.min = f16Floor(lo);
  const float min = r.minValue();
  r.scale = f16Ceil((hi - min) / static_cast<float>((1 << bits) - 1));
  const float scale = r.scaleValue();
  for (int64_t i = 0; i < n; ++i)
    codes[i] = encodeAsym(x[i], bits, scale, min);
  return r;
}

void kiviQuantizeKeys(const float *keys, int tokens, int dim, int bits,
                      uint8_t *packedRows, size_t rowStride,
                      AsymRecord *records, float *column, uint8_t *codes) {
  // Quantize channel by channel into channel-major codes, then pack them as
  // token-major rows, the order kernels read keys in.
  for (int c = 0; c < dim; ++c) {
    for (int t = 0; t < tokens; ++t)
      column[t] = keys[static_cast<size_t>(t) * dim + c];
    records[c] = quantizeAsymRecord(column, tokens, bits,
                                    codes + static_cast<size_t>(c) * tokens);
  }
  for (int t = 0; t < tokens; ++t) {
    uint8_t *row = packedRows + t * rowStride;
    std::memset(row, 0, static_cast<size_t>(dim) * bits / 8);
    for (int c = 0; c < dim; ++c) {
      int64_t bit = static_cast<int64_t>(c) * bits;
      row[bit / 8] |= static_cast<uint8_t>(
          codes[static_cast<size_t>(c) * tokens + t] << (bit % 8));
    }
  }
}

void kiviDequantizeKeyRow(const uint8_t *packedRow, int dim, int bits,
                          const AsymRecord *records, float *key) {
  uint8_t mask = static_cast<uint8_t>((1u << bits) - 1u);
  for (int c = 0; c < dim; ++c) {
    int64_t bit = static_cast<int64_t>(c) * bits;
    key[c] = records[c].decode((packedRow[bit / 8] >> (bit % 8)) & mask);
  }
}

void kiviEncodeKeyRow(const float *key, int dim, int bits,
                      const AsymRecord *records, uint8_t *packedRow,
                      uint8_t *codes) {
  for (int c = 0; c < dim; ++c)
    codes[c] = encodeAsym(key[c], bits, records[c].scaleValue(),
                          records[c].minValue());
  packBits(codes, dim, bits, packedRow);
}

void kiviQuantizeValue(const float *value, int dim, int group, int bits,
                       uint8_t *packedRow, AsymRecord *records,
                       uint8_t *codes) {
  for (int g = 0; g * group < dim; ++g)
    records[g] =
        quantizeAsymRecord(value + g * group, group, bits, &codes[g * group]);
  packBits(codes, dim, bits, packedRow);
}

void kiviDequantizeValue(const uint8_t *packedRow, int dim, int group, int bits,
                         const AsymRecord *records, float *value) {
  uint8_t mask = static_cast<uint8_t>((1u << bits) - 1u);
  for (int c = 0; c < dim; ++c) {
    int64_t bit = static_cast<int64_t>(c) * bits;
    value[c] =
        records[c / group].decode((packedRow[bit / 8] >> (bit % 8)) & mask);
  }
}

} // namespace kvc::rt

//===----------------------------------------------------------------------===//
// Exported quantizers
//===----------------------------------------------------------------------===//

namespace {

kvc_status_t checkBits(const char *name, int32_t bits, bool allow8) {
  if (bits == 2 || bits == 4 || (allow8 && bits == 8))
    return KVC_STATUS_OK;
  return fail(KVC_STATUS_INVALID_ARGUMENT, "%s: bits must be 2, 4%s (got %d)",
              name, allow8 ? " or 8" : "", bits);
}

kvc_status_t checkCount(const char *name, int64_t n) {
  if (n > 0)
    return KVC_STATUS_OK;
  return fail(KVC_STATUS_INVALID_ARGUMENT, "%s: count must be > 0 (got %lld)",
              name, static_cast<long long>(n));
}

kvc_status_t checkFloats(const char *name, const char *what,
                         const float *pointer) {
  if (!pointer)
    return fail(KVC_STATUS_NULL_POINTER, "%s: %s is NULL", name, what);
  if (!isAligned<float>(pointer))
    return fail(KVC_STATUS_MISALIGNED, "%s: %s is not 4-byte aligned", name,
                what);
  return KVC_STATUS_OK;
}

// A NaN or infinity would poison the scale of a whole group.
kvc_status_t checkFinite(const char *name, const float *x, int64_t n) {
  for (int64_t i = 0; i < n; ++i)
    if (!std::isfinite(x[i]))
      return fail(KVC_STATUS_INVALID_ARGUMENT, "%s: x[%lld] is not finite",
                  name, static_cast<long long>(i));
  return KVC_STATUS_OK;
}

kvc_status_t checkBytes(const char *name, const char *what,
                        const void *pointer) {
  if (!pointer)
    return fail(KVC_STATUS_NULL_POINTER, "%s: %s is NULL", name, what);
  return KVC_STATUS_OK;
}

// Validates the shape shared by the KIVI entry points.
kvc_status_t checkKiviShape(const char *name, int32_t dim, int32_t bits,
                            int32_t group) {
  if (kvc_status_t s = checkBits(name, bits, /*allow8=*/false))
    return s;
  if (dim <= 0)
    return fail(KVC_STATUS_INVALID_ARGUMENT, "%s: dim must be > 0 (got %d)",
                name, dim);
  if ((static_cast<int64_t>(dim) * bits) % 8 != 0)
    return fail(KVC_STATUS_GEOMETRY_MISMATCH,
                "%s: dim %d times %d bits is not a whole number of bytes", name,
                dim, bits);
  if (group <= 0 || dim % group != 0)
    return fail(KVC_STATUS_GEOMETRY_MISMATCH,
                "%s: group %d does not divide dim %d", name, group, dim);
  return KVC_STATUS_OK;
}

} // namespace

#define KVC_CHECK(expr)                                                        \
  do {                                                                         \
    if (kvc_status_t kvcCheckStatus = (expr))                                  \
      return kvcCheckStatus;                                                   \
  } while (false)

extern "C" kvc_status_t kvc_pack_bits(const uint8_t *codes, int64_t n,
                                      int32_t bits, uint8_t *packed) {
  return guarded("kvc_pack_bits", [&] {
    const char *name = "kvc_pack_bits";
    KVC_CHECK(checkBytes(name, "codes", codes));
    KVC_CHECK(checkBytes(name, "packed", packed));
    KVC_CHECK(checkCount(name, n));
    KVC_CHECK(checkBits(name, bits, /*allow8=*/true));
    for (int64_t j = 0; j < n; ++j)
      if (codes[j] >> bits)
        return fail(KVC_STATUS_INVALID_ARGUMENT,
                    "%s: code %u at index %lld does not fit in %d bits", name,
                    codes[j], static_cast<long long>(j), bits);
    packBits(codes, n, bits, packed);
    return KVC_STATUS_OK;
  });
}

extern "C" kvc_status_t kvc_unpack_bits(const uint8_t *packed, int64_t n,
                                        int32_t bits, uint8_t *codes) {
  return guarded("kvc_unpack_bits", [&] {
    const char *name = "kvc_unpack_bits";
    KVC_CHECK(checkBytes(name, "packed", packed));
    KVC_CHECK(checkBytes(name, "codes", codes));
    KVC_CHECK(checkCount(name, n));
    KVC_CHECK(checkBits(name, bits, /*allow8=*/true));
    unpackBits(packed, n, bits, codes);
    return KVC_STATUS_OK;
  });
}

extern "C" kvc_status_t kvc_quantize_asym(const float *x, int64_t n,
                                          int32_t bits, uint8_t *codes,
                                          float *scale, float *min) {
  return guarded("kvc_quantize_asym", [&] {
    const char *name = "kvc_quantize_asym";
    KVC_CHECK(checkFloats(name, "x", x));
    KVC_CHECK(checkBytes(name, "codes", codes));
    KVC_CHECK(checkFloats(name, "scale", scale));
    KVC_CHECK(checkFloats(name, "min", min));
    KVC_CHECK(checkCount(name, n));
    KVC_CHECK(checkBits(name, bits, /*allow8=*/true));
    KVC_CHECK(checkFinite(name, x, n));
    quantizeAsym(x, n, bits, codes, scale, min);
    return KVC_STATUS_OK;
  });
}

extern "C" kvc_status_t kvc_dequantize_asym(const uint8_t *codes, int64_t n,
                                            float scale, float min, float *x) {
  return guarded("kvc_dequantize_asym", [&] {
    const char *name = "kvc_dequantize_asym";
    KVC_CHECK(checkBytes(name, "codes", codes));
    KVC_CHECK(checkFloats(name, "x", x));
    KVC_CHECK(checkCount(name, n));
    for (int64_t i = 0; i < n; ++i)
      x[i] = static_cast<float>(codes[i]) * scale + min;
    return KVC_STATUS_OK;
  });
}

extern "C" kvc_status_t kvc_kivi_quantize_keys(const float *keys,
                                               int32_t tokens, int32_t dim,
                                               int32_t bits, uint8_t *packed,
                                               float *scales, float *mins) {
  return guarded("kvc_kivi_quantize_keys", [&] {
    const char *name = "kvc_kivi_quantize_keys";
    KVC_CHECK(checkFloats(name, "keys", keys));
    KVC_CHECK(checkBytes(name, "packed", packed));
    KVC_CHECK(checkFloats(name, "scales", scales));
    KVC_CHECK(checkFloats(name, "mins", mins));
    KVC_CHECK(checkCount(name, tokens));
    KVC_CHECK(checkKiviShape(name, dim, bits, /*group=*/dim));
    KVC_CHECK(checkFinite(name, keys, static_cast<int64_t>(tokens) * dim));
    std::vector<AsymRecord> records(static_cast<size_t>(dim));
    std::vector<float> column(static_cast<size_t>(tokens));
    std::vector<uint8_t> codes(static_cast<size_t>(tokens) * dim);
    size_t row = static_cast<size_t>(dim) * bits / 8;
    kiviQuantizeKeys(keys, tokens, dim, bits, packed, row, records.data(),
                     column.data(), codes.data());
    for (int c = 0; c < dim; ++c) {
      scales[c] = records[c].scaleValue();
      mins[c] = records[c].minValue();
    }
    return KVC_STATUS_OK;
  });
}

extern "C" kvc_status_t
kvc_kivi_dequantize_keys(const uint8_t *packed, int32_t tokens, int32_t dim,
                         int32_t bits, const float *scales, const float *mins,
                         float *keys) {
  return guarded("kvc_kivi_dequantize_keys", [&] {
    const char *name = "kvc_kivi_dequantize_keys";
    KVC_CHECK(checkBytes(name, "packed", packed));
    KVC_CHECK(checkFloats(name, "scales", scales));
    KVC_CHECK(checkFloats(name, "mins", mins));
    KVC_CHECK(checkFloats(name, "keys", keys));
    KVC_CHECK(checkCount(name, tokens));
    KVC_CHECK(checkKiviShape(name, dim, bits, /*group=*/dim));
    const uint8_t mask = static_cast<uint8_t>((1u << bits) - 1u);
    const size_t row = static_cast<size_t>(dim) * bits / 8;
    for (int t = 0; t < tokens; ++t)
      for (int c = 0; c < dim; ++c) {
        const int64_t bit = static_cast<int64_t>(c) * bits;
        const uint8_t code = (packed[t * row + bit / 8] >> (bit % 8)) & mask;
        keys[static_cast<size_t>(t) * dim + c] =
            static_cast<float>(code) * scales[c] + mins[c];
      }
    return KVC_STATUS_OK;
  });
}

extern "C" kvc_status_t kvc_kivi_quantize_value(const float *value, int32_t dim,
                                                int32_t group, int32_t bits,
                                                uint8_t *packed, float *scales,
                                                float *mins) {
  return guarded("kvc_kivi_quantize_value", [&] {
    const char *name = "kvc_kivi_quantize_value";
    KVC_CHECK(checkFloats(name, "value", value));
    KVC_CHECK(checkBytes(name, "packed", packed));
    KVC_CHECK(checkFloats(name, "scales", scales));
    KVC_CHECK(checkFloats(name, "mins", mins));
    KVC_CHECK(checkKiviShape(name, dim, bits, group));
    KVC_CHECK(checkFinite(name, value, dim));
    std::vector<AsymRecord> records(static_cast<size_t>(dim / group));
    std::vector<uint8_t> codes(static_cast<size_t>(dim));
    kiviQuantizeValue(value, dim, group, bits, packed, records.data(),
                      codes.data());
    for (int g = 0; g < dim / group; ++g) {
      scales[g] = records[g].scaleValue();
      mins[g] = records[g].minValue();
    }
    return KVC_STATUS_OK;
  });
}

extern "C" kvc_status_t
kvc_kivi_dequantize_value(const uint8_t *packed, int32_t dim, int32_t group,
                          int32_t bits, const float *scales, const float *mins,
                          float *value) {
  return guarded("kvc_kivi_dequantize_value", [&] {
    const char *name = "kvc_kivi_dequantize_value";
    KVC_CHECK(checkBytes(name, "packed", packed));
    KVC_CHECK(checkFloats(name, "scales", scales));
    KVC_CHECK(checkFloats(name, "mins", mins));
    KVC_CHECK(checkFloats(name, "value", value));
    KVC_CHECK(checkKiviShape(name, dim, bits, group));
    const uint8_t mask = static_cast<uint8_t>((1u << bits) - 1u);
    for (int c = 0; c < dim; ++c) {
      const int64_t bit = static_cast<int64_t>(c) * bits;
      const uint8_t code = (packed[bit / 8] >> (bit % 8)) & mask;
      value[c] = static_cast<float>(code) * scales[c / group] + mins[c / group];
    }
    return KVC_STATUS_OK;
  });
}

extern "C" kvc_status_t kvc_quantize_int8(const float *x, int64_t n, int8_t *q,
                                          float *scale) {
  return guarded("kvc_quantize_int8", [&] {
    const char *name = "kvc_quantize_int8";
    KVC_CHECK(checkFloats(name, "x", x));
    KVC_CHECK(checkBytes(name, "q", q));
    KVC_CHECK(checkFloats(name, "scale", scale));
    KVC_CHECK(checkCount(name, n));
    KVC_CHECK(checkFinite(name, x, n));
    quantizeInt8(x, n, q, scale);
    return KVC_STATUS_OK;
  });
}

extern "C" kvc_status_t kvc_dequantize_int8(const int8_t *q, int64_t n,
                                            float scale, float *x) {
  return guarded("kvc_dequantize_int8", [&] {
    const char *name = "kvc_dequantize_int8";
    KVC_CHECK(checkBytes(name, "q", q));
    KVC_CHECK(checkFloats(name, "x", x));
    KVC_CHECK(checkCount(name, n));
    for (int64_t i = 0; i < n; ++i)
      x[i] = static_cast<float>(q[i]) * scale;
    return KVC_STATUS_OK;
  });
}

extern "C" kvc_status_t kvc_quantize_fp8_e4m3(const float *x, int64_t n,
                                              uint8_t *q, float *scale) {
  return guarded("kvc_quantize_fp8_e4m3", [&] {
    const char *name = "kvc_quantize_fp8_e4m3";
    KVC_CHECK(checkFloats(name, "x", x));
    KVC_CHECK(checkBytes(name, "q", q));
    KVC_CHECK(checkFloats(name, "scale", scale));
    KVC_CHECK(checkCount(name, n));
    KVC_CHECK(checkFinite(name, x, n));
    quantizeFp8(x, n, q, scale);
    return KVC_STATUS_OK;
  });
}

extern "C" kvc_status_t kvc_dequantize_fp8_e4m3(const uint8_t *q, int64_t n,
                                                float scale, float *x) {
  return guarded("kvc_dequantize_fp8_e4m3", [&] {
    const char *name = "kvc_dequantize_fp8_e4m3";
    KVC_CHECK(checkBytes(name, "q", q));
    KVC_CHECK(checkFloats(name, "x", x));
    KVC_CHECK(checkCount(name, n));
    for (int64_t i = 0; i < n; ++i)
      x[i] = kvc_fp8_e4m3_to_f32(q[i]) * scale;
    return KVC_STATUS_OK;
  });
}
