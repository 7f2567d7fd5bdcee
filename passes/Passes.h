//===- Passes.h - kvc passes ------------------------------------*- C++ -*-===//
//
// Declarations and registration of every kvc pass.
//
//===----------------------------------------------------------------------===//

#ifndef KVC_PASSES_PASSES_H
#define KVC_PASSES_PASSES_H

#include "mlir/IR/BuiltinOps.h"
#include "mlir/Pass/Pass.h"

namespace kvc {

#define GEN_PASS_DECL
#include "passes/Passes.h.inc"

#define GEN_PASS_REGISTRATION
#include "passes/Passes.h.inc"

} // namespace kvc

#endif // KVC_PASSES_PASSES_H
