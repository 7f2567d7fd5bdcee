//===- OverridesFacts.h - Kernel choices as one translation unit sees them -===//
//
// OverridesFacts.cu reports, through these functions, which decode paths
// runtime/kvc_cuda.cuh selects and where three of its kernel instantiations
// live. test/cudaemu/CMakeLists.txt compiles it twice, with the defaults
// and with the fifteen build-time overrides, and OverridesTest.cu links the
// two.
//
//===----------------------------------------------------------------------===//

#ifndef KVC_TEST_CUDAEMU_OVERRIDESFACTS_H
#define KVC_TEST_CUDAEMU_OVERRIDESFACTS_H

namespace kvc::test {

struct KernelFacts {
  /// MmaDecode::kApplies and KiviMma::kApplies at G = 4, head dim 128
  /// (f16; int2 in key blocks of 32), KiviMma::kMinBlocks there.
  bool tensorCoreDecode, tensorCoreKivi;
  int kiviMinBlocks;
  /// The addresses of decodeAttentionSplit and decodeAttentionKivi of that
  /// geometry in this translation unit.
  const void *splitKernel, *kiviKernel;
  /// kPrefillTensorCores, kPrefillQueryTile and the address of
  /// prefillAttention at G = 4, head dim 128.
  bool tensorCorePrefill;
  int prefillQueryTile;
  const void *prefillKernel;
  /// kEvictFirst: whether the 16-bit decodes read the cache under an L2
  /// evict-first policy.
  bool evictFirst;
  /// The fold blocks planFold gives a head at G = 4, 64 heads of 32769
  /// slots on 132 SMs (64 splits of 513).
  int foldBlocks;
  /// The attention splits planSplits gives 64 heads of 4096 slots on a
  /// device that holds 924 blocks at once (16 splits by length).
  int splits;
  /// kIssueAhead: whether a staged decode issues its next tile's copies
  /// before it waits for the current tile's.
  bool issueAhead;
  /// kDependentLaunch: whether a decode step's attention and fold kernels
  /// may be launched as programmatic dependents (launchDependent).
  bool dependentLaunch;
  /// kFoldAhead: the passes of slots the fold asks L2 for ahead of its
  /// loads; the end of firstPasses at G = 4 over slots [0, 32769).
  int foldAhead, firstPassesEnd;
  /// MmaDecode::kSharedQuery at G = 4, head dim 128 (f16), and the blocks
  /// per SM that decodeAttentionSplit's launch bounds ask for there.
  bool sharedQuery;
  int mmaMinBlocks;
  /// MmaDecode::kTransposedValues and KiviMma::kTransposedValues there:
  /// whether the value sums take the values (the codes' units) as A.
  bool transposedValues, kiviTransposedValues;
  /// kDiscardLogits: whether a decode fold block drops its logits' lines
  /// from L2 once it has read them (discardRowLines).
  bool discardLogits;
  /// kLogitsEvictLast: whether the decode attention stores a share of its
  /// logits evict-last in L2; logitsKeepFraction of 64 heads x G = 4 x
  /// 32768 logits (32 MiB), of 1 MiB and of 1 TiB under a 50 MiB L2.
  bool logitsEvictLast;
  float logitsKeep[3];
  /// kFoldInGrid: whether a decode with statistics folds them in its
  /// attention grid (decodeAttentionFold); and planGridFold's ranges,
  /// range slots and lag for 64 heads of 32769 slots in 64 splits, 528
  /// blocks at once.
  bool foldInGrid;
  int32_t gridRanges, gridRangeSlots, gridLag;
  /// KiviTiles::kMinBlocks at G = 1, head dim 128 (int2 in key blocks of
  /// 32): the blocks per SM that the CUDA-core KIVI decode's launch bounds
  /// ask for.
  int kiviTileMinBlocks;
};

KernelFacts defaultFacts();
KernelFacts overriddenFacts();

} // namespace kvc::test

#endif // KVC_TEST_CUDAEMU_OVERRIDESFACTS_H
