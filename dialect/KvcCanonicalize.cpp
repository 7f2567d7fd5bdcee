//===- KvcCanonicalize.cpp - kvc folds and canonicalization ---------------===//
//
// Folds that remove score transforms which change nothing, and the
// flattening of nested weighted sums, so that later passes see each policy in
// one canonical form whatever way it was written.
//
//===----------------------------------------------------------------------===//

#include "dialect/KvcOps.h"

#include "mlir/IR/PatternMatch.h"

using namespace mlir;
using namespace kvc;

/// Pooling with a kernel of one is the identity.
OpFoldResult PoolOp::fold(FoldAdaptor) {
  if (getKernel() == 1)
    return getInput();
  return {};
}

/// Every normalization is idempotent.
OpFoldResult NormalizeOp::fold(FoldAdaptor) {
  if (auto inner = getInput().getDefiningOp<NormalizeOp>())
    if (inner.getKind() == getKind())
      return getInput();
  return {};
}

/// Protecting nothing is the identity.
OpFoldResult ProtectOp::fold(FoldAdaptor) {
  if (getSinks() == 0 && getRecent() == 0)
    return getInput();
  return {};
}

/// A sum or product of one input with unit weight is that input.
OpFoldResult CombineOp::fold(FoldAdaptor) {
  if (getInputs().size() == 1 && getWeight(0) == 1.0)
    return getInputs().front();
  return {};
}

namespace {
/// Inlines a weighted sum used as an input of another weighted sum:
/// sum(a * sum(b * x, c * y), d * z) -> sum(a*b * x, a*c * y, d * z).
struct FlattenNestedSum final : OpRewritePattern<CombineOp> {
  using OpRewritePattern::OpRewritePattern;

  LogicalResult matchAndRewrite(CombineOp op,
                                PatternRewriter &rewriter) const override {
    if (op.getKind() != CombineKind::sum)
      return failure();
    SmallVector<Value> inputs;
    SmallVector<double> weights;
    bool changed = false;
    for (auto [i, input] : llvm::enumerate(op.getInputs())) {
      auto inner = input.getDefiningOp<CombineOp>();
      if (!inner || inner.getKind() != CombineKind::sum) {
        inputs.push_back(input);
        weights.push_back(op.getWeight(i));
        continue;
      }
      changed = true;
      for (auto [j, innerInput] : llvm::enumerate(inner.getInputs())) {
        inputs.push_back(innerInput);
        weights.push_back(op.getWeight(i) * inner.getWeight(j));
      }
    }
    if (!changed)
      return failure();
    rewriter.replaceOpWithNewOp<CombineOp>(
        op, op.getType(), inputs, CombineKind::sum,
        rewriter.getDenseF64ArrayAttr(weights));
    return success();
  }
};
} // namespace

void CombineOp::getCanonicalizationPatterns(RewritePatternSet &results,
                                            MLIRContext *context) {
  results.add<FlattenNestedSum>(context);
}
