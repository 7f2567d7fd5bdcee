// The generated CUDA of the policies whose decode kernel folds per-entry
// state besides the accumulated attention compiles with nvcc (architectures:
// see cuda-nvcc.mlir): Scissorhands (importance bits in the runtime's
// history metadata), RPC (a periodic window sum) and the global budget (a
// stored score and a host select kernel), fused and unfused, in the
// f16/G=3, bf16/G=8/d128 and f32/G=1 geometries. No GPU is needed.
//
// REQUIRES: nvcc
// RUN: rm -rf %t && mkdir -p %t/f16 %t/bf16 %t/f32
// RUN: kvc-opt %kvc_src_root/policies/scissorhands.mlir --kvc-specialize=model=smollm2-135m --kvc-form-kernels --kvc-emit="target=cuda output-dir=%t/f16" -o /dev/null
// RUN: kvc-opt %kvc_src_root/policies/rpc.mlir --kvc-specialize=model=smollm2-135m --kvc-form-kernels --kvc-emit="target=cuda output-dir=%t/f16" -o /dev/null
// Unfused, G=8, head_dim 128, bf16: prefill_scoring and decode_scoring.
// RUN: kvc-opt %kvc_src_root/policies/scissorhands.mlir "--kvc-specialize=layers=2 q-heads=8 kv-heads=1 head-dim=128 dtype=bf16" --kvc-form-kernels=unfused=1 --kvc-emit="target=cuda output-dir=%t/bf16" -o /dev/null
// RUN: %nvcc -std=c++17 -I%kvc_src_root -I%t/bf16 -gencode arch=compute_80,code=sm_80 -gencode arch=compute_90a,code=sm_90a -c %t/bf16/kvc_scissorhands_cuda.cu -o %t/scissorhands_unfused.o
// f32, G=1: the oracle comparison's small period.
// RUN: kvc-opt %kvc_src_root/test/codegen/policies/rpc_small.mlir "--kvc-specialize=layers=1 q-heads=2 kv-heads=2 head-dim=64 dtype=f32" --kvc-form-kernels --kvc-emit="target=cuda output-dir=%t/f32" -o /dev/null
// RUN: %nvcc -std=c++17 -I%kvc_src_root -I%t/f32 -gencode arch=compute_90a,code=sm_90a -c %t/f32/kvc_rpc_small_cuda.cu -o %t/rpc_small.o
// The global budget: the prefill downloads each entry's score, the select
// entry point is host code over the runtime's metadata.
// RUN: kvc-opt %kvc_src_root/policies/snapkv_global.mlir --kvc-specialize=model=smollm2-135m --kvc-form-kernels --kvc-emit="target=cuda output-dir=%t/f16" -o /dev/null
// RUN: FileCheck %s --input-file=%t/f16/kvc_snapkv_global_cuda.cu
// RUN: %cmake -DBACKEND=cuda "-DPOLICIES=scissorhands;rpc;snapkv_global" -DOUTPUT=%t/f16/kvc_bundle_cuda.cu -P %kvc_src_root/codegen/KvcPolicyBundle.cmake
// RUN: %nvcc -std=c++17 -I%kvc_src_root -I%t/f16 -gencode arch=compute_80,code=sm_80 -gencode arch=compute_90a,code=sm_90a -c %t/f16/kvc_bundle_cuda.cu -o %t/f16.o

// CHECK-LABEL: kvc_status_t kvc_snapkv_global_cuda_prefill(
// CHECK:         cudaMemcpyAsync(storedScore.data(), w.s2,
// CHECK:         meta.score[slots[j]] = storedScore[static_cast<size_t>(h) * n + j];
// CHECK-LABEL: kvc_status_t kvc_snapkv_global_cuda_select(
// CHECK:         // %2 = kvc.budget_global %1, %0
// CHECK-NEXT:    const int64_t total = 1024 * static_cast<int64_t>(kLayers) * kKvHeads;
// CHECK:         KVC_CUDA_TRY(kvc_select_candidates(candidates, count, total, 1));
// CHECK:         KVC_CUDA_TRY(kvc_evict(context, sequence, head / kKvHeads, head % kKvHeads, numVictims, victims));
