//===- OverridesTest.cu - Build-time overrides link beside the defaults ----===//
//
// runtime/kvc_cuda.cuh's KVC_CUDA_TENSOR_CORES and KVC_CUDA_KIVI_MMA_BLOCKS
// (docs/codegen-cuda.md, "Build-time overrides"): a translation unit built
// with them selects the CUDA-core decodes and no KIVI launch bounds, one
// built without them the tensor-core decodes and four blocks per SM, and
// when both link into one program (as kvc-bench-gpu's kernel alternatives
// do) each keeps its own kernels: the same instantiation in the two is two
// functions, not one that the linker picked. Exits 1 on a difference.
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
