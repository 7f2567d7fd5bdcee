//===- CudaEmitter.cpp - the CUDA backend ---------------------------------===//
//
// Emits one host entry point per kernel of a policy, plus one generated
// __global__ "stages" kernel that runs the policy's stages for one kv-head
// per block (three when a stage needs every head of the layer: the stages
// before it, a one-block kernel for it, the stages after it). Attention, the
// split merge, merges of evicted entries and entry stores are the building
// blocks of runtime/kvc_cuda.cuh, instantiated with the policy's constants.
// The runtime's bookkeeping is on the host: entry points snapshot page
// tables, positions and score state into the device workspace, launch on
// the caller's stream, and write back evictions, kept slots and score
// state. docs/codegen-cuda.md describes what runs where.
//
//===----------------------------------------------------------------------===//

#include "codegen/Emitter.h"
#include "codegen/KernelEmitterBase.h"

#include "mlir/IR/AsmState.h"
#include "llvm/ADT/DenseMap.h"
#include "llvm/ADT/StringExtras.h"
#include "llvm/ADT/TypeSwitch.h"

#include <cmath>
#include <cstdio>

using namespace mlir;
using namespace kvc;

namespace {

/// "prefill_scoring" -> "PrefillScoring".
std::string camelKind(KernelKind kind) {
  std::string s;
  bool upper = true;
  for (char c : stringifyKernelKind(kind)) {
    if (c == '_') {
      upper = true;
      continue;
    }
    s += upper ? static_cast<char>(std::toupper(c)) : c;
    upper = false;
  }
  return s;
}

/// Emits the stages kernel, the workspace and the host entry point of one
/// kernel of a policy.
class CudaKernelEmitter : public KernelEmitterBase {
public:
  /// KIVI storage: the runtime records the quantization work of appends
  /// (kvc_kivi_pending_work) and the kernels perform it.
  bool kivi = false;
  /// Mixed precision: the context has a low page class (kLowBits-bit codes
  /// in groups of kLowGroup channels) that decode reads beside the storage
  /// format.
  bool mixed = false;

  CudaKernelEmitter(PolicyOp policy, KernelOp kernel, AsmState &asmState)
      : KernelEmitterBase(policy, kernel, asmState, "cuda"),
        camel(camelKind(kernel.getKind())),
        periodic(decode && kernel.getTrigger() == Trigger::every_n) {}

  /// Decode: the step split for CUDA graphs (planDeclaration,
  /// runDeclaration, finishDeclaration): a decode kernel whose launches
  /// depend on the batch alone. KIVI's quantization and staging launch in
  /// grids for the most work of a step (launchPlannedKivi); mixed
  /// precision appends to the high class only (its low class is stored at
  /// prefill), so its step launches what a step of one class does. Not a
  /// periodic kernel with a cross-head op, whose cross-head kernels launch
  /// only at the steps where some sequence ends a period (decided on the
  /// host); a periodic kernel's other kernels launch at every step and
  /// their blocks check their own sequence's position.
  bool graphable() {
    return decode && kernel.getKind() == KernelKind::decode &&
           !(periodic && crossOp);
  }
  /// The host part of a step: check-out, appends, the tables' upload.
  std::string planDeclaration() {
    return "kvc_status_t " + name +
           "_plan_batch(kvc_context_t *context, int32_t batch, const "
           "uint64_t *sequences, int32_t layer, const int32_t *positions, "
           "int32_t capacity, void *workspace, uint64_t workspace_bytes, "
           "void *stream)";
  }
  /// The device part: launches only, the same at every step of a batch
  /// and capacity (capturable in a CUDA graph).
  std::string runDeclaration() {
    return "kvc_status_t " + name +
           "_run_batch(kvc_context_t *context, int32_t batch, int32_t "
           "layer, const float *q, const float *k, const float *v, " +
           (writesOutput(kernel) ? std::string("float *out, ") : "") +
           "int32_t capacity, void *workspace, uint64_t workspace_bytes, "
           "void *stream)";
  }
  /// The step's event, after the run.
  std::string finishDeclaration() {
    return "kvc_status_t " + name +
           "_finish_batch(kvc_context_t *context, int32_t layer, void "
           "*stream)";
  }
  std::string planDocumentation();
  std::string runDocumentation();
  std::string finishDocumentation();
  /// The single-sequence decode entry's name, while `name` is that of one
  /// of its parts (_plan_batch, _run_batch).
  std::string stepName() const {
    StringRef n(name);
    if (!n.consume_back("_plan_batch"))
      n.consume_back("_run_batch");
    return n.str();
  }

  std::string documentation();
  std::string batchDocumentation();

  /// Emits the device part (workspace, stages kernel) into `dev` and the
  /// extern "C" part (workspace query, entry point) into `host`.
  LogicalResult emit(raw_ostream &dev, raw_ostream &host);

private:
  /// Emits `call` once per row of a per-query buffer (with `+ g * stride`
  /// offsets substituted for "@"), or once.
  void forRows(raw_ostream &os, bool perQuery, const std::string &call);
  /// Emits an elementwise loop over the entries of the head.
  void elementwise(raw_ostream &os, bool perQuery, const std::string &target,
                   const std::string &expr);

  LogicalResult emitStage(Operation *op, raw_ostream &os);
  void emitAttentionStage(raw_ostream &os);
  /// The score of live slot i that a decode statistic op reads from the
  /// device tables, the same expression in the stages and in the fold
  /// kernel's selection summary; "" for another op.
  std::string decodeSlotScore(Operation *op);
  /// Finds the selection that the stages settle from the fold blocks'
  /// summaries (oneVictim), when the policy's decode phase has that shape.
  void findOneVictim();
  /// The decode fold kernel: the exact merge of the splits' output rows,
  /// the statistics over the slot ranges of the attention's splits and the
  /// summaries of a oneVictim selection.
  void emitFoldKernel(raw_ostream &os);
  /// Decode: the attention pass folds statistics into the device tables or
  /// writes probabilities.
  bool foldsStatistics() {
    return decode && (attention.getAccumulate() || attention.getPersistence() ||
                      attention.getWindow() || needsProbs);
  }
  /// Declares budget `op` = `expr` in the current stages kernel.
  void declareBudget(raw_ostream &os, Operation *op, const std::string &expr,
                     bool sameForAllHeads);
  /// Emits the cross-head op into the one-block kernel between the two
  /// stages kernels.
  LogicalResult emitCrossStage(raw_ostream &os);
  void emitGatherStage(raw_ostream &os);
  void emitWorkspace(raw_ostream &os);
  void emitPrefillEntry(raw_ostream &os);
  /// Emits the launches of the merge kernels (prefill, after the stages).
  void emitMergeLaunch(raw_ostream &os);
  /// The parts of a decode step an entry point performs: all of it
  /// (decode_batch), or its host part (plan) or its launches (run).
  enum class DecodePart { Whole, Plan, Run };
  void emitDecodeEntry(raw_ostream &os, DecodePart part = DecodePart::Whole);
  void emitValidation(raw_ostream &os, DecodePart part = DecodePart::Whole);

  std::string camel;
  /// The name of one of the kernel's generated device functions: `camel`
  /// with a lower-case first letter, then `suffix` (decodeFold,
  /// prefillStages, ...).
  std::string deviceName(StringRef suffix) const {
    std::string n = camel;
    n[0] = static_cast<char>(std::tolower(n[0]));
    return n + suffix.str();
  }

