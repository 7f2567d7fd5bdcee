// Mirrors policies/snapkv_maxpool.mlir, scaled for a hand-worked case:
// window 8 -> 4, recent 8 -> 4, pooling kernel 7 -> 3 (a kernel may not be
// wider than the window), budget count 1024 -> 8.
//
// The geometry FidelityTest.cpp builds it for; the kernels must form.
// RUN: kvc-opt %s "--kvc-specialize=layers=1 q-heads=2 kv-heads=1 head-dim=4 dtype=f32" --kvc-form-kernels | FileCheck %s
// CHECK-LABEL: kvc.policy @snapkv_maxpool geometry #kvc.geometry<layers = 1, q_heads = 2, kv_heads = 1, head_dim = 4, dtype = f32> {
// CHECK:         kvc.kernel prefill
// CHECK:         kvc.kernel decode

kvc.policy @snapkv_maxpool {
  kvc.phase after_prefill {
    %window = kvc.attn_window size 4
    %pooled = kvc.pool max %window kernel 3 : !kvc.score<query>
    %group = kvc.group_reduce mean %pooled
    %score = kvc.protect %group sinks 0 recent 4 : !kvc.score<kv_head>
    %budget = kvc.budget_uniform count 8
    %keep = kvc.topk %score, %budget tie recent : !kvc.score<kv_head>
    kvc.evict %keep
  }
}
