//===- KvcDialect.cpp - kvc dialect registration and attributes -----------===//
//
// Registers the kvc dialect and implements attribute verification. Attribute
// rules that need no model geometry live here; rules that relate a format to
// the model (a group against the head dimension) are checked by the policy
// once it is specialized.
//
//===----------------------------------------------------------------------===//

#include "dialect/KvcDialect.h"
#include "dialect/KvcOps.h"

#include "mlir/IR/Builders.h"
#include "mlir/IR/DialectImplementation.h"
#include "llvm/ADT/TypeSwitch.h"

using namespace mlir;
using namespace kvc;

#include "dialect/KvcDialect.cpp.inc"
#include "dialect/KvcEnums.cpp.inc"

#define GET_ATTRDEF_CLASSES
#include "dialect/KvcAttrs.cpp.inc"

#define GET_TYPEDEF_CLASSES
#include "dialect/KvcTypes.cpp.inc"

void KvcDialect::initialize() {
  addOperations<
#define GET_OP_LIST
#include "dialect/KvcOps.cpp.inc"
      >();
  addAttributes<
#define GET_ATTRDEF_LIST
#include "dialect/KvcAttrs.cpp.inc"
      >();
  addTypes<
#define GET_TYPEDEF_LIST
#include "dialect/KvcTypes.cpp.inc"
      >();
}

//===----------------------------------------------------------------------===//
// FormatAttr
//===----------------------------------------------------------------------===//

unsigned FormatAttr::getBits() const {
  switch (getKind()) {
  case FormatKind::full:
    return 0;
  case FormatKind::int2:
    return 2;
  case FormatKind::int4:
    return 4;
  case FormatKind::int8:
  case FormatKind::fp8_e4m3:
    return 8;
  }
  llvm_unreachable("unknown format kind");
}

LogicalResult
FormatAttr::verify(function_ref<InFlightDiagnostic()> emitError,
                   FormatKind kind, QuantAxis axis, int64_t group) {
  switch (kind) {
  case FormatKind::full:
    if (axis != QuantAxis::none || group != 0)
      return emitError() << "full-precision format takes no axis or group";
    return success();
  case FormatKind::int2:
  case FormatKind::int4:
    if (axis != QuantAxis::per_channel && axis != QuantAxis::per_token)
      return emitError() << stringifyFormatKind(kind)
                         << " format needs a per_channel or per_token axis";
    if (group <= 0)
      return emitError() << stringifyFormatKind(kind)
                         << " format needs a positive group size";
    return success();
  case FormatKind::int8:
    if (axis != QuantAxis::per_token && axis != QuantAxis::per_channel)
      return emitError()
             << "int8 format needs a per_token or per_channel axis";
    if (group < 0)
      return emitError() << "group size must not be negative";
    return success();
  case FormatKind::fp8_e4m3:
    if (axis != QuantAxis::per_head && axis != QuantAxis::per_token)
      return emitError() << "fp8_e4m3 format needs a per_head or per_token "
                            "scale axis";
    if (group != 0)
      return emitError() << "fp8_e4m3 format takes no group";
    return success();
  }
  llvm_unreachable("unknown format kind");
}

//===----------------------------------------------------------------------===//
// GeometryAttr
//===----------------------------------------------------------------------===//

LogicalResult
GeometryAttr::verify(function_ref<InFlightDiagnostic()> emitError,
                     int64_t layers, int64_t qHeads, int64_t kvHeads,
                     int64_t headDim, Type dtype) {
  if (layers <= 0 || qHeads <= 0 || kvHeads <= 0 || headDim <= 0)
    return emitError() << "geometry sizes must be positive";
  if (qHeads % kvHeads != 0)
    return emitError() << "q_heads (" << qHeads
                       << ") must be a multiple of kv_heads (" << kvHeads
                       << ")";
  if (!dtype.isF16() && !dtype.isBF16() && !dtype.isF32())
    return emitError() << "dtype must be f16, bf16 or f32, got " << dtype;
  return success();
}
