// H2O over KIVI storage on the CUDA backend: KIVI's per-slot tables follow
// the residual windows, which change at every step, so its decode stages
// the runtime's tables from the host at every step (TableStager) and hands
// the score state back with the victims, instead of keeping them on the
// device (DeviceTables). The device stages still clear the victims.
//
// RUN: rm -rf %t && mkdir -p %t
// RUN: kvc-opt %s --kvc-specialize=model=smollm2-135m --kvc-form-kernels --kvc-emit="target=cuda output-dir=%t" -o /dev/null
// RUN: FileCheck %s --input-file=%t/kvc_h2o_kivi_cuda.cu

// CHECK: decodeStages(DecodeWorkspace w, int64_t stride, int32_t numSplits, int32_t layer, float *out) {
// CHECK: kvc::cuda::clearEvicted<kStageThreads>(t, victim, n);
// CHECK-LABEL: kvc_status_t kvc_h2o_kivi_cuda_decode_batch(
// CHECK-NOT: DeviceTables
// CHECK: kvc::cuda::TableStager tables;
// CHECK-NEXT: KVC_CUDA_TRY(tables.gather(context, batch, sequences, positions, layer, kKvHeads,
// CHECK-NEXT: /*withState=*/true));
// CHECK: kvc::cuda::decodeAttentionKivi<kGroup, kHeadDim, kKiviBits, kKiviGroup, kDtype,
// CHECK: KVC_CUDA_TRY(victims.queue(w.numVictims, w.victims, heads, stride, s, "kvc_h2o_kivi_cuda_decode_batch"));
// CHECK-NEXT: cudaStreamSynchronize(s)
// CHECK-NEXT: KVC_CUDA_TRY(tables.downloadState(w.tables, "kvc_h2o_kivi_cuda_decode_batch"));
// CHECK-NEXT: KVC_CUDA_TRY(victims.fetchRest("kvc_h2o_kivi_cuda_decode_batch"));
// CHECK-NOT: checkIn
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
