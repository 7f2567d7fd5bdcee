// The generated code of two bundled policies, byte for byte, and the
// determinism of the emitter. After an intended change of the emitter,
// regenerate the golden files with the same kvc-opt command lines.
//
// RUN: rm -rf %t && mkdir -p %t/a %t/b
// RUN: kvc-opt %kvc_src_root/policies/snapkv.mlir --kvc-specialize=model=smollm2-135m --kvc-form-kernels --kvc-emit="target=cpu output-dir=%t/a" -o /dev/null
// RUN: kvc-opt %kvc_src_root/policies/h2o.mlir --kvc-specialize=model=smollm2-135m --kvc-form-kernels --kvc-emit="target=cpu output-dir=%t/a" -o /dev/null
// RUN: diff %S/golden/kvc_snapkv_cpu.cpp %t/a/kvc_snapkv_cpu.cpp
// RUN: diff %S/golden/kvc_snapkv_cpu.h %t/a/kvc_snapkv_cpu.h
// RUN: diff %S/golden/kvc_h2o_cpu.cpp %t/a/kvc_h2o_cpu.cpp
// RUN: diff %S/golden/kvc_h2o_cpu.h %t/a/kvc_h2o_cpu.h
// RUN: kvc-opt %kvc_src_root/policies/h2o.mlir --kvc-specialize=model=smollm2-135m --kvc-form-kernels --kvc-emit="target=cpu output-dir=%t/b" -o /dev/null
// RUN: diff %t/a/kvc_h2o_cpu.cpp %t/b/kvc_h2o_cpu.cpp
