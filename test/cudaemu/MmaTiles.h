//===- MmaTiles.h - The arithmetic of the emulated mma.sync -----*- C++ -*-===//
//
// The sums of kvc::emu::formMmaTiles (kvc_cuda_emu.h), which checks its
// arguments and then calls sumMmaTiles. MmaTiles.cpp is compiled once, at
// -O3 without the sanitizers and for the host's widest vectors, into both
// emulator libraries: the emulated prefill spends most of its time here,
// on the emulator's own exchange words, which the checked caller bounds.
//
//===----------------------------------------------------------------------===//

#ifndef KVC_TEST_CUDAEMU_MMATILES_H
#define KVC_TEST_CUDAEMU_MMATILES_H

#include <cstdint>

namespace kvc::emu {

/// formMmaTiles' tiles from `words`, the arguments already checked.
void sumMmaTiles(const uint64_t *words, int accumulators, int products,
                 int halves, float *tiles);

} // namespace kvc::emu

#endif // KVC_TEST_CUDAEMU_MMATILES_H
