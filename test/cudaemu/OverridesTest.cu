//===- OverridesTest.cu - Build-time overrides link beside the defaults ----===//
//
// runtime/kvc_cuda.cuh's KVC_CUDA_TENSOR_CORES, KVC_CUDA_KIVI_MMA_BLOCKS,
// KVC_CUDA_PREFILL_MMA, KVC_CUDA_EVICT_FIRST, KVC_CUDA_FOLD_PLAN,
// KVC_CUDA_SPLIT_PLAN, KVC_CUDA_ISSUE_AHEAD, KVC_CUDA_DEPENDENT_LAUNCH,
// KVC_CUDA_FOLD_AHEAD, KVC_CUDA_MMA_SHARED_QUERY,
// KVC_CUDA_MMA_TRANSPOSED_VALUES, KVC_CUDA_DISCARD_LOGITS,
// KVC_CUDA_LOGITS_EVICT_LAST, KVC_CUDA_FOLD_IN_GRID and
// KVC_CUDA_KIVI_TILE_BLOCKS (docs/codegen-cuda.md, "Build-time overrides"):
// a translation unit built with them selects the CUDA-core decodes, no KIVI
// launch bounds, the CUDA-core prefill attention (16-query tiles), the
// default L2 policy for the cache's reads, a fold block per attention split,
// splits by length, a staged tile's copies after the wait, ordinary launches,
// a fold that asks L2 for its first pass only, the query fragments in
// registers, the weights as A of the value sums, a fold that leaves its
// logits in L2, the statistics folded in the attention grid and launch
// bounds for nine blocks of the CUDA-core KIVI decode at G = 1; one built
// without them the tensor-core decodes, four KIVI blocks per SM, the
// tensor-core prefill attention (64-query tiles), the evict-first policy,
// planFold's fold blocks, splits by waves, copies issued ahead, dependent
// launches, a fold that asks for its passes two ahead, the query fragments in
// shared memory, the values as A at G <= 4 (launch bounds for five blocks at
// head dim 128), a fold that drops its logits from L2, a fold kernel after
// the attention and no launch bounds for the CUDA-core KIVI decode; and when
// both link into one program (as kvc-bench-gpu's kernel alternatives do)
// each keeps its own kernels: the same instantiation in the two is two
// functions, not one that the linker picked.
// Exits 1 on a difference.
//
//===----------------------------------------------------------------------===//

#include "test/cudaemu/OverridesFacts.h"

#include <cstdio>

