//===- Kvc.td - kvc dialect umbrella -----------------------*- tablegen -*-===//

#ifndef KVC_DIALECT_KVC_TD
#define KVC_DIALECT_KVC_TD

include "dialect/KvcDialect.td"
include "dialect/KvcAttrs.td"
include "dialect/KvcTypes.td"
include "dialect/KvcOps.td"

#endif // KVC_DIALECT_KVC_TD
