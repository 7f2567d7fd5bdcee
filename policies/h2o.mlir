// H2O: "Heavy-Hitter Oracle for Efficient Generative Inference of Large
// Language Models" (Zhang et al., 2023).
//
// Scores each entry by the attention it has accumulated from every query
// seen so far (prompt queries, then one more at every decode step) and keeps
// the heavy hitters plus a recent window. Variant: the original H2O sum
// (decay 1, no division by the number of queries that can see an entry; the
// reference press library divides, which is `visible_normalized`), mean over
// the GQA group, half of a 1024-entry budget reserved for the 512 most recent
// entries as in the paper's equal heavy/recent split.
//
// RUN: kvc-opt %s | FileCheck %s
// RUN: kvc-opt %s | kvc-opt | FileCheck %s
// RUN: kvc-opt %s --mlir-print-op-generic | kvc-opt | FileCheck %s

// CHECK-LABEL: kvc.policy @h2o {
// CHECK-NEXT:    kvc.phase over_budget {
// CHECK-NEXT:      %[[A:.+]] = kvc.attn_accumulate decay 1.000000e+00
// CHECK-NEXT:      %[[G:.+]] = kvc.group_reduce mean %[[A]]
// CHECK-NEXT:      %[[P:.+]] = kvc.protect %[[G]] sinks 0 recent 512 : !kvc.score<kv_head>
// CHECK-NEXT:      %[[B:.+]] = kvc.budget_uniform count 1024
// CHECK-NEXT:      %[[K:.+]] = kvc.topk %[[P]], %[[B]] tie recent : !kvc.score<kv_head>
// CHECK-NEXT:      kvc.evict %[[K]]

kvc.policy @h2o {
  kvc.phase over_budget {
    %attn = kvc.attn_accumulate decay 1.0
    %group = kvc.group_reduce mean %attn
    %score = kvc.protect %group sinks 0 recent 512 : !kvc.score<kv_head>
    %budget = kvc.budget_uniform count 1024
    %keep = kvc.topk %score, %budget tie recent : !kvc.score<kv_head>
    kvc.evict %keep
  }
}
