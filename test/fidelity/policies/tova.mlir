// Mirrors policies/tova.mlir, scaled for a hand-worked case: budget count
// 1024 -> 6.
//
// The geometry FidelityTest.cpp builds it for; the kernels must form.
// RUN: kvc-opt %s "--kvc-specialize=layers=1 q-heads=2 kv-heads=2 head-dim=4 dtype=f32" --kvc-form-kernels | FileCheck %s
// CHECK-LABEL: kvc.policy @tova geometry #kvc.geometry<layers = 1, q_heads = 2, kv_heads = 2, head_dim = 4, dtype = f32> {
// CHECK:         kvc.kernel prefill
// CHECK:         kvc.kernel decode

kvc.policy @tova {
  kvc.phase over_budget {
    %last = kvc.attn_last
    %layer = kvc.layer_reduce mean %last : !kvc.score<query>
    %budget = kvc.budget_uniform count 6
    %keep = kvc.topk %layer, %budget tie recent : !kvc.score<layer>
    kvc.evict %keep
  }
}
