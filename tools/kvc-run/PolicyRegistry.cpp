//===- PolicyRegistry.cpp - The policy libraries linked in ----------------===//
//
// Part of kvc, the KV-cache policy compiler.
//
//===----------------------------------------------------------------------===//
//
// The build of tools/kvc-run/policies generates kvc_run_policies.inc: the
// headers of the linked policy libraries and an X-macro list of their names
// and descriptions (G for policies with a global selection kernel). Each
// name expands here into a table entry holding that library's entry
// points. A build without the compiler defines no registry
// and the table is empty.
//
//===----------------------------------------------------------------------===//

#include "tools/kvc-run/PolicyLibrary.h"

#ifdef KVC_RUN_HAVE_POLICY_REGISTRY
#include "kvc_run_policies.inc"
#endif

namespace kvc {
namespace run {

const std::vector<PolicyLibrary> &policyLibraries() {
  static const std::vector<PolicyLibrary> libraries = {
#ifdef KVC_RUN_HAVE_POLICY_REGISTRY
#define KVC_RUN_POLICY_ENTRY(NAME, DESCRIPTION)                                \
  {#NAME,                                                                      \
   DESCRIPTION,                                                                \
   kvc_##NAME##_cpu_configure,                                                 \
   kvc_##NAME##_cpu_prefill_workspace_bytes,                                   \
   kvc_##NAME##_cpu_prefill,                                                   \
   kvc_##NAME##_cpu_decode_workspace_bytes,                                    \
   kvc_##NAME##_cpu_decode},
#define KVC_RUN_GLOBAL_POLICY_ENTRY(NAME, DESCRIPTION)                         \
  {#NAME,                                                                      \
   DESCRIPTION,                                                                \
   kvc_##NAME##_cpu_configure,                                                 \
   kvc_##NAME##_cpu_prefill_workspace_bytes,                                   \
   kvc_##NAME##_cpu_prefill,                                                   \
   kvc_##NAME##_cpu_decode_workspace_bytes,                                    \
   kvc_##NAME##_cpu_decode,                                                    \
   kvc_##NAME##_cpu_select_workspace_bytes,                                    \
   kvc_##NAME##_cpu_select},
      KVC_RUN_POLICIES(KVC_RUN_POLICY_ENTRY, KVC_RUN_GLOBAL_POLICY_ENTRY)
#undef KVC_RUN_GLOBAL_POLICY_ENTRY
#undef KVC_RUN_POLICY_ENTRY
#endif
  };
  return libraries;
}

const PolicyLibrary *findPolicyLibrary(const std::string &name) {
  for (const PolicyLibrary &library : policyLibraries())
    if (name == library.name)
      return &library;
  return nullptr;
}

int policyEvalContext() {
#ifdef KVC_RUN_HAVE_POLICY_REGISTRY
  return KVC_RUN_EVAL_CONTEXT;
#else
  return 0;
#endif
}

} // namespace run
} // namespace kvc
