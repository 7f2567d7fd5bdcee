// SnapKV: "SnapKV: LLM Knows What You are Looking for Before Generation"
// (Li et al., 2024).
//
// After prefill, scores every prompt entry by the mean attention it receives
// from the last w queries (the observation window), smooths the scores with
// 1-D pooling along tokens, averages over the GQA group, and keeps the top
// entries plus the window itself. Variant: the reference press library's
// defaults, w = 64 and average pooling with kernel 5 (zero padding counted);
// the paper uses w = 32, and the PyramidKV code base runs w = 8 with max
// pooling of kernel 7 (see pyramidkv.mlir). Budget: 1024 entries per layer
// and kv-head, the window included.
//
// RUN: kvc-opt %s | FileCheck %s
// RUN: kvc-opt %s | kvc-opt | FileCheck %s
// RUN: kvc-opt %s --mlir-print-op-generic | kvc-opt | FileCheck %s

// CHECK-LABEL: kvc.policy @snapkv {
// CHECK-NEXT:    kvc.phase after_prefill {
// CHECK-NEXT:      %[[W:.+]] = kvc.attn_window size 64
// CHECK-NEXT:      %[[P:.+]] = kvc.pool avg %[[W]] kernel 5 : !kvc.score<query>
// CHECK-NEXT:      %[[G:.+]] = kvc.group_reduce mean %[[P]]
// CHECK-NEXT:      %[[S:.+]] = kvc.protect %[[G]] sinks 0 recent 64 : !kvc.score<kv_head>
// CHECK-NEXT:      %[[B:.+]] = kvc.budget_uniform count 1024
// CHECK-NEXT:      %[[K:.+]] = kvc.topk %[[S]], %[[B]] tie recent : !kvc.score<kv_head>
// CHECK-NEXT:      kvc.evict %[[K]]

kvc.policy @snapkv {
  kvc.phase after_prefill {
    %window = kvc.attn_window size 64
    %pooled = kvc.pool avg %window kernel 5 : !kvc.score<query>
    %group = kvc.group_reduce mean %pooled
    %score = kvc.protect %group sinks 0 recent 64 : !kvc.score<kv_head>
    %budget = kvc.budget_uniform count 1024
    %keep = kvc.topk %score, %budget tie recent : !kvc.score<kv_head>
    kvc.evict %keep
  }
}
