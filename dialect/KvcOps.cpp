//===- KvcOps.cpp - kvc operation verifiers -------------------------------===//
//
// Verification of kvc operations. ODS constraints check types and the
// presence of attributes; the verifiers here check ranges, relations between
// ops of a phase (pooling against its attention window, protected entries
// against the budget, merges against the statistics the phase produces) and,
// once a policy is bound to a model geometry, the model-dependent rules.
//
//===----------------------------------------------------------------------===//

#include "dialect/KvcOps.h"

#include "mlir/IR/Builders.h"
#include "mlir/IR/OpImplementation.h"
#include "llvm/ADT/STLExtras.h"
#include "llvm/ADT/SmallPtrSet.h"

using namespace mlir;
using namespace kvc;

#define GET_OP_CLASSES
#include "dialect/KvcOps.cpp.inc"

//===----------------------------------------------------------------------===//
// Helpers
//===----------------------------------------------------------------------===//

/// Calls `fn` on every op of the phase that `value` (transitively) derives
/// from, the defining op of `value` included.
static void forEachUpstreamOp(Value value,
                              llvm::function_ref<void(Operation *)> fn) {
  SmallVector<Value> worklist{value};
  llvm::SmallPtrSet<Operation *, 8> visited;
  while (!worklist.empty()) {
    Operation *def = worklist.pop_back_val().getDefiningOp();
    if (!def || !visited.insert(def).second)
      continue;
    fn(def);
    llvm::append_range(worklist, def->getOperands());
  }
}

/// True if `value` derives from an attention statistic.
static bool usesAttentionStatistic(Value value) {
  bool found = false;
  forEachUpstreamOp(value, [&](Operation *op) {
    if (isa<AttnWindowOp, AttnLastOp, AttnAccumulateOp, AttnPersistenceOp,
            ExpectedAttnOp>(op))
      found = true;
  });
  return found;
}

static bool inOpenUnitInterval(double x) { return x > 0.0 && x < 1.0; }
static bool inClosedUnitInterval(double x) { return x >= 0.0 && x <= 1.0; }

/// Precision rank of a format, used to order mixed-precision formats: full
/// precision ranks above every quantized format.
static unsigned precisionRank(FormatAttr format) {
  return format.isFull() ? 64 : format.getBits();
}

//===----------------------------------------------------------------------===//
// PolicyOp
//===----------------------------------------------------------------------===//

StorageOp PolicyOp::getStorage() {
  for (Operation &op : getBody().front())
    if (auto storage = dyn_cast<StorageOp>(op))
      return storage;
  return {};
}

/// Checks a quantization format against the head dimension of the model.
static LogicalResult verifyFormatAgainstGeometry(Operation *op,
                                                 StringRef role,
                                                 FormatAttr format,
                                                 GeometryAttr geometry) {
  if (format.getAxis() == QuantAxis::per_token && format.getGroup() > 0 &&
      geometry.getHeadDim() % format.getGroup() != 0)
    return op->emitOpError()
           << role << " group size " << format.getGroup()
           << " does not divide the head dimension " << geometry.getHeadDim();
  return success();
}

/// Checks that a per-(layer, kv-head) table matches the geometry.
static LogicalResult verifyTableShape(Operation *op, ElementsAttr table,
                                      GeometryAttr geometry) {
  auto type = cast<ShapedType>(table.getType());
  if (type.getShape() !=
      ArrayRef<int64_t>{geometry.getLayers(), geometry.getKvHeads()})
    return op->emitOpError()
           << "table of shape " << type << " does not match the geometry: "
           << "expected " << geometry.getLayers() << "x"
           << geometry.getKvHeads() << " (layers x kv_heads)";
  return success();
}

