// The 16-bit decodes read the cache under an L2 evict-first policy
// (runtime/kvc_cuda.cuh, streamPolicy; KVC_CUDA_EVICT_FIRST): in the PTX of
// a generated library, the decode attention kernel creates the policy and
// attaches it to its cache reads: the cp.async copies of the tensor-core
// path (G = 3) and the 16-byte loads of the row path (G = 1). Built with
// KVC_CUDA_EVICT_FIRST=0 (kvc-bench-gpu's fused_lru alternative) nothing in
// the library reads under a cache policy and the copies are the plain ones
// (the logit stores keep theirs: cuda-ptx-logits-evict-last.mlir). The
// prefill kernels are not affected either way. No GPU is needed (nvcc
// -ptx).
//
// REQUIRES: nvcc
// RUN: rm -rf %t && mkdir -p %t/g3 %t/g1
// RUN: kvc-opt %kvc_src_root/policies/snapkv.mlir --kvc-specialize=model=smollm2-135m --kvc-form-kernels --kvc-emit="target=cuda output-dir=%t/g3" -o /dev/null
// RUN: kvc-opt %kvc_src_root/policies/snapkv.mlir "--kvc-specialize=layers=2 q-heads=2 kv-heads=2 head-dim=64 dtype=f16" --kvc-form-kernels --kvc-emit="target=cuda output-dir=%t/g1" -o /dev/null
// RUN: %nvcc -std=c++17 -I%kvc_src_root -I%t/g3 -gencode arch=compute_90a,code=sm_90a -ptx %t/g3/kvc_snapkv_cuda.cu -o %t/g3.ptx
// RUN: FileCheck %s --check-prefix=MMA < %t/g3.ptx
// RUN: %nvcc -std=c++17 -I%kvc_src_root -I%t/g1 -gencode arch=compute_90a,code=sm_90a -ptx %t/g1/kvc_snapkv_cuda.cu -o %t/g1.ptx
// RUN: FileCheck %s --check-prefix=ROWS < %t/g1.ptx
// RUN: %nvcc -std=c++17 -I%kvc_src_root -I%t/g3 -DKVC_CUDA_EVICT_FIRST=0 -gencode arch=compute_90a,code=sm_90a -ptx %t/g3/kvc_snapkv_cuda.cu -o %t/g3-off.ptx
// RUN: FileCheck %s --check-prefix=OFF < %t/g3-off.ptx

// MMA-LABEL: .entry _ZN3kvc4cuda16prefillAttentionILi3ELi64E
// MMA-NOT: cache_hint
// MMA-LABEL: .entry _ZN3kvc4cuda20decodeAttentionSplitILi3ELi64E
// MMA: createpolicy.fractional.L2::evict_first.b64 [[POLICY:%rd[0-9]+]], 1.0;
// MMA: cp.async.cg.shared.global.L2::cache_hint [{{%r[0-9]+}}], [{{%rd[0-9]+}}], 16, [[POLICY]];
// MMA: cp.async.cg.shared.global.L2::cache_hint [{{%r[0-9]+}}], [{{%rd[0-9]+}}], 16, [[POLICY]];
// MMA-LABEL: .entry _ZN3kvc4cuda12storeEntries

// ROWS-LABEL: .entry _ZN3kvc4cuda20decodeAttentionSplitILi1ELi64E
// ROWS: createpolicy.fractional.L2::evict_first.b64 [[POLICY:%rd[0-9]+]], 1.0;
// ROWS: ld.global.nc.L2::cache_hint.v4.u32 {{.*}}, [{{%rd[0-9]+}}], [[POLICY]];
// ROWS-LABEL: .entry _ZN3kvc4cuda12storeEntries

// OFF-NOT: evict_first
// OFF-NOT: ld.global.nc.L2::cache_hint
// OFF-NOT: cp.async.cg.shared.global.L2::cache_hint
// OFF-LABEL: .entry _ZN3kvc4cuda109overrides_tc1_blocks4_prefill1_evict0_fold1_split1_ahead1_pdl1_foldahead2_sq1_tv1_discard1_last1_grid0_tiles020decodeAttentionSplitILi3ELi64E
// OFF-NOT: evict_first
// OFF-NOT: ld.global.nc.L2::cache_hint
// OFF-NOT: cp.async.cg.shared.global.L2::cache_hint
// OFF: cp.async.cg.shared.global [{{%r[0-9]+}}], [{{%rd[0-9]+}}], 16;
// OFF-NOT: evict_first
// OFF-NOT: ld.global.nc.L2::cache_hint
// OFF-NOT: cp.async.cg.shared.global.L2::cache_hint
