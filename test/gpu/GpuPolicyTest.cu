//===- GpuPolicyTest.cu - CUDA backend vs CPU backend ---------------------===//
//
// Every bundled policy with a device format, compiled for CUDA and for the
// CPU with the geometry this executable was built for, runs the same prefill
// (1100 tokens, not a multiple of the page size) and decode steps on both
// backends. The CPU backend is checked against the reference oracle by
// test/codegen; here the GPU must agree with it:
//  - attention outputs within 5e-4 absolute (float sums in different orders,
//    each within 2e-4 of the double oracle);
//  - kept positions identical, except at most kMaxBoundarySwaps entries per
//    head whose scores tie with the selection boundary up to float order;
//  - score state within 1e-3 relative (H2O's accumulated attention, RPC's
//    window sum, the global budget's stored SnapKV scores);
//  - importance bits (Scissorhands) identical, except for at most
//    kMaxHistoryMismatches entries per head whose words differ in at most
//    kMaxHistoryBits bits: a step's bit compares a float weight with the
//    threshold, and weights that lie within float rounding of it may fall on
//    either side on the two backends;
//  - stored keys and values bit-identical (both round the same floats),
//    except for policies that merge evicted entries into kept ones: their
//    merged rows come from sums in a different order (CaM's weights from
//    float attention statistics), so they agree within kMergeTolerance
//    relative, two units of bf16 precision.
// KIVI policies (kivi2, kivi4, snapkv_kivi2) run on a KIVI device pool,
// where the generated CUDA performs the quantization work the runtime
// records for each append, against the CPU backend on a host KIVI pool.
// They run residual + 2 decode steps, so that values leave the window at
// every step and a block of keys is quantized during decode. Per kept
// position both sides must report the same key and value formats, and the
// bytes must be equal: residual rows (keys and values still in full
// precision), quantized value rows and their {scale, min} records, and
// quantized key rows with their block's record wherever the block holds
// the same positions on both sides (a boundary swap of snapkv_kivi2 moves
// the later entries of a head to other blocks, whose per-channel ranges
// then differ legitimately).
// Mixed precision (mixed_precision: int8 high, int2 low in groups of 32)
// runs on a device pool with a low page class against the CPU backend on a
// host pool with the same classes: every head must hold as many entries of
// each class on both sides, the formats of a position may differ only for
// at most kMaxBoundarySwaps entries per head whose ranks tie with the
// boundary up to float order (their decode outputs then agree within
// kClassSwapTolerance only: one entry is read in int8 on one side and in
// int2 on the other), and the bytes of every position stored in the same
// class on both sides must be equal: rows and parameter records of the
// high pages (int8 with its scale) and of the low pages (packed codes and
// {scale, min} pairs), each page read with its class's layout. The page
// class the runtime reports must be the entries' format.
// The global budget (snapkv_global) prefills every layer, then calls the
// select kernel once on each side (host code over the scores each prefill
// stored); heads keep different counts, so a boundary swap may move an
// entry between heads: per-head counts may differ by kMaxBoundarySwaps,
// the total kept must be equal.
// The batch test (several sequences of different lengths per call) runs
// H2O, TOVA, RPC and SnapKV a second time through the decode step in three
// calls, each layer's run captured once in a CUDA graph and replayed at
// every later step, then checks that the misuses of the three calls are
// refused (runBatch with `graph`).
// Every device buffer (the pools, the workspaces, the inputs) starts with
// 0x7f in every byte, not zeros, on a device as on the emulator: a policy
// must not read pool or workspace bytes it did not write.
// Exits 77 (skipped) when no CUDA device is usable.
//
//===----------------------------------------------------------------------===//

#include "kvc_adakv_cpu.h"
#include "kvc_adakv_cuda.h"
#include "kvc_cam_cpu.h"
#include "kvc_cam_cuda.h"
#include "kvc_d2o_cpu.h"
#include "kvc_d2o_cuda.h"
#include "kvc_h2o_cpu.h"
#include "kvc_h2o_cuda.h"
#include "kvc_h2o_merge_cpu.h"
#include "kvc_h2o_merge_cuda.h"
#include "kvc_kivi2_cpu.h"
#include "kvc_kivi2_cuda.h"
#include "kvc_kivi4_cpu.h"
#include "kvc_kivi4_cuda.h"
#include "kvc_merge_nearest_cpu.h"
#include "kvc_merge_nearest_cuda.h"
#include "kvc_mixed_precision_cpu.h"
#include "kvc_mixed_precision_cuda.h"
#include "kvc_pyramidkv_cpu.h"
#include "kvc_pyramidkv_cuda.h"
#include "kvc_pyramidkv_small_adakv_cpu.h"
#include "kvc_pyramidkv_small_adakv_cuda.h"
#include "kvc_pyramidkv_small_cpu.h"
#include "kvc_pyramidkv_small_cuda.h"
#include "kvc_rpc_small_cpu.h"
#include "kvc_rpc_small_cuda.h"
#include "kvc_scissorhands_cpu.h"
#include "kvc_scissorhands_cuda.h"
#include "kvc_snapkv_cpu.h"
#include "kvc_snapkv_cuda.h"
#include "kvc_snapkv_global_cpu.h"
#include "kvc_snapkv_global_cuda.h"
#include "kvc_snapkv_kivi2_cpu.h"
#include "kvc_snapkv_kivi2_cuda.h"
#include "kvc_streaming_llm_cpu.h"
#include "kvc_streaming_llm_cuda.h"
#include "kvc_tova_cpu.h"
#include "kvc_tova_cuda.h"
#if KVC_TEST_HEAD_CLASSES
#include "kvc_duo_small_cpu.h"
#include "kvc_duo_small_cuda.h"
#endif

#include "runtime/kvc_policy_api.h"
#include "test/reference/PolicyInputs.h"
#include "runtime/kvc_runtime.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <random>
#include <set>
#include <string>
#include <vector>

