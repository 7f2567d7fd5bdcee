// Mirrors policies/keydiff.mlir, scaled for a hand-worked case: budget count
// 1024 -> 3.
//
// The geometry FidelityTest.cpp builds it for; the kernels must form.
// RUN: kvc-opt %s "--kvc-specialize=layers=1 q-heads=2 kv-heads=1 head-dim=4 dtype=f32" --kvc-form-kernels | FileCheck %s
// CHECK-LABEL: kvc.policy @keydiff geometry #kvc.geometry<layers = 1, q_heads = 2, kv_heads = 1, head_dim = 4, dtype = f32> {
// CHECK:         kvc.kernel prefill
// CHECK:         kvc.kernel decode

kvc.policy @keydiff {
  kvc.phase after_prefill {
    %diversity = kvc.key_diversity
    %budget = kvc.budget_uniform count 3
    %keep = kvc.topk %diversity, %budget tie recent : !kvc.score<kv_head>
    kvc.evict %keep
  }
}
