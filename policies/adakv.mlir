// AdaKV: "Ada-KV: Optimizing KV Cache Eviction by Adaptive Budget
// Allocation for Efficient LLM Inference" (Feng et al., 2024), over SnapKV
// scores (snapkv.mlir: w = 64, average pooling of kernel 5, mean over the
// GQA group, window protected).
//
// A layer keeps heads x 1024 entries, but not 1024 per head: every head
// first keeps its top alpha * 1024 entries (alpha = 0.2, the paper's safety
// share), then the rest of the layer's budget goes to the best remaining
// scores of any head, so heads with concentrated attention give entries to
// heads with dispersed attention.
//
// RUN: kvc-opt %s | FileCheck %s
// RUN: kvc-opt %s --mlir-print-op-generic | kvc-opt | FileCheck %s

// CHECK-LABEL: kvc.policy @adakv {
// CHECK:         %[[B:.+]] = kvc.budget_uniform count 1024
// CHECK-NEXT:    %[[A:.+]] = kvc.budget_adaptive %[[B]], %[[S:.+]] alpha 2.000000e-01

kvc.policy @adakv {
  kvc.phase after_prefill {
    %window = kvc.attn_window size 64
    %pooled = kvc.pool avg %window kernel 5 : !kvc.score<query>
    %group = kvc.group_reduce mean %pooled
    %score = kvc.protect %group sinks 0 recent 64 : !kvc.score<kv_head>
    %base = kvc.budget_uniform count 1024
    %budget = kvc.budget_adaptive %base, %score alpha 0.2
    %keep = kvc.topk %score, %budget tie recent : !kvc.score<kv_head>
    kvc.evict %keep
  }
}