  /// The declaration of each per-kernel budget, repeated in the stages
  /// kernel after a cross-head op when that kernel reads it.
  llvm::DenseMap<Value, std::string> budgetDecls;
  /// Namespace-scope device declarations (head class tables).
  std::string deviceDecls;
  AppendOp append;
  GatherOp gather;
  /// The kernel's stages include a selection (kvc.topk).
  bool selects = false;
  /// Decode: the selection whose common step (one victim or none) the
  /// stages settle from the fold blocks' summaries (takeOneVictim): a
  /// kvc.topk of a decode statistic (through group_reduce aliases and at most
  /// one kvc.protect, `oneVictimProtect`) under a constant or head-class
  /// budget, feeding kvc.evict. Its score expression is `oneVictimScore`.
  TopKOp oneVictim;
  ProtectOp oneVictimProtect;
  std::string oneVictimScore;
  /// The decode fold kernel exists (emitFoldKernel).
  bool foldKernel = false;
  /// Decode reads the last query's probabilities (kvc.attn_last).
  bool needsProbs = false;
  /// A periodic decode kernel (every_n): the window folds into the score
  /// state at every step, the rest of the phase runs once per period.
  bool periodic = false;
  /// The runtime's per-slot metadata the kernel reads and updates: the score
  /// state (accumulated attention, a periodic window's sum) and the
  /// importance bits (kvc.attn_persistence).
  bool state = false, history = false;
  /// A generated stages kernel exists.
  bool stagesKernel = false;
  /// Decode: the stages run in the fold kernel, in the last of each head's
  /// blocks to finish (kvc::cuda::lastArrival), instead of a kernel of
  /// their own: a fold kernel without a periodic early exit and no
  /// cross-head op.
  bool stagesInFold = false;
  /// Decode: the only stage is the merge of the splits (a decode of
  /// attention alone: no statistics, no selection), which the last of each
  /// head's attention blocks performs (DecodeSplitArgs::mergeOut) instead
  /// of a stages kernel.
  bool mergeInAttention = false;
};

std::string CudaKernelEmitter::documentation() {
  const std::string devices =
      " q, k, v, out and workspace are device pointers, positions a host "
      "array; the work is queued on `stream` (a cudaStream_t).";
  switch (kernel.getKind()) {
  case KernelKind::prefill:
    return "Prefill of one layer on the GPU: causal attention of the n prompt "
           "tokens (out: n x q_heads x head_dim)" +
           std::string(kernel.getTrigger()
                           ? ", the policy's prefill phase, and the gather of "
                             "the kept entries into the runtime's device "
                             "pages"
                           : "") +
           ". q: n x q_heads x head_dim; k, v: n x kv_heads x head_dim, after "
           "RoPE, float32. The heads of `layer` must be empty, and a "
           "prefill that fails leaves them empty." +
           devices +
           (kernel.getBody().front().getOps<GatherOp>().empty()
                ? ""
                : " Synchronizes the stream once: the runtime allocates the "
                  "slots of the kept entries on the host.");
  case KernelKind::prefill_scoring:
    return "Unfused prefill scoring of one layer on the GPU: recomputes the "
           "attention weights of the prompt, scores, selects and gathers the "
           "kept entries into the runtime's device pages." +
           devices;
  case KernelKind::decode:
    return "Decode step of one layer on the GPU for one new token: appends "
           "k, v (kv_heads x head_dim) at `position` into the lowest free "
           "slot, then split-KV attention of q (q_heads x head_dim) over the "
           "cache into out" +
           std::string(!kernel.getTrigger() ? ""
                       : periodic
                           ? ", with the policy's decode statistics on the "
                             "device and its victim selection after the last "
                             "position of every period"
                           : ", with the policy's decode statistics and "
                             "victim selection on the device") +
           ". The layer's slot tables, score state and victims stay on the "
           "device between steps and the step does not synchronize the "
           "stream: the runtime evicts a step's victims when the layer's "
           "next step starts, and any runtime call on the layer brings its "
           "bookkeeping up to date first." +
           devices;
  case KernelKind::decode_scoring:
    return "Unfused decode scoring of one layer on the GPU: recomputes the "
           "attention weights of q over the cache, folds the statistics and "
           "selects the victims, which the runtime evicts when the layer's "
           "next step starts or a runtime call reads the layer (no stream "
           "synchronization)." +
           devices;
  case KernelKind::select:
    break; // Emitted by emitSelectKernel.
  }
  llvm_unreachable("unknown kernel kind");
}

std::string CudaKernelEmitter::batchDocumentation() {
  const bool hasKv = kernel.getKind() != KernelKind::decode_scoring;
  return "The step of " + name +
         " for `batch` distinct sequences of any lengths, each at its "
         "positions[b], in one launch per kernel (grid: splits x batch x "
         "kv_heads) without a stream synchronization. q: batch x q_heads x head_dim" +
         (hasKv ? std::string("; k, v: batch x kv_heads x head_dim") : "") +
         (writesOutput(kernel) ? "; out: batch x q_heads x head_dim" : "") +
         ". sequences and positions are host arrays of `batch` entries; q, " +
         (hasKv ? "k, v, " : "") + (writesOutput(kernel) ? "out, " : "") +
         "workspace are device pointers.";
}

std::string CudaKernelEmitter::planDocumentation() {
  return "The host part of " + name +
         "_batch's step, for a run captured in a CUDA graph: takes the "
         "device tables of the `batch` sequences off the context, appends "
         "each sequence's entry at positions[b] (host arrays) and queues "
         "the tables' upload into `workspace` on `stream`, for the run of "
         "`capacity` slots per kv-head that follows (every head must hold "
         "at most capacity - page_size slots before the step). Then " +
         name + "_run_batch, then " + name + "_finish_batch.";
}

std::string CudaKernelEmitter::runDocumentation() {
  return "The launches of a step that " + name +
         "_plan_batch planned, on `stream`: new rows from k, v (batch x "
         "kv_heads x head_dim), attention of q (batch x q_heads x head_dim) "
         "into out, the policy's statistics and selection. They depend on "
         "batch, layer, capacity and the pointers only, and make no host "
         "call that waits or allocates: captured once in a CUDA graph, "
         "they replay for every later plan of the same batch size, "
         "capacity and workspace.";
}

std::string CudaKernelEmitter::finishDocumentation() {
  return "Ends the steps planned on `layer`: records their event on "
         "`stream` after the run (queued or launched as a graph). The "
         "layer's next step waits for that event, and so does a host access "
         "to a layer with device score state or victims; before the finish "
         "both are refused.";
}

void CudaKernelEmitter::forRows(raw_ostream &os, bool perQuery,
                                const std::string &call) {
  std::string text;
  for (char c : call)
    text += c == '@' ? std::string(perQuery ? " + g * stride" : "")
                     : std::string(1, c);
  if (perQuery)
    os << "  for (int32_t g = 0; g < kGroup; ++g)\n  ";
  os << "  " << text << "\n";
}

void CudaKernelEmitter::elementwise(raw_ostream &os, bool perQuery,
                                    const std::string &target,
                                    const std::string &expr) {
  if (perQuery)
    os << "  for (int32_t g = 0; g < kGroup; ++g)\n  ";
  os << "  for (int32_t i = threadIdx.x; i < n; i += kStageThreads)\n";
  os << (perQuery ? "  " : "") << "    " << target
     << (perQuery ? "[g * stride + i]" : "[i]") << " = " << expr << ";\n";
  os << "  __syncthreads();\n";
}

void CudaKernelEmitter::emitAttentionStage(raw_ostream &os) {
  // Decode: the splits ran before this kernel. The fold kernel, when there
  // is one, merged them and formed the statistics; otherwise the block
  // merges them exactly.
  os << "  " << opComment(attention) << "\n";
  if (foldKernel) {
    os << "  // The fold kernel merged the splits and formed the statistics.\n";
  } else {
    os << "  __shared__ float maxLogit[kGroup], invSum[kGroup];\n";
    os << "  kvc::cuda::mergeSplits<kGroup, kHeadDim, kStageThreads>("
          "w.partials, numBlocks, h, "
       << (attention.getOutput() ? "out" : "nullptr")
       << ", maxLogit, invSum);\n";
  }
  if (periodic)
    os << "  // The phase runs once every kPeriod positions (the same for the "
          "whole block).\n"
          "  if ((position + 1) % kPeriod != 0)\n"
          "    return;\n";
}

static std::string
usedDeclarations(ArrayRef<std::pair<std::string, std::string>> decls,
                 StringRef body);

std::string CudaKernelEmitter::decodeSlotScore(Operation *op) {
  if (auto acc = dyn_cast<AttnAccumulateOp>(op))
    return acc.getVisibleNormalized()
               ? "t.state[i] / (position - positions[i] + 1)"
               : "t.state[i]";
  if (isa<AttnPersistenceOp>(op))
    return "static_cast<float>(kvc::cuda::countRecentBits(t.history[i], "
           "kHistory))";
  if (isa<AttnWindowOp>(op))
    return "positions[i] > position - kWindow ? 0.0f : t.state[i] / kWindow";
  if (isa<RecencyOp>(op))
    return "static_cast<float>(positions[i])";
  return "";
}

void CudaKernelEmitter::findOneVictim() {
  if (!decode || !selects || crossOp || merge)
    return;
  SmallVector<TopKOp> selections(kernel.getBody().front().getOps<TopKOp>());
  if (selections.size() != 1)
    return;
  TopKOp topk = selections.front();
  if (cast<ScoreType>(topk.getScore().getType()).getGranularity() !=
          Granularity::kv_head ||
      !llvm::all_of(topk->getUsers(),
                    [](Operation *user) { return isa<EvictOp>(user); }))
    return;
  Operation *budget = topk.getBudget().getDefiningOp();
  auto uniform = dyn_cast_or_null<BudgetUniformOp>(budget);
  if (!(uniform && uniform.getCount()) &&
      !isa_and_nonnull<BudgetHeadClassesOp>(budget))
    return;
  // The score: a decode statistic, through group_reduce aliases (a state
  // the attention pass already reduced over the group), under at most one
  // kvc.protect.
  Value score = topk.getScore();
  ProtectOp protect = score.getDefiningOp<ProtectOp>();
  if (protect)
    score = protect.getInput();
  while (auto reduce = score.getDefiningOp<GroupReduceOp>()) {
    if (!isa_and_nonnull<AttnAccumulateOp, AttnWindowOp>(
            reduce.getInput().getDefiningOp()))
      return;
    score = reduce.getInput();
  }
  if (!score.getDefiningOp())
    return;
  std::string expr = decodeSlotScore(score.getDefiningOp());
  if (expr.empty())
    return;
  oneVictim = topk;
  oneVictimProtect = protect;
  oneVictimScore = expr;
}

/// "kvc::cuda::guessProtection(sinks, recent, position)" of a oneVictim
/// selection's kvc.protect (0, 0 without one).
static std::string protectionGuess(ProtectOp protect) {
  return "kvc::cuda::guessProtection(" +
         std::to_string(protect ? protect.getSinks() : 0) + ", " +
         std::to_string(protect ? protect.getRecent() : 0) + ", position)";
}

/// Every line of `text` indented by two more spaces (empty lines stay
/// empty).
static std::string indented(StringRef text) {
  std::string r;
  for (StringRef line : llvm::split(text.rtrim('\n'), '\n'))
    r += (line.empty() ? "" : "  ") + line.str() + "\n";
  return r;
}

void CudaKernelEmitter::emitFoldKernel(raw_ostream &out) {
  // The steps of a periodic kernel's window (its fold, and the prefetch for
  // it) and the step that ends a period (its selection's summaries).
  const char *inWindow = "position % kPeriod >= kPeriod - kWindow";
  const char *periodEnd = "(position + 1) % kPeriod == 0";
  // The statistics and the selection's summaries over the block's slots.
  std::string slotWork;
  llvm::raw_string_ostream os(slotWork);
  // A selection summarized every step takes its slots in the pass of the
  // last fold that runs every step (accumulate, or persistence after it):
  // the fold visits each live slot right after it stores the slot's new
  // state, so the summary reads no position or score a second time.
  const bool scanInFold =
      oneVictim && !periodic &&
      (attention.getAccumulate() || attention.getPersistence());
  const std::string selection = "&w.selection[h * foldBlocks + range]";
  auto summaryComment = [&]() {
    os << "  // The block's summary for takeOneVictim, which settles the "
          "selection in\n  // "
       << deviceName("Stages") << " when one entry goes or none:\n  "
       << opComment(oneVictim) << "\n";
  };
  // The summary's guessed protection and tie order, as both forms take
  // them.
  auto selectionArgs = [&]() {
    return protectionGuess(oneVictimProtect) + ", " +
           (oneVictim.getTie() == TieBreak::recent ? "true" : "false");
  };
  // The fold's trailing argument: the scan's visit.
  std::string visit;
  if (scanInFold) {
    summaryComment();
    os << "  // Each live slot goes into it as the fold below stores the "
          "slot's new\n  // state.\n";
    os << "  kvc::cuda::SelectionScan scan(" << selectionArgs() << ");\n";
    visit = ",\n      [&](int32_t i, int32_t at) { scan.add(i, at, " +
            oneVictimScore + "); }";
  }
  if (attention.getAccumulate())
    os << "  kvc::cuda::foldAccumulated<kGroup, kThreads>(\n"
          "      positions, t.state, r, logits, stride, maxLogit, invSum, "
          "kDecay, "
       << reduceEnumerator("cuda", *attention.getReduce())
       << (attention.getPersistence() ? "" : visit) << ");\n";
  if (attention.getPersistence())
    os << "  kvc::cuda::foldPersistence<kGroup, kThreads>(\n"
          "      positions, t.history, r, logits, stride, maxLogit, invSum, "
          "kThreshold,\n      "
       << reduceEnumerator("cuda", *attention.getPersistenceReduce()) << visit
       << ");\n";
  if (attention.getWindow())
    os << "  // The window: the group-mean weights of the last kWindow queries "
          "of\n  // each period, summed in the score state.\n"
          "  if ("
       << inWindow
       << ")\n"
          "    kvc::cuda::foldWindowSum<kGroup, kThreads>(\n"
          "        positions, t.state, r, logits, stride, maxLogit, invSum,\n"
          "        position % kPeriod == kPeriod - kWindow);\n";
  if (needsProbs)
    os << "  kvc::cuda::writeProbabilities<kGroup, kThreads>(\n"
          "      logits, stride, r, maxLogit, invSum, probs);\n";
  // The block's logits are read by nothing after its statistics (the
  // ranges are the blocks' own, and no stage reads logits): their lines
  // leave L2 without a write to device memory, at the steps a periodic
  // window skips too (the attention wrote them all the same).
  if (foldsStatistics())
    os << "  // Nothing reads the block's logits again: their lines leave L2 "
          "without a\n  // write to device memory.\n"
          "  kvc::cuda::discardRowLines<kThreads>(\n"
          "      w.logits + h * kGroup * stride, kGroup, stride, r);\n";
  if (scanInFold) {
    os << "  scan.summarize<kThreads>(r, " << selection
       << ");\n";
  } else if (oneVictim) {
    if (periodic)
      os << "  // The selection runs once every kPeriod positions.\n"
            "  if ((position + 1) % kPeriod != 0)\n"
            "    return;\n";
    summaryComment();
    os << "  kvc::cuda::summarizeSelection<kThreads>(\n"
          "      positions, r, "
       << selectionArgs() << ",\n      [&](int32_t i) { return "
       << oneVictimScore
       << "; },\n      " << selection << ");\n";
  }

  std::string body;
  llvm::raw_string_ostream bs(body);
  // The slot arrays that the slot work reads, asked of L2 before the merge
  // of the splits loads its records, at the steps where that work runs.
  SmallVector<std::string> arrays;
  if (usesWord(slotWork, "positions"))
    arrays.push_back("kvc::cuda::slotArray(positions)");
  for (StringRef word : {"t.state", "t.history"})
    if (usesWord(slotWork, word))
      arrays.push_back(("kvc::cuda::slotArray(" + word + ")").str());
  if (usesWord(slotWork, "logits"))
    arrays.push_back("kvc::cuda::slotArray(logits, kGroup, stride)");
  if (!arrays.empty()) {
    const bool everyStep = attention.getAccumulate() ||
                           attention.getPersistence() || needsProbs ||
                           (oneVictim && !periodic);
    std::string indent = "  ";
    bs << "  // The lines of the block's first passes of slots into L2 while "
          "the splits'\n  // records load.\n";
    if (!everyStep) {
      bs << "  if (" << (attention.getWindow() ? inWindow : periodEnd)
         << ")\n";
      indent = "    ";
    }
    bs << indent
       << "kvc::cuda::prefetchSlotLines<kThreads>(\n"
       << indent
       << "    kvc::cuda::firstPasses<kGroup, kThreads>(r),\n"
       << indent << "    {"
       << llvm::join(arrays, ",\n" + indent + "        ") << "});\n";
  }
  // What the block reads before the wait is the uploaded HeadTables and
  // L2 hints, what it reads after it the attention's logits and records.
  bs << "  // The attention's logits and split records of head h from here "
        "on.\n"
        "  wait(t);\n";
  if (foldsStatistics() || attention.getOutput())
    bs << "  __shared__ float maxLogit[kGroup], invSum[kGroup];\n"
          "  kvc::cuda::splitStatistics<kGroup, kHeadDim>(w.partials, "
          "numSplits, h, maxLogit, invSum);\n";
  if (attention.getOutput())
    bs << "  // The output rows of the group, spread over the head's "
          "blocks.\n"
          "  kvc::cuda::mergeOutput<kGroup, kHeadDim, kThreads>(\n"
          "      w.partials, numSplits, h, out, maxLogit, invSum, range, "
          "foldBlocks);\n";
  bs << slotWork;
  if (stagesInFold)
    bs << "  // The last of the head's blocks to finish runs the policy's "
          "stages for it.\n"
          "  if (kvc::cuda::lastArrival(t.arrivals, arrivals + foldBlocks))\n"
          "    "
       << deviceName("Stages") << "<kThreads>(w, stride, foldBlocks, layer, "
       << (attention.getOutput() ? "out" : "/*out=*/nullptr") << ", h);\n";

  SmallVector<std::pair<std::string, std::string>> decls;
  decls.push_back({"t", "  const kvc::cuda::HeadTable t = w.heads[h];\n"});
  decls.push_back({"r", "  const kvc::cuda::SlotRange r = "
                        "kvc::cuda::foldRange(t.numSlots, slotsPerBlock, "
                        "range);\n"});
  decls.push_back({"positions", "  const int32_t *positions = t.positions;\n"});
  decls.push_back(
      {"position", "  const int32_t position = t.queryPosition;\n"});
  decls.push_back(
      {"logits", "  const float *logits = w.logits + h * kGroup * stride;\n"});
  decls.push_back(
      {"probs", "  float *probs = w.probs + h * kGroup * stride;\n"});
  const std::string ranges = camel + "FoldRanges";
  out << "/// " << ranges
      << ": the exact merge of the splits and the statistics over the\n/// "
         "slots of fold range `range` of head `h` of the batch, in kThreads "
         "threads"
      << (oneVictim ? ",\n/// and the range's summary of the selection" : "")
      << (stagesInFold ? "; the last range of a head to end runs its stages"
                       : "")
      << ".\n/// `wait(t)` returns once the attention's logits and split "
         "records of the\n/// head (HeadTable t) may be read: "
      << deviceName("Fold")
      << "'s awaitPriorGrids, or\n/// kvc::cuda::decodeAttentionFold's wait "
         "for the head's splits.\n"
      << "struct " << ranges << " {\n  " << camel
      << "Workspace w;\n  int64_t stride;\n  int32_t numSplits, foldBlocks, "
         "slotsPerBlock;\n"
      << (stagesInFold
              ? "  /// Arrivals at a head's counter before its ranges': the "
                "attention's splits\n  /// in decodeAttentionFold, none in " +
                    deviceName("Fold") + ".\n  int32_t arrivals;\n"
                    "  int32_t layer;\n"
              : std::string())
      << (attention.getOutput() ? "  float *out;\n" : "")
      << "\n  template <int kThreads, typename Wait>\n"
         "  __device__ void run(int32_t h, int32_t range, Wait wait) const {\n"
      << indented(usedDeclarations(decls, body) + body) << "  }\n};\n\n";
  // Not compiled where the attention grid folds instead (KVC_CUDA_FOLD_IN_GRID,
  // every storage but KIVI's; emitDecodeEntry).
  if (!kivi)
    out << "#if !KVC_CUDA_FOLD_IN_GRID\n";
  out << "/// " << name
      << ": " << ranges << " in blocks of whole slot ranges per head of the "
         "batch\n/// (FoldPlan): head blockIdx.x, range blockIdx.y, after "
         "the attention kernel\n/// (launchDependent).\n"
      << "__global__ void __launch_bounds__(kvc::cuda::kFoldThreads, "
         "kvc::cuda::kFoldBlocksPerSM)\n    "
      << deviceName("Fold") << "(" << ranges << " f) {\n"
      << "  f.run<kvc::cuda::kFoldThreads>(\n"
         "      blockIdx.x, blockIdx.y,\n"
         "      [](const kvc::cuda::HeadTable &) { "
         "kvc::cuda::awaitPriorGrids(); });\n}\n";
  if (!kivi)
    out << "#endif\n";
  out << "\n";
}

void CudaKernelEmitter::emitGatherStage(raw_ostream &os) {
  if (!selects && !state && !gather.getLow())
    return; // The host keeps every entry.
  os << "  " << opComment(gather) << "\n";
  if (selects) {
    os << "  // The kept list, in prompt order, for the host to allocate "
          "slots.\n"
          "  kvc::cuda::compactIndices<kStageThreads>(\n"
          "      n, [&](int32_t i) { return !victim[i]; }, w.kept + h * "
          "stride, &w.numKept[h]);\n";
  }
  if (state)
    os << "  // Accumulated attention carried into decode as score state.\n"
          "  kvc::cuda::groupReduce<kStageThreads>(accumulated, kGroup, "
          "stride, n, "
       << reduceEnumerator("cuda", *attention.getReduce())
       << ", w.state + h * stride);\n";
  if (merge && isa<MergeCamOp>(merge))
    os << "  // CaM's attention: the window statistic averaged over the "
          "group.\n"
          "  kvc::cuda::groupReduce<kStageThreads>(windowProbs, kGroup, "
          "stride, n, kvc::cuda::Reduce::Mean, w.camAttention + h * "
          "stride);\n";
  else if (merge)
    os << "  // The victims, in prompt order, for the merge kernels.\n"
          "  kvc::cuda::compactIndices<kStageThreads>(\n"
          "      n, [&](int32_t i) { return victim[i] != 0; }, w.victimList "
          "+ h * stride, &w.numVictims[h]);\n";
  if (gather.getLow())
    os << "  // Mixed precision: the best-ranked kept entries stay in the "
          "storage format,\n  // the others go to the low page class.\n"
          "  kvc::cuda::markHighPrecision<kStageThreads>("
       << values.lookup(gather.getRank()).name << ", positions, n, "
       << (selects ? "victim" : "nullptr") << ", "
       << doubleLiteral(gather.getFraction()->convertToDouble())
       << ",\n                                              w.high + h * "
          "stride);\n";
}

LogicalResult CudaKernelEmitter::emitCrossStage(raw_ostream &os) {
  os << "  " << opComment(crossOp) << "\n";
  if (auto reduce = dyn_cast<LayerReduceOp>(crossOp)) {
    Buffer in = values.lookup(reduce.getInput());
    // Decode: the heads of sequence b of the batch.
    os << "  kvc::cuda::layerReduce<kStageThreads>(w." << in.name
       << (decode ? in.perQuery ? " + b * kKvHeads * kGroup * stride"
                                : " + b * kKvHeads * stride"
                  : "")
       << ", kKvHeads, " << (in.perQuery ? "kGroup" : "1") << ", stride, n, "
       << reduceEnumerator("cuda", reduce.getKind()) << ", w.layerScore"
       << (decode ? " + b * stride" : "") << ");\n";
    bind(reduce, "layerScore", false);
    return success();
  }
  auto adaptive = cast<BudgetAdaptiveOp>(crossOp);
  if (!budgetExprs.count(adaptive.getBase()))
    return unsupported(crossOp, "its base budget is per head");
  Buffer score = values.lookup(adaptive.getScore());
  if (score.perQuery)
    return unsupported(crossOp, "per-query-head scores");
  std::string isLive =
      decode ? "[&](int32_t hd, int32_t i) {\n"
               "        return i < heads[hd].numSlots && "
               "heads[hd].positions[i] != KVC_POSITION_NONE;\n      }"
             : "[&](int32_t, int32_t i) { return w.positions[i] != "
               "KVC_POSITION_NONE; }";
  os << "  kvc::cuda::adaptiveBudgets<kStageThreads, kKvHeads>(\n      w."
     << score.name << (decode ? " + b * kKvHeads * stride" : "") << ", "
     << isLive << ", n, stride,\n      "
     << budgetExprs.lookup(adaptive.getBase()) << ", "
     << floatLiteral("cuda", adaptive.getAlpha().convertToDouble())
     << ", w.adaptiveBudgets" << (decode ? " + b * kKvHeads" : "") << ");\n";
  budgets[adaptive] = "w.adaptiveBudgets[h]";
  return success();
}

LogicalResult CudaKernelEmitter::emitStage(Operation *op, raw_ostream &os) {
  if (isa<AttentionPassOp>(op)) {
    if (decode)
      emitAttentionStage(os);
    return success();
  }
  if (isa<GatherOp>(op)) {
    emitGatherStage(os);
    return success();
  }
  if (isa<AppendOp>(op))
    return success(); // On the host, ahead of the attention.

  os << "  " << opComment(op) << "\n";
  return llvm::TypeSwitch<Operation *, LogicalResult>(op)
      .Case([&](AttnWindowOp window) -> LogicalResult {
        if (decode) {
          // Periodic: the running sum over the window, already the group
          // mean; the window's own entries score 0 as at prefill.
          std::string b = define(window, false);
          elementwise(os, false, b,
                      "positions[i] == KVC_POSITION_NONE ? kvc::cuda::kNegInf "
                      ": " + decodeSlotScore(window));
          return success();
        }
        if (!window.getVisibleNormalized()) {
          bind(window, "windowProbs", true);
          return success();
        }
        // Sum over the window divided by the window queries that see i.
        std::string b = define(window, true);
        elementwise(os, true, b,
                    "windowProbs[g * stride + i] * min(kWindow, n) / "
                    "min(min(kWindow, n), n - i)");
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
          elementwise(os, true, b,
                      "accumulated[g * stride + i] / (n - i)");
          return success();
        }
        // Decode: the state is already reduced over the group; the
        // kvc.group_reduce that follows is an alias.
        std::string b = define(acc, false);
        elementwise(os, false, b,
                    "positions[i] == KVC_POSITION_NONE ? kvc::cuda::kNegInf : " +
                        decodeSlotScore(acc));
        return success();
      })
      .Case([&](AttnPersistenceOp persistence) -> LogicalResult {
        // The steps with the importance bit set among the last kHistory.
        std::string b = define(persistence, false);
        elementwise(os, false, b,
                    decode ? "positions[i] == KVC_POSITION_NONE ? "
                             "kvc::cuda::kNegInf : " +
                                 decodeSlotScore(persistence)
                           : "static_cast<float>(kvc::cuda::countRecentBits("
                             "persistBits[i], kHistory))");
        return success();
      })
      .Case([&](RecencyOp recency) -> LogicalResult {
        std::string b = define(recency, false);
        elementwise(os, false, b, decodeSlotScore(recency));
        return success();
      })
      .Case([&](KeyNormOp keyNorm) -> LogicalResult {
        if (decode)
          return unsupported(op);
        std::string b = define(keyNorm, false);
        os << "  kvc::cuda::rowNorms<kStageThreads>(k + h * kHeadDim, "
              "kKvStride, n, kHeadDim, 2, "
           << b << ");\n";
        return success();
      })
      .Case([&](ValueNormOp valueNorm) -> LogicalResult {
        if (decode)
          return unsupported(op);
        std::string b = define(valueNorm, false);
        os << "  kvc::cuda::rowNorms<kStageThreads>(v + h * kHeadDim, "
              "kKvStride, n, kHeadDim, "
           << valueNorm.getP() << ", " << b << ");\n";
        return success();
      })
      .Case([&](KeyDiversityOp diversity) -> LogicalResult {
        if (decode)
          return unsupported(op);
        std::string b = define(diversity, false);
        os << "  kvc::cuda::keyDiversity<kStageThreads, kHeadDim>(k + h * "
              "kHeadDim, kKvStride, n, "
           << b << ");\n";
        return success();
      })
      .Case([&](PoolOp pool) -> LogicalResult {
        if (decode)
          return unsupported(op, "slots are not in token order at decode");
        Buffer in = values.lookup(pool.getInput());
        std::string b = define(pool, in.perQuery);
        forRows(os, in.perQuery,
                "kvc::cuda::pool<kStageThreads>(" + in.name + "@, n, " +
                    std::to_string(pool.getKernel()) + ", " +
                    (pool.getKind() == PoolKind::max ? "true" : "false") +
                    ", " + b + "@);");
        return success();
      })
      .Case([&](GroupReduceOp reduce) -> LogicalResult {
        Buffer in = values.lookup(reduce.getInput());
        if (!in.perQuery) { // Decode state: reduced by the attention pass.
          const bool windowSum = attention && attention.getWindow();
          std::optional<ReduceKind> folded =
              windowSum ? std::optional<ReduceKind>(ReduceKind::mean)
              : attention ? attention.getReduce()
                          : std::nullopt;
          if (!folded || reduce.getKind() != *folded)
            return unsupported(op, "the state was reduced differently");
          bind(reduce, in.name, false);
          os << (windowSum ? "  // Folded into the window sum by the "
                             "fold kernel.\n"
                           : "  // Folded into the accumulated state by the "
                             "fold kernel.\n");
          return success();
        }
        std::string b = define(reduce, false);
        os << "  kvc::cuda::groupReduce<kStageThreads>(" << in.name
           << ", kGroup, stride, n, " << reduceEnumerator("cuda", reduce.getKind())
           << ", " << b << ");\n";
        return success();
      })
      .Case([&](NormalizeOp norm) -> LogicalResult {
        Buffer in = values.lookup(norm.getInput());
        std::string b = define(norm, in.perQuery);
        forRows(os, in.perQuery,
                "kvc::cuda::normalize<kStageThreads>(" + in.name +
                    "@, positions, n, " + normalizeEnumerator("cuda", norm.getKind()) +
                    ", " + b + "@);");
        return success();
      })
      .Case([&](ProtectOp protect) -> LogicalResult {
        Buffer in = values.lookup(protect.getInput());
        std::string b = define(protect, in.perQuery);
        forRows(os, in.perQuery,
                "kvc::cuda::protect<kStageThreads>(" + in.name +
                    "@, positions, n, " + std::to_string(protect.getSinks()) +
                    ", " + std::to_string(protect.getRecent()) + ", " + b +
                    "@);");
        return success();
      })
      .Case([&](CombineOp combine) -> LogicalResult {
        bool perQuery = isQueryScore(combine.getResult());
        std::string b = define(combine, perQuery);
        std::string index = perQuery ? "[g * stride + i]" : "[i]";
        std::string expr;
        for (auto [i, input] : llvm::enumerate(combine.getInputs())) {
          std::string term = values.lookup(input).name + index;
          if (combine.getKind() == CombineKind::product) {
            expr += (i ? " * " : "") + term;
            continue;
          }
          expr += (i ? " + " : "") + floatLiteral("cuda", combine.getWeight(i)) +
                  " * " + term;
        }
        elementwise(os, perQuery, b, expr);
        return success();
      })
      .Case([&](BudgetUniformOp uniform) -> LogicalResult {
        if (!uniform.getCount() && decode)
          return unsupported(op, "decode-time eviction needs a count budget");
        std::string expr =
            uniform.getCount()
                ? std::to_string(*uniform.getCount())
                : "static_cast<int64_t>(n * (1.0 - " +
                      floatLiteral("cuda",
                                   uniform.getRatio()->convertToDouble()) +
                      "))";
        declareBudget(os, uniform, expr, true);
        return success();
      })
      .Case([&](BudgetPyramidOp pyramid) -> LogicalResult {
        if (decode)
          return unsupported(op, "decode-time eviction needs a count budget");
        declareBudget(os, pyramid,
                      "kvc::cuda::pyramidBudget(" +
                          std::to_string(pyramid.getCapacity()) + ", " +
                          std::to_string(pyramid.getWindow()) + ", " +
                          std::to_string(pyramid.getBeta()) +
                          ", kLayers, layer, n)",
                      true);
        return success();
      })
      .Case([&](BudgetHeadClassesOp classes) -> LogicalResult {
        // A table per (layer, kv-head) in constant memory.
        std::string table =
            "k" + camel + "HeadClasses" + std::to_string(budgets.size());
        llvm::raw_string_ostream ds(deviceDecls);
        ds << "/// " << opComment(classes).substr(3) << "\n"
           << "/// 1: retrieval head (keeps everything), 0: streaming head "
              "(sinks + recent).\n"
           << "__constant__ int8_t " << table << "[kLayers][kKvHeads] = {";
        auto shape = cast<ShapedType>(classes.getTable().getType()).getShape();
        SmallVector<APInt> entries(classes.getTable().getValues<APInt>());
        for (int64_t l = 0; l < shape[0]; ++l) {
          ds << (l ? ", " : "") << "{";
          for (int64_t hd = 0; hd < shape[1]; ++hd)
            ds << (hd ? ", " : "") << entries[l * shape[1] + hd].getZExtValue();
          ds << "}";
        }
        ds << "};\n\n";
        declareBudget(
            os, classes,
            table + (decode ? "[layer][head]" : "[layer][h]") +
                " ? INT64_MAX : " +
                std::to_string(classes.getSinks() + classes.getRecent()),
            false);
        return success();
      })
      .Case([&](TopKOp topk) -> LogicalResult {
        if (!budgets.count(topk.getBudget()))
          return unsupported(op, "its budget has no generated form");
        if (cast<ScoreType>(topk.getScore().getType()).getGranularity() ==
                Granularity::layer &&
            !isa_and_nonnull<LayerReduceOp>(crossOp))
          return unsupported(op, "layer-wide selection");
        os << "  kvc::cuda::selectVictims<kStageThreads>("
           << values.lookup(topk.getScore()).name << ", positions, n, "
           << budgets.lookup(topk.getBudget()) << ", "
           << (topk.getTie() == TieBreak::recent ? "true" : "false")
           << ", victim);\n";
        return success();
      })
      .Case([&](EvictOp) -> LogicalResult {
        if (decode)
          os << "  // The victims' slots, for the host to evict: in the "
                "device tables' victim\n  // list (DeviceTables: the "
                "count, then the slots).\n"
                "  kvc::cuda::compactIndices<kStageThreads>(\n"
                "      n, [&](int32_t i) { return victim[i] != 0; }, "
                "t.victims + 1, t.victims);\n"
                "  // The same eviction in the device tables.\n"
                "  kvc::cuda::clearEvicted<kStageThreads>(t, victim, n);\n"
                "  // The head's victim row for the host (no download "
                "launch).\n"
                "  kvc::cuda::publishVictims<kStageThreads>(t);\n";
        else
          os << "  // The gather below skips the victims.\n";
        return success();
      })
      .Case<MergeNearestOp, MergeD2OOp, MergeCamOp>([&](Operation *mergeOp)
                                                        -> LogicalResult {
        if (decode)
          return unsupported(mergeOp);
        if (isa<MergeCamOp>(mergeOp) && (!attention || !attention.getWindow()))
          return unsupported(mergeOp, "CaM reads a window attention statistic");
        merge = mergeOp;
        os << "  // Evicted entries merge into kept ones after this "
              "kernel (kvc::cuda::merge*).\n";
        return success();
      })
      .Default([&](Operation *other) { return unsupported(other); });
}

