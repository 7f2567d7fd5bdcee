// Mirrors policies/fp8.mlir; it has no size constants, so nothing changed.
//
// The geometry FidelityTest.cpp builds it for; the kernels must form.
// RUN: kvc-opt %s "--kvc-specialize=layers=1 q-heads=2 kv-heads=1 head-dim=4 dtype=f32" --kvc-form-kernels | FileCheck %s
// CHECK-LABEL: kvc.policy @fp8 geometry #kvc.geometry<layers = 1, q_heads = 2, kv_heads = 1, head_dim = 4, dtype = f32> {
// CHECK:         kvc.kernel prefill
// CHECK:         kvc.kernel decode

kvc.policy @fp8 {
  kvc.storage key #kvc.format<fp8_e4m3, per_token>
              value #kvc.format<fp8_e4m3, per_token>
}
