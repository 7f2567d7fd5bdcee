// KeyDiff: "KeyDiff: Key Similarity-Based KV Cache Eviction for Long-Context
// LLM Inference in Resource-Constrained Environments" (Park et al., 2025).
//
// Keeps the keys least similar to the mean key direction: score =
// -cos(k_i, mean_j k_j / ||k_j||). Attention-free, so it works with any
// attention kernel. Variant: applied once to the whole prompt after prefill
// (the paper also evicts block-wise while prefilling), 1024 entries per
// layer and kv-head.
//
// RUN: kvc-opt %s | FileCheck %s
// RUN: kvc-opt %s | kvc-opt | FileCheck %s
// RUN: kvc-opt %s --mlir-print-op-generic | kvc-opt | FileCheck %s

// CHECK-LABEL: kvc.policy @keydiff {
// CHECK-NEXT:    kvc.phase after_prefill {
// CHECK-NEXT:      %[[D:.+]] = kvc.key_diversity
// CHECK-NEXT:      %[[B:.+]] = kvc.budget_uniform count 1024
// CHECK-NEXT:      %[[K:.+]] = kvc.topk %[[D]], %[[B]] tie recent : !kvc.score<kv_head>
// CHECK-NEXT:      kvc.evict %[[K]]

kvc.policy @keydiff {
  kvc.phase after_prefill {
    %diversity = kvc.key_diversity
    %budget = kvc.budget_uniform count 1024
    %keep = kvc.topk %diversity, %budget tie recent : !kvc.score<kv_head>
    kvc.evict %keep
  }
}
