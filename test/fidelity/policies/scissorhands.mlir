// Mirrors policies/scissorhands.mlir, scaled for a hand-worked case:
// threshold 1/1024 -> 0.1, history 64 -> 4, recent 64 -> 2, budget count
// 1024 -> 6. The group reduction (mean) and the tie rule are unchanged.
//
// The geometry FidelityTest.cpp builds it for; the kernels must form.
// RUN: kvc-opt %s "--kvc-specialize=layers=1 q-heads=2 kv-heads=1 head-dim=4 dtype=f32" --kvc-form-kernels | FileCheck %s
// CHECK-LABEL: kvc.policy @scissorhands geometry #kvc.geometry<layers = 1, q_heads = 2, kv_heads = 1, head_dim = 4, dtype = f32> {
// CHECK:         kvc.kernel prefill
// CHECK:         kvc.kernel decode

kvc.policy @scissorhands {
  kvc.phase over_budget {
    %count = kvc.attn_persistence threshold 0.1 history 4 reduce mean
    %score = kvc.protect %count sinks 0 recent 2 : !kvc.score<kv_head>
    %budget = kvc.budget_uniform count 6
    %keep = kvc.topk %score, %budget tie recent : !kvc.score<kv_head>
    kvc.evict %keep
  }
}
