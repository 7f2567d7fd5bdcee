//===- EmitterSupport.cpp - what the C++ and CUDA emitters share ----------===//

#include "codegen/Emitter.h"

#include <cmath>
#include <cstdio>

using namespace mlir;
using namespace kvc;

std::string kvc::floatLiteral(StringRef ns, double x) {
  if (std::isinf(x))
    return ("kvc::" + ns + (x > 0 ? "::kPosInf" : "::kNegInf")).str();
  char text[32];
  std::snprintf(text, sizeof text, "%.9g", x);
  std::string s = text;
  if (s.find_first_of(".e") == std::string::npos)
    s += ".0";
  return s + "f";
}

std::string kvc::reduceEnumerator(StringRef ns, ReduceKind kind) {
  const char *name = "Mean";
  switch (kind) {
  case ReduceKind::mean:
    name = "Mean";
    break;
  case ReduceKind::max:
    name = "Max";
    break;
  case ReduceKind::sum:
    name = "Sum";
    break;
  }
  return ("kvc::" + ns + "::Reduce::" + name).str();
}

std::string kvc::normalizeEnumerator(StringRef ns, NormalizeKind kind) {
  const char *name = "ZScore";
  switch (kind) {
  case NormalizeKind::zscore:
    name = "ZScore";
    break;
  case NormalizeKind::sum:
    name = "Sum";
    break;
  case NormalizeKind::max:
    name = "Max";
    break;
  }
  return ("kvc::" + ns + "::Normalize::" + name).str();
}

bool kvc::isQueryScore(Value v) {
  return cast<ScoreType>(v.getType()).getGranularity() == Granularity::query;
}

bool kvc::isDecodeKernel(KernelOp kernel) {
  return kernel.getKind() == KernelKind::decode ||
         kernel.getKind() == KernelKind::decode_scoring;
}

bool kvc::writesOutput(KernelOp kernel) {
  return kernel.getKind() == KernelKind::prefill ||
         kernel.getKind() == KernelKind::decode;
}
