// KIVI, 4-bit: "KIVI: A Tuning-Free Asymmetric 2bit Quantization for KV
// Cache" (Liu et al., 2024), with the paper's 4-bit setting: keys per
// channel and values per token in groups of G = 32, the R = 128 most recent
// entries in full precision. No eviction. {scale, min} pairs are stored
// as two f16, as in kivi2.mlir.
//
// RUN: kvc-opt %s | FileCheck %s
// RUN: kvc-opt %s --mlir-print-op-generic | kvc-opt | FileCheck %s

// CHECK-LABEL: kvc.policy @kivi4 {
// CHECK-NEXT:    kvc.storage key #kvc.format<int4, per_channel, group = 32> value #kvc.format<int4, per_token, group = 32> residual 128

kvc.policy @kivi4 {
  kvc.storage key #kvc.format<int4, per_channel, group = 32>
              value #kvc.format<int4, per_token, group = 32> residual 128
}
