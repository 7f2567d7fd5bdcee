// PyramidKV: "PyramidKV: Dynamic KV Cache Compression based on Pyramidal
// Information Funneling" (Cai et al., 2024).
//
// SnapKV scores with layer budgets that shrink linearly with depth. Variant:
// the PyramidKV code base's LongBench setting, observation window w = 8, max
// pooling with kernel 7, mean over the GQA group, average capacity 2048 per
// layer and beta = 20, with the code base's integer budget rule (both
// fallback branches: no compression below the capacity, plain SnapKV below
// twice the capacity minus the window).
//
// RUN: kvc-opt %s | FileCheck %s
// RUN: kvc-opt %s | kvc-opt | FileCheck %s
// RUN: kvc-opt %s --mlir-print-op-generic | kvc-opt | FileCheck %s

// CHECK-LABEL: kvc.policy @pyramidkv {
// CHECK-NEXT:    kvc.phase after_prefill {
// CHECK-NEXT:      %[[W:.+]] = kvc.attn_window size 8
// CHECK-NEXT:      %[[P:.+]] = kvc.pool max %[[W]] kernel 7 : !kvc.score<query>
// CHECK-NEXT:      %[[G:.+]] = kvc.group_reduce mean %[[P]]
// CHECK-NEXT:      %[[S:.+]] = kvc.protect %[[G]] sinks 0 recent 8 : !kvc.score<kv_head>
// CHECK-NEXT:      %[[B:.+]] = kvc.budget_pyramid capacity 2048 window 8 beta 20
// CHECK-NEXT:      %[[K:.+]] = kvc.topk %[[S]], %[[B]] tie recent : !kvc.score<kv_head>
// CHECK-NEXT:      kvc.evict %[[K]]

kvc.policy @pyramidkv {
  kvc.phase after_prefill {
    %window = kvc.attn_window size 8
    %pooled = kvc.pool max %window kernel 7 : !kvc.score<query>
    %group = kvc.group_reduce mean %pooled
    %score = kvc.protect %group sinks 0 recent 8 : !kvc.score<kv_head>
    %budget = kvc.budget_pyramid capacity 2048 window 8 beta 20
    %keep = kvc.topk %score, %budget tie recent : !kvc.score<kv_head>
    kvc.evict %keep
  }
}
