// RPC (policies/rpc.mlir) with a period and selector window of 2 decode
// positions, so that the four decode steps of the oracle comparison
// compress twice: at positions 1101 and 1103 of a 1100-token prompt.
//
// RUN: kvc-opt %s --kvc-specialize=model=smollm2-135m --kvc-form-kernels | FileCheck %s

// CHECK: kvc.kernel decode for every_n period 2 {
// CHECK:   kvc.attention_pass output window 2

kvc.policy @rpc_small {
  kvc.phase every_n period 2 {
    %window = kvc.attn_window size 2
    %group = kvc.group_reduce mean %window
    %score = kvc.protect %group sinks 0 recent 2 : !kvc.score<kv_head>
    %budget = kvc.budget_uniform count 1024
    %keep = kvc.topk %score, %budget tie recent : !kvc.score<kv_head>
    kvc.evict %keep
  }
}
