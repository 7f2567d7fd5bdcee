//===- Formats.h - Element conversions and quantizers ---------*- C++ -*-===//
//
// Internal to KvcRuntime: the C++ forms of the conversions and quantizers
// that kvc_runtime.h exports, used by the page code without re-validating
// arguments that the context already checked.
//
//===----------------------------------------------------------------------===//

#ifndef KVC_RUNTIME_FORMATS_H
#define KVC_RUNTIME_FORMATS_H

#include "runtime/kvc_runtime.h"

#include <cstddef>
#include <cstdint>

namespace kvc::rt {

/// Bytes of one element of `dtype` (a validated kvc_dtype_t value).
size_t dtypeBytes(int32_t dtype);

/// Bits per code of a KIVI kvc_format_t value (2 or 4); 0 for others.
int kiviBits(int32_t format);

/// Bits per code of a per-token grouped kvc_format_t value (INT2, INT4: the
/// low class of mixed precision); 0 for others.
int tokenGroupBits(int32_t format);

/// Stores n floats as `dtype` elements at `out` (rounding to nearest even).
void storeElements(int32_t dtype, const float *in, int64_t n, void *out);

/// Loads n `dtype` elements from `in` as floats.
void loadElements(int32_t dtype, const void *in, int64_t n, float *out);

/// Unchecked bodies of the exported quantizers (see kvc_runtime.h).
void packBits(const uint8_t *codes, int64_t n, int bits, uint8_t *packed);
void unpackBits(const uint8_t *packed, int64_t n, int bits, uint8_t *codes);
void quantizeAsym(const float *x, int64_t n, int bits, uint8_t *codes,
                  float *scale, float *min);
/// Encodes with given parameters: code = clamp(rne((x - min) / scale)).
uint8_t encodeAsym(float x, int bits, float scale, float min);
void quantizeInt8(const float *x, int64_t n, int8_t *q, float *scale);
void quantizeFp8(const float *x, int64_t n, uint8_t *q, float *scale);

/// f16 bit patterns of a finite float rounded towards -infinity (f16Floor)
/// or +infinity (f16Ceil), saturating at +-65504; f16Float widens one back
/// exactly.
uint16_t f16Floor(float x);
uint16_t f16Ceil(float x);
float f16Float(uint16_t bits);

/// An asymmetric record: the {scale, min} pair of one group of codes as two
/// f16 (scale first), the parameters every asymmetric format stores (KIVI
/// keys and values, INT2/INT4). kvc_runtime.h states the rounding.
struct AsymRecord {
  uint16_t scale, min;
  float scaleValue() const { return f16Float(scale); }
  float minValue() const { return f16Float(min); }
  float decode(uint8_t code) const {
    return static_cast<float>(code) * scaleValue() + minValue();
  }
};
static_assert(sizeof(AsymRecord) == 4, "a record pair is one 32-bit word");

/// The record of the n values at x and their codes: min = the least value
/// rounded down to f16, scale = (max - min) / (2^bits - 1) rounded up, so
/// that every value within the f16 range lies within the range the codes
/// span.
AsymRecord quantizeAsymRecord(const float *x, int64_t n, int bits,
                              uint8_t *codes);

/// KIVI keys of `tokens` rows, each channel over all tokens: packed rows of
/// dim * bits / 8 bytes, one record per channel in `records` (dim of them).
/// `column` (tokens floats) and `codes` (tokens * dim bytes) are caller
/// scratch, so that the page code can allocate before it commits to a
/// change.
void kiviQuantizeKeys(const float *keys, int tokens, int dim, int bits,
                      uint8_t *packedRows, size_t rowStride,
                      AsymRecord *records, float *column, uint8_t *codes);
/// Dequantizes one key row of a KIVI block.
void kiviDequantizeKeyRow(const uint8_t *packedRow, int dim, int bits,
                          const AsymRecord *records, float *key);
/// Encodes one key row with a block's existing records (`codes`: dim bytes
/// of scratch).
void kiviEncodeKeyRow(const float *key, int dim, int bits,
                      const AsymRecord *records, uint8_t *packedRow,
                      uint8_t *codes);
/// KIVI value: one record per group of `group` channels in `records`
/// (`codes`: dim bytes of scratch).
void kiviQuantizeValue(const float *value, int dim, int group, int bits,
                       uint8_t *packedRow, AsymRecord *records, uint8_t *codes);
void kiviDequantizeValue(const uint8_t *packedRow, int dim, int group, int bits,
                         const AsymRecord *records, float *value);

} // namespace kvc::rt

#endif // KVC_RUNTIME_FORMATS_H
