// Value-aware token pruning (VATP): "Attention Score is not All You Need for
// Token Importance Indicator in KV Cache Reduction: Value Also Matters"
// (Guo et al., 2024).
//
// Scores each entry by its accumulated attention times the L1 norm of its
// value, so that entries whose values barely contribute are evicted first.
// Variant: applied once after prefill, accumulated attention over every
// prompt query (H2O's sum, mean over the GQA group) times ||v_i||_1, the 64
// most recent entries protected, 1024 entries per layer and kv-head.
// CriticalKV's exact form (||W_o v_i||_1) needs the output projection and
// is not this policy.
//
// RUN: kvc-opt %s | FileCheck %s
// RUN: kvc-opt %s | kvc-opt | FileCheck %s
// RUN: kvc-opt %s --mlir-print-op-generic | kvc-opt | FileCheck %s

// CHECK-LABEL: kvc.policy @value_aware {
// CHECK-NEXT:    kvc.phase after_prefill {
// CHECK-NEXT:      %[[A:.+]] = kvc.attn_accumulate decay 1.000000e+00
// CHECK-NEXT:      %[[G:.+]] = kvc.group_reduce mean %[[A]]
// CHECK-NEXT:      %[[V:.+]] = kvc.value_norm p 1
// CHECK-NEXT:      %[[S:.+]] = kvc.combine product %[[G]], %[[V]] : !kvc.score<kv_head>

kvc.policy @value_aware {
  kvc.phase after_prefill {
    %attn = kvc.attn_accumulate decay 1.0
    %group = kvc.group_reduce mean %attn
    %norm = kvc.value_norm p 1
    %product = kvc.combine product %group, %norm : !kvc.score<kv_head>
    %score = kvc.protect %product sinks 0 recent 64 : !kvc.score<kv_head>
    %budget = kvc.budget_uniform count 1024
    %keep = kvc.topk %score, %budget tie recent : !kvc.score<kv_head>
    kvc.evict %keep
  }
}
