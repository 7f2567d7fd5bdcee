// Mixed precision by importance: "No Token Left Behind: Reliable KV Cache
// Compression via Importance-Aware Mixed Precision Quantization" (MiKV,
// Yang et al., 2024), with ZipCache (He et al., 2024) as the other source.
//
// No entry is evicted. After the prompt, each entry is ranked by the
// attention it accumulated from every prompt query (H2O's importance, the
// one MiKV builds on), averaged over the GQA group, with the 64 most recent
// entries ranked first; the top 20% per kv-head stay in int8 (per token, one
// float scale) and the rest are stored in int2 (per token, asymmetric, one
// {scale, min} pair per 32 channels). Entries generated during decode are
// int8. Differences from the papers:
//  - MiKV keeps important entries in full precision or int8 and re-assigns
//    precision at every decode step as H2O evicts; here precision is
//    assigned once, after the prompt (ZipCache's prefill behaviour), and
//    decode entries stay high precision.
//  - MiKV quantizes low-precision keys per channel with an outlier balancer,
//    ZipCache with channel-separable token-wise parameters; both low classes
//    here are plain per-token groups of 32 channels, which the runtime's low
//    page class stores.
//  - ZipCache ranks by the accumulated attention divided by the number of
//    queries that see an entry, its "normalized attention score": add
//    `visible_normalized` to kvc.attn_accumulate for that metric. The plain
//    sum is MiKV's.
// Memory: with SmolLM2's head_dim 64 and 16-slot pages an int8 page is
// 2304 bytes and an int2 page 1024, so a pool page holds two int2 pages and
// an int2 entry costs 72 bytes against 144.
//
// RUN: kvc-opt %s | FileCheck %s
// RUN: kvc-opt %s --mlir-print-op-generic | kvc-opt | FileCheck %s
// RUN: kvc-opt %s --kvc-specialize=model=smollm2-135m --kvc-form-kernels | FileCheck %s --check-prefix=KERNELS

// CHECK-LABEL: kvc.policy @mixed_precision {
// CHECK-NEXT:    kvc.storage key #kvc.format<int8, per_token> value #kvc.format<int8, per_token>
// CHECK-NEXT:    kvc.phase after_prefill {
// CHECK-NEXT:      %[[A:.+]] = kvc.attn_accumulate decay 1.000000e+00
// CHECK-NEXT:      %[[G:.+]] = kvc.group_reduce mean %[[A]]
// CHECK-NEXT:      %[[S:.+]] = kvc.protect %[[G]] sinks 0 recent 64 : !kvc.score<kv_head>
// CHECK-NEXT:      kvc.mixed_precision %[[S]] high #kvc.format<int8, per_token> low #kvc.format<int2, per_token, group = 32> fraction 2.000000e-01 : !kvc.score<kv_head>

// KERNELS:      kvc.kernel prefill for after_prefill {
// KERNELS-NEXT:   kvc.attention_pass output accumulate 1.000000e+00 reduce mean
// KERNELS:        %[[S:.+]] = kvc.protect
// KERNELS-NEXT:   kvc.gather key #kvc.format<int8, per_token> value #kvc.format<int8, per_token> low #kvc.format<int2, per_token, group = 32> by %[[S]] fraction 2.000000e-01
// KERNELS-NEXT: }
// KERNELS:      kvc.kernel decode {
// KERNELS-NEXT:   kvc.append key #kvc.format<int8, per_token> value #kvc.format<int8, per_token>
// KERNELS-NEXT:   kvc.attention_pass output
// KERNELS-NEXT: }

kvc.policy @mixed_precision {
  kvc.storage key #kvc.format<int8, per_token>
              value #kvc.format<int8, per_token>
  kvc.phase after_prefill {
    %attn = kvc.attn_accumulate decay 1.0
    %group = kvc.group_reduce mean %attn
    %score = kvc.protect %group sinks 0 recent 64 : !kvc.score<kv_head>
    kvc.mixed_precision %score high #kvc.format<int8, per_token>
        low #kvc.format<int2, per_token, group = 32> fraction 0.2
        : !kvc.score<kv_head>
  }
}