LogicalResult PolicyOp::verifyRegions() {
  StorageOp storage;
  SmallVector<PhaseOp> phases;
  for (Operation &op : getBody().front()) {
    if (auto phase = dyn_cast<PhaseOp>(op)) {
      for (PhaseOp other : phases)
        if (other.getTrigger() == phase.getTrigger())
          return phase.emitOpError()
                 << "duplicate '" << stringifyTrigger(phase.getTrigger())
                 << "' phase in policy @" << getSymName();
      phases.push_back(phase);
      continue;
    }
    if (auto decl = dyn_cast<StorageOp>(op)) {
      if (storage)
        return decl.emitOpError() << "policy @" << getSymName()
                                  << " declares its storage twice";
      storage = decl;
      continue;
    }
    if (isa<KernelOp>(op))
      continue;
    return op.emitOpError() << "is not allowed in a kvc.policy body; "
                               "expected kvc.phase or kvc.storage";
  }
  if (phases.empty() && !storage && getBody().front().empty())
    return emitOpError() << "policy @" << getSymName()
                         << " does nothing: it has no phase and no storage";

  GeometryAttr geometry = getGeometryAttr();
  if (!geometry)
    return success();

  // Rules that relate the policy to its model.
  if (storage &&
      (failed(verifyFormatAgainstGeometry(storage, "key", storage.getKey(),
                                          geometry)) ||
       failed(verifyFormatAgainstGeometry(storage, "value",
                                          storage.getValue(), geometry))))
    return failure();
  WalkResult result = walk([&](Operation *op) -> WalkResult {
    if (auto mixed = dyn_cast<MixedPrecisionOp>(op))
      if (failed(verifyFormatAgainstGeometry(mixed, "high", mixed.getHigh(),
                                             geometry)) ||
          failed(verifyFormatAgainstGeometry(mixed, "low", mixed.getLow(),
                                             geometry)))
        return WalkResult::interrupt();
    if (auto classes = dyn_cast<BudgetHeadClassesOp>(op))
      if (failed(verifyTableShape(classes, classes.getTable(), geometry)))
        return WalkResult::interrupt();
    if (auto weights = dyn_cast<BudgetHeadWeightsOp>(op))
      if (failed(verifyTableShape(weights, weights.getTable(), geometry)))
        return WalkResult::interrupt();
    return WalkResult::advance();
  });
  return failure(result.wasInterrupted());
}

//===----------------------------------------------------------------------===//
// PhaseOp
//===----------------------------------------------------------------------===//

LogicalResult PhaseOp::verify() {
  std::optional<int64_t> period = getPeriod();
  if (getTrigger() == Trigger::every_n) {
    if (!period)
      return emitOpError() << "'every_n' phase needs a period";
    if (*period <= 0)
      return emitOpError() << "period must be positive, got " << *period;
  } else if (period) {
    return emitOpError() << "only an 'every_n' phase takes a period";
  }
  return success();
}

LogicalResult PhaseOp::verifyRegions() {
  Operation *eviction = nullptr;
  for (Operation &op : getBody().front()) {
    if (isa<EvictOp, MergeNearestOp, MergeD2OOp, MergeCamOp,
            MergeAdjacentOp>(op)) {
      if (eviction) {
        InFlightDiagnostic diag =
            op.emitOpError() << "is the second eviction action of this phase";
        diag.attachNote(eviction->getLoc()) << "first eviction action here";
        return diag;
      }
      eviction = &op;
    }
    if (auto topk = dyn_cast<TopKOp>(op))
      if (topk->use_empty())
        return topk.emitOpError()
               << "selection is never applied; end the phase with kvc.evict "
                  "or a kvc.merge_* op";
  }
  return success();
}

//===----------------------------------------------------------------------===//
// Storage ops
//===----------------------------------------------------------------------===//

LogicalResult StorageOp::verify() {
  std::optional<int64_t> residual = getResidual();
  if (!residual)
    return success();
  if (*residual < 0)
    return emitOpError() << "residual window must not be negative, got "
                         << *residual;
  if (getKey().isFull() && getValue().isFull())
    return emitOpError()
           << "residual window needs a quantized key or value format";
  for (FormatAttr format : {getKey(), getValue()})
    if (format.getAxis() == QuantAxis::per_channel && format.getGroup() > 0 &&
        *residual % format.getGroup() != 0)
      return emitOpError() << "residual window " << *residual
                           << " is not a multiple of the per-channel group "
                           << format.getGroup();
  return success();
}

LogicalResult MixedPrecisionOp::verify() {
  if (!inOpenUnitInterval(getFraction().convertToDouble()))
    return emitOpError() << "fraction must be in (0, 1), got "
                         << getFraction().convertToDouble();
  if (precisionRank(getHigh()) <= precisionRank(getLow()))
    return emitOpError() << "high format must be more precise than the low "
                            "format";
  if (cast<ScoreType>(getScore().getType()).getGranularity() ==
      Granularity::query)
    return emitOpError() << "needs kv_head or layer scores; reduce query-head "
                            "scores with kvc.group_reduce first";
  return success();
}

//===----------------------------------------------------------------------===//
// Score ops
//===----------------------------------------------------------------------===//

LogicalResult AttnWindowOp::verify() {
  if (getSize() <= 0)
    return emitOpError() << "window size must be positive, got " << getSize();
  auto phase = dyn_cast<PhaseOp>((*this)->getParentOp());
  if (phase && getSize() > 1 && phase.getTrigger() == Trigger::every_step)
    return emitOpError()
           << "needs the last " << getSize()
           << " queries, which no 'every_step' phase retains; use "
              "kvc.attn_accumulate, kvc.attn_last or an 'every_n' phase";
  return success();
}

