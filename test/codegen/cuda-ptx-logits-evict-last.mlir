// The decode attention stores its logits under an L2 evict-last policy for
// the share of them that half of L2 holds, where the fold reads them back
// and discards them (runtime/kvc_cuda.cuh, logitPolicy, storeLogitIf;
// KVC_CUDA_LOGITS_EVICT_LAST): in the PTX of a generated library (sm_80
// and sm_90a) the attention kernel makes the policy from its argument
// (evict last with the fraction, the other lines unchanged) and stores
// the logits with it, predicated; no other kernel stores with a policy.
// Built with KVC_CUDA_LOGITS_EVICT_LAST=0 (kvc-bench-gpu's fused_norm
// alternative), or with KVC_CUDA_DISCARD_LOGITS=0 (fused_keep: no discard,
// so no line may stay evict-last), nothing in the library does. No GPU is
// needed (nvcc -ptx).
//
// REQUIRES: nvcc
// RUN: rm -rf %t && mkdir -p %t
// RUN: kvc-opt %kvc_src_root/bench/policies/h2o_decode.mlir "--kvc-specialize=layers=2 q-heads=8 kv-heads=2 head-dim=64 dtype=f16" --kvc-form-kernels --kvc-emit="target=cuda output-dir=%t" -o /dev/null
// RUN: %nvcc -std=c++17 -I%kvc_src_root -I%t -gencode arch=compute_90a,code=sm_90a -ptx %t/kvc_h2o_decode_cuda.cu -o %t/sm90.ptx
// RUN: FileCheck %s --check-prefix=ON < %t/sm90.ptx
// RUN: %nvcc -std=c++17 -I%kvc_src_root -I%t -gencode arch=compute_80,code=sm_80 -ptx %t/kvc_h2o_decode_cuda.cu -o %t/sm80.ptx
// RUN: FileCheck %s --check-prefix=ON < %t/sm80.ptx
// RUN: %nvcc -std=c++17 -I%kvc_src_root -I%t -DKVC_CUDA_LOGITS_EVICT_LAST=0 -gencode arch=compute_90a,code=sm_90a -ptx %t/kvc_h2o_decode_cuda.cu -o %t/off.ptx
// RUN: FileCheck %s --check-prefix=OFF < %t/off.ptx
// RUN: %nvcc -std=c++17 -I%kvc_src_root -I%t -DKVC_CUDA_DISCARD_LOGITS=0 -gencode arch=compute_90a,code=sm_90a -ptx %t/kvc_h2o_decode_cuda.cu -o %t/keep.ptx
// RUN: FileCheck %s --check-prefix=OFF < %t/keep.ptx

// ON-NOT: st.global.L2::cache_hint
// ON: .entry _ZN3kvc4cuda20decodeAttentionSplitILi4ELi64E
// ON: createpolicy.fractional.L2::evict_last.L2::evict_unchanged.b64 [[POLICY:%rd[0-9]+]], %f{{[0-9]+}};
// ON: @p st.global.L2::cache_hint.f32 [{{%rd[0-9]+}}], %f{{[0-9]+}}, [[POLICY]];
// ON: .entry
// ON-NOT: st.global.L2::cache_hint

// OFF-NOT: evict_last
// OFF-NOT: st.global.L2::cache_hint
