// The decode step in three calls for CUDA graphs: decode_plan_batch (the
// host part: check-out, appends, the tables' upload, the check-in whose
// event the finish records), decode_run_batch (launches only, planned for
// `capacity` slots, nothing read from the host's tables) and
// decode_finish_batch. Generated for the decode kernels of one storage
// class whose launches depend on the batch alone: periodic (RPC),
// cross-head (TOVA), KIVI (its quantization and staging in grids for a
// step's most work) and mixed precision (whose decode appends to the
// high class only) included; not the scoring kernel of an unfused policy.
// No nvcc needed (cuda-nvcc*.mlir and the GPU test, under the emulator,
// compile and run them).
//
// RUN: rm -rf %t && mkdir -p %t
// RUN: kvc-opt %kvc_src_root/policies/h2o.mlir --kvc-specialize=model=smollm2-135m --kvc-form-kernels --kvc-emit="target=cuda output-dir=%t" -o /dev/null
// RUN: FileCheck %s --check-prefix=HDR --input-file=%t/kvc_h2o_cuda.h
// RUN: FileCheck %s --input-file=%t/kvc_h2o_cuda.cu
// RUN: kvc-opt %kvc_src_root/policies/snapkv.mlir --kvc-specialize=model=smollm2-135m --kvc-form-kernels --kvc-emit="target=cuda output-dir=%t" -o /dev/null
// RUN: FileCheck %s --check-prefix=SNAP --input-file=%t/kvc_snapkv_cuda.cu
// RUN: kvc-opt %kvc_src_root/policies/kivi2.mlir --kvc-specialize=model=smollm2-135m --kvc-form-kernels --kvc-emit="target=cuda output-dir=%t" -o /dev/null
// RUN: FileCheck %s --check-prefix=KIVI --input-file=%t/kvc_kivi2_cuda.cu
// RUN: kvc-opt %kvc_src_root/policies/rpc.mlir --kvc-specialize=model=smollm2-135m --kvc-form-kernels --kvc-emit="target=cuda output-dir=%t" -o /dev/null
// RUN: FileCheck %s --check-prefix=RPC --input-file=%t/kvc_rpc_cuda.cu
// RUN: kvc-opt %kvc_src_root/policies/tova.mlir --kvc-specialize=model=smollm2-135m --kvc-form-kernels --kvc-emit="target=cuda output-dir=%t" -o /dev/null
// RUN: FileCheck %s --check-prefix=TOVA --input-file=%t/kvc_tova_cuda.cu
// RUN: kvc-opt %kvc_src_root/policies/mixed_precision.mlir --kvc-specialize=model=smollm2-135m --kvc-form-kernels --kvc-emit="target=cuda output-dir=%t" -o /dev/null
// RUN: FileCheck %s --check-prefix=MIXED --input-file=%t/kvc_mixed_precision_cuda.cu
// RUN: rm -rf %t/u && mkdir -p %t/u
// RUN: kvc-opt %kvc_src_root/policies/h2o.mlir --kvc-specialize=model=smollm2-135m --kvc-form-kernels=unfused=1 --kvc-emit="target=cuda output-dir=%t/u" -o /dev/null
// RUN: FileCheck %s --check-prefix=NONE --input-file=%t/u/kvc_h2o_cuda.h

// HDR: kvc_status_t kvc_h2o_cuda_decode_batch(
// HDR: kvc_status_t kvc_h2o_cuda_decode_plan_batch(kvc_context_t *context, int32_t batch, const uint64_t *sequences, int32_t layer, const int32_t *positions, int32_t capacity, void *workspace, uint64_t workspace_bytes, void *stream);
// HDR: kvc_status_t kvc_h2o_cuda_decode_run_batch(kvc_context_t *context, int32_t batch, int32_t layer, const float *q, const float *k, const float *v, float *out, int32_t capacity, void *workspace, uint64_t workspace_bytes, void *stream);
// HDR: kvc_status_t kvc_h2o_cuda_decode_finish_batch(kvc_context_t *context, int32_t layer, void *stream);

// The whole step keeps its words in storeAppended and its event at the
// check-in.
// CHECK-LABEL: kvc_status_t kvc_h2o_cuda_decode_batch(
// CHECK: /*kiviWork=*/nullptr, kvc::cuda::WordsBy::Stores));
// CHECK: tables, w.heads, heads, kKvHeads
// CHECK: KVC_CUDA_TRY(tables.checkIn(/*victimsPublished=*/true));

