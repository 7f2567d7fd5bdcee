// kvc-specialize name=... renames the policy, which names the library.
//
// RUN: kvc-opt %s --kvc-specialize="model=smollm2-135m name=h2o_unfused" | FileCheck %s
// RUN: not kvc-opt %s --kvc-specialize="model=smollm2-135m name=bad-name" 2>&1 | FileCheck %s --check-prefix=BAD

// CHECK: kvc.policy @h2o_unfused geometry #kvc.geometry<layers = 30, q_heads = 9, kv_heads = 3, head_dim = 64, dtype = f16> {
// BAD: error: kvc-specialize: policy name 'bad-name' must be letters, digits and '_'
kvc.policy @h2o {
  kvc.storage key #kvc.format<full> value #kvc.format<int8, per_token>
}
