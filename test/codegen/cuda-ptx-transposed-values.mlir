// The tensor-core decodes at G <= 4 sum their values as O^T += V^T P^T
// (runtime/kvc_cuda.cuh, MmaDecode::kTransposedValues and
// KiviMma::kTransposedValues; KVC_CUDA_MMA_TRANSPOSED_VALUES): one mma takes
// 16 value channels instead of 8. In the sm_90a PTX of generated libraries
// at G = 4, head dim 128, the 16-bit attention kernel's value sums are 8
// m16n8k8 a tile (its logits take m16n8k16) under the launch bound
// `.minnctapersm 5`, and the int2 KIVI kernel's are 16 bf16 m16n8k16 a tile
// (its logits take u8 m16n8k32). Built with KVC_CUDA_MMA_TRANSPOSED_VALUES=0
// (kvc-bench-gpu's plain_rowv and kivi2_rowv alternatives) they are 16 and
// 32, with four blocks asked for. No GPU is needed (nvcc -ptx).
//
// REQUIRES: nvcc
// RUN: rm -rf %t && mkdir -p %t/plain %t/kivi
// RUN: kvc-opt %kvc_src_root/policies/snapkv.mlir "--kvc-specialize=layers=2 q-heads=32 kv-heads=8 head-dim=128 dtype=f16" --kvc-form-kernels --kvc-emit="target=cuda output-dir=%t/plain" -o /dev/null
// RUN: kvc-opt %kvc_src_root/policies/kivi2.mlir "--kvc-specialize=layers=2 q-heads=32 kv-heads=8 head-dim=128 dtype=f16" --kvc-form-kernels --kvc-emit="target=cuda output-dir=%t/kivi" -o /dev/null
// RUN: %nvcc -std=c++17 -I%kvc_src_root -I%t/plain -gencode arch=compute_90a,code=sm_90a -ptx %t/plain/kvc_snapkv_cuda.cu -o %t/plain.ptx
// RUN: FileCheck %s --check-prefix=PLAIN < %t/plain.ptx
// RUN: %nvcc -std=c++17 -I%kvc_src_root -I%t/plain -DKVC_CUDA_MMA_TRANSPOSED_VALUES=0 -gencode arch=compute_90a,code=sm_90a -ptx %t/plain/kvc_snapkv_cuda.cu -o %t/plain-rows.ptx
// RUN: FileCheck %s --check-prefix=PLAIN-ROWS < %t/plain-rows.ptx
// RUN: %nvcc -std=c++17 -I%kvc_src_root -I%t/kivi -gencode arch=compute_90a,code=sm_90a -ptx %t/kivi/kvc_kivi2_cuda.cu -o %t/kivi.ptx
// RUN: FileCheck %s --check-prefix=KIVI < %t/kivi.ptx
// RUN: %nvcc -std=c++17 -I%kvc_src_root -I%t/kivi -DKVC_CUDA_MMA_TRANSPOSED_VALUES=0 -gencode arch=compute_90a,code=sm_90a -ptx %t/kivi/kvc_kivi2_cuda.cu -o %t/kivi-rows.ptx
// RUN: FileCheck %s --check-prefix=KIVI-ROWS < %t/kivi-rows.ptx

// PLAIN-LABEL: .entry _ZN3kvc4cuda20decodeAttentionSplitILi4ELi128ELNS0_7StorageE1E
// PLAIN: .minnctapersm 5
// PLAIN-COUNT-8: mma.sync.aligned.m16n8k8.row.col.f32.f16.f16.f32
// PLAIN-NOT: mma.sync.aligned.m16n8k8
// PLAIN-LABEL: .entry

// PLAIN-ROWS-LABEL: .entry _ZN3kvc4cuda109overrides_tc1_blocks4_prefill1_evict1_fold1_split1_ahead1_pdl1_foldahead2_sq1_tv0_discard1_last1_grid0_tiles020decodeAttentionSplitILi4ELi128E
// PLAIN-ROWS: .minnctapersm 4
// PLAIN-ROWS-COUNT-16: mma.sync.aligned.m16n8k8.row.col.f32.f16.f16.f32
// PLAIN-ROWS-NOT: mma.sync.aligned.m16n8k8
// PLAIN-ROWS-LABEL: .entry

// KIVI-LABEL: .entry _ZN3kvc4cuda19decodeAttentionKiviILi4ELi128ELi2ELi32E
// KIVI-COUNT-16: mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32
// KIVI-NOT: mma.sync.aligned.m16n8k16.row.col.f32.bf16
// KIVI-LABEL: .entry

// KIVI-ROWS-LABEL: .entry _ZN3kvc4cuda109overrides_tc1_blocks4_prefill1_evict1_fold1_split1_ahead1_pdl1_foldahead2_sq1_tv0_discard1_last1_grid0_tiles019decodeAttentionKiviILi4ELi128ELi2ELi32E
// KIVI-ROWS-COUNT-32: mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32
// KIVI-ROWS-NOT: mma.sync.aligned.m16n8k16.row.col.f32.bf16
// KIVI-ROWS-LABEL: .entry
