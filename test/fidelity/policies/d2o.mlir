// Mirrors policies/d2o.mlir, scaled for a hand-worked case: recent 512 -> 3,
// budget count 1024 -> 6, in both phases. alpha = beta = 0.5 unchanged.
//
// The geometry FidelityTest.cpp builds it for; the kernels must form.
// RUN: kvc-opt %s "--kvc-specialize=layers=1 q-heads=2 kv-heads=1 head-dim=4 dtype=f32" --kvc-form-kernels | FileCheck %s
// CHECK-LABEL: kvc.policy @d2o geometry #kvc.geometry<layers = 1, q_heads = 2, kv_heads = 1, head_dim = 4, dtype = f32> {
// CHECK:         kvc.kernel prefill
// CHECK:         kvc.kernel decode

kvc.policy @d2o {
  kvc.phase after_prefill {
    %attn = kvc.attn_accumulate decay 1.0
    %group = kvc.group_reduce mean %attn
    %score = kvc.protect %group sinks 0 recent 3 : !kvc.score<kv_head>
    %budget = kvc.budget_uniform count 6
    %keep = kvc.topk %score, %budget tie recent : !kvc.score<kv_head>
    kvc.merge_d2o %keep alpha 0.5 beta 0.5
  }
  kvc.phase every_step {
    %attn = kvc.attn_accumulate decay 1.0
    %group = kvc.group_reduce mean %attn
    %score = kvc.protect %group sinks 0 recent 3 : !kvc.score<kv_head>
    %budget = kvc.budget_uniform count 6
    %keep = kvc.topk %score, %budget tie recent : !kvc.score<kv_head>
    kvc.evict %keep
  }
}
