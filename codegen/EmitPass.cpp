//===- EmitPass.cpp - write generated sources -----------------------------===//
//
// The kvc-emit pass: runs the emitter of the requested target on every
// policy and writes the files into an existing output directory.
//
//===----------------------------------------------------------------------===//

#include "codegen/Emitter.h"
#include "passes/Passes.h"

#include "llvm/Support/FileSystem.h"
#include "llvm/Support/Path.h"

namespace kvc {
#define GEN_PASS_DEF_KVCEMITPASS
#include "passes/Passes.h.inc"
} // namespace kvc

using namespace mlir;
using namespace kvc;

namespace {

struct EmitPass final : kvc::impl::KvcEmitPassBase<EmitPass> {
  using Base::Base;

  void runOnOperation() override {
    ModuleOp module = getOperation();
    if (target != "cpu" && target != "cuda") {
      mlir::emitError(module.getLoc()) << "kvc-emit: unknown target '" << target
                                       << "'; expected cpu or cuda";
      return signalPassFailure();
    }
    if (outputDir.empty() || !llvm::sys::fs::is_directory(outputDir)) {
      mlir::emitError(module.getLoc())
          << "kvc-emit: output directory '" << outputDir << "' does not exist";
      return signalPassFailure();
    }
    SmallVector<EmittedFile> files;
    for (PolicyOp policy : module.getOps<PolicyOp>())
      if (failed(target == "cuda" ? emitCuda(policy, files)
                                  : emitCpp(policy, files)))
        return signalPassFailure();
    if (files.empty()) {
      mlir::emitError(module.getLoc())
          << "kvc-emit: the module holds no policy";
      return signalPassFailure();
    }
    for (const EmittedFile &file : files) {
      SmallString<256> path(outputDir);
      llvm::sys::path::append(path, file.name);
      std::error_code ec;
      llvm::raw_fd_ostream os(path, ec, llvm::sys::fs::OF_Text);
      if (ec) {
        mlir::emitError(module.getLoc())
            << "kvc-emit: cannot write '" << path << "': " << ec.message();
        return signalPassFailure();
      }
      os << file.contents;
    }
  }
};

} // namespace
