// SnapKV + KIVI-2: prompt compression by SnapKV (snapkv.mlir, press library
// defaults w = 64, average pooling of kernel 5, 1024 entries) with the kept
// entries stored as KIVI 2-bit (kivi2.mlir: G = 32, R = 128). Eviction and
// quantization compose: the budget counts entries, the format sets their
// bytes.
//
// RUN: kvc-opt %s | FileCheck %s
// RUN: kvc-opt %s | kvc-opt | FileCheck %s
// RUN: kvc-opt %s --mlir-print-op-generic | kvc-opt | FileCheck %s

// CHECK-LABEL: kvc.policy @snapkv_kivi2 {
// CHECK-NEXT:    kvc.storage key #kvc.format<int2, per_channel, group = 32> value #kvc.format<int2, per_token, group = 32> residual 128
// CHECK-NEXT:    kvc.phase after_prefill {
// CHECK-NEXT:      %[[W:.+]] = kvc.attn_window size 64
// CHECK-NEXT:      %[[P:.+]] = kvc.pool avg %[[W]] kernel 5 : !kvc.score<query>
// CHECK-NEXT:      %[[G:.+]] = kvc.group_reduce mean %[[P]]
// CHECK-NEXT:      %[[S:.+]] = kvc.protect %[[G]] sinks 0 recent 64 : !kvc.score<kv_head>
// CHECK-NEXT:      %[[B:.+]] = kvc.budget_uniform count 1024
// CHECK-NEXT:      %[[K:.+]] = kvc.topk %[[S]], %[[B]] tie recent : !kvc.score<kv_head>
// CHECK-NEXT:      kvc.evict %[[K]]

kvc.policy @snapkv_kivi2 {
  kvc.storage key #kvc.format<int2, per_channel, group = 32>
              value #kvc.format<int2, per_token, group = 32> residual 128
  kvc.phase after_prefill {
    %window = kvc.attn_window size 64
    %pooled = kvc.pool avg %window kernel 5 : !kvc.score<query>
    %group = kvc.group_reduce mean %pooled
    %score = kvc.protect %group sinks 0 recent 64 : !kvc.score<kv_head>
    %budget = kvc.budget_uniform count 1024
    %keep = kvc.topk %score, %budget tie recent : !kvc.score<kv_head>
    kvc.evict %keep
  }
}
