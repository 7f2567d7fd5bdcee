// Folds and canonicalization patterns of the kvc dialect.
//
// RUN: kvc-opt %s --canonicalize --split-input-file | FileCheck %s

// Identity transforms fold away; nested weighted sums flatten with their
// weights multiplied; unused pure score ops are erased.
// CHECK-LABEL: kvc.policy @identities {
// CHECK-NEXT:    kvc.phase after_prefill {
// CHECK-NEXT:      %[[W:.+]] = kvc.attn_window size 32
// CHECK-NEXT:      %[[G:.+]] = kvc.group_reduce mean %[[W]]
// CHECK-NEXT:      %[[N:.+]] = kvc.key_norm
// CHECK-NEXT:      %[[V:.+]] = kvc.value_norm p 2
// CHECK-NEXT:      %[[C:.+]] = kvc.combine sum %[[G]], %[[N]], %[[V]] weights [5.000000e-01, -1.000000e+00, 2.000000e+00] : !kvc.score<kv_head>
// CHECK-NEXT:      %[[B:.+]] = kvc.budget_uniform count 64
// CHECK-NEXT:      %[[K:.+]] = kvc.topk %[[C]], %[[B]] tie recent : !kvc.score<kv_head>
// CHECK-NEXT:      kvc.evict %[[K]]
// CHECK-NEXT:    }
kvc.policy @identities {
  kvc.phase after_prefill {
    %w = kvc.attn_window size 32
    %p = kvc.pool avg %w kernel 1 : !kvc.score<query>
    %g = kvc.group_reduce mean %p
    %n = kvc.key_norm
    %v = kvc.value_norm p 2
    %unused = kvc.key_diversity
    %inner = kvc.combine sum %g, %n weights [1.0, -2.0] : !kvc.score<kv_head>
    %outer = kvc.combine sum %inner, %v weights [0.5, 2.0] : !kvc.score<kv_head>
    %single = kvc.combine sum %outer : !kvc.score<kv_head>
    %prot = kvc.protect %single sinks 0 recent 0 : !kvc.score<kv_head>
    %b = kvc.budget_uniform count 64
    %k = kvc.topk %prot, %b tie recent : !kvc.score<kv_head>
    kvc.evict %k
  }
}

// -----

// A repeated normalization of the same kind folds; a different kind stays.
// Transforms that do change the scores stay.
// CHECK-LABEL: kvc.policy @kept {
// CHECK-NEXT:    kvc.phase over_budget {
// CHECK-NEXT:      %[[N:.+]] = kvc.key_norm
// CHECK-NEXT:      %[[Z:.+]] = kvc.normalize zscore %[[N]] : !kvc.score<kv_head>
// CHECK-NEXT:      %[[M:.+]] = kvc.normalize max %[[Z]] : !kvc.score<kv_head>
// CHECK-NEXT:      %[[P:.+]] = kvc.protect %[[M]] sinks 4 recent 0 : !kvc.score<kv_head>
// CHECK-NEXT:      %[[C:.+]] = kvc.combine sum %[[P]] weights [-1.000000e+00] : !kvc.score<kv_head>
// CHECK-NEXT:      %[[B:.+]] = kvc.budget_uniform count 64
// CHECK-NEXT:      %[[K:.+]] = kvc.topk %[[C]], %[[B]] tie recent : !kvc.score<kv_head>
// CHECK-NEXT:      kvc.evict %[[K]]
kvc.policy @kept {
  kvc.phase over_budget {
    %n = kvc.key_norm
    %z = kvc.normalize zscore %n : !kvc.score<kv_head>
    %zz = kvc.normalize zscore %z : !kvc.score<kv_head>
    %m = kvc.normalize max %zz : !kvc.score<kv_head>
    %p = kvc.protect %m sinks 4 recent 0 : !kvc.score<kv_head>
    %c = kvc.combine sum %p weights [-1.0] : !kvc.score<kv_head>
    %b = kvc.budget_uniform count 64
    %k = kvc.topk %c, %b tie recent : !kvc.score<kv_head>
    kvc.evict %k
  }
}
