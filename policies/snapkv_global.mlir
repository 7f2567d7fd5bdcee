// Global budget over SnapKV scores: the cross-layer allocation of KVzip
// ("KVzip: Query-Agnostic KV Cache Compression with Context Reconstruction",
// Kim et al., 2025) applied to SnapKV's observation-window scores.
//
// One top-k over every entry of every layer and kv-head keeps the whole
// model's budget, so layers and heads whose attention is concentrated give
// room to those whose attention is spread out; they end with different
// counts. Variant: KVzip's allocation, not its scores: KVzip scores entries
// by the attention of a context-reconstruction pass, which needs the
// model's forward pass; here the scores are SnapKV's (policies/snapkv.mlir:
// window of 64 queries, average pooling of kernel 5, mean over the group,
// the window itself always kept). The budget is 1024 entries per layer and
// kv-head on average: 1024 x layers x kv-heads in total, ties toward the
// more recent entry, then the later layer and head.
//
// The selection needs every layer's scores, so kvc-form-kernels splits the
// phase: the prefill kernel stores each entry's score as its score state,
// and a `select` kernel (kvc_<policy>_cpu_select) that the engine calls
// once after the prefill of every layer ranks them all and evicts.
//
// RUN: kvc-opt %s | FileCheck %s
// RUN: kvc-opt %s | kvc-opt | FileCheck %s
// RUN: kvc-opt %s --mlir-print-op-generic | kvc-opt | FileCheck %s
// RUN: kvc-opt %s --kvc-specialize=model=smollm2-135m --kvc-form-kernels | FileCheck %s --check-prefix=KERNELS

// CHECK-LABEL: kvc.policy @snapkv_global {
// CHECK-NEXT:    kvc.phase after_prefill {
// CHECK-NEXT:      %[[W:.+]] = kvc.attn_window size 64
// CHECK-NEXT:      %[[P:.+]] = kvc.pool avg %[[W]] kernel 5 : !kvc.score<query>
// CHECK-NEXT:      %[[G:.+]] = kvc.group_reduce mean %[[P]]
// CHECK-NEXT:      %[[S:.+]] = kvc.protect %[[G]] sinks 0 recent 64 : !kvc.score<kv_head>
// CHECK-NEXT:      %[[B:.+]] = kvc.budget_uniform count 1024
// CHECK-NEXT:      %[[GB:.+]] = kvc.budget_global %[[B]], %[[S]]
// CHECK-NEXT:      %[[K:.+]] = kvc.topk %[[S]], %[[GB]] tie recent : !kvc.score<kv_head>
// CHECK-NEXT:      kvc.evict %[[K]]

// KERNELS:      kvc.kernel prefill for after_prefill {
// KERNELS-NEXT:   kvc.attention_pass output window 64
// KERNELS:        %[[S:.+]] = kvc.protect
// KERNELS-NEXT:   kvc.gather key #kvc.format<full> value #kvc.format<full> state %[[S]]
// KERNELS-NEXT: }
// KERNELS-NEXT: kvc.kernel select for after_prefill {
// KERNELS-NEXT:   %[[T:.+]] = kvc.score_state
// KERNELS-NEXT:   %[[B:.+]] = kvc.budget_uniform count 1024
// KERNELS-NEXT:   %[[GB:.+]] = kvc.budget_global %[[B]], %[[T]]
// KERNELS-NEXT:   %[[K:.+]] = kvc.topk %[[T]], %[[GB]] tie recent : !kvc.score<kv_head>
// KERNELS-NEXT:   kvc.evict %[[K]]
// KERNELS-NEXT: }
// KERNELS-NEXT: kvc.kernel decode {

kvc.policy @snapkv_global {
  kvc.phase after_prefill {
    %window = kvc.attn_window size 64
    %pooled = kvc.pool avg %window kernel 5 : !kvc.score<query>
    %group = kvc.group_reduce mean %pooled
    %score = kvc.protect %group sinks 0 recent 64 : !kvc.score<kv_head>
    %budget = kvc.budget_uniform count 1024
    %total = kvc.budget_global %budget, %score
    %keep = kvc.topk %score, %total tie recent : !kvc.score<kv_head>
    kvc.evict %keep
  }
}
