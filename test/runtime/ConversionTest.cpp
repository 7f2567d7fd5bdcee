//===- ConversionTest.cpp - f16 / bf16 / fp8 e4m3 conversions -------------===//
//
// Golden encodings written by hand from the format definitions, then wide
// comparisons against the reference's value-domain rounding (which rounds
// with frexp/ldexp or by exhaustive nearest-code search, not bit tricks).
//
//===----------------------------------------------------------------------===//

#include "runtime/kvc_runtime.h"
#include "test/reference/Reference.h"

#include "gtest/gtest.h"

#include <cmath>
#include <cstring>
#include <limits>
#include <random>

namespace {

float bitsToFloat(uint32_t bits) {
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

TEST(Conversion, F16Golden) {
  EXPECT_EQ(kvc_f32_to_f16(1.0f), 0x3C00);
  EXPECT_EQ(kvc_f32_to_f16(-2.0f), 0xC000);
  EXPECT_EQ(kvc_f32_to_f16(0.0f), 0x0000);
  EXPECT_EQ(kvc_f32_to_f16(-0.0f), 0x8000);
  EXPECT_EQ(kvc_f32_to_f16(65504.0f), 0x7BFF); // largest finite
  EXPECT_EQ(kvc_f32_to_f16(65519.0f), 0x7BFF); // below the midpoint
  EXPECT_EQ(kvc_f32_to_f16(65520.0f), 0x7C00); // tie, odd 0x3ff -> inf
  EXPECT_EQ(kvc_f32_to_f16(1e9f), 0x7C00);
  EXPECT_EQ(kvc_f32_to_f16(std::ldexp(1.0f, -24)), 0x0001); // min subnormal
  EXPECT_EQ(kvc_f32_to_f16(std::ldexp(1.0f, -25)), 0x0000); // tie -> even 0
  EXPECT_EQ(kvc_f32_to_f16(std::ldexp(3.0f, -25)), 0x0002); // 1.5 units -> 2
  // 1 + 2^-11 is halfway between mantissas 0 and 1: even (0) wins.
  EXPECT_EQ(kvc_f32_to_f16(1.0f + std::ldexp(1.0f, -11)), 0x3C00);
  // 1 + 3 * 2^-11 is halfway between mantissas 1 and 2: even (2) wins.
  EXPECT_EQ(kvc_f32_to_f16(1.0f + std::ldexp(3.0f, -11)), 0x3C02);
  EXPECT_EQ(kvc_f32_to_f16(0.1f), 0x2E66);
  EXPECT_EQ(kvc_f32_to_f16(std::numeric_limits<float>::infinity()), 0x7C00);
  uint16_t nan = kvc_f32_to_f16(std::numeric_limits<float>::quiet_NaN());
  EXPECT_EQ(nan & 0x7C00, 0x7C00);
  EXPECT_NE(nan & 0x03FF, 0);
  EXPECT_EQ(kvc_f16_to_f32(0x3C00), 1.0f);
  EXPECT_EQ(kvc_f16_to_f32(0x0001), std::ldexp(1.0f, -24));
  EXPECT_EQ(kvc_f16_to_f32(0xFBFF), -65504.0f);
  EXPECT_TRUE(std::isinf(kvc_f16_to_f32(0x7C00)));
}

TEST(Conversion, Bf16Golden) {
  EXPECT_EQ(kvc_f32_to_bf16(1.0f), 0x3F80);
  EXPECT_EQ(kvc_f32_to_bf16(-1.0f), 0xBF80);
  // bf16 keeps 7 mantissa bits: 1 + 2^-8 is a tie, even (down) wins; 1 +
  // 3 * 2^-8 ties between mantissas 1 and 2: 2 wins.
  EXPECT_EQ(kvc_f32_to_bf16(1.0f + std::ldexp(1.0f, -8)), 0x3F80);
  EXPECT_EQ(kvc_f32_to_bf16(1.0f + std::ldexp(3.0f, -8)), 0x3F82);
  EXPECT_EQ(kvc_f32_to_bf16(-std::numeric_limits<float>::infinity()), 0xFF80);
  EXPECT_EQ(kvc_f32_to_bf16(std::numeric_limits<float>::max()), 0x7F80);
  uint16_t nan = kvc_f32_to_bf16(std::numeric_limits<float>::quiet_NaN());
  EXPECT_TRUE(std::isnan(kvc_bf16_to_f32(nan)));
  EXPECT_EQ(kvc_bf16_to_f32(0x4049), 3.140625f);
}

TEST(Conversion, Fp8E4M3Golden) {
  EXPECT_EQ(kvc_f32_to_fp8_e4m3(1.0f), 0x38); // 0 0111 000
  EXPECT_EQ(kvc_f32_to_fp8_e4m3(-1.0f), 0xB8);
  EXPECT_EQ(kvc_f32_to_fp8_e4m3(448.0f), 0x7E); // 0 1111 110 = 1.75 * 2^8
  EXPECT_EQ(kvc_f32_to_fp8_e4m3(-448.0f), 0xFE);
  EXPECT_EQ(kvc_f32_to_fp8_e4m3(464.0f), 0x7E); // would round to 480: clamp
  EXPECT_EQ(kvc_f32_to_fp8_e4m3(1e6f), 0x7E);
  EXPECT_EQ(kvc_f32_to_fp8_e4m3(std::numeric_limits<float>::infinity()), 0x7E);
  EXPECT_EQ(kvc_f32_to_fp8_e4m3(std::numeric_limits<float>::quiet_NaN()), 0x7F);
  EXPECT_EQ(kvc_f32_to_fp8_e4m3(240.0f), 0x77); // 1.875 * 2^7: 0 1110 111
  EXPECT_EQ(kvc_f32_to_fp8_e4m3(std::ldexp(1.0f, -9)), 0x01);  // min subnormal
  EXPECT_EQ(kvc_f32_to_fp8_e4m3(std::ldexp(1.0f, -6)), 0x08);  // min normal
  EXPECT_EQ(kvc_f32_to_fp8_e4m3(std::ldexp(1.0f, -10)), 0x00); // tie -> 0
  EXPECT_EQ(kvc_f32_to_fp8_e4m3(std::ldexp(3.0f, -10)), 0x02); // 1.5 -> 2
  EXPECT_EQ(kvc_f32_to_fp8_e4m3(1.0625f), 0x38); // tie 1 | 1.125 -> m=0
  EXPECT_EQ(kvc_f32_to_fp8_e4m3(1.1875f), 0x3A); // tie 1.125 | 1.25 -> m=2
  EXPECT_EQ(kvc_fp8_e4m3_to_f32(0x7E), 448.0f);
  EXPECT_EQ(kvc_fp8_e4m3_to_f32(0x01), std::ldexp(1.0f, -9));
  EXPECT_EQ(kvc_fp8_e4m3_to_f32(0xB8), -1.0f);
  EXPECT_TRUE(std::isnan(kvc_fp8_e4m3_to_f32(0x7F)));
  EXPECT_TRUE(std::isnan(kvc_fp8_e4m3_to_f32(0xFF)));
}

TEST(Conversion, DecodeMatchesReferenceForEveryCode) {
  for (int code = 0; code < 256; ++code) {
    double expected = kvc::ref::fp8E4M3Decode(static_cast<uint8_t>(code));
    float got = kvc_fp8_e4m3_to_f32(static_cast<uint8_t>(code));
    if (std::isnan(expected)) {
      EXPECT_TRUE(std::isnan(got)) << code;
    } else {
      EXPECT_EQ(static_cast<double>(got), expected) << code;
    }
  }
  // Every finite f16 / bf16 code round-trips through float exactly.
  for (uint32_t code = 0; code < 65536; ++code) {
    uint16_t h = static_cast<uint16_t>(code);
    float f16 = kvc_f16_to_f32(h);
    if (!std::isnan(f16)) {
      EXPECT_EQ(kvc_f32_to_f16(f16), h) << code;
    }
    float bf = kvc_bf16_to_f32(h);
    if (!std::isnan(bf)) {
      EXPECT_EQ(kvc_f32_to_bf16(bf), h) << code;
    }
  }
}

// Random floats over many binades plus exact midpoints between neighbouring
// codes, where round-to-nearest-even decides.
TEST(Conversion, EncodeMatchesReference) {
  std::mt19937 rng(7);
  std::uniform_real_distribution<float> mantissa(1.0f, 2.0f);
  std::uniform_int_distribution<int> exponent(-30, 20);
  for (int i = 0; i < 200000; ++i) {
    float x = std::ldexp(mantissa(rng), exponent(rng)) * (i % 2 ? -1.f : 1.f);
    ASSERT_EQ(static_cast<double>(kvc_f16_to_f32(kvc_f32_to_f16(x))),
              kvc::ref::roundToF16(x))
        << x;
    ASSERT_EQ(static_cast<double>(kvc_bf16_to_f32(kvc_f32_to_bf16(x))),
              kvc::ref::roundToBf16(x))
        << x;
    ASSERT_EQ(kvc_f32_to_fp8_e4m3(x), kvc::ref::fp8E4M3Encode(x)) << x;
  }
  for (int code = 0; code < 0x7E; ++code) {
    double lo = kvc::ref::fp8E4M3Decode(static_cast<uint8_t>(code));
    double hi = kvc::ref::fp8E4M3Decode(static_cast<uint8_t>(code + 1));
    float mid = static_cast<float>((lo + hi) / 2); // exact in float
    ASSERT_EQ(kvc_f32_to_fp8_e4m3(mid), kvc::ref::fp8E4M3Encode(mid)) << code;
    ASSERT_EQ(kvc_f32_to_fp8_e4m3(mid) & 1, 0) << "tie must pick even";
  }
  for (uint32_t code = 0; code < 0x7BFF; ++code) {
    double lo = kvc_f16_to_f32(static_cast<uint16_t>(code));
    double hi = kvc_f16_to_f32(static_cast<uint16_t>(code + 1));
    float mid = static_cast<float>((lo + hi) / 2);
    ASSERT_EQ(static_cast<double>(kvc_f16_to_f32(kvc_f32_to_f16(mid))),
              kvc::ref::roundToF16(mid))
        << code;
  }
  // Subnormal float inputs.
  EXPECT_EQ(kvc_f32_to_f16(bitsToFloat(1)), 0);
  EXPECT_EQ(kvc_f32_to_fp8_e4m3(-bitsToFloat(1)), 0x80);
}

} // namespace
