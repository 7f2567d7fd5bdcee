// D2O: "D2O: Dynamic Discriminative Operations for Efficient Long-Context
// Inference of Large Language Models" (Wan et al., 2024).
//
// H2O's selection (accumulated attention, 512 recent of 1024 entries); each
// evicted key finds its most similar kept key, and merges into it when the
// similarity reaches the EMA threshold tau <- alpha * tau + beta *
// mean(max sim), as the similarity-weighted mean of keys and values (weight
// exp(sim), exp(1) for the kept entry). alpha = beta = 0.5, the paper's
// values. Variant: the merge runs when the prompt is compressed, from a
// threshold of 0; during decoding the policy evicts as H2O does
// (decode-time merging has no generated kernel yet).
//
// RUN: kvc-opt %s | FileCheck %s
// RUN: kvc-opt %s --mlir-print-op-generic | kvc-opt | FileCheck %s

// CHECK-LABEL: kvc.policy @d2o {
// CHECK:           kvc.merge_d2o %{{.+}} alpha 5.000000e-01 beta 5.000000e-01

kvc.policy @d2o {
  kvc.phase after_prefill {
    %attn = kvc.attn_accumulate decay 1.0
    %group = kvc.group_reduce mean %attn
    %score = kvc.protect %group sinks 0 recent 512 : !kvc.score<kv_head>
    %budget = kvc.budget_uniform count 1024
    %keep = kvc.topk %score, %budget tie recent : !kvc.score<kv_head>
    kvc.merge_d2o %keep alpha 0.5 beta 0.5
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
