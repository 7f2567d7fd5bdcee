//===- EmitterSupport.cpp - what the C++ and CUDA emitters share ----------===//

#include "codegen/Emitter.h"

#include "mlir/IR/AsmState.h"
#include "llvm/ADT/StringExtras.h"
#include "llvm/ADT/TypeSwitch.h"

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

bool kvc::usesWord(StringRef text, StringRef word) {
  auto isWord = [](char c) { return llvm::isAlnum(c) || c == '_'; };
  for (size_t at = text.find(word); at != StringRef::npos;
       at = text.find(word, at + 1)) {
    const size_t end = at + word.size();
    if ((at != 0 && isWord(text[at - 1])) ||
        (end < text.size() && isWord(text[end])))
      continue;
    // The line up to the match: a `//` there makes it a comment.
    const size_t lineStart = text.rfind('\n', at);
    const StringRef before = text.slice(
        lineStart == StringRef::npos ? 0 : lineStart + 1, at);
    if (!before.contains("//"))
      return true;
  }
  return false;
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

std::string kvc::batchDecodeDeclaration(const std::string &name,
                                        KernelOp kernel, bool stream) {
  std::string s = "kvc_status_t " + name +
                  "_batch(kvc_context_t *context, int32_t batch, const "
                  "uint64_t *sequences, int32_t layer, const float *q, ";
  if (kernel.getKind() != KernelKind::decode_scoring)
    s += "const float *k, const float *v, ";
  s += "const int32_t *positions, ";
  if (writesOutput(kernel))
    s += "float *out, ";
  s += "void *workspace, uint64_t workspace_bytes";
  return s + (stream ? ", void *stream)" : ")");
}

std::string kvc::batchWorkspaceDeclaration(const std::string &name) {
  return "uint64_t " + name +
         "_batch_workspace_bytes(int32_t batch, int32_t num_slots)";
}

std::string kvc::batchSequenceChecks(const std::string &entry) {
  return "  // A batch of at least one sequence, each taking one step.\n"
         "  if (const kvc_status_t status = kvc_check_batch(\"" +
         entry +
         "\", batch, sequences);\n"
         "      status != KVC_STATUS_OK)\n"
         "    return status;\n";
}

/// The `select` kernel of a global budget: one selection over the score
/// state of every layer and head, then the evictions.
LogicalResult kvc::emitSelectKernel(PolicyOp policy, KernelOp kernel,
                                    AsmState &asmState, StringRef target,
                                    raw_ostream &src, raw_ostream &hdr) {
  std::string name = ("kvc_" + policy.getSymName() + "_" + target + "_" +
                      stringifyKernelKind(kernel.getKind()))
                         .str();
  std::string tryMacro = target == "cuda" ? "KVC_CUDA_TRY" : "KVC_CPU_TRY";
  auto comment = [&](Operation *op) {
    std::string text;
    llvm::raw_string_ostream os(text);
    op->print(os, asmState);
    return "  // " + text + "\n";
  };
  std::string body, budgetExpr;
  llvm::raw_string_ostream os(body);
  bool preferRecent = true;
  for (Operation &op : kernel.getBody().front()) {
    os << comment(&op);
    LogicalResult result =
        llvm::TypeSwitch<Operation *, LogicalResult>(&op)
            .Case([&](ScoreStateOp) {
              os << "  // Every live entry of every head is a candidate.\n"
         "  for (int32_t layer = 0; layer < kLayers; ++layer)\n"
         "    for (int32_t h = 0; h < kKvHeads; ++h) {\n"
         "      kvc_metadata_t meta;\n"
      << "      " << tryMacro
      << "(kvc_get_metadata(context, sequence, layer, h, &meta));\n"
         "      int32_t live = 0;\n"
      << "      " << tryMacro
      << "(kvc_get_num_entries(context, sequence, layer, h, &live));\n"
         "      if (live > n)\n"
      << "        return kvc_report_error(KVC_STATUS_INVALID_ARGUMENT, \""
      << name << ": a head holds more than n entries\");\n"
      << "      for (int32_t s = 0; s < meta.num_slots; ++s)\n"
         "        if (meta.position[s] != KVC_POSITION_NONE)\n"
         "          candidates[count++] = {meta.score[s], meta.position[s], "
         "layer * kKvHeads + h, s};\n"
         "    }\n";
              return success();
            })
            .Case([&](BudgetUniformOp uniform) {
              if (std::optional<int64_t> count = uniform.getCount()) {
                budgetExpr = std::to_string(*count) +
                             " * static_cast<int64_t>(kLayers) * kKvHeads";
                os << "  // Per layer and head on average.\n";
              } else {
                budgetExpr = "static_cast<int64_t>(count * (1.0 - " +
                             floatLiteral(target,
                                          uniform.getRatio()->convertToDouble()) +
                             "))";
                os << "  // A fraction of every live entry.\n";
              }
              return success();
            })
            .Case([&](BudgetGlobalOp) {
              os << "  const int64_t total = " << budgetExpr << ";\n";
              return success();
            })
            .Case([&](TopKOp topk) {
              preferRecent = topk.getTie() == TieBreak::recent;
              os << "  " << tryMacro
                 << "(kvc_select_candidates(candidates, count, total, "
                 << (preferRecent ? 1 : 0) << "));\n";
              return success();
            })
            .Case([&](EvictOp) {
              os << "  for (int64_t i = std::min(total, count); i < count;) "
                    "{\n"
                    "    const int32_t head = candidates[i].head;\n"
                    "    int32_t numVictims = 0;\n"
                    "    while (i < count && candidates[i].head == head)\n"
                    "      victims[numVictims++] = candidates[i++].slot;\n"
                    "    " + tryMacro + "(kvc_evict(context, sequence, head / "
                    "kKvHeads, head % kKvHeads, numVictims, victims));\n"
                    "  }\n";
              return success();
            })
            .Default([&](Operation *other) {
              return other->emitOpError()
                     << "is not supported by the cpu emitter in a select "
                        "kernel";
            });
    if (failed(result))
      return failure();
  }
  if (budgetExpr.empty())
    return kernel.emitOpError() << "select kernel without a budget";

  std::string doc =
      "Global selection of a sequence: after the prefill of every layer, "
      "one top-k over the score every entry of every layer and head stored, "
      "then the evictions. n: the prompt length (no head holds more "
      "entries).";
  if (target == "cuda")
    doc += " Runs on the host over the runtime's metadata (the prefill "
           "downloaded the scores): the workspace is host memory, and no "
           "device work is queued.";
  std::string decl = "kvc_status_t " + name +
                     "(kvc_context_t *context, uint64_t sequence, int32_t n, "
                     "void *workspace, uint64_t workspace_bytes)";
  std::string wsDecl = "uint64_t " + name + "_workspace_bytes(int32_t n)";
  src << "/// A candidate per entry of every head, and the victims of one.\n"
      << wsDecl << " {\n"
      << "  return static_cast<uint64_t>(n) * (sizeof(kvc_candidate_t) * kLayers * kKvHeads + sizeof(int32_t));\n}\n\n"
      << "/// " << doc << "\n"
      << decl << " {\n"
      << "  if (!context || !workspace)\n"
      << "    return kvc_report_error(KVC_STATUS_NULL_POINTER, \"" << name
      << ": null argument\");\n"
      << "  if (n <= 0)\n"
      << "    return kvc_report_error(KVC_STATUS_INVALID_ARGUMENT, \"" << name
      << ": the prompt is empty\");\n"
      << "  if (workspace_bytes < " << name << "_workspace_bytes(n))\n"
      << "    return kvc_report_error(KVC_STATUS_BUFFER_TOO_SMALL, \"" << name
      << ": workspace smaller than " << name << "_workspace_bytes(n)\");\n"
      << "  kvc_config_t config;\n"
      << "  " << tryMacro << "(kvc_context_config(context, &config));\n"
         "  if (config.num_layers != kLayers || config.num_q_heads != kQHeads "
         "||\n"
         "      config.num_kv_heads != kKvHeads || config.head_dim != "
         "kHeadDim)\n"
      << "    return kvc_report_error(KVC_STATUS_GEOMETRY_MISMATCH, \"" << name
      << ": the context's geometry is not the policy's\");\n"
      << "  auto *candidates = static_cast<kvc_candidate_t *>(workspace);\n"
         "  int32_t *victims = reinterpret_cast<int32_t *>(candidates + "
         "static_cast<int64_t>(n) * kLayers * kKvHeads);\n"
         "  int64_t count = 0;\n"
      << body << "  return KVC_STATUS_OK;\n}\n";
  hdr << "/// Workspace bytes of " << name << ".\n" << wsDecl << ";\n"
      << "/// " << doc << "\n" << decl << ";\n\n";
  return success();
}

std::string kvc::doubleLiteral(double x) {
  char text[40];
  std::snprintf(text, sizeof text, "%.17g", x);
  std::string s = text;
  if (s.find_first_of(".e") == std::string::npos)
    s += ".0";
  return s;
}

std::string kvc::policyConstants(ArrayRef<KernelOp> kernels, StringRef ns) {
  std::string constants;
  llvm::raw_string_ostream cs(constants);
  std::optional<int64_t> window, period, history;
  std::optional<double> decay, threshold;
  std::optional<FormatAttr> low;
  for (KernelOp kernel : kernels) {
    if (kernel.getPeriod())
      period = *kernel.getPeriod();
    for (auto gather : kernel.getBody().front().getOps<GatherOp>())
      if (gather.getLow())
        low = *gather.getLow();
    for (auto pass : kernel.getBody().front().getOps<AttentionPassOp>()) {
      if (pass.getWindow())
        window = *pass.getWindow();
      if (pass.getAccumulate())
        decay = pass.getAccumulate()->convertToDouble();
      if (pass.getPersistence()) {
        history = *pass.getPersistence();
        threshold = pass.getThreshold()->convertToDouble();
      }
    }
  }
  if (period)
    cs << "/// Positions between two periodic compressions: the phase runs "
          "after\n/// the decode step of position p when (p + 1) % kPeriod "
          "== 0.\n"
       << "constexpr int32_t kPeriod = " << *period << ";\n";
  if (window && period)
    cs << "/// Decode queries observed before each periodic compression.\n"
       << "constexpr int32_t kWindow = " << *window << ";\n";
  else if (window)
    cs << "/// Observation window of the prefill statistics.\n"
       << "constexpr int32_t kWindow = " << *window << ";\n";
  if (history)
    cs << "/// Steps of importance history and the weight that makes an "
          "entry\n/// important at a step.\n"
       << "constexpr int32_t kHistory = " << *history << ";\n"
       << "constexpr float kThreshold = " << floatLiteral(ns, *threshold)
       << ";\n";
  if (decay)
    cs << "/// Decay of the accumulated attention state.\n"
       << "constexpr float kDecay = " << floatLiteral(ns, *decay) << ";\n";
  if (low)
    cs << "/// The runtime format of the low page class (mixed precision).\n"
       << "constexpr int32_t kLowFormat = "
       << (low->getKind() == FormatKind::int2 ? "KVC_FORMAT_INT2"
                                              : "KVC_FORMAT_INT4")
       << ";\n";
  return constants;
}

void kvc::addLowClass(ArrayRef<KernelOp> kernels, RuntimeStorage &storage) {
  for (KernelOp kernel : kernels)
    for (auto gather : kernel.getBody().front().getOps<GatherOp>())
      if (std::optional<FormatAttr> low = gather.getLow()) {
        storage.lowFormat = low->getKind() == FormatKind::int2
                                ? "KVC_FORMAT_INT2"
                                : "KVC_FORMAT_INT4";
        storage.groupSize = low->getGroup();
      }
}
