// Mirrors policies/duo_attention.mlir, scaled for a hand-worked case: sinks
// 4 -> 2 (protect and head classes), recent 256 -> 4, and the head table
// 30x3 -> 2x1 for a 2-layer, 1-kv-head geometry: layer 0 is a retrieval
// head, layer 1 a streaming head.
//
// The geometry FidelityTest.cpp builds it for; the kernels must form.
// RUN: kvc-opt %s "--kvc-specialize=layers=2 q-heads=2 kv-heads=1 head-dim=4 dtype=f32" --kvc-form-kernels | FileCheck %s
// CHECK-LABEL: kvc.policy @duo_attention geometry #kvc.geometry<layers = 2, q_heads = 2, kv_heads = 1, head_dim = 4, dtype = f32> {
// CHECK:         kvc.kernel prefill
// CHECK:         kvc.kernel decode

kvc.policy @duo_attention {
  kvc.phase over_budget {
    %position = kvc.recency
    %score = kvc.protect %position sinks 2 recent 0 : !kvc.score<kv_head>
    %budget = kvc.budget_head_classes table dense<[[1], [0]]> : tensor<2x1xi8> sinks 2 recent 4
    %keep = kvc.topk %score, %budget tie recent : !kvc.score<kv_head>
    kvc.evict %keep
  }
}
