// Round trip of every kvc op and attribute: custom form, the printed form
// parsed again, and the generic form parsed back.
//
// RUN: kvc-opt %s | FileCheck %s
// RUN: kvc-opt %s | kvc-opt | FileCheck %s
// RUN: kvc-opt %s --mlir-print-op-generic | kvc-opt | FileCheck %s
// RUN: kvc-opt %s --mlir-print-op-generic | FileCheck %s --check-prefix=GENERIC

// CHECK-LABEL: kvc.policy @scores geometry #kvc.geometry<layers = 2, q_heads = 4, kv_heads = 2, head_dim = 64, dtype = bf16> {
// CHECK-NEXT:    kvc.phase after_prefill {
// CHECK-NEXT:      %[[W:.+]] = kvc.attn_window size 16 visible_normalized
// CHECK-NEXT:      %[[L:.+]] = kvc.attn_last
// CHECK-NEXT:      %[[E:.+]] = kvc.expected_attn window 64 horizon 512 covariance
// CHECK-NEXT:      %[[E2:.+]] = kvc.expected_attn window 8 horizon 16{{$}}
// CHECK-NEXT:      %[[PO:.+]] = kvc.pool max %[[W]] kernel 7 : !kvc.score<query>
// CHECK-NEXT:      %[[LR:.+]] = kvc.layer_reduce max %[[L]] : !kvc.score<query>
// CHECK-NEXT:      %[[GR:.+]] = kvc.group_reduce sum %[[PO]]
// CHECK-NEXT:      %[[KN:.+]] = kvc.key_norm
// CHECK-NEXT:      %[[KD:.+]] = kvc.key_diversity
// CHECK-NEXT:      %[[VN:.+]] = kvc.value_norm p 1
// CHECK-NEXT:      %[[RC:.+]] = kvc.recency
// CHECK-NEXT:      %[[N:.+]] = kvc.normalize zscore %[[KD]] : !kvc.score<kv_head>
// CHECK-NEXT:      %[[C:.+]] = kvc.combine sum %[[GR]], %[[KN]], %[[N]] weights [1.000000e+00, -1.000000e+00, 2.500000e-01] : !kvc.score<kv_head>
// CHECK-NEXT:      %[[CP:.+]] = kvc.combine product %[[C]], %[[VN]] : !kvc.score<kv_head>
// CHECK-NEXT:      %[[PR:.+]] = kvc.protect %[[CP]] sinks 4 recent 16 : !kvc.score<kv_head>
// CHECK-NEXT:      %[[B:.+]] = kvc.budget_uniform ratio 7.500000e-01
// CHECK-NEXT:      %[[BG:.+]] = kvc.budget_global %[[B]], %[[RC]]
// CHECK-NEXT:      %[[K:.+]] = kvc.topk %[[PR]], %[[BG]] tie oldest : !kvc.score<kv_head>
// CHECK-NEXT:      kvc.evict %[[K]]
// CHECK-NEXT:    }
// CHECK-NEXT:    kvc.phase every_step {
// CHECK-NEXT:      %[[A:.+]] = kvc.attn_accumulate decay 9.000000e-01 visible_normalized noise_temperature 5.000000e-01 lag 8
// CHECK-NEXT:      %[[S:.+]] = kvc.attn_persistence threshold 1.000000e-02 history 64 reduce mean
// CHECK-NEXT:      %[[LA:.+]] = kvc.layer_reduce mean %[[A]] : !kvc.score<query>
// CHECK-NEXT:      %[[LS:.+]] = kvc.layer_reduce mean %[[S]] : !kvc.score<kv_head>
// CHECK-NEXT:      %[[SUM:.+]] = kvc.combine sum %[[LA]], %[[LS]] : !kvc.score<layer>
// CHECK-NEXT:      %[[B1:.+]] = kvc.budget_uniform count 256
// CHECK-NEXT:      %[[K1:.+]] = kvc.topk %[[SUM]], %[[B1]] tie recent : !kvc.score<layer>
// CHECK-NEXT:      kvc.merge_cam %[[K1]] span 4
// CHECK-NEXT:    }
// CHECK-NEXT:  }

// GENERIC: "kvc.policy"() <{geometry = #kvc.geometry<layers = 2, q_heads = 4, kv_heads = 2, head_dim = 64, dtype = bf16>, sym_name = "scores"}> ({
// GENERIC:   "kvc.phase"() <{trigger = 0 : i32}> ({
// GENERIC:     "kvc.attn_window"() <{size = 16 : i64, visible_normalized}> : () -> !kvc.score<query>

kvc.policy @scores geometry #kvc.geometry<layers = 2, q_heads = 4, kv_heads = 2, head_dim = 64, dtype = bf16> {
  kvc.phase after_prefill {
    %w = kvc.attn_window size 16 visible_normalized
    %l = kvc.attn_last
    %e = kvc.expected_attn window 64 horizon 512 covariance
    %e2 = kvc.expected_attn window 8 horizon 16
    %po = kvc.pool max %w kernel 7 : !kvc.score<query>
    %lr = kvc.layer_reduce max %l : !kvc.score<query>
    %gr = kvc.group_reduce sum %po
    %kn = kvc.key_norm
    %kd = kvc.key_diversity
    %vn = kvc.value_norm p 1
    %rc = kvc.recency
    %n = kvc.normalize zscore %kd : !kvc.score<kv_head>
    %c = kvc.combine sum %gr, %kn, %n weights [1.0, -1.0, 0.25] : !kvc.score<kv_head>
    %cp = kvc.combine product %c, %vn : !kvc.score<kv_head>
    %pr = kvc.protect %cp sinks 4 recent 16 : !kvc.score<kv_head>
    %b = kvc.budget_uniform ratio 0.75
    %bg = kvc.budget_global %b, %rc
    %k = kvc.topk %pr, %bg tie oldest : !kvc.score<kv_head>
    kvc.evict %k
  }
  kvc.phase every_step {
    %a = kvc.attn_accumulate decay 0.9 visible_normalized noise_temperature 0.5 lag 8
    %s = kvc.attn_persistence threshold 0.01 history 64 reduce mean
    %la = kvc.layer_reduce mean %a : !kvc.score<query>
    %ls = kvc.layer_reduce mean %s : !kvc.score<kv_head>
    %sum = kvc.combine sum %la, %ls : !kvc.score<layer>
    %b = kvc.budget_uniform count 256
    %k = kvc.topk %sum, %b tie recent : !kvc.score<layer>
    kvc.merge_cam %k span 4
  }
}

