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

// -----

kvc.policy @mixed_at_decode geometry #kvc.geometry<layers = 2, q_heads = 4, kv_heads = 2, head_dim = 64, dtype = f16> {
  kvc.storage key #kvc.format<int8, per_token> value #kvc.format<int8, per_token>
  kvc.phase over_budget {
    %a = kvc.attn_accumulate decay 1.0
    %g = kvc.group_reduce mean %a
    // expected-error @below {{assigns formats when the prompt is gathered; it needs the 'after_prefill' phase, not 'over_budget' (entries are not re-encoded during decode)}}
    kvc.mixed_precision %g high #kvc.format<int8, per_token> low #kvc.format<int2, per_token, group = 32> fraction 0.2 : !kvc.score<kv_head>
  }
}

// -----

kvc.policy @mixed_high_not_storage geometry #kvc.geometry<layers = 2, q_heads = 4, kv_heads = 2, head_dim = 64, dtype = f16> {
  kvc.storage key #kvc.format<fp8_e4m3, per_token> value #kvc.format<fp8_e4m3, per_token>
  kvc.phase after_prefill {
    %a = kvc.attn_accumulate decay 1.0
    %g = kvc.group_reduce mean %a
    // expected-error @below {{high format #kvc.format<int8, per_token> must be the storage format of keys and values (#kvc.format<fp8_e4m3, per_token> / #kvc.format<fp8_e4m3, per_token>), which new entries use}}
    kvc.mixed_precision %g high #kvc.format<int8, per_token> low #kvc.format<int2, per_token, group = 32> fraction 0.2 : !kvc.score<kv_head>
  }
}

// -----

kvc.policy @mixed_low_per_channel geometry #kvc.geometry<layers = 2, q_heads = 4, kv_heads = 2, head_dim = 64, dtype = f16> {
  kvc.storage key #kvc.format<int8, per_token> value #kvc.format<int8, per_token>
  kvc.phase after_prefill {
    %a = kvc.attn_accumulate decay 1.0
    %g = kvc.group_reduce mean %a
    // expected-error @below {{low format #kvc.format<int2, per_channel, group = 32> has no runtime page class; the low class is int2 or int4 per token in groups of channels}}
    kvc.mixed_precision %g high #kvc.format<int8, per_token> low #kvc.format<int2, per_channel, group = 32> fraction 0.2 : !kvc.score<kv_head>
  }
}

// -----

kvc.policy @mixed_twice geometry #kvc.geometry<layers = 2, q_heads = 4, kv_heads = 2, head_dim = 64, dtype = f16> {
  kvc.storage key #kvc.format<int8, per_token> value #kvc.format<int8, per_token>
  kvc.phase after_prefill {
    %a = kvc.attn_accumulate decay 1.0
    %g = kvc.group_reduce mean %a
    kvc.mixed_precision %g high #kvc.format<int8, per_token> low #kvc.format<int2, per_token, group = 32> fraction 0.2 : !kvc.score<kv_head>
    // expected-error @below {{a phase assigns formats once}}
    kvc.mixed_precision %g high #kvc.format<int8, per_token> low #kvc.format<int4, per_token, group = 32> fraction 0.5 : !kvc.score<kv_head>
  }
}
