//===- kvc_cuda.cuh - CUDA building blocks of generated kernels -*- CUDA -*-===//
//
// Header-only device building blocks and host helpers that the CUDA emitter
// composes into policy kernels (codegen/CudaEmitter.cpp). The generated code
// folds the policy constants and the geometry into template arguments; the
// loops live here, written once.
//
// Division of labour (see docs/codegen-cuda.md):
//  - The runtime's bookkeeping (page tables, free lists, positions, score
//    state) lives on the host. Decode keeps a device copy of the slot
//    tables of every (sequence, layer) between steps (DeviceTables: page
//    addresses, positions, score state, importance bits, a KIVI head's
//    per-slot window words), writes into it only what a step's appends and
//    the last step's evictions changed, and never waits for its kernels;
//    the runtime evicts a step's victims before the layer's next step.
//    Prefill reads the prompt tensors and hands its kept lists to the host.
//  - Keys and values only ever move on the device: storeEntries writes new,
//    gathered or merged entries into their pages (encoding f16/bf16/f32,
//    int8 or fp8 in registers), decodeAttentionSplit reads them once per
//    step. Merges of evicted prompt entries (mergeTargets, mergeRows,
//    mergeCamRows) run on the device too, with kvc_cpu.h's arithmetic.
//  - Mixed precision (a context with a low_format): the prefill gather
//    ranks the kept entries on the device (markHighPrecision), the host
//    appends each class through the runtime, storeEntries and
//    storeLowEntries write the two classes, and decodeAttentionSplit's
//    mixed instantiation reads a low page's grouped int2/int4 rows where
//    DeviceTables tagged its address (kLowPageTag).
//
// Layouts: prompt tensors are float32, row-major [token][head][channel];
// a score buffer of a kv-head holds one float per entry (prompt index in
// prefill, slot in decode); the G query-head rows of a group are G buffers
// `stride` floats apart. Free slots read as -infinity wherever a score is.
//
// Every __device__ block function below is called by all threads of a block
// of kThreads threads and ends with __syncthreads(), so the next stage sees
// its global-memory writes.
//
// Not part of the C ABI: generated .cu files include it, engines need not.
//
//===----------------------------------------------------------------------===//

#ifndef KVC_RUNTIME_KVC_CUDA_CUH
#define KVC_RUNTIME_KVC_CUDA_CUH

#include "runtime/kvc_prefill.h"
#include "runtime/kvc_rules.h"
#include "runtime/kvc_runtime.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <atomic>
#include <map>
#include <memory>
#include <mutex>
#include <new>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

// Build-time overrides of fifteen kernel choices, for side-by-side
// measurement (kvc-bench-gpu's alternatives table, docs/performance.md);
// generated libraries are built with the defaults, which are what kvc
// ships. Define before including this header (a -D flag of the library's
// compilation):
//  - KVC_CUDA_TENSOR_CORES (default 1): 0 sends the decodes that take
//    mma.sync (16-bit storage and KIVI at 2 <= G <= 8) to their CUDA-core
//    paths (decodeStagedRows or the register path; decodeKiviTiles).
//  - KVC_CUDA_KIVI_MMA_BLOCKS (default 4): blocks of 128 threads per SM
//    that the launch bounds of the tensor-core KIVI decode ask for
//    (KiviMma::kMinBlocks); 0 leaves its registers to ptxas.
//  - KVC_CUDA_KIVI_TILE_BLOCKS (default 0): blocks of 128 threads per SM
//    that the launch bounds of the CUDA-core KIVI decode ask for at G <= 2
//    (KiviTiles::kMinBlocks: decodeKiviTiles, the path of one query head
//    per kv-head); 0 leaves its registers to ptxas (64 at int2 and int4,
//    head dim 128: eight blocks).
//  - KVC_CUDA_PREFILL_MMA (default 1): prefill attention and the prefill
//    statistics run on tensor cores (prefillAttentionMma,
//    prefillColumnStatsMma: float operands split into two bf16 parts); 0
//    runs them on CUDA cores (prefillAttentionTiles,
//    prefillColumnStatsTiles).
//  - KVC_CUDA_EVICT_FIRST (default 1): the 16-bit decodes read the cache's
//    rows (and a mixed-precision cache's low codes) with an L2
//    evict-first policy (streamPolicy), so that the step's small outputs
//    (logits, split records, score state) outlast them in L2 until the
//    fold and the merge read them; 0 reads them with the default policy.
//  - KVC_CUDA_FOLD_PLAN (default 1): the decode fold kernel runs as many
//    blocks as fill the device once, each over whole passes of slots
//    (planFold); 0 runs one block per attention split, as many as the
//    attention kernel has.
//  - KVC_CUDA_SPLIT_PLAN (default 1): the decode attention's splits are
//    counted against whole waves of the blocks the device holds at once
//    (planSplits); 0 counts them from the longest head's length alone.
//  - KVC_CUDA_ISSUE_AHEAD (default 1): a staged decode (decodeMmaRows,
//    decodeStagedRows) issues the copies of its next tile before it waits
//    for the tile it is about to read, so that all of its stages are in
//    flight while it waits (nextStagedTile), and a KIVI tile walk
//    (decodeKiviTiles, decodeKiviMma) copies the positions and KIVI words
//    of its next tile into shared memory as it enters a tile
//    (KiviTileWalk); 0 issues the staged copies after the wait, one stage
//    fewer in flight and one barrier a tile fewer, and loads a KIVI tile's
//    words when it enters it.
//  - KVC_CUDA_DEPENDENT_LAUNCH (default 1): a decode step's attention and
//    fold kernels are launched as programmatic dependents of the kernel
//    before them in the stream where the device and the kernel's code allow
//    it (launchDependent: compute capability 9.0 or above, code compiled for
//    it), so that their launch and their blocks' start overlap the end of
//    that kernel; 0 launches them after it, as every other kernel.
//  - KVC_CUDA_FOLD_AHEAD (default 2): passes of slots that the decode fold
//    asks L2 for ahead of its loads (kFoldAhead: the fold kernel asks for
//    its first passes, foldSlots for the pass that many later while it
//    loads one), 1 to 4; 0 asks for the first pass only, as before.
//  - KVC_CUDA_MMA_SHARED_QUERY (default 1): the 16-bit tensor-core decode
//    (decodeMmaRows) at head dim 128 and above reads its query fragments
//    from shared memory, which every warp of the block shares, so that
//    four blocks of 128 threads fit an SM at head dim 128 (128
//    registers, launch bounds); 0 keeps them in each thread's registers
//    (158 to 162 at head dim 128: three blocks).
//  - KVC_CUDA_MMA_TRANSPOSED_VALUES (default 1): the tensor-core decodes
//    at G <= 4 (decodeMmaRows; decodeKiviMma at head dim 128 and above)
//    and at G > 4 (both; the heads as B's columns) sum their values
//    as O^T += V^T P^T, the value rows (or the KIVI codes' units) as A and
//    the weights as B, half the accumulators (and at G <= 4 16 channels an
//    mma), so that decodeMmaRows fits five blocks of 128 threads an SM at
//    head dim 128 (92 registers, launch bounds); 0 keeps the weights as A
//    (8 channels an mma; four blocks).
//  - KVC_CUDA_DISCARD_LOGITS (default 1): once a decode fold block has
//    read its range of the attention's logits, it drops their lines from
//    L2 without a write to device memory (discardRowLines), since nothing
//    reads them again, and so does the last kernel of a step that reads
//    the fold's probabilities (kvc.attn_last) with theirs; 0 leaves them to
//    be written back as L2 evicts them.
//  - KVC_CUDA_LOGITS_EVICT_LAST (default 1): where the fold discards them,
//    the decode attention stores its logits under an L2 evict-last policy
//    for as large a share of them as half of L2 holds (logitPolicy), so
//    that the kernel's stream of cache lines evicts them last and the fold
//    reads them from L2 and drops them unwritten; 0 stores them with the
//    default policy.
//  - KVC_CUDA_FOLD_IN_GRID (default 0): a decode with statistics folds
//    them in its attention grid (decodeAttentionFold: each block folds a
//    range of a head that ended about a wave of blocks before its own,
//    while the other blocks stream the cache), not in a fold kernel after
//    the whole grid; 1 takes it (docs/codegen-cuda.md, "The fold in the
//    attention grid"). KIVI storage keeps the fold kernel either way.
#ifndef KVC_CUDA_TENSOR_CORES
#define KVC_CUDA_TENSOR_CORES 1
#endif
#ifndef KVC_CUDA_KIVI_MMA_BLOCKS
#define KVC_CUDA_KIVI_MMA_BLOCKS 4
#endif
#ifndef KVC_CUDA_KIVI_TILE_BLOCKS
#define KVC_CUDA_KIVI_TILE_BLOCKS 0
#endif
#ifndef KVC_CUDA_PREFILL_MMA
#define KVC_CUDA_PREFILL_MMA 1
#endif
#ifndef KVC_CUDA_EVICT_FIRST
#define KVC_CUDA_EVICT_FIRST 1
#endif
#ifndef KVC_CUDA_FOLD_PLAN
#define KVC_CUDA_FOLD_PLAN 1
#endif
#ifndef KVC_CUDA_SPLIT_PLAN
#define KVC_CUDA_SPLIT_PLAN 1
#endif
#ifndef KVC_CUDA_ISSUE_AHEAD
#define KVC_CUDA_ISSUE_AHEAD 1
#endif
#ifndef KVC_CUDA_DEPENDENT_LAUNCH
#define KVC_CUDA_DEPENDENT_LAUNCH 1
#endif
#ifndef KVC_CUDA_FOLD_AHEAD
#define KVC_CUDA_FOLD_AHEAD 2
#endif
#ifndef KVC_CUDA_MMA_SHARED_QUERY
#define KVC_CUDA_MMA_SHARED_QUERY 1
#endif
#ifndef KVC_CUDA_MMA_TRANSPOSED_VALUES
#define KVC_CUDA_MMA_TRANSPOSED_VALUES 1
#endif
#ifndef KVC_CUDA_DISCARD_LOGITS
#define KVC_CUDA_DISCARD_LOGITS 1
#endif
#ifndef KVC_CUDA_LOGITS_EVICT_LAST
#define KVC_CUDA_LOGITS_EVICT_LAST 1
#endif
#ifndef KVC_CUDA_FOLD_IN_GRID
#define KVC_CUDA_FOLD_IN_GRID 0
#endif
#if KVC_CUDA_TENSOR_CORES != 0 && KVC_CUDA_TENSOR_CORES != 1
#error "KVC_CUDA_TENSOR_CORES must be 0 or 1"
#endif
#if KVC_CUDA_KIVI_MMA_BLOCKS < 0 || KVC_CUDA_KIVI_MMA_BLOCKS > 16
#error "KVC_CUDA_KIVI_MMA_BLOCKS must be 0 to 16"
#endif
#if KVC_CUDA_KIVI_TILE_BLOCKS < 0 || KVC_CUDA_KIVI_TILE_BLOCKS > 16
#error "KVC_CUDA_KIVI_TILE_BLOCKS must be 0 to 16"
#endif
#if KVC_CUDA_PREFILL_MMA != 0 && KVC_CUDA_PREFILL_MMA != 1
#error "KVC_CUDA_PREFILL_MMA must be 0 or 1"
#endif
#if KVC_CUDA_EVICT_FIRST != 0 && KVC_CUDA_EVICT_FIRST != 1
#error "KVC_CUDA_EVICT_FIRST must be 0 or 1"
#endif
#if KVC_CUDA_FOLD_PLAN != 0 && KVC_CUDA_FOLD_PLAN != 1
#error "KVC_CUDA_FOLD_PLAN must be 0 or 1"
#endif
#if KVC_CUDA_SPLIT_PLAN != 0 && KVC_CUDA_SPLIT_PLAN != 1
#error "KVC_CUDA_SPLIT_PLAN must be 0 or 1"
#endif
#if KVC_CUDA_ISSUE_AHEAD != 0 && KVC_CUDA_ISSUE_AHEAD != 1
#error "KVC_CUDA_ISSUE_AHEAD must be 0 or 1"
#endif
#if KVC_CUDA_DEPENDENT_LAUNCH != 0 && KVC_CUDA_DEPENDENT_LAUNCH != 1
#error "KVC_CUDA_DEPENDENT_LAUNCH must be 0 or 1"
#endif
#if KVC_CUDA_FOLD_AHEAD < 0 || KVC_CUDA_FOLD_AHEAD > 4
#error "KVC_CUDA_FOLD_AHEAD must be 0 to 4"
#endif
#if KVC_CUDA_MMA_SHARED_QUERY != 0 && KVC_CUDA_MMA_SHARED_QUERY != 1
#error "KVC_CUDA_MMA_SHARED_QUERY must be 0 or 1"
#endif
#if KVC_CUDA_MMA_TRANSPOSED_VALUES != 0 && KVC_CUDA_MMA_TRANSPOSED_VALUES != 1
#error "KVC_CUDA_MMA_TRANSPOSED_VALUES must be 0 or 1"
#endif
#if KVC_CUDA_DISCARD_LOGITS != 0 && KVC_CUDA_DISCARD_LOGITS != 1
#error "KVC_CUDA_DISCARD_LOGITS must be 0 or 1"
#endif
#if KVC_CUDA_LOGITS_EVICT_LAST != 0 && KVC_CUDA_LOGITS_EVICT_LAST != 1
#error "KVC_CUDA_LOGITS_EVICT_LAST must be 0 or 1"
#endif
#if KVC_CUDA_FOLD_IN_GRID != 0 && KVC_CUDA_FOLD_IN_GRID != 1
#error "KVC_CUDA_FOLD_IN_GRID must be 0 or 1"
#endif
// A build with overrides puts every entity of kvc::cuda into an inline
// namespace named after them, so that its kernels and block functions are
// other symbols than the defaults' when both link into one program (a
// benchmark timing both side by side): a kernel instantiation means one
// body per program.
#if KVC_CUDA_TENSOR_CORES != 1 || KVC_CUDA_KIVI_MMA_BLOCKS != 4 ||             \
    KVC_CUDA_PREFILL_MMA != 1 || KVC_CUDA_EVICT_FIRST != 1 ||                  \
    KVC_CUDA_FOLD_PLAN != 1 || KVC_CUDA_SPLIT_PLAN != 1 ||                     \
    KVC_CUDA_ISSUE_AHEAD != 1 || KVC_CUDA_DEPENDENT_LAUNCH != 1 ||             \
    KVC_CUDA_FOLD_AHEAD != 2 || KVC_CUDA_MMA_SHARED_QUERY != 1 ||              \
    KVC_CUDA_MMA_TRANSPOSED_VALUES != 1 || KVC_CUDA_DISCARD_LOGITS != 1 ||     \
    KVC_CUDA_LOGITS_EVICT_LAST != 1 || KVC_CUDA_FOLD_IN_GRID != 0 ||           \
    KVC_CUDA_KIVI_TILE_BLOCKS != 0
#define KVC_CUDA_OVERRIDES_NAME2(tc, blocks, prefill, evict, fold, split,      \
                                 ahead, pdl, foldahead, sq, tv, discard, last, \
                                 grid, tiles)                                  \
  overrides_tc##tc##_blocks##blocks##_prefill##prefill##_evict##evict##_fold## \
      fold##_split##split##_ahead##ahead##_pdl##pdl##_foldahead##foldahead##   \
      _sq##sq##_tv##tv##_discard##discard##_last##last##_grid##grid##_tiles##  \
      tiles
#define KVC_CUDA_OVERRIDES_NAME(tc, blocks, prefill, evict, fold, split,       \
                                ahead, pdl, foldahead, sq, tv, discard, last,  \
                                grid, tiles)                                   \
  KVC_CUDA_OVERRIDES_NAME2(tc, blocks, prefill, evict, fold, split, ahead,     \
                           pdl, foldahead, sq, tv, discard, last, grid, tiles)
#define KVC_CUDA_OVERRIDES_BEGIN                                               \
  inline namespace KVC_CUDA_OVERRIDES_NAME(                                    \
      KVC_CUDA_TENSOR_CORES, KVC_CUDA_KIVI_MMA_BLOCKS, KVC_CUDA_PREFILL_MMA,   \
      KVC_CUDA_EVICT_FIRST, KVC_CUDA_FOLD_PLAN, KVC_CUDA_SPLIT_PLAN,           \
      KVC_CUDA_ISSUE_AHEAD, KVC_CUDA_DEPENDENT_LAUNCH, KVC_CUDA_FOLD_AHEAD,    \
      KVC_CUDA_MMA_SHARED_QUERY, KVC_CUDA_MMA_TRANSPOSED_VALUES,               \
      KVC_CUDA_DISCARD_LOGITS, KVC_CUDA_LOGITS_EVICT_LAST,                     \
      KVC_CUDA_FOLD_IN_GRID, KVC_CUDA_KIVI_TILE_BLOCKS) {
#define KVC_CUDA_OVERRIDES_END }
#else
#define KVC_CUDA_OVERRIDES_BEGIN
#define KVC_CUDA_OVERRIDES_END
#endif

namespace kvc::cuda {
KVC_CUDA_OVERRIDES_BEGIN

/// Whether the decodes may take tensor cores (KVC_CUDA_TENSOR_CORES).
constexpr bool kTensorCores = KVC_CUDA_TENSOR_CORES != 0;
/// Whether prefill attention takes tensor cores (KVC_CUDA_PREFILL_MMA).
constexpr bool kPrefillTensorCores = KVC_CUDA_PREFILL_MMA != 0;
/// Whether the decodes stream the cache with an L2 evict-first policy
/// (KVC_CUDA_EVICT_FIRST, streamPolicy).
constexpr bool kEvictFirst = KVC_CUDA_EVICT_FIRST != 0;
/// Whether a decode fold block drops its logits' lines from L2 once it
/// has read them (KVC_CUDA_DISCARD_LOGITS, discardRowLines).
constexpr bool kDiscardLogits = KVC_CUDA_DISCARD_LOGITS != 0;
/// Whether the decode attention stores a share of its logits under an L2
/// evict-last policy (KVC_CUDA_LOGITS_EVICT_LAST, logitPolicy): only where
/// the fold discards them, so that no line of that policy outlives the
/// step in L2.
constexpr bool kLogitsEvictLast =
    KVC_CUDA_LOGITS_EVICT_LAST != 0 && kDiscardLogits;
/// Whether a staged decode issues its next tile's copies before it waits
/// for the current tile's (KVC_CUDA_ISSUE_AHEAD, nextStagedTile), and a
/// KIVI tile walk copies its next tile's words ahead (KiviTileWalk).
constexpr bool kIssueAhead = KVC_CUDA_ISSUE_AHEAD != 0;
/// Whether a decode step's attention and fold kernels may start before the
/// kernel ahead of them ends (KVC_CUDA_DEPENDENT_LAUNCH, launchDependent).
constexpr bool kDependentLaunch = KVC_CUDA_DEPENDENT_LAUNCH != 0;
/// Whether the 16-bit tensor-core decode at head dim 128 and above reads
/// its query fragments from shared memory (KVC_CUDA_MMA_SHARED_QUERY,
/// MmaDecode::kSharedQuery).
constexpr bool kMmaSharedQuery = KVC_CUDA_MMA_SHARED_QUERY != 0;
/// Whether the tensor-core decodes at G <= 4 sum their values as O^T +=
/// V^T P^T (KVC_CUDA_MMA_TRANSPOSED_VALUES, MmaDecode::kTransposedValues,
/// KiviMma::kTransposedValues).
constexpr bool kMmaTransposedValues = KVC_CUDA_MMA_TRANSPOSED_VALUES != 0;

constexpr float kNegInf = -__builtin_huge_valf();
constexpr float kPosInf = __builtin_huge_valf();
constexpr int kWarpSize = 32;
constexpr unsigned kFullMask = 0xffffffffu;

/// Returns from the enclosing function when a runtime call fails.
#define KVC_CUDA_TRY(...)                                                      \
  do {                                                                         \
    kvc_status_t kvc_cuda_status_ = (__VA_ARGS__);                             \
    if (kvc_cuda_status_ != KVC_STATUS_OK)                                     \
      return kvc_cuda_status_;                                                 \
  } while (0)

/// Returns a kvc status naming `name` when a CUDA call fails.
#define KVC_CUDA_CHECK(name, ...)                                              \
  do {                                                                         \
    cudaError_t kvc_cuda_error_ = (__VA_ARGS__);                               \
    if (kvc_cuda_error_ != cudaSuccess)                                        \
      return ::kvc::cuda::reportCudaError(name, kvc_cuda_error_);              \
  } while (0)

/// Records a CUDA failure as the calling thread's kvc error.
inline kvc_status_t reportCudaError(const char *name, cudaError_t error) {
  char message[256];
  std::snprintf(message, sizeof message, "%s: CUDA error: %s", name,
                cudaGetErrorString(error));
  return kvc_report_error(error == cudaErrorMemoryAllocation
                              ? KVC_STATUS_OUT_OF_MEMORY
                              : KVC_STATUS_INTERNAL,
                          message);
}

/// Reduction kinds over the query heads of a group.
enum class Reduce { Mean, Max, Sum };
/// Score normalizations.
enum class Normalize { ZScore, Sum, Max };

//===----------------------------------------------------------------------===//
// Element storage: how one key or value row is encoded in a page
//===----------------------------------------------------------------------===//

/// Row encodings of the runtime's device formats (kvc_page_layout_t).
enum class Storage { F32, F16, BF16, Int8, Fp8E4M3 };

/// The value of type To with the bits of `from` (a float from its bits,
/// the bits of a float), on the device and on the host: the row codecs
/// below are also the host's (the kernel tests build and read their pages
/// with them), and the device's reinterpreting intrinsics have no host
/// definition. On the device the copy is a register move.
template <typename To, typename From>
__host__ __device__ inline To bitCast(From from) {
  static_assert(sizeof(To) == sizeof(From), "bitCast between sizes");
  To to;
  std::memcpy(&to, &from, sizeof to);
  return to;
}

/// fp8 e4m3 bits to float, exact (0x7f/0xff are NaN, no infinities).
__host__ __device__ inline float fp8E4m3ToFloat(uint32_t bits) {
  const uint32_t exponent = (bits >> 3) & 0xfu, mantissa = bits & 0x7u;
  float magnitude;
  if (exponent == 15 && mantissa == 7)
    magnitude = bitCast<float>(0x7fc00000u);
  else if (exponent == 0)
    magnitude = static_cast<float>(mantissa) * (1.0f / 512.0f);
  else
    magnitude = bitCast<float>(((exponent + 120u) << 23) | (mantissa << 20));
  return (bits & 0x80u) ? -magnitude : magnitude;
}

/// float to fp8 e4m3 with round-half-to-even, saturating to +-448; the same
/// bits as kvc_f32_to_fp8_e4m3.
__host__ __device__ inline uint8_t floatToFp8E4m3(float value) {
  const uint32_t x = bitCast<uint32_t>(value);
  const uint8_t sign = static_cast<uint8_t>((x >> 24) & 0x80u);
  const uint32_t magnitude = x & 0x7fffffffu;
  if (magnitude > 0x7f800000u)
    return 0x7f;
  const float a = bitCast<float>(magnitude);
  if (a >= 448.0f)
    return sign | 0x7e;
  if (a < 0.015625f) // Subnormals in units of 2^-9.
    return sign | static_cast<uint8_t>(rintf(a * 512.0f));
  const uint32_t rounded = magnitude + 0x7ffffu + ((magnitude >> 20) & 1u);
  return sign | static_cast<uint8_t>((rounded >> 20) - (120u << 3));
}

/// The L2 policy of the 16-bit decodes' cache reads (createpolicy, sm_80
/// and later): evict first. A decode step reads each key and value row
/// once and nothing reads it again before the layer's next step,
/// gigabytes later; its logits, split records and score state, tens of
/// megabytes at most, are read again by the fold or the merge at the end
/// of the same step. Marking the cache's lines first to go keeps those
/// outputs in L2 in between instead of whichever lines were touched last.
/// (The KIVI decodes read their codes with the default policy: their
/// steps have no fold, and the policy, a per-thread value there, would
/// cost two moves into uniform registers per load.) 0 (no policy) where
/// kEvictFirst is off or off the device.
__device__ __forceinline__ uint64_t streamPolicy() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800 &&                          \
    !defined(KVC_CUDA_EMULATED)
  if constexpr (kEvictFirst) {
    uint64_t policy;
    asm("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;\n"
        : "=l"(policy));
    return policy;
  }
#endif
  return 0;
}

/// A read-only load of cache bytes (a T of 1, 2, 4, 8 or 16 bytes,
/// naturally aligned) under `policy` (streamPolicy): __ldg with the policy
/// attached.
template <typename T>
__device__ __forceinline__ T loadStreamed(const T *p, uint64_t policy) {
  static_assert(sizeof(T) == 1 || sizeof(T) == 2 || sizeof(T) == 4 ||
                    sizeof(T) == 8 || sizeof(T) == 16,
                "loadStreamed loads 1, 2, 4, 8 or 16 bytes");
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800 &&                          \
    !defined(KVC_CUDA_EMULATED)
  if constexpr (kEvictFirst) {
    T x;
    if constexpr (sizeof(T) == 16) {
      uint4 w;
      asm("ld.global.nc.L2::cache_hint.v4.u32 {%0, %1, %2, %3}, "
          "[%4], %5;\n"
          : "=r"(w.x), "=r"(w.y), "=r"(w.z), "=r"(w.w)
          : "l"(p), "l"(policy));
      std::memcpy(&x, &w, 16);
    } else if constexpr (sizeof(T) == 8) {
      uint2 w;
      asm("ld.global.nc.L2::cache_hint.v2.u32 {%0, %1}, [%2], %3;\n"
          : "=r"(w.x), "=r"(w.y)
          : "l"(p), "l"(policy));
      std::memcpy(&x, &w, 8);
    } else if constexpr (sizeof(T) == 4) {
      uint32_t w;
      asm("ld.global.nc.L2::cache_hint.u32 %0, [%1], %2;\n"
          : "=r"(w)
          : "l"(p), "l"(policy));
      std::memcpy(&x, &w, 4);
    } else {
      // 1 or 2 bytes: ld.u8/u16 into a 32-bit register.
      uint32_t w;
      if constexpr (sizeof(T) == 2)
        asm("ld.global.nc.L2::cache_hint.u16 %0, [%1], %2;\n"
            : "=r"(w)
            : "l"(p), "l"(policy));
      else
        asm("ld.global.nc.L2::cache_hint.u8 %0, [%1], %2;\n"
            : "=r"(w)
            : "l"(p), "l"(policy));
      std::memcpy(&x, &w, sizeof(T));
    }
    return x;
  }
#endif
  (void)policy;
  return __ldg(p);
}

/// The L2 policy of the decode attention's logit stores (createpolicy,
/// sm_80 and later): evict last for the share `keep` of their lines
/// (logitsKeepFraction; the device takes it in sixteenths, by address),
/// the others as L2 would place them. The logits are read once, by the
/// fold at the end of the step, which then discards their lines
/// (discardRowLines); until then the attention streams the cache through
/// L2 (evict first, streamPolicy), and every logit line L2 evicts in
/// between costs device memory a write and the fold a read. `keep` 0 (no
/// statistics, or the fraction rounds to nothing) or kLogitsEvictLast off:
/// evict unchanged, the default placement. 0 off the device.
__device__ __forceinline__ uint64_t logitPolicy(float keep) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800 &&                          \
    !defined(KVC_CUDA_EMULATED)
  if constexpr (kLogitsEvictLast) {
    uint64_t policy;
    if (keep > 0.0f)
      asm("createpolicy.fractional.L2::evict_last.L2::evict_unchanged.b64 "
          "%0, %1;\n"
          : "=l"(policy)
          : "f"(fminf(keep, 1.0f)));
    else
      asm("createpolicy.fractional.L2::evict_unchanged.b64 %0, 1.0;\n"
          : "=l"(policy));
    return policy;
  }
#endif
  (void)keep;
  return 0;
}

/// logits[at] = x under `policy` (logitPolicy) where `take` holds (which
/// it does not where `logits` is null): a decode attention's logit store,
/// one predicated instruction rather than a branch around it.
__device__ __forceinline__ void storeLogitIf(bool take, float *logits,
                                             int64_t at, float x,
                                             uint64_t policy) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800 &&                          \
    !defined(KVC_CUDA_EMULATED)
  if constexpr (kLogitsEvictLast) {
    const float *p = logits + at;
    // No "memory" clobber: nothing in the kernel reads a logit back, so
    // its other loads and stores may move across the store.
    asm volatile("{\n\t.reg .pred p;\n\tsetp.ne.u32 p, %3, 0;\n\t"
                 "@p st.global.L2::cache_hint.f32 [%0], %1, %2;\n\t}\n" ::"l"(
                     p),
                 "f"(x), "l"(policy), "r"(static_cast<uint32_t>(take)));
    return;
  }
#endif
  (void)policy;
  if (take)
    logits[at] = x;
}

/// The share of a decode step's logit lines that the attention stores
/// evict-last (logitPolicy): as many of `logitBytes` as half of an L2 of
/// `l2Bytes` holds, the rest of L2 left to the cache's stream, the split
/// records and the score state; 0 where that is under a sixteenth (the
/// policy's unit), where either size is unknown or kLogitsEvictLast is off.
__host__ __device__ inline float logitsKeepFraction(int64_t logitBytes,
                                                    int64_t l2Bytes) {
  if (!kLogitsEvictLast || logitBytes <= 0 || l2Bytes <= 0)
    return 0.0f;
  const double keep = static_cast<double>(l2Bytes / 2) /
                      static_cast<double>(logitBytes);
  if (keep < 1.0 / 16)
    return 0.0f;
  return keep >= 1.0 ? 1.0f : static_cast<float>(keep);
}

/// Decoding and encoding of one storage kind. kScaled formats carry one
/// float scale per row in the page's parameter region.
/// Host and device: the kernel tests write and read their pages with it.
template <Storage S> struct Codec;

template <> struct Codec<Storage::F32> {
  static constexpr int kBytes = 4;
  static constexpr bool kScaled = false;
  __host__ __device__ static void decode(const uint4 &raw, float, float *out) {
    out[0] = bitCast<float>(raw.x);
    out[1] = bitCast<float>(raw.y);
    out[2] = bitCast<float>(raw.z);
    out[3] = bitCast<float>(raw.w);
  }
  __host__ __device__ static void store(uint8_t *row, int c, float x, float) {
    reinterpret_cast<float *>(row)[c] = x;
  }
};

template <> struct Codec<Storage::F16> {
  static constexpr int kBytes = 2;
  static constexpr bool kScaled = false;
  __host__ __device__ static void decode(const uint4 &raw, float, float *out) {
    const __half2 *h = reinterpret_cast<const __half2 *>(&raw);
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const float2 f = __half22float2(h[i]);
      out[2 * i] = f.x;
      out[2 * i + 1] = f.y;
    }
  }
  __host__ __device__ static void store(uint8_t *row, int c, float x, float) {
    reinterpret_cast<__half *>(row)[c] = __float2half_rn(x);
  }
};

template <> struct Codec<Storage::BF16> {
  static constexpr int kBytes = 2;
  static constexpr bool kScaled = false;
  __host__ __device__ static void decode(const uint4 &raw, float, float *out) {
    const __nv_bfloat162 *b = reinterpret_cast<const __nv_bfloat162 *>(&raw);
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const float2 f = __bfloat1622float2(b[i]);
      out[2 * i] = f.x;
      out[2 * i + 1] = f.y;
    }
  }
  __host__ __device__ static void store(uint8_t *row, int c, float x, float) {
    reinterpret_cast<__nv_bfloat16 *>(row)[c] = __float2bfloat16_rn(x);
  }
};

template <> struct Codec<Storage::Int8> {
  static constexpr int kBytes = 1;
  static constexpr bool kScaled = true;
  /// scale = max|x| / 127 (0 for a zero row), as kvc_quantize_int8.
  __host__ __device__ static float scaleOf(float amax) { return amax / 127.0f; }
  __host__ __device__ static void decode(const uint4 &raw, float scale,
                                         float *out) {
    const int8_t *q = reinterpret_cast<const int8_t *>(&raw);
#pragma unroll
    for (int i = 0; i < 16; ++i)
      out[i] = static_cast<float>(q[i]) * scale;
  }
  __host__ __device__ static void store(uint8_t *row, int c, float x,
                                        float scale) {
    float r = 0.0f;
    if (scale > 0.0f)
      r = fminf(rintf(fabsf(x) / scale), 127.0f);
    reinterpret_cast<int8_t *>(row)[c] =
        static_cast<int8_t>(x < 0.0f ? -r : r);
  }
};

template <> struct Codec<Storage::Fp8E4M3> {
  static constexpr int kBytes = 1;
  static constexpr bool kScaled = true;
  /// scale = max|x| / 448 (1 for a zero row), as kvc_quantize_fp8_e4m3.
  __host__ __device__ static float scaleOf(float amax) {
    return amax > 0.0f ? amax / 448.0f : 1.0f;
  }
  __host__ __device__ static void decode(const uint4 &raw, float scale,
                                         float *out) {
    const uint8_t *q = reinterpret_cast<const uint8_t *>(&raw);
#pragma unroll
    for (int i = 0; i < 16; ++i)
      out[i] = fp8E4m3ToFloat(q[i]) * scale;
  }
  __host__ __device__ static void store(uint8_t *row, int c, float x,
                                        float scale) {
    row[c] = floatToFp8E4m3(x / scale);
  }
};

/// How a row of D channels splits into 16-byte vectors and lanes: kLanes
/// consecutive lanes read one row with 128-bit loads, vector j of lane L
/// holding channels (j * kLanes + L) * kElemsPerVec onwards, so that the
/// lanes of a row read consecutive 16 bytes (coalesced).
template <int D, Storage S> struct RowShape {
  static constexpr int kRowBytes = D * Codec<S>::kBytes;
  static constexpr int kVecs = kRowBytes / 16;
  static constexpr int kElemsPerVec = 16 / Codec<S>::kBytes;
  static constexpr int kLanes = kVecs < kWarpSize ? kVecs : kWarpSize;
  static constexpr int kVecsPerLane = kVecs / kLanes;
  /// Channels one lane holds.
  static constexpr int kChunk = kVecsPerLane * kElemsPerVec;
  static_assert(kRowBytes % 16 == 0, "rows must be whole 16-byte vectors");
  static_assert((kLanes & (kLanes - 1)) == 0 && kVecs % kLanes == 0,
                "a row must spread over a power-of-two number of lanes");
  __device__ static int channel(int j, int lane, int e) {
    return (j * kLanes + lane) * kElemsPerVec + e;
  }
};

//===----------------------------------------------------------------------===//
// Asymmetric codes: KIVI and the low class of mixed precision
//===----------------------------------------------------------------------===//

/// kvc_quantize_asym's scale for the range [lo, hi], with IEEE operations
/// (no contraction) so that the bytes equal the host's.
template <int kBits> __device__ float kiviScale(float lo, float hi) {
  return __fdiv_rn(__fsub_rn(hi, lo), static_cast<float>((1 << kBits) - 1));
}

/// code = rne((x - min) / scale) clamped to [0, 2^bits - 1]; 0 when scale
/// is 0 (kvc_quantize_asym).
template <int kBits>
__device__ uint32_t kiviCode(float x, float scale, float lo) {
  if (!(scale > 0.0f))
    return 0;
  const float code = rintf(fmaxf(__fdiv_rn(__fsub_rn(x, lo), scale), 0.0f));
  return static_cast<uint32_t>(
      fminf(code, static_cast<float>((1 << kBits) - 1)));
}

/// A page's {scale, min} record: two f16 in one 32-bit word, scale in the
/// low half (runtime/Formats.h, AsymRecord), rounded by
/// kvc::rules::f16Directed as the host rounds it, so that the bytes equal
/// the host's.
/// The record of a group whose least and greatest values are lo and hi:
/// min = lo rounded down, scale = (hi - min) / (2^bits - 1) rounded up, as
/// floats for the codes (kiviCode) and as the word a page stores.
struct AsymParams {
  float scale, min;
  uint32_t word;
};
/// The float of the f16 in the low 16 bits of `bits`.
__device__ __forceinline__ float f16Value(uint32_t bits) {
  __half_raw raw;
  raw.x = static_cast<unsigned short>(bits);
  return __half2float(__half(raw));
}
template <int kBits> __device__ AsymParams asymParams(float lo, float hi) {
  const uint32_t minBits = rules::f16Directed(__float_as_uint(lo), false);
  const float min = f16Value(minBits);
  const uint32_t scaleBits =
      rules::f16Directed(__float_as_uint(kiviScale<kBits>(min, hi)), true);
  return {f16Value(scaleBits), min, scaleBits | minBits << 16};
}

/// The N consecutive 32-bit words at `from` (aligned to the widest of 16,
/// 8 and 4 bytes that N words fill) in the fewest loads.
template <int N>
__device__ __forceinline__ void loadWords(const uint8_t *from,
                                          uint32_t (&words)[N]) {
  if constexpr (N % 4 == 0) {
#pragma unroll
    for (int i = 0; i < N; i += 4) {
      const uint4 w = __ldg(reinterpret_cast<const uint4 *>(from) + i / 4);
      words[i] = w.x;
      words[i + 1] = w.y;
      words[i + 2] = w.z;
      words[i + 3] = w.w;
    }
  } else if constexpr (N % 2 == 0) {
#pragma unroll
    for (int i = 0; i < N; i += 2) {
      const uint2 w = __ldg(reinterpret_cast<const uint2 *>(from) + i / 2);
      words[i] = w.x;
      words[i + 1] = w.y;
    }
  } else {
#pragma unroll
    for (int i = 0; i < N; ++i)
      words[i] = __ldg(reinterpret_cast<const uint32_t *>(from) + i);
  }
}

/// {scale, min} of a record word: two conversions.
__device__ __forceinline__ float2 asymPair(uint32_t word) {
  return __half22float2(*reinterpret_cast<const __half2 *>(&word));
}

/// x = code * scale + min in one fused multiply-add: the decode kernels'
/// dequantization. The host's (kvc_dequantize_asym) rounds the product and
/// the sum apart; the two differ by at most an ulp of x, which the decode
/// tolerates (attention outputs are compared within 5e-4), and the fused
/// form is one instruction per code instead of two.
__device__ inline float kiviDequant(uint32_t code, float scale, float lo) {
  return fmaf(static_cast<float>(code), scale, lo);
}

/// Mixed precision: a low-class row (KVC_FORMAT_INT2/INT4: kBits-bit codes
/// per token, packed LSB-first, one {scale, min} pair per group of KG
/// channels) read in the lane layout of RowShape<D, S>, the high class's, so
/// that both classes share the query and accumulator registers of
/// decodeAttentionSplit. Vector j of a lane covers kElemsPerVec consecutive
/// channels, whose codes are kRunBytes consecutive bytes of the packed row.
template <int D, Storage S, int kBits, int KG> struct LowRow {
  using Shape = RowShape<D, S>;
  static constexpr int kRowBytes = D * kBits / 8;
  static constexpr int kRunBytes = Shape::kElemsPerVec * kBits / 8;
  /// Bytes of the parameter record of one slot (a 4-byte {scale, min}
  /// word per group).
  static constexpr uint64_t kRecordBytes = 4 * (D / KG);
  static_assert(kBits == 2 || kBits == 4, "the low class is int2 or int4");
  static_assert(KG > 0 && D % KG == 0, "groups must divide head_dim");
  static_assert(kRunBytes == 1 || kRunBytes == 2 || kRunBytes == 4 ||
                    kRunBytes == 8,
                "a lane's codes are one aligned load");
  using Word = std::conditional_t<
      kRunBytes == 1, unsigned char,
      std::conditional_t<
          kRunBytes == 2, unsigned short,
          std::conditional_t<kRunBytes == 4, unsigned int,
                             unsigned long long>>>;

  /// The codes of vector j of `lane` (aligned: rows and runs are multiples
  /// of kRunBytes from a 16-byte aligned region).
  __device__ static uint64_t load(const uint8_t *row, int j, int lane) {
    return __ldg(reinterpret_cast<const Word *>(
        row + Shape::channel(j, lane, 0) * kBits / 8));
  }
  /// load() under `policy` (streamPolicy).
  __device__ static uint64_t load(const uint8_t *row, int j, int lane,
                                  uint64_t policy) {
    return loadStreamed(reinterpret_cast<const Word *>(
                            row + Shape::channel(j, lane, 0) * kBits / 8),
                        policy);
  }

  /// Dequantizes the kElemsPerVec channels of vector j of `lane` from their
  /// codes and the slot's record `records` (a word per group).
  __device__ static void decode(uint64_t codes, const uint32_t *records,
                                int j, int lane, float *out) {
    constexpr uint64_t kMask = (uint64_t{1} << kBits) - 1;
    if constexpr (KG % Shape::kElemsPerVec == 0) {
      // The vector lies in one group.
      const float2 p =
          asymPair(__ldg(records + Shape::channel(j, lane, 0) / KG));
#pragma unroll
      for (int e = 0; e < Shape::kElemsPerVec; ++e)
        out[e] = kiviDequant(
            static_cast<uint32_t>((codes >> (e * kBits)) & kMask), p.x, p.y);
    } else {
#pragma unroll
      for (int e = 0; e < Shape::kElemsPerVec; ++e) {
        const float2 p =
            asymPair(__ldg(records + Shape::channel(j, lane, e) / KG));
        out[e] = kiviDequant(
            static_cast<uint32_t>((codes >> (e * kBits)) & kMask), p.x, p.y);
      }
    }
  }
};

//===----------------------------------------------------------------------===//
// Device views of the runtime's pages
//===----------------------------------------------------------------------===//

/// Division of a slot index (0 <= slot < 2^31) by the page size without a
/// divide instruction (a multiply-high, an add and a shift): with
/// shift = ceil(log2 size) and magic = floor(2^32 (2^shift - size) / size) + 1,
/// page(slot) = (hi32(slot * magic) + slot) >> shift. The multiplier
/// 2^32 + magic exceeds 2^(32 + shift) / size by e <= size <= 2^shift, so
/// slot * e / (size 2^(32 + shift)) < 1 / (2 size) and the quotient's
/// fraction, at most (size - 1) / size, stays below 1: exact for every
/// dividend below 2^31, and the sum stays below 2^32. A power of two gets
/// magic 1 (hi32 = 0): a shift.
struct PageDivisor {
  int32_t size;
  uint32_t magic;
  int32_t shift;

  static PageDivisor of(int32_t size) {
    int32_t shift = 0;
    while ((int64_t{1} << shift) < size)
      ++shift;
    const uint64_t excess =
        (uint64_t{1} << shift) - static_cast<uint64_t>(size);
    return PageDivisor{
        size,
        static_cast<uint32_t>((excess << 32) / static_cast<uint64_t>(size) + 1),
        shift};
  }
  __host__ __device__ int32_t page(int32_t slot) const {
    const uint32_t n = static_cast<uint32_t>(slot);
#ifdef __CUDA_ARCH__
    const uint32_t hi = __umulhi(n, magic);
#else
    const uint32_t hi =
        static_cast<uint32_t>((static_cast<uint64_t>(n) * magic) >> 32);
#endif
    return static_cast<int32_t>((hi + n) >> shift);
  }
  __host__ __device__ int32_t offset(int32_t slot) const {
    return slot - page(slot) * size;
  }
};

/// The page layout of a context (kvc_page_layout_t), as kernels read it.
struct PageLayout {
  /// The page size (slots per page), as a divisor: slot -> (page, offset).
  PageDivisor pages;
  uint64_t keyOffset, valueOffset, keyParamOffset, valueParamOffset;
  /// Mixed precision: the same offsets in a low page (kvc_low_page_layout);
  /// 0 for a context with one class.
  uint64_t lowKeyOffset, lowValueOffset, lowKeyParamOffset,
      lowValueParamOffset;
};

/// Converts the runtime's page layout.
inline PageLayout devicePageLayout(const kvc_config_t &config,
                                   const kvc_page_layout_t &layout) {
  return PageLayout{PageDivisor::of(config.page_size),
                    layout.key_offset,
                    layout.value_offset,
                    layout.key_param_offset,
                    layout.value_param_offset,
                    0,
                    0,
                    0,
                    0};
}

/// Converts the page layouts of both classes of a mixed-precision context.
inline PageLayout devicePageLayout(const kvc_config_t &config,
                                   const kvc_page_layout_t &layout,
                                   const kvc_page_layout_t &low) {
  PageLayout l = devicePageLayout(config, layout);
  l.lowKeyOffset = low.key_offset;
  l.lowValueOffset = low.value_offset;
  l.lowKeyParamOffset = low.key_param_offset;
  l.lowValueParamOffset = low.value_param_offset;
  return l;
}

/// Mixed precision: bit 0 of a page address in a HeadTable marks a page of
/// the low class (kvc_get_page_format names the context's low_format). The
/// bit is free: the pool is KVC_POOL_ALIGNMENT-aligned and so are the
/// strides of pool pages and of low pages, so every page address is a
/// multiple of 256. DeviceTables sets it; kernels that read a context with
/// one class never see it.
constexpr uint64_t kLowPageTag = 1;

/// Per-slot word of a KIVI head (HeadTable::kiviRows): -1 when key and
/// value are both quantized, else the residual row with these flags.
constexpr int32_t kKiviKeyFull = 1 << 30;
constexpr int32_t kKiviValueFull = 1 << 29;
constexpr int32_t kKiviRowMask = kKiviValueFull - 1;

/// The slot tables of one (sequence, layer, kv-head) in device memory.
struct HeadTable {
  /// Device address of each page (0: a hole), with kLowPageTag set for a
  /// low page of a mixed-precision context.
  const uint64_t *pages;
  /// Per slot; KVC_POSITION_NONE when free. Written by the decode stages
  /// only to mirror the runtime's eviction of the step's victims.
  int32_t *positions;
  float *state;             ///< Score state per slot (null when unused).
  uint64_t *history;        ///< Importance bits per slot (null when unused).
  int32_t numSlots;
  int32_t numPages;
  /// Decode: the position of the step's query (the sequence's new token).
  int32_t queryPosition;
  /// Decode on device-resident tables (DeviceTables) of a policy that
  /// selects: where the stages leave the step's victims, the count at [0]
  /// and the slots after it, for the host to evict before the sequence's
  /// next step. Null for a policy that does not select at decode.
  int32_t *victims;
  /// KIVI storage: per slot, the word of kKiviKeyFull (which part is read
  /// from the residual window, and from which row); null otherwise.
  const int32_t *kiviRows;
  /// KIVI storage: the head's residual region, R key rows then R value
  /// rows of dtype elements.
  const uint8_t *kiviResidual;
  /// Decode on device-resident tables of a policy that selects: the pinned
  /// host row that receives the victim count and the first kInlineVictims
  /// victims of `victims` (copyVictimRows; pinned host memory is mapped,
  /// so the device writes it through the host's address). Null otherwise.
  int32_t *hostVictims;
  /// Decode on device-resident tables: the slot the runtime gave the step's
  /// new entry (storeAppended writes its key and value there), -1 when the
  /// step appends nothing.
  int32_t appendSlot;
  /// Decode on device-resident tables: the device address of appendSlot's
  /// page (pages[] after the step's words, without kLowPageTag; 0 when the
  /// step appends nothing), so that storeAppended does not read the page
  /// table that the same launch writes.
  uint64_t appendPage;
  /// Decode on device-resident tables: this head's arrival counter, zero
  /// when the step's tables are uploaded, which the blocks of a kernel over
  /// the head's splits count up so that the last of them can finish the
  /// head's work (lastArrival).
  int32_t *arrivals;
};

/// A 4-byte word, or an 8-byte one when bit 0 of `address` is set, that a
/// decode step writes into its device tables before its attention runs.
struct TableWord {
  uint64_t address;
  uint64_t value;
};

/// Writes word `i` of the `n` at `words` (nothing when i >= n).
__device__ inline void writeTableWord(const TableWord *words, int32_t n,
                                      int32_t i) {
  if (i < 0 || i >= n)
    return;
  const TableWord w = words[i];
  if (w.address & 1)
    *reinterpret_cast<uint64_t *>(w.address & ~uint64_t{1}) = w.value;
  else
    *reinterpret_cast<uint32_t *>(w.address) = static_cast<uint32_t>(w.value);
}

/// The table words of a step in the word blocks of a launch that writes
/// them beside its own work (storeAppended, kiviStageRows): `block` is the
/// calling block's index among those `blocks` blocks of `threads` threads,
/// each thread taking every (blocks x threads)-th word from its own. The
/// `numWords` at `words`, or with `counted` (a planned run,
/// WordsBy::PlannedStores) the count held in words[0].address, read here,
/// and the words after it (DeviceTables::plannedWords).
__device__ inline void writeStepWords(const TableWord *words, int32_t numWords,
                                      bool counted, int32_t block,
                                      int32_t blocks, int32_t threads) {
  if (counted) {
    numWords = static_cast<int32_t>(words[0].address);
    ++words;
  }
  for (int32_t i = block * threads + static_cast<int32_t>(threadIdx.x);
       i < numWords; i += blocks * threads)
    writeTableWord(words, numWords, i);
}

/// One row pair that storeEntries writes: source row `row` of the float
/// k/v tensors for kv-head `head`, into the given device addresses.
struct StoreEntry {
  uint64_t key, value;           ///< Row addresses.
  uint64_t keyScale, valueScale; ///< Parameter records (scaled formats).
  int32_t head, row;
};

/// Device address of byte `offset` of slot `slot`'s page region.
__device__ inline const uint8_t *slotBase(const HeadTable &t, int32_t slot,
                                          const PageDivisor &pages) {
  return reinterpret_cast<const uint8_t *>(t.pages[pages.page(slot)]);
}

//===----------------------------------------------------------------------===//
// Warp and block primitives
//===----------------------------------------------------------------------===//

/// Asynchronous copy of kBytes (4, 8 or 16) from global into shared memory
/// (cp.async, sm_80 and later), in the group that the calling thread's next
/// commitCopies closes; the bytes may land at any time until a waitCopies
/// covers the group. Both addresses are kBytes-aligned.
template <int kBytes>
__device__ __forceinline__ void copyAsync(void *shared, const void *global) {
  static_assert(kBytes == 4 || kBytes == 8 || kBytes == 16,
                "cp.async copies 4, 8 or 16 bytes");
#if defined(KVC_CUDA_EMULATED)
  ::kvc::emu::copyAsync(shared, global, kBytes);
#elif defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  const unsigned address =
      static_cast<unsigned>(__cvta_generic_to_shared(shared));
  if constexpr (kBytes == 16)
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(address),
                 "l"(global)
                 : "memory");
  else
    asm volatile("cp.async.ca.shared.global [%0], [%1], %2;\n" ::"r"(address),
                 "l"(global), "n"(kBytes)
                 : "memory");
#else
  std::memcpy(shared, global, kBytes);
#endif
}

/// copyAsync<16> of cache bytes under `policy` (streamPolicy).
__device__ __forceinline__ void
copyAsyncStreamed(void *shared, const void *global, uint64_t policy) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800 &&                          \
    !defined(KVC_CUDA_EMULATED)
  if constexpr (kEvictFirst) {
    const unsigned address =
        static_cast<unsigned>(__cvta_generic_to_shared(shared));
    asm volatile(
        "cp.async.cg.shared.global.L2::cache_hint [%0], [%1], 16, %2;\n" ::"r"(
            address),
        "l"(global), "l"(policy)
        : "memory");
    return;
  }
#endif
  (void)policy;
  copyAsync<16>(shared, global);
}

/// Closes the calling thread's group of asynchronous copies (possibly
/// empty, so that every thread counts groups alike).
__device__ __forceinline__ void commitCopies() {
#if defined(KVC_CUDA_EMULATED)
  ::kvc::emu::commitCopies();
#elif defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile("cp.async.commit_group;\n" ::: "memory");
#endif
}

/// Waits until every group of the calling thread but the kNewest most
/// recently committed has landed. Other threads' copies are visible only
/// after a barrier that follows their own wait.
template <int kNewest> __device__ __forceinline__ void waitCopies() {
#if defined(KVC_CUDA_EMULATED)
  ::kvc::emu::waitCopies(kNewest);
#elif defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile("cp.async.wait_group %0;\n" ::"n"(kNewest) : "memory");
#endif
}

/// Orders the calling thread's global memory accesses before and after it
/// for every thread of the device (__threadfence).
__device__ __forceinline__ void fenceDevice() {
#if defined(KVC_CUDA_EMULATED)
  // One block runs at a time: its writes are everyone's already.
#else
  __threadfence();
#endif
}

/// Counts the calling block in at `*arrivals` (HeadTable::arrivals) once
/// every thread of the block has called it, after all of the block's
/// writes: true in every thread of the last of `blocks` blocks to arrive,
/// which then reads what all of them wrote (the counter is zeroed by the
/// next step's upload). Every thread fences its own writes before the
/// block's barrier, so the count orders them all, not only thread 0's.
/// The other blocks must not wait for it: their kernel ends after the
/// call.
__device__ inline bool lastArrival(int32_t *arrivals, int32_t blocks) {
  __shared__ bool last;
  fenceDevice();
  __syncthreads();
  if (threadIdx.x == 0) {
    fenceDevice();
    last = atomicAdd(arrivals, 1) == blocks - 1;
    if (last)
      fenceDevice();
  }
  __syncthreads();
  return last;
}

/// Counts the calling block in at `*counter` once every thread of the
/// block has called it, after all of the block's writes, for the blocks
/// that wait for the count (awaitCount). Every thread fences its own
/// writes before the block's barrier, as in lastArrival.
__device__ inline void countIn(int32_t *counter) {
  fenceDevice();
  __syncthreads();
  if (threadIdx.x == 0) {
    fenceDevice();
    atomicAdd(counter, 1);
  }
}

/// Waits until `*counter` holds at least `target` (blocks counting in with
/// countIn or lastArrival); after it every thread of the block reads what
/// the counted blocks wrote before they counted in. Every thread calls it.
/// Only for counts whose blocks have all started, or will start whatever
/// the waiting blocks hold (claimItem's items before the caller's): a
/// device runs blocks in no promised order, so a wait for a block that
/// has not started may never end.
__device__ inline void awaitCount(const int32_t *counter, int32_t target) {
  __shared__ bool reached;
  for (;;) {
    if (threadIdx.x == 0) {
      reached = *static_cast<const volatile int32_t *>(counter) >= target;
      if (reached)
        fenceDevice();
    }
    __syncthreads();
    if (reached)
      break;
#if defined(KVC_CUDA_EMULATED)
    ::kvc::emu::awaitOthers();
#elif defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 700
    __nanosleep(256);
#endif
    // Every thread has read `reached` before thread 0 writes it again.
    __syncthreads();
  }
  __syncthreads();
}

/// The calling block's item of a grid whose blocks take their work from a
/// counter (decodeAttentionFold): the count of blocks that took one
/// before it. Every thread calls it and gets the same item. An item's
/// block has started, so a block may wait for what blocks of earlier
/// items write (awaitCount).
__device__ inline int32_t claimItem(int32_t *items) {
  __shared__ int32_t item;
  if (threadIdx.x == 0)
    item = atomicAdd(items, 1);
  __syncthreads();
  return item;
}

/// Programmatic dependent launch (compute capability 9.0 and above;
/// launchDependent on the host). A kernel launched as a dependent may start
/// while the kernel before it in the stream still runs: awaitPriorGrids
/// waits until that kernel (and through its own wait, every one before it)
/// has completed and its writes are visible, so a dependent reads nothing
/// that the kernels before it write until after it, and calls it in every
/// block before anything that depends on them, early returns included.
/// releaseDependents lets the next kernel, if it was launched as a
/// dependent, start its blocks once every block of this one has called it
/// or ended: it orders nothing (the dependent still waits for this
/// kernel's end), it only hides that kernel's launch. Both compile to
/// nothing below sm_90 (and on the host); launched as an ordinary kernel, a
/// kernel's wait returns at once. The CUDA emulator starts a dependent as
/// early as an sm_90 device may (kvc_cuda_emu.h, with deferred device
/// work): until its wait, a block reads what the kernel before wrote as it
/// was before that kernel ran.
__device__ __forceinline__ void awaitPriorGrids() {
#if defined(KVC_CUDA_EMULATED)
#if KVC_CUDA_DEPENDENT_LAUNCH
  ::kvc::emu::awaitPriorGrids();
#endif
#elif defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900 && KVC_CUDA_DEPENDENT_LAUNCH
  asm volatile("griddepcontrol.wait;\n" ::: "memory");
#endif
}

__device__ __forceinline__ void releaseDependents() {
#if defined(KVC_CUDA_EMULATED)
#if KVC_CUDA_DEPENDENT_LAUNCH
  ::kvc::emu::releaseDependents();
#endif
#elif defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900 && KVC_CUDA_DEPENDENT_LAUNCH
  asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
#endif
}

/// Asks the L2 cache to fetch the 128-byte line holding `address`, a
/// global address: a hint with no effect on results, which turns the
/// latency of a later load of the line into an L2 hit.
/// The CUDA emulator notes the address (kvc::emu::prefetch), for the
/// tests that check which lines a kernel asks for.
__device__ __forceinline__ void prefetchL2(const void *address) {
#if defined(KVC_CUDA_EMULATED)
  ::kvc::emu::prefetch(address);
#elif defined(__CUDA_ARCH__)
  asm volatile("prefetch.global.L2 [%0];\n" ::"l"(address));
#else
  (void)address;
#endif
}

/// prefetchL2(address) where `take` holds, as one predicated instruction
/// rather than a branch around it (which a warp whose lanes disagree runs
/// with a reconvergence barrier).
__device__ __forceinline__ void prefetchL2If(bool take, const void *address) {
#if defined(KVC_CUDA_EMULATED)
  if (take)
    ::kvc::emu::prefetch(address);
#elif defined(__CUDA_ARCH__)
  asm volatile("{\n\t.reg .pred p;\n\tsetp.ne.u32 p, %1, 0;\n\t"
               "@p prefetch.global.L2 [%0];\n\t}\n" ::"l"(address),
               "r"(static_cast<uint32_t>(take)));
#else
  (void)take;
  (void)address;
#endif
}

/// Drops the 128-byte line at `line` (global memory, 128-byte aligned)
/// from L2 without writing it to device memory (discard.global.L2, sm_80
/// and later): until something writes them again, the line's bytes are
/// indeterminate. For scratch that nothing reads again, whose dirty lines
/// would otherwise cost device memory a write when L2 evicts them. The
/// CUDA emulator writes 0xff over the line (a NaN in every float) so that
/// a test whose kernels read a discarded line sees it; the host pass and
/// devices before sm_80 do nothing.
__device__ __forceinline__ void discardL2(void *line) {
#if defined(KVC_CUDA_EMULATED)
  ::kvc::emu::discard(line);
#elif defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile("discard.global.L2 [%0], 128;\n" ::"l"(line) : "memory");
#else
  (void)line;
#endif
}

/// 2^x by the hardware's ex2.approx.ftz (relative error below 2^-22; a
/// result under 2^-126 flushes to 0): the softmax weights of the
/// tensor-core KIVI decode as e^(l - m) = 2^((l - m) log2 e), one multiply
/// and one instruction where exp2f adds a subnormal range check and expf a
/// range reduction.
__device__ __forceinline__ float exp2Approx(float x) {
#if defined(__CUDA_ARCH__) && !defined(KVC_CUDA_EMULATED)
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
#else
  const float y = exp2f(x);
  return y < 1.17549435e-38f ? 0.0f : y;
#endif
}

/// Whether the row of `rowBytes` bytes at byte offset `offset` is the
/// first to touch its 128-byte line (rows of one region, from a 128-byte
/// aligned start), or `first` is set: the rows a prefetch names once.
__host__ __device__ constexpr bool startsLine(uint64_t offset,
                                              uint64_t rowBytes, bool first) {
  return first || offset % 128 < rowBytes;
}

template <typename T> __device__ T warpSum(T x) {
#pragma unroll
  for (int o = kWarpSize / 2; o > 0; o /= 2)
    x += __shfl_xor_sync(kFullMask, x, o);
  return x;
}

template <typename T> __device__ T warpMax(T x) {
#pragma unroll
  for (int o = kWarpSize / 2; o > 0; o /= 2)
    x = max(x, __shfl_xor_sync(kFullMask, x, o));
  return x;
}

/// The warp sums of kN values per lane (kN a power of two), each lane
/// receiving one of them: the sum of v[x] over all lanes for x = bits
/// [kLow, kLow + log2 kN) of its lane. A butterfly that halves the values
/// at each of those bits (a lane keeps the half its bit selects and sends
/// the other to its partner), then sums over the other bits: kN - 1 + 5 -
/// log2 kN shuffles, where kN warp sums take 5 kN. Deterministic: a fixed
/// order of additions per lane. The whole warp calls it.
template <int kN, int kLow>
__device__ __forceinline__ float warpSumScattered(float (&v)[kN], int lane) {
  static_assert(kN >= 1 && (kN & (kN - 1)) == 0, "a power of two");
  constexpr int kBits = kN == 1 ? 0 : (kN == 2 ? 1 : (kN == 4 ? 2 : 3));
  static_assert(kN <= 8 && kLow + kBits <= 5, "bits of a lane");
#pragma unroll
  for (int n = kN, bit = kLow + kBits - 1; n > 1; n /= 2, --bit) {
    const bool upper = (lane >> bit) & 1;
#pragma unroll
    for (int i = 0; i < n / 2; ++i) {
      const float send = upper ? v[i] : v[i + n / 2];
      const float keep = upper ? v[i + n / 2] : v[i];
      v[i] = keep + __shfl_xor_sync(kFullMask, send, 1 << bit);
    }
  }
  float x = v[0];
#pragma unroll
  for (int bit = 0; bit < 5; ++bit)
    if (bit < kLow || bit >= kLow + kBits)
      x += __shfl_xor_sync(kFullMask, x, 1 << bit);
  return x;
}

/// Sum (kMax: maximum) of one value per thread over the block; every thread
/// gets the result. Deterministic: fixed shuffle and slot order.
template <int kThreads, bool kMax = false, typename T>
__device__ T blockReduce(T x) {
  static_assert(kThreads % kWarpSize == 0 && kThreads <= 1024, "block size");
  constexpr int kWarps = kThreads / kWarpSize;
  __shared__ T partials[kWarps];
  const int lane = threadIdx.x % kWarpSize, warp = threadIdx.x / kWarpSize;
  x = kMax ? warpMax(x) : warpSum(x);
  if (lane == 0)
    partials[warp] = x;
  __syncthreads();
  T r = partials[0];
  for (int w = 1; w < kWarps; ++w)
    r = kMax ? max(r, partials[w]) : r + partials[w];
  __syncthreads();
  return r;
}

/// Exclusive prefix sum of one int per thread in thread order; *total gets
/// the block's sum.
template <int kThreads>
__device__ int32_t blockExclusiveScan(int32_t x, int32_t *total) {
  constexpr int kWarps = kThreads / kWarpSize;
  __shared__ int32_t warpTotals[kWarps];
  const int lane = threadIdx.x % kWarpSize, warp = threadIdx.x / kWarpSize;
  int32_t inclusive = x;
#pragma unroll
  for (int o = 1; o < kWarpSize; o *= 2) {
    const int32_t y = __shfl_up_sync(kFullMask, inclusive, o);
    if (lane >= o)
      inclusive += y;
  }
  if (lane == kWarpSize - 1)
    warpTotals[warp] = inclusive;
  __syncthreads();
  int32_t before = 0, sum = 0;
  for (int w = 0; w < kWarps; ++w) {
    if (w < warp)
      before += warpTotals[w];
    sum += warpTotals[w];
  }
  __syncthreads();
  *total = sum;
  return before + inclusive - x;
}

/// Calls emit(i, rank) for every i < n with pred(i), where rank counts the
/// i' < i with pred(i'), and returns their number (every thread). Thread t
/// walks the contiguous chunk [t * c, (t + 1) * c), c = ceil(n / kThreads),
/// twice: once to count, once to emit after one block-wide scan of the
/// counts, so a pass over n entries costs one scan rather than one per
/// kThreads entries. pred is called twice per entry and must not change.
template <int kThreads, typename Pred, typename Emit>
__device__ int32_t forEachRanked(int32_t n, Pred pred, Emit emit) {
  const int32_t chunk = (n + kThreads - 1) / kThreads;
  const int32_t first = min(n, static_cast<int32_t>(threadIdx.x) * chunk);
  const int32_t last = min(n, first + chunk);
  int32_t mine = 0;
  for (int32_t i = first; i < last; ++i)
    mine += pred(i) ? 1 : 0;
  int32_t total = 0;
  int32_t rank = blockExclusiveScan<kThreads>(mine, &total);
  if (mine != 0)
    for (int32_t i = first; i < last; ++i)
      if (pred(i))
        emit(i, rank++);
  __syncthreads();
  return total;
}

/// Number of live entries (position != KVC_POSITION_NONE).
template <int kThreads>
__device__ int32_t countLive(const int32_t *positions, int32_t n) {
  int32_t live = 0;
  for (int32_t i = threadIdx.x; i < n; i += kThreads)
    live += positions[i] != KVC_POSITION_NONE;
  return blockReduce<kThreads>(live);
}

/// The k-th smallest (1-based, 1 <= k <= number of keys) of the keys that
/// keyOf(i, &key) reports for i in [0, n), by radix selection: one pass of
/// 8-bit digits per byte of `kBits`, each a shared-memory histogram. Runs in
/// O(n * kBits / 8) without sorting. k == 1 (a single victim, the common
/// decode step) is one block-wide minimum instead.
template <int kThreads, int kBits, typename KeyOf>
__device__ uint64_t blockSelectKth(int32_t n, int64_t k, KeyOf keyOf) {
  static_assert(kBits % 8 == 0 && kBits <= 64, "whole bytes");
  if (k == 1) {
    // The minimum as the maximum of the complements (0: no key).
    unsigned long long best = 0;
    for (int32_t i = threadIdx.x; i < n; i += kThreads) {
      uint64_t key;
      if (keyOf(i, &key))
        best = max(best, static_cast<unsigned long long>(~key));
    }
    return ~static_cast<uint64_t>(blockReduce<kThreads, true>(best));
  }
  __shared__ int32_t histogram[256];
  __shared__ uint64_t sharedPrefix;
  __shared__ int64_t sharedRank;
  uint64_t prefix = 0, mask = 0;
  for (int shift = kBits - 8; shift >= 0; shift -= 8) {
    for (int d = threadIdx.x; d < 256; d += kThreads)
      histogram[d] = 0;
    __syncthreads();
    // Keys share their leading digits (positions, close scores): the lanes
    // of a warp with the same digit add their count in one atomic rather
    // than contending for one histogram bin. Uniform trip count, so that
    // every lane takes part in the match.
    for (int32_t base = 0; base < n; base += kThreads) {
      const int32_t i = base + threadIdx.x;
      uint64_t key = 0;
      const bool counted = i < n && keyOf(i, &key) && (key & mask) == prefix;
      const unsigned digit =
          counted ? static_cast<unsigned>((key >> shift) & 0xffu) : 256u;
      const unsigned peers = __match_any_sync(kFullMask, digit);
      const int lane = static_cast<int>(threadIdx.x % kWarpSize);
      if (counted && lane == __ffs(peers) - 1)
        atomicAdd(&histogram[digit], __popc(peers));
    }
    __syncthreads();
    if (threadIdx.x == 0) {
      int64_t rank = k;
      int d = 0;
      for (; d < 255 && rank > histogram[d]; ++d)
        rank -= histogram[d];
      sharedPrefix = prefix | (static_cast<uint64_t>(d) << shift);
      sharedRank = rank;
    }
    __syncthreads();
    prefix = sharedPrefix;
    k = sharedRank;
    mask |= static_cast<uint64_t>(0xffu) << shift;
  }
  __syncthreads();
  return prefix;
}

/// Maps a float to an unsigned key with the same order (-0 == +0).
__device__ inline uint32_t orderedBits(float x) {
  const uint32_t b = __float_as_uint(x == 0.0f ? 0.0f : x);
  return (b & 0x80000000u) ? ~b : (b | 0x80000000u);
}

//===----------------------------------------------------------------------===//
// Storing entries (decode append, prefill gather)
//===----------------------------------------------------------------------===//

/// Encodes one float row of D channels into `dst` (and its scale record):
/// called by the 32 lanes of a warp.
template <int D, Storage S>
__device__ void storeRow(const float *src, uint8_t *dst, float *scaleRecord) {
  const int lane = threadIdx.x % kWarpSize;
  float scale = 0.0f;
  if constexpr (Codec<S>::kScaled) {
    float amax = 0.0f;
    for (int c = lane; c < D; c += kWarpSize)
      amax = fmaxf(amax, fabsf(src[c]));
    scale = Codec<S>::scaleOf(warpMax(amax));
    if (lane == 0)
      *scaleRecord = scale;
  }
  for (int c = lane; c < D; c += kWarpSize)
    Codec<S>::store(dst, c, src[c], scale);
}

/// Writes `count` entries, one warp each: key row `row` of head `head` is
/// k + row * kvStride + head * D (likewise values).
template <int D, Storage S>
__global__ void storeEntries(const StoreEntry *entries, int32_t count,
                             const float *k, const float *v,
                             int64_t kvStride) {
  const int32_t e = blockIdx.x * (blockDim.x / kWarpSize) +
                    threadIdx.x / kWarpSize;
  if (e >= count)
    return;
  const StoreEntry s = entries[e];
  const int64_t offset = s.row * kvStride + static_cast<int64_t>(s.head) * D;
  storeRow<D, S>(k + offset, reinterpret_cast<uint8_t *>(s.key),
                 reinterpret_cast<float *>(s.keyScale));
  storeRow<D, S>(v + offset, reinterpret_cast<uint8_t *>(s.value),
                 reinterpret_cast<float *>(s.valueScale));
}

/// Threads per block of storeEntries (one warp per entry).
constexpr int kStoreThreads = 128;

/// The first kernel of a decode step: writes the step's new entries, one
/// warp per head of the batch (`count` = batch x kvHeads; head i is kv-head
/// i % kvHeads of sequence i / kvHeads, whose rows are row i / kvHeads of k
/// and v), and the step's `numWords` table words (writeTableWords), in the
/// blocks after the heads', each thread taking every (word blocks x
/// kStoreThreads)-th word from its own. With `counted` (a planned run,
/// launchPlannedStores) the count is read here instead: words[0].address,
/// the words after it (DeviceTables::plannedWords). The entry goes to slot
/// tables[i].appendSlot of page tables[i].appendPage, which the upload
/// set, so the stores read nothing that the words write and the two need
/// no launch between them. The slot is in a page of the storage format
/// (appends take full-class pages).
template <int D, Storage S>
__global__ void __launch_bounds__(kStoreThreads)
    storeAppended(const HeadTable *tables, int32_t count, int32_t kvHeads,
                  PageLayout layout, const float *k, const float *v,
                  int64_t kvStride, const TableWord *words,
                  int32_t numWords, bool counted) {
  // The attention kernel after it may start its blocks (launchDependent).
  releaseDependents();
  constexpr int32_t kWarps = kStoreThreads / kWarpSize;
  const int32_t headBlocks = (count + kWarps - 1) / kWarps;
  if (static_cast<int32_t>(blockIdx.x) >= headBlocks) {
    writeStepWords(words, numWords, counted,
                   static_cast<int32_t>(blockIdx.x) - headBlocks,
                   static_cast<int32_t>(gridDim.x) - headBlocks,
                   kStoreThreads);
    return;
  }
  const int32_t i = blockIdx.x * kWarps + threadIdx.x / kWarpSize;
  if (i >= count)
    return;
  const HeadTable &t = tables[i];
  const int32_t slot = t.appendSlot;
  if (slot < 0)
    return;
  const uint64_t page = t.appendPage;
  const uint64_t o = static_cast<uint64_t>(layout.pages.offset(slot));
  constexpr uint64_t kRowBytes = static_cast<uint64_t>(D) * Codec<S>::kBytes;
  const int64_t offset = static_cast<int64_t>(i / kvHeads) * kvStride +
                         static_cast<int64_t>(i % kvHeads) * D;
  storeRow<D, S>(
      k + offset,
      reinterpret_cast<uint8_t *>(page + layout.keyOffset + o * kRowBytes),
      reinterpret_cast<float *>(page + layout.keyParamOffset +
                                o * sizeof(float)));
  storeRow<D, S>(
      v + offset,
      reinterpret_cast<uint8_t *>(page + layout.valueOffset + o * kRowBytes),
      reinterpret_cast<float *>(page + layout.valueParamOffset +
                                o * sizeof(float)));
}

/// Encodes one float row of D channels into a low-class row (mixed
/// precision) and its record of D / KG {scale, min} words: called by the
/// 32 lanes of a warp, with `row` and `pairs` the warp's shared scratch.
/// The bytes of kvc_kivi_quantize_value, which a host pool's
/// kvc_append_format writes: each group's minimum and maximum taken in the
/// host's order (first element, then strict comparisons), the record of
/// asymParams, codes kiviCode, packed as kvc_pack_bits (code c at bit
/// (c * bits) % 8 of byte c * bits / 8).
template <int D, int kBits, int KG>
__device__ void storeLowRow(const float *src, uint8_t *dst, uint32_t *record,
                            float *row, float *pairs) {
  constexpr int kGroups = D / KG, kPerByte = 8 / kBits;
  const int lane = threadIdx.x % kWarpSize;
  for (int c = lane; c < D; c += kWarpSize)
    row[c] = src[c];
  __syncwarp();
  for (int g = lane; g < kGroups; g += kWarpSize) {
    float lo = row[g * KG], hi = lo;
    for (int i = g * KG + 1; i < (g + 1) * KG; ++i) {
      lo = row[i] < lo ? row[i] : lo;
      hi = hi < row[i] ? row[i] : hi;
    }
    const AsymParams p = asymParams<kBits>(lo, hi);
    pairs[2 * g] = p.scale;
    pairs[2 * g + 1] = p.min;
    record[g] = p.word;
  }
  __syncwarp();
  for (int b = lane; b < D * kBits / 8; b += kWarpSize) {
    uint32_t byte = 0;
#pragma unroll
    for (int e = 0; e < kPerByte; ++e) {
      const int c = b * kPerByte + e, g = c / KG;
      byte |= kiviCode<kBits>(row[c], pairs[2 * g], pairs[2 * g + 1])
              << (e * kBits);
    }
    dst[b] = static_cast<uint8_t>(byte);
  }
  __syncwarp();
}

/// storeEntries for the low class of a mixed-precision context: writes
/// `count` entries, one warp each, into low-page rows (StoreEntry's scale
/// addresses are the entries' {scale, min} records; lowStoreEntry).
template <int D, int kBits, int KG>
__global__ void __launch_bounds__(kStoreThreads)
    storeLowEntries(const StoreEntry *entries, int32_t count, const float *k,
                    const float *v, int64_t kvStride) {
  constexpr int kWarps = kStoreThreads / kWarpSize;
  __shared__ float rows[kWarps][D], pairs[kWarps][2 * (D / KG)];
  const int warp = threadIdx.x / kWarpSize;
  const int32_t e = blockIdx.x * kWarps + warp;
  if (e >= count)
    return;
  const StoreEntry s = entries[e];
  const int64_t offset = s.row * kvStride + static_cast<int64_t>(s.head) * D;
  storeLowRow<D, kBits, KG>(k + offset, reinterpret_cast<uint8_t *>(s.key),
                            reinterpret_cast<uint32_t *>(s.keyScale),
                            rows[warp], pairs[warp]);
  storeLowRow<D, kBits, KG>(v + offset, reinterpret_cast<uint8_t *>(s.value),
                            reinterpret_cast<uint32_t *>(s.valueScale),
                            rows[warp], pairs[warp]);
}

//===----------------------------------------------------------------------===//
// Decode attention: split-KV with exact statistics
//===----------------------------------------------------------------------===//

/// Arguments of decodeAttentionSplit.
struct DecodeSplitArgs {
  const HeadTable *heads;
  PageLayout layout;
  const float *q;     ///< kv_heads * G rows of D floats.
  float scale;        ///< Softmax scale.
  int32_t splitSlots; ///< Slots per split.
  int32_t numSplits;
  int64_t stride; ///< Row stride of `logits` (>= every head's num_slots).
  /// Per head, G rows of `stride` unnormalized logits (-inf: free slot),
  /// for the statistics that the fold kernel forms from them; null when no
  /// statistic reads them (a decode without attention statistics), and then
  /// no logit is stored: 4 G bytes per slot less written.
  float *logits;
  /// Per (head, split, g): {m, z, acc[D]}: the split's maximum logit, its
  /// sum of exp(l - m), and its exp-weighted value sum.
  float *partials;
  /// When not null: the output rows (G per head, D floats each) into which
  /// the last block of each head to finish merges the head's splits
  /// (mergeInLastSplit), so that no kernel after the attention does; the
  /// heads' HeadTable::arrivals count the blocks in. Null when a later
  /// kernel merges (the fold of a decode with statistics).
  float *mergeOut = nullptr;
  /// The share of the logits' lines stored evict-last (logitPolicy,
  /// logitsKeepFraction); 0: none.
  float logitsKeep = 0.0f;
};

template <int G, int D, int kThreads>
__device__ void mergeInLastSplit(const DecodeSplitArgs &a, const HeadTable &t,
                                 int32_t h);

/// Floats of one (head, split, g) partial record.
template <int D> __host__ __device__ constexpr int partialFloats() { return D + 2; }

/// The split's partial records of kv-head h from the row groups' states
/// (groupMax, groupSum per group and query head) and the block's value
/// sums (blockAcc, each group's already times e^(m_r - M)): per query head
/// {M, Z, acc[D]}, M = max_r m_r, Z = sum_r z_r e^(m_r - M) (a group
/// without a live row adds nothing). Every thread calls it.
template <int G, int D, int kThreads, int kRowGroups>
__device__ void writeSplitRecords(const DecodeSplitArgs &a, int32_t h,
                                  int32_t split,
                                  const float (&groupMax)[kRowGroups][G],
                                  const float (&groupSum)[kRowGroups][G],
                                  const float (&blockAcc)[G][D]) {
  float *out = a.partials + ((static_cast<int64_t>(h) * a.numSplits + split) *
                             G) * partialFloats<D>();
  for (int i = threadIdx.x; i < G * partialFloats<D>(); i += kThreads) {
    const int g = i / partialFloats<D>(), x = i % partialFloats<D>();
    float bm = kNegInf;
    for (int r = 0; r < kRowGroups; ++r)
      bm = fmaxf(bm, groupMax[r][g]);
    if (x == 0) {
      out[i] = bm;
    } else if (x == 1) {
      float bz = 0.0f;
      for (int r = 0; r < kRowGroups; ++r)
        if (groupMax[r][g] != kNegInf)
          bz += groupSum[r][g] * expf(groupMax[r][g] - bm);
      out[i] = bz;
    } else {
      out[i] = blockAcc[g][x - 2];
    }
  }
}

/// The end of a decode split block: combines the online softmax states
/// (m, z) of its row groups, in row-group order, into the split's partial
/// record. `addAcc(g, factor, sum)` adds the calling thread's value sum of
/// query head g, times factor, into the block's sum[g][channel].
template <int G, int D, int kThreads, int kRowGroups, typename AddAcc>
__device__ void combineRowGroups(const DecodeSplitArgs &a, int32_t h,
                                 int32_t split, int rowGroup, bool leader,
                                 const float (&m)[G], const float (&z)[G],
                                 AddAcc addAcc) {
  __shared__ float groupMax[kRowGroups][G], groupSum[kRowGroups][G];
  __shared__ float blockAcc[G][D];
  if (leader)
#pragma unroll
    for (int g = 0; g < G; ++g) {
      groupMax[rowGroup][g] = m[g];
      groupSum[rowGroup][g] = z[g];
    }
  for (int i = threadIdx.x; i < G * D; i += kThreads)
    (&blockAcc[0][0])[i] = 0.0f;
  __syncthreads();
  float factor[G];
#pragma unroll
  for (int g = 0; g < G; ++g) {
    float bm = kNegInf;
    for (int r = 0; r < kRowGroups; ++r)
      bm = fmaxf(bm, groupMax[r][g]);
    factor[g] = m[g] == kNegInf ? 0.0f : expf(m[g] - bm);
  }
  for (int r = 0; r < kRowGroups; ++r) {
    if (rowGroup == r)
#pragma unroll
      for (int g = 0; g < G; ++g)
        addAcc(g, factor[g], blockAcc);
    __syncthreads();
  }
  writeSplitRecords<G, D, kThreads, kRowGroups>(a, h, split, groupMax,
                                                groupSum, blockAcc);
}

/// combineRowGroups for row groups whose threads hold value sums of query
/// heads in fragments, as decodeKiviMma's: the `leader` thread of a head
/// (`head`) in each group writes the head's m and z, and each thread that
/// `adds` calls `addAcc(factorOf, acc)`, which adds its value sums of head
/// x, times factorOf(x, m_x) (e^(m_x - M) for the head's maximum m_x in
/// the thread's group and M over the groups; 0 where m_x = -inf), into
/// acc[x][channel]. Row-group order, as combineRowGroups.
template <int G, int D, int kThreads, int kRowGroups, typename AddAcc>
__device__ void combineHeadLanes(const DecodeSplitArgs &a, int32_t h,
                                 int32_t split, int rowGroup, int head,
                                 bool leader, float m, float z, bool adds,
                                 AddAcc addAcc) {
  __shared__ float groupMax[kRowGroups][G], groupSum[kRowGroups][G];
  __shared__ float blockAcc[G][D];
  if (leader) {
    groupMax[rowGroup][head] = m;
    groupSum[rowGroup][head] = z;
  }
  for (int i = threadIdx.x; i < G * D; i += kThreads)
    (&blockAcc[0][0])[i] = 0.0f;
  __syncthreads();
  const auto factorOf = [&](int x, float mx) {
    if (mx == kNegInf)
      return 0.0f;
    float bm = kNegInf;
    for (int r = 0; r < kRowGroups; ++r)
      bm = fmaxf(bm, groupMax[r][x]);
    return expf(mx - bm);
  };
  for (int r = 0; r < kRowGroups; ++r) {
    if (rowGroup == r && adds)
      addAcc(factorOf, blockAcc);
    __syncthreads();
  }
  writeSplitRecords<G, D, kThreads, kRowGroups>(a, h, split, groupMax,
                                                groupSum, blockAcc);
}

/// Loads the calling lane's channels (RowShape Shape) of query heads
/// [g0, g0 + kHeads) of kv-head h's group of G, and starts their online
/// softmax: maximum -inf, sum 0, value sums 0.
template <int G, int D, typename Shape, int kHeads>
__device__ __forceinline__ void
startQueryRows(const DecodeSplitArgs &a, int32_t h, int g0, int lane,
               float (&q)[kHeads][Shape::kChunk],
               float (&acc)[kHeads][Shape::kChunk], float (&m)[kHeads],
               float (&z)[kHeads]) {
#pragma unroll
  for (int g = 0; g < kHeads; ++g) {
    m[g] = kNegInf;
    z[g] = 0.0f;
#pragma unroll
    for (int j = 0; j < Shape::kVecsPerLane; ++j)
#pragma unroll
      for (int e = 0; e < Shape::kElemsPerVec; ++e) {
        const int x = j * Shape::kElemsPerVec + e;
        q[g][x] = a.q[(static_cast<int64_t>(h) * G + g0 + g) * D +
                      Shape::channel(j, lane, e)];
        acc[g][x] = 0.0f;
      }
  }
}

/// Moves query head g's running maximum to mNew (finite) for a tile of
/// kRows rows: rescales its sum and value sums once, and turns the tile's
/// logits l[r][g] into weights e^(l - mNew) (0 for a free or masked row,
/// whose logit is -inf), added to the sum. A tile that leaves the maximum
/// where it was skips the rescale (a factor e^0 = 1: the same bits), which
/// is most tiles once the first rows are in.
template <int kHeads, int kChunk, int kRows>
__device__ __forceinline__ void
moveMaximum(int g, float mNew, float (&m)[kHeads], float (&z)[kHeads],
            float (&acc)[kHeads][kChunk], float (&l)[kRows][kHeads]) {
  if (mNew != m[g]) {
    const float rescale = expf(m[g] - mNew);
    m[g] = mNew;
    z[g] *= rescale;
#pragma unroll
    for (int x = 0; x < kChunk; ++x)
      acc[g][x] *= rescale;
  }
#pragma unroll
  for (int r = 0; r < kRows; ++r) {
    l[r][g] = expf(l[r][g] - mNew);
    z[g] += l[r][g];
  }
}

/// The Prefetch of decodeSplitRows that fetches nothing ahead.
struct NoPrefetch {
  static constexpr int kRows = 0;
  __device__ void operator()(int32_t, int32_t) const {}
};

/// Rows each thread of decodeAttentionSplit loads before it uses the first
/// (a tile of its online softmax). More rows keep more bytes in flight and
/// rescale the accumulators less often, but each holds its key and value
/// vectors in registers beside the G query and accumulator rows: with f16
/// and head dim 128 (ptxas, sm_90a), G = 4 takes 128 registers at 2 rows
/// (4 blocks of 128 threads per SM) and 154 at 4 (3 blocks); G = 8 takes
/// 193 at 1 row and 216 at 2 (2 blocks either way).
template <int G> struct DecodeRowsInFlight {
  static constexpr int value = G <= 2 ? 4 : 2;
};

/// The rows of one split of head h, shared by the decode kernels of every
/// storage: each row group takes the slots begin + r, begin + r +
/// kRowGroups, ... of [begin, end); `load(slot, row)` issues a row's loads
/// (and sets row.slot, row.inRange, row.live), `decode(row, value, j, out)`
/// gives the kElemsPerVec channels of vector j of the calling lane (its
/// key, or its value), as floats. Stores every slot's logit and the
/// split's partial record.
template <int G, int D, typename Shape, int kThreads, int kRowsInFlight,
          typename Row, typename Load, typename Decode,
          typename Prefetch = NoPrefetch>
__device__ __forceinline__ void
decodeSplitRows(const DecodeSplitArgs &a, int32_t h, int32_t split,
                int32_t begin, int32_t end, Load load, Decode decode,
                Prefetch prefetch = {}) {
  constexpr int kRowGroups = kThreads / Shape::kLanes;
  constexpr int kChunk = Shape::kChunk;
  const int lane = threadIdx.x % Shape::kLanes;
  const int rowGroup = threadIdx.x / Shape::kLanes;
  float q[G][kChunk], acc[G][kChunk], m[G], z[G];
  startQueryRows<G, D, Shape>(a, h, 0, lane, q, acc, m, z);
  const uint64_t logitHint = logitPolicy(a.logitsKeep);

  // The scaled logits of a loaded row (every lane of the row gets them),
  // stored for the statistics.
  auto logitsOf = [&](const Row &r, float (&l)[G]) {
#pragma unroll
    for (int g = 0; g < G; ++g)
      l[g] = 0.0f;
    if (r.live) {
#pragma unroll
      for (int j = 0; j < Shape::kVecsPerLane; ++j) {
        float kf[Shape::kElemsPerVec];
        decode(r, false, j, kf);
#pragma unroll
        for (int g = 0; g < G; ++g)
#pragma unroll
          for (int e = 0; e < Shape::kElemsPerVec; ++e)
            l[g] += q[g][j * Shape::kElemsPerVec + e] * kf[e];
      }
    }
#pragma unroll
    for (int g = 0; g < G; ++g) {
#pragma unroll
      for (int o = Shape::kLanes / 2; o > 0; o /= 2)
        l[g] += __shfl_xor_sync(kFullMask, l[g], o);
      l[g] = r.live ? l[g] * a.scale : kNegInf;
    }
#pragma unroll
    for (int g = 0; g < G; ++g)
      storeLogitIf(a.logits && r.inRange && lane == 0, a.logits,
                   (static_cast<int64_t>(h) * G + g) * a.stride + r.slot, l[g],
                   logitHint);
  };

  // Row group r takes the slots begin + r, begin + r + kRowGroups, ... in
  // order, kRowsInFlight at a time: their loads are all issued before the
  // first is used, so that more bytes are in flight per thread, and the
  // online softmax moves its maximum once per tile of rows (one rescale of
  // the accumulators per tile rather than per row). Every thread runs the
  // same trip count so that the shuffles stay convergent; rows past the
  // split or free are masked (logit -inf, weight 0).
  constexpr int kStep = kRowGroups * kRowsInFlight;
  for (int32_t base = begin; base < end; base += kStep) {
    // The rows Prefetch::kRows ahead of this tile's, into L2.
    prefetch(base + Prefetch::kRows, kStep);
    Row rows[kRowsInFlight];
#pragma unroll
    for (int u = 0; u < kRowsInFlight; ++u)
      load(base + u * kRowGroups + rowGroup, rows[u]);
    float l[kRowsInFlight][G];
#pragma unroll
    for (int u = 0; u < kRowsInFlight; ++u)
      logitsOf(rows[u], l[u]);
    // The tile's maximum, the accumulators' rescale and the rows' weights.
#pragma unroll
    for (int g = 0; g < G; ++g) {
      float mNew = m[g];
#pragma unroll
      for (int u = 0; u < kRowsInFlight; ++u)
        mNew = fmaxf(mNew, l[u][g]);
      if (mNew != kNegInf) // else no live row yet: nothing to add
        moveMaximum(g, mNew, m, z, acc, l);
    }
#pragma unroll
    for (int u = 0; u < kRowsInFlight; ++u) {
      if (!rows[u].live)
        continue;
#pragma unroll
      for (int j = 0; j < Shape::kVecsPerLane; ++j) {
        float vf[Shape::kElemsPerVec];
        decode(rows[u], true, j, vf);
#pragma unroll
        for (int g = 0; g < G; ++g)
#pragma unroll
          for (int e = 0; e < Shape::kElemsPerVec; ++e)
            acc[g][j * Shape::kElemsPerVec + e] += l[u][g] * vf[e];
      }
    }
  }

  combineRowGroups<G, D, kThreads, kRowGroups>(
      a, h, split, rowGroup, lane == 0, m, z,
      [&](int g, float factor, float (*sum)[D]) {
#pragma unroll
        for (int j = 0; j < Shape::kVecsPerLane; ++j)
#pragma unroll
          for (int e = 0; e < Shape::kElemsPerVec; ++e)
            sum[g][Shape::channel(j, lane, e)] +=
                acc[g][j * Shape::kElemsPerVec + e] * factor;
      });
}


/// Geometry of decodeStagedRows: the block's kWarps warps own G / kWarps
/// query heads each and read every row of the split from shared-memory
/// tiles of kTileRows rows (keys and values: 8 KiB at most, kStages of them
/// in flight), which cp.async fills while the warps work on earlier tiles.
template <int G, int D, Storage S, int kThreads> struct StagedDecode {
  using Shape = RowShape<D, S>;
  static constexpr int kWarps = kThreads / kWarpSize;
  /// Whether the group divides among the warps (else decodeSplitRows).
  static constexpr bool kApplies = kThreads % kWarpSize == 0 && G >= kWarps &&
                                   G % kWarps == 0;
  static constexpr int kHeadsPerWarp = kApplies ? G / kWarps : 1;
  /// Rows a warp reads per vector load (kLanes lanes each).
  static constexpr int kRowsPerPass = kWarpSize / Shape::kLanes;
  static constexpr int kTileRows =
      4096 / Shape::kRowBytes > kRowsPerPass
          ? 4096 / Shape::kRowBytes / kRowsPerPass * kRowsPerPass
          : kRowsPerPass;
  static constexpr int kPasses = kTileRows / kRowsPerPass;
  static constexpr int kStages = 3;
  /// (row, vector) units of a tile: a unit copies the key and the value
  /// vector; a thread takes units threadIdx.x, + kThreads, ...
  static constexpr int kUnits = kTileRows * Shape::kVecs;
  static constexpr int kUnitsPerThread = (kUnits + kThreads - 1) / kThreads;
};

/// The top of a staged decode's loop over its tiles (decodeStagedRows,
/// decodeMmaRows), whose tiles 0 .. kStages - 2 were issued before it and
/// whose `fetch` holds tile i + kStages - 1's slots: on return tile i has
/// landed for every thread, tile i + kStages - 1's copies are out into the
/// stage of tile i - 1 (which every warp is done with), and `fetch` holds
/// tile i + kStages's slots. Under kIssueAhead the copies go out before the
/// wait for tile i, so that kStages tiles are in flight while the block
/// waits (a barrier first, so that no warp still reads tile i - 1's stage,
/// and a second one after the wait); otherwise after it, behind the one
/// barrier that serves both, with kStages - 1 tiles in flight during the
/// wait. With two stages (decodeMmaRows at head dim 128) that is two tiles
/// in flight against one.
template <int kStages, typename Issue, typename Fetch>
__device__ __forceinline__ void nextStagedTile(int32_t i, Issue &issue,
                                               Fetch &fetch) {
  if constexpr (kIssueAhead) {
    __syncthreads();
    issue(i + kStages - 1);
    fetch(i + kStages);
    waitCopies<kStages - 1>();
    __syncthreads();
  } else {
    waitCopies<kStages - 2>();
    __syncthreads();
    issue(i + kStages - 1);
    fetch(i + kStages);
  }
}

/// The position and page address of each of a thread's copy units of a
/// tile of kTileRows rows, kVecs units per row (units threadIdx.x,
/// + kThreads, ... below kUnits): what a staged decode loads one tile
/// ahead of the tile's copies, so that no thread waits on them
/// (decodeStagedRows, decodeMmaRows).
template <int kTileRows, int kVecs, int kThreads> struct TileSlots {
  static constexpr int kUnits = kTileRows * kVecs;
  static constexpr int kUnitsPerThread = (kUnits + kThreads - 1) / kThreads;
  int32_t position[kUnitsPerThread];
  uint64_t page[kUnitsPerThread];

  /// Loads tile `tile` of the split [begin, end) of t (KVC_POSITION_NONE
  /// past the split or the split's numTiles tiles).
  __device__ __forceinline__ void fetch(const HeadTable &t,
                                        const PageDivisor &pages,
                                        int32_t begin, int32_t end,
                                        int32_t numTiles, int32_t tile) {
#pragma unroll
    for (int k = 0; k < kUnitsPerThread; ++k) {
      const int u = threadIdx.x + k * kThreads;
      const int32_t slot = begin + tile * kTileRows + u / kVecs;
      position[k] = KVC_POSITION_NONE;
      page[k] = 0;
      if (tile < numTiles && u < kUnits && slot < end) {
        position[k] = t.positions[slot];
        page[k] = t.pages[pages.page(slot)];
      }
    }
  }

  /// The copies of tile `tile` (fetched): for each of the calling thread's
  /// units, marks its row in liveRows (the unit of vector 0) and calls
  /// free(row, vec) for a free slot or live(row, vec, page, offset) with
  /// the page address and the slot's offset in it.
  template <typename Free, typename Live>
  __device__ __forceinline__ void issue(const PageDivisor &pages,
                                        int32_t begin, int32_t tile,
                                        uint8_t *liveRows, Free free,
                                        Live live) const {
#pragma unroll
    for (int k = 0; k < kUnitsPerThread; ++k) {
      const int u = threadIdx.x + k * kThreads;
      if (u >= kUnits)
        continue;
      const int row = u / kVecs, vec = u % kVecs;
      const bool isLive = position[k] != KVC_POSITION_NONE;
      if (vec == 0)
        liveRows[row] = isLive ? 1 : 0;
      if (!isLive) {
        free(row, vec);
        continue;
      }
      const int32_t slot = begin + tile * kTileRows + row;
      live(row, vec, reinterpret_cast<const uint8_t *>(page[k]),
           static_cast<uint64_t>(pages.offset(slot)));
    }
  }
};

/// decodeSplitRows for a group that divides among the block's warps (one
/// storage class, no KIVI): the block copies each tile of rows of the split
/// into shared memory with cp.async, kStages - 1 tiles ahead of the one its
/// warps work on, and warp w computes query heads [w * Gw, (w + 1) * Gw) of
/// every row from there. A thread thus holds the query and accumulator
/// rows of Gw heads rather than G, and the bytes in flight are the copies'
/// rather than its registers'. Each row's position and page address are
/// loaded one tile before its copies are issued, so that no thread waits on
/// them. Same outputs as decodeSplitRows: every slot's logit (as it
/// computes them: a lane's channels in order, then the butterfly over the
/// row's lanes) and the split's partial record.
template <int G, int D, Storage S, int kThreads>
__device__ __forceinline__ void decodeStagedRows(const DecodeSplitArgs &a,
                                                 const HeadTable &t,
                                                 int32_t h, int32_t split,
                                                 int32_t begin, int32_t end) {
  using P = StagedDecode<G, D, S, kThreads>;
  using Shape = typename P::Shape;
  static_assert(P::kApplies, "the group must divide among the warps");
  constexpr int kTileRows = P::kTileRows, kStages = P::kStages;
  constexpr int kGw = P::kHeadsPerWarp, kChunk = Shape::kChunk;
  constexpr int kRowBytes = Shape::kRowBytes;
  // [stage][key, value][row][bytes], the scales of scaled formats, and
  // whether each row holds a live slot.
  __shared__ __align__(16) uint8_t tiles[kStages][2][kTileRows][kRowBytes];
  __shared__ float scales[kStages][2][Codec<S>::kScaled ? kTileRows : 1];
  __shared__ uint8_t liveRow[kStages][kTileRows];

  const int warp = threadIdx.x / kWarpSize;
  const int lane = threadIdx.x % kWarpSize;
  const int sub = lane / Shape::kLanes;     // the row of a pass
  const int rowLane = lane % Shape::kLanes; // the lane within the row
  const int g0 = warp * kGw;
  const int32_t numTiles =
      end > begin ? (end - begin + kTileRows - 1) / kTileRows : 0;
  const uint64_t logitHint = logitPolicy(a.logitsKeep);

  float q[kGw][kChunk], acc[kGw][kChunk], m[kGw], z[kGw];
  startQueryRows<G, D, Shape>(a, h, g0, rowLane, q, acc, m, z);

  // The position and page address of the calling thread's units of a tile.
  TileSlots<kTileRows, Shape::kVecs, kThreads> ahead;
  static_assert(decltype(ahead)::kUnits == P::kUnits, "tile units");
  auto fetch = [&](int32_t tile) {
    ahead.fetch(t, a.layout.pages, begin, end, numTiles, tile);
  };
  // Issues the copies of a tile's live rows into its stage (one group per
  // thread, empty past the tiles) and marks which rows are live.
  const uint64_t policy = streamPolicy();
  auto issue = [&](int32_t tile) {
    const int st = tile % kStages;
    ahead.issue(
        a.layout.pages, begin, tile, liveRow[st], [](int, int) {},
        [&](int row, int vec, const uint8_t *base, uint64_t o) {
          copyAsyncStreamed(&tiles[st][0][row][vec * 16],
                            base + a.layout.keyOffset + o * kRowBytes +
                                vec * 16,
                            policy);
          copyAsyncStreamed(&tiles[st][1][row][vec * 16],
                            base + a.layout.valueOffset + o * kRowBytes +
                                vec * 16,
                            policy);
          if constexpr (Codec<S>::kScaled)
            if (vec == 0) {
              copyAsync<4>(&scales[st][0][row],
                           base + a.layout.keyParamOffset + o * sizeof(float));
              copyAsync<4>(&scales[st][1][row],
                           base + a.layout.valueParamOffset +
                               o * sizeof(float));
            }
        });
    commitCopies();
  };
  auto decodeRow = [&](int st, int part, int row, int j, float *out) {
    const uint4 raw = *reinterpret_cast<const uint4 *>(
        &tiles[st][part][row][(j * Shape::kLanes + rowLane) * 16]);
    Codec<S>::decode(raw, Codec<S>::kScaled ? scales[st][part][row] : 1.0f,
                     out);
  };

#pragma unroll
  for (int32_t tile = 0; tile < kStages - 1; ++tile) {
    fetch(tile);
    issue(tile);
  }
  fetch(kStages - 1);
  for (int32_t i = 0; i < numTiles; ++i) {
    nextStagedTile<kStages>(i, issue, fetch);

    const int st = i % kStages;
    float l[P::kPasses][kGw];
#pragma unroll
    for (int p = 0; p < P::kPasses; ++p) {
      const int row = p * P::kRowsPerPass + sub;
      const bool live = liveRow[st][row] != 0;
#pragma unroll
      for (int g = 0; g < kGw; ++g)
        l[p][g] = 0.0f;
      if (live) {
#pragma unroll
        for (int j = 0; j < Shape::kVecsPerLane; ++j) {
          float kf[Shape::kElemsPerVec];
          decodeRow(st, 0, row, j, kf);
#pragma unroll
          for (int g = 0; g < kGw; ++g)
#pragma unroll
            for (int e = 0; e < Shape::kElemsPerVec; ++e)
              l[p][g] += q[g][j * Shape::kElemsPerVec + e] * kf[e];
        }
      }
      const int32_t slot = begin + i * kTileRows + row;
#pragma unroll
      for (int g = 0; g < kGw; ++g) {
#pragma unroll
        for (int o = Shape::kLanes / 2; o > 0; o /= 2)
          l[p][g] += __shfl_xor_sync(kFullMask, l[p][g], o);
        l[p][g] = live ? l[p][g] * a.scale : kNegInf;
        storeLogitIf(a.logits && rowLane == 0 && slot < end, a.logits,
                     (static_cast<int64_t>(h) * G + g0 + g) * a.stride + slot,
                     l[p][g], logitHint);
      }
    }
    // The tile's maximum over the warp's rows, one rescale per tile.
#pragma unroll
    for (int g = 0; g < kGw; ++g) {
      float mNew = m[g];
#pragma unroll
      for (int p = 0; p < P::kPasses; ++p)
        mNew = fmaxf(mNew, l[p][g]);
#pragma unroll
      for (int o = Shape::kLanes; o < kWarpSize; o *= 2)
        mNew = fmaxf(mNew, __shfl_xor_sync(kFullMask, mNew, o));
      if (mNew != kNegInf) // else no live row yet: nothing to add
        moveMaximum(g, mNew, m, z, acc, l);
    }
#pragma unroll
    for (int p = 0; p < P::kPasses; ++p) {
      const int row = p * P::kRowsPerPass + sub;
      if (!liveRow[st][row])
        continue;
#pragma unroll
      for (int j = 0; j < Shape::kVecsPerLane; ++j) {
        float vf[Shape::kElemsPerVec];
        decodeRow(st, 1, row, j, vf);
#pragma unroll
        for (int g = 0; g < kGw; ++g)
#pragma unroll
          for (int e = 0; e < Shape::kElemsPerVec; ++e)
            acc[g][j * Shape::kElemsPerVec + e] += l[p][g] * vf[e];
      }
    }
  }

  // The rows of a pass share the warp's maximum: their sums add up.
#pragma unroll
  for (int g = 0; g < kGw; ++g) {
#pragma unroll
    for (int o = Shape::kLanes; o < kWarpSize; o *= 2) {
      z[g] += __shfl_xor_sync(kFullMask, z[g], o);
#pragma unroll
      for (int x = 0; x < kChunk; ++x)
        acc[g][x] += __shfl_xor_sync(kFullMask, acc[g][x], o);
    }
  }
  if (sub != 0)
    return;
#pragma unroll
  for (int g = 0; g < kGw; ++g) {
    float *out = a.partials +
                 ((static_cast<int64_t>(h) * a.numSplits + split) * G + g0 +
                  g) *
                     partialFloats<D>();
    if (rowLane == 0) {
      out[0] = m[g];
      out[1] = z[g];
    }
#pragma unroll
    for (int j = 0; j < Shape::kVecsPerLane; ++j)
#pragma unroll
      for (int e = 0; e < Shape::kElemsPerVec; ++e)
        out[2 + Shape::channel(j, rowLane, e)] =
            acc[g][j * Shape::kElemsPerVec + e];
  }
}

/// The 16-bit element type that tensor cores multiply for storage S (F16
/// or BF16, the stored bytes as they are): rounding of a float to it, and
/// two of them packed into one mma.sync operand register, the lower index
/// in the low half.
template <Storage S> struct MmaElement;

template <> struct MmaElement<Storage::F16> {
  /// Weights are multiplied by kWeightScale before they are rounded, so
  /// that small weights stay normal f16 numbers (the largest, 1, becomes
  /// 4096, far below f16's 65504); the value sums are divided by it.
  static constexpr float kWeightScale = 4096.0f;
  __device__ static float round(float x) {
    return __half2float(__float2half_rn(x));
  }
  __device__ static uint32_t bits(float x) {
    return static_cast<__half_raw>(__float2half_rn(x)).x;
  }
  __device__ static float value(uint32_t bits) {
    __half_raw raw;
    raw.x = static_cast<unsigned short>(bits);
    return __half2float(__half(raw));
  }
  __device__ static uint32_t pack(float lo, float hi) {
    return bits(lo) | bits(hi) << 16;
  }
};

template <> struct MmaElement<Storage::BF16> {
  /// bf16 has float's exponent range: no scaling needed.
  static constexpr float kWeightScale = 1.0f;
  __device__ static float round(float x) {
    return __bfloat162float(__float2bfloat16_rn(x));
  }
  __device__ static uint32_t bits(float x) {
    return static_cast<__nv_bfloat16_raw>(__float2bfloat16_rn(x)).x;
  }
  __device__ static float value(uint32_t bits) {
    return __uint_as_float((bits & 0xffffu) << 16);
  }
  __device__ static uint32_t pack(float lo, float hi) {
    return bits(lo) | bits(hi) << 16;
  }
};

/// a.b of two packed pairs, in float (the products are exact).
template <Storage S> __device__ float dotPair(uint32_t a, uint32_t b) {
  using E = MmaElement<S>;
  return E::value(a) * E::value(b) + E::value(a >> 16) * E::value(b >> 16);
}

#if !defined(__CUDA_ARCH__) || __CUDA_ARCH__ < 800 || defined(KVC_CUDA_EMULATED)
/// The products of mmaK8 away from tensor cores (the emulator, the host
/// pass), from the rows of A and columns of B that lane (g, t) needs: rowA
/// and rowA8 are rows g and g + 8 of A, colB and colB1 columns 2t and 2t +
/// 1 of B, each as the four lanes' pairs. The sums of one tile are formed
/// first and added to C after, as the mma's.
template <Storage S>
__device__ __forceinline__ void mmaK8Products(float (&c)[4],
                                              const uint32_t (&rowA)[4],
                                              const uint32_t (&rowA8)[4],
                                              const uint32_t (&colB)[4],
                                              const uint32_t (&colB1)[4]) {
  float d[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
  for (int s = 0; s < 4; ++s) {
    d[0] += dotPair<S>(rowA[s], colB[s]);
    d[1] += dotPair<S>(rowA[s], colB1[s]);
    d[2] += dotPair<S>(rowA8[s], colB[s]);
    d[3] += dotPair<S>(rowA8[s], colB1[s]);
  }
#pragma unroll
  for (int i = 0; i < 4; ++i)
    c[i] += d[i];
}
#endif

#if defined(KVC_CUDA_EMULATED)
/// M accumulators C_j, each with N products C_j += A_i B_{j,i} (i = 0 ..
/// N-1, in order) of mmaK8 (halves = 1) or mmaK16 (halves = 2), on the
/// emulator, with one exchange for all of them: the A operands are the same
/// for every accumulator (O += P V over M tiles of channels). Each lane
/// publishes its accumulators and its registers converted to float (a[i]:
/// A_i's pairs, b[j][i]: B_{j,i}'s; publishShared); the first lane back
/// gathers each C_j (16 x 8), each A_i (16 x 16) once and each B_{j,i} (16
/// x 8), forms each product's sums per half in the order of mmaK8Products
/// (per sum, the pairs' products added, then the pair to the sum) and adds
/// them to C_j in turn (kvc::emu::formMmaTiles, in the emulator's library,
/// compiled with its optimization); every lane then takes its four of each
/// C_j. The
/// results are those of M N mmaK8Products calls bit for bit, without a warp
/// barrier per product, forming each product in four lanes, or converting a
/// 16-bit element once for every lane that reads it. c[first + j] is C_j.
template <Storage S, int M, int N, int T>
__device__ __forceinline__ void mmaEmulatedColumns(float (&c)[T][4], int first,
                                                   const uint32_t (&a)[N][4],
                                                   const uint32_t (&b)[M][N][2],
                                                   int halves) {
  using E = MmaElement<S>;
  const int lane = threadIdx.x % kWarpSize, g = lane / 4, t = lane % 4;
  // Words 0 .. 2M-1: the C_j's pairs (two per j); then per A_i four words,
  // its registers' pairs (floats 0-7, low element first); then per B_{j,i}
  // two words.
  constexpr int kA = 2 * M, kB = kA + 4 * N, kWords = kB + 2 * M * N;
  static_assert(kWords <= ::kvc::emu::kPublishWords &&
                    M * 16 * 8 <= 2 * ::kvc::emu::kSharedWords,
                "the operands and the tiles fit the exchange");
  const auto pair = [](float lo, float hi) {
    return __float_as_uint(lo) | uint64_t{__float_as_uint(hi)} << 32;
  };
  uint64_t words[kWords];
  for (int j = 0; j < M; ++j) {
    words[2 * j] = pair(c[first + j][0], c[first + j][1]);
    words[2 * j + 1] = pair(c[first + j][2], c[first + j][3]);
  }
  for (int i = 0; i < N; ++i)
    for (int r = 0; r < 4; ++r)
      words[kA + 4 * i + r] = pair(E::value(a[i][r]), E::value(a[i][r] >> 16));
  for (int j = 0; j < M; ++j)
    for (int i = 0; i < N; ++i)
      for (int r = 0; r < 2; ++r)
        words[kB + 2 * (j * N + i) + r] =
            pair(E::value(b[j][i][r]), E::value(b[j][i][r] >> 16));
  uint64_t *result = nullptr;
  bool form = false;
  const uint64_t *w = ::kvc::emu::publishShared(kFullMask, words, kWords,
                                                &result, &form);
  // The warp's C_j, row by row, one tile after another.
  auto *tiles = reinterpret_cast<float(*)[16][8]>(result);
  if (form)
    ::kvc::emu::formMmaTiles(w, M, N, halves, &tiles[0][0][0]);
  for (int j = 0; j < M; ++j) {
    c[first + j][0] = tiles[j][g][2 * t];
    c[first + j][1] = tiles[j][g][2 * t + 1];
    c[first + j][2] = tiles[j][g + 8][2 * t];
    c[first + j][3] = tiles[j][g + 8][2 * t + 1];
  }
}

/// N products C += A_i B_i (i = 0 .. N-1, in order) of mmaK8 (halves = 1)
/// or mmaK16 (halves = 2) on the emulator, with one exchange for all of
/// them: mmaEmulatedColumns of one accumulator.
template <Storage S, int N>
__device__ __forceinline__ void mmaEmulated(float (&c)[4],
                                            const uint32_t (&a)[N][4],
                                            const uint32_t (&b)[N][2],
                                            int halves) {
  float cs[1][4] = {{c[0], c[1], c[2], c[3]}};
  uint32_t bs[1][N][2];
  for (int i = 0; i < N; ++i) {
    bs[0][i][0] = b[i][0];
    bs[0][i][1] = b[i][1];
  }
  mmaEmulatedColumns<S, 1, N>(cs, 0, a, bs, halves);
  for (int r = 0; r < 4; ++r)
    c[r] = cs[0][r];
}
#endif

/// C += A B for one 16x8x8 tile (mma.sync m16n8k8, float accumulators),
/// in the fragment layout of the PTX ISA: lane (g, t) = (lane / 4,
/// lane % 4) holds a0 = A[g][2t, 2t+1], a1 = A[g+8][2t, 2t+1], b0 =
/// B[2t, 2t+1][g] and c = {C[g][2t], C[g][2t+1], C[g+8][2t], C[g+8][2t+1]}.
/// The whole warp calls it, converged.
template <Storage S>
__device__ __forceinline__ void mmaK8(float (&c)[4], uint32_t a0, uint32_t a1,
                                      uint32_t b0) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800 && !defined(KVC_CUDA_EMULATED)
  if constexpr (S == Storage::F16)
    asm volatile("mma.sync.aligned.m16n8k8.row.col.f32.f16.f16.f32 "
                 "{%0, %1, %2, %3}, {%4, %5}, {%6}, {%0, %1, %2, %3};\n"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a0), "r"(a1), "r"(b0));
  else
    asm volatile("mma.sync.aligned.m16n8k8.row.col.f32.bf16.bf16.f32 "
                 "{%0, %1, %2, %3}, {%4, %5}, {%6}, {%0, %1, %2, %3};\n"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a0), "r"(a1), "r"(b0));
#elif defined(KVC_CUDA_EMULATED)
  const uint32_t a[1][4] = {{a0, a1, 0u, 0u}}, b[1][2] = {{b0, 0u}};
  mmaEmulated<S, 1>(c, a, b, 1);
#else
  // Elsewhere (devices before sm_80, the host pass): the same products
  // from the warp's registers. Row g of A is in lanes 4g .. 4g+3, column n
  // of B in lanes 4n .. 4n+3.
  const int lane = threadIdx.x % kWarpSize, g = lane / 4, t = lane % 4;
  uint32_t rowA[4], rowA8[4], colB[4], colB1[4];
#pragma unroll
  for (int s = 0; s < 4; ++s) {
    rowA[s] = __shfl_sync(kFullMask, a0, 4 * g + s);
    rowA8[s] = __shfl_sync(kFullMask, a1, 4 * g + s);
    colB[s] = __shfl_sync(kFullMask, b0, 4 * (2 * t) + s);
    colB1[s] = __shfl_sync(kFullMask, b0, 4 * (2 * t + 1) + s);
  }
  mmaK8Products<S>(c, rowA, rowA8, colB, colB1);
#endif
}

/// C += A B for one 16x8x16 tile (mma.sync m16n8k16): a = {A[g][2t, 2t+1],
/// A[g+8][2t, 2t+1], A[g][2t+8, 2t+9], A[g+8][2t+8, 2t+9]}, b = {B[2t,
/// 2t+1][g], B[2t+8, 2t+9][g]}, c as mmaK8.
template <Storage S>
__device__ __forceinline__ void mmaK16(float (&c)[4], const uint32_t (&a)[4],
                                       uint32_t b0, uint32_t b1) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800 && !defined(KVC_CUDA_EMULATED)
  if constexpr (S == Storage::F16)
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 "
                 "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
                 "{%0, %1, %2, %3};\n"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0),
                   "r"(b1));
  else
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 "
                 "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
                 "{%0, %1, %2, %3};\n"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0),
                   "r"(b1));
#elif defined(KVC_CUDA_EMULATED)
  // Columns 0-7 of A with rows 0-7 of B, then the rest.
  const uint32_t as[1][4] = {{a[0], a[1], a[2], a[3]}}, b[1][2] = {{b0, b1}};
  mmaEmulated<S, 1>(c, as, b, 2);
#else
  // Columns 0-7 of A with rows 0-7 of B, then the rest.
  mmaK8<S>(c, a[0], a[1], b0);
  mmaK8<S>(c, a[2], a[3], b1);
#endif
}

/// C += A_lo B_hi + A_hi B_lo + A_hi B_hi, in that order: the three
/// mmaK16 products of operands split into bf16 hi and lo parts (splitPair),
/// the lo * lo term left out. On the emulator one exchange for the three.
/// The whole warp calls it, converged.
__device__ __forceinline__ void mmaK16Split(float (&c)[4],
                                            const uint32_t (&aHi)[4],
                                            const uint32_t (&aLo)[4],
                                            uint32_t bh0, uint32_t bh1,
                                            uint32_t bl0, uint32_t bl1) {
#if defined(KVC_CUDA_EMULATED)
  const uint32_t a[3][4] = {{aLo[0], aLo[1], aLo[2], aLo[3]},
                            {aHi[0], aHi[1], aHi[2], aHi[3]},
                            {aHi[0], aHi[1], aHi[2], aHi[3]}};
  const uint32_t b[3][2] = {{bh0, bh1}, {bl0, bl1}, {bh0, bh1}};
  mmaEmulated<Storage::BF16, 3>(c, a, b, 2);
#else
  mmaK16<Storage::BF16>(c, aLo, bh0, bh1);
  mmaK16<Storage::BF16>(c, aHi, bl0, bl1);
  mmaK16<Storage::BF16>(c, aHi, bh0, bh1);
#endif
}

/// mmaK16Split into M accumulators with the same A: c[first + j] += A
/// B_j (j = 0 .. M-1, in order), B_j's registers bh0[j], bh1[j] (hi) and
/// bl0[j], bl1[j] (lo): O += P V over M tiles of eight channels. On the
/// emulator one exchange for the 3 M products.
template <int M, int T>
__device__ __forceinline__ void mmaK16SplitColumns(
    float (&c)[T][4], int first, const uint32_t (&aHi)[4],
    const uint32_t (&aLo)[4], const uint32_t (&bh0)[M],
    const uint32_t (&bh1)[M], const uint32_t (&bl0)[M],
    const uint32_t (&bl1)[M]) {
#if defined(KVC_CUDA_EMULATED)
  const uint32_t a[3][4] = {{aLo[0], aLo[1], aLo[2], aLo[3]},
                            {aHi[0], aHi[1], aHi[2], aHi[3]},
                            {aHi[0], aHi[1], aHi[2], aHi[3]}};
  uint32_t b[M][3][2];
  for (int j = 0; j < M; ++j) {
    b[j][0][0] = b[j][2][0] = bh0[j];
    b[j][0][1] = b[j][2][1] = bh1[j];
    b[j][1][0] = bl0[j];
    b[j][1][1] = bl1[j];
  }
  mmaEmulatedColumns<Storage::BF16, M, 3>(c, first, a, b, 2);
#else
#pragma unroll
  for (int j = 0; j < M; ++j)
    mmaK16Split(c[first + j], aHi, aLo, bh0[j], bh1[j], bl0[j], bl1[j]);
#endif
}

/// C += A B for one 16x8x32 tile of unsigned bytes (mma.sync m16n8k32
/// u8.u8, exact 32-bit integer sums), in the PTX ISA's fragment layout:
/// lane (g, t) holds a = {A[g][4t .. 4t+3], A[g+8][4t .. 4t+3], A[g][4t+16
/// .. 4t+19], A[g+8][4t+16 .. 4t+19]} (byte i of a register: the i-th of
/// its four k), b = {B[4t .. 4t+3][g], B[4t+16 .. 4t+19][g]} and c =
/// {C[g][2t], C[g][2t+1], C[g+8][2t], C[g+8][2t+1]}. The whole warp calls
/// it, converged.
__device__ __forceinline__ void mmaK32U8(int32_t (&c)[4],
                                         const uint32_t (&a)[4], uint32_t b0,
                                         uint32_t b1) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800 && !defined(KVC_CUDA_EMULATED)
  asm volatile("mma.sync.aligned.m16n8k32.row.col.s32.u8.u8.s32 "
               "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
               "{%0, %1, %2, %3};\n"
               : "+r"(c[0]), "+r"(c[1]), "+r"(c[2]), "+r"(c[3])
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0),
                 "r"(b1));
#elif defined(KVC_CUDA_EMULATED)
  // On the emulator the first lane back from the exchange forms the 16 x 8
  // sums of the tile once (exact integers: any order; see mmaEmulated) and
  // every lane adds its four to C. Lane 4r + s holds k 4s .. 4s+3 of rows r
  // and r + 8 (a0, a1) and k 4s+16 .. 4s+19 (a2, a3), and the same k of
  // column r of B (b0, b1).
  static_assert(16 * 8 <= 2 * ::kvc::emu::kSharedWords,
                "the tile's sums fit the exchange");
  const int lane = threadIdx.x % kWarpSize, g = lane / 4, t = lane % 4;
  const uint64_t words[3] = {a[0] | uint64_t{a[1]} << 32,
                             a[2] | uint64_t{a[3]} << 32,
                             b0 | uint64_t{b1} << 32};
  uint64_t *result = nullptr;
  bool form = false;
  const uint64_t *w =
      ::kvc::emu::publishShared(kFullMask, words, 3, &result, &form);
  auto *d = reinterpret_cast<int32_t(*)[8]>(result);
  if (form) {
    int32_t A[16][32], B[32][8];
    for (int l = 0; l < kWarpSize; ++l) {
      const int r = l / 4, k = 4 * (l % 4);
      const uint64_t *x = w + l * ::kvc::emu::kPublishWords;
      for (int i = 0; i < 4; ++i) {
        const int shift = 8 * i;
        A[r][k + i] = static_cast<int32_t>(x[0] >> shift & 0xffu);
        A[r + 8][k + i] = static_cast<int32_t>(x[0] >> (32 + shift) & 0xffu);
        A[r][k + 16 + i] = static_cast<int32_t>(x[1] >> shift & 0xffu);
        A[r + 8][k + 16 + i] =
            static_cast<int32_t>(x[1] >> (32 + shift) & 0xffu);
        B[k + i][r] = static_cast<int32_t>(x[2] >> shift & 0xffu);
        B[k + 16 + i][r] = static_cast<int32_t>(x[2] >> (32 + shift) & 0xffu);
      }
    }
    for (int r = 0; r < 16; ++r) {
      int32_t sum[8] = {};
      for (int k = 0; k < 32; ++k)
        for (int n = 0; n < 8; ++n)
          sum[n] += A[r][k] * B[k][n];
      for (int n = 0; n < 8; ++n)
        d[r][n] = sum[n];
    }
  }
  c[0] += d[g][2 * t];
  c[1] += d[g][2 * t + 1];
  c[2] += d[g + 8][2 * t];
  c[3] += d[g + 8][2 * t + 1];
#else
  // Row g of A is in lanes 4g .. 4g+3, column n of B in lanes 4n .. 4n+3:
  // lane 4g + s holds k 4s .. 4s+3 of both rows (a0, a1) and k 4s+16 ..
  // 4s+19 (a2, a3), lane 4n + s those of column n (b0, b1).
  const int lane = threadIdx.x % kWarpSize, g = lane / 4, t = lane % 4;
  const auto word = [&](int source, int i) {
    const uint32_t lo = __shfl_sync(kFullMask, i == 2 ? b0 : a[2 * i], source);
    const uint32_t hi =
        __shfl_sync(kFullMask, i == 2 ? b1 : a[2 * i + 1], source);
    return lo | uint64_t{hi} << 32;
  };
  int32_t d[4] = {0, 0, 0, 0};
  const auto dot = [](uint32_t x, uint32_t y) {
    int32_t sum = 0;
    for (int i = 0; i < 4; ++i)
      sum += static_cast<int32_t>((x >> 8 * i & 0xffu) * (y >> 8 * i & 0xffu));
    return sum;
  };
  for (int s = 0; s < 4; ++s)
    for (int half = 0; half < 2; ++half) {
      // k 4s + 16 half .. +3: A's word `half`, B's word 2, shifted by half.
      const uint64_t rows = word(4 * g + s, half);
      const uint32_t b = static_cast<uint32_t>(word(4 * (2 * t) + s, 2) >>
                                               (32 * half));
      const uint32_t b1 = static_cast<uint32_t>(
          word(4 * (2 * t + 1) + s, 2) >> (32 * half));
      d[0] += dot(static_cast<uint32_t>(rows), b);
      d[1] += dot(static_cast<uint32_t>(rows), b1);
      d[2] += dot(static_cast<uint32_t>(rows >> 32), b);
      d[3] += dot(static_cast<uint32_t>(rows >> 32), b1);
    }
  for (int i = 0; i < 4; ++i)
    c[i] += d[i];
#endif
}

/// The rescale of value sums held as columns (C fragments of O^T += V^T
/// P^T, the tensor-core decodes, kHeads = 4 at G <= 4 and 8 at G > 4):
/// lane (g, t) holds columns 2t and 2t + 1, whose heads (2t % kHeads and
/// (2t + 1) % kHeads; kHeads = 4: rounded weights in columns 0-3, their
/// remainders in 4-7; kHeads = 8: a head a column) have their running
/// maxima in lanes 4 head, each with its `rescale` (1 where the maximum
/// stayed). The whole warp calls it, converged.
template <int kHeads = 4, int kBlocks>
__device__ __forceinline__ void rescaleColumns(float (&o)[kBlocks][4],
                                               float rescale) {
  static_assert(kHeads == 4 || kHeads == 8, "four or eight heads' columns");
  const int t = threadIdx.x % 4;
  const float r0 = __shfl_sync(kFullMask, rescale, 8 * t % (4 * kHeads));
  const float r1 =
      __shfl_sync(kFullMask, rescale, (8 * t + 4) % (4 * kHeads));
  if (r0 != 1.0f || r1 != 1.0f)
#pragma unroll
    for (int j = 0; j < kBlocks; ++j) {
      o[j][0] *= r0;
      o[j][1] *= r1;
      o[j][2] *= r0;
      o[j][3] *= r1;
    }
}

/// The B operands (mmaK8) of four 8x8 blocks of a row-major tile of 16-bit
/// elements in shared memory: `rows` points at element (0, 0) of eight rows
/// `pitch` bytes apart, and block i is columns column0 + 8i .. +7. Lane (g,
/// t) receives b[i] = {X[2t][column0 + 8i + g], X[2t+1][column0 + 8i + g]}
/// (ldmatrix .x4 .trans). Rows are 16-byte aligned. The whole warp calls
/// it, converged.
__device__ __forceinline__ void loadTransposed(const uint8_t *rows, int pitch,
                                               int column0, uint32_t (&b)[4]) {
  const int lane = threadIdx.x % kWarpSize;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800 && !defined(KVC_CUDA_EMULATED)
  // Lanes 8i .. 8i+7 name the rows of block i.
  const unsigned address = static_cast<unsigned>(__cvta_generic_to_shared(
      rows + (lane % 8) * pitch + 2 * (column0 + 8 * (lane / 8))));
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 "
               "{%0, %1, %2, %3}, [%4];\n"
               : "=r"(b[0]), "=r"(b[1]), "=r"(b[2]), "=r"(b[3])
               : "r"(address));
#else
  const int g = lane / 4, t = lane % 4;
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const int c = column0 + 8 * i + g;
    const uint32_t lo =
        reinterpret_cast<const uint16_t *>(rows + 2 * t * pitch)[c];
    const uint32_t hi =
        reinterpret_cast<const uint16_t *>(rows + (2 * t + 1) * pitch)[c];
    b[i] = lo | hi << 16;
  }
#endif
}

/// Geometry of decodeMmaRows: each of the block's kWarps warps takes eight
/// rows of every tile of kTileRows, whose keys and values cp.async copies
/// into shared memory rows of kPitch bytes (16 more than a row, so that the
/// eight rows of a fragment load fall into different banks), kStages tiles
/// in flight (two where three would pass 32 KiB).
template <int G, int D, Storage S, int kThreads> struct MmaDecode {
  /// 16-bit storage (what tensor cores read as stored), a group that fits
  /// the eight rows of a fragment, and whole warps.
  static constexpr bool kApplies =
      kTensorCores && (S == Storage::F16 || S == Storage::BF16) && G >= 2 &&
      G <= 8 && D % 32 == 0 && kThreads % kWarpSize == 0;
  static constexpr int kWarps = kThreads / kWarpSize;
  static constexpr int kKeysPerWarp = 8;
  static constexpr int kTileRows = kWarps * kKeysPerWarp;
  static constexpr int kRowBytes = 2 * D;
  static constexpr int kPitch = kRowBytes + 16;
  static constexpr int kVecs = kRowBytes / 16;
  static constexpr int kUnits = kTileRows * kVecs;
  static constexpr int kUnitsPerThread = (kUnits + kThreads - 1) / kThreads;
  static constexpr int kStageBytes = 2 * kTileRows * kPitch;
  static constexpr int kStages = 3 * kStageBytes <= 32 * 1024 ? 3 : 2;
  /// Steps of 16 channels (the logits) and blocks of 8 (the value sums).
  static constexpr int kKSteps = D / 16;
  static constexpr int kNBlocks = D / 8;
  /// Whether the query's A fragments (4 words per lane and step, the same
  /// in every warp) live in shared memory rather than in each thread's
  /// registers: at head dim 128 and above, where the 32 registers (and
  /// more) that they take decide how many blocks fit an SM. ptxas
  /// (sm_90a, G = 2 to 8): 158 to 162 registers at head dim 128 in
  /// registers (three blocks of 128 threads), 126 to 128 from shared
  /// memory (four), for 6 to 16 more instructions in a tile of about 550
  /// (one 16-byte shared load per step). At head dim 64 the fragments
  /// take 16 registers and the block count would rise from 5 to 7 for
  /// about 10% more instructions a tile: they stay in registers there.
  static constexpr bool kSharedQuery = kMmaSharedQuery && D >= 128;
  /// Blocks of 128 threads per SM that the launch bounds ask for
  /// (DecodeMinBlocks): at head dim 128 with the query in shared memory,
  /// five where the value sums are held as columns (G <= 4: 91 to 92
  /// registers, no spill; under a four-block bound ptxas takes 96 to 102,
  /// and the five blocks cost 5 to 44 instructions a tile of about 530,
  /// by the translation unit; G = 8, the heads as columns: 93 registers,
  /// no spill, a tile loop of 511 to 513 instructions, where the weights
  /// as A took 127 registers, four blocks and 530 to 532) and four
  /// otherwise (126 to 128 registers); at head dim 64 with the value sums
  /// as columns, six (G <= 4: 72 registers, seven blocks fit, as many as
  /// shared memory allows, and a tile loop of 327 instructions, where
  /// ptxas left free takes 64 and 341; G = 8: 70 registers and 328, where
  /// the weights as A took 80 and 347); none elsewhere (ptxas's choice).
  static constexpr int kMinBlocks =
      kSharedQuery && D == 128
          ? (kMmaTransposedValues ? 5 : 4) * 128 / kThreads
      : D == 64 && kMmaTransposedValues ? 6 * 128 / kThreads
                                        : 0;
  /// Whether the value sums go as O^T += V^T P^T (G <= 4): the value rows
  /// as A (16 channels a block, the same ldmatrix .trans fragments), the
  /// weights as B (columns 0-3 the heads' rounded weights, 4-7 their
  /// remainders), so that one mma takes 16 channels instead of 8 and the
  /// accumulators of a lane are D / 4 floats instead of D / 2. Needs
  /// lanes g and g + 4 to hold the same head's weights: rows 4-7 of the
  /// logits' A repeat the heads of rows 0-3 (KVC_CUDA_MMA_TRANSPOSED_VALUES
  /// = 0 keeps the weights as A for every G).
  static constexpr bool kTransposedValues = kMmaTransposedValues && G <= 4;
  /// Whether the value sums go as O^T += V^T P^T with the heads as B's
  /// columns (G > 4): lane (g, t) holds head g's weights of rows 2t and
  /// 2t + 1, which are B's column g already, and the rounded weights and
  /// their remainders go as two B operands into the same sums: as many
  /// mmas as with the weights as A (two per 16 channels), half the
  /// accumulators.
  static constexpr bool kHeadColumns = kMmaTransposedValues && G > 4;
  /// Whether the value sums are held as columns (either form above).
  static constexpr bool kColumnSums = kTransposedValues || kHeadColumns;
  /// Accumulator blocks of 4 floats a lane: 16 channels each when held as
  /// columns, else 8.
  static constexpr int kAccBlocks = kColumnSums ? D / 16 : D / 8;
  /// Query head of fragment row g (and g + 8) of the logits' A.
  __device__ static int queryHead(int g) {
    return kTransposedValues ? g % 4 : g;
  }
};

/// decodeSplitRows on tensor cores, for 16-bit storage and 2 <= G <= 8
/// (MmaDecode::kApplies). Warp w takes rows 8w .. 8w+7 of every tile of
/// the split and runs an online softmax over them for every query head:
///  - logits: S = Q K^T with mma.sync m16n8k16, the eight rows of the warp
///    as the eight columns and the heads as rows 0 .. G-1 of A; rows 8 ..
///    8+G-1 hold the remainder q - round(q) of each query (q scaled by the
///    softmax scale), so that the two row halves of S add up to the logit
///    of a query of 16 significant bits rather than 8 (bf16) or 11 (f16);
///  - value sums: O += P V with m16n8k8, the weights e^(l - m) of the eight
///    rows as A, likewise split into rounded part (rows 0-7) and remainder
///    (rows 8-15); B from ldmatrix .trans of the value rows.
/// Lane (g, t) thus holds query head g's logits of rows 2t and 2t+1 and its
/// value sums of channels 8j + 2t, 8j + 2t + 1: a row's keys and values are
/// read from shared memory once per block and never converted to float.
/// Free rows (and rows past the split) get zero values in shared memory
/// and the logit -inf. The warps' states are combined into the split's
/// partial record as in decodeSplitRows (combineRowGroups).
template <int G, int D, Storage S, int kThreads>
__device__ __forceinline__ void decodeMmaRows(const DecodeSplitArgs &a,
                                              const HeadTable &t, int32_t h,
                                              int32_t split, int32_t begin,
                                              int32_t end) {
  using P = MmaDecode<G, D, S, kThreads>;
  using E = MmaElement<S>;
  static_assert(P::kApplies, "decodeMmaRows: 16-bit storage, 2 <= G <= 8");
  constexpr int kTileRows = P::kTileRows, kStages = P::kStages;
  constexpr int kPitch = P::kPitch, kVecs = P::kVecs;
  // [stage][key, value][row][bytes], and whether each row holds a live
  // slot.
  __shared__ __align__(16) uint8_t tiles[kStages][2][kTileRows][kPitch];
  __shared__ uint8_t liveRow[kStages][kTileRows];

  const int warp = threadIdx.x / kWarpSize;
  const int lane = threadIdx.x % kWarpSize;
  const int g = lane / 4, tq = lane % 4;
  const int32_t numTiles =
      end > begin ? (end - begin + kTileRows - 1) / kTileRows : 0;
  const uint64_t logitHint = logitPolicy(a.logitsKeep);

  // A of the logits: per 16 channels, {round(q), q - round(q)} of head g at
  // channels 2t, 2t+1, then at 2t+8, 2t+9 (zero past the group). Every
  // warp multiplies the same fragments: where P::kSharedQuery, warp 0
  // writes them to shared memory (read after the barrier that the loop's
  // first nextStagedTile begins with) and each step loads its own;
  // otherwise each thread keeps all of them in registers.
  auto queryFragment = [&](int ks, uint32_t(&f)[4]) {
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const int c = ks * 16 + half * 8 + 2 * tq;
      float x0 = 0.0f, x1 = 0.0f;
      const int head = P::queryHead(g);
      if (head < G) {
        const float *row = a.q + (static_cast<int64_t>(h) * G + head) * D;
        x0 = row[c] * a.scale;
        x1 = row[c + 1] * a.scale;
      }
      const float r0 = E::round(x0), r1 = E::round(x1);
      f[2 * half] = E::pack(r0, r1);
      f[2 * half + 1] = E::pack(x0 - r0, x1 - r1);
    }
  };
  constexpr int kHeldSteps = P::kSharedQuery ? 1 : P::kKSteps;
  __shared__ __align__(16) uint4
      sharedQuery[P::kSharedQuery ? P::kKSteps : 1][kWarpSize];
  uint32_t qa[kHeldSteps][4];
  if constexpr (P::kSharedQuery) {
    if (warp == 0)
#pragma unroll
      for (int ks = 0; ks < P::kKSteps; ++ks) {
        queryFragment(ks, qa[0]);
        sharedQuery[ks][lane] = make_uint4(qa[0][0], qa[0][1], qa[0][2],
                                           qa[0][3]);
      }
  } else {
#pragma unroll
    for (int ks = 0; ks < P::kKSteps; ++ks)
      queryFragment(ks, qa[ks]);
  }
  // Head g's online softmax over the warp's rows (lanes g and g + 4 the
  // same head's where P::kTransposedValues): m and z (the lane's rows'
  // share of z), and the value sums, times E::kWeightScale: of head g's
  // rounded (o[j][0..1]) and remainder (o[j][2..3]) weights, channels 8j +
  // 2t, 8j + 2t + 1; as columns, of channels 16j + g (o[j][0..1]) and
  // 16j + 8 + g (o[j][2..3]) for columns 2t, 2t + 1 (transposed: heads 2t,
  // 2t + 1 rounded at t < 2, heads 2t - 4, 2t - 3 remainders at t >= 2;
  // kHeadColumns: heads 2t, 2t + 1, both parts).
  float m = kNegInf, z = 0.0f;
  float o[P::kAccBlocks][4];
#pragma unroll
  for (int j = 0; j < P::kAccBlocks; ++j)
#pragma unroll
    for (int x = 0; x < 4; ++x)
      o[j][x] = 0.0f;

  // The position and page address of the calling thread's units of a tile.
  TileSlots<kTileRows, kVecs, kThreads> ahead;
  static_assert(decltype(ahead)::kUnits == P::kUnits, "tile units");
  auto fetch = [&](int32_t tile) {
    ahead.fetch(t, a.layout.pages, begin, end, numTiles, tile);
  };
  // Issues the copies of a tile's live rows into its stage (one group per
  // thread), zeroes the value rows of the others (a weight 0 times whatever
  // bytes a free row held would not be 0 if they were Inf or NaN) and marks
  // which rows are live. No warp reads the stage until a barrier that
  // follows.
  const uint64_t policy = streamPolicy();
  auto issue = [&](int32_t tile) {
    const int st = tile % kStages;
    ahead.issue(
        a.layout.pages, begin, tile, liveRow[st],
        [&](int row, int vec) {
          *reinterpret_cast<uint4 *>(&tiles[st][1][row][vec * 16]) =
              make_uint4(0u, 0u, 0u, 0u);
        },
        [&](int row, int vec, const uint8_t *base, uint64_t offset) {
          copyAsyncStreamed(&tiles[st][0][row][vec * 16],
                            base + a.layout.keyOffset +
                                offset * P::kRowBytes + vec * 16,
                            policy);
          copyAsyncStreamed(&tiles[st][1][row][vec * 16],
                            base + a.layout.valueOffset +
                                offset * P::kRowBytes + vec * 16,
                            policy);
        });
    commitCopies();
  };

#pragma unroll
  for (int32_t tile = 0; tile < kStages - 1; ++tile) {
    fetch(tile);
    issue(tile);
  }
  fetch(kStages - 1);
  for (int32_t i = 0; i < numTiles; ++i) {
    nextStagedTile<kStages>(i, issue, fetch);

    const int st = i % kStages;
    const int row0 = warp * P::kKeysPerWarp;
    // S = Q K^T: B[k][n] = key row n's channel k, two consecutive channels
    // per 32-bit word.
    float s[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    const uint8_t *keyRow = &tiles[st][0][row0 + g][4 * tq];
#pragma unroll
    for (int ks = 0; ks < P::kKSteps; ++ks) {
      if constexpr (P::kSharedQuery) {
        const uint4 f = sharedQuery[ks][lane];
        qa[0][0] = f.x;
        qa[0][1] = f.y;
        qa[0][2] = f.z;
        qa[0][3] = f.w;
      }
      mmaK16<S>(s, qa[P::kSharedQuery ? 0 : ks],
                *reinterpret_cast<const uint32_t *>(keyRow + 32 * ks),
                *reinterpret_cast<const uint32_t *>(keyRow + 32 * ks + 16));
    }
    // Head g's logits of rows 2t and 2t+1: the two halves of S added.
    float l[2];
#pragma unroll
    for (int e = 0; e < 2; ++e) {
      const int row = row0 + 2 * tq + e;
      l[e] = liveRow[st][row] ? s[e] + s[2 + e] : kNegInf;
      const int32_t slot = begin + i * kTileRows + row;
      storeLogitIf(a.logits && g < G && slot < end, a.logits,
                   (static_cast<int64_t>(h) * G + g) * a.stride + slot, l[e],
                   logitHint);
    }
    // The maximum over the warp's eight rows (the four lanes of head g),
    // one rescale per tile, and the rows' weights.
    float mNew = fmaxf(m, fmaxf(l[0], l[1]));
    mNew = fmaxf(mNew, __shfl_xor_sync(kFullMask, mNew, 1));
    mNew = fmaxf(mNew, __shfl_xor_sync(kFullMask, mNew, 2));
    float p[2] = {0.0f, 0.0f};
    float rescale = 1.0f;
    if (mNew != kNegInf) { // else no live row yet: nothing to add
      if (mNew != m) { // else a rescale by e^0 = 1 (moveMaximum)
        rescale = expf(m - mNew);
        m = mNew;
        z *= rescale;
        if constexpr (!P::kColumnSums)
#pragma unroll
          for (int j = 0; j < P::kAccBlocks; ++j)
#pragma unroll
            for (int x = 0; x < 4; ++x)
              o[j][x] *= rescale;
      }
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        p[e] = expf(l[e] - mNew);
        z += p[e];
      }
    }
    if constexpr (P::kColumnSums)
      rescaleColumns<P::kHeadColumns ? 8 : 4>(o, rescale);
    // The weights scaled by E::kWeightScale and split into their rounding
    // and its remainder. O += P V: rows g and g + 8 of A, the value rows
    // as B; transposed, O^T += V^T P^T: the value rows as A (ldmatrix's
    // blocks 2x and 2x + 1 as rows 0-7 and 8-15, 16 channels), the
    // rounding (g < 4) or the remainder (g >= 4) as column g of B; with
    // kHeadColumns head g's rounding, then its remainder, as column g.
    const float w0 = p[0] * E::kWeightScale, w1 = p[1] * E::kWeightScale;
    const float r0 = E::round(w0), r1 = E::round(w1);
    const uint32_t pa = E::pack(r0, r1), pr = E::pack(w0 - r0, w1 - r1);
    const uint8_t *valueRows = &tiles[st][1][row0][0];
#pragma unroll
    for (int j = 0; j < P::kNBlocks; j += 4) {
      uint32_t b[4];
      loadTransposed(valueRows, kPitch, 8 * j, b);
      if constexpr (P::kHeadColumns) {
        mmaK8<S>(o[j / 2], b[0], b[1], pa);
        mmaK8<S>(o[j / 2], b[0], b[1], pr);
        mmaK8<S>(o[j / 2 + 1], b[2], b[3], pa);
        mmaK8<S>(o[j / 2 + 1], b[2], b[3], pr);
      } else if constexpr (P::kTransposedValues) {
        const uint32_t column = g < 4 ? pa : pr;
        mmaK8<S>(o[j / 2], b[0], b[1], column);
        mmaK8<S>(o[j / 2 + 1], b[2], b[3], column);
      } else {
#pragma unroll
        for (int x = 0; x < 4; ++x)
          mmaK8<S>(o[j + x], pa, pr, b[x]);
      }
    }
  }

  // z over the four lanes of head g; the lane's value sums, the rounded
  // and remainder halves added and the weight scale taken out.
  z += __shfl_xor_sync(kFullMask, z, 1);
  z += __shfl_xor_sync(kFullMask, z, 2);
  // The warps' states go through shared memory (the tiles, free once every
  // copy landed and every warp is done) into the split's partial record:
  // M = max_w m_w, Z = sum_w z_w e^(m_w - M), acc = sum_w acc_w e^(m_w - M),
  // added in warp order (a warp without a live row adds nothing).
  static_assert(sizeof(float) * P::kWarps * G * D <= sizeof(tiles),
                "the warps' value sums must fit the tiles");
  __shared__ float warpMax[P::kWarps][G], warpSum[P::kWarps][G];
  waitCopies<0>();
  __syncthreads();
  float(*warpAcc)[G][D] = reinterpret_cast<float(*)[G][D]>(&tiles[0][0][0][0]);
  if constexpr (P::kHeadColumns) {
    // Column 2t + e: head 2t + e's sums of channels 16j + g, 16j + 8 + g.
#pragma unroll
    for (int j = 0; j < P::kAccBlocks; ++j)
#pragma unroll
      for (int x = 0; x < 4; ++x) {
        const int head = 2 * tq + x % 2;
        if (head < G)
          warpAcc[warp][head][16 * j + 8 * (x / 2) + g] =
              o[j][x] / E::kWeightScale;
      }
  } else if constexpr (P::kTransposedValues) {
    // Column 2t + e (t < 2) and its remainder in column 2t + e + 4, lane
    // (g, t + 2)'s: head 2t + e's sums of channels 16j + g, 16j + 8 + g.
#pragma unroll
    for (int j = 0; j < P::kAccBlocks; ++j)
#pragma unroll
      for (int x = 0; x < 4; ++x) {
        const float sum = o[j][x] + __shfl_xor_sync(kFullMask, o[j][x], 2);
        const int head = 2 * tq + x % 2;
        if (tq < 2 && head < G)
          warpAcc[warp][head][16 * j + 8 * (x / 2) + g] =
              sum / E::kWeightScale;
      }
  }
  if (g < G) {
    if constexpr (!P::kColumnSums)
#pragma unroll
      for (int j = 0; j < P::kNBlocks; ++j) {
        warpAcc[warp][g][8 * j + 2 * tq] =
            (o[j][0] + o[j][2]) / E::kWeightScale;
        warpAcc[warp][g][8 * j + 2 * tq + 1] =
            (o[j][1] + o[j][3]) / E::kWeightScale;
      }
    if (tq == 0) {
      warpMax[warp][g] = m;
      warpSum[warp][g] = z;
    }
  }
  __syncthreads();
  float *out = a.partials + ((static_cast<int64_t>(h) * a.numSplits + split) *
                             G) * partialFloats<D>();
  for (int i = threadIdx.x; i < G * partialFloats<D>(); i += kThreads) {
    const int head = i / partialFloats<D>(), x = i % partialFloats<D>();
    float bm = kNegInf;
#pragma unroll
    for (int w = 0; w < P::kWarps; ++w)
      bm = fmaxf(bm, warpMax[w][head]);
    float total = 0.0f;
#pragma unroll
    for (int w = 0; w < P::kWarps; ++w) {
      const float mw = warpMax[w][head];
      if (mw == kNegInf)
        continue;
      const float f = expf(mw - bm);
      total += (x == 1 ? warpSum[w][head] : warpAcc[w][head][x < 2 ? 0 : x - 2]) * f;
    }
    out[i] = x == 0 ? bm : total;
  }
}

/// Blocks per SM that decodeAttentionSplit asks ptxas to fit
/// (__launch_bounds__). The register path of 16-bit storage at G = 1, the
/// one that reaches the copy bandwidth, holds its rows in 72 registers (7
/// blocks of 128 threads per SM) when asked to, with no spills (ptxas,
/// sm_90a, head dim 64 and 128), and takes 80 (6 blocks) when not. The
/// tensor-core path asks for MmaDecode::kMinBlocks. The other paths keep
/// ptxas's own choice (0: no minimum; a minimum of 1 would let ptxas spend
/// more registers than it does unasked).
template <int G, int D, Storage S, int kThreads, int kLowBits>
constexpr int DecodeMinBlocks =
    G == 1 && kLowBits == 0 && (S == Storage::F16 || S == Storage::BF16)
        ? 65536 / (72 * kThreads)
    : kLowBits == 0 && MmaDecode<G, D, S, kThreads>::kApplies
        ? MmaDecode<G, D, S, kThreads>::kMinBlocks
        : 0;

/// One block per (split, kv-head): the G query heads of the group read each
/// key and value of the split once, with 128-bit loads, dequantizing in
/// registers. kLanes lanes share a row; the block's rows run an online
/// softmax each, combined at the end into the split's partial record. Every
/// slot's logit is stored (where a.logits is not null) so that the fold
/// can form exact probabilities.
/// A group that divides among the block's warps (one storage class) goes
/// through shared-memory tiles instead (decodeStagedRows), with the same
/// outputs.
///
/// Mixed precision (kLowBits != 0): a slot of a page tagged kLowPageTag is
/// a low-class row (LowRow: kLowBits-bit codes per token in groups of
/// kLowGroup channels) that each lane dequantizes in registers into the
/// same channels as a high row; the cache is read as stored, never
/// expanded. With kLowBits == 0 (one class) none of it is compiled in.
///
/// decodeSplit is the work of one block, split `split` of head `h` of the
/// batch: the kernel decodeAttentionSplit runs it at (blockIdx.x,
/// blockIdx.y), decodeAttentionFold at the item its block claims.
template <int G, int D, Storage S, int kThreads, int kLowBits = 0,
          int kLowGroup = 0>
__device__ void decodeSplit(const DecodeSplitArgs &a, int32_t h,
                            int32_t split) {
  using Shape = RowShape<D, S>;
  constexpr bool kMixed = kLowBits != 0;
  using Low = LowRow<D, S, kLowBits, kLowGroup>;
  const HeadTable t = a.heads[h];
  const int32_t begin = split * a.splitSlots;
  const int32_t end = min(begin + a.splitSlots, t.numSlots);
  if constexpr (!kMixed && MmaDecode<G, D, S, kThreads>::kApplies) {
    decodeMmaRows<G, D, S, kThreads>(a, t, h, split, begin, end);
  } else if constexpr (!kMixed && StagedDecode<G, D, S, kThreads>::kApplies) {
    decodeStagedRows<G, D, S, kThreads>(a, t, h, split, begin, end);
  } else {
    const int lane = threadIdx.x % Shape::kLanes;
    // A row's loads, issued kRowsInFlight rows ahead of their use.
    struct Row {
      int32_t slot;
      bool inRange, live, low;
      uint4 kRaw[Shape::kVecsPerLane], vRaw[Shape::kVecsPerLane];
      float kScale, vScale;
      // Mixed precision: the codes and records of a low slot.
      uint64_t kCodes[kMixed ? Shape::kVecsPerLane : 1],
          vCodes[kMixed ? Shape::kVecsPerLane : 1];
      const uint32_t *kRecord, *vRecord;
    };
    // The cache's rows and codes stream (streamPolicy).
    const uint64_t policy = streamPolicy();
    auto load = [&](int32_t slot, Row &r) {
      r.slot = slot;
      r.inRange = slot < end;
      r.live = r.inRange && t.positions[slot] != KVC_POSITION_NONE;
      r.low = false;
      r.kScale = 1.0f;
      r.vScale = 1.0f;
      if (!r.live)
        return;
      const uint8_t *page = slotBase(t, slot, a.layout.pages);
      const int32_t o = a.layout.pages.offset(slot);
      if constexpr (kMixed) {
        const uint64_t address = reinterpret_cast<uint64_t>(page);
        r.low = (address & kLowPageTag) != 0;
        page = reinterpret_cast<const uint8_t *>(address & ~kLowPageTag);
        if (r.low) {
          const uint8_t *kRow = page + a.layout.lowKeyOffset +
                                static_cast<uint64_t>(o) * Low::kRowBytes;
          const uint8_t *vRow = page + a.layout.lowValueOffset +
                                static_cast<uint64_t>(o) * Low::kRowBytes;
  #pragma unroll
          for (int j = 0; j < Shape::kVecsPerLane; ++j) {
            r.kCodes[j] = Low::load(kRow, j, lane, policy);
            r.vCodes[j] = Low::load(vRow, j, lane, policy);
          }
          r.kRecord = reinterpret_cast<const uint32_t *>(
              page + a.layout.lowKeyParamOffset + o * Low::kRecordBytes);
          r.vRecord = reinterpret_cast<const uint32_t *>(
              page + a.layout.lowValueParamOffset + o * Low::kRecordBytes);
          return;
        }
      }
      const uint4 *kRow = reinterpret_cast<const uint4 *>(
          page + a.layout.keyOffset +
          static_cast<uint64_t>(o) * Shape::kRowBytes);
      const uint4 *vRow = reinterpret_cast<const uint4 *>(
          page + a.layout.valueOffset +
          static_cast<uint64_t>(o) * Shape::kRowBytes);
  #pragma unroll
      for (int j = 0; j < Shape::kVecsPerLane; ++j) {
        r.kRaw[j] = loadStreamed(kRow + j * Shape::kLanes + lane, policy);
        r.vRaw[j] = loadStreamed(vRow + j * Shape::kLanes + lane, policy);
      }
      if constexpr (Codec<S>::kScaled) {
        r.kScale = __ldg(reinterpret_cast<const float *>(
                             page + a.layout.keyParamOffset) +
                         o);
        r.vScale = __ldg(reinterpret_cast<const float *>(
                             page + a.layout.valueParamOffset) +
                         o);
      }
    };
    // Channels j of a loaded row, as floats.
    auto decode = [&](const Row &r, bool value, int j, float *out) {
      if constexpr (kMixed) {
        if (r.low) {
          Low::decode(value ? r.vCodes[j] : r.kCodes[j],
                      value ? r.vRecord : r.kRecord, j, lane, out);
          return;
        }
      }
      Codec<S>::decode(value ? r.vRaw[j] : r.kRaw[j],
                       value ? r.vScale : r.kScale, out);
    };
    decodeSplitRows<G, D, Shape, kThreads, DecodeRowsInFlight<G>::value, Row>(
        a, h, split, begin, end, load, decode);
  }
  mergeInLastSplit<G, D, kThreads>(a, t, h);
}

template <int G, int D, Storage S, int kThreads, int kLowBits = 0,
          int kLowGroup = 0>
__global__ void __launch_bounds__(kThreads,
                                  DecodeMinBlocks<G, D, S, kThreads, kLowBits>)
    decodeAttentionSplit(DecodeSplitArgs a) {
  // Launched as a dependent of the step's stores (launchDependent): their
  // rows and table words first; then the fold may start its blocks.
  awaitPriorGrids();
  releaseDependents();
  // Heads in x (up to 2^31 - 1 of them: any batch), splits in y (<= 64).
  decodeSplit<G, D, S, kThreads, kLowBits, kLowGroup>(a, blockIdx.x,
                                                      blockIdx.y);
}

/// Threads per block of decodeAttentionSplit.
constexpr int kDecodeThreads = 128;

/// Whether a decode with statistics folds them in its attention grid
/// (decodeAttentionFold) rather than in a fold kernel after it
/// (KVC_CUDA_FOLD_IN_GRID; the generated decode entries read it).
constexpr bool kFoldInGrid = KVC_CUDA_FOLD_IN_GRID != 0;

/// The items of decodeAttentionFold's grid: `heads` x `splits` attention
/// items, head-major (item i: split i % splits of head i / splits), then
/// `lag` x `ranges` fold items. Attention item (h, s) also folds range s
/// (when s < ranges) of head h - lag (when h >= lag); fold item k folds
/// range k % ranges of head heads - lag + k / ranges. A fold of head h'
/// waits until h''s splits have all counted in: every item of head h' is
/// before the folding item, so its block has started (claimItem) and the
/// wait ends.
struct GridFold {
  /// The step's item counter (DeviceTables::stepItems), zero when the step's
  /// tables are uploaded.
  int32_t *items;
  int32_t heads;
  /// Fold ranges per head (<= the attention's splits) and their slots, a
  /// multiple of 32 (whole 128-byte lines of 4-byte elements).
  int32_t ranges, slotsPerRange;
  /// Heads between the head an attention item reads and the one it folds
  /// (1 <= lag <= heads).
  int32_t lag;
};

/// The items of a GridFold's grid.
inline int64_t gridFoldItems(const GridFold &g, int32_t splits) {
  return static_cast<int64_t>(g.heads) * splits +
         static_cast<int64_t>(g.lag) * g.ranges;
}

/// The decode attention of decodeAttentionSplit with the statistics folded
/// in the same grid (KVC_CUDA_FOLD_IN_GRID): each block claims an item of
/// `g` (claimItem), runs its split (decodeSplit) and counts in at the
/// split's head (countIn on HeadTable::arrivals), then folds its range of
/// a head `g.lag` heads back: `fold.run<kThreads>(head, range, wait)`, a
/// policy's fold (the emitter's DecodeFoldRanges), which calls `wait(t)`
/// before it reads the head's logits and split records. The splits' logits
/// are read back one wave after they were written, not after the whole
/// grid, and the fold's reads and instructions overlap the other blocks'
/// streaming of the cache. Launched over gridFoldItems blocks.
template <int G, int D, Storage S, int kThreads, int kLowBits, int kLowGroup,
          typename Fold>
__global__ void __launch_bounds__(kThreads,
                                  DecodeMinBlocks<G, D, S, kThreads, kLowBits>)
    decodeAttentionFold(DecodeSplitArgs a, GridFold g, Fold fold) {
  awaitPriorGrids();
  releaseDependents();
  const int32_t item = claimItem(g.items);
  const int32_t attended = g.heads * a.numSplits;
  int32_t head, range;
  if (item < attended) {
    const int32_t h = item / a.numSplits, split = item % a.numSplits;
    decodeSplit<G, D, S, kThreads, kLowBits, kLowGroup>(a, h, split);
    countIn(a.heads[h].arrivals);
    head = h - g.lag;
    range = split;
  } else {
    const int32_t k = item - attended;
    head = g.heads - g.lag + k / g.ranges;
    range = k % g.ranges;
  }
  if (head < 0 || range >= g.ranges)
    return;
  const int32_t splits = a.numSplits;
  fold.template run<kThreads>(head, range, [splits](const HeadTable &t) {
    awaitCount(t.arrivals, splits);
  });
}

//===----------------------------------------------------------------------===//
// KIVI on device pools: the work kvc_kivi_pending_work records
//===----------------------------------------------------------------------===//

/// Full-precision elements of a KIVI context's residual rows.
template <kvc_dtype_t T> struct Element;

template <> struct Element<KVC_DTYPE_F32> {
  static constexpr int kBytes = 4;
  __device__ static float load(const uint8_t *row, int c) {
    return reinterpret_cast<const float *>(row)[c];
  }
  __device__ static void store(uint8_t *row, int c, float x) {
    reinterpret_cast<float *>(row)[c] = x;
  }
  __device__ static float round(float x) { return x; }
};

template <> struct Element<KVC_DTYPE_F16> {
  static constexpr int kBytes = 2;
  __device__ static float load(const uint8_t *row, int c) {
    return __half2float(reinterpret_cast<const __half *>(row)[c]);
  }
  __device__ static void store(uint8_t *row, int c, float x) {
    reinterpret_cast<__half *>(row)[c] = __float2half_rn(x);
  }
  __device__ static float round(float x) {
    return __half2float(__float2half_rn(x));
  }
};

template <> struct Element<KVC_DTYPE_BF16> {
  static constexpr int kBytes = 2;
  __device__ static float load(const uint8_t *row, int c) {
    return __bfloat162float(reinterpret_cast<const __nv_bfloat16 *>(row)[c]);
  }
  __device__ static void store(uint8_t *row, int c, float x) {
    reinterpret_cast<__nv_bfloat16 *>(row)[c] = __float2bfloat16_rn(x);
  }
  __device__ static float round(float x) {
    return __bfloat162float(__float2bfloat16_rn(x));
  }
};

/// Where a KIVI job reads a full-precision row: a float32 input row of the
/// call (rounded to dtype first, as staging would store it) or a residual
/// row of dtype elements. An input row is named by its offset in floats
/// from the launch's key or value tensor (the job's kind says which), so
/// that uploaded jobs do not depend on the tensors' addresses (a decode
/// run replayed from a CUDA graph); a residual row by its address.
struct KiviSource {
  uint64_t location; ///< Input: offset in floats; residual: address.
  int32_t isInput;
  int32_t pad;
};

/// One member of a quantization job: its source and its packed row.
struct KiviMember {
  KiviSource source;
  uint64_t row;
};

/// One quantization job: a value (one member) or a key block (its members
/// in token order). `params` is the value's record or the block's (a
/// {scale, min} word per group or channel).
struct KiviJob {
  uint64_t params;
  int32_t firstMember, count;
  int32_t isKey;
  int32_t pad;
};

/// One row pair to stage into the residual window.
struct KiviStage {
  int64_t input; ///< The input rows: their offset in floats in k and in v.
  uint64_t residualKey, residualValue; ///< Residual rows.
};

/// The counts at the start of a KIVI work region (KiviWorkPlan::upload):
/// the blocks of kiviQuantize and kiviStageRows past them return, so that
/// a launch may size its grid for the most work of a step.
struct KiviWorkCounts {
  int32_t jobs, stages;
};

template <kvc_dtype_t T>
__device__ float kiviSourceElement(const KiviSource &s, const float *input,
                                   int c) {
  if (s.isInput)
    return Element<T>::round(input[static_cast<int64_t>(s.location) + c]);
  return Element<T>::load(reinterpret_cast<const uint8_t *>(s.location), c);
}

/// Runs the quantization jobs, one block of D threads each (thread c owns
/// channel c; the blocks past counts->jobs return): a value per token over
/// groups of KG channels, a key block per channel over its members, whose
/// input rows are read from k (keys) or v (values). Minima and maxima are
/// taken in the host's order (first element, then strict comparisons), then
/// codes are packed as kvc_pack_bits does: code j at bit (j * bits) % 8 of
/// byte j * bits / 8.
template <int D, int kBits, int KG, kvc_dtype_t T>
__global__ void __launch_bounds__(D)
    kiviQuantize(const KiviJob *jobs, const KiviMember *members,
                 const KiviWorkCounts *counts, const float *k,
                 const float *v) {
  static_assert(D % KG == 0 && (D * kBits) % 8 == 0, "KIVI geometry");
  // The attention kernel may follow it (a step without staged rows:
  // launchDependent).
  releaseDependents();
  if (static_cast<int32_t>(blockIdx.x) >= counts->jobs)
    return;
  const KiviJob job = jobs[blockIdx.x];
  __shared__ uint8_t codes[KG][D];
  __shared__ float row[D];
  const int c = threadIdx.x;
  uint32_t *records = reinterpret_cast<uint32_t *>(job.params);
  if (job.isKey) {
    float lo = 0.0f, hi = 0.0f;
    for (int32_t t = 0; t < job.count; ++t) {
      const float x =
          kiviSourceElement<T>(members[job.firstMember + t].source, k, c);
      lo = t == 0 || x < lo ? x : lo;
      hi = t == 0 || hi < x ? x : hi;
    }
    const AsymParams p = asymParams<kBits>(lo, hi);
    records[c] = p.word;
    for (int32_t t = 0; t < job.count; ++t)
      codes[t][c] = static_cast<uint8_t>(kiviCode<kBits>(
          kiviSourceElement<T>(members[job.firstMember + t].source, k, c),
          p.scale, p.min));
  } else {
    row[c] = kiviSourceElement<T>(members[job.firstMember].source, v, c);
    __syncthreads();
    const int first = c / KG * KG;
    float lo = row[first], hi = lo;
    for (int i = first + 1; i < first + KG; ++i) {
      lo = row[i] < lo ? row[i] : lo;
      hi = hi < row[i] ? row[i] : hi;
    }
    const AsymParams p = asymParams<kBits>(lo, hi);
    if (c == first)
      records[c / KG] = p.word;
    codes[0][c] =
        static_cast<uint8_t>(kiviCode<kBits>(row[c], p.scale, p.min));
  }
  __syncthreads();
  constexpr int kRowBytes = D * kBits / 8, kPerByte = 8 / kBits;
  const int32_t rows = job.isKey ? job.count : 1;
  for (int32_t i = c; i < rows * kRowBytes; i += D) {
    const int32_t t = i / kRowBytes, b = i % kRowBytes;
    uint32_t byte = 0;
#pragma unroll
    for (int e = 0; e < kPerByte; ++e)
      byte |= static_cast<uint32_t>(codes[t][b * kPerByte + e]) << (e * kBits);
    reinterpret_cast<uint8_t *>(members[job.firstMember + t].row)[b] =
        static_cast<uint8_t>(byte);
  }
}

/// Writes the staged rows (counts->stages of them, rows of k and v) into
/// the residual window, one block of D threads per row pair among the
/// first `stageBlocks` blocks, and in the blocks after them a decode
/// step's `numWords` table words (writeTableWords; the rows and the words
/// touch different memory), each thread taking every (word blocks x D)-th
/// word from its own; with `counted` (a planned run, launchPlannedKivi)
/// the count is words[0].address, read here, and the words follow it
/// (DeviceTables::plannedWords). Runs after kiviQuantize, whose jobs may
/// read the rows these overwrite.
template <int D, kvc_dtype_t T>
__global__ void __launch_bounds__(D)
    kiviStageRows(const KiviStage *stages, int32_t stageBlocks,
                  const KiviWorkCounts *counts, const float *k,
                  const float *v, const TableWord *words, int32_t numWords,
                  bool counted) {
  // The attention kernel after it may start its blocks (launchDependent).
  releaseDependents();
  const int32_t block = static_cast<int32_t>(blockIdx.x);
  if (block >= stageBlocks) {
    writeStepWords(words, numWords, counted, block - stageBlocks,
                   static_cast<int32_t>(gridDim.x) - stageBlocks, D);
    return;
  }
  if (block >= counts->stages)
    return;
  const KiviStage s = stages[block];
  const int c = threadIdx.x;
  Element<T>::store(reinterpret_cast<uint8_t *>(s.residualKey), c,
                    k[s.input + c]);
  Element<T>::store(reinterpret_cast<uint8_t *>(s.residualValue), c,
                    v[s.input + c]);
}

/// The Storage of a KIVI context's full-precision rows (its dtype).
template <kvc_dtype_t T>
constexpr Storage kKiviFullStorage =
    T == KVC_DTYPE_F32 ? Storage::F32
                       : (T == KVC_DTYPE_F16 ? Storage::F16 : Storage::BF16);

/// Rows each thread of decodeAttentionKivi loads before it uses the first
/// (DecodeRowsInFlight's trade-off): the most that stay within 128
/// registers (4 blocks of 128 threads per SM) where that is possible. With
/// f16, head dim 128 and int2 (ptxas, sm_90a): G = 1 takes 120 registers at
/// 4 rows, G = 2 128 at 4, G = 3 124 at 2, G = 4 128 at 1 (138 at 2),
/// G = 8 200 at 1; no spills at head dim 64 and 128, int2 and int4, f16,
/// bf16 and f32, on sm_80 and sm_90a.
template <int G> struct KiviRowsInFlight {
  static constexpr int value = G <= 2 ? 4 : (G == 3 ? 2 : 1);
};

/// The Prefetch of decodeAttentionKivi: asks L2 for the lines of the rows
/// [first, first + count) of the split (a thread per row, each line once):
/// their positions and KIVI words, key and value codes, value records and
/// the lines of their key blocks' records. A KIVI row's loads are short
/// (D * kBits / 8 bytes of codes per part), and each waits on the row's
/// position and word: fetching them kRows rows ahead turns that chain of
/// memory round trips into L2 hits. Window rows (full precision in the
/// residual region) are not fetched ahead: there are few.
template <int D, Storage S, int kBits, int KG> struct KiviPrefetch {
  static constexpr int kRows = 64;
  using Packed = LowRow<D, S, kBits, KG>;
  static constexpr uint64_t kKeyRecordBytes = 4 * D;
  const uint64_t *pages;
  const int32_t *positions, *kiviRows;
  PageLayout layout;
  int32_t end;

  __device__ void operator()(int32_t first, int32_t count) const {
    const int32_t slot = first + static_cast<int32_t>(threadIdx.x);
    if (static_cast<int32_t>(threadIdx.x) >= count || slot >= end)
      return;
    const bool lead = threadIdx.x == 0;
    if (startsLine(static_cast<uint64_t>(slot) * 4, 4, lead)) {
      prefetchL2(positions + slot);
      prefetchL2(kiviRows + slot);
    }
    const uint8_t *page =
        reinterpret_cast<const uint8_t *>(pages[layout.pages.page(slot)]);
    if (!page)
      return;
    const uint64_t o = static_cast<uint64_t>(layout.pages.offset(slot));
    const bool pageLead = lead || o == 0;
    if (startsLine(o * Packed::kRowBytes, Packed::kRowBytes, pageLead)) {
      prefetchL2(page + layout.keyOffset + o * Packed::kRowBytes);
      prefetchL2(page + layout.valueOffset + o * Packed::kRowBytes);
    }
    if (startsLine(o * Packed::kRecordBytes, Packed::kRecordBytes, pageLead))
      prefetchL2(page + layout.valueParamOffset + o * Packed::kRecordBytes);
    const uint64_t line = o % static_cast<uint64_t>(KG);
    if (line * 128 < kKeyRecordBytes)
      prefetchL2(page + layout.keyParamOffset +
                 o / static_cast<uint64_t>(KG) * kKeyRecordBytes + line * 128);
  }
};

/// decodeAttentionSplit for KIVI pages, in the same lane layout
/// (RowShape of the dtype: kLanes lanes per row, each holding the channels
/// of its 16-byte vectors): a window entry's full-precision key or value is
/// read from the residual rows with 128-bit loads; a quantized one as the
/// lane's run of packed codes (one 1-8 byte load, LowRow), dequantized in
/// registers with the slot's per-group {scale, min} (values) or the
/// per-channel pairs of the slot's block of KG tokens (keys, 16-byte
/// loads). The slot's word (HeadTable::kiviRows) says which part is where.
/// Same outputs as decodeAttentionSplit (logits and split partials), so
/// mergeSplits and the stages follow unchanged; the cache is never
/// expanded in memory.
template <int G, int D, int kBits, int KG, kvc_dtype_t T, int kThreads>
__device__ __forceinline__ void
decodeKiviRows(const DecodeSplitArgs &a, const HeadTable &t, int32_t h,
               int32_t split, int32_t begin, int32_t end,
               int32_t residualLength) {
  constexpr Storage S = kKiviFullStorage<T>;
  using Shape = RowShape<D, S>;
  // Keys and values are packed per token alike (kvc_pack_bits); a value's
  // record is the low class's layout.
  using Packed = LowRow<D, S, kBits, KG>;
  constexpr uint64_t kKeyRecordBytes = 4 * D;
  constexpr uint64_t kMask = (uint64_t{1} << kBits) - 1;
  static_assert(Shape::kElemsPerVec % 4 == 0,
                "a lane's key records are whole 16-byte loads");
  const int lane = threadIdx.x % Shape::kLanes;

  // A row's loads: per vector, the full-precision vector, or its codes in
  // (x, y).
  struct Row {
    int32_t slot;
    bool inRange, live, keyFull, valueFull;
    uint4 k[Shape::kVecsPerLane], v[Shape::kVecsPerLane];
    const uint32_t *kRecord, *vRecord;
  };
  auto load = [&](int32_t slot, Row &r) {
    r.slot = slot;
    r.inRange = slot < end;
    r.live = r.inRange && t.positions[slot] != KVC_POSITION_NONE;
    // decode reads a live row only; a free one is still fully defined.
    r.keyFull = r.valueFull = false;
    r.kRecord = r.vRecord = nullptr;
    if (!r.live)
      return;
    const uint8_t *page = slotBase(t, slot, a.layout.pages);
    const uint64_t o = static_cast<uint64_t>(a.layout.pages.offset(slot));
    const int32_t word = t.kiviRows[slot];
    r.keyFull = word >= 0 && (word & kKiviKeyFull);
    r.valueFull = word >= 0 && (word & kKiviValueFull);
    const uint64_t row =
        word >= 0 ? static_cast<uint64_t>(word & kKiviRowMask) : 0;
    const uint4 *kFull = reinterpret_cast<const uint4 *>(
        t.kiviResidual + row * Shape::kRowBytes);
    const uint4 *vFull = reinterpret_cast<const uint4 *>(
        t.kiviResidual + (residualLength + row) * Shape::kRowBytes);
    const uint8_t *kCodes = page + a.layout.keyOffset + o * Packed::kRowBytes;
    const uint8_t *vCodes =
        page + a.layout.valueOffset + o * Packed::kRowBytes;
#pragma unroll
    for (int j = 0; j < Shape::kVecsPerLane; ++j) {
      if (r.keyFull) {
        r.k[j] = __ldg(kFull + j * Shape::kLanes + lane);
      } else {
        const uint64_t c = Packed::load(kCodes, j, lane);
        r.k[j] = make_uint4(static_cast<uint32_t>(c),
                            static_cast<uint32_t>(c >> 32), 0u, 0u);
      }
      if (r.valueFull) {
        r.v[j] = __ldg(vFull + j * Shape::kLanes + lane);
      } else {
        const uint64_t c = Packed::load(vCodes, j, lane);
        r.v[j] = make_uint4(static_cast<uint32_t>(c),
                            static_cast<uint32_t>(c >> 32), 0u, 0u);
      }
    }
    r.kRecord = reinterpret_cast<const uint32_t *>(
        page + a.layout.keyParamOffset +
        o / static_cast<uint64_t>(KG) * kKeyRecordBytes);
    r.vRecord = reinterpret_cast<const uint32_t *>(
        page + a.layout.valueParamOffset + o * Packed::kRecordBytes);
  };
  auto decode = [&](const Row &r, bool value, int j, float *out) {
    const uint4 &raw = value ? r.v[j] : r.k[j];
    if (value ? r.valueFull : r.keyFull) {
      Codec<S>::decode(raw, 1.0f, out);
      return;
    }
    const uint64_t codes =
        static_cast<uint64_t>(raw.x) | static_cast<uint64_t>(raw.y) << 32;
    if (value) {
      Packed::decode(codes, r.vRecord, j, lane, out);
      return;
    }
    // The {scale, min} words of the lane's channels, consecutive in the
    // block's record and 16-byte aligned (the record is, and a vector's
    // first channel is a multiple of kElemsPerVec, itself of 4).
    uint32_t words[Shape::kElemsPerVec];
    loadWords(reinterpret_cast<const uint8_t *>(
                  r.kRecord + Shape::channel(j, lane, 0)),
              words);
#pragma unroll
    for (int e = 0; e < Shape::kElemsPerVec; ++e) {
      const float2 p = asymPair(words[e]);
      out[e] = kiviDequant(
          static_cast<uint32_t>((codes >> (e * kBits)) & kMask), p.x, p.y);
    }
  };
  decodeSplitRows<G, D, Shape, kThreads, KiviRowsInFlight<G>::value, Row>(
      a, h, split, begin, end, load, decode,
      KiviPrefetch<D, S, kBits, KG>{t.pages, t.positions, t.kiviRows,
                                    a.layout, end});
}

/// (x & kMask) | bits, one instruction (ptxas does not merge an AND and an
/// OR that take an immediate each).
template <uint32_t kMask>
__device__ __forceinline__ uint32_t maskOr(uint32_t x, uint32_t bits) {
#if defined(__CUDA_ARCH__) && !defined(KVC_CUDA_EMULATED)
  uint32_t d;
  asm("lop3.b32 %0, %1, %2, %3, 0xea;"
      : "=r"(d)
      : "r"(x), "n"(kMask), "r"(bits));
  return d;
#else
  return (x & kMask) | bits;
#endif
}

/// prmt.b32: byte i of the result is byte (nibble i of `selector`) of
/// {b, a} (bytes 0-3 of a, 4-7 of b); selectors here leave bit 3 of every
/// nibble clear.
__device__ __forceinline__ uint32_t bytePerm(uint32_t a, uint32_t b,
                                             uint32_t selector) {
#if defined(__CUDA_ARCH__) && !defined(KVC_CUDA_EMULATED)
  uint32_t d;
  asm("prmt.b32 %0, %1, %2, %3;" : "=r"(d) : "r"(a), "r"(b), "r"(selector));
  return d;
#else
  const uint64_t bytes = a | static_cast<uint64_t>(b) << 32;
  uint32_t d = 0;
  for (int i = 0; i < 4; ++i)
    d |= static_cast<uint32_t>(bytes >> (8 * ((selector >> (4 * i)) & 7)) &
                               0xffu)
         << (8 * i);
  return d;
#endif
}

/// acc + a.lo * b.byte0 + a.hi * b.byte1 (lo: true) or + a.lo * b.byte2 +
/// a.hi * b.byte3 (false): a holds two signed 16-bit integers, b four
/// signed bytes (dp2a.lo / dp2a.hi, one instruction); exact in 32 bits.
template <bool kLo>
__device__ __forceinline__ int32_t dot2x16(uint32_t a, uint32_t b,
                                           int32_t acc) {
#if defined(__CUDA_ARCH__) && !defined(KVC_CUDA_EMULATED)
  return kLo ? __dp2a_lo(static_cast<int>(a), static_cast<int>(b), acc)
             : __dp2a_hi(static_cast<int>(a), static_cast<int>(b), acc);
#else
  const int shift = kLo ? 0 : 16;
  const int32_t b0 = static_cast<int8_t>((b >> shift) & 0xffu),
                b1 = static_cast<int8_t>((b >> (shift + 8)) & 0xffu);
  const int32_t a0 = static_cast<int16_t>(a & 0xffffu),
                a1 = static_cast<int16_t>(a >> 16);
  return static_cast<int32_t>(static_cast<uint32_t>(acc) +
                              static_cast<uint32_t>(a0 * b0 + a1 * b1));
#endif
}

/// A float of a warp's folded query as two signed 15-bit digits under the
/// warp's shared power of two (decodeKiviTiles): x = unit (d0 + d1 / 2^15)
/// within unit / 2^16, for |x| below the warp's bound. `scale` is 2^14 /
/// bound's power of two and `unit` its inverse (KiviDigitScale); rounding
/// to nearest by adding and taking away 1.5 * 2^23, exact for the
/// magnitudes below 2^22 that the scale guarantees.
struct KiviDigits {
  int32_t d0, d1;
  __device__ __forceinline__ KiviDigits(float x, float scale) {
    constexpr float kRound = 12582912.0f; // 1.5 * 2^23
    const float t0 = x * scale; // |t0| < 2^14: exact (a power of two)
    const float r0 = t0 + kRound;
    d0 = static_cast<int32_t>(__float_as_uint(r0) - __float_as_uint(kRound));
    const float t1 = (t0 - (r0 - kRound)) * 32768.0f; // |t1| <= 2^14
    d1 = static_cast<int32_t>(__float_as_uint(t1 + kRound) -
                              __float_as_uint(kRound));
  }
  /// acc + unit (s0 + s1 / 2^15): the sums of a digit 0 and a digit 1
  /// times integers back under their power of two (s0 and s1 below 2^24
  /// convert exactly).
  __device__ static __forceinline__ float addSums(float unit, int32_t s0,
                                                  int32_t s1, float acc) {
    return fmaf(unit,
                fmaf(static_cast<float>(s1), 1.0f / 32768.0f,
                     static_cast<float>(s0)),
                acc);
  }
};

/// The power of two under which a warp's values become integers of up to
/// kTop bits: for a warp whose largest |x| is `bound`, scale = 2^(kTop - k)
/// for 2^(k - 1) <= bound < 2^k, so that |x scale| < 2^kTop; unit = 1 /
/// scale. A bound below 2^(kTop - 127) (0 included) takes the scale of
/// that bound, so that the factors stay normal floats; a bound of 2^127 or
/// more (or not finite) has no integers: scale 0 and unit NaN, so that the
/// logits are NaN as a float dot product's would be.
/// `boundBits`: the bits of the bound (the largest of the values' bits
/// with the sign cleared, so that a NaN or an infinity wins).
/// KiviDigitScale: kTop = 14, the first of KiviDigits' two digits;
/// KiviKeyScale: kTop = 22, the fixed-point key factors of decodeKiviTiles'
/// tensor-core keys (three bytes).
template <int kTop> struct KiviPowerScale {
  float scale, unit;
  __device__ __forceinline__ explicit KiviPowerScale(uint32_t boundBits) {
    int e = static_cast<int>(boundBits >> 23);
    e = e < kTop ? kTop : e;
    scale = e > 253 ? 0.0f : __int_as_float((kTop + 253 - e) << 23);
    unit = e > 253 ? __int_as_float(0x7fc00000)
                   : __int_as_float((e + 1 - kTop) << 23);
  }
};
using KiviDigitScale = KiviPowerScale<14>;
using KiviKeyScale = KiviPowerScale<22>;

/// Geometry of decodeKiviTiles: each warp takes tiles of 32 consecutive
/// slots (32-aligned, so a tile lies in one key block of KG >= 32 tokens and
/// in one page: pages hold whole blocks). Keys go a slot per lane, against
/// the query folded with the tile's block record once (f[g][c] =
/// q[g][c] * scale[c], as digits); values go kValueChannels channels per
/// lane, kValueLanes lanes per slot, two slots at a time.
template <int G, int D, int kBits, int KG, kvc_dtype_t T, int kThreads>
struct KiviTiles {
  static constexpr int kWarps = kThreads / kWarpSize;
  static constexpr int kHeadDim = D, kKeyGroup = KG, kCodeBits = kBits;
  /// Bytes of a block's key record ({scale, min} word per channel) and of
  /// a slot's value record (a word per group of KG channels).
  static constexpr uint64_t kKeyRecordBytes = 4 * D;
  static constexpr uint64_t kValueRecordBytes = 4 * (D / KG);
  /// Codes per 32-bit word, words and bytes of a packed row.
  static constexpr int kCodesPerWord = 32 / kBits;
  static constexpr int kRowWords = D * kBits / 32;
  static constexpr int kRowBytes = D * kBits / 8;
  /// Value groups of a row ({scale, min} per KG channels).
  static constexpr int kGroups = D / KG;
  static constexpr int kValueChannels = 8;
  static constexpr int kValueLanes = D / kValueChannels;
  static constexpr int kSlotsPerStep = kWarpSize / kValueLanes;
  /// 2^kBits: a code c is 2^kBits (u - 1) for its unit u = 1 + c / 2^kBits
  /// (decodeKiviMma's operands, KiviBf16Units).
  static constexpr float kUnit = static_cast<float>(1 << kBits);
  /// Codes per byte, and the mask that keeps the low code of every byte of
  /// a word: (word >> j kBits) & kByteMask holds code kCodesPerByte k + j of
  /// the word in byte k.
  static constexpr int kCodesPerByte = 8 / kBits;
  static constexpr uint32_t kByteMask = ((1u << kBits) - 1) * 0x01010101u;
  /// Key codes as the bytes of mmaK32U8 (decodeKiviMma's B, the G = 1
  /// tiles' A): where channel c goes among the 32 k of its key step (c /
  /// 32): k 4t + 16 half + i for the channel of code kCodesPerByte i + t %
  /// kCodesPerByte of key word keyWord(c / 32, t, half), so that the shift
  /// by kBits (t % kCodesPerByte) and kByteMask of that word give the four
  /// k 4t + 16 half .. +3 a fragment register holds. A permutation of the
  /// step's channels (entry 8t + 4 half + i: a lane's eight k in order).
  __host__ __device__ static constexpr int keyIndex(int c) {
    const int w16 = c % 16, r = w16 % kCodesPerWord;
    const int t = w16 / kCodesPerWord * kCodesPerByte + r % kCodesPerByte;
    return c / 32 * 32 + 8 * t + 4 * (c % 32 / 16) + r / kCodesPerByte;
  }
  /// The key word whose bytes lane t takes at step ks (half 0: k 4t ..
  /// 4t+3, half 1: k 4t+16 .. 4t+19), shifted right by kBits (t %
  /// kCodesPerByte).
  __host__ __device__ static constexpr int keyWord(int ks, int t, int half) {
    return (32 * ks + 16 * half) / kCodesPerWord + t / kCodesPerByte;
  }
  /// Row pitch of codes staged in shared memory, in words: an odd multiple
  /// of 4, so that rows stay 16-byte aligned and the eight rows that a
  /// fragment reads fall into different banks.
  static constexpr int kWordPitch =
      (kRowWords + 3) / 4 % 2 ? (kRowWords + 3) / 4 * 4
                              : (kRowWords + 3) / 4 * 4 + 4;
  /// Whether the keys' logits go through mma.sync (G = 1; decodeKiviMma
  /// takes G >= 2 where tensor cores are on): the warp's 32 slots as the
  /// rows of two A (their codes as bytes, keyIndex order), the folded
  /// query's three fixed-point digit bytes and a column of ones as B.
  static constexpr bool kKeyMma = kTensorCores && G == 1;
  /// Where digit byte `digit` (0..2) of channel c's fixed-point factor goes
  /// in the warp's scratch (as bytes): per key step, 32 bytes a digit in
  /// keyIndex order, so that lane (g, t) of the step reads B's column g
  /// (g < 3) as the eight bytes from 8t.
  __host__ __device__ static constexpr int keyDigitByte(int c, int digit) {
    return (c / 32 * 3 + digit) * 32 + keyIndex(c) % 32;
  }
  /// Where digit `digit` (0, 1) of channel c of a query head's folded row
  /// goes in its 2 D entries of decodeKiviTiles' scratch: for the run j of
  /// word w, the 16 bytes {d0 of bytes 0-3, d1 of bytes 0-3}, two per
  /// 32-bit word as dp2a takes them against bytes 0-1 (lo) and 2-3 (hi).
  __host__ __device__ static constexpr int digitIndex(int c, int digit) {
    return (((c / kCodesPerWord) * kCodesPerByte + c % kCodesPerByte) * 2 +
            digit) *
               4 +
           c % kCodesPerWord / kCodesPerByte;
  }
  /// Slots a value lane takes per tile (kSlotsPerStep apart), in pairs.
  static constexpr int kPairsPerLane = kWarpSize / kSlotsPerStep / 2;
  /// The lowest lane bit of a value lane's group c0 / KG (c0 = (lane %
  /// kValueLanes) kValueChannels): log2(KG / kValueChannels), KG a power
  /// of two (it divides the head dim).
  static constexpr int kGroupLaneBit = [] {
    int bit = 0;
    while ((kValueChannels << bit) < KG)
      ++bit;
    return bit;
  }();
  /// Pairs whose loads the value loop issues together: all of them for one
  /// or two query heads; two beyond (the loop runs once per head, and
  /// unrolled whole it held 255 registers at G = 8, head dim 128).
  static constexpr int kPairUnroll = G <= 2 ? kPairsPerLane : 2;
  /// Blocks per SM that decodeAttentionKivi's registers must allow on this
  /// path (launch bounds): at G <= 2 those of KVC_CUDA_KIVI_TILE_BLOCKS
  /// (none by default); three blocks of 128 threads beyond, where ptxas
  /// left free takes up to 255 registers at G = 8 (two blocks) to keep the
  /// G query heads' loads of the folded query in flight.
  static constexpr int kMinBlocks =
      G <= 2 ? KVC_CUDA_KIVI_TILE_BLOCKS * 128 / kThreads : 3 * 128 / kThreads;
  /// Where digit `digit` of slot r's value weight goes in the 64 entries of
  /// a query head and group: the two slots r0 = sub + 2 i kSlotsPerStep and
  /// r0 + kSlotsPerStep that a value lane takes together share 8 bytes,
  /// {d0 of r0, d0 of r1, d1 of r0, d1 of r1}, pair sub kPairsPerLane + i.
  __host__ __device__ static constexpr int weightIndex(int r, int digit) {
    return ((r % kSlotsPerStep * kPairsPerLane + r / kSlotsPerStep / 2) * 2 +
            digit) *
               2 +
           r / kSlotsPerStep % 2;
  }
  /// A warp's scratch entries (16-bit): the folded query's digits, then the
  /// value weights' digits.
  static constexpr int kScratch = 2 * G * D > 2 * G * kGroups * kWarpSize
                                      ? 2 * G * D
                                      : 2 * G * kGroups * kWarpSize;
  /// digitIndex(c + 32, d) - digitIndex(c, d): 32 channels are whole words.
  static constexpr int kDigitStride =
      kWarpSize / kCodesPerWord * kCodesPerByte * 8;
  static_assert(kWarpSize % kCodesPerWord == 0 &&
                    digitIndex(kWarpSize + 5, 1) ==
                        digitIndex(5, 1) + kDigitStride,
                "a lane's channels are 32 apart in whole words");
  using ValueCodes = std::conditional_t<kBits == 2, uint16_t, uint32_t>;
  /// A packed row as 16- or 8-byte vectors.
  using RowVector = std::conditional_t<kRowWords % 4 == 0, uint4, uint2>;
  static constexpr int kRowVectors = kRowWords / (sizeof(RowVector) / 4);
  /// The lines of a tile's L2 prefetch (KiviTilePrefetch): its positions and
  /// KIVI words, key and value codes, value records and key record; the
  /// rounds of a warp that ask for them, and their shared memory.
  static constexpr int kCodeLines = kRowBytes * kWarpSize / 128;
  static constexpr int kValueRecordLines =
      static_cast<int>(kValueRecordBytes * kWarpSize / 128);
  static constexpr int kKeyRecordLines =
      static_cast<int>(kKeyRecordBytes / 128);
  static constexpr int kPrefetchLines =
      2 + 2 * kCodeLines + kValueRecordLines + kKeyRecordLines;
  static constexpr int kPrefetchRounds =
      (kPrefetchLines + kWarpSize - 1) / kWarpSize;
  static constexpr int kPrefetchBytes =
      kWarps * kPrefetchRounds * kWarpSize * 8;
  /// Shared memory of the kernel (its buffers, the staged key rows at
  /// kKeyMma, and combineRowGroups').
  static constexpr int kSharedBytes =
      4 * (G * D + kWarps * kWarpSize * (G + 1)) +
      kWarps * (2 * kScratch + kWarpSize * kRowBytes) +
      (kKeyMma ? 4 * kWarps * kWarpSize * kWordPitch : 0) +
      4 * (G * D + 2 * kWarps * G) + kPrefetchBytes;
  /// Key blocks of whole tiles, up to 8 query heads (their value sums stay
  /// in registers), the static shared memory limit; other KIVI geometries
  /// go through decodeKiviRows. decodeAttentionKivi takes this path where
  /// decodeKiviMma does not apply (G = 1).
  static constexpr bool kApplies =
      KG % kWarpSize == 0 && (KG & (KG - 1)) == 0 &&
      kThreads % kWarpSize == 0 && D % kWarpSize == 0 && G <= 8 &&
      kSharedBytes <= 48 * 1024;
  static_assert(kBits == 2 || kBits == 4, "KIVI codes are int2 or int4");
  static_assert(kRowWords % 2 == 0, "a packed row is whole 8-byte words");
  static_assert(kValueLanes <= kWarpSize && kWarpSize % kValueLanes == 0,
                "a value row spreads over a power-of-two number of lanes");
};

/// The L2 prefetch of a KIVI tile of 32 slots (decodeKiviTiles,
/// decodeKiviMma): its Tiles::kPrefetchLines lines, one per lane and
/// round. Line 0 is the tile's positions (t.positions + base), line 1 its
/// KIVI words (t.kiviRows + base; neither asked for with kIssueAhead, where
/// the walk loads them a tile ahead), then its key codes, value codes, value
/// records and its block's key record, each a line of the tile's page at
///     page + 16 offset + (o0 >> shift) scale,
/// o0 the tile's first slot's offset in the page: a lane's offset, shift
/// and scale of each round depend on the lane alone, so the warp's walk
/// sets them once (set) and a tile's prefetch (issue) reads them back from
/// shared memory, a lane its own entries (no barrier), rather than
/// computing each lane's region and line per tile, which took about 80
/// instructions of a tile's path (nested branches that the lanes of a
/// warp all take in turn, and 64-bit address arithmetic).
template <typename Tiles> struct KiviTilePrefetch {
  static constexpr int kCodeLines = Tiles::kCodeLines;
  static constexpr int kValueRecordLines = Tiles::kValueRecordLines;
  static constexpr int kKeyRecordLines = Tiles::kKeyRecordLines;
  static constexpr int kRounds = Tiles::kPrefetchRounds;
  /// log2 of the key group: a tile's key record is that of block o0 / KG.
  static constexpr int kKeyGroupShift = [] {
    int s = 0;
    while ((1 << s) < Tiles::kKeyGroup)
      ++s;
    return s;
  }();
  static_assert(Tiles::kKeyGroup == 1 << kKeyGroupShift,
                "a key group is a power of two");
  static_assert(Tiles::kKeyRecordBytes < (uint64_t{1} << 24),
                "a line's scale fits its 24 bits");
  /// Round r's entry of lane l of warp w: {16-byte units of the region's
  /// and line's offset in the page, shift | scale << 8}; scale 0 for no
  /// line of the page (lines 0 and 1, and past the last).
  __device__ static uint2 (&entries())[Tiles::kWarps][kRounds][kWarpSize] {
    __shared__ uint2 table[Tiles::kWarps][kRounds][kWarpSize];
    return table;
  }

  /// The lane's entries, from the context's page layout (region offsets
  /// 16-byte aligned, kvc_page_layout_t; 32 bits of 16-byte units reach
  /// 64 GiB into a page).
  __device__ static void set(const PageLayout &layout, int warp, int lane) {
#pragma unroll
    for (int r = 0; r < kRounds; ++r) {
      // Line i of the page's lines (lines 0 and 1 are the tables').
      int i = r * kWarpSize + lane - 2;
      uint64_t offset = 0;
      uint32_t shift = 0, scale = 0;
      if (i >= 0) {
        if (i < kCodeLines) {
          offset = layout.keyOffset + 128 * i;
          scale = Tiles::kRowBytes;
        } else if ((i -= kCodeLines) < kCodeLines) {
          offset = layout.valueOffset + 128 * i;
          scale = Tiles::kRowBytes;
        } else if ((i -= kCodeLines) < kValueRecordLines) {
          offset = layout.valueParamOffset + 128 * i;
          scale = static_cast<uint32_t>(Tiles::kValueRecordBytes);
        } else if ((i -= kValueRecordLines) < kKeyRecordLines) {
          offset = layout.keyParamOffset + 128 * i;
          shift = kKeyGroupShift;
          scale = static_cast<uint32_t>(Tiles::kKeyRecordBytes);
        }
      }
      entries()[warp][r][lane] =
          make_uint2(static_cast<uint32_t>(offset / 16), shift | scale << 8);
    }
  }

  /// Asks L2 for the lines of the tile at `base` (offset o0 in `page`;
  /// nothing for a null page).
  __device__ static __forceinline__ void issue(const HeadTable &t,
                                               int32_t base, int32_t o0,
                                               const uint8_t *page, int warp,
                                               int lane) {
    if (!page)
      return;
    // With kIssueAhead the walk has loaded the tile's positions and words.
    if constexpr (!kIssueAhead)
      prefetchL2If(lane < 2, (lane ? t.kiviRows : t.positions) + base);
#pragma unroll
    for (int r = 0; r < kRounds; ++r) {
      const uint2 e = entries()[warp][r][lane];
      prefetchL2If(e.y >> 8 != 0,
                   page + 16 * static_cast<uint64_t>(e.x) +
                       static_cast<uint64_t>(static_cast<uint32_t>(o0) >>
                                             (e.y & 0xffu)) *
                           (e.y >> 8));
    }
  }
};

/// The walk of one warp over the KIVI tiles of a split (decodeKiviTiles,
/// decodeKiviMma): tiles of 32 slots, 32-aligned (one key block, one page),
/// warp w of kWarps taking those that meet [begin, end) from the w-th on,
/// every kWarps-th. enter() takes the next tile and decodes the lane's
/// slot there (into a Tile): whether it lies in the split and holds an
/// entry, and its KIVI word (window key or value, residual row); a tile
/// without a live slot gets the logit -inf for its slots in the split and
/// nothing else. Each tile's page address and offset in it are found with
/// the tile before it (one division by the page size per tile), and
/// prefetchNext() asks L2 for the lines of the tile after the current one
/// (KiviTilePrefetch). With kIssueAhead the lane's position and KIVI word
/// of the tile after the current one are copied into shared memory
/// (copyAsync, no registers held) as the current one is entered, so that
/// they arrive while it is worked on: a tile's loads of codes and records
/// then wait for nothing, where they used to follow two dependent loads
/// (the position, for whether a slot is live, then the word, for where its
/// key and value are), each a round trip to L2 at least.
template <int G, typename Tiles> struct KiviTileWalk {
  static constexpr int32_t kStride = Tiles::kWarps * kWarpSize;
  using Prefetch = KiviTilePrefetch<Tiles>;
  /// The tile after the current one, its page address (0: none) and its
  /// offset in the page.
  int32_t ahead, aheadOffset;
  uint64_t aheadPage;
  /// With kIssueAhead: the position and KIVI word of lane l's slot of
  /// warp w's `ahead` at [w][l][0] and [1] (KVC_POSITION_NONE and -1
  /// outside the split), the lane's own copies (no barrier).
  __device__ static int32_t (&held())[Tiles::kWarps][kWarpSize][2] {
    __shared__ __align__(8) int32_t words[Tiles::kWarps][kWarpSize][2];
    return words;
  }
  /// The current tile: its first slot, its page, the lane's slot and its
  /// offset in the page, and what the slot holds.
  struct Tile {
    int32_t base, slot, row;
    const uint8_t *page;
    uint64_t offset;
    bool inRange, live, keyFull, valueFull;
  };

  __device__ KiviTileWalk(const DecodeSplitArgs &a, const HeadTable &t,
                          int32_t begin, int32_t end, int warp, int lane)
      : ahead(begin / kWarpSize * kWarpSize + warp * kWarpSize) {
    locateAhead(a, t, begin, end, lane);
    Prefetch::set(a.layout, warp, lane);
  }

  /// aheadPage and aheadOffset of `ahead` (and with kIssueAhead the copies
  /// of the lane's held words, one group; the caller's enter waits for it
  /// before it reads them or copies again).
  __device__ __forceinline__ void locateAhead(const DecodeSplitArgs &a,
                                              const HeadTable &t,
                                              int32_t begin, int32_t end,
                                              int lane) {
    const int32_t page = a.layout.pages.page(ahead);
    aheadOffset = ahead - page * a.layout.pages.size;
    aheadPage = ahead < end ? t.pages[page] : 0;
    if constexpr (kIssueAhead) {
      const int32_t slot = ahead + lane;
      int32_t *words = held()[threadIdx.x / kWarpSize][lane];
      if (slot >= begin && slot < end) {
        copyAsync<4>(&words[0], t.positions + slot);
        copyAsync<4>(&words[1], t.kiviRows + slot);
      } else {
        words[0] = KVC_POSITION_NONE;
        words[1] = -1;
      }
      commitCopies();
    }
  }

  /// Whether a tile is left.
  __device__ __forceinline__ bool more(int32_t end) const {
    return ahead < end;
  }

  /// Takes the next tile into x; false (the tile done) when no slot of it
  /// is live.
  __device__ __forceinline__ bool enter(const DecodeSplitArgs &a,
                                        const HeadTable &t, int32_t h,
                                        int32_t begin, int32_t end, int lane,
                                        Tile &x) {
    x.base = ahead;
    x.slot = x.base + lane;
    x.inRange = x.slot >= begin && x.slot < end;
    int32_t position = KVC_POSITION_NONE, heldWord = -1;
    if constexpr (kIssueAhead) {
      waitCopies<0>();
      const int32_t *words = held()[threadIdx.x / kWarpSize][lane];
      position = words[0];
      heldWord = words[1];
    } else if (x.inRange) {
      position = t.positions[x.slot];
    }
    x.live = x.inRange && position != KVC_POSITION_NONE;
    const uint64_t here = aheadPage;
    const int32_t hereOffset = aheadOffset;
    ahead = x.base + kStride;
    locateAhead(a, t, begin, end, lane);
    if (__ballot_sync(kFullMask, x.live) == 0) {
      if (a.logits && x.inRange)
#pragma unroll
        for (int g = 0; g < G; ++g)
          a.logits[(static_cast<int64_t>(h) * G + g) * a.stride + x.slot] =
              kNegInf;
      prefetchNext(t, lane);
      return false;
    }
    // A tile with a live slot has its page (and a block's slots share it).
    x.page = reinterpret_cast<const uint8_t *>(here);
    x.offset = static_cast<uint64_t>(hereOffset) + static_cast<uint64_t>(lane);
    const int32_t word =
        !x.live ? -1 : kIssueAhead ? heldWord : t.kiviRows[x.slot];
    x.keyFull = word >= 0 && (word & kKiviKeyFull);
    x.valueFull = word >= 0 && (word & kKiviValueFull);
    x.row = word & kKiviRowMask;
    return true;
  }

  __device__ __forceinline__ void prefetchNext(const HeadTable &t,
                                               int lane) const {
    Prefetch::issue(t, ahead, aheadOffset,
                    reinterpret_cast<const uint8_t *>(aheadPage),
                    threadIdx.x / kWarpSize, lane);
  }
};

/// One lane's loads of a KIVI tile, issued together ahead of their use: its
/// slot's key codes (where they are read: `keyCodes`), value codes (always:
/// a free slot's are read from its page, which exists when the tile has a
/// live slot, and weighted 0), value record (a live slot with quantized
/// value) and, when some lane of the warp reads key codes (`fold`), the
/// block's {scale, min} of channels lane, lane + 32, ...: record words,
/// which asymPair widens where they are used.
template <typename Tiles> struct KiviTileLoads {
  using RowVector = typename Tiles::RowVector;
  RowVector keyRow[Tiles::kRowVectors] = {}, valueRow[Tiles::kRowVectors];
  uint32_t valueRecord[Tiles::kGroups] = {};
  uint32_t keyRecord[Tiles::kHeadDim / kWarpSize] = {};

  /// The packed row of slot `o` of the code region at `region`.
  __device__ static __forceinline__ void
  loadRow(const uint8_t *region, uint64_t o,
          RowVector (&row)[Tiles::kRowVectors]) {
    const auto *codes =
        reinterpret_cast<const RowVector *>(region + o * Tiles::kRowBytes);
#pragma unroll
    for (int v = 0; v < Tiles::kRowVectors; ++v)
      row[v] = __ldg(codes + v);
  }

  /// `page`: the tile's page; `o`: the lane's slot offset in it.
  __device__ __forceinline__ void load(const DecodeSplitArgs &a,
                                       const uint8_t *page, uint64_t o,
                                       int lane, bool keyCodes,
                                       bool valueCodes, bool fold) {
    if (keyCodes)
      loadRow(page + a.layout.keyOffset, o, keyRow);
    loadRow(page + a.layout.valueOffset, o, valueRow);
    if (valueCodes)
      loadWords<Tiles::kGroups>(page + a.layout.valueParamOffset +
                                    o * Tiles::kValueRecordBytes,
                                valueRecord);
    if (fold) {
      const uint32_t *words = reinterpret_cast<const uint32_t *>(
          page + a.layout.keyParamOffset +
          (o - lane) / Tiles::kKeyGroup * Tiles::kKeyRecordBytes);
#pragma unroll
      for (int i = 0; i < Tiles::kHeadDim / kWarpSize; ++i)
        keyRecord[i] = __ldg(words + i * kWarpSize + lane);
    }
  }
};

/// l[g] += q[g] . k over the D channels of a KIVI window key, k the
/// full-precision row `row` of the residual region (Storage S) and q[g] the
/// `pitch` floats at queries + g * pitch (decodeKiviTiles, decodeKiviMma).
template <int G, int D, Storage S>
__device__ __forceinline__ void addWindowKeyDots(const uint8_t *residual,
                                                 int32_t row,
                                                 const float *queries,
                                                 int pitch, float (&l)[G]) {
  using Full = RowShape<D, S>;
  const uint4 *full = reinterpret_cast<const uint4 *>(
      residual + static_cast<uint64_t>(row) * Full::kRowBytes);
#pragma unroll 2
  for (int v = 0; v < Full::kVecs; ++v) {
    float x[Full::kElemsPerVec];
    Codec<S>::decode(__ldg(full + v), 1.0f, x);
#pragma unroll
    for (int e = 0; e < Full::kElemsPerVec; ++e)
#pragma unroll
      for (int g = 0; g < G; ++g)
        l[g] = fmaf(queries[g * pitch + v * Full::kElemsPerVec + e], x[e],
                    l[g]);
  }
}

/// The fold of a KIVI tile's key block record ({scale, min} per channel,
/// KiviTileLoads::keyRecord) into G query heads (rows of D floats from
/// `queries`), channels c = lane + 32 i of the lane: f[i][g] = q[g][c]
/// s[c], bound[g] the largest bits of |f[i][g]| (a NaN or an infinity
/// wins), and bias[g] += q[g][c] min[c], the lane's share of the bias
/// (decodeKiviTiles, tileKeyLogit).
template <int G, typename Tiles>
__device__ __forceinline__ void
foldKeyRecord(const KiviTileLoads<Tiles> &in, const float *queries, int lane,
              float (&f)[Tiles::kHeadDim / kWarpSize][G],
              uint32_t (&bound)[G], float (&bias)[G]) {
  constexpr int D = Tiles::kHeadDim;
#pragma unroll
  for (int g = 0; g < G; ++g)
    bound[g] = 0;
#pragma unroll
  for (int i = 0; i < D / kWarpSize; ++i) {
    const int c = i * kWarpSize + lane;
    const float2 record = asymPair(in.keyRecord[i]);
#pragma unroll
    for (int g = 0; g < G; ++g) {
      f[i][g] = queries[g * D + c] * record.x;
      const uint32_t bits = __float_as_uint(f[i][g]) & 0x7fffffffu;
      bound[g] = bits > bound[g] ? bits : bound[g];
      bias[g] = fmaf(queries[g * D + c], record.y, bias[g]);
    }
  }
}

/// The logit q . k of a lane's slot (before the softmax scale) for a tile
/// of decodeKiviTiles at G = 1 on tensor cores (KiviTiles::kKeyMma); 0 where
/// the slot's key is not codes. With k = code s + min per channel, q . k =
/// sum_c f_c code_c + sum_c q_c min_c, f_c = q_c s_c for the tile's key
/// block (`fold`: some lane's key is codes). The factors become integers
/// X_c = f_c / U, |X_c| <= 2^22, under one power of two U for the warp
/// (KiviKeyScale: 2^-22 of the power of two above the largest |f_c|), by
/// one fused multiply-add with 1.5 2^23, whose bits' low three bytes are
/// the digits of X_c + 2^22 (the last at most 128: X_c = 2^22, the largest
/// |f_c| rounded up, gives 2^24, whose exponent's low bit is bit 23, so
/// that byte 2 reads 128 and bytes 0 and 1 zero); each lane writes its
/// channels' digit bytes to `digits` (KiviTiles::keyDigitByte). The two
/// halves of the tile's 32 slots are the rows of two A of mmaK32U8 (their
/// staged codes `rows` as bytes, a shift and a mask per four), and B's
/// columns are digit 0, 1, 2 and ones, twice (columns 4..7 as 0..3), so
/// that lane (g, t) holds C[r][2t], C[r][2t + 1] of its rows r = g, g + 8:
/// the low part C0 + 2^8 C1 at even t, the high part 2^16 (C2 - 2^6 C1s)
/// at odd t (the ones column takes the 2^22 of every factor back out) of
/// slots 16 m + 8 half + g. Lane (g, t) adds its part of slot run 2m +
/// half = t to its neighbour's (one shuffle), and slot s's lane reads it
/// from lane 4 (s % 8) + s / 8: l = U (C0 + 2^8 C1 + 2^16 (C2 - 2^6 C1s))
/// + bias. For int2 up to head dim 128 the sum is one 32-bit integer
/// (|C2 - 2^6 C1s| <= 2^6 3 D, C0 + 2^8 C1 <= 257 255 3 D, their sum below
/// 2^31), else two floats. The whole warp calls it, converged.
template <typename Tiles>
__device__ __forceinline__ float
tileKeyLogit(const KiviTileLoads<Tiles> &in, const float *query,
             uint8_t *digits, const uint32_t (*rows)[Tiles::kWordPitch],
             bool fold, bool keyCodes, int lane) {
  constexpr int D = Tiles::kHeadDim, kBits = Tiles::kCodeBits;
  constexpr int kSteps = D / kWarpSize;
  constexpr float kMagic = 12582912.0f; // 1.5 * 2^23
  if (!fold)
    return 0.0f;
  float f[kSteps][1], bias[1] = {0.0f};
  uint32_t bound[1];
  foldKeyRecord<1>(in, query, lane, f, bound, bias);
  const float sum = warpSum(bias[0]);
  const KiviKeyScale k(warpMax(bound[0]));
#pragma unroll
  for (int i = 0; i < kSteps; ++i) {
    const uint32_t x = __float_as_uint(fmaf(f[i][0], k.scale, kMagic));
    const int c = i * kWarpSize + lane;
    digits[Tiles::keyDigitByte(c, 0)] = static_cast<uint8_t>(x);
    digits[Tiles::keyDigitByte(c, 1)] = static_cast<uint8_t>(x >> 8);
    digits[Tiles::keyDigitByte(c, 2)] = static_cast<uint8_t>(x >> 16);
  }
  __syncwarp();

  const int g = lane / 4, t = lane % 4, column = g % 4;
  const int shift = kBits * (t % Tiles::kCodesPerByte);
  int32_t acc[2][4] = {};
#pragma unroll
  for (int ks = 0; ks < kSteps; ++ks) {
    uint32_t b0 = 0x01010101u, b1 = 0x01010101u;
    if (column < 3) {
      const uint2 b = *reinterpret_cast<const uint2 *>(
          digits + (ks * 3 + column) * kWarpSize + 8 * t);
      b0 = b.x;
      b1 = b.y;
    }
    const int w0 = Tiles::keyWord(ks, t, 0), w1 = Tiles::keyWord(ks, t, 1);
#pragma unroll
    for (int m = 0; m < 2; ++m) {
      const uint32_t *lo = rows[16 * m + g], *hi = rows[16 * m + g + 8];
      const uint32_t a[4] = {lo[w0] >> shift & Tiles::kByteMask,
                             hi[w0] >> shift & Tiles::kByteMask,
                             lo[w1] >> shift & Tiles::kByteMask,
                             hi[w1] >> shift & Tiles::kByteMask};
      mmaK32U8(acc[m], a, b0, b1);
    }
  }

  // Part 2m + half of this lane (slots 16m + 8 half + g), then the sum of
  // run t with the other parity's part of it.
  constexpr bool kOneInteger = kBits == 2 && D <= 128;
  using Sum = std::conditional_t<kOneInteger, int32_t, float>;
  Sum part[4];
#pragma unroll
  for (int m = 0; m < 2; ++m)
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const int32_t x0 = acc[m][2 * half], x1 = acc[m][2 * half + 1];
      Sum v;
      if constexpr (kOneInteger)
        v = t % 2 ? static_cast<int32_t>(
                        static_cast<uint32_t>(x0 - x1 * 64) << 16)
                  : x0 + x1 * 256;
      else
        v = t % 2 ? 65536.0f * static_cast<float>(x0 - x1 * 64)
                  : static_cast<float>(x0 + x1 * 256);
      part[2 * m + half] = v;
    }
  const Sum mine = t == 0 ? part[0]
                   : t == 1 ? part[1]
                   : t == 2 ? part[2]
                            : part[3];
  const Sum other = t == 0 ? part[1]
                    : t == 1 ? part[0]
                    : t == 2 ? part[3]
                             : part[2];
  const Sum run = mine + __shfl_xor_sync(kFullMask, other, 1);
  const Sum slotSum =
      __shfl_sync(kFullMask, run, 4 * (lane % 8) + lane / 8);
  return keyCodes ? fmaf(k.unit, static_cast<float>(slotSum), sum) : 0.0f;
}

/// decodeAttentionKivi for key blocks of KG >= 32 tokens (KG a multiple of
/// 32; the paper's 32 and larger): the codes stay integers and meet their
/// factors in integer dot products (dp2a: two 16-bit digits times two
/// bytes, one instruction), so that a key code costs about one dp2a per
/// query head and a value code the same, where a float form costs a shift,
/// a mask and a fused multiply-add per code.
///
/// Keys (a slot per lane): with x = code * s + min,
/// q . x = sum_c (q_c s_c) code_c + sum_c q_c min_c. Once per tile the warp
/// writes the first factors f_c = q_c s_c of each query head as two signed
/// 15-bit digits under one power of two (KiviDigits: f = u (d0 + d1 / 2^15)
/// within u / 2^16, u from the head's largest |f_c|) and forms the second
/// sum (the bias) by a warp reduction; each lane then turns its slot's codes
/// into bytes (a shift and a mask per kCodesPerByte codes of a word) and
/// sums d0 code and d1 code exactly in 32-bit integers, reading the digits
/// with broadcast loads: l = bias + u (S0 + S1 / 2^15).
/// Values (kValueChannels channels of two slots per lane and step): the
/// same identity per slot and group gives acc += (p s) code + p min. Each
/// slot's lane writes its weights w = p s per group as digits under a power
/// of two per query head and tile; the value lanes interleave the codes of
/// their two slots byte by byte (prmt) and sum w code per channel in
/// integers, turned to float once per tile and head; the offsets p min are
/// one warp sum per group and tile. A window slot's full-precision key or
/// value goes the direct way (its weight p, its row from the residual
/// region). The integer sums are exact; a digit pair keeps 29 bits of the
/// factor's largest magnitude, more than a float's 24.
/// Same outputs as decodeKiviRows: every slot's logit and the split's
/// partial record.
template <int G, int D, int kBits, int KG, kvc_dtype_t T, int kThreads>
__device__ __forceinline__ void
decodeKiviTiles(const DecodeSplitArgs &a, const HeadTable &t, int32_t h,
                int32_t split, int32_t begin, int32_t end,
                int32_t residualLength) {
  using Tiles = KiviTiles<G, D, kBits, KG, T, kThreads>;
  constexpr Storage S = kKiviFullStorage<T>;
  using Full = RowShape<D, S>;
  constexpr int kWarps = Tiles::kWarps, kVC = Tiles::kValueChannels;
  const int lane = threadIdx.x % kWarpSize, warp = threadIdx.x / kWarpSize;
  // The value phase's lane: channels [c0, c0 + kVC) of the slots
  // sub, sub + kSlotsPerStep, ... of the tile.
  const int sub = lane / Tiles::kValueLanes;
  const int c0 = lane % Tiles::kValueLanes * kVC;
  // The fold's lane: digit 0 of channel lane + 32 i of a folded row goes
  // to laneDigits + i kDigitStride, digit 1 four entries after it; digit 0
  // of the lane's slot's value weight of a group to laneWeight, digit 1 two
  // entries after it.
  const int laneDigits = Tiles::digitIndex(lane, 0);
  const int laneWeight = Tiles::weightIndex(lane, 0);

  __shared__ __align__(16) float queries[G][D];
  // A warp's scratch, in turn: the tile's folded query q[g][c] s[c] per
  // query head as two 15-bit digits (KiviDigits; 2 D per head, in the
  // order the key loop reads them: KiviTiles::digitIndex), then its slots'
  // value weights p s per query head and group as digits (64 per head and
  // group: KiviTiles::weightIndex).
  __shared__ __align__(16) int16_t scratch[kWarps][Tiles::kScratch];
  // At G = 1 on tensor cores (kKeyMma), the tile's key rows (a slot's at
  // warp 32 + slot), which the key fragments gather across slots.
  __shared__ __align__(16) uint32_t
      keyWords[Tiles::kKeyMma ? kWarps * kWarpSize : 1][Tiles::kWordPitch];
  // A tile's weights (per slot and query head) and full-precision value
  // rows (-1: codes), for its window values.
  __shared__ __align__(16) float weights[kWarps][kWarpSize][G];
  __shared__ int32_t valueRows[kWarps][kWarpSize];
  __shared__ __align__(16)
      typename Tiles::RowVector valueCodes[kWarps][kWarpSize]
                                          [Tiles::kRowVectors];
  // The lane's value codes of slot r: channels [c0, c0 + kVC).
  auto valueCodesOf = [&](int r) -> uint32_t {
    return reinterpret_cast<const typename Tiles::ValueCodes *>(
        &valueCodes[warp][r][0])[c0 * kBits / 8 /
                                 sizeof(typename Tiles::ValueCodes)];
  };
  for (int i = threadIdx.x; i < G * D; i += kThreads)
    (&queries[0][0])[i] = a.q[static_cast<int64_t>(h) * G * D + i];
  __syncthreads();

  float m[G], z[G], acc[G][kVC], corr[G];
#pragma unroll
  for (int g = 0; g < G; ++g) {
    m[g] = kNegInf;
    z[g] = corr[g] = 0.0f;
#pragma unroll
    for (int e = 0; e < kVC; ++e)
      acc[g][e] = 0.0f;
  }

  // Warp w takes the 32-aligned tiles w, w + kWarps, ... that meet
  // [begin, end); a lane's slot outside the split is masked.
  KiviTileWalk<G, Tiles> walk(a, t, begin, end, warp, lane);
  typename KiviTileWalk<G, Tiles>::Tile tile;
  while (walk.more(end)) {
    if (!walk.enter(a, t, h, begin, end, lane, tile))
      continue;
    const int32_t slot = tile.slot, row = tile.row;
    const bool inRange = tile.inRange, live = tile.live,
               keyFull = tile.keyFull, valueFull = tile.valueFull;
    const bool keyCodes = live && !keyFull;
    float l[G];

    // Every load of the tile goes first.
    const bool fold = __ballot_sync(kFullMask, keyCodes) != 0;
    KiviTileLoads<Tiles> in;
    in.load(a, tile.page, tile.offset, lane, keyCodes, live && !valueFull,
            fold);

    // The previous tile's lanes are done with the tile buffers: the slot's
    // value codes and window row go to them.
    __syncwarp();
#pragma unroll
    for (int v = 0; v < Tiles::kRowVectors; ++v) {
      valueCodes[warp][lane][v] = in.valueRow[v];
      if constexpr (Tiles::kKeyMma)
        reinterpret_cast<typename Tiles::RowVector *>(
            keyWords[warp * kWarpSize + lane])[v] = in.keyRow[v];
    }
    valueRows[warp][lane] = valueFull ? row : -1;
    if constexpr (Tiles::kKeyMma) {
      l[0] = tileKeyLogit<Tiles>(in, &queries[0][0],
                                 reinterpret_cast<uint8_t *>(scratch[warp]),
                                 keyWords + warp * kWarpSize, fold, keyCodes,
                                 lane);
    } else {
      // The fold: f[g][c] = q[g][c] s[c] as digits under a power of two per
      // query head (the warp's largest |f[g][c]|), and the bias
      // sum_c q[g][c] min[c], channels lane, lane + 32, ...
      float bias[G], unit[G];
#pragma unroll
      for (int g = 0; g < G; ++g)
        bias[g] = unit[g] = 0.0f;
      if (fold) {
        float f[D / kWarpSize][G];
        uint32_t bound[G];
        foldKeyRecord<G>(in, &queries[0][0], lane, f, bound, bias);
#pragma unroll
        for (int g = 0; g < G; ++g) {
          bias[g] = warpSum(bias[g]);
          const KiviDigitScale k(warpMax(bound[g]));
          unit[g] = k.unit;
          int16_t *row = &scratch[warp][g * 2 * D + laneDigits];
#pragma unroll
          for (int i = 0; i < D / kWarpSize; ++i) {
            const KiviDigits d(f[i][g], k.scale);
            row[i * Tiles::kDigitStride] = static_cast<int16_t>(d.d0);
            row[i * Tiles::kDigitStride + 4] = static_cast<int16_t>(d.d1);
          }
        }
      }
      __syncwarp();
#pragma unroll
      for (int g = 0; g < G; ++g)
        l[g] = keyCodes ? bias[g] : 0.0f;
      if (keyCodes) {
        // q . x = sum_c f_c code_c + bias: each run of kCodesPerByte codes
        // as bytes (a shift and a mask), two dp2a per digit and byte pair.
        const uint32_t *words =
            reinterpret_cast<const uint32_t *>(in.keyRow);
        int32_t s0[G], s1[G];
#pragma unroll
        for (int g = 0; g < G; ++g)
          s0[g] = s1[g] = 0;
#pragma unroll
        for (int w = 0; w < Tiles::kRowWords; ++w)
#pragma unroll
          for (int j = 0; j < Tiles::kCodesPerByte; ++j) {
            const uint32_t bytes =
                (words[w] >> (j * kBits)) & Tiles::kByteMask;
#pragma unroll
            for (int g = 0; g < G; ++g) {
              const uint4 d = *reinterpret_cast<const uint4 *>(
                  &scratch[warp][g * 2 * D +
                                 Tiles::digitIndex(
                                     w * Tiles::kCodesPerWord + j, 0)]);
              s0[g] = dot2x16<true>(d.x, bytes, s0[g]);
              s0[g] = dot2x16<false>(d.y, bytes, s0[g]);
              s1[g] = dot2x16<true>(d.z, bytes, s1[g]);
              s1[g] = dot2x16<false>(d.w, bytes, s1[g]);
            }
          }
#pragma unroll
        for (int g = 0; g < G; ++g)
          l[g] = KiviDigits::addSums(unit[g], s0[g], s1[g], l[g]);
      }
    }
    if (live && !keyCodes) {
      // A window key: its full-precision row from the residual region.
      addWindowKeyDots<G, D, S>(t.kiviResidual, row, &queries[0][0], D, l);
    }
#pragma unroll
    for (int g = 0; g < G; ++g) {
      l[g] = live ? l[g] * a.scale : kNegInf;
      if (a.logits && inRange)
        a.logits[(static_cast<int64_t>(h) * G + g) * a.stride + slot] = l[g];
    }

    // The online softmax: the tile's maximum (finite: a slot is live), one
    // rescale when it moves, the slot's weights.
    float p[G];
#pragma unroll
    for (int g = 0; g < G; ++g) {
      const float mNew = fmaxf(m[g], warpMax(l[g]));
      if (mNew != m[g]) {
        const float rescale = expf(m[g] - mNew);
        m[g] = mNew;
        z[g] *= rescale;
        corr[g] *= rescale;
#pragma unroll
        for (int e = 0; e < kVC; ++e)
          acc[g][e] *= rescale;
      }
      // e^(l - m) as 2^((l - m) log2 e) (exp2Approx), as decodeKiviMma.
      p[g] = exp2Approx((l[g] - mNew) * 1.44269504088896341f);
      z[g] += p[g];
    }

    // The slot's weights w = p s per group as digits under a power of two
    // per query head (the warp's largest w), in the scratch buffer now that
    // every lane is done with the folded query; each group's offset
    // sum_slots p min, once per tile (a warp sum); the weights themselves
    // for window values.
    const bool valueCodesLive = live && !valueFull;
    const int group = c0 / KG;
    float vUnit[G];
    __syncwarp();
#pragma unroll
    for (int g = 0; g < G; ++g) {
      weights[warp][lane][g] = p[g];
      float w[Tiles::kGroups], offsets[Tiles::kGroups];
      uint32_t bound = 0;
#pragma unroll
      for (int x = 0; x < Tiles::kGroups; ++x) {
        const float2 record = asymPair(in.valueRecord[x]);
        w[x] = valueCodesLive ? p[g] * record.x : 0.0f;
        const uint32_t bits = __float_as_uint(w[x]) & 0x7fffffffu;
        bound = bits > bound ? bits : bound;
        offsets[x] = valueCodesLive ? p[g] * record.y : 0.0f;
      }
      // The offset of the lane's value group (lane bits from log2(KG / 8)
      // on: c0 / KG), which counts once per channel: in the lanes of the
      // first slot run.
      const float offset =
          warpSumScattered<Tiles::kGroups, Tiles::kGroupLaneBit>(offsets,
                                                                 lane);
      if (sub == 0)
        corr[g] += offset;
      const KiviDigitScale k(warpMax(bound));
      vUnit[g] = k.unit;
      int16_t *slotDigits =
          &scratch[warp][g * Tiles::kGroups * 2 * kWarpSize + laneWeight];
#pragma unroll
      for (int x = 0; x < Tiles::kGroups; ++x) {
        const KiviDigits d(w[x], k.scale);
        slotDigits[x * 2 * kWarpSize] = static_cast<int16_t>(d.d0);
        slotDigits[x * 2 * kWarpSize + 2] = static_cast<int16_t>(d.d1);
      }
    }
    __syncwarp();
    walk.prefetchNext(t, lane);

    // Values: the lane's slots two at a time, their codes of channels
    // [c0, c0 + kVC) interleaved byte by byte (a prmt per two bytes of
    // each), a shift and a mask per run of kCodesPerByte codes, and two
    // dp2a per digit: one for channels lo, one for channels hi. Window
    // values have weight digits 0 here and go the direct way after.
#pragma unroll
    for (int g = 0; g < G; ++g) {
      int32_t s0[kVC], s1[kVC];
#pragma unroll
      for (int e = 0; e < kVC; ++e)
        s0[e] = s1[e] = 0;
      const uint2 *pairDigits = reinterpret_cast<const uint2 *>(
          &scratch[warp][(g * Tiles::kGroups + group) * 2 * kWarpSize]);
#pragma unroll(Tiles::kPairUnroll)
      for (int pr = 0; pr < Tiles::kPairsPerLane; ++pr) {
        const int r0 = sub + 2 * pr * Tiles::kSlotsPerStep,
                  r1 = r0 + Tiles::kSlotsPerStep;
        const uint2 d = pairDigits[sub * Tiles::kPairsPerLane + pr];
        const uint32_t a0 = valueCodesOf(r0), a1 = valueCodesOf(r1);
#pragma unroll
        for (int q = 0; q < kVC * kBits / 16; ++q) {
          const uint32_t y = bytePerm(a0, a1, q == 0 ? 0x5140u : 0x7362u);
#pragma unroll
          for (int j = 0; j < Tiles::kCodesPerByte; ++j) {
            const uint32_t bytes = (y >> (j * kBits)) & Tiles::kByteMask;
            const int lo = 2 * q * Tiles::kCodesPerByte + j,
                      hi = lo + Tiles::kCodesPerByte;
            s0[lo] = dot2x16<true>(d.x, bytes, s0[lo]);
            s1[lo] = dot2x16<true>(d.y, bytes, s1[lo]);
            s0[hi] = dot2x16<false>(d.x, bytes, s0[hi]);
            s1[hi] = dot2x16<false>(d.y, bytes, s1[hi]);
          }
        }
      }
#pragma unroll
      for (int e = 0; e < kVC; ++e)
        acc[g][e] = KiviDigits::addSums(vUnit[g], s0[e], s1[e], acc[g][e]);
    }
    if (__ballot_sync(kFullMask, valueFull) != 0) {
      // Window values: p times the full-precision row.
      for (int r = sub; r < kWarpSize; r += Tiles::kSlotsPerStep) {
        const int32_t fullRow = valueRows[warp][r];
        if (fullRow < 0)
          continue;
        float x[kVC];
        const uint4 *full = reinterpret_cast<const uint4 *>(
            t.kiviResidual +
            (static_cast<uint64_t>(residualLength) + fullRow) *
                Full::kRowBytes +
            c0 * Codec<S>::kBytes);
#pragma unroll
        for (int v = 0; v < kVC / Full::kElemsPerVec; ++v)
          Codec<S>::decode(__ldg(full + v), 1.0f, x + v * Full::kElemsPerVec);
#pragma unroll
        for (int g = 0; g < G; ++g) {
          const float pg = weights[warp][r][g];
#pragma unroll
          for (int e = 0; e < kVC; ++e)
            acc[g][e] = fmaf(pg, x[e], acc[g][e]);
        }
      }
    }
  }

  // The lanes of a channel run hold the sums of different slots: add them
  // (with their offsets), then the warps' states in warp order.
#pragma unroll
  for (int g = 0; g < G; ++g) {
    z[g] = warpSum(z[g]);
#pragma unroll
    for (int e = 0; e < kVC; ++e) {
      float v = acc[g][e] + corr[g];
#pragma unroll
      for (int s = Tiles::kValueLanes; s < kWarpSize; s *= 2)
        v += __shfl_xor_sync(kFullMask, v, s);
      acc[g][e] = v;
    }
  }
  combineRowGroups<G, D, kThreads, kWarps>(
      a, h, split, warp, lane == 0, m, z,
      [&](int g, float factor, float (*sum)[D]) {
        if (sub == 0)
#pragma unroll
          for (int e = 0; e < kVC; ++e)
            sum[g][c0 + e] += acc[g][e] * factor;
      });
}

/// KIVI codes as bf16 operands of mma.sync: u = 1 + code / 2^kBits, the
/// code in the top kBits of the mantissa of 1.0 (exact), two per register
/// (the lower k index in the low half).
template <int kBits> struct KiviBf16Units {
  /// Where a code goes in a bf16 (7 mantissa bits), and its mask in both
  /// halves.
  static constexpr int kShift = 7 - kBits;
  static constexpr uint32_t kMask = (((1u << kBits) - 1) << kShift) * 0x10001u;
  static constexpr uint32_t kOnes = 0x3F803F80u;
  /// Codes i and i + 1 of the byte x (x < 256): one multiply places both
  /// (the two shifted copies of x do not overlap), one lop3 keeps them.
  __device__ static __forceinline__ uint32_t pair(uint32_t x, int i) {
    const uint32_t spread = (1u << (kShift - i * kBits)) +
                            (1u << (16 + kShift - (i + 1) * kBits));
    return maskOr<kMask>(x * spread, kOnes);
  }
  /// Code r of byte 0 (low half) and of byte 2 (high half) of x, whatever
  /// bytes 1 and 3 hold.
  __device__ static __forceinline__ uint32_t spread(uint32_t x, int r) {
    const int s = kShift - r * kBits;
    return maskOr<kMask>(s >= 0 ? x << s : x >> -s, kOnes);
  }
};

/// A float as a sum of bf16 parts for mma.sync, by integer operations (no
/// conversion instructions): lead(x) is x rounded to bf16 (its top 16 bits
/// after adding half a unit of the last kept bit: to nearest, ties away
/// from zero), a float whose low 16 bits are 0; x - lead(x) is exact and
/// the next part is taken from it. pack() puts the top 16 bits of two
/// floats into one register (the first in the low half): the bf16 pair of
/// two leads, or of two last parts truncated.
struct Bf16Parts {
  __device__ static __forceinline__ float lead(float x) {
    return __uint_as_float((__float_as_uint(x) + 0x8000u) & 0xffff0000u);
  }
  __device__ static __forceinline__ uint32_t pack(float lo, float hi) {
    return bytePerm(__float_as_uint(lo), __float_as_uint(hi), 0x7632u);
  }
};

/// Geometry of decodeKiviMma. A warp's tile of 32 slots (as in KiviTiles)
/// goes through mma.sync twice:
///  - logits S = Q' K^T in exact integers (mmaK32U8: bytes, 32-bit sums), four
///    blocks of 8 slots, kKeySteps steps of 32 channels. A dequantized key is
///    code s + min per channel, so q . k = sum_c (q_c s_c) code_c + sum_c q_c
///    min_c (the bias, in float). The factors q_c s_c of a query head become
///    integers X_c = q_c s_c / U, |X_c| < 2^22, under one unit U per head and
///    tile (U = (E / t)(P / 2^11), t = KeyFixedPoint::kTop just below 2^11: E
///    the head's largest |q_c|, fixed for the step, and P the least power of
///    two above the block's scales, so that a tile's division is exact), by
///    one fused multiply-add whose result's low three bytes are the digits of
///    X_c + 2^22; A holds those digits (rows: head g's digit 0, 1, 2), B the
///    slots' codes, a byte each, and a row of ones sums each slot's codes to
///    take the 2^22 back out: l = U (C0 + 2^8 C1 + 2^16 (C2 - 2^6 C1s)) +
///    bias. At G <= 4 (kPairedLanes) the rows are g, g + 4 and g + 8 and the
///    ones row 12, one mma per key block and step; at G > 4 rows g and g + 8
///    of a first A, row g of a second and its row 8 the ones, two mmas. Step
///    ks, lane (g, t): A's k 4t + i and 4t + 16 + i are the channels whose
///    factors keyIndex puts in entries 8t + i and 8t + 4 + i of the step, and
///    B's bytes are (word >> kBits (t % kCodesPerByte)) & kByteMask of the
///    slot's key words keyWord(ks, t, half): a shift and a mask per four
///    codes;
///  - value sums O += W U: A the weights e^(l - m) times the slot's value
///    scale s 2^b per group (two bf16 parts, rows g and g + 8), which lane
///    (g, t) holds already as the logits of its slots 8n + 2t, 8n + 2t + 1 (the
///    C fragment of S is the A fragment of W); B the value codes of two
///    slots per register (bytePerm of their words), n-block j = kCpb q + r
///    holding column n at channel 8 kCpb q + kCpb n + r (byte 8q + n of a
///    row, code r of it): valueChannel.
/// Each value group's offset sum_slots p (min - s 2^b) goes per lane and
/// group alongside (corr), as in decodeKiviTiles.
/// decodeKiviMma's fixed-point key factors (KiviMma).
struct KeyFixedPoint {
  /// 1.5 * 2^23: fmaf(x, y, kMagic) for |x y| < 2^22 rounds x y to the
  /// nearest integer X and holds X + 2^22 in its low 23 bits (the float's
  /// mantissa, its unit 1), so bytes 0, 1, 2 of its bits are the digits of
  /// X + 2^22, the last below 128.
  static constexpr float kMagic = 12582912.0f;
  /// What a query's and a block's largest magnitude become: 2^11 less
  /// 2^-9, so that two factors' product stays below 2^22 whatever their
  /// roundings.
  static constexpr float kTop = 2048.0f - 0x1p-9f;
  /// The least magnitude a largest one is taken as (a zero query or a
  /// block of zero scales: its factors are 0 whatever the unit).
  static constexpr float kFloor = 1e-30f;
  /// kTop / x for a largest magnitude x, and x / kTop (once per block).
  __device__ static __forceinline__ float scale(float x) {
    return kTop / fmaxf(x, kFloor);
  }
  __device__ static __forceinline__ float unit(float x) {
    return fmaxf(x, kFloor) * (1.0f / kTop);
  }
  /// The least power of two above x >= 0, within 2^-99 .. 2^100 (per
  /// tile: no division), and 2^11 over it, exactly.
  __device__ static __forceinline__ float above(float x) {
    const uint32_t e = min(max(__float_as_uint(x) & 0x7F800000u, 27u << 23),
                           226u << 23);
    return __uint_as_float(e + 0x00800000u);
  }
  __device__ static __forceinline__ float over(float p) {
    return __uint_as_float((265u << 23) - __float_as_uint(p));
  }
};

template <int G, int D, int kBits, int KG, kvc_dtype_t T, int kThreads>
struct KiviMma {
  using Tiles = KiviTiles<G, D, kBits, KG, T, kThreads>;
  static constexpr int kWarps = kThreads / kWarpSize;
  static constexpr int kCpb = 8 / kBits;
  /// Row pitch of the staged codes in words (KiviTiles::kWordPitch).
  static constexpr int kRowWords = Tiles::kRowWords;
  static constexpr int kPitch = Tiles::kWordPitch;
  /// Query rows padded so that the window keys' broadcast loads of the
  /// heads miss each other's banks.
  static constexpr int kQueryPitch = D + (kBits == 2 ? 16 : 8);
  /// Key steps of 32 channels (mmaK32U8), blocks of 8 slots.
  static constexpr int kKeySteps = D / 32;
  static constexpr int kKeyBlocks = kWarpSize / 8;
  /// Codes per byte and per word of a packed key row, and the mask that
  /// keeps the low code of every byte.
  static constexpr int kCodesPerByte = 8 / kBits;
  static constexpr int kCodesPerWord = 32 / kBits;
  static constexpr uint32_t kByteMask = Tiles::kByteMask;
  /// Whether one A holds every row of the logits (G <= 4): head g's digits
  /// in rows g, g + 4 (lane g + 4) and g + 8, the ones in row 12, one mma
  /// per key block and step instead of two.
  static constexpr bool kPairedLanes = G <= 4;
  /// Rows of the staged fixed-point query: the heads of rows 0..3 or 0..7
  /// (those past G zero).
  static constexpr int kKeyRows = kPairedLanes ? 4 : 8;
  /// Value channel blocks (8 kCpb channels: a byte of every column's row),
  /// n-blocks of 8 channels, channel blocks per value group.
  static constexpr int kQBlocks = D / (8 * kCpb);
  static constexpr int kValueBlocks = D / 8;
  static constexpr int kQPerGroup = KG / (8 * kCpb);
  static constexpr int kSharedBytes =
      4 * 8 * kQueryPitch + 2 * 4 * kWarps * kWarpSize * kPitch +
      8 * kWarps * D + 8 * kWarps * kWarpSize * Tiles::kGroups +
      4 * kWarps * kWarpSize * G + 4 * (G * D + 2 * kWarps * G) +
      4 * kKeyRows * (D + 1) + Tiles::kPrefetchBytes;
  /// Two to eight query heads (one fragment row each), whole key blocks per
  /// tile, whole value groups per channel block, the static shared memory
  /// limit; others go through decodeKiviTiles or decodeKiviRows.
  static constexpr bool kApplies =
      kTensorCores && G >= 2 && G <= 8 && KG % kWarpSize == 0 &&
      D % kWarpSize == 0 && kThreads % kWarpSize == 0 &&
      kSharedBytes <= 48 * 1024;
  /// Blocks per SM that the kernel's registers must allow (launch bounds):
  /// four blocks of 128 threads, 128 registers a thread. Left free, ptxas
  /// takes 152 at G = 4 and 153 at G = 8, head dim 128 (three blocks; 168
  /// at G = 4 before the value sums were transposed); at 128 it keeps a
  /// few of a lane's values in local memory, 4 and 6 spill instructions a
  /// tile (of 1,384 and 1,704), for a third more warps to hide the latency
  /// of shared memory, shuffles and mma.sync. KVC_CUDA_KIVI_MMA_BLOCKS
  /// overrides the four (0: no bound; 5: 96 registers, 16 and 30 spill
  /// instructions a tile of 1,475 and 1,758, kvc-bench-gpu's kivi2_b5).
  static constexpr int kMinBlocks = KVC_CUDA_KIVI_MMA_BLOCKS * 128 / kThreads;

  /// Channel of column n of value n-block kCpb q + r.
  __device__ static int valueChannel(int q, int n, int r) {
    return 8 * kCpb * q + kCpb * n + r;
  }
  /// Whether the value sums go as O^T += U^T W^T (G <= 4, the paired
  /// lanes): the units of n-blocks kCpb q + 2i and kCpb q + 2i + 1 as rows
  /// 0-7 and 8-15 of A, the weights as B (columns 0-3 the heads' rounded
  /// weights, 4-7 their remainders, lanes g >= 4 taking head g - 4's
  /// weights from lane g - 4), so that one mma takes 16 channels instead of
  /// 8 and a lane's accumulators are D / 4 floats instead of D / 2
  /// (KVC_CUDA_MMA_TRANSPOSED_VALUES = 0 keeps the weights as A).
  /// At head dim 64 the tile gains about 3% instructions (the weights'
  /// exchange) and no block per SM (128 registers either way): G <= 4
  /// keeps the weights as A there. At G > 4 (kHeadColumns) the columns
  /// are the heads themselves, lane (g, t) holding head g's weights of
  /// the B fragment's rows already (no exchange), and the rounded weights
  /// and their remainders go as two B operands into the same sums: as
  /// many mmas as with the weights as A, half the accumulators (D / 4
  /// floats a lane rather than D / 2), which at head dim 128 took 24 of
  /// the tile's 30 spill instructions at 128 registers (at head dim 64:
  /// int2 1,167 to 1,166 instructions a tile, int4 1,345 to 1,302).
  static constexpr bool kTransposedValues =
      kMmaTransposedValues && (D >= 128 || !kPairedLanes);
  static constexpr bool kHeadColumns = kTransposedValues && !kPairedLanes;
  static constexpr int kAccBlocks =
      kTransposedValues ? kQBlocks * kCpb / 2 : kValueBlocks;
};

/// decodeAttentionKivi on tensor cores for 2 <= G <= 8 and key blocks of
/// KG >= 32 tokens (KiviMma). The tiles, their loads and the window
/// entries as in decodeKiviTiles: lane l loads slot base + l's codes and
/// records and stages them in shared memory; a window key's logits come
/// from its full-precision row (by its lane) and a window value's row is
/// added by every lane to the channels it sums, times the slot's weight.
/// The codes are never converted to float: four key codes cost a shift
/// and a mask (bytes of mmaK32U8) and a value code about 1.1 integer
/// instructions (KiviBf16Units), and the multiplications go to the tensor
/// cores. Same outputs as decodeKiviTiles.
template <int G, int D, int kBits, int KG, kvc_dtype_t T, int kThreads>
__device__ __forceinline__ void
decodeKiviMma(const DecodeSplitArgs &a, const HeadTable &t, int32_t h,
              int32_t split, int32_t begin, int32_t end,
              int32_t residualLength) {
  using P = KiviMma<G, D, kBits, KG, T, kThreads>;
  using Tiles = typename P::Tiles;
  using U = KiviBf16Units<kBits>;
  constexpr Storage S = kKiviFullStorage<T>;
  using Full = RowShape<D, S>;
  constexpr int kWarps = P::kWarps, kCpb = P::kCpb;
  const int lane = threadIdx.x % kWarpSize, warp = threadIdx.x / kWarpSize;
  // Fragment coordinates: query head (and key column) g, pair t.
  const int g = lane / 4, tq = lane % 4;

  // The queries times the softmax scale (zero rows from G to the
  // fragment's 8), and as fixed-point factors (keyQuery: q t / E in
  // keyIndex order, E = headBound the head's largest |q|, t = kTop); the
  // tile's codes (keyWords, valueWords: rows of kPitch words), the block's
  // key factors {s 2^11 / P, min} per channel in keyIndex order (P a power
  // of two above the block's scales), the slots' value factors per
  // group ({0, 0} for a free slot or a window value), and per slot and head
  // a window key's logit, then (same lane, same entry) the weight of a
  // window value.
  static_assert([] {
    for (int c = 0; c < kWarpSize; ++c) {
      int hits = 0;
      for (int d = 0; d < kWarpSize; ++d)
        hits += Tiles::keyIndex(d) == c;
      if (hits != 1)
        return false;
    }
    return true;
  }(), "keyIndex permutes the channels of a key step");
  using Fixed = KeyFixedPoint;
  __shared__ __align__(16) float queries[8][P::kQueryPitch];
  __shared__ __align__(16) float keyQuery[P::kKeyRows][D];
  __shared__ float headBound[P::kKeyRows], headScale[P::kKeyRows];
  __shared__ __align__(16) uint32_t keyWords[kWarps][kWarpSize][P::kPitch];
  __shared__ __align__(16) uint32_t valueWords[kWarps][kWarpSize][P::kPitch];
  __shared__ __align__(16) float2 keyTerms[kWarps][D];
  __shared__ float2 valueTerms[kWarps][kWarpSize][Tiles::kGroups];
  __shared__ float slotHeads[kWarps][kWarpSize][G];
  for (int i = threadIdx.x; i < 8 * D; i += kThreads)
    queries[i / D][i % D] =
        i < G * D ? a.q[static_cast<int64_t>(h) * G * D + i] * a.scale : 0.0f;
  __syncthreads();
  for (int row = warp; row < P::kKeyRows; row += kWarps) {
    float x = 0.0f;
    for (int c = lane; c < D; c += kWarpSize)
      x = fmaxf(x, fabsf(queries[row][c]));
    x = warpMax(x);
    if (lane == 0) {
      headBound[row] = Fixed::unit(x);
      headScale[row] = Fixed::scale(x);
    }
  }
  __syncthreads();
  static_assert(P::kKeyRows * D % kThreads == 0,
                "the fixed-point query is whole rounds of the block");
#pragma unroll
  for (int k = 0; k < P::kKeyRows * D / kThreads; ++k) {
    const int i = threadIdx.x + k * kThreads, row = i / D, c = i % D;
    keyQuery[row][Tiles::keyIndex(c)] = queries[row][c] * headScale[row];
  }
  __syncthreads();

  // x0 and x1 as bf16 pairs of kParts parts (Bf16Parts; the weights take
  // two): parts[0] the rounded values, parts[i] those of what the parts
  // before leave, the last truncated.
  auto splitParts = [](float x0, float x1, auto &parts) {
    constexpr int kParts = sizeof(parts) / sizeof(parts[0]);
#pragma unroll
    for (int i = 0; i + 1 < kParts; ++i) {
      const float l0 = Bf16Parts::lead(x0), l1 = Bf16Parts::lead(x1);
      parts[i] = Bf16Parts::pack(l0, l1);
      x0 -= l0;
      x1 -= l1;
    }
    parts[kParts - 1] = Bf16Parts::pack(x0, x1);
  };
  // Head g's online softmax: m, z (the lane's slots' share), the value
  // sums, and the lane's share of each group's offset. The sums: of
  // rounded (o[j][0..1]) and remainder (o[j][2..3]) weights of head g,
  // channels valueChannel(q, 2t + e, r) of n-block j = kCpb q + r;
  // transposed, of columns 2t + e (heads 2t, 2t + 1 rounded at t < 2, heads
  // 2t - 4, 2t - 3 remainders at t >= 2), channels valueChannel(q, g, 2i +
  // x / 2) of block j = kCpb q / 2 + i.
  float m = kNegInf, z = 0.0f;
  float o[P::kAccBlocks][4], corr[Tiles::kGroups];
#pragma unroll
  for (int j = 0; j < P::kAccBlocks; ++j)
#pragma unroll
    for (int x = 0; x < 4; ++x)
      o[j][x] = 0.0f;
#pragma unroll
  for (int x = 0; x < Tiles::kGroups; ++x)
    corr[x] = 0.0f;
  // The key path's lane constants: the query row of its A (head g, or g %
  // 4 at G <= 4, where lanes g >= 4 hold digit 1), the digit bytes it
  // gathers (bytePerm of two factors: digit 0 or 1 of both, then digit 2 or
  // 1), the ones row's bytes (row 12 at G <= 4: lane g = 4; row 8 of the
  // second A: lane g = 0), the shift of its key codes, where its channels'
  // factors go (keyIndex), and the unit's E / t (times P 2^-11 per tile),
  // which the bias takes too.
  const int loShift = g < 4 ? 0 : 8;
  const int keyRow = P::kPairedLanes ? g % 4 : g;
  const uint32_t digitBytes = P::kPairedLanes
                                  ? (g < 4 ? 0x6240u : 0x6251u)
                                  : 0x5140u;
  const uint32_t onesRow = g == (P::kPairedLanes ? 4 : 0) ? 0x01010101u : 0u;
  const int keyShift = kBits * (tq % P::kCodesPerByte);
  const int keyTerm = Tiles::keyIndex(lane);
  const float headUnit = headBound[keyRow];
  // Byte g % 4 of two value words into bytes 0 and 2.
  const uint32_t valueBytes =
      static_cast<uint32_t>(g % 4) | static_cast<uint32_t>(4 + g % 4) << 8;

  // Head g's row of logits (g < G; null when none are stored).
  float *const headLogits =
      a.logits ? a.logits + (static_cast<int64_t>(h) * G + (g < G ? g : 0)) *
                                a.stride
               : nullptr;
  KiviTileWalk<G, Tiles> walk(a, t, begin, end, warp, lane);
  typename KiviTileWalk<G, Tiles>::Tile tile;
  while (walk.more(end)) {
    if (!walk.enter(a, t, h, begin, end, lane, tile))
      continue;
    const int32_t base = tile.base, row = tile.row;
    const bool live = tile.live, keyFull = tile.keyFull,
               valueFull = tile.valueFull;
    const uint32_t liveMask = __ballot_sync(kFullMask, live);
    const bool keyCodes = live && !keyFull;
    const uint32_t codeKeys = __ballot_sync(kFullMask, keyCodes);
    const uint32_t windowKeys = __ballot_sync(kFullMask, live && keyFull);
    const uint32_t windowValues = __ballot_sync(kFullMask, live && valueFull);
    KiviTileLoads<Tiles> in;
    in.load(a, tile.page, tile.offset, lane, keyCodes, live && !valueFull,
            codeKeys != 0);

    // The previous tile is done with the buffers: stage this one's.
    __syncwarp();
    using RowVector = typename Tiles::RowVector;
#pragma unroll
    for (int v = 0; v < Tiles::kRowVectors; ++v) {
      reinterpret_cast<RowVector *>(&keyWords[warp][lane][0])[v] =
          in.keyRow[v];
      reinterpret_cast<RowVector *>(&valueWords[warp][lane][0])[v] =
          in.valueRow[v];
    }
#pragma unroll
    for (int x = 0; x < Tiles::kGroups; ++x) {
      const float2 record = asymPair(in.valueRecord[x]);
      const float s = record.x * Tiles::kUnit;
      valueTerms[warp][lane][x] = live && !valueFull
                                      ? make_float2(s, record.y - s)
                                      : make_float2(0.0f, 0.0f);
    }
    // The block's key factors as fixed point: s 2^11 / P, P a power of two
    // above the block's scales, so that |q s| / U < 2^22.
    float keyUnit = 0.0f;
    if (codeKeys) {
      float sMax = 0.0f;
#pragma unroll
      for (int i = 0; i < D / kWarpSize; ++i)
        sMax = fmaxf(sMax, asymPair(in.keyRecord[i]).x);
      const float bound = Fixed::above(warpMax(sMax));
      const float toFixed = Fixed::over(bound);
#pragma unroll
      for (int i = 0; i < D / kWarpSize; ++i) {
        const float2 record = asymPair(in.keyRecord[i]);
        keyTerms[warp][i * kWarpSize + keyTerm] =
            make_float2(record.x * toFixed, record.y);
      }
      keyUnit = headUnit * bound * 0x1p-11f;
    }
    if (live && keyFull) {
      // A window key: its logits from the full-precision row.
      float l[G];
#pragma unroll
      for (int q = 0; q < G; ++q)
        l[q] = 0.0f;
      addWindowKeyDots<G, D, S>(t.kiviResidual, row, &queries[0][0],
                                P::kQueryPitch, l);
#pragma unroll
      for (int q = 0; q < G; ++q)
        slotHeads[warp][lane][q] = l[q];
    }
    __syncwarp();
    walk.prefetchNext(t, lane);

    // S = Q' K^T in integers over key steps of 32 channels: per step the
    // lane's 8 factors (entries 8t .. 8t+7: k 4t .. 4t+3, 4t+16 .. 4t+19)
    // as fixed point, their digit bytes gathered into A (bytePerm), and
    // per key block its slot's codes as bytes (B); head g's bias sum_c q
    // min over the lane's channels, then over the lanes of the head.
    int32_t acc[P::kPairedLanes ? 1 : 2][P::kKeyBlocks][4] = {};
    float bias = 0.0f;
    if (codeKeys) {
#pragma unroll 1
      for (int ks = 0; ks < P::kKeySteps; ++ks) {
        const float4 *factors =
            reinterpret_cast<const float4 *>(&keyQuery[keyRow][32 * ks]) +
            2 * tq;
        const float4 *terms =
            reinterpret_cast<const float4 *>(&keyTerms[warp][32 * ks]) +
            4 * tq;
        const float4 f0 = factors[0], f1 = factors[1];
        const float q[8] = {f0.x, f0.y, f0.z, f0.w, f1.x, f1.y, f1.z, f1.w};
        uint32_t x[8];
#pragma unroll
        for (int v = 0; v < 4; ++v) {
          const float4 st = terms[v]; // {s0, min0, s1, min1}
          x[2 * v] = __float_as_uint(fmaf(q[2 * v], st.x, Fixed::kMagic));
          x[2 * v + 1] =
              __float_as_uint(fmaf(q[2 * v + 1], st.z, Fixed::kMagic));
          bias = fmaf(q[2 * v], st.y, bias);
          bias = fmaf(q[2 * v + 1], st.w, bias);
        }
        uint32_t qa[4], qb[4];
#pragma unroll
        for (int half = 0; half < 2; ++half) {
          const uint32_t *y = x + 4 * half;
          const uint32_t p01 = bytePerm(y[0], y[1], digitBytes);
          const uint32_t p23 = bytePerm(y[2], y[3], digitBytes);
          qa[2 * half] = bytePerm(p01, p23, 0x5410u);
          qa[2 * half + 1] = bytePerm(p01, p23, 0x7632u);
          if constexpr (P::kPairedLanes) {
            if (g >= 4)
              qa[2 * half + 1] = onesRow;
          } else {
            qb[2 * half] = bytePerm(bytePerm(y[0], y[1], 0x62u),
                                    bytePerm(y[2], y[3], 0x62u), 0x5410u);
            qb[2 * half + 1] = onesRow;
          }
        }
#pragma unroll
        for (int n = 0; n < P::kKeyBlocks; ++n) {
          const uint32_t *words = keyWords[warp][8 * n + g];
          const uint32_t b0 =
              words[Tiles::keyWord(ks, tq, 0)] >> keyShift & P::kByteMask;
          const uint32_t b1 =
              words[Tiles::keyWord(ks, tq, 1)] >> keyShift & P::kByteMask;
          mmaK32U8(acc[0][n], qa, b0, b1);
          if constexpr (!P::kPairedLanes)
            mmaK32U8(acc[1][n], qb, b0, b1);
        }
      }
    }
    bias += __shfl_xor_sync(kFullMask, bias, 1);
    bias += __shfl_xor_sync(kFullMask, bias, 2);
    bias *= headUnit;

    // The logits of head g's slots 8n + 2t + e from the digit rows: C0 +
    // 2^8 C1 (below 2^27) and 2^16 (C2 - 2^6 C1s) (the ones row takes back
    // the 2^22 of every factor), times the unit; for int2 up to head dim
    // 128 the whole sum in one 32-bit integer (|C2 - 2^6 C1s| <= 2^6 3 D,
    // C0 + 2^8 C1 <= 257 255 3 D: below 2^31), else two floats.
    // At G <= 4 lane g + 4 (lane ^ 16) adds 2^8 C1 and lane 16 + t holds
    // the ones; lanes g >= 4 get C0 + 2^8 C1 and a C2 of no head's (rows
    // 4..7 of W, whose sums no lane keeps), finite either way.
    float kl[P::kKeyBlocks][2];
#pragma unroll
    for (int n = 0; n < P::kKeyBlocks; ++n)
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        int32_t lo, hi;
        if constexpr (P::kPairedLanes) {
          const int32_t ones =
              __shfl_sync(kFullMask, acc[0][n][2 + e], 16 + tq);
          lo = acc[0][n][e] << loShift;
          lo += __shfl_xor_sync(kFullMask, lo, 16);
          hi = acc[0][n][2 + e] - (ones << 6);
        } else {
          const int32_t ones = __shfl_sync(kFullMask, acc[1][n][2 + e], tq);
          lo = acc[0][n][e] + (acc[0][n][2 + e] << 8);
          hi = acc[1][n][e] - (ones << 6);
        }
        float x;
        if constexpr (kBits == 2 && D <= 128)
          x = static_cast<float>(static_cast<int32_t>(
              static_cast<uint32_t>(lo) + (static_cast<uint32_t>(hi) << 16)));
        else
          x = fmaf(65536.0f, static_cast<float>(hi), static_cast<float>(lo));
        kl[n][e] = fmaf(keyUnit, x, bias);
      }

    // Head g's logits of slots 8n + 2t + e (kl; a window key's from
    // slotHeads, a free slot's -inf), every one of the split stored; the
    // tile's maximum (finite: a slot is live), one rescale when it moves, the
    // weights. A tile of live quantized keys inside the split (the common
    // one) takes the plain loops, without a test per slot.
    float p[P::kKeyBlocks][2];
    float tileMax = kNegInf;
    auto takeLogits = [&](auto mixed) {
#pragma unroll
      for (int n = 0; n < P::kKeyBlocks; ++n)
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          const int r = 8 * n + 2 * tq + e;
          float l = kl[n][e];
          if constexpr (decltype(mixed)::value) {
            if (windowKeys >> r & 1u)
              l = g < G ? slotHeads[warp][r][g] : 0.0f;
            if (!(liveMask >> r & 1u))
              l = kNegInf;
          }
          p[n][e] = l;
          tileMax = fmaxf(tileMax, l);
        }
    };
    if (windowKeys == 0 && liveMask == kFullMask)
      takeLogits(std::false_type{});
    else
      takeLogits(std::true_type{});
    if (headLogits && g < G) {
      float *row = headLogits + base + 2 * tq;
      if (base >= begin && base + kWarpSize <= end) {
#pragma unroll
        for (int n = 0; n < P::kKeyBlocks; ++n)
#pragma unroll
          for (int e = 0; e < 2; ++e)
            row[8 * n + e] = p[n][e];
      } else {
#pragma unroll
        for (int n = 0; n < P::kKeyBlocks; ++n)
#pragma unroll
          for (int e = 0; e < 2; ++e) {
            const int32_t at = base + 8 * n + 2 * tq + e;
            if (at >= begin && at < end)
              row[8 * n + e] = p[n][e];
          }
      }
    }
    tileMax = fmaxf(tileMax, __shfl_xor_sync(kFullMask, tileMax, 1));
    tileMax = fmaxf(tileMax, __shfl_xor_sync(kFullMask, tileMax, 2));
    const float mNew = fmaxf(m, tileMax);
    float rescale = 1.0f;
    if (mNew != m) {
      rescale = expf(m - mNew);
      m = mNew;
      z *= rescale;
#pragma unroll
      for (int x = 0; x < Tiles::kGroups; ++x)
        corr[x] *= rescale;
      if constexpr (!P::kTransposedValues)
#pragma unroll
        for (int j = 0; j < P::kAccBlocks; ++j)
#pragma unroll
          for (int x = 0; x < 4; ++x)
            o[j][x] *= rescale;
    }
    if constexpr (P::kTransposedValues)
      rescaleColumns<P::kHeadColumns ? 8 : 4>(o, rescale);
    // e^(l - m) as 2^((l - m) log2 e) (exp2Approx).
#pragma unroll
    for (int n = 0; n < P::kKeyBlocks; ++n)
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        p[n][e] = exp2Approx((p[n][e] - m) * 1.44269504088896341f);
        z += p[n][e];
      }
    if constexpr (P::kTransposedValues && !P::kHeadColumns) {
      // Lanes g >= 4 form the remainders of head g - 4's weights (their own
      // m, z and offsets are no head's).
#pragma unroll
      for (int n = 0; n < P::kKeyBlocks; ++n)
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          const float other = __shfl_xor_sync(kFullMask, p[n][e], 16);
          if (g >= 4)
            p[n][e] = other;
        }
    }

    // O += W U, 16 slots per step: per value group, the weights times the
    // slots' scales (and the offsets into corr), then the group's channel
    // blocks; transposed, O^T += U^T W^T: two n-blocks' units as A, the
    // rounded weights (g < 4) or their remainders (g >= 4) as B.
#pragma unroll
    for (int ks = 0; ks < kWarpSize / 16; ++ks)
#pragma unroll
      for (int x = 0; x < Tiles::kGroups; ++x) {
        uint32_t wa[4];
#pragma unroll
        for (int half = 0; half < 2; ++half) {
          float w[2];
#pragma unroll
          for (int e = 0; e < 2; ++e) {
            const float2 term =
                valueTerms[warp][16 * ks + 8 * half + 2 * tq + e][x];
            const float pr = p[2 * ks + half][e];
            w[e] = pr * term.x;
            corr[x] = fmaf(pr, term.y, corr[x]);
          }
          uint32_t parts[2];
          splitParts(w[0], w[1], parts);
          wa[2 * half] = parts[0];
          wa[2 * half + 1] = parts[1];
        }
#pragma unroll
        for (int qq = 0; qq < P::kQPerGroup; ++qq) {
          const int q = x * P::kQPerGroup + qq, wi = 2 * q + g / 4;
          const int r0 = 16 * ks + 2 * tq;
          const uint32_t ab = bytePerm(valueWords[warp][r0][wi],
                                       valueWords[warp][r0 + 1][wi],
                                       valueBytes);
          const uint32_t cd = bytePerm(valueWords[warp][r0 + 8][wi],
                                       valueWords[warp][r0 + 9][wi],
                                       valueBytes);
          if constexpr (P::kTransposedValues) {
            // Column g: head g's rounded weights (g < 4) or head g - 4's
            // remainders; with kHeadColumns head g's rounded weights, then
            // their remainders, into the same sums.
            const uint32_t b0 = P::kHeadColumns || g < 4 ? wa[0] : wa[1];
            const uint32_t b1 = P::kHeadColumns || g < 4 ? wa[2] : wa[3];
#pragma unroll
            for (int i = 0; i < kCpb / 2; ++i) {
              const uint32_t units[4] = {
                  U::spread(ab, 2 * i), U::spread(ab, 2 * i + 1),
                  U::spread(cd, 2 * i), U::spread(cd, 2 * i + 1)};
              mmaK16<Storage::BF16>(o[kCpb / 2 * q + i], units, b0, b1);
              if constexpr (P::kHeadColumns)
                mmaK16<Storage::BF16>(o[kCpb / 2 * q + i], units, wa[1],
                                      wa[3]);
            }
          } else {
#pragma unroll
            for (int r = 0; r < kCpb; ++r)
              mmaK16<Storage::BF16>(o[kCpb * q + r], wa, U::spread(ab, r),
                                    U::spread(cd, r));
          }
        }
      }

    // Window values: each lane adds the row's channels it sums, times the
    // weight of their head: 2 kCpb from channel valueChannel(q, 2t, 0),
    // head g's; transposed, kCpb from valueChannel(q, g, 0), heads 2t and
    // 2t + 1 (the rounded columns, t < 2).
    if (windowValues) {
#pragma unroll
      for (int n = 0; n < P::kKeyBlocks; ++n)
#pragma unroll
        for (int e = 0; e < 2; ++e)
          if (g < G)
            slotHeads[warp][8 * n + 2 * tq + e][g] = p[n][e];
      __syncwarp();
      constexpr int kRun = P::kTransposedValues ? kCpb : 2 * kCpb;
      constexpr int kPerVec = Full::kElemsPerVec;
      // Channels c .. c + kRun - 1 of a full-precision row.
      const auto loadRun = [](const uint8_t *full, int c, float(&x)[kRun]) {
        if constexpr (kRun >= kPerVec) {
#pragma unroll
          for (int v = 0; v < kRun / kPerVec; ++v)
            Codec<S>::decode(
                __ldg(reinterpret_cast<const uint4 *>(
                          full + c * Codec<S>::kBytes) +
                      v),
                1.0f, x + v * kPerVec);
        } else {
          // A part of one vector: decode it, keep the run.
          float y[kPerVec];
          Codec<S>::decode(
              __ldg(reinterpret_cast<const uint4 *>(full + c / kPerVec * 16)),
              1.0f, y);
          const int at = c % kPerVec;
#pragma unroll
          for (int i = 0; i < kRun; ++i) {
            x[i] = y[i];
#pragma unroll
            for (int k = 1; k < kPerVec / kRun; ++k)
              if (at == k * kRun)
                x[i] = y[k * kRun + i];
          }
        }
      };
      for (uint32_t bits = windowValues; bits; bits &= bits - 1) {
        const int r = __ffs(static_cast<int>(bits)) - 1;
        const int32_t fullRow = __shfl_sync(kFullMask, row, r);
        const uint8_t *full =
            t.kiviResidual +
            (static_cast<uint64_t>(residualLength) + fullRow) * Full::kRowBytes;
        if constexpr (P::kTransposedValues) {
          if (!P::kHeadColumns && tq >= 2)
            continue;
          float pr[2];
#pragma unroll
          for (int e = 0; e < 2; ++e)
            pr[e] = 2 * tq + e < G ? slotHeads[warp][r][2 * tq + e] : 0.0f;
#pragma unroll
          for (int q = 0; q < P::kQBlocks; ++q) {
            float x[kRun];
            loadRun(full, P::valueChannel(q, g, 0), x);
#pragma unroll
            for (int i = 0; i < kCpb / 2; ++i)
#pragma unroll
              for (int y = 0; y < 4; ++y)
                o[kCpb / 2 * q + i][y] = fmaf(pr[y % 2], x[2 * i + y / 2],
                                              o[kCpb / 2 * q + i][y]);
          }
        } else {
          const float pr = g < G ? slotHeads[warp][r][g] : 0.0f;
#pragma unroll
          for (int q = 0; q < P::kQBlocks; ++q) {
            float x[kRun];
            loadRun(full, P::valueChannel(q, 2 * tq, 0), x);
#pragma unroll
            for (int e = 0; e < 2; ++e)
#pragma unroll
              for (int r2 = 0; r2 < kCpb; ++r2)
                o[kCpb * q + r2][e] =
                    fmaf(pr, x[kCpb * e + r2], o[kCpb * q + r2][e]);
          }
        }
      }
    }
  }

  // Head g's sum and offsets over its four lanes, then the warps' states
  // in warp order.
  z += __shfl_xor_sync(kFullMask, z, 1);
  z += __shfl_xor_sync(kFullMask, z, 2);
#pragma unroll
  for (int x = 0; x < Tiles::kGroups; ++x) {
    corr[x] += __shfl_xor_sync(kFullMask, corr[x], 1);
    corr[x] += __shfl_xor_sync(kFullMask, corr[x], 2);
  }
  if constexpr (P::kTransposedValues) {
    // Lane (g, t < 2) adds heads 2t and 2t + 1: the rounded column and its
    // remainder (lane (g, t + 2)'s), and the heads' m and offsets from
    // lanes 4 head; with kHeadColumns lane (g, t) adds heads 2t and 2t + 1,
    // whose columns hold both parts.
    float mh[2], corrh[2][Tiles::kGroups];
#pragma unroll
    for (int e = 0; e < 2; ++e) {
      const int from = (8 * tq + 4 * e) % (P::kHeadColumns ? 32 : 16);
      mh[e] = __shfl_sync(kFullMask, m, from);
#pragma unroll
      for (int x = 0; x < Tiles::kGroups; ++x)
        corrh[e][x] = __shfl_sync(kFullMask, corr[x], from);
    }
    if constexpr (!P::kHeadColumns)
#pragma unroll
      for (int j = 0; j < P::kAccBlocks; ++j)
#pragma unroll
        for (int y = 0; y < 4; ++y)
          o[j][y] += __shfl_xor_sync(kFullMask, o[j][y], 2);
    combineHeadLanes<G, D, kThreads, kWarps>(
        a, h, split, warp, g, g < G && tq == 0, m, z,
        (P::kHeadColumns || tq < 2) && 2 * tq < G,
        [&](auto factorOf, float(*sum)[D]) {
#pragma unroll
          for (int e = 0; e < 2; ++e) {
            const int head = 2 * tq + e;
            if (head >= G)
              continue;
            const float factor = factorOf(head, mh[e]);
#pragma unroll
            for (int q = 0; q < P::kQBlocks; ++q)
#pragma unroll
              for (int i = 0; i < kCpb / 2; ++i)
#pragma unroll
                for (int y = e; y < 4; y += 2) {
                  const int c = P::valueChannel(q, g, 2 * i + y / 2);
                  sum[head][c] +=
                      (o[kCpb / 2 * q + i][y] + corrh[e][c / KG]) * factor;
                }
          }
        });
  } else {
    combineHeadLanes<G, D, kThreads, kWarps>(
        a, h, split, warp, g, g < G && tq == 0, m, z, g < G,
        [&](auto factorOf, float(*sum)[D]) {
          const float factor = factorOf(g, m);
#pragma unroll
          for (int q = 0; q < P::kQBlocks; ++q)
#pragma unroll
            for (int r = 0; r < kCpb; ++r)
#pragma unroll
              for (int e = 0; e < 2; ++e) {
                const int c = P::valueChannel(q, 2 * tq + e, r);
                sum[g][c] += (o[kCpb * q + r][e] + o[kCpb * q + r][2 + e] +
                              corr[c / KG]) *
                             factor;
              }
        });
  }
}

/// Decode attention over KIVI pages: one block per (split, kv-head), the
/// same outputs as decodeAttentionSplit (every slot's logit and the split's
/// partial records), so mergeSplits and the stages follow unchanged; the
/// cache is never expanded in memory. Key blocks of 32 tokens or a multiple
/// take the tensor cores (decodeKiviMma) at 2 <= G <= 8 and
/// decodeKiviTiles at G = 1; other geometries decodeKiviRows.
template <int G, int D, int kBits, int KG, kvc_dtype_t T, int kThreads>
__global__ void __launch_bounds__(
    kThreads, KiviMma<G, D, kBits, KG, T, kThreads>::kApplies
                  ? KiviMma<G, D, kBits, KG, T, kThreads>::kMinBlocks
                  : (KiviTiles<G, D, kBits, KG, T, kThreads>::kApplies
                         ? KiviTiles<G, D, kBits, KG, T, kThreads>::kMinBlocks
                         : 0))
    decodeAttentionKivi(DecodeSplitArgs a, int32_t residualLength) {
  // Launched as a dependent of the step's quantization and stores
  // (launchDependent): their codes, rows and table words first.
  awaitPriorGrids();
  releaseDependents();
  // Heads in x (up to 2^31 - 1 of them: any batch), splits in y (<= 64).
  const int32_t h = blockIdx.x, split = blockIdx.y;
  const HeadTable t = a.heads[h];
  const int32_t begin = split * a.splitSlots;
  const int32_t end = min(begin + a.splitSlots, t.numSlots);
  if constexpr (KiviMma<G, D, kBits, KG, T, kThreads>::kApplies)
    decodeKiviMma<G, D, kBits, KG, T, kThreads>(a, t, h, split, begin, end,
                                                residualLength);
  else if constexpr (KiviTiles<G, D, kBits, KG, T, kThreads>::kApplies)
    decodeKiviTiles<G, D, kBits, KG, T, kThreads>(a, t, h, split, begin, end,
                                                  residualLength);
  else
    decodeKiviRows<G, D, kBits, KG, T, kThreads>(a, t, h, split, begin, end,
                                                 residualLength);
  mergeInLastSplit<G, D, kThreads>(a, t, h);
}

/// M = max m_s and 1/Z, Z = sum z_s e^(m_s - M), of the G query heads of
/// kv-head `h` from its split partial records, into `maxOut` and `invSumOut`
/// (shared arrays of G, read by the statistics that follow). One warp per
/// query head reads the splits in parallel (lane l: splits l, l + 32, ...),
/// so that a block waits for one round of loads rather than numSplits;
/// deterministic (fixed shuffle order). blockDim.x must be a multiple of
/// the warp size.
template <int G, int D>
__device__ void splitStatistics(const float *partials, int32_t numSplits,
                                int32_t h, float *maxOut, float *invSumOut) {
  constexpr int kRecord = partialFloats<D>();
  const float *head = partials + static_cast<int64_t>(h) * numSplits * G * kRecord;
  const int warp = threadIdx.x / kWarpSize, lane = threadIdx.x % kWarpSize;
  const int warps = blockDim.x / kWarpSize;
  // The lane's first kCached splits stay in registers from the first pass
  // to the second (64 splits: the decode's kMaxSplits), so that both loads
  // of each record issue at once; the sums keep the split order.
  constexpr int kCached = 2;
  for (int g = warp; g < G; g += warps) {
    float cm[kCached], cz[kCached];
#pragma unroll
    for (int j = 0; j < kCached; ++j) {
      const int s = lane + j * kWarpSize;
      cm[j] = s < numSplits ? head[(s * G + g) * kRecord] : kNegInf;
      cz[j] = s < numSplits ? head[(s * G + g) * kRecord + 1] : 0.0f;
    }
    float bm = kNegInf;
#pragma unroll
    for (int j = 0; j < kCached; ++j)
      bm = fmaxf(bm, cm[j]);
    for (int s = lane + kCached * kWarpSize; s < numSplits; s += kWarpSize)
      bm = fmaxf(bm, head[(s * G + g) * kRecord]);
    bm = warpMax(bm);
    float bz = 0.0f;
#pragma unroll
    for (int j = 0; j < kCached; ++j)
      if (cm[j] != kNegInf)
        bz += cz[j] * expf(cm[j] - bm);
    for (int s = lane + kCached * kWarpSize; s < numSplits; s += kWarpSize) {
      const float ms = head[(s * G + g) * kRecord];
      if (ms != kNegInf)
        bz += head[(s * G + g) * kRecord + 1] * expf(ms - bm);
    }
    bz = warpSum(bz);
    if (lane == 0) {
      maxOut[g] = bm;
      invSumOut[g] = bz > 0.0f ? 1.0f / bz : 0.0f;
    }
  }
  __syncthreads();
}

/// Writes part `part` of `parts` of the G output rows of kv-head `h` (its
/// G * D entries cut in `parts` consecutive runs): out = sum acc_s
/// e^(m_s - M) / Z over its split records, with M and 1/Z from
/// splitStatistics. When the block has at least two threads per entry of
/// its run, the entry's splits are spread over them (thread k of an entry:
/// splits k, k + per, ...) and their sums added in thread order, so that
/// the block waits for a few rounds of loads rather than numSplits. A
/// thread issues the loads of kMergeUnroll of its splits (the record's
/// maximum and the entry's sum) before it uses any, and adds them in split
/// order: with few parts (a fold block per several splits, FoldPlan) an
/// entry's splits are a thread's alone, and it waits for numSplits /
/// kMergeUnroll rounds rather than numSplits. Deterministic for a given
/// (parts, kThreads). Every thread of the block calls it (it synchronizes).
template <int G, int D, int kThreads>
__device__ void mergeOutput(const float *partials, int32_t numSplits,
                            int32_t h, float *out, const float *maxLogit,
                            const float *invSum, int32_t part, int32_t parts) {
  constexpr int kRecord = partialFloats<D>(), kEntries = G * D;
  constexpr int kMergeUnroll = 8;
  __shared__ float sums[kThreads];
  const float *head = partials + static_cast<int64_t>(h) * numSplits * G * kRecord;
  const int32_t run = (kEntries + parts - 1) / parts;
  const int32_t first = part * run;
  const int32_t last = first + run < kEntries ? first + run : kEntries;
  const int32_t n = last - first;
  // The sum of entry i over splits k, k + step, ... in that order.
  auto sumOf = [&](int i, int k, int step) {
    const int g = i / D, c = i % D;
    float sum = 0.0f;
    for (int s0 = k; s0 < numSplits; s0 += kMergeUnroll * step) {
      // Both words of each record load at once (every split has a record;
      // an empty split's sum is not used).
      float ms[kMergeUnroll], acc[kMergeUnroll];
#pragma unroll
      for (int u = 0; u < kMergeUnroll; ++u) {
        const int s = s0 + u * step;
        const bool live = s < numSplits;
        ms[u] = live ? head[(s * G + g) * kRecord] : kNegInf;
        acc[u] = live ? head[(s * G + g) * kRecord + 2 + c] : 0.0f;
      }
#pragma unroll
      for (int u = 0; u < kMergeUnroll; ++u)
        if (ms[u] != kNegInf)
          sum += acc[u] * expf(ms[u] - maxLogit[g]);
    }
    return sum;
  };
  if (n <= 0)
    return;
  if (2 * n > kThreads) {
    for (int i = first + threadIdx.x; i < last; i += kThreads)
      out[(static_cast<int64_t>(h) * G) * D + i] =
          sumOf(i, 0, 1) * invSum[i / D];
    return;
  }
  const int per = kThreads / n;
  const int e = threadIdx.x / per, k = threadIdx.x % per;
  sums[threadIdx.x] = e < n ? sumOf(first + e, k, per) : 0.0f;
  __syncthreads();
  if (static_cast<int>(threadIdx.x) < n) {
    const int i = first + threadIdx.x;
    float sum = 0.0f;
    for (int j = 0; j < per; ++j)
      sum += sums[threadIdx.x * per + j];
    out[(static_cast<int64_t>(h) * G) * D + i] = sum * invSum[i / D];
  }
}

/// The G output rows of kv-head `h` merged by one block (mergeOutput with
/// a single part, for even D): out = sum_s acc_s e^(m_s - M) / Z, with M
/// and 1/Z from splitStatistics. Each thread sums pairs of channels
/// (float2 loads: a record is D + 2 floats, so its acc is 8-byte aligned)
/// over the splits in order, the loads of kUnroll splits (the record's m
/// and the pair's two acc words) issued before any is used. The block then
/// waits for numSplits / kUnroll rounds of loads where mergeOutput's
/// threads take their entries one after another: at G = 8, head dim 128,
/// 64 splits and 128 threads, 16 rounds against 8 entries of 64 splits
/// each. This is the merge at the end of a decode without statistics
/// (mergeInLastSplit), which the last block of every head runs while the
/// other blocks have ended. It keeps no array in shared memory: a shared
/// array of factors changed how ptxas allocated the attention loop before
/// it (docs/codegen-cuda.md, "The merge in the last block").
/// Deterministic (fixed split order per entry). Every thread of the block
/// calls it.
template <int G, int D, int kThreads>
__device__ void mergeOutputInBlock(const float *partials, int32_t numSplits,
                                   int32_t h, float *out,
                                   const float *maxLogit,
                                   const float *invSum) {
  static_assert(D % 2 == 0, "channel pairs");
  constexpr int kRecord = partialFloats<D>(), kPairs = G * D / 2;
  constexpr int kPerThread = (kPairs + kThreads - 1) / kThreads;
  // Splits whose loads a thread issues together: eight for one pair of
  // channels, four for two or more (G D >= 512 at 128 threads; at G = 8,
  // head dim 128, four pairs: 16 float2 loads and 16 maxima in flight).
  constexpr int kUnroll = kPerThread >= 2 ? 4 : 8;
  const float *head = partials + static_cast<int64_t>(h) * numSplits * G * kRecord;
  float2 sum[kPerThread];
#pragma unroll
  for (int k = 0; k < kPerThread; ++k)
    sum[k] = make_float2(0.0f, 0.0f);
  for (int32_t s = 0; s < numSplits; s += kUnroll) {
    float2 v[kUnroll][kPerThread];
    float m[kUnroll][kPerThread];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u)
#pragma unroll
      for (int k = 0; k < kPerThread; ++k) {
        const int p = threadIdx.x + k * kThreads;
        const int g = 2 * p / D, c = 2 * p % D;
        const float *record =
            head + ((static_cast<int64_t>(s) + u) * G + g) * kRecord;
        const bool live = s + u < numSplits && p < kPairs;
        m[u][k] = live ? record[0] : kNegInf;
        v[u][k] = live ? *reinterpret_cast<const float2 *>(record + 2 + c)
                       : make_float2(0.0f, 0.0f);
      }
#pragma unroll
    for (int u = 0; u < kUnroll; ++u)
#pragma unroll
      for (int k = 0; k < kPerThread; ++k) {
        const int p = threadIdx.x + k * kThreads;
        const int g = p < kPairs ? 2 * p / D : 0;
        if (m[u][k] != kNegInf) {
          const float f = expf(m[u][k] - maxLogit[g]);
          sum[k].x += v[u][k].x * f;
          sum[k].y += v[u][k].y * f;
        }
      }
  }
#pragma unroll
  for (int k = 0; k < kPerThread; ++k) {
    const int p = threadIdx.x + k * kThreads;
    if (p < kPairs) {
      const float z = invSum[2 * p / D];
      float *row = out + static_cast<int64_t>(h) * G * D + 2 * p;
      row[0] = sum[k].x * z;
      row[1] = sum[k].y * z;
    }
  }
}

/// Merges the split partial records of kv-head `h` exactly in one block:
/// M = max m_s, Z = sum z_s e^(m_s - M), out = sum acc_s e^(m_s - M) / Z.
/// Writes the G output rows (when `out` is given) and M and 1/Z to
/// `maxOut` and `invSumOut` (splitStatistics).
template <int G, int D, int kThreads>
__device__ void mergeSplits(const float *partials, int32_t numSplits,
                            int32_t h, float *out, float *maxOut,
                            float *invSumOut) {
  splitStatistics<G, D>(partials, numSplits, h, maxOut, invSumOut);
  if (out) {
    if constexpr (D % 2 == 0)
      mergeOutputInBlock<G, D, kThreads>(partials, numSplits, h, out, maxOut,
                                         invSumOut);
    else
      mergeOutput<G, D, kThreads>(partials, numSplits, h, out, maxOut,
                                  invSumOut, 0, 1);
  }
  __syncthreads();
}

/// With a.mergeOut: counts the calling block (every thread, after the
/// block's split records are written) in at the head's arrival counter,
/// and the last of the head's a.numSplits blocks merges them into the
/// head's G output rows (mergeSplits). Nothing without a.mergeOut.
template <int G, int D, int kThreads>
__device__ void mergeInLastSplit(const DecodeSplitArgs &a, const HeadTable &t,
                                 int32_t h) {
  if (!a.mergeOut || !lastArrival(t.arrivals, a.numSplits))
    return;
  __shared__ float maxLogit[G], invSum[G];
  mergeSplits<G, D, kThreads>(a.partials, a.numSplits, h, a.mergeOut, maxLogit,
                              invSum);
}

/// Threads of a decode fold block: FoldPlan's blocks per head of the
/// batch, each walking its range of the head's slots once.
constexpr int kFoldThreads = 256;

/// The slots [first, last) of one head that a block of the decode fold
/// kernel covers: range `range` of `slotsPerBlock` slots
/// (FoldPlan::slotsPerBlock), cut at the head's `numSlots`.
struct SlotRange {
  int32_t first, last;
};

__device__ inline SlotRange foldRange(int32_t numSlots, int32_t slotsPerBlock,
                                     int32_t range) {
  const int64_t first = static_cast<int64_t>(range) * slotsPerBlock;
  const int64_t last = first + slotsPerBlock;
  return {static_cast<int32_t>(first < numSlots ? first : numSlots),
          static_cast<int32_t>(last < numSlots ? last : numSlots)};
}

/// Slots a thread of a fold block takes per pass at group size G (kThreads
/// apart, so that a warp's loads stay coalesced): every load of the pass
/// issues before any result is used, so that a block waits for its slots'
/// memory once per pass. At most 8 logits per thread and pass (G = 8: one
/// slot, whose ten loads still issue together), which keeps the H2O fold
/// within 64 registers (four blocks of 256 threads per SM) at every G.
template <int G>
__host__ __device__ constexpr int foldUnroll() {
  return G >= 8 ? 1 : G >= 4 ? 2 : 4;
}

/// Passes that a fold helper asks L2 for ahead of its loads (foldSlots;
/// KVC_CUDA_FOLD_AHEAD): while the loads of pass p are in flight, its
/// threads ask for the lines of pass p + kFoldAhead, so that a block keeps
/// memory busy while it waits for its pass and computes (without them,
/// the bytes it has in flight fall to nothing at the end of every pass).
/// 0: none.
constexpr int kFoldAhead = KVC_CUDA_FOLD_AHEAD;

/// The slots of the first kFoldAhead passes (one where kFoldAhead is 0) of
/// a fold block over `r` (foldUnroll<G>() slots per thread and pass): what
/// the fold kernel asks L2 for before the merge of the splits
/// (prefetchSlotLines); foldSlots asks for the lines of the later passes.
template <int G, int kThreads>
__host__ __device__ inline SlotRange firstPasses(SlotRange r) {
  const int32_t passes =
      (kFoldAhead > 0 ? kFoldAhead : 1) * kThreads * foldUnroll<G>();
  return {r.first, r.last - r.first > passes ? r.first + passes : r.last};
}

/// Asks L2 for the lines of a fold's arrays that start at a slot of the
/// warp's window [a, a + 32) before `last`: the positions, the values (4
/// or 8 bytes an element) and the G logit rows, `stride` floats apart. Over
/// a run of windows each line is asked for once, by the slot at its start.
/// A window holds one line start of a 4-byte array and two of an 8-byte
/// one, and one lane asks for each: lane 0 the positions', lanes 1 .. V
/// the values', then a lane per logit row (where every lane used to test
/// every array's address at its own slot). A lane's array and alignment do
/// not change over a fold's loop, so a window costs a few instructions
/// whatever G. The whole warp calls it with the same `a`.
template <int G, typename T>
__device__ __forceinline__ void
prefetchWindowLines(const int32_t *positions, const T *values,
                    const float *logits, int64_t stride, int32_t a,
                    int32_t last, int lane) {
  static_assert(sizeof(T) == 4 || sizeof(T) == 8, "4- or 8-byte values");
  constexpr int V = static_cast<int>(sizeof(T)) / 4;
  static_assert(1 + V + G <= kWarpSize, "a lane per line start");
  const bool isValue = lane >= 1 && lane <= V;
  const int row = min(max(lane - 1 - V, 0), G - 1);
  const char *base =
      lane == 0 ? reinterpret_cast<const char *>(positions)
      : isValue ? reinterpret_cast<const char *>(values)
                : reinterpret_cast<const char *>(logits + row * stride);
  // Elements of 4 (shift 2) or 8 bytes, 32 or 16 to a line; which of the
  // window's line starts the lane takes (the second for lane 2 of 8-byte
  // values).
  const int shift = isValue && V == 2 ? 3 : 2;
  const uint32_t perLine = 128u >> shift;
  const int32_t skip = isValue ? (lane - 1) * static_cast<int32_t>(perLine) : 0;
  // The window's first element whose address starts a line.
  const uint32_t index =
      static_cast<uint32_t>(reinterpret_cast<uintptr_t>(base) >> shift) +
      static_cast<uint32_t>(a);
  const int32_t e =
      a + static_cast<int32_t>((0u - index) & (perLine - 1)) + skip;
  prefetchL2If(lane <= V + G && e < last && e < a + kWarpSize,
               base + (static_cast<int64_t>(e) << shift));
}

/// One array of per-slot elements that a fold block reads: `rows` rows of
/// `elementBytes`-byte elements, `rowStride` elements apart.
struct SlotArray {
  const void *base;
  int32_t elementBytes, rows;
  int64_t rowStride;
};

template <typename T>
__device__ inline SlotArray slotArray(const T *base, int32_t rows = 1,
                                      int64_t rowStride = 0) {
  return {base, static_cast<int32_t>(sizeof(T)), rows, rowStride};
}

/// Calls visit(address) for this thread's share of the 128-byte lines that
/// hold an element of the slots in `r` of the `arrays` (a null base is
/// skipped): the block's lines in array and row order, taken by its threads
/// in turn, each line once. The address is the line's start, or the range's
/// first element for the line that holds it, so that it lies in the range.
template <int kThreads, int N, typename Visit>
__device__ void forSlotLines(SlotRange r, const SlotArray (&arrays)[N],
                             Visit visit) {
  if (r.last <= r.first)
    return;
  int64_t before = 0; // lines of the rows before this one
  for (int a = 0; a < N; ++a) {
    const SlotArray &x = arrays[a];
    if (!x.base)
      continue;
    for (int32_t row = 0; row < x.rows; ++row) {
      const char *lo = static_cast<const char *>(x.base) +
                       (row * x.rowStride + r.first) * x.elementBytes;
      const char *hi = static_cast<const char *>(x.base) +
                       (row * x.rowStride + r.last) * x.elementBytes - 1;
      const uintptr_t first = reinterpret_cast<uintptr_t>(lo) / 128;
      const int64_t lines =
          static_cast<int64_t>(reinterpret_cast<uintptr_t>(hi) / 128 - first) +
          1;
      // This thread's lines j of the row: before + j = threadIdx.x (mod
      // kThreads).
      int64_t j = (static_cast<int64_t>(threadIdx.x) - before) % kThreads;
      if (j < 0)
        j += kThreads;
      for (; j < lines; j += kThreads)
        visit(j == 0 ? lo : reinterpret_cast<const char *>((first + j) * 128));
      before += lines;
    }
  }
}

/// Asks L2 for every line of the slots in `r` of the `arrays`
/// (forSlotLines), so that the loads of the fold that follows the merge of
/// the splits hit L2 rather than wait for device memory behind the merge's
/// own loads (the fold kernel asks for its first passes, firstPasses:
/// about 20 to 24 KB a block, 13 MB for a wave of 4 blocks on each of 132
/// SMs, which L2 keeps). A hint: no effect on results.
template <int kThreads, int N>
__device__ void prefetchSlotLines(SlotRange r, const SlotArray (&arrays)[N]) {
  forSlotLines<kThreads>(r, arrays,
                         [](const char *line) { prefetchL2(line); });
}

/// Drops from L2 the lines of `count` rows of floats (`stride` apart) that
/// hold only slots of `r` (discardL2): a decode fold block's logits once
/// it has read them, and the probabilities of kvc.attn_last once the last
/// kernel that reads them has (KVC_CUDA_DISCARD_LOGITS; nothing under 0).
/// A line that also holds a slot outside `r` (another block's, or a row's
/// padding) stays. The lines go to the block's threads in turn. Every
/// thread of the block calls it, after its last read of the rows' slots
/// in `r`: it begins with a barrier, so that no thread's read comes after
/// another's discard. No other block may read those slots after it.
template <int kThreads>
__device__ void discardRowLines(float *rows, int32_t count, int64_t stride,
                                SlotRange r) {
  if constexpr (!kDiscardLogits)
    return;
  __syncthreads();
  if (r.last <= r.first)
    return;
  int64_t before = 0; // lines of the rows before this one
  for (int32_t row = 0; row < count; ++row) {
    // Lines [first, end): those whose 128 bytes all lie in the range.
    const uintptr_t first =
        (reinterpret_cast<uintptr_t>(rows + row * stride + r.first) + 127) /
        128;
    const uintptr_t end =
        reinterpret_cast<uintptr_t>(rows + row * stride + r.last) / 128;
    const int64_t lines =
        end > first ? static_cast<int64_t>(end - first) : int64_t{0};
    int64_t j = (static_cast<int64_t>(threadIdx.x) - before) % kThreads;
    if (j < 0)
      j += kThreads;
    for (; j < lines; j += kThreads)
      discardL2(reinterpret_cast<void *>((first + j) * 128));
    before += lines;
  }
}

/// The normalized weights of a kv-head's G query heads once the splits are
/// merged, exp(l - M_g) / Z_g of the single-pass softmax (0 for a free
/// slot, whose logit is kNegInf), with M_g and 1 / Z_g (splitStatistics'
/// maxLogit and invSum, in shared memory) taken into registers once: a
/// fold helper's loop would otherwise load them again at every slot, since
/// its stores through generic pointers may alias shared memory. A free
/// slot's weight needs no test: its logit is -inf, and e^(-inf - M) is 0
/// for every finite M; a head of free slots alone, whose M is -inf (and 1/Z
/// 0: splitStatistics), takes M as 0 here, so that its weights are
/// e^-inf 0 = 0 rather than e^(-inf + inf), a NaN. The weights are those
/// of a test per slot, bit for bit. (expf stays: the hardware's
/// ex2.approx.ftz would flush weights below 2^-126 to 0, where the CPU
/// backend and the selections' ties keep them apart.)
template <int G> struct FoldWeights {
  float maxLogit[G], invSum[G];
  __device__ FoldWeights(const float *maxLogitIn, const float *invSumIn) {
#pragma unroll
    for (int g = 0; g < G; ++g) {
      maxLogit[g] = maxLogitIn[g] == kNegInf ? 0.0f : maxLogitIn[g];
      invSum[g] = invSumIn[g];
    }
  }
  /// Query head g's weight of logit l (0 for a free slot's -inf).
  __device__ __forceinline__ float of(float l, int g) const {
    return expf(l - maxLogit[g]) * invSum[g];
  }
  /// reduce_g(p_g) of a slot from the logits of its G query heads: the sum,
  /// the maximum, or the mean over the group.
  __device__ __forceinline__ float group(const float (&l)[G],
                                         Reduce kind) const {
    float r = kind == Reduce::Max ? kNegInf : 0.0f;
#pragma unroll
    for (int g = 0; g < G; ++g) {
      const float p = of(l[g], g);
      r = kind == Reduce::Max ? fmaxf(r, p) : r + p;
    }
    return kind == Reduce::Mean ? r / G : r;
  }
};

/// Loads the G logits of slot s (rows `stride` apart); kNegInf (a free
/// slot's) outside the range.
template <int G>
__device__ __forceinline__ void loadLogits(const float *logits, int64_t stride,
                                           int32_t s, bool in, float (&l)[G]) {
#pragma unroll
  for (int g = 0; g < G; ++g)
    l[g] = in ? logits[g * stride + s] : kNegInf;
}

/// Writes the probabilities of the G query heads (rows `stride` apart) of
/// the slots in `r`.
template <int G, int kThreads>
__device__ void writeProbabilities(const float *logits, int64_t stride,
                                   SlotRange r, const float *maxLogit,
                                   const float *invSum, float *probs) {
  constexpr int U = foldUnroll<G>();
  const FoldWeights<G> weights(maxLogit, invSum);
  for (int32_t s0 = r.first + threadIdx.x; s0 < r.last;
       s0 += U * kThreads) {
    float l[U][G];
#pragma unroll
    for (int u = 0; u < U; ++u)
      loadLogits<G>(logits, stride, s0 + u * kThreads,
                    s0 + u * kThreads < r.last, l[u]);
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int32_t s = s0 + u * kThreads;
      if (s < r.last)
#pragma unroll
        for (int g = 0; g < G; ++g)
          probs[g * stride + s] = weights.of(l[u][g], g);
    }
  }
  __syncthreads();
}

/// What a fold helper does after it updates a slot when nothing else reads
/// the slots in the same pass.
struct NoVisit {
  __device__ void operator()(int32_t, int32_t) const {}
};

/// values[s] <- update(values[s], reduce_g(p_g)) for every live slot s in
/// `r`, foldUnroll<G>() slots per thread at a time: their positions, values
/// and logits load together, then the updates store. visit(s, position)
/// follows each live slot's store, in ascending slot order per thread (a
/// SelectionScan's add, which summarizes the selection in the same pass).
/// With the loads of a pass, the lines of the pass kFoldAhead later are
/// asked of L2 (prefetchWindowLines; the fold kernel asks for those of
/// firstPasses before it starts): hints, with no effect on results.
template <int G, int kThreads, typename T, typename Update,
          typename Visit = NoVisit>
__device__ void foldSlots(const int32_t *positions, T *values, SlotRange r,
                          const float *logits, int64_t stride,
                          const float *maxLogit, const float *invSum,
                          Reduce kind, Update update, Visit visit = {}) {
  constexpr int U = foldUnroll<G>();
  const FoldWeights<G> weights(maxLogit, invSum);
  for (int32_t s0 = r.first + threadIdx.x; s0 < r.last;
       s0 += U * kThreads) {
    int32_t pos[U];
    T old[U];
    float l[U][G];
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int32_t s = s0 + u * kThreads;
      const bool in = s < r.last;
      pos[u] = in ? positions[s] : KVC_POSITION_NONE;
      old[u] = in ? values[s] : T{};
      loadLogits<G>(logits, stride, s, in, l[u]);
      if constexpr (kFoldAhead > 0)
        // The warp's window of the pass kFoldAhead later. (Where a warp's
        // lanes part at the range's end, this is its last pass, and its
        // windows ahead lie past the range.)
        prefetchWindowLines<G>(
            positions, values, logits, stride,
            s - static_cast<int32_t>(threadIdx.x % kWarpSize) +
                kFoldAhead * U * kThreads,
            r.last, static_cast<int>(threadIdx.x % kWarpSize));
    }
#pragma unroll
    for (int u = 0; u < U; ++u)
      if (pos[u] != KVC_POSITION_NONE) {
        values[s0 + u * kThreads] =
            update(old[u], weights.group(l[u], kind));
        visit(s0 + u * kThreads, pos[u]);
      }
  }
  __syncthreads();
}

/// Folds this step's probabilities into the score state of every live
/// slot in `r`: state <- decay * state + reduce_g(p_g).
template <int G, int kThreads, typename Visit = NoVisit>
__device__ void foldAccumulated(const int32_t *positions, float *state,
                                SlotRange r, const float *logits, int64_t stride,
                                const float *maxLogit, const float *invSum,
                                float decay, Reduce kind, Visit visit = {}) {
  foldSlots<G, kThreads>(
      positions, state, r, logits, stride, maxLogit, invSum, kind,
      [&](float old, float weight) { return decay * old + weight; }, visit);
}

/// Shifts this step into the importance bits of every live slot in `r`
/// (kvc.attn_persistence): bits <- (bits << 1) | (reduce_g(p_g) >
/// threshold), the latest step in bit 0, as kvc_cpu.h's foldPersistence.
template <int G, int kThreads, typename Visit = NoVisit>
__device__ void foldPersistence(const int32_t *positions, uint64_t *bits,
                                SlotRange r, const float *logits, int64_t stride,
                                const float *maxLogit, const float *invSum,
                                float threshold, Reduce kind, Visit visit = {}) {
  foldSlots<G, kThreads>(
      positions, bits, r, logits, stride, maxLogit, invSum, kind,
      [&](uint64_t old, float weight) -> uint64_t {
        return (old << 1) | (weight > threshold ? 1u : 0u);
      },
      visit);
}

/// Adds this step's group-mean weights to the score state of every live
/// slot in `r`, starting from 0 when `restart` (the first query of a
/// periodic phase's window), as kvc_cpu.h's foldWindowSum.
template <int G, int kThreads>
__device__ void foldWindowSum(const int32_t *positions, float *state,
                              SlotRange r, const float *logits, int64_t stride,
                              const float *maxLogit, const float *invSum,
                              bool restart) {
  foldSlots<G, kThreads>(positions, state, r, logits, stride, maxLogit, invSum,
                         Reduce::Mean, [&](float old, float weight) {
                           return (restart ? 0.0f : old) + weight;
                         });
}

/// Number of set bits among the lowest `history` (<= 64) bits of `bits`.
__device__ inline int32_t countRecentBits(uint64_t bits, int32_t history) {
  if (history < 64)
    bits &= (uint64_t{1} << history) - 1;
  return __popcll(bits);
}

//===----------------------------------------------------------------------===//
// Prefill attention and window statistics
//===----------------------------------------------------------------------===//

/// Queries of one block of prefillAttentionTiles (4 warps x 4 queries).
constexpr int kPrefillQueriesPerWarp = 4;
constexpr int kPrefillWarps = 4;
constexpr int kPrefillThreads = kPrefillWarps * kWarpSize;
constexpr int kPrefillTilesQueryTile = kPrefillQueriesPerWarp * kPrefillWarps;
/// Queries of one block of prefillAttentionMma: 16 per warp, the rows of
/// an mma.sync tile.
constexpr int kPrefillMmaQueryTile = 16 * kPrefillWarps;
/// Queries of one block of prefillAttention, whichever body it runs: the
/// launch covers the prompt with blocks of this many (grid.x).
constexpr int kPrefillQueryTile =
    kPrefillTensorCores ? kPrefillMmaQueryTile : kPrefillTilesQueryTile;
/// Keys per shared-memory tile: one per lane.
constexpr int kKeyTile = kWarpSize;

/// dot[r] = rows[r] . key for kRows rows of D floats in shared memory,
/// stored one after the other and 16-byte aligned (the same rows for every
/// lane: four channels of a row are one broadcast read), and the lane's key
/// row (each channel read once for all the rows). The sums run in channel
/// order, as a one-row loop's would.
template <int kRows, int D>
__device__ __forceinline__ void dotSharedRows(const float *rows,
                                              const float *key,
                                              float (&dot)[kRows]) {
  static_assert(D % 4 == 0, "rows are read four channels at a time");
#pragma unroll
  for (int r = 0; r < kRows; ++r)
    dot[r] = 0.0f;
#pragma unroll 2
  for (int c = 0; c < D; c += 4) {
    float kc[4];
#pragma unroll
    for (int i = 0; i < 4; ++i)
      kc[i] = key[c + i];
#pragma unroll
    for (int r = 0; r < kRows; ++r) {
      const float4 qc = *reinterpret_cast<const float4 *>(rows + r * D + c);
      dot[r] += qc.x * kc[0];
      dot[r] += qc.y * kc[1];
      dot[r] += qc.z * kc[2];
      dot[r] += qc.w * kc[3];
    }
  }
}

/// Causal attention of one query head over the prompt on CUDA cores, one
/// block per tile of kPrefillTilesQueryTile queries (grid: query tiles x
/// q_heads). Keys and
/// values pass through shared memory 32 at a time; lane j scores key j of
/// the tile for the warp's kPrefillQueriesPerWarp rows at once (each key
/// channel read once for all of them, the rows' channels four at a time),
/// then the warp accumulates the 32 values into every row (each value read
/// once for all of them). The sums run in channel and key order, as one row
/// at a time would. Writes the output rows (when `out` is given) and the
/// log-sum-exp of every query, which the statistics pass needs to form
/// exact probabilities.
template <int G, int D>
__device__ void prefillAttentionTiles(int32_t n, const float *q,
                                      const float *k, const float *v,
                                      float scale, float *out, float *lse) {
  static_assert(D % kWarpSize == 0, "head_dim must be a multiple of 32");
  constexpr int kPerLane = D / kWarpSize;
  constexpr int kRows = kPrefillQueriesPerWarp;
  static_assert(kRows % 4 == 0, "a warp's rows are read as float4");
  const int32_t qHead = blockIdx.y, kvHead = qHead / G;
  const int64_t qStride = static_cast<int64_t>(gridDim.y) * D;
  const int64_t kvStride = static_cast<int64_t>(gridDim.y / G) * D;
  const int32_t tile = blockIdx.x * kPrefillTilesQueryTile;
  const int lane = threadIdx.x % kWarpSize, warp = threadIdx.x / kWarpSize;
  // The warp's first row and its query.
  const int row0 = warp * kRows;
  const int32_t t0 = tile + row0;

  __shared__ float keys[kKeyTile][D + 1], values[kKeyTile][D + 1];
  __shared__ __align__(16) float queries[kPrefillTilesQueryTile][D];
  // The weights of the key tile for the warp's rows: key j's in
  // tileProbs[warp][j], which every lane reads in turn (broadcast reads).
  __shared__ __align__(16) float tileProbs[kPrefillWarps][kKeyTile][kRows];
  for (int i = threadIdx.x; i < kPrefillTilesQueryTile * D;
       i += kPrefillThreads) {
    const int r = i / D, c = i % D;
    const int32_t t = tile + r;
    queries[r][c] = t < n ? q[t * qStride + qHead * D + c] : 0.0f;
  }
  float m[kRows], z[kRows];
  float acc[kRows][kPerLane];
#pragma unroll
  for (int r = 0; r < kRows; ++r) {
    m[r] = kNegInf;
    z[r] = 0.0f;
#pragma unroll
    for (int x = 0; x < kPerLane; ++x)
      acc[r][x] = 0.0f;
  }
  const int32_t last = min(tile + kPrefillTilesQueryTile, n) - 1;
  for (int32_t k0 = 0; k0 <= last; k0 += kKeyTile) {
    __syncthreads();
    for (int i = threadIdx.x; i < kKeyTile * D; i += kPrefillThreads) {
      const int r = i / D, c = i % D;
      const int32_t j = k0 + r;
      keys[r][c] = j < n ? k[j * kvStride + kvHead * D + c] : 0.0f;
      values[r][c] = j < n ? v[j * kvStride + kvHead * D + c] : 0.0f;
    }
    __syncthreads();
    // No row of the warp sees a key of the tile (uniform over the warp).
    if (t0 >= n || k0 > t0 + kRows - 1)
      continue;
    float dot[kRows];
    dotSharedRows<kRows, D>(&queries[row0][0], &keys[lane][0], dot);
    // The online softmax of each row that sees the tile (uniform over the
    // warp); a row that does not gets weights 0.
#pragma unroll
    for (int r = 0; r < kRows; ++r) {
      const int32_t t = t0 + r;
      float p = 0.0f;
      if (t < n && k0 <= t) {
        const float l = k0 + lane <= t ? dot[r] * scale : kNegInf;
        const float mNew = fmaxf(m[r], warpMax(l));
        p = expf(l - mNew);
        const float rescale = expf(m[r] - mNew);
        z[r] = z[r] * rescale + warpSum(p);
        m[r] = mNew;
#pragma unroll
        for (int x = 0; x < kPerLane; ++x)
          acc[r][x] *= rescale;
      }
      tileProbs[warp][lane][r] = p;
    }
    __syncwarp();
    for (int j = 0; j < kKeyTile; ++j) {
      float pj[kRows];
#pragma unroll
      for (int r = 0; r < kRows; r += 4) {
        const float4 p4 =
            *reinterpret_cast<const float4 *>(&tileProbs[warp][j][r]);
        pj[r] = p4.x;
        pj[r + 1] = p4.y;
        pj[r + 2] = p4.z;
        pj[r + 3] = p4.w;
      }
#pragma unroll
      for (int x = 0; x < kPerLane; ++x) {
        const float vj = values[j][lane + x * kWarpSize];
#pragma unroll
        for (int r = 0; r < kRows; ++r)
          acc[r][x] += pj[r] * vj;
      }
    }
    // Every lane has read the weights before the next tile writes them.
    __syncwarp();
  }
#pragma unroll
  for (int r = 0; r < kRows; ++r) {
    const int32_t t = t0 + r;
    if (t >= n)
      continue;
    if (out)
#pragma unroll
      for (int x = 0; x < kPerLane; ++x)
        out[t * qStride + qHead * D + lane + x * kWarpSize] = acc[r][x] / z[r];
    if (lane == 0)
      lse[static_cast<int64_t>(qHead) * n + t] = m[r] + logf(z[r]);
  }
}

/// A float as two bf16 parts, hi = bf16(x) and lo = bf16(x - hi) (the
/// difference is exact), packed as mma.sync operands: the pair (a, b) in
/// `hi` and `lo`, a in the low halves. hi + lo is x to about 2^-17
/// relative, and a product of two split numbers less its lo * lo term is
/// the float product to about 2^-16 relative.
__device__ __forceinline__ void splitPair(float a, float b, uint32_t &hi,
                                          uint32_t &lo) {
  const __nv_bfloat162 h = __floats2bfloat162_rn(a, b);
  const float2 back = __bfloat1622float2(h);
  const __nv_bfloat162 l = __floats2bfloat162_rn(a - back.x, b - back.y);
  hi = reinterpret_cast<const uint32_t &>(h);
  lo = reinterpret_cast<const uint32_t &>(l);
}

/// Whether a float array can be read as float4 (16-byte aligned); rows of
/// the prefill inputs start at multiples of 4 floats past it.
__device__ __forceinline__ bool vectorRows(const float *p) {
  return (reinterpret_cast<uintptr_t>(p) & 15) == 0;
}

/// Stages rows first .. first + kRows - 1 of a float matrix (row t at
/// base + t * stride, D channels) in shared memory as bf16 hi and lo parts
/// (splitPair), rows of kPitch elements; rows at or past `limit` are
/// zeros. A thread keeps four channels and steps rows, one float4 read per
/// row where `vector` (vectorRows), one 8-byte write per part. The whole
/// block (kThreads threads) calls it.
template <int kRows, int D, int kPitch, int kThreads>
__device__ __forceinline__ void stageSplitRows(const float *base,
                                               int64_t stride, int32_t first,
                                               int32_t limit, bool vector,
                                               uint16_t (*hi)[kPitch],
                                               uint16_t (*lo)[kPitch]) {
  constexpr int kQuads = D / 4, kRowsPerPass = kThreads / kQuads;
  static_assert(D % 4 == 0 && kPitch % 4 == 0, "rows are staged as quads");
  static_assert(kThreads % kQuads == 0 && kRows % kRowsPerPass == 0,
                "whole rows in whole passes");
  const int c = 4 * (threadIdx.x % kQuads), r0 = threadIdx.x / kQuads;
#pragma unroll
  for (int r = r0; r < kRows; r += kRowsPerPass) {
    const int32_t t = first + r;
    float4 x = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    if (t < limit) {
      const float *row = base + t * stride + c;
      if (vector)
        x = *reinterpret_cast<const float4 *>(row);
      else
        x = make_float4(row[0], row[1], row[2], row[3]);
    }
    uint2 h, l;
    splitPair(x.x, x.y, h.x, l.x);
    splitPair(x.z, x.w, h.y, l.y);
    *reinterpret_cast<uint2 *>(&hi[r][c]) = h;
    *reinterpret_cast<uint2 *>(&lo[r][c]) = l;
  }
}

/// The A fragments (mmaK16) of rows first .. first + 15 of a float matrix
/// (row t at base + t * stride, D channels; rows at or past `limit` are
/// zeros) as bf16 hi and lo parts (splitPair): step s holds channels
/// 16s .. 16s + 15 of rows g and g + 8 for lane (g, t). The whole warp
/// calls it.
template <int D>
__device__ __forceinline__ void loadSplitFragments(const float *base,
                                                   int64_t stride,
                                                   int32_t first,
                                                   int32_t limit,
                                                   uint32_t (&hi)[D / 16][4],
                                                   uint32_t (&lo)[D / 16][4]) {
  const int lane = threadIdx.x % kWarpSize, g = lane / 4, t = lane % 4;
#pragma unroll
  for (int s = 0; s < D / 16; ++s)
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const int32_t row = first + g + 8 * (i % 2);
      const int c = 16 * s + 8 * (i / 2) + 2 * t;
      const float *x = base + (row < limit ? row : 0) * stride + c;
      splitPair(row < limit ? x[0] : 0.0f, row < limit ? x[1] : 0.0f,
                hi[s][i], lo[s][i]);
    }
}

/// c += A B for one 16 x 8 tile over D channels with split operands, three
/// products per pair (lo * hi, hi * lo, hi * hi): A as loadSplitFragments
/// gives it, B's column g (lane (g, t)) a row of channels staged as parts
/// in shared memory, `hi` and `lo` pointing at its channel 2t. The whole
/// warp calls it.
template <int D>
__device__ __forceinline__ void mmaSplit(float (&c)[4],
                                         const uint32_t (&aHi)[D / 16][4],
                                         const uint32_t (&aLo)[D / 16][4],
                                         const uint16_t *hi,
                                         const uint16_t *lo) {
#if defined(KVC_CUDA_EMULATED)
  // The products of up to four steps in one exchange (mmaEmulated), in
  // the order below.
  constexpr int kSteps = D / 16 < 4 ? D / 16 : 4;
  static_assert(D / 16 % kSteps == 0, "whole exchanges of steps");
  for (int s0 = 0; s0 < D / 16; s0 += kSteps) {
    uint32_t a[3 * kSteps][4], b[3 * kSteps][2];
    for (int x = 0; x < kSteps; ++x) {
      const int s = s0 + x;
      const uint32_t bh0 = *reinterpret_cast<const uint32_t *>(hi + 16 * s);
      const uint32_t bh1 =
          *reinterpret_cast<const uint32_t *>(hi + 16 * s + 8);
      const uint32_t bl0 = *reinterpret_cast<const uint32_t *>(lo + 16 * s);
      const uint32_t bl1 =
          *reinterpret_cast<const uint32_t *>(lo + 16 * s + 8);
      for (int i = 0; i < 4; ++i) {
        a[3 * x][i] = aLo[s][i];
        a[3 * x + 1][i] = aHi[s][i];
        a[3 * x + 2][i] = aHi[s][i];
      }
      b[3 * x][0] = b[3 * x + 2][0] = bh0;
      b[3 * x][1] = b[3 * x + 2][1] = bh1;
      b[3 * x + 1][0] = bl0;
      b[3 * x + 1][1] = bl1;
    }
    mmaEmulated<Storage::BF16, 3 * kSteps>(c, a, b, 2);
  }
#else
#pragma unroll
  for (int s = 0; s < D / 16; ++s) {
    const uint32_t bh0 = *reinterpret_cast<const uint32_t *>(hi + 16 * s);
    const uint32_t bh1 = *reinterpret_cast<const uint32_t *>(hi + 16 * s + 8);
    const uint32_t bl0 = *reinterpret_cast<const uint32_t *>(lo + 16 * s);
    const uint32_t bl1 = *reinterpret_cast<const uint32_t *>(lo + 16 * s + 8);
    mmaK16Split(c, aHi[s], aLo[s], bh0, bh1, bl0, bl1);
  }
#endif
}

/// Geometry of prefillAttentionMma: each warp takes 16 query rows (the rows
/// of an mma.sync tile) and every key tile of kKeys keys, whose rows are
/// staged as bf16 hi and lo parts in shared-memory rows of kPitch elements
/// (16 bytes more than a row, so that the eight rows of a fragment load
/// fall into different banks).
template <int D> struct PrefillMma {
  static_assert(D % 32 == 0, "head_dim must be a multiple of 32");
  static constexpr int kKeys = 32;
  static constexpr int kPitch = D + 8;
  /// Channel steps of a key product (k = 16) and channel tiles of the
  /// output (n = 8).
  static constexpr int kSteps = D / 16;
  static constexpr int kChannelTiles = D / 8;
};

/// Causal attention of one query head over the prompt on tensor cores, one
/// block per tile of kPrefillMmaQueryTile queries (grid: query tiles x
/// q_heads), with the results of prefillAttentionTiles: the output rows
/// (when `out` is given) and the log-sum-exp of every query.
///
/// The float queries, keys, values and weights are split into bf16 hi and
/// lo parts (splitPair), and each product is three mma.sync products with
/// float sums: lo * hi, hi * lo, then hi * hi. A warp keeps its rows' query
/// parts in registers as A fragments; per tile of 32 keys it forms the
/// 16 x 32 logits (S = Q K^T: B is a key row's channel pairs, read straight
/// from shared memory), the online softmax of its two rows per lane (row g
/// and g + 8 of the tile; the maximum over the four lanes of a row, the sum
/// kept per lane and added once at the end), and the output O += P V, where
/// the weights' C fragments are the A fragments of the next product and V
/// comes transposed through ldmatrix (loadTransposed). Logits and sums are
/// float, as on CUDA cores; the operands carry about 2^-16 of relative
/// error, far inside test/gpu's output tolerance.
template <int G, int D>
__device__ void prefillAttentionMma(int32_t n, const float *q, const float *k,
                                    const float *v, float scale, float *out,
                                    float *lse) {
  using P = PrefillMma<D>;
  const int32_t qHead = blockIdx.y, kvHead = qHead / G;
  const int64_t qStride = static_cast<int64_t>(gridDim.y) * D;
  const int64_t kvStride = static_cast<int64_t>(gridDim.y / G) * D;
  const int32_t tile = blockIdx.x * kPrefillMmaQueryTile;
  const int lane = threadIdx.x % kWarpSize, warp = threadIdx.x / kWarpSize;
  const int g = lane / 4, t = lane % 4;
  // The warp's first row; the lane's rows are r0 + g and r0 + g + 8.
  const int32_t r0 = tile + 16 * warp;

  // [part][key][channel]: part 0 = hi, 1 = lo.
  __shared__ __align__(16) uint16_t keyParts[2][P::kKeys][P::kPitch];
  __shared__ __align__(16) uint16_t valueParts[2][P::kKeys][P::kPitch];

  // The warp's query rows as split A fragments.
  uint32_t qHi[P::kSteps][4], qLo[P::kSteps][4];
  loadSplitFragments<D>(q + qHead * D, qStride, r0, n, qHi, qLo);
  // Per row h (0: g, 1: g + 8): running maximum, the lane's part of the
  // sum; output channels 8j + 2t, +1 of the row in o[j][2h], o[j][2h + 1].
  float m[2] = {kNegInf, kNegInf}, z[2] = {0.0f, 0.0f};
  float o[P::kChannelTiles][4];
#pragma unroll
  for (int j = 0; j < P::kChannelTiles; ++j)
#pragma unroll
    for (int i = 0; i < 4; ++i)
      o[j][i] = 0.0f;

  const bool vector = vectorRows(k) && vectorRows(v);
  const int32_t last = min(tile + kPrefillMmaQueryTile, n) - 1;
  for (int32_t k0 = 0; k0 <= last; k0 += P::kKeys) {
    __syncthreads();
    stageSplitRows<P::kKeys, D, P::kPitch, kPrefillThreads>(k + kvHead * D, kvStride, k0, n,
                                           vector, keyParts[0], keyParts[1]);
    stageSplitRows<P::kKeys, D, P::kPitch, kPrefillThreads>(v + kvHead * D, kvStride, k0, n,
                                           vector, valueParts[0],
                                           valueParts[1]);
    __syncthreads();
    // No row of the warp sees a key of the tile (uniform over the warp).
    if (r0 >= n || k0 > r0 + 15)
      continue;
    // Logits of keys k0 + 8x + 2t, +1 for the lane's rows: s[x][2h + e].
    float s[4][4];
#pragma unroll
    for (int x = 0; x < 4; ++x) {
#pragma unroll
      for (int i = 0; i < 4; ++i)
        s[x][i] = 0.0f;
      mmaSplit<D>(s[x], qHi, qLo, &keyParts[0][8 * x + g][2 * t],
                  &keyParts[1][8 * x + g][2 * t]);
    }
    // The online softmax of the lane's two rows; masked logits (a later
    // key, a row past the prompt) are -infinity and get weight 0.
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int32_t row = r0 + g + 8 * h;
      float mx = kNegInf;
#pragma unroll
      for (int x = 0; x < 4; ++x)
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          const int32_t key = k0 + 8 * x + 2 * t + e;
          const float l =
              row < n && key <= row ? s[x][2 * h + e] * scale : kNegInf;
          s[x][2 * h + e] = l;
          mx = fmaxf(mx, l);
        }
      mx = fmaxf(mx, __shfl_xor_sync(kFullMask, mx, 1));
      mx = fmaxf(mx, __shfl_xor_sync(kFullMask, mx, 2));
      const float mNew = fmaxf(m[h], mx);
      // A row past the prompt sees no key: its weights stay 0, not NaN.
      const float ref = mNew == kNegInf ? 0.0f : mNew;
      const float rescale = expf(m[h] - ref);
      m[h] = mNew;
      z[h] *= rescale;
#pragma unroll
      for (int j = 0; j < P::kChannelTiles; ++j) {
        o[j][2 * h] *= rescale;
        o[j][2 * h + 1] *= rescale;
      }
#pragma unroll
      for (int x = 0; x < 4; ++x)
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          const float p = expf(s[x][2 * h + e] - ref);
          s[x][2 * h + e] = p;
          z[h] += p;
        }
    }
    // O += P V, 16 keys at a time: the weights of key tiles 2c and 2c + 1
    // are the A fragment of keys 16c .. 16c + 15.
#pragma unroll
    for (int c = 0; c < 2; ++c) {
      uint32_t aHi[4], aLo[4];
      splitPair(s[2 * c][0], s[2 * c][1], aHi[0], aLo[0]);
      splitPair(s[2 * c][2], s[2 * c][3], aHi[1], aLo[1]);
      splitPair(s[2 * c + 1][0], s[2 * c + 1][1], aHi[2], aLo[2]);
      splitPair(s[2 * c + 1][2], s[2 * c + 1][3], aHi[3], aLo[3]);
#pragma unroll
      for (int cb = 0; cb < D / 32; ++cb) {
        // B of keys 16c .. +7 (b0) and 16c + 8 .. +15 (b1), channels
        // 32cb + 8i .. +7 in element i.
        uint32_t vh0[4], vh1[4], vl0[4], vl1[4];
        constexpr int kPitchBytes = 2 * P::kPitch;
        loadTransposed(reinterpret_cast<const uint8_t *>(
                           &valueParts[0][16 * c][0]),
                       kPitchBytes, 32 * cb, vh0);
        loadTransposed(reinterpret_cast<const uint8_t *>(
                           &valueParts[0][16 * c + 8][0]),
                       kPitchBytes, 32 * cb, vh1);
        loadTransposed(reinterpret_cast<const uint8_t *>(
                           &valueParts[1][16 * c][0]),
                       kPitchBytes, 32 * cb, vl0);
        loadTransposed(reinterpret_cast<const uint8_t *>(
                           &valueParts[1][16 * c + 8][0]),
                       kPitchBytes, 32 * cb, vl1);
        mmaK16SplitColumns<4>(o, 4 * cb, aHi, aLo, vh0, vh1, vl0, vl1);
      }
    }
  }
  // The rows' sums over their four lanes, in lane order.
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const float z01 = z[h] + __shfl_xor_sync(kFullMask, z[h], 1);
    const float sum = z01 + __shfl_xor_sync(kFullMask, z01, 2);
    const int32_t row = r0 + g + 8 * h;
    if (row >= n)
      continue;
    if (out)
#pragma unroll
      for (int j = 0; j < P::kChannelTiles; ++j) {
        float *y = out + row * qStride + qHead * D + 8 * j + 2 * t;
        y[0] = o[j][2 * h] / sum;
        y[1] = o[j][2 * h + 1] / sum;
      }
    if (t == 0)
      lse[static_cast<int64_t>(qHead) * n + row] = m[h] + logf(sum);
  }
}

/// Causal attention of one query head over the prompt (grid: tiles of
/// kPrefillQueryTile queries x q_heads, kPrefillThreads threads): the
/// output rows (when `out` is given) and the log-sum-exp of every query,
/// which the statistics pass needs to form exact probabilities. Runs
/// prefillAttentionTiles, or prefillAttentionMma where
/// KVC_CUDA_PREFILL_MMA=1.
template <int G, int D>
__global__ void __launch_bounds__(kPrefillThreads)
    prefillAttention(int32_t n, const float *q, const float *k, const float *v,
                     float scale, float *out, float *lse) {
  if constexpr (kPrefillTensorCores)
    prefillAttentionMma<G, D>(n, q, k, v, scale, out, lse);
  else
    prefillAttentionTiles<G, D>(n, q, k, v, scale, out, lse);
}

/// Importance bits of the prompt (kvc.attn_persistence), as kvc_cpu.h's
/// PersistenceBits: bit a of bits[h * n + i] is set when query n - 1 - a
/// (one of the last `history` <= 64) gave entry i a group-reduced (`reduce`)
/// weight above `threshold`. A null `bits` (the default) computes nothing.
struct PersistenceBits {
  int32_t history;
  float threshold;
  Reduce reduce;
  uint64_t *bits;
};

/// Column statistics of the prompt's attention, one block per tile of 32
/// keys of one kv-head (grid: key tiles x kv_heads), recomputing
/// p = exp(q.k * scale - lse) with the log-sum-exp of prefillAttention:
///  - `windowProbs` (when given): for the G query heads, the mean over the
///    last w = min(window, n) queries of p for the entries before the
///    window, 0 for the window entries themselves;
///  - `lastProbs` (when given): p of the last query over every entry, the
///    last token itself included (kvc.attn_last, as kvc_cpu.h);
///  - `accumulated` (when given): the decayed sum over all queries t of
///    decay^(n-1-t) * p, the state s <- decay * s + p after the last query.
///  - `persistence.bits` (when given): see PersistenceBits.
/// Buffers are per kv-head, G rows of n (importance bits: one row of n).
/// prefillColumnStatsTiles computes them on CUDA cores: warps split the
/// queries; their sums are added (their bits or-ed) in warp order, so the
/// result is deterministic. A warp scores a query for up to four heads of
/// the group at once (each key channel read once for all).
template <int G, int D>
__device__ void prefillColumnStatsTiles(int32_t n, int32_t kvHeads,
                                        const float *q, const float *k,
                                        float scale, const float *lse,
                                        int32_t window, float *windowProbs,
                                        float *lastProbs, float *accumulated,
                                        float decay,
                                        PersistenceBits persistence) {
  const int32_t h = blockIdx.y, col0 = blockIdx.x * kKeyTile;
  const int64_t qStride = static_cast<int64_t>(kvHeads) * G * D;
  const int64_t kvStride = static_cast<int64_t>(kvHeads) * D;
  const int lane = threadIdx.x % kWarpSize, warp = threadIdx.x / kWarpSize;
  const int32_t w = min(window, n);
  // Heads of the group whose query rows a warp stages and scores at once:
  // each key channel is read once for all of them.
  constexpr int kHeads = G % 4 == 0 ? 4 : G % 3 == 0 ? 3 : G % 2 == 0 ? 2 : 1;
  __shared__ float keys[kKeyTile][D + 1];
  __shared__ __align__(16) float queries[kPrefillWarps][kHeads][D];
  __shared__ float sums[kPrefillWarps][2][G][kWarpSize];
  __shared__ uint64_t importance[kPrefillWarps][kWarpSize];
  for (int i = threadIdx.x; i < kKeyTile * D; i += kPrefillThreads) {
    const int r = i / D, c = i % D;
    keys[r][c] = col0 + r < n ? k[(col0 + r) * kvStride + h * D + c] : 0.0f;
  }
  __syncthreads();
  const int32_t col = col0 + lane;
  float windowSum[G], totalSum[G], lastP[G];
#pragma unroll
  for (int g = 0; g < G; ++g)
    windowSum[g] = totalSum[g] = lastP[g] = 0.0f;
  uint64_t bits = 0;
  // Queries that can see a key of this tile and matter to a statistic.
  const int32_t span = max(lastProbs ? max(w, 1) : w,
                           persistence.bits ? persistence.history : 0);
  const int32_t first = accumulated ? col0 : max(col0, n - span);
  for (int32_t t = first + warp; t < n; t += kPrefillWarps) {
    const float age = decay == 1.0f ? 1.0f : powf(decay, float(n - 1 - t));
    // Queries of the persistence history reduce their group's weights.
    const bool persists = persistence.bits && n - 1 - t < persistence.history;
    float reduced = persistence.reduce == Reduce::Max ? kNegInf : 0.0f;
#pragma unroll
    for (int g0 = 0; g0 < G; g0 += kHeads) {
      // Query t's rows of heads g0 .. g0 + kHeads - 1 (adjacent in q).
      __syncwarp();
      const float *rows = q + t * qStride + static_cast<int64_t>(h * G + g0) * D;
      for (int i = lane; i < kHeads * D; i += kWarpSize)
        queries[warp][i / D][i % D] = rows[i];
      __syncwarp();
      float dot[kHeads];
      dotSharedRows<kHeads, D>(&queries[warp][0][0], &keys[lane][0], dot);
#pragma unroll
      for (int x = 0; x < kHeads; ++x) {
        const int g = g0 + x;
        const int32_t qHead = h * G + g;
        const float p =
            col <= t && col < n
                ? expf(dot[x] * scale -
                       lse[static_cast<int64_t>(qHead) * n + t])
                : 0.0f;
        totalSum[g] += p * age;
        if (t >= n - w)
          windowSum[g] += p;
        if (t == n - 1)
          lastP[g] = p;
        if (persists)
          reduced = persistence.reduce == Reduce::Max ? fmaxf(reduced, p)
                                                      : reduced + p;
      }
    }
    if (persists && col <= t && col < n &&
        (persistence.reduce == Reduce::Mean ? reduced / G : reduced) >
            persistence.threshold)
      bits |= uint64_t{1} << (n - 1 - t);
  }
  importance[warp][lane] = bits;
#pragma unroll
  for (int g = 0; g < G; ++g) {
    sums[warp][0][g][lane] = windowSum[g];
    sums[warp][1][g][lane] = totalSum[g];
  }
  // The warp that ran the last query holds its weights.
  if (lastProbs && col < n && (n - 1 - first) % kPrefillWarps == warp &&
      n - 1 >= first)
#pragma unroll
    for (int g = 0; g < G; ++g)
      lastProbs[(static_cast<int64_t>(h) * G + g) * n + col] = lastP[g];
  __syncthreads();
  if (warp != 0 || col >= n)
    return;
#pragma unroll
  for (int g = 0; g < G; ++g) {
    float ws = 0.0f, ts = 0.0f;
    for (int x = 0; x < kPrefillWarps; ++x) {
      ws += sums[x][0][g][lane];
      ts += sums[x][1][g][lane];
    }
    const int64_t at = (static_cast<int64_t>(h) * G + g) * n + col;
    if (windowProbs)
      windowProbs[at] = col < n - w ? ws / w : 0.0f;
    if (accumulated)
      accumulated[at] = ts;
  }
  if (persistence.bits) {
    uint64_t all = 0;
    for (int x = 0; x < kPrefillWarps; ++x)
      all |= importance[x][lane];
    persistence.bits[static_cast<int64_t>(h) * n + col] = all;
  }
}

/// prefillColumnStatsTiles's results on tensor cores (KVC_CUDA_PREFILL_MMA),
/// with its grid: a block per 32 keys of one kv-head. Warp (pair, half)
/// keeps keys col0 + 16 half .. +15 in registers as the bf16 hi and lo
/// parts of A fragments (splitPair, as prefillAttentionMma) and, per step
/// of 32 queries of one query head staged in shared memory, scores queries
/// 16 pair .. +15 of the step: the transposed logits K Q^T, rows keys and
/// columns queries, three mma.sync products per operand pair. The heads
/// of the group run one after the other. A lane sums the weights of its
/// two keys over its query columns in step order, then the four lanes of a
/// row add theirs in lane order and pair 0 adds pair 1's: deterministic,
/// in another order than the CUDA-core body. The persistence history keeps
/// the group-reduced weight of each of its queries and keys in shared
/// memory (every element owned by one lane) until the last head, then one
/// thread per key turns them into bits.
template <int G, int D>
__device__ void prefillColumnStatsMma(int32_t n, int32_t kvHeads,
                                      const float *q, const float *k,
                                      float scale, const float *lse,
                                      int32_t window, float *windowProbs,
                                      float *lastProbs, float *accumulated,
                                      float decay,
                                      PersistenceBits persistence) {
  using P = PrefillMma<D>;
  // Queries staged per step: 16 for each pair of warps.
  constexpr int kQueries = 32;
  constexpr int kMaxHistory = 64;
  const int32_t h = blockIdx.y, col0 = blockIdx.x * kKeyTile;
  const int64_t qStride = static_cast<int64_t>(kvHeads) * G * D;
  const int64_t kvStride = static_cast<int64_t>(kvHeads) * D;
  const int lane = threadIdx.x % kWarpSize, warp = threadIdx.x / kWarpSize;
  // Fragment coordinates: the lane's rows (keys) row and row + 8, its
  // columns (queries) 8x + 2 col + e.
  const int row = lane / 4, col = lane % 4;
  const int half = warp % 2, pair = warp / 2;
  const int32_t w = min(window, n);
  const int32_t span = max(lastProbs ? max(w, 1) : w,
                           persistence.bits ? persistence.history : 0);
  const int32_t first = accumulated ? col0 : max(col0, n - span);
  const int32_t history =
      persistence.bits ? min(min(persistence.history, kMaxHistory), n) : 0;
  // The lane's keys: keys[r] for rows row + 8r of the warp's 16.
  const int32_t keys[2] = {col0 + 16 * half + row, col0 + 16 * half + row + 8};

  // Logits and log-sum-exps in base 2.
  constexpr float kLog2e = 1.4426950408889634f;
  const float scaleLog2 = scale * kLog2e;
  __shared__ __align__(16) uint16_t queryParts[2][kQueries][P::kPitch];
  // The step's log-sum-exps (base 2) and decay factors.
  __shared__ float stepLse[kQueries], stepAge[kQueries];
  // Pair 1's sums of a head (window, accumulated, last), which pair 0 adds.
  __shared__ float pairSums[3][kKeyTile];
  // reduced[a][i]: the group-reduced weight of query n - 1 - a for key
  // col0 + i.
  __shared__ float reduced[kMaxHistory][kKeyTile];

  const bool vector = vectorRows(q);
  // The warp's 16 keys as split A fragments.
  uint32_t kHi[P::kSteps][4], kLo[P::kSteps][4];
  loadSplitFragments<D>(k + h * D, kvStride, keys[0] - row, n, kHi, kLo);

  for (int g = 0; g < G; ++g) {
    const int32_t qHead = h * G + g;
    // Per key r of the lane: window sum, decayed sum, last query's weight.
    float windowSum[2] = {0.0f, 0.0f}, totalSum[2] = {0.0f, 0.0f},
          lastP[2] = {0.0f, 0.0f};
    for (int32_t t0 = first; t0 < n; t0 += kQueries) {
      __syncthreads();
      stageSplitRows<kQueries, D, P::kPitch, kPrefillThreads>(q + qHead * D, qStride, t0, n,
                                             vector, queryParts[0],
                                             queryParts[1]);
      if (threadIdx.x < kQueries) {
        const int32_t t = t0 + threadIdx.x;
        stepLse[threadIdx.x] =
            t < n ? lse[static_cast<int64_t>(qHead) * n + t] * kLog2e : 0.0f;
        // Queries past the prompt get 0 (their weights are 0; a factor of
        // decay^-k could be infinite).
        stepAge[threadIdx.x] = t >= n        ? 0.0f
                               : decay == 1.0f ? 1.0f
                                               : powf(decay, float(n - 1 - t));
      }
      __syncthreads();
      // None of the warp's queries sees one of its keys (uniform).
      const int32_t tw = t0 + 16 * pair;
      if (tw >= n || tw + 15 < keys[0] - row)
        continue;
      float sc[2][4];
#pragma unroll
      for (int x = 0; x < 2; ++x) {
#pragma unroll
        for (int i = 0; i < 4; ++i)
          sc[x][i] = 0.0f;
        mmaSplit<D>(sc[x], kHi, kLo,
                    &queryParts[0][16 * pair + 8 * x + row][2 * col],
                    &queryParts[1][16 * pair + 8 * x + row][2 * col]);
      }
      // p = 2^(logit * log2(e) - lse * log2(e)). Most steps of an
      // accumulated sum (uniform): every query after the warp's keys and
      // inside the prompt, none in the window, the last query or the
      // history; they only add to the decayed sum.
      const bool tail = t0 + kQueries > n - span;
      const bool masked = tw < keys[0] - row + 15 || tw + 15 >= n;
      if (!tail && !masked) {
#pragma unroll
        for (int x = 0; x < 2; ++x)
#pragma unroll
          for (int e = 0; e < 2; ++e) {
            const int i = 16 * pair + 8 * x + 2 * col + e;
            const float l = stepLse[i], age = stepAge[i];
#pragma unroll
            for (int r = 0; r < 2; ++r)
              totalSum[r] += exp2f(fmaf(sc[x][2 * r + e], scaleLog2, -l)) * age;
          }
        continue;
      }
#pragma unroll
      for (int x = 0; x < 2; ++x)
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          const int i = 16 * pair + 8 * x + 2 * col + e;
          const int32_t t = t0 + i;
          const float l = stepLse[i], age = stepAge[i];
#pragma unroll
          for (int r = 0; r < 2; ++r) {
            const float p =
                t < n && keys[r] <= t
                    ? exp2f(fmaf(sc[x][2 * r + e], scaleLog2, -l))
                    : 0.0f;
            totalSum[r] += p * age;
            if (t >= n - w)
              windowSum[r] += p;
            if (t == n - 1)
              lastP[r] += p;
            const int32_t a = n - 1 - t;
            if (t < n && a < history) {
              float &red = reduced[a][16 * half + row + 8 * r];
              red = g == 0 ? p
                    : persistence.reduce == Reduce::Max ? fmaxf(red, p)
                                                        : red + p;
            }
          }
        }
    }
    // The row's four lanes, then the two pairs.
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      float *sums[3] = {&windowSum[r], &totalSum[r], &lastP[r]};
#pragma unroll
      for (int j = 0; j < 3; ++j) {
        const float v = *sums[j] + __shfl_xor_sync(kFullMask, *sums[j], 1);
        *sums[j] = v + __shfl_xor_sync(kFullMask, v, 2);
      }
      if (pair == 1 && col == 0) {
        pairSums[0][16 * half + row + 8 * r] = windowSum[r];
        pairSums[1][16 * half + row + 8 * r] = totalSum[r];
        pairSums[2][16 * half + row + 8 * r] = lastP[r];
      }
    }
    __syncthreads();
    if (pair == 0 && col == 0)
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        const int32_t key = keys[r];
        if (key >= n)
          continue;
        const int i = 16 * half + row + 8 * r;
        const int64_t at = static_cast<int64_t>(qHead) * n + key;
        if (windowProbs)
          windowProbs[at] =
              key < n - w ? (windowSum[r] + pairSums[0][i]) / w : 0.0f;
        if (accumulated)
          accumulated[at] = totalSum[r] + pairSums[1][i];
        if (lastProbs)
          lastProbs[at] = lastP[r] + pairSums[2][i];
      }
    // Pair 1 writes the next head's sums only after pair 0 read these.
    __syncthreads();
  }
  if (persistence.bits && threadIdx.x < kKeyTile) {
    const int32_t key = col0 + threadIdx.x;
    if (key >= n)
      return;
    uint64_t bits = 0;
    // Query n - 1 - a sees the key while key <= n - 1 - a.
    for (int32_t a = 0; a < history && key <= n - 1 - a; ++a) {
      const float x = reduced[a][threadIdx.x];
      if ((persistence.reduce == Reduce::Mean ? x / G : x) >
          persistence.threshold)
        bits |= uint64_t{1} << a;
    }
    persistence.bits[static_cast<int64_t>(h) * n + key] = bits;
  }
}

/// Column statistics of the prompt's attention (see
/// prefillColumnStatsTiles; grid: key tiles of kKeyTile x kv_heads,
/// kPrefillThreads threads): prefillColumnStatsTiles, or
/// prefillColumnStatsMma where KVC_CUDA_PREFILL_MMA=1.
template <int G, int D>
__global__ void __launch_bounds__(kPrefillThreads)
    prefillColumnStats(int32_t n, int32_t kvHeads, const float *q,
                       const float *k, float scale, const float *lse,
                       int32_t window, float *windowProbs, float *lastProbs,
                       float *accumulated, float decay,
                       PersistenceBits persistence) {
  if constexpr (kPrefillTensorCores)
    prefillColumnStatsMma<G, D>(n, kvHeads, q, k, scale, lse, window,
                                windowProbs, lastProbs, accumulated, decay,
                                persistence);
  else
    prefillColumnStatsTiles<G, D>(n, kvHeads, q, k, scale, lse, window,
                                  windowProbs, lastProbs, accumulated, decay,
                                  persistence);
}

//===----------------------------------------------------------------------===//
// Score transforms (block functions over one kv-head's buffers)
//===----------------------------------------------------------------------===//

/// out[i] = reduce over g of in[g * stride + i].
template <int kThreads>
__device__ void groupReduce(const float *in, int groups, int64_t stride,
                            int32_t n, Reduce kind, float *out) {
  for (int32_t i = threadIdx.x; i < n; i += kThreads) {
    float r = kind == Reduce::Max ? kNegInf : 0.0f;
    for (int g = 0; g < groups; ++g) {
      const float x = in[g * stride + i];
      r = kind == Reduce::Max ? fmaxf(r, x) : r + x;
    }
    out[i] = kind == Reduce::Mean ? r / groups : r;
  }
  __syncthreads();
}

/// 1-D pooling along n tokens with an odd kernel, stride 1, "same" padding:
/// zeros counted in the divisor (average) or -infinity (maximum).
template <int kThreads>
__device__ void pool(const float *in, int32_t n, int32_t kernel, bool max,
                     float *out) {
  const int32_t half = kernel / 2;
  for (int32_t i = threadIdx.x; i < n; i += kThreads) {
    float r = max ? kNegInf : 0.0f;
    for (int32_t j = ::max(0, i - half); j <= ::min(n - 1, i + half); ++j)
      r = max ? fmaxf(r, in[j]) : r + in[j];
    out[i] = max ? r : r / kernel;
  }
  __syncthreads();
}

/// Normalizes the live entries of one buffer (population deviation; a zero
/// deviation, sum or maximum gives zeros), in double like the CPU backend.
template <int kThreads>
__device__ void normalize(const float *in, const int32_t *positions, int32_t n,
                          Normalize kind, float *out) {
  double sum = 0.0, sq = 0.0, mx = -__builtin_huge_val();
  int32_t live = 0;
  for (int32_t i = threadIdx.x; i < n; i += kThreads) {
    if (positions[i] == KVC_POSITION_NONE)
      continue;
    ++live;
    sum += in[i];
    sq += static_cast<double>(in[i]) * in[i];
    mx = fmax(mx, static_cast<double>(in[i]));
  }
  sum = blockReduce<kThreads>(sum);
  sq = blockReduce<kThreads>(sq);
  mx = blockReduce<kThreads, true>(mx);
  live = blockReduce<kThreads>(live);
  const double mean = live ? sum / live : 0.0;
  const double sd = live ? sqrt(fmax(0.0, sq / live - mean * mean)) : 0.0;
  for (int32_t i = threadIdx.x; i < n; i += kThreads) {
    double x = in[i];
    switch (kind) {
    case Normalize::ZScore:
      x = sd > 0.0 ? (x - mean) / sd : 0.0;
      break;
    case Normalize::Sum:
      x = sum != 0.0 ? x / sum : 0.0;
      break;
    case Normalize::Max:
      x = mx != 0.0 ? x / mx : 0.0;
      break;
    }
    out[i] = static_cast<float>(x);
  }
  __syncthreads();
}

/// Sets the score of the `sinks` oldest and the `recent` newest live entries
/// (by original position, found by radix selection) to +infinity.
template <int kThreads>
__device__ void protect(const float *in, const int32_t *positions, int32_t n,
                        int32_t sinks, int32_t recent, float *out) {
  const int32_t live = countLive<kThreads>(positions, n);
  for (int32_t i = threadIdx.x; i < n; i += kThreads)
    out[i] = in[i];
  __syncthreads();
  if (live == 0)
    return;
  auto keyOf = [&](int32_t i, uint64_t *key) {
    *key = static_cast<uint32_t>(positions[i]);
    return positions[i] != KVC_POSITION_NONE;
  };
  // Positions <= lowCut are sinks, positions >= highCut recent.
  int64_t lowCut = -1, highCut = INT64_MAX;
  if (sinks > 0)
    lowCut = static_cast<int64_t>(
        blockSelectKth<kThreads, 32>(n, min(sinks, live), keyOf));
  if (recent > 0)
    highCut = static_cast<int64_t>(blockSelectKth<kThreads, 32>(
        n, live - min(recent, live) + 1, keyOf));
  for (int32_t i = threadIdx.x; i < n; i += kThreads)
    if (positions[i] != KVC_POSITION_NONE &&
        (positions[i] <= lowCut || positions[i] >= highCut))
      out[i] = kPosInf;
  __syncthreads();
}

/// ||row_i||_p (p = 1 or 2) of n rows of D floats, `stride` floats apart.
template <int kThreads>
__device__ void rowNorms(const float *rows, int64_t stride, int32_t n, int dim,
                         int p, float *out) {
  for (int32_t i = threadIdx.x; i < n; i += kThreads) {
    double s = 0.0;
    for (int c = 0; c < dim; ++c) {
      const double x = rows[i * stride + c];
      s += p == 1 ? fabs(x) : x * x;
    }
    out[i] = static_cast<float>(p == 1 ? s : sqrt(s));
  }
  __syncthreads();
}

/// KeyDiff: -cos(k_i, mean_j k_j / ||k_j||) over n prompt keys.
template <int kThreads, int D>
__device__ void keyDiversity(const float *rows, int64_t stride, int32_t n,
                             float *out) {
  __shared__ double mean[D];
  __shared__ double meanNorm;
  rowNorms<kThreads>(rows, stride, n, D, 2, out); // out holds ||k_i||.
  for (int c = threadIdx.x; c < D; c += kThreads) {
    double s = 0.0;
    for (int32_t i = 0; i < n; ++i)
      if (out[i] > 0.0f)
        s += rows[i * stride + c] / static_cast<double>(out[i]);
    mean[c] = s / (n > 1 ? n : 1);
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    double s = 0.0;
    for (int c = 0; c < D; ++c)
      s += mean[c] * mean[c];
    meanNorm = sqrt(s);
  }
  __syncthreads();
  for (int32_t i = threadIdx.x; i < n; i += kThreads) {
    double dot = 0.0;
    for (int c = 0; c < D; ++c)
      dot += rows[i * stride + c] * mean[c];
    const double denom = static_cast<double>(out[i]) * meanNorm;
    out[i] = static_cast<float>(denom > 0.0 ? -dot / denom : 0.0);
  }
  __syncthreads();
}

//===----------------------------------------------------------------------===//
// Budgets and selection
//===----------------------------------------------------------------------===//

/// PyramidKV integer budget of `layer` for a prompt of `length` tokens,
/// window entries included (the rule of kvc_cpu.h's pyramidBudget).
__host__ __device__ inline int64_t pyramidBudget(int64_t capacity,
                                                 int64_t window, int64_t beta,
                                                 int64_t layers, int64_t layer,
                                                 int64_t length) {
  if (length < capacity)
    return length;
  const int64_t c = capacity - window;
  if (length < 2 * c)
    return c + window;
  int64_t lo = c / beta;
  int64_t hi = 2 * c - lo;
  if (hi >= length - window) {
    hi = length - window;
    lo = 2 * c - hi;
  }
  const int64_t step = layers > 1 ? (hi - lo) / (layers - 1) : 0;
  return hi - layer * step + window;
}

/// Sets flag[i] = 1 for the `want` entries of the block's selection whose
/// keys come first: every key strictly beyond `threshold` (above it with
/// kAbove, below it otherwise), then keys equal to it in index order until
/// `want` are flagged. `threshold` is the want-th key in that order
/// (blockSelectKth), so exactly `want` entries are flagged; keyOf(i, &key)
/// is false for entries outside the selection.
template <int kThreads, bool kAbove, typename KeyOf>
__device__ void flagThrough(int32_t n, KeyOf keyOf, uint64_t threshold,
                            int32_t want, uint8_t *flag) {
  int32_t beyond = 0;
  for (int32_t i = threadIdx.x; i < n; i += kThreads) {
    uint64_t key;
    if (keyOf(i, &key) && (kAbove ? key > threshold : key < threshold)) {
      flag[i] = 1;
      ++beyond;
    }
  }
  beyond = blockReduce<kThreads>(beyond);
  if (beyond >= want)
    return;
  forEachRanked<kThreads>(
      n,
      [&](int32_t i) {
        uint64_t key = 0;
        return keyOf(i, &key) && key == threshold;
      },
      [&](int32_t i, int32_t rank) {
        if (beyond + rank < want)
          flag[i] = 1;
      });
}

/// The order of a selection's victims: by score, then by position, older
/// first when `tieRecent` (newer first otherwise); the smallest key goes.
__device__ inline uint64_t selectionKey(float score, int32_t position,
                                        bool tieRecent) {
  const uint32_t pos = static_cast<uint32_t>(position);
  return static_cast<uint64_t>(orderedBits(score)) << 32 |
         (tieRecent ? pos : ~pos);
}

/// Flags in `victim` the live entries outside the top `budget` by score and
/// returns their count: the `drop` smallest of the keys (score, position),
/// positions ordered so that ties evict the older entry when `tieRecent`
/// (the newer otherwise). The drop-th key is found by radix selection;
/// entries equal to it (only possible with repeated positions) are taken in
/// index order, so exactly `drop` are flagged.
template <int kThreads>
__device__ int32_t selectVictims(const float *scores, const int32_t *positions,
                                 int32_t n, int64_t budget, bool tieRecent,
                                 uint8_t *victim) {
  const int32_t live = countLive<kThreads>(positions, n);
  const int64_t drop = live > budget ? live - budget : 0;
  auto keyOf = [&](int32_t i, uint64_t *key) {
    *key = selectionKey(scores[i], positions[i], tieRecent);
    return positions[i] != KVC_POSITION_NONE;
  };
  for (int32_t i = threadIdx.x; i < n; i += kThreads)
    victim[i] = 0;
  __syncthreads();
  if (drop == 0)
    return 0;
  const uint64_t threshold = blockSelectKth<kThreads, 64>(n, drop, keyOf);
  flagThrough<kThreads, false>(n, keyOf, threshold,
                               static_cast<int32_t>(drop), victim);
  return static_cast<int32_t>(drop);
}

/// Mixed precision of a prefill gather, the rule of kvc_cpu.h's
/// markHighPrecision: sets high[i] = 1 for the rules::highPrecisionCount(kept,
/// fraction) kept entries (victim[i] == 0; every i < n when `victim` is
/// null) that rank highest by score, ties going to the more recent
/// position, and 0 for every other entry; returns that count. The cut is a
/// radix selection over the keys (score, position); entries equal to it
/// (only possible with repeated positions) are taken in index order, so
/// exactly that many are flagged.
template <int kThreads>
__device__ int32_t markHighPrecision(const float *scores,
                                     const int32_t *positions, int32_t n,
                                     const uint8_t *victim, double fraction,
                                     uint8_t *high) {
  auto keyOf = [&](int32_t i, uint64_t *key) {
    *key = static_cast<uint64_t>(orderedBits(scores[i])) << 32 |
           static_cast<uint32_t>(positions[i]);
    return !victim || !victim[i];
  };
  int32_t kept = 0;
  for (int32_t i = threadIdx.x; i < n; i += kThreads) {
    kept += !victim || !victim[i];
    high[i] = 0;
  }
  kept = blockReduce<kThreads>(kept);
  const int32_t count = rules::highPrecisionCount(kept, fraction);
  if (count == 0)
    return 0;
  // The count-th largest key.
  const uint64_t threshold =
      blockSelectKth<kThreads, 64>(n, kept - count + 1, keyOf);
  flagThrough<kThreads, true>(n, keyOf, threshold, count, high);
  return count;
}

/// Writes, in ascending order, the indices i < n with keep(i) to `list`
/// and their count to *count (thread 0). Block-wide prefix sums.
template <int kThreads, typename Keep>
__device__ void compactIndices(int32_t n, Keep keep, int32_t *list,
                               int32_t *count) {
  const int32_t written = forEachRanked<kThreads>(
      n, keep, [&](int32_t i, int32_t at) { list[at] = i; });
  if (threadIdx.x == 0)
    *count = written;
  __syncthreads();
}

/// What the runtime's kvc_evict does to the metadata of slot i, done to the
/// head's device tables: position KVC_POSITION_NONE, score state and
/// importance bits 0.
__device__ inline void clearSlot(const HeadTable &t, int32_t i) {
  t.positions[i] = KVC_POSITION_NONE;
  if (t.state)
    t.state[i] = 0.0f;
  if (t.history)
    t.history[i] = 0;
}

/// What the runtime's kvc_evict does to the metadata of the flagged slots
/// (victim[i] != 0), done to the head's device tables: position
/// KVC_POSITION_NONE, score state and importance bits 0. The host evicts
/// the same slots after the step, so a device-resident table (DeviceTables)
/// stays equal to the runtime's.
template <int kThreads>
__device__ void clearEvicted(const HeadTable &t, const uint8_t *victim,
                             int32_t n) {
  for (int32_t i = threadIdx.x; i < n; i += kThreads)
    if (victim[i])
      clearSlot(t, i);
  __syncthreads();
}

//===----------------------------------------------------------------------===//
// One victim per decode step, settled from the fold blocks
//===----------------------------------------------------------------------===//

/// kvc.protect's cuts as the decode fold guesses them from the step: the
/// sinks are positions 0 .. sinks - 1 and the recent entries positions
/// position - recent + 1 .. position (the query's own). The guess is
/// protect's exactly when the head holds min(sinks, live) live entries at or
/// below lowCut and min(recent, live) at or above highCut: each side is then
/// the set of that many oldest (newest) live entries, whatever the positions
/// below (above) the cut. takeOneVictim checks both counts. A policy without
/// kvc.protect guesses sinks = recent = 0, which is always exact.
struct ProtectGuess {
  int32_t sinks, recent;
  int64_t lowCut, highCut;
};

__device__ inline ProtectGuess guessProtection(int32_t sinks, int32_t recent,
                                               int32_t position) {
  return {sinks, recent, static_cast<int64_t>(sinks) - 1,
          recent > 0 ? static_cast<int64_t>(position) - recent + 1 : INT64_MAX};
}

/// One fold block's account of its slots for the decode selection: the
/// smallest selection key of its live slots (score after the guessed
/// protection, position) and the lowest slot that holds it (-1: no live
/// slot), its live slots, and how many of them the guess counts as sinks and
/// as recent.
struct SelectionSummary {
  unsigned long long key;
  int32_t slot, live, sinks, recent;
};

/// Bits of each count in summarizeSelection's packed sum.
constexpr int kCountBits = 21;
/// Slots a thread of summarizeSelection takes per pass (kThreads apart):
/// their positions and scores load together.
constexpr int kSummaryUnroll = 4;

/// A thread's account of the live slots it has seen for a SelectionSummary:
/// add() them in ascending slot order (so that on equal keys it keeps the
/// lowest), then summarize() in every thread of the block. Used by
/// summarizeSelection, and by a fold helper that updates the score the
/// selection reads (its visit), which then needs no second pass over the
/// slots' positions and scores.
struct SelectionScan {
  ProtectGuess guess;
  bool tieRecent;
  unsigned long long best = ~0ull;
  int32_t bestSlot = INT32_MAX, live = 0, sinks = 0, recent = 0;

  __device__ SelectionScan(ProtectGuess guess, bool tieRecent)
      : guess(guess), tieRecent(tieRecent) {}

  /// Live slot `slot` at `position`, of the policy's score `score` before
  /// kvc.protect; a slot the guess protects scores +infinity, as protect
  /// writes it.
  __device__ void add(int32_t slot, int32_t position, float score) {
    const bool sink = position <= guess.lowCut,
               young = position >= guess.highCut;
    ++live;
    sinks += sink;
    recent += young;
    const unsigned long long key =
        selectionKey(sink || young ? kPosInf : score, position, tieRecent);
    if (key < best) {
      best = key;
      bestSlot = slot;
    }
  }

  /// The block's summary of the range `r` the threads added from into *out
  /// (thread 0 writes it). Every thread of the block calls it.
  template <int kThreads>
  __device__ void summarize(SlotRange r, SelectionSummary *out) const {
    const unsigned long long blockBest =
        ~blockReduce<kThreads, true>(~best);
    const int32_t slot = -blockReduce<kThreads, true>(
        best == blockBest ? -bestSlot : -INT32_MAX);
    int32_t all = live, low = sinks, high = recent;
    if (r.last - r.first < (int32_t{1} << kCountBits)) {
      // The three counts (each at most the range's length) in one sum.
      const unsigned long long counts = blockReduce<kThreads>(
          static_cast<unsigned long long>(live) |
          static_cast<unsigned long long>(sinks) << kCountBits |
          static_cast<unsigned long long>(recent) << 2 * kCountBits);
      constexpr unsigned long long kMask = (1ull << kCountBits) - 1;
      all = static_cast<int32_t>(counts & kMask);
      low = static_cast<int32_t>(counts >> kCountBits & kMask);
      high = static_cast<int32_t>(counts >> 2 * kCountBits & kMask);
    } else {
      all = blockReduce<kThreads>(all);
      low = blockReduce<kThreads>(low);
      high = blockReduce<kThreads>(high);
    }
    if (threadIdx.x == 0)
      *out = {blockBest, all > 0 && slot != INT32_MAX ? slot : -1, all, low,
              high};
  }
};

/// Summarizes the live slots of `r` into *out (thread 0 writes it).
/// score(i) is the policy's score of live slot i before kvc.protect (see
/// SelectionScan::add). score(i) is also evaluated, and its value ignored,
/// for the free slots of `r` (so that it loads with the positions,
/// kSummaryUnroll slots per thread at a time): it must read only slot i's
/// entries.
template <int kThreads, typename Score>
__device__ void summarizeSelection(const int32_t *positions, SlotRange r,
                                   ProtectGuess guess, bool tieRecent,
                                   Score score, SelectionSummary *out) {
  SelectionScan scan(guess, tieRecent);
  // Each thread's slots ascend.
  for (int32_t i0 = r.first + threadIdx.x; i0 < r.last;
       i0 += kSummaryUnroll * kThreads) {
    int32_t pos[kSummaryUnroll];
    float scores[kSummaryUnroll];
#pragma unroll
    for (int u = 0; u < kSummaryUnroll; ++u) {
      const int32_t i = i0 + u * kThreads;
      const bool in = i < r.last;
      pos[u] = in ? positions[i] : KVC_POSITION_NONE;
      scores[u] = in ? score(i) : 0.0f;
    }
#pragma unroll
    for (int u = 0; u < kSummaryUnroll; ++u)
      if (pos[u] != KVC_POSITION_NONE)
        scan.add(i0 + u * kThreads, pos[u], scores[u]);
  }
  scan.summarize<kThreads>(r, out);
}

/// Settles a head's decode selection from the `count` summaries of its fold
/// blocks when it can, and returns true (every thread): no victim when the
/// live entries fit `budget`; when exactly one must go and the guessed
/// protection was exact, the smallest key of the summaries, the entry that
/// selectVictims would flag. Writes the victim list (t.victims) and clears
/// the victim in the device tables (clearSlot). Otherwise returns
/// false with nothing written, and the stages run in full.
template <int kThreads>
__device__ bool takeOneVictim(const HeadTable &t,
                              const SelectionSummary *summaries, int32_t count,
                              int64_t budget, ProtectGuess guess) {
  __shared__ int32_t settled;
  if (threadIdx.x < kWarpSize) {
    unsigned long long best = ~0ull;
    int32_t slot = INT32_MAX, live = 0, sinks = 0, recent = 0;
    // Summaries in block order, so a lane's lowest slot of a key comes first.
    for (int32_t j = threadIdx.x; j < count; j += kWarpSize) {
      const SelectionSummary s = summaries[j];
      live += s.live;
      sinks += s.sinks;
      recent += s.recent;
      if (s.slot >= 0 && s.key < best) {
        best = s.key;
        slot = s.slot;
      }
    }
    const unsigned long long warpBest = ~warpMax(~best);
    slot = -warpMax(best == warpBest ? -slot : -INT32_MAX);
    live = warpSum(live);
    sinks = warpSum(sinks);
    recent = warpSum(recent);
    if (threadIdx.x == 0) {
      const int64_t drop = live > budget ? live - budget : 0;
      const bool exact = sinks == min(guess.sinks, live) &&
                         recent == min(guess.recent, live);
      settled = drop == 0 || (drop == 1 && exact && slot != INT32_MAX);
      if (drop == 0) {
        t.victims[0] = 0;
      } else if (settled) {
        t.victims[0] = 1;
        t.victims[1] = slot;
        clearSlot(t, slot);
      }
    }
  }
  __syncthreads();
  return settled != 0;
}

//===----------------------------------------------------------------------===//
// Across the heads of a layer (one block for the whole layer)
//===----------------------------------------------------------------------===//

/// Layer-wide score of entry i < n: reduce over the kv-heads h and rows g
/// of scores[(h * rows + g) * stride + i], in (h, g) order like the CPU
/// backend; the mean divides by heads * rows.
template <int kThreads>
__device__ void layerReduce(const float *scores, int32_t heads, int32_t rows,
                            int64_t stride, int32_t n, Reduce kind,
                            float *out) {
  for (int32_t i = threadIdx.x; i < n; i += kThreads) {
    float r = kind == Reduce::Max ? kNegInf : 0.0f;
    for (int32_t h = 0; h < heads; ++h)
      for (int32_t g = 0; g < rows; ++g) {
        const float x =
            scores[(static_cast<int64_t>(h) * rows + g) * stride + i];
        r = kind == Reduce::Max ? fmaxf(r, x) : r + x;
      }
    out[i] = kind == Reduce::Mean ? r / (heads * rows) : r;
  }
  __syncthreads();
}

/// AdaKV's per-head budgets, the rule of kvc_cpu.h's adaptiveBudgets: every
/// head keeps its top floor(alpha * budget) live entries (ties: the later
/// entry), then the rest of the layer's kHeads * budget goes to the highest
/// remaining scores of any head (ties: the later entry, then the later
/// head). scores[h * stride + i]; isLive(h, i) tells the live entries of
/// head h among i < n. Both selections are radix selections over unique
/// 64-bit keys (score, entry[, head]), so nothing is sorted and the counts
/// are exact; kHeads * n must stay below 2^31. Writes perHead[kHeads].
template <int kThreads, int kHeads, typename IsLive>
__device__ void adaptiveBudgets(const float *scores, IsLive isLive, int32_t n,
                                int64_t stride, int64_t budget, double alpha,
                                int64_t *perHead) {
  __shared__ uint64_t cuts[kHeads];
  __shared__ int64_t counts[kHeads];
  const int64_t share = static_cast<int64_t>(floor(alpha * budget));
  auto score = [&](int32_t h, int32_t i) {
    return static_cast<uint64_t>(orderedBits(scores[h * stride + i])) << 32;
  };
  int64_t remaining = kHeads * budget, candidates = 0;
  for (int32_t h = 0; h < kHeads; ++h) {
    int32_t live = 0;
    for (int32_t i = threadIdx.x; i < n; i += kThreads)
      live += isLive(h, i);
    live = blockReduce<kThreads>(live);
    const int64_t mine = min(share, static_cast<int64_t>(live));
    // Entries of the head with a key >= cut are its share.
    uint64_t cut = ~0ull;
    if (mine > 0)
      cut = blockSelectKth<kThreads, 64>(
          n, live - mine + 1, [&](int32_t i, uint64_t *key) {
            *key = score(h, i) | static_cast<uint32_t>(i);
            return isLive(h, i);
          });
    if (threadIdx.x == 0) {
      cuts[h] = cut;
      counts[h] = mine;
    }
    remaining -= mine;
    candidates += live - mine;
  }
  __syncthreads();
  const int64_t picks = max(int64_t{0}, min(remaining, candidates));
  if (picks > 0) {
    // The remaining entries of every head, keyed (score, entry, head).
    auto candidateKey = [&](int32_t x, uint64_t *key) {
      const int32_t h = x / n, i = x % n;
      if (!isLive(h, i) ||
          (score(h, i) | static_cast<uint32_t>(i)) >= cuts[h])
        return false;
      *key = score(h, i) |
             (static_cast<uint32_t>(i) * static_cast<uint32_t>(kHeads) + h);
      return true;
    };
    const uint64_t threshold = blockSelectKth<kThreads, 64>(
        kHeads * n, candidates - picks + 1, candidateKey);
    for (int32_t h = 0; h < kHeads; ++h) {
      int32_t won = 0;
      for (int32_t i = threadIdx.x; i < n; i += kThreads) {
        uint64_t key = 0; // set by candidateKey when it returns true
        won += candidateKey(h * n + i, &key) && key >= threshold;
      }
      won = blockReduce<kThreads>(won);
      if (threadIdx.x == 0)
        counts[h] += won;
    }
  }
  __syncthreads();
  for (int32_t h = threadIdx.x; h < kHeads; h += kThreads)
    perHead[h] = counts[h];
  __syncthreads();
}

//===----------------------------------------------------------------------===//
// Merges of evicted prompt entries into kept ones (prefill)
//
// The same arithmetic as kvc_cpu.h, in the same order: double precision
// with explicitly rounded operations (no contraction into fused
// multiply-adds), one thread per dot product, sums over the victims of a
// kept entry in ascending victim order. Inputs are the float prompt rows
// k/v ([token][kv-head][channel], row stride kvStride); per kv-head `h`
// the kept list kept[0..numKept) and victim list victims[0..numVictims)
// (ascending prompt indices). Outputs are the rows to store, in kept-list
// order: merged[(j * kvHeads + h) * D + c] for kept entry j.
//===----------------------------------------------------------------------===//

/// Merge weight rules of kvc.merge_nearest.
enum class MergeWeight { SimNorm, Similarity, Uniform };

/// Which merge mergeRows applies.
enum class MergeKind { Nearest, D2O };

/// Scratch of the merges, per kv-head (`stride` entries each).
struct MergeScratch {
  double *keptNorms;  ///< |k_t| of every kept entry.
  int32_t *targets;   ///< Nearest kept entry of every victim (-1: none).
  double *sims;       ///< Its cosine similarity.
  double *weights;    ///< The victim's merge weight (0: not merged).
  double *means;      ///< CaM's window mean, per kv-head.
};

/// Euclidean norm of a float row, summed in channel order.
template <int D> __device__ double rowNormDouble(const float *row) {
  double s = 0.0;
  for (int c = 0; c < D; ++c)
    s = __dadd_rn(s, __dmul_rn(static_cast<double>(row[c]), row[c]));
  return sqrt(s);
}

/// |k_t| of the kept entries of kv-head blockIdx.y (grid: entry tiles x
/// kv-heads, one thread per entry).
template <int D>
__global__ void mergeKeptNorms(const float *k, int64_t kvStride,
                               const int32_t *kept, const int32_t *numKept,
                               int64_t stride, MergeScratch m) {
  const int32_t h = blockIdx.y;
  const int32_t t = blockIdx.x * blockDim.x + threadIdx.x;
  if (t >= numKept[h])
    return;
  m.keptNorms[h * stride + t] =
      rowNormDouble<D>(k + kept[h * stride + t] * kvStride + h * D);
}

/// Every victim's most cosine-similar kept key (ties: the later kept
/// entry), its similarity and, for merge-into-nearest, its weight (grid:
/// victim tiles x kv-heads, one thread per victim).
template <int D>
__global__ void mergeTargets(const float *k, const float *v, int64_t kvStride,
                             const int32_t *kept, const int32_t *numKept,
                             const int32_t *victims, const int32_t *numVictims,
                             int64_t stride, MergeKind kind, MergeWeight rule,
                             MergeScratch m) {
  const int32_t h = blockIdx.y;
  const int32_t j = blockIdx.x * blockDim.x + threadIdx.x;
  if (j >= numVictims[h])
    return;
  const int32_t e = victims[h * stride + j];
  const float *key = k + e * kvStride + h * D;
  const double keyNorm = rowNormDouble<D>(key);
  int32_t best = -1;
  double bestSim = -__builtin_huge_val();
  for (int32_t t = 0; t < numKept[h]; ++t) {
    const float *other = k + kept[h * stride + t] * kvStride + h * D;
    double dot = 0.0;
    for (int c = 0; c < D; ++c)
      dot = __dadd_rn(dot, __dmul_rn(static_cast<double>(key[c]), other[c]));
    const double denom = __dmul_rn(keyNorm, m.keptNorms[h * stride + t]);
    const double sim = denom > 0.0 ? __ddiv_rn(dot, denom) : 0.0;
    if (best < 0 || sim >= bestSim) {
      best = t;
      bestSim = sim;
    }
  }
  m.targets[h * stride + j] = best;
  m.sims[h * stride + j] = bestSim;
  if (kind != MergeKind::Nearest)
    return;
  double w = 1.0;
  if (rule != MergeWeight::Uniform)
    w = fmax(bestSim, 0.0);
  if (rule == MergeWeight::SimNorm && best >= 0) {
    const double ne = rowNormDouble<D>(v + e * kvStride + h * D);
    const double nt =
        rowNormDouble<D>(v + kept[h * stride + best] * kvStride + h * D);
    const double sum = __dadd_rn(ne, nt);
    w = sum > 0.0 ? __ddiv_rn(__dmul_rn(w, ne), sum) : 0.0;
  }
  m.weights[h * stride + j] = w;
}

/// D2O's threshold tau = alpha * threshold + beta * mean_e s_e and the
/// weights exp(s_e) of the victims with s_e >= tau (0 for the others), one
/// block per kv-head; the mean is summed in victim order by one thread.
template <int kThreads>
__global__ void mergeD2OWeights(const int32_t *numVictims, int64_t stride,
                                double threshold, double alpha, double beta,
                                MergeScratch m) {
  const int32_t h = blockIdx.x;
  const int32_t count = numVictims[h];
  __shared__ double tau;
  if (threadIdx.x == 0) {
    double meanSim = 0.0;
    for (int32_t j = 0; j < count; ++j)
      meanSim = __dadd_rn(meanSim, __ddiv_rn(m.sims[h * stride + j], count));
    tau = __dadd_rn(__dmul_rn(alpha, threshold), __dmul_rn(beta, meanSim));
  }
  __syncthreads();
  for (int32_t j = threadIdx.x; j < count; j += kThreads) {
    const double s = m.sims[h * stride + j];
    m.weights[h * stride + j] =
        m.targets[h * stride + j] >= 0 && s >= tau ? exp(s) : 0.0;
  }
}

/// The merged rows of every kept entry, one warp per kept entry (grid:
/// kept tiles x kv-heads): the warp finds the victims that chose it, in
/// ascending order, and sums their weighted rows in double.
///  - Nearest: keys unchanged; v_t <- (v_t + sum w v_e) / (1 + sum w).
///  - D2O: k_t <- (e k_t + sum w k_e) / (e + sum w), likewise v_t, over
///    the victims with a weight; no victims at all leaves the rows as they
///    are.
template <int D, int kThreads>
__global__ void __launch_bounds__(kThreads)
    mergeRows(const float *k, const float *v, int64_t kvStride,
              int32_t kvHeads, const int32_t *kept, const int32_t *numKept,
              const int32_t *victims, const int32_t *numVictims,
              int64_t stride, MergeKind kind, MergeScratch m,
              float *mergedKeys, float *mergedValues) {
  static_assert(D % kWarpSize == 0, "head_dim must be a multiple of 32");
  constexpr int kPerLane = D / kWarpSize;
  const int32_t h = blockIdx.y;
  const int lane = threadIdx.x % kWarpSize;
  const int32_t t =
      blockIdx.x * (kThreads / kWarpSize) + threadIdx.x / kWarpSize;
  if (t >= numKept[h])
    return;
  const int32_t count = numVictims[h];
  const float *keptKey = k + kept[h * stride + t] * kvStride + h * D;
  const float *keptValue = v + kept[h * stride + t] * kvStride + h * D;
  float *outKey = mergedKeys + (static_cast<int64_t>(t) * kvHeads + h) * D;
  float *outValue = mergedValues + (static_cast<int64_t>(t) * kvHeads + h) * D;
  const bool d2o = kind == MergeKind::D2O;
  if (d2o && count == 0) {
    for (int c = lane; c < D; c += kWarpSize) {
      outKey[c] = keptKey[c];
      outValue[c] = keptValue[c];
    }
    return;
  }
  // std::exp(1.0), the weight of the kept entry itself in D2O.
  const double self = 2.718281828459045;
  double weight = d2o ? self : 0.0;
  double keySum[kPerLane], valueSum[kPerLane];
#pragma unroll
  for (int x = 0; x < kPerLane; ++x) {
    const int c = lane + x * kWarpSize;
    keySum[x] = d2o ? __dmul_rn(self, keptKey[c]) : 0.0;
    valueSum[x] = d2o ? __dmul_rn(self, keptValue[c]) : 0.0;
  }
  for (int32_t j0 = 0; j0 < count; j0 += kWarpSize) {
    const int32_t j = j0 + lane;
    const bool mine = j < count && m.targets[h * stride + j] == t &&
                      (!d2o || m.weights[h * stride + j] > 0.0);
    for (unsigned ballot = __ballot_sync(kFullMask, mine); ballot;
         ballot &= ballot - 1) {
      const int32_t jj = j0 + __ffs(ballot) - 1;
      const double w = m.weights[h * stride + jj];
      const int64_t row = victims[h * stride + jj] * kvStride + h * D;
      weight = __dadd_rn(weight, w);
#pragma unroll
      for (int x = 0; x < kPerLane; ++x) {
        const int c = lane + x * kWarpSize;
        if (d2o)
          keySum[x] = __dadd_rn(keySum[x], __dmul_rn(w, k[row + c]));
        valueSum[x] = __dadd_rn(valueSum[x], __dmul_rn(w, v[row + c]));
      }
    }
  }
#pragma unroll
  for (int x = 0; x < kPerLane; ++x) {
    const int c = lane + x * kWarpSize;
    if (d2o) {
      outKey[c] = __double2float_rn(__ddiv_rn(keySum[x], weight));
      outValue[c] = __double2float_rn(__ddiv_rn(valueSum[x], weight));
    } else {
      outKey[c] = keptKey[c];
      outValue[c] = __double2float_rn(
          __ddiv_rn(__dadd_rn(keptValue[c], valueSum[x]),
                    __dadd_rn(1.0, weight)));
    }
  }
}

/// CaM's window mean: the mean of attention[i] over the `observed` first
/// prompt entries, summed in order by one thread per kv-head (grid: kv
/// heads, kThreads threads of which one works); attention rows are
/// `stride` apart. A template so that the header defines it once per
/// translation unit without clashing at link time.
template <int kThreads>
__global__ void __launch_bounds__(kThreads)
    mergeCamMean(const float *attention, int64_t stride, int32_t observed,
                 double *means) {
  if (threadIdx.x != 0)
    return;
  const float *a = attention + blockIdx.x * stride;
  double mean = 0.0;
  for (int32_t i = 0; i < observed; ++i)
    mean = __dadd_rn(mean, __ddiv_rn(static_cast<double>(a[i]), observed));
  means[blockIdx.x] = mean;
}

/// CaM: each evicted value, times p_e / span with p_e = clamp(A_e / mean,
/// 0, 1), is added to the next `span` kept entries after it. Kept entry t
/// thus receives the victims e in [kept[t - span], kept[t]) (from 0 for
/// t < span), added in ascending order in float as kvc_cpu.h does; keys
/// are unchanged. One warp per kept entry (grid: kept tiles x kv-heads).
template <int D, int kThreads>
__global__ void __launch_bounds__(kThreads)
    mergeCamRows(const float *k, const float *v, int64_t kvStride,
                 int32_t kvHeads, const int32_t *kept, const int32_t *numKept,
                 const uint8_t *victim, const float *attention,
                 const double *means, int64_t stride, int32_t span,
                 float *mergedKeys, float *mergedValues) {
  constexpr int kPerLane = D / kWarpSize;
  const int32_t h = blockIdx.y;
  const int lane = threadIdx.x % kWarpSize;
  const int32_t t =
      blockIdx.x * (kThreads / kWarpSize) + threadIdx.x / kWarpSize;
  if (t >= numKept[h])
    return;
  const int32_t *list = kept + h * stride;
  const float *keptKey = k + list[t] * kvStride + h * D;
  const float *keptValue = v + list[t] * kvStride + h * D;
  float *outKey = mergedKeys + (static_cast<int64_t>(t) * kvHeads + h) * D;
  float *outValue = mergedValues + (static_cast<int64_t>(t) * kvHeads + h) * D;
  float value[kPerLane];
#pragma unroll
  for (int x = 0; x < kPerLane; ++x)
    value[x] = keptValue[lane + x * kWarpSize];
  const double mean = means[h];
  const int32_t lo = t >= span ? list[t - span] : 0;
  for (int32_t e = lo; e < list[t]; ++e) {
    if (!victim[h * stride + e])
      continue;
    const double ratio =
        mean > 0.0 ? __ddiv_rn(static_cast<double>(attention[h * stride + e]),
                               mean)
                   : 0.0;
    const double p = ratio < 0.0 ? 0.0 : (1.0 < ratio ? 1.0 : ratio);
    const float *row = v + e * kvStride + h * D;
#pragma unroll
    for (int x = 0; x < kPerLane; ++x)
      value[x] = __fadd_rn(
          value[x], __double2float_rn(__ddiv_rn(
                        __dmul_rn(p, row[lane + x * kWarpSize]), span)));
  }
#pragma unroll
  for (int x = 0; x < kPerLane; ++x) {
    const int c = lane + x * kWarpSize;
    outKey[c] = keptKey[c];
    outValue[c] = value[x];
  }
}

//===----------------------------------------------------------------------===//
// Host side: workspace carving and the staging of the runtime's tables
//===----------------------------------------------------------------------===//

/// Alignment of every workspace buffer.
constexpr uint64_t kWorkspaceAlignment = 256;

/// Bump allocator over a device workspace. With a null base it only
/// counts, so a workspace-size query and the entry point carve alike.
class Carver {
public:
  explicit Carver(void *base) : base_(static_cast<char *>(base)) {}
  template <typename T> T *take(int64_t count) {
    offset_ = (offset_ + kWorkspaceAlignment - 1) / kWorkspaceAlignment *
              kWorkspaceAlignment;
    T *p = base_ ? reinterpret_cast<T *>(base_ + offset_) : nullptr;
    offset_ += static_cast<uint64_t>(count > 0 ? count : 0) * sizeof(T);
    return p;
  }
  uint64_t bytes() const { return offset_; }

private:
  char *base_;
  uint64_t offset_ = 0;
};

/// Victims per head that a decode step downloads with the counts.
constexpr int32_t kInlineVictims = 8;

/// Victim lists a TableMirror holds, used by its steps in turn: the
/// runtime evicts a step's victims at the check-out of the step after next
/// (DeviceTables::checkOut), so a step never waits for the step just
/// before it.
constexpr int32_t kVictimBuffers = 2;

//===----------------------------------------------------------------------===//
// Device-resident slot tables (decode)
//===----------------------------------------------------------------------===//

/// One thread per word of a chunk that the step's first kernel does not
/// write (a template, like every kernel here, so that the policy libraries
/// linked into one program share it).
template <int kThreads>
__global__ void __launch_bounds__(kThreads)
    writeTableWords(const TableWord *words, int32_t n) {
  // A KIVI step's attention kernel may follow it (launchDependent).
  releaseDependents();
  writeTableWord(words, n, blockIdx.x * kThreads + threadIdx.x);
}

/// Threads per block of copyVictimRows.
constexpr int kCopyVictimThreads = 256;

/// The victim download of a decode step, one launch for the batch: word w
/// of head i's row (its victim count, then its first kInlineVictims
/// victims) goes from the device list HeadTable::victims to the pinned
/// host row HeadTable::hostVictims, one thread per word. The host reads
/// the rows after the step's event (applyVictims).
template <int kThreads>
__global__ void __launch_bounds__(kThreads)
    copyVictimRows(const HeadTable *tables, int32_t heads) {
  constexpr int kRow = 1 + kInlineVictims;
  const int64_t w = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x;
  if (w >= static_cast<int64_t>(heads) * kRow)
    return;
  const HeadTable &t = tables[w / kRow];
  if (t.victims && t.hostVictims)
    t.hostVictims[w % kRow] = t.victims[w % kRow];
}

/// The victim download of one head, by the block that listed its victims
/// in a decode step (every thread of the block calls it, after the list is
/// written): the count and the first kInlineVictims victims of t.victims go
/// to the pinned host row t.hostVictims, as copyVictimRows would copy
/// them, so the step needs no launch for its download.
template <int kThreads> __device__ void publishVictims(const HeadTable &t) {
  __syncthreads();
  if (!t.victims || !t.hostVictims)
    return;
  for (int w = threadIdx.x; w < 1 + kInlineVictims; w += kThreads)
    t.hostVictims[w] = t.victims[w];
}

/// A row of a KIVI head's residual window as decode reads it: the slot of
/// the entry it holds (-1: none) and that slot's word (HeadTable::kiviRows).
struct KiviWindowRow {
  int32_t slot, word;
  bool operator==(const KiviWindowRow &o) const {
    return slot == o.slot && word == o.word;
  }
};

/// The window row `r` of one KIVI head as the device tables hold it (its
/// slot, or -1 when the row is free or its entry was evicted; a row's word
/// is -1 once both parts of its entry are quantized, so that decode reads
/// the pages, else the row with kKiviKeyFull and kKiviValueFull for the
/// parts still in full precision), from the head's work record
/// (kvc_kivi_pending_work), which carries the slots' formats.
inline KiviWindowRow kiviWindowRow(const kvc_kivi_work_t &work, int32_t r) {
  const int32_t s = work.residual_slot[r];
  if (s < 0 || s >= work.num_slots)
    return KiviWindowRow{-1, -1};
  int32_t word = r;
  if (work.key_format[s] == KVC_FORMAT_FULL)
    word |= kKiviKeyFull;
  if (work.value_format[s] == KVC_FORMAT_FULL)
    word |= kKiviValueFull;
  return KiviWindowRow{s, word == r ? -1 : word};
}

/// Reads the residual window of one KIVI head into `rows` (R of them,
/// kiviWindowRow each), the address of its residual region and the serial
/// of its work record (kvc_kivi_work_t::serial) that the rows reflect.
inline kvc_status_t readKiviWindow(kvc_context_t *context, uint64_t sequence,
                                   int32_t layer, int32_t head,
                                   std::vector<KiviWindowRow> &rows,
                                   const uint8_t **residual, uint64_t *serial) {
  kvc_kivi_work_t work;
  KVC_CUDA_TRY(kvc_kivi_pending_work(context, sequence, layer, head, &work));
  *residual = static_cast<const uint8_t *>(work.residual);
  *serial = work.serial;
  try {
    rows.resize(static_cast<size_t>(work.residual_length));
  } catch (const std::bad_alloc &) {
    return kvc_report_error(KVC_STATUS_OUT_OF_MEMORY,
                            "kvc cuda: host table allocation failed");
  }
  for (int32_t r = 0; r < work.residual_length; ++r)
    rows[r] = kiviWindowRow(work, r);
  return KVC_STATUS_OK;
}

/// A CUDA event that the mirrors of a decode step's batch share: the step
/// records it once, after its last launch (DeviceTables::checkIn). The last
/// holder to let go of it (a mirror, a retired mirror of MirrorMemory, or a
/// pinned staging block whose copies it guards) gives the CUDA event back
/// to MirrorMemory for a later step.
struct StepEvent {
  cudaEvent_t event = nullptr;
  /// The device the event belongs to.
  int device = 0;
  /// The recorded work is known to be done (a wait returned), so the
  /// batch's other mirrors do not wait again.
  bool complete = false;
  /// The event of a planned step (a policy's decode_plan_batch) whose
  /// kernels are queued by its run, possibly from a CUDA graph, after the
  /// plan returns: the step's finish records it (finishPlannedSteps). Until
  /// then it stands for work not yet queued: nothing may wait for it, and
  /// what it guards is not free.
  bool unrecorded = false;
  StepEvent() = default;
  StepEvent(const StepEvent &) = delete;
  StepEvent &operator=(const StepEvent &) = delete;
  ~StepEvent();
};

/// Where the mirrors (TableMirror) get their memory and their steps their
/// events, so that sequences joining and leaving a decode batch make no
/// CUDA call that synchronizes once the first steps have run. cudaMalloc
/// and cudaMallocHost serialize the device's streams, and cudaFree and
/// cudaFreeHost wait for the device: in a serving engine, where a sequence
/// ends or starts at almost every step, each would stall the pipeline of
/// decode steps (the host would wait for the GPU inside a step).
///  - Device regions come from a memory pool of kvc's own per device
///    (cudaMemPoolCreate; its release threshold at the maximum, so freed
///    memory stays in the pool for the next mirror), allocated and freed in
///    stream order (cudaMallocFromPoolAsync, cudaFreeAsync) on the stream of
///    the step that needs them. A device without memory pools
///    (cudaDevAttrMemoryPoolsSupported) takes cudaMalloc and cudaFree.
///  - Pinned victim rows are cut from pinned chunks of kPinnedChunkBytes
///    (cudaMallocHost) and reused.
///  - Step events are reused.
/// A released mirror whose steps have finished (asked without waiting,
/// cudaEventQuery) frees its region at once, in stream order on the calling
/// thread's default stream, and leaves its rows for the next mirror; one
/// whose steps still run is retired with their events (releaseMirror), and
/// once they have finished a later step frees its region on that step's
/// stream and makes its rows reusable (collect), or a later release does
/// so on the default stream. When the last mirror is gone and nothing is
/// retired (every sequence removed or settled after its steps finished,
/// e.g. every context destroyed), the pinned chunks and the pools go too
/// (those calls synchronize, once); the events stay for later steps. One
/// instance per process, locked by the threads that step, never
/// destroyed.
class MirrorMemory {
public:
  /// Bytes of one pinned chunk: the victim rows of about 110 mirrors of
  /// 8 kv-heads.
  static constexpr uint64_t kPinnedChunkBytes = uint64_t{64} << 10;

  static MirrorMemory &instance() {
    static MirrorMemory *memory = new MirrorMemory;
    return *memory;
  }

  /// A device region of `bytes` on the current device (*device), queued on
  /// `stream`: usable by the work queued on it after this call.
  kvc_status_t allocateRegion(uint64_t bytes, cudaStream_t stream,
                              const char *name, char **region,
                              int32_t *device) {
    *region = nullptr;
    int current = 0;
    KVC_CUDA_CHECK(name, cudaGetDevice(&current));
    std::lock_guard<std::mutex> lock(mutex_);
    cudaMemPool_t pool = nullptr;
    KVC_CUDA_TRY(poolOf(current, name, &pool));
    // retire never allocates: the retired list has room for every live
    // region.
    try {
      retired_.reserve(retired_.size() + liveRegions_ + 1);
    } catch (const std::bad_alloc &) {
      return kvc_report_error(KVC_STATUS_OUT_OF_MEMORY,
                              "kvc cuda: host table allocation failed");
    }
    void *p = nullptr;
    if (pool)
      KVC_CUDA_CHECK(name, cudaMallocFromPoolAsync(&p, bytes, pool, stream));
    else
      KVC_CUDA_CHECK(name, cudaMalloc(&p, bytes));
    ++liveRegions_;
    *region = static_cast<char *>(p);
    *device = current;
    return KVC_STATUS_OK;
  }

  /// Pinned host rows of `bytes` (16-byte aligned), mapped into the
  /// devices' address space (unified addressing).
  kvc_status_t allocateRows(uint64_t bytes, const char *name,
                            int32_t **rows) {
    bytes = (bytes + 15) / 16 * 16;
    std::lock_guard<std::mutex> lock(mutex_);
    try {
      std::vector<int32_t *> &reusable = freeRows_[bytes];
      if (!reusable.empty()) {
        *rows = reusable.back();
        reusable.pop_back();
        return KVC_STATUS_OK;
      }
      // Room to give them back (collect) without allocating.
      reusable.reserve(++rowsOfSize_[bytes]);
    } catch (const std::bad_alloc &) {
      return kvc_report_error(KVC_STATUS_OUT_OF_MEMORY,
                              "kvc cuda: host table allocation failed");
    }
    if (bytes > chunkLeft_) {
      const uint64_t chunkBytes =
          bytes > kPinnedChunkBytes ? bytes : kPinnedChunkBytes;
      void *chunk = nullptr;
      try {
        chunks_.reserve(chunks_.size() + 1);
      } catch (const std::bad_alloc &) {
        return kvc_report_error(KVC_STATUS_OUT_OF_MEMORY,
                                "kvc cuda: host table allocation failed");
      }
      KVC_CUDA_CHECK(name, cudaMallocHost(&chunk, chunkBytes));
      chunks_.push_back(chunk);
      chunk_ = static_cast<char *>(chunk);
      chunkLeft_ = chunkBytes;
    }
    *rows = reinterpret_cast<int32_t *>(chunk_);
    chunk_ += bytes;
    chunkLeft_ -= bytes;
    return KVC_STATUS_OK;
  }

  /// A released mirror's `region` (on `device`) and `rows` (`rowBytes`, as
  /// allocated), either of them null, which the work recorded in `guards`
  /// (kVictimBuffers of them, null where a buffer was never used) may still
  /// use: freed or left for reuse now if that work has finished, else once
  /// it has (collect). A region whose work was never recorded must be idle
  /// (its stream synchronized). Never fails.
  void retire(char *region, int32_t device, int32_t *rows, uint64_t rowBytes,
              const std::shared_ptr<StepEvent> *guards) {
    if (!region && !rows)
      return;
    std::lock_guard<std::mutex> lock(mutex_);
    Retired r;
    r.region = region;
    r.device = device;
    r.rows = rows;
    r.rowBytes = (rowBytes + 15) / 16 * 16;
    for (int32_t k = 0; k < kVictimBuffers; ++k)
      r.guards[k] = guards[k];
    if (region)
      --liveRegions_;
    // A release callback reports nothing: a failed query or free leaves the
    // entry for a later step instead.
    const char *name = "kvc cuda: releasing device tables";
    bool done = false;
    int current = 0;
    if (cudaGetDevice(&current) == cudaSuccess &&
        (!region || device == current) &&
        finished(r, name, &done) != KVC_STATUS_OK)
      done = false;
    if (!done || release(r, current, cudaStreamPerThread, name) !=
                     KVC_STATUS_OK) {
      // allocateRegion reserved room for every live region; a mirror
      // without a region (its allocation failed) has no rows either.
      retired_.push_back(std::move(r));
      retiredCount_ = retired_.size();
      return;
    }
    // Mirrors retired earlier whose steps have finished since go too (the
    // last releases, e.g. a context destroyed, leave nothing behind for a
    // step that may never come).
    if (!retired_.empty() &&
        sweep(current, cudaStreamPerThread, name) != KVC_STATUS_OK)
      return;
    releaseIdle();
  }

  /// Frees on `stream` the retired regions of the current device whose
  /// steps have finished and makes their rows reusable. It asks each event
  /// without waiting; nothing to do (the usual step) costs a load.
  kvc_status_t collect(cudaStream_t stream, const char *name) {
    if (retiredCount_ == 0)
      return KVC_STATUS_OK;
    int current = 0;
    KVC_CUDA_CHECK(name, cudaGetDevice(&current));
    std::lock_guard<std::mutex> lock(mutex_);
    const kvc_status_t status = sweep(current, stream, name);
    if (status == KVC_STATUS_OK)
      releaseIdle();
    return status;
  }

  /// An event of the current device (*device) for a step to record.
  kvc_status_t takeEvent(const char *name, cudaEvent_t *event,
                         int *device) {
    KVC_CUDA_CHECK(name, cudaGetDevice(device));
    {
      std::lock_guard<std::mutex> lock(eventsMutex_);
      for (size_t i = events_.size(); i-- > 0;)
        if (events_[i].first == *device) {
          *event = events_[i].second;
          events_[i] = events_.back();
          events_.pop_back();
          return KVC_STATUS_OK;
        }
    }
    KVC_CUDA_CHECK(name,
                   cudaEventCreateWithFlags(event, cudaEventDisableTiming));
    return KVC_STATUS_OK;
  }

  /// An event no step records any more (~StepEvent).
  void recycleEvent(cudaEvent_t event, int device) {
    std::lock_guard<std::mutex> lock(eventsMutex_);
    try {
      events_.emplace_back(device, event);
    } catch (const std::bad_alloc &) {
      cudaEventDestroy(event);
    }
  }

private:
  MirrorMemory() = default;

  struct Retired {
    char *region = nullptr;
    int32_t device = 0;
    int32_t *rows = nullptr;
    uint64_t rowBytes = 0;
    std::shared_ptr<StepEvent> guards[kVictimBuffers];
  };

  /// kvc's memory pool on `device`, made on first use; null where the
  /// device has no memory pools.
  kvc_status_t poolOf(int device, const char *name, cudaMemPool_t *pool) {
    for (const std::pair<int, cudaMemPool_t> &p : pools_)
      if (p.first == device) {
        *pool = p.second;
        return KVC_STATUS_OK;
      }
    try {
      pools_.reserve(pools_.size() + 1);
    } catch (const std::bad_alloc &) {
      return kvc_report_error(KVC_STATUS_OUT_OF_MEMORY,
                              "kvc cuda: host table allocation failed");
    }
    int supported = 0;
    KVC_CUDA_CHECK(name, cudaDeviceGetAttribute(
                             &supported, cudaDevAttrMemoryPoolsSupported,
                             device));
    cudaMemPool_t created = nullptr;
    if (supported) {
      cudaMemPoolProps props;
      std::memset(&props, 0, sizeof props);
      props.allocType = cudaMemAllocationTypePinned;
      props.handleTypes = cudaMemHandleTypeNone;
      props.location.type = cudaMemLocationTypeDevice;
      props.location.id = device;
      KVC_CUDA_CHECK(name, cudaMemPoolCreate(&created, &props));
      uint64_t keep = ~uint64_t{0};
      const cudaError_t error = cudaMemPoolSetAttribute(
          created, cudaMemPoolAttrReleaseThreshold, &keep);
      if (error != cudaSuccess) {
        cudaMemPoolDestroy(created);
        return reportCudaError(name, error);
      }
    }
    pools_.emplace_back(device, created);
    *pool = created;
    return KVC_STATUS_OK;
  }

  /// Whether the work recorded in every guard of `r` has finished (*done),
  /// asked without waiting.
  static kvc_status_t finished(const Retired &r, const char *name,
                               bool *done) {
    *done = true;
    for (const std::shared_ptr<StepEvent> &guard : r.guards) {
      if (!guard)
        continue;
      if (guard->unrecorded) {
        *done = false;
        return KVC_STATUS_OK;
      }
      const cudaError_t status = cudaEventQuery(guard->event);
      if (status == cudaErrorNotReady) {
        // A status, not a failure: leave no error behind for the step's
        // launch checks.
        if (cudaPeekAtLastError() == cudaErrorNotReady)
          cudaGetLastError();
        *done = false;
        return KVC_STATUS_OK;
      }
      KVC_CUDA_CHECK(name, status);
    }
    return KVC_STATUS_OK;
  }

  /// Frees on `stream` the retired regions of the current device
  /// (`current`) whose steps have finished and makes their rows reusable;
  /// with the lock held.
  kvc_status_t sweep(int current, cudaStream_t stream, const char *name) {
    kvc_status_t status = KVC_STATUS_OK;
    for (size_t i = 0; i < retired_.size() && status == KVC_STATUS_OK;) {
      Retired &r = retired_[i];
      bool done = false;
      if (!r.region || r.device == current)
        status = finished(r, name, &done);
      if (status == KVC_STATUS_OK && done)
        status = release(r, current, stream, name);
      if (status != KVC_STATUS_OK || !done) {
        ++i;
        continue;
      }
      // The guards' events go back to the event list (~StepEvent).
      r = std::move(retired_.back());
      retired_.pop_back();
    }
    retiredCount_ = retired_.size();
    return status;
  }

  /// Frees the region of `r` (of the current device `current`, its work
  /// finished) in stream order on `stream` and leaves its rows for reuse.
  kvc_status_t release(Retired &r, int current, cudaStream_t stream,
                       const char *name) {
    if (r.region) {
      cudaMemPool_t pool = nullptr;
      KVC_CUDA_TRY(poolOf(current, name, &pool));
      KVC_CUDA_CHECK(name, pool ? cudaFreeAsync(r.region, stream)
                                : cudaFree(r.region));
      r.region = nullptr;
    }
    // allocateRows reserved the room.
    if (r.rows)
      freeRows_[r.rowBytes].push_back(r.rows);
    r.rows = nullptr;
    return KVC_STATUS_OK;
  }

  /// With no mirror left and nothing retired: frees the pinned chunks and
  /// destroys the pools (their memory was freed). Best effort: the process
  /// is done with them for now. The events kept for reuse stay (they hold
  /// no memory of the device or pinned memory, and the next step would
  /// make them again).
  void releaseIdle() {
    if (liveRegions_ != 0 || !retired_.empty() ||
        (chunks_.empty() && pools_.empty()))
      return;
    for (void *chunk : chunks_)
      cudaFreeHost(chunk);
    chunks_.clear();
    chunk_ = nullptr;
    chunkLeft_ = 0;
    freeRows_.clear();
    rowsOfSize_.clear();
    for (const std::pair<int, cudaMemPool_t> &p : pools_)
      if (p.second)
        cudaMemPoolDestroy(p.second);
    pools_.clear();
  }

  std::mutex mutex_;
  std::vector<std::pair<int, cudaMemPool_t>> pools_;
  std::vector<Retired> retired_;
  /// retired_.size(), read without the lock by collect's early return.
  std::atomic<size_t> retiredCount_{0};
  /// Regions allocated and not retired.
  size_t liveRegions_ = 0;
  /// Reusable pinned rows by size, and how many of each size exist.
  std::map<uint64_t, std::vector<int32_t *>> freeRows_;
  std::map<uint64_t, size_t> rowsOfSize_;
  /// Every pinned chunk, and the rest of the newest.
  std::vector<void *> chunks_;
  char *chunk_ = nullptr;
  uint64_t chunkLeft_ = 0;
  std::mutex eventsMutex_;
  std::vector<std::pair<int, cudaEvent_t>> events_;
};

inline StepEvent::~StepEvent() {
  if (event)
    MirrorMemory::instance().recycleEvent(event, device);
}

/// The device-resident copy of one (sequence, layer)'s slot tables: per
/// kv-head the page addresses (with kLowPageTag), the position of every
/// slot and, as the policy needs them, the score state, the importance
/// bits and a KIVI head's per-slot window words, each sized for `capPages`
/// pages. Between decode steps it is
/// attached to the context (kvc_attachment_t): the device then holds the
/// newest score state and importance bits, which flushMirror writes back
/// into the runtime's metadata when anything on the host reads or changes
/// that layer; positions and pages are the runtime's, which every step
/// changes on both sides alike (DeviceTables).
struct TableMirror {
  static constexpr uint64_t kMagic = 0x6b76632d7461626cull;
  uint64_t magic = kMagic;
  int32_t heads = 0, pageSize = 0, capPages = 0;
  bool withState = false, withHistory = false, withVictims = false;
  bool withKivi = false;
  /// The device copy was uploaded (a mirror whose build failed holds
  /// nothing to write back).
  bool loaded = false;
  /// Per victim buffer (kVictimBuffers of them, used by steps in turn): the
  /// step that used it left victims that the runtime has not evicted yet.
  /// Its kernels cleared them on the device, listed them in the buffer's
  /// device lists (victimsOf), and hostVictimsOf(buffer) receives their
  /// counts and first kInlineVictims slots per head (applyVictims).
  bool pending[kVictimBuffers] = {};
  /// The buffer the next step uses: the one of the step before the last.
  int32_t next = 0;
  /// The step in progress moved the mirror into a larger region
  /// (DeviceTables::grow): checkIn gives it the step's event for both
  /// buffers, since the copies that filled them are the step's.
  bool moved = false;
  /// The device region (MirrorMemory::allocateRegion) and its device.
  char *device = nullptr;
  int32_t deviceId = 0;
  uint64_t headBytes = 0;
  /// Pinned host memory, per buffer and head: the victim count and the
  /// first kInlineVictims victim slots (withVictims;
  /// MirrorMemory::allocateRows).
  int32_t *hostVictims = nullptr;
  /// Per buffer: recorded on the stream after the kernels and copies of the
  /// last step that used it, one event for every mirror of that step's
  /// batch (StepEvent; null before the first step).
  std::shared_ptr<StepEvent> done[kVictimBuffers];
  /// Per head: the page-table entries the device holds, as many as the
  /// runtime's page table has.
  std::vector<std::vector<uint64_t>> pages;
  /// (head, page) entries the next step compares with the runtime's page
  /// table: pages that the last step's evictions may have returned to the
  /// pool (a hole, 0), unless an append mapped them again since.
  std::vector<std::pair<int32_t, int32_t>> recheck;
  /// KIVI: per head, the residual window the device's words reflect, and
  /// the address of the head's residual region.
  std::vector<std::vector<KiviWindowRow>> window;
  std::vector<const uint8_t *> residual;
  /// KIVI: per head, the serial of the runtime's work record
  /// (kvc_kivi_work_t::serial) when `window` was last brought up to date.
  std::vector<uint64_t> windowSerial;

  static uint64_t align(uint64_t x) { return (x + 15) / 16 * 16; }
  /// Bytes of hostVictims.
  uint64_t hostVictimBytes() const {
    return sizeof(int32_t) * (1 + kInlineVictims) * kVictimBuffers * heads;
  }
  int64_t capSlots() const { return static_cast<int64_t>(capPages) * pageSize; }
  uint64_t positionsOffset() const { return align(8ull * capPages); }
  uint64_t stateOffset() const {
    return positionsOffset() + align(4ull * capSlots());
  }
  uint64_t historyOffset() const {
    return stateOffset() + (withState ? align(4ull * capSlots()) : 0);
  }
  uint64_t victimsOffset() const {
    return historyOffset() + (withHistory ? align(8ull * capSlots()) : 0);
  }
  /// Words of a head's victim list: the count, then room for every slot
  /// (and at least for the kInlineVictims that a step downloads).
  int64_t victimWords() const {
    return 1 + (capSlots() > kInlineVictims ? capSlots() : kInlineVictims);
  }
  uint64_t kiviRowsOffset() const {
    return victimsOffset() +
           (withVictims ? kVictimBuffers * align(4ull * victimWords()) : 0);
  }
  uint64_t regionBytes() const {
    return kiviRowsOffset() + (withKivi ? align(4ull * capSlots()) : 0);
  }
  char *head(int32_t h) const { return device + h * headBytes; }
  uint64_t *pagesOf(int32_t h) const {
    return reinterpret_cast<uint64_t *>(head(h));
  }
  int32_t *positionsOf(int32_t h) const {
    return reinterpret_cast<int32_t *>(head(h) + positionsOffset());
  }
  float *stateOf(int32_t h) const {
    return withState ? reinterpret_cast<float *>(head(h) + stateOffset())
                     : nullptr;
  }
  uint64_t *historyOf(int32_t h) const {
    return withHistory
               ? reinterpret_cast<uint64_t *>(head(h) + historyOffset())
               : nullptr;
  }
  /// Head h's victim list in `buffer` ([0]: the count), where the stages
  /// of a step that uses the buffer leave its victims (HeadTable::victims).
  int32_t *victimsOf(int32_t h, int32_t buffer) const {
    return withVictims
               ? reinterpret_cast<int32_t *>(head(h) + victimsOffset() +
                                             buffer *
                                                 align(4ull * victimWords()))
               : nullptr;
  }
  /// The pinned rows (count, first kInlineVictims slots) of `buffer`, one
  /// per head.
  int32_t *hostVictimsOf(int32_t buffer) const {
    return hostVictims + static_cast<int64_t>(buffer) * heads *
                             (1 + kInlineVictims);
  }
  /// The buffer of the step `age` uses before the next one (0: the last).
  int32_t bufferOf(int32_t age) const {
    return (next + kVictimBuffers - 1 - age) % kVictimBuffers;
  }
  /// KIVI: head h's per-slot window words (HeadTable::kiviRows).
  int32_t *kiviRowsOf(int32_t h) const {
    return withKivi ? reinterpret_cast<int32_t *>(head(h) + kiviRowsOffset())
                    : nullptr;
  }

  /// After the runtime evicted `slots` of head h: the page-table entries
  /// the eviction may have returned to the pool are compared with the
  /// runtime's at the next upload (recheck), and trailing holes leave the
  /// host shadow (an append that maps the entry again is written then).
  /// The runtime's table ends with a mapped page (it drops trailing holes
  /// as they appear), so it can only have shrunk when a victim was in its
  /// last page; only then is its length asked for.
  kvc_status_t noteEvicted(kvc_context_t *context, uint64_t sequence,
                           int32_t layer, int32_t h, int32_t count,
                           const int32_t *slots) {
    std::vector<uint64_t> &shadow = pages[h];
    int32_t numPages = static_cast<int32_t>(shadow.size());
    bool lastPage = false;
    for (int32_t k = 0; k < count && !lastPage; ++k)
      lastPage = slots[k] / pageSize >= numPages - 1;
    if (lastPage)
      KVC_CUDA_TRY(kvc_get_num_pages(context, sequence, layer, h, &numPages));
    try {
      if (static_cast<size_t>(numPages) < shadow.size())
        shadow.resize(numPages);
      for (int32_t k = 0; k < count; ++k) {
        const int32_t p = slots[k] / pageSize;
        if (p < numPages && shadow[p] != 0)
          recheck.emplace_back(h, p);
      }
    } catch (const std::bad_alloc &) {
      return kvc_report_error(KVC_STATUS_OUT_OF_MEMORY,
                              "kvc cuda: host table allocation failed");
    }
    return KVC_STATUS_OK;
  }
};

/// Pinned host memory that a decode step's host-to-device copies go
/// through, so that they are asynchronous. A cudaMemcpyAsync from pageable
/// memory may synchronize with the stream (the driver stages the bytes
/// through pinned memory of its own), which would make the host wait for
/// the GPU inside a step; from pinned memory it only queues the copy, which
/// reads the bytes later. So a block is reused once an event recorded
/// after its copies has finished (asked without waiting, oldest block
/// first); when none has, a new one is allocated (cudaMallocHost, which
/// synchronizes: the first steps, or a GPU further behind than ever
/// before). A decode step's blocks (its table image, a new mirror's image)
/// wait for the event the step records at its end anyway (`queuedInStep`,
/// then `guard` from DeviceTables::checkIn), so they cost no event record
/// of their own; other copies record the block's event (`queued`). Per
/// thread, like the steps it serves; freed when the thread ends.
class PinnedStaging {
public:
  PinnedStaging() = default;
  PinnedStaging(const PinnedStaging &) = delete;
  PinnedStaging &operator=(const PinnedStaging &) = delete;
  ~PinnedStaging() {
    for (Block &b : blocks_) {
      cudaFreeHost(b.data);
      cudaEventDestroy(b.event);
    }
  }

  /// A pinned block of at least `bytes` whose earlier copies have finished;
  /// the caller writes it, queues its copies from it and then calls
  /// `queued` on their stream.
  kvc_status_t take(size_t bytes, const char *name, char **data) {
    const size_t n = blocks_.size();
    for (size_t k = 0; k < n; ++k) {
      Block &b = blocks_[(next_ + k) % n];
      if (b.bytes < bytes || b.inStep)
        continue;
      const bool asked = b.guard ? !b.guard->complete : b.recorded;
      if (b.guard && b.guard->unrecorded)
        continue;
      if (asked) {
        const cudaError_t status =
            cudaEventQuery(b.guard ? b.guard->event : b.event);
        if (status == cudaErrorNotReady) {
          // A status, not a failure: leave no error behind.
          if (cudaPeekAtLastError() == cudaErrorNotReady)
            cudaGetLastError();
          continue;
        }
        KVC_CUDA_CHECK(name, status);
      }
      // The step's event goes back to the event list once its mirrors let
      // go of it too.
      b.guard.reset();
      b.recorded = false;
      taken_ = (next_ + k) % n;
      *data = b.data;
      return KVC_STATUS_OK;
    }
    try {
      blocks_.reserve(n + 1);
    } catch (const std::bad_alloc &) {
      return kvc_report_error(KVC_STATUS_OUT_OF_MEMORY,
                              "kvc cuda: host staging allocation failed");
    }
    Block b;
    b.bytes = kMinBlockBytes;
    while (b.bytes < bytes)
      b.bytes *= 2;
    void *p = nullptr;
    KVC_CUDA_CHECK(name, cudaMallocHost(&p, b.bytes));
    b.data = static_cast<char *>(p);
    const cudaError_t error =
        cudaEventCreateWithFlags(&b.event, cudaEventDisableTiming);
    if (error != cudaSuccess) {
      cudaFreeHost(p);
      return reportCudaError(name, error);
    }
    blocks_.push_back(b);
    taken_ = n;
    *data = b.data;
    return KVC_STATUS_OK;
  }

  /// The copies from the block `take` gave were queued on `stream`: it is
  /// reused once they have run.
  kvc_status_t queued(cudaStream_t stream, const char *name) {
    Block &b = blocks_[taken_];
    KVC_CUDA_CHECK(name, cudaEventRecord(b.event, stream));
    b.recorded = true;
    next_ = (taken_ + 1) % blocks_.size();
    return KVC_STATUS_OK;
  }

  /// The copies into the block `take` gave have been waited for (the host
  /// reads it now, ReadStreams): it is reusable at once.
  void waitedFor() { next_ = (taken_ + 1) % blocks_.size(); }

  /// The copies from the block `take` gave were queued by a decode step,
  /// which records an event on their stream after its launches: the block
  /// waits for that event (`guard`), or for its own (`queued(block, ...)`)
  /// if the step fails first, and is not taken before either. Returns the
  /// block.
  size_t queuedInStep() {
    blocks_[taken_].inStep = true;
    next_ = (taken_ + 1) % blocks_.size();
    return taken_;
  }

  /// The step that queued copies from `block` (queuedInStep) recorded
  /// `event` on their stream after them.
  void guard(size_t block, const std::shared_ptr<StepEvent> &event) {
    Block &b = blocks_[block];
    b.guard = event;
    b.recorded = false;
    b.inStep = false;
  }

  /// How many blocks the thread holds, and how many of them wait for a
  /// step's event that is not recorded yet (queuedInStep).
  size_t blocks() const { return blocks_.size(); }
  size_t blocksInStep() const {
    size_t n = 0;
    for (const Block &b : blocks_)
      n += b.inStep;
    return n;
  }

  /// How many blocks wait for `event`.
  long guarding(const std::shared_ptr<StepEvent> &event) const {
    long n = 0;
    for (const Block &b : blocks_)
      n += b.guard == event;
    return n;
  }

  /// The step that queued copies from `block` on `stream` (queuedInStep)
  /// ends without its event: the block's own is recorded instead. Never
  /// fails: where the record fails, the stream is waited for.
  void queued(size_t block, cudaStream_t stream) {
    Block &b = blocks_[block];
    b.guard.reset();
    b.recorded = cudaEventRecord(b.event, stream) == cudaSuccess;
    if (!b.recorded)
      cudaStreamSynchronize(stream);
    b.inStep = false;
  }

private:
  static constexpr size_t kMinBlockBytes = size_t{16} << 10;
  struct Block {
    char *data = nullptr;
    size_t bytes = 0;
    cudaEvent_t event = nullptr;
    /// `event` was recorded after the block's copies.
    bool recorded = false;
    /// The event of the decode step that copied from the block last.
    std::shared_ptr<StepEvent> guard;
    /// Copied from by a step that has not recorded its event yet.
    bool inStep = false;
  };
  std::vector<Block> blocks_;
  /// The block take gave last, and the one to ask first next time (the
  /// oldest).
  size_t taken_ = 0, next_ = 0;
};

inline PinnedStaging &pinnedStaging() {
  static thread_local PinnedStaging staging;
  return staging;
}

/// Waits for the work recorded in `event` (none: nothing to wait for), once
/// per record for all the mirrors that share it.
inline kvc_status_t waitFor(StepEvent *event, const char *name) {
  if (!event || event->complete)
    return KVC_STATUS_OK;
  if (event->unrecorded)
    return kvc_report_error(
        KVC_STATUS_INVALID_ARGUMENT,
        (std::string(name) +
         ": the layer's planned decode step was not finished (its "
         "decode_finish_batch records the step after its run)")
            .c_str());
  KVC_CUDA_CHECK(name, cudaEventSynchronize(event->event));
  event->complete = true;
  return KVC_STATUS_OK;
}

/// Streams of kvc's own, one per device and thread, created non-blocking,
/// on which the host reads device memory that it waits for: victim lists
/// longer than a host row (LongVictimLists) and a mirror's state written
/// back (flushMirror). A cudaMemcpy runs on the legacy default stream,
/// which waits for the work queued before it on every blocking stream of
/// the device: in an engine that queued the next layers' kernels before
/// this layer's step, the host would wait for all of them. A copy on a
/// non-blocking stream of its own waits for nothing else, and the bytes it
/// reads are ready (the event of the step that wrote them was waited for
/// first), so the host waits for the copy alone. Freed when the thread
/// ends.
class ReadStreams {
public:
  ReadStreams() = default;
  ReadStreams(const ReadStreams &) = delete;
  ReadStreams &operator=(const ReadStreams &) = delete;
  ~ReadStreams() {
    for (const std::pair<int, cudaStream_t> &s : streams_)
      cudaStreamDestroy(s.second);
  }

  /// The calling thread's stream on `device` (the one that holds the
  /// memory to read: a copy may be queued on a stream of a device other
  /// than the current one), made on first use.
  kvc_status_t of(int device, const char *name, cudaStream_t *stream) {
    for (const std::pair<int, cudaStream_t> &s : streams_)
      if (s.first == device) {
        *stream = s.second;
        return KVC_STATUS_OK;
      }
    try {
      streams_.reserve(streams_.size() + 1);
    } catch (const std::bad_alloc &) {
      return kvc_report_error(KVC_STATUS_OUT_OF_MEMORY,
                              "kvc cuda: host stream allocation failed");
    }
    int current = 0;
    KVC_CUDA_CHECK(name, cudaGetDevice(&current));
    if (current != device)
      KVC_CUDA_CHECK(name, cudaSetDevice(device));
    cudaStream_t created = nullptr;
    const cudaError_t error =
        cudaStreamCreateWithFlags(&created, cudaStreamNonBlocking);
    if (current != device)
      cudaSetDevice(current);
    KVC_CUDA_CHECK(name, error);
    streams_.emplace_back(device, created);
    *stream = created;
    return KVC_STATUS_OK;
  }

private:
  std::vector<std::pair<int, cudaStream_t>> streams_;
};

inline ReadStreams &readStreams() {
  static thread_local ReadStreams streams;
  return streams;
}

/// The victim lists of finished steps that are longer than a host row
/// holds (kInlineVictims: a periodic policy's compression, a budget that
/// shrank), read from the device for the runtime's evictions. The lists of
/// every mirror a check-out settles arrive together: one 2-D copy per
/// mirror buffer (a buffer's lists are a head's bytes apart), from the
/// first head with a long list to the last, as wide as the longest, into
/// one pinned staging block, on the thread's read stream (ReadStreams),
/// and one wait for all of them. A step that finds no long list makes no
/// CUDA call and allocates nothing here.
class LongVictimLists {
public:
  /// Notes the long lists of m's `buffer`, whose step has finished (its
  /// host rows hold the counts).
  kvc_status_t note(const TableMirror &m, int32_t buffer) {
    const int32_t *rows = m.hostVictimsOf(buffer);
    Read r{&m, buffer, -1, -1, 0, words_};
    for (int32_t h = 0; h < m.heads; ++h) {
      const int32_t count = rows[h * (1 + kInlineVictims)];
      if (count <= kInlineVictims)
        continue;
      if (r.first < 0)
        r.first = h;
      r.last = h;
      r.width = count > r.width ? count : r.width;
    }
    if (r.first < 0)
      return KVC_STATUS_OK;
    try {
      reads_.push_back(r);
    } catch (const std::bad_alloc &) {
      return kvc_report_error(KVC_STATUS_OUT_OF_MEMORY,
                              "kvc cuda: host victim allocation failed");
    }
    words_ += static_cast<uint64_t>(r.last - r.first + 1) * r.width;
    return KVC_STATUS_OK;
  }

  /// Reads every list noted (nothing when none was).
  kvc_status_t read(const char *name) {
    if (reads_.empty())
      return KVC_STATUS_OK;
    PinnedStaging &staging = pinnedStaging();
    char *block = nullptr;
    KVC_CUDA_TRY(staging.take(sizeof(int32_t) * words_, name, &block));
    // The mirrors of a batch live on the step's device: one stream and one
    // wait, unless a caller mixed devices (then a wait per change).
    cudaStream_t last = nullptr;
    for (const Read &r : reads_) {
      cudaStream_t stream = nullptr;
      KVC_CUDA_TRY(readStreams().of(r.mirror->deviceId, name, &stream));
      if (last && stream != last)
        KVC_CUDA_CHECK(name, cudaStreamSynchronize(last));
      last = stream;
      const size_t width = sizeof(int32_t) * static_cast<size_t>(r.width);
      KVC_CUDA_CHECK(name,
                     cudaMemcpy2DAsync(block + sizeof(int32_t) * r.offset,
                                       width,
                                       r.mirror->victimsOf(r.first, r.buffer) +
                                           1,
                                       r.mirror->headBytes, width,
                                       r.last - r.first + 1,
                                       cudaMemcpyDeviceToHost, stream));
    }
    KVC_CUDA_CHECK(name, cudaStreamSynchronize(last));
    staging.waitedFor();
    lists_ = reinterpret_cast<const int32_t *>(block);
    return KVC_STATUS_OK;
  }

  /// After read: head h's list in m's `buffer` (its count from the host
  /// row), or null where none was read.
  const int32_t *list(const TableMirror &m, int32_t buffer, int32_t h) const {
    if (!lists_)
      return nullptr;
    for (const Read &r : reads_)
      if (r.mirror == &m && r.buffer == buffer && h >= r.first && h <= r.last)
        return lists_ + r.offset + static_cast<uint64_t>(h - r.first) * r.width;
    return nullptr;
  }

private:
  struct Read {
    const TableMirror *mirror;
    int32_t buffer, first, last, width;
    /// Where its first head's list starts in the block, in words.
    uint64_t offset;
  };
  std::vector<Read> reads_;
  uint64_t words_ = 0;
  const int32_t *lists_ = nullptr;
};

/// Waits for the steps whose victims applyVictims(m, ..., keep) evicts and
/// notes their long lists in `lists`.
inline kvc_status_t awaitVictims(TableMirror &m, int32_t keep,
                                 LongVictimLists &lists, const char *name) {
  for (int32_t age = kVictimBuffers - 1; age >= keep; --age) {
    const int32_t buffer = m.bufferOf(age);
    if (!m.pending[buffer])
      continue;
    KVC_CUDA_TRY(waitFor(m.done[buffer].get(), name));
    KVC_CUDA_TRY(lists.note(m, buffer));
  }
  return KVC_STATUS_OK;
}

/// Evicts through the runtime the victims that the steps using the mirror
/// left on the device (TableMirror::pending), oldest first, once each step
/// is done, except those of the `keep` most recent steps: so the runtime's
/// host bookkeeping catches up with the device before the sequence's next
/// step (keep 1: all but the last step's victims; see
/// DeviceTables::checkOut) or any host access to the layer (keep 0). The
/// mirror must be detached (kvc_evict settles the layer). Lists longer
/// than kInlineVictims come from `lists`, which awaitVictims(m, keep) and
/// read filled (a check-out reads those of its batch together); without
/// it they are read here.
inline kvc_status_t applyVictims(TableMirror &m, kvc_context_t *context,
                                 uint64_t sequence, int32_t layer,
                                 int32_t keep = 0,
                                 const LongVictimLists *lists = nullptr) {
  const char *name = "kvc cuda: evicting a step's victims";
  LongVictimLists own;
  if (!lists) {
    KVC_CUDA_TRY(awaitVictims(m, keep, own, name));
    KVC_CUDA_TRY(own.read(name));
    lists = &own;
  }
  for (int32_t age = kVictimBuffers - 1; age >= keep; --age) {
    const int32_t buffer = m.bufferOf(age);
    if (!m.pending[buffer])
      continue;
    m.pending[buffer] = false;
    for (int32_t h = 0; h < m.heads; ++h) {
      const int32_t *row =
          m.hostVictimsOf(buffer) + h * (1 + kInlineVictims);
      const int32_t count = row[0];
      if (count <= 0)
        continue;
      const int32_t *slots =
          count > kInlineVictims ? lists->list(m, buffer, h) : row + 1;
      if (!slots)
        return kvc_report_error(KVC_STATUS_INTERNAL,
                                "kvc cuda: a long victim list was not read");
      KVC_CUDA_TRY(kvc_evict(context, sequence, layer, h, count, slots));
      KVC_CUDA_TRY(m.noteEvicted(context, sequence, layer, h, count, slots));
    }
  }
  return KVC_STATUS_OK;
}

/// kvc_attachment_t::release of a TableMirror: its memory is retired until
/// the steps that used it have finished (MirrorMemory), without waiting
/// for them.
inline void releaseMirror(void *data) {
  TableMirror *m = static_cast<TableMirror *>(data);
  MirrorMemory::instance().retire(m->device, m->deviceId, m->hostVictims,
                                  m->hostVictimBytes(), m->done);
  delete m;
}

/// kvc_attachment_t::flush of a TableMirror: waits for the steps that used
/// it, evicts every victim they left through the runtime (applyVictims)
/// and copies its score state and importance bits into the runtime's
/// metadata, on the thread's read stream (ReadStreams: the host waits for
/// these copies, not for work an engine queued after the steps), with one
/// wait for all of them.
inline kvc_status_t flushMirror(void *data, kvc_context_t *context,
                                uint64_t sequence, int32_t layer) {
  TableMirror &m = *static_cast<TableMirror *>(data);
  const char *name = "kvc cuda: writing device score state back";
  KVC_CUDA_TRY(applyVictims(m, context, sequence, layer));
  if (!m.loaded || (!m.withState && !m.withHistory))
    return KVC_STATUS_OK;
  KVC_CUDA_TRY(waitFor(m.done[m.bufferOf(0)].get(), name));
  cudaStream_t stream = nullptr;
  KVC_CUDA_TRY(readStreams().of(m.deviceId, name, &stream));
  for (int32_t h = 0; h < m.heads; ++h) {
    kvc_metadata_t meta;
    KVC_CUDA_TRY(kvc_get_metadata(context, sequence, layer, h, &meta));
    // Slots past the mirror's capacity were appended after it was last
    // used: the runtime's fresh metadata is already right for them.
    const int64_t n = meta.num_slots < m.capSlots() ? meta.num_slots
                                                    : m.capSlots();
    if (m.withState)
      KVC_CUDA_CHECK(name, cudaMemcpyAsync(meta.score, m.stateOf(h), 4 * n,
                                           cudaMemcpyDeviceToHost, stream));
    if (m.withHistory)
      KVC_CUDA_CHECK(name,
                     cudaMemcpyAsync(meta.history, m.historyOf(h), 8 * n,
                                     cudaMemcpyDeviceToHost, stream));
  }
  KVC_CUDA_CHECK(name, cudaStreamSynchronize(stream));
  return KVC_STATUS_OK;
}

/// Table words per head that DeviceTables::upload has room for besides one
/// head's worth of `slots` (deviceTableBytes): a step's appended slot
/// writes at most three (position, state, importance bits) and a new page
/// one.
constexpr int64_t kTableWordsPerHead = 16;

/// Workspace bytes of DeviceTables::upload for `heads` heads of at most
/// `slots` slots: the HeadTables, their arrival counters, the step's item
/// counter and kTableWordsPerHead words per head plus
/// `slots` more (the pages that a long eviction released), plus, for KIVI
/// storage with a window of `residual` rows, that many per head (a step
/// whose block of keys leaves the window changes a word per member). It
/// does not grow with the batch's slots: a step whose words exceed it
/// uploads them in chunks.
inline uint64_t deviceTableBytes(int32_t heads, int64_t slots,
                                 int32_t residual = 0) {
  return TableMirror::align(sizeof(HeadTable) * static_cast<uint64_t>(heads)) +
         TableMirror::align(sizeof(int32_t) *
                            (static_cast<uint64_t>(heads) + 1)) +
         sizeof(TableWord) *
             (static_cast<uint64_t>(heads) *
                  (kTableWordsPerHead + static_cast<uint64_t>(residual)) +
              static_cast<uint64_t>(slots)) +
         kWorkspaceAlignment;
}

/// DeviceTables::upload's host buffers, kept per thread between steps (a
/// DeviceTables lives for one step), so that a step of a batch size that
/// stepped before allocates nothing for them.
struct UploadScratch {
  std::vector<HeadTable> headTables;
  std::vector<TableWord> words;
};

inline UploadScratch &uploadScratch() {
  static thread_local UploadScratch scratch;
  return scratch;
}

/// The events of planned decode steps (DeviceTables::checkIn with
/// `recordLater`: a policy's decode_plan_batch) that no finish has recorded
/// yet, with their context and layer. Per thread, as the pinned staging:
/// a step is planned and finished on one thread.
struct PlannedStep {
  const kvc_context_t *context;
  int32_t layer;
  std::shared_ptr<StepEvent> event;
  /// What the plan was made for (notePlannedRun; batch 0 until then).
  int32_t batch = 0, capacity = 0;
  const void *workspace = nullptr;
};
inline std::vector<PlannedStep> &plannedSteps() {
  static thread_local std::vector<PlannedStep> steps;
  return steps;
}

/// A policy's decode_plan_batch, after its check-in: the batch, capacity
/// and workspace of the run it planned (checkPlannedRun).
inline kvc_status_t notePlannedRun(const kvc_context_t *context,
                                   int32_t layer, int32_t batch,
                                   int32_t capacity, const void *workspace,
                                   const char *name) {
  std::vector<PlannedStep> &steps = plannedSteps();
  for (auto it = steps.rbegin(); it != steps.rend(); ++it)
    if (it->context == context && it->layer == layer) {
      it->batch = batch;
      it->capacity = capacity;
      it->workspace = workspace;
      return KVC_STATUS_OK;
    }
  return kvc_report_error(KVC_STATUS_INTERNAL,
                          (std::string(name) +
                           ": no planned decode step to note its run in")
                              .c_str());
}

/// A policy's decode_run_batch, before its launches: where this thread
/// planned a step of (context, layer) that is not finished, the run must
/// be the one planned (the same batch, capacity and workspace), or its
/// kernels would read tables laid out for another. Without such a step
/// (a run captured before any plan, or on another thread) nothing can be
/// compared, and the run is the caller's contract. A CUDA graph's replay
/// runs no host code, so this checks the captured call only.
inline kvc_status_t checkPlannedRun(const kvc_context_t *context,
                                    int32_t layer, int32_t batch,
                                    int32_t capacity, const void *workspace,
                                    const char *name) {
  for (const PlannedStep &step : plannedSteps())
    if (step.context == context && step.layer == layer && step.batch > 0 &&
        (step.batch != batch || step.capacity != capacity ||
         step.workspace != workspace))
      return kvc_report_error(
          KVC_STATUS_INVALID_ARGUMENT,
          (std::string(name) + ": the run differs from layer " +
           std::to_string(layer) + "'s planned step (batch " +
           std::to_string(step.batch) + ", capacity " +
           std::to_string(step.capacity) +
           ", its workspace): run what the plan planned")
              .c_str());
  return KVC_STATUS_OK;
}

/// A policy's decode_finish_batch: records on `stream`, after the run's
/// kernels that the caller queued there (directly or as a CUDA graph), the
/// event of every step planned on (context, layer) and not finished yet.
/// From then on the runtime may wait for those steps as for any decode
/// step's. A finish with no such step is refused.
inline kvc_status_t finishPlannedSteps(const kvc_context_t *context,
                                       int32_t layer, cudaStream_t stream,
                                       const char *name) {
  std::vector<PlannedStep> &steps = plannedSteps();
  bool found = false;
  for (size_t i = 0; i < steps.size();) {
    if (steps[i].context != context || steps[i].layer != layer) {
      ++i;
      continue;
    }
    StepEvent &event = *steps[i].event;
    KVC_CUDA_CHECK(name, cudaEventRecord(event.event, stream));
    event.unrecorded = false;
    event.complete = false;
    steps.erase(steps.begin() + static_cast<std::ptrdiff_t>(i));
    found = true;
  }
  if (!found)
    return kvc_report_error(
        KVC_STATUS_INVALID_ARGUMENT,
        (std::string(name) + ": no planned decode step of layer " +
         std::to_string(layer) + " to finish (decode_plan_batch first)")
            .c_str());
  return KVC_STATUS_OK;
}

/// Whether a step that used `m` was planned and not finished yet.
inline bool awaitsFinish(const TableMirror &m) {
  for (const std::shared_ptr<StepEvent> &event : m.done)
    if (event && event->unrecorded)
      return true;
  return false;
}

/// The slot tables of a decode step's batch, kept on the device between
/// steps (one TableMirror per sequence of the batch, attached to the
/// context). A step checks the mirrors out (kvc_detach; the runtime then
/// evicts the victims that the step before the last left, applyVictims)
/// before the runtime's appends, writes only what changed into them
/// (upload: the appended slots, new pages, pages that eviction released),
/// lets its kernels update the score state in place, mirror their
/// evictions (clearEvicted) and leave the victim lists in the mirror's
/// victim buffer of the step, queues the download of those lists
/// (keepVictims) and checks the mirrors back in.
/// The runtime thus lags the device by up to two steps' evictions (the
/// last step's victims stay live in its bookkeeping through the next
/// step's append), and a step waits only for the step before the last,
/// whose work the GPU finished while it ran the last one: the host
/// prepares a step while the GPU runs the one before. A KIVI pool lags by
/// one step only: its appends quantize blocks of keys whose scales the
/// live members set, so every victim must be gone before the next append
/// (each step waits for the last one).
/// For KIVI storage the mirror also holds each slot's window word
/// (HeadTable::kiviRows); a step compares each head's residual window with
/// the one the device reflects and writes the words of the slots whose
/// rows changed (the entry that entered, the value that left, a block of
/// keys that left, window entries evicted).
/// So a step moves a few words per head over the host link instead of
/// every slot's position and state, downloads no state, and never waits
/// for its own kernels. A mirror is built from the
/// runtime's metadata (one upload of every table) when a sequence has none,
/// when something on the host touched the layer since (the runtime settled
/// and released it). A page table that outgrew its mirror has the mirror
/// moved, on the device, into a region with room for a quarter more pages
/// (grow): nothing is written back or waited for.
/// What writes the table words of a step's upload (DeviceTables::upload).
enum class WordsBy {
  /// The upload: one writeTableWords launch per chunk of words.
  Upload,
  /// The step's launch that stores its new rows (storeAppended through
  /// launchAppendStores, or a KIVI step's kiviStageRows through
  /// KiviWorkPlan::launch) writes the last chunk, whose address and count
  /// it takes from DeviceTables::takeDeferredWords.
  Stores,
  /// A planned run's storeAppended (launchPlannedStores) writes the last
  /// chunk: the upload puts a header word holding the chunk's count
  /// (TableWord::address) before it, at DeviceTables::plannedWords, a
  /// place that depends on the batch alone, and the run reads the count
  /// on the device. Earlier chunks, where a step's words outgrow the
  /// region, go through writeTableWords as under Upload.
  PlannedStores,
};

class DeviceTables {
public:
  DeviceTables() = default;
  DeviceTables(const DeviceTables &) = delete;
  DeviceTables &operator=(const DeviceTables &) = delete;
  /// Mirrors a failed step did not check in are written back (best effort)
  /// and released: the runtime's metadata stays the authority. The step's
  /// appends (upload's newSlots) are taken back first, head by head of
  /// every sequence not checked in (kvc_evict of the slot each got, which
  /// also gives back a page that the append opened), so that the batch's
  /// sequences hold what they held before the call and the engine can call
  /// the step again; not on a KIVI pool, whose appends also moved the
  /// residual windows (and may have quantized a block of keys). The step's
  /// error message (kvc_last_error) outlives the runtime calls this makes.
  ~DeviceTables() {
    if (!staged_.empty()) {
      PinnedStaging &staging = pinnedStaging();
      for (size_t block : staged_)
        staging.queued(block, stream_);
    }
    bool failed = !grown_.empty();
    for (TableMirror *m : mirrors_)
      failed = failed || m != nullptr;
    for (int32_t slot : appended_)
      failed = failed || slot >= 0;
    if (!failed)
      return;
    char message[512];
    std::snprintf(message, sizeof(message), "%s", kvc_last_error());
    // The regions that mirrors moved out of: their contents live on in the
    // new ones; once the copies ran they go.
    if (!grown_.empty() && uploaded_)
      cudaStreamSynchronize(stream_);
    for (TableMirror *old : grown_)
      releaseMirror(old);
    grown_.clear();
    for (size_t i = 0; i < appended_.size(); ++i)
      if (appended_[i] >= 0)
        kvc_evict(context_, sequences_[i / heads_], layer_,
                  static_cast<int32_t>(i % heads_), 1, &appended_[i]);
    for (size_t b = 0; b < mirrors_.size(); ++b) {
      if (!mirrors_[b])
        continue;
      // What upload queued (a new mirror's image among it) lands first; the
      // flush reads the state on a stream of its own. A null stream_ is
      // the legacy stream.
      if (uploaded_)
        cudaStreamSynchronize(stream_);
      flushMirror(mirrors_[b], context_, sequences_[b], layer_);
      releaseMirror(mirrors_[b]);
    }
    kvc_report_error(KVC_STATUS_OK, message);
  }

  /// Takes the mirrors of the batch's sequences off the context, before the
  /// step changes the runtime's bookkeeping. A mirror with more than the
  /// step needs is kept (an unfused pipeline's attention kernel reads the
  /// one its scoring kernel keeps with score state); a record of another
  /// kind, or a mirror without the state the step needs, is settled
  /// (flushed and released) instead.
  kvc_status_t checkOut(kvc_context_t *context, int32_t batch,
                        const uint64_t *sequences, int32_t layer,
                        int32_t heads, bool withState, bool withHistory,
                        bool withVictims, const char *name,
                        bool withKivi = false) {
    context_ = context;
    sequences_ = sequences;
    batch_ = batch;
    layer_ = layer;
    heads_ = heads;
    withState_ = withState;
    withHistory_ = withHistory;
    withVictims_ = withVictims;
    withKivi_ = withKivi;
    name_ = name;
    kvc_config_t config;
    KVC_CUDA_TRY(kvc_context_config(context, &config));
    pageSize_ = config.page_size;
    mixed_ = config.low_format != KVC_FORMAT_FULL;
    lowFormat_ = config.low_format;
    const bool kivi = config.format == KVC_FORMAT_KIVI_INT2 ||
                      config.format == KVC_FORMAT_KIVI_INT4;
    kiviPool_ = kivi;
    try {
      mirrors_.assign(batch, nullptr);
      // upload fills it after the appends without allocating.
      appended_.clear();
      appended_.reserve(static_cast<size_t>(batch) * heads);
    } catch (const std::bad_alloc &) {
      return kvc_report_error(KVC_STATUS_OUT_OF_MEMORY,
                              "kvc cuda: host table allocation failed");
    }
    // The runtime catches up with the evictions of every step but the last
    // (of every step on a KIVI pool): the mirrors' steps are waited for
    // first and their long victim lists read together.
    const int32_t keep = kivi ? 0 : 1;
    LongVictimLists lists;
    for (int32_t b = 0; b < batch; ++b) {
      kvc_attachment_t a{};
      KVC_CUDA_TRY(kvc_detach(context, sequences[b], layer, &a));
      TableMirror *m = static_cast<TableMirror *>(a.data);
      if (a.release == &releaseMirror && m && m->magic == TableMirror::kMagic &&
          awaitsFinish(*m)) {
        // Put back as it was: its last step was planned and not finished,
        // so its kernels may not even be queued yet.
        KVC_CUDA_TRY(kvc_attach(context, sequences[b], layer, &a));
        return kvc_report_error(
            KVC_STATUS_INVALID_ARGUMENT,
            (std::string(name) + ": sequence " +
             std::to_string(sequences[b]) + " layer " +
             std::to_string(layer) +
             " has a planned decode step that was not finished "
             "(decode_finish_batch)")
                .c_str());
      }
      if (a.release == &releaseMirror && m && m->magic == TableMirror::kMagic &&
          m->heads == heads && m->pageSize == pageSize_ &&
          (m->withState || !withState) && (m->withHistory || !withHistory) &&
          (m->withVictims || !withVictims) && (m->withKivi || !withKivi)) {
        // Settled by the destructor if anything fails from here on.
        mirrors_[b] = m;
        KVC_CUDA_TRY(awaitVictims(*m, keep, lists, name));
        continue;
      }
      kvc_status_t status =
          a.flush ? a.flush(a.data, context, sequences[b], layer)
                  : KVC_STATUS_OK;
      if (a.release)
        a.release(a.data);
      KVC_CUDA_TRY(status);
    }
    KVC_CUDA_TRY(lists.read(name));
    // A mirror the runtime could not catch up with is written back and
    // dropped.
    for (int32_t b = 0; b < batch; ++b) {
      TableMirror *m = mirrors_[b];
      if (!m)
        continue;
      const kvc_status_t status =
          applyVictims(*m, context, sequences[b], layer, keep, &lists);
      if (status != KVC_STATUS_OK) {
        mirrors_[b] = nullptr;
        flushMirror(m, context, sequences[b], layer);
        releaseMirror(m);
        return status;
      }
    }
    return KVC_STATUS_OK;
  }

  /// After the step's appends (newSlots[i]: the slot the runtime gave head
  /// i of the batch, at queryPositions[i / heads], and numPages[i] the
  /// head's page-table length after it, as kvc_append_step reports them;
  /// both null when the step appends nothing, numPages null to ask the
  /// runtime): brings every mirror up to date, builds the missing
  /// ones, and uploads the HeadTable of every head of the batch into
  /// `region` (`capacity` bytes of device workspace) on `stream`; *out
  /// receives that array. `sameEntries`: a layer-wide policy, whose heads
  /// of a sequence must hold the same entries (checked). `kiviWork`: for
  /// KIVI tables, the work record of every head of the batch as read after
  /// the appends (KiviWorkPlan::records; null to ask the runtime per head).
  /// `wordsBy`: what writes the words (WordsBy).
  kvc_status_t upload(const int32_t *queryPositions, const int32_t *newSlots,
                      const int32_t *numPages, bool sameEntries, void *region,
                      uint64_t capacity, cudaStream_t stream,
                      const HeadTable **out,
                      const kvc_kivi_work_t *kiviWork = nullptr,
                      WordsBy wordsBy = WordsBy::Upload) {
    stream_ = stream;
    uploaded_ = true;
    // What the destructor takes back if the step fails from here on (room
    // reserved by checkOut).
    if (newSlots && !kiviPool_)
      appended_.assign(newSlots,
                       newSlots + static_cast<size_t>(batch_) * heads_);
    // Memory of released mirrors whose steps have finished goes back to
    // the pool before this step builds any.
    KVC_CUDA_TRY(MirrorMemory::instance().collect(stream, name_));
    const int32_t tables = batch_ * heads_;
    // The region: the HeadTables, their arrival counters, the words.
    const uint64_t countersOffset =
        TableMirror::align(sizeof(HeadTable) * tables);
    const uint64_t tableBytes = tableImageBytes(tables);
    UploadScratch &scratch = uploadScratch();
    std::vector<HeadTable> &headTables = scratch.headTables;
    std::vector<TableWord> &words = scratch.words;
    words.clear();
    try {
      headTables.resize(tables);
      maxSlots_ = 0;
      for (int32_t b = 0; b < batch_; ++b) {
        const int32_t *slots = newSlots ? newSlots + b * heads_ : nullptr;
        if (sameEntries && slots)
          for (int32_t h = 1; h < heads_; ++h)
            if (slots[h] != slots[0])
              return kvc_report_error(
                  KVC_STATUS_INTERNAL,
                  (std::string(name_) +
                   ": the heads of a layer-wide policy hold different "
                   "entries")
                      .c_str());
        KVC_CUDA_TRY(refresh(b, queryPositions[b], slots,
                             numPages ? numPages + b * heads_ : nullptr,
                             sameEntries,
                             kiviWork ? kiviWork + b * heads_ : nullptr,
                             words));
        const TableMirror &m = *mirrors_[b];
        for (int32_t h = 0; h < heads_; ++h) {
          const int32_t i = b * heads_ + h;
          HeadTable &t = headTables[i];
          t.pages = m.pagesOf(h);
          t.positions = m.positionsOf(h);
          t.state = m.stateOf(h);
          t.history = m.historyOf(h);
          t.numPages = static_cast<int32_t>(m.pages[h].size());
          t.numSlots = t.numPages * pageSize_;
          t.queryPosition = queryPositions[b];
          t.victims = m.victimsOf(h, m.next);
          t.hostVictims = m.withVictims ? m.hostVictimsOf(m.next) +
                                              h * (1 + kInlineVictims)
                                        : nullptr;
          t.kiviRows = m.kiviRowsOf(h);
          t.kiviResidual = m.withKivi ? m.residual[h] : nullptr;
          t.appendSlot = slots ? slots[h] : -1;
          if (t.appendSlot >= t.numSlots)
            return kvc_report_error(
                KVC_STATUS_INTERNAL,
                (std::string(name_) +
                 ": an appended slot lies past its head's page table")
                    .c_str());
          t.appendPage =
              t.appendSlot >= 0
                  ? m.pages[h][t.appendSlot / pageSize_] & ~kLowPageTag
                  : 0;
          t.arrivals = reinterpret_cast<int32_t *>(
                           static_cast<char *>(region) + countersOffset) +
                       i;
          maxSlots_ = maxSlots_ > t.numSlots ? maxSlots_ : t.numSlots;
        }
      }
    } catch (const std::bad_alloc &) {
      return kvc_report_error(KVC_STATUS_OUT_OF_MEMORY,
                              "kvc cuda: host table allocation failed");
    }
    // One copy of the HeadTables, their zeroed arrival counters and the
    // words (in chunks when a step released more pages than the region
    // holds words), one launch per chunk but the last, whose words
    // storeAppended may write. A planned run's chunks start with a header
    // word, their count.
    const size_t header = wordsBy == WordsBy::PlannedStores ? 1 : 0;
    if (capacity < tableBytes + sizeof(TableWord) * (header + 1))
      return kvc_report_error(KVC_STATUS_BUFFER_TOO_SMALL,
                              (std::string(name_) +
                               ": workspace too small for the slot tables")
                                  .c_str());
    const size_t perChunk =
        (capacity - tableBytes) / sizeof(TableWord) - header;
    char *device = static_cast<char *>(region);
    size_t done = 0;
    PinnedStaging &staging = pinnedStaging();
    do {
      const size_t n =
          words.size() - done < perChunk ? words.size() - done : perChunk;
      // The image is written straight into pinned memory, whose copy only
      // queues (PinnedStaging).
      const size_t bytes = tableBytes + sizeof(TableWord) * (header + n);
      char *image = nullptr;
      KVC_CUDA_TRY(staging.take(bytes, name_, &image));
      std::memcpy(image, headTables.data(), sizeof(HeadTable) * tables);
      std::memset(image + sizeof(HeadTable) * tables, 0,
                  tableBytes - sizeof(HeadTable) * tables);
      if (header) {
        const TableWord count{static_cast<uint64_t>(n), 0};
        std::memcpy(image + tableBytes, &count, sizeof(TableWord));
      }
      if (n)
        std::memcpy(image + tableBytes + sizeof(TableWord) * header,
                    words.data() + done, sizeof(TableWord) * n);
      KVC_CUDA_CHECK(name_, cudaMemcpyAsync(device, image, bytes,
                                            cudaMemcpyHostToDevice, stream));
      staged(staging);
      const TableWord *chunk =
          reinterpret_cast<const TableWord *>(device + tableBytes) + header;
      done += n;
      if (wordsBy == WordsBy::PlannedStores && done == words.size()) {
        // The run's storeAppended reads them (launchPlannedStores).
      } else if (wordsBy == WordsBy::Stores && done == words.size()) {
        deferredWords_ = chunk;
        numDeferredWords_ = static_cast<int32_t>(n);
        wordsDeferred_ = true;
      } else if (n) {
        writeTableWords<256><<<static_cast<unsigned>((n + 255) / 256), 256,
                               0, stream>>>(chunk, static_cast<int32_t>(n));
      }
    } while (done < words.size());
    *out = reinterpret_cast<const HeadTable *>(region);
    deviceTables_ = *out;
    return KVC_STATUS_OK;
  }

  /// Queues on the step's stream, after its kernels, the download of the
  /// victim counts and first kInlineVictims victims that the stages left in
  /// the step's victim buffer of sequence b's mirror (for a periodic
  /// policy: only a sequence whose stages selected in this step). The
  /// runtime evicts them at the check-out of the step after next (the next
  /// one on a KIVI pool) or when the mirror is settled (applyVictims): the
  /// step itself does not wait for them.
  kvc_status_t keepVictims(int32_t b) {
    TableMirror &m = *mirrors_[b];
    if (!m.withVictims)
      return kvc_report_error(KVC_STATUS_INTERNAL,
                              (std::string(name_) +
                               ": victims kept in tables without a victim "
                               "list")
                                  .c_str());
    m.pending[m.next] = true;
    downloadVictims_ = true;
    return KVC_STATUS_OK;
  }

  /// Bytes of the HeadTables, their arrival counters and the step's item
  /// counter (stepItems) of `tables` heads at the start of upload's region,
  /// where its words begin.
  static uint64_t tableImageBytes(int32_t tables) {
    return TableMirror::align(sizeof(HeadTable) * tables) +
           TableMirror::align(sizeof(int32_t) * (tables + 1));
  }

  /// The step's item counter (GridFold::items) when upload's region (its
  /// HeadTables) is at `tables` for a batch of `heads` heads: the word
  /// after the heads' arrival counters, zeroed with them by every upload.
  static int32_t *stepItems(const HeadTable *tables, int32_t heads) {
    return reinterpret_cast<int32_t *>(
               const_cast<char *>(reinterpret_cast<const char *>(tables)) +
               TableMirror::align(sizeof(HeadTable) * heads)) +
           heads;
  }

  /// The header word of a planned step's last chunk of words
  /// (WordsBy::PlannedStores) when upload's region (its HeadTables) is at
  /// `tables` for a batch of `heads` heads: the same place at every step
  /// of that batch.
  static const TableWord *plannedWords(const HeadTable *tables,
                                       int32_t heads) {
    return reinterpret_cast<const TableWord *>(
        reinterpret_cast<const char *>(tables) + tableImageBytes(heads));
  }

  /// The table words that upload left to the step's storeAppended launch
  /// (WordsBy::Stores), once: *words and *n receive them (n may be 0).
  kvc_status_t takeDeferredWords(const TableWord **words, int32_t *n) {
    if (!wordsDeferred_)
      return kvc_report_error(KVC_STATUS_INTERNAL,
                              (std::string(name_) +
                               ": no table words were left to the stores")
                                  .c_str());
    *words = deferredWords_;
    *n = numDeferredWords_;
    wordsDeferred_ = false;
    return KVC_STATUS_OK;
  }

  /// Attaches the mirrors to the context again, after the step's last
  /// kernel was queued on `stream`; the next step uses the other victim
  /// buffer. When a sequence kept its victims and the stages did not
  /// publish them (`victimsPublished`: the kernel that lists a head's
  /// victims also writes its pinned host row, publishVictims), one
  /// copyVictimRows launch first downloads the victim rows of every head
  /// of the batch (those of the sequences that did not keep theirs are
  /// never read). `recordLater`: a planned step (decode_plan_batch), whose
  /// run queues its kernels after this returns; the step's event is left
  /// to its finish (finishPlannedSteps), and such a step must queue
  /// nothing here.
  kvc_status_t checkIn(bool victimsPublished = false,
                       bool recordLater = false) {
    if (recordLater && downloadVictims_ && !victimsPublished)
      return kvc_report_error(KVC_STATUS_INTERNAL,
                              (std::string(name_) +
                               ": a planned step cannot download victims "
                               "before its run")
                                  .c_str());
    if (wordsDeferred_)
      return kvc_report_error(KVC_STATUS_INTERNAL,
                              (std::string(name_) +
                               ": the step's table words were left to "
                               "stores that never ran")
                                  .c_str());
    if (downloadVictims_ && !victimsPublished) {
      const int64_t words =
          static_cast<int64_t>(batch_) * heads_ * (1 + kInlineVictims);
      copyVictimRows<kCopyVictimThreads>
          <<<static_cast<unsigned>((words + kCopyVictimThreads - 1) /
                                   kCopyVictimThreads),
             kCopyVictimThreads, 0, stream_>>>(deviceTables_,
                                               batch_ * heads_);
      KVC_CUDA_CHECK(name_, cudaGetLastError());
    }
    downloadVictims_ = false;
    // One event for the batch, recorded once. The event that the first
    // mirror's buffer holds from its earlier step is recorded again when
    // every mirror holding it is in this batch (the usual case: the same
    // sequences step together), since all of them now take this step's;
    // otherwise a new one. A staging block that waits for it then waits
    // for this step, which comes after the copies it guarded (the steps of
    // a layer are ordered).
    std::shared_ptr<StepEvent> event;
    const std::shared_ptr<StepEvent> &first =
        mirrors_[0]->done[mirrors_[0]->next];
    if (first) {
      long holders = pinnedStaging().guarding(first);
      for (int32_t b = 0; b < batch_; ++b)
        holders += mirrors_[b]->done[mirrors_[b]->next] == first;
      if (holders == first.use_count())
        event = first;
    }
    if (!event) {
      try {
        event = std::make_shared<StepEvent>();
      } catch (const std::bad_alloc &) {
        return kvc_report_error(KVC_STATUS_OUT_OF_MEMORY,
                                "kvc cuda: host event allocation failed");
      }
      KVC_CUDA_TRY(MirrorMemory::instance().takeEvent(name_, &event->event,
                                                      &event->device));
    }
    if (recordLater) {
      // A planned step: its run queues the kernels after this returns, and
      // its finish records the event behind them.
      event->unrecorded = true;
      try {
        plannedSteps().push_back({context_, layer_, event});
      } catch (const std::bad_alloc &) {
        return kvc_report_error(KVC_STATUS_OUT_OF_MEMORY,
                                "kvc cuda: host step list allocation failed");
      }
    } else {
      KVC_CUDA_CHECK(name_, cudaEventRecord(event->event, stream_));
    }
    event->complete = false;
    // The step's copies from pinned staging are behind it too.
    PinnedStaging &staging = pinnedStaging();
    for (size_t block : staged_)
      staging.guard(block, event);
    staged_.clear();
    // The regions that grow moved mirrors out of: the step's copies read
    // them.
    for (TableMirror *old : grown_) {
      for (std::shared_ptr<StepEvent> &guard : old->done)
        guard = event;
      releaseMirror(old);
    }
    grown_.clear();
    for (int32_t b = 0; b < batch_; ++b) {
      TableMirror *m = mirrors_[b];
      if (m->moved)
        for (std::shared_ptr<StepEvent> &guard : m->done)
          guard = event;
      m->moved = false;
      m->done[m->next] = event;
      m->next = (m->next + 1) % kVictimBuffers;
      const kvc_attachment_t a{m, &flushMirror, &releaseMirror};
      KVC_CUDA_TRY(kvc_attach(context_, sequences_[b], layer_, &a));
      mirrors_[b] = nullptr;
      // The sequence's step is done: its appends stay.
      for (size_t i = static_cast<size_t>(b) * heads_;
           i < appended_.size() && i < static_cast<size_t>(b + 1) * heads_; ++i)
        appended_[i] = -1;
    }
    return KVC_STATUS_OK;
  }

  /// After checkOut, before the step's appends: the most slots a head of
  /// the batch has. A checked-out mirror's host shadow holds as many
  /// page-table entries as the runtime's table (upload sets its length from
  /// the runtime, the evictions since then trimmed it as the runtime did,
  /// and any other host call on the layer settles the mirror), so only a
  /// sequence without one asks the runtime.
  kvc_status_t slotsBeforeStep(int32_t *maxSlots) const {
    int32_t most = 0;
    for (int32_t b = 0; b < batch_; ++b) {
      if (const TableMirror *m = mirrors_[b]) {
        for (const std::vector<uint64_t> &shadow : m->pages) {
          const int32_t slots = static_cast<int32_t>(shadow.size()) * pageSize_;
          most = slots > most ? slots : most;
        }
        continue;
      }
      for (int32_t h = 0; h < heads_; ++h) {
        int32_t slots = 0;
        KVC_CUDA_TRY(kvc_get_num_slots(context_, sequences_[b], layer_, h,
                                       &slots));
        most = slots > most ? slots : most;
      }
    }
    *maxSlots = most;
    return KVC_STATUS_OK;
  }

  /// After upload: the most slots a head of the batch has.
  int32_t maxSlots() const { return maxSlots_; }
  /// The mirror of sequence b of the batch (checked out).
  const TableMirror &mirror(int32_t b) const { return *mirrors_[b]; }

private:
  /// The device page-table entry of page p of head h: its address, tagged
  /// for a low page.
  kvc_status_t pageEntry(uint64_t sequence, int32_t h, int32_t p,
                         uint64_t *entry) const {
    void *address = nullptr;
    KVC_CUDA_TRY(kvc_get_page(context_, sequence, layer_, h, p, nullptr,
                              nullptr, &address));
    *entry = reinterpret_cast<uint64_t>(address);
    if (mixed_ && address) {
      int32_t format = 0;
      KVC_CUDA_TRY(kvc_get_page_format(context_, sequence, layer_, h, p,
                                       &format));
      if (format == lowFormat_)
        *entry |= kLowPageTag;
    }
    return KVC_STATUS_OK;
  }

  /// Brings the mirror of sequence b up to date (words) or builds it.
  /// `knownPages`: the page-table length of each head, or null to ask the
  /// runtime.
  kvc_status_t refresh(int32_t b, int32_t position, const int32_t *newSlots,
                       const int32_t *knownPages, bool sameEntries,
                       const kvc_kivi_work_t *kiviWork,
                       std::vector<TableWord> &words) {
    const uint64_t sequence = sequences_[b];
    // Working lists reused across the batch's sequences and heads.
    std::vector<int32_t> &numPages = numPages_;
    numPages.resize(heads_);
    int32_t maxPages = 0;
    for (int32_t h = 0; h < heads_; ++h) {
      if (knownPages)
        numPages[h] = knownPages[h];
      else
        KVC_CUDA_TRY(
            kvc_get_num_pages(context_, sequence, layer_, h, &numPages[h]));
      maxPages = maxPages > numPages[h] ? maxPages : numPages[h];
    }
    if (mirrors_[b] && maxPages > mirrors_[b]->capPages)
      KVC_CUDA_TRY(grow(b, maxPages));
    TableMirror *&m = mirrors_[b];
    if (!m)
      return build(b, numPages, maxPages, sameEntries);
    for (int32_t h = 0; h < heads_; ++h) {
      std::vector<uint64_t> &shadow = m->pages[h];
      const size_t before = shadow.size() < static_cast<size_t>(numPages[h])
                                ? shadow.size()
                                : static_cast<size_t>(numPages[h]);
      shadow.resize(numPages[h], 0);
      // The entries to compare: those the page table gained, the appended
      // slot's page when the mirror holds a hole there (the append mapped
      // it again; a page the mirror holds mapped is unchanged unless the
      // last evictions touched it) and the pages the last evictions
      // touched; each once.
      std::vector<int32_t> &check = check_;
      check.clear();
      for (int32_t p = static_cast<int32_t>(before); p < numPages[h]; ++p)
        check.push_back(p);
      if (newSlots) {
        const int32_t p = newSlots[h] / pageSize_;
        if (static_cast<size_t>(p) < before && shadow[p] == 0)
          check.push_back(p);
      }
      for (const auto &[head, p] : m->recheck)
        if (head == h && p < numPages[h])
          check.push_back(p);
      if (check.size() > 1) {
        std::sort(check.begin(), check.end());
        check.erase(std::unique(check.begin(), check.end()), check.end());
      }
      for (int32_t p : check) {
        uint64_t entry = 0;
        KVC_CUDA_TRY(pageEntry(sequence, h, p, &entry));
        if (static_cast<size_t>(p) < before && entry == shadow[p])
          continue;
        shadow[p] = entry;
        words.push_back(TableWord{
            reinterpret_cast<uint64_t>(m->pagesOf(h) + p) | 1, entry});
      }
      if (!newSlots)
        continue;
      // What kvc_append wrote into the appended slot's metadata.
      const int32_t slot = newSlots[h];
      words.push_back(TableWord{
          reinterpret_cast<uint64_t>(m->positionsOf(h) + slot),
          static_cast<uint32_t>(position)});
      if (m->withState)
        words.push_back(
            TableWord{reinterpret_cast<uint64_t>(m->stateOf(h) + slot), 0});
      if (m->withHistory)
        words.push_back(TableWord{
            reinterpret_cast<uint64_t>(m->historyOf(h) + slot) | 1, 0});
    }
    m->recheck.clear();
    if (m->withKivi)
      for (int32_t h = 0; h < heads_; ++h)
        KVC_CUDA_TRY(refreshWindow(*m, sequence, h,
                                   kiviWork ? kiviWork + h : nullptr, words));
    return KVC_STATUS_OK;
  }

  /// KIVI: the words of the slots whose residual-window rows changed since
  /// the device's copy: each such slot gets the word of the row that holds
  /// it now, or -1 (quantized, or no longer in the window). The rows are
  /// compared with the mirror's copy in place. When the only change to the
  /// head since the copy is the append its work record describes (the
  /// record's serial is one past the copy's and it holds stages: a decode
  /// step's append), only the rows the record names can have changed (its
  /// stages, the values it quantized and the members of the key blocks it
  /// quantized; kvc_kivi_work_t), and only those are compared: a step
  /// changes one row (the new entry takes the row of the value that leaves
  /// the window) and, every G steps, the words of a block of keys.
  /// Otherwise (an eviction or a compaction since, or more than one append)
  /// all R rows are. `given`: the head's record as the step read it
  /// (KiviWorkPlan::records), else null to ask the runtime.
  kvc_status_t refreshWindow(TableMirror &m, uint64_t sequence, int32_t h,
                             const kvc_kivi_work_t *given,
                             std::vector<TableWord> &words) {
    kvc_kivi_work_t queried;
    if (!given)
      KVC_CUDA_TRY(
          kvc_kivi_pending_work(context_, sequence, layer_, h, &queried));
    const kvc_kivi_work_t &work = given ? *given : queried;
    m.residual[h] = static_cast<const uint8_t *>(work.residual);
    std::vector<KiviWindowRow> &rows = m.window[h];
    // The slots that left a row (their old row) and those that arrived in
    // one or kept it with another word (their new row).
    std::vector<KiviWindowRow> &left = windowLeft_;
    std::vector<KiviWindowRow> &arrived = windowArrived_;
    left.clear();
    arrived.clear();
    const bool onlyRecorded =
        work.serial == m.windowSerial[h] + 1 && work.num_stages > 0 &&
        rows.size() == static_cast<size_t>(work.residual_length);
    try {
      auto compare = [&](int32_t r) {
        if (r < 0 || r >= work.residual_length)
          return;
        const KiviWindowRow now = kiviWindowRow(work, r);
        if (now == rows[r])
          return;
        if (rows[r].slot >= 0)
          left.push_back(rows[r]);
        if (now.slot >= 0)
          arrived.push_back(now);
        rows[r] = now;
      };
      if (onlyRecorded) {
        // A row named twice compares equal the second time.
        for (int32_t i = 0; i < work.num_stages; ++i)
          compare(work.stages[i].residual_row);
        for (int32_t i = 0; i < work.num_values; ++i)
          compare(work.values[i].residual_row);
        for (int32_t i = 0; i < work.key_block_begin[work.num_key_blocks];
             ++i)
          compare(work.key_members[i].residual_row);
      } else {
        if (rows.size() != static_cast<size_t>(work.residual_length))
          rows.assign(static_cast<size_t>(work.residual_length),
                      KiviWindowRow{-1, -1});
        for (int32_t r = 0; r < work.residual_length; ++r)
          compare(r);
      }
    } catch (const std::bad_alloc &) {
      return kvc_report_error(KVC_STATUS_OUT_OF_MEMORY,
                              "kvc cuda: host table allocation failed");
    }
    m.windowSerial[h] = work.serial;
    if (left.empty() && arrived.empty())
      return KVC_STATUS_OK;
    // A slot is in at most one row, so each slot gets one word: the word of
    // the row it arrived in, else -1.
    auto bySlot = [](const KiviWindowRow &a, const KiviWindowRow &b) {
      return a.slot < b.slot;
    };
    std::sort(arrived.begin(), arrived.end(), bySlot);
    for (const KiviWindowRow &row : left) {
      if (std::binary_search(arrived.begin(), arrived.end(),
                             KiviWindowRow{row.slot, -1}, bySlot))
        continue;
      if (row.slot < m.capSlots())
        words.push_back(
            TableWord{reinterpret_cast<uint64_t>(m.kiviRowsOf(h) + row.slot),
                      static_cast<uint32_t>(-1)});
    }
    for (const KiviWindowRow &row : arrived)
      if (row.slot < m.capSlots())
        words.push_back(
            TableWord{reinterpret_cast<uint64_t>(m.kiviRowsOf(h) + row.slot),
                      static_cast<uint32_t>(row.word)});
    return KVC_STATUS_OK;
  }

  /// Moves the mirror of sequence b, which a page table of `maxPages`
  /// pages outgrew, into a region with room for a quarter more pages, on
  /// the device: each part is copied region to region on the step's stream
  /// (one cudaMemcpy2DAsync per part, a row per head), the slots past the
  /// old capacity are made free (positions KVC_POSITION_NONE, state and
  /// bits 0, KIVI words -1), and the host side (page shadows, pending
  /// victims, events, pinned rows) moves over. Nothing is written back and
  /// nothing waits; the step's words then bring the tables up to date as
  /// usual. The old region is retired at checkIn, guarded by the step's
  /// event. On failure the old mirror stays in place.
  kvc_status_t grow(int32_t b, int32_t maxPages) {
    TableMirror *old = mirrors_[b];
    try {
      grown_.reserve(grown_.size() + 1);
    } catch (const std::bad_alloc &) {
      return kvc_report_error(KVC_STATUS_OUT_OF_MEMORY,
                              "kvc cuda: host table allocation failed");
    }
    std::unique_ptr<TableMirror> grown(new (std::nothrow) TableMirror);
    if (!grown)
      return kvc_report_error(KVC_STATUS_OUT_OF_MEMORY,
                              "kvc cuda: host table allocation failed");
    TableMirror &m = *grown;
    m.heads = old->heads;
    m.pageSize = old->pageSize;
    m.capPages = maxPages + maxPages / 4 + 4;
    m.withState = old->withState;
    m.withHistory = old->withHistory;
    m.withVictims = old->withVictims;
    m.withKivi = old->withKivi;
    m.headBytes = m.regionBytes();
    KVC_CUDA_TRY(MirrorMemory::instance().allocateRegion(
        m.headBytes * m.heads, stream_, name_, &m.device, &m.deviceId));
    const cudaError_t error = copyRegion(*old, m);
    if (error != cudaSuccess) {
      // Some copies may be queued: the new region goes once they ran.
      cudaStreamSynchronize(stream_);
      MirrorMemory::instance().retire(m.device, m.deviceId, nullptr, 0,
                                      m.done);
      return reportCudaError(name_, error);
    }
    m.loaded = old->loaded;
    m.moved = true;
    m.next = old->next;
    for (int32_t k = 0; k < kVictimBuffers; ++k) {
      m.pending[k] = old->pending[k];
      m.done[k] = old->done[k];
    }
    m.pages = std::move(old->pages);
    m.recheck = std::move(old->recheck);
    m.window = std::move(old->window);
    m.residual = std::move(old->residual);
    m.windowSerial = std::move(old->windowSerial);
    m.hostVictims = old->hostVictims;
    old->hostVictims = nullptr;
    grown_.push_back(old);
    mirrors_[b] = grown.release();
    return KVC_STATUS_OK;
  }

  /// Queues the copies of grow from `from`'s region into `to`'s (larger)
  /// one, and the fills of the slots past `from`'s capacity.
  cudaError_t copyRegion(const TableMirror &from, const TableMirror &to) {
    const size_t heads = static_cast<size_t>(to.heads);
    auto copy = [&](uint64_t toOffset, uint64_t fromOffset, uint64_t bytes) {
      return cudaMemcpy2DAsync(to.device + toOffset, to.headBytes,
                               from.device + fromOffset, from.headBytes,
                               bytes, heads, cudaMemcpyDeviceToDevice,
                               stream_);
    };
    auto fill = [&](uint64_t offset, int value, uint64_t bytes) {
      return cudaMemset2DAsync(to.device + offset, to.headBytes, value,
                               bytes, heads, stream_);
    };
    const uint64_t kept = static_cast<uint64_t>(from.capSlots());
    const uint64_t added = static_cast<uint64_t>(to.capSlots()) - kept;
    cudaError_t e = copy(0, 0, 8ull * from.capPages);
    if (e == cudaSuccess)
      e = copy(to.positionsOffset(), from.positionsOffset(), 4 * kept);
    if (e == cudaSuccess)
      e = fill(to.positionsOffset() + 4 * kept, 0xff, 4 * added);
    if (e == cudaSuccess && to.withState)
      e = copy(to.stateOffset(), from.stateOffset(), 4 * kept);
    if (e == cudaSuccess && to.withState)
      e = fill(to.stateOffset() + 4 * kept, 0, 4 * added);
    if (e == cudaSuccess && to.withHistory)
      e = copy(to.historyOffset(), from.historyOffset(), 8 * kept);
    if (e == cudaSuccess && to.withHistory)
      e = fill(to.historyOffset() + 8 * kept, 0, 8 * added);
    for (int32_t k = 0; k < kVictimBuffers && e == cudaSuccess && to.withVictims;
         ++k)
      e = copy(reinterpret_cast<char *>(to.victimsOf(0, k)) - to.device,
               reinterpret_cast<char *>(from.victimsOf(0, k)) - from.device,
               4ull * static_cast<uint64_t>(from.victimWords()));
    if (e == cudaSuccess && to.withKivi)
      e = copy(to.kiviRowsOffset(), from.kiviRowsOffset(), 4 * kept);
    if (e == cudaSuccess && to.withKivi)
      e = fill(to.kiviRowsOffset() + 4 * kept, 0xff, 4 * added);
    return e;
  }

  /// A new mirror of sequence b from the runtime's metadata, with room for
  /// a quarter more pages than the largest page table.
  kvc_status_t build(int32_t b, const std::vector<int32_t> &numPages,
                     int32_t maxPages, bool sameEntries) {
    const uint64_t sequence = sequences_[b];
    TableMirror *m = new (std::nothrow) TableMirror;
    if (!m)
      return kvc_report_error(KVC_STATUS_OUT_OF_MEMORY,
                              "kvc cuda: host table allocation failed");
    mirrors_[b] = m;
    m->heads = heads_;
    m->pageSize = pageSize_;
    m->capPages = maxPages + maxPages / 4 + 4;
    m->withState = withState_;
    m->withHistory = withHistory_;
    m->withVictims = withVictims_;
    m->withKivi = withKivi_;
    m->headBytes = m->regionBytes();
    m->pages.resize(heads_);
    if (withKivi_) {
      m->window.resize(heads_);
      m->residual.assign(heads_, nullptr);
      m->windowSerial.assign(heads_, 0);
    }
    KVC_CUDA_TRY(MirrorMemory::instance().allocateRegion(
        m->headBytes * heads_, stream_, name_, &m->device, &m->deviceId));
    if (withVictims_)
      KVC_CUDA_TRY(MirrorMemory::instance().allocateRows(
          m->hostVictimBytes(), name_, &m->hostVictims));
    // The image is written straight into pinned memory, whose copy only
    // queues (PinnedStaging).
    PinnedStaging &staging = pinnedStaging();
    const size_t imageBytes = m->headBytes * heads_;
    char *image = nullptr;
    KVC_CUDA_TRY(staging.take(imageBytes, name_, &image));
    std::memset(image, 0, imageBytes);
    const int32_t *firstPositions = nullptr;
    int32_t firstSlots = 0;
    for (int32_t h = 0; h < heads_; ++h) {
      char *base = image + h * m->headBytes;
      m->pages[h].resize(numPages[h]);
      for (int32_t p = 0; p < numPages[h]; ++p)
        KVC_CUDA_TRY(pageEntry(sequence, h, p, &m->pages[h][p]));
      std::memcpy(base, m->pages[h].data(), 8 * m->pages[h].size());
      kvc_metadata_t meta;
      KVC_CUDA_TRY(kvc_get_metadata(context_, sequence, layer_, h, &meta));
      if (sameEntries) {
        if (h == 0) {
          firstPositions = meta.position;
          firstSlots = meta.num_slots;
        } else if (meta.num_slots != firstSlots ||
                   std::memcmp(meta.position, firstPositions,
                               4 * static_cast<size_t>(firstSlots)) != 0) {
          return kvc_report_error(
              KVC_STATUS_INTERNAL,
              (std::string(name_) +
               ": the heads of a layer-wide policy hold different entries")
                  .c_str());
        }
      }
      int32_t *positions =
          reinterpret_cast<int32_t *>(base + m->positionsOffset());
      std::memcpy(positions, meta.position, 4 * meta.num_slots);
      for (int64_t s = meta.num_slots; s < m->capSlots(); ++s)
        positions[s] = KVC_POSITION_NONE;
      if (withState_)
        std::memcpy(base + m->stateOffset(), meta.score, 4 * meta.num_slots);
      if (withHistory_)
        std::memcpy(base + m->historyOffset(), meta.history,
                    8 * meta.num_slots);
      if (withKivi_) {
        int32_t *rows = reinterpret_cast<int32_t *>(base + m->kiviRowsOffset());
        for (int64_t s = 0; s < m->capSlots(); ++s)
          rows[s] = -1;
        KVC_CUDA_TRY(readKiviWindow(context_, sequence, layer_, h,
                                    m->window[h], &m->residual[h],
                                    &m->windowSerial[h]));
        for (const KiviWindowRow &row : m->window[h])
          if (row.slot >= 0 && row.slot < m->capSlots())
            rows[row.slot] = row.word;
      }
    }
    KVC_CUDA_CHECK(name_, cudaMemcpyAsync(m->device, image, imageBytes,
                                          cudaMemcpyHostToDevice, stream_));
    staged(staging);
    m->loaded = true;
    return KVC_STATUS_OK;
  }

  kvc_context_t *context_ = nullptr;
  const uint64_t *sequences_ = nullptr;
  int32_t batch_ = 0, layer_ = 0, heads_ = 0, pageSize_ = 1, lowFormat_ = 0;
  int32_t maxSlots_ = 0;
  bool withState_ = false, withHistory_ = false, withVictims_ = false;
  bool withKivi_ = false, mixed_ = false, kiviPool_ = false;
  const char *name_ = "";
  cudaStream_t stream_ = nullptr;
  /// Whether upload queued work on stream_ (which may be the legacy
  /// stream, null).
  bool uploaded_ = false;
  std::vector<TableMirror *> mirrors_;
  /// The step's HeadTables on the device (upload), and whether a sequence
  /// kept its victims (keepVictims) so that checkIn downloads them.
  const HeadTable *deviceTables_ = nullptr;
  bool downloadVictims_ = false;
  /// The last chunk of the step's table words, left by upload to
  /// storeAppended (takeDeferredWords).
  const TableWord *deferredWords_ = nullptr;
  int32_t numDeferredWords_ = 0;
  bool wordsDeferred_ = false;
  /// refresh's page counts of a sequence and page-table entries of a head.
  std::vector<int32_t> numPages_, check_;
  /// refreshWindow's working lists, reused across heads and steps.
  std::vector<KiviWindowRow> windowLeft_, windowArrived_;
  /// Mirrors that grow moved out of, released at checkIn.
  std::vector<TableMirror *> grown_;
  /// The slot each head of the batch appended (upload's newSlots; empty on
  /// a KIVI pool), which a failed step takes back (~DeviceTables).
  std::vector<int32_t> appended_;
  /// The pinned staging blocks this step copied from, which its event
  /// guards (checkIn).
  std::vector<size_t> staged_;

  /// A copy from the block `staging.take` gave was queued on stream_: the
  /// step's event guards the block (checkIn).
  void staged(PinnedStaging &staging) {
    const size_t block = staging.queuedInStep();
    try {
      staged_.push_back(block);
    } catch (const std::bad_alloc &) {
      staging.queued(block, stream_);
    }
  }
};

/// The StoreEntry of slot `slot` of a head whose page addresses `pages`
/// (pool addresses from kvc_get_page) are known on the host.
inline StoreEntry storeEntry(const kvc_page_layout_t &layout, int32_t pageSize,
                             uint64_t pageAddress, int32_t slot, int32_t head,
                             int32_t row, uint64_t keyRowBytes) {
  const uint64_t o = static_cast<uint64_t>(slot % pageSize);
  StoreEntry e;
  e.key = pageAddress + layout.key_offset + o * keyRowBytes;
  e.value = pageAddress + layout.value_offset + o * keyRowBytes;
  e.keyScale = pageAddress + layout.key_param_offset + o * sizeof(float);
  e.valueScale = pageAddress + layout.value_param_offset + o * sizeof(float);
  e.head = head;
  e.row = row;
  return e;
}

/// The StoreEntry of slot `slot` of a low page at `pageAddress` (mixed
/// precision; kvc_get_page's address of the low page), with `low` the low
/// class's layout (kvc_low_page_layout): packed rows and {scale, min}
/// records of its strides.
inline StoreEntry lowStoreEntry(const kvc_page_layout_t &low, int32_t pageSize,
                                uint64_t pageAddress, int32_t slot,
                                int32_t head, int32_t row) {
  const uint64_t o = static_cast<uint64_t>(slot % pageSize);
  StoreEntry e;
  e.key = pageAddress + low.key_offset + o * low.key_stride;
  e.value = pageAddress + low.value_offset + o * low.value_stride;
  e.keyScale = pageAddress + low.key_param_offset + o * low.key_param_stride;
  e.valueScale =
      pageAddress + low.value_param_offset + o * low.value_param_stride;
  e.head = head;
  e.row = row;
  return e;
}

/// How decode splits the slots of a head: `splits` blocks per kv-head of
/// `slotsPerSplit` slots each.
struct SplitPlan {
  int32_t splits;
  int32_t slotsPerSplit;
};

/// Whether the decode attention's splits follow whole waves of the
/// device's resident blocks (KVC_CUDA_SPLIT_PLAN).
constexpr bool kSplitsByWaves = KVC_CUDA_SPLIT_PLAN != 0;

/// The splits of a decode step over `heads` heads of the batch of at most
/// `maxSlots` slots. By length: a split per `minSlotsPerSplit` slots of
/// the longest head, 1 to `maxSplits`. The attention's blocks are heads x
/// splits, and equal splits make equal blocks: where they are more than
/// the `wave` blocks that the device holds at once (SMs x resident blocks
/// per SM; 0: unknown), the last wave runs a remainder of blocks alone
/// for as long as a whole one (at batch 8 and 4k, G = 1: 1,024 blocks
/// over the 924 of 132 SMs, a second wave of a tenth). The plan models a
/// count of splits s as waves(s) x slots(s) (ceil(heads s / wave) waves
/// of blocks of ceil(maxSlots / s) slots) and takes the most splits, at
/// most the length's count, whose model lies within 1/16 of the least:
/// the same count where the remainder is a small part of many waves, and
/// fewer, longer splits where it would be a wave of its own (14 a head
/// for the 1,024 blocks above: 896 blocks, one wave). Under
/// KVC_CUDA_SPLIT_PLAN=0: by length only.
inline SplitPlan planSplits(int32_t maxSlots, int32_t maxSplits,
                            int32_t minSlotsPerSplit, int32_t heads,
                            int64_t wave) {
  int32_t splits = (maxSlots + minSlotsPerSplit - 1) / minSlotsPerSplit;
  splits = splits < 1 ? 1 : (splits > maxSplits ? maxSplits : splits);
  if (kSplitsByWaves && wave > 0 && heads > 0 &&
      static_cast<int64_t>(heads) * splits > wave) {
    auto model = [&](int32_t s) {
      const int64_t waves = (static_cast<int64_t>(heads) * s + wave - 1) / wave;
      return waves * ((static_cast<int64_t>(maxSlots) + s - 1) / s);
    };
    int64_t least = model(splits);
    for (int32_t s = splits - 1; s >= 1; --s)
      least = std::min(least, model(s));
    while (splits > 1 && 16 * model(splits) > 17 * least)
      --splits;
  }
  int32_t per = (maxSlots + splits - 1) / splits;
  return SplitPlan{splits, per < 1 ? 1 : per};
}

/// Whether the fold kernel's blocks follow planFold (KVC_CUDA_FOLD_PLAN).
constexpr bool kFoldPlanned = KVC_CUDA_FOLD_PLAN != 0;

/// Fold blocks of kFoldThreads threads that one SM holds at once: four,
/// 64 registers a thread, which the generated fold kernels ask of ptxas
/// as their launch bounds (the emitter's decodeFold), so that planFold's
/// one wave stays one wave whatever a policy's fold and stages need. The
/// bundled policies' folds take 48 to 64 at the test and benchmark
/// geometries without the bound (H2O's, Scissorhands', D2O's and
/// H2O-merge's 64 at G = 3 and 8), so the bound costs them no spill
/// (test/codegen/cuda-ptx-fold-bounds.mlir); folds of fewer registers
/// hold more blocks, which leaves the wave short of full, not longer.
constexpr int32_t kFoldBlocksPerSM = 4;

/// How the decode fold kernel covers the slots of a head: `blocks` blocks
/// per head of the batch, `slotsPerBlock` consecutive slots each (foldRange).
struct FoldPlan {
  int32_t blocks;
  int32_t slotsPerBlock;
};

/// The fold blocks of a decode step at group size G over `heads` heads of
/// at most `maxSlots` slots, on a device of `multiprocessors` SMs. A fold
/// block waits for a chain of memory round trips before its slots (the
/// splits' records, its share of the merged output, then the slot passes,
/// the arrival) and its slot work is a few bytes per slot: a block per
/// attention split (`split`, up to 64 a head) would make batch x kv-heads
/// x splits short blocks, many waves of them one after another, each
/// waiting for the same chain. The plan takes as few blocks per head as
/// fill the device once (kFoldBlocksPerSM a SM), each a
/// whole pass of slots at least (kFoldThreads x foldUnroll<G>()), and
/// never more than the attention's splits; the ranges are whole multiples
/// of 32 slots (128-byte lines of 4-byte elements), the last one ending
/// with the longest head. Under KVC_CUDA_FOLD_PLAN=0: a block per
/// attention split.
template <int G>
inline FoldPlan planFold(const SplitPlan &split, int32_t heads,
                         int32_t maxSlots, int32_t multiprocessors) {
  if (!kFoldPlanned)
    return FoldPlan{split.splits, split.slotsPerSplit};
  const int64_t resident =
      static_cast<int64_t>(multiprocessors > 0 ? multiprocessors : 1) *
      kFoldBlocksPerSM;
  const int64_t pass = static_cast<int64_t>(kFoldThreads) * foldUnroll<G>();
  int64_t blocks = resident / (heads > 0 ? heads : 1);
  blocks = std::min(blocks, (maxSlots + pass - 1) / pass);
  blocks = std::min<int64_t>(blocks, split.splits);
  blocks = std::max<int64_t>(blocks, 1);
  int64_t per = (static_cast<int64_t>(maxSlots) + blocks - 1) / blocks;
  per = std::max<int64_t>((per + 31) / 32 * 32, 32);
  // The rounding may leave the last blocks without slots: not launched.
  blocks = std::max<int64_t>((maxSlots + per - 1) / per, 1);
  return FoldPlan{static_cast<int32_t>(blocks), static_cast<int32_t>(per)};
}

/// The GridFold of a decode step over `heads` heads of at most `maxSlots`
/// slots in `split`'s splits, on a device that holds `wave` of the
/// kernel's blocks at once (0: unknown). A range per split, rounded up to
/// whole lines; a lag of the heads that one wave of attention items
/// covers, plus one, so that the head an item folds has usually ended
/// before the item starts (its wait then returns at once) while its
/// logits, written one wave before, are still in L2.
inline GridFold planGridFold(const SplitPlan &split, int32_t heads,
                             int32_t maxSlots, int64_t wave,
                             int32_t *items) {
  const int64_t splits = split.splits > 0 ? split.splits : 1;
  int64_t per = (static_cast<int64_t>(maxSlots) + splits - 1) / splits;
  per = (per + 31) / 32 * 32;
  if (per < 32)
    per = 32;
  int64_t ranges = (static_cast<int64_t>(maxSlots) + per - 1) / per;
  if (ranges < 1)
    ranges = 1;
  int64_t lag = (wave > 0 ? (wave + splits - 1) / splits : 0) + 1;
  if (lag > heads)
    lag = heads;
  if (lag < 1)
    lag = 1;
  GridFold g;
  g.items = items;
  g.heads = heads;
  g.ranges = static_cast<int32_t>(ranges);
  g.slotsPerRange = static_cast<int32_t>(per);
  g.lag = static_cast<int32_t>(lag);
  return g;
}

/// A count of the current device (*count) that `ask(device, &value)` (a
/// CUDA runtime call) gives, asked once per device: `known` holds each
/// device's count plus one, 0 before the first call (devices past
/// kKnownDevices are asked every time).
constexpr int kKnownDevices = 64;
template <typename Ask>
inline kvc_status_t perDeviceCount(const char *name,
                                   std::atomic<int32_t> (&known)[kKnownDevices],
                                   Ask ask, int32_t *count) {
  int device = 0;
  KVC_CUDA_CHECK(name, cudaGetDevice(&device));
  const bool cached = device >= 0 && device < kKnownDevices;
  if (cached) {
    const int32_t value = known[device].load(std::memory_order_relaxed);
    if (value > 0) {
      *count = value - 1;
      return KVC_STATUS_OK;
    }
  }
  int value = 0;
  KVC_CUDA_CHECK(name, ask(device, &value));
  *count = value;
  if (cached)
    known[device].store(value + 1, std::memory_order_relaxed);
  return KVC_STATUS_OK;
}

/// The SMs of the current device (*count), asked of the runtime once per
/// device.
inline kvc_status_t deviceMultiprocessors(const char *name, int32_t *count) {
  static std::atomic<int32_t> known[kKnownDevices];
  return perDeviceCount(
      name, known,
      [](int device, int *value) {
        return cudaDeviceGetAttribute(value, cudaDevAttrMultiProcessorCount,
                                      device);
      },
      count);
}

/// The bytes of L2 of the current device (*bytes), asked of the runtime
/// once per device. For logitsKeepFraction.
inline kvc_status_t deviceL2Bytes(const char *name, int32_t *bytes) {
  static std::atomic<int32_t> known[kKnownDevices];
  return perDeviceCount(
      name, known,
      [](int device, int *value) {
        return cudaDeviceGetAttribute(value, cudaDevAttrL2CacheSize, device);
      },
      bytes);
}

/// The blocks of kThreads threads (no dynamic shared memory) of kernel
/// `Kernel` that one SM of the current device holds at once (*count; 0
/// where it cannot run one), asked of the runtime once per device. For
/// planSplits' wave.
template <auto Kernel, int kThreads>
inline kvc_status_t residentBlocks(const char *name, int32_t *count) {
  static std::atomic<int32_t> known[kKnownDevices];
  return perDeviceCount(
      name, known,
      [](int, int *value) {
        return cudaOccupancyMaxActiveBlocksPerMultiprocessor(value, Kernel,
                                                             kThreads, 0);
      },
      count);
}

/// Whether `Kernel` can be launched as a programmatic dependent on the
/// current device (*applies): a device of compute capability 9.0 or above
/// running code of the kernel compiled for one (its PTX version 90 or
/// above, where awaitPriorGrids is a wait: not the sm_80 PTX that the
/// driver compiles for a newer device), asked of the runtime once per
/// device. Always false under KVC_CUDA_DEPENDENT_LAUNCH=0 and in the CUDA
/// emulator (where launchDependent tells the emulator instead).
template <auto Kernel>
inline kvc_status_t dependentLaunchApplies(const char *name, bool *applies) {
#if KVC_CUDA_DEPENDENT_LAUNCH && !defined(KVC_CUDA_EMULATED)
  static std::atomic<int32_t> known[kKnownDevices];
  int32_t value = 0;
  KVC_CUDA_TRY(perDeviceCount(
      name, known,
      [](int device, int *answer) {
        int major = 0;
        cudaError_t error = cudaDeviceGetAttribute(
            &major, cudaDevAttrComputeCapabilityMajor, device);
        if (error != cudaSuccess)
          return error;
        cudaFuncAttributes attributes{};
        error = cudaFuncGetAttributes(&attributes, Kernel);
        if (error != cudaSuccess)
          return error;
        *answer = major >= 9 && attributes.ptxVersion >= 90 ? 1 : 0;
        return cudaSuccess;
      },
      &value));
  *applies = value != 0;
#else
  (void)name;
  *applies = false;
#endif
  return KVC_STATUS_OK;
}

/// Launches `Kernel` (no dynamic shared memory) on `stream` as a
/// programmatic dependent of the kernel before it where
/// dependentLaunchApplies, otherwise as an ordinary launch. The kernel
/// must call awaitPriorGrids (above) before it reads anything that the
/// work before it in the stream writes. A launch error is reported under
/// `name`.
template <auto Kernel, typename... Args>
inline kvc_status_t launchDependent(const char *name, dim3 grid, dim3 block,
                                    cudaStream_t stream,
                                    const Args &...args) {
  bool dependent = false;
  KVC_CUDA_TRY(dependentLaunchApplies<Kernel>(name, &dependent));
#if !defined(KVC_CUDA_EMULATED)
  if (dependent) {
    cudaLaunchAttribute attribute[1] = {};
    attribute[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attribute[0].val.programmaticStreamSerializationAllowed = 1;
    cudaLaunchConfig_t config = {};
    config.gridDim = grid;
    config.blockDim = block;
    config.dynamicSmemBytes = 0;
    config.stream = stream;
    config.attrs = attribute;
    config.numAttrs = 1;
    KVC_CUDA_CHECK(name, cudaLaunchKernelEx(&config, Kernel, args...));
    return KVC_STATUS_OK;
  }
#elif KVC_CUDA_DEPENDENT_LAUNCH
  // The emulator, a device of compute capability 9.0, starts it as early
  // as such a device may (kvc_cuda_emu.h).
  ::kvc::emu::markDependentLaunch();
#endif
  Kernel<<<grid, block, 0, stream>>>(args...);
  KVC_CUDA_CHECK(name, cudaGetLastError());
  return KVC_STATUS_OK;
}

/// Uploads `entries` (not empty) to `region`; `blocks` receives the grid of
/// kStoreThreads blocks that stores them (a warp per entry).
inline kvc_status_t uploadStores(const std::vector<StoreEntry> &entries,
                                 StoreEntry *region, cudaStream_t stream,
                                 const char *name, unsigned &blocks) {
  KVC_CUDA_CHECK(name, cudaMemcpyAsync(region, entries.data(),
                                       sizeof(StoreEntry) * entries.size(),
                                       cudaMemcpyHostToDevice, stream));
  constexpr size_t kWarps = kStoreThreads / kWarpSize;
  blocks = static_cast<unsigned>((entries.size() + kWarps - 1) / kWarps);
  return KVC_STATUS_OK;
}

/// Launches storeAppended on `stream` for the `heads` heads of a decode
/// batch (kvHeads per sequence) whose uploaded HeadTables `tables` holds
/// (their appendSlot and appendPage), and the `numWords` table words
/// `words` in its further blocks. Without words (a planned step, whose
/// upload wrote them) the launch depends on the batch alone, the same at
/// every step: a decode run captured in a CUDA graph replays it.
template <int D, Storage S>
kvc_status_t launchAppendStores(const HeadTable *tables, int32_t heads,
                                int32_t kvHeads, const PageLayout &layout,
                                const float *k, const float *v,
                                int64_t kvStride, cudaStream_t stream,
                                const char *name,
                                const TableWord *words = nullptr,
                                int32_t numWords = 0) {
  constexpr int32_t kWarps = kStoreThreads / kWarpSize;
  const int32_t blocks = (heads + kWarps - 1) / kWarps +
                         (numWords + kStoreThreads - 1) / kStoreThreads;
  storeAppended<D, S><<<static_cast<unsigned>(blocks), kStoreThreads, 0,
                        stream>>>(tables, heads, kvHeads, layout, k, v,
                                  kvStride, words, numWords,
                                  /*counted=*/false);
  KVC_CUDA_CHECK(name, cudaGetLastError());
  return KVC_STATUS_OK;
}

/// Word blocks of launchPlannedStores for `heads` heads: a step writes
/// about three words a head (position, score state, importance bits; a
/// page's word now and then), one thread each; the blocks loop over more.
inline int32_t plannedWordBlocks(int32_t heads) {
  const int64_t words = 3 * static_cast<int64_t>(heads);
  return static_cast<int32_t>(
      std::max<int64_t>((words + kStoreThreads - 1) / kStoreThreads, 1));
}

/// launchAppendStores for a planned run (a policy's decode_run_batch):
/// the step's table words are those the plan's upload left at
/// DeviceTables::plannedWords(tables, heads) (WordsBy::PlannedStores),
/// their count read on the device, so that the launch, its grid
/// (plannedWordBlocks) and its arguments depend on the batch alone and a
/// graph that captured it replays it at every step. The plan then
/// launches no kernel of its own.
template <int D, Storage S>
kvc_status_t launchPlannedStores(const HeadTable *tables, int32_t heads,
                                 int32_t kvHeads, const PageLayout &layout,
                                 const float *k, const float *v,
                                 int64_t kvStride, cudaStream_t stream,
                                 const char *name) {
  constexpr int32_t kWarps = kStoreThreads / kWarpSize;
  const int32_t blocks =
      (heads + kWarps - 1) / kWarps + plannedWordBlocks(heads);
  storeAppended<D, S><<<static_cast<unsigned>(blocks), kStoreThreads, 0,
                        stream>>>(tables, heads, kvHeads, layout, k, v,
                                  kvStride, DeviceTables::plannedWords(
                                                tables, heads),
                                  0, /*counted=*/true);
  KVC_CUDA_CHECK(name, cudaGetLastError());
  return KVC_STATUS_OK;
}

/// launchAppendStores after the upload (WordsBy::Stores) that left
/// the step's table words to this launch.
template <int D, Storage S>
kvc_status_t launchAppendStores(DeviceTables &deviceTables,
                                const HeadTable *tables, int32_t heads,
                                int32_t kvHeads, const PageLayout &layout,
                                const float *k, const float *v,
                                int64_t kvStride, cudaStream_t stream,
                                const char *name) {
  const TableWord *words = nullptr;
  int32_t numWords = 0;
  KVC_CUDA_TRY(deviceTables.takeDeferredWords(&words, &numWords));
  return launchAppendStores<D, S>(tables, heads, kvHeads, layout, k, v,
                                  kvStride, stream, name, words, numWords);
}

/// Uploads `entries` to `region` and launches storeEntries on `stream`.
template <int D, Storage S>
kvc_status_t launchStores(const std::vector<StoreEntry> &entries,
                          StoreEntry *region, const float *k, const float *v,
                          int64_t kvStride, cudaStream_t stream,
                          const char *name) {
  if (entries.empty())
    return KVC_STATUS_OK;
  unsigned blocks = 0;
  KVC_CUDA_TRY(uploadStores(entries, region, stream, name, blocks));
  storeEntries<D, S><<<blocks, kStoreThreads, 0, stream>>>(
      region, static_cast<int32_t>(entries.size()), k, v, kvStride);
  KVC_CUDA_CHECK(name, cudaGetLastError());
  return KVC_STATUS_OK;
}

/// launchStores for the low class of a mixed-precision context
/// (storeLowEntries; entries from lowStoreEntry).
template <int D, int kBits, int KG>
kvc_status_t launchLowStores(const std::vector<StoreEntry> &entries,
                             StoreEntry *region, const float *k,
                             const float *v, int64_t kvStride,
                             cudaStream_t stream, const char *name) {
  if (entries.empty())
    return KVC_STATUS_OK;
  unsigned blocks = 0;
  KVC_CUDA_TRY(uploadStores(entries, region, stream, name, blocks));
  storeLowEntries<D, kBits, KG><<<blocks, kStoreThreads, 0, stream>>>(
      region, static_cast<int32_t>(entries.size()), k, v, kvStride);
  KVC_CUDA_CHECK(name, cudaGetLastError());
  return KVC_STATUS_OK;
}


//===----------------------------------------------------------------------===//
// Host side of KIVI: the runtime's recorded work, as device jobs
//===----------------------------------------------------------------------===//

/// The most work KIVI appends of `heads` heads, each of at most `entries`
/// entries in one call (R residual rows, group KG), record: a value per
/// entry, key blocks over at most entries + R keys, at most min(entries, R)
/// stages, and the members of those jobs.
struct KiviWorkBounds {
  int64_t jobs = 0, members = 0, stages = 0;
};

inline KiviWorkBounds kiviWorkBounds(int32_t heads, int64_t entries,
                                     int32_t residual, int32_t group) {
  const int64_t n = entries > 0 ? entries : 0;
  const int64_t h = heads > 0 ? heads : 0;
  KiviWorkBounds b;
  b.jobs = h * (n + (n + residual) / group + 1);
  b.members = h * (2 * n + residual);
  b.stages = h * (n < residual ? n : residual);
  return b;
}

/// A KIVI work region laid out for `bounds`: the counts, then the stages,
/// the jobs and the members, each at a fixed place, so that the launches
/// of a decode run name the same addresses at every step.
struct KiviWorkRegion {
  KiviWorkCounts *counts;
  KiviStage *stages;
  KiviJob *jobs;
  KiviMember *members;
};

inline KiviWorkRegion carveKiviWork(Carver &carver,
                                    const KiviWorkBounds &bounds) {
  KiviWorkRegion r;
  r.counts = carver.take<KiviWorkCounts>(1);
  r.stages = carver.take<KiviStage>(bounds.stages);
  r.jobs = carver.take<KiviJob>(bounds.jobs);
  r.members = carver.take<KiviMember>(bounds.members);
  return r;
}

/// Workspace bytes of a KIVI work region for kiviWorkBounds(heads, entries,
/// residual, group) (KiviWorkPlan::upload, launchPlannedKivi).
inline uint64_t kiviWorkBytes(int32_t heads, int64_t entries, int32_t residual,
                              int32_t group) {
  Carver carver(nullptr);
  carveKiviWork(carver, kiviWorkBounds(heads, entries, residual, group));
  return carver.bytes();
}

/// Launches the KIVI work uploaded into `region` (carveKiviWork for
/// `bounds`) on `stream`: kiviQuantize over `jobBlocks` blocks, then
/// kiviStageRows over `stageBlocks` blocks and, after them, the blocks of
/// `numWords` table words (with `wordBlocks` >= 0: that many blocks for
/// the words behind the header word at `words`, whose count the kernel
/// reads, WordsBy::PlannedStores). k and v are the tensors the jobs' input
/// rows are offsets into.
template <int D, int kBits, int KG, kvc_dtype_t T>
kvc_status_t launchKiviWork(void *region, const KiviWorkBounds &bounds,
                            int64_t jobBlocks, int64_t stageBlocks,
                            const float *k, const float *v,
                            const TableWord *words, int32_t numWords,
                            cudaStream_t stream, const char *name,
                            int64_t wordBlocks = -1) {
  Carver at(region);
  const KiviWorkRegion r = carveKiviWork(at, bounds);
  if (jobBlocks > 0) {
    kiviQuantize<D, kBits, KG, T><<<static_cast<unsigned>(jobBlocks), D, 0,
                                    stream>>>(r.jobs, r.members, r.counts, k,
                                              v);
    KVC_CUDA_CHECK(name, cudaGetLastError());
  }
  const bool counted = wordBlocks >= 0;
  if (!counted)
    wordBlocks = (numWords + D - 1) / D;
  if (stageBlocks + wordBlocks > 0) {
    kiviStageRows<D, T><<<static_cast<unsigned>(stageBlocks + wordBlocks), D,
                          0, stream>>>(r.stages,
                                       static_cast<int32_t>(stageBlocks),
                                       r.counts, k, v, words, numWords,
                                       counted);
    KVC_CUDA_CHECK(name, cudaGetLastError());
  }
  return KVC_STATUS_OK;
}

/// The launches of the KIVI work of a planned decode step
/// (KiviWorkPlan::upload into `region` for kiviWorkBounds(heads, 1,
/// residual, KG)): grids for the most work of a step, whose blocks past the
/// uploaded counts return, so that the launches are the same at every step
/// of a batch (a decode run captured in a CUDA graph). The staging also
/// writes the table words that the plan's upload left behind the
/// HeadTables at `tables` (WordsBy::PlannedStores), their count read on
/// the device, with as many threads as launchPlannedStores gives its
/// words (plannedWordBlocks) in blocks of D, at least one block.
template <int D, int kBits, int KG, kvc_dtype_t T>
kvc_status_t launchPlannedKivi(void *region, const HeadTable *tables,
                               int32_t heads, int32_t residual,
                               const float *k, const float *v,
                               cudaStream_t stream, const char *name) {
  const KiviWorkBounds bounds = kiviWorkBounds(heads, 1, residual, KG);
  // A KIVI step's words: about three a head, and a window's worth where
  // a block of keys leaves it (the blocks loop over more).
  const int64_t wordBlocks =
      std::max<int64_t>(plannedWordBlocks(heads) * kStoreThreads / D, 1);
  return launchKiviWork<D, kBits, KG, T>(
      region, bounds, bounds.jobs, bounds.stages, k, v,
      DeviceTables::plannedWords(tables, heads), 0, stream, name,
      wordBlocks);
}

/// The data work of the latest kvc_append of some heads
/// (kvc_kivi_pending_work), turned into device jobs: addresses of packed
/// rows, parameter records and residual rows, and offsets of float input
/// rows into the k and v tensors the launch is given.
class KiviWorkPlan {
public:
  /// Adds the work of kv-head `head`. Input j of the append is row
  /// inputRows[j] (j when null) of the float32 k/v tensors, whose rows are
  /// kvStride floats apart (head h at h * D).
  template <int D, kvc_dtype_t T>
  kvc_status_t add(kvc_context_t *context, uint64_t sequence, int32_t layer,
                   int32_t head, const kvc_page_layout_t &layout,
                   int32_t pageSize, int32_t group, const int32_t *inputRows,
                   int64_t kvStride) {
    kvc_kivi_work_t work;
    KVC_CUDA_TRY(kvc_kivi_pending_work(context, sequence, layer, head, &work));
    return addRecord<D, T>(work, head, layout, pageSize, group, inputRows,
                           kvStride);
  }

  /// Adds the work of a decode step's appends (kvc_append_step: one entry
  /// per kv-head of each sequence, input row b for sequences[b]), read in
  /// one call (kvc_kivi_step_work); records() then holds the records, in
  /// the order of the batch's heads.
  template <int D, kvc_dtype_t T>
  kvc_status_t addStep(kvc_context_t *context, int32_t layer, int32_t batch,
                       const uint64_t *sequences, int32_t kvHeads,
                       const kvc_page_layout_t &layout, int32_t pageSize,
                       int32_t group, int64_t kvStride) {
    // A step's work per head: a stage and at most one value, and every G
    // steps a block of G keys.
    const size_t heads = static_cast<size_t>(batch) * kvHeads;
    try {
      records_.resize(heads);
      jobs_.reserve(jobs_.size() + 2 * heads);
      members_.reserve(members_.size() + 2 * heads);
      stages_.reserve(stages_.size() + heads);
    } catch (const std::bad_alloc &) {
      return kvc_report_error(KVC_STATUS_OUT_OF_MEMORY,
                              "kvc cuda: host KIVI work allocation failed");
    }
    KVC_CUDA_TRY(
        kvc_kivi_step_work(context, layer, batch, sequences, records_.data()));
    for (int32_t i = 0; i < batch * kvHeads; ++i) {
      const int32_t row = i / kvHeads;
      KVC_CUDA_TRY((addRecord<D, T>(records_[i], i % kvHeads, layout, pageSize,
                                    group, &row, kvStride)));
    }
    return KVC_STATUS_OK;
  }

  /// The records addStep read (one per head of the batch), for the device
  /// tables' window words (DeviceTables::upload); null before addStep.
  const kvc_kivi_work_t *records() const {
    return records_.empty() ? nullptr : records_.data();
  }

private:
  /// The jobs of one head's record. A job's page address comes from the
  /// record's page ids (one page class: byte pages_offset + id * page_bytes
  /// of the pool).
  template <int D, kvc_dtype_t T>
  kvc_status_t addRecord(const kvc_kivi_work_t &work, int32_t head,
                         const kvc_page_layout_t &layout, int32_t pageSize,
                         int32_t group, const int32_t *inputRows,
                         int64_t kvStride) {
    const uint64_t rowBytes = static_cast<uint64_t>(D) * Element<T>::kBytes;
    const uint64_t residual = reinterpret_cast<uint64_t>(work.residual);
    const uint64_t pool = residual - work.residual_offset;
    const uint64_t valueRows = static_cast<uint64_t>(work.residual_length);
    auto inputRow = [&](int32_t input) {
      const int64_t row = inputRows ? inputRows[input] : input;
      return row * kvStride + static_cast<int64_t>(head) * D;
    };
    auto source = [&](const kvc_kivi_row_t &r, bool key) {
      if (r.input >= 0)
        return KiviSource{static_cast<uint64_t>(inputRow(r.input)), 1, 0};
      return KiviSource{residual + (static_cast<uint64_t>(r.residual_row) +
                                    (key ? 0 : valueRows)) *
                                       rowBytes,
                        0, 0};
    };
    auto pageOf = [&](int32_t slot, uint64_t *address) -> kvc_status_t {
      const int32_t p = slot / pageSize;
      const int32_t id = p >= 0 && p < work.num_pages ? work.pages[p] : -1;
      if (id < 0)
        return kvc_report_error(
            KVC_STATUS_INTERNAL,
            "kvc cuda: a KIVI work row names a slot of an unmapped page");
      *address = pool + layout.pages_offset +
                 static_cast<uint64_t>(id) * layout.page_bytes;
      return KVC_STATUS_OK;
    };
    try {
      for (int32_t i = 0; i < work.num_values; ++i) {
        const kvc_kivi_row_t &r = work.values[i];
        uint64_t page = 0;
        KVC_CUDA_TRY(pageOf(r.slot, &page));
        const uint64_t o = static_cast<uint64_t>(r.slot % pageSize);
        jobs_.push_back({page + layout.value_param_offset +
                             o * layout.value_param_stride,
                         static_cast<int32_t>(members_.size()), 1, 0, 0});
        members_.push_back(
            {source(r, false), page + layout.value_offset + o * layout.value_stride});
      }
      for (int32_t b = 0; b < work.num_key_blocks; ++b) {
        const int32_t first = work.key_block_begin[b];
        const int32_t count = work.key_block_begin[b + 1] - first;
        const int32_t lead = work.key_members[first].slot;
        uint64_t page = 0;
        KVC_CUDA_TRY(pageOf(lead, &page));
        const uint64_t block = static_cast<uint64_t>(lead % pageSize / group);
        jobs_.push_back({page + layout.key_param_offset +
                             block * layout.key_param_stride,
                         static_cast<int32_t>(members_.size()), count, 1, 0});
        for (int32_t t = 0; t < count; ++t) {
          const kvc_kivi_row_t &r = work.key_members[first + t];
          const uint64_t o = static_cast<uint64_t>(r.slot % pageSize);
          members_.push_back(
              {source(r, true), page + layout.key_offset + o * layout.key_stride});
        }
      }
      for (int32_t i = 0; i < work.num_stages; ++i) {
        const kvc_kivi_row_t &r = work.stages[i];
        const uint64_t row = static_cast<uint64_t>(r.residual_row);
        stages_.push_back({inputRow(r.input), residual + row * rowBytes,
                           residual + (valueRows + row) * rowBytes});
      }
    } catch (const std::bad_alloc &) {
      return kvc_report_error(KVC_STATUS_OUT_OF_MEMORY,
                              "kvc cuda: host KIVI work allocation failed");
    }
    return KVC_STATUS_OK;
  }

public:
  /// Queues on `stream` the copy of the jobs into `region` (kiviWorkBytes
  /// long, laid out by carveKiviWork for `bounds`): the counts, then each
  /// list at its place, in one copy from a pinned image that ends with the
  /// last member (PinnedStaging).
  kvc_status_t upload(void *region, const KiviWorkBounds &bounds,
                      cudaStream_t stream, const char *name) {
    if (static_cast<int64_t>(jobs_.size()) > bounds.jobs ||
        static_cast<int64_t>(members_.size()) > bounds.members ||
        static_cast<int64_t>(stages_.size()) > bounds.stages)
      return kvc_report_error(KVC_STATUS_INTERNAL,
                              "kvc cuda: KIVI work exceeds its workspace");
    if (!region)
      return kvc_report_error(KVC_STATUS_INTERNAL,
                              "kvc cuda: KIVI work without a workspace");
    // Offsets into the region (and the image) of each list.
    Carver carver(region);
    const KiviWorkRegion at = carveKiviWork(carver, bounds);
    auto offset = [region](const void *p) {
      return static_cast<uint64_t>(static_cast<const char *>(p) -
                                   static_cast<const char *>(region));
    };
    const uint64_t bytes =
        offset(at.members) + sizeof(KiviMember) * members_.size();
    PinnedStaging &staging = pinnedStaging();
    char *image = nullptr;
    KVC_CUDA_TRY(staging.take(bytes, name, &image));
    // Each list at its place and zeros between them, so that the copy's
    // bytes do not depend on what the staging memory held.
    uint64_t filled = 0;
    auto put = [&](const void *items, uint64_t size, const void *to) {
      const uint64_t from = offset(to);
      std::memset(image + filled, 0, from - filled);
      if (size)
        std::memcpy(image + from, items, size);
      filled = from + size;
    };
    const KiviWorkCounts counts{static_cast<int32_t>(jobs_.size()),
                                static_cast<int32_t>(stages_.size())};
    put(&counts, sizeof(counts), at.counts);
    put(stages_.data(), sizeof(KiviStage) * stages_.size(), at.stages);
    put(jobs_.data(), sizeof(KiviJob) * jobs_.size(), at.jobs);
    put(members_.data(), sizeof(KiviMember) * members_.size(), at.members);
    KVC_CUDA_CHECK(name, cudaMemcpyAsync(region, image, bytes,
                                         cudaMemcpyHostToDevice, stream));
    KVC_CUDA_TRY(staging.queued(stream, name));
    return KVC_STATUS_OK;
  }

  /// Uploads the jobs into `region` (kiviWorkBytes long, for `bounds`) and
  /// launches the quantization, then the staging, on `stream`, with grids
  /// of the work's size; the input rows are those of k and v. With
  /// `tables` (a decode step whose upload left its words to the stores,
  /// WordsBy::Stores), the staging launch writes the step's table words
  /// too, or a writeTableWords launch where nothing is staged.
  template <int D, int kBits, int KG, kvc_dtype_t T>
  kvc_status_t launch(void *region, const KiviWorkBounds &bounds,
                      const float *k, const float *v, cudaStream_t stream,
                      const char *name, DeviceTables *tables = nullptr) {
    const TableWord *words = nullptr;
    int32_t numWords = 0;
    if (tables)
      KVC_CUDA_TRY(tables->takeDeferredWords(&words, &numWords));
    if (stages_.empty() && numWords > 0) {
      writeTableWords<256><<<static_cast<unsigned>((numWords + 255) / 256),
                             256, 0, stream>>>(words, numWords);
      KVC_CUDA_CHECK(name, cudaGetLastError());
      numWords = 0;
    }
    if (jobs_.empty() && stages_.empty())
      return KVC_STATUS_OK;
    KVC_CUDA_TRY(upload(region, bounds, stream, name));
    return launchKiviWork<D, kBits, KG, T>(
        region, bounds, static_cast<int64_t>(jobs_.size()),
        static_cast<int64_t>(stages_.size()), k, v, words, numWords, stream,
        name);
  }

private:
  std::vector<KiviJob> jobs_;
  std::vector<KiviMember> members_;
  std::vector<KiviStage> stages_;
  std::vector<kvc_kivi_work_t> records_;
};

KVC_CUDA_OVERRIDES_END
} // namespace kvc::cuda

#endif // KVC_RUNTIME_KVC_CUDA_CUH