// CHECK-LABEL: kvc.policy @budgets {
// CHECK-NEXT:    kvc.storage key #kvc.format<fp8_e4m3, per_head> value #kvc.format<int8, per_token>
// CHECK-NEXT:    kvc.phase every_n period 32 {
// CHECK-NEXT:      %[[W:.+]] = kvc.attn_window size 16
// CHECK-NEXT:      %[[G:.+]] = kvc.group_reduce max %[[W]]
// CHECK-NEXT:      %[[P:.+]] = kvc.budget_pyramid capacity 2048 window 8 beta 20
// CHECK-NEXT:      %[[A:.+]] = kvc.budget_adaptive %[[P]], %[[G]] alpha 2.000000e-01
// CHECK-NEXT:      %[[H:.+]] = kvc.budget_head_weights %[[A]] table dense<{{\[\[}}1.000000e+00, 3.000000e+00]]> : tensor<1x2xf32>
// CHECK-NEXT:      %[[C:.+]] = kvc.budget_cake %[[H]] tau1 1.000000e+00 tau2 2.000000e+00
// CHECK-NEXT:      %[[K:.+]] = kvc.topk %[[G]], %[[C]] tie recent : !kvc.score<kv_head>
// CHECK-NEXT:      kvc.mixed_precision %[[G]] high #kvc.format<int8, per_token> low #kvc.format<int2, per_token, group = 32> fraction 2.000000e-01 : !kvc.score<kv_head>
// CHECK-NEXT:      kvc.merge_nearest %[[K]] weight sim_norm
// CHECK-NEXT:    }
// CHECK-NEXT:    kvc.phase over_budget {
// CHECK-NEXT:      %[[KN:.+]] = kvc.key_norm
// CHECK-NEXT:      %[[HC:.+]] = kvc.budget_head_classes table dense<{{\[\[}}1, 0]]> : tensor<1x2xi8> sinks 4 recent 256
// CHECK-NEXT:      %[[K2:.+]] = kvc.topk %[[KN]], %[[HC]] tie recent : !kvc.score<kv_head>
// CHECK-NEXT:      kvc.merge_d2o %[[K2]] alpha 5.000000e-01 beta 5.000000e-01
// CHECK-NEXT:    }
// CHECK-NEXT:    kvc.phase every_step {
// CHECK-NEXT:      %[[L:.+]] = kvc.attn_last
// CHECK-NEXT:      %[[G3:.+]] = kvc.group_reduce mean %[[L]]
// CHECK-NEXT:      %[[B3:.+]] = kvc.budget_uniform count 128
// CHECK-NEXT:      %[[K3:.+]] = kvc.topk %[[G3]], %[[B3]] tie recent : !kvc.score<kv_head>
// CHECK-NEXT:      kvc.merge_adjacent %[[K3]] threshold 9.000000e-01 sigma 1.000000e+00
// CHECK-NEXT:    }
// CHECK-NEXT:  }

kvc.policy @budgets {
  kvc.storage key #kvc.format<fp8_e4m3, per_head> value #kvc.format<int8, per_token>
  kvc.phase every_n period 32 {
    %w = kvc.attn_window size 16
    %g = kvc.group_reduce max %w
    %p = kvc.budget_pyramid capacity 2048 window 8 beta 20
    %a = kvc.budget_adaptive %p, %g alpha 0.2
    %h = kvc.budget_head_weights %a table dense<[[1.0, 3.0]]> : tensor<1x2xf32>
    %c = kvc.budget_cake %h tau1 1.0 tau2 2.0
    %k = kvc.topk %g, %c tie recent : !kvc.score<kv_head>
    kvc.mixed_precision %g high #kvc.format<int8, per_token> low #kvc.format<int2, per_token, group = 32> fraction 0.2 : !kvc.score<kv_head>
    kvc.merge_nearest %k weight sim_norm
  }
  kvc.phase over_budget {
    %kn = kvc.key_norm
    %hc = kvc.budget_head_classes table dense<[[1, 0]]> : tensor<1x2xi8> sinks 4 recent 256
    %k = kvc.topk %kn, %hc tie recent : !kvc.score<kv_head>
    kvc.merge_d2o %k alpha 0.5 beta 0.5
  }
  kvc.phase every_step {
    %l = kvc.attn_last
    %g = kvc.group_reduce mean %l
    %b = kvc.budget_uniform count 128
    %k = kvc.topk %g, %b tie recent : !kvc.score<kv_head>
    kvc.merge_adjacent %k threshold 0.9 sigma 1.0
  }
}

// CHECK-LABEL: kvc.policy @full_storage {
// CHECK-NEXT:    kvc.storage key #kvc.format<full> value #kvc.format<int4, per_channel, group = 64> residual 64
kvc.policy @full_storage {
  kvc.storage key #kvc.format<full> value #kvc.format<int4, per_channel, group = 64> residual 64
}