void CudaKernelEmitter::declareBudget(raw_ostream &os, Operation *op,
                                      const std::string &expr,
                                      bool sameForAllHeads) {
  std::string b = "budget" + std::to_string(budgets.size());
  budgets[op->getResult(0)] = b;
  budgetDecls[op->getResult(0)] = "  const int64_t " + b + " = " + expr + ";\n";
  if (sameForAllHeads)
    budgetExprs[op->getResult(0)] = expr;
  if (llvm::all_of(op->getUsers(),
                   [&](Operation *user) { return user == crossOp; }))
    os << "  // Read by the cross-head kernel.\n";
  else
    os << budgetDecls[op->getResult(0)];
}

void CudaKernelEmitter::emitWorkspace(raw_ostream &os) {
  const bool window = attention && attention.getWindow();
  const bool last = attention && attention.getLast();
  const bool acc = attention && attention.getAccumulate();
  const bool scratchOut = attention && !attention.getOutput();
  struct Field {
    std::string type, name, count, doc;
  };
  SmallVector<Field> fields;
  if (decode)
    fields.push_back({"char", "tables",
                      kivi ? "kvc::cuda::deviceTableBytes(kKvHeads, stride, "
                             "kResidual)"
                           : "kvc::cuda::deviceTableBytes(kKvHeads, stride)",
                      "The HeadTables and the words that change the slot "
                      "tables kept on the\n  /// device (DeviceTables)."});
  if (decode) {
    // Only the statistics read the logits; without them the attention
    // stores none.
    if (foldsStatistics())
      fields.push_back({"float", "logits", "kKvHeads * kGroup * stride",
                        "Per head, G rows of unnormalized logits per slot."});
    fields.push_back(
        {"float", "partials",
         "kKvHeads * kMaxSplits * kGroup * "
         "kvc::cuda::partialFloats<kHeadDim>()",
         "Per (head, split, query head): maximum, sum and value sum."});
    if (needsProbs)
      fields.push_back({"float", "probs", "kKvHeads * kGroup * stride",
                        "Per head, G rows of normalized weights."});
    if (scratchOut)
      fields.push_back({"float", "scratchOut", "kKvHeads * kGroup * kHeadDim",
                        "The attention output nobody reads."});
  } else {
    fields.push_back({"int32_t", "positions", "stride",
                      "The prompt's original positions."});
    fields.push_back({"float", "lse", "kQHeads * stride",
                      "Log-sum-exp of every prompt query."});
    if (scratchOut)
      fields.push_back({"float", "scratchOut", "stride * kQHeads * kHeadDim",
                        "The attention output nobody reads."});
    if (window)
      fields.push_back({"float", "windowProbs", "kKvHeads * kGroup * stride",
                        "Window statistics per query head."});
    if (last)
      fields.push_back({"float", "lastProbs", "kKvHeads * kGroup * stride",
                        "Weights of the last prompt query per query head."});
    if (acc)
      fields.push_back({"float", "accumulated", "kKvHeads * kGroup * stride",
                        "Summed attention per query head."});
    if (acc && gather)
      fields.push_back({"float", "state", "kKvHeads * stride",
                        "Group-reduced score state of every prompt entry."});
    if (history)
      fields.push_back({"uint64_t", "persistBits", "kKvHeads * stride",
                        "Importance bits of every prompt entry."});
  }
  for (const Buffer &b : floatBuffers)
    fields.push_back({"float", b.name,
                      std::string("kKvHeads * ") +
                          (b.perQuery ? "kGroup * " : "") + "stride",
                      "Score buffer of a policy stage."});
  if (isa_and_nonnull<LayerReduceOp>(crossOp))
    fields.push_back({"float", "layerScore",
                      decode ? "heads / kKvHeads * stride" : "stride",
                      decode ? "Per sequence, the layer-wide score, the same "
                               "for every head."
                             : "The layer-wide score, the same for every "
                               "head."});
  if (isa_and_nonnull<BudgetAdaptiveOp>(crossOp))
    fields.push_back({"int64_t", "adaptiveBudgets", "kKvHeads",
                      "AdaKV's budget of every head."});
  if (selects)
    fields.push_back(
        {"uint8_t", "victim", "kKvHeads * stride", "Victim flag per entry."});
  if (oneVictim)
    fields.push_back({"kvc::cuda::SelectionSummary", "selection",
                      "kKvHeads * kMaxSplits",
                      "Per (head, split): the fold block's summary of its "
                      "slots for the selection."});
  if (merge) {
    if (isa<MergeCamOp>(merge)) {
      fields.push_back({"float", "camAttention", "kKvHeads * stride",
                        "CaM's group-averaged window attention."});
      fields.push_back(
          {"double", "means", "kKvHeads", "CaM's window mean per head."});
    } else {
      fields.push_back({"int32_t", "victimList", "kKvHeads * stride",
                        "Victim prompt indices per head, ascending."});
      fields.push_back(
          {"int32_t", "numVictims", "kKvHeads", "Victims per head."});
      fields.push_back({"double", "keptNorms", "kKvHeads * stride",
                        "Key norms of the kept entries."});
      fields.push_back({"int32_t", "targets", "kKvHeads * stride",
                        "Nearest kept entry of every victim."});
      fields.push_back(
          {"double", "sims", "kKvHeads * stride", "Its cosine similarity."});
      fields.push_back({"double", "weights", "kKvHeads * stride",
                        "The victim's merge weight."});
    }
    fields.push_back({"float", "mergedKeys", "stride * kKvHeads * kHeadDim",
                      "Kept keys after the merge, in kept-list order."});
    fields.push_back({"float", "mergedValues", "stride * kKvHeads * kHeadDim",
                      "Kept values after the merge, in kept-list order."});
  }
  if (!decode && selects) {
    fields.push_back({"int32_t", "kept", "kKvHeads * stride",
                      "Kept prompt indices per head, ascending."});
    fields.push_back({"int32_t", "numKept", "kKvHeads", "Kept per head."});
  }
  if (gather && gather.getLow())
    fields.push_back({"uint8_t", "high", "kKvHeads * stride",
                      "Mixed precision: 1 for the kept entries stored in the "
                      "storage format."});
  if (append && kivi) {
    fields.push_back({"char", "kivi",
                      "kvc::cuda::kiviWorkBytes(kKvHeads, 1, kResidual, "
                      "kKiviGroup)",
                      "KIVI jobs of the new entries (KiviWorkPlan)."});
  }
  if (gather && kivi)
    fields.push_back({"char", "kivi",
                      "kvc::cuda::kiviWorkBytes(kKvHeads, stride, kResidual, "
                      "kKiviGroup)",
                      "KIVI jobs of the kept entries (KiviWorkPlan)."});
  else if (gather)
    fields.push_back({"kvc::cuda::StoreEntry", "stores", "kKvHeads * stride",
                      "Destinations of the kept entries."});

  // Decode carves per head of the batch: `heads` = batch x kv_heads, head
  // b * kKvHeads + h being kv-head h of sequence b.
  if (decode)
    for (Field &f : fields) {
      if (f.name == "layerScore")
        continue;
      for (size_t at = f.count.find("kKvHeads"); at != std::string::npos;
           at = f.count.find("kKvHeads", at))
        f.count.replace(at, sizeof("kKvHeads") - 1, "heads");
    }
  os << "/// Device workspace of " << name << ", carved in this order.\n";
  os << "struct " << camel << "Workspace {\n";
  if (decode)
    os << "  /// Device copy of the HeadTable of every head of the batch (in "
          "tables).\n"
          "  const kvc::cuda::HeadTable *heads;\n";
  for (const Field &f : fields)
    os << "  /// " << f.doc << "\n  " << f.type << " *" << f.name << ";\n";
  os << "};\n\n";
  if (decode)
    os << "/// Carves the workspace for `heads` heads (batch x kv_heads) of "
          "`stride` entries\n/// each (null base: sizing only).\n"
       << "void carve" << camel << "Workspace(kvc::cuda::Carver &c, int32_t "
          "heads, int64_t stride, "
       << camel << "Workspace &w) {\n";
  else
    os << "/// Carves the workspace for `stride` entries per kv-head (null "
          "base: sizing only).\n"
       << "void carve" << camel << "Workspace(kvc::cuda::Carver &c, int64_t "
          "stride, "
       << camel << "Workspace &w) {\n";
  for (const Field &f : fields)
    os << "  w." << f.name << " = c.take<" << f.type << ">(" << f.count
       << ");\n";
  os << "}\n\n";
}

