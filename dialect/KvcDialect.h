//===- KvcDialect.h - kvc dialect -------------------------------*- C++ -*-===//
//
// Declarations of the kvc dialect, its enums, attributes and types.
//
//===----------------------------------------------------------------------===//

#ifndef KVC_DIALECT_KVCDIALECT_H
#define KVC_DIALECT_KVCDIALECT_H

#include "mlir/IR/BuiltinAttributes.h"
#include "mlir/IR/BuiltinTypes.h"
#include "mlir/IR/Dialect.h"

#include "dialect/KvcDialect.h.inc"
#include "dialect/KvcEnums.h.inc"

#define GET_ATTRDEF_CLASSES
#include "dialect/KvcAttrs.h.inc"

#define GET_TYPEDEF_CLASSES
#include "dialect/KvcTypes.h.inc"

#endif // KVC_DIALECT_KVCDIALECT_H
