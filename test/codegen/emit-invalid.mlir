// Inputs kvc-emit rejects: a clear error and a non-zero exit.
//
// RUN: rm -rf %t && mkdir -p %t
// RUN: not kvc-opt %s --kvc-emit="target=cpu output-dir=%t" 2>&1 | FileCheck %s --check-prefix=NOKERNELS
// RUN: not kvc-opt %s --kvc-specialize=model=smollm2-135m --kvc-form-kernels --kvc-emit="target=cpu output-dir=%t.missing/dir" 2>&1 | FileCheck %s --check-prefix=NODIR
// RUN: not kvc-opt %s --kvc-specialize=model=smollm2-135m --kvc-form-kernels --kvc-emit="target=tpu output-dir=%t" 2>&1 | FileCheck %s --check-prefix=TARGET
// RUN: not kvc-opt %s --kvc-specialize=model=smollm2-135m --kvc-form-kernels --kvc-emit="target=cpu" 2>&1 | FileCheck %s --check-prefix=NOOUT

// NOKERNELS: error: 'kvc.policy' op has no kernels; run kvc-specialize and kvc-form-kernels first
// NODIR: error: kvc-emit: output directory '{{.*}}.missing/dir' does not exist
// An option's error is about the command line: the module is not printed
// after it.
// NODIR-NOT: see current operation
// TARGET: error: kvc-emit: unknown target 'tpu'
// TARGET-NOT: see current operation
// NOOUT: error: kvc-emit: output directory '' does not exist

kvc.policy @p {
  kvc.storage key #kvc.format<full> value #kvc.format<int8, per_token>
}
