//===- kvc_rules.h - Selection rules shared by the CPU and CUDA code -*- C++ -*-===//
//
// Integer rules that the CPU building blocks (kvc_cpu.h) and the CUDA ones
// (kvc_cuda.cuh) must compute identically, so that both backends keep the
// same entries, and the rounding of the asymmetric records, which the
// host's quantizers (runtime/Formats.cpp) and the device's must produce
// bit for bit. Header-only; host and device functions under nvcc.
//
//===----------------------------------------------------------------------===//

#ifndef KVC_RUNTIME_KVC_RULES_H
#define KVC_RUNTIME_KVC_RULES_H

#include <cmath>
#include <cstdint>

#ifdef __CUDACC__
#define KVC_HOST_DEVICE __host__ __device__
#else
#define KVC_HOST_DEVICE
#endif

namespace kvc::rules {

/// The number of kept entries that mixed precision keeps in the high
/// format: ceil(fraction * kept), computed so that a product that is an
/// integer up to rounding (0.2 * 5) is not rounded up past it.
KVC_HOST_DEVICE inline int32_t highPrecisionCount(int32_t kept,
                                                  double fraction) {
  const double x = fraction * kept;
  const double nearest = nearbyint(x);
  const double count =
      fabs(x - nearest) <= 1e-9 * (1.0 + fabs(x)) ? nearest : ceil(x);
  return static_cast<int32_t>(count < kept ? count : kept);
}

/// The f16 bits of the finite float whose bits are `floatBits`, rounded
/// towards +infinity (`up`) or -infinity and saturating at +-65504: the
/// rounding of a KIVI or INT2/INT4 record's min (down) and scale (up).
KVC_HOST_DEVICE inline uint32_t f16Directed(uint32_t floatBits, bool up) {
  const uint32_t sign = floatBits >> 31, magnitude = floatBits & 0x7fffffffu;
  const bool away = up != (sign != 0); // round the magnitude up
  const int exponent = static_cast<int>(magnitude >> 23) - 127;
  uint32_t h = 0x7bffu; // 65504: the saturated magnitude
  if (magnitude == 0) {
    h = 0;
  } else if (exponent < 16) {
    // The significand with its leading bit (none for a subnormal float),
    // moved right to count f16 units: 2^(e - 10) for a normal f16 (e >=
    // -14), 2^-24 below.
    const uint32_t significand =
        exponent == -127 ? magnitude : (magnitude & 0x7fffffu) | 0x800000u;
    const int e = exponent == -127 ? -126 : exponent;
    const int shift = e >= -14 ? 13 : -1 - e;
    uint32_t units = shift < 32 ? significand >> shift : 0;
    const bool dropped =
        shift < 32 ? (significand & ((1u << shift) - 1)) != 0 : true;
    // A normal f16's leading bit lands in its exponent field: adding
    // (e + 14) << 10 gives the bits of 1.m 2^e (biased exponent e + 15).
    if (e >= -14)
      units += static_cast<uint32_t>(e + 14) << 10;
    units += away && dropped ? 1u : 0u;
    h = units > 0x7bffu ? 0x7bffu : units;
  }
  return sign << 15 | h;
}

} // namespace kvc::rules

#endif // KVC_RUNTIME_KVC_RULES_H
