//===- Specialize.cpp - bind policies to a model geometry -----------------===//
//
// A policy is written once for every model; code generation needs the exact
// numbers of layers, heads and channels. This pass supplies them.
//
//===----------------------------------------------------------------------===//

#include "passes/Passes.h"

#include "dialect/KvcOps.h"

#include "mlir/IR/Builders.h"
#include "llvm/ADT/StringExtras.h"
#include "llvm/ADT/StringSwitch.h"

namespace kvc {
#define GEN_PASS_DEF_KVCSPECIALIZEPASS
#include "passes/Passes.h.inc"
} // namespace kvc

using namespace mlir;
using namespace kvc;

namespace {

/// Sizes of a model known by name.
struct KnownModel {
  int64_t layers, qHeads, kvHeads, headDim;
};

std::optional<KnownModel> lookupModel(StringRef name) {
  return llvm::StringSwitch<std::optional<KnownModel>>(name)
      .Case("smollm2-135m", KnownModel{30, 9, 3, 64})
      .Case("llama-3.1-8b", KnownModel{32, 32, 8, 128})
      .Case("mistral-7b", KnownModel{32, 32, 8, 128})
      .Default(std::nullopt);
}

struct SpecializePass final
    : kvc::impl::KvcSpecializePassBase<SpecializePass> {
  using Base::Base;

  void runOnOperation() override {
    ModuleOp module = getOperation();
    MLIRContext *ctx = &getContext();

    int64_t l = layers, q = qHeads, kv = kvHeads, d = headDim;
    if (!model.empty()) {
      std::optional<KnownModel> known = lookupModel(model);
      if (!known) {
        mlir::emitError(module.getLoc())
            << "kvc-specialize: unknown model '" << model
            << "'; known: smollm2-135m, llama-3.1-8b, "
               "mistral-7b";
        return signalPassFailure();
      }
      l = known->layers;
      q = known->qHeads;
      kv = known->kvHeads;
      d = known->headDim;
    }
    if (l <= 0 || q <= 0 || kv <= 0 || d <= 0) {
      mlir::emitError(module.getLoc())
          << "kvc-specialize: give a model name or positive "
             "layers, q-heads, kv-heads and head-dim";
      return signalPassFailure();
    }
    Type elementType = llvm::StringSwitch<Type>(dtype)
                           .Case("f16", Float16Type::get(ctx))
                           .Case("bf16", BFloat16Type::get(ctx))
                           .Case("f32", Float32Type::get(ctx))
                           .Default(Type());
    if (!elementType) {
      mlir::emitError(module.getLoc())
          << "kvc-specialize: dtype must be f16, bf16 or f32, "
             "got '"
          << dtype << "'";
      return signalPassFailure();
    }
    auto diagEmitter = [&]() {
      return mlir::emitError(module.getLoc()) << "kvc-specialize: ";
    };
    if (failed(GeometryAttr::verify(diagEmitter, l, q, kv, d, elementType)))
      return signalPassFailure();
    auto geometry = GeometryAttr::get(ctx, l, q, kv, d, elementType);

    if (!name.empty()) {
      auto policies = llvm::to_vector(module.getOps<PolicyOp>());
      if (policies.size() != 1) {
        mlir::emitError(module.getLoc())
            << "kvc-specialize: 'name' renames a module's "
               "only policy, but it holds "
            << policies.size();
        return signalPassFailure();
      }
      if (!llvm::all_of(name,
                        [](char c) { return llvm::isAlnum(c) || c == '_'; })) {
        mlir::emitError(module.getLoc())
            << "kvc-specialize: policy name '" << name
            << "' must be letters, digits and '_'";
        return signalPassFailure();
      }
      policies.front().setSymName(name);
    }
    for (PolicyOp policy : module.getOps<PolicyOp>()) {
      GeometryAttr existing = policy.getGeometryAttr();
      if (existing && existing != geometry) {
        policy.emitOpError() << "is already specialized to " << existing;
        return signalPassFailure();
      }
      policy.setGeometryAttr(geometry);
      ++numSpecialized;
    }
  }
};

} // namespace
