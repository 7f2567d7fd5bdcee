// The decode fold kernel asks ptxas for the four blocks per SM that
// planFold's one wave counts on (runtime/kvc_cuda.cuh, kFoldBlocksPerSM;
// the emitter's decodeFold): in the sm_90a PTX of a generated library the
// fold entry carries `.maxntid 256, 1, 1` and `.minnctapersm 4`, and
// ptxas fits it in 64 registers without a spill. Scissorhands at G = 8,
// head dim 128, bf16 (the GPU suite's g8 geometry) is the bundled fold
// that takes the most registers, 64 without the bound; a fold that needed
// more would spill under it, and this test would fail on it. No GPU is
// needed (nvcc -ptx, nvcc -cubin).
//
// REQUIRES: nvcc
// RUN: rm -rf %t && mkdir -p %t
// RUN: kvc-opt %kvc_src_root/policies/scissorhands.mlir "--kvc-specialize=layers=1 q-heads=8 kv-heads=1 head-dim=128 dtype=bf16" --kvc-form-kernels --kvc-emit="target=cuda output-dir=%t" -o /dev/null
// RUN: FileCheck %s --check-prefix=EMIT < %t/kvc_scissorhands_cuda.cu
// RUN: %nvcc -std=c++17 -I%kvc_src_root -I%t -gencode arch=compute_90a,code=sm_90a -ptx %t/kvc_scissorhands_cuda.cu -o %t/sm90.ptx
// RUN: FileCheck %s --check-prefix=PTX < %t/sm90.ptx
// RUN: %nvcc -std=c++17 -I%kvc_src_root -I%t -gencode arch=compute_90a,code=sm_90a -cubin -Xptxas -v %t/kvc_scissorhands_cuda.cu -o %t/sm90.cubin 2> %t/ptxas.txt
// RUN: FileCheck %s --check-prefix=PTXAS < %t/ptxas.txt

// EMIT: __global__ void __launch_bounds__(kvc::cuda::kFoldThreads, kvc::cuda::kFoldBlocksPerSM)
// EMIT-NEXT: decodeFold(

// PTX-LABEL: .entry {{.*}}decodeFold
// PTX: )
// PTX-NEXT: .maxntid 256, 1, 1
// PTX-NEXT: .minnctapersm 4

// PTXAS: Function properties for {{.*}}decodeFold
// PTXAS-NEXT: 0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
// PTXAS-NEXT: Used {{([1-5][0-9]|6[0-4]|[0-9])}} registers
