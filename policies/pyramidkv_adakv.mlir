// PyramidKV + AdaKV: PyramidKV's layer budgets (pyramidkv.mlir: w = 8, max
// pooling of kernel 7, capacity 2048, beta 20) split between the heads of
// each layer by AdaKV (adakv.mlir: alpha = 0.2), the combination the AdaKV
// paper evaluates.
//
// RUN: kvc-opt %s | FileCheck %s
// RUN: kvc-opt %s --mlir-print-op-generic | kvc-opt | FileCheck %s

// CHECK-LABEL: kvc.policy @pyramidkv_adakv {
// CHECK:         %[[B:.+]] = kvc.budget_pyramid capacity 2048 window 8 beta 20
// CHECK-NEXT:    %[[A:.+]] = kvc.budget_adaptive %[[B]], %[[S:.+]] alpha 2.000000e-01

kvc.policy @pyramidkv_adakv {
  kvc.phase after_prefill {
    %window = kvc.attn_window size 8
    %pooled = kvc.pool max %window kernel 7 : !kvc.score<query>
    %group = kvc.group_reduce mean %pooled
    %score = kvc.protect %group sinks 0 recent 8 : !kvc.score<kv_head>
    %base = kvc.budget_pyramid capacity 2048 window 8 beta 20
    %budget = kvc.budget_adaptive %base, %score alpha 0.2
    %keep = kvc.topk %score, %budget tie recent : !kvc.score<kv_head>
    kvc.evict %keep
  }
}
