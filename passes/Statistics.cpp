//===- Statistics.cpp - what a phase needs from attention -----------------===//

#include "passes/Statistics.h"

using namespace mlir;
using namespace kvc;

bool kvc::runsAtPrefill(Trigger trigger) {
  return trigger == Trigger::after_prefill || trigger == Trigger::over_budget;
}

bool kvc::runsAtDecode(Trigger trigger) {
  return trigger != Trigger::after_prefill;
}

FailureOr<PhaseStatistics> kvc::analyzePhase(PhaseOp phase) {
  PhaseStatistics stats;
  const bool decode = runsAtDecode(phase.getTrigger());
  for (Operation &op : phase.getBody().front()) {
    if (auto window = dyn_cast<AttnWindowOp>(op)) {
      // A periodic phase observes its window over the decode steps that
      // end each period.
      const bool periodic = phase.getTrigger() == Trigger::every_n;
      if (periodic && window.getSize() > *phase.getPeriod())
        return window.emitOpError()
               << "needs a window of " << window.getSize()
               << " decode queries, more than the period of "
               << *phase.getPeriod() << " steps between compressions";
      if (periodic && window.getVisibleNormalized())
        return window.emitOpError()
               << "cannot divide by the queries that saw an entry in a "
                  "periodic phase: the window is kept as a running sum";
      if (decode && !periodic && window.getSize() > 1)
        return window.emitOpError()
               << "needs a window of " << window.getSize()
               << " queries, but a '" << stringifyTrigger(phase.getTrigger())
               << "' phase also runs at decode, where only the current query "
                  "is seen";
      if (stats.window && *stats.window != window.getSize())
        return window.emitOpError()
               << "reads a window of " << window.getSize()
               << " queries, but this phase already reads one of "
               << *stats.window << "; a kernel computes one window";
      stats.window = window.getSize();
      continue;
    }
    if (isa<AttnLastOp>(op)) {
      stats.last = true;
      continue;
    }
    if (auto acc = dyn_cast<AttnAccumulateOp>(op)) {
      double decay = acc.getDecay().convertToDouble();
      if (stats.decay && *stats.decay != decay)
        return acc.emitOpError() << "a phase keeps one accumulated state; "
                                    "this one already decays by "
                                 << *stats.decay;
      // The runtime keeps one score per entry and kv-head, so the group
      // reduction must commute with the decayed sum.
      for (Operation *user : acc->getUsers()) {
        auto reduce = dyn_cast<GroupReduceOp>(user);
        if (!reduce || reduce.getKind() == ReduceKind::max)
          return acc.emitOpError()
                 << "accumulated attention must be reduced over its GQA "
                    "group with mean or sum before any other use: the state "
                    "kept with each entry is per kv-head";
        stats.stateReduce = reduce.getKind();
      }
      if (acc.getNoiseTemperature() || acc.getLag())
        stats.unsupported.push_back(acc);
      stats.decay = decay;
      stats.visibleNormalized = acc.getVisibleNormalized();
      continue;
    }
    if (isa<KeyNormOp>(op)) {
      stats.keyNorm = true;
      continue;
    }
    if (isa<KeyDiversityOp>(op)) {
      stats.keyDiversity = true;
      continue;
    }
    if (isa<RecencyOp>(op)) {
      stats.recency = true;
      continue;
    }
    if (auto norm = dyn_cast<ValueNormOp>(op)) {
      if (!llvm::is_contained(stats.valueNormP, norm.getP()))
        stats.valueNormP.push_back(norm.getP());
      continue;
    }
    if (auto persistence = dyn_cast<AttnPersistenceOp>(op)) {
      PhaseStatistics::Persistence p{
          persistence.getHistory(),
          persistence.getThreshold().convertToDouble(),
          persistence.getReduce()};
      if (stats.persistence &&
          (stats.persistence->history != p.history ||
           stats.persistence->threshold != p.threshold ||
           stats.persistence->reduce != p.reduce))
        return persistence.emitOpError()
               << "a phase keeps one history of importance bits; this one "
                  "already records "
               << stats.persistence->history << " steps";
      stats.persistence = p;
      continue;
    }
    if (isa<ExpectedAttnOp>(op))
      stats.unsupported.push_back(&op);
  }
  return stats;
}
