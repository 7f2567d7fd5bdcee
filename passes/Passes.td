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
    the head dimension, head tables against layers and kv-heads).
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
  ];
  let statistics = [
    Statistic<"numSpecialized", "num-specialized",
              "Number of policies bound to the geometry">,
  ];
}

#endif // KVC_PASSES_PASSES_TD