/// `text` without the device functions that take their thread count as a
/// template parameter named kStageThreads (the stages that a fold block
/// runs): their uses of the name are their parameter's, not the constant's.
static std::string withoutStageTemplates(StringRef text) {
  const StringRef head = "template <int kStageThreads>\n";
  std::string rest;
  for (size_t at = text.find(head); at != StringRef::npos;
       at = text.find(head)) {
    rest += text.take_front(at).str();
    const size_t end = text.find("\n}\n", at);
    text = end == StringRef::npos ? StringRef() : text.drop_front(end + 3);
  }
  return rest + text.str();
}

/// Keeps the declarations (name, line) that `body` reads, directly or
/// through a later kept declaration, in their order.
static std::string
usedDeclarations(ArrayRef<std::pair<std::string, std::string>> decls,
                 StringRef body) {
  std::string reads = body.str();
  SmallVector<bool> keep(decls.size(), false);
  for (size_t i = decls.size(); i-- > 0;)
    if (usesWord(reads, decls[i].first)) {
      keep[i] = true;
      reads += decls[i].second;
    }
  std::string text;
  for (size_t i = 0; i < decls.size(); ++i)
    if (keep[i])
      text += decls[i].second;
  return text;
}

LogicalResult CudaKernelEmitter::emit(raw_ostream &out, raw_ostream &host) {
  for (Operation &op : kernel.getBody().front()) {
    if (auto a = dyn_cast<AttentionPassOp>(op))
      attention = a;
    if (auto a = dyn_cast<AppendOp>(op))
      append = a;
    if (auto g = dyn_cast<GatherOp>(op))
      gather = g;
    if (isa<LayerReduceOp, BudgetAdaptiveOp>(op) && !crossOp)
      crossOp = &op;
    selects |= isa<TopKOp>(op);
    needsProbs |= decode && isa<AttnLastOp>(op);
  }
  if (!attention)
    return kernel.emitOpError() << "has no kvc.attention_pass";
  if (decode && attention.getWindow() && !periodic)
    return unsupported(attention, "a decode window outside a periodic kernel");
  if (attention.getWindow() && attention.getAccumulate() && decode)
    return unsupported(attention, "the score state holds one running "
                                  "statistic, not a window sum and an "
                                  "accumulated sum");
  state = attention.getAccumulate().has_value() ||
          (decode && attention.getWindow().has_value());
  history = attention.getPersistence().has_value();
  findOneVictim();
  foldKernel = foldsStatistics() || oneVictim;
  Operation *oneVictimBudget =
      oneVictim ? oneVictim.getBudget().getDefiningOp() : nullptr;

  // Stages first, into buffers: they decide which buffers exist. Ops before
  // the cross-head op run in the first stages kernel, the op itself in a
  // one-block kernel, the rest in a second stages kernel.
  std::string body, crossBody, afterBody;
  llvm::raw_string_ostream bs(body), cs(crossBody), as(afterBody);
  bool afterCross = false;
  for (Operation &op : kernel.getBody().front()) {
    if (&op == crossOp) {
      if (failed(emitCrossStage(cs)))
        return failure();
      afterCross = true;
      continue;
    }
    if (&op == oneVictimBudget)
      continue; // Declared ahead of the one-victim check.
    if (failed(emitStage(&op, afterCross ? as : bs)))
      return failure();
    if (oneVictim && isa<AttentionPassOp>(op)) {
      // The common step first: the budget (a constant of the head), then
      // the one-victim check that skips the stages.
      if (failed(emitStage(oneVictimBudget, bs)))
        return failure();
      bs << "  // One victim or none, the common decode step: settled from "
            "the fold blocks'\n  // summaries (the stages below run "
            "otherwise).\n"
            "  if (kvc::cuda::takeOneVictim<kStageThreads>(t, w.selection + h "
            "* numBlocks, numBlocks, "
         << budgets.lookup(oneVictim.getBudget()) << ",\n"
         << "                                               "
         << protectionGuess(oneVictimProtect) << ")) {\n"
         << "    kvc::cuda::publishVictims<kStageThreads>(t);\n"
         << "    return;\n"
         << "  }\n";
    }
  }
  // Budgets of the first kernel that the second reads are declared again.
  if (crossOp) {
    std::string again;
    SmallVector<Value> seen;
    for (Operation *op = crossOp->getNextNode(); op; op = op->getNextNode())
      for (Value operand : op->getOperands())
        if (budgetDecls.count(operand) && operand.getDefiningOp() &&
            operand.getDefiningOp()->isBeforeInBlock(crossOp) &&
            !llvm::is_contained(seen, operand)) {
          seen.push_back(operand);
          again += budgetDecls.lookup(operand);
        }
    afterBody = again + afterBody;
    // A batch launches the rest of a periodic phase when any of its
    // sequences ends a period; each block checks its own.
    if (decode && periodic)
      afterBody = "  if ((position + 1) % kPeriod != 0)\n    return;\n" +
                  afterBody;
  }

  const std::string fn = deviceName("Stages");
  // A prefill stages kernel of comments only (aliases of the attention
  // statistics) is not launched; its comments go to the next kernel.
  bool hasCode = false;
  for (StringRef line : llvm::split(body, '\n'))
    hasCode |= !line.trim().empty() && !line.trim().starts_with("//");
  // A decode whose fold kernel merges the splits needs no stages kernel
  // without stages.
  const bool foldOnly = decode && foldKernel && !hasCode;
  if ((!decode || foldOnly) && !hasCode && crossOp) {
    crossBody = body + crossBody;
    body.clear();
  }
  if (foldOnly)
    body.clear();
  stagesKernel = decode ? !foldOnly : !body.empty();
  stagesInFold = decode && foldKernel && stagesKernel && !crossOp && !periodic;
  mergeInAttention =
      decode && stagesKernel && !foldKernel && !crossOp && !periodic &&
      llvm::all_of(kernel.getBody().front(), [](Operation &op) {
        return isa<AppendOp, AttentionPassOp>(op) ||
               op.hasTrait<OpTrait::IsTerminator>();
      });

  // The last query's probabilities (kvc.attn_last) that the fold wrote:
  // the last kernel of the step that reads them drops their lines from L2
  // once it has (discardRowLines, as the fold drops its logits), so that
  // L2 does not write them back to device memory; the next step's fold
  // writes them all again before anything reads them. The last reader is
  // the stages after a cross-head op, the cross-head op (every head of a
  // sequence), or the stages before it (a kernel after the fold's, or the
  // last of a head's fold blocks once every block has written its range).
  if (needsProbs) {
    const char *perHead =
        "  // Nothing reads the head's probabilities again this step: their "
        "lines\n  // leave L2 without a write to device memory.\n"
        "  kvc::cuda::discardRowLines<kStageThreads>(probs, kGroup, stride, "
        "{0, n});\n";
    if (usesWord(afterBody, "probs"))
      afterBody += perHead;
    else if (usesWord(crossBody, "probs"))
      crossBody +=
          "  // Nothing reads the sequence's probabilities again this step: "
          "their lines\n  // leave L2 without a write to device memory.\n"
          "  kvc::cuda::discardRowLines<kStageThreads>(\n"
          "      w.probs + b * kKvHeads * kGroup * stride, kKvHeads * kGroup, "
          "stride, {0, n});\n";
    else if (usesWord(body, "probs"))
      body += perHead;
  }

  out << "//===--- " << name << ": device part ---===//\n\n";
  emitWorkspace(out);
  out << deviceDecls;

  // The per-kv-head prologue of a stages kernel: the declarations its body
  // reads.
  auto prologue = [&](const std::string &text) {
    SmallVector<std::pair<std::string, std::string>> decls;
    if (decode) {
      decls.push_back({"h", "  // Head h of the batch: kv-head h % kKvHeads of "
                            "sequence h / kKvHeads.\n"
                            "  const int32_t h = blockIdx.x;\n"});
      decls.push_back({"head", "  const int32_t head = h % kKvHeads;\n"});
      decls.push_back({"t", "  const kvc::cuda::HeadTable t = w.heads[h];\n"});
      decls.push_back({"n", "  const int32_t n = t.numSlots;\n"});
      decls.push_back(
          {"positions", "  const int32_t *positions = t.positions;\n"});
      decls.push_back(
          {"position", "  const int32_t position = t.queryPosition;\n"});
      // No stage reads the logits: the fold blocks drop them from L2
      // (discardRowLines) before the stages run.
      decls.push_back(
          {"probs", "  float *probs = w.probs + h * kGroup * stride;\n"});
    } else {
      decls.push_back({"h", "  const int32_t h = blockIdx.x;\n"});
      decls.push_back({"stride", "  const int64_t stride = n;\n"});
      decls.push_back(
          {"positions", "  const int32_t *positions = w.positions;\n"});
      decls.push_back(
          {"windowProbs", "  const float *windowProbs = w.windowProbs + h * "
                          "kGroup * stride;\n"});
      decls.push_back(
          {"lastProbs",
           "  const float *lastProbs = w.lastProbs + h * kGroup * stride;\n"});
      decls.push_back(
          {"accumulated", "  const float *accumulated = w.accumulated + h * "
                          "kGroup * stride;\n"});
      decls.push_back(
          {"persistBits",
           "  const uint64_t *persistBits = w.persistBits + h * stride;\n"});
    }
    if (isa_and_nonnull<LayerReduceOp>(crossOp))
      decls.push_back(
          {"layerScore",
           decode ? "  const float *layerScore = w.layerScore + h / kKvHeads "
                    "* stride;\n"
                  : "  const float *layerScore = w.layerScore;\n"});
    for (const Buffer &b : floatBuffers)
      decls.push_back({b.name, "  float *" + b.name + " = w." + b.name +
                                   " + h * " + (b.perQuery ? "kGroup * " : "") +
                                   "stride;\n"});
    if (selects)
      decls.push_back(
          {"victim", "  uint8_t *victim = w.victim + h * stride;\n"});
    return usedDeclarations(decls, text);
  };
  auto signature = [&](const std::string &kernelName) {
    out << "__global__ void __launch_bounds__(kStageThreads)\n    "
        << kernelName << "(" << camel << "Workspace w, ";
    if (decode)
      out << "int64_t stride, int32_t numBlocks, int32_t layer, float *out) "
             "{\n";
    else
      out << "int32_t n, int32_t layer, const float *k, const float *v) {\n";
  };

  if (stagesInFold) {
    // Head h is a parameter: the fold range that runs the stages has it.
    std::string decls = prologue(body);
    const std::string hDecl = "  // Head h of the batch: kv-head h % kKvHeads "
                              "of sequence h / kKvHeads.\n"
                              "  const int32_t h = blockIdx.x;\n";
    if (size_t at = decls.find(hDecl); at != std::string::npos)
      decls.erase(at, hDecl.size());
    out << "/// The stages of " << name
        << " for head h of the batch (kv-head h % kKvHeads of\n/// sequence "
           "h / kKvHeads), in the order of the policy: run by the last of "
           "the\n/// head's fold ranges, kStageThreads threads (numBlocks: "
           "the fold ranges of a\n/// head, one selection summary each).\n"
        << "template <int kStageThreads>\n__device__ void " << fn << "("
        << camel
        << "Workspace w, int64_t stride, int32_t numBlocks, int32_t layer, "
           "float *out,\n    int32_t h) {\n"
        << decls << body << "}\n\n";
  }
  if (foldKernel)
    emitFoldKernel(out);
  if (stagesKernel && !stagesInFold && !mergeInAttention) {
    out << "/// The stages of " << name << ", one block per "
        << (decode ? "head of the batch" : "kv-head") << ", in the "
        << "order of the policy" << (crossOp ? ", up to the cross-head op" : "")
        << (!decode ? ".\n"
            : foldKernel
                ? " (numBlocks: the fold blocks of a\n/// head, one "
                  "selection summary each).\n"
                : " (numBlocks: the attention's splits of a\n/// head, one "
                  "partial record each).\n");
    signature(fn);
    out << prologue(body) << body << "}\n\n";
  }
  if (crossOp) {
    out << "/// The cross-head op of " << name
        << (decode ? ": one block for every head of the layer of a sequence "
                     "of the batch.\n"
                   : ": one block for every head of the layer.\n")
        << "__global__ void __launch_bounds__(kStageThreads)\n    " << fn
        << "AcrossHeads(" << camel << "Workspace w, ";
    if (decode) {
      out << "int64_t stride, int32_t layer) {\n"
          << "  // The kv-heads of sequence b of the batch.\n"
             "  const int32_t b = blockIdx.x;\n"
             "  const kvc::cuda::HeadTable *heads = w.heads + b * kKvHeads;\n"
          << (isa<LayerReduceOp>(crossOp)
                  ? "  // Every head holds the same entries (checked on the "
                    "host).\n  const int32_t n = heads[0].numSlots;\n"
                  : "  const int32_t n = static_cast<int32_t>(stride);\n");
      if (periodic)
        out << "  if ((heads[0].queryPosition + 1) % kPeriod != 0)\n"
               "    return;\n";
    } else
      out << "int32_t n, int32_t layer) {\n"
          << "  const int64_t stride = n;\n";
    out << crossBody << "}\n\n";
    out << "/// The stages of " << name
        << " after the cross-head op, one block per "
        << (decode ? "head of the batch" : "kv-head") << ".\n";
    signature(fn + "AfterHeads");
    out << prologue(afterBody) << afterBody << "}\n\n";
  }

  // Workspace query and entry point.
  if (!decode) {
    host << "/// Device workspace bytes of " << name << ".\n";
    host << workspaceDeclaration() << " {\n"
         << "  kvc::cuda::Carver c(nullptr);\n"
         << "  " << camel << "Workspace w;\n"
         << "  carve" << camel << "Workspace(c, n, w);\n"
         << "  return c.bytes();\n}\n\n";
    host << "/// " << documentation() << "\n";
    host << declaration() << " {\n";
    emitValidation(host);
    emitPrefillEntry(host);
    if (gather)
      host << "  appends.keep();\n";
    host << "  return KVC_STATUS_OK;\n}\n\n";
    return success();
  }

  // Decode: the batch entry does the work; its messages name it.
  const std::string single = name;
  host << "/// Device workspace bytes of " << single << "_batch.\n";
  host << batchWorkspaceDeclaration() << " {\n"
       << "  kvc::cuda::Carver c(nullptr);\n"
       << "  " << camel << "Workspace w;\n"
       << "  carve" << camel << "Workspace(c, batch * kKvHeads, num_slots, "
       << "w);\n"
       << "  return c.bytes();\n}\n\n";
  host << "/// " << batchDocumentation() << "\n";
  host << batchDeclaration() << " {\n";
  name = single + "_batch";
  emitValidation(host);
  emitDecodeEntry(host);
  name = single;
  host << "  return KVC_STATUS_OK;\n}\n\n";

  if (graphable()) {
    // The same step in three calls, so that an engine can capture the
    // launches in a CUDA graph: each entry's messages name it.
    auto entry = [&](const std::string &documentation,
                     const std::string &declaration, const char *suffix,
                     DecodePart part) {
      host << "/// " << documentation << "\n" << declaration << " {\n";
      name = single + suffix;
      emitValidation(host, part);
      emitDecodeEntry(host, part);
      name = single;
      host << "  return KVC_STATUS_OK;\n}\n\n";
    };
    entry(planDocumentation(), planDeclaration(), "_plan_batch",
          DecodePart::Plan);
    entry(runDocumentation(), runDeclaration(), "_run_batch",
          DecodePart::Run);
    host << "/// " << finishDocumentation() << "\n" << finishDeclaration()
         << " {\n"
         << "  if (!context)\n"
         << "    return kvc_report_error(KVC_STATUS_NULL_POINTER, \"" << single
         << "_finish_batch: null argument\");\n"
         << "  if (layer < 0 || layer >= kLayers)\n"
         << "    return kvc_report_error(KVC_STATUS_OUT_OF_RANGE, \"" << single
         << "_finish_batch: layer out of range\");\n"
         << "  return kvc::cuda::finishPlannedSteps(context, layer, "
            "static_cast<cudaStream_t>(stream),\n"
         << "                                       \"" << single
         << "_finish_batch\");\n}\n\n";
  }

  host << "/// Device workspace bytes of " << name << ".\n";
  host << workspaceDeclaration() << " {\n"
       << "  return " << name << "_batch_workspace_bytes(1, num_slots);\n}\n\n";
  host << "/// " << documentation() << "\n";
  host << declaration() << " {\n"
       << "  // A batch of one.\n"
       << "  return " << name << "_batch(context, 1, &sequence, layer, q, "
       << (kernel.getKind() != KernelKind::decode_scoring ? "k, v, " : "")
       << "&position, " << (writesOutput(kernel) ? "out, " : "")
       << "workspace,\n"
       << "      workspace_bytes, stream);\n}\n\n";
  return success();
}

