// Mirrors policies/streaming_llm.mlir, scaled for a hand-worked case:
// sinks 4 -> 2, budget count 1024 -> 6 (so r = 4 recent entries).
//
// The geometry FidelityTest.cpp builds it for; the kernels must form.
// RUN: kvc-opt %s "--kvc-specialize=layers=1 q-heads=2 kv-heads=1 head-dim=4 dtype=f32" --kvc-form-kernels | FileCheck %s
// CHECK-LABEL: kvc.policy @streaming_llm geometry #kvc.geometry<layers = 1, q_heads = 2, kv_heads = 1, head_dim = 4, dtype = f32> {
// CHECK:         kvc.kernel prefill
// CHECK:         kvc.kernel decode

kvc.policy @streaming_llm {
  kvc.phase over_budget {
    %position = kvc.recency
    %score = kvc.protect %position sinks 2 recent 0 : !kvc.score<kv_head>
    %budget = kvc.budget_uniform count 6
    %keep = kvc.topk %score, %budget tie recent : !kvc.score<kv_head>
    kvc.evict %keep
  }
}
