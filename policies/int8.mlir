// int8 storage: symmetric 8-bit integers with one float scale per token and
// head (max|x| / 127), the int8 KV-cache format of serving engines, as a
// baseline. No eviction.
//
// RUN: kvc-opt %s | FileCheck %s
// RUN: kvc-opt %s --mlir-print-op-generic | kvc-opt | FileCheck %s

// CHECK-LABEL: kvc.policy @int8 {
// CHECK-NEXT:    kvc.storage key #kvc.format<int8, per_token> value #kvc.format<int8, per_token>

kvc.policy @int8 {
  kvc.storage key #kvc.format<int8, per_token>
              value #kvc.format<int8, per_token>
}