void CudaKernelEmitter::emitValidation(raw_ostream &out, DecodePart part) {
  const bool hasKv = kernel.getKind() != KernelKind::decode_scoring;
  const bool plan = part == DecodePart::Plan, run = part == DecodePart::Run;
  out << "  if (!context" << (decode && !run ? " || !sequences" : "")
      << (plan ? "" : " || !q") << (hasKv && !plan ? " || !k || !v" : "")
      << (run ? "" : " || !positions")
      << (writesOutput(kernel) && !plan ? " || !out" : "")
      << " || !workspace)\n"
      << "    return kvc_report_error(KVC_STATUS_NULL_POINTER, \"" << name
      << ": null argument\");\n";
  out << layerCheck(name);
  if (decode && !run)
    out << batchSequenceChecks(name);
  if (run)
    out << "  if (batch < 1)\n"
        << "    return kvc_report_error(KVC_STATUS_INVALID_ARGUMENT, \""
        << name << ": a batch needs at least one sequence\");\n";
  if (plan || run)
    out << "  if (capacity < 1)\n"
        << "    return kvc_report_error(KVC_STATUS_INVALID_ARGUMENT, \""
        << name << ": capacity must be at least one slot\");\n";
  if (!decode)
    out << promptChecks(name);
  out << contextGeometryCheck(name, "KVC_CUDA_TRY");
  if (mixed)
    out << "  if (config.memory != KVC_MEMORY_DEVICE || config.dtype != kDtype "
           "||\n"
           "      config.format != kFormat || config.low_format != kLowFormat "
           "||\n"
           "      config.group_size != kLowGroup)\n"
        << "    return kvc_report_error(KVC_STATUS_UNSUPPORTED, \"" << name
        << ": needs a device pool of the policy's dtype and formats\");\n";
  else
    out << "  if (config.memory != KVC_MEMORY_DEVICE || config.dtype != kDtype "
           "||\n"
           "      config.format != kFormat)\n"
        << "    return kvc_report_error(KVC_STATUS_UNSUPPORTED, \"" << name
        << ": needs a device pool of the policy's dtype and format\");\n";
  out << "  kvc_page_layout_t layout;\n"
         "  KVC_CUDA_TRY(kvc_page_layout(&config, &layout));\n"
         "  if (layout.key_stride != kRowBytes || layout.value_stride != "
         "kRowBytes ||\n"
         "      layout.value_offset % 16 != 0)\n"
      << "    return kvc_report_error(KVC_STATUS_INTERNAL, \"" << name
      << ": unexpected page layout\");\n";
  if (mixed)
    out << "  // The low page class of mixed precision.\n"
           "  kvc_page_layout_t lowLayout;\n"
           "  KVC_CUDA_TRY(kvc_low_page_layout(&config, &lowLayout, "
           "nullptr));\n"
           "  if (lowLayout.key_stride != kLowRowBytes || "
           "lowLayout.value_stride != kLowRowBytes ||\n"
           "      lowLayout.key_param_stride != kLowRecordBytes ||\n"
           "      lowLayout.value_param_stride != kLowRecordBytes)\n"
        << "    return kvc_report_error(KVC_STATUS_INTERNAL, \"" << name
        << ": unexpected low page layout\");\n";
  out << "  cudaStream_t s = static_cast<cudaStream_t>(stream);\n";
}

