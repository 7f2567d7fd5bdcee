// Mirrors policies/rpc.mlir, scaled for a hand-worked case: period 4096 ->
// 4, selector window 32 -> 2 (and the protected recent window with it),
// budget count 4096 -> 4.
//
// The geometry FidelityTest.cpp builds it for; the kernels must form.
// RUN: kvc-opt %s "--kvc-specialize=layers=1 q-heads=2 kv-heads=1 head-dim=4 dtype=f32" --kvc-form-kernels | FileCheck %s
// CHECK-LABEL: kvc.policy @rpc geometry #kvc.geometry<layers = 1, q_heads = 2, kv_heads = 1, head_dim = 4, dtype = f32> {
// CHECK:         kvc.kernel prefill
// CHECK:         kvc.kernel decode for every_n period 4

kvc.policy @rpc {
  kvc.phase every_n period 4 {
    %window = kvc.attn_window size 2
    %group = kvc.group_reduce mean %window
    %score = kvc.protect %group sinks 0 recent 2 : !kvc.score<kv_head>
    %budget = kvc.budget_uniform count 4
    %keep = kvc.topk %score, %budget tie recent : !kvc.score<kv_head>
    kvc.evict %keep
  }
}
