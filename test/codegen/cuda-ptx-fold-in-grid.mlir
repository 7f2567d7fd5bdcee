// Under KVC_CUDA_FOLD_IN_GRID=1 a decode with statistics folds them in its
// attention grid (runtime/kvc_cuda.cuh, decodeAttentionFold): one kernel,
// whose blocks take their (head, split) items from the step's item counter
// before anything else, run their split, count in at the head's arrivals
// and then fold a range of a head that ended before (a wait that sleeps
// between its reads of the head's count), dropping its logits from L2. In
// the sm_90a PTX of a generated library built with it:
//  - decodeAttentionFold waits for the kernels before it and lets its
//    dependents start before it loads anything, then claims its item with
//    an atomic add;
//  - its wait reads the count volatile and sleeps (nanosleep), and fences
//    once the count is reached;
//  - the fold kernel (decodeFold) is not compiled: nothing launches it.
// Built without it, the library has no decodeAttentionFold, and its fold
// kernel is there. The emulated suites cudaemu.g3.grid and cudaemu.g3.grid.reordered
// run these decodes against the CPU backend. No GPU is needed (nvcc -ptx).
//
// REQUIRES: nvcc
// RUN: rm -rf %t && mkdir -p %t
// RUN: kvc-opt %kvc_src_root/bench/policies/h2o_decode.mlir "--kvc-specialize=layers=2 q-heads=8 kv-heads=2 head-dim=64 dtype=f16" --kvc-form-kernels --kvc-emit="target=cuda output-dir=%t" -o /dev/null
// RUN: %nvcc -std=c++17 -I%kvc_src_root -I%t -DKVC_CUDA_FOLD_IN_GRID=1 -gencode arch=compute_90a,code=sm_90a -ptx %t/kvc_h2o_decode_cuda.cu -o %t/grid.ptx
// RUN: FileCheck %s --check-prefix=GRID < %t/grid.ptx
// RUN: FileCheck %s --check-prefix=NOFOLD < %t/grid.ptx
// RUN: %nvcc -std=c++17 -I%kvc_src_root -I%t -gencode arch=compute_90a,code=sm_90a -ptx %t/kvc_h2o_decode_cuda.cu -o %t/default.ptx
// RUN: FileCheck %s --check-prefix=DEFAULT < %t/default.ptx

// GRID-LABEL: .entry {{.*}}decodeAttentionFoldILi4ELi64E
// GRID-NOT: ld.global
// GRID: griddepcontrol.wait;
// GRID-NOT: ld.global
// GRID: griddepcontrol.launch_dependents;
// GRID-NOT: ld.global
// GRID: atom.global.add.u32 {{%r[0-9]+}}, [{{%rd[0-9]+}}], 1;
// GRID: nanosleep.u32
// GRID: ld.volatile.u32
// GRID-NEXT: setp
// GRID: membar.gl;
// GRID: discard.global.L2 [{{%rd[0-9]+}}], 128;
// GRID: .entry

// NOFOLD-NOT: decodeFoldENS_16DecodeFoldRanges

// DEFAULT-NOT: decodeAttentionFold
// DEFAULT: .entry {{.*}}decodeFoldENS_16DecodeFoldRanges
// DEFAULT-NOT: decodeAttentionFold