void CudaKernelEmitter::emitPrefillEntry(raw_ostream &out) {
  const std::string fn = deviceName("Stages");
  // A prefill that appends leaves its layer empty again if it fails after
  // the first head's append (kvc::LayerAppends).
  out << emptyLayerCheck(name, "KVC_CUDA_TRY", static_cast<bool>(gather));
  out << "  kvc::cuda::Carver carver(workspace);\n  " << camel
      << "Workspace w;\n  carve" << camel << "Workspace(carver, n, w);\n";
  out << "  KVC_CUDA_CHECK(\"" << name
      << "\", cudaMemcpyAsync(w.positions, positions, sizeof(int32_t) * n,\n"
         "                                   cudaMemcpyHostToDevice, s));\n";
  out << "  " << opComment(attention) << "\n";
  out << "  kvc::cuda::prefillAttention<kGroup, kHeadDim>\n"
         "      <<<dim3((n + kvc::cuda::kPrefillQueryTile - 1) / "
         "kvc::cuda::kPrefillQueryTile, kQHeads),\n"
         "         kvc::cuda::kPrefillThreads, 0, s>>>(n, q, k, v, "
         "kSoftmaxScale, "
      << (attention.getOutput() ? "out" : "w.scratchOut") << ", w.lse);\n";
  const bool window = attention.getWindow().has_value();
  const bool last = attention.getLast();
  const bool acc = attention.getAccumulate().has_value();
  if (window || last || acc || history) {
    out << "  kvc::cuda::prefillColumnStats<kGroup, kHeadDim>\n"
           "      <<<dim3((n + kvc::cuda::kKeyTile - 1) / kvc::cuda::kKeyTile, "
           "kKvHeads),\n"
           "         kvc::cuda::kPrefillThreads, 0, s>>>(n, kKvHeads, q, k, "
           "kSoftmaxScale, w.lse, "
        << (window ? "kWindow" : "0") << ", "
        << (window ? "w.windowProbs" : "nullptr") << ", "
        << (last ? "w.lastProbs" : "nullptr") << ", "
        << (acc ? "w.accumulated, kDecay" : "nullptr, 1.0f");
    if (history)
      out << ",\n         kvc::cuda::PersistenceBits{kHistory, kThreshold, "
          << reduceEnumerator("cuda", *attention.getPersistenceReduce())
          << ", w.persistBits}";
    else
      out << ", kvc::cuda::PersistenceBits{}";
    out << ");\n";
  }
  if (stagesKernel)
    out << "  // The policy's stages, one block per kv-head.\n"
        << "  " << fn << "<<<kKvHeads, kStageThreads, 0, s>>>(w, n, layer, k, "
        << "v);\n";
  if (crossOp && !stagesKernel)
    out << "  // The policy's stages: across heads, then one block per "
           "kv-head.\n";
  if (crossOp)
    out << "  " << opComment(crossOp) << "\n"
        << "  " << fn << "AcrossHeads<<<1, kStageThreads, 0, s>>>(w, n, "
        << "layer);\n"
        << "  " << fn << "AfterHeads<<<kKvHeads, kStageThreads, 0, s>>>(w, n, "
        << "layer, k, v);\n";
  if (merge)
    emitMergeLaunch(out);
  out << "  KVC_CUDA_CHECK(\"" << name << "\", cudaGetLastError());\n";
  if (!gather)
    return;
  out << "  " << opComment(gather) << "\n";
  const bool low = static_cast<bool>(gather.getLow());
  if (kivi)
    out << "  // The runtime allocates the slots of the kept entries on the "
           "host and\n"
           "  // records the KIVI work their append implies; kiviQuantize and "
           "kiviStageRows\n"
           "  // perform it.\n";
  else if (low)
    out << "  // The runtime allocates the slots of the kept entries on the "
           "host, those\n"
           "  // ranked best in the storage format and the others in the low "
           "page class;\n"
           "  // storeEntries and storeLowEntries then write them into their "
           "pages.\n";
  else
    out << "  // The runtime allocates the slots of the kept entries on the "
           "host;\n"
           "  // storeEntries then writes them into their pages.\n";
  out << "  try {\n";
  if (selects)
    out << "    std::vector<int32_t> numKept(kKvHeads), kept(static_cast<"
           "size_t>(kKvHeads) * n);\n"
        << "    KVC_CUDA_CHECK(\"" << name
        << "\", cudaMemcpyAsync(numKept.data(), w.numKept, sizeof(int32_t) * "
           "kKvHeads,\n"
           "                                     cudaMemcpyDeviceToHost, s));\n"
        << "    KVC_CUDA_CHECK(\"" << name
        << "\", cudaMemcpyAsync(kept.data(), w.kept, sizeof(int32_t) * "
           "kept.size(),\n"
           "                                     cudaMemcpyDeviceToHost, s));\n";
  if (state)
    out << "    std::vector<float> state(static_cast<size_t>(kKvHeads) * n);\n"
        << "    KVC_CUDA_CHECK(\"" << name
        << "\", cudaMemcpyAsync(state.data(), w.state, sizeof(float) * "
           "state.size(),\n"
           "                                     cudaMemcpyDeviceToHost, s));\n";
  if (history)
    out << "    std::vector<uint64_t> persistBits(static_cast<size_t>(kKvHeads) "
           "* n);\n"
        << "    KVC_CUDA_CHECK(\"" << name
        << "\", cudaMemcpyAsync(persistBits.data(), w.persistBits, "
           "sizeof(uint64_t) * persistBits.size(),\n"
           "                                     cudaMemcpyDeviceToHost, s));\n";
  // A score stored for a later kernel (a global budget's select).
  std::string stored;
  if (Value v = gather.getState())
    stored = values.lookup(v).name;
  if (!stored.empty())
    out << "    std::vector<float> storedScore(static_cast<size_t>(kKvHeads) "
           "* n);\n"
        << "    KVC_CUDA_CHECK(\"" << name
        << "\", cudaMemcpyAsync(storedScore.data(), w." << stored
        << ", sizeof(float) * storedScore.size(),\n"
           "                                     cudaMemcpyDeviceToHost, s));\n";
  if (low)
    out << "    std::vector<uint8_t> high(static_cast<size_t>(kKvHeads) * n);\n"
        << "    KVC_CUDA_CHECK(\"" << name
        << "\", cudaMemcpyAsync(high.data(), w.high, high.size(),\n"
           "                                     cudaMemcpyDeviceToHost, s));\n";
  if (selects || state || history || !stored.empty() || low)
    out << "    KVC_CUDA_CHECK(\"" << name
        << "\", cudaStreamSynchronize(s));\n";
  out << "    std::vector<int32_t> keptPositions(n), slots(n);\n";
  if (low)
    out << "    std::vector<int32_t> order(n);\n";
  if (kivi)
    out << "    kvc::cuda::KiviWorkPlan kivi;\n";
  else
    out << "    std::vector<kvc::cuda::StoreEntry> stores"
        << (low ? ", lowStores" : "") << ";\n"
        << "    stores.reserve(static_cast<size_t>(kKvHeads) * n);\n";
  out << "    for (int32_t h = 0; h < kKvHeads; ++h) {\n";
  if (selects)
    out << "      const int32_t count = numKept[h];\n"
           "      const int32_t *index = kept.data() + static_cast<size_t>(h) "
           "* n;\n";
  else
    out << "      const int32_t count = n;\n";
  std::string index = selects ? "index[j]" : "j";
  out << "      if (count == 0)\n        continue;\n";
  if (low) {
    out << "      // Mixed precision: the high entries, then the low ones, "
           "each in prompt\n"
           "      // order (the order of the cpu backend's appends).\n"
           "      const uint8_t *isHigh = high.data() + static_cast<size_t>(h) "
           "* n;\n"
           "      int32_t numHigh = 0;\n"
           "      for (int32_t j = 0; j < count; ++j)\n"
        << "        numHigh += isHigh[" << index << "];\n"
        << "      for (int32_t j = 0, hi = 0, lo = numHigh; j < count; ++j)\n"
        << "        order[isHigh[" << index << "] ? hi++ : lo++] = " << index
        << ";\n";
    index = "order[j]";
  }
  out << "      for (int32_t j = 0; j < count; ++j)\n"
      << "        keptPositions[j] = positions[" << index << "];\n";
  if (low)
    out << "      if (numHigh > 0)\n"
           "        KVC_CUDA_TRY(kvc_append(context, sequence, layer, h, "
           "numHigh, kHeadDim, nullptr, nullptr,\n"
           "                                keptPositions.data(), "
           "slots.data()));\n"
           "      if (count > numHigh)\n"
           "        KVC_CUDA_TRY(kvc_append_format(context, sequence, layer, "
           "h, kLowFormat, count - numHigh,\n"
           "                                       kHeadDim, nullptr, nullptr, "
           "keptPositions.data() + numHigh,\n"
           "                                       slots.data() + "
           "numHigh));\n";
  else
    out << "      KVC_CUDA_TRY(kvc_append(context, sequence, layer, h, count, "
           "kHeadDim, nullptr, nullptr,\n"
           "                              keptPositions.data(), "
           "slots.data()));\n";
  if (state || history || !stored.empty())
    out << "      kvc_metadata_t meta;\n"
           "      KVC_CUDA_TRY(kvc_get_metadata(context, sequence, layer, h, "
           "&meta));\n";
  if (state)
    out << "      for (int32_t j = 0; j < count; ++j)\n"
        << "        meta.score[slots[j]] = state[static_cast<size_t>(h) * n + "
        << index << "];\n";
  if (!stored.empty())
    out << "      // The score of every kept entry, for the select kernel.\n"
           "      for (int32_t j = 0; j < count; ++j)\n"
        << "        meta.score[slots[j]] = storedScore[static_cast<size_t>(h) "
           "* n + "
        << index << "];\n";
  if (history)
    out << "      // Importance bits carried into decode.\n"
           "      for (int32_t j = 0; j < count; ++j)\n"
        << "        meta.history[slots[j]] = persistBits[static_cast<size_t>(h) "
           "* n + "
        << index << "];\n";
  if (kivi) {
    out << "      KVC_CUDA_TRY((kivi.add<kHeadDim, kDtype>(context, sequence, "
           "layer, h, layout, config.page_size,\n"
           "                                               kKiviGroup, "
        << (merge || !selects ? "nullptr" : "index") << ", kKvStride)));\n"
        << "    }\n"
        << (merge ? "    // The merged rows, in kept-list order.\n" : "")
        << "    KVC_CUDA_TRY((kivi.launch<kHeadDim, kKiviBits, kKiviGroup, "
           "kDtype>(\n"
           "        w.kivi, kvc::cuda::kiviWorkBounds(kKvHeads, n, kResidual, "
           "kKiviGroup), "
        << (merge ? "w.mergedKeys, w.mergedValues" : "k, v") << ", s,\n"
        << "        \"" << name << "\")));\n"
        << "  } catch (const std::bad_alloc &) {\n"
           "    return kvc_report_error(KVC_STATUS_OUT_OF_MEMORY, \""
        << name << ": host allocation failed\");\n  }\n";
    return;
  }
  out << "      int32_t page = -1;\n"
         "      void *address = nullptr;\n"
         "      for (int32_t j = 0; j < count; ++j) {\n"
         "        if (slots[j] / config.page_size != page) {\n"
         "          page = slots[j] / config.page_size;\n"
         "          KVC_CUDA_TRY(kvc_get_page(context, sequence, layer, h, "
         "page, nullptr, nullptr, &address));\n"
         "        }\n";
  if (low)
    out << "        if (j < numHigh)\n"
           "          stores.push_back(kvc::cuda::storeEntry(layout, "
           "config.page_size,\n"
           "                                                 "
           "reinterpret_cast<uint64_t>(address), slots[j], h,\n"
        << "                                                 " << index
        << ", kRowBytes));\n"
           "        else\n"
           "          lowStores.push_back(kvc::cuda::lowStoreEntry(lowLayout, "
           "config.page_size,\n"
           "                                                       "
           "reinterpret_cast<uint64_t>(address), slots[j], h,\n"
        << "                                                       " << index
        << "));\n";
  else
    out << "        stores.push_back(kvc::cuda::storeEntry(layout, "
           "config.page_size,\n"
           "                                               "
           "reinterpret_cast<uint64_t>(address), slots[j], h,\n"
        << "                                               "
        << (merge ? std::string("j") : index) << ", kRowBytes));\n";
  out << "      }\n"
         "    }\n"
      << (merge ? "    // The merged rows, in kept-list order.\n" : "")
      << "    KVC_CUDA_TRY(kvc::cuda::launchStores<kHeadDim, kStorage>(stores, "
      << (merge ? "w.stores, w.mergedKeys, w.mergedValues, kKvStride, s,\n"
                : "w.stores, k, v, kKvStride, s,\n")
      << "                                                           \"" << name
      << "\"));\n";
  if (low)
    out << "    // The low entries' destinations follow the high ones' in the "
           "workspace.\n"
           "    KVC_CUDA_TRY((kvc::cuda::launchLowStores<kHeadDim, kLowBits, "
           "kLowGroup>(\n"
           "        lowStores, w.stores + stores.size(), k, v, kKvStride, s, \""
        << name << "\")));\n";
  out << "  } catch (const std::bad_alloc &) {\n"
         "    return kvc_report_error(KVC_STATUS_OUT_OF_MEMORY, \""
      << name << ": host allocation failed\");\n  }\n";
}

void CudaKernelEmitter::emitMergeLaunch(raw_ostream &out) {
  out << "  " << opComment(merge) << "\n";
  const std::string tiles =
      "dim3((n + kMergeWarps - 1) / kMergeWarps, kKvHeads), kStageThreads, 0, "
      "s";
  if (auto cam = dyn_cast<MergeCamOp>(merge)) {
    out << "  // The window mean over the entries the window scores, then "
           "the rows.\n"
        << "  kvc::cuda::mergeCamMean<32><<<kKvHeads, 32, 0, s>>>(w.camAttention, "
           "n, n - (kWindow < n ? kWindow : n), w.means);\n"
        << "  kvc::cuda::mergeCamRows<kHeadDim, kStageThreads><<<" << tiles
        << ">>>(\n"
        << "      k, v, kKvStride, kKvHeads, w.kept, w.numKept, w.victim, "
           "w.camAttention, w.means, n, "
        << cam.getSpan() << ", w.mergedKeys, w.mergedValues);\n";
    return;
  }
  const bool d2o = isa<MergeD2OOp>(merge);
  std::string rule = "SimNorm";
  if (auto nearest = dyn_cast<MergeNearestOp>(merge)) {
    if (nearest.getWeight() == MergeWeight::similarity)
      rule = "Similarity";
    else if (nearest.getWeight() == MergeWeight::uniform)
      rule = "Uniform";
  }
  const std::string kind =
      d2o ? "kvc::cuda::MergeKind::D2O" : "kvc::cuda::MergeKind::Nearest";
  const std::string threads = "dim3((n + kStageThreads - 1) / kStageThreads, "
                              "kKvHeads), kStageThreads, 0, s";
  out << "  const kvc::cuda::MergeScratch scratch{w.keptNorms, w.targets, "
         "w.sims, w.weights, nullptr};\n"
      << "  // Key norms of the kept entries, then every victim's nearest kept "
         "key.\n"
      << "  kvc::cuda::mergeKeptNorms<kHeadDim><<<" << threads << ">>>(\n"
      << "      k, kKvStride, w.kept, w.numKept, n, scratch);\n"
      << "  kvc::cuda::mergeTargets<kHeadDim><<<" << threads << ">>>(\n"
      << "      k, v, kKvStride, w.kept, w.numKept, w.victimList, "
         "w.numVictims, "
         "n, "
      << kind << ",\n      kvc::cuda::MergeWeight::" << rule
      << (d2o ? " /* D2O weighs by exp(similarity) below */" : "")
      << ", scratch);\n";
  if (auto op = dyn_cast<MergeD2OOp>(merge))
    out << "  // The prompt is the first merge step: the EMA threshold "
           "starts from 0.\n"
        << "  kvc::cuda::mergeD2OWeights<kStageThreads><<<kKvHeads, "
           "kStageThreads, 0, s>>>(w.numVictims, n, 0.0, "
        << floatLiteral("cuda", op.getAlpha().convertToDouble()) << ", "
        << floatLiteral("cuda", op.getBeta().convertToDouble())
        << ", scratch);\n";
  out << "  kvc::cuda::mergeRows<kHeadDim, kStageThreads><<<" << tiles
      << ">>>(\n"
      << "      k, v, kKvStride, kKvHeads, w.kept, w.numKept, w.victimList, "
         "w.numVictims, n, "
      << kind << ", scratch,\n      w.mergedKeys, w.mergedValues);\n";
}

