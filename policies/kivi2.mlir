// KIVI: "KIVI: A Tuning-Free Asymmetric 2bit Quantization for KV Cache"
// (Liu et al., 2024).
//
// No eviction: every entry is kept, stored in 2 bits. Keys are quantized per
// channel over groups of G = 32 tokens, values per token over groups of
// G = 32 channels, asymmetric (scale and minimum per group). The R = 128 most
// recent entries stay in full precision; keys leave the residual window a
// block of G tokens at a time, values one token at a time. These are the
// paper's defaults.
//
// Precision of the parameters (the paper leaves it to the implementation,
// whose scales and zero points are in the model's 16-bit type): each
// {scale, min} pair is stored as two f16, min rounded down and scale
// rounded up so that the codes still span the group (docs/runtime.md).
//
// RUN: kvc-opt %s | FileCheck %s
// RUN: kvc-opt %s | kvc-opt | FileCheck %s
// RUN: kvc-opt %s --mlir-print-op-generic | kvc-opt | FileCheck %s
// RUN: kvc-opt %s --kvc-specialize=model=llama-3.1-8b | FileCheck %s --check-prefix=SPEC

// CHECK-LABEL: kvc.policy @kivi2 {
// CHECK-NEXT:    kvc.storage key #kvc.format<int2, per_channel, group = 32> value #kvc.format<int2, per_token, group = 32> residual 128
// CHECK-NEXT:  }

// SPEC: kvc.policy @kivi2 geometry #kvc.geometry<layers = 32, q_heads = 32, kv_heads = 8, head_dim = 128, dtype = f16> {

kvc.policy @kivi2 {
  kvc.storage key #kvc.format<int2, per_channel, group = 32>
              value #kvc.format<int2, per_token, group = 32> residual 128
}
