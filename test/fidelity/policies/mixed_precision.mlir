// Mirrors policies/mixed_precision.mlir, scaled for a hand-worked case:
// recent 64 -> 1, fraction 0.2 -> 0.375 (3 of 8 entries), low group 32 -> 8
// (the head dim of the case). Ranking and formats unchanged.
//
// The geometry FidelityTest.cpp builds it for; the kernels must form.
// RUN: kvc-opt %s "--kvc-specialize=layers=1 q-heads=2 kv-heads=1 head-dim=8 dtype=f32" --kvc-form-kernels | FileCheck %s
// CHECK-LABEL: kvc.policy @mixed_precision geometry #kvc.geometry<layers = 1, q_heads = 2, kv_heads = 1, head_dim = 8, dtype = f32> {
// CHECK:         kvc.gather key #kvc.format<int8, per_token> value #kvc.format<int8, per_token> low #kvc.format<int2, per_token, group = 8> by %{{.+}} fraction 3.750000e-01
// CHECK:         kvc.kernel decode

kvc.policy @mixed_precision {
  kvc.storage key #kvc.format<int8, per_token>
              value #kvc.format<int8, per_token>
  kvc.phase after_prefill {
    %attn = kvc.attn_accumulate decay 1.0
    %group = kvc.group_reduce mean %attn
    %score = kvc.protect %group sinks 0 recent 1 : !kvc.score<kv_head>
    kvc.mixed_precision %score high #kvc.format<int8, per_token>
        low #kvc.format<int2, per_token, group = 8> fraction 0.375
        : !kvc.score<kv_head>
  }
}
