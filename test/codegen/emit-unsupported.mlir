// Storage formats and stages the CPU backend has no code for are located
// errors, never silently dropped.
//
// RUN: rm -rf %t && mkdir -p %t
// RUN: kvc-opt %s --split-input-file --kvc-specialize=model=smollm2-135m --kvc-form-kernels --kvc-emit="target=cpu output-dir=%t" --verify-diagnostics -o /dev/null

kvc.policy @mixed_kinds {
  // expected-error @below {{storage formats #kvc.format<int4, per_channel, group = 32> / #kvc.format<int2, per_token, group = 32> have no runtime format: the runtime stores keys and values of a context in one format kind}}
  kvc.storage key #kvc.format<int4, per_channel, group = 32> value #kvc.format<int2, per_token, group = 32> residual 128
}

// -----

kvc.policy @per_token_keys {
  // expected-error @below {{have no runtime format: low-bit storage is KIVI's: per-channel keys and per-token values with one group size}}
  kvc.storage key #kvc.format<int2, per_token, group = 32> value #kvc.format<int2, per_token, group = 32>
}

// -----

kvc.policy @key_norm_at_decode {
  kvc.phase every_step {
    // expected-error @below {{'kvc.key_norm' op is not supported by the cpu emitter in a decode kernel yet}}
    %n = kvc.key_norm
    %b = kvc.budget_uniform count 64
    %k = kvc.topk %n, %b tie recent : !kvc.score<kv_head>
    kvc.evict %k
  }
}

// -----

kvc.policy @merge_at_decode {
  kvc.phase every_step {
    %a = kvc.attn_accumulate decay 1.0
    %g = kvc.group_reduce mean %a
    %b = kvc.budget_uniform count 64
    %k = kvc.topk %g, %b tie recent : !kvc.score<kv_head>
    // expected-error @below {{'kvc.merge_nearest' op is not supported by the cpu emitter in a decode kernel yet}}
    kvc.merge_nearest %k weight sim_norm
  }
}

// -----

kvc.policy @cam_without_window {
  kvc.phase after_prefill {
    %a = kvc.attn_accumulate decay 1.0
    %g = kvc.group_reduce mean %a
    %b = kvc.budget_uniform count 64
    %k = kvc.topk %g, %b tie recent : !kvc.score<kv_head>
    // expected-error @below {{'kvc.merge_cam' op is not supported by the cpu emitter in a prefill kernel yet: CaM reads a window attention statistic}}
    kvc.merge_cam %k span 4
  }
}
