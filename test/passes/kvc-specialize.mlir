// kvc-specialize binds policies to a model geometry.
//
// RUN: kvc-opt %s --kvc-specialize=model=smollm2-135m | FileCheck %s --check-prefix=MODEL
// RUN: kvc-opt %s --kvc-specialize="layers=4 q-heads=8 kv-heads=2 head-dim=128 dtype=bf16" | FileCheck %s --check-prefix=SIZES
// RUN: not kvc-opt %s --kvc-specialize=model=gpt-5 2>&1 | FileCheck %s --check-prefix=UNKNOWN
// RUN: not kvc-opt %s --kvc-specialize 2>&1 | FileCheck %s --check-prefix=MISSING
// RUN: not kvc-opt %s --kvc-specialize="layers=4 q-heads=6 kv-heads=4 head-dim=64" 2>&1 | FileCheck %s --check-prefix=GQA
// RUN: not kvc-opt %s --kvc-specialize="model=smollm2-135m dtype=f64" 2>&1 | FileCheck %s --check-prefix=DTYPE
// RUN: not kvc-opt %s --kvc-specialize="layers=4 q-heads=8 kv-heads=2 head-dim=48" 2>&1 | FileCheck %s --check-prefix=GROUP

// RUN: not kvc-opt %s --kvc-specialize="model=smollm2-135m name=x" 2>&1 | FileCheck %s --check-prefix=RENAME-MANY

// RENAME-MANY: error: kvc-specialize: 'name' renames a module's only policy, but it holds 2

// MODEL: kvc.policy @a geometry #kvc.geometry<layers = 30, q_heads = 9, kv_heads = 3, head_dim = 64, dtype = f16> {
// MODEL: kvc.policy @b geometry #kvc.geometry<layers = 30, q_heads = 9, kv_heads = 3, head_dim = 64, dtype = f16> {
// SIZES: kvc.policy @a geometry #kvc.geometry<layers = 4, q_heads = 8, kv_heads = 2, head_dim = 128, dtype = bf16> {
// UNKNOWN: error: kvc-specialize: unknown model 'gpt-5'; known: smollm2-135m, llama-3.1-8b, mistral-7b
// An option's error is about the command line: the module is not printed
// after it.
// UNKNOWN-NOT: see current operation
// MISSING: error: kvc-specialize: give a model name or positive layers, q-heads, kv-heads and head-dim
// GQA: error: kvc-specialize: q_heads (6) must be a multiple of kv_heads (4)
// DTYPE: error: kvc-specialize: dtype must be f16, bf16 or f32, got 'f64'
// GROUP: error: 'kvc.storage' op value group size 32 does not divide the head dimension 48

kvc.policy @a {
  kvc.storage key #kvc.format<int2, per_channel, group = 32> value #kvc.format<int2, per_token, group = 32> residual 128
}
kvc.policy @b {
  kvc.phase over_budget {
    %n = kvc.key_norm
    %b = kvc.budget_uniform count 64
    %k = kvc.topk %n, %b tie recent : !kvc.score<kv_head>
    kvc.evict %k
  }
}

