//===- CppEmitter.cpp - the CPU backend -----------------------------------===//
//
// Emits one C++ function per kernel of a policy. A kernel loops over the
// kv-heads of one layer; inside, its stages run in order, each a few lines
// that call the building blocks of runtime/kvc_cpu.h with the policy's
// constants folded in, under a comment that prints the op it came from.
//
//===----------------------------------------------------------------------===//

#include "codegen/Emitter.h"
#include "codegen/KernelEmitterBase.h"

#include "mlir/IR/AsmState.h"
#include "llvm/ADT/DenseMap.h"
#include "llvm/ADT/StringExtras.h"
#include "llvm/ADT/TypeSwitch.h"
#include "llvm/Support/FormatVariadic.h"

#include <cmath>
#include <cstdio>

using namespace mlir;
using namespace kvc;

namespace {

/// Emits the body of one kernel function.
class KernelEmitter : public KernelEmitterBase {
public:
  KernelEmitter(PolicyOp policy, KernelOp kernel, AsmState &asmState)
      : KernelEmitterBase(policy, kernel, asmState, "cpu"),
        geometry(policy.getGeometryAttr()) {}

  /// A one-paragraph description for the header.
  std::string documentation();
  std::string batchDocumentation() {
    return "The step of " + name +
           " for `batch` distinct sequences of any lengths, sequence "
           "sequences[b] at positions[b] with row b of q" +
           (kernel.getKind() != KernelKind::decode_scoring ? ", k, v" : "") +
           (writesOutput(kernel) ? " and out" : "") +
           ", one after another in one workspace. Every sequence, the "
           "workspace and the arguments are checked before the first step" +
           (appendOp ? std::string(", and every head of every sequence "
                                   "appends before any computes") +
                           appendFailure()
                     : std::string("."));
  }
  /// What a failed append leaves (documentation).
  std::string appendFailure() {
    return ": a full pool fails the call with nothing appended.";
  }
  /// Emits the batch entry point of a decode kernel: checks, every
  /// sequence's appends, then the heads function once per sequence.
  void emitBatch(raw_ostream &os);

  LogicalResult emit(raw_ostream &os);

private:
  /// Writes the entry point: `prologue` (its declaration and checks) and
  /// `loops` (the heads, up to the closing brace). A decode kernel's loops
  /// become the heads function the entry and the batch entry call once its
  /// appends are made.
  void emitEntry(raw_ostream &os, const std::string &prologue,
                 const std::string &loops);
  /// The append's op comment and what the step does with it.
  std::string appendComment() {
    return opComment(appendOp) + "\n" +
           "  // Every head appends before any computes, all or nothing "
           "(kvc_append_step):\n  // a full pool changes nothing.\n";
  }
  /// Decode: a loop over the kv-heads of `sequence`, indented by `indent`,
  /// that returns the error of entry `entry` when the workspace is too
  /// small for a head's slots plus a page.
  std::string workspaceCheck(const std::string &indent,
                             const std::string &sequence,
                             const std::string &entry) {
    return indent + "  for (int32_t h = 0; h < kKvHeads; ++h) {\n" + indent +
           "    int32_t slots = 0;\n" + indent +
           "    KVC_CPU_TRY(kvc_get_num_slots(context, " + sequence +
           ", layer, h, &slots));\n" + indent + "    if (workspace_bytes < " +
           name + "_workspace_bytes(slots + config.page_size))\n" + indent +
           "      return kvc_report_error(KVC_STATUS_BUFFER_TOO_SMALL, \"" +
           entry + ": workspace smaller than " + name +
           "_workspace_bytes(slots + page_size)\");\n" + indent + "  }\n";
  }
  /// Decode: the arguments of the heads function for sequence `sequence`,
  /// position `position`, rows of q and out at `q` and `out`.
  std::string headsArguments(const std::string &sequence,
                             const std::string &q,
                             const std::string &position,
                             const std::string &out);

  LogicalResult emitStage(Operation *op, raw_ostream &os);
  /// True if every user of `op` runs after the loop it is emitted in.
  bool usedOnlyAcrossHeads(Operation *op) {
    return crossOp && op->isBeforeInBlock(crossOp) &&
           llvm::all_of(op->getUsers(), [&](Operation *user) {
             return user == crossOp || crossOp->isBeforeInBlock(user);
           });
  }
  LogicalResult emitAttentionPass(AttentionPassOp pass, raw_ostream &os);
  void emitGather(GatherOp gather, raw_ostream &os);
  /// Emits `body` once per query head row of a per-query buffer, or once.
  void forRows(raw_ostream &os, bool perQuery, const std::string &body);

