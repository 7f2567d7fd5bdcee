// H2O + merge into nearest: H2O's heavy hitters and recent window
// (h2o.mlir: accumulated attention, mean over the GQA group, 512 recent of
// 1024 entries), with the prompt entries H2O evicts merged into their most
// similar kept entry (merge_nearest.mlir's rule) instead of dropped.
//
// Variant: merging happens when the prompt is compressed; during decoding
// the policy keeps accumulating attention and evicts one entry per step as
// H2O does (decode-time merging has no generated kernel yet).
//
// RUN: kvc-opt %s | FileCheck %s
// RUN: kvc-opt %s --mlir-print-op-generic | kvc-opt | FileCheck %s

// CHECK-LABEL: kvc.policy @h2o_merge {
// CHECK:         kvc.phase after_prefill {
// CHECK:           kvc.merge_nearest %{{.+}} weight sim_norm
// CHECK:         kvc.phase every_step {
// CHECK:           kvc.evict

kvc.policy @h2o_merge {
  kvc.phase after_prefill {
    %attn = kvc.attn_accumulate decay 1.0
    %group = kvc.group_reduce mean %attn
    %score = kvc.protect %group sinks 0 recent 512 : !kvc.score<kv_head>
    %budget = kvc.budget_uniform count 1024
    %keep = kvc.topk %score, %budget tie recent : !kvc.score<kv_head>
    kvc.merge_nearest %keep weight sim_norm
  }
  kvc.phase every_step {
    %attn = kvc.attn_accumulate decay 1.0
    %group = kvc.group_reduce mean %attn
    %score = kvc.protect %group sinks 0 recent 512 : !kvc.score<kv_head>
    %budget = kvc.budget_uniform count 1024
    %keep = kvc.topk %score, %budget tie recent : !kvc.score<kv_head>
    kvc.evict %keep
  }
}
