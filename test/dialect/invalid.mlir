// Every diagnostic of the kvc verifiers, one case per split.
//
// RUN: kvc-opt %s -split-input-file -verify-diagnostics

// expected-error @below {{full-precision format takes no axis or group}}
kvc.policy @p { kvc.storage key #kvc.format<full, per_token> value #kvc.format<full> }

// -----

// expected-error @below {{int2 format needs a per_channel or per_token axis}}
kvc.policy @p { kvc.storage key #kvc.format<int2> value #kvc.format<full> }

// -----

// expected-error @below {{int4 format needs a positive group size}}
kvc.policy @p { kvc.storage key #kvc.format<int4, per_token> value #kvc.format<full> }

// -----

// expected-error @below {{int8 format needs a per_token or per_channel axis}}
kvc.policy @p { kvc.storage key #kvc.format<int8, per_head> value #kvc.format<full> }

// -----

// expected-error @below {{fp8_e4m3 format takes no group}}
kvc.policy @p { kvc.storage key #kvc.format<fp8_e4m3, per_head, group = 32> value #kvc.format<full> }

// -----

// expected-error @below {{fp8_e4m3 format needs a per_head or per_token scale axis}}
kvc.policy @p { kvc.storage key #kvc.format<fp8_e4m3, per_channel> value #kvc.format<full> }

// -----

// expected-error @below {{q_heads (9) must be a multiple of kv_heads (2)}}
kvc.policy @p geometry #kvc.geometry<layers = 2, q_heads = 9, kv_heads = 2, head_dim = 64, dtype = f16> {
  kvc.storage key #kvc.format<full> value #kvc.format<int8, per_token>
}

// -----

// expected-error @below {{dtype must be f16, bf16 or f32, got 'i8'}}
kvc.policy @p geometry #kvc.geometry<layers = 2, q_heads = 4, kv_heads = 2, head_dim = 64, dtype = i8> {
  kvc.storage key #kvc.format<full> value #kvc.format<int8, per_token>
}

// -----

// expected-error @below {{geometry sizes must be positive}}
kvc.policy @p geometry #kvc.geometry<layers = 0, q_heads = 4, kv_heads = 2, head_dim = 64, dtype = f16> {
  kvc.storage key #kvc.format<full> value #kvc.format<int8, per_token>
}

// -----

kvc.policy @p geometry #kvc.geometry<layers = 2, q_heads = 4, kv_heads = 2, head_dim = 64, dtype = f16> {
  // expected-error @below {{value group size 48 does not divide the head dimension 64}}
  kvc.storage key #kvc.format<int2, per_channel, group = 32> value #kvc.format<int2, per_token, group = 48> residual 128
}

// -----

kvc.policy @p {
  // expected-error @below {{residual window 100 is not a multiple of the per-channel group 32}}
  kvc.storage key #kvc.format<int2, per_channel, group = 32> value #kvc.format<int2, per_token, group = 32> residual 100
}

// -----

kvc.policy @p {
  // expected-error @below {{residual window must not be negative, got -1}}
  kvc.storage key #kvc.format<int2, per_channel, group = 32> value #kvc.format<full> residual -1
}

// -----

kvc.policy @p {
  // expected-error @below {{residual window needs a quantized key or value format}}
  kvc.storage key #kvc.format<full> value #kvc.format<full> residual 128
}

// -----

kvc.policy @p {
  kvc.storage key #kvc.format<full> value #kvc.format<int8, per_token>
  // expected-error @below {{policy @p declares its storage twice}}
  kvc.storage key #kvc.format<full> value #kvc.format<int8, per_token>
}

// -----

// expected-error @below {{policy @p does nothing: it has no phase and no storage}}
kvc.policy @p {
}

// -----

kvc.policy @p {
  kvc.phase after_prefill {
    %w = kvc.attn_window size 32
    // expected-error @below {{pooling kernel must be odd and positive, got 4}}
    %p = kvc.pool avg %w kernel 4 : !kvc.score<query>
  }
}

// -----

kvc.policy @p {
  kvc.phase after_prefill {
    // expected-note @below {{window defined here}}
    %w = kvc.attn_window size 4
    // expected-error @below {{pooling kernel 7 is wider than the attention window 4}}
    %p = kvc.pool max %w kernel 7 : !kvc.score<query>
  }
}

// -----

kvc.policy @p {
  kvc.phase after_prefill {
    %w = kvc.attn_window size 64
    %g = kvc.group_reduce mean %w
    // expected-note @below {{protected entries defined here}}
    %s = kvc.protect %g sinks 4 recent 1096 : !kvc.score<kv_head>
    %b = kvc.budget_uniform count 1024
    // expected-error @below {{protects 1100 entries but the budget keeps only 1024}}
    %k = kvc.topk %s, %b tie recent : !kvc.score<kv_head>
    kvc.evict %k
  }
}

// -----

kvc.policy @p {
  kvc.phase over_budget {
    %n = kvc.key_norm
    %b = kvc.budget_uniform count 1024
    %k = kvc.topk %n, %b tie recent : !kvc.score<kv_head>
    // expected-error @below {{needs attention statistics, but the scores of this phase use none}}
    kvc.merge_cam %k span 4
  }
}

// -----

kvc.policy @p {
  kvc.phase every_step {
    // expected-error @below {{decay must be in (0, 1], got 1.5}}
    %a = kvc.attn_accumulate decay 1.5
  }
}

// -----

kvc.policy @p {
  kvc.phase every_step {
    // expected-error @below {{decay must be in (0, 1], got 0}}
    %a = kvc.attn_accumulate decay 0.0
  }
}

// -----

kvc.policy @p {
  kvc.phase every_step {
    // expected-error @below {{ratio must be in (0, 1), got 1}}
    %b = kvc.budget_uniform ratio 1.0
  }
}

// -----

kvc.policy @p {
  kvc.phase every_step {
    // expected-error @below {{needs exactly one of 'count' and 'ratio'}}
    %b = kvc.budget_uniform count 8 ratio 0.5
  }
}

// -----

kvc.policy @p {
  kvc.phase every_step {
    // expected-error @below {{count must be positive, got 0}}
    %b = kvc.budget_uniform count 0
  }
}

// -----

kvc.policy @p {
  kvc.phase after_prefill {
  }
  // expected-error @below {{duplicate 'after_prefill' phase in policy @p}}
  kvc.phase after_prefill {
  }
}

// -----

kvc.policy @p geometry #kvc.geometry<layers = 30, q_heads = 9, kv_heads = 3, head_dim = 64, dtype = f16> {
  kvc.phase over_budget {
    %n = kvc.recency
    // expected-error @below {{table of shape 'tensor<2x2xi8>' does not match the geometry: expected 30x3 (layers x kv_heads)}}
    %h = kvc.budget_head_classes table dense<[[1, 0], [0, 1]]> : tensor<2x2xi8> sinks 4 recent 64
    %k = kvc.topk %n, %h tie recent : !kvc.score<kv_head>
    kvc.evict %k
  }
}

// -----

kvc.policy @p {
  kvc.phase over_budget {
    // expected-error @below {{table must have rank 2 (layers x kv_heads), got 'tensor<4xi8>'}}
    %h = kvc.budget_head_classes table dense<[1, 0, 0, 1]> : tensor<4xi8> sinks 4 recent 64
  }
}

// -----

kvc.policy @p {
  kvc.phase over_budget {
    // expected-error @below {{table entries must be 0 (streaming) or 1 (retrieval), got 2}}
    %h = kvc.budget_head_classes table dense<[[1, 2]]> : tensor<1x2xi8> sinks 4 recent 64
  }
}

// -----

kvc.policy @p {
  kvc.phase over_budget {
    // expected-error @below {{streaming heads must keep at least one entry}}
    %h = kvc.budget_head_classes table dense<[[1, 0]]> : tensor<1x2xi8> sinks 0 recent 0
  }
}

// -----

kvc.policy @p {
  // expected-error @below {{'every_n' phase needs a period}}
  kvc.phase every_n {
  }
}

// -----

kvc.policy @p {
  // expected-error @below {{only an 'every_n' phase takes a period}}
  kvc.phase every_step period 4 {
  }
}

// -----

kvc.policy @p {
  // expected-error @below {{period must be positive, got 0}}
  kvc.phase every_n period 0 {
  }
}

// -----

kvc.policy @p {
  kvc.phase after_prefill {
    %w = kvc.attn_window size 32
    %b = kvc.budget_uniform count 64
    // expected-error @below {{needs kv_head or layer scores; reduce query-head scores with kvc.group_reduce first}}
    %k = kvc.topk %w, %b tie recent : !kvc.score<query>
    kvc.evict %k
  }
}

// -----

kvc.policy @p {
  kvc.phase after_prefill {
    %n = kvc.key_norm
    %b = kvc.budget_uniform count 64
    // expected-error @below {{selection is never applied; end the phase with kvc.evict or a kvc.merge_* op}}
    %k = kvc.topk %n, %b tie recent : !kvc.score<kv_head>
  }
}

// -----

kvc.policy @p {
  kvc.phase after_prefill {
    %n = kvc.key_norm
    %b = kvc.budget_uniform count 64
    %k = kvc.topk %n, %b tie recent : !kvc.score<kv_head>
    // expected-note @below {{first eviction action here}}
    kvc.evict %k
    // expected-error @below {{is the second eviction action of this phase}}
    kvc.merge_nearest %k weight sim_norm
  }
}

// -----

kvc.policy @p {
  kvc.phase every_step {
    // expected-error @below {{needs the last 16 queries, which no 'every_step' phase retains}}
    %w = kvc.attn_window size 16
  }
}

// -----

kvc.policy @p {
  kvc.phase after_prefill {
    // expected-error @below {{window size must be positive, got 0}}
    %w = kvc.attn_window size 0
  }
}

// -----

kvc.policy @p {
  kvc.phase after_prefill {
    // expected-error @below {{capacity 32 must exceed the window it protects (64)}}
    %b = kvc.budget_pyramid capacity 32 window 64 beta 20
  }
}

// -----

kvc.policy @p {
  kvc.phase after_prefill {
    // expected-error @below {{beta must be positive, got 0}}
    %b = kvc.budget_pyramid capacity 2048 window 8 beta 0
  }
}

// -----

kvc.policy @p {
  kvc.phase after_prefill {
    %n = kvc.key_norm
    %b = kvc.budget_uniform count 64
    // expected-error @below {{alpha must be in [0, 1], got 1.5}}
    %a = kvc.budget_adaptive %b, %n alpha 1.5
  }
}

// -----

kvc.policy @p {
  kvc.phase after_prefill {
    %b = kvc.budget_uniform count 64
    // expected-error @below {{table weights must be non-negative}}
    %h = kvc.budget_head_weights %b table dense<[[1.0, -2.0]]> : tensor<1x2xf32>
  }
}

// -----

kvc.policy @p {
  kvc.phase after_prefill {
    %b = kvc.budget_uniform count 64
    // expected-error @below {{table weights must not all be zero}}
    %h = kvc.budget_head_weights %b table dense<[[0.0, 0.0]]> : tensor<1x2xf32>
  }
}

// -----

kvc.policy @p {
  kvc.phase after_prefill {
    %b = kvc.budget_uniform count 64
    // expected-error @below {{temperatures tau1 and tau2 must be positive}}
    %c = kvc.budget_cake %b tau1 0.0 tau2 1.0
  }
}

// -----

kvc.policy @p {
  kvc.phase after_prefill {
    %n = kvc.key_norm
    %v = kvc.value_norm p 2
    // expected-error @below {{has 2 inputs but 1 weights}}
    %c = kvc.combine sum %n, %v weights [1.0] : !kvc.score<kv_head>
  }
}

// -----

kvc.policy @p {
  kvc.phase after_prefill {
    %n = kvc.key_norm
    %v = kvc.value_norm p 2
    // expected-error @below {{a product takes no weights}}
    %c = kvc.combine product %n, %v weights [1.0, 2.0] : !kvc.score<kv_head>
  }
}

// -----

kvc.policy @p {
  kvc.phase after_prefill {
    // expected-error @below {{p must be 1 or 2, got 3}}
    %v = kvc.value_norm p 3
  }
}

// -----

kvc.policy @p {
  kvc.phase every_step {
    // expected-error @below {{threshold must be in (0, 1), got 1.5}}
    %s = kvc.attn_persistence threshold 1.5 history 64 reduce mean
  }
}

// -----

kvc.policy @p {
  kvc.phase every_step {
    // expected-error @below {{history must be in [1, 64] steps, got 0}}
    %s = kvc.attn_persistence threshold 0.01 history 0 reduce mean
  }
}

// -----

kvc.policy @p {
  kvc.phase every_step {
    // expected-error @below {{history must be in [1, 64] steps, got 65}}
    %s = kvc.attn_persistence threshold 0.01 history 65 reduce max
  }
}

// -----

kvc.policy @p {
  kvc.phase every_step {
    // expected-error @below {{reduces the group with mean or max before the threshold}}
    %s = kvc.attn_persistence threshold 0.01 history 8 reduce sum
  }
}

// -----

kvc.policy @p {
  kvc.phase every_step {
    // expected-error @below {{lag must be positive, got -2}}
    %a = kvc.attn_accumulate decay 1.0 lag -2
  }
}

// -----

kvc.policy @p {
  kvc.phase after_prefill {
    // expected-error @below {{window and horizon must be positive}}
    %e = kvc.expected_attn window 0 horizon 512
  }
}

// -----

kvc.policy @p {
  kvc.phase after_prefill {
    %n = kvc.key_norm
    // expected-error @below {{fraction must be in (0, 1), got 1.5}}
    kvc.mixed_precision %n high #kvc.format<int8, per_token> low #kvc.format<int2, per_token, group = 32> fraction 1.5 : !kvc.score<kv_head>
  }
}

// -----

kvc.policy @p {
  kvc.phase after_prefill {
    %n = kvc.key_norm
    // expected-error @below {{high format must be more precise than the low format}}
    kvc.mixed_precision %n high #kvc.format<int2, per_token, group = 32> low #kvc.format<int4, per_token, group = 32> fraction 0.2 : !kvc.score<kv_head>
  }
}

// -----

kvc.policy @p {
  kvc.phase after_prefill {
    %n = kvc.key_norm
    %b = kvc.budget_uniform count 64
    %k = kvc.topk %n, %b tie recent : !kvc.score<kv_head>
    // expected-error @below {{alpha and beta must be in [0, 1]}}
    kvc.merge_d2o %k alpha 0.5 beta 2.0
  }
}

// -----

kvc.policy @p {
  kvc.phase after_prefill {
    %n = kvc.key_norm
    %b = kvc.budget_uniform count 64
    %k = kvc.topk %n, %b tie recent : !kvc.score<kv_head>
    // expected-error @below {{similarity threshold must be in [-1, 1], got 2}}
    kvc.merge_adjacent %k threshold 2.0 sigma 1.0
  }
}

// -----

kvc.policy @p {
  kvc.phase after_prefill {
    %a = kvc.attn_last
    %l = kvc.layer_reduce mean %a : !kvc.score<query>
    // expected-error @below {{input is already a layer score}}
    %l2 = kvc.layer_reduce mean %l : !kvc.score<layer>
  }
}

// -----

kvc.policy @p {
  kvc.phase after_prefill {
    %n = kvc.key_norm
    // expected-error @below {{protected counts must not be negative}}
    %p = kvc.protect %n sinks -1 recent 4 : !kvc.score<kv_head>
  }
}

// -----

kvc.policy @p {
  kvc.phase after_prefill {
    %n = kvc.key_norm
    // expected-error @below {{operand #0 must be !kvc.score<query>}}
    %g = "kvc.group_reduce"(%n) <{kind = 0 : i32}> : (!kvc.score<kv_head>) -> !kvc.score<kv_head>
  }
}

// -----

// expected-error @below {{expects parent op 'kvc.policy'}}
kvc.phase after_prefill {
}

// -----

kvc.policy @p {
  // expected-error @below {{is not allowed in a kvc.policy body; expected kvc.phase or kvc.storage}}
  "builtin.module"() ({
  ^bb0:
  }) : () -> ()
}

// -----

kvc.policy @gather_low_per_channel {
  kvc.kernel prefill {
    %a = kvc.attn_accumulate decay 1.0
    %g = kvc.group_reduce mean %a
    // expected-error @below {{low format #kvc.format<int2, per_channel, group = 32> is not int2 or int4 per token in groups of channels, the runtime's low page class}}
    kvc.gather key #kvc.format<int8, per_token> value #kvc.format<int8, per_token> low #kvc.format<int2, per_channel, group = 32> by %g fraction 0.2
  }
}

// -----

kvc.policy @gather_low_fraction {
  kvc.kernel prefill {
    %a = kvc.attn_accumulate decay 1.0
    %g = kvc.group_reduce mean %a
    // expected-error @below {{fraction must be in (0, 1), got 1.5}}
    kvc.gather key #kvc.format<int8, per_token> value #kvc.format<int8, per_token> low #kvc.format<int2, per_token, group = 32> by %g fraction 1.5
  }
}

// -----

kvc.policy @gather_low_not_lower {
  kvc.kernel prefill {
    %a = kvc.attn_accumulate decay 1.0
    %g = kvc.group_reduce mean %a
    // expected-error @below {{low format must be less precise than the storage formats}}
    kvc.gather key #kvc.format<int4, per_token, group = 32> value #kvc.format<int4, per_token, group = 32> low #kvc.format<int4, per_token, group = 32> by %g fraction 0.2
  }
}
