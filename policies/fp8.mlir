// fp8 e4m3 storage: the 8-bit floating-point cache format serving engines
// already use, as a cheap baseline. Keys and values in e4m3 (bias 7, max
// 448) with one float scale per token and head (max|x| / 448). No eviction.
//
// RUN: kvc-opt %s | FileCheck %s
// RUN: kvc-opt %s --mlir-print-op-generic | kvc-opt | FileCheck %s

// CHECK-LABEL: kvc.policy @fp8 {
// CHECK-NEXT:    kvc.storage key #kvc.format<fp8_e4m3, per_token> value #kvc.format<fp8_e4m3, per_token>

kvc.policy @fp8 {
  kvc.storage key #kvc.format<fp8_e4m3, per_token>
              value #kvc.format<fp8_e4m3, per_token>
}
