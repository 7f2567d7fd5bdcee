// Knorm: "A Simple and Effective L2 Norm-Based Strategy for KV Cache
// Compression" (Devoto et al., 2024).
//
// Keys with a low L2 norm attract attention, so the policy keeps the entries
// with the lowest key norm and needs no queries at all. Variant: the
// reference press library's, score = -||k||_2, no protected window, applied
// once after prefill with 1024 entries per layer and kv-head.
//
// RUN: kvc-opt %s | FileCheck %s
// RUN: kvc-opt %s | kvc-opt | FileCheck %s
// RUN: kvc-opt %s --mlir-print-op-generic | kvc-opt | FileCheck %s

// CHECK-LABEL: kvc.policy @knorm {
// CHECK-NEXT:    kvc.phase after_prefill {
// CHECK-NEXT:      %[[N:.+]] = kvc.key_norm
// CHECK-NEXT:      %[[S:.+]] = kvc.combine sum %[[N]] weights [-1.000000e+00] : !kvc.score<kv_head>
// CHECK-NEXT:      %[[B:.+]] = kvc.budget_uniform count 1024
// CHECK-NEXT:      %[[K:.+]] = kvc.topk %[[S]], %[[B]] tie recent : !kvc.score<kv_head>
// CHECK-NEXT:      kvc.evict %[[K]]

kvc.policy @knorm {
  kvc.phase after_prefill {
    %norm = kvc.key_norm
    %score = kvc.combine sum %norm weights [-1.0] : !kvc.score<kv_head>
    %budget = kvc.budget_uniform count 1024
    %keep = kvc.topk %score, %budget tie recent : !kvc.score<kv_head>
    kvc.evict %keep
  }
}
