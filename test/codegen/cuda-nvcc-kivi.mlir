// The generated CUDA of the three KIVI policies (device pools: the runtime
// records each append's quantization work, kiviQuantize / kiviStageRows do
// it, decodeAttentionKivi dequantizes in registers) compiles with nvcc
// (architectures: see cuda-nvcc.mlir). No GPU is needed.
//
// REQUIRES: nvcc
// RUN: rm -rf %t && mkdir -p %t
// RUN: kvc-opt %kvc_src_root/policies/kivi2.mlir --kvc-specialize=model=smollm2-135m --kvc-form-kernels --kvc-emit="target=cuda output-dir=%t" -o /dev/null
// RUN: kvc-opt %kvc_src_root/policies/kivi4.mlir --kvc-specialize=model=smollm2-135m --kvc-form-kernels --kvc-emit="target=cuda output-dir=%t" -o /dev/null
// RUN: kvc-opt %kvc_src_root/policies/snapkv_kivi2.mlir --kvc-specialize=model=smollm2-135m --kvc-form-kernels --kvc-emit="target=cuda output-dir=%t" -o /dev/null
// RUN: %cmake -DBACKEND=cuda "-DPOLICIES=kivi2;kivi4;snapkv_kivi2" -DOUTPUT=%t/kvc_bundle_cuda.cu -P %kvc_src_root/codegen/KvcPolicyBundle.cmake
// RUN: %nvcc -std=c++17 -I%kvc_src_root -I%t -gencode arch=compute_90a,code=sm_90a -c %t/kvc_bundle_cuda.cu -o %t/smollm2.o
// RUN: kvc-opt %kvc_src_root/policies/kivi4.mlir --kvc-specialize="layers=2 q-heads=8 kv-heads=1 head-dim=128 dtype=bf16" --kvc-form-kernels --kvc-emit="target=cuda output-dir=%t" -o /dev/null
// RUN: %nvcc -std=c++17 -I%kvc_src_root -I%t -gencode arch=compute_90a,code=sm_90a -c %t/kvc_kivi4_cuda.cu -o %t/kivi4-d128.o
