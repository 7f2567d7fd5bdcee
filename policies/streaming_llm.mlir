// StreamingLLM: "Efficient Streaming Language Models with Attention Sinks"
// (Xiao et al., 2023).
//
// Keeps the first s attention-sink tokens and the last r tokens and drops the
// middle. Variant: s = 4 sinks (the paper's default), r = 1020 recent tokens,
// a cache of 1024 entries per layer and kv-head. The policy acts whenever a
// sequence exceeds its budget, so prompt and generated tokens are treated
// alike. No attention statistics are needed: entries are ranked by position.
//
// RUN: kvc-opt %s | FileCheck %s
// RUN: kvc-opt %s | kvc-opt | FileCheck %s
// RUN: kvc-opt %s --mlir-print-op-generic | kvc-opt | FileCheck %s
// RUN: kvc-opt %s --kvc-specialize=model=smollm2-135m | FileCheck %s --check-prefix=SPEC

// CHECK-LABEL: kvc.policy @streaming_llm {
// CHECK-NEXT:    kvc.phase over_budget {
// CHECK-NEXT:      %[[R:.+]] = kvc.recency
// CHECK-NEXT:      %[[P:.+]] = kvc.protect %[[R]] sinks 4 recent 0 : !kvc.score<kv_head>
// CHECK-NEXT:      %[[B:.+]] = kvc.budget_uniform count 1024
// CHECK-NEXT:      %[[K:.+]] = kvc.topk %[[P]], %[[B]] tie recent : !kvc.score<kv_head>
// CHECK-NEXT:      kvc.evict %[[K]]
// CHECK-NEXT:    }
// CHECK-NEXT:  }

// SPEC: kvc.policy @streaming_llm geometry #kvc.geometry<layers = 30, q_heads = 9, kv_heads = 3, head_dim = 64, dtype = f16> {

kvc.policy @streaming_llm {
  kvc.phase over_budget {
    %position = kvc.recency
    %score = kvc.protect %position sinks 4 recent 0 : !kvc.score<kv_head>
    %budget = kvc.budget_uniform count 1024
    %keep = kvc.topk %score, %budget tie recent : !kvc.score<kv_head>
    kvc.evict %keep
  }
}
