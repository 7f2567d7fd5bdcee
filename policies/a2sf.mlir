// A2SF: "A2SF: Accumulative Attention Scoring with Forgetting Factor for
// Token Pruning in Transformer Decoder" (Jo and Shin, 2024).
//
// H2O's accumulated attention with a forgetting factor, so that old
// attention counts less: s_i <- gamma * s_i + p_{t,i} over every prompt and
// decode query. Variant: gamma = 0.9, mean over the GQA group, the 512 most
// recent entries protected, 1024 entries per layer and kv-head (the budget
// split of h2o.mlir), acting whenever the cache exceeds its budget.
//
// RUN: kvc-opt %s | FileCheck %s
// RUN: kvc-opt %s | kvc-opt | FileCheck %s
// RUN: kvc-opt %s --mlir-print-op-generic | kvc-opt | FileCheck %s

// CHECK-LABEL: kvc.policy @a2sf {
// CHECK-NEXT:    kvc.phase over_budget {
// CHECK-NEXT:      %[[A:.+]] = kvc.attn_accumulate decay 9.000000e-01
// CHECK-NEXT:      %[[G:.+]] = kvc.group_reduce mean %[[A]]
// CHECK-NEXT:      %[[P:.+]] = kvc.protect %[[G]] sinks 0 recent 512 : !kvc.score<kv_head>

kvc.policy @a2sf {
  kvc.phase over_budget {
    %attn = kvc.attn_accumulate decay 0.9
    %group = kvc.group_reduce mean %attn
    %score = kvc.protect %group sinks 0 recent 512 : !kvc.score<kv_head>
    %budget = kvc.budget_uniform count 1024
    %keep = kvc.topk %score, %budget tie recent : !kvc.score<kv_head>
    kvc.evict %keep
  }
}
