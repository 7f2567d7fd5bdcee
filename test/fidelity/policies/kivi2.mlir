// Mirrors policies/kivi2.mlir, scaled for a hand-worked case: group G 32 -> 4
// (keys and values), residual R 128 -> 8.
//
// The geometry FidelityTest.cpp builds it for; the kernels must form.
// RUN: kvc-opt %s "--kvc-specialize=layers=1 q-heads=2 kv-heads=1 head-dim=8 dtype=f32" --kvc-form-kernels | FileCheck %s
// CHECK-LABEL: kvc.policy @kivi2 geometry #kvc.geometry<layers = 1, q_heads = 2, kv_heads = 1, head_dim = 8, dtype = f32> {
// CHECK:         kvc.kernel prefill
// CHECK:         kvc.kernel decode

kvc.policy @kivi2 {
  kvc.storage key #kvc.format<int2, per_channel, group = 4>
              value #kvc.format<int2, per_token, group = 4> residual 8
}
