// Scissorhands: "Scissorhands: Exploiting the Persistence of Importance
// Hypothesis for LLM KV Cache Compression at Test Time" (Liu et al., 2023).
//
// Persistence of importance: an entry that mattered at some steps keeps
// mattering. Every entry counts the steps, among the last 64 queries, at
// which it was important (its attention weight above a threshold); whenever
// the cache exceeds its budget the entries with the lowest counts go (ties:
// the oldest first), and a recent window is always kept.
//
// Variant and defaults (kvc's choices, where the paper leaves room):
//  - "important" means a weight above the fixed threshold 1/1024, the
//    uniform weight of a full 1024-entry cache; the paper compares with the
//    uniform weight 1/t of the current step, which changes as the cache
//    grows;
//  - a history of the last 64 queries (prompt queries, then decode steps),
//    a protected recent window of 64 entries, 1024 entries per layer and
//    kv-head;
//  - with grouped-query attention, the group's mean weight is compared with
//    the threshold (the paper's models have one query head per kv-head);
//  - the paper drops a batch of entries once the buffer fills up; kvc's
//    over_budget trigger drops one entry per decode step once the budget is
//    reached, the same ranking applied step by step.
//
// RUN: kvc-opt %s | FileCheck %s
// RUN: kvc-opt %s | kvc-opt | FileCheck %s
// RUN: kvc-opt %s --mlir-print-op-generic | kvc-opt | FileCheck %s
// RUN: kvc-opt %s --kvc-specialize=model=smollm2-135m --kvc-form-kernels | FileCheck %s --check-prefix=KERNELS

// CHECK-LABEL: kvc.policy @scissorhands {
// CHECK-NEXT:    kvc.phase over_budget {
// CHECK-NEXT:      %[[C:.+]] = kvc.attn_persistence threshold 9.765625E-4 history 64 reduce mean
// CHECK-NEXT:      %[[P:.+]] = kvc.protect %[[C]] sinks 0 recent 64 : !kvc.score<kv_head>
// CHECK-NEXT:      %[[B:.+]] = kvc.budget_uniform count 1024
// CHECK-NEXT:      %[[K:.+]] = kvc.topk %[[P]], %[[B]] tie recent : !kvc.score<kv_head>
// CHECK-NEXT:      kvc.evict %[[K]]

// Both kernels fold the importance bits into the one pass over the cache.
// KERNELS:      kvc.kernel prefill for over_budget {
// KERNELS-NEXT:   kvc.attention_pass output persistence 64 threshold 9.765625E-4 by mean
// KERNELS:      kvc.kernel decode for over_budget {
// KERNELS-NEXT:   kvc.append
// KERNELS-NEXT:   kvc.attention_pass output persistence 64 threshold 9.765625E-4 by mean

kvc.policy @scissorhands {
  kvc.phase over_budget {
    %count = kvc.attn_persistence threshold 9.765625e-4 history 64 reduce mean
    %score = kvc.protect %count sinks 0 recent 64 : !kvc.score<kv_head>
    %budget = kvc.budget_uniform count 1024
    %keep = kvc.topk %score, %budget tie recent : !kvc.score<kv_head>
    kvc.evict %keep
  }
}
