// DuoAttention (duo_attention.mlir) with a table for the 2-layer, 3-kv-head
// test geometry: retrieval heads (0, 1) and (1, 0), the others streaming,
// with 4 sinks and 60 recent entries.
//
// RUN: kvc-opt %s "--kvc-specialize=layers=2 q-heads=9 kv-heads=3 head-dim=64" | FileCheck %s
// CHECK: kvc.budget_head_classes table dense<{{\[\[}}0, 1, 0], [1, 0, 0]]> : tensor<2x3xi8> sinks 4 recent 60

kvc.policy @duo_small {
  kvc.phase over_budget {
    %position = kvc.recency
    %score = kvc.protect %position sinks 4 recent 0 : !kvc.score<kv_head>
    %budget = kvc.budget_head_classes table dense<[[0, 1, 0], [1, 0, 0]]> : tensor<2x3xi8> sinks 4 recent 60
    %keep = kvc.topk %score, %budget tie recent : !kvc.score<kv_head>
    kvc.evict %keep
  }
}
