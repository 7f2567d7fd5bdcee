// Mirrors policies/snapkv_kivi2.mlir, scaled for a hand-worked case: group
// G 32 -> 4 (keys and values), residual R 128 -> 8, window 64 -> 4, recent
// 64 -> 4, pooling kernel 5 -> 3 (a kernel may not be wider than the
// window), budget count 1024 -> 10.
//
// The geometry FidelityTest.cpp builds it for; the kernels must form.
// RUN: kvc-opt %s "--kvc-specialize=layers=1 q-heads=2 kv-heads=1 head-dim=8 dtype=f32" --kvc-form-kernels | FileCheck %s
// CHECK-LABEL: kvc.policy @snapkv_kivi2 geometry #kvc.geometry<layers = 1, q_heads = 2, kv_heads = 1, head_dim = 8, dtype = f32> {
// CHECK:         kvc.kernel prefill
// CHECK:         kvc.kernel decode

kvc.policy @snapkv_kivi2 {
  kvc.storage key #kvc.format<int2, per_channel, group = 4>
              value #kvc.format<int2, per_token, group = 4> residual 8
  kvc.phase after_prefill {
    %window = kvc.attn_window size 4
    %pooled = kvc.pool avg %window kernel 3 : !kvc.score<query>
    %group = kvc.group_reduce mean %pooled
    %score = kvc.protect %group sinks 0 recent 4 : !kvc.score<kv_head>
    %budget = kvc.budget_uniform count 10
    %keep = kvc.topk %score, %budget tie recent : !kvc.score<kv_head>
    kvc.evict %keep
  }
}
