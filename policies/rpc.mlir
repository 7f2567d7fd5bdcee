// RPC: "Reasoning Path Compression: Compressing Generation Trajectories for
// Efficient LLM Reasoning" (Song et al., 2025).
//
// Periodic decode-time compression for long generations: every P generated
// positions, every entry is scored by the attention it received from a
// selector window of the R most recent queries (mean over the window and
// over the GQA group), the selector window itself is kept, and the cache is
// cut back to its budget by top-k. The prompt is not compressed at prefill.
//
// Variant and defaults: P = 4096, R = 32 (the paper's setting for its
// reasoning models). The budget is a fixed 4096 entries per layer and
// kv-head, so the cache grows to 8192 entries between compressions and
// returns to 4096 after each; the paper's target grows with the generated
// length instead (one quarter of it, compression ratio 4). The period
// counts positions: the phase runs after the decode step of position p when
// (p + 1) mod P = 0, and the selector window is the queries of the R
// positions that end the period.
//
// RUN: kvc-opt %s | FileCheck %s
// RUN: kvc-opt %s | kvc-opt | FileCheck %s
// RUN: kvc-opt %s --mlir-print-op-generic | kvc-opt | FileCheck %s
// RUN: kvc-opt %s --kvc-specialize=model=smollm2-135m --kvc-form-kernels | FileCheck %s --check-prefix=KERNELS

// CHECK-LABEL: kvc.policy @rpc {
// CHECK-NEXT:    kvc.phase every_n period 4096 {
// CHECK-NEXT:      %[[W:.+]] = kvc.attn_window size 32
// CHECK-NEXT:      %[[G:.+]] = kvc.group_reduce mean %[[W]]
// CHECK-NEXT:      %[[P:.+]] = kvc.protect %[[G]] sinks 0 recent 32 : !kvc.score<kv_head>
// CHECK-NEXT:      %[[B:.+]] = kvc.budget_uniform count 4096
// CHECK-NEXT:      %[[K:.+]] = kvc.topk %[[P]], %[[B]] tie recent : !kvc.score<kv_head>
// CHECK-NEXT:      kvc.evict %[[K]]

// The prefill kernel only attends and gathers; the decode kernel folds the
// selector window into the pass over the cache and compresses every period.
// KERNELS:      kvc.kernel prefill {
// KERNELS-NEXT:   kvc.attention_pass output
// KERNELS-NEXT:   kvc.gather
// KERNELS:      kvc.kernel decode for every_n period 4096 {
// KERNELS-NEXT:   kvc.append
// KERNELS-NEXT:   kvc.attention_pass output window 32

kvc.policy @rpc {
  kvc.phase every_n period 4096 {
    %window = kvc.attn_window size 32
    %group = kvc.group_reduce mean %window
    %score = kvc.protect %group sinks 0 recent 32 : !kvc.score<kv_head>
    %budget = kvc.budget_uniform count 4096
    %keep = kvc.topk %score, %budget tie recent : !kvc.score<kv_head>
    kvc.evict %keep
  }
}
