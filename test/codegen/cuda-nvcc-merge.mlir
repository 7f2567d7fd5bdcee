// The generated CUDA of the bundled policies that merge evicted prompt
// entries into kept ones (merge_nearest, h2o_merge, d2o, cam) compiles with
// nvcc (architectures: see cuda-nvcc.mlir). No GPU is needed.
//
// REQUIRES: nvcc
// RUN: rm -rf %t && mkdir -p %t %t/f32
// RUN: kvc-opt %kvc_src_root/policies/merge_nearest.mlir --kvc-specialize=model=smollm2-135m --kvc-form-kernels --kvc-emit="target=cuda output-dir=%t" -o /dev/null
// RUN: kvc-opt %kvc_src_root/policies/h2o_merge.mlir --kvc-specialize=model=smollm2-135m --kvc-form-kernels --kvc-emit="target=cuda output-dir=%t" -o /dev/null
// RUN: kvc-opt %kvc_src_root/policies/d2o.mlir --kvc-specialize=model=smollm2-135m --kvc-form-kernels --kvc-emit="target=cuda output-dir=%t" -o /dev/null
// RUN: kvc-opt %kvc_src_root/policies/cam.mlir --kvc-specialize=model=smollm2-135m --kvc-form-kernels --kvc-emit="target=cuda output-dir=%t" -o /dev/null
// RUN: %cmake -DBACKEND=cuda "-DPOLICIES=merge_nearest;h2o_merge;d2o;cam" -DOUTPUT=%t/kvc_bundle_cuda.cu -P %kvc_src_root/codegen/KvcPolicyBundle.cmake
// RUN: %nvcc -std=c++17 -I%kvc_src_root -I%t -gencode arch=compute_90a,code=sm_90a -c %t/kvc_bundle_cuda.cu -o %t/smollm2.o
// f32 storage, group 1: the merged rows stored without rounding.
// RUN: kvc-opt %kvc_src_root/policies/merge_nearest.mlir "--kvc-specialize=layers=2 q-heads=2 kv-heads=2 head-dim=64 dtype=f32" --kvc-form-kernels --kvc-emit="target=cuda output-dir=%t/f32" -o /dev/null
// RUN: %nvcc -std=c++17 -I%kvc_src_root -I%t/f32 -gencode arch=compute_90a,code=sm_90a -c %t/f32/kvc_merge_nearest_cuda.cu -o %t/merge_nearest_f32.o