LogicalResult AttnAccumulateOp::verify() {
  double decay = getDecay().convertToDouble();
  if (!(decay > 0.0 && decay <= 1.0))
    return emitOpError() << "decay must be in (0, 1], got " << decay;
  if (std::optional<APFloat> t = getNoiseTemperature())
    if (!(t->convertToDouble() > 0.0))
      return emitOpError() << "noise temperature must be positive";
  if (std::optional<int64_t> lag = getLag())
    if (*lag <= 0)
      return emitOpError() << "lag must be positive, got " << *lag;
  return success();
}

LogicalResult AttnPersistenceOp::verify() {
  if (!inOpenUnitInterval(getThreshold().convertToDouble()))
    return emitOpError() << "threshold must be in (0, 1), got "
                         << getThreshold().convertToDouble();
  if (getHistory() <= 0 || getHistory() > 64)
    return emitOpError() << "history must be in [1, 64] steps, got "
                         << getHistory();
  if (getReduce() == ReduceKind::sum)
    return emitOpError() << "reduces the group with mean or max before the "
                            "threshold; a sum of weights is not a weight";
  return success();
}

LogicalResult GatherOp::verify() {
  bool anyMixed = getLow() || getRank() || getFraction();
  if (!anyMixed)
    return success();
  if (!getLow() || !getRank() || !getFraction())
    return emitOpError() << "mixed precision needs a low format, a rank "
                            "score and a fraction together";
  double fraction = getFraction()->convertToDouble();
  if (!inOpenUnitInterval(fraction))
    return emitOpError() << "fraction must be in (0, 1), got " << fraction;
  FormatAttr low = *getLow();
  if ((low.getKind() != FormatKind::int2 &&
       low.getKind() != FormatKind::int4) ||
      low.getAxis() != QuantAxis::per_token || low.getGroup() <= 0)
    return emitOpError() << "low format " << low
                         << " is not int2 or int4 per token in groups of "
                            "channels, the runtime's low page class";
  if (precisionRank(getKey()) <= precisionRank(low) ||
      precisionRank(getValue()) <= precisionRank(low))
    return emitOpError() << "low format must be less precise than the "
                            "storage formats";
  return success();
}

LogicalResult AttentionPassOp::verify() {
  const bool any = getPersistence() || getThreshold() || getPersistenceReduce();
  const bool all = getPersistence() && getThreshold() && getPersistenceReduce();
  if (any && !all)
    return emitOpError() << "persistence needs its history, threshold and "
                            "group reduction together";
  return success();
}

LogicalResult ExpectedAttnOp::verify() {
  if (getWindow() <= 0 || getHorizon() <= 0)
    return emitOpError() << "window and horizon must be positive";
  return success();
}

LogicalResult ValueNormOp::verify() {
  if (getP() != 1 && getP() != 2)
    return emitOpError() << "p must be 1 or 2, got " << getP();
  return success();
}

LogicalResult PoolOp::verify() {
  int64_t kernel = getKernel();
  if (kernel <= 0 || kernel % 2 == 0)
    return emitOpError() << "pooling kernel must be odd and positive, got "
                         << kernel;
  LogicalResult result = success();
  forEachUpstreamOp(getInput(), [&](Operation *op) {
    auto window = dyn_cast<AttnWindowOp>(op);
    if (!window || failed(result) || kernel <= window.getSize())
      return;
    InFlightDiagnostic diag = emitOpError()
                              << "pooling kernel " << kernel
                              << " is wider than the attention window "
                              << window.getSize();
    diag.attachNote(window.getLoc()) << "window defined here";
    result = diag;
  });
  return result;
}

LogicalResult ProtectOp::verify() {
  if (getSinks() < 0 || getRecent() < 0)
    return emitOpError() << "protected counts must not be negative";
  return success();
}

double CombineOp::getWeight(unsigned i) {
  std::optional<ArrayRef<double>> weights = getWeights();
  return weights ? (*weights)[i] : 1.0;
}

LogicalResult CombineOp::verify() {
  if (getInputs().empty())
    return emitOpError() << "needs at least one input";
  std::optional<ArrayRef<double>> weights = getWeights();
  if (!weights)
    return success();
  if (getKind() == CombineKind::product)
    return emitOpError() << "a product takes no weights";
  if (weights->size() != getInputs().size())
    return emitOpError() << "has " << getInputs().size() << " inputs but "
                         << weights->size() << " weights";
  return success();
}

LogicalResult LayerReduceOp::verify() {
  if (cast<ScoreType>(getInput().getType()).getGranularity() ==
      Granularity::layer)
    return emitOpError() << "input is already a layer score";
  return success();
}

//===----------------------------------------------------------------------===//
// Budget ops
//===----------------------------------------------------------------------===//

