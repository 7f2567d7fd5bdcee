// Statistics the kernels cannot produce are located errors.
//
// RUN: kvc-opt %s --split-input-file --kvc-infer-statistics --verify-diagnostics

kvc.policy @max_state {
  kvc.phase every_step {
    // expected-error @below {{accumulated attention must be reduced over its GQA group with mean or sum before any other use: the state kept with each entry is per kv-head}}
    %a = kvc.attn_accumulate decay 0.5
    %g = kvc.group_reduce max %a
    %b = kvc.budget_uniform count 8
    %k = kvc.topk %g, %b tie recent : !kvc.score<kv_head>
    kvc.evict %k
  }
}

// -----

kvc.policy @window_at_decode {
  kvc.phase over_budget {
    // expected-error @below {{needs a window of 16 queries, but a 'over_budget' phase also runs at decode, where only the current query is seen}}
    %w = kvc.attn_window size 16
    %g = kvc.group_reduce mean %w
    %b = kvc.budget_uniform count 8
    %k = kvc.topk %g, %b tie recent : !kvc.score<kv_head>
    kvc.evict %k
  }
}
