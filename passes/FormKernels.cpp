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

  /// Clones the body of `phase` at the builder's insertion point.
  void clonePhaseBody(OpBuilder &b, PhaseOp phase) {
    IRMapping mapping;
    for (Operation &op : phase.getBody().front())
      b.clone(op, mapping);
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
      GatherOp::create(b, storageLoc, keyFormat, valueFormat, residual);
    };
    auto append = [&] {
      AppendOp::create(b, storageLoc, keyFormat, valueFormat, residual);
    };

    // Prefill.
    if (!*prefillPhase || !unfused) {
      createKernel(b, policy, KernelKind::prefill, *prefillPhase);
      buildAttentionPass(b, loc, /*output=*/true,
                         prefillStats ? &*prefillStats : nullptr);
      if (*prefillPhase)
        clonePhaseBody(b, *prefillPhase);
      gather();
    } else {
      createKernel(b, policy, KernelKind::prefill, PhaseOp());
      buildAttentionPass(b, loc, /*output=*/true, nullptr);
      createKernel(b, policy, KernelKind::prefill_scoring, *prefillPhase);
      buildAttentionPass(b, loc, /*output=*/false, &*prefillStats);
      clonePhaseBody(b, *prefillPhase);
      gather();
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