LogicalResult BudgetUniformOp::verify() {
  std::optional<int64_t> count = getCount();
  std::optional<APFloat> ratio = getRatio();
  if (count.has_value() == ratio.has_value())
    return emitOpError() << "needs exactly one of 'count' and 'ratio'";
  if (count && *count <= 0)
    return emitOpError() << "count must be positive, got " << *count;
  if (ratio && !inOpenUnitInterval(ratio->convertToDouble()))
    return emitOpError() << "ratio must be in (0, 1), got "
                         << ratio->convertToDouble();
  return success();
}

LogicalResult BudgetPyramidOp::verify() {
  if (getCapacity() <= 0 || getWindow() < 0)
    return emitOpError()
           << "capacity must be positive and window non-negative";
  if (getBeta() <= 0)
    return emitOpError() << "beta must be positive, got " << getBeta();
  if (getCapacity() <= getWindow())
    return emitOpError() << "capacity " << getCapacity()
                         << " must exceed the window it protects ("
                         << getWindow() << ")";
  return success();
}

LogicalResult BudgetAdaptiveOp::verify() {
  if (!inClosedUnitInterval(getAlpha().convertToDouble()))
    return emitOpError() << "alpha must be in [0, 1], got "
                         << getAlpha().convertToDouble();
  return success();
}

LogicalResult BudgetHeadClassesOp::verify() {
  auto type = cast<ShapedType>(getTable().getType());
  if (type.getRank() != 2)
    return emitOpError() << "table must have rank 2 (layers x kv_heads), got "
                         << type;
  for (const APInt &v : getTable().getValues<APInt>())
    if (!v.isZero() && !v.isOne())
      return emitOpError() << "table entries must be 0 (streaming) or 1 "
                              "(retrieval), got "
                           << v.getSExtValue();
  if (getSinks() < 0 || getRecent() < 0)
    return emitOpError() << "protected counts must not be negative";
  if (getSinks() + getRecent() == 0)
    return emitOpError() << "streaming heads must keep at least one entry";
  return success();
}

LogicalResult BudgetHeadWeightsOp::verify() {
  auto type = cast<ShapedType>(getTable().getType());
  if (type.getRank() != 2)
    return emitOpError() << "table must have rank 2 (layers x kv_heads), got "
                         << type;
  bool positive = false;
  for (const APFloat &v : getTable().getValues<APFloat>()) {
    if (v.isNegative() || v.isNaN())
      return emitOpError() << "table weights must be non-negative";
    positive |= !v.isZero();
  }
  if (!positive)
    return emitOpError() << "table weights must not all be zero";
  return success();
}

LogicalResult BudgetCakeOp::verify() {
  if (!(getTau1().convertToDouble() > 0.0) ||
      !(getTau2().convertToDouble() > 0.0))
    return emitOpError() << "temperatures tau1 and tau2 must be positive";
  return success();
}

//===----------------------------------------------------------------------===//
// Select and merge
//===----------------------------------------------------------------------===//

LogicalResult TopKOp::verify() {
  if (cast<ScoreType>(getScore().getType()).getGranularity() ==
      Granularity::query)
    return emitOpError() << "needs kv_head or layer scores; reduce query-head "
                            "scores with kvc.group_reduce first";
  auto uniform = getBudget().getDefiningOp<BudgetUniformOp>();
  if (!uniform || !uniform.getCount())
    return success();
  int64_t count = *uniform.getCount();
  LogicalResult result = success();
  forEachUpstreamOp(getScore(), [&](Operation *op) {
    auto protect = dyn_cast<ProtectOp>(op);
    if (!protect || failed(result) || protect.getProtectedCount() <= count)
      return;
    InFlightDiagnostic diag = emitOpError()
                              << "protects " << protect.getProtectedCount()
                              << " entries but the budget keeps only "
                              << count;
    diag.attachNote(protect.getLoc()) << "protected entries defined here";
    result = diag;
  });
  return result;
}

LogicalResult MergeD2OOp::verify() {
  if (!inClosedUnitInterval(getAlpha().convertToDouble()) ||
      !inClosedUnitInterval(getBeta().convertToDouble()))
    return emitOpError() << "alpha and beta must be in [0, 1]";
  return success();
}

LogicalResult MergeCamOp::verify() {
  if (getSpan() <= 0)
    return emitOpError() << "span must be positive, got " << getSpan();
  auto topk = getSelection().getDefiningOp<TopKOp>();
  if (topk && !usesAttentionStatistic(topk.getScore()))
    return emitOpError() << "needs attention statistics, but the scores of "
                            "this phase use none";
  return success();
}

LogicalResult MergeAdjacentOp::verify() {
  double threshold = getThreshold().convertToDouble();
  if (!(threshold >= -1.0 && threshold <= 1.0))
    return emitOpError() << "similarity threshold must be in [-1, 1], got "
                         << threshold;
  if (!(getSigma().convertToDouble() > 0.0))
    return emitOpError() << "sigma must be positive";
  return success();
}
