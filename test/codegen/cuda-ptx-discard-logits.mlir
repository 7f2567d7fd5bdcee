// A decode fold block drops its range of the attention's logits from L2
// once it has read them (runtime/kvc_cuda.cuh, discardRowLines;
// KVC_CUDA_DISCARD_LOGITS): in the PTX of a generated library (sm_80 and
// sm_90a) the fold kernel discards lines after its loads of the logits
// and before the arrival that lets the last block run the stages, and no
// other kernel discards anything. Built with KVC_CUDA_DISCARD_LOGITS=0
// (kvc-bench-gpu's fused_keep alternative) nothing in the library
// discards. TOVA's fold writes the last query's probabilities, which its
// cross-head kernel reads last: there the cross-head kernel discards their
// lines after its loads, the fold its logits', and the stages after the
// cross-head op discard nothing. No GPU is needed (nvcc -ptx).
//
// REQUIRES: nvcc
// RUN: rm -rf %t && mkdir -p %t
// RUN: kvc-opt %kvc_src_root/bench/policies/h2o_decode.mlir "--kvc-specialize=layers=2 q-heads=8 kv-heads=2 head-dim=64 dtype=f16" --kvc-form-kernels --kvc-emit="target=cuda output-dir=%t" -o /dev/null
// RUN: %nvcc -std=c++17 -I%kvc_src_root -I%t -gencode arch=compute_90a,code=sm_90a -ptx %t/kvc_h2o_decode_cuda.cu -o %t/sm90.ptx
// RUN: FileCheck %s --check-prefix=ON < %t/sm90.ptx
// RUN: %nvcc -std=c++17 -I%kvc_src_root -I%t -gencode arch=compute_80,code=sm_80 -ptx %t/kvc_h2o_decode_cuda.cu -o %t/sm80.ptx
// RUN: FileCheck %s --check-prefix=ON < %t/sm80.ptx
// RUN: %nvcc -std=c++17 -I%kvc_src_root -I%t -DKVC_CUDA_DISCARD_LOGITS=0 -gencode arch=compute_90a,code=sm_90a -ptx %t/kvc_h2o_decode_cuda.cu -o %t/off.ptx
// RUN: FileCheck %s --check-prefix=OFF < %t/off.ptx
// RUN: kvc-opt %kvc_src_root/policies/tova.mlir "--kvc-specialize=layers=2 q-heads=8 kv-heads=2 head-dim=64 dtype=f16" --kvc-form-kernels --kvc-emit="target=cuda output-dir=%t" -o /dev/null
// RUN: %nvcc -std=c++17 -I%kvc_src_root -I%t -gencode arch=compute_90a,code=sm_90a -ptx %t/kvc_tova_cuda.cu -o %t/tova.ptx
// RUN: FileCheck %s --check-prefix=TOVA < %t/tova.ptx
// RUN: %nvcc -std=c++17 -I%kvc_src_root -I%t -DKVC_CUDA_DISCARD_LOGITS=0 -gencode arch=compute_90a,code=sm_90a -ptx %t/kvc_tova_cuda.cu -o %t/tova-off.ptx
// RUN: FileCheck %s --check-prefix=OFF < %t/tova-off.ptx

// ON-NOT: discard.global.L2
// ON-LABEL: decodeFoldENS_16DecodeFoldRanges
// ON: ld.global.f32
// ON: discard.global.L2 [{{%rd[0-9]+}}], 128;
// ON: atom.add.u32
// ON-NOT: discard.global.L2

// OFF-NOT: discard.global

// TOVA-NOT: discard.global.L2
// TOVA-LABEL: decodeFoldENS_16DecodeFoldRanges
// TOVA: discard.global.L2 [{{%rd[0-9]+}}], 128;
// TOVA-LABEL: decodeStagesAcrossHeadsENS_15DecodeWorkspace
// TOVA: ld.global.f32
// TOVA: bar.sync 0;
// TOVA: discard.global.L2 [{{%rd[0-9]+}}], 128;
// TOVA-LABEL: decodeStagesAfterHeadsENS_15DecodeWorkspace
// TOVA-NOT: discard.global.L2