// The plan: a capacity checked before any append, the words left to the
// run's stores (their count in a header word on the device), no kernel at
// all, the event left to the finish.
// CHECK-LABEL: kvc_status_t kvc_h2o_cuda_decode_plan_batch(
// CHECK: tables.checkOut(
// CHECK: if (static_cast<int64_t>(maxSlots) + config.page_size > capacity)
// CHECK-NEXT: return kvc_report_error(KVC_STATUS_OUT_OF_RANGE, "kvc_h2o_cuda_decode_plan_batch: a head holds more than capacity - page_size slots");
// CHECK-NEXT: const int64_t stride = capacity;
// CHECK: kvc_append_step(
// CHECK: KVC_CUDA_TRY(tables.upload(positions, newSlots.data(), numPages.data(), /*sameEntries=*/false, w.tables,
// CHECK-NEXT: kvc::cuda::deviceTableBytes(heads, stride), s, &w.heads,
// CHECK-NEXT: /*kiviWork=*/nullptr, kvc::cuda::WordsBy::PlannedStores));
// CHECK-NOT: launch
// CHECK: KVC_CUDA_TRY(tables.keepVictims(b));
// CHECK-NEXT: // The step's event waits for its finish, after the run.
// CHECK-NEXT: KVC_CUDA_TRY(tables.checkIn(/*victimsPublished=*/true, /*recordLater=*/true));
// CHECK-NEXT: // The run it planned, which the run's call checks (checkPlannedRun).
// CHECK-NEXT: KVC_CUDA_TRY(kvc::cuda::notePlannedRun(context, layer, batch, capacity, workspace,
// CHECK-NEXT: "kvc_h2o_cuda_decode_plan_batch"));

// The run: the splits and fold blocks planned for the capacity, nothing
// from the host's tables, no append.
// CHECK-LABEL: kvc_status_t kvc_h2o_cuda_decode_run_batch(
// CHECK-NOT: tables.
// CHECK-NOT: kvc_append
// CHECK: KVC_CUDA_TRY(kvc::cuda::checkPlannedRun(context, layer, batch, capacity, workspace,
// CHECK-NEXT: "kvc_h2o_cuda_decode_run_batch"));
// CHECK: w.heads = reinterpret_cast<const kvc::cuda::HeadTable *>(w.tables);
// CHECK-NOT: tables.
// CHECK: launchPlannedStores<kHeadDim, kStorage>(
// CHECK-NEXT: w.heads, heads, kKvHeads,
// CHECK-NOT: tables.
// CHECK: kvc::cuda::planSplits(
// CHECK-NEXT: capacity, kMaxSplits, kMinSlotsPerSplit, heads,
// CHECK-NOT: tables.
// The share of logits kept in L2 is sized for the capacity too.
// CHECK: args.logitsKeep = kvc::cuda::logitsKeepFraction(
// CHECK-NEXT: static_cast<int64_t>(heads) * kGroup * capacity * 4, l2Bytes);
// CHECK-NOT: tables.
// CHECK: kvc::cuda::planFold<kGroup>(
// CHECK-NEXT: plan, heads, capacity, multiprocessors);
// CHECK-NOT: tables.
// CHECK: launchDependent<&decodeFold>(
// CHECK-NOT: tables.
// CHECK-LABEL: kvc_status_t kvc_h2o_cuda_decode_finish_batch(
// CHECK: return kvc::cuda::finishPlannedSteps(context, layer, static_cast<cudaStream_t>(stream),

// SnapKV: no victims to keep; the run's attention merges its splits.
// SNAP-LABEL: kvc_status_t kvc_snapkv_cuda_decode_plan_batch(
// SNAP-NOT: keepVictims
// SNAP: KVC_CUDA_TRY(tables.checkIn(/*victimsPublished=*/false, /*recordLater=*/true));
// SNAP-LABEL: kvc_status_t kvc_snapkv_cuda_decode_run_batch(
// SNAP: /*mergeOut=*/out};
// SNAP-LABEL: kvc_status_t kvc_snapkv_cuda_decode_finish_batch(

// For the periodic RPC, the plan keeps the victims of the sequences that end
// a period; the run launches the stages at every step (their blocks check the period).
// RPC-LABEL: kvc_status_t kvc_rpc_cuda_decode_plan_batch(
// RPC: if ((positions[b] + 1) % kPeriod == 0)
// RPC-NEXT: KVC_CUDA_TRY(tables.keepVictims(b));
// RPC-LABEL: kvc_status_t kvc_rpc_cuda_decode_run_batch(
// RPC-NOT: positions
// RPC: decodeStages<<<heads, kStageThreads, 0, s>>>(w, stride, fold.blocks, layer, out);
// RPC-NOT: positions
// RPC-LABEL: kvc_status_t kvc_rpc_cuda_decode_finish_batch(