  GeometryAttr geometry;
  /// The kernel's append, if any (a decode step's new entry).
  AppendOp appendOp;
  /// The heads function of a decode kernel reads `position`.
  bool headsUsePosition = false;
  /// The group-reduced accumulated state exists (decode: in the runtime's
  /// score metadata; prefill: computed for the gather).
  bool hasState = false;
  /// The score state holds a periodic kernel's window sum.
  bool windowState = false;
};

std::string KernelEmitter::documentation() {
  switch (kernel.getKind()) {
  case KernelKind::prefill:
    return "Prefill of one layer: causal attention of the n prompt tokens "
           "(out: n x q_heads x head_dim)" +
           std::string(kernel.getTrigger()
                           ? ", the policy's prefill phase fused into the "
                             "same pass, and the gather of the kept entries "
                             "into the runtime's pages"
                           : " and the gather of every entry into the "
                             "runtime's pages") +
           ". q: n x q_heads x head_dim; k, v: n x kv_heads x head_dim, after "
           "RoPE; positions: n original positions. The heads of `layer` must "
           "be empty, and a prefill that fails leaves them empty.";
  case KernelKind::prefill_scoring:
    return "Unfused prefill scoring of one layer: recomputes the attention "
           "weights of the prompt in a second pass, scores, selects and "
           "gathers the kept entries into the runtime's pages.";
  case KernelKind::decode:
    return "Decode step of one layer for one new token: appends k, v "
           "(kv_heads x head_dim) at `position` into the lowest free slot, "
           "then attention of q (q_heads x head_dim) over the cache into out" +
           std::string(kernel.getTrigger() ? ", with the policy's decode "
                                             "statistics and victim "
                                             "selection in the same pass"
                                           : "") +
           (appendOp ? ". Every head appends before any computes" +
                           appendFailure()
                     : std::string("."));
  case KernelKind::decode_scoring:
    return "Unfused decode scoring of one layer: recomputes the attention "
           "weights of q over the cache in a second pass, folds the "
           "statistics and evicts the victims.";
  case KernelKind::select:
    break; // Emitted by emitSelectKernel.
  }
  llvm_unreachable("unknown kernel kind");
}

void KernelEmitter::emitBatch(raw_ostream &out) {
  const bool hasKv = kernel.getKind() != KernelKind::decode_scoring;
  const std::string batchName = name + "_batch";
  out << "/// Workspace bytes of " << batchName
      << ": the steps share one workspace.\n"
      << batchWorkspaceDeclaration() << " {\n"
      << "  (void)batch;\n"
      << "  return " << name << "_workspace_bytes(num_slots);\n}\n\n";
  out << "/// " << batchDocumentation() << "\n";
  out << batchDeclaration() << " {\n";
  out << "  if (!context || !sequences || !q" << (hasKv ? " || !k || !v" : "")
      << " || !positions" << (writesOutput(kernel) ? " || !out" : "")
      << " || !workspace)\n"
      << "    return kvc_report_error(KVC_STATUS_NULL_POINTER, \"" << batchName
      << ": null argument\");\n";
  out << layerCheck(batchName);
  out << batchSequenceChecks(batchName);
  out << "  kvc_config_t config;\n"
         "  KVC_CPU_TRY(kvc_context_config(context, &config));\n"
         "  if (config.num_kv_heads != kKvHeads)\n"
      << "    return kvc_report_error(KVC_STATUS_GEOMETRY_MISMATCH, \""
      << batchName << ": the context's geometry is not the policy's\");\n";
  out << "  // Every sequence exists and fits the workspace before the first "
         "step.\n"
         "  for (int32_t b = 0; b < batch; ++b)\n"
      << workspaceCheck("  ", "sequences[b]", batchName);
  if (appendOp)
    out << "  " << appendComment()
        << "  KVC_CPU_TRY(kvc::cpu::appendStep(context, batch, sequences, "
           "layer, kKvHeads, kHeadDim, k, v,\n"
           "                                   positions));\n";
  out << "  for (int32_t b = 0; b < batch; ++b)\n"
      << "    KVC_CPU_TRY(" << name << "_heads("
      << headsArguments("sequences[b]", "q + b * kQStride", "positions[b]",
                        "out + b * kQStride")
      << "));\n";
  out << "  return KVC_STATUS_OK;\n}\n\n";
}

std::string KernelEmitter::headsArguments(const std::string &sequence,
                                          const std::string &q,
                                          const std::string &position,
                                          const std::string &out) {
  return "context, " + sequence + ", layer, " + q + ", " +
         (headsUsePosition ? position + ", " : "") +
         (writesOutput(kernel) ? out + ", " : "") + "workspace";
}

void KernelEmitter::emitEntry(raw_ostream &out, const std::string &prologue,
                              const std::string &loops) {
  if (!decode) {
    out << prologue << loops;
    return;
  }
  headsUsePosition = usesWord(loops, "position");
  out << "/// The heads of " << name
      << " once its checks passed and its appends are made"
      << (crossOp ? ": two loops over the kv-heads around the cross-head "
                    "stage.\n"
                  : ": one kv-head after another.\n")
      << "static kvc_status_t " << name
      << "_heads(kvc_context_t *context, uint64_t sequence, int32_t layer, "
         "const float *q, "
      << (headsUsePosition ? "int32_t position, " : "")
      << (writesOutput(kernel) ? "float *out, " : "")
      << "void *workspace) {\n"
      << loops << "\n";
  out << prologue;
  out << "  // Every head fits the workspace before the step changes "
         "anything.\n"
      << workspaceCheck("", "sequence", name);
  if (appendOp)
    out << "  " << appendComment()
        << "  KVC_CPU_TRY(kvc::cpu::appendStep(context, 1, &sequence, layer, "
           "kKvHeads, kHeadDim, k, v,\n"
           "                                   &position));\n";
  out << "  return " << name << "_heads("
      << headsArguments("sequence", "q", "position", "out") << ");\n}\n";
}

void KernelEmitter::forRows(raw_ostream &os, bool perQuery,
                            const std::string &body) {
  if (!perQuery) {
    os << "    " << body << "\n";
    return;
  }
  os << "    for (int32_t g = 0; g < kGroup; ++g)\n      " << body << "\n";
}

LogicalResult KernelEmitter::emitAttentionPass(AttentionPassOp pass,
                                               raw_ostream &os) {
  attention = pass;
  os << "    " << opComment(pass) << "\n";
  const bool acc = pass.getAccumulate().has_value();
  const bool persist = pass.getPersistence().has_value();
  std::string persistReduce =
      persist ? reduceEnumerator("cpu", *pass.getPersistenceReduce()) : "";
  if (!decode) {
    std::string outArg = pass.getOutput() ? "oh" : "nullptr";
    if (persist)
      os << "    const kvc::cpu::PersistenceBits persistence{kHistory, "
            "kThreshold, "
         << persistReduce << ", persistBits, persistRow};\n";
    os << "    kvc::cpu::prefillAttention<kGroup, kHeadDim>(n, qh, kQStride, "
          "kh, vh, kKvStride, kSoftmaxScale, "
       << outArg << ", " << (pass.getWindow() ? "kWindow" : "0") << ", "
       << (pass.getWindow() ? "windowProbs" : "nullptr") << ", "
       << (pass.getLast() ? "lastProbs" : "nullptr") << ", "
       << (acc ? "accumulated, kDecay" : "nullptr, 1.0f") << ", logits"
       << (persist ? ", &persistence" : "") << ");\n";
    hasState = acc;
    return success();
  }
  const bool periodic = kernel.getTrigger() == Trigger::every_n;
  if (pass.getWindow() && !periodic)
    return unsupported(pass, "a decode window outside a periodic kernel");
  if (pass.getWindow() && acc)
    return unsupported(pass, "the score state holds one running statistic, "
                             "not a window sum and an accumulated sum");
  const bool needProbs = pass.getLast() || acc || persist || pass.getWindow();
  std::string outArg =
      pass.getOutput() ? "out + h * kGroup * kHeadDim" : "nullptr";
  os << "    KVC_CPU_TRY(kvc::cpu::decodeAttention<kGroup, kHeadDim>(head, "
        "q + h * kGroup * kHeadDim, kSoftmaxScale, "
     << outArg << ", " << (needProbs ? "probs" : "nullptr") << ", logits));\n";
  if (acc) {
    os << "    kvc::cpu::foldAccumulated(head, probs, kGroup, kDecay, "
       << reduceEnumerator("cpu", *pass.getReduce()) << ");\n";
    hasState = true;
  }
  if (persist)
    os << "    kvc::cpu::foldPersistence(head, probs, kGroup, kThreshold, "
       << persistReduce << ");\n";
  if (pass.getWindow())
    os << "    // The window: the group-mean weights of the last kWindow "
          "queries of\n    // each period, summed in the score state.\n"
          "    if (position % kPeriod >= kPeriod - kWindow)\n"
          "      kvc::cpu::foldWindowSum(head, probs, kGroup, position % "
          "kPeriod == kPeriod - kWindow);\n";
  if (periodic)
    os << "    // The phase runs once every kPeriod positions.\n"
          "    if ((position + 1) % kPeriod != 0)\n"
          "      continue;\n";
  return success();
}

void KernelEmitter::emitGather(GatherOp gather, raw_ostream &os) {
  os << "    " << opComment(gather) << "\n";
  const bool selects = !kernel.getBody().front().getOps<TopKOp>().empty();
  const bool mixed = static_cast<bool>(gather.getLow());
  if (mixed)
    os << "    // Mixed precision: the best-ranked kept entries are gathered "
          "first and\n    // stay in the storage format, the rest go to the "
          "low page class.\n"
          "    const int32_t numHigh = kvc::cpu::markHighPrecision("
       << values.lookup(gather.getRank()).name << ", positions, n, "
       << (selects ? "victims, numVictims" : "nullptr, 0") << ", "
       << doubleLiteral(gather.getFraction()->convertToDouble())
       << ", order, highPrecision);\n";
  os << "    int32_t kept = 0;\n";
  std::string indent = "    ";
  if (mixed) {
    os << "    for (int32_t pass = 0; pass < 2; ++pass)\n";
    indent = "      ";
  }
  if (selects)
    os << indent << "for (int32_t i = 0, next = 0; i < n; ++i) {\n"
       << indent << "  if (next < numVictims && victims[next] == i) {\n"
       << indent << "    ++next;\n"
       << indent << "    continue;\n"
       << indent << "  }\n";
  else
    os << indent << "for (int32_t i = 0; i < n; ++i) {\n";
  if (mixed)
    os << indent << "  if (highPrecision[i] != (pass == 0))\n"
       << indent << "    continue;\n";
  os << indent
     << "  std::memcpy(gatherKeys + kept * kHeadDim, kh + i * kKvStride, "
        "sizeof(float) * kHeadDim);\n"
     << indent
     << "  std::memcpy(gatherValues + kept * kHeadDim, vh + i * kKvStride, "
        "sizeof(float) * kHeadDim);\n"
     << indent << "  keptPositions[kept] = positions[i];\n"
     << indent << "  keptIndex[kept++] = i;\n"
     << indent << "}\n";
  if (merge) {
    os << "    " << opComment(merge) << "\n";
    llvm::TypeSwitch<Operation *>(merge)
        .Case([&](MergeNearestOp nearest) {
          const char *rule = "SimNorm";
          if (nearest.getWeight() == MergeWeight::similarity)
            rule = "Similarity";
          else if (nearest.getWeight() == MergeWeight::uniform)
            rule = "Uniform";
          os << "    kvc::cpu::mergeNearest(kh, vh, kKvStride, victims, "
                "numVictims, gatherKeys, gatherValues, kept, kHeadDim, "
                "kvc::cpu::MergeWeight::"
             << rule << ", mergeScratch);\n";
        })
        .Case([&](MergeD2OOp d2o) {
          // The prompt is the first merge step: the EMA threshold starts
          // from 0.
          os << "    kvc::cpu::mergeD2O(kh, vh, kKvStride, victims, "
                "numVictims, gatherKeys, gatherValues, kept, kHeadDim, 0.0, "
             << floatLiteral("cpu", d2o.getAlpha().convertToDouble()) << ", "
             << floatLiteral("cpu", d2o.getBeta().convertToDouble())
             << ", mergeScratch);\n";
        })
        .Case([&](MergeCamOp cam) {
          os << "    kvc::cpu::groupReduce(windowProbs, kGroup, n, "
                "kvc::cpu::Reduce::Mean, camAttention);\n"
                "    kvc::cpu::mergeCam(vh, kKvStride, camAttention, "
                "n - std::min(kWindow, n), victims, numVictims, keptIndex, "
                "gatherValues, kept, kHeadDim, "
             << cam.getSpan() << ");\n";
        });
  }
  if (mixed)
    os << "    if (numHigh > 0)\n"
          "      KVC_CPU_TRY(kvc_append(context, sequence, layer, h, numHigh, "
          "kHeadDim, gatherKeys, gatherValues, keptPositions, slots));\n"
          "    if (kept > numHigh)\n"
          "      KVC_CPU_TRY(kvc_append_format(context, sequence, layer, h, "
          "kLowFormat, kept - numHigh, kHeadDim, gatherKeys + numHigh * "
          "kHeadDim, gatherValues + numHigh * kHeadDim, keptPositions + "
          "numHigh, slots + numHigh));\n";
  else
    os << "    KVC_CPU_TRY(kvc_append(context, sequence, layer, h, kept, "
          "kHeadDim, gatherKeys, gatherValues, keptPositions, slots));\n";
  const bool persist = attention && attention.getPersistence();
  if (hasState || persist || gather.getState())
    os << "    kvc_metadata_t meta;\n"
          "    KVC_CPU_TRY(kvc_get_metadata(context, sequence, layer, h, "
          "&meta));\n";
  if (hasState) {
    // The per-entry state carried into decode is the group-reduced sum,
    // before any normalization the scores applied.
    os << "    // Accumulated attention carried into decode as score state.\n"
          "    kvc::cpu::groupReduce(accumulated, kGroup, n, "
       << reduceEnumerator("cpu", *attention.getReduce())
       << ", state);\n"
          "    for (int32_t j = 0; j < kept; ++j)\n"
          "      meta.score[slots[j]] = state[keptIndex[j]];\n";
  }
  if (Value state = gather.getState()) {
    os << "    // The score of every kept entry, stored for a later kernel.\n"
          "    for (int32_t j = 0; j < kept; ++j)\n"
          "      meta.score[slots[j]] = "
       << values.lookup(state).name << "[keptIndex[j]];\n";
  }
  if (persist)
    os << "    // Importance bits carried into decode.\n"
          "    for (int32_t j = 0; j < kept; ++j)\n"
          "      meta.history[slots[j]] = persistBits[keptIndex[j]];\n";
}

LogicalResult KernelEmitter::emitStage(Operation *op, raw_ostream &os) {
  if (auto pass = dyn_cast<AttentionPassOp>(op))
    return emitAttentionPass(pass, os);
  if (auto gather = dyn_cast<GatherOp>(op)) {
    if (gather.getState() && hasState)
      return unsupported(gather, "the score state already holds the "
                                 "accumulated attention");
    emitGather(gather, os);
    return success();
  }
  if (isa<AppendOp>(op))
    return success(); // Emitted ahead of the view, see emit().

  os << "    " << opComment(op) << "\n";
  return llvm::TypeSwitch<Operation *, LogicalResult>(op)
      .Case([&](AttnWindowOp window) -> LogicalResult {
        if (decode) {
          // Periodic: the running sum over the window, already the group
          // mean; the window's own entries score 0 as at prefill.
          std::string b = define(window, false);
          os << "    for (int32_t i = 0; i < n; ++i)\n      " << b
             << "[i] = positions[i] == KVC_POSITION_NONE ? kvc::cpu::kNegInf "
                ": positions[i] > position - kWindow ? 0.0f : "
                "head.scoreState()[i] / kWindow;\n";
          windowState = true;
          return success();
        }
        if (!window.getVisibleNormalized()) {
          bind(window, "windowProbs", true);
          return success();
        }
        // Sum over the window divided by the window queries that see i.
        std::string b = define(window, true);
        os << "    for (int32_t g = 0; g < kGroup; ++g)\n"
              "      for (int32_t i = 0; i < n; ++i) {\n"
              "        const int32_t w = std::min(kWindow, n);\n"
              "        const int32_t seen = std::min(w, n - i);\n"
              "        "
           << b << "[g * n + i] = windowProbs[g * n + i] * w / seen;\n"
           << "      }\n";
        return success();
      })
      .Case([&](AttnLastOp last) -> LogicalResult {
        bind(last, decode ? "probs" : "lastProbs", true);
        return success();
      })
      .Case([&](AttnAccumulateOp acc) -> LogicalResult {
        if (!decode) {
          if (!acc.getVisibleNormalized()) {
            bind(acc, "accumulated", true);
            return success();
          }
          std::string b = define(acc, true);
          os << "    for (int32_t g = 0; g < kGroup; ++g)\n"
                "      for (int32_t i = 0; i < n; ++i)\n"
                "        "
             << b << "[g * n + i] = accumulated[g * n + i] / (n - i);\n";
          return success();
        }
        // Decode: the state is already reduced over the group; the
        // kvc.group_reduce that follows is an alias.
        std::string b = define(acc, false);
        os << "    for (int32_t i = 0; i < n; ++i)\n      " << b
           << "[i] = positions[i] == KVC_POSITION_NONE ? kvc::cpu::kNegInf : "
           << (acc.getVisibleNormalized()
                   ? "head.scoreState()[i] / (position - positions[i] + 1)"
                   : "head.scoreState()[i]")
           << ";\n";
        return success();
      })
      .Case([&](AttnPersistenceOp persistence) -> LogicalResult {
        std::string b = define(persistence, false);
        if (decode)
          os << "    for (int32_t i = 0; i < n; ++i)\n      " << b
             << "[i] = positions[i] == KVC_POSITION_NONE ? kvc::cpu::kNegInf "
                ": static_cast<float>(kvc::cpu::countRecentBits("
                "head.history()[i], kHistory));\n";
        else
          os << "    for (int32_t i = 0; i < n; ++i)\n      " << b
             << "[i] = static_cast<float>(kvc::cpu::countRecentBits("
                "persistBits[i], kHistory));\n";
        return success();
      })
      .Case([&](RecencyOp recency) -> LogicalResult {
        std::string b = define(recency, false);
        os << "    for (int32_t i = 0; i < n; ++i)\n      " << b
           << "[i] = static_cast<float>(positions[i]);\n";
        return success();
      })
      .Case([&](KeyNormOp keyNorm) -> LogicalResult {
        if (decode)
          return unsupported(op);
        std::string b = define(keyNorm, false);
        os << "    kvc::cpu::rowNorms(kh, kKvStride, n, kHeadDim, 2, " << b
           << ");\n";
        return success();
      })
      .Case([&](ValueNormOp valueNorm) -> LogicalResult {
        if (decode)
          return unsupported(op);
        std::string b = define(valueNorm, false);
        os << "    kvc::cpu::rowNorms(vh, kKvStride, n, kHeadDim, "
           << valueNorm.getP() << ", " << b << ");\n";
        return success();
      })
      .Case([&](KeyDiversityOp diversity) -> LogicalResult {
        if (decode)
          return unsupported(op);
        std::string b = define(diversity, false);
        os << "    kvc::cpu::keyDiversity(kh, kKvStride, n, kHeadDim, " << b
           << ");\n";
        return success();
      })
      .Case([&](PoolOp pool) -> LogicalResult {
        if (decode)
          return unsupported(op, "slots are not in token order at decode");
        Buffer in = values.lookup(pool.getInput());
        std::string b = define(pool, in.perQuery);
        std::string fn = pool.getKind() == PoolKind::avg ? "poolAvg" : "poolMax";
        std::string offset = in.perQuery ? " + g * n" : "";
        forRows(os, in.perQuery,
                "kvc::cpu::" + fn + "(" + in.name + offset + ", n, " +
                    std::to_string(pool.getKernel()) + ", " + b + offset +
                    ");");
        return success();
      })
      .Case([&](GroupReduceOp reduce) -> LogicalResult {
        Buffer in = values.lookup(reduce.getInput());
        if (!in.perQuery) { // Decode state: reduced by the attention pass.
          ReduceKind folded = windowState ? ReduceKind::mean
                                          : *attention.getReduce();
          if (reduce.getKind() != folded)
            return unsupported(op, "the state was reduced differently");
          bind(reduce, in.name, false);
          os << (windowState ? "    // Folded into the window sum by the "
                               "attention pass.\n"
                             : "    // Folded into the accumulated state by "
                               "the attention pass.\n");
          return success();
        }
        std::string b = define(reduce, false);
        os << "    kvc::cpu::groupReduce(" << in.name << ", kGroup, n, "
           << reduceEnumerator("cpu", reduce.getKind()) << ", " << b << ");\n";
        return success();
      })
      .Case([&](NormalizeOp norm) -> LogicalResult {
        Buffer in = values.lookup(norm.getInput());
        std::string b = define(norm, in.perQuery);
        std::string offset = in.perQuery ? " + g * n" : "";
        forRows(os, in.perQuery,
                "kvc::cpu::normalize(" + in.name + offset +
                    ", positions, n, " + normalizeEnumerator("cpu", norm.getKind()) +
                    ", " + b + offset + ");");
        return success();
      })
      .Case([&](ProtectOp protect) -> LogicalResult {
        Buffer in = values.lookup(protect.getInput());
        std::string b = define(protect, in.perQuery);
        std::string offset = in.perQuery ? " + g * n" : "";
        forRows(os, in.perQuery,
                "kvc::cpu::protect(" + in.name + offset + ", positions, n, " +
                    std::to_string(protect.getSinks()) + ", " +
                    std::to_string(protect.getRecent()) + ", " + b + offset +
                    ", order);");
        return success();
      })
      .Case([&](CombineOp combine) -> LogicalResult {
        bool perQuery = isQueryScore(combine.getResult());
        std::string b = define(combine, perQuery);
        std::string expr;
        for (auto [i, input] : llvm::enumerate(combine.getInputs())) {
          std::string term = values.lookup(input).name + "[i]";
          if (combine.getKind() == CombineKind::product) {
            expr += (i ? " * " : "") + term;
            continue;
          }
          expr += (i ? " + " : "") + floatLiteral("cpu", combine.getWeight(i)) +
                  " * " + term;
        }
        os << "    for (int64_t i = 0; i < " << (perQuery ? "kGroup * n" : "n")
           << "; ++i)\n      " << b << "[i] = " << expr << ";\n";
        return success();
      })
      .Case([&](BudgetUniformOp uniform) -> LogicalResult {
        std::string b = "budget" + std::to_string(budgets.size());
        budgets[uniform] = b;
        if (std::optional<int64_t> count = uniform.getCount()) {
          budgetExprs[uniform] = std::to_string(*count);
          if (usedOnlyAcrossHeads(uniform))
            os << "    // Used after the loop over heads.\n";
          else
            os << "    const int64_t " << b << " = " << *count << ";\n";
          return success();
        }
        if (decode)
          return unsupported(op, "decode-time eviction needs a count budget");
        budgetExprs[uniform] =
            "static_cast<int64_t>(n * (1.0 - " +
            floatLiteral("cpu", uniform.getRatio()->convertToDouble()) + "))";
        if (usedOnlyAcrossHeads(uniform))
          os << "    // Used after the loop over heads.\n";
        else
          os << "    const int64_t " << b << " = " << budgetExprs[uniform]
             << ";\n";
        return success();
      })
      .Case([&](BudgetPyramidOp pyramid) -> LogicalResult {
        if (decode)
          return unsupported(op, "decode-time eviction needs a count budget");
        std::string b = "budget" + std::to_string(budgets.size());
        budgets[pyramid] = b;
        budgetExprs[pyramid] = "kvc::cpu::pyramidBudget(" +
                               std::to_string(pyramid.getCapacity()) + ", " +
                               std::to_string(pyramid.getWindow()) + ", " +
                               std::to_string(pyramid.getBeta()) +
                               ", kLayers, layer, n)";
        if (usedOnlyAcrossHeads(pyramid))
          os << "    // Used after the loop over heads.\n";
        else
          os << "    const int64_t " << b << " = " << budgetExprs[pyramid]
             << ";\n";
        return success();
      })
      .Case([&](BudgetHeadClassesOp classes) -> LogicalResult {
        std::string b = "budget" + std::to_string(budgets.size());
        std::string table = "kHeadClasses" + std::to_string(budgets.size());
        budgets[classes] = b;
        os << "    // 1: retrieval head (keeps everything), 0: streaming head.\n"
           << "    static constexpr int8_t " << table
           << "[kLayers][kKvHeads] = {";
        auto shape = cast<ShapedType>(classes.getTable().getType()).getShape();
        SmallVector<APInt> entries(classes.getTable().getValues<APInt>());
        for (int64_t l = 0; l < shape[0]; ++l) {
          os << (l ? ", " : "") << "{";
          for (int64_t h = 0; h < shape[1]; ++h)
            os << (h ? ", " : "") << entries[l * shape[1] + h].getZExtValue();
          os << "}";
        }
        os << "};\n";
        os << "    const int64_t " << b << " = " << table
           << "[layer][h] ? std::numeric_limits<int64_t>::max() : "
           << classes.getSinks() + classes.getRecent() << ";\n";
        return success();
      })
      .Case([&](TopKOp topk) -> LogicalResult {
        if (!budgets.count(topk.getBudget()))
          return unsupported(op, "its budget has no generated form");
        if (cast<ScoreType>(topk.getScore().getType()).getGranularity() ==
                Granularity::layer &&
            !crossOp)
          return unsupported(op, "layer-wide selection");
        os << "    kvc::cpu::selectVictims("
           << values.lookup(topk.getScore()).name << ", positions, n, "
           << budgets.lookup(topk.getBudget()) << ", "
           << (topk.getTie() == TieBreak::recent ? "true" : "false")
           << ", order, victims, &numVictims);\n";
        return success();
      })
      .Case([&](EvictOp) -> LogicalResult {
        if (decode)
          os << "    if (numVictims > 0)\n"
                "      KVC_CPU_TRY(kvc_evict(context, sequence, layer, h, "
                "numVictims, victims));\n";
        else
          os << "    // The gather below skips the victims.\n";
        return success();
      })
      .Case<MergeNearestOp, MergeD2OOp, MergeCamOp>(
          [&](Operation *mergeOp) -> LogicalResult {
            if (decode)
              return unsupported(mergeOp);
            if (auto cam = dyn_cast<MergeCamOp>(mergeOp))
              if (!attention || !attention.getWindow())
                return unsupported(mergeOp,
                                   "CaM reads a window attention statistic");
            merge = mergeOp;
            os << "    // Evicted entries merge into kept ones in the gather "
                  "below.\n";
            return success();
          })
      .Default([&](Operation *other) { return unsupported(other); });
}

/// Rows of a buffer, as a C++ expression.
static std::string rowsOf(bool perQuery) { return perQuery ? "kGroup" : "1"; }

LogicalResult KernelEmitter::emit(raw_ostream &outer) {
  Block &block = kernel.getBody().front();
  for (Operation &op : block)
    if (isa<LayerReduceOp, BudgetAdaptiveOp>(op)) {
      crossOp = &op;
      break;
    }

  // Stages first, into buffers: they decide which workspace buffers exist.
  // Ops before the cross-head op run in the first loop over heads, the
  // cross-head op between the loops, the rest in the second loop.
  std::string bodyA, bodyB, cross;
  llvm::raw_string_ostream osA(bodyA), osB(bodyB), osCross(cross);
  AppendOp append;
  bool afterCross = false;
  for (Operation &op : block) {
    if (auto a = dyn_cast<AppendOp>(op))
      append = appendOp = a;
    if (&op == crossOp) {
      afterCross = true;
      continue; // Emitted below, once the live-outs are known.
    }
    if (afterCross)
      continue; // After the cross-head op, below.
    if (failed(emitStage(&op, osA)))
      return failure();
  }

  // Across heads: the buffers the second loop reads from the first
  // (persisted per head), and the cross-head op itself.
  const bool gathersEntries = !decode && !block.getOps<GatherOp>().empty();
  SmallVector<std::pair<std::string, std::string>> liveOuts;
  /// The live-outs the second loop reads (the rest only feed the cross op).
  SmallVector<std::string> restoredNames;
  SmallVector<Operation *> redeclaredBudgets;
  std::string persistRows, crossConstant;
  if (crossOp) {
    llvm::SmallDenseSet<Value> seen;
    auto addLiveOut = [&](Value v) {
      if (!values.count(v) || !seen.insert(v).second)
        return;
      Buffer b = values.lookup(v);
      for (auto &[name, rows] : liveOuts)
        if (name == b.name)
          return;
      liveOuts.push_back({b.name, rowsOf(b.perQuery)});
    };
    bool inB = false;
    for (Operation &op : block) {
      if (&op == crossOp) {
        inB = true;
        for (Value operand : op.getOperands())
          addLiveOut(operand);
        continue;
      }
      if (!inB)
        continue;
      for (Value operand : op.getOperands()) {
        Operation *def = operand.getDefiningOp();
        if (def && def->isBeforeInBlock(crossOp)) {
          if (budgets.count(operand)) {
            if (!budgetExprs.count(operand))
              return unsupported(def, "a per-head budget across two loops");
            if (!llvm::is_contained(redeclaredBudgets, def))
              redeclaredBudgets.push_back(def);
            continue;
          }
          addLiveOut(operand);
          if (values.count(operand))
            restoredNames.push_back(values.lookup(operand).name);
        }
      }
    }
    if (hasState && gathersEntries) {
      if (!llvm::any_of(liveOuts,
                        [](auto &l) { return l.first == "accumulated"; }))
        liveOuts.push_back({"accumulated", "kGroup"});
      restoredNames.push_back("accumulated");
    }
    for (auto &[bufName, rows] : liveOuts)
      persistRows += " + kKvHeads * " + rows;
    if (decode)
      persistRows += " + kKvHeads"; // Positions of every head.

    osCross << "  " << opComment(crossOp) << "\n";
    if (auto reduce = dyn_cast<LayerReduceOp>(crossOp)) {
      Buffer in = values.lookup(reduce.getInput());
      std::string rows = rowsOf(in.perQuery);
      persistRows += " + 1";
      if (decode)
        osCross
            << "  // Layer-wide scores index slots: every head must hold the "
               "same entries.\n"
               "  for (int32_t h = 1; h < kKvHeads; ++h)\n"
               "    if (std::memcmp(persistedPositions + h * stride, "
               "persistedPositions, sizeof(int32_t) * stride) != 0)\n"
            << "      return kvc_report_error(KVC_STATUS_INTERNAL, \"" << name
            << ": the heads of a layer-wide policy hold different entries\");\n";
      const char *init = reduce.getKind() == ReduceKind::max
                             ? "kvc::cpu::kNegInf"
                             : "0.0f";
      osCross << "  for (int64_t i = 0; i < stride; ++i) {\n"
              << "    float r = " << init << ";\n"
              << "    for (int32_t h = 0; h < kKvHeads; ++h)\n"
              << "      for (int32_t g = 0; g < " << rows << "; ++g) {\n"
              << "        const float x = persisted_" << in.name << "[(h * "
              << rows << " + g) * stride + i];\n"
              << "        r = "
              << (reduce.getKind() == ReduceKind::max ? "std::max(r, x)"
                                                       : "r + x")
              << ";\n      }\n"
              << "    layerScore[i] = r"
              << (reduce.getKind() == ReduceKind::mean
                      ? " / (kKvHeads * " + rows + ")"
                      : "")
              << ";\n  }\n";
      bind(reduce, "layerScore", false);
    } else {
      auto adaptive = cast<BudgetAdaptiveOp>(crossOp);
      if (!budgetExprs.count(adaptive.getBase()))
        return unsupported(crossOp, "its base budget is per head");
      Buffer score = values.lookup(adaptive.getScore());
      persistRows += " + 2 * kKvHeads"; // int64 order of every entry.
      crossConstant = " + 2 * kKvHeads"; // int64 budget of every head.
      // At decode every head's rows are `stride` long, padded with free
      // positions.
      osCross << "  kvc::cpu::adaptiveBudgets(persisted_" << score.name << ", "
              << (decode ? "persistedPositions, stride"
                         : "positions, 0")
              << ", kKvHeads, "
              << (decode ? "static_cast<int32_t>(stride)" : "n")
              << ", stride, " << budgetExprs.lookup(adaptive.getBase())
              << ", " << floatLiteral("cpu", adaptive.getAlpha().convertToDouble())
              << ", adaptiveBudgets, adaptiveOrder);\n";
      budgets[adaptive] = "adaptiveBudgets[h]";
    }
    // The second loop's stages, which read the cross-head result by name.
    afterCross = false;
    for (Operation &op : block) {
      if (&op == crossOp) {
        afterCross = true;
        continue;
      }
      if (afterCross && failed(emitStage(&op, osB)))
        return failure();
    }
  }

  // Workspace: float rows of n entries, int rows of n entries.
  const bool acc = attention && attention.getAccumulate();
  const bool persistence = attention && attention.getPersistence();
  const bool probs = decode && attention &&
                     (attention.getLast() || attention.getAccumulate() ||
                      attention.getWindow() || persistence);
  const bool gathers = !decode && !block.getOps<GatherOp>().empty();
  SmallVector<std::pair<std::string, std::string>> floats, ints;
  // Each entry: name, rows (multiples of n). Doubles of the merges come
  // first, where the workspace is aligned.
  const bool mergeScratch = merge && !isa<MergeCamOp>(merge);
  if (mergeScratch)
    floats.push_back({"mergeScratchRows", "2 * (2 * kHeadDim + 4)"});
  // 64-bit words, after the doubles, where the workspace is still aligned.
  if (!decode && persistence) {
    floats.push_back({"persistBitsRows", "2"});
    floats.push_back({"persistRow", "1"});
  }
  if (merge && isa<MergeCamOp>(merge))
    floats.push_back({"camAttention", "1"});
  floats.push_back({"logits", decode ? "kGroup" : "1"});
  if (!decode && attention && attention.getWindow())
    floats.push_back({"windowProbs", "kGroup"});
  if (!decode && attention && attention.getLast())
    floats.push_back({"lastProbs", "kGroup"});
  if (!decode && acc)
    floats.push_back({"accumulated", "kGroup"});
  if (!decode && acc && gathers)
    floats.push_back({"state", "1"});
  if (probs)
    floats.push_back({"probs", "kGroup"});
  for (const Buffer &b : floatBuffers)
    floats.push_back({b.name, rowsOf(b.perQuery)});
  if (gathers) {
    floats.push_back({"gatherKeys", "kHeadDim"});
    floats.push_back({"gatherValues", "kHeadDim"});
  }
  bool selects = false, orders = false, mixed = false;
  for (Operation &op : block) {
    selects |= isa<TopKOp>(op);
    orders |= isa<TopKOp, ProtectOp>(op);
    if (auto g = dyn_cast<GatherOp>(op))
      mixed |= static_cast<bool>(g.getLow());
  }
  orders |= mixed;
  if (orders)
    ints.push_back({"order", "1"});
  if (selects)
    ints.push_back({"victims", "1"});
  if (gathers) {
    ints.push_back({"keptPositions", "1"});
    ints.push_back({"keptIndex", "1"});
    ints.push_back({"slots", "1"});
  }
  if (mixed)
    ints.push_back({"highPrecision", "1"});

  std::string rowSum;
  for (auto &[bufName, rows] : floats)
    rowSum += (rowSum.empty() ? "" : " + ") + rows;
  for (auto &[bufName, rows] : ints)
    rowSum += (rowSum.empty() ? "" : " + ") + rows;
  std::string entries = decode ? "num_slots" : "n";

  // The workspace query.
  outer << "/// Rows of " << entries
      << " floats or ints this kernel carves from its workspace";
  if (crossOp)
    outer << ", after what it keeps of every head between its two loops";
  outer << ".\n" << workspaceDeclaration() << " {\n";
  outer << "  return sizeof(float) * (static_cast<uint64_t>(" << entries
      << ") * (" << rowSum << persistRows << ")"
      << (crossOp ? " + 16" + crossConstant : "") << ");\n}\n\n";

  // The entry point: its checks first. A decode entry then appends every
  // head and calls the heads function (below), which holds the loops; a
  // prefill entry holds the loops itself.
  std::string prologue, loops;
  llvm::raw_string_ostream pro(prologue);
  pro << "/// " << documentation() << "\n";
  pro << declaration() << " {\n";
  pro << "  if (!context || !q" << (append || !decode ? " || !k || !v" : "")
      << (decode ? "" : " || !positions")
      << (writesOutput(kernel) ? " || !out" : "") << " || !workspace)\n"
      << "    return kvc_report_error(KVC_STATUS_NULL_POINTER, \"" << name
      << ": null argument\");\n";
  pro << layerCheck(name);
  if (!decode)
    pro << promptChecks(name);
  pro << contextGeometryCheck(name, "KVC_CPU_TRY");
  // A prefill that appends leaves its layer empty again if it fails after
  // the first head's append (kvc::LayerAppends).
  const bool guarded = !decode && gathers;
  if (!decode)
    pro << emptyLayerCheck(name, "KVC_CPU_TRY", guarded);
  const char *ending =
      guarded ? "  }\n  appends.keep();\n  return KVC_STATUS_OK;\n}\n"
              : "  }\n  return KVC_STATUS_OK;\n}\n";
  llvm::raw_string_ostream out(loops);

  // Cross-head kernels: the region kept between the loops comes first.
  std::string carveBase = "static_cast<float *>(workspace)";
  if (crossOp) {
    if (decode) {
      // The entry checked the workspace against the slots before the
      // append plus a page, which bounds the slots after it.
      out << "  // Every head's buffers share one stride: the largest slot "
             "count.\n"
             "  int64_t stride = 0;\n"
             "  for (int32_t h = 0; h < kKvHeads; ++h) {\n"
             "    int32_t slots = 0;\n"
             "    KVC_CPU_TRY(kvc_get_num_slots(context, sequence, layer, h, "
             "&slots));\n"
             "    stride = std::max<int64_t>(stride, slots);\n"
             "  }\n";
    } else {
      out << "  const int64_t stride = n;\n";
    }
    out << "  float *acrossHeads = static_cast<float *>(workspace);\n";
    if (isa<BudgetAdaptiveOp>(crossOp))
      out << "  int64_t *adaptiveBudgets = "
             "reinterpret_cast<int64_t *>(acrossHeads);\n"
             "  acrossHeads += 2 * kKvHeads;\n"
             "  int64_t *adaptiveOrder = "
             "reinterpret_cast<int64_t *>(acrossHeads);\n"
             "  acrossHeads += 2 * kKvHeads * stride;\n";
    for (auto &[bufName, rows] : liveOuts)
      out << "  float *persisted_" << bufName
          << " = acrossHeads;\n  acrossHeads += kKvHeads * " << rows
          << " * stride;\n";
    if (decode)
      out << "  int32_t *persistedPositions = "
             "reinterpret_cast<int32_t *>(acrossHeads);\n"
             "  acrossHeads += kKvHeads * stride;\n";
    if (isa<LayerReduceOp>(crossOp))
      out << "  float *layerScore = acrossHeads;\n  acrossHeads += stride;\n";
    out << "  // Per-head buffers start 64-byte aligned after it.\n"
           "  float *perHead = acrossHeads + (16 - (acrossHeads - "
           "static_cast<float *>(workspace)) % 16) % 16;\n";
    carveBase = "perHead";
  }

  // Carves the buffers that `uses` (the loop's code) names.
  auto emitCarve = [&](raw_ostream &o, const std::string &uses) {
    auto used = [&](StringRef bufName) { return usesWord(uses, bufName); };
    o << "    float *ws = " << carveBase << ";\n";
    for (auto &[bufName, rows] : floats) {
      if (!used(bufName) &&
          !(bufName == "mergeScratchRows" && used("mergeScratch")) &&
          !(bufName == "persistBitsRows" && used("persistBits")))
        continue;
      o << "    float *" << bufName << " = ws;\n    ws += static_cast<int64_t>("
        << rows << ") * n;\n";
    }
    for (auto &[bufName, rows] : ints) {
      if (!used(bufName))
        continue;
      o << "    int32_t *" << bufName
        << " = reinterpret_cast<int32_t *>(ws);\n    ws += n;\n";
    }
    if (mergeScratch && used("mergeScratch"))
      o << "    double *mergeScratch = "
           "reinterpret_cast<double *>(mergeScratchRows);\n";
    if (used("persistBits"))
      o << "    uint64_t *persistBits = "
           "reinterpret_cast<uint64_t *>(persistBitsRows);\n";
    if (used("numVictims"))
      o << "    int32_t numVictims = 0;\n";
  };
  auto emitPrefillHead = [&](raw_ostream &o, bool first) {
    if (first)
      o << "    const float *qh = q + h * kGroup * kHeadDim;\n";
    o << "    const float *kh = k + h * kHeadDim;\n"
         "    const float *vh = v + h * kHeadDim;\n";
    if (first && writesOutput(kernel))
      o << "    float *oh = out + h * kGroup * kHeadDim;\n";
  };
  auto emitDecodeHead = [&](raw_ostream &o, bool) {
    o << "    kvc::cpu::HeadView head;\n"
         "    KVC_CPU_TRY(head.bind(context, sequence, layer, h));\n"
         "    const int32_t n = head.numSlots();\n";
    if (!floatBuffers.empty() || selects || crossOp)
      o << "    const int32_t *positions = head.positions();\n";
  };

  if (!crossOp) {
    out << "  for (int32_t h = 0; h < kKvHeads; ++h) {\n";
    decode ? emitDecodeHead(out, true) : emitPrefillHead(out, true);
    emitCarve(out, bodyA);
    out << bodyA;
    out << ending;
    emitEntry(outer, prologue, loops);
    return success();
  }

  // Loop 1: every head up to the cross-head op, its results kept.
  std::string keepText, restoreText;
  llvm::raw_string_ostream keepOs(keepText), restoreOs(restoreText);
  for (auto &[bufName, rows] : liveOuts) {
    keepOs << "    for (int64_t r = 0; r < " << rows << "; ++r)\n"
           << "      std::memcpy(persisted_" << bufName << " + (h * " << rows
           << " + r) * stride, " << bufName
           << " + r * n, sizeof(float) * n);\n";
    if (llvm::is_contained(restoredNames, bufName))
      restoreOs << "    for (int64_t r = 0; r < " << rows << "; ++r)\n"
                << "      std::memcpy(" << bufName << " + r * n, persisted_"
                << bufName << " + (h * " << rows
                << " + r) * stride, sizeof(float) * n);\n";
  }
  out << "  for (int32_t h = 0; h < kKvHeads; ++h) {\n";
  decode ? emitDecodeHead(out, true) : emitPrefillHead(out, true);
  emitCarve(out, bodyA + keepText);
  out << bodyA;
  out << "    // Keep what the cross-head stage and the second loop read.\n"
      << keepText;
  if (decode)
    out << "    std::fill(persistedPositions + h * stride, persistedPositions "
           "+ (h + 1) * stride, KVC_POSITION_NONE);\n"
           "    std::memcpy(persistedPositions + h * stride, positions, "
           "sizeof(int32_t) * n);\n";
  out << "  }\n";
  // Between the loops.
  out << cross;
  // Loop 2: every head from the cross-head op on.
  out << "  for (int32_t h = 0; h < kKvHeads; ++h) {\n";
  decode ? emitDecodeHead(out, false) : emitPrefillHead(out, false);
  emitCarve(out, bodyB + restoreText);
  out << restoreText;
  for (Operation *budget : redeclaredBudgets)
    out << "    const int64_t " << budgets.lookup(budget->getResult(0)) << " = "
        << budgetExprs.lookup(budget->getResult(0)) << ";\n";
  out << bodyB;
  out << ending;
  emitEntry(outer, prologue, loops);
  return success();
}

} // namespace