void CudaKernelEmitter::emitDecodeEntry(raw_ostream &out, DecodePart part) {
  const std::string fn = deviceName("Stages");
  const std::string outArg = attention.getOutput() ? "out" : "w.scratchOut";
  const bool plan = part == DecodePart::Plan, run = part == DecodePart::Run;
  if (run) {
    // The launches alone: everything they read comes from the arguments
    // and the tables the plan uploaded into the workspace.
    out << "  // Head i of the batch is kv-head i % kKvHeads of sequence i / "
           "kKvHeads; each head's\n  // rows of the workspace take "
           "`capacity` slots, as in the plan.\n"
           "  const int32_t heads = batch * kKvHeads;\n"
           "  const int64_t stride = capacity;\n";
    out << "  if (workspace_bytes < " << stepName()
        << "_batch_workspace_bytes(batch, capacity))\n"
        << "    return kvc_report_error(KVC_STATUS_BUFFER_TOO_SMALL, \""
        << name << ": workspace smaller than " << stepName()
        << "_batch_workspace_bytes(batch, capacity)\");\n";
    out << "  // The step this thread planned for the layer, if any, was "
           "planned for this run.\n"
        << "  KVC_CUDA_TRY(kvc::cuda::checkPlannedRun(context, layer, batch, "
           "capacity, workspace,\n"
        << "                                          \"" << name
        << "\"));\n";
    out << "  kvc::cuda::Carver carver(workspace);\n  " << camel
        << "Workspace w;\n  carve" << camel
        << "Workspace(carver, heads, stride, w);\n"
        << "  // The plan's upload put the batch's HeadTables first.\n"
        << "  w.heads = reinterpret_cast<const kvc::cuda::HeadTable "
           "*>(w.tables);\n";
    out << "  try {\n";
  } else {
  out << "  // The slot tables of the batch's sequences stay on the device "
           "between steps\n  // (DeviceTables). Checked out first: the "
           "runtime then evicts the victims of\n  // the step before the "
           "last (of the last step on a KIVI pool) before anything\n  // "
           "here reads its bookkeeping.\n"
           "  kvc::cuda::DeviceTables tables;\n"
           "  KVC_CUDA_TRY(tables.checkOut(context, batch, sequences, layer, "
           "kKvHeads,\n"
           "                               /*withState=*/"
      << (state ? "true" : "false") << ", /*withHistory=*/"
      << (history ? "true" : "false") << ",\n"
      << "                               /*withVictims=*/"
      << (selects ? "true" : "false") << ", \"" << name << "\""
      << (kivi ? ",\n                               /*withKivi=*/true" : "")
      << "));\n";
  out << "  // Head i of the batch is kv-head i % kKvHeads of sequence i / "
         "kKvHeads.\n"
         "  const int32_t heads = batch * kKvHeads;\n"
         "  int32_t maxSlots = 0;\n"
         "  KVC_CUDA_TRY(tables.slotsBeforeStep(&maxSlots));\n";
  if (plan) {
    const std::string batchName = stepName();
    out << "  // The run is planned for `capacity` slots per head: every head "
           "must fit it\n  // after the append (at most one more page).\n"
           "  if (static_cast<int64_t>(maxSlots) + config.page_size > "
           "capacity)\n"
        << "    return kvc_report_error(KVC_STATUS_OUT_OF_RANGE, \"" << name
        << ": a head holds more than capacity - page_size slots\");\n"
        << "  const int64_t stride = capacity;\n";
    out << "  if (workspace_bytes < " << batchName
        << "_batch_workspace_bytes(batch, capacity))\n"
        << "    return kvc_report_error(KVC_STATUS_BUFFER_TOO_SMALL, \""
        << name << ": workspace smaller than " << batchName
        << "_batch_workspace_bytes(batch, capacity)\");\n";
  } else {
  out << "  // Slots after the append: at most one more page per head.\n"
         "  const int64_t stride = static_cast<int64_t>(maxSlots) + "
         "config.page_size;\n";
  out << "  if (workspace_bytes < " << name
      << "_workspace_bytes(batch, static_cast<int32_t>(stride)))\n"
      << "    return kvc_report_error(KVC_STATUS_BUFFER_TOO_SMALL, \"" << name
      << ": workspace smaller than " << name
      << "_workspace_bytes(batch, slots + page_size)\");\n";
  }
  out << "  kvc::cuda::Carver carver(workspace);\n  " << camel
      << "Workspace w;\n  carve" << camel
      << "Workspace(carver, heads, stride, w);\n";
  out << "  try {\n";
  }
  if (append && !run) {
    out << "    " << opComment(append) << "\n";
    if (kivi)
      out << "    // The runtime takes the lowest free slot of each head and "
             "records the KIVI\n"
             "    // work of the append (kvc_kivi_pending_work): the new row "
             "goes to the residual\n"
             "    // window, the value that leaves it and, every G appends, a "
             "block of keys are\n"
             "    // quantized; kiviQuantize and kiviStageRows perform it.\n";
    else
      out << "    // The runtime takes the lowest free slot of each head (a "
             "victim's slot\n"
             "    // after an eviction); storeAppended writes the row there.\n";
    out << "    // One call for the batch, all or nothing; it also gives "
           "each head's page-table\n"
           "    // length, which the device tables need.\n"
           "    std::vector<int32_t> newSlots(heads), numPages(heads);\n"
           "    KVC_CUDA_TRY(kvc_append_step(context, layer, batch, "
           "sequences, kHeadDim, nullptr, nullptr,\n"
           "                                 positions, newSlots.data(), "
           "numPages.data()));\n";
    if (kivi)
      out << "    // The batch's work records in one call; the device "
             "tables read them too.\n"
             "    kvc::cuda::KiviWorkPlan kivi;\n"
             "    KVC_CUDA_TRY((kivi.addStep<kHeadDim, kDtype>(context, "
             "layer, batch, sequences, kKvHeads, layout,\n"
             "                                                   "
             "config.page_size, kKiviGroup, kKvStride)));\n";
  }
  if (!run)
  out << "    KVC_CUDA_TRY(tables.upload(positions, "
      << (append ? "newSlots.data(), numPages.data()" : "nullptr, nullptr")
      << ", /*sameEntries=*/"
      << (isa_and_nonnull<LayerReduceOp>(crossOp) ? "true" : "false")
      << ", w.tables,\n"
         "                               kvc::cuda::deviceTableBytes(heads, "
         "stride"
      << (kivi ? ", kResidual" : "") << "), s, &w.heads"
      << (kivi && append ? ",\n                               kivi.records(), "
                           "kvc::cuda::WordsBy::" +
                               std::string(plan ? "PlannedStores" : "Stores")
                         : std::string())
      << (append && !kivi
              ? ",\n                               /*kiviWork=*/nullptr, "
                "kvc::cuda::WordsBy::" +
                    std::string(plan ? "PlannedStores" : "Stores")
              : std::string())
      << "));\n";
  if (append && kivi && !plan && !run)
    out << "    // The quantization, then the new rows into the residual "
           "windows and, in the\n    // same launch, the tables' words.\n"
           "    KVC_CUDA_TRY((kivi.launch<kHeadDim, kKiviBits, kKiviGroup, "
           "kDtype>(\n"
           "        w.kivi, kvc::cuda::kiviWorkBounds(heads, 1, "
           "kResidual, kKiviGroup), k, v, s,\n        \""
        << name << "\", &tables)));\n";
  if (append && kivi && plan)
    out << "    // The jobs of the run's quantization and staging, each list "
           "at a place that\n    // depends on the batch alone "
           "(carveKiviWork).\n"
           "    KVC_CUDA_TRY(kivi.upload(w.kivi, "
           "kvc::cuda::kiviWorkBounds(heads, 1, kResidual, kKiviGroup),\n"
           "                             s, \""
        << name << "\"));\n";
  if (append && kivi && run)
    out << "    // The quantization and staging of the jobs the plan "
           "uploaded, in grids for\n    // the most work of a step whose "
           "blocks past the uploaded counts return;\n    // the staging "
           "writes the tables' words too.\n"
           "    KVC_CUDA_TRY((kvc::cuda::launchPlannedKivi<kHeadDim, "
           "kKiviBits, kKiviGroup, kDtype>(\n"
           "        w.kivi, w.heads, heads, kResidual, k, v, s, \""
        << name << "\")));\n";
  if (append && !kivi && !plan && !run)
    out << "    // The new rows, at the slots the uploaded tables name, and "
           "the tables' words\n    // in the same launch.\n"
           "    KVC_CUDA_TRY((kvc::cuda::launchAppendStores<kHeadDim, "
           "kStorage>(\n"
           "        tables, w.heads, heads, kKvHeads, kvc::cuda::devicePageLayout("
           "config, layout), k, v,\n"
           "        kKvStride, s, \""
        << name << "\")));\n";
  if (append && !kivi && run)
    out << "    // The new rows, at the slots the uploaded tables name, and "
           "the words the plan\n    // uploaded after them, their count read "
           "on the device.\n"
           "    KVC_CUDA_TRY((kvc::cuda::launchPlannedStores<kHeadDim, "
           "kStorage>(\n"
           "        w.heads, heads, kKvHeads, kvc::cuda::devicePageLayout("
           "config, layout), k, v, kKvStride,\n"
           "        s, \""
        << name << "\")));\n";
  // The plan queues no kernel of the step: its keepVictims and checkIn
  // below.
  if (!plan) {
  // The slots the splits and fold blocks are planned for: the longest
  // head's, or the run's capacity.
  const char *planned = run ? "capacity" : "tables.maxSlots()";
  // The attention kernel's instantiation, indented to follow `at` columns.
  auto attentionKernel = [&](int at) {
    std::string pad(at, ' ');
    if (kivi)
      return "kvc::cuda::decodeAttentionKivi<kGroup, kHeadDim, kKiviBits, "
             "kKiviGroup, kDtype,\n" +
             pad + "kvc::cuda::kDecodeThreads>";
    if (mixed)
      return "kvc::cuda::decodeAttentionSplit<kGroup, kHeadDim, kStorage, "
             "kvc::cuda::kDecodeThreads,\n" +
             pad + "kLowBits, kLowGroup>";
    return std::string("kvc::cuda::decodeAttentionSplit<kGroup, kHeadDim, "
                       "kStorage, kvc::cuda::kDecodeThreads>");
  };
  // A decode whose fold kernel may instead fold in the attention grid
  // (KVC_CUDA_FOLD_IN_GRID, decodeAttentionFold): every one but KIVI's.
  const bool inGrid = foldKernel && !kivi;
  const std::string ranges = camel + "FoldRanges";
  auto foldedKernel = [&](int at) {
    std::string pad(at, ' ');
    return "kvc::cuda::decodeAttentionFold<kGroup, kHeadDim, kStorage, "
           "kvc::cuda::kDecodeThreads,\n" +
           pad + (mixed ? "kLowBits, kLowGroup, " : "0, 0, ") + ranges + ">";
  };
  auto residentOf = [&](const std::string &kernel) {
    return "    KVC_CUDA_TRY((kvc::cuda::residentBlocks<\n        &" + kernel +
           ",\n        kvc::cuda::kDecodeThreads>(\"" + name +
           "\", &resident)));\n";
  };
  out << "    " << opComment(attention) << "\n"
      << "    // Split-KV: one block per (split, head of the batch) reads "
         "every key and value\n    // once, in as many splits as whole "
         "waves of the kernel's resident blocks\n    // allow (planSplits)."
         "\n"
         "    int32_t multiprocessors = 0, resident = 0;\n"
         "    KVC_CUDA_TRY(kvc::cuda::deviceMultiprocessors(\""
      << name << "\", &multiprocessors));\n";
  if (inGrid)
    out << "#if KVC_CUDA_FOLD_IN_GRID\n"
        << residentOf(foldedKernel(40)) << "#else\n"
        << residentOf(attentionKernel(41)) << "#endif\n";
  else
    out << residentOf(attentionKernel(kivi ? 40 : 41));
  out << "    const kvc::cuda::SplitPlan plan = kvc::cuda::planSplits(\n"
         "        "
      << planned
      << ", kMaxSplits, kMinSlotsPerSplit, heads,\n"
         "        static_cast<int64_t>(multiprocessors) * resident);\n"
         "    kvc::cuda::DecodeSplitArgs args{w.heads, "
         "kvc::cuda::devicePageLayout(config, layout"
      << (mixed ? ", lowLayout" : "")
      << "), q,\n"
         "                                    kSoftmaxScale, "
         "plan.slotsPerSplit, plan.splits, stride,\n"
         "                                    "
      << (foldsStatistics() ? "w.logits" : "/*logits=*/nullptr")
      << ", w.partials"
      << (mergeInAttention ? ",\n                                    /*mergeOut=*/" +
                                 outArg
                           : std::string())
      << "};\n";
  if (foldsStatistics())
    out << "    // The fold reads the logits back and drops them from L2: the "
           "attention\n    // stores as many of them evict-last as half of "
           "L2 holds (logitPolicy).\n"
           "    int32_t l2Bytes = 0;\n"
           "    KVC_CUDA_TRY(kvc::cuda::deviceL2Bytes(\""
        << name
        << "\", &l2Bytes));\n"
           "    args.logitsKeep = kvc::cuda::logitsKeepFraction(\n"
           "        static_cast<int64_t>(heads) * kGroup * "
        << planned << " * 4, l2Bytes);\n";
  if (kivi)
    out << "    // KIVI: packed int codes dequantized in registers, the window "
           "read from\n"
           "    // the residual rows (the device tables' word per slot: row "
           "and formats).\n";
  else if (mixed)
    out << "    // Mixed precision: the low pages (tagged by DeviceTables) hold "
           "grouped int\n"
           "    // codes, dequantized in registers.\n";
  // The fold's fields past its workspace, stride and ranges.
  auto foldFields = [&](StringRef arrivals) {
    return (stagesInFold ? (", /*arrivals=*/" + arrivals + ", layer").str()
                         : std::string()) +
           (attention.getOutput() ? ", out" : "");
  };
  if (inGrid)
    out << "#if KVC_CUDA_FOLD_IN_GRID\n"
        << "    // The statistics in the same grid: its blocks take (head, "
           "split) items in\n    // order, and each folds a range of a head "
           "that ended about a wave of\n    // blocks before (GridFold), "
        << (stagesInFold ? "the last of a head's ranges running the policy's\n"
                           "    // stages for it, "
                         : "")
        << "while the others stream the cache.\n"
        << "    const kvc::cuda::GridFold grid = kvc::cuda::planGridFold(\n"
           "        plan, heads, "
        << planned
        << ", static_cast<int64_t>(multiprocessors) * resident,\n"
           "        kvc::cuda::DeviceTables::stepItems(w.heads, heads));\n"
           "    const kvc::cuda::FoldPlan fold{grid.ranges, "
           "grid.slotsPerRange};\n"
           "    const "
        << ranges
        << " ranges{w, stride, plan.splits, fold.blocks, fold.slotsPerBlock"
        << foldFields("plan.splits") << "};\n"
        << "    // Its blocks may start while the kernel before it ends, and "
           "wait for it\n    // (launchDependent).\n"
        << "    KVC_CUDA_TRY((kvc::cuda::launchDependent<\n        &"
        << foldedKernel(40) << ">(\n        \"" << name
        << "\", dim3(static_cast<unsigned>(kvc::cuda::gridFoldItems(grid, "
           "plan.splits))),\n        kvc::cuda::kDecodeThreads, s, args, "
           "grid, ranges)));\n"
        << "#else\n";
  out << "    // Its blocks may start while the kernel before it ends, and wait "
         "for it\n    // (launchDependent).\n"
      << "    KVC_CUDA_TRY((kvc::cuda::launchDependent<\n        &"
      << attentionKernel(kivi ? 40 : 41) << ">(\n        \"" << name
      << "\", dim3(heads, plan.splits), kvc::cuda::kDecodeThreads, s, args"
      << (kivi ? ", kResidual" : "") << ")));\n";
  if (foldKernel) {
    out << "    // Exact merge of the splits and the statistics over the "
           "slots"
        << (oneVictim ? ",\n    // and the selection's summaries" : "")
        << ", in blocks of whole slot ranges per head of\n    // the batch "
           "that fill the device once (FoldPlan)"
        << (stagesInFold ? ";\n    // the last block of a head runs the "
                           "policy's stages for it.\n"
                         : ".\n")
        << "    const kvc::cuda::FoldPlan fold = kvc::cuda::planFold<kGroup>(\n"
           "        plan, heads, "
        << planned << ", multiprocessors);\n"
        << "    const " << ranges
        << " ranges{w, stride, plan.splits, fold.blocks, fold.slotsPerBlock"
        << foldFields("0") << "};\n"
        << "    // Its blocks may start while the attention ends, and wait "
           "for it.\n"
        << "    KVC_CUDA_TRY(kvc::cuda::launchDependent<&" << deviceName("Fold")
        << ">(\n        \"" << name
        << "\", dim3(heads, fold.blocks), kvc::cuda::kFoldThreads, s, "
           "ranges));\n";
  }
  if (inGrid)
    out << "#endif\n";
  if (mergeInAttention)
    out << "    // The last of each head's blocks merges the head's splits "
           "(mergeOut): no kernel\n    // follows.\n";
  if (stagesKernel && !stagesInFold && !mergeInAttention)
    out << (foldKernel ? "    // The policy's stages, one block per head of "
                         "the batch.\n"
                       : "    // Exact merge of the splits, then the "
                         "policy's stages, one block per head of\n    // "
                         "the batch.\n")
        << "    " << fn << "<<<heads, kStageThreads, 0, s>>>(w, stride, "
        << (foldKernel ? "fold.blocks" : "plan.splits") << ", layer, "
        << outArg << ");\n";
  // "Some sequence of the batch is at a step where `condition` (of
  // `position`) holds."
  auto anySequence = [](const std::string &var, const std::string &cond) {
    return "    bool " + var +
           " = false;\n"
           "    for (int32_t b = 0; b < batch; ++b) {\n"
           "      const int32_t position = positions[b];\n"
           "      " +
           var + " = " + var + " || " + cond +
           ";\n"
           "    }\n";
  };
  const bool periodEnds = periodic && crossOp;
  if (periodEnds)
    out << "    // The rest of the phase runs once every kPeriod positions: "
           "in the blocks of\n    // the sequences that end a period.\n"
        << anySequence("periodEnds", "(position + 1) % kPeriod == 0");
  if (crossOp) {
    std::string launches;
    llvm::raw_string_ostream ls(launches);
    ls << "    " << opComment(crossOp) << "\n"
       << "    " << fn << "AcrossHeads<<<batch, kStageThreads, 0, s>>>(w, "
       << "stride, layer);\n"
       << "    " << fn << "AfterHeads<<<heads, kStageThreads, 0, s>>>(w, "
       << "stride, " << (foldKernel ? "fold.blocks" : "plan.splits")
       << ", layer, " << outArg << ");\n";
    if (periodic)
      out << "    if (periodEnds) {\n" << indented(launches) << "    }\n";
    else
      out << launches;
  }
  out << "    KVC_CUDA_CHECK(\"" << name << "\", cudaGetLastError());\n";
  }
  // The score state, the importance bits and the victims stay on the
  // device; the victim lists' download is queued, and the runtime evicts
  // them at the check-out of the step after next or when the tables are
  // settled.
  if (selects && !run) {
    out << "    // The victims stay in the device tables; their download is "
           "queued, and the\n    // runtime evicts them at this layer's "
           "step after next (the next one on a\n    // KIVI pool) or host "
           "access; the step does not wait for its kernels.\n"
           "    for (int32_t b = 0; b < batch; ++b)\n";
    if (periodic)
      out << "      if ((positions[b] + 1) % kPeriod == 0)\n  ";
    out << "      KVC_CUDA_TRY(tables.keepVictims(b));\n";
  }
  // The stages that list a head's victims write its host row too.
  if (plan)
    out << "    // The step's event waits for its finish, after the run.\n"
        << "    KVC_CUDA_TRY(tables.checkIn(/*victimsPublished=*/"
        << (selects ? "true" : "false") << ", /*recordLater=*/true));\n"
        << "    // The run it planned, which the run's call checks "
           "(checkPlannedRun).\n"
        << "    KVC_CUDA_TRY(kvc::cuda::notePlannedRun(context, layer, batch, "
           "capacity, workspace,\n"
        << "                                           \"" << name
        << "\"));\n";
  else if (!run)
    out << "    KVC_CUDA_TRY(tables.checkIn("
        << (selects ? "/*victimsPublished=*/true" : "") << "));\n";
  out << "  } catch (const std::bad_alloc &) {\n"
         "    return kvc_report_error(KVC_STATUS_OUT_OF_MEMORY, \""
      << name << ": host allocation failed\");\n  }\n";
}

