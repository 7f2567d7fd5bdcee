// kvc-form-kernels: the fusion decisions. Fused: one prefill kernel whose
// attention pass also produces the phase's statistics, one decode kernel that
// appends, attends with statistics and selects victims. Unfused: attention
// kernels produce outputs only and scoring kernels recompute the weights.
//
// RUN: kvc-opt %s --split-input-file --kvc-specialize=model=smollm2-135m --kvc-form-kernels | FileCheck %s --check-prefix=FUSED
// RUN: kvc-opt %s --split-input-file --kvc-specialize=model=smollm2-135m --kvc-form-kernels=unfused=1 | FileCheck %s --check-prefix=UNFUSED

// FUSED-LABEL: kvc.policy @snapkv_kivi
// FUSED-NEXT:    kvc.storage key #kvc.format<int2, per_channel, group = 32> value #kvc.format<int2, per_token, group = 32> residual 128
// FUSED-NEXT:    kvc.kernel prefill for after_prefill {
// FUSED-NEXT:      kvc.attention_pass output window 64
// FUSED-NEXT:      %[[W:.+]] = kvc.attn_window size 64
// FUSED-NEXT:      %[[P:.+]] = kvc.pool avg %[[W]] kernel 5 : !kvc.score<query>
// FUSED-NEXT:      %[[G:.+]] = kvc.group_reduce mean %[[P]]
// FUSED-NEXT:      %[[B:.+]] = kvc.budget_uniform count 1024
// FUSED-NEXT:      %[[K:.+]] = kvc.topk %[[G]], %[[B]] tie recent : !kvc.score<kv_head>
// FUSED-NEXT:      kvc.evict %[[K]]
// FUSED-NEXT:      kvc.gather key #kvc.format<int2, per_channel, group = 32> value #kvc.format<int2, per_token, group = 32> residual 128
// FUSED-NEXT:    }
// FUSED-NEXT:    kvc.kernel decode {
// FUSED-NEXT:      kvc.append key #kvc.format<int2, per_channel, group = 32> value #kvc.format<int2, per_token, group = 32> residual 128
// FUSED-NEXT:      kvc.attention_pass output
// FUSED-NEXT:    }
// FUSED-NEXT:  }
// FUSED-NOT:   kvc.phase

