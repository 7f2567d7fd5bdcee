// PyramidKV + AdaKV (pyramidkv_adakv.mlir) with a capacity of 256 so that
// the test prompts reach the pyramid branch of the budget rule.
//
// RUN: kvc-opt %s | FileCheck %s
// CHECK: kvc.budget_adaptive %{{.+}}, %{{.+}} alpha 2.000000e-01

kvc.policy @pyramidkv_small_adakv {
  kvc.phase after_prefill {
    %window = kvc.attn_window size 8
    %pooled = kvc.pool max %window kernel 7 : !kvc.score<query>
    %group = kvc.group_reduce mean %pooled
    %score = kvc.protect %group sinks 0 recent 8 : !kvc.score<kv_head>
    %base = kvc.budget_pyramid capacity 256 window 8 beta 20
    %budget = kvc.budget_adaptive %base, %score alpha 0.2
    %keep = kvc.topk %score, %budget tie recent : !kvc.score<kv_head>
    kvc.evict %keep
  }
}
