// Mirrors policies/value_aware.mlir, scaled for a hand-worked case: recent
// 64 -> 2, budget count 1024 -> 5. Decay 1 and the L1 norm are unchanged.
//
// The geometry FidelityTest.cpp builds it for; the kernels must form.
// RUN: kvc-opt %s "--kvc-specialize=layers=1 q-heads=2 kv-heads=1 head-dim=4 dtype=f32" --kvc-form-kernels | FileCheck %s
// CHECK-LABEL: kvc.policy @value_aware geometry #kvc.geometry<layers = 1, q_heads = 2, kv_heads = 1, head_dim = 4, dtype = f32> {
// CHECK:         kvc.kernel prefill
// CHECK:         kvc.kernel decode

kvc.policy @value_aware {
  kvc.phase after_prefill {
    %attn = kvc.attn_accumulate decay 1.0
    %group = kvc.group_reduce mean %attn
    %norm = kvc.value_norm p 1
    %product = kvc.combine product %group, %norm : !kvc.score<kv_head>
    %score = kvc.protect %product sinks 0 recent 2 : !kvc.score<kv_head>
    %budget = kvc.budget_uniform count 5
    %keep = kvc.topk %score, %budget tie recent : !kvc.score<kv_head>
    kvc.evict %keep
  }
}
