// The CUDA emitter rejects mixed precision combined with a merge of evicted
// prompt entries (the CPU backend lowers it), with a located error at the
// kvc.mixed_precision that the gather was formed from and a non-zero exit.
//
// RUN: rm -rf %t && mkdir -p %t
// RUN: not kvc-opt %s --kvc-specialize=model=smollm2-135m --kvc-form-kernels --kvc-emit="target=cuda output-dir=%t" -o /dev/null 2>&1 | FileCheck %s
// RUN: kvc-opt %s --kvc-specialize=model=smollm2-135m --kvc-form-kernels --kvc-emit="target=cpu output-dir=%t" -o /dev/null

// CHECK: cuda-emit-invalid-mixed.mlir:[[@LINE+11]]:5: error: 'kvc.gather' op mixed precision (a low page class) with a merge of evicted entries ('kvc.merge_nearest') has no CUDA lowering
kvc.policy @mixed_merge {
  kvc.storage key #kvc.format<int8, per_token>
              value #kvc.format<int8, per_token>
  kvc.phase after_prefill {
    %window = kvc.attn_window size 64
    %group = kvc.group_reduce mean %window
    %score = kvc.protect %group sinks 0 recent 64 : !kvc.score<kv_head>
    %budget = kvc.budget_uniform count 1024
    %keep = kvc.topk %score, %budget tie recent : !kvc.score<kv_head>
    kvc.merge_nearest %keep weight sim_norm
    kvc.mixed_precision %score high #kvc.format<int8, per_token>
        low #kvc.format<int2, per_token, group = 32> fraction 0.2
        : !kvc.score<kv_head>
  }
}
