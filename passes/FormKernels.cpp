//===- FormKernels.cpp - decide kernel boundaries -------------------------===//
//
// Every specialized policy compiles into a prefill kernel and a decode
// kernel. Fusion means that the pass over keys and values that computes
// attention also produces every statistic the phase reads, and that
// selection, gather and append happen in the same kernel; the unfused
// pipeline keeps attention alone and recomputes the weights in a separate
// scoring kernel, for comparison.
//
//===----------------------------------------------------------------------===//

#include "passes/Passes.h"
#include "passes/Statistics.h"

#include "mlir/IR/Builders.h"
#include "mlir/IR/IRMapping.h"

namespace kvc {
#define GEN_PASS_DEF_KVCFORMKERNELSPASS
#include "passes/Passes.h.inc"
} // namespace kvc

using namespace mlir;
using namespace kvc;

namespace {

struct FormKernelsPass final
    : kvc::impl::KvcFormKernelsPassBase<FormKernelsPass> {
  using Base::Base;

  void runOnOperation() override {
    for (PolicyOp policy : getOperation().getOps<PolicyOp>())
      if (failed(formKernels(policy)))
        return signalPassFailure();
  }

  /// Picks the one phase of `policy` that runs at prefill (or at decode).
  FailureOr<PhaseOp> pickPhase(PolicyOp policy, bool decode) {
    PhaseOp picked;
    for (auto phase : policy.getBody().front().getOps<PhaseOp>()) {
      bool runs = decode ? runsAtDecode(phase.getTrigger())
                         : runsAtPrefill(phase.getTrigger());
      if (!runs)
        continue;
      if (picked) {
        InFlightDiagnostic diag =
            phase.emitOpError()
            << "is the second phase that runs at "
            << (decode ? "decode" : "prefill") << "; a kernel runs one phase";
        diag.attachNote(picked.getLoc()) << "first phase here";
        return diag;
      }
      picked = phase;
    }
    return picked;
  }

  /// Adds a kvc.attention_pass producing `stats` (and the output if asked).
  void buildAttentionPass(OpBuilder &b, Location loc, bool output,
                          const PhaseStatistics *stats) {
    auto pass = AttentionPassOp::create(b, loc, UnitAttr(), IntegerAttr(),
                                        UnitAttr(), FloatAttr(),
                                        ReduceKindAttr(), UnitAttr(),
                                        IntegerAttr(), FloatAttr(),
                                        ReduceKindAttr());
    if (output)
      pass.setOutput(true);
    if (!stats)
      return;
    if (stats->window)
      pass.setWindow(*stats->window);
    if (stats->last)
      pass.setLast(true);
    if (stats->decay) {
      pass.setAccumulateAttr(b.getF64FloatAttr(*stats->decay));
      pass.setReduce(stats->stateReduce);
      if (stats->visibleNormalized)
        pass.setVisibleNormalized(true);
    }
    if (stats->persistence) {
      pass.setPersistence(stats->persistence->history);
      pass.setThresholdAttr(b.getF64FloatAttr(stats->persistence->threshold));
      pass.setPersistenceReduce(stats->persistence->reduce);
    }
  }

  /// Creates an empty kernel at the end of the policy body.
  KernelOp createKernel(OpBuilder &b, PolicyOp policy, KernelKind kind,
                        PhaseOp phase) {
    b.setInsertionPointToEnd(&policy.getBody().front());
    auto kernel = KernelOp::create(b, policy.getLoc(), kind, TriggerAttr(),
                                   IntegerAttr());
    if (phase) {
      kernel.setTrigger(phase.getTrigger());
      if (std::optional<int64_t> period = phase.getPeriod())
        kernel.setPeriod(*period);
    }
    kernel.getBody().emplaceBlock();
    b.setInsertionPointToStart(&kernel.getBody().front());
    return kernel;
  }

  /// Clones the body of `phase` at the builder's insertion point, except
  /// the ops in `skip`.
  void clonePhaseBody(OpBuilder &b, PhaseOp phase, IRMapping &mapping,
                      ArrayRef<Operation *> skip = {}) {
    for (Operation &op : phase.getBody().front())
      if (!llvm::is_contained(skip, &op))
        b.clone(op, mapping);
  }
  void clonePhaseBody(OpBuilder &b, PhaseOp phase) {
    IRMapping mapping;
    clonePhaseBody(b, phase, mapping);
  }

  /// A global budget (kvc.budget_global) selects over every layer's scores,
  /// so its phase splits in two: the prefill kernel scores and stores the
  /// score with every entry (kvc.gather ... state), and a `select` kernel
  /// runs the selection once every layer is prefilled.
  struct GlobalSplit {
    BudgetGlobalOp global;
    TopKOp topk;
    EvictOp evict;
    /// Ops of the phase that move to the select kernel.
    SmallVector<Operation *> moved;
  };
  FailureOr<std::optional<GlobalSplit>> findGlobalSplit(PhaseOp phase) {
    auto globals = phase.getBody().front().getOps<BudgetGlobalOp>();
    if (globals.empty())
      return std::optional<GlobalSplit>();
    GlobalSplit split;
    split.global = *globals.begin();
    if (phase.getTrigger() != Trigger::after_prefill)
      return split.global.emitOpError()
             << "selects across layers, which a kernel can do once every "
                "layer is prefilled; it needs an 'after_prefill' phase, not '"
             << stringifyTrigger(phase.getTrigger()) << "'";
    for (Operation *user : split.global->getUsers())
      if (auto topk = dyn_cast<TopKOp>(user))
        split.topk = topk;
    if (!split.topk)
      return split.global.emitOpError() << "is not the budget of a kvc.topk";
    for (Operation *user : split.topk->getUsers())
      if (auto evict = dyn_cast<EvictOp>(user))
        split.evict = evict;
    if (!split.evict || split.topk.getScore() != split.global.getScore())
      return split.global.emitOpError()
             << "a global selection must rank by the score its budget reads "
                "and evict what it does not keep";
    Operation *base = split.global.getBase().getDefiningOp();
    if (!base || !base->hasOneUse() || base->getNumOperands() != 0)
      return split.global.emitOpError()
             << "needs a base budget of its own (a count or a ratio)";
    split.moved = {base, split.global, split.topk, split.evict};
    return std::optional<GlobalSplit>(split);
  }

  /// The kvc.mixed_precision of the prefill phase, checked: formats are
  /// assigned once, when the prompt is gathered, the high format is the
  /// storage format that every other entry uses, and the low one is the
  /// runtime's low page class.
  FailureOr<MixedPrecisionOp> findMixedPrecision(PolicyOp policy,
                                                 PhaseOp prefill,
                                                 FormatAttr keyFormat,
                                                 FormatAttr valueFormat) {
    MixedPrecisionOp found;
    WalkResult walk = policy.walk([&](MixedPrecisionOp op) {
      auto phase = dyn_cast<PhaseOp>(op->getParentOp());
      if (!phase || phase != prefill ||
          phase.getTrigger() != Trigger::after_prefill) {
        op.emitOpError()
            << "assigns formats when the prompt is gathered; it needs the "
               "'after_prefill' phase"
            << (phase ? ", not '" + stringifyTrigger(phase.getTrigger()).str() +
                            "'"
                      : std::string())
            << " (entries are not re-encoded during decode)";
        return WalkResult::interrupt();
      }
      if (found) {
        op.emitOpError() << "a phase assigns formats once";
        return WalkResult::interrupt();
      }
      found = op;
      return WalkResult::advance();
    });
    if (walk.wasInterrupted())
      return failure();
    if (!found)
      return found;
    if (found.getHigh() != keyFormat || found.getHigh() != valueFormat)
      return found.emitOpError()
             << "high format " << found.getHigh()
             << " must be the storage format of keys and values ("
             << keyFormat << " / " << valueFormat
             << "), which new entries use";
    FormatAttr low = found.getLow();
    if ((low.getKind() != FormatKind::int2 &&
         low.getKind() != FormatKind::int4) ||
        low.getAxis() != QuantAxis::per_token || low.getGroup() <= 0)
      return found.emitOpError()
             << "low format " << low
             << " has no runtime page class; the low class is int2 or int4 "
                "per token in groups of channels";
    if (!isa<ScoreType>(found.getScore().getType()) ||
        cast<ScoreType>(found.getScore().getType()).getGranularity() !=
            Granularity::kv_head)
      return found.emitOpError() << "ranks the entries of each kv-head; it "
                                    "needs kv_head scores";
    return found;
  }

  LogicalResult formKernels(PolicyOp policy) {
    if (!policy.getGeometryAttr())
      return policy.emitOpError()
             << "is not specialized to a model; run kvc-specialize first";
    FailureOr<PhaseOp> prefillPhase = pickPhase(policy, /*decode=*/false);
    FailureOr<PhaseOp> decodePhase = pickPhase(policy, /*decode=*/true);
    if (failed(prefillPhase) || failed(decodePhase))
      return failure();
    std::optional<PhaseStatistics> prefillStats, decodeStats;
    if (*prefillPhase) {
      FailureOr<PhaseStatistics> s = analyzePhase(*prefillPhase);
      if (failed(s))
        return failure();
      prefillStats = *s;
    }
    if (*decodePhase) {
      FailureOr<PhaseStatistics> s = analyzePhase(*decodePhase);
      if (failed(s))
        return failure();
      decodeStats = *s;
    }

    MLIRContext *ctx = policy.getContext();
    FormatAttr keyFormat = FormatAttr::get(ctx, FormatKind::full,
                                           QuantAxis::none, 0);
    FormatAttr valueFormat = keyFormat;
    IntegerAttr residual;
    if (StorageOp storage = policy.getStorage()) {
      keyFormat = storage.getKey();
      valueFormat = storage.getValue();
      residual = storage.getResidualAttr();
    }

    OpBuilder b(ctx);
    Location loc = policy.getLoc();
    // Entries are written where the storage was declared.
    Location storageLoc =
        policy.getStorage() ? policy.getStorage().getLoc() : loc;
    auto gather = [&] {
      GatherOp::create(b, storageLoc, keyFormat, valueFormat, residual, Value(),
                       FormatAttr(), Value(), FloatAttr());
    };
    auto append = [&] {
      AppendOp::create(b, storageLoc, keyFormat, valueFormat, residual);
    };

    // Prefill.
    std::optional<GlobalSplit> split;
    if (*prefillPhase) {
      FailureOr<std::optional<GlobalSplit>> found =
          findGlobalSplit(*prefillPhase);
      if (failed(found))
        return failure();
      split = *found;
    }
    FailureOr<MixedPrecisionOp> mixed = findMixedPrecision(
        policy, *prefillPhase, keyFormat, valueFormat);
    if (failed(mixed))
      return failure();
    if (*mixed && split)
      return mixed->emitOpError()
             << "cannot be combined with a global budget, whose selection "
                "runs after the prompt is gathered";
    // The prefill phase's stages, and the gather that ends them.
    auto phaseAndGather = [&] {
      IRMapping mapping;
      if (*mixed) {
        // The formats are assigned where the kept entries are written.
        clonePhaseBody(b, *prefillPhase, mapping, {mixed->getOperation()});
        GatherOp::create(b, mixed->getLoc(), keyFormat, valueFormat, residual,
                         Value(), mixed->getLowAttr(),
                         mapping.lookup(mixed->getScore()),
                         mixed->getFractionAttr());
        return;
      }
      if (!split) {
        clonePhaseBody(b, *prefillPhase);
        gather();
        return;
      }
      clonePhaseBody(b, *prefillPhase, mapping, split->moved);
      GatherOp::create(b, storageLoc, keyFormat, valueFormat, residual,
                       mapping.lookup(split->global.getScore()), FormatAttr(),
                       Value(), FloatAttr());
    };
    if (!*prefillPhase || !unfused) {
      createKernel(b, policy, KernelKind::prefill, *prefillPhase);
      buildAttentionPass(b, loc, /*output=*/true,
                         prefillStats ? &*prefillStats : nullptr);
      if (*prefillPhase)
        phaseAndGather();
      else
        gather();
    } else {
      createKernel(b, policy, KernelKind::prefill, PhaseOp());
      buildAttentionPass(b, loc, /*output=*/true, nullptr);
      createKernel(b, policy, KernelKind::prefill_scoring, *prefillPhase);
      buildAttentionPass(b, loc, /*output=*/false, &*prefillStats);
      phaseAndGather();
    }
    if (split) {
      // The selection over every layer, from the stored scores.
      createKernel(b, policy, KernelKind::select, *prefillPhase);
      IRMapping mapping;
      auto state = ScoreStateOp::create(b, split->global.getLoc());
      mapping.map(split->global.getScore(), state.getResult());
      for (Operation *op : split->moved)
        b.clone(*op, mapping);
    }

    // Decode.
    if (!*decodePhase || !unfused) {
      createKernel(b, policy, KernelKind::decode, *decodePhase);
      append();
      buildAttentionPass(b, loc, /*output=*/true,
                         decodeStats ? &*decodeStats : nullptr);
      if (*decodePhase)
        clonePhaseBody(b, *decodePhase);
    } else {
      createKernel(b, policy, KernelKind::decode, PhaseOp());
      append();
      buildAttentionPass(b, loc, /*output=*/true, nullptr);
      createKernel(b, policy, KernelKind::decode_scoring, *decodePhase);
      buildAttentionPass(b, loc, /*output=*/false, &*decodeStats);
      clonePhaseBody(b, *decodePhase);
    }

    // The phases now live in the kernels.
    for (PhaseOp phase :
         llvm::make_early_inc_range(policy.getBody().front().getOps<PhaseOp>()))
      phase.erase();
    return success();
  }
};

} // namespace
