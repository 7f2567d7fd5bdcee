// The generated CUDA of the remaining bundled policies with a device format
// compiles with nvcc for sm_80 and sm_90a (none of them is in the GPU test
// suite; see cuda-nvcc.mlir). No GPU is needed.
//
// REQUIRES: nvcc
// RUN: rm -rf %t && mkdir -p %t
// RUN: kvc-opt %kvc_src_root/policies/int8.mlir --kvc-specialize=model=smollm2-135m --kvc-form-kernels --kvc-emit="target=cuda output-dir=%t" -o /dev/null
// RUN: kvc-opt %kvc_src_root/policies/fp8.mlir --kvc-specialize=model=smollm2-135m --kvc-form-kernels --kvc-emit="target=cuda output-dir=%t" -o /dev/null
// RUN: kvc-opt %kvc_src_root/policies/a2sf.mlir --kvc-specialize=model=smollm2-135m --kvc-form-kernels --kvc-emit="target=cuda output-dir=%t" -o /dev/null
// RUN: kvc-opt %kvc_src_root/policies/keydiff.mlir --kvc-specialize=model=smollm2-135m --kvc-form-kernels --kvc-emit="target=cuda output-dir=%t" -o /dev/null
// RUN: kvc-opt %kvc_src_root/policies/knorm.mlir --kvc-specialize=model=smollm2-135m --kvc-form-kernels --kvc-emit="target=cuda output-dir=%t" -o /dev/null
// RUN: kvc-opt %kvc_src_root/policies/snapkv_maxpool.mlir --kvc-specialize=model=smollm2-135m --kvc-form-kernels --kvc-emit="target=cuda output-dir=%t" -o /dev/null
// RUN: kvc-opt %kvc_src_root/policies/value_aware.mlir --kvc-specialize=model=smollm2-135m --kvc-form-kernels --kvc-emit="target=cuda output-dir=%t" -o /dev/null
// RUN: %cmake -DBACKEND=cuda "-DPOLICIES=int8;fp8;a2sf;keydiff;knorm;snapkv_maxpool;value_aware" -DOUTPUT=%t/kvc_bundle_cuda.cu -P %kvc_src_root/codegen/KvcPolicyBundle.cmake
// RUN: %nvcc -std=c++17 -I%kvc_src_root -I%t -gencode arch=compute_80,code=sm_80 -gencode arch=compute_90a,code=sm_90a -c %t/kvc_bundle_cuda.cu -o %t/smollm2.o
