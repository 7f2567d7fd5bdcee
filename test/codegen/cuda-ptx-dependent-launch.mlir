// A decode step's attention and fold kernels are launched as programmatic
// dependents of the kernel before each (runtime/kvc_cuda.cuh,
// launchDependent; KVC_CUDA_DEPENDENT_LAUNCH). In the sm_90a PTX of a
// generated library:
//  - the attention kernel waits for the kernels before it
//    (griddepcontrol.wait) before anything else, then lets the fold start
//    its blocks (griddepcontrol.launch_dependents);
//  - the fold reads only its HeadTable (integer and pointer fields) and
//    asks L2 for its first passes' lines before its wait: no float (logit,
//    split record) is loaded and no atomic runs ahead of it;
//  - the step's first kernel (storeAppended) lets the attention start.
// In sm_80 PTX, and under KVC_CUDA_DEPENDENT_LAUNCH=0 (kvc-bench-gpu's
// fused_serial alternative), there is no griddepcontrol at all. No GPU is
// needed (nvcc -ptx).
//
// REQUIRES: nvcc
// RUN: rm -rf %t && mkdir -p %t
// RUN: kvc-opt %kvc_src_root/bench/policies/h2o_decode.mlir "--kvc-specialize=layers=2 q-heads=8 kv-heads=2 head-dim=64 dtype=f16" --kvc-form-kernels --kvc-emit="target=cuda output-dir=%t" -o /dev/null
// RUN: %nvcc -std=c++17 -I%kvc_src_root -I%t -gencode arch=compute_90a,code=sm_90a -ptx %t/kvc_h2o_decode_cuda.cu -o %t/sm90.ptx
// RUN: FileCheck %s --check-prefix=SM90 < %t/sm90.ptx
// RUN: %nvcc -std=c++17 -I%kvc_src_root -I%t -gencode arch=compute_80,code=sm_80 -ptx %t/kvc_h2o_decode_cuda.cu -o %t/sm80.ptx
// RUN: FileCheck %s --check-prefix=OFF < %t/sm80.ptx
// RUN: %nvcc -std=c++17 -I%kvc_src_root -I%t -DKVC_CUDA_DEPENDENT_LAUNCH=0 -gencode arch=compute_90a,code=sm_90a -ptx %t/kvc_h2o_decode_cuda.cu -o %t/sm90-off.ptx
// RUN: FileCheck %s --check-prefix=OFF < %t/sm90-off.ptx

// SM90-LABEL: .entry _ZN3kvc4cuda20decodeAttentionSplitILi4ELi64E
// SM90-NOT: ld.global
// SM90-NOT: st.global
// SM90: griddepcontrol.wait;
// SM90-NOT: ld.global
// SM90-NOT: st.global
// SM90: griddepcontrol.launch_dependents;
// SM90-LABEL: .entry _ZN3kvc4cuda13storeAppendedILi64E
// SM90-NOT: ld.global
// SM90: griddepcontrol.launch_dependents;
// SM90-LABEL: decodeFoldENS_16DecodeFoldRangesE
// SM90-NOT: ld.global.f32
// SM90-NOT: ld.global.v{{[24]}}.f32
// SM90-NOT: atom
// SM90-NOT: st.global
// SM90: prefetch.global.L2
// SM90-NOT: ld.global.f32
// SM90-NOT: atom
// SM90-NOT: st.global
// SM90: griddepcontrol.wait;
// SM90-NOT: griddepcontrol

// OFF-NOT: griddepcontrol