LogicalResult kvc::emitCpp(PolicyOp policy,
                           SmallVectorImpl<EmittedFile> &files) {
  FailureOr<SmallVector<KernelOp>> formed = formedKernels(policy);
  if (failed(formed))
    return failure();
  const SmallVector<KernelOp> &kernels = *formed;
  GeometryAttr geometry = policy.getGeometryAttr();
  std::string p = policy.getSymName().str();

  // Storage: every kernel that writes entries agrees on the format.
  FailureOr<RuntimeStorage> storage = policyStorage(kernels);
  if (failed(storage))
    return failure();

  // Constants of the policy, one per folded parameter.
  std::string constants = policyConstants(kernels, "cpu");

  AsmState asmState(policy);
  std::string source, header;
  llvm::raw_string_ostream src(source), hdr(header);

  hdr << headerOpening(policy, "cpu");
  hdr << "/// Fills the geometry and storage fields of a runtime configuration "
         "for\n/// this policy; the caller chooses page_size (a multiple of "
         "the KIVI group\n/// when quantized), num_pages, max_sequences and "
         "memory.\n";
  hdr << "void kvc_" << p << "_cpu_configure(kvc_config_t *config);\n\n";

  src << sourceOpening(policy, kernels, "cpu");
  src << "\n\n#include \"kvc_" << p << "_cpu.h\"\n\n"
      << "#include \"runtime/kvc_cpu.h\"\n\n"
      << "namespace {\n"
      << geometryConstants(geometry)
      << "/// Row strides of prompt tensors, in floats.\n"
      << "constexpr int64_t kQStride = kQHeads * kHeadDim;\n"
      << "constexpr int64_t kKvStride = kKvHeads * kHeadDim;\n"
      << "/// 1 / sqrt(head_dim).\n"
      << "constexpr float kSoftmaxScale = "
      << floatLiteral("cpu", 1.0 / std::sqrt(double(geometry.getHeadDim()))) << ";\n"
      << constants << "} // namespace\n\n"
      << "extern \"C\" {\n\n";

  src << "void kvc_" << p << "_cpu_configure(kvc_config_t *config) {\n"
      << "  if (!config)\n    return;\n"
      << "  config->num_layers = kLayers;\n"
      << "  config->num_q_heads = kQHeads;\n"
      << "  config->num_kv_heads = kKvHeads;\n"
      << "  config->head_dim = kHeadDim;\n"
      << "  config->dtype = " << dtypeEnumerator(geometry.getDtype()) << ";\n"
      << "  config->format = " << storage->format << ";\n"
      << "  config->group_size = " << storage->groupSize << ";\n"
      << "  config->residual_length = " << storage->residual << ";\n"
      << "  config->low_format = " << storage->lowFormat << ";\n"
      << "}\n\n";

  for (KernelOp kernel : kernels) {
    if (kernel.getKind() == KernelKind::select) {
      if (failed(emitSelectKernel(policy, kernel, asmState, "cpu", src, hdr)))
        return failure();
      src << "\n";
      continue;
    }
    KernelEmitter emitter(policy, kernel, asmState);
    if (failed(emitter.emit(src)))
      return failure();
    src << "\n";
    hdr << "/// Workspace bytes of " << entryName(policy, kernel, "cpu")
        << ".\n"
        << emitter.workspaceDeclaration() << ";\n";
    hdr << "/// " << emitter.documentation() << "\n"
        << emitter.declaration() << ";\n\n";
    if (isDecodeKernel(kernel)) {
      emitter.emitBatch(src);
      hdr << "/// Workspace bytes of the batch entry point below, for "
             "sequences of at most\n/// `num_slots` slots per kv-head.\n"
          << emitter.batchWorkspaceDeclaration() << ";\n"
          << "/// " << emitter.batchDocumentation() << "\n"
          << emitter.batchDeclaration() << ";\n\n";
    }
  }
  src << "} // extern \"C\"\n";
  hdr << headerClosing(policy, "cpu");

  files.push_back({"kvc_" + p + "_cpu.h", header});
  files.push_back({"kvc_" + p + "_cpu.cpp", source});
  return success();
}
