//===- OverridesFacts.cu - Kernel choices as one translation unit sees them -===//
//
// Defines defaultFacts() or, compiled with KVC_TEST_OVERRIDDEN and the
// build-time overrides of runtime/kvc_cuda.cuh, overriddenFacts().
//
//===----------------------------------------------------------------------===//

#include "runtime/kvc_cuda.cuh"
#include "test/cudaemu/OverridesFacts.h"

namespace kvc::test {

#ifdef KVC_TEST_OVERRIDDEN
KernelFacts overriddenFacts() {
#else
KernelFacts defaultFacts() {
#endif
  using namespace kvc::cuda;
  constexpr int kThreads = 128;
  using Kivi = KiviMma<4, 128, 2, 32, KVC_DTYPE_F16, kThreads>;
  constexpr int64_t kL2 = int64_t{50} << 20;
  return {MmaDecode<4, 128, Storage::F16, kThreads>::kApplies, Kivi::kApplies,
          Kivi::kMinBlocks,
          reinterpret_cast<const void *>(
              &decodeAttentionSplit<4, 128, Storage::F16, kThreads>),
          reinterpret_cast<const void *>(
              &decodeAttentionKivi<4, 128, 2, 32, KVC_DTYPE_F16, kThreads>),
          kPrefillTensorCores, kPrefillQueryTile,
          reinterpret_cast<const void *>(&prefillAttention<4, 128>),
          kEvictFirst,
          planFold<4>(planSplits(32769, 64, 256, 64, 0), 64, 32769, 132)
              .blocks,
          planSplits(4096, 64, 256, 64, 924).splits, kIssueAhead,
          kDependentLaunch, kFoldAhead,
          firstPasses<4, kFoldThreads>(SlotRange{0, 32769}).last,
          MmaDecode<4, 128, Storage::F16, kThreads>::kSharedQuery,
          DecodeMinBlocks<4, 128, Storage::F16, kThreads, 0>,
          MmaDecode<4, 128, Storage::F16, kThreads>::kTransposedValues,
          Kivi::kTransposedValues, kDiscardLogits, kLogitsEvictLast,
          {logitsKeepFraction(int64_t{64} * 4 * 32768 * 4, kL2),
           logitsKeepFraction(int64_t{1} << 20, kL2),
           logitsKeepFraction(int64_t{1} << 40, kL2)},
          kFoldInGrid,
          planGridFold(SplitPlan{64, 513}, 64, 32769, 528, nullptr).ranges,
          planGridFold(SplitPlan{64, 513}, 64, 32769, 528, nullptr)
              .slotsPerRange,
          planGridFold(SplitPlan{64, 513}, 64, 32769, 528, nullptr).lag,
          KiviTiles<1, 128, 2, 32, KVC_DTYPE_F16, kThreads>::kMinBlocks};
}

} // namespace kvc::test
