// Merge into nearest: the reference press library's merging of evicted
// entries into kept ones, here on SnapKV's selection (snapkv.mlir defaults:
// w = 64, average pooling of kernel 5, 1024 entries).
//
// Each evicted value goes to the kept entry whose key is most
// cosine-similar, with weight w = max(sim, 0) * ||v_e|| / (||v_e|| +
// ||v_t||), and v_t <- (v_t + sum w v_e) / (1 + sum w); keys are left as they
// are, which keeps them valid under RoPE. Merging happens once, after
// prefill.
//
// RUN: kvc-opt %s | FileCheck %s
// RUN: kvc-opt %s --mlir-print-op-generic | kvc-opt | FileCheck %s

// CHECK-LABEL: kvc.policy @merge_nearest {
// CHECK:         %[[K:.+]] = kvc.topk
// CHECK-NEXT:    kvc.merge_nearest %[[K]] weight sim_norm

kvc.policy @merge_nearest {
  kvc.phase after_prefill {
    %window = kvc.attn_window size 64
    %pooled = kvc.pool avg %window kernel 5 : !kvc.score<query>
    %group = kvc.group_reduce mean %pooled
    %score = kvc.protect %group sinks 0 recent 64 : !kvc.score<kv_head>
    %budget = kvc.budget_uniform count 1024
    %keep = kvc.topk %score, %budget tie recent : !kvc.score<kv_head>
    kvc.merge_nearest %keep weight sim_norm
  }
}
