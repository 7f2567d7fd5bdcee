//===- QuantizationTest.cpp - Packing, quantizers, round-trip bounds ------===//
//
// Golden bytes for every packed layout (worked out by hand in the comments),
// round-trip errors within each format's analytic bound on N(0,1) data, and
// agreement of the runtime's quantizers with the reference oracle.
//
//===----------------------------------------------------------------------===//

#include "runtime/kvc_runtime.h"
#include "test/reference/Reference.h"
#include "test/runtime/TestSupport.h"

#include "gtest/gtest.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <random>

namespace {

using kvc::test::gaussian;

//===----------------------------------------------------------------------===//
// Golden layouts
//===----------------------------------------------------------------------===//

TEST(Packing, Int4Golden) {
  // byte = c0 | c1 << 4: (1, 2) -> 0x21, (3, 4) -> 0x43, (15, 0) -> 0x0F.
  const uint8_t codes[] = {1, 2, 3, 4, 15, 0};
  uint8_t packed[3] = {0xFF, 0xFF, 0xFF};
  ASSERT_EQ(kvc_pack_bits(codes, 6, 4, packed), KVC_STATUS_OK);
  EXPECT_EQ(packed[0], 0x21);
  EXPECT_EQ(packed[1], 0x43);
  EXPECT_EQ(packed[2], 0x0F);
  uint8_t back[6];
  ASSERT_EQ(kvc_unpack_bits(packed, 6, 4, back), KVC_STATUS_OK);
  EXPECT_TRUE(std::equal(codes, codes + 6, back));
}

TEST(Packing, Int2Golden) {
  // byte = c0 | c1 << 2 | c2 << 4 | c3 << 6:
  // (1, 2, 3, 0) -> 1 + 8 + 48 + 0 = 57 = 0x39;
  // (3, 3, 0, 1) -> 3 + 12 + 0 + 64 = 79 = 0x4F; (2) -> 0x02.
  const uint8_t codes[] = {1, 2, 3, 0, 3, 3, 0, 1, 2};
  uint8_t packed[3];
  ASSERT_EQ(kvc_pack_bits(codes, 9, 2, packed), KVC_STATUS_OK);
  EXPECT_EQ(packed[0], 0x39);
  EXPECT_EQ(packed[1], 0x4F);
  EXPECT_EQ(packed[2], 0x02);
  uint8_t back[9];
  ASSERT_EQ(kvc_unpack_bits(packed, 9, 2, back), KVC_STATUS_OK);
  EXPECT_TRUE(std::equal(codes, codes + 9, back));
  // The reference packs the same bytes from its own bit-stream writer.
  std::vector<int> refCodes(codes, codes + 9);
  EXPECT_EQ(kvc::ref::packCodes(refCodes, 2),
            (std::vector<uint8_t>{0x39, 0x4F, 0x02}));
}

TEST(Quantizers, AsymGolden) {
  // min 0, max 15, 4 bits: scale = 15 / 15 = 1; 7.5 and 8.5 are ties and go
  // to the even code 8. Packed: (0, 8) -> 0x80, (15, 3) -> 0x3F, (8) -> 0x08.
  const float x[] = {0.0f, 7.5f, 15.0f, 3.0f, 8.5f};
  uint8_t codes[5];
  float scale = 0, min = 0;
  ASSERT_EQ(kvc_quantize_asym(x, 5, 4, codes, &scale, &min), KVC_STATUS_OK);
  EXPECT_EQ(scale, 1.0f);
  EXPECT_EQ(min, 0.0f);
  EXPECT_EQ(std::vector<uint8_t>(codes, codes + 5),
            (std::vector<uint8_t>{0, 8, 15, 3, 8}));
  uint8_t packed[3];
  ASSERT_EQ(kvc_pack_bits(codes, 5, 4, packed), KVC_STATUS_OK);
  EXPECT_EQ(packed[0], 0x80);
  EXPECT_EQ(packed[1], 0x3F);
  EXPECT_EQ(packed[2], 0x08);
  kvc::ref::AsymGroup ref = kvc::ref::quantizeAsym({0, 7.5, 15, 3, 8.5}, 4);
  EXPECT_EQ(ref.codes, (std::vector<int>{0, 8, 15, 3, 8}));
}

TEST(Quantizers, KiviKeyBlockGolden) {
  // Two tokens, four channels, 2 bits (levels 0..3), per channel:
  //  c0: {0, 3}  -> min 0, scale 1, codes (0, 3)
  //  c1: {1, 1}  -> min 1, scale 0, codes (0, 0)
  //  c2: {10, 4} -> min 4, scale 2, codes (3, 0)
  //  c3: {5, 5}  -> min 5, scale 0, codes (0, 0)
  // Token rows: t0 = (0, 0, 3, 0) -> 3 << 4 = 0x30; t1 = (3, 0, 0, 0) -> 0x03.
  const float keys[] = {0, 1, 10, 5, 3, 1, 4, 5};
  uint8_t packed[2];
  float scales[4], mins[4];
  ASSERT_EQ(kvc_kivi_quantize_keys(keys, 2, 4, 2, packed, scales, mins),
            KVC_STATUS_OK);
  EXPECT_EQ(packed[0], 0x30);
  EXPECT_EQ(packed[1], 0x03);
  EXPECT_EQ(std::vector<float>(scales, scales + 4),
            (std::vector<float>{1, 0, 2, 0}));
  EXPECT_EQ(std::vector<float>(mins, mins + 4),
            (std::vector<float>{0, 1, 4, 5}));
  float back[8];
  ASSERT_EQ(kvc_kivi_dequantize_keys(packed, 2, 4, 2, scales, mins, back),
            KVC_STATUS_OK);
  EXPECT_TRUE(std::equal(keys, keys + 8, back)); // exactly representable
}

TEST(Quantizers, KiviValueGolden) {
  // Eight channels, groups of four, 2 bits:
  //  g0 {0, 3, 6, 9}: min 0, scale 3, codes (0, 1, 2, 3) -> byte 0xE4
  //  g1 {-1 x4}:      min -1, scale 0, codes 0          -> byte 0x00
  const float v[] = {0, 3, 6, 9, -1, -1, -1, -1};
  uint8_t packed[2];
  float scales[2], mins[2];
  ASSERT_EQ(kvc_kivi_quantize_value(v, 8, 4, 2, packed, scales, mins),
            KVC_STATUS_OK);
  EXPECT_EQ(packed[0], 0xE4);
  EXPECT_EQ(packed[1], 0x00);
  EXPECT_EQ(scales[0], 3.0f);
  EXPECT_EQ(scales[1], 0.0f);
  EXPECT_EQ(mins[0], 0.0f);
  EXPECT_EQ(mins[1], -1.0f);
}

TEST(Quantizers, Int8Golden) {
  // amax 127 -> scale 1; 0.5 -> 0 and 1.5 -> 2 and -2.5 -> -2 (ties to
  // even); bytes in two's complement: 0x7F 0xC0 0x00 0x02 0xFE.
  const float x[] = {127.0f, -64.0f, 0.5f, 1.5f, -2.5f};
  int8_t q[5];
  float scale = 0;
  ASSERT_EQ(kvc_quantize_int8(x, 5, q, &scale), KVC_STATUS_OK);
  EXPECT_EQ(scale, 1.0f);
  const uint8_t expected[] = {0x7F, 0xC0, 0x00, 0x02, 0xFE};
  for (int i = 0; i < 5; ++i)
    EXPECT_EQ(static_cast<uint8_t>(q[i]), expected[i]) << i;
}

TEST(Quantizers, Fp8Golden) {
  // amax 448 -> scale 1: 448 -> 0x7E, -224 = -1.75 * 2^7 -> 1 1110 110 =
  // 0xF6, 1 -> 0x38, 0 -> 0x00. A zero vector keeps scale 1.
  const float x[] = {448.0f, -224.0f, 1.0f, 0.0f};
  uint8_t q[4];
  float scale = 0;
  ASSERT_EQ(kvc_quantize_fp8_e4m3(x, 4, q, &scale), KVC_STATUS_OK);
  EXPECT_EQ(scale, 1.0f);
  EXPECT_EQ(std::vector<uint8_t>(q, q + 4),
            (std::vector<uint8_t>{0x7E, 0xF6, 0x38, 0x00}));
  const float zeros[] = {0.0f, 0.0f};
  ASSERT_EQ(kvc_quantize_fp8_e4m3(zeros, 2, q, &scale), KVC_STATUS_OK);
  EXPECT_EQ(scale, 1.0f);
}

//===----------------------------------------------------------------------===//
// Round-trip bounds on N(0, 1) data (the measured maxima are printed)
//===----------------------------------------------------------------------===//

void report(const char *format, double maxError) {
  std::printf("[ measured ] %-22s max |x - x^| = %.6g\n", format, maxError);
}

TEST(RoundTrip, KiviKeysAndValues) {
  // KIVI defaults: G = 32, d = 128; a key block is G tokens.
  std::mt19937 rng(11);
  const int d = 128, g = 32;
  for (int bits : {2, 4}) {
    double maxKey = 0, maxValue = 0;
    for (int trial = 0; trial < 20; ++trial) {
      std::vector<float> keys = gaussian(rng, static_cast<size_t>(g) * d);
      std::vector<uint8_t> packed(static_cast<size_t>(g) * d * bits / 8);
      std::vector<float> scales(d), mins(d), back(keys.size());
      ASSERT_EQ(kvc_kivi_quantize_keys(keys.data(), g, d, bits, packed.data(),
                                       scales.data(), mins.data()),
                KVC_STATUS_OK);
      ASSERT_EQ(kvc_kivi_dequantize_keys(packed.data(), g, d, bits,
                                         scales.data(), mins.data(),
                                         back.data()),
                KVC_STATUS_OK);
      for (int t = 0; t < g; ++t)
        for (int c = 0; c < d; ++c) {
          size_t i = static_cast<size_t>(t) * d + c;
          double err = std::fabs(keys[i] - back[i]);
          // Bound: half a step of the channel's scale, plus float rounding.
          ASSERT_LE(err, scales[c] / 2 * (1 + 1e-5) + 1e-6);
          maxKey = std::max(maxKey, err);
        }
      std::vector<float> value = gaussian(rng, d), vback(d);
      std::vector<float> vs(d / g), vm(d / g);
      std::vector<uint8_t> vpacked(d * bits / 8);
      ASSERT_EQ(kvc_kivi_quantize_value(value.data(), d, g, bits,
                                        vpacked.data(), vs.data(), vm.data()),
                KVC_STATUS_OK);
      ASSERT_EQ(kvc_kivi_dequantize_value(vpacked.data(), d, g, bits, vs.data(),
                                          vm.data(), vback.data()),
                KVC_STATUS_OK);
      for (int c = 0; c < d; ++c) {
        double err = std::fabs(value[c] - vback[c]);
        ASSERT_LE(err, vs[c / g] / 2 * (1 + 1e-5) + 1e-6);
        maxValue = std::max(maxValue, err);
      }
    }
    report(bits == 2 ? "KIVI int2 keys (G=32)" : "KIVI int4 keys (G=32)",
           maxKey);
    report(bits == 2 ? "KIVI int2 values (G=32)" : "KIVI int4 values (G=32)",
           maxValue);
  }
}

TEST(RoundTrip, Int8AndFp8) {
  std::mt19937 rng(12);
  const int d = 128;
  double maxInt8 = 0, maxFp8 = 0;
  for (int trial = 0; trial < 200; ++trial) {
    std::vector<float> x = gaussian(rng, d), back(d);
    std::vector<int8_t> q(d);
    float scale = 0;
    ASSERT_EQ(kvc_quantize_int8(x.data(), d, q.data(), &scale), KVC_STATUS_OK);
    ASSERT_EQ(kvc_dequantize_int8(q.data(), d, scale, back.data()),
              KVC_STATUS_OK);
    for (int i = 0; i < d; ++i) {
      double err = std::fabs(x[i] - back[i]);
      ASSERT_LE(err, scale / 2 * (1 + 1e-5));
      maxInt8 = std::max(maxInt8, err);
    }
    std::vector<uint8_t> f(d);
    ASSERT_EQ(kvc_quantize_fp8_e4m3(x.data(), d, f.data(), &scale),
              KVC_STATUS_OK);
    ASSERT_EQ(kvc_dequantize_fp8_e4m3(f.data(), d, scale, back.data()),
              KVC_STATUS_OK);
    for (int i = 0; i < d; ++i) {
      double err = std::fabs(x[i] - back[i]);
      // e4m3 keeps 3 mantissa bits: relative 2^-4 for normal values; the
      // subnormal step is 2^-9, so half of it (times the scale) below 2^-6.
      double bound = std::max(std::ldexp(double(std::fabs(x[i])), -4),
                              std::ldexp(double(scale), -10));
      ASSERT_LE(err, bound * (1 + 1e-5)) << x[i];
      maxFp8 = std::max(maxFp8, err);
    }
  }
  report("int8 per token", maxInt8);
  report("fp8 e4m3 per token", maxFp8);
}

TEST(RoundTrip, HalfPrecisionElements) {
  std::mt19937 rng(13);
  std::vector<float> x = gaussian(rng, 100000);
  double maxF16 = 0, maxBf16 = 0;
  for (float v : x) {
    double e16 = std::fabs(v - kvc_f16_to_f32(kvc_f32_to_f16(v)));
    double eb = std::fabs(v - kvc_bf16_to_f32(kvc_f32_to_bf16(v)));
    // Half an ulp: 2^-11 relative for f16 normals (plus the 2^-25 subnormal
    // half-step), 2^-8 relative for bf16.
    ASSERT_LE(e16, std::ldexp(std::fabs(v), -11) + std::ldexp(1.0, -25));
    ASSERT_LE(eb, std::ldexp(std::fabs(v), -8));
    maxF16 = std::max(maxF16, e16);
    maxBf16 = std::max(maxBf16, eb);
  }
  report("f16 elements", maxF16);
  report("bf16 elements", maxBf16);
}

//===----------------------------------------------------------------------===//
// Runtime vs reference
//===----------------------------------------------------------------------===//

// The runtime computes in float and the reference in double, so a code may
// differ only where the reference's unrounded value sits on a rounding
// midpoint up to float precision.
bool nearMidpoint(double unrounded) {
  double frac = unrounded - std::floor(unrounded);
  return std::fabs(frac - 0.5) < 1e-4;
}

TEST(RuntimeVsReference, Asym) {
  std::mt19937 rng(21);
  int nearTies = 0;
  for (int bits : {2, 4, 8})
    for (int trial = 0; trial < 300; ++trial) {
      std::vector<float> x = gaussian(rng, 64);
      std::vector<uint8_t> codes(64);
      float scale, min;
      ASSERT_EQ(
          kvc_quantize_asym(x.data(), 64, bits, codes.data(), &scale, &min),
          KVC_STATUS_OK);
      kvc::ref::AsymGroup ref =
          kvc::ref::quantizeAsym(kvc::ref::Vector(x.begin(), x.end()), bits);
      EXPECT_NEAR(scale, ref.scale, 1e-6 * std::fabs(ref.scale));
      EXPECT_EQ(min, ref.min);
      for (int i = 0; i < 64; ++i) {
        if (codes[i] == ref.codes[i])
          continue;
        double unrounded = (x[i] - ref.min) / ref.scale;
        ASSERT_TRUE(nearMidpoint(unrounded)) << "bits " << bits << " i " << i;
        ASSERT_EQ(std::abs(codes[i] - ref.codes[i]), 1);
        ++nearTies;
      }
    }
  EXPECT_LE(nearTies, 3);
}

// A page stores {scale, min} as two f16: min rounded down, scale rounded
// up, so that the codes still span every value of the group.
TEST(Quantization, KiviRecordsAreF16AndSpanTheirGroup) {
  // Groups of four int2 codes, by hand.
  struct Case {
    float x[4];
    float min, scale;
    uint8_t packed;
  };
  const Case cases[] = {
      // min -1 - 2^-12 rounds down to -1 - 2^-10 = -1.0009765625 (f16
      // spacing 2^-10 in [1, 2)); scale (1.5 + 1.0009765625) / 3 =
      // 0.833659... rounds up to 1708 / 2048 = 0.833984375 (spacing 2^-11
      // in [1/2, 1)); codes rne((x - min) / scale): 0.0009 -> 0, 2.999 ->
      // 3, 1.560 -> 2, 0.601 -> 1.
      {{-1.0f - std::ldexp(1.0f, -12), 1.5f, 0.3f, -0.5f},
       -1.0009765625f,
       0.833984375f,
       0 | 3 << 2 | 2 << 4 | 1 << 6},
      // Below f16's normal range the spacing is 2^-24: scale 1e-6 / 3 =
      // 5.59 2^-24 rounds up to 6 2^-24; codes 0, 2.80 -> 3, 0, 0.
      {{0.0f, 1e-6f, 0.0f, 0.0f}, 0.0f, std::ldexp(6.0f, -24), 3 << 2},
      // Beyond +-65504 the record saturates: min -65504, scale (1e5 +
      // 65504) / 3 = 55168 (a multiple of f16's spacing 32 there); -1e5 is
      // clamped to min (code 0), 1e5 is code 3, 0 is 1.19 -> 1.
      {{-1e5f, 1e5f, 0.0f, 0.0f},
       -65504.0f,
       55168.0f,
       0 | 3 << 2 | 1 << 4 | 1 << 6},
  };
  for (const Case &c : cases) {
    uint8_t packed = 0;
    float scale = 0.0f, min = 0.0f;
    ASSERT_EQ(
        kvc_kivi_quantize_value(c.x, 4, 4, 2, &packed, &scale, &min),
        KVC_STATUS_OK);
    EXPECT_EQ(min, c.min) << c.x[1];
    EXPECT_EQ(scale, c.scale) << c.x[1];
    EXPECT_EQ(packed, c.packed) << c.x[1];
  }

  std::mt19937 rng(31);
  for (int bits : {2, 4})
    for (int trial = 0; trial < 200; ++trial) {
      // Groups away from 0 too, where rounding min down matters most.
      std::vector<float> v = gaussian(rng, 32);
      const float shift = static_cast<float>(trial % 7) - 3.0f;
      for (float &x : v)
        x = x * 0.1f + shift;
      std::vector<uint8_t> vp(32 * bits / 8);
      float s = 0.0f, m = 0.0f;
      ASSERT_EQ(kvc_kivi_quantize_value(v.data(), 32, 32, bits, vp.data(),
                                        &s, &m),
                KVC_STATUS_OK);
      EXPECT_EQ(kvc_f16_to_f32(kvc_f32_to_f16(s)), s);
      EXPECT_EQ(kvc_f16_to_f32(kvc_f32_to_f16(m)), m);
      const float lo = *std::min_element(v.begin(), v.end());
      const float hi = *std::max_element(v.begin(), v.end());
      const float exact = (hi - lo) / static_cast<float>((1 << bits) - 1);
      EXPECT_LE(m, lo);
      EXPECT_GE(static_cast<double>(m) + ((1 << bits) - 1) * double(s),
                static_cast<double>(hi));
      // Both roundings together widen the step by less than 2^-10 of it
      // plus an f16 step of min.
      EXPECT_LE(s, exact * (1.0f + std::ldexp(1.0f, -10)) +
                       std::fabs(m) * std::ldexp(1.0f, -10));
      std::vector<float> back(32);
      ASSERT_EQ(kvc_kivi_dequantize_value(vp.data(), 32, 32, bits, &s, &m,
                                          back.data()),
                KVC_STATUS_OK);
      for (int i = 0; i < 32; ++i)
        ASSERT_LE(std::fabs(back[i] - v[i]),
                  s * 0.5f + 1e-6f * std::fabs(v[i]))
            << "bits " << bits << " i " << i;
    }
}

TEST(RuntimeVsReference, KiviInt8Fp8) {
  std::mt19937 rng(22);
  const int d = 64, g = 16, tokens = 16;
  for (int trial = 0; trial < 50; ++trial) {
    for (int bits : {2, 4}) {
      std::vector<float> keys = gaussian(rng, tokens * d);
      std::vector<uint8_t> packed(tokens * d * bits / 8);
      std::vector<float> scales(d), mins(d);
      ASSERT_EQ(kvc_kivi_quantize_keys(keys.data(), tokens, d, bits,
                                       packed.data(), scales.data(),
                                       mins.data()),
                KVC_STATUS_OK);
      kvc::ref::Matrix km(tokens, d);
      for (int i = 0; i < tokens * d; ++i)
        km.data[i] = keys[i];
      kvc::ref::KiviKeyBlock ref = kvc::ref::kiviQuantizeKeys(km, bits);
      std::vector<int> refCodes = ref.codes;
      std::vector<uint8_t> refPacked;
      for (int t = 0; t < tokens; ++t) {
        std::vector<int> row(refCodes.begin() + t * d,
                             refCodes.begin() + (t + 1) * d);
        std::vector<uint8_t> bytes = kvc::ref::packCodes(row, bits);
        refPacked.insert(refPacked.end(), bytes.begin(), bytes.end());
      }
      int differing = 0;
      for (size_t i = 0; i < packed.size(); ++i)
        differing += packed[i] != refPacked[i];
      EXPECT_LE(differing, 1) << "bits " << bits; // at most a midpoint flip
      for (int c = 0; c < d; ++c) {
        EXPECT_EQ(scales[c], ref.scales[c]);
        EXPECT_EQ(mins[c], ref.mins[c]);
      }
      std::vector<float> v = gaussian(rng, d);
      std::vector<uint8_t> vp(d * bits / 8);
      std::vector<float> vs(d / g), vm(d / g);
      ASSERT_EQ(kvc_kivi_quantize_value(v.data(), d, g, bits, vp.data(),
                                        vs.data(), vm.data()),
                KVC_STATUS_OK);
      kvc::ref::KiviValue rv = kvc::ref::kiviQuantizeValue(
          kvc::ref::Vector(v.begin(), v.end()), g, bits);
      std::vector<uint8_t> rvp = kvc::ref::packCodes(rv.codes, bits);
      int vdiff = 0;
      for (size_t i = 0; i < vp.size(); ++i)
        vdiff += vp[i] != rvp[i];
      EXPECT_LE(vdiff, 1);
      for (int j = 0; j < d / g; ++j) {
        EXPECT_EQ(vs[j], rv.scales[j]);
        EXPECT_EQ(vm[j], rv.mins[j]);
      }
    }
    std::vector<float> x = gaussian(rng, d);
    std::vector<int8_t> q(d);
    float scale;
    ASSERT_EQ(kvc_quantize_int8(x.data(), d, q.data(), &scale), KVC_STATUS_OK);
    kvc::ref::Int8Vector r8 =
        kvc::ref::quantizeInt8(kvc::ref::Vector(x.begin(), x.end()));
    EXPECT_NEAR(scale, r8.scale, 1e-6 * r8.scale);
    for (int i = 0; i < d; ++i)
      if (q[i] != r8.q[i]) {
        EXPECT_TRUE(nearMidpoint(x[i] / r8.scale)) << i;
      }
    std::vector<uint8_t> f(d);
    ASSERT_EQ(kvc_quantize_fp8_e4m3(x.data(), d, f.data(), &scale),
              KVC_STATUS_OK);
    kvc::ref::Fp8Vector rf =
        kvc::ref::quantizeFp8(kvc::ref::Vector(x.begin(), x.end()));
    EXPECT_NEAR(scale, rf.scale, 1e-6 * rf.scale);
    int fdiff = 0;
    for (int i = 0; i < d; ++i)
      fdiff += f[i] != rf.q[i];
    EXPECT_LE(fdiff, 1);
  }
}

} // namespace
