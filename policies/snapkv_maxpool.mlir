// SnapKV, max-pool variant: the PyramidKV code base's LongBench setting of
// SnapKV (observation window w = 8, max pooling with kernel 7), next to the
// reference press library's w = 64 average-pool variant in snapkv.mlir.
// Budget: 1024 entries per layer and kv-head, the window included.
//
// RUN: kvc-opt %s | FileCheck %s
// RUN: kvc-opt %s | kvc-opt | FileCheck %s
// RUN: kvc-opt %s --mlir-print-op-generic | kvc-opt | FileCheck %s

// CHECK-LABEL: kvc.policy @snapkv_maxpool {
// CHECK-NEXT:    kvc.phase after_prefill {
// CHECK-NEXT:      %[[W:.+]] = kvc.attn_window size 8
// CHECK-NEXT:      %[[P:.+]] = kvc.pool max %[[W]] kernel 7 : !kvc.score<query>

kvc.policy @snapkv_maxpool {
  kvc.phase after_prefill {
    %window = kvc.attn_window size 8
    %pooled = kvc.pool max %window kernel 7 : !kvc.score<query>
    %group = kvc.group_reduce mean %pooled
    %score = kvc.protect %group sinks 0 recent 8 : !kvc.score<kv_head>
    %budget = kvc.budget_uniform count 1024
    %keep = kvc.topk %score, %budget tie recent : !kvc.score<kv_head>
    kvc.evict %keep
  }
}
