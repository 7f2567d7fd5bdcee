// A policy already bound to another geometry is not rebound silently.
//
// RUN: not kvc-opt %s --kvc-specialize=model=smollm2-135m 2>&1 | FileCheck %s

// CHECK: error: 'kvc.policy' op is already specialized to #kvc.geometry<layers = 32, q_heads = 32, kv_heads = 8, head_dim = 128, dtype = f16>
kvc.policy @a geometry #kvc.geometry<layers = 32, q_heads = 32, kv_heads = 8, head_dim = 128, dtype = f16> {
  kvc.storage key #kvc.format<full> value #kvc.format<int8, per_token>
}
