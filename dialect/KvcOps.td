//===- KvcOps.td - kvc operations --------------------------*- tablegen -*-===//
//
// Operations of the kvc dialect, grouped by the question of the policy model
// they answer: when (policy structure), score, budget, select and merge,
// store.
//
//===----------------------------------------------------------------------===//

#ifndef KVC_DIALECT_KVCOPS_TD
#define KVC_DIALECT_KVCOPS_TD

include "dialect/KvcTypes.td"
include "mlir/IR/SymbolInterfaces.td"
include "mlir/IR/RegionKindInterface.td"
include "mlir/Interfaces/SideEffectInterfaces.td"
include "mlir/Interfaces/InferTypeOpInterface.td"

/// A signless 64-bit integer attribute read back as a signed value, so that
/// verifiers can reject negative counts with their own diagnostics.
def Kvc_I64Attr : TypedSignlessIntegerAttrBase<I64, "int64_t",
    "64-bit signless integer attribute"> {
  let convertFromStorage = "$_self.getValue().getSExtValue()";
}

/// Policy ops live in a phase, and after kernel formation in a kernel.
def Kvc_InPhaseOrKernel : ParentOneOf<["PhaseOp", "KernelOp"]>;

//===----------------------------------------------------------------------===//
// Policy structure: when the policy acts
//===----------------------------------------------------------------------===//

def Kvc_PolicyOp : Kvc_Op<"policy", [Symbol, IsolatedFromAbove, NoTerminator,
                                     SingleBlock, NoRegionArguments]> {
  let summary = "A KV-cache policy";
  let description = [{
    The top-level description of a KV-cache policy. The body holds at most one
    `kvc.storage` and any number of `kvc.phase` ops, no two with the same
    trigger; a policy with neither does nothing and is rejected. Without `geometry` the policy is model-agnostic; `kvc-specialize`
    binds it to a model, after which model-dependent rules (quantization
    groups against the head dimension, head tables against the number of
    layers and heads) are verified too.

    ```mlir
    kvc.policy @streaming_llm {
      kvc.phase every_step {
        %s = kvc.key_norm
        %p = kvc.protect %s sinks 4 recent 1020 : !kvc.score<kv_head>
        %b = kvc.budget_uniform count 1024
        %k = kvc.topk %p, %b tie recent : !kvc.score<kv_head>
        kvc.evict %k
      }
    }
    ```
  }];
  let arguments = (ins SymbolNameAttr:$sym_name,
                       OptionalAttr<Kvc_GeometryAttr>:$geometry);
  let regions = (region SizedRegion<1>:$body);
  let assemblyFormat = [{
    $sym_name (`geometry` qualified($geometry)^)? attr-dict-with-keyword $body
  }];
  let hasRegionVerifier = 1;
  let extraClassDeclaration = [{
    /// The storage declaration of the policy, if any.
    StorageOp getStorage();
  }];
}

def Kvc_PhaseOp : Kvc_Op<"phase", [HasParent<"PolicyOp">, NoTerminator,
                                   SingleBlock, NoRegionArguments]> {
  let summary = "When a policy acts, and what it does then";
  let description = [{
    `after_prefill` runs once over the prompt; `every_step` after every decode
    step; `every_n` every `period` decode steps (periodic compression);
    `over_budget` whenever a sequence's cache exceeds its budget. The body
    scores entries, computes budgets and ends in at most one eviction action
    (`kvc.evict` or a `kvc.merge_*`) and any number of storage actions.

    ```mlir
    kvc.phase every_n period 32 {
      %w = kvc.attn_window size 16
      %g = kvc.group_reduce mean %w
      %b = kvc.budget_uniform count 512
      %k = kvc.topk %g, %b tie recent : !kvc.score<kv_head>
      kvc.evict %k
    }
    ```
  }];
  let arguments = (ins Kvc_Trigger:$trigger, OptionalAttr<Kvc_I64Attr>:$period);
  let regions = (region SizedRegion<1>:$body);
  let assemblyFormat = [{
    $trigger (`period` $period^)? attr-dict-with-keyword $body
  }];
  let hasVerifier = 1;
  let hasRegionVerifier = 1;
}

//===----------------------------------------------------------------------===//
// Store: formats of kept entries
//===----------------------------------------------------------------------===//

