// kvc-infer-statistics: which statistics each phase reads and which kernel
// produces them.
//
// RUN: kvc-opt %s --split-input-file --kvc-infer-statistics | FileCheck %s

// SnapKV reads a window of 64 prompt queries, produced by the prefill kernel.
// CHECK-LABEL: kvc.policy @snapkv
// CHECK:         kvc.phase after_prefill attributes {statistics = [{granularity = "query", kernel = "prefill", name = "attention.window", queries = 64 : i64, state = false}]}
kvc.policy @snapkv {
  kvc.phase after_prefill {
    %w = kvc.attn_window size 64
    %p = kvc.pool avg %w kernel 5 : !kvc.score<query>
    %g = kvc.group_reduce mean %p
    %b = kvc.budget_uniform count 1024
    %k = kvc.topk %g, %b tie recent : !kvc.score<kv_head>
    kvc.evict %k
  }
}

// -----

// H2O keeps the accumulated attention as per-entry state, reduced over the
// group by the attention pass, in both kernels.
// CHECK-LABEL: kvc.policy @h2o
// CHECK:         kvc.phase over_budget attributes {statistics = [{decay = 1.000000e+00 : f64, granularity = "kv_head", kernel = "prefill+decode", name = "attention.accumulated", reduce = "mean", state = true, visible_normalized = false}]}
kvc.policy @h2o {
  kvc.phase over_budget {
    %a = kvc.attn_accumulate decay 1.0
    %g = kvc.group_reduce mean %a
    %b = kvc.budget_uniform count 1024
    %k = kvc.topk %g, %b tie recent : !kvc.score<kv_head>
    kvc.evict %k
  }
}

// -----

// Key and value features and positions come from the pass over keys and
// values; the last query from the decode kernel.
// CHECK-LABEL: kvc.policy @features
// CHECK:         kvc.phase every_step attributes {statistics = [{granularity = "query", kernel = "decode", name = "attention.last", state = false}, {granularity = "kv_head", kernel = "decode", name = "key.norm", state = false}, {granularity = "kv_head", kernel = "decode", name = "key.diversity", state = false}, {granularity = "kv_head", kernel = "decode", name = "value.norm", p = 1 : i64, state = false}, {granularity = "kv_head", kernel = "decode", name = "entry.position", state = false}]}
kvc.policy @features {
  kvc.phase every_step {
    %l = kvc.attn_last
    %g = kvc.group_reduce max %l
    %n = kvc.key_norm
    %d = kvc.key_diversity
    %v = kvc.value_norm p 1
    %r = kvc.recency
    %c = kvc.combine sum %g, %n, %d, %v, %r : !kvc.score<kv_head>
    %b = kvc.budget_uniform count 8
    %k = kvc.topk %c, %b tie recent : !kvc.score<kv_head>
    kvc.evict %k
  }
}

// -----

// Scissorhands' importance bits: state kept with each entry, produced by
// both kernels of an over_budget phase.
// CHECK-LABEL: kvc.policy @persistent
// CHECK:         kvc.phase over_budget attributes {statistics = [{granularity = "kv_head", history = 8 : i64, kernel = "prefill+decode", name = "attention.persistence", reduce = "max", state = true, threshold = 5.000000e-02 : f64}]}
kvc.policy @persistent {
  kvc.phase over_budget {
    %c = kvc.attn_persistence threshold 0.05 history 8 reduce max
    %b = kvc.budget_uniform count 64
    %k = kvc.topk %c, %b tie recent : !kvc.score<kv_head>
    kvc.evict %k
  }
}

// -----

// RPC's selector window is a decode statistic of a periodic phase, summed
// into each entry's score state.
// CHECK-LABEL: kvc.policy @periodic
// CHECK:         kvc.phase every_n period 16 attributes {statistics = [{granularity = "query", kernel = "decode", name = "attention.window", queries = 4 : i64, state = true}]}
kvc.policy @periodic {
  kvc.phase every_n period 16 {
    %w = kvc.attn_window size 4
    %g = kvc.group_reduce mean %w
    %b = kvc.budget_uniform count 64
    %k = kvc.topk %g, %b tie recent : !kvc.score<kv_head>
    kvc.evict %k
  }
}
