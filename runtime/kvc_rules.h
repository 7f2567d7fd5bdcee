//===- kvc_rules.h - Selection rules shared by the CPU and CUDA code -*- C++ -*-===//
//
// Integer rules that the CPU building blocks (kvc_cpu.h) and the CUDA ones
// (kvc_cuda.cuh) must compute identically, so that both backends keep the
// same entries. Header-only; host and device functions under nvcc.
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

} // namespace kvc::rules

#endif // KVC_RUNTIME_KVC_RULES_H