def Kvc_StorageOp : Kvc_Op<"storage", [HasParent<"PolicyOp">]> {
  let summary = "Storage formats of kept keys and values";
  let description = [{
    Declares the format of stored keys and values. The `residual` most recent
    entries stay in full precision (KIVI's residual window); per-channel key
    groups run over tokens, so the residual is a multiple of the key group.

    ```mlir
    kvc.storage key #kvc.format<int2, per_channel, group = 32>
                value #kvc.format<int2, per_token, group = 32> residual 128
    ```
  }];
  let arguments = (ins Kvc_FormatAttr:$key, Kvc_FormatAttr:$value,
                       OptionalAttr<Kvc_I64Attr>:$residual);
  let assemblyFormat = [{
    `key` qualified($key) `value` qualified($value)
    (`residual` $residual^)? attr-dict
  }];
  let hasVerifier = 1;
}

def Kvc_MixedPrecisionOp : Kvc_Op<"mixed_precision",
    [Kvc_InPhaseOrKernel, MemoryEffects<[MemWrite]>]> {
  let summary = "Store the most important entries at a higher precision";
  let description = [{
    Keeps the top `fraction` of entries by `score` (per kv-head) in the
    `high` format and the rest in the `low` format (MiKV, ZipCache).

    ```mlir
    kvc.mixed_precision %s high #kvc.format<int8, per_token>
        low #kvc.format<int2, per_token, group = 32> fraction 2.000000e-01
        : !kvc.score<kv_head>
    ```
  }];
  let arguments = (ins Kvc_ScoreType:$score, Kvc_FormatAttr:$high,
                       Kvc_FormatAttr:$low, F64Attr:$fraction);
  let assemblyFormat = [{
    $score `high` qualified($high) `low` qualified($low)
    `fraction` $fraction attr-dict `:` qualified(type($score))
  }];
  let hasVerifier = 1;
}

//===----------------------------------------------------------------------===//
// Score: attention statistics
//===----------------------------------------------------------------------===//

class Kvc_ScoreSourceOp<string mnemonic, list<Trait> traits = []>
    : Kvc_Op<mnemonic, !listconcat([Pure, Kvc_InPhaseOrKernel], traits)>;

def Kvc_AttnWindowOp : Kvc_ScoreSourceOp<"attn_window"> {
  let summary = "Mean attention of the last `size` queries";
  let description = [{
    For every query head, the mean over the last `size` queries of the
    causal softmax attention weight each entry before the window receives
    (SnapKV's observation window). Entries inside the window score 0: they
    are only partly observed, policies keep them with `kvc.protect`, and a
    zero makes pooling across the window boundary equal to pooling the
    prefix alone (the reference implementations pool the prefix only). With `visible_normalized`, the sum over the window is divided by
    the number of window queries that can see the entry instead (the H2O
    normalization of the reference press library).

    ```mlir
    %w = kvc.attn_window size 32
    ```
  }];
  let arguments = (ins Kvc_I64Attr:$size, UnitAttr:$visible_normalized);
  let results = (outs Kvc_QueryScore:$result);
  let assemblyFormat = [{
    `size` $size (`visible_normalized` $visible_normalized^)? attr-dict
  }];
  let hasVerifier = 1;
}

def Kvc_AttnLastOp : Kvc_ScoreSourceOp<"attn_last"> {
  let summary = "Attention weight of the most recent query";
  let description = [{
    The softmax attention weight of the last query (TOVA).

    ```mlir
    %a = kvc.attn_last
    ```
  }];
  let results = (outs Kvc_QueryScore:$result);
  let assemblyFormat = "attr-dict";
}

def Kvc_AttnAccumulateOp : Kvc_ScoreSourceOp<"attn_accumulate"> {
  let summary = "Attention accumulated over every query seen, with a decay";
  let description = [{
    The running score `s_i <- decay * s_i + p_{t,i}` over every query `t` that
    attended to the cache (prompt queries and decode steps). `decay = 1` is
    H2O's plain sum, `decay < 1` A2SF's forgetting factor. With
    `noise_temperature`, logits are perturbed with Gumbel noise of that
    temperature before the softmax (Keyformer). `lag` delays decisions until
    an entry has been observed for `lag` steps (lagged eviction).

    ```mlir
    %a = kvc.attn_accumulate decay 9.000000e-01
    ```
  }];
  let arguments = (ins F64Attr:$decay, UnitAttr:$visible_normalized,
                       OptionalAttr<F64Attr>:$noise_temperature,
                       OptionalAttr<Kvc_I64Attr>:$lag);
  let results = (outs Kvc_QueryScore:$result);
  let assemblyFormat = [{
    `decay` $decay (`visible_normalized` $visible_normalized^)?
    (`noise_temperature` $noise_temperature^)? (`lag` $lag^)? attr-dict
  }];
  let hasVerifier = 1;
}

def Kvc_AttnPersistenceOp : Kvc_ScoreSourceOp<"attn_persistence"> {
  let summary = "Persistence of importance over a history of steps";
  let description = [{
    The number of the last `history` queries (at most 64) for which the
    entry was important: its attention weight, reduced over the GQA group
    with `reduce` (mean or max), exceeded `threshold` (Scissorhands). The
    count is per kv-head: the runtime keeps one bit per step and entry, so
    the group is reduced before the threshold, not after. With one query
    head per kv-head both readings agree with the paper's per-head count.

    ```mlir
    %c = kvc.attn_persistence threshold 1.000000e-02 history 64 reduce mean
    ```
  }];
  let arguments = (ins F64Attr:$threshold, Kvc_I64Attr:$history,
                       Kvc_ReduceKind:$reduce);
  let results = (outs Kvc_KvHeadScore:$result);
  let assemblyFormat = [{
    `threshold` $threshold `history` $history `reduce` $reduce attr-dict
  }];
  let hasVerifier = 1;
}

def Kvc_ExpectedAttnOp : Kvc_ScoreSourceOp<"expected_attn"> {
  let summary = "Attention expected from future queries";
  let description = [{
    `softmax_i(k_i . mu / sqrt(d) + 1/2 k_i^T Sigma k_i / d)` where `mu` and
    `Sigma` are the mean and covariance of the queries of the last `window`
    positions, rotated to the next `horizon` positions and averaged (expected
    attention). Without `covariance` the second term is dropped.

    ```mlir
    %e = kvc.expected_attn window 64 horizon 512 covariance
    ```
  }];
  let arguments = (ins Kvc_I64Attr:$window, Kvc_I64Attr:$horizon, UnitAttr:$covariance);
  let results = (outs Kvc_QueryScore:$result);
  let assemblyFormat = [{
    `window` $window `horizon` $horizon (`covariance` $covariance^)? attr-dict
  }];
  let hasVerifier = 1;
}

def Kvc_RecencyOp : Kvc_ScoreSourceOp<"recency"> {
  let summary = "The original position of each entry";
  let description = [{
    Scores every entry by its original position, so that newer entries score
    higher: with `kvc.protect` of the sinks and a budget, top-k keeps the
    sinks and the most recent entries (StreamingLLM).

    ```mlir
    %r = kvc.recency
    ```
  }];
  let results = (outs Kvc_KvHeadScore:$result);
  let assemblyFormat = "attr-dict";
}

//===----------------------------------------------------------------------===//
// Score: key and value geometry
//===----------------------------------------------------------------------===//

def Kvc_KeyNormOp : Kvc_ScoreSourceOp<"key_norm"> {
  let summary = "L2 norm of each key";
  let description = [{
    `||k_i||_2` per kv-head. Knorm keeps low-norm keys: combine with weight
    `-1`.

    ```mlir
    %n = kvc.key_norm
    ```
  }];
  let results = (outs Kvc_KvHeadScore:$result);
  let assemblyFormat = "attr-dict";
}

def Kvc_KeyDiversityOp : Kvc_ScoreSourceOp<"key_diversity"> {
  let summary = "Dissimilarity of each key to the mean key direction";
  let description = [{
    `-cos(k_i, mean_j k_j / ||k_j||)` per kv-head (KeyDiff): keys far from
    the average direction score high.

    ```mlir
    %d = kvc.key_diversity
    ```
  }];
  let results = (outs Kvc_KvHeadScore:$result);
  let assemblyFormat = "attr-dict";
}

def Kvc_ValueNormOp : Kvc_ScoreSourceOp<"value_norm"> {
  let summary = "Lp norm of each value";
  let description = [{
    `||v_i||_p` per kv-head, `p` in {1, 2} (value-aware scoring).

    ```mlir
    %v = kvc.value_norm p 2
    ```
  }];
  let arguments = (ins Kvc_I64Attr:$p);
  let results = (outs Kvc_KvHeadScore:$result);
  let assemblyFormat = "`p` $p attr-dict";
  let hasVerifier = 1;
}

//===----------------------------------------------------------------------===//
// Score: combinators
//===----------------------------------------------------------------------===//

class Kvc_ScoreTransformOp<string mnemonic, list<Trait> traits = []>
    : Kvc_Op<mnemonic, !listconcat([Pure, Kvc_InPhaseOrKernel,
                                    AllTypesMatch<["input", "result"]>],
                                   traits)>;

def Kvc_PoolOp : Kvc_ScoreTransformOp<"pool"> {
  let summary = "Pooling of scores along tokens";
  let description = [{
    1-D pooling along the token axis with an odd `kernel`, stride 1 and
    "same" padding: `avg` counts the zero padding in its divisor, `max` pads
    with -inf (SnapKV's clustering of neighbouring tokens).

    ```mlir
    %p = kvc.pool avg %w kernel 5 : !kvc.score<query>
    ```
  }];
  let arguments = (ins Kvc_ScoreType:$input, Kvc_PoolKind:$kind,
                       Kvc_I64Attr:$kernel);
  let results = (outs Kvc_ScoreType:$result);
  let assemblyFormat = [{
    $kind $input `kernel` $kernel attr-dict `:` qualified(type($input))
  }];
  let hasVerifier = 1;
  let hasFolder = 1;
}

def Kvc_NormalizeOp : Kvc_ScoreTransformOp<"normalize"> {
  let summary = "Normalization of a score vector per head";
  let description = [{
    `zscore` subtracts the mean and divides by the standard deviation; `sum`
    divides by the sum; `max` divides by the maximum, per head.

    ```mlir
    %z = kvc.normalize zscore %s : !kvc.score<kv_head>
    ```
  }];
  let arguments = (ins Kvc_ScoreType:$input, Kvc_NormalizeKind:$kind);
  let results = (outs Kvc_ScoreType:$result);
  let assemblyFormat = "$kind $input attr-dict `:` qualified(type($input))";
  let hasFolder = 1;
}

def Kvc_ProtectOp : Kvc_ScoreTransformOp<"protect"> {
  let summary = "Always keep the first sinks and the most recent entries";
  let description = [{
    Sets the score of the first `sinks` entries (by original position) and of
    the `recent` most recent entries to +inf, so every budget keeps them.

    ```mlir
    %p = kvc.protect %s sinks 4 recent 32 : !kvc.score<kv_head>
    ```
  }];
  let arguments = (ins Kvc_ScoreType:$input, Kvc_I64Attr:$sinks, Kvc_I64Attr:$recent);
  let results = (outs Kvc_ScoreType:$result);
  let assemblyFormat = [{
    $input `sinks` $sinks `recent` $recent attr-dict `:` qualified(type($input))
  }];
  let hasVerifier = 1;
  let hasFolder = 1;
  let extraClassDeclaration = [{
    /// Number of entries this op protects.
    int64_t getProtectedCount() { return getSinks() + getRecent(); }
  }];
}

def Kvc_CombineOp : Kvc_Op<"combine", [Pure, Kvc_InPhaseOrKernel,
                                      SameOperandsAndResultType]> {
  let summary = "Weighted sum or product of score vectors";
  let description = [{
    `sum` is `sum_j weights[j] * inputs[j]` (weights default to 1);
    `product` is the elementwise product and takes no weights (value-aware
    scoring: attention times value norm).

    ```mlir
    %c = kvc.combine sum %a, %b weights [5.000000e-01, 5.000000e-01]
        : !kvc.score<kv_head>
    ```
  }];
  let arguments = (ins Variadic<Kvc_ScoreType>:$inputs, Kvc_CombineKind:$kind,
                       OptionalAttr<DenseF64ArrayAttr>:$weights);
  let results = (outs Kvc_ScoreType:$result);
  let assemblyFormat = [{
    $kind $inputs (`weights` $weights^)? attr-dict `:` qualified(type($result))
  }];
  let hasVerifier = 1;
  let hasFolder = 1;
  let hasCanonicalizer = 1;
  let extraClassDeclaration = [{
    /// The weight of input `i` (1 when no weights are given).
    double getWeight(unsigned i);
  }];
}

def Kvc_GroupReduceOp : Kvc_Op<"group_reduce", [Pure, Kvc_InPhaseOrKernel]> {
  let summary = "Reduce query-head scores over their GQA group";
  let description = [{
    Turns one score per query head into one score per kv-head by reducing
    over the query heads that share the kv-head.

    ```mlir
    %g = kvc.group_reduce mean %w
    ```
  }];
  let arguments = (ins Kvc_QueryScore:$input, Kvc_ReduceKind:$kind);
  let results = (outs Kvc_KvHeadScore:$result);
  let assemblyFormat = "$kind $input attr-dict";
}

def Kvc_LayerReduceOp : Kvc_Op<"layer_reduce", [Pure, Kvc_InPhaseOrKernel]> {
  let summary = "Reduce scores over every head of a layer";
  let description = [{
    One score per entry shared by every head of a layer (TOVA): all heads of
    the layer then keep the same entries.

    ```mlir
    %l = kvc.layer_reduce mean %a : !kvc.score<query>
    ```
  }];
  let arguments = (ins Kvc_ScoreType:$input, Kvc_ReduceKind:$kind);
  let results = (outs Kvc_LayerScore:$result);
  let assemblyFormat = "$kind $input attr-dict `:` qualified(type($input))";
  let hasVerifier = 1;
}

//===----------------------------------------------------------------------===//
// Budget: how many entries each layer and kv-head keeps
//===----------------------------------------------------------------------===//

class Kvc_BudgetOp<string mnemonic, list<Trait> traits = []>
    : Kvc_Op<mnemonic, !listconcat([Pure, Kvc_InPhaseOrKernel], traits)> {
  let results = (outs Kvc_BudgetType:$result);
}

def Kvc_BudgetUniformOp : Kvc_BudgetOp<"budget_uniform"> {
  let summary = "The same budget for every layer and kv-head";
  let description = [{
    Every (layer, kv-head) keeps `count` entries, or `floor((1 - ratio) * n)`
    of its `n` entries: `ratio` is the fraction removed.

    ```mlir
    %b = kvc.budget_uniform count 1024
    %r = kvc.budget_uniform ratio 7.500000e-01
    ```
  }];
  let arguments = (ins OptionalAttr<Kvc_I64Attr>:$count,
                       OptionalAttr<F64Attr>:$ratio);
  let assemblyFormat = "(`count` $count^)? (`ratio` $ratio^)? attr-dict";
  let hasVerifier = 1;
}

def Kvc_BudgetPyramidOp : Kvc_BudgetOp<"budget_pyramid"> {
  let summary = "Budgets decreasing linearly with depth (PyramidKV)";
  let description = [{
    PyramidKV's integer rule with average capacity `capacity` per layer, an
    observation window of `window` entries and steepness `beta`: lower layers
    keep more entries than upper layers (see docs/dialect.md for the exact
    formula and its two fallback branches).

    ```mlir
    %b = kvc.budget_pyramid capacity 2048 window 32 beta 20
    ```
  }];
  let arguments = (ins Kvc_I64Attr:$capacity, Kvc_I64Attr:$window, Kvc_I64Attr:$beta);
  let assemblyFormat = [{
    `capacity` $capacity `window` $window `beta` $beta attr-dict
  }];
  let hasVerifier = 1;
}

def Kvc_BudgetAdaptiveOp : Kvc_BudgetOp<"budget_adaptive"> {
  let summary = "Redistribute a layer's budget across its heads (AdaKV)";
  let description = [{
    Each head first keeps its top `alpha * C` entries by `score`; the rest of
    the layer's `H * C` entries go to the best remaining scores of any head.

    ```mlir
    %a = kvc.budget_adaptive %b, %s alpha 2.000000e-01
    ```
  }];
  let arguments = (ins Kvc_BudgetType:$base, Kvc_KvHeadScore:$score,
                       F64Attr:$alpha);
  let assemblyFormat = "$base `,` $score `alpha` $alpha attr-dict";
  let hasVerifier = 1;
}

def Kvc_BudgetGlobalOp : Kvc_BudgetOp<"budget_global"> {
  let summary = "One budget shared by every layer and head";
  let description = [{
    The total of `base` over every layer and kv-head is kept by one top-k
    over all layers' and heads' scores (KVzip style), so layers and heads end
    with different counts.

    ```mlir
    %g = kvc.budget_global %b, %s
    ```
  }];
  let arguments = (ins Kvc_BudgetType:$base, Kvc_KvHeadScore:$score);
  let assemblyFormat = "$base `,` $score attr-dict";
}

def Kvc_BudgetHeadClassesOp : Kvc_BudgetOp<"budget_head_classes"> {
  let summary = "Retrieval heads keep everything, streaming heads a window";
  let description = [{
    `table` has one entry per (layer, kv-head): 1 marks a retrieval head,
    which keeps its full cache, 0 a streaming head, which keeps `sinks` first
    and `recent` last entries (DuoAttention, RazorAttention).

    ```mlir
    %h = kvc.budget_head_classes table dense<[[1, 0], [0, 1]]> : tensor<2x2xi8>
        sinks 4 recent 256
    ```
  }];
  let arguments = (ins AnyIntElementsAttr:$table, Kvc_I64Attr:$sinks,
                       Kvc_I64Attr:$recent);
  let assemblyFormat = [{
    `table` $table `sinks` $sinks `recent` $recent attr-dict
  }];
  let hasVerifier = 1;
}

def Kvc_BudgetHeadWeightsOp : Kvc_BudgetOp<"budget_head_weights"> {
  let summary = "Per-head budgets proportional to an importance table";
  let description = [{
    The total of `base` within each layer is split between its kv-heads in
    proportion to `table` (one non-negative weight per (layer, kv-head),
    HeadKV).

    ```mlir
    %w = kvc.budget_head_weights %b table dense<[[1.0, 3.0]]> : tensor<1x2xf32>
    ```
  }];
  let arguments = (ins Kvc_BudgetType:$base, FloatElementsAttr<32>:$table);
  let assemblyFormat = "$base `table` $table attr-dict";
  let hasVerifier = 1;
}

def Kvc_BudgetCakeOp : Kvc_BudgetOp<"budget_cake"> {
  let summary = "Layer budgets from attention dispersion and shift (CAKE)";
  let description = [{
    The total of `base` is split between layers in proportion to each
    layer's preference `H^(1/tau1) * V^(1/tau2)`, with `H` the entropy of its
    observation-window attention and `V` its variance over the window.

    ```mlir
    %c = kvc.budget_cake %b tau1 1.000000e+00 tau2 1.000000e+00
    ```
  }];
  let arguments = (ins Kvc_BudgetType:$base, F64Attr:$tau1, F64Attr:$tau2);
  let assemblyFormat = "$base `tau1` $tau1 `tau2` $tau2 attr-dict";
  let hasVerifier = 1;
}

//===----------------------------------------------------------------------===//
// Select and merge
//===----------------------------------------------------------------------===//

def Kvc_TopKOp : Kvc_Op<"topk", [Pure, Kvc_InPhaseOrKernel]> {
  let summary = "Keep the highest-scoring entries within the budget";
  let description = [{
    Per (layer, kv-head) the `budget` entries with the highest score are
    kept; `tie recent` breaks equal scores toward the more recent entry.
    `layer` scores keep the same entries in every head of a layer.

    ```mlir
    %k = kvc.topk %s, %b tie recent : !kvc.score<kv_head>
    ```
  }];
  let arguments = (ins Kvc_ScoreType:$score, Kvc_BudgetType:$budget,
                       Kvc_TieBreak:$tie);
  let results = (outs Kvc_SelectionType:$result);
  let assemblyFormat = [{
    $score `,` $budget `tie` $tie attr-dict `:` qualified(type($score))
  }];
  let hasVerifier = 1;
}

class Kvc_EvictionOp<string mnemonic>
    : Kvc_Op<mnemonic, [Kvc_InPhaseOrKernel, MemoryEffects<[MemWrite]>]>;

def Kvc_EvictOp : Kvc_EvictionOp<"evict"> {
  let summary = "Drop every entry outside the selection";
  let description = [{
    Evicted entries' slots return to their page; the next appended entry may
    take one.

    ```mlir
    kvc.evict %k
    ```
  }];
  let arguments = (ins Kvc_SelectionType:$selection);
  let assemblyFormat = "$selection attr-dict";
}

def Kvc_MergeNearestOp : Kvc_EvictionOp<"merge_nearest"> {
  let summary = "Fold each evicted value into the most similar kept entry";
  let description = [{
    Each evicted entry `e` goes to the kept entry `t` whose key is most
    cosine-similar. With `sim_norm` its weight is
    `max(sim, 0) * |v_e| / (|v_e| + |v_t|)`; `similarity` uses `max(sim, 0)`,
    `uniform` 1. Then `v_t <- (v_t + sum w v_e) / (1 + sum w)`; keys are left
    unchanged, which keeps them valid under RoPE.

    ```mlir
    kvc.merge_nearest %k weight sim_norm
    ```
  }];
  let arguments = (ins Kvc_SelectionType:$selection, Kvc_MergeWeight:$weight);
  let assemblyFormat = "$selection `weight` $weight attr-dict";
}

def Kvc_MergeD2OOp : Kvc_EvictionOp<"merge_d2o"> {
  let summary = "Merge evicted entries above an adaptive similarity threshold";
  let description = [{
    D2O: an evicted key is merged into its most similar kept entry when the
    similarity reaches the threshold `tau <- alpha * tau + beta * mean(max
    sim)`; key and value become the similarity-weighted mean.

    ```mlir
    kvc.merge_d2o %k alpha 5.000000e-01 beta 5.000000e-01
    ```
  }];
  let arguments = (ins Kvc_SelectionType:$selection, F64Attr:$alpha,
                       F64Attr:$beta);
  let assemblyFormat = "$selection `alpha` $alpha `beta` $beta attr-dict";
  let hasVerifier = 1;
}

def Kvc_MergeCamOp : Kvc_EvictionOp<"merge_cam"> {
  let summary = "Merge evicted values into the following kept entries";
  let description = [{
    CaM: an evicted value is merged into the next `span` kept entries with
    probability `clamp(A_e / mean(A_window), 0, 1)`, where `A` is the
    attention statistic of the phase's scores. Values only.

    ```mlir
    kvc.merge_cam %k span 4
    ```
  }];
  let arguments = (ins Kvc_SelectionType:$selection, Kvc_I64Attr:$span);
  let assemblyFormat = "$selection `span` $span attr-dict";
  let hasVerifier = 1;
}

def Kvc_MergeAdjacentOp : Kvc_EvictionOp<"merge_adjacent"> {
  let summary = "Merge runs of adjacent similar keys around a pivot";
  let description = [{
    KVMerger: maximal runs of adjacent entries whose consecutive key
    similarity is at least `threshold` collapse into their most-attended
    pivot, with Gaussian weights of width `sigma` (in positions).

    ```mlir
    kvc.merge_adjacent %k threshold 9.000000e-01 sigma 1.000000e+00
    ```
  }];
  let arguments = (ins Kvc_SelectionType:$selection, F64Attr:$threshold,
                       F64Attr:$sigma);
  let assemblyFormat = [{
    $selection `threshold` $threshold `sigma` $sigma attr-dict
  }];
  let hasVerifier = 1;
}

//===----------------------------------------------------------------------===//
// Kernel level
//
// `kvc-form-kernels` turns phases into kernels. A kernel is one function of
// the generated library; its body lists its stages in execution order. The
// policy ops keep their meaning as stages; the ops below make explicit what a
// policy leaves implicit: the pass over keys and values and what it emits,
// and where entries are written.
//===----------------------------------------------------------------------===//

def Kvc_KernelOp : Kvc_Op<"kernel", [HasParent<"PolicyOp">, NoTerminator,
                                     SingleBlock, NoRegionArguments]> {
  let summary = "One kernel of the generated library";
  let description = [{
    `prefill` runs over a prompt: causal attention, then the stages of the
    phase it implements (`after_prefill` or `over_budget`), then the gather
    of kept entries into pages. `decode` runs once per generated token:
    attention over the cache, the statistics the decode phase needs, victim
    selection, and the append of the new entry. `prefill_scoring` and
    `decode_scoring` exist only in the unfused pipeline: they recompute the
    attention weights in a second pass over the keys. `select` runs once
    after every layer's prefill: one selection over the scores the prefill
    stored for every layer and head (a global budget).

    ```mlir
    kvc.kernel decode for over_budget {
      kvc.attention_pass output accumulate 1.000000e+00 reduce mean
      kvc.append key #kvc.format<full> value #kvc.format<full>
      %a = kvc.attn_accumulate decay 1.000000e+00
      ...
    }
    ```
  }];
  let arguments = (ins Kvc_KernelKind:$kind, OptionalAttr<Kvc_Trigger>:$trigger,
                       OptionalAttr<Kvc_I64Attr>:$period);
  let regions = (region SizedRegion<1>:$body);
  let assemblyFormat = [{
    $kind (`for` $trigger^)? (`period` $period^)? attr-dict-with-keyword $body
  }];
}

def Kvc_AttentionPassOp : Kvc_Op<"attention_pass",
    [HasParent<"KernelOp">, MemoryEffects<[MemRead, MemWrite]>]> {
  let summary = "One pass over keys and values and what it emits";
  let description = [{
    Reads every key and value of the cache once. `output` computes the
    attention output. The statistics it folds in on the way: `window` the
    mean probabilities of the last N queries (per query head), `last` the
    probabilities of the last query, `accumulate` the running score state
    `s <- decay * s + reduce_group(p)` stored with each entry,
    `visible_normalized` dividing by the number of queries that saw an
    entry, `persistence` the per-step importance bits of the last
    `persistence` queries (the group-reduced weight above `threshold`, the
    latest step in bit 0) stored with each entry. In a periodic decode
    kernel, `window` is the sum over the last N decode queries of the
    group-mean weight, kept in the score state and restarted every period.

    ```mlir
    kvc.attention_pass output window 64
    kvc.attention_pass output persistence 32 threshold 1.000000e-02 by mean
    ```
  }];
  let arguments = (ins UnitAttr:$output, OptionalAttr<Kvc_I64Attr>:$window,
                       UnitAttr:$last, OptionalAttr<F64Attr>:$accumulate,
                       OptionalAttr<Kvc_ReduceKind>:$reduce,
                       UnitAttr:$visible_normalized,
                       OptionalAttr<Kvc_I64Attr>:$persistence,
                       OptionalAttr<F64Attr>:$threshold,
                       OptionalAttr<Kvc_ReduceKind>:$persistence_reduce);
  let assemblyFormat = [{
    (`output` $output^)? (`window` $window^)? (`last` $last^)?
    (`accumulate` $accumulate^)? (`reduce` $reduce^)?
    (`visible_normalized` $visible_normalized^)?
    (`persistence` $persistence^ `threshold` $threshold `by`
     $persistence_reduce)? attr-dict
  }];
  let hasVerifier = 1;
}

def Kvc_GatherOp : Kvc_Op<"gather", [HasParent<"KernelOp">,
                                     AttrSizedOperandSegments,
                                     MemoryEffects<[MemWrite]>]> {
  let summary = "Write the kept prompt entries into pages";
  let description = [{
    Writes the entries kept by the kernel's selection (every entry when there
    is none) into the runtime's pages of each head, encoded in the storage
    formats, with their score state; with `state`, that score is stored as
    each entry's score state for a later kernel (`kvc.score_state`).

    With `low ... by %rank fraction f` (what `kvc-form-kernels` makes of a
    `kvc.mixed_precision`), the ceil(f * kept) kept entries of each kv-head
    that rank highest by `%rank` (ties: the more recent) are written in the
    storage formats, the others in the `low` format, into the runtime's low
    page class.

    ```mlir
    kvc.gather key #kvc.format<int2, per_channel, group = 32>
               value #kvc.format<int2, per_token, group = 32> residual 128
    kvc.gather key #kvc.format<int8, per_token> value #kvc.format<int8, per_token>
               low #kvc.format<int2, per_token, group = 32> by %s fraction 0.2
    ```
  }];
  let arguments = (ins Kvc_FormatAttr:$key, Kvc_FormatAttr:$value,
                       OptionalAttr<Kvc_I64Attr>:$residual,
                       Optional<Kvc_KvHeadScore>:$state,
                       OptionalAttr<Kvc_FormatAttr>:$low,
                       Optional<Kvc_KvHeadScore>:$rank,
                       OptionalAttr<F64Attr>:$fraction);
  let assemblyFormat = [{
    `key` qualified($key) `value` qualified($value)
    (`residual` $residual^)? (`state` $state^)?
    (`low` qualified($low)^ `by` $rank `fraction` $fraction)? attr-dict
  }];
  let hasVerifier = 1;
}

def Kvc_ScoreStateOp : Kvc_Op<"score_state", [HasParent<"KernelOp">,
                                              MemoryEffects<[MemRead]>]> {
  let summary = "The per-entry score an earlier kernel stored";
  let description = [{
    Reads the score state that a `kvc.gather ... state %s` of an earlier
    kernel stored with every entry, so that a selection can run once every
    layer's scores exist (a global budget's `select` kernel).

    ```mlir
    %s = kvc.score_state
    ```
  }];
  let results = (outs Kvc_KvHeadScore:$result);
  let assemblyFormat = "attr-dict";
}

def Kvc_AppendOp : Kvc_Op<"append", [HasParent<"KernelOp">,
                                     MemoryEffects<[MemWrite]>]> {
  let summary = "Write the new decode entry into a free slot";
  let description = [{
    Writes the new token's key and value into the lowest free slot of each
    head, which is the slot of the previous step's victim when the policy
    evicts at decode: eviction moves no data.

    ```mlir
    kvc.append key #kvc.format<full> value #kvc.format<full>
    ```
  }];
  let arguments = (ins Kvc_FormatAttr:$key, Kvc_FormatAttr:$value,
                       OptionalAttr<Kvc_I64Attr>:$residual);
  let assemblyFormat = [{
    `key` qualified($key) `value` qualified($value)
    (`residual` $residual^)? attr-dict
  }];
}

#endif // KVC_DIALECT_KVCOPS_TD
