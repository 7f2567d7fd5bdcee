//===- KvcAttrs.td - kvc enums and attributes --------------*- tablegen -*-===//
//
// Enumerations and attributes of the kvc dialect: phase triggers, score
// granularities, reduction kinds, storage formats and model geometry.
//
//===----------------------------------------------------------------------===//

#ifndef KVC_DIALECT_KVCATTRS_TD
#define KVC_DIALECT_KVCATTRS_TD

include "dialect/KvcDialect.td"
include "mlir/IR/EnumAttr.td"
include "mlir/IR/BuiltinAttributeInterfaces.td"

//===----------------------------------------------------------------------===//
// Enumerations
//===----------------------------------------------------------------------===//

def Kvc_Trigger : I32EnumAttr<"Trigger", "when a policy phase runs", [
    I32EnumAttrCase<"after_prefill", 0>,
    I32EnumAttrCase<"every_step", 1>,
    I32EnumAttrCase<"every_n", 2>,
    I32EnumAttrCase<"over_budget", 3>]> {
  let cppNamespace = "::kvc";
}

def Kvc_Granularity : I32EnumAttr<"Granularity",
    "which attention heads a score vector belongs to", [
    I32EnumAttrCase<"query", 0>,
    I32EnumAttrCase<"kv_head", 1>,
    I32EnumAttrCase<"layer", 2>]> {
  let cppNamespace = "::kvc";
}

def Kvc_PoolKind : I32EnumAttr<"PoolKind", "pooling along tokens", [
    I32EnumAttrCase<"avg", 0>,
    I32EnumAttrCase<"max", 1>]> {
  let cppNamespace = "::kvc";
}

def Kvc_ReduceKind : I32EnumAttr<"ReduceKind", "reduction over heads", [
    I32EnumAttrCase<"mean", 0>,
    I32EnumAttrCase<"max", 1>,
    I32EnumAttrCase<"sum", 2>]> {
  let cppNamespace = "::kvc";
}

def Kvc_NormalizeKind : I32EnumAttr<"NormalizeKind",
    "normalization of a score vector", [
    I32EnumAttrCase<"zscore", 0>,
    I32EnumAttrCase<"sum", 1>,
    I32EnumAttrCase<"max", 2>]> {
  let cppNamespace = "::kvc";
}

def Kvc_CombineKind : I32EnumAttr<"CombineKind",
    "how score vectors are combined", [
    I32EnumAttrCase<"sum", 0>,
    I32EnumAttrCase<"product", 1>]> {
  let cppNamespace = "::kvc";
}

def Kvc_TieBreak : I32EnumAttr<"TieBreak",
    "which of two equal scores top-k keeps", [
    I32EnumAttrCase<"recent", 0>,
    I32EnumAttrCase<"oldest", 1>]> {
  let cppNamespace = "::kvc";
}

def Kvc_MergeWeight : I32EnumAttr<"MergeWeight",
    "weight of an evicted value merged into its nearest kept entry", [
    I32EnumAttrCase<"sim_norm", 0>,
    I32EnumAttrCase<"similarity", 1>,
    I32EnumAttrCase<"uniform", 2>]> {
  let cppNamespace = "::kvc";
}

def Kvc_FormatKind : I32EnumAttr<"FormatKind", "storage format of entries", [
    I32EnumAttrCase<"full", 0>,
    I32EnumAttrCase<"int2", 1>,
    I32EnumAttrCase<"int4", 2>,
    I32EnumAttrCase<"int8", 3>,
    I32EnumAttrCase<"fp8_e4m3", 4>]> {
  let cppNamespace = "::kvc";
}

def Kvc_QuantAxis : I32EnumAttr<"QuantAxis",
    "axis along which quantization parameters are shared", [
    I32EnumAttrCase<"none", 0>,
    I32EnumAttrCase<"per_channel", 1>,
    I32EnumAttrCase<"per_token", 2>,
    I32EnumAttrCase<"per_head", 3>]> {
  let cppNamespace = "::kvc";
}

def Kvc_KernelKind : I32EnumAttr<"KernelKind", "kind of generated kernel", [
    I32EnumAttrCase<"prefill", 0>,
    I32EnumAttrCase<"decode", 1>,
    I32EnumAttrCase<"prefill_scoring", 2>,
    I32EnumAttrCase<"decode_scoring", 3>,
    I32EnumAttrCase<"select", 4>]> {
  let cppNamespace = "::kvc";
}

//===----------------------------------------------------------------------===//
// Attributes
//===----------------------------------------------------------------------===//

class Kvc_Attr<string name, string attrMnemonic, list<Trait> traits = []>
    : AttrDef<Kvc_Dialect, name, traits> {
  let mnemonic = attrMnemonic;
}

def Kvc_FormatAttr : Kvc_Attr<"Format", "format"> {
  let summary = "Storage format of cached keys or values";
  let description = [{
    `kind` is the element format. Integer formats are asymmetric uniform
    quantization (scale and minimum per group); `axis` says along which
    dimension a group runs (`per_channel`: one channel over `group`
    consecutive tokens, as KIVI stores keys; `per_token`: `group` consecutive
    channels of one token, as KIVI stores values). `fp8_e4m3` carries one
    scale per `axis` (`per_head` or `per_token`). `full` stores the model's
    element type and takes neither axis nor group.

    ```mlir
    #kvc.format<int2, per_channel, group = 32>
    #kvc.format<fp8_e4m3, per_head>
    #kvc.format<full>
    ```
  }];
  let parameters = (ins
    EnumParameter<Kvc_FormatKind>:$kind,
    DefaultValuedParameter<"::kvc::QuantAxis", "::kvc::QuantAxis::none">:$axis,
    DefaultValuedParameter<"int64_t", "0">:$group);
  let assemblyFormat = "`<` $kind (`,` $axis^)? (`,` `group` `=` $group^)? `>`";
  let genVerifyDecl = 1;
  let extraClassDeclaration = [{
    /// Bits per stored element (full precision reports 0: it depends on the
    /// model's element type).
    unsigned getBits() const;
    bool isFull() const { return getKind() == ::kvc::FormatKind::full; }
  }];
}

def Kvc_GeometryAttr : Kvc_Attr<"Geometry", "geometry"> {
  let summary = "The model geometry a policy is specialized to";
  let description = [{
    Binds a model-agnostic policy to a model: number of layers, query heads,
    kv-heads (GQA: `q_heads` is a multiple of `kv_heads`), head dimension and
    element type of keys and values.

    ```mlir
    #kvc.geometry<layers = 30, q_heads = 9, kv_heads = 3, head_dim = 64,
                  dtype = f16>
    ```
  }];
  let parameters = (ins "int64_t":$layers, "int64_t":$q_heads,
                        "int64_t":$kv_heads, "int64_t":$head_dim,
                        "::mlir::Type":$dtype);
  let assemblyFormat = "`<` struct(params) `>`";
  let genVerifyDecl = 1;
  let extraClassDeclaration = [{
    /// Query heads sharing one kv-head.
    int64_t getGroupSize() const { return getQHeads() / getKvHeads(); }
  }];
}

#endif // KVC_DIALECT_KVCATTRS_TD
