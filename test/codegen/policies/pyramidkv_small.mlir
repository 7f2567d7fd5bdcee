// PyramidKV (pyramidkv.mlir) with a capacity of 256 so that the test prompts
// of about a thousand tokens reach the pyramid branch of the budget rule.
//
// RUN: kvc-opt %s | FileCheck %s
// CHECK: kvc.budget_pyramid capacity 256 window 8 beta 20

kvc.policy @pyramidkv_small {
  kvc.phase after_prefill {
    %window = kvc.attn_window size 8
    %pooled = kvc.pool max %window kernel 7 : !kvc.score<query>
    %group = kvc.group_reduce mean %pooled
    %score = kvc.protect %group sinks 0 recent 8 : !kvc.score<kv_head>
    %budget = kvc.budget_pyramid capacity 256 window 8 beta 20
    %keep = kvc.topk %score, %budget tie recent : !kvc.score<kv_head>
    kvc.evict %keep
  }
}
