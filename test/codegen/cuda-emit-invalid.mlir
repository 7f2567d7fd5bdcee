// The CUDA emitter rejects storage the runtime has no format for, with a
// located error and a non-zero exit.
//
// RUN: rm -rf %t && mkdir -p %t
// RUN: not kvc-opt %s --kvc-specialize=model=smollm2-135m --kvc-form-kernels --kvc-emit="target=cuda output-dir=%t" -o /dev/null 2>&1 | FileCheck %s
// RUN: not kvc-opt %s --kvc-specialize=model=smollm2-135m --kvc-form-kernels --kvc-emit="target=metal output-dir=%t" -o /dev/null 2>&1 | FileCheck %s --check-prefix=TARGET

// CHECK: cuda-emit-invalid.mlir:[[@LINE+3]]:3: error: 'kvc.gather' op storage formats #kvc.format<int2, per_channel, group = 32> / #kvc.format<int4, per_token, group = 32> have no runtime format
// TARGET: error: kvc-emit: unknown target 'metal'; expected cpu or cuda
kvc.policy @mixed_bits {
  kvc.storage key #kvc.format<int2, per_channel, group = 32>
              value #kvc.format<int4, per_token, group = 32> residual 128
}
