// Mirrors policies/snapkv_global.mlir, scaled for a hand-worked case:
// window 64 -> 2 (and the protected recent window with it), pooling kernel
// 5 -> 1 (no smoothing), budget count 1024 -> 4 per layer and head on
// average, so 8 entries over the 2 layers of the test geometry.
//
// The geometry FidelityTest.cpp builds it for; the kernels must form.
// RUN: kvc-opt %s "--kvc-specialize=layers=2 q-heads=2 kv-heads=1 head-dim=4 dtype=f32" --kvc-form-kernels | FileCheck %s
// CHECK-LABEL: kvc.policy @snapkv_global geometry #kvc.geometry<layers = 2, q_heads = 2, kv_heads = 1, head_dim = 4, dtype = f32> {
// CHECK:         kvc.kernel prefill
// CHECK:         kvc.kernel select
// CHECK:         kvc.kernel decode

kvc.policy @snapkv_global {
  kvc.phase after_prefill {
    %window = kvc.attn_window size 2
    %pooled = kvc.pool avg %window kernel 1 : !kvc.score<query>
    %group = kvc.group_reduce mean %pooled
    %score = kvc.protect %group sinks 0 recent 2 : !kvc.score<kv_head>
    %budget = kvc.budget_uniform count 4
    %total = kvc.budget_global %budget, %score
    %keep = kvc.topk %score, %total tie recent : !kvc.score<kv_head>
    kvc.evict %keep
  }
}
