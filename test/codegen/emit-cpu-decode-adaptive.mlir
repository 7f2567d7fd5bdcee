// AdaKV budgets at decode (no bundled policy reallocates at every step):
// the cross-head stage reads every head's padded rows, and the generated
// C++ compiles.
//
// REQUIRES: cxx
// RUN: rm -rf %t && mkdir -p %t
// RUN: kvc-opt %s --kvc-specialize=model=smollm2-135m --kvc-form-kernels --kvc-emit="target=cpu output-dir=%t" -o /dev/null
// RUN: FileCheck %s --input-file=%t/kvc_adaptive_decode_cpu.cpp
// RUN: %cxx -std=c++17 -fsyntax-only -I%kvc_src_root -I%t %t/kvc_adaptive_decode_cpu.cpp

// CHECK-LABEL: static kvc_status_t kvc_adaptive_decode_cpu_decode_heads(
// CHECK:       // %4 = kvc.budget_adaptive %3, %2 alpha 2.000000e-01
// CHECK-NEXT:  kvc::cpu::adaptiveBudgets(persisted_s1, persistedPositions, stride, kKvHeads, static_cast<int32_t>(stride), stride, 64, 0.2f, adaptiveBudgets, adaptiveOrder);

kvc.policy @adaptive_decode {
  kvc.phase over_budget {
    %attn = kvc.attn_accumulate decay 1.0
    %group = kvc.group_reduce mean %attn
    %score = kvc.protect %group sinks 0 recent 16 : !kvc.score<kv_head>
    %budget = kvc.budget_uniform count 64
    %ada = kvc.budget_adaptive %budget, %score alpha 0.2
    %keep = kvc.topk %score, %ada tie recent : !kvc.score<kv_head>
    kvc.evict %keep
  }
}
