// Mirrors policies/pyramidkv_adakv.mlir, scaled for a hand-worked case:
// window 8 -> 4 (attn_window, protect recent and the budget's window),
// pooling kernel 7 -> 3 (a kernel may not be wider than the window),
// capacity 2048 -> 12, beta 20 -> 4. alpha 0.2 is unchanged.
//
// The geometry FidelityTest.cpp builds it for; the kernels must form.
// RUN: kvc-opt %s "--kvc-specialize=layers=2 q-heads=2 kv-heads=2 head-dim=4 dtype=f32" --kvc-form-kernels | FileCheck %s
// CHECK-LABEL: kvc.policy @pyramidkv_adakv geometry #kvc.geometry<layers = 2, q_heads = 2, kv_heads = 2, head_dim = 4, dtype = f32> {
// CHECK:         kvc.kernel prefill
// CHECK:         kvc.kernel decode

kvc.policy @pyramidkv_adakv {
  kvc.phase after_prefill {
    %window = kvc.attn_window size 4
    %pooled = kvc.pool max %window kernel 3 : !kvc.score<query>
    %group = kvc.group_reduce mean %pooled
    %score = kvc.protect %group sinks 0 recent 4 : !kvc.score<kv_head>
    %base = kvc.budget_pyramid capacity 12 window 4 beta 4
    %budget = kvc.budget_adaptive %base, %score alpha 0.2
    %keep = kvc.topk %score, %budget tie recent : !kvc.score<kv_head>
    kvc.evict %keep
  }
}
