// The generated CUDA of the bundled policies with cross-head stages
// (duo_attention's head classes, TOVA's layer-wide score, AdaKV budgets) and
// prefill merges compiles with nvcc (architectures: see cuda-nvcc.mlir).
// No GPU is needed.
//
// REQUIRES: nvcc
// RUN: rm -rf %t && mkdir -p %t %t/g8
// RUN: kvc-opt %kvc_src_root/policies/duo_attention.mlir --kvc-specialize=model=smollm2-135m --kvc-form-kernels --kvc-emit="target=cuda output-dir=%t" -o /dev/null
// RUN: kvc-opt %kvc_src_root/policies/tova.mlir --kvc-specialize=model=smollm2-135m --kvc-form-kernels --kvc-emit="target=cuda output-dir=%t" -o /dev/null
// RUN: kvc-opt %kvc_src_root/policies/adakv.mlir --kvc-specialize=model=smollm2-135m --kvc-form-kernels --kvc-emit="target=cuda output-dir=%t" -o /dev/null
// RUN: kvc-opt %kvc_src_root/policies/pyramidkv_adakv.mlir --kvc-specialize=model=smollm2-135m --kvc-form-kernels --kvc-emit="target=cuda output-dir=%t" -o /dev/null
// RUN: %cmake -DBACKEND=cuda "-DPOLICIES=duo_attention;tova;adakv;pyramidkv_adakv" -DOUTPUT=%t/kvc_bundle_cuda.cu -P %kvc_src_root/codegen/KvcPolicyBundle.cmake
// RUN: %nvcc -std=c++17 -I%kvc_src_root -I%t -gencode arch=compute_80,code=sm_80 -gencode arch=compute_90a,code=sm_90a -c %t/kvc_bundle_cuda.cu -o %t/smollm2.o
// One kv-head, group 8, head_dim 128, bf16: the cross-head kernels with a single head.
// RUN: kvc-opt %kvc_src_root/policies/tova.mlir "--kvc-specialize=layers=2 q-heads=8 kv-heads=1 head-dim=128 dtype=bf16" --kvc-form-kernels --kvc-emit="target=cuda output-dir=%t/g8" -o /dev/null
// RUN: %nvcc -std=c++17 -I%kvc_src_root -I%t/g8 -gencode arch=compute_90a,code=sm_90a -c %t/g8/kvc_tova_cuda.cu -o %t/tova_g8.o
