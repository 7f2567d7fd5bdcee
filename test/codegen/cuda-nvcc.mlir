// The generated CUDA of the bundled policies compiles with nvcc: these four
// here, the others in cuda-nvcc-more.mlir, cuda-nvcc-cross.mlir,
// cuda-nvcc-merge.mlir, cuda-nvcc-kivi.mlir, cuda-nvcc-mixed.mlir and
// cuda-nvcc-stateful.mlir (files of their own so that lit runs them side by
// side). Two more builds here cover the other element types and GQA shapes
// (bf16, head_dim 128, group 8; f32, group 1) and the unfused pipeline. No
// GPU is needed.
//
// Architectures (all cuda-nvcc files): every build is for sm_90a, and for
// sm_80 too unless the GPU test suite compiles the same policy in the same
// form (fused or unfused) for sm_80 in the build (test/gpu, built wherever
// CMake finds nvcc). The sources take the same paths on both architectures
// (every architecture branch of runtime/kvc_cuda.cuh is at sm_80), so such
// an sm_80 pass here would repeat one that the build already makes.
//
// The policies of SmolLM2's geometry in each file compile together, as one
// translation unit (codegen/KvcPolicyBundle.cmake writes it; it is the one
// kvc_add_policy_library's POLICIES compiles), so that the kernels they
// share compile once; such a bundle is also built for sm_80 when one of its
// policies is. The other geometries' builds compile a generated source
// alone, as a library of one POLICY does.
//
// REQUIRES: nvcc
// RUN: rm -rf %t && mkdir -p %t/f16 %t/bf16 %t/f32
// RUN: kvc-opt %kvc_src_root/policies/streaming_llm.mlir --kvc-specialize=model=smollm2-135m --kvc-form-kernels --kvc-emit="target=cuda output-dir=%t/f16" -o /dev/null
// RUN: kvc-opt %kvc_src_root/policies/h2o.mlir --kvc-specialize=model=smollm2-135m --kvc-form-kernels --kvc-emit="target=cuda output-dir=%t/f16" -o /dev/null
// RUN: kvc-opt %kvc_src_root/policies/snapkv.mlir --kvc-specialize=model=smollm2-135m --kvc-form-kernels --kvc-emit="target=cuda output-dir=%t/f16" -o /dev/null
// RUN: kvc-opt %kvc_src_root/policies/pyramidkv.mlir --kvc-specialize=model=smollm2-135m --kvc-form-kernels --kvc-emit="target=cuda output-dir=%t/f16" -o /dev/null
// RUN: kvc-opt %kvc_src_root/policies/h2o.mlir "--kvc-specialize=layers=2 q-heads=8 kv-heads=1 head-dim=128 dtype=bf16" --kvc-form-kernels=unfused=1 --kvc-emit="target=cuda output-dir=%t/bf16" -o /dev/null
// RUN: kvc-opt %kvc_src_root/policies/snapkv.mlir "--kvc-specialize=layers=2 q-heads=2 kv-heads=2 head-dim=64 dtype=f32" --kvc-form-kernels --kvc-emit="target=cuda output-dir=%t/f32" -o /dev/null
// RUN: %cmake -DBACKEND=cuda "-DPOLICIES=streaming_llm;h2o;snapkv;pyramidkv" -DOUTPUT=%t/f16/kvc_bundle_cuda.cu -P %kvc_src_root/codegen/KvcPolicyBundle.cmake
// RUN: %nvcc -std=c++17 -I%kvc_src_root -I%t/f16 -gencode arch=compute_90a,code=sm_90a -c %t/f16/kvc_bundle_cuda.cu -o %t/f16.o
// RUN: %nvcc -std=c++17 -I%kvc_src_root -I%t/bf16 -gencode arch=compute_80,code=sm_80 -gencode arch=compute_90a,code=sm_90a -c %t/bf16/kvc_h2o_cuda.cu -o %t/h2o_unfused.o
// RUN: %nvcc -std=c++17 -I%kvc_src_root -I%t/f32 -gencode arch=compute_90a,code=sm_90a -c %t/f32/kvc_snapkv_cuda.cu -o %t/snapkv_f32.o
// RUN: %nvcc -std=c++17 -I%kvc_src_root -x cu -gencode arch=compute_80,code=sm_80 -c %kvc_src_root/runtime/kvc_cuda.cuh -o %t/header.o
