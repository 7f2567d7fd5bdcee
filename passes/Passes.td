//===- Passes.td - kvc passes ------------------------------*- tablegen -*-===//

#ifndef KVC_PASSES_PASSES_TD
#define KVC_PASSES_PASSES_TD

include "mlir/Pass/PassBase.td"

def KvcSpecializePass : Pass<"kvc-specialize", "mlir::ModuleOp"> {
  let summary = "Bind every policy of the module to a model geometry";
  let description = [{
    Sets the `geometry` attribute of every `kvc.policy`, either from a known
    model name (`model=smollm2-135m`) or from explicit sizes. A policy already
    bound to a different geometry is an error. After binding, the policy
    verifier checks the model-dependent rules (quantization groups against
    the head dimension, head tables against layers and kv-heads). With
    `name`, the module's only policy is renamed, so that variants of one
    policy (another geometry, the unfused pipeline) can be linked side by
    side.
  }];
  let options = [
    Option<"model", "model", "std::string", /*default=*/"\"\"",
           "Known model name: smollm2-135m, llama-3.1-8b, mistral-7b">,
    Option<"layers", "layers", "int64_t", /*default=*/"0",
           "Number of transformer layers">,
    Option<"qHeads", "q-heads", "int64_t", /*default=*/"0",
           "Number of query heads per layer">,
    Option<"kvHeads", "kv-heads", "int64_t", /*default=*/"0",
           "Number of key/value heads per layer">,
    Option<"headDim", "head-dim", "int64_t", /*default=*/"0",
           "Head dimension">,
    Option<"dtype", "dtype", "std::string", /*default=*/"\"f16\"",
           "Element type of keys and values: f16, bf16 or f32">,
    Option<"name", "name", "std::string", /*default=*/"\"\"",
           "New symbol of the (single) policy; it names the generated "
           "library's files and entry points">,
  ];
  let statistics = [
    Statistic<"numSpecialized", "num-specialized",
              "Number of policies bound to the geometry">,
  ];
}

def KvcInferStatisticsPass : Pass<"kvc-infer-statistics", "mlir::ModuleOp"> {
  let summary = "Infer which statistics each phase needs and who produces them";
  let description = [{
    Annotates every `kvc.phase` with a `statistics` array: one dictionary per
    statistic the phase reads (attention over a window of queries, the last
    query, the decayed accumulated attention, key and value features), with
    the kernel that produces it (`prefill` or `decode`), whether it is kept
    as per-entry state across steps, and at which granularity. A statistic
    no kernel can produce is an error.
  }];
}

def KvcFormKernelsPass : Pass<"kvc-form-kernels", "mlir::ModuleOp"> {
  let summary = "Decide kernel boundaries: fuse each phase into a kernel";
  let description = [{
    Replaces the phases of every specialized policy with `kvc.kernel` ops.
    Fused (the default): a `prefill` kernel computes causal attention, the
    statistics of the prefill phase in the same pass over keys and values,
    the scores, the selection and the gather of kept entries; a `decode`
    kernel appends the new entry into the previous victim's slot, computes
    attention and the decode statistics in one pass, and selects victims.
    With `unfused`, attention kernels only compute outputs and separate
    `prefill_scoring` / `decode_scoring` kernels recompute the attention
    weights in a second pass over the keys.
  }];
  let options = [
    Option<"unfused", "unfused", "bool", /*default=*/"false",
           "Keep attention and scoring in separate kernels">,
  ];
  let dependentDialects = ["::kvc::KvcDialect"];
}

def KvcEmitPass : Pass<"kvc-emit", "mlir::ModuleOp"> {
  let summary = "Emit C++ or CUDA C++ sources and a C header per policy";
  let description = [{
    Writes, for every policy whose phases were formed into kernels,
    `kvc_<policy>.h` (the C entry points and workspace queries) and
    `kvc_<policy>_cpu.cpp` (target `cpu`) or `kvc_<policy>_cuda.cu` (target
    `cuda`) into `output-dir`, which must exist. Every policy constant and
    geometry value is folded into the sources. The output is deterministic.
  }];
  let options = [
    Option<"target", "target", "std::string", /*default=*/"\"cpu\"",
           "Code generation target: cpu or cuda">,
    Option<"outputDir", "output-dir", "std::string", /*default=*/"\"\"",
           "Existing directory that receives the sources">,
  ];
}

#endif // KVC_PASSES_PASSES_TD
