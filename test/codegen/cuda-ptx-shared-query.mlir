// The 16-bit tensor-core decode at head dim 128 reads its query fragments
// from shared memory and asks for five blocks per SM at G <= 4 (four with
// KVC_CUDA_MMA_TRANSPOSED_VALUES=0, cuda-ptx-transposed-values.mlir)
// (runtime/kvc_cuda.cuh, MmaDecode::kSharedQuery and kMinBlocks;
// KVC_CUDA_MMA_SHARED_QUERY): in the
// sm_90a PTX of a generated library (G = 4, head dim 128), the attention
// kernel carries the launch bound `.minnctapersm 5` and a 4 KiB shared
// array of the query's fragments (8 steps x 32 lanes x 16 bytes, a step
// 512 bytes on), which its logits loop loads 16 bytes a lane and step
// ahead of the mma.sync. Built
// with KVC_CUDA_MMA_SHARED_QUERY=0 (kvc-bench-gpu's plain_regq
// alternative) the kernel has neither. At head dim 64 the fragments stay
// in registers, under the launch bound of the transposed value sums
// (`.minnctapersm 6`). No GPU is needed (nvcc -ptx).
//
// REQUIRES: nvcc
// RUN: rm -rf %t && mkdir -p %t/d128 %t/d64
// RUN: kvc-opt %kvc_src_root/policies/snapkv.mlir "--kvc-specialize=layers=2 q-heads=32 kv-heads=8 head-dim=128 dtype=f16" --kvc-form-kernels --kvc-emit="target=cuda output-dir=%t/d128" -o /dev/null
// RUN: kvc-opt %kvc_src_root/policies/snapkv.mlir "--kvc-specialize=layers=2 q-heads=32 kv-heads=8 head-dim=64 dtype=f16" --kvc-form-kernels --kvc-emit="target=cuda output-dir=%t/d64" -o /dev/null
// RUN: %nvcc -std=c++17 -I%kvc_src_root -I%t/d128 -gencode arch=compute_90a,code=sm_90a -ptx %t/d128/kvc_snapkv_cuda.cu -o %t/d128.ptx
// RUN: FileCheck %s --check-prefix=SHARED < %t/d128.ptx
// RUN: %nvcc -std=c++17 -I%kvc_src_root -I%t/d128 -DKVC_CUDA_MMA_SHARED_QUERY=0 -gencode arch=compute_90a,code=sm_90a -ptx %t/d128/kvc_snapkv_cuda.cu -o %t/d128-off.ptx
// RUN: FileCheck %s --check-prefix=OFF < %t/d128-off.ptx
// RUN: %nvcc -std=c++17 -I%kvc_src_root -I%t/d64 -gencode arch=compute_90a,code=sm_90a -ptx %t/d64/kvc_snapkv_cuda.cu -o %t/d64.ptx
// RUN: FileCheck %s --check-prefix=D64 < %t/d64.ptx

// SHARED-LABEL: .entry _ZN3kvc4cuda20decodeAttentionSplitILi4ELi128ELNS0_7StorageE1E
// SHARED-NEXT: .param
// SHARED-NEXT: )
// SHARED-NEXT: .maxntid 128, 1, 1
// SHARED-NEXT: .minnctapersm 5
// SHARED: .shared .align 16 .b8 _ZZN3kvc4cuda13decodeMmaRowsILi4ELi128E{{.*}}sharedQuery[4096];
// SHARED: ld.shared.v4.u32 {{.*}}+512];
// SHARED: ld.shared.v4.u32 {{.*}}+3584];
// SHARED: mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32
// SHARED-LABEL: .entry

// OFF-LABEL: .entry _ZN3kvc4cuda109overrides_tc1_blocks4_prefill1_evict1_fold1_split1_ahead1_pdl1_foldahead2_sq0_tv1_discard1_last1_grid0_tiles020decodeAttentionSplitILi4ELi128E
// OFF-NEXT: .param
// OFF-NEXT: )
// OFF-NEXT: .maxntid 128, 1, 1
// OFF-NOT: .minnctapersm
// OFF-NOT: sharedQuery
// OFF: mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32
// OFF-NOT: sharedQuery
// OFF-LABEL: .entry

// D64-LABEL: .entry _ZN3kvc4cuda20decodeAttentionSplitILi4ELi64ELNS0_7StorageE1E
// D64-NEXT: .param
// D64-NEXT: )
// D64-NEXT: .maxntid 128, 1, 1
// D64-NEXT: .minnctapersm 6
// D64-NOT: sharedQuery
// D64: mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32
// D64-NOT: sharedQuery
// D64-LABEL: .entry
