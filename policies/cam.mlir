// CaM: "CaM: Cache Merging for Memory-efficient LLMs Inference" (Zhang et
// al., 2024).
//
// Evicted values are merged into the next m kept entries with probability
// p = clamp(A_e / mean(A over the attention window), 0, 1), A the attention
// the entry receives; values only. Variant: on SnapKV's selection
// (snapkv.mlir: w = 64, average pooling of kernel 5, 1024 entries), A = the
// window attention averaged over the GQA group, normalized by its mean over
// the entries the window observes (those before it), m = 4, and the merge
// adds the expected value p * v_e / m (deterministic) instead of sampling
// the Bernoulli mask.
//
// RUN: kvc-opt %s | FileCheck %s
// RUN: kvc-opt %s --mlir-print-op-generic | kvc-opt | FileCheck %s

// CHECK-LABEL: kvc.policy @cam {
// CHECK:           kvc.merge_cam %{{.+}} span 4

kvc.policy @cam {
  kvc.phase after_prefill {
    %window = kvc.attn_window size 64
    %pooled = kvc.pool avg %window kernel 5 : !kvc.score<query>
    %group = kvc.group_reduce mean %pooled
    %score = kvc.protect %group sinks 0 recent 64 : !kvc.score<kv_head>
    %budget = kvc.budget_uniform count 1024
    %keep = kvc.topk %score, %budget tie recent : !kvc.score<kv_head>
    kvc.merge_cam %keep span 4
  }
}
