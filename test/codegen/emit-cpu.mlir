// What the C++ emitter folds and emits: geometry and policy constants, one
// commented stage per op, only the stages the policy uses.
//
// RUN: rm -rf %t && mkdir -p %t
// RUN: kvc-opt %s --kvc-specialize="layers=4 q-heads=8 kv-heads=2 head-dim=128 dtype=bf16" --kvc-form-kernels --kvc-emit="target=cpu output-dir=%t" -o /dev/null
// RUN: FileCheck %s --input-file=%t/kvc_window_cpu.cpp
// RUN: FileCheck %s --input-file=%t/kvc_window_cpu.h --check-prefix=HEADER
// RUN: kvc-opt %kvc_src_root/policies/kivi2.mlir --kvc-specialize=model=smollm2-135m --kvc-form-kernels --kvc-emit="target=cpu output-dir=%t" -o /dev/null
// RUN: FileCheck %s --input-file=%t/kvc_kivi2_cpu.cpp --check-prefix=KIVI

// CHECK:      constexpr int32_t kLayers = 4;
// CHECK:      constexpr int32_t kGroup = 4;
// CHECK:      constexpr int32_t kHeadDim = 128;
// CHECK:      constexpr float kSoftmaxScale = 0.0883883476f;
// CHECK:      constexpr int32_t kWindow = 16;
// CHECK-NOT:  kDecay
// CHECK:      config->dtype = KVC_DTYPE_BF16;
// CHECK:      config->format = KVC_FORMAT_INT8;
// CHECK-LABEL: kvc_status_t kvc_window_cpu_prefill(
// CHECK:      // kvc.attention_pass output window 16
// CHECK-NEXT: kvc::cpu::prefillAttention<kGroup, kHeadDim>(n, qh, kQStride, kh, vh, kKvStride, kSoftmaxScale, oh, kWindow, windowProbs, nullptr, nullptr, 1.0f, logits);
// CHECK-NEXT: // %0 = kvc.attn_window size 16
// CHECK-NEXT: // %1 = kvc.pool max %0 kernel 3 : !kvc.score<query>
// CHECK-NEXT: for (int32_t g = 0; g < kGroup; ++g)
// CHECK-NEXT:   kvc::cpu::poolMax(windowProbs + g * n, n, 3, s0 + g * n);
// CHECK-NEXT: // %2 = kvc.group_reduce max %1
// CHECK-NEXT: kvc::cpu::groupReduce(s0, kGroup, n, kvc::cpu::Reduce::Max, s1);
// CHECK-NEXT: // %3 = kvc.value_norm p 2
// CHECK-NEXT: kvc::cpu::rowNorms(vh, kKvStride, n, kHeadDim, 2, s2);
// CHECK-NEXT: // %4 = kvc.combine product %2, %3 : !kvc.score<kv_head>
// CHECK-NEXT: for (int64_t i = 0; i < n; ++i)
// CHECK-NEXT:   s3[i] = s1[i] * s2[i];
// CHECK-NEXT: // %5 = kvc.protect %4 sinks 2 recent 16 : !kvc.score<kv_head>
// CHECK-NEXT: kvc::cpu::protect(s3, positions, n, 2, 16, s4, order);
// CHECK-NEXT: // %6 = kvc.budget_uniform ratio 7.500000e-01
// CHECK-NEXT: const int64_t budget0 = static_cast<int64_t>(n * (1.0 - 0.75f));
// CHECK:      // kvc.gather key #kvc.format<int8, per_token> value #kvc.format<int8, per_token>
// CHECK-LABEL: static kvc_status_t kvc_window_cpu_decode_heads(kvc_context_t *context, uint64_t sequence, int32_t layer, const float *q, float *out, void *workspace) {
// CHECK-NOT:  kvc::cpu::protect
// CHECK:      KVC_CPU_TRY(kvc::cpu::decodeAttention<kGroup, kHeadDim>(head, q + h * kGroup * kHeadDim, kSoftmaxScale, out + h * kGroup * kHeadDim, nullptr, logits));
// CHECK-NEXT: }
// The entry point checks, appends every head (all or nothing, one
// kvc_append_step), then calls the heads.
// CHECK-LABEL: kvc_status_t kvc_window_cpu_decode(
// CHECK:      // kvc.append key #kvc.format<int8, per_token> value #kvc.format<int8, per_token>
// CHECK-NEXT: // Every head appends before any computes, all or nothing (kvc_append_step):
// CHECK-NEXT: // a full pool changes nothing.
// CHECK-NEXT: KVC_CPU_TRY(kvc::cpu::appendStep(context, 1, &sequence, layer, kKvHeads, kHeadDim, k, v,
// CHECK-NEXT:   &position));
// CHECK-NEXT: return kvc_window_cpu_decode_heads(context, sequence, layer, q, out, workspace);

// A KIVI append also quantizes the value leaving the residual window, which
// an eviction would not undo; the runtime's batched append plans every head
// first, so KIVI is all or nothing too, in both entries.
// KIVI-LABEL: kvc_status_t kvc_kivi2_cpu_decode(
// KIVI:       // Every head appends before any computes, all or nothing (kvc_append_step):
// KIVI:       KVC_CPU_TRY(kvc::cpu::appendStep(context, 1, &sequence, layer, kKvHeads, kHeadDim, k, v,
// KIVI-NEXT:    &position));
// KIVI-LABEL: kvc_status_t kvc_kivi2_cpu_decode_batch(
// KIVI:       KVC_CPU_TRY(kvc::cpu::appendStep(context, batch, sequences, layer, kKvHeads, kHeadDim, k, v,
// KIVI-NEXT:    positions));
// KIVI-NOT:   kvc_append(

// HEADER: void kvc_window_cpu_configure(kvc_config_t *config);
// HEADER: uint64_t kvc_window_cpu_prefill_workspace_bytes(int32_t n);
// HEADER: kvc_status_t kvc_window_cpu_prefill(kvc_context_t *context, uint64_t sequence, int32_t layer, int32_t n, const float *q, const float *k, const float *v, const int32_t *positions, float *out, void *workspace, uint64_t workspace_bytes);
// HEADER: uint64_t kvc_window_cpu_decode_workspace_bytes(int32_t num_slots);
// HEADER: kvc_status_t kvc_window_cpu_decode(kvc_context_t *context, uint64_t sequence, int32_t layer, const float *q, const float *k, const float *v, int32_t position, float *out, void *workspace, uint64_t workspace_bytes);

kvc.policy @window {
  kvc.storage key #kvc.format<int8, per_token> value #kvc.format<int8, per_token>
  kvc.phase after_prefill {
    %w = kvc.attn_window size 16
    %p = kvc.pool max %w kernel 3 : !kvc.score<query>
    %g = kvc.group_reduce max %p
    %v = kvc.value_norm p 2
    %c = kvc.combine product %g, %v : !kvc.score<kv_head>
    %s = kvc.protect %c sinks 2 recent 16 : !kvc.score<kv_head>
    %b = kvc.budget_uniform ratio 0.75
    %k = kvc.topk %s, %b tie recent : !kvc.score<kv_head>
    kvc.evict %k
  }
}
