// TOVA: "Transformers are Multi-State RNNs" (Oren et al., 2024), Token
// Omission Via Attention.
//
// Scores every entry by the attention weight of the most recent query,
// averaged over all query heads of the layer, so that every head of a layer
// keeps the same entries; whenever the cache exceeds its budget the
// lowest-scoring entries are dropped (one per decode step). Variant: the
// paper's, no protected sinks or window; 1024 entries per layer.
//
// RUN: kvc-opt %s | FileCheck %s
// RUN: kvc-opt %s --mlir-print-op-generic | kvc-opt | FileCheck %s

// CHECK-LABEL: kvc.policy @tova {
// CHECK-NEXT:    kvc.phase over_budget {
// CHECK-NEXT:      %[[A:.+]] = kvc.attn_last
// CHECK-NEXT:      %[[L:.+]] = kvc.layer_reduce mean %[[A]] : !kvc.score<query>
// CHECK-NEXT:      %[[B:.+]] = kvc.budget_uniform count 1024
// CHECK-NEXT:      %[[K:.+]] = kvc.topk %[[L]], %[[B]] tie recent : !kvc.score<layer>

kvc.policy @tova {
  kvc.phase over_budget {
    %last = kvc.attn_last
    %layer = kvc.layer_reduce mean %last : !kvc.score<query>
    %budget = kvc.budget_uniform count 1024
    %keep = kvc.topk %layer, %budget tie recent : !kvc.score<layer>
    kvc.evict %keep
  }
}
