// Mirrors policies/knorm.mlir, scaled for a hand-worked case: budget count
// 1024 -> 5.
//
// The geometry FidelityTest.cpp builds it for; the kernels must form.
// RUN: kvc-opt %s "--kvc-specialize=layers=1 q-heads=2 kv-heads=1 head-dim=4 dtype=f32" --kvc-form-kernels | FileCheck %s
// CHECK-LABEL: kvc.policy @knorm geometry #kvc.geometry<layers = 1, q_heads = 2, kv_heads = 1, head_dim = 4, dtype = f32> {
// CHECK:         kvc.kernel prefill
// CHECK:         kvc.kernel decode

kvc.policy @knorm {
  kvc.phase after_prefill {
    %norm = kvc.key_norm
    %score = kvc.combine sum %norm weights [-1.0] : !kvc.score<kv_head>
    %budget = kvc.budget_uniform count 5
    %keep = kvc.topk %score, %budget tie recent : !kvc.score<kv_head>
    kvc.evict %keep
  }
}