namespace {

constexpr int kLayers = KVC_TEST_LAYERS;
constexpr int kQHeads = KVC_TEST_Q_HEADS;
constexpr int kKvHeads = KVC_TEST_KV_HEADS;
constexpr int kDim = KVC_TEST_HEAD_DIM;
constexpr int kPrompt = 1100;
constexpr int kDecodeSteps = 5;
constexpr int kPageSize = 32;
constexpr double kOutputTolerance = 5e-4;
constexpr double kStateTolerance = 1e-3;
constexpr int kMaxBoundarySwaps = 2;
constexpr double kMergeTolerance = 8e-3;
constexpr int kMaxHistoryMismatches = 4;
constexpr int kMaxHistoryBits = 2;
constexpr double kClassSwapTolerance = 5e-2;

/// The select kernel of a global budget on both backends (host code, with a
/// host workspace on both): called once after the prefill of every layer.
struct SelectApi {
  kvc_workspace_bytes_fn cpuBytes;
  kvc_select_fn cpu;
  kvc_workspace_bytes_fn cudaBytes;
  kvc_select_fn cuda;
};

/// Both backends of one policy.
struct Api {
  const char *name;
  /// The policy keeps score state into decode (importance bits are always
  /// compared).
  bool state;
  /// The policy merges evicted prompt entries into kept ones.
  bool merges;
  kvc_configure_fn cpuConfigure;
  kvc_workspace_bytes_fn cpuPrefillBytes;
  kvc_cpu_prefill_fn cpuPrefill;
  kvc_workspace_bytes_fn cpuDecodeBytes;
  kvc_cpu_decode_fn cpuDecode;
  kvc_configure_fn cudaConfigure;
  kvc_workspace_bytes_fn cudaPrefillBytes;
  kvc_cuda_prefill_fn cudaPrefill;
  kvc_workspace_bytes_fn cudaDecodeBytes;
  kvc_cuda_decode_fn cudaDecode;
  /// Null members for policies without a global budget.
  SelectApi select;
};

#define KVC_API(p, state, merges)                                              \
  Api {                                                                        \
    #p, state, merges, kvc_##p##_cpu_configure, kvc_##p##_cpu_prefill_workspace_bytes,        \
        kvc_##p##_cpu_prefill, kvc_##p##_cpu_decode_workspace_bytes,           \
        kvc_##p##_cpu_decode, kvc_##p##_cuda_configure,                        \
        kvc_##p##_cuda_prefill_workspace_bytes, kvc_##p##_cuda_prefill,        \
        kvc_##p##_cuda_decode_workspace_bytes, kvc_##p##_cuda_decode,          \
        SelectApi {}                                                           \
  }

/// A policy with a global budget: KVC_API plus its select kernel.
#define KVC_API_GLOBAL(p, state, merges)                                       \
  Api {                                                                        \
    #p, state, merges, kvc_##p##_cpu_configure, kvc_##p##_cpu_prefill_workspace_bytes,        \
        kvc_##p##_cpu_prefill, kvc_##p##_cpu_decode_workspace_bytes,           \
        kvc_##p##_cpu_decode, kvc_##p##_cuda_configure,                        \
        kvc_##p##_cuda_prefill_workspace_bytes, kvc_##p##_cuda_prefill,        \
        kvc_##p##_cuda_decode_workspace_bytes, kvc_##p##_cuda_decode,          \
        SelectApi {                                                            \
      kvc_##p##_cpu_select_workspace_bytes, kvc_##p##_cpu_select,              \
          kvc_##p##_cuda_select_workspace_bytes, kvc_##p##_cuda_select         \
    }                                                                          \
  }

int failures = 0;

void fail(const std::string &what) {
  ++failures;
  if (failures <= 50)
    std::fprintf(stderr, "FAIL: %s\n", what.c_str());
}

#define CUDA_OK(...)                                                           \
  do {                                                                         \
    cudaError_t e_ = (__VA_ARGS__);                                            \
    if (e_ != cudaSuccess) {                                                   \
      fail(std::string(#__VA_ARGS__) + ": " + cudaGetErrorString(e_));         \
      return;                                                                  \
    }                                                                          \
  } while (0)

#define KVC_OK(...)                                                            \
  do {                                                                         \
    kvc_status_t s_ = (__VA_ARGS__);                                           \
    if (s_ != KVC_STATUS_OK) {                                                 \
      fail(std::string(#__VA_ARGS__) + ": " + kvc_last_error());              \
      return;                                                                  \
    }                                                                          \
  } while (0)

/// Random q, k, v for `tokens` tokens: the inputs of test/codegen's suite
/// (kvc::ref::makeLayerInputs).
using Inputs = kvc::ref::LayerInputs;

/// What KVC_GPU_TEST_SEED adds to every generator's seed: 0 (the inputs
/// the suite always ran) when unset. Other values draw other q, k and v
/// of the same shapes, to look for data on which the backends part.
uint32_t gSeedOffset = 0;

Inputs makeInputs(std::mt19937 &rng, int tokens, bool structured,
                  int firstPosition) {
  return kvc::ref::makeLayerInputs(rng, tokens, kQHeads, kKvHeads, kDim,
                                   structured, firstPosition);
}

/// A device buffer freed on scope exit, every byte kFreshByte once
/// allocated: the pools and workspaces an engine hands a policy hold what
/// was there before (a freshly mapped allocation may read as zeros on a
/// device), so the suite runs every policy on memory it did not zero.
struct DeviceBuffer {
  static constexpr int kFreshByte = 0x7f;
  void *ptr = nullptr;
  size_t bytes = 0;
  cudaError_t allocate(size_t n) {
    bytes = n;
    const cudaError_t error = cudaMalloc(&ptr, n ? n : 1);
    return error != cudaSuccess ? error
                                : cudaMemset(ptr, kFreshByte, n ? n : 1);
  }
  ~DeviceBuffer() { cudaFree(ptr); }
  template <typename T> T *as() const { return static_cast<T *>(ptr); }
};

/// position -> slot of the live entries of one head.
std::map<int, int> liveSlots(kvc_context_t *context, int layer, int head) {
  kvc_metadata_t meta{};
  std::map<int, int> live;
  if (kvc_get_metadata(context, 0, layer, head, &meta) != KVC_STATUS_OK)
    return live;
  for (int s = 0; s < meta.num_slots; ++s)
    if (meta.position[s] != KVC_POSITION_NONE)
      live[meta.position[s]] = s;
  return live;
}

/// Bytes of one full-precision element.
#if defined(KVC_TEST_DTYPE_f16) || defined(KVC_TEST_DTYPE_bf16)
constexpr uint64_t kElementBytes = 2;
#else
constexpr uint64_t kElementBytes = 4;
#endif

/// Element c of a stored full-precision row.
float decodeElement(const uint8_t *row, int c) {
#if defined(KVC_TEST_DTYPE_f16) || defined(KVC_TEST_DTYPE_bf16)
  uint16_t bits;
  std::memcpy(&bits, row + 2 * c, 2);
#if defined(KVC_TEST_DTYPE_f16)
  return kvc_f16_to_f32(bits);
#else
  return kvc_bf16_to_f32(bits);
#endif
#else
  float f;
  std::memcpy(&f, row + 4 * c, 4);
  return f;
#endif
}

bool isKivi(const kvc_config_t &config) {
  return config.format == KVC_FORMAT_KIVI_INT2 ||
         config.format == KVC_FORMAT_KIVI_INT4;
}

/// Differences between the stored bytes of the two backends: how many, and
/// the first one's description.
struct Mismatches {
  int count = 0;
  std::string first;

  void note(const std::string &what) {
    if (count++ == 0)
      first = what;
  }
  /// `bytes` at x and y (either null when the entry was not found) must be
  /// equal.
  void bytes(const uint8_t *x, const uint8_t *y, uint64_t n, int pos,
             const char *what) {
    if (n == 0 || (x && y && std::memcmp(x, y, n) == 0))
      return;
    note(std::string(what) + " of position " + std::to_string(pos) +
         (x && y ? "" : " (not found)"));
  }
  void report(const std::string &where, const char *what) const {
    if (count)
      fail(where + ": " + std::to_string(count) + " " + what +
           " differ from the cpu backend's (first: " + first + ")");
  }
};


/// The pool bytes of one side as the host reads them: a host pool in place
/// (`copy` null), or `copy`, the host copy of a device pool at `base`.
struct PoolView {
  kvc_context_t *context;
  const uint8_t *copy;
  const uint8_t *base;

  /// First byte of the page holding `slot`, or null.
  const uint8_t *page(int layer, int head, int slot) const {
    void *address = nullptr;
    if (kvc_get_page(context, 0, layer, head, slot / kPageSize, nullptr,
                     nullptr, &address) != KVC_STATUS_OK ||
        !address)
      return nullptr;
    const auto *p = static_cast<const uint8_t *>(address);
    return copy ? copy + (p - base) : p;
  }
};

/// The KIVI state of one head on one side: the metadata, the residual
/// region and which slot each residual row holds.
struct KiviHeadView {
  explicit KiviHeadView(const PoolView &pool) : pool(pool) {}

  PoolView pool;
  kvc_metadata_t meta{};
  const uint8_t *residual = nullptr;
  int32_t residualLength = 0;
  /// slot -> residual row.
  std::map<int, int> rows;

  bool load(int layer, int head) {
    kvc_kivi_work_t work{};
    if (kvc_get_metadata(pool.context, 0, layer, head, &meta) !=
            KVC_STATUS_OK ||
        kvc_kivi_pending_work(pool.context, 0, layer, head, &work) !=
            KVC_STATUS_OK)
      return false;
    residual = pool.copy ? pool.copy + work.residual_offset
                         : static_cast<const uint8_t *>(work.residual);
    residualLength = work.residual_length;
    for (int32_t r = 0; r < work.residual_length; ++r)
      if (work.residual_slot[r] >= 0)
        rows[work.residual_slot[r]] = r;
    return true;
  }
  /// Residual key (value: `value`) row of the entry in `slot`, or null.
  const uint8_t *residualRow(int slot, bool value) const {
    auto it = rows.find(slot);
    if (it == rows.end())
      return nullptr;
    const uint64_t row =
        static_cast<uint64_t>(it->second) + (value ? residualLength : 0);
    return residual + row * kDim * kElementBytes;
  }
  /// Positions of the slots of the key block holding `slot`
  /// (KVC_POSITION_NONE for free ones).
  std::vector<int32_t> blockPositions(int slot, int group) const {
    std::vector<int32_t> positions(group, KVC_POSITION_NONE);
    const int first = slot / group * group;
    for (int i = 0; i < group && first + i < meta.num_slots; ++i)
      positions[i] = meta.position[first + i];
    return positions;
  }
};

/// Compares the stored bytes of the KIVI entries that both backends kept in
/// one (layer, head) (a, b: position -> slot): formats, residual rows,
/// quantized value rows and records, and quantized key rows and block
/// records where the block holds the same positions on both sides. Both
/// backends append kept entries in ascending position order, so blocks
/// differ only when the kept sets do.
void compareKiviEntries(const std::string &where, const PoolView &cpuPool,
                        const PoolView &gpuPool,
                        const kvc_page_layout_t &layout,
                        const kvc_config_t &config, int layer, int head,
                        const std::map<int, int> &a,
                        const std::map<int, int> &b) {
  KiviHeadView c(cpuPool), g(gpuPool);
  if (!c.load(layer, head) || !g.load(layer, head)) {
    fail(where + ": KIVI state: " + kvc_last_error());
    return;
  }
  const int group = config.group_size;
  const uint64_t rowBytes = kDim * kElementBytes;
  bool sameKept = a.size() == b.size();
  for (auto &[pos, slot] : a)
    sameKept = sameKept && b.count(pos);
  Mismatches mismatches;
  auto check = [&](const uint8_t *x, const uint8_t *y, uint64_t bytes, int pos,
                   const char *what) { mismatches.bytes(x, y, bytes, pos, what); };
  for (auto &[pos, sa] : a) {
    auto it = b.find(pos);
    if (it == b.end())
      continue;
    const int sb = it->second;
    const int keyFormat = c.meta.key_format[sa];
    const int valueFormat = c.meta.value_format[sa];
    if (keyFormat != g.meta.key_format[sb] ||
        valueFormat != g.meta.value_format[sb]) {
      mismatches.note("formats of position " + std::to_string(pos) +
                      ": gpu key " + std::to_string(g.meta.key_format[sb]) +
                      " value " + std::to_string(g.meta.value_format[sb]) +
                      ", cpu key " + std::to_string(keyFormat) + " value " +
                      std::to_string(valueFormat));
      continue;
    }
    const uint8_t *pa = c.pool.page(layer, head, sa);
    const uint8_t *pb = g.pool.page(layer, head, sb);
    const uint64_t oa = sa % kPageSize, ob = sb % kPageSize;
    if (keyFormat == KVC_FORMAT_FULL) {
      check(c.residualRow(sa, false), g.residualRow(sb, false), rowBytes, pos,
            "residual key row");
    } else if (c.blockPositions(sa, group) != g.blockPositions(sb, group)) {
      if (sameKept)
        mismatches.note("positions of the key block of position " +
                        std::to_string(pos));
    } else {
      check(pa ? pa + layout.key_offset + oa * layout.key_stride : nullptr,
            pb ? pb + layout.key_offset + ob * layout.key_stride : nullptr,
            layout.key_stride, pos, "key row");
      check(pa ? pa + layout.key_param_offset +
                     oa / group * layout.key_param_stride
               : nullptr,
            pb ? pb + layout.key_param_offset +
                     ob / group * layout.key_param_stride
               : nullptr,
            layout.key_param_stride, pos, "key block record");
    }
    if (valueFormat == KVC_FORMAT_FULL) {
      check(c.residualRow(sa, true), g.residualRow(sb, true), rowBytes, pos,
            "residual value row");
    } else {
      check(pa ? pa + layout.value_offset + oa * layout.value_stride : nullptr,
            pb ? pb + layout.value_offset + ob * layout.value_stride : nullptr,
            layout.value_stride, pos, "value row");
      check(pa ? pa + layout.value_param_offset + oa * layout.value_param_stride
               : nullptr,
            pb ? pb + layout.value_param_offset + ob * layout.value_param_stride
               : nullptr,
            layout.value_param_stride, pos, "value record");
    }
  }
  mismatches.report(where, "KIVI rows, records or formats");
}

/// Mixed precision: the entries of one (layer, head) that both backends
/// kept (a, b: position -> slot), with `high` and `low` the layouts of the
/// two page classes. Counts of each class must be equal, formats may differ
/// for at most kMaxBoundarySwaps positions (returned through *swaps), and
/// the rows and parameter records of positions stored in the same class
/// must be byte-identical.
void compareMixedEntries(const std::string &where, const PoolView &cpuPool,
                         const PoolView &gpuPool,
                         const kvc_page_layout_t &high,
                         const kvc_page_layout_t &low,
                         const kvc_config_t &config, int layer, int head,
                         const std::map<int, int> &a,
                         const std::map<int, int> &b, int *swaps) {
  kvc_metadata_t ma{}, mb{};
  if (kvc_get_metadata(cpuPool.context, 0, layer, head, &ma) !=
          KVC_STATUS_OK ||
      kvc_get_metadata(gpuPool.context, 0, layer, head, &mb) !=
          KVC_STATUS_OK) {
    fail(where + ": metadata");
    return;
  }
  auto lowCount = [&](const kvc_metadata_t &m, const std::map<int, int> &x) {
    int count = 0;
    for (auto &[pos, slot] : x)
      count += m.key_format[slot] == config.low_format;
    return count;
  };
  const int lowCpu = lowCount(ma, a), lowGpu = lowCount(mb, b);
  if (lowCpu != lowGpu)
    fail(where + ": " + std::to_string(lowGpu) + " low-class entries, cpu " +
         std::to_string(lowCpu));
  Mismatches mismatches;
  int swapped = 0;
  auto check = [&](const uint8_t *x, const uint8_t *y, uint64_t bytes, int pos,
                   const char *what) { mismatches.bytes(x, y, bytes, pos, what); };
  for (auto &[pos, sa] : a) {
    auto it = b.find(pos);
    if (it == b.end())
      continue;
    const int sb = it->second;
    const int format = ma.key_format[sa];
    int32_t pageFormat = -1;
    if (kvc_get_page_format(gpuPool.context, 0, layer, head, sb / kPageSize,
                            &pageFormat) != KVC_STATUS_OK ||
        pageFormat != mb.key_format[sb] ||
        mb.value_format[sb] != mb.key_format[sb] ||
        ma.value_format[sa] != format) {
      mismatches.note("page class of position " + std::to_string(pos));
      continue;
    }
    if (format != mb.key_format[sb]) {
      ++swapped;
      continue;
    }
    const kvc_page_layout_t &l = format == config.low_format ? low : high;
    const uint8_t *pa = cpuPool.page(layer, head, sa);
    const uint8_t *pb = gpuPool.page(layer, head, sb);
    const uint64_t oa = sa % kPageSize, ob = sb % kPageSize;
    check(pa ? pa + l.key_offset + oa * l.key_stride : nullptr,
          pb ? pb + l.key_offset + ob * l.key_stride : nullptr, l.key_stride,
          pos, "key row");
    check(pa ? pa + l.value_offset + oa * l.value_stride : nullptr,
          pb ? pb + l.value_offset + ob * l.value_stride : nullptr,
          l.value_stride, pos, "value row");
    check(pa ? pa + l.key_param_offset + oa * l.key_param_stride : nullptr,
          pb ? pb + l.key_param_offset + ob * l.key_param_stride : nullptr,
          l.key_param_stride, pos, "key record");
    check(pa ? pa + l.value_param_offset + oa * l.value_param_stride
             : nullptr,
          pb ? pb + l.value_param_offset + ob * l.value_param_stride
             : nullptr,
          l.value_param_stride, pos, "value record");
  }
  if (swapped > kMaxBoundarySwaps)
    fail(where + ": " + std::to_string(swapped) +
         " positions are stored in another class than on the cpu backend");
  mismatches.report(where, "rows, records or page classes");
  *swaps += swapped;
}

/// Compares the two caches of one (layer, head): kept positions, score
/// state and stored rows. `countSlack`: by how many entries the kept counts
/// may differ (a global budget's boundary swaps move entries between
/// heads). `lowLayout`: the low page class of a mixed-precision context,
/// whose entries that changed class are added to *classSwaps.
void compareHeads(const std::string &where, kvc_context_t *cpu,
                  kvc_context_t *gpu, const std::vector<uint8_t> &gpuPool,
                  const uint8_t *gpuPoolBase, const kvc_page_layout_t &layout,
                  const kvc_page_layout_t &lowLayout,
                  const kvc_config_t &config, int layer, int head,
                  bool compareState, bool merged, size_t countSlack,
                  int *classSwaps) {
  std::map<int, int> a = liveSlots(cpu, layer, head);
  std::map<int, int> b = liveSlots(gpu, layer, head);
  std::vector<int> onlyCpu, onlyGpu;
  for (auto &[pos, slot] : a)
    if (!b.count(pos))
      onlyCpu.push_back(pos);
  for (auto &[pos, slot] : b)
    if (!a.count(pos))
      onlyGpu.push_back(pos);
  const size_t countDifference =
      a.size() > b.size() ? a.size() - b.size() : b.size() - a.size();
  if (countDifference > countSlack)
    fail(where + ": kept " + std::to_string(b.size()) + " entries, cpu " +
         std::to_string(a.size()));
  else if (std::max(onlyCpu.size(), onlyGpu.size()) >
           static_cast<size_t>(kMaxBoundarySwaps))
    fail(where + ": " +
         std::to_string(std::max(onlyCpu.size(), onlyGpu.size())) +
         " kept entries differ from the cpu backend (first: cpu " +
         (onlyCpu.empty() ? std::string("-") : std::to_string(onlyCpu[0])) +
         ", gpu " +
         (onlyGpu.empty() ? std::string("-") : std::to_string(onlyGpu[0])) +
         ")");
  kvc_metadata_t ma{}, mb{};
  if (kvc_get_metadata(cpu, 0, layer, head, &ma) != KVC_STATUS_OK ||
      kvc_get_metadata(gpu, 0, layer, head, &mb) != KVC_STATUS_OK) {
    fail(where + ": metadata");
    return;
  }
  const bool kivi = isKivi(config);
  const bool mixed = config.low_format != KVC_FORMAT_FULL;
  std::vector<float> key(kDim), value(kDim);
  int historyMismatches = 0;
  for (auto &[pos, slot] : b) {
    auto it = a.find(pos);
    if (it == a.end())
      continue;
    // Importance bits: 0 on both backends for policies without them.
    if (ma.history[it->second] != mb.history[slot]) {
      const int bits =
          __builtin_popcountll(ma.history[it->second] ^ mb.history[slot]);
      if (bits > kMaxHistoryBits)
        fail(where + ": importance bits of position " + std::to_string(pos) +
             " differ from the cpu backend's in " + std::to_string(bits) +
             " bits");
      else if (++historyMismatches == kMaxHistoryMismatches + 1)
        fail(where + ": more than " + std::to_string(kMaxHistoryMismatches) +
             " entries' importance bits differ from the cpu backend's "
             "(position " + std::to_string(pos) + ")");
    }
    if (compareState) {
      const double x = ma.score[it->second], y = mb.score[slot];
      if (std::fabs(x - y) > kStateTolerance * std::max(1.0, std::fabs(x)))
        fail(where + ": state of position " + std::to_string(pos) + " is " +
             std::to_string(y) + ", cpu " + std::to_string(x));
    }
    if (kivi || mixed)
      continue;
    if (kvc_read_entry(cpu, 0, layer, head, it->second, kDim, key.data(),
                       value.data()) != KVC_STATUS_OK) {
      fail(where + ": read cpu entry");
      return;
    }
    void *address = nullptr;
    if (kvc_get_page(gpu, 0, layer, head, slot / kPageSize, nullptr, nullptr,
                     &address) != KVC_STATUS_OK) {
      fail(where + ": gpu page");
      return;
    }
    const size_t page = static_cast<const uint8_t *>(address) - gpuPoolBase;
    const uint64_t o = slot % kPageSize;
    const uint8_t *k = gpuPool.data() + page + layout.key_offset +
                       o * layout.key_stride;
    const uint8_t *v = gpuPool.data() + page + layout.value_offset +
                       o * layout.value_stride;
    auto differs = [&](float gpuValue, float cpuValue) {
      if (!merged)
        return gpuValue != cpuValue;
      return !(std::fabs(gpuValue - cpuValue) <=
               kMergeTolerance * std::max(1.0f, std::fabs(cpuValue)));
    };
    for (int c = 0; c < kDim; ++c)
      if (differs(decodeElement(k, c), key[c]) ||
          differs(decodeElement(v, c), value[c])) {
        fail(where + ": stored row of position " + std::to_string(pos) +
             " differs at channel " + std::to_string(c));
        break;
      }
  }
  if (kivi)
    compareKiviEntries(where, PoolView{cpu, nullptr, nullptr},
                       PoolView{gpu, gpuPool.data(), gpuPoolBase}, layout,
                       config, layer, head, a, b);
  if (mixed)
    compareMixedEntries(where, PoolView{cpu, nullptr, nullptr},
                        PoolView{gpu, gpuPool.data(), gpuPoolBase}, layout,
                        lowLayout, config, layer, head, a, b, classSwaps);
}

/// The larger of two differences, NaN when either is: a NaN output on one
/// side (or both) is a failure that std::max would drop.
double worseOf(double worst, double d) {
  return std::isnan(d) || d > worst ? d : worst;
}

double maxDifference(const std::vector<float> &a, const std::vector<float> &b) {
  double worst = 0.0;
  for (size_t i = 0; i < a.size(); ++i)
    worst = worseOf(worst, static_cast<double>(std::fabs(a[i] - b[i])));
  return worst;
}

/// Copies q, k and v of `in` to the device buffers (large enough).
cudaError_t upload(const Inputs &in, const DeviceBuffer &q,
                   const DeviceBuffer &k, const DeviceBuffer &v) {
  cudaError_t e = cudaMemcpy(q.ptr, in.q.data(), in.q.size() * 4,
                             cudaMemcpyHostToDevice);
  if (e == cudaSuccess)
    e = cudaMemcpy(k.ptr, in.k.data(), in.k.size() * 4,
                   cudaMemcpyHostToDevice);
  if (e == cudaSuccess)
    e = cudaMemcpy(v.ptr, in.v.data(), in.v.size() * 4,
                   cudaMemcpyHostToDevice);
  return e;
}

/// A KVC_POOL_ALIGNMENT-aligned host pool of `bytes` inside `storage`.
void *alignedHostPool(std::vector<uint8_t> &storage, uint64_t bytes) {
  storage.resize(bytes + KVC_POOL_ALIGNMENT);
  const uintptr_t misalign =
      reinterpret_cast<uintptr_t>(storage.data()) % KVC_POOL_ALIGNMENT;
  return storage.data() + (KVC_POOL_ALIGNMENT - misalign) % KVC_POOL_ALIGNMENT;
}

/// Creates a context of `config` over `pool`.
kvc_context_t *makeContext(kvc_config_t config, void *pool, uint64_t bytes) {
  kvc_context_t *context = nullptr;
  if (kvc_context_create(&config, pool, bytes, &context) != KVC_STATUS_OK ||
      kvc_sequence_add(context, 0) != KVC_STATUS_OK) {
    fail(std::string("context: ") + kvc_last_error());
    kvc_context_destroy(context);
    return nullptr;
  }
  return context;
}

void runPolicy(const Api &api, bool structured, cudaStream_t stream) {
  const std::string name =
      std::string(api.name) + (structured ? " structured" : " random");
  std::printf("  %s\n", name.c_str());
  const int before = failures;
  kvc_config_t cpuConfig{}, gpuConfig{};
  api.cpuConfigure(&cpuConfig);
  api.cudaConfigure(&gpuConfig);
  // KIVI: enough steps for every decode step to quantize the value leaving
  // the window and for one step to quantize a block of keys.
  const bool kivi = isKivi(gpuConfig);
  const int decodeSteps = kivi ? gpuConfig.residual_length + 2 : kDecodeSteps;
  for (kvc_config_t *c : {&cpuConfig, &gpuConfig}) {
    c->page_size = kPageSize;
    c->num_pages =
        kLayers * kKvHeads * ((kPrompt + decodeSteps + 64) / kPageSize + 2);
    c->max_sequences = 1;
  }
  cpuConfig.memory = KVC_MEMORY_HOST;
  uint64_t poolBytes = 0;
  KVC_OK(kvc_pool_bytes_required(&gpuConfig, &poolBytes));
  kvc_page_layout_t layout{}, lowLayout{};
  KVC_OK(kvc_page_layout(&gpuConfig, &layout));
  const bool mixed = gpuConfig.low_format != KVC_FORMAT_FULL;
  if (mixed)
    KVC_OK(kvc_low_page_layout(&gpuConfig, &lowLayout, nullptr));
  std::vector<uint8_t> hostPoolStorage;
  void *hostPool = alignedHostPool(hostPoolStorage, poolBytes);
  DeviceBuffer devicePool;
  CUDA_OK(devicePool.allocate(poolBytes));
  kvc_context_t *cpu = makeContext(cpuConfig, hostPool, poolBytes);
  kvc_context_t *gpu = makeContext(gpuConfig, devicePool.ptr, poolBytes);
  if (!cpu || !gpu) {
    kvc_context_destroy(cpu);
    kvc_context_destroy(gpu);
    return;
  }
  struct Cleanup {
    kvc_context_t *a, *b;
    ~Cleanup() {
      kvc_context_destroy(a);
      kvc_context_destroy(b);
    }
  } cleanup{cpu, gpu};

  std::mt19937 rng(4321 + structured + gSeedOffset);
  std::vector<int32_t> positions(kPrompt);
  for (int i = 0; i < kPrompt; ++i)
    positions[i] = i;
  std::vector<char> cpuWorkspace(api.cpuPrefillBytes(kPrompt));
  DeviceBuffer workspace, q, k, v, out;
  CUDA_OK(workspace.allocate(api.cudaPrefillBytes(kPrompt)));
  const size_t qFloats = static_cast<size_t>(kPrompt) * kQHeads * kDim;
  const size_t kvFloats = static_cast<size_t>(kPrompt) * kKvHeads * kDim;
  CUDA_OK(q.allocate(qFloats * 4));
  CUDA_OK(k.allocate(kvFloats * 4));
  CUDA_OK(v.allocate(kvFloats * 4));
  CUDA_OK(out.allocate(qFloats * 4));
  std::vector<uint8_t> gpuPool(poolBytes);

  const bool global = api.select.cpu != nullptr;
  const size_t countSlack = global ? kMaxBoundarySwaps : 0;
  // Returns the entries of the layer that the backends stored in different
  // classes (mixed precision).
  auto compareLayer = [&](const std::string &where, int layer) {
    int classSwaps = 0;
    if (cudaMemcpy(gpuPool.data(), devicePool.ptr, poolBytes,
                   cudaMemcpyDeviceToHost) != cudaSuccess) {
      fail(where + ": pool download");
      return classSwaps;
    }
    for (int h = 0; h < kKvHeads; ++h)
      compareHeads(where + " head " + std::to_string(h), cpu, gpu, gpuPool,
                   devicePool.as<uint8_t>(), layout, lowLayout, gpuConfig,
                   layer, h, api.state, api.merges, countSlack, &classSwaps);
    return classSwaps;
  };
  // Layers whose entries changed class since the prefill (their decode
  // outputs agree within kClassSwapTolerance).
  std::vector<bool> swappedLayers(kLayers, false);

  for (int layer = 0; layer < kLayers; ++layer) {
    Inputs in = makeInputs(rng, kPrompt, structured, 0);
    std::vector<float> cpuOut(qFloats), gpuOut(qFloats);
    KVC_OK(api.cpuPrefill(cpu, 0, layer, kPrompt, in.q.data(), in.k.data(),
                          in.v.data(), positions.data(), cpuOut.data(),
                          cpuWorkspace.data(), cpuWorkspace.size()));
    CUDA_OK(cudaMemcpy(q.ptr, in.q.data(), qFloats * 4, cudaMemcpyHostToDevice));
    CUDA_OK(cudaMemcpy(k.ptr, in.k.data(), kvFloats * 4, cudaMemcpyHostToDevice));
    CUDA_OK(cudaMemcpy(v.ptr, in.v.data(), kvFloats * 4, cudaMemcpyHostToDevice));
    KVC_OK(api.cudaPrefill(gpu, 0, layer, kPrompt, q.as<float>(),
                           k.as<float>(), v.as<float>(), positions.data(),
                           out.as<float>(), workspace.ptr, workspace.bytes,
                           stream));
    CUDA_OK(cudaStreamSynchronize(stream));
    CUDA_OK(cudaMemcpy(gpuOut.data(), out.ptr, qFloats * 4,
                       cudaMemcpyDeviceToHost));
    const std::string where = name + " prefill layer " + std::to_string(layer);
    const double worst = maxDifference(cpuOut, gpuOut);
    if (!(worst < kOutputTolerance))
      fail(where + ": output differs by " + std::to_string(worst));
    swappedLayers[layer] = compareLayer(where, layer) > 0;
  }

  if (global) {
    // One selection over the scores every layer's prefill stored; the CUDA
    // backend's select is host code over the runtime's metadata as well.
    std::vector<char> cpuSelect(api.select.cpuBytes(kPrompt)),
        gpuSelect(api.select.cudaBytes(kPrompt));
    KVC_OK(api.select.cpu(cpu, 0, kPrompt, cpuSelect.data(), cpuSelect.size()));
    KVC_OK(
        api.select.cuda(gpu, 0, kPrompt, gpuSelect.data(), gpuSelect.size()));
    int64_t keptCpu = 0, keptGpu = 0;
    for (int layer = 0; layer < kLayers; ++layer)
      for (int h = 0; h < kKvHeads; ++h) {
        int32_t x = 0, y = 0;
        KVC_OK(kvc_get_num_entries(cpu, 0, layer, h, &x));
        KVC_OK(kvc_get_num_entries(gpu, 0, layer, h, &y));
        keptCpu += x;
        keptGpu += y;
      }
    if (keptCpu != keptGpu)
      fail(name + " select: kept " + std::to_string(keptGpu) +
           " entries in all, cpu " + std::to_string(keptCpu));
    if (keptGpu >= int64_t{kPrompt} * kLayers * kKvHeads)
      fail(name + " select: evicted nothing");
    for (int layer = 0; layer < kLayers; ++layer)
      compareLayer(name + " select layer " + std::to_string(layer), layer);
  }

  for (int step = 0; step < decodeSteps; ++step) {
    const int32_t position = kPrompt + step;
    for (int layer = 0; layer < kLayers; ++layer) {
      Inputs in = makeInputs(rng, 1, structured, position);
      // The workspace covers the head with the most slots (AdaKV's heads
      // keep different counts).
      int32_t slots = 0;
      for (int h = 0; h < kKvHeads; ++h) {
        int32_t n = 0;
        KVC_OK(kvc_get_num_slots(cpu, 0, layer, h, &n));
        slots = std::max(slots, n);
      }
      std::vector<char> ws(api.cpuDecodeBytes(slots + 2 * kPageSize));
      std::vector<float> cpuOut(kQHeads * kDim), gpuOut(kQHeads * kDim);
      KVC_OK(api.cpuDecode(cpu, 0, layer, in.q.data(), in.k.data(),
                           in.v.data(), position, cpuOut.data(), ws.data(),
                           ws.size()));
      // Sized from the CPU context's slot tables before its step, which
      // the GPU context's equal once the last step's victims are evicted:
      // a query of the GPU context here would settle its device tables.
      DeviceBuffer decodeWorkspace;
      CUDA_OK(decodeWorkspace.allocate(
          api.cudaDecodeBytes(slots + 2 * kPageSize)));
      CUDA_OK(upload(in, q, k, v));
      KVC_OK(api.cudaDecode(gpu, 0, layer, q.as<float>(), k.as<float>(),
                            v.as<float>(), position, out.as<float>(),
                            decodeWorkspace.ptr, decodeWorkspace.bytes,
                            stream));
      CUDA_OK(cudaStreamSynchronize(stream));
      CUDA_OK(cudaMemcpy(gpuOut.data(), out.ptr, gpuOut.size() * 4,
                         cudaMemcpyDeviceToHost));
      const std::string where = name + " decode step " + std::to_string(step) +
                                " layer " + std::to_string(layer);
      const double worst = maxDifference(cpuOut, gpuOut);
      const double tolerance =
          swappedLayers[layer] ? kClassSwapTolerance : kOutputTolerance;
      if (!(worst < tolerance))
        fail(where + ": output differs by " + std::to_string(worst));
      // Reading the metadata writes the device-resident slot tables back
      // and detaches them (DeviceTables): comparing after the odd steps and
      // the last leaves the even steps before them on tables the device
      // kept, and the others on tables built from the runtime.
      if (step % 2 == 1 || step == decodeSteps - 1)
        compareLayer(where, layer);
    }
  }
  if (kivi) {
    // The steps quantized the values leaving the window and, in one of
    // them, a block of keys appended during decode.
    for (int layer = 0; layer < kLayers; ++layer)
      for (int h = 0; h < kKvHeads; ++h) {
        kvc_metadata_t meta{};
        KVC_OK(kvc_get_metadata(gpu, 0, layer, h, &meta));
        bool decodeKey = false;
        for (int s = 0; s < meta.num_slots; ++s)
          decodeKey |= meta.position[s] >= kPrompt &&
                       meta.key_format[s] != KVC_FORMAT_FULL;
        if (!decodeKey)
          fail(name + " layer " + std::to_string(layer) + " head " +
               std::to_string(h) +
               ": no key appended during decode was quantized");
      }
  }
  std::printf("    %s\n", failures == before ? "ok" : "FAILED");
}


//===----------------------------------------------------------------------===//
// Batched decode: several sequences of different lengths in one call
//===----------------------------------------------------------------------===//

/// The CUDA backend's decode step in three calls (decode_plan_batch,
/// decode_run_batch, decode_finish_batch), where the policy has them.
struct GraphApi {
  kvc_cuda_decode_plan_batch_fn plan = nullptr;
  kvc_cuda_decode_run_batch_fn run = nullptr;
  kvc_cuda_decode_finish_batch_fn finish = nullptr;
};

/// Both backends' prefill and batch decode of one policy.
struct BatchApi {
  const char *name;
  bool state;
  kvc_configure_fn cpuConfigure;
  kvc_workspace_bytes_fn cpuPrefillBytes;
  kvc_cpu_prefill_fn cpuPrefill;
  kvc_batch_workspace_bytes_fn cpuBatchBytes;
  kvc_cpu_decode_batch_fn cpuBatch;
  kvc_configure_fn cudaConfigure;
  kvc_workspace_bytes_fn cudaPrefillBytes;
  kvc_cuda_prefill_fn cudaPrefill;
  kvc_batch_workspace_bytes_fn cudaBatchBytes;
  kvc_cuda_decode_batch_fn cudaBatch;
  GraphApi graph;
  /// Whether a host access to a layer waits for its decode steps (score
  /// state or victims on the device).
  bool waits;
};

/// Both APIs of policy p, with its step in three calls.
#define KVC_BATCH_API(p, state, waits)                                         \
  BatchApi {                                                                   \
    #p, state, kvc_##p##_cpu_configure,                                        \
        kvc_##p##_cpu_prefill_workspace_bytes, kvc_##p##_cpu_prefill,          \
        kvc_##p##_cpu_decode_batch_workspace_bytes,                            \
        kvc_##p##_cpu_decode_batch, kvc_##p##_cuda_configure,                  \
        kvc_##p##_cuda_prefill_workspace_bytes, kvc_##p##_cuda_prefill,        \
        kvc_##p##_cuda_decode_batch_workspace_bytes,                           \
        kvc_##p##_cuda_decode_batch,                                           \
        GraphApi{kvc_##p##_cuda_decode_plan_batch,                             \
                 kvc_##p##_cuda_decode_run_batch,                              \
                 kvc_##p##_cuda_decode_finish_batch},                          \
        waits                                                                  \
  }

/// The sequences of the batch test and their prompt lengths: one above the
/// budgets of the bundled policies (H2O and TOVA evict at every step), one
/// in between, one within a page; positions of both parities, so that RPC's
/// period of 2 ends for some sequences of a step and not for others.
constexpr uint64_t kBatchSequences[] = {4, 0, 9};
constexpr int32_t kBatchPrompts[] = {kPrompt, 300, 37};
/// A KIVI policy's prompts instead: the first two beyond the residual
/// window of R = 128 (a value to quantize at every step), and 2 and 3
/// appends short of a multiple of R, where the window flushes its R keys
/// (four blocks of G = 32): at step 1 for the first sequence and step 2
/// for the second, after the graph runs' capture at step 0.
constexpr int32_t kKiviBatchPrompts[] = {1022, 253, 37};
constexpr int32_t kBatch = 3;
constexpr int kBatchSteps = 4;
/// Slots per kv-head that the graph runs of the batch test are planned for:
/// the longest prompt and its steps, and room for an append's new page.
constexpr int32_t kGraphCapacity =
    ((kPrompt + kBatchSteps + 2) / kPageSize + 3) * kPageSize;

/// A status and kvc_last_error() that must be `want` and contain `text`.
void expectRefusal(const std::string &where, kvc_status_t got,
                   kvc_status_t want, const std::string &text) {
  const std::string message = kvc_last_error();
  if (got != want || message.find(text) == std::string::npos)
    fail(where + ": got " + kvc_status_string(got) + " \"" + message +
         "\", expected " + kvc_status_string(want) + " with \"" + text + "\"");
}

/// Per layer, the CUDA graph of a batch's decode run, captured once.
struct LayerGraphs {
  cudaGraphExec_t exec[kLayers] = {};
  DeviceBuffer workspace[kLayers];
  ~LayerGraphs() {
    for (cudaGraphExec_t e : exec)
      if (e)
        cudaGraphExecDestroy(e);
  }
};

/// Live positions (and their score state) of one head of `sequence`.
std::map<int, float> liveState(kvc_context_t *context, uint64_t sequence,
                               int layer, int head) {
  std::map<int, float> live;
  kvc_metadata_t meta{};
  if (kvc_get_metadata(context, sequence, layer, head, &meta) != KVC_STATUS_OK) {
    fail(std::string("metadata: ") + kvc_last_error());
    return live;
  }
  for (int s = 0; s < meta.num_slots; ++s)
    if (meta.position[s] != KVC_POSITION_NONE)
      live[meta.position[s]] = meta.score ? meta.score[s] : 0.0f;
  return live;
}

/// The CUDA backend's decode_batch against the CPU backend's (which
/// test/codegen checks against one decode call per sequence, and those
/// against the oracle): the prefill of each sequence (kBatchPrompts or
/// kKiviBatchPrompts), then kBatchSteps steps of the three sequences in
/// one call.
/// Outputs of every sequence within kOutputTolerance, per head the same
/// live positions up to kMaxBoundarySwaps and, for stateful policies, the
/// state within kStateTolerance. `graph`: each GPU step is the policy's
/// plan, a replay
/// of the run that the layer's first step captured in a CUDA graph (global
/// capture mode: a call in the run that waits, allocates or queries fails
/// the capture), and the finish; then the misuses of the three calls are
/// refused with their messages, and the layer stays usable.
void runBatch(const BatchApi &api, cudaStream_t stream, bool graph = false) {
  const std::string name =
      std::string(api.name) + (graph ? " batch graph" : " batch");
  std::printf("  %s\n", name.c_str());
  const int before = failures;
  kvc_config_t cpuConfig{}, gpuConfig{};
  api.cpuConfigure(&cpuConfig);
  api.cudaConfigure(&gpuConfig);
  const int32_t *prompts =
      isKivi(gpuConfig) ? kKiviBatchPrompts : kBatchPrompts;
  if (isKivi(gpuConfig) &&
      (gpuConfig.residual_length != 128 || gpuConfig.group_size != 32))
    fail(name + ": kKiviBatchPrompts are for R = 128 and G = 32");
  int32_t pagesPerHead = 0;
  for (int b = 0; b < kBatch; ++b)
    pagesPerHead += (prompts[b] + kBatchSteps + 64) / kPageSize + 2;
  for (kvc_config_t *c : {&cpuConfig, &gpuConfig}) {
    c->page_size = kPageSize;
    c->num_pages = kLayers * kKvHeads * pagesPerHead;
    c->max_sequences = kBatch;
  }
  cpuConfig.memory = KVC_MEMORY_HOST;
  uint64_t poolBytes = 0;
  KVC_OK(kvc_pool_bytes_required(&gpuConfig, &poolBytes));
  std::vector<uint8_t> hostPoolStorage;
  void *hostPool = alignedHostPool(hostPoolStorage, poolBytes);
  DeviceBuffer devicePool;
  CUDA_OK(devicePool.allocate(poolBytes));
  kvc_context_t *cpu = nullptr, *gpu = nullptr;
  struct Cleanup {
    kvc_context_t **a, **b;
    ~Cleanup() {
      kvc_context_destroy(*a);
      kvc_context_destroy(*b);
    }
  } cleanup{&cpu, &gpu};
  KVC_OK(kvc_context_create(&cpuConfig, hostPool, poolBytes, &cpu));
  KVC_OK(kvc_context_create(&gpuConfig, devicePool.ptr, poolBytes, &gpu));
  for (uint64_t s : kBatchSequences) {
    KVC_OK(kvc_sequence_add(cpu, s));
    KVC_OK(kvc_sequence_add(gpu, s));
  }

  std::mt19937 rng(977 + gSeedOffset);
  const size_t qRow = size_t(kQHeads) * kDim, kvRow = size_t(kKvHeads) * kDim;
  DeviceBuffer q, k, v, out, workspace;
  CUDA_OK(q.allocate(kPrompt * qRow * 4));
  CUDA_OK(k.allocate(kPrompt * kvRow * 4));
  CUDA_OK(v.allocate(kPrompt * kvRow * 4));
  CUDA_OK(out.allocate(kPrompt * qRow * 4));
  CUDA_OK(workspace.allocate(api.cudaPrefillBytes(kPrompt)));
  std::vector<char> cpuWorkspace(api.cpuPrefillBytes(kPrompt));
  for (int b = 0; b < kBatch; ++b)
    for (int layer = 0; layer < kLayers; ++layer) {
      const int32_t n = prompts[b];
      Inputs in = makeInputs(rng, n, true, 0);
      std::vector<int32_t> positions(n);
      for (int32_t i = 0; i < n; ++i)
        positions[i] = i;
      std::vector<float> cpuOut(n * qRow);
      KVC_OK(api.cpuPrefill(cpu, kBatchSequences[b], layer, n, in.q.data(),
                            in.k.data(), in.v.data(), positions.data(),
                            cpuOut.data(), cpuWorkspace.data(),
                            cpuWorkspace.size()));
      CUDA_OK(upload(in, q, k, v));
      KVC_OK(api.cudaPrefill(gpu, kBatchSequences[b], layer, n, q.as<float>(),
                             k.as<float>(), v.as<float>(), positions.data(),
                             out.as<float>(), workspace.ptr, workspace.bytes,
                             stream));
      CUDA_OK(cudaStreamSynchronize(stream));
    }

  LayerGraphs graphs;
  if (graph)
    for (int layer = 0; layer < kLayers; ++layer)
      CUDA_OK(graphs.workspace[layer].allocate(
          api.cudaBatchBytes(kBatch, kGraphCapacity)));
  // One step of the GPU context's layer in three calls; the run is
  // captured at the layer's first step and replayed after.
  auto graphStep = [&](int layer, const int32_t *positions) {
    DeviceBuffer &ws = graphs.workspace[layer];
    KVC_OK(api.graph.plan(gpu, kBatch, kBatchSequences, layer, positions,
                          kGraphCapacity, ws.ptr, ws.bytes, stream));
    if (!graphs.exec[layer]) {
      CUDA_OK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal));
      const kvc_status_t status = api.graph.run(
          gpu, kBatch, layer, q.as<float>(), k.as<float>(), v.as<float>(),
          out.as<float>(), kGraphCapacity, ws.ptr, ws.bytes, stream);
      const std::string message = kvc_last_error();
      cudaGraph_t captured = nullptr;
      const cudaError_t ended = cudaStreamEndCapture(stream, &captured);
      if (status != KVC_STATUS_OK) {
        fail("run under capture: " + message);
        return;
      }
      CUDA_OK(ended);
      const cudaError_t made =
          cudaGraphInstantiate(&graphs.exec[layer], captured, 0);
      cudaGraphDestroy(captured);
      CUDA_OK(made);
    }
    CUDA_OK(cudaGraphLaunch(graphs.exec[layer], stream));
    KVC_OK(api.graph.finish(gpu, layer, stream));
  };

  for (int step = 0; step < kBatchSteps; ++step) {
    std::vector<int32_t> positions(kBatch);
    for (int b = 0; b < kBatch; ++b)
      positions[b] = prompts[b] + step;
    for (int layer = 0; layer < kLayers; ++layer) {
      Inputs in = makeInputs(rng, kBatch, true, positions[0]);
      // From the CPU context only: a query of the GPU context would settle
      // its device tables (its slot tables equal the CPU's once the last
      // step's victims are evicted).
      int32_t maxSlots = 0;
      for (uint64_t s : kBatchSequences)
        for (int h = 0; h < kKvHeads; ++h) {
          int32_t a = 0;
          KVC_OK(kvc_get_num_slots(cpu, s, layer, h, &a));
          maxSlots = std::max(maxSlots, a);
        }
      std::vector<char> ws(api.cpuBatchBytes(kBatch, maxSlots + 2 * kPageSize));
      std::vector<float> cpuOut(kBatch * qRow), gpuOut(kBatch * qRow);
      KVC_OK(api.cpuBatch(cpu, kBatch, kBatchSequences, layer, in.q.data(),
                          in.k.data(), in.v.data(), positions.data(),
                          cpuOut.data(), ws.data(), ws.size()));
      DeviceBuffer decodeWorkspace;
      CUDA_OK(decodeWorkspace.allocate(
          api.cudaBatchBytes(kBatch, maxSlots + 2 * kPageSize)));
      CUDA_OK(upload(in, q, k, v));
      if (graph) {
        const int before = failures;
        graphStep(layer, positions.data());
        if (failures != before)
          return;
      } else {
        KVC_OK(api.cudaBatch(gpu, kBatch, kBatchSequences, layer,
                             q.as<float>(), k.as<float>(), v.as<float>(),
                             positions.data(), out.as<float>(),
                             decodeWorkspace.ptr, decodeWorkspace.bytes,
                             stream));
      }
      CUDA_OK(cudaStreamSynchronize(stream));
      CUDA_OK(cudaMemcpy(gpuOut.data(), out.ptr, gpuOut.size() * 4,
                         cudaMemcpyDeviceToHost));
      for (int b = 0; b < kBatch; ++b) {
        const std::string where =
            name + " step " + std::to_string(step) + " layer " +
            std::to_string(layer) + " sequence " +
            std::to_string(kBatchSequences[b]);
        double worst = 0.0;
        for (size_t i = b * qRow; i < (b + 1) * qRow; ++i)
          worst = worseOf(
              worst, static_cast<double>(std::fabs(cpuOut[i] - gpuOut[i])));
        if (!(worst < kOutputTolerance))
          fail(where + ": output differs by " + std::to_string(worst));
        // As in the single-sequence steps: the state is read (and the
        // device tables written back) after odd steps only.
        for (int h = 0; h < kKvHeads && step % 2 == 1; ++h) {
          const std::map<int, float> a =
              liveState(cpu, kBatchSequences[b], layer, h);
          const std::map<int, float> c =
              liveState(gpu, kBatchSequences[b], layer, h);
          int onlyOne = 0;
          for (const auto &[pos, state] : a) {
            auto it = c.find(pos);
            if (it == c.end()) {
              ++onlyOne;
              continue;
            }
            if (api.state &&
                !(std::fabs(state - it->second) <=
                  kStateTolerance * std::max(1.0f, std::fabs(state))))
              fail(where + " head " + std::to_string(h) + ": state of " +
                   std::to_string(pos) + " is " + std::to_string(it->second) +
                   ", cpu " + std::to_string(state));
          }
          for (const auto &entry : c)
            onlyOne += a.count(entry.first) ? 0 : 1;
          if (a.size() != c.size() || onlyOne > 2 * kMaxBoundarySwaps)
            fail(where + " head " + std::to_string(h) + ": " +
                 std::to_string(c.size()) + " live entries, cpu " +
                 std::to_string(a.size()) + ", " + std::to_string(onlyOne) +
                 " on one side only");
        }
      }
    }
  }
  if (graph) {
    // The misuses, each refused with its message, the layer usable after.
    std::vector<int32_t> positions(kBatch);
    for (int b = 0; b < kBatch; ++b)
      positions[b] = prompts[b] + kBatchSteps;
    DeviceBuffer &ws = graphs.workspace[0];
    expectRefusal(name + " finish without a plan",
                  api.graph.finish(gpu, 0, stream),
                  KVC_STATUS_INVALID_ARGUMENT, "no planned decode step");
    expectRefusal(name + " plan over capacity",
                  api.graph.plan(gpu, kBatch, kBatchSequences, 0,
                                 positions.data(), kPageSize, ws.ptr, ws.bytes,
                                 stream),
                  KVC_STATUS_OUT_OF_RANGE, "more than capacity - page_size");
    KVC_OK(api.graph.plan(gpu, kBatch, kBatchSequences, 0, positions.data(),
                          kGraphCapacity, ws.ptr, ws.bytes, stream));
    for (int b = 0; b < kBatch; ++b)
      ++positions[b];
    expectRefusal(name + " second plan before the finish",
                  api.graph.plan(gpu, kBatch, kBatchSequences, 0,
                                 positions.data(), kGraphCapacity, ws.ptr,
                                 ws.bytes, stream),
                  KVC_STATUS_INVALID_ARGUMENT, "was not finished");
    // A run other than the planned one (its call; a replay runs no host
    // code).
    expectRefusal(name + " run of another capacity",
                  api.graph.run(gpu, kBatch, 0, q.as<float>(), k.as<float>(),
                                v.as<float>(), out.as<float>(),
                                kGraphCapacity - kPageSize, ws.ptr, ws.bytes,
                                stream),
                  KVC_STATUS_INVALID_ARGUMENT,
                  "differs from layer 0's planned step (batch " +
                      std::to_string(kBatch) + ", capacity " +
                      std::to_string(kGraphCapacity));
    expectRefusal(name + " run of another batch",
                  api.graph.run(gpu, kBatch - 1, 0, q.as<float>(),
                                k.as<float>(), v.as<float>(), out.as<float>(),
                                kGraphCapacity, ws.ptr, ws.bytes, stream),
                  KVC_STATUS_INVALID_ARGUMENT, "differs from layer 0's");
    // A layer with device score state or victims waits for its steps
    // before the host reads it: refused until the finish. (Without either,
    // the runtime's own bookkeeping is the whole truth: no wait, no
    // refusal.)
    kvc_metadata_t meta{};
    if (api.waits)
      expectRefusal(name + " host access before the finish",
                    kvc_get_metadata(gpu, kBatchSequences[0], 0, 0, &meta),
                    KVC_STATUS_INVALID_ARGUMENT, "was not finished");
    else if (kvc_get_metadata(gpu, kBatchSequences[0], 0, 0, &meta) !=
             KVC_STATUS_OK)
      fail(name + ": host access before the finish: " + kvc_last_error());
    CUDA_OK(cudaGraphLaunch(graphs.exec[0], stream));
    KVC_OK(api.graph.finish(gpu, 0, stream));
    KVC_OK(kvc_get_metadata(gpu, kBatchSequences[0], 0, 0, &meta));
    CUDA_OK(cudaStreamSynchronize(stream));
  }
  std::printf("    %s\n", failures == before ? "ok" : "FAILED");
}

} // namespace

/// Whether the policy runs: all of them, or those named in the
/// comma-separated KVC_GPU_TEST_POLICIES.
bool selected(const char *name) {
  const char *list = std::getenv("KVC_GPU_TEST_POLICIES");
  if (!list || !*list)
    return true;
  const std::string names = std::string(",") + list + ",";
  return names.find(std::string(",") + name + ",") != std::string::npos;
}

int main() {
  int devices = 0;
  const cudaError_t error = cudaGetDeviceCount(&devices);
  if (error != cudaSuccess || devices == 0) {
    std::printf("SKIP: no usable CUDA device (%s); the GPU test needs one\n",
                error != cudaSuccess ? cudaGetErrorString(error)
                                     : "zero devices");
    return 77;
  }
  if (const char *seed = std::getenv("KVC_GPU_TEST_SEED"); seed && *seed) {
    char *end = nullptr;
    const unsigned long value = std::strtoul(seed, &end, 10);
    if (*end || *seed == '-' || value > 0xffffffffUL) {
      std::printf("FAIL: KVC_GPU_TEST_SEED is '%s', not a decimal number "
                  "below 2^32\n",
                  seed);
      return 1;
    }
    gSeedOffset = static_cast<uint32_t>(value);
  }
  cudaDeviceProp prop{};
  cudaGetDeviceProperties(&prop, 0);
  std::printf("kvc GPU test on %s: geometry layers=%d q_heads=%d kv_heads=%d "
              "head_dim=%d seed+%u\n",
              prop.name, kLayers, kQHeads, kKvHeads, kDim, gSeedOffset);
  cudaStream_t stream = nullptr;
  if (cudaStreamCreate(&stream) != cudaSuccess) {
    std::printf("FAIL: cudaStreamCreate\n");
    return 1;
  }
  const Api apis[] = {
    KVC_API(streaming_llm, false, false),
    KVC_API(h2o, true, false),
    KVC_API(snapkv, false, false),
    KVC_API(pyramidkv, false, false),
    KVC_API(pyramidkv_small, false, false),
    KVC_API(tova, false, false),
    KVC_API(adakv, false, false),
    KVC_API(pyramidkv_small_adakv, false, false),
    KVC_API(merge_nearest, false, true),
    KVC_API(h2o_merge, true, true),
    KVC_API(d2o, true, true),
    KVC_API(cam, false, true),
    KVC_API(scissorhands, false, false),
    KVC_API(rpc_small, true, false),
    KVC_API(kivi2, false, false),
    KVC_API(kivi4, false, false),
    KVC_API(snapkv_kivi2, false, false),
    KVC_API(mixed_precision, true, false),
    KVC_API_GLOBAL(snapkv_global, true, false),
#if KVC_TEST_HEAD_CLASSES
    KVC_API(duo_small, false, false),
#endif
  };
  // A name of KVC_GPU_TEST_POLICIES that no geometry's test has would
  // narrow the run to less than its caller meant: refused.
  if (const char *list = std::getenv("KVC_GPU_TEST_POLICIES"); list && *list) {
    const std::string names = list;
    for (size_t at = 0; at <= names.size();) {
      size_t comma = names.find(',', at);
      if (comma == std::string::npos)
        comma = names.size();
      const std::string name = names.substr(at, comma - at);
      bool known = false;
      for (const Api &api : apis)
        known |= name == api.name;
#if !KVC_TEST_HEAD_CLASSES
      // DuoAttention's test table is shaped like geometry g3 only.
      if (name == "duo_small") {
        std::printf("duo_small: a policy of geometry g3 only, not run "
                    "here\n");
        known = true;
      }
#endif
      if (!known) {
        std::printf("FAIL: KVC_GPU_TEST_POLICIES names '%s', which is not a "
                    "policy of the GPU test\n",
                    name.c_str());
        return 1;
      }
      at = comma + 1;
    }
  }
  for (const Api &api : apis)
    if (selected(api.name))
      for (bool structured : {false, true})
        runPolicy(api, structured, stream);
  // One of each kind of decode step: stateful with evictions (H2O), across
  // heads (TOVA), periodic (RPC), without statistics (SnapKV), KIVI pages
  // and two page classes. Each runs its step a second time in three calls,
  // the run replayed from a CUDA graph.
  const BatchApi batchApis[] = {
    KVC_BATCH_API(h2o, true, true),
    KVC_BATCH_API(tova, false, true),
    KVC_BATCH_API(rpc_small, true, true),
    KVC_BATCH_API(snapkv, false, false),
    KVC_BATCH_API(kivi2, false, false),
    KVC_BATCH_API(mixed_precision, true, false),
  };
  for (const BatchApi &api : batchApis)
    if (selected(api.name)) {
      runBatch(api, stream);
      runBatch(api, stream, /*graph=*/true);
    }
  cudaStreamDestroy(stream);
#if defined(KVC_CUDA_EMULATED)
  // With deferred device work the emulator starts each dependent (the
  // decode steps' attention and fold kernels) before the kernel ahead of it
  // has run, as an sm_90 device may (kvc_cuda_emu.h): a run whose
  // dependents all started late checked nothing of their waits.
  const kvc::emu::Counters &emulated = kvc::emu::counters();
  std::printf("emulator: %llu programmatic dependent launches (a graph's "
              "once), %llu runs of one started before the kernel ahead\n",
              static_cast<unsigned long long>(emulated.dependentLaunches),
              static_cast<unsigned long long>(emulated.earlyDependents));
  const char *work = std::getenv("KVC_EMU_DEVICE_WORK");
  if (work && !std::strcmp(work, "deferred") && emulated.dependentLaunches &&
      !emulated.earlyDependents) {
    std::printf("FAIL: deferred device work, and no dependent launch "
                "started before the kernel ahead of it\n");
    ++failures;
  }
#endif
  std::printf("%s: %d failure(s)\n", failures ? "FAILED" : "PASSED", failures);
  return failures ? 1 : 0;
}
