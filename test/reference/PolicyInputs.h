//===- PolicyInputs.h - q, k and v for the policy suites --------*- C++ -*-===//
//
// The inputs that the CPU policy suite (test/codegen/PolicyTest.cpp) and the
// GPU suite (test/gpu/GpuPolicyTest.cu) give every policy, so that both
// suites check the same cases.
//
//===----------------------------------------------------------------------===//

#ifndef KVC_TEST_REFERENCE_POLICYINPUTS_H
#define KVC_TEST_REFERENCE_POLICYINPUTS_H

#include <cstddef>
#include <random>
#include <vector>

namespace kvc::ref {

/// q, k and v of `tokens` steps of one layer, [token][head][dim].
struct LayerInputs {
  std::vector<float> q, k, v;
};

/// Standard normal q, k and v drawn from `rng` (q, then k, then v). With
/// `structured`, sinks and heavy hitters: every query gets +3 along its first
/// channel, and the keys of positions 0 to 3 and of every 97th position from
/// 13 get +4 along the same channel, so that attention concentrates on them
/// (the tokens are at positions firstPosition, firstPosition + 1, ...).
inline LayerInputs makeLayerInputs(std::mt19937 &rng, int tokens, int qHeads,
                                   int kvHeads, int dim, bool structured,
                                   int firstPosition) {
  std::normal_distribution<float> normal(0.0f, 1.0f);
  LayerInputs in;
  in.q.resize(static_cast<size_t>(tokens) * qHeads * dim);
  in.k.resize(static_cast<size_t>(tokens) * kvHeads * dim);
  in.v.resize(in.k.size());
  for (float &x : in.q)
    x = normal(rng);
  for (float &x : in.k)
    x = normal(rng);
  for (float &x : in.v)
    x = normal(rng);
  if (!structured)
    return in;
  for (int t = 0; t < tokens; ++t) {
    const int pos = firstPosition + t;
    for (int h = 0; h < qHeads; ++h)
      in.q[(static_cast<size_t>(t) * qHeads + h) * dim] += 3.0f;
    if (pos < 4 || pos % 97 == 13)
      for (int h = 0; h < kvHeads; ++h)
        in.k[(static_cast<size_t>(t) * kvHeads + h) * dim] += 4.0f;
  }
  return in;
}

} // namespace kvc::ref

#endif // KVC_TEST_REFERENCE_POLICYINPUTS_H
