// DuoAttention: "DuoAttention: Efficient Long-Context LLM Inference with
// Retrieval and Streaming Heads" (Xiao et al., 2024); RazorAttention (Tang
// et al., 2024) classifies heads the same way.
//
// A table marks each (layer, kv-head) as a retrieval head, which keeps its
// full cache, or a streaming head, which keeps only the attention sinks and
// a recent window (StreamingLLM per head). Variant: 4 sinks and 256 recent
// entries for streaming heads. The table is model-specific, so this file is
// written for SmolLM2-135M (30 layers x 3 kv-heads) and verified against
// that geometry. Its values are not learned: they mark kv-head 0 of every
// layer as a retrieval head (a third of the heads, DuoAttention's typical
// ratio). DuoAttention learns the table per model by optimizing a gate per
// head, which kvc does not do; replace the table with one learned for the
// target model.
//
// RUN: kvc-opt %s --kvc-specialize=model=smollm2-135m | FileCheck %s
// RUN: kvc-opt %s --kvc-specialize=model=smollm2-135m --mlir-print-op-generic | kvc-opt | FileCheck %s
// RUN: not kvc-opt %s --kvc-specialize=model=llama-3.1-8b 2>&1 | FileCheck %s --check-prefix=OTHER

// CHECK-LABEL: kvc.policy @duo_attention geometry #kvc.geometry<layers = 30, q_heads = 9, kv_heads = 3, head_dim = 64, dtype = f16> {
// CHECK:         kvc.budget_head_classes table dense<{{.*}}> : tensor<30x3xi8> sinks 4 recent 256
// OTHER: error: 'kvc.budget_head_classes' op table of shape 'tensor<30x3xi8>' does not match the geometry: expected 32x8 (layers x kv_heads)

kvc.policy @duo_attention {
  kvc.phase over_budget {
    %position = kvc.recency
    %score = kvc.protect %position sinks 4 recent 0 : !kvc.score<kv_head>
    %budget = kvc.budget_head_classes table dense<[[1, 0, 0], [1, 0, 0], [1, 0, 0], [1, 0, 0], [1, 0, 0], [1, 0, 0], [1, 0, 0], [1, 0, 0], [1, 0, 0], [1, 0, 0], [1, 0, 0], [1, 0, 0], [1, 0, 0], [1, 0, 0], [1, 0, 0], [1, 0, 0], [1, 0, 0], [1, 0, 0], [1, 0, 0], [1, 0, 0], [1, 0, 0], [1, 0, 0], [1, 0, 0], [1, 0, 0], [1, 0, 0], [1, 0, 0], [1, 0, 0], [1, 0, 0], [1, 0, 0], [1, 0, 0]]> : tensor<30x3xi8> sinks 4 recent 256
    %keep = kvc.topk %score, %budget tie recent : !kvc.score<kv_head>
    kvc.evict %keep
  }
}
