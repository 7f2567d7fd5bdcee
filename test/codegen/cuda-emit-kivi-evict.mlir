// H2O over KIVI storage on the CUDA backend: the decode keeps the slot
// tables on the device like every other storage (DeviceTables), with each
// slot's KIVI window word besides positions and score state; the stages
// list the victims in the device tables, clear them there and write each
// head's victim row for the host, without synchronizing the stream.
//
// RUN: rm -rf %t && mkdir -p %t
// RUN: kvc-opt %s --kvc-specialize=model=smollm2-135m --kvc-form-kernels --kvc-emit="target=cuda output-dir=%t" -o /dev/null
// RUN: FileCheck %s --input-file=%t/kvc_h2o_kivi_cuda.cu

// CHECK: decodeStages(DecodeWorkspace w, int64_t stride, int32_t numBlocks, int32_t layer, float *out,
// CHECK-NEXT: int32_t h) {
// CHECK: kvc::cuda::compactIndices<kStageThreads>(
// CHECK-NEXT: n, [&](int32_t i) { return victim[i] != 0; }, t.victims + 1, t.victims);
// CHECK: kvc::cuda::clearEvicted<kStageThreads>(t, victim, n);
// CHECK-NEXT: // The head's victim row for the host (no download launch).
// CHECK-NEXT: kvc::cuda::publishVictims<kStageThreads>(t);
// CHECK-LABEL: kvc_status_t kvc_h2o_kivi_cuda_decode_batch(
// CHECK-NOT: TableStager
// CHECK: kvc::cuda::DeviceTables tables;
// CHECK-NEXT: KVC_CUDA_TRY(tables.checkOut(context, batch, sequences, layer, kKvHeads,
// CHECK-NEXT: /*withState=*/true, /*withHistory=*/false,
// CHECK-NEXT: /*withVictims=*/true, "kvc_h2o_kivi_cuda_decode_batch",
// CHECK-NEXT: /*withKivi=*/true));
// CHECK: &kvc::cuda::decodeAttentionKivi<kGroup, kHeadDim, kKiviBits, kKiviGroup, kDtype,
// CHECK: // the residual rows (the device tables' word per slot: row and formats).
// CHECK: KVC_CUDA_TRY((kvc::cuda::launchDependent<
// CHECK-NEXT: &kvc::cuda::decodeAttentionKivi<kGroup, kHeadDim, kKiviBits, kKiviGroup, kDtype,
// CHECK-NOT: cudaStreamSynchronize
// CHECK: KVC_CUDA_TRY(tables.keepVictims(b));
// CHECK-NEXT: KVC_CUDA_TRY(tables.checkIn(/*victimsPublished=*/true));
// CHECK-LABEL: kvc_status_t kvc_h2o_kivi_cuda_decode(

kvc.policy @h2o_kivi {
  kvc.storage key #kvc.format<int2, per_channel, group = 32>
              value #kvc.format<int2, per_token, group = 32> residual 128
  kvc.phase over_budget {
    %attn = kvc.attn_accumulate decay 1.0
    %group = kvc.group_reduce mean %attn
    %score = kvc.protect %group sinks 0 recent 512 : !kvc.score<kv_head>
    %budget = kvc.budget_uniform count 1024
    %keep = kvc.topk %score, %budget tie recent : !kvc.score<kv_head>
    kvc.evict %keep
  }
}
