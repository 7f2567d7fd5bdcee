//===- KvcDialect.td - kvc policy dialect definition -------*- tablegen -*-===//
//
// The kvc dialect describes KV-cache policies: when a policy acts, how it
// scores cached entries, how many entries each layer and head keeps, how the
// kept set is selected and what happens to evicted entries, and in which
// format kept entries are stored.
//
//===----------------------------------------------------------------------===//

#ifndef KVC_DIALECT_KVCDIALECT_TD
#define KVC_DIALECT_KVCDIALECT_TD

include "mlir/IR/OpBase.td"
include "mlir/IR/AttrTypeBase.td"

def Kvc_Dialect : Dialect {
  let name = "kvc";
  let cppNamespace = "::kvc";
  let summary = "A declarative dialect for LLM KV-cache policies";
  let description = [{
    A `kvc.policy` is a model-agnostic description of a KV-cache compression
    policy. Its body holds an optional `kvc.storage` declaration and one or
    more `kvc.phase` regions. Each phase says *when* the policy acts and, in
    SSA form, how entries are scored (`kvc.attn_*`, `kvc.key_*`,
    `kvc.value_norm` and the combinators), how many entries each layer and
    kv-head keeps (`kvc.budget_*`), which entries are kept (`kvc.topk`) and
    what happens to the others (`kvc.evict`, `kvc.merge_*`).

    A policy becomes compilable once it is bound to a model geometry through
    the `geometry` attribute (see `kvc-specialize`).
  }];
  let useDefaultAttributePrinterParser = 1;
  let useDefaultTypePrinterParser = 1;
  let hasConstantMaterializer = 0;
}

/// Base class of every kvc operation.
class Kvc_Op<string mnemonic, list<Trait> traits = []>
    : Op<Kvc_Dialect, mnemonic, traits>;

#endif // KVC_DIALECT_KVCDIALECT_TD
