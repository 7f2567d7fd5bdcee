//===- KvcTypes.td - kvc types -----------------------------*- tablegen -*-===//
//
// Value types flowing between policy ops inside a phase.
//
//===----------------------------------------------------------------------===//

#ifndef KVC_DIALECT_KVCTYPES_TD
#define KVC_DIALECT_KVCTYPES_TD

include "dialect/KvcAttrs.td"

class Kvc_Type<string name, string typeMnemonic, list<Trait> traits = []>
    : TypeDef<Kvc_Dialect, name, traits> {
  let mnemonic = typeMnemonic;
}

def Kvc_ScoreType : Kvc_Type<"Score", "score"> {
  let summary = "One importance score per cached entry";
  let description = [{
    A score vector per cached entry, for every query head (`query`), every
    kv-head (`kv_head`) or shared by every head of a layer (`layer`). Higher
    means more important. Selection needs `kv_head` or `layer` scores; query
    head scores are reduced over their GQA group first.

    ```mlir
    !kvc.score<query>
    ```
  }];
  let parameters = (ins EnumParameter<Kvc_Granularity>:$granularity);
  let assemblyFormat = "`<` $granularity `>`";
}

def Kvc_BudgetType : Kvc_Type<"Budget", "budget"> {
  let summary = "Number of entries each layer and kv-head keeps";
  let description = [{
    ```mlir
    !kvc.budget
    ```
  }];
}

def Kvc_SelectionType : Kvc_Type<"Selection", "selection"> {
  let summary = "The set of kept entries of every layer and kv-head";
  let description = [{
    ```mlir
    !kvc.selection
    ```
  }];
}

class Kvc_ScoreOf<string g> : Type<
    And<[CPred<"::llvm::isa<::kvc::ScoreType>($_self)">,
         CPred<"::llvm::cast<::kvc::ScoreType>($_self).getGranularity() == "
               "::kvc::Granularity::" # g>]>,
    "!kvc.score<" # g # ">", "::kvc::ScoreType">,
  BuildableType<"::kvc::ScoreType::get($_builder.getContext(), "
                "::kvc::Granularity::" # g # ")">;

def Kvc_QueryScore : Kvc_ScoreOf<"query">;
def Kvc_KvHeadScore : Kvc_ScoreOf<"kv_head">;
def Kvc_LayerScore : Kvc_ScoreOf<"layer">;

#endif // KVC_DIALECT_KVCTYPES_TD