// UNFUSED-LABEL: kvc.policy @snapkv_kivi
// UNFUSED:         kvc.kernel prefill {
// UNFUSED-NEXT:      kvc.attention_pass output
// UNFUSED-NEXT:    }
// UNFUSED-NEXT:    kvc.kernel prefill_scoring for after_prefill {
// UNFUSED-NEXT:      kvc.attention_pass window 64
// UNFUSED:           kvc.gather
// UNFUSED-NEXT:    }
// UNFUSED-NEXT:    kvc.kernel decode {
// UNFUSED-NEXT:      kvc.append
// UNFUSED-NEXT:      kvc.attention_pass output
// UNFUSED-NEXT:    }
// UNFUSED-NEXT:  }
kvc.policy @snapkv_kivi {
  kvc.storage key #kvc.format<int2, per_channel, group = 32> value #kvc.format<int2, per_token, group = 32> residual 128
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

// An over_budget phase runs in both kernels; the decode kernel folds the
// accumulated attention into the state during its one pass.
// FUSED-LABEL: kvc.policy @h2o
// FUSED-NEXT:    kvc.kernel prefill for over_budget {
// FUSED-NEXT:      kvc.attention_pass output accumulate 1.000000e+00 reduce mean
// FUSED:           kvc.gather key #kvc.format<full> value #kvc.format<full>
// FUSED-NEXT:    }
// FUSED-NEXT:    kvc.kernel decode for over_budget {
// FUSED-NEXT:      kvc.append key #kvc.format<full> value #kvc.format<full>
// FUSED-NEXT:      kvc.attention_pass output accumulate 1.000000e+00 reduce mean
// FUSED-NEXT:      %[[A:.+]] = kvc.attn_accumulate decay 1.000000e+00
// FUSED-NEXT:      %[[G:.+]] = kvc.group_reduce mean %[[A]]
// FUSED-NEXT:      %[[B:.+]] = kvc.budget_uniform count 1024
// FUSED-NEXT:      %[[K:.+]] = kvc.topk %[[G]], %[[B]] tie recent : !kvc.score<kv_head>
// FUSED-NEXT:      kvc.evict %[[K]]
// FUSED-NEXT:    }

// UNFUSED-LABEL: kvc.policy @h2o
// UNFUSED-NEXT:    kvc.kernel prefill {
// UNFUSED-NEXT:      kvc.attention_pass output
// UNFUSED-NEXT:    }
// UNFUSED-NEXT:    kvc.kernel prefill_scoring for over_budget {
// UNFUSED-NEXT:      kvc.attention_pass accumulate 1.000000e+00 reduce mean
// UNFUSED:         kvc.kernel decode {
// UNFUSED-NEXT:      kvc.append
// UNFUSED-NEXT:      kvc.attention_pass output
// UNFUSED-NEXT:    }
// UNFUSED-NEXT:    kvc.kernel decode_scoring for over_budget {
// UNFUSED-NEXT:      kvc.attention_pass accumulate 1.000000e+00 reduce mean
// UNFUSED-NEXT:      kvc.attn_accumulate
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

// A global budget splits its phase: the prefill (or, unfused, the prefill
// scoring) kernel stores each entry's score, a select kernel ranks them all.
// FUSED-LABEL: kvc.policy @global
// FUSED-NEXT:    kvc.kernel prefill for after_prefill {
// FUSED-NEXT:      kvc.attention_pass output window 8
// FUSED-NEXT:      %[[W:.+]] = kvc.attn_window size 8
// FUSED-NEXT:      %[[G:.+]] = kvc.group_reduce mean %[[W]]
// FUSED-NEXT:      kvc.gather key #kvc.format<full> value #kvc.format<full> state %[[G]]
// FUSED-NEXT:    }
// FUSED-NEXT:    kvc.kernel select for after_prefill {
// FUSED-NEXT:      %[[S:.+]] = kvc.score_state
// FUSED-NEXT:      %[[B:.+]] = kvc.budget_uniform ratio 5.000000e-01
// FUSED-NEXT:      %[[T:.+]] = kvc.budget_global %[[B]], %[[S]]
// FUSED-NEXT:      %[[K:.+]] = kvc.topk %[[S]], %[[T]] tie oldest : !kvc.score<kv_head>
// FUSED-NEXT:      kvc.evict %[[K]]
// FUSED-NEXT:    }
// FUSED-NEXT:    kvc.kernel decode {
// UNFUSED-LABEL: kvc.policy @global
// UNFUSED:         kvc.kernel prefill_scoring for after_prefill {
// UNFUSED-NEXT:      kvc.attention_pass window 8
// UNFUSED:           kvc.gather key #kvc.format<full> value #kvc.format<full> state
// UNFUSED-NEXT:    }
// UNFUSED-NEXT:    kvc.kernel select for after_prefill {
kvc.policy @global {
  kvc.phase after_prefill {
    %w = kvc.attn_window size 8
    %g = kvc.group_reduce mean %w
    %b = kvc.budget_uniform ratio 0.5
    %t = kvc.budget_global %b, %g
    %k = kvc.topk %g, %t tie oldest : !kvc.score<kv_head>
    kvc.evict %k
  }
}

// -----

// A periodic phase: no prefill statistics; the decode kernel folds the
// window and runs the phase once a period. Scissorhands' bits are a fused
// statistic of both kernels.
// FUSED-LABEL: kvc.policy @periodic
// FUSED-NEXT:    kvc.kernel prefill {
// FUSED-NEXT:      kvc.attention_pass output
// FUSED-NEXT:      kvc.gather
// FUSED-NEXT:    }
// FUSED-NEXT:    kvc.kernel decode for every_n period 16 {
// FUSED-NEXT:      kvc.append
// FUSED-NEXT:      kvc.attention_pass output window 4
// UNFUSED-LABEL: kvc.policy @periodic
// UNFUSED:         kvc.kernel decode_scoring for every_n period 16 {
// UNFUSED-NEXT:      kvc.attention_pass window 4
kvc.policy @periodic {
  kvc.phase every_n period 16 {
    %w = kvc.attn_window size 4
    %g = kvc.group_reduce mean %w
    %p = kvc.protect %g sinks 0 recent 4 : !kvc.score<kv_head>
    %b = kvc.budget_uniform count 64
    %k = kvc.topk %p, %b tie recent : !kvc.score<kv_head>
    kvc.evict %k
  }
}

// -----

// FUSED-LABEL: kvc.policy @persistent
// FUSED-NEXT:    kvc.kernel prefill for over_budget {
// FUSED-NEXT:      kvc.attention_pass output persistence 8 threshold 5.000000e-02 by max
// FUSED:         kvc.kernel decode for over_budget {
// FUSED-NEXT:      kvc.append
// FUSED-NEXT:      kvc.attention_pass output persistence 8 threshold 5.000000e-02 by max
// UNFUSED-LABEL: kvc.policy @persistent
// UNFUSED:         kvc.kernel prefill_scoring for over_budget {
// UNFUSED-NEXT:      kvc.attention_pass persistence 8 threshold 5.000000e-02 by max
kvc.policy @persistent {
  kvc.phase over_budget {
    %c = kvc.attn_persistence threshold 0.05 history 8 reduce max
    %b = kvc.budget_uniform count 64
    %k = kvc.topk %c, %b tie recent : !kvc.score<kv_head>
    kvc.evict %k
  }
}