int main() {
  using kvc::test::KernelFacts;
  const KernelFacts shipped = kvc::test::defaultFacts();
  const KernelFacts overridden = kvc::test::overriddenFacts();
  int failures = 0;
  auto expect = [&](bool ok, const char *what) {
    if (!ok) {
      std::printf("FAIL: %s\n", what);
      ++failures;
    }
  };
  expect(shipped.tensorCoreDecode && shipped.tensorCoreKivi,
         "the defaults take tensor cores at G = 4");
  expect(shipped.kiviMinBlocks == 4,
         "the defaults bound the KIVI decode to 4 blocks of 128 threads");
  expect(!overridden.tensorCoreDecode && !overridden.tensorCoreKivi,
         "KVC_CUDA_TENSOR_CORES=0 takes the CUDA-core decodes");
  expect(overridden.kiviMinBlocks == 0,
         "KVC_CUDA_KIVI_MMA_BLOCKS=0 leaves the KIVI decode unbounded");
  expect(shipped.tensorCorePrefill && shipped.prefillQueryTile == 64,
         "the defaults run prefill attention on tensor cores, 64 queries a "
         "block");
  expect(!overridden.tensorCorePrefill && overridden.prefillQueryTile == 16,
         "KVC_CUDA_PREFILL_MMA=0 runs prefill attention on CUDA cores, 16 "
         "queries a block");
  expect(shipped.evictFirst,
         "the defaults stream the 16-bit decodes' cache reads (evict first)");
  expect(!overridden.evictFirst,
         "KVC_CUDA_EVICT_FIRST=0 reads the cache under the default policy");
  expect(shipped.foldBlocks == 8,
         "the defaults fold 64 heads of 32k slots in 8 blocks a head");
  expect(overridden.foldBlocks == 64,
         "KVC_CUDA_FOLD_PLAN=0 folds in a block per attention split");
  expect(shipped.splits == 14,
         "the defaults split 64 heads of 4096 slots 14 ways where 924 "
         "blocks fit the device at once");
  expect(overridden.splits == 16,
         "KVC_CUDA_SPLIT_PLAN=0 splits by length (16 splits of 256)");
  expect(shipped.issueAhead,
         "the defaults issue a staged decode's next tile before the wait");
  expect(!overridden.issueAhead,
         "KVC_CUDA_ISSUE_AHEAD=0 issues the next tile after the wait");
  expect(shipped.dependentLaunch,
         "the defaults launch a decode step's attention and fold kernels as "
         "programmatic dependents");
  expect(!overridden.dependentLaunch,
         "KVC_CUDA_DEPENDENT_LAUNCH=0 launches them as ordinary kernels");
  expect(shipped.foldAhead == 2 && shipped.firstPassesEnd == 1024,
         "the defaults' fold asks L2 for its passes two ahead, and first "
         "for two passes (1,024 slots at G = 4)");
  expect(overridden.foldAhead == 0 && overridden.firstPassesEnd == 512,
         "KVC_CUDA_FOLD_AHEAD=0's fold asks L2 for its first pass only "
         "(512 slots at G = 4)");
  expect(shipped.sharedQuery && shipped.mmaMinBlocks == 5,
         "the defaults' tensor-core decode at head dim 128 reads its query "
         "fragments from shared memory and asks for five blocks per SM");
  expect(shipped.transposedValues && shipped.kiviTransposedValues,
         "the defaults' tensor-core decodes at G = 4, head dim 128 take the "
         "values (the codes' units) as A of the value sums");
  expect(!overridden.transposedValues && !overridden.kiviTransposedValues,
         "KVC_CUDA_MMA_TRANSPOSED_VALUES=0 keeps the weights as A");
  expect(shipped.discardLogits,
         "the defaults' fold blocks drop their logits' lines from L2");
  expect(!overridden.discardLogits,
         "KVC_CUDA_DISCARD_LOGITS=0 leaves the logits' lines in L2");
  expect(shipped.logitsEvictLast && shipped.logitsKeep[0] == 0.78125f,
         "the defaults' attention keeps 25 MiB of 32 MiB of logits "
         "evict-last under a 50 MiB L2 (0.78125)");
  expect(shipped.logitsKeep[1] == 1.0f && shipped.logitsKeep[2] == 0.0f,
         "all of 1 MiB of logits are kept, none of 1 TiB (under a "
         "sixteenth)");
  expect(!overridden.logitsEvictLast && overridden.logitsKeep[0] == 0.0f &&
             overridden.logitsKeep[1] == 0.0f,
         "KVC_CUDA_LOGITS_EVICT_LAST=0 stores the logits with the default "
         "policy");
  expect(!shipped.foldInGrid,
         "the defaults fold a decode's statistics in a kernel after the "
         "attention");
  expect(overridden.foldInGrid,
         "KVC_CUDA_FOLD_IN_GRID=1 folds them in the attention grid");
  expect(shipped.gridRanges == 61 && shipped.gridRangeSlots == 544 &&
             shipped.gridLag == 10,
         "64 heads of 32769 slots in 64 splits, 528 blocks at once: 61 fold "
         "ranges of 544 slots a head (513 rounded up to whole lines), folded "
         "10 heads behind (the 9 heads of a wave, plus one)");
  expect(shipped.kiviTileMinBlocks == 0,
         "the defaults leave the CUDA-core KIVI decode's registers at G = 1 "
         "to ptxas");
  expect(overridden.kiviTileMinBlocks == 9,
         "KVC_CUDA_KIVI_TILE_BLOCKS=9 bounds it to 9 blocks of 128 threads");
  expect(!overridden.sharedQuery && overridden.mmaMinBlocks == 0,
         "KVC_CUDA_MMA_SHARED_QUERY=0 keeps the query fragments in "
         "registers, with no launch bounds");
  expect(shipped.prefillKernel != overridden.prefillKernel,
         "prefillAttention of the overridden build is its own function");
  expect(shipped.splitKernel != overridden.splitKernel,
         "decodeAttentionSplit of the overridden build is its own function");
  expect(shipped.kiviKernel != overridden.kiviKernel,
         "decodeAttentionKivi of the overridden build is its own function");
  if (failures)
    return 1;
  std::printf("PASS: build-time overrides (2 builds of kvc_cuda.cuh in one "
              "program)\n");
  return 0;
}
