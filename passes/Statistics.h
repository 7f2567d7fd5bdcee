//===- Statistics.h - what a phase needs from attention ---------*- C++ -*-===//
//
// The analysis shared by kvc-infer-statistics and kvc-form-kernels: which
// attention statistics and key/value features a phase reads, and whether the
// kernels can produce them.
//
//===----------------------------------------------------------------------===//

#ifndef KVC_PASSES_STATISTICS_H
#define KVC_PASSES_STATISTICS_H

#include "dialect/KvcOps.h"

#include "mlir/Support/LLVM.h"

#include <optional>

namespace kvc {

using mlir::FailureOr;
using mlir::Operation;
using llvm::SmallVector;

/// The statistics one phase reads.
struct PhaseStatistics {
  /// Queries of the attention window (kvc.attn_window).
  std::optional<int64_t> window;
  /// Probabilities of the last query (kvc.attn_last).
  bool last = false;
  /// Decay of the accumulated attention (kvc.attn_accumulate).
  std::optional<double> decay;
  /// Whether the accumulated attention is divided by its number of
  /// observers.
  bool visibleNormalized = false;
  /// Group reduction folded into the accumulated per-entry state.
  ReduceKind stateReduce = ReduceKind::mean;
  /// Per-step importance bits (kvc.attn_persistence): the steps kept, the
  /// weight threshold and how the GQA group is reduced before it.
  struct Persistence {
    int64_t history;
    double threshold;
    ReduceKind reduce;
  };
  std::optional<Persistence> persistence;
  /// Key and value features.
  bool keyNorm = false, keyDiversity = false, recency = false;
  SmallVector<int64_t, 2> valueNormP;
  /// Statistics no emitter produces yet (the phase can still be verified
  /// and printed).
  SmallVector<Operation *> unsupported;

  /// True if the phase needs the attention weights at all.
  bool needsAttention() const {
    return window || last || decay || persistence;
  }
};

/// Whether a trigger runs at prefill and at decode.
bool runsAtPrefill(Trigger trigger);
bool runsAtDecode(Trigger trigger);

/// Analyzes one phase; emits a located error and fails when a statistic
/// cannot be produced by the kernels the phase's trigger implies.
FailureOr<PhaseStatistics> analyzePhase(PhaseOp phase);

} // namespace kvc

#endif // KVC_PASSES_STATISTICS_H
