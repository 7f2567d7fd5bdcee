//===- kvc-opt.cpp - the kvc optimizer driver -----------------------------===//
//
// Parses, verifies and transforms kvc policies. Registers only what kvc uses:
// the kvc dialect, the kvc passes and the generic cleanup passes.
//
//===----------------------------------------------------------------------===//

#include "dialect/KvcDialect.h"
#include "passes/Passes.h"

#include "mlir/IR/DialectRegistry.h"
#include "mlir/Tools/mlir-opt/MlirOptMain.h"
#include "mlir/Transforms/Passes.h"

int main(int argc, char **argv) {
  mlir::DialectRegistry registry;
  registry.insert<kvc::KvcDialect>();

  kvc::registerKvcPasses();
  mlir::registerCanonicalizerPass();
  mlir::registerCSEPass();
  mlir::registerSymbolDCEPass();

  return mlir::asMainReturnCode(
      mlir::MlirOptMain(argc, argv, "kvc KV-cache policy compiler\n", registry));
}