/// The runtime's storage of a policy on device pools.
struct DeviceStorage {
  std::string format;  ///< kvc_format_t enumerator.
  std::string storage; ///< kvc::cuda::Storage enumerator (not for KIVI).
  int64_t elementBytes = 0;
  /// KIVI: bits per code, group G and residual window R (0 otherwise).
  int64_t kiviBits = 0, kiviGroup = 0, residual = 0;
  /// Mixed precision: bits per code and channel group of the low page
  /// class (0 for one class).
  int64_t lowBits = 0, lowGroup = 0;
};

/// The combinations of mixed precision (a gather with a low page class)
/// that the CUDA backend lowers: a storage format of one row per token
/// (FULL, INT8, FP8), kept entries gathered as they are (no merge of
/// evicted ones), and low-class groups that divide head_dim.
LogicalResult checkMixedPrecision(GatherOp gather, KernelOp kernel,
                                  const RuntimeStorage &storage,
                                  GeometryAttr geometry) {
  if (storage.format == "KVC_FORMAT_KIVI_INT2" ||
      storage.format == "KVC_FORMAT_KIVI_INT4")
    return gather.emitOpError()
           << "mixed precision (a low page class) over KIVI storage has no "
              "CUDA lowering";
  for (Operation &op : kernel.getBody().front())
    if (isa<MergeNearestOp, MergeD2OOp, MergeCamOp>(op))
      return gather.emitOpError()
             << "mixed precision (a low page class) with a merge of evicted "
                "entries ('"
             << op.getName() << "') has no CUDA lowering";
  const int64_t group = gather.getLow()->getGroup();
  if (group <= 0 || geometry.getHeadDim() % group != 0)
    return gather.emitOpError()
           << "the low page class needs a channel group dividing head_dim "
           << geometry.getHeadDim() << " (got " << group << ")";
  return success();
}

FailureOr<DeviceStorage> deviceStorage(PolicyOp policy,
                                       ArrayRef<KernelOp> kernels) {
  GeometryAttr geometry = policy.getGeometryAttr();
  Operation *writer = nullptr;
  FailureOr<RuntimeStorage> storage = policyStorage(
      kernels,
      [&](GatherOp g, KernelOp kernel, const RuntimeStorage &mapped) {
        return g.getLow() ? checkMixedPrecision(g, kernel, mapped, geometry)
                          : success();
      },
      &writer);
  if (failed(storage))
    return failure();
  DeviceStorage d;
  d.format = storage->format;
  if (storage->lowFormat != "KVC_FORMAT_FULL") {
    d.lowBits = storage->lowFormat == "KVC_FORMAT_INT2" ? 2 : 4;
    d.lowGroup = storage->groupSize;
  }
  if (d.format == "KVC_FORMAT_FULL") {
    Type t = geometry.getDtype();
    d.storage = t.isF16()    ? "kvc::cuda::Storage::F16"
                : t.isBF16() ? "kvc::cuda::Storage::BF16"
                             : "kvc::cuda::Storage::F32";
    d.elementBytes = t.isF16() || t.isBF16() ? 2 : 4;
    return d;
  }
  if (d.format == "KVC_FORMAT_INT8" || d.format == "KVC_FORMAT_FP8_E4M3") {
    d.storage = d.format == "KVC_FORMAT_INT8"
                    ? "kvc::cuda::Storage::Int8"
                    : "kvc::cuda::Storage::Fp8E4M3";
    d.elementBytes = 1;
    return d;
  }
  // KIVI: kiviQuantize runs one thread per channel, decodeAttentionKivi
  // one warp per row.
  d.kiviBits = d.format == "KVC_FORMAT_KIVI_INT2" ? 2 : 4;
  d.kiviGroup = storage->groupSize;
  d.residual = storage->residual;
  if (d.residual <= 0 || d.kiviGroup <= 0 ||
      geometry.getHeadDim() % d.kiviGroup != 0 || d.residual % d.kiviGroup)
    return writer->emitOpError()
           << "KIVI storage needs a group dividing head_dim and a positive "
              "residual window that is a multiple of it";
  return d;
}

} // namespace

LogicalResult kvc::emitCuda(PolicyOp policy,
                            SmallVectorImpl<EmittedFile> &files) {
  FailureOr<SmallVector<KernelOp>> formed = formedKernels(policy);
  if (failed(formed))
    return failure();
  const SmallVector<KernelOp> &kernels = *formed;
  GeometryAttr geometry = policy.getGeometryAttr();
  std::string p = policy.getSymName().str();
  const int64_t dim = geometry.getHeadDim();
  // Rows spread over a power-of-two number of lanes, and the prefill tiles
  // of 32 keys and values fit the 48 KiB of static shared memory.
  if (dim != 32 && dim != 64 && dim != 128)
    return policy.emitOpError()
           << "head_dim " << dim
           << " is not supported by the cuda emitter: it needs 32, 64 or 128";
  FailureOr<DeviceStorage> storage = deviceStorage(policy, kernels);
  if (failed(storage))
    return failure();

  std::string constants = policyConstants(kernels, "cuda");
  bool merges = false;
  for (KernelOp kernel : kernels)
    for (Operation &op : kernel.getBody().front())
      merges |= isa<MergeNearestOp, MergeD2OOp, MergeCamOp>(op);

  AsmState asmState(policy);
  std::string source, header;
  llvm::raw_string_ostream src(source), hdr(header);

  hdr << headerOpening(policy, "cuda");
  hdr << "/// Fills the geometry and storage fields of a runtime configuration "
         "for\n/// this policy on a device pool (memory = KVC_MEMORY_DEVICE); "
         "the caller\n/// chooses page_size, num_pages and max_sequences.\n";
  hdr << "void kvc_" << p << "_cuda_configure(kvc_config_t *config);\n\n";

  src << sourceOpening(policy, kernels, "cuda");
  src << "\n"
      << "//\n"
      << "// On the device: attention, statistics, merge, selection and the "
         "stores of\n"
      << "// entries into pages. On the host: the runtime's bookkeeping (slot "
         "allocation,\n"
      << "// eviction, score state), staged through the workspace once per "
         "call.\n\n"
      << "#include \"kvc_" << p << "_cuda.h\"\n\n"
      << "#include \"runtime/kvc_cuda.cuh\"\n\n"
      << "namespace {\n"
      << geometryConstants(geometry)
      << "/// Row stride of prompt keys and values, in floats.\n"
      << "constexpr int64_t kKvStride = kKvHeads * kHeadDim;\n"
      << "/// 1 / sqrt(head_dim).\n"
      << "constexpr float kSoftmaxScale = "
      << floatLiteral("cuda", 1.0 / std::sqrt(double(geometry.getHeadDim())))
      << ";\n"
      << "/// Storage of keys and values in the device pages.\n"
      << "constexpr kvc_dtype_t kDtype = "
      << dtypeEnumerator(geometry.getDtype()) << ";\n"
      << "constexpr kvc_format_t kFormat = " << storage->format << ";\n"
      << (storage->kiviBits
              ? "/// KIVI: bits per code, group G (channels of a value group, "
                "tokens of a\n/// key block) and residual window R.\n"
                "constexpr int kKiviBits = " +
                    std::to_string(storage->kiviBits) +
                    ";\nconstexpr int kKiviGroup = " +
                    std::to_string(storage->kiviGroup) +
                    ";\nconstexpr int32_t kResidual = " +
                    std::to_string(storage->residual) +
                    ";\n/// Bytes of one packed key or value row.\n"
                    "constexpr uint64_t kRowBytes = kHeadDim * kKiviBits / "
                    "8;\n"
              : "constexpr kvc::cuda::Storage kStorage = " + storage->storage +
                    ";\n/// Bytes of one stored key or value row.\n"
                    "constexpr uint64_t kRowBytes = " +
                    std::to_string(storage->elementBytes) + " * kHeadDim;\n")
      << (storage->lowBits
              ? "/// Mixed precision: bits per code and channel group of the "
                "low page class,\n/// the bytes of one of its packed rows "
                "and of a slot's {scale, min} records (4 bytes each).\n"
                "constexpr int kLowBits = " +
                    std::to_string(storage->lowBits) +
                    ";\nconstexpr int kLowGroup = " +
                    std::to_string(storage->lowGroup) +
                    ";\nconstexpr uint64_t kLowRowBytes = kHeadDim * "
                    "kLowBits / 8;\n"
                    "constexpr uint64_t kLowRecordBytes = 4 * (kHeadDim / "
                    "kLowGroup);\n"
              : "")

      << "/// Decode splits: at most kMaxSplits per kv-head, each of at least\n"
      << "/// kMinSlotsPerSplit slots.\n"
      << "constexpr int32_t kMaxSplits = 64;\n"
      << "constexpr int32_t kMinSlotsPerSplit = 256;\n";

  // The kernels first, into their own text, so that the constants above
  // them name only what they use.
  std::string device;
  llvm::raw_string_ostream dev(device);
  std::string entries;
  llvm::raw_string_ostream host(entries);
  for (KernelOp kernel : kernels) {
    if (kernel.getKind() == KernelKind::select) {
      // Host code over the score state the prefill downloaded: the same
      // selection as the CPU backend's.
      if (failed(emitSelectKernel(policy, kernel, asmState, "cuda", host,
                                  hdr)))
        return failure();
      host << "\n";
      continue;
    }
    CudaKernelEmitter emitter(policy, kernel, asmState);
    emitter.kivi = storage->kiviBits != 0;
    emitter.mixed = storage->lowBits != 0;
    if (failed(emitter.emit(dev, host)))
      return failure();
    hdr << "/// Device workspace bytes of the entry point below.\n"
        << emitter.workspaceDeclaration() << ";\n";
    hdr << "/// " << emitter.documentation() << "\n"
        << emitter.declaration() << ";\n\n";
    if (isDecodeKernel(kernel))
      hdr << "/// Device workspace bytes of the batch entry point below, for "
             "`batch` sequences\n/// of at most `num_slots` slots per "
             "kv-head.\n"
          << emitter.batchWorkspaceDeclaration() << ";\n"
          << "/// " << emitter.batchDocumentation() << "\n"
          << emitter.batchDeclaration() << ";\n\n";
    if (emitter.graphable())
      hdr << "/// " << emitter.planDocumentation() << "\n"
          << emitter.planDeclaration() << ";\n"
          << "/// " << emitter.runDocumentation() << "\n"
          << emitter.runDeclaration() << ";\n"
          << "/// " << emitter.finishDocumentation() << "\n"
          << emitter.finishDeclaration() << ";\n\n";
  }
  if (usesWord(withoutStageTemplates(device), "kStageThreads") ||
      usesWord(entries, "kStageThreads"))
    src << "/// Threads of the per-kv-head stage kernels: a stage walks every "
           "slot\n"
        << "/// of its head, so a step of a small batch (one block per head) "
           "is\n"
        << "/// bound by how many loads one block keeps in flight.\n"
        << "constexpr int kStageThreads = 512;\n";
  src << (merges ? "/// Kept entries per block of the merge kernels (a warp "
                   "each).\nconstexpr int32_t kMergeWarps = kStageThreads / "
                   "32;\n"
                 : "")
      << constants << "\n"
      << device << "} // namespace\n\n"
      << "extern \"C\" {\n\n"
      << entries;
  src << "void kvc_" << p
      << "_cuda_configure(kvc_config_t *config) {\n"
      << "  if (!config)\n    return;\n"
      << "  config->num_layers = kLayers;\n"
      << "  config->num_q_heads = kQHeads;\n"
      << "  config->num_kv_heads = kKvHeads;\n"
      << "  config->head_dim = kHeadDim;\n"
      << "  config->dtype = kDtype;\n"
      << "  config->format = kFormat;\n"
      << (storage->kiviBits ? "  config->group_size = kKiviGroup;\n"
                              "  config->residual_length = kResidual;\n"
          : storage->lowBits  ? "  config->group_size = kLowGroup;\n"
                                "  config->residual_length = 0;\n"
                              : "  config->group_size = 0;\n"
                                "  config->residual_length = 0;\n")
      << "  config->low_format = "
      << (storage->lowBits ? "kLowFormat" : "KVC_FORMAT_FULL") << ";\n"

      << "  config->memory = KVC_MEMORY_DEVICE;\n"
      << "}\n\n"
      << "} // extern \"C\"\n";
  hdr << headerClosing(policy, "cuda");

  files.push_back({"kvc_" + p + "_cuda.h", header});
  files.push_back({"kvc_" + p + "_cuda.cu", source});
  return success();
}
