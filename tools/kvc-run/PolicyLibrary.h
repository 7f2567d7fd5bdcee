//===- PolicyLibrary.h - Policy libraries linked into kvc-run ---*- C++ -*-===//
//
// Part of kvc, the KV-cache policy compiler.
//
//===----------------------------------------------------------------------===//
//
// A policy library is what kvc_add_policy_library builds from a policy file:
// a configure function that fills the runtime configuration, and prefill and
// decode entry points with their workspace sizes. kvc-run links a set of them
// statically (tools/kvc-run/policies) and finds them by name in the table
// below; without the compiler the table is empty.
//
//===----------------------------------------------------------------------===//

#ifndef KVC_TOOLS_KVCRUN_POLICYLIBRARY_H
#define KVC_TOOLS_KVCRUN_POLICYLIBRARY_H

#include "runtime/kvc_runtime.h"

#include <string>
#include <vector>

namespace kvc {
namespace run {

/// The generated C entry points of one compiled policy.
struct PolicyLibrary {
  /// Name the policy was compiled under (kvc_<name>_cpu_*).
  const char *name;
  /// Where it comes from: the policy file and any budget change.
  const char *description;
  void (*configure)(kvc_config_t *config);
  uint64_t (*prefillWorkspaceBytes)(int32_t n);
  kvc_status_t (*prefill)(kvc_context_t *context, uint64_t sequence,
                          int32_t layer, int32_t n, const float *q,
                          const float *k, const float *v,
                          const int32_t *positions, float *out,
                          void *workspace, uint64_t workspaceBytes);
  uint64_t (*decodeWorkspaceBytes)(int32_t numSlots);
  kvc_status_t (*decode)(kvc_context_t *context, uint64_t sequence,
                         int32_t layer, const float *q, const float *k,
                         const float *v, int32_t position, float *out,
                         void *workspace, uint64_t workspaceBytes);
  /// A global budget's selection over every layer, run once after the
  /// prefill of the last layer; null for policies that select per layer.
  uint64_t (*selectWorkspaceBytes)(int32_t n) = nullptr;
  kvc_status_t (*select)(kvc_context_t *context, uint64_t sequence,
                         int32_t n, void *workspace,
                         uint64_t workspaceBytes) = nullptr;
};

/// Every policy library linked into this binary, in registry order.
const std::vector<PolicyLibrary> &policyLibraries();

/// The library named `name`, or null.
const PolicyLibrary *findPolicyLibrary(const std::string &name);

/// Prompt length the budget variants were derived from (0 when no policy
/// libraries are linked).
int policyEvalContext();

} // namespace run
} // namespace kvc

#endif // KVC_TOOLS_KVCRUN_POLICYLIBRARY_H
