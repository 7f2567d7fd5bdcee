// Policies kernel formation cannot handle are located errors.
//
// RUN: kvc-opt %s --split-input-file --kvc-form-kernels --verify-diagnostics

// expected-error @below {{'kvc.policy' op is not specialized to a model; run kvc-specialize first}}
kvc.policy @unspecialized {
  kvc.storage key #kvc.format<full> value #kvc.format<int8, per_token>
}

// -----

kvc.policy @periodic geometry #kvc.geometry<layers = 2, q_heads = 4, kv_heads = 2, head_dim = 64, dtype = f16> {
  kvc.phase every_n period 32 {
    // expected-error @below {{needs a window of 48 decode queries, more than the period of 32 steps between compressions}}
    %w = kvc.attn_window size 48
    %g = kvc.group_reduce mean %w
    %b = kvc.budget_uniform count 64
    %k = kvc.topk %g, %b tie recent : !kvc.score<kv_head>
    kvc.evict %k
  }
}

// -----

kvc.policy @two_decode_phases geometry #kvc.geometry<layers = 2, q_heads = 4, kv_heads = 2, head_dim = 64, dtype = f16> {
  // expected-note @below {{first phase here}}
  kvc.phase every_step {
    %r = kvc.recency
    %b = kvc.budget_uniform count 64
    %k = kvc.topk %r, %b tie recent : !kvc.score<kv_head>
    kvc.evict %k
  }
  // expected-error @below {{is the second phase that runs at decode; a kernel runs one phase}}
  kvc.phase over_budget {
    %r = kvc.recency
    %b = kvc.budget_uniform count 64
    %k = kvc.topk %r, %b tie recent : !kvc.score<kv_head>
    kvc.evict %k
  }
}

// -----

kvc.policy @global_at_decode geometry #kvc.geometry<layers = 2, q_heads = 4, kv_heads = 2, head_dim = 64, dtype = f16> {
  kvc.phase over_budget {
    %r = kvc.recency
    %b = kvc.budget_uniform count 64
    // expected-error @below {{selects across layers, which a kernel can do once every layer is prefilled; it needs an 'after_prefill' phase, not 'over_budget'}}
    %g = kvc.budget_global %b, %r
    %k = kvc.topk %r, %g tie recent : !kvc.score<kv_head>
    kvc.evict %k
  }
}

// -----

kvc.policy @global_other_score geometry #kvc.geometry<layers = 2, q_heads = 4, kv_heads = 2, head_dim = 64, dtype = f16> {
  kvc.phase after_prefill {
    %r = kvc.recency
    %n = kvc.key_norm
    %b = kvc.budget_uniform count 64
    // expected-error @below {{a global selection must rank by the score its budget reads and evict what it does not keep}}
    %g = kvc.budget_global %b, %r
    %k = kvc.topk %n, %g tie recent : !kvc.score<kv_head>
    kvc.evict %k
  }
}

// -----

kvc.policy @periodic_normalized geometry #kvc.geometry<layers = 2, q_heads = 4, kv_heads = 2, head_dim = 64, dtype = f16> {
  kvc.phase every_n period 32 {
    // expected-error @below {{cannot divide by the queries that saw an entry in a periodic phase: the window is kept as a running sum}}
    %w = kvc.attn_window size 8 visible_normalized
    %g = kvc.group_reduce mean %w
    %b = kvc.budget_uniform count 64
    %k = kvc.topk %g, %b tie recent : !kvc.score<kv_head>
    kvc.evict %k
  }
}
