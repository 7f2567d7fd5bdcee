// The generated CUDA of mixed precision (a low page class of per-token int2 /
// int4 in channel groups beside the storage format) compiles with nvcc
// (architectures: see cuda-nvcc.mlir): the bundled
// policies/mixed_precision.mlir (int8 high, int2 low in groups of 32) at
// SmolLM2's geometry and at head_dim 128 in bf16, and the policy below
// (full-precision high, int4 low in groups of 4, after a SnapKV selection)
// in f32 and f16, whose 16-byte vectors hold 4 and 8 channels, so that one
// group spans several vectors or one vector several groups. No GPU is
// needed.
//
// REQUIRES: nvcc
// RUN: rm -rf %t && mkdir -p %t/smollm2 %t/d128 %t/f32 %t/f16
// RUN: kvc-opt %kvc_src_root/policies/mixed_precision.mlir --kvc-specialize=model=smollm2-135m --kvc-form-kernels --kvc-emit="target=cuda output-dir=%t/smollm2" -o /dev/null
// RUN: FileCheck %s --input-file=%t/smollm2/kvc_mixed_precision_cuda.cu
// RUN: %nvcc -std=c++17 -I%kvc_src_root -I%t/smollm2 -gencode arch=compute_90a,code=sm_90a -c %t/smollm2/kvc_mixed_precision_cuda.cu -o %t/mixed_precision.o
// RUN: kvc-opt %kvc_src_root/policies/mixed_precision.mlir "--kvc-specialize=layers=2 q-heads=8 kv-heads=1 head-dim=128 dtype=bf16" --kvc-form-kernels --kvc-emit="target=cuda output-dir=%t/d128" -o /dev/null
// RUN: %nvcc -std=c++17 -I%kvc_src_root -I%t/d128 -gencode arch=compute_90a,code=sm_90a -c %t/d128/kvc_mixed_precision_cuda.cu -o %t/mixed_precision_d128.o
// RUN: kvc-opt %s "--kvc-specialize=layers=2 q-heads=4 kv-heads=2 head-dim=64 dtype=f32" --kvc-form-kernels --kvc-emit="target=cuda output-dir=%t/f32" -o /dev/null
// RUN: FileCheck %s --check-prefix=SELECT --input-file=%t/f32/kvc_mixed_select_cuda.cu
// RUN: %nvcc -std=c++17 -I%kvc_src_root -I%t/f32 -gencode arch=compute_80,code=sm_80 -gencode arch=compute_90a,code=sm_90a -c %t/f32/kvc_mixed_select_cuda.cu -o %t/mixed_select_f32.o
// RUN: kvc-opt %s "--kvc-specialize=layers=2 q-heads=4 kv-heads=2 head-dim=32 dtype=f16" --kvc-form-kernels --kvc-emit="target=cuda output-dir=%t/f16" -o /dev/null
// RUN: %nvcc -std=c++17 -I%kvc_src_root -I%t/f16 -gencode arch=compute_80,code=sm_80 -gencode arch=compute_90a,code=sm_90a -c %t/f16/kvc_mixed_select_cuda.cu -o %t/mixed_select_f16.o

// The bundled policy: the prefill ranks on the device and appends each
// class; decode reads both.
// CHECK:      constexpr int kLowBits = 2;
// CHECK-NEXT: constexpr int kLowGroup = 32;
// CHECK:      constexpr int32_t kLowFormat = KVC_FORMAT_INT2;
// CHECK:      kvc::cuda::markHighPrecision<kStageThreads>(s1, positions, n, nullptr, 0.20000000000000001,
// CHECK:      KVC_CUDA_TRY(kvc_append(context, sequence, layer, h, numHigh,
// CHECK:      KVC_CUDA_TRY(kvc_append_format(context, sequence, layer, h, kLowFormat, count - numHigh,
// CHECK:      kvc::cuda::launchLowStores<kHeadDim, kLowBits, kLowGroup>(
// CHECK:      &kvc::cuda::decodeAttentionSplit<kGroup, kHeadDim, kStorage, kvc::cuda::kDecodeThreads,
// CHECK-NEXT:                                          kLowBits, kLowGroup>,
// CHECK-NEXT:         kvc::cuda::kDecodeThreads>(
// CHECK:      kvc::cuda::devicePageLayout(config, layout, lowLayout)
// CHECK:      // codes, dequantized in registers.
// CHECK:      KVC_CUDA_TRY((kvc::cuda::launchDependent<
// CHECK-NEXT:     &kvc::cuda::decodeAttentionSplit<kGroup, kHeadDim, kStorage, kvc::cuda::kDecodeThreads,
// CHECK-NEXT:                                      kLowBits, kLowGroup>>(
// CHECK:      config->group_size = kLowGroup;
// CHECK:      config->low_format = kLowFormat;

// A selection first: the ranking covers the kept entries only.
// SELECT:     constexpr kvc::cuda::Storage kStorage = kvc::cuda::Storage::F32;
// SELECT:     constexpr int kLowBits = 4;
// SELECT-NEXT: constexpr int kLowGroup = 4;
// SELECT:     kvc::cuda::selectVictims<kStageThreads>(
// SELECT:     kvc::cuda::markHighPrecision<kStageThreads>(s{{[0-9]+}}, positions, n, victim, 0.5,
// SELECT:     order[isHigh[index[j]] ? hi++ : lo++] = index[j];

kvc.policy @mixed_select {
  kvc.phase after_prefill {
    %window = kvc.attn_window size 16
    %group = kvc.group_reduce mean %window
    %score = kvc.protect %group sinks 4 recent 16 : !kvc.score<kv_head>
    %budget = kvc.budget_uniform count 256
    %keep = kvc.topk %score, %budget tie recent : !kvc.score<kv_head>
    kvc.evict %keep
    kvc.mixed_precision %score high #kvc.format<full>
        low #kvc.format<int4, per_token, group = 4> fraction 0.5
        : !kvc.score<kv_head>
  }
}
