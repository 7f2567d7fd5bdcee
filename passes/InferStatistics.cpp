//===- InferStatistics.cpp - annotate phases with their statistics --------===//
//
// Makes the statistics plan visible in the IR: every phase gets a
// `statistics` array saying what it reads, which kernel produces it and
// whether it lives on as per-entry state between steps.
//
//===----------------------------------------------------------------------===//

#include "passes/Passes.h"
#include "passes/Statistics.h"

#include "mlir/IR/Builders.h"

namespace kvc {
#define GEN_PASS_DEF_KVCINFERSTATISTICSPASS
#include "passes/Passes.h.inc"
} // namespace kvc

using namespace mlir;
using namespace kvc;

namespace {

/// The kernels that run a phase with this trigger.
StringRef producers(Trigger trigger) {
  switch (trigger) {
  case Trigger::after_prefill:
    return "prefill";
  case Trigger::over_budget:
    return "prefill+decode";
  case Trigger::every_step:
  case Trigger::every_n:
    return "decode";
  }
  llvm_unreachable("unknown trigger");
}

struct InferStatisticsPass final
    : kvc::impl::KvcInferStatisticsPassBase<InferStatisticsPass> {
  void runOnOperation() override {
    WalkResult result = getOperation().walk([&](PhaseOp phase) {
      FailureOr<PhaseStatistics> stats = analyzePhase(phase);
      if (failed(stats))
        return WalkResult::interrupt();
      phase->setAttr("statistics", describe(phase, *stats));
      return WalkResult::advance();
    });
    if (result.wasInterrupted())
      signalPassFailure();
  }

  ArrayAttr describe(PhaseOp phase, const PhaseStatistics &stats) {
    Builder b(&getContext());
    StringRef kernel = producers(phase.getTrigger());
    SmallVector<Attribute> entries;
    auto add = [&](StringRef name, StringRef granularity, bool state,
                   ArrayRef<NamedAttribute> extra) {
      SmallVector<NamedAttribute> fields{
          b.getNamedAttr("name", b.getStringAttr(name)),
          b.getNamedAttr("kernel", b.getStringAttr(kernel)),
          b.getNamedAttr("granularity", b.getStringAttr(granularity)),
          b.getNamedAttr("state", b.getBoolAttr(state))};
      llvm::append_range(fields, extra);
      entries.push_back(b.getDictionaryAttr(fields));
    };
    // A periodic phase sums its window into each entry's score state.
    if (stats.window)
      add("attention.window", "query",
          phase.getTrigger() == Trigger::every_n,
          {b.getNamedAttr("queries", b.getI64IntegerAttr(*stats.window))});
    if (stats.last)
      add("attention.last", "query", false, {});
    if (stats.decay)
      add("attention.accumulated", "kv_head", true,
          {b.getNamedAttr("decay", b.getF64FloatAttr(*stats.decay)),
           b.getNamedAttr("reduce", b.getStringAttr(stringifyReduceKind(
                                        stats.stateReduce))),
           b.getNamedAttr("visible_normalized",
                          b.getBoolAttr(stats.visibleNormalized))});
    if (stats.persistence)
      add("attention.persistence", "kv_head", true,
          {b.getNamedAttr("history",
                          b.getI64IntegerAttr(stats.persistence->history)),
           b.getNamedAttr("threshold",
                          b.getF64FloatAttr(stats.persistence->threshold)),
           b.getNamedAttr("reduce",
                          b.getStringAttr(stringifyReduceKind(
                              stats.persistence->reduce)))});
    if (stats.keyNorm)
      add("key.norm", "kv_head", false, {});
    if (stats.keyDiversity)
      add("key.diversity", "kv_head", false, {});
    for (int64_t p : stats.valueNormP)
      add("value.norm", "kv_head", false,
          {b.getNamedAttr("p", b.getI64IntegerAttr(p))});
    if (stats.recency)
      add("entry.position", "kv_head", false, {});
    return b.getArrayAttr(entries);
  }
};

} // namespace
