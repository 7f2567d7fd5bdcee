//===- KvcOps.h - kvc operations --------------------------------*- C++ -*-===//
//
// Declarations of the kvc operations.
//
//===----------------------------------------------------------------------===//

#ifndef KVC_DIALECT_KVCOPS_H
#define KVC_DIALECT_KVCOPS_H

#include "dialect/KvcDialect.h"

#include "mlir/Bytecode/BytecodeOpInterface.h"
#include "mlir/IR/OpDefinition.h"
#include "mlir/IR/OpImplementation.h"
#include "mlir/IR/RegionKindInterface.h"
#include "mlir/IR/SymbolTable.h"
#include "mlir/Interfaces/InferTypeOpInterface.h"
#include "mlir/Interfaces/SideEffectInterfaces.h"

namespace kvc {
class StorageOp;
} // namespace kvc

#define GET_OP_CLASSES
#include "dialect/KvcOps.h.inc"

#endif // KVC_DIALECT_KVCOPS_H
