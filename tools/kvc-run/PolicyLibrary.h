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

#include "runtime/kvc_policy_api.h"
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
  kvc_configure_fn configure;
  kvc_workspace_bytes_fn prefillWorkspaceBytes;
  kvc_cpu_prefill_fn prefill;
  kvc_workspace_bytes_fn decodeWorkspaceBytes;
  kvc_cpu_decode_fn decode;
  /// A global budget's selection over every layer, run once after the
  /// prefill of the last layer; null for policies that select per layer.
  kvc_workspace_bytes_fn selectWorkspaceBytes = nullptr;
  kvc_select_fn select = nullptr;
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