// For the cross-head TOVA, the layer-wide entries checked by the plan's
// upload; the run launches the cross-head kernels.
// TOVA-LABEL: kvc_status_t kvc_tova_cuda_decode_plan_batch(
// TOVA: /*sameEntries=*/true
// TOVA-LABEL: kvc_status_t kvc_tova_cuda_decode_run_batch(
// TOVA: decodeStagesAcrossHeads<<<batch, kStageThreads, 0, s>>>(w, stride, layer);
// TOVA-NEXT: decodeStagesAfterHeads<<<heads, kStageThreads, 0, s>>>(
// TOVA-LABEL: kvc_status_t kvc_tova_cuda_decode_finish_batch(

// For KIVI, the whole step launches its jobs in grids of their size, with
// the tables' words; the plan uploads them for the run, whose grids are the
// bounds of a step (launchPlannedKivi), and leaves the words after the
// tables for the run's staging, as for the other policies.
// KIVI-LABEL: kvc_status_t kvc_kivi2_cuda_decode_batch(
// KIVI: kivi.records(), kvc::cuda::WordsBy::Stores));
// KIVI: KVC_CUDA_TRY((kivi.launch<kHeadDim, kKiviBits, kKiviGroup, kDtype>(
// KIVI-NEXT: w.kivi, kvc::cuda::kiviWorkBounds(heads, 1, kResidual, kKiviGroup), k, v, s,
// KIVI-NEXT: "kvc_kivi2_cuda_decode_batch", &tables)));
// KIVI-LABEL: kvc_status_t kvc_kivi2_cuda_decode_plan_batch(
// KIVI: KVC_CUDA_TRY((kivi.addStep<kHeadDim, kDtype>(context, layer, batch, sequences, kKvHeads, layout,
// KIVI-NEXT: config.page_size, kKiviGroup, kKvStride)));
// KIVI-NEXT: KVC_CUDA_TRY(tables.upload(
// KIVI: kivi.records(), kvc::cuda::WordsBy::PlannedStores));
// KIVI-NOT: launch
// KIVI: KVC_CUDA_TRY(kivi.upload(w.kivi, kvc::cuda::kiviWorkBounds(heads, 1, kResidual, kKiviGroup),
// KIVI-NEXT: s, "kvc_kivi2_cuda_decode_plan_batch"));
// KIVI-NEXT: // The step's event waits for its finish, after the run.
// KIVI-NEXT: KVC_CUDA_TRY(tables.checkIn(/*victimsPublished=*/false, /*recordLater=*/true));
// KIVI-LABEL: kvc_status_t kvc_kivi2_cuda_decode_run_batch(
// KIVI-NOT: tables.
// KIVI-NOT: kivi.
// KIVI: KVC_CUDA_TRY((kvc::cuda::launchPlannedKivi<kHeadDim, kKiviBits, kKiviGroup, kDtype>(
// KIVI-NEXT: w.kivi, w.heads, heads, kResidual, k, v, s, "kvc_kivi2_cuda_decode_run_batch")));
// KIVI-NOT: tables.
// KIVI: kvc::cuda::planSplits(
// KIVI-NEXT: capacity, kMaxSplits, kMinSlotsPerSplit, heads,
// KIVI-NOT: tables.
// KIVI: decodeAttentionKivi
// KIVI-LABEL: kvc_status_t kvc_kivi2_cuda_decode_finish_batch(

// Mixed precision: the run's attention reads both page classes; no low
// class is stored at decode.
// MIXED-LABEL: kvc_status_t kvc_mixed_precision_cuda_decode_plan_batch(
// MIXED-NOT: lowStore
// MIXED: KVC_CUDA_TRY(tables.checkIn(/*victimsPublished=*/false, /*recordLater=*/true));
// MIXED-LABEL: kvc_status_t kvc_mixed_precision_cuda_decode_run_batch(
// MIXED-NOT: lowStore
// MIXED: launchPlannedStores<kHeadDim, kStorage>(
// MIXED-NEXT: w.heads, heads, kKvHeads,
// MIXED: kvc::cuda::planSplits(
// MIXED-NEXT: capacity, kMaxSplits, kMinSlotsPerSplit, heads,
// MIXED: DecodeSplitArgs args{w.heads, kvc::cuda::devicePageLayout(config, layout, lowLayout), q,
// MIXED-LABEL: kvc_status_t kvc_mixed_precision_cuda_decode_finish_batch(

// The unfused H2O: its attention-only decode has the three calls, its
// scoring kernel (which reads the logits the decode left) none.
// NONE: kvc_h2o_cuda_decode_plan_batch(
// NONE: kvc_h2o_cuda_decode_scoring_batch(
// NONE-NOT: _plan_batch
// NONE-NOT: _run_batch
// NONE-NOT: _finish_batch
