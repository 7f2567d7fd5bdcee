//===- gpu_decode_bench.cu - the CUDA backend against copy bandwidth ------===//
//
// Drives the generated CUDA policy libraries through the C ABI an engine
// uses (kvc_<p>_cuda_decode / _prefill over a device pool of the runtime)
// and prints one table:
//  - the device's copy bandwidth, measured first in the same run
//    (cudaMemcpy device-to-device and a 128-bit copy kernel over a large
//    buffer; read + written bytes per second, the better of the two);
//  - per (head dim, GQA group, batch, context): a decode step of one layer
//    without decode statistics ("plain", SnapKV's decode: attention only),
//    fused (H2O's decode step: attention, accumulated attention state and
//    victim selection) and unfused (the same policy, attention then a
//    scoring kernel that recomputes the weights); the fused step's achieved
//    bandwidth and its ratio to the copy bandwidth; the statistics overhead
//    (fused / plain) and unfused / fused, each next to its target;
//  - KIVI int2/int4 decode (policies/kivi2.mlir, kivi4.mlir: packed codes
//    dequantized in registers, the window read in full precision, the
//    quantization work of each append done on the device) against the
//    16-bit decode of the same cell, with the bytes each reads per step
//    computed from the page layout, next to the target (int2 >= 3x faster
//    at context >= 16k);
//  - a model step: the fused decode of every layer per token as an engine
//    calls it (no host synchronization inside a call) against the same
//    calls each followed by a stream synchronization, and against the step
//    in three calls whose launches replay from a CUDA graph per layer;
//  - prefill compression (SnapKV, H2O) as a fraction of a plain prefill
//    (attention, every entry stored) over the same prompt, batch 1;
//  - the host side of a decode call: the CPU time of one _decode_batch
//    call after the stream drained (the runtime's slot allocation, the
//    device tables' words, the launches and copies it queues), per call
//    and per kv-head, for the plain and the fused decode.
// Batch B is B sequences of one context stepped by one
// kvc_<p>_cuda_decode_batch call per step (one launch per kernel for the
// batch). Exits 77 without a CUDA device.
// kvc-bench-gpu --help lists the options.
//
//===----------------------------------------------------------------------===//

#include "runtime/kvc_policy_api.h"
#include "runtime/kvc_runtime.h"

#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <cstdarg>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <map>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

namespace {

// The entry points' types (runtime/kvc_policy_api.h), by shorter names.
using ConfigureFn = kvc_configure_fn;
using BytesFn = kvc_workspace_bytes_fn;
using BatchBytesFn = kvc_batch_workspace_bytes_fn;
using DecodeFn = kvc_cuda_decode_batch_fn;
using ScoringFn = kvc_cuda_decode_scoring_batch_fn;
using PlanFn = kvc_cuda_decode_plan_batch_fn;
using RunFn = kvc_cuda_decode_run_batch_fn;
using FinishFn = kvc_cuda_decode_finish_batch_fn;
using PrefillFn = kvc_cuda_prefill_fn;

/// The six libraries of one geometry (bench/gpu/CMakeLists.txt).
struct BenchGeometry {
  int dim, group;
  ConfigureFn configure[4]; // plain, fused, unfused, h2o (one f16 context)
  BatchBytesFn plainBytes;
  DecodeFn plainDecode;
  BatchBytesFn fusedBytes;
  DecodeFn fusedDecode;
  BatchBytesFn unfusedBytes;
  DecodeFn unfusedDecode;
  BatchBytesFn scoringBytes;
  ScoringFn unfusedScoring;
  /// Plain prefill: attention, every entry stored (the fused policy has no
  /// prefill phase).
  BytesFn plainPrefillBytes;
  PrefillFn plainPrefill;
  BytesFn snapkvPrefillBytes;
  PrefillFn snapkvPrefill;
  BytesFn h2oPrefillBytes;
  PrefillFn h2oPrefill;
  /// KIVI int2 and int4 (their own pool formats).
  ConfigureFn kiviConfigure[2];
  BatchBytesFn kiviBytes[2];
  DecodeFn kiviDecode[2];
  /// The fused step in three calls (the model step's graph variant).
  PlanFn fusedPlan;
  RunFn fusedRun;
  FinishFn fusedFinish;
  /// int2's step in three calls (the KIVI table's graph column).
  PlanFn kivi2Plan;
  RunFn kivi2Run;
  FinishFn kivi2Finish;
  /// The G = 1 alternatives (gpu_bench_g1_alternatives in
  /// bench/gpu/GpuBenchPolicies.cmake), null where not compiled in: kivi2's
  /// CUDA-core decode (decodeKiviTiles) loading each tile's slot words
  /// after it is entered (kivi2_late) and with launch bounds for nine
  /// blocks per SM (kivi2_b9); fused's decode launched as ordinary kernels
  /// (fused_serial), with a fold that leaves its logits in L2
  /// (fused_keep), with its logits stored under the default L2 policy
  /// (fused_norm) and with its statistics folded in the attention grid
  /// (fused_grid).
  ConfigureFn kivi2TileAltConfigure[2] = {};
  BatchBytesFn kivi2TileAltBytes[2] = {};
  DecodeFn kivi2TileAltDecode[2] = {};
  BatchBytesFn fusedG1AltBytes[4] = {};
  DecodeFn fusedG1AltDecode[4] = {};
  /// Alternatives at G >= 2 (bench/gpu/GpuBenchPolicies.cmake), null where
  /// not compiled in: plain's decode without tensor cores (plain_cc); kivi2's
  /// on CUDA cores (kivi2_cc), on tensor cores without launch bounds
  /// (kivi2_free) and with launch bounds for five blocks per SM
  /// (kivi2_b5), with the weights as A of its value sums (kivi2_rowv) and
  /// with each tile's slot words loaded after it is entered (kivi2_late);
  /// the plain prefill with CUDA-core attention
  /// (prefill_cc) and H2O's prefill with CUDA-core attention and
  /// statistics (h2o_cc); fused's decode reading the cache under the
  /// default L2 policy (fused_lru) and with one fold block per attention
  /// split (fused_split); plain's decode split by length only (plain_len)
  /// and issuing a tile's copies after the wait for the tile before
  /// (plain_late); fused's decode with ordinary launches (fused_serial)
  /// and with a fold that asks L2 for its first pass only (fused_first);
  /// plain's decode with the query fragments in registers (plain_regq)
  /// and with the weights as A of its value sums (plain_rowv); fused's
  /// decode with a fold that leaves its logits in L2 (fused_keep), with
  /// its logits stored under the default L2 policy (fused_norm) and with
  /// its statistics folded in the attention grid (fused_grid).
  BatchBytesFn plainCcBytes = nullptr;
  DecodeFn plainCcDecode = nullptr;
  ConfigureFn kivi2AltConfigure[5] = {};
  BatchBytesFn kivi2AltBytes[5] = {};
  DecodeFn kivi2AltDecode[5] = {};
  BytesFn prefillCcBytes = nullptr;
  PrefillFn prefillCc = nullptr;
  BytesFn h2oCcBytes = nullptr;
  PrefillFn h2oCc = nullptr;
  BatchBytesFn fusedLruBytes = nullptr;
  DecodeFn fusedLruDecode = nullptr;
  BatchBytesFn fusedSplitBytes = nullptr;
  DecodeFn fusedSplitDecode = nullptr;
  BatchBytesFn plainLenBytes = nullptr;
  DecodeFn plainLenDecode = nullptr;
  BatchBytesFn plainLateBytes = nullptr;
  DecodeFn plainLateDecode = nullptr;
  BatchBytesFn fusedSerialBytes = nullptr;
  DecodeFn fusedSerialDecode = nullptr;
  BatchBytesFn fusedFirstBytes = nullptr;
  DecodeFn fusedFirstDecode = nullptr;
  BatchBytesFn plainRegqBytes = nullptr;
  DecodeFn plainRegqDecode = nullptr;
  BatchBytesFn plainRowvBytes = nullptr;
  DecodeFn plainRowvDecode = nullptr;
  BatchBytesFn fusedKeepBytes = nullptr;
  DecodeFn fusedKeepDecode = nullptr;
  BatchBytesFn fusedNormBytes = nullptr;
  DecodeFn fusedNormDecode = nullptr;
  BatchBytesFn fusedGridBytes = nullptr;
  DecodeFn fusedGridDecode = nullptr;
  bool hasAlternatives() const { return plainCcDecode != nullptr; }
  bool hasG1Alternatives() const { return kivi2TileAltDecode[0] != nullptr; }
};

#define KVC_GB(v, d, g, suffix) kvc_gb_##v##_d##d##_g##g##_cuda_##suffix
#define KVC_BENCH_GEOMETRY(d, g)                                               \
  BenchGeometry { KVC_BENCH_GEOMETRY_FIELDS(d, g) }
#define KVC_BENCH_GEOMETRY_WITH_G1_ALTERNATIVES(d, g)                          \
  BenchGeometry {                                                              \
    KVC_BENCH_GEOMETRY_FIELDS(d, g),                                           \
        {KVC_GB(kivi2_late, d, g, configure),                                  \
         KVC_GB(kivi2_b9, d, g, configure)},                                   \
        {KVC_GB(kivi2_late, d, g, decode_batch_workspace_bytes),               \
         KVC_GB(kivi2_b9, d, g, decode_batch_workspace_bytes)},                \
        {KVC_GB(kivi2_late, d, g, decode_batch),                               \
         KVC_GB(kivi2_b9, d, g, decode_batch)},                                \
        {KVC_GB(fused_serial, d, g, decode_batch_workspace_bytes),             \
         KVC_GB(fused_keep, d, g, decode_batch_workspace_bytes),               \
         KVC_GB(fused_norm, d, g, decode_batch_workspace_bytes),               \
         KVC_GB(fused_grid, d, g, decode_batch_workspace_bytes)},              \
        {KVC_GB(fused_serial, d, g, decode_batch),                             \
         KVC_GB(fused_keep, d, g, decode_batch),                               \
         KVC_GB(fused_norm, d, g, decode_batch),                               \
         KVC_GB(fused_grid, d, g, decode_batch)}                               \
  }
#define KVC_BENCH_GEOMETRY_WITH_ALTERNATIVES(d, g)                             \
  BenchGeometry {                                                              \
    KVC_BENCH_GEOMETRY_FIELDS(d, g), {}, {}, {}, {}, {},                       \
        KVC_GB(plain_cc, d, g, decode_batch_workspace_bytes),                  \
        KVC_GB(plain_cc, d, g, decode_batch),                                  \
        {KVC_GB(kivi2_cc, d, g, configure),                                    \
         KVC_GB(kivi2_free, d, g, configure),                                  \
         KVC_GB(kivi2_rowv, d, g, configure),                                  \
         KVC_GB(kivi2_late, d, g, configure),                                  \
         KVC_GB(kivi2_b5, d, g, configure)},                                   \
        {KVC_GB(kivi2_cc, d, g, decode_batch_workspace_bytes),                 \
         KVC_GB(kivi2_free, d, g, decode_batch_workspace_bytes),               \
         KVC_GB(kivi2_rowv, d, g, decode_batch_workspace_bytes),               \
         KVC_GB(kivi2_late, d, g, decode_batch_workspace_bytes),               \
         KVC_GB(kivi2_b5, d, g, decode_batch_workspace_bytes)},                \
        {KVC_GB(kivi2_cc, d, g, decode_batch),                                 \
         KVC_GB(kivi2_free, d, g, decode_batch),                               \
         KVC_GB(kivi2_rowv, d, g, decode_batch),                               \
         KVC_GB(kivi2_late, d, g, decode_batch),                               \
         KVC_GB(kivi2_b5, d, g, decode_batch)},                                \
        KVC_GB(prefill_cc, d, g, prefill_workspace_bytes),                     \
        KVC_GB(prefill_cc, d, g, prefill),                                     \
        KVC_GB(h2o_cc, d, g, prefill_workspace_bytes),                         \
        KVC_GB(h2o_cc, d, g, prefill),                                         \
        KVC_GB(fused_lru, d, g, decode_batch_workspace_bytes),                 \
        KVC_GB(fused_lru, d, g, decode_batch),                                 \
        KVC_GB(fused_split, d, g, decode_batch_workspace_bytes),               \
        KVC_GB(fused_split, d, g, decode_batch),                               \
        KVC_GB(plain_len, d, g, decode_batch_workspace_bytes),                 \
        KVC_GB(plain_len, d, g, decode_batch),                                 \
        KVC_GB(plain_late, d, g, decode_batch_workspace_bytes),                \
        KVC_GB(plain_late, d, g, decode_batch),                                \
        KVC_GB(fused_serial, d, g, decode_batch_workspace_bytes),              \
        KVC_GB(fused_serial, d, g, decode_batch),                              \
        KVC_GB(fused_first, d, g, decode_batch_workspace_bytes),               \
        KVC_GB(fused_first, d, g, decode_batch),                               \
        KVC_GB(plain_regq, d, g, decode_batch_workspace_bytes),                \
        KVC_GB(plain_regq, d, g, decode_batch),                                \
        KVC_GB(plain_rowv, d, g, decode_batch_workspace_bytes),                \
        KVC_GB(plain_rowv, d, g, decode_batch),                                \
        KVC_GB(fused_keep, d, g, decode_batch_workspace_bytes),                \
        KVC_GB(fused_keep, d, g, decode_batch),                                \
        KVC_GB(fused_norm, d, g, decode_batch_workspace_bytes),                \
        KVC_GB(fused_norm, d, g, decode_batch),                                \
        KVC_GB(fused_grid, d, g, decode_batch_workspace_bytes),                \
        KVC_GB(fused_grid, d, g, decode_batch)                                 \
  }
#define KVC_BENCH_GEOMETRY_FIELDS(d, g)                                        \
    d, g,                                                                      \
        {KVC_GB(plain, d, g, configure), KVC_GB(fused, d, g, configure),       \
         KVC_GB(unfused, d, g, configure), KVC_GB(h2o, d, g, configure)},      \
        KVC_GB(plain, d, g, decode_batch_workspace_bytes),                     \
        KVC_GB(plain, d, g, decode_batch),                                     \
        KVC_GB(fused, d, g, decode_batch_workspace_bytes),                     \
        KVC_GB(fused, d, g, decode_batch),                                     \
        KVC_GB(unfused, d, g, decode_batch_workspace_bytes),                   \
        KVC_GB(unfused, d, g, decode_batch),                                   \
        KVC_GB(unfused, d, g, decode_scoring_batch_workspace_bytes),           \
        KVC_GB(unfused, d, g, decode_scoring_batch),                           \
        KVC_GB(fused, d, g, prefill_workspace_bytes),                          \
        KVC_GB(fused, d, g, prefill),                                          \
        KVC_GB(plain, d, g, prefill_workspace_bytes),                          \
        KVC_GB(plain, d, g, prefill), KVC_GB(h2o, d, g, prefill_workspace_bytes), \
        KVC_GB(h2o, d, g, prefill),                                            \
        {KVC_GB(kivi2, d, g, configure), KVC_GB(kivi4, d, g, configure)},      \
        {KVC_GB(kivi2, d, g, decode_batch_workspace_bytes),                    \
         KVC_GB(kivi4, d, g, decode_batch_workspace_bytes)},                   \
        {KVC_GB(kivi2, d, g, decode_batch),                                    \
         KVC_GB(kivi4, d, g, decode_batch)},                                   \
        KVC_GB(fused, d, g, decode_plan_batch),                                \
        KVC_GB(fused, d, g, decode_run_batch),                                 \
        KVC_GB(fused, d, g, decode_finish_batch),                              \
        KVC_GB(kivi2, d, g, decode_plan_batch),                                \
        KVC_GB(kivi2, d, g, decode_run_batch),                                 \
        KVC_GB(kivi2, d, g, decode_finish_batch)

} // namespace

#include "gpu_bench_geometries.h"

namespace {

constexpr int kKvHeads = KVC_BENCH_KV_HEADS;
constexpr int kSkip = 77;

/// Targets of the performance issue.
constexpr double kTargetCopyFraction = 0.85; // batch >= 8, context >= 4k
constexpr double kTargetStatsOverhead = 0.05;
constexpr double kTargetUnfusedRatio = 1.5;
constexpr double kTargetInt2Speedup = 3.0; // context >= 16k

struct Options {
  std::vector<int> batches{1, 8, 32};
  std::vector<int> contexts{1024, 4096, 16384, 32768};
  std::vector<int> prefillContexts{1024, 4096, 16384};
  /// Contexts of the model-step table (every batch of `batches`).
  std::vector<int> modelContexts{4096, 16384};
  /// Contexts of the alternatives table (every batch of `batches`).
  std::vector<int> alternativeContexts{16384, 32768};
  /// Contexts of the host-side table (every batch of `batches`).
  std::vector<int> hostContexts{4096, 32768};
  std::vector<int> dims, groups; // empty: every compiled-in one
  double minMs = 100.0;
  int steps = 8;
  /// Timed runs per cell at least (decode rounds, prefill calls), warm-up
  /// runs before them, and the copy test's timed runs and largest buffer.
  int minRounds = 2, minReps = 3;
  bool warmUp = true;
  int copyRuns = 20;
  size_t copyBytes = size_t(1) << 30;
  int pageSize = 64;
  /// Decode variants to time (plain, fused, unfused, int2, int4).
  bool variants[5] = {true, true, true, true, true};
  bool list = false;
  std::string csv;
};

/// Cells (or rows) whose measurement failed; the run then exits with 1.
int gCellErrors = 0;

/// An error of one measurement; the cell prints "error".
struct BenchError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

/// Records a failed measurement in `error` (its cell prints "error" and the
/// run exits with 1), then lets the stream finish what was queued and
/// clears the CUDA runtime's last error, so that the next cell starts on an
/// idle stream.
void cellFailed(std::string &error, const BenchError &e, cudaStream_t stream) {
  error = e.what();
  ++gCellErrors;
  cudaStreamSynchronize(stream);
  cudaGetLastError();
}

std::string format(const char *fmt, ...) {
  char buffer[1024];
  va_list args;
  va_start(args, fmt);
  std::vsnprintf(buffer, sizeof buffer, fmt, args);
  va_end(args);
  return buffer;
}

void cudaCheck(cudaError_t e, const char *what) {
  if (e != cudaSuccess)
    throw BenchError(format("%s: %s", what, cudaGetErrorString(e)));
}

void kvcCheck(kvc_status_t s, const char *what) {
  if (s != KVC_STATUS_OK)
    throw BenchError(format("%s: %s: %s", what, kvc_status_string(s),
                            kvc_last_error()));
}

#define CUDA_CHECK(...) cudaCheck((__VA_ARGS__), #__VA_ARGS__)
#define KVC_CHECK(...) kvcCheck((__VA_ARGS__), #__VA_ARGS__)

/// A device buffer that grows on demand (contents are lost on growth).
struct DeviceBuffer {
  void *ptr = nullptr;
  size_t bytes = 0;
  /// Returns true when the buffer was (re)allocated.
  bool reserve(size_t n) {
    if (n <= bytes)
      return false;
    if (ptr)
      cudaFree(ptr);
    ptr = nullptr;
    bytes = 0;
    CUDA_CHECK(cudaMalloc(&ptr, n));
    bytes = n;
    return true;
  }
  void release() {
    if (ptr)
      cudaFree(ptr);
    ptr = nullptr;
    bytes = 0;
  }
  ~DeviceBuffer() { release(); }
  template <typename T> T *as() const { return static_cast<T *>(ptr); }
};

//===--- Kernels of the benchmark itself --------------------------------===//

__device__ inline float hashUniform(uint64_t i, uint64_t seed) {
  uint64_t x = i * 0x9E3779B97F4A7C15ull + seed;
  x ^= x >> 31;
  x *= 0xBF58476D1CE4E5B9ull;
  x ^= x >> 29;
  return static_cast<float>(x >> 40) * (2.0f / 16777216.0f) - 1.0f;
}

/// Finite random f16 in [-1, 1): every byte of the pool decodes to a valid
/// key or value, whatever slot the runtime hands out.
__global__ void fillHalf(__half *p, size_t n, uint64_t seed) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n;
       i += size_t(gridDim.x) * blockDim.x)
    p[i] = __float2half_rn(hashUniform(i, seed));
}

__global__ void fillFloat(float *p, size_t n, uint64_t seed) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n;
       i += size_t(gridDim.x) * blockDim.x)
    p[i] = hashUniform(i, seed);
}

/// The reference copy: 128-bit loads and stores, four in flight per thread.
__global__ void copyKernel(const uint4 *__restrict__ in, uint4 *__restrict__ out,
                           size_t n) {
  const size_t stride = size_t(gridDim.x) * blockDim.x;
  size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x;
  for (; i + 3 * stride < n; i += 4 * stride) {
    uint4 a = in[i], b = in[i + stride], c = in[i + 2 * stride],
          d = in[i + 3 * stride];
    out[i] = a;
    out[i + stride] = b;
    out[i + 2 * stride] = c;
    out[i + 3 * stride] = d;
  }
  for (; i < n; i += stride)
    out[i] = in[i];
}

int gFillBlocks = 1024;

void fillRandomHalf(void *p, size_t bytes, uint64_t seed) {
  fillHalf<<<gFillBlocks, 256>>>(static_cast<__half *>(p), bytes / 2, seed);
  CUDA_CHECK(cudaGetLastError());
}

void fillRandomFloat(float *p, size_t n, uint64_t seed) {
  fillFloat<<<gFillBlocks, 256>>>(p, n, seed);
  CUDA_CHECK(cudaGetLastError());
}

/// Milliseconds between two events recorded around `body` on `stream`.
struct EventTimer {
  cudaEvent_t start = nullptr, stop = nullptr;
  EventTimer() {
    CUDA_CHECK(cudaEventCreate(&start));
    CUDA_CHECK(cudaEventCreate(&stop));
  }
  ~EventTimer() {
    cudaEventDestroy(start);
    cudaEventDestroy(stop);
  }
  template <typename F> float time(cudaStream_t s, F &&body) {
    CUDA_CHECK(cudaEventRecord(start, s));
    body();
    CUDA_CHECK(cudaEventRecord(stop, s));
    CUDA_CHECK(cudaEventSynchronize(stop));
    float ms = 0.0f;
    CUDA_CHECK(cudaEventElapsedTime(&ms, start, stop));
    return ms;
  }
};

/// CUDA graphs of decode runs (kvc_<p>_cuda_decode_run_batch), one per
/// layer, each captured at the layer's first step (global capture mode: a
/// run that waits, allocates or queries fails the capture) and replayed
/// at every step.
struct RunGraphs {
  std::vector<cudaGraphExec_t> exec;
  explicit RunGraphs(int layers) : exec(layers, nullptr) {}
  ~RunGraphs() {
    for (cudaGraphExec_t e : exec)
      if (e)
        cudaGraphExecDestroy(e);
  }
  RunGraphs(const RunGraphs &) = delete;
  RunGraphs &operator=(const RunGraphs &) = delete;
  /// Launches layer's graph on `stream`, captured from `run` (a call of
  /// the run on `stream`) first if the layer has none. Throws BenchError.
  template <typename Run>
  void launch(int layer, cudaStream_t stream, Run &&run) {
    if (!exec[layer]) {
      CUDA_CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal));
      const kvc_status_t status = run();
      cudaGraph_t captured = nullptr;
      const cudaError_t ended = cudaStreamEndCapture(stream, &captured);
      KVC_CHECK(status);
      CUDA_CHECK(ended);
      const cudaError_t made = cudaGraphInstantiate(&exec[layer], captured, 0);
      cudaGraphDestroy(captured);
      CUDA_CHECK(made);
    }
    CUDA_CHECK(cudaGraphLaunch(exec[layer], stream));
  }
};

//===--- Copy bandwidth ---------------------------------------------------===//

struct CopyBandwidth {
  double memcpyGBs = 0.0, kernelGBs = 0.0;
  size_t bytes = 0;
  double best() const { return std::max(memcpyGBs, kernelGBs); }
};

/// Read + written bytes per second of a device-to-device copy of a buffer
/// of up to `maxBytes` (a quarter of the free memory at most), best of
/// `runs`.
CopyBandwidth measureCopyBandwidth(cudaStream_t s, int sms, size_t maxBytes,
                                   int runs, bool warmUp) {
  size_t freeBytes = 0, totalBytes = 0;
  CUDA_CHECK(cudaMemGetInfo(&freeBytes, &totalBytes));
  size_t bytes = std::min<size_t>(maxBytes, freeBytes / 4);
  bytes &= ~size_t(0xFFFF);
  DeviceBuffer a, b;
  a.reserve(bytes);
  b.reserve(bytes);
  fillRandomHalf(a.ptr, bytes, 1);
  CUDA_CHECK(cudaMemsetAsync(b.ptr, 0, bytes, s));
  EventTimer timer;
  CopyBandwidth r;
  r.bytes = bytes;
  auto best = [&](auto &&body) {
    float bestMs = 1e30f;
    for (int i = 0; i < (warmUp ? 3 : 0); ++i)
      body();
    for (int i = 0; i < runs; ++i)
      bestMs = std::min(bestMs, timer.time(s, body));
    return 2.0 * double(bytes) / (bestMs * 1e-3) / 1e9;
  };
  r.memcpyGBs = best([&] {
    CUDA_CHECK(cudaMemcpyAsync(b.ptr, a.ptr, bytes, cudaMemcpyDeviceToDevice, s));
  });
  const size_t vectors = bytes / sizeof(uint4);
  r.kernelGBs = best([&] {
    copyKernel<<<sms * 8, 512, 0, s>>>(a.as<uint4>(), b.as<uint4>(), vectors);
    CUDA_CHECK(cudaGetLastError());
  });
  return r;
}

//===--- Decode -------------------------------------------------------------===//

enum Variant { kPlain = 0, kFused = 1, kUnfused = 2, kNumVariants = 3 };
/// KIVI decode variants; their --variants flags follow the three above.
enum KiviVariant { kInt2 = 0, kInt4 = 1, kNumKivi = 2 };
const char *kVariantNames[] = {"plain", "fused", "unfused", "int2", "int4"};

/// Shared device buffers (pool, workspace, inputs), grown as the sweep needs.
struct Buffers {
  DeviceBuffer pool, workspace, inputs;
  uint64_t seed = 11;
  void reservePool(size_t bytes) {
    if (pool.reserve(bytes))
      fillRandomHalf(pool.ptr, pool.bytes, seed++);
  }
  void releaseAll() {
    pool.release();
    workspace.release();
    inputs.release();
  }
};

/// A context of `batch` sequences holding `n` entries in every kv-head of
/// layers 0 .. layers-1, over the shared pool, configured by `configure` (a
/// policy's kvc_<p>_cuda_configure).
struct Context {
  kvc_context_t *context = nullptr;
  kvc_config_t config{};
  uint64_t poolBytes = 0;
  int pagesPerHead = 0;
  int layers = 1;
  Context(ConfigureFn configure, int dim, Buffers &buffers, int batch, int n,
          int headroom, int pageSize, int layerCount = 1)
      : layers(layerCount) {
    configure(&config);
    config.page_size = pageSize;
    pagesPerHead = (n + headroom + pageSize - 1) / pageSize + 1;
    config.num_pages = batch * layers * kKvHeads * pagesPerHead;
    config.max_sequences = batch;
    KVC_CHECK(kvc_pool_bytes_required(&config, &poolBytes));
    buffers.reservePool(poolBytes);
    KVC_CHECK(
        kvc_context_create(&config, buffers.pool.ptr, poolBytes, &context));
    std::vector<int32_t> positions(n);
    for (int i = 0; i < n; ++i)
      positions[i] = i;
    for (int b = 0; b < batch; ++b) {
      KVC_CHECK(kvc_sequence_add(context, b));
      if (n > 0)
        for (int l = 0; l < layers; ++l)
          for (int h = 0; h < kKvHeads; ++h)
            KVC_CHECK(kvc_append(context, b, l, h, n, dim, nullptr, nullptr,
                                 positions.data(), nullptr));
    }
  }
  ~Context() { kvc_context_destroy(context); }
  Context(const Context &) = delete;
  Context &operator=(const Context &) = delete;

  /// Evicts every entry at position >= n (the steps' new tokens), so that
  /// each round starts from the same n entries.
  void restore(int batch, int n) {
    std::vector<int32_t> slots;
    for (int b = 0; b < batch; ++b)
      for (int l = 0; l < layers; ++l)
        for (int h = 0; h < kKvHeads; ++h) {
          kvc_metadata_t meta{};
          KVC_CHECK(kvc_get_metadata(context, b, l, h, &meta));
          slots.clear();
          for (int s = 0; s < meta.num_slots; ++s)
            if (meta.position[s] >= n)
              slots.push_back(s);
          if (!slots.empty())
            KVC_CHECK(kvc_evict(context, b, l, h, int32_t(slots.size()),
                                slots.data()));
        }
  }

  /// Evicts the oldest entries of every head down to n (KIVI: the round's
  /// new tokens stay in the residual window, so that every step quantizes
  /// the value leaving it, as in a long decode; evicting the new tokens
  /// instead would empty the window after a few rounds).
  void restoreOldest(int batch, int n) {
    std::vector<std::pair<int32_t, int32_t>> live; // (position, slot)
    std::vector<int32_t> slots;
    for (int b = 0; b < batch; ++b)
      for (int h = 0; h < kKvHeads; ++h) {
        kvc_metadata_t meta{};
        KVC_CHECK(kvc_get_metadata(context, b, 0, h, &meta));
        live.clear();
        for (int s = 0; s < meta.num_slots; ++s)
          if (meta.position[s] != KVC_POSITION_NONE)
            live.emplace_back(meta.position[s], s);
        if (int(live.size()) <= n)
          continue;
        const size_t excess = live.size() - size_t(n);
        std::nth_element(live.begin(), live.begin() + (excess - 1), live.end());
        slots.clear();
        for (size_t i = 0; i < excess; ++i)
          slots.push_back(live[i].second);
        KVC_CHECK(
            kvc_evict(context, b, 0, h, int32_t(slots.size()), slots.data()));
      }
  }
};

/// The device inputs of a batch decode step (q, k, v and out with one row
/// per sequence, random) and its host arrays (sequences 0..B-1, positions).
struct Batch {
  std::vector<uint64_t> sequences;
  std::vector<int32_t> positions;
  float *q, *k, *v, *out;
  Batch(Buffers &buffers, int batch, int qHeads, int dim)
      : sequences(batch), positions(batch) {
    for (int b = 0; b < batch; ++b)
      sequences[b] = uint64_t(b);
    const size_t qFloats = size_t(batch) * qHeads * dim,
                 kvFloats = size_t(batch) * kKvHeads * dim;
    buffers.inputs.reserve((2 * qFloats + 2 * kvFloats) * sizeof(float));
    q = buffers.inputs.as<float>();
    k = q + qFloats;
    v = k + kvFloats;
    out = v + kvFloats;
    fillRandomFloat(q, 2 * qFloats + 2 * kvFloats, buffers.seed++);
  }
  /// Every sequence at `position`.
  const int32_t *at(int32_t position) {
    std::fill(positions.begin(), positions.end(), position);
    return positions.data();
  }
};

struct DecodeResult {
  bool ok[kNumVariants] = {};
  double usPerStep[kNumVariants] = {};
  std::string error[kNumVariants];
  /// Mean entries per (sequence, kv-head) over the timed steps.
  double meanEntries = 0.0;
};

/// Microseconds per step of `step(position, timed)`: rounds of o.steps
/// timed steps from position n + 1 until o.minMs and o.minRounds are met,
/// after a warm-up round. Before each round an untimed step at position n
/// (the restore after the last round changed the runtime's host
/// bookkeeping, so this step rebuilds the device-resident slot tables,
/// DeviceTables, and the timed steps run on tables kept on the device, as
/// in a long decode); after it ctx.restore(batch, n). A BenchError is
/// rethrown once the stream is drained and the context restored.
template <typename Step>
double timeSteps(EventTimer &timer, Context &ctx, int batch, int n,
                 const Options &o, cudaStream_t stream, Step &&step) {
  try {
    auto prime = [&] {
      step(n, false);
      CUDA_CHECK(cudaStreamSynchronize(stream));
    };
    auto round = [&] {
      for (int i = 0; i < o.steps; ++i)
        step(n + 1 + i, true);
    };
    // Warm-up round (first launches, host allocations).
    if (o.warmUp) {
      prime();
      timer.time(stream, round);
      ctx.restore(batch, n);
    }
    double ms = 0.0;
    int rounds = 0;
    while ((ms < o.minMs || rounds < o.minRounds) && rounds < 10000) {
      prime();
      ms += timer.time(stream, round);
      ++rounds;
      ctx.restore(batch, n);
    }
    CUDA_CHECK(cudaGetLastError());
    return 1e3 * ms / (double(rounds) * o.steps);
  } catch (const BenchError &) {
    cudaStreamSynchronize(stream);
    cudaGetLastError();
    try {
      ctx.restore(batch, n);
    } catch (const BenchError &) {
    }
    throw;
  }
}

/// Times every variant at one (geometry, batch, context).
DecodeResult benchDecode(const BenchGeometry &g, Buffers &buffers, int batch,
                         int n, const Options &o, cudaStream_t stream) {
  DecodeResult r;
  const int qHeads = kKvHeads * g.group;
  const int steps = o.steps;
  // Headroom: the untimed first step and the round's steps.
  Context ctx(g.configure[kFused], g.dim, buffers, batch, n, steps + 2,
              o.pageSize);
  // Decode workspace: slots after the append plus one page, as the
  // generated code checks, for the whole batch.
  const int32_t stride = (ctx.pagesPerHead + 1) * o.pageSize;
  const uint64_t wsBytes = std::max(
      {g.plainBytes(batch, stride), g.fusedBytes(batch, stride),
       g.unfusedBytes(batch, stride), g.scoringBytes(batch, stride)});
  buffers.workspace.reserve(wsBytes);
  // Inputs of the batch: q, k, v and out, each with a row per sequence.
  Batch in(buffers, batch, qHeads, g.dim);
  void *ws = buffers.workspace.ptr;
  const uint64_t wsSize = buffers.workspace.bytes;
  CUDA_CHECK(cudaDeviceSynchronize());

  auto call = [&](Variant variant, int32_t position) {
    const int32_t *positions = in.at(position);
    switch (variant) {
    case kPlain:
      KVC_CHECK(g.plainDecode(ctx.context, batch, in.sequences.data(), 0, in.q,
                              in.k, in.v, positions, in.out, ws, wsSize,
                              stream));
      break;
    case kFused:
      KVC_CHECK(g.fusedDecode(ctx.context, batch, in.sequences.data(), 0, in.q,
                              in.k, in.v, positions, in.out, ws, wsSize,
                              stream));
      break;
    default:
      KVC_CHECK(g.unfusedDecode(ctx.context, batch, in.sequences.data(), 0,
                                in.q, in.k, in.v, positions, in.out, ws,
                                wsSize, stream));
      KVC_CHECK(g.unfusedScoring(ctx.context, batch, in.sequences.data(), 0,
                                 in.q, positions, ws, wsSize, stream));
      break;
    }
  };
  EventTimer timer;
  for (int variant = 0; variant < kNumVariants; ++variant) {
    if (!o.variants[variant]) {
      r.error[variant] = "not selected (--variants)";
      continue;
    }
    try {
      r.usPerStep[variant] =
          timeSteps(timer, ctx, batch, n, o, stream,
                    [&](int32_t position, bool) {
                      call(Variant(variant), position);
                    });
      r.ok[variant] = true;
    } catch (const BenchError &e) {
      cellFailed(r.error[variant], e, stream);
    }
  }
  // Step i of a round sees n + i + 2 entries (the untimed step's token and
  // the new one included).
  r.meanEntries = n + 1 + (steps + 1) / 2.0;
  return r;
}

//===--- Host side of a decode call --------------------------------------===//

/// What the CUDA emulator counted so far (test/cudaemu); zeros on a device,
/// where kernels do not run inside the call and nothing is counted.
struct RuntimeCounts {
  double kernelSeconds = 0.0;
  double launches = 0, copies = 0, eventRecords = 0, waits = 0,
         allocations = 0, pageable = 0;
};

RuntimeCounts runtimeCounts() {
  RuntimeCounts c;
#if defined(KVC_CUDA_EMULATED)
  const kvc::emu::Counters &e = kvc::emu::counters();
  c.kernelSeconds = e.kernelSeconds;
  c.launches = double(e.launches);
  c.copies = double(e.asyncCopies + e.syncCopies + e.memsets);
  c.eventRecords = double(e.eventRecords);
  c.waits = double(e.waits + e.syncCopies);
  c.allocations = double(e.allocations);
  c.pageable = double(e.pageableCopies);
#endif
  return c;
}

/// Whether runtimeCounts() counts (the emulator).
constexpr bool kCountsRuntimeCalls =
#if defined(KVC_CUDA_EMULATED)
    true;
#else
    false;
#endif

enum HostVariant {
  kHostPlain = 0,
  kHostFused = 1,
  kHostInt2 = 2,
  kNumHost = 3
};

struct HostResult {
  bool ok[kNumHost] = {};
  std::string error[kNumHost];
  /// Median CPU microseconds per call.
  double us[kNumHost] = {};
  /// Per call, mean over the timed calls (the emulator only): kernel
  /// launches, copies and memsets, event records, waits (synchronizations
  /// and synchronous copies), allocations (memory and events), copies
  /// from or to pageable host memory.
  RuntimeCounts perCall[kNumHost];
  int calls[kNumHost] = {};
};

/// The host side of the plain, the fused and the int2 (KIVI) decode at one
/// (geometry, batch, context): each timed call is issued after
/// cudaStreamSynchronize, so it waits for nothing, and its CPU time
/// (steady_clock around the call, less the time the emulator spent running
/// kernels inside it) is the work the host does per step: the runtime's
/// appends and evictions, the device tables' words, a KIVI step's work
/// records and the CUDA runtime calls that queue copies and launches.
/// Rounds of o.steps calls as in timeSteps (an untimed call at `context`
/// entries first, the round's entries evicted after it; for int2 as in
/// timeKivi: positions keep growing and the oldest entries are evicted down
/// to `context`), >= o.minRounds rounds and until o.minMs of wall time.
/// int2 runs where it is selected (--variants).
HostResult benchHost(const BenchGeometry &g, Buffers &buffers, int batch,
                     int n, const Options &o, cudaStream_t stream) {
  HostResult r;
  const int qHeads = kKvHeads * g.group;
  Batch in(buffers, batch, qHeads, g.dim);
  // Times `call(position)` as described above; `restore` ends a round.
  auto measure = [&](int v, const std::function<void(int32_t)> &call,
                     const std::function<void()> &restore, int32_t first,
                     bool keepPositions) {
    std::vector<double> samples;
    RuntimeCounts total;
    int32_t position = first;
    try {
      const auto start = std::chrono::steady_clock::now();
      int rounds = 0;
      for (int round = -(o.warmUp ? 1 : 0);; ++round) {
        const double wallMs = std::chrono::duration<double, std::milli>(
                                  std::chrono::steady_clock::now() - start)
                                  .count();
        if (round >= 0 && rounds >= o.minRounds &&
            (wallMs >= o.minMs || rounds >= 10))
          break;
        if (!keepPositions)
          position = first;
        call(position++);
        for (int i = 0; i < o.steps; ++i) {
          CUDA_CHECK(cudaStreamSynchronize(stream));
          const RuntimeCounts before = runtimeCounts();
          const auto t0 = std::chrono::steady_clock::now();
          call(position++);
          const auto t1 = std::chrono::steady_clock::now();
          const RuntimeCounts after = runtimeCounts();
          if (round < 0)
            continue;
          samples.push_back(
              std::chrono::duration<double, std::micro>(t1 - t0).count() -
              1e6 * (after.kernelSeconds - before.kernelSeconds));
          total.launches += after.launches - before.launches;
          total.copies += after.copies - before.copies;
          total.eventRecords += after.eventRecords - before.eventRecords;
          total.waits += after.waits - before.waits;
          total.allocations += after.allocations - before.allocations;
          total.pageable += after.pageable - before.pageable;
        }
        CUDA_CHECK(cudaStreamSynchronize(stream));
        restore();
        if (round >= 0)
          ++rounds;
      }
      CUDA_CHECK(cudaGetLastError());
    } catch (const BenchError &e) {
      cellFailed(r.error[v], e, stream);
      try {
        restore();
      } catch (const BenchError &) {
      }
      return;
    }
    std::sort(samples.begin(), samples.end());
    const size_t m = samples.size();
    r.us[v] = m % 2 ? samples[m / 2] : (samples[m / 2 - 1] + samples[m / 2]) / 2;
    r.calls[v] = int(m);
    r.perCall[v].launches = total.launches / double(m);
    r.perCall[v].copies = total.copies / double(m);
    r.perCall[v].eventRecords = total.eventRecords / double(m);
    r.perCall[v].waits = total.waits / double(m);
    r.perCall[v].allocations = total.allocations / double(m);
    r.perCall[v].pageable = total.pageable / double(m);
    r.ok[v] = true;
  };
  {
    Context ctx(g.configure[kFused], g.dim, buffers, batch, n, o.steps + 2,
                o.pageSize);
    const int32_t stride = (ctx.pagesPerHead + 1) * o.pageSize;
    buffers.workspace.reserve(
        std::max(g.plainBytes(batch, stride), g.fusedBytes(batch, stride)));
    void *ws = buffers.workspace.ptr;
    const uint64_t wsSize = buffers.workspace.bytes;
    CUDA_CHECK(cudaDeviceSynchronize());
    for (int v : {kHostPlain, kHostFused}) {
      const DecodeFn decode = v == kHostPlain ? g.plainDecode : g.fusedDecode;
      measure(
          v,
          [&](int32_t position) {
            KVC_CHECK(decode(ctx.context, batch, in.sequences.data(), 0, in.q,
                             in.k, in.v, in.at(position), in.out, ws, wsSize,
                             stream));
          },
          [&] { ctx.restore(batch, n); }, n, false);
    }
  }
  if (!o.variants[kNumVariants + kInt2]) {
    r.error[kHostInt2] = "not selected (--variants)";
    return r;
  }
  try {
    kvc_config_t kivi{};
    g.kiviConfigure[kInt2](&kivi);
    Context ctx(g.kiviConfigure[kInt2], g.dim, buffers, batch, n,
                o.steps + 2 + 2 * kivi.group_size, o.pageSize);
    fillRandomHalf(buffers.pool.ptr, ctx.poolBytes, buffers.seed++);
    const int32_t stride = (ctx.pagesPerHead + 1) * o.pageSize;
    buffers.workspace.reserve(g.kiviBytes[kInt2](batch, stride));
    void *ws = buffers.workspace.ptr;
    const uint64_t wsSize = buffers.workspace.bytes;
    CUDA_CHECK(cudaDeviceSynchronize());
    measure(
        kHostInt2,
        [&](int32_t position) {
          KVC_CHECK(g.kiviDecode[kInt2](ctx.context, batch,
                                        in.sequences.data(), 0, in.q, in.k,
                                        in.v, in.at(position), in.out, ws,
                                        wsSize, stream));
        },
        [&] { ctx.restoreOldest(batch, n); }, n, true);
  } catch (const BenchError &e) {
    cellFailed(r.error[kHostInt2], e, stream);
  }
  return r;
}

//===--- Model step -----------------------------------------------------===//

/// A model step: every layer of the fused policy per token, "pipelined" as
/// an engine calls it (no host synchronization inside a call), and
/// "synchronized", the same calls each followed by cudaStreamSynchronize
/// (what a step that waits for its own kernels, to hand its victims to the
/// host, costs); and every layer of the plain decode (attention only),
/// pipelined, so that the policy's cost is measured where a layer's host
/// work overlaps the kernels of the layers before it; and "graph", the
/// fused step of every layer in three calls: the plan, a replay of the
/// layer's run captured in a CUDA graph at its first step, the finish (a
/// graph launch per layer instead of the step's three kernel launches).
enum ModelVariant {
  kPipelined = 0,
  kSynchronized = 1,
  kPlainPipelined = 2,
  kGraphPipelined = 3,
  kNumModel = 4
};

struct ModelResult {
  bool ok[kNumModel] = {};
  double usPerToken[kNumModel] = {};
  std::string error[kNumModel];
  int layers = 0;
};

ModelResult benchModel(const BenchGeometry &g, Buffers &buffers, int batch,
                       int n, const Options &o, cudaStream_t stream) {
  ModelResult r;
  kvc_config_t config{};
  g.configure[kFused](&config);
  r.layers = config.num_layers;
  const int qHeads = kKvHeads * g.group;
  const int steps = o.steps;
  Context ctx(g.configure[kFused], g.dim, buffers, batch, n, steps + 2,
              o.pageSize, r.layers);
  // One workspace for every layer: the calls are ordered on the stream.
  const int32_t stride = (ctx.pagesPerHead + 1) * o.pageSize;
  buffers.workspace.reserve(
      std::max(g.fusedBytes(batch, stride), g.plainBytes(batch, stride)));
  Batch in(buffers, batch, qHeads, g.dim);
  CUDA_CHECK(cudaDeviceSynchronize());
  auto token = [&](int32_t position, bool synchronize, bool plain) {
    const int32_t *positions = in.at(position);
    for (int layer = 0; layer < r.layers; ++layer) {
      KVC_CHECK((plain ? g.plainDecode : g.fusedDecode)(
          ctx.context, batch, in.sequences.data(), layer, in.q, in.k, in.v,
          positions, in.out, buffers.workspace.ptr, buffers.workspace.bytes,
          stream));
      if (synchronize)
        CUDA_CHECK(cudaStreamSynchronize(stream));
    }
  };
  // The graph variant: the runs are planned for `stride` slots (the
  // workspace's), each layer's captured at its first step.
  RunGraphs graphs(r.layers);
  auto graphToken = [&](int32_t position) {
    const int32_t *positions = in.at(position);
    void *ws = buffers.workspace.ptr;
    const uint64_t wsBytes = buffers.workspace.bytes;
    for (int layer = 0; layer < r.layers; ++layer) {
      KVC_CHECK(g.fusedPlan(ctx.context, batch, in.sequences.data(), layer,
                            positions, stride, ws, wsBytes, stream));
      graphs.launch(layer, stream, [&] {
        return g.fusedRun(ctx.context, batch, layer, in.q, in.k, in.v, in.out,
                          stride, ws, wsBytes, stream);
      });
      KVC_CHECK(g.fusedFinish(ctx.context, layer, stream));
    }
  };
  EventTimer timer;
  for (int variant = 0; variant < kNumModel; ++variant) {
    const bool synchronize = variant == kSynchronized;
    const bool plain = variant == kPlainPipelined;
    const bool graph = variant == kGraphPipelined;
    if (plain && !o.variants[kPlain]) {
      r.error[variant] = "not selected (--variants)";
      continue;
    }
    try {
      r.usPerToken[variant] = timeSteps(
          timer, ctx, batch, n, o, stream, [&](int32_t position, bool timed) {
            if (graph)
              graphToken(position);
            else
              token(position, synchronize && timed, plain);
          });
      r.ok[variant] = true;
    } catch (const BenchError &e) {
      cellFailed(r.error[variant], e, stream);
    }
  }
  return r;
}

//===--- Prefill ------------------------------------------------------------===//

/// prefill_cc, h2o_cc: the plain and H2O prefills on CUDA cores
/// (KVC_CUDA_PREFILL_MMA=0), where compiled in.
enum PrefillVariant {
  kPrefillPlain = 0,
  kPrefillSnapKV,
  kPrefillH2O,
  kPrefillPlainCc,
  kPrefillH2OCc,
  kNumPrefill
};
const char *kPrefillNames[] = {"plain", "snapkv", "h2o", "prefill_cc",
                               "h2o_cc"};

struct PrefillResult {
  bool ok[kNumPrefill] = {};
  double ms[kNumPrefill] = {};
  std::string error[kNumPrefill];
};

PrefillResult benchPrefill(const BenchGeometry &g, Buffers &buffers, int n,
                           const Options &o, cudaStream_t stream) {
  PrefillResult r;
  const int qHeads = kKvHeads * g.group;
  Context ctx(g.configure[kFused], g.dim, buffers, 1, 0, n, o.pageSize);
  const uint64_t wsBytes = std::max(
      {g.plainPrefillBytes(n), g.snapkvPrefillBytes(n), g.h2oPrefillBytes(n),
       g.prefillCcBytes ? g.prefillCcBytes(n) : uint64_t{0},
       g.h2oCcBytes ? g.h2oCcBytes(n) : uint64_t{0}});
  buffers.workspace.reserve(wsBytes);
  const size_t qFloats = size_t(n) * qHeads * g.dim;
  const size_t kvFloats = size_t(n) * kKvHeads * g.dim;
  buffers.inputs.reserve((2 * qFloats + 2 * kvFloats) * sizeof(float));
  float *q = buffers.inputs.as<float>();
  float *k = q + qFloats, *v = k + kvFloats, *out = v + kvFloats;
  fillRandomFloat(q, qFloats + 2 * kvFloats, buffers.seed++);
  std::vector<int32_t> positions(n);
  for (int i = 0; i < n; ++i)
    positions[i] = i;
  CUDA_CHECK(cudaDeviceSynchronize());
  EventTimer timer;
  for (int variant = 0; variant < kNumPrefill; ++variant) {
    PrefillFn fn = variant == kPrefillPlain    ? g.plainPrefill
                   : variant == kPrefillSnapKV ? g.snapkvPrefill
                   : variant == kPrefillH2O    ? g.h2oPrefill
                   : variant == kPrefillPlainCc ? g.prefillCc
                                                : g.h2oCc;
    if (!fn)
      continue; // not compiled in: r.ok stays false, no error
    try {
      auto once = [&] {
        KVC_CHECK(fn(ctx.context, 0, 0, n, q, k, v, positions.data(), out,
                     buffers.workspace.ptr, buffers.workspace.bytes, stream));
      };
      // Prefill needs empty heads: a fresh sequence before every call.
      auto reset = [&] {
        KVC_CHECK(kvc_sequence_remove(ctx.context, 0));
        KVC_CHECK(kvc_sequence_add(ctx.context, 0));
      };
      if (o.warmUp) {
        timer.time(stream, once);
        reset();
      }
      double ms = 0.0;
      int reps = 0;
      while ((ms < o.minMs || reps < o.minReps) && reps < 1000) {
        ms += timer.time(stream, once);
        ++reps;
        reset();
      }
      CUDA_CHECK(cudaGetLastError());
      r.ms[variant] = ms / reps;
      r.ok[variant] = true;
    } catch (const BenchError &e) {
      cellFailed(r.error[variant], e, stream);
      try {
        KVC_CHECK(kvc_sequence_remove(ctx.context, 0));
        KVC_CHECK(kvc_sequence_add(ctx.context, 0));
      } catch (const BenchError &) {
      }
    }
  }
  return r;
}

//===--- KIVI ----------------------------------------------------------------===//

struct KiviResult {
  bool ok[kNumKivi] = {};
  double usPerStep[kNumKivi] = {};
  /// Mean bytes a step reads (kiviCacheBytes over the timed steps).
  double bytesPerStep[kNumKivi] = {};
  std::string error[kNumKivi];
  /// int2's step as plan, a replay of its run from a CUDA graph, finish.
  bool graphOk = false;
  double graphUsPerStep = 0.0;
  std::string graphError;
};

/// Bytes a decode step reads of the KIVI cache `ctx` holds in layer 0,
/// from the page layout and each slot's formats: per live entry 8 B
/// (position, per-slot KIVI word), its key (a packed row, or a residual row
/// of head_dim dtype elements while still in full precision) and its value
/// (a packed row and its {scale, min} record, or a residual row); per key
/// block holding a quantized live key, the block's per-channel record.
double kiviCacheBytes(const Context &ctx, int batch) {
  kvc_page_layout_t layout{};
  KVC_CHECK(kvc_page_layout(&ctx.config, &layout));
  const double fullRow =
      double(ctx.config.head_dim) * (ctx.config.dtype == KVC_DTYPE_F32 ? 4 : 2);
  const int32_t group = ctx.config.group_size;
  double bytes = 0.0;
  for (int b = 0; b < batch; ++b)
    for (int h = 0; h < kKvHeads; ++h) {
      kvc_metadata_t meta{};
      KVC_CHECK(kvc_get_metadata(ctx.context, b, 0, h, &meta));
      int32_t block = -1;
      for (int32_t s = 0; s < meta.num_slots; ++s) {
        if (meta.position[s] == KVC_POSITION_NONE)
          continue;
        bytes += 8;
        if (meta.key_format[s] == KVC_FORMAT_FULL) {
          bytes += fullRow;
        } else {
          bytes += double(layout.key_stride);
          if (s / group != block) {
            block = s / group;
            bytes += double(layout.key_param_stride);
          }
        }
        if (meta.value_format[s] == KVC_FORMAT_FULL)
          bytes += fullRow;
        else
          bytes += double(layout.value_stride + layout.value_param_stride);
      }
    }
  return bytes;
}

/// Times the KIVI decode variants at one (geometry, batch, context). Per
/// format a KIVI device pool holds B sequences of `n` entries in every
/// kv-head, appended with null data over random finite f16 bytes (every
/// {scale, min} record then decodes to finite floats; no data-dependent
/// branch in the kernels). Each round of steps appends one token per step
/// with increasing positions; between rounds (untimed) the oldest entries
/// are evicted down to `n`, so the residual window keeps its R newest
/// entries and every step quantizes the value that leaves it, as in a long
/// decode. As in timeSteps, an untimed step before each round rebuilds the
/// device-resident slot tables (the eviction and the byte count read the
/// runtime's bookkeeping, which settles them), so the timed steps run on
/// tables kept on the device.
/// One KIVI decode (a policy's configure, workspace size and batched
/// decode) at `batch` sequences of `n` entries: microseconds and bytes read
/// per step. Throws BenchError.
struct KiviTiming {
  double usPerStep, bytesPerStep;
};

/// A policy's decode step in three calls (plan, run, finish).
struct StepCalls {
  PlanFn plan = nullptr;
  RunFn run = nullptr;
  FinishFn finish = nullptr;
};

/// With `calls`, every step is the plan, a replay of the run captured in a
/// CUDA graph at the first step, and the finish, instead of `decode`.
KiviTiming timeKivi(ConfigureFn configure, BatchBytesFn workspaceBytes,
                    DecodeFn decode, int dim, int qHeads, Buffers &buffers,
                    int batch, int n, const Options &o, cudaStream_t stream,
                    const StepCalls *calls = nullptr) {
  const int steps = o.steps;
  EventTimer timer;
  kvc_config_t kivi{};
  configure(&kivi);
  // Headroom: the untimed step's and the round's tokens, the open key
  // block and the partly evicted oldest one.
  Context ctx(configure, dim, buffers, batch, n,
              steps + 2 + 2 * kivi.group_size, o.pageSize);
  fillRandomHalf(buffers.pool.ptr, ctx.poolBytes, buffers.seed++);
  // Slots after an append plus one page, as the generated code checks.
  const int32_t stride = (ctx.pagesPerHead + 1) * o.pageSize;
  buffers.workspace.reserve(workspaceBytes(batch, stride));
  Batch in(buffers, batch, qHeads, dim);
  CUDA_CHECK(cudaDeviceSynchronize());
  int32_t position = n;
  RunGraphs graphs(1);
  auto step = [&](int32_t at) {
    void *ws = buffers.workspace.ptr;
    const uint64_t wsBytes = buffers.workspace.bytes;
    if (!calls) {
      KVC_CHECK(decode(ctx.context, batch, in.sequences.data(), 0, in.q, in.k,
                       in.v, in.at(at), in.out, ws, wsBytes, stream));
      return;
    }
    KVC_CHECK(calls->plan(ctx.context, batch, in.sequences.data(), 0,
                          in.at(at), stride, ws, wsBytes, stream));
    graphs.launch(0, stream, [&] {
      return calls->run(ctx.context, batch, 0, in.q, in.k, in.v, in.out,
                        stride, ws, wsBytes, stream);
    });
    KVC_CHECK(calls->finish(ctx.context, 0, stream));
  };
  auto prime = [&] {
    step(position++);
    CUDA_CHECK(cudaStreamSynchronize(stream));
  };
  auto round = [&] {
    for (int i = 0; i < steps; ++i, ++position)
      step(position);
  };
  // Warm-up round (first launches, host allocations).
  if (o.warmUp) {
    prime();
    timer.time(stream, round);
    ctx.restoreOldest(batch, n);
  }
  double ms = 0.0, bytes = 0.0;
  int rounds = 0;
  while ((ms < o.minMs || rounds < o.minRounds) && rounds < 10000) {
    // Timed step i reads the cache after its append, the (i + 2)th since
    // `first` (the untimed step's is the first): interpolate between the
    // state before the untimed step and after the round.
    const double first = kiviCacheBytes(ctx, batch);
    prime();
    ms += timer.time(stream, round);
    const double last = kiviCacheBytes(ctx, batch);
    bytes += first + (last - first) * (steps + 3) / (2.0 * (steps + 1));
    ++rounds;
    ctx.restoreOldest(batch, n);
  }
  CUDA_CHECK(cudaGetLastError());
  return {1e3 * ms / (double(rounds) * steps), bytes / rounds};
}

KiviResult benchKivi(const BenchGeometry &g, Buffers &buffers, int batch, int n,
                     const Options &o, cudaStream_t stream) {
  KiviResult r;
  for (int variant = 0; variant < kNumKivi; ++variant) {
    if (!o.variants[kNumVariants + variant]) {
      r.error[variant] = "not selected (--variants)";
      continue;
    }
    try {
      const KiviTiming t = timeKivi(
          g.kiviConfigure[variant], g.kiviBytes[variant], g.kiviDecode[variant],
          g.dim, kKvHeads * g.group, buffers, batch, n, o, stream);
      r.usPerStep[variant] = t.usPerStep;
      r.bytesPerStep[variant] = t.bytesPerStep;
      r.ok[variant] = true;
    } catch (const BenchError &e) {
      cellFailed(r.error[variant], e, stream);
    }
  }
  if (o.variants[kNumVariants + kInt2]) {
    const StepCalls calls{g.kivi2Plan, g.kivi2Run, g.kivi2Finish};
    try {
      r.graphUsPerStep =
          timeKivi(g.kiviConfigure[kInt2], g.kiviBytes[kInt2],
                   g.kiviDecode[kInt2], g.dim, kKvHeads * g.group, buffers,
                   batch, n, o, stream, &calls)
              .usPerStep;
      r.graphOk = true;
    } catch (const BenchError &e) {
      cellFailed(r.graphError, e, stream);
    }
  }
  return r;
}

//===--- Kernel alternatives ------------------------------------------------===//

/// The decodes of the alternatives table: plain's (tensor cores at these
/// groups) and plain_cc's, kivi2's (tensor cores, launch bounds for four
/// blocks per SM), kivi2_cc's and kivi2_free's, fused's (the cache read
/// evict-first, a fold of planFold's blocks), fused_lru's and
/// fused_split's, plain_len's, plain_late's, fused_serial's, fused_first's,
/// plain_regq's, plain_rowv's, kivi2_rowv's, fused_keep's, fused_norm's,
/// fused_grid's, kivi2_late's and kivi2_b5's (GpuBenchPolicies.cmake).
enum Alternative {
  kAltPlain = 0,
  kAltPlainCc = 1,
  kAltInt2 = 2,
  kAltInt2Cc = 3,
  kAltInt2Free = 4,
  kAltFused = 5,
  kAltFusedLru = 6,
  kAltFusedSplit = 7,
  kAltPlainLen = 8,
  kAltPlainLate = 9,
  kAltFusedSerial = 10,
  kAltFusedFirst = 11,
  kAltPlainRegq = 12,
  kAltPlainRowv = 13,
  kAltInt2Rowv = 14,
  kAltFusedKeep = 15,
  kAltFusedNorm = 16,
  kAltFusedGrid = 17,
  kAltInt2Late = 18,
  kAltInt2B5 = 19,
  kNumAlternatives = 20
};
const char *kAlternativeNames[] = {
    "plain",       "plain_cc",   "int2",         "int2_cc",
    "int2_free",   "fused",      "fused_lru",    "fused_split",
    "plain_len",   "plain_late", "fused_serial", "fused_first",
    "plain_regq",  "plain_rowv", "int2_rowv",    "fused_keep",
    "fused_norm",  "fused_grid", "int2_late",    "int2_b5"};

std::string cell(bool ok, const char *fmt, double x);
void csv(const char *fmt, ...);

/// The decodes of an alternatives table's cell, one after the other: each
/// one's time per step, or the error it failed with.
template <int N> struct TimedDecodes {
  bool ok[N] = {};
  double usPerStep[N] = {};
  std::string error[N];

  /// Decode a's microseconds, and a's time over b's, as table cells ('-'
  /// where one failed).
  std::string us(int a) const { return cell(ok[a], "%.1f", usPerStep[a]); }
  std::string ratio(int a, int b) const {
    const bool both = ok[a] && ok[b];
    return cell(both, "%.2f", both ? usPerStep[a] / usPerStep[b] : 0.0);
  }
  /// The lines under the cell's row: each decode that failed with its
  /// error; the CSV rows (alt_<name>) of the others.
  void details(const char *const (&names)[N], int dim, int group, int batch,
               int n, double copyGBs) const {
    for (int a = 0; a < N; ++a) {
      if (!ok[a])
        std::printf("     %s: %s\n", names[a], error[a].c_str());
      else
        csv("alt_%s,%d,%d,%d,%d,%d,,us,%.3f,,,,%.1f\n", names[a], dim, group,
            kKvHeads * group, batch, n, usPerStep[a], copyGBs);
    }
    std::fflush(stdout);
  }
};

using AlternativesResult = TimedDecodes<kNumAlternatives>;

/// One 16-bit decode of a cell's list (timeDecodes): its batched decode
/// and workspace size, and its alternative's index in the cell's results.
struct DecodeChoice {
  int alt;
  DecodeFn decode;
  BatchBytesFn bytes;
};

/// Times 16-bit decodes one after the other at one (geometry, batch,
/// context), over one f16 context of the fused policy's configuration (as
/// benchDecode's plain and fused), each as timeSteps does: ok[alt] and
/// usPerStep[alt] of each, or error[alt] where one fails (the others go on).
template <size_t N>
void timeDecodes(const BenchGeometry &g, Buffers &buffers, int batch, int n,
                 const Options &o, cudaStream_t stream,
                 const std::array<DecodeChoice, N> &decodes, bool *ok,
                 double *usPerStep, std::string *error) {
  const int qHeads = kKvHeads * g.group;
  Context ctx(g.configure[kFused], g.dim, buffers, batch, n, o.steps + 2,
              o.pageSize);
  // Slots after an append plus one page, as benchDecode.
  const int32_t stride = (ctx.pagesPerHead + 1) * o.pageSize;
  uint64_t bytes = 0;
  for (const DecodeChoice &d : decodes)
    bytes = std::max(bytes, d.bytes(batch, stride));
  buffers.workspace.reserve(bytes);
  Batch in(buffers, batch, qHeads, g.dim);
  CUDA_CHECK(cudaDeviceSynchronize());
  EventTimer timer;
  for (const DecodeChoice &d : decodes) {
    try {
      usPerStep[d.alt] = timeSteps(
          timer, ctx, batch, n, o, stream, [&](int32_t position, bool) {
            KVC_CHECK(d.decode(ctx.context, batch, in.sequences.data(), 0,
                               in.q, in.k, in.v, in.at(position), in.out,
                               buffers.workspace.ptr, buffers.workspace.bytes,
                               stream));
          });
      ok[d.alt] = true;
    } catch (const BenchError &e) {
      cellFailed(error[d.alt], e, stream);
    }
  }
}

/// Times the twenty decodes at one (geometry, batch, context), one after
/// the other: the 16-bit ones over one f16 context as benchDecode, the KIVI
/// ones as benchKivi.
AlternativesResult benchAlternatives(const BenchGeometry &g, Buffers &buffers,
                                     int batch, int n, const Options &o,
                                     cudaStream_t stream) {
  AlternativesResult r;
  const int qHeads = kKvHeads * g.group;
  timeDecodes(g, buffers, batch, n, o, stream,
              std::array<DecodeChoice, 14>{{
                  {kAltPlain, g.plainDecode, g.plainBytes},
                  {kAltPlainCc, g.plainCcDecode, g.plainCcBytes},
                  {kAltPlainLen, g.plainLenDecode, g.plainLenBytes},
                  {kAltPlainLate, g.plainLateDecode, g.plainLateBytes},
                  {kAltPlainRegq, g.plainRegqDecode, g.plainRegqBytes},
                  {kAltPlainRowv, g.plainRowvDecode, g.plainRowvBytes},
                  {kAltFused, g.fusedDecode, g.fusedBytes},
                  {kAltFusedLru, g.fusedLruDecode, g.fusedLruBytes},
                  {kAltFusedSplit, g.fusedSplitDecode, g.fusedSplitBytes},
                  {kAltFusedSerial, g.fusedSerialDecode, g.fusedSerialBytes},
                  {kAltFusedFirst, g.fusedFirstDecode, g.fusedFirstBytes},
                  {kAltFusedKeep, g.fusedKeepDecode, g.fusedKeepBytes},
                  {kAltFusedNorm, g.fusedNormDecode, g.fusedNormBytes},
                  {kAltFusedGrid, g.fusedGridDecode, g.fusedGridBytes},
              }},
              r.ok, r.usPerStep, r.error);
  // kivi2 itself (-1), or entry i of the geometry's kivi2 alternatives
  // (KVC_BENCH_GEOMETRY_WITH_ALTERNATIVES: _cc, _free, _rowv, _late, _b5).
  const std::pair<int, int> kivi2Alternatives[] = {
      {kAltInt2, -1},    {kAltInt2Cc, 0},   {kAltInt2Free, 1},
      {kAltInt2Rowv, 2}, {kAltInt2Late, 3}, {kAltInt2B5, 4}};
  for (const auto &[alt, i] : kivi2Alternatives) {
    const bool shipped = i < 0;
    try {
      r.usPerStep[alt] =
          timeKivi(shipped ? g.kiviConfigure[kInt2] : g.kivi2AltConfigure[i],
                   shipped ? g.kiviBytes[kInt2] : g.kivi2AltBytes[i],
                   shipped ? g.kiviDecode[kInt2] : g.kivi2AltDecode[i], g.dim,
                   qHeads, buffers, batch, n, o, stream)
              .usPerStep;
      r.ok[alt] = true;
    } catch (const BenchError &e) {
      cellFailed(r.error[alt], e, stream);
    }
  }
  return r;
}

/// The decodes of the G = 1 alternatives table: kivi2's (decodeKiviTiles,
/// registers left to ptxas, each tile's slot words copied a tile ahead),
/// kivi2_late's and kivi2_b9's; fused's (the H2O step: the 16-bit register
/// path, a fold kernel after the attention, launched as programmatic
/// dependents), fused_serial's, fused_keep's, fused_norm's and
/// fused_grid's (gpu_bench_g1_alternatives).
enum G1Alternative {
  kG1Int2 = 0,
  kG1Int2Late = 1,
  kG1Int2B9 = 2,
  kG1Fused = 3,
  kG1FusedSerial = 4,
  kG1FusedKeep = 5,
  kG1FusedNorm = 6,
  kG1FusedGrid = 7,
  kNumG1 = 8
};
const char *kG1AlternativeNames[] = {
    "int2",         "int2_late",  "int2_b9",    "fused",
    "fused_serial", "fused_keep", "fused_norm", "fused_grid"};

using G1AlternativesResult = TimedDecodes<kNumG1>;

/// Times the eight G = 1 decodes at one (geometry, batch, context), one
/// after the other: the fused ones over one f16 context as benchDecode, the
/// KIVI ones as benchKivi.
G1AlternativesResult benchG1Alternatives(const BenchGeometry &g,
                                         Buffers &buffers, int batch, int n,
                                         const Options &o,
                                         cudaStream_t stream) {
  G1AlternativesResult r;
  timeDecodes(
      g, buffers, batch, n, o, stream,
      std::array<DecodeChoice, 5>{{
          {kG1Fused, g.fusedDecode, g.fusedBytes},
          {kG1FusedSerial, g.fusedG1AltDecode[0], g.fusedG1AltBytes[0]},
          {kG1FusedKeep, g.fusedG1AltDecode[1], g.fusedG1AltBytes[1]},
          {kG1FusedNorm, g.fusedG1AltDecode[2], g.fusedG1AltBytes[2]},
          {kG1FusedGrid, g.fusedG1AltDecode[3], g.fusedG1AltBytes[3]},
      }},
      r.ok, r.usPerStep, r.error);
  const int qHeads = kKvHeads * g.group;
  for (int alt : {kG1Int2, kG1Int2Late, kG1Int2B9}) {
    // kivi2 itself, or entry alt - 1 of kivi2TileAlt*: _late, _b9.
    const bool shipped = alt == kG1Int2;
    try {
      r.usPerStep[alt] =
          timeKivi(shipped ? g.kiviConfigure[kInt2]
                           : g.kivi2TileAltConfigure[alt - 1],
                   shipped ? g.kiviBytes[kInt2] : g.kivi2TileAltBytes[alt - 1],
                   shipped ? g.kiviDecode[kInt2]
                           : g.kivi2TileAltDecode[alt - 1],
                   g.dim, qHeads, buffers, batch, n, o, stream)
              .usPerStep;
      r.ok[alt] = true;
    } catch (const BenchError &e) {
      cellFailed(r.error[alt], e, stream);
    }
  }
  return r;
}

//===--- Output --------------------------------------------------------------===//

/// Prints to stdout and, when open, mirrors CSV rows to a file. Each row
/// reaches the file when it is written, so that a run stopped from outside
/// (a time limit) keeps every row it measured.
FILE *gCsv = nullptr;

void csv(const char *fmt, ...) {
  if (!gCsv)
    return;
  va_list args;
  va_start(args, fmt);
  std::vfprintf(gCsv, fmt, args);
  va_end(args);
  std::fflush(gCsv);
}

const char *mark(bool applies, bool met) {
  return !applies ? "-" : (met ? "ok" : "MISS");
}

std::string cell(bool ok, const char *fmt, double x) {
  return ok ? format(fmt, x) : std::string("-");
}

bool parseList(const char *text, std::vector<int> &values) {
  values.clear();
  if (std::strcmp(text, "none") == 0)
    return true;
  const char *p = text;
  while (*p) {
    char *end = nullptr;
    long x = std::strtol(p, &end, 10);
    if (end == p || x <= 0)
      return false;
    if (*end == 'k' || *end == 'K') {
      x *= 1024;
      ++end;
    }
    values.push_back(int(x));
    if (*end == ',')
      ++end;
    else if (*end)
      return false;
    p = end;
  }
  return true;
}

std::string joinList(const std::vector<int> &values) {
  if (values.empty())
    return "none";
  std::string s;
  for (size_t i = 0; i < values.size(); ++i)
    s += (i ? "," : "") + std::to_string(values[i]);
  return s;
}

void usage(const char *argv0) {
  std::printf(
      "usage: %s [options]\n"
      "  --batch=LIST            sequences per step (default 1,8,32)\n"
      "  --context=LIST          cached entries per sequence (default "
      "1k,4k,16k,32k)\n"
      "  --prefill-context=LIST  prompt lengths of the prefill table, batch 1 "
      "(default 1k,4k,16k; 'none' skips it)\n"
      "  --model-context=LIST    contexts of the model-step table (default "
      "4k,16k; 'none' skips it)\n"
      "  --alt-context=LIST      contexts of the kernel alternatives tables "
      "(G >= 2, and KIVI at G = 1; default 16k,32k; 'none' skips them)\n"
      "  --host-context=LIST     contexts of the host-side table (default "
      "4k,32k; 'none' skips it)\n"
      "  --dim=LIST, --group=LIST  restrict to these head dims / GQA groups\n"
      "  --min-ms=X              timed milliseconds per measurement (default "
      "100)\n"
      "  --steps=N               decode steps per timed round (default 8)\n"
      "  --page-size=N           runtime page size in entries (default 64)\n"
      "  --variants=LIST         decode variants among plain,fused,unfused,"
      "int2,int4 (default all)\n"
      "  --quick                 batch 1, context 1k, prefill 1k, 20 ms\n"
      "  --check                 --quick, run once: no warm-up, one timed run "
      "per cell, a 64 MiB copy test; checks that every call of the sweep "
      "succeeds (its times are not measurements)\n"
      "  --csv=FILE              also write the rows as CSV\n"
      "  --list                  print the compiled-in geometries and the "
      "sweep, then exit (no GPU needed)\n"
      "Exits 77 when no CUDA device is usable.\n",
      argv0);
}

int parseOptions(int argc, char **argv, Options &o) {
  for (int i = 1; i < argc; ++i) {
    std::string arg = argv[i];
    std::string value;
    const size_t eq = arg.find('=');
    auto takeValue = [&]() -> bool {
      if (eq != std::string::npos) {
        value = arg.substr(eq + 1);
        return true;
      }
      if (i + 1 < argc) {
        value = argv[++i];
        return true;
      }
      return false;
    };
    const std::string key = arg.substr(0, eq);
    bool good = true;
    if (key == "--help" || key == "-h") {
      usage(argv[0]);
      return 0;
    } else if (key == "--list") {
      o.list = true;
    } else if (key == "--quick" || key == "--check") {
      o.batches = {1};
      o.contexts = {1024};
      o.prefillContexts = {1024};
      o.modelContexts = {1024};
      o.alternativeContexts = {1024};
      o.hostContexts = {1024};
      o.minMs = 20.0;
      if (key == "--check") {
        o.minMs = 1e-3;
        o.minRounds = o.minReps = 1;
        o.warmUp = false;
        o.copyRuns = 1;
        o.copyBytes = size_t(64) << 20;
      }
    } else if (key == "--batch") {
      good = takeValue() && parseList(value.c_str(), o.batches);
    } else if (key == "--context") {
      good = takeValue() && parseList(value.c_str(), o.contexts);
    } else if (key == "--prefill-context") {
      good = takeValue() && parseList(value.c_str(), o.prefillContexts);
    } else if (key == "--model-context") {
      good = takeValue() && parseList(value.c_str(), o.modelContexts);
    } else if (key == "--host-context") {
      good = takeValue() && parseList(value.c_str(), o.hostContexts);
    } else if (key == "--alt-context") {
      good = takeValue() && parseList(value.c_str(), o.alternativeContexts);
    } else if (key == "--dim") {
      good = takeValue() && parseList(value.c_str(), o.dims);
    } else if (key == "--group") {
      good = takeValue() && parseList(value.c_str(), o.groups);
    } else if (key == "--min-ms") {
      good = takeValue() && (o.minMs = std::atof(value.c_str())) > 0.0;
    } else if (key == "--steps") {
      good = takeValue() && (o.steps = std::atoi(value.c_str())) > 0;
    } else if (key == "--page-size") {
      good = takeValue() && (o.pageSize = std::atoi(value.c_str())) > 0;
    } else if (key == "--variants") {
      good = takeValue();
      for (bool &v : o.variants)
        v = false;
      size_t at = 0;
      while (good && at <= value.size()) {
        const size_t comma = std::min(value.find(',', at), value.size());
        const std::string name = value.substr(at, comma - at);
        int found = -1;
        for (int v = 0; v < kNumVariants + kNumKivi; ++v)
          if (name == kVariantNames[v])
            found = v;
        good = found >= 0;
        if (good)
          o.variants[found] = true;
        at = comma + 1;
      }
    } else if (key == "--csv") {
      good = takeValue() && !value.empty();
      o.csv = value;
    } else {
      good = false;
    }
    if (!good) {
      std::fprintf(stderr, "%s: bad argument '%s'\n", argv[0], argv[i]);
      usage(argv[0]);
      return 2;
    }
  }
  // Every table but the prefill's has a row per batch and context: without
  // a batch those with contexts would print their headers and no row (a
  // --batch=none meant to skip the decode table, which --context=none
  // does, would leave them all empty).
  if (o.batches.empty()) {
    std::string tables;
    auto add = [&](const std::vector<int> &contexts, const char *table) {
      if (!contexts.empty())
        tables += (tables.empty() ? "" : ", ") + std::string(table);
    };
    add(o.contexts, "decode and KIVI (--context)");
    add(o.alternativeContexts, "kernel alternatives (--alt-context)");
    add(o.modelContexts, "model step (--model-context)");
    add(o.hostContexts, "host side (--host-context)");
    if (!tables.empty()) {
      std::fprintf(stderr,
                   "%s: --batch=none leaves these tables without a row: %s; "
                   "give their contexts 'none' too (--context=none skips the "
                   "decode and KIVI tables)\n",
                   argv[0], tables.c_str());
      return 2;
    }
  }
  return -1;
}

bool selected(const std::vector<int> &filter, int x) {
  return filter.empty() || std::find(filter.begin(), filter.end(), x) != filter.end();
}

/// One table's sweep: bench(g, batch, n) for every selected geometry (of
/// those for which `applies` holds, when given), batch and context of
/// `contexts`, then print(g, batch, n, result) for each cell that
/// succeeded; a cell that throws prints its error row instead and counts in
/// gCellErrors.
template <typename Bench, typename Print>
void sweepCells(const Options &o, const std::vector<int> &contexts, Bench bench,
                Print print, bool (*applies)(const BenchGeometry &) = nullptr) {
  for (const BenchGeometry &g : kBenchGeometries) {
    if (!selected(o.dims, g.dim) || !selected(o.groups, g.group) ||
        (applies && !applies(g)))
      continue;
    for (int batch : o.batches)
      for (int n : contexts) {
        try {
          print(g, batch, n, bench(g, batch, n));
        } catch (const BenchError &e) {
          std::printf("%4d %3d %4d %3d %7d  error: %s\n", g.dim, g.group,
                      kKvHeads * g.group, batch, n, e.what());
          cudaGetLastError();
          ++gCellErrors;
        }
      }
  }
}

void printList(const Options &o) {
  kvc_config_t config{};
  kBenchGeometries[0].configure[kFused](&config);
  std::printf("kvc-bench-gpu: compiled-in geometries (layers=%d, kv_heads=%d, "
              "f16 cache):\n",
              config.num_layers, kKvHeads);
  for (const BenchGeometry &g : kBenchGeometries)
    std::printf("  head_dim=%-4d group=%d q_heads=%-3d %s\n", g.dim, g.group,
                kKvHeads * g.group,
                selected(o.dims, g.dim) && selected(o.groups, g.group)
                    ? ""
                    : "(not selected)");
  std::printf("decode variants: plain (policies/snapkv.mlir decode: attention "
              "only), fused (bench/policies/h2o_decode.mlir), unfused (same, "
              "--kvc-form-kernels=unfused=1)\n");
  std::printf("prefill variants: plain (h2o_decode prefill: attention, every "
              "entry stored), snapkv (policies/snapkv.mlir), h2o "
              "(policies/h2o.mlir)\n");
  std::printf("sweep: batch %s, context %s, prefill %s, %g ms per "
              "measurement, %d steps per round, page size %d\n",
              joinList(o.batches).c_str(), joinList(o.contexts).c_str(),
              joinList(o.prefillContexts).c_str(), o.minMs, o.steps,
              o.pageSize);
  std::printf("KIVI decode variants: int2 (policies/kivi2.mlir), int4 "
              "(policies/kivi4.mlir), against plain (16-bit)\n");
  std::printf("host side of a decode call: plain and fused, contexts %s\n",
              joinList(o.hostContexts).c_str());
  std::printf("model step: every layer of the fused policy per token, "
              "pipelined against synchronized after each layer and against "
              "the runs replayed from CUDA graphs; contexts %s\n",
              joinList(o.modelContexts).c_str());
  bool alternatives = false;
  for (const BenchGeometry &g : kBenchGeometries)
    alternatives = alternatives || g.hasAlternatives();
  if (alternatives)
    std::printf("kernel alternatives (geometries with G >= 2): plain_cc "
                "(plain's decode, KVC_CUDA_TENSOR_CORES=0), kivi2_cc (kivi2, "
                "KVC_CUDA_TENSOR_CORES=0), kivi2_free (kivi2, "
                "KVC_CUDA_KIVI_MMA_BLOCKS=0), fused_lru (fused, "
                "KVC_CUDA_EVICT_FIRST=0), fused_split (fused, "
                "KVC_CUDA_FOLD_PLAN=0), plain_len (plain, "
                "KVC_CUDA_SPLIT_PLAN=0), plain_late (plain, "
                "KVC_CUDA_ISSUE_AHEAD=0), fused_serial (fused, "
                "KVC_CUDA_DEPENDENT_LAUNCH=0), fused_first (fused, "
                "KVC_CUDA_FOLD_AHEAD=0), plain_regq (plain, "
                "KVC_CUDA_MMA_SHARED_QUERY=0), plain_rowv (plain, "
                "KVC_CUDA_MMA_TRANSPOSED_VALUES=0), kivi2_rowv (kivi2, "
                "KVC_CUDA_MMA_TRANSPOSED_VALUES=0), kivi2_late (kivi2, "
                "KVC_CUDA_ISSUE_AHEAD=0), kivi2_b5 (kivi2, "
                "KVC_CUDA_KIVI_MMA_BLOCKS=5), fused_keep (fused, "
                "KVC_CUDA_DISCARD_LOGITS=0), fused_norm (fused, "
                "KVC_CUDA_LOGITS_EVICT_LAST=0), fused_grid (fused, "
                "KVC_CUDA_FOLD_IN_GRID=1), contexts %s; "
                "prefill_cc and h2o_cc (the plain and H2O prefills, "
                "KVC_CUDA_PREFILL_MMA=0) in the prefill table\n",
                joinList(o.alternativeContexts).c_str());
  else
    std::printf("kernel alternatives: none compiled in (kvc-bench-gpu has "
                "them)\n");
  bool g1Alternatives = false;
  for (const BenchGeometry &g : kBenchGeometries)
    g1Alternatives = g1Alternatives || g.hasG1Alternatives();
  if (g1Alternatives)
    std::printf("kernel alternatives (geometries with G = 1): kivi2_late "
                "(kivi2, KVC_CUDA_ISSUE_AHEAD=0), kivi2_b9 (kivi2, "
                "KVC_CUDA_KIVI_TILE_BLOCKS=9), fused_serial (fused, "
                "KVC_CUDA_DEPENDENT_LAUNCH=0), fused_keep (fused, "
                "KVC_CUDA_DISCARD_LOGITS=0), fused_norm (fused, "
                "KVC_CUDA_LOGITS_EVICT_LAST=0), fused_grid (fused, "
                "KVC_CUDA_FOLD_IN_GRID=1), contexts %s\n",
                joinList(o.alternativeContexts).c_str());
}

} // namespace

int main(int argc, char **argv) {
  Options o;
  const int parsed = parseOptions(argc, argv, o);
  if (parsed >= 0)
    return parsed;
  if (o.list) {
    printList(o);
    return 0;
  }

  int devices = 0;
  const cudaError_t error = cudaGetDeviceCount(&devices);
  if (error != cudaSuccess || devices == 0) {
    std::printf("kvc-bench-gpu: SKIP: no usable CUDA device (%s); the GPU "
                "benchmark needs one. Exit code 77.\n",
                error != cudaSuccess ? cudaGetErrorString(error)
                                     : "zero devices");
    return kSkip;
  }
  if (!o.csv.empty()) {
    gCsv = std::fopen(o.csv.c_str(), "w");
    if (!gCsv) {
      std::fprintf(stderr, "kvc-bench-gpu: cannot write %s\n", o.csv.c_str());
      return 2;
    }
  }

  const auto start = std::chrono::steady_clock::now();
  try {
    cudaDeviceProp prop{};
    CUDA_CHECK(cudaGetDeviceProperties(&prop, 0));
    gFillBlocks = prop.multiProcessorCount * 8;
    int driver = 0, runtime = 0;
    cudaDriverGetVersion(&driver);
    cudaRuntimeGetVersion(&runtime);
    cudaStream_t stream = nullptr;
    // A blocking stream: the fills below run on the legacy default stream,
    // and the generated code's synchronous copies too.
    CUDA_CHECK(cudaStreamCreate(&stream));

    std::printf("kvc-bench-gpu on %s (sm_%d%d, %d SMs, %.1f GiB), driver %d, "
                "runtime %d\n",
                prop.name, prop.major, prop.minor, prop.multiProcessorCount,
                prop.totalGlobalMem / double(1 << 30), driver, runtime);
    const CopyBandwidth copy =
        measureCopyBandwidth(stream, prop.multiProcessorCount, o.copyBytes,
                             o.copyRuns, o.warmUp);
    std::printf("copy bandwidth (read + written bytes / s, %.0f MiB buffer, "
                "best of %d): cudaMemcpy D2D %.0f GB/s, copy kernel %.0f GB/s; "
                "reference = %.0f GB/s\n",
                copy.bytes / 1048576.0, o.copyRuns, copy.memcpyGBs,
                copy.kernelGBs, copy.best());
    if (!o.warmUp)
      std::printf("--check: every cell runs once without a warm-up; the "
                  "times below are not measurements\n");
    // decode rows: times in microseconds per step of plain, fused, unfused;
    // int2 and int4 rows (KIVI): bytes per step of that format, the 16-bit
    // (plain) time, that format's time, its GB/s; int2_graph rows: the
    // 16-bit time, int2's step through a CUDA graph; prefill rows:
    // milliseconds per call of plain, snapkv, h2o; model rows:
    // microseconds per token (every layer) of the fused policy pipelined,
    // then synchronized, then of the plain decode pipelined, then of the
    // fused policy through CUDA graphs (fused_GBs column); alt_<name>
    // rows (kernel alternatives): that decode's microseconds per step;
    // alt_prefill_cc rows: milliseconds per call of the plain and the H2O
    // prefill on CUDA cores; host rows: CPU microseconds per call of the
    // plain, the fused and the int2 decode (the host side, kernels
    // excluded).
    csv("kind,head_dim,group,q_heads,batch,context,bytes_per_step,time_unit,"
        "t_plain,t_fused_or_snapkv,t_unfused_or_h2o_or_int2,fused_GBs,"
        "copy_GBs\n");
    csv("copy,,,,,,%zu,,,,,,%.1f\n", copy.bytes, copy.best());

    Buffers buffers;
    // The plain (16-bit) decode time per (dim, group, batch, context), the
    // reference of the KIVI table.
    std::map<std::array<int, 4>, double> plainUs;
    // --context=none: neither the decode table nor the KIVI table (no
    // header without rows).
    const bool anyDecode =
        o.variants[kPlain] || o.variants[kFused] || o.variants[kUnfused];
    if (anyDecode && !o.contexts.empty()) {
      std::printf(
          "\nDecode: one step of one layer (kv_heads=%d, f16 cache, page size "
          "%d). Batch B = B sequences in one context, one batched call per "
          "step (_decode_batch: one launch per kernel for the batch).\n"
          "Times are cudaEvent time per step (the whole call, host bookkeeping "
          "and synchronizations inside the calls included), %d steps per "
          "round after a warm-up round, >= %g ms per cell; each round starts "
          "at `context` entries and appends one per step.\n"
          "bytes/step = sum over sequences of entries * kv_heads * (2 * "
          "head_dim * 2 B [f16 keys and values] + 8 B [position, score "
          "state])\n"
          "fused GB/s = bytes/step / fused time; %%copy = fused GB/s / copy "
          "bandwidth; ovh = fused / plain - 1 (cost of the policy's "
          "statistics and selection); unf/fus = unfused / fused.\n"
          "Targets: %%copy >= %.0f%% at batch >= 8 and context >= 4k; ovh <= "
          "%.0f%%; unf/fus >= %.1fx (H2O: accumulated attention statistics). "
          "'-': target does not apply.\n\n",
          kKvHeads, o.pageSize, o.steps, o.minMs, 100 * kTargetCopyFraction,
          100 * kTargetStatsOverhead, kTargetUnfusedRatio);
      std::printf("%4s %3s %4s %3s %7s %9s | %9s %9s %9s | %8s %8s %6s %4s | "
                  "%7s %4s | %7s %4s\n",
                  "dim", "G", "qh", "B", "context", "MB/step", "plain us",
                  "fused us", "unfus us", "plainGB/s", "fusGB/s", "%copy",
                  "tgt", "ovh", "tgt", "unf/fus", "tgt");
      // Every variant of a geometry decodes the same context.
      for (const BenchGeometry &g : kBenchGeometries) {
        if (!selected(o.dims, g.dim) || !selected(o.groups, g.group))
          continue;
        kvc_config_t reference{};
        g.configure[kFused](&reference);
        for (int v = 0; v < 4; ++v) {
          kvc_config_t c{};
          g.configure[v](&c);
          if (std::memcmp(&c, &reference, sizeof c) != 0)
            throw BenchError("the policies of a geometry configure different "
                             "contexts");
        }
      }
      sweepCells(
          o, o.contexts,
          [&](const BenchGeometry &g, int batch, int n) {
            return benchDecode(g, buffers, batch, n, o, stream);
          },
          [&](const BenchGeometry &g, int batch, int n, const DecodeResult &r) {
            const double bytes = double(batch) * r.meanEntries * kKvHeads *
                                 (2.0 * g.dim * 2 + 8);
            auto gbs = [&](int v) {
              return bytes / (r.usPerStep[v] * 1e-6) / 1e9;
            };
            const bool fused = r.ok[kFused], plain = r.ok[kPlain],
                       unfused = r.ok[kUnfused];
            const double fraction = fused ? gbs(kFused) / copy.best() : 0.0;
            const double overhead =
                fused && plain ? r.usPerStep[kFused] / r.usPerStep[kPlain] - 1
                               : 0;
            const double ratio =
                fused && unfused ? r.usPerStep[kUnfused] / r.usPerStep[kFused]
                                 : 0;
            std::printf(
                "%4d %3d %4d %3d %7d %9.2f | %9s %9s %9s | %8s %8s %6s %4s | "
                "%7s %4s | %7s %4s\n",
                g.dim, g.group, kKvHeads * g.group, batch, n, bytes / 1e6,
                cell(plain, "%.1f", r.usPerStep[kPlain]).c_str(),
                cell(fused, "%.1f", r.usPerStep[kFused]).c_str(),
                cell(unfused, "%.1f", r.usPerStep[kUnfused]).c_str(),
                cell(plain, "%.0f", plain ? gbs(kPlain) : 0).c_str(),
                cell(fused, "%.0f", fused ? gbs(kFused) : 0).c_str(),
                cell(fused, "%.1f%%", 100 * fraction).c_str(),
                mark(fused && batch >= 8 && n >= 4096,
                     fraction >= kTargetCopyFraction),
                cell(fused && plain, "%+.1f%%", 100 * overhead).c_str(),
                mark(fused && plain, overhead <= kTargetStatsOverhead),
                cell(fused && unfused, "%.2fx", ratio).c_str(),
                mark(fused && unfused, ratio >= kTargetUnfusedRatio));
            for (int v = 0; v < kNumVariants; ++v)
              if (!r.ok[v] && o.variants[v])
                std::printf("     %s: %s\n", kVariantNames[v],
                            r.error[v].c_str());
            if (plain)
              plainUs[{g.dim, g.group, batch, n}] = r.usPerStep[kPlain];
            csv("decode,%d,%d,%d,%d,%d,%.0f,us,%.3f,%.3f,%.3f,%.1f,%.1f\n",
                g.dim, g.group, kKvHeads * g.group, batch, n, bytes,
                plain ? r.usPerStep[kPlain] : NAN,
                fused ? r.usPerStep[kFused] : NAN,
                unfused ? r.usPerStep[kUnfused] : NAN,
                fused ? gbs(kFused) : NAN, copy.best());
            std::fflush(stdout);
          });
    }

    if (o.variants[kFused] && !o.modelContexts.empty()) {
      kvc_config_t config{};
      kBenchGeometries[0].configure[kFused](&config);
      std::printf(
          "\nModel step: the fused decode (H2O's statistics and victim "
          "selection) of every one of the %d layers per token, batch B, as "
          "an engine calls it: pipelined = one _decode_batch call per layer "
          "(the calls do not synchronize: a layer's victims are evicted when "
          "its next step checks its tables out); synchronized = the same "
          "calls, each followed by cudaStreamSynchronize (what a step that "
          "waits for its kernels to hand the victims to the host costs); "
          "plain = the plain decode (attention only) of every layer, "
          "pipelined. cudaEvent time per token over %d tokens per round, >= "
          "%g ms per cell. sync/pipe = synchronized / pipelined; ovh = "
          "pipelined / plain - 1, the policy's cost where each layer's host "
          "work overlaps the kernels before it (target <= %.0f%%); graph = "
          "the fused step of every layer as _decode_plan_batch, a replay of "
          "the layer's _decode_run_batch captured in a CUDA graph, "
          "_decode_finish_batch; pipe/gr = pipelined / graph (above 1, the "
          "graphs are faster).\n\n",
          config.num_layers, o.steps, o.minMs, 100 * kTargetStatsOverhead);
      std::printf("%4s %3s %4s %3s %7s %6s | %11s %11s %9s | %12s %8s %4s | "
                  "%8s | %12s %7s\n",
                  "dim", "G", "qh", "B", "context", "layers", "pipe us/tok",
                  "sync us/tok", "sync/pipe", "plain us/tok", "ovh", "tgt",
                  "us/layer", "graph us/tok", "pipe/gr");
      sweepCells(
          o, o.modelContexts,
          [&](const BenchGeometry &g, int batch, int n) {
            return benchModel(g, buffers, batch, n, o, stream);
          },
          [&](const BenchGeometry &g, int batch, int n, const ModelResult &r) {
            const bool pipe = r.ok[kPipelined], sync = r.ok[kSynchronized];
            const bool plain = r.ok[kPlainPipelined];
            const double overhead =
                pipe && plain
                    ? r.usPerToken[kPipelined] / r.usPerToken[kPlainPipelined] -
                          1.0
                    : 0.0;
            const bool graph = r.ok[kGraphPipelined];
            std::printf(
                "%4d %3d %4d %3d %7d %6d | %11s %11s %9s | %12s %8s %4s | "
                "%8s | %12s %7s\n",
                g.dim, g.group, kKvHeads * g.group, batch, n, r.layers,
                cell(pipe, "%.1f", r.usPerToken[kPipelined]).c_str(),
                cell(sync, "%.1f", r.usPerToken[kSynchronized]).c_str(),
                cell(pipe && sync, "%.2fx",
                     pipe && sync ? r.usPerToken[kSynchronized] /
                                        r.usPerToken[kPipelined]
                                  : 0)
                    .c_str(),
                cell(plain, "%.1f", r.usPerToken[kPlainPipelined]).c_str(),
                cell(pipe && plain, "%+.1f%%", 100 * overhead).c_str(),
                mark(pipe && plain, overhead <= kTargetStatsOverhead),
                cell(pipe, "%.1f", r.usPerToken[kPipelined] / r.layers)
                    .c_str(),
                cell(graph, "%.1f", r.usPerToken[kGraphPipelined]).c_str(),
                cell(pipe && graph, "%.2fx",
                     pipe && graph ? r.usPerToken[kPipelined] /
                                         r.usPerToken[kGraphPipelined]
                                   : 0)
                    .c_str());
            const char *kModelNames[] = {"pipelined", "synchronized", "plain",
                                         "graph"};
            for (int v = 0; v < kNumModel; ++v)
              if (!r.ok[v])
                std::printf("     %s: %s\n", kModelNames[v],
                            r.error[v].c_str());
            csv("model,%d,%d,%d,%d,%d,,us_per_token,%.3f,%.3f,%.3f,%.3f,\n",
                g.dim, g.group, kKvHeads * g.group, batch, n,
                pipe ? r.usPerToken[kPipelined] : NAN,
                sync ? r.usPerToken[kSynchronized] : NAN,
                plain ? r.usPerToken[kPlainPipelined] : NAN,
                graph ? r.usPerToken[kGraphPipelined] : NAN);
            std::fflush(stdout);
          });
    }

    if ((o.variants[kNumVariants + kInt2] ||
         o.variants[kNumVariants + kInt4]) &&
        !o.contexts.empty()) {
      std::printf(
          "\nint2/int4 (KIVI) decode against 16-bit decode, same geometry, "
          "batch and context: policies/kivi2.mlir and kivi4.mlir (keys per "
          "channel over blocks of 32 tokens, values per token over groups of "
          "32 channels, the 128 most recent entries in full precision). A "
          "step appends the token, quantizes on the device the value leaving "
          "the window (and every 32 steps a block of keys), and attends "
          "over packed codes dequantized in registers. A KIVI device pool "
          "per format over random finite f16 bytes (no prefill); each round "
          "of %d steps follows an untimed step at `context` entries, which "
          "rebuilds the device-resident tables (the oldest entries are "
          "evicted between rounds, untimed), >= %g ms per cell.\n"
          "16-bit = the plain decode of the table above (f16 pages, "
          "attention only; '-' when it was not measured).\n"
          "int MB/step = sum over sequences and kv-heads, from the page "
          "layout and each slot's formats, of: per entry 8 B [position, "
          "per-slot KIVI word] + key: head_dim * bits / 8 B packed, or "
          "head_dim * 2 B while in full precision + value: head_dim * bits "
          "/ 8 B packed and head_dim / 32 {scale, min} pairs (8 B each), or "
          "head_dim * 2 B in the window; + per key block of 32 slots "
          "head_dim {scale, min} pairs; mean over the timed steps.\n"
          "x16b = 16-bit time / KIVI time. Target: int2 >= %.0fx at "
          "context >= 16k ('-': does not apply); int4 has none.\n"
          "graph us = int2's step as kvc_kivi2_cuda_decode_plan_batch, a "
          "replay of its _decode_run_batch captured in a CUDA graph at the "
          "first step (quantization and staging in grids for a step's most "
          "work), _decode_finish_batch; i2/gr = int2 us / graph us (above "
          "1, the graph is faster).\n\n",
          o.steps, o.minMs, kTargetInt2Speedup);
      std::printf("%4s %3s %4s %3s %7s | %9s %9s | %9s %9s %8s %6s %4s | %9s "
                  "%6s | %9s %9s %8s %6s\n",
                  "dim", "G", "qh", "B", "context", "16b MB", "16b us",
                  "int2 MB", "int2 us", "GB/s", "x16b", "tgt", "graph us",
                  "i2/gr", "int4 MB", "int4 us", "GB/s", "x16b");
      sweepCells(
          o, o.contexts,
          [&](const BenchGeometry &g, int batch, int n) {
            return benchKivi(g, buffers, batch, n, o, stream);
          },
          [&](const BenchGeometry &g, int batch, int n, const KiviResult &r) {
            auto found = plainUs.find({g.dim, g.group, batch, n});
            const bool reference = found != plainUs.end();
            const double t16 = reference ? found->second : 0.0;
            // The plain decode's bytes (the table above): f16 keys and
            // values of n + (steps + 1) / 2 entries on average.
            const double bytes16 = double(batch) * (n + (o.steps + 1) / 2.0) *
                                   kKvHeads * (2.0 * g.dim * 2 + 8);
            auto gbs = [&](int v) {
              return r.bytesPerStep[v] / (r.usPerStep[v] * 1e-6) / 1e9;
            };
            auto speedup = [&](int v) { return t16 / r.usPerStep[v]; };
            const bool int2 = r.ok[kInt2], int4 = r.ok[kInt4];
            const bool graph = r.graphOk;
            std::printf(
                "%4d %3d %4d %3d %7d | %9.2f %9s | %9s %9s %8s %6s %4s | %9s "
                "%6s | %9s %9s %8s %6s\n",
                g.dim, g.group, kKvHeads * g.group, batch, n, bytes16 / 1e6,
                cell(reference, "%.1f", t16).c_str(),
                cell(int2, "%.2f", r.bytesPerStep[kInt2] / 1e6).c_str(),
                cell(int2, "%.1f", r.usPerStep[kInt2]).c_str(),
                cell(int2, "%.0f", int2 ? gbs(kInt2) : 0).c_str(),
                cell(int2 && reference, "%.2fx",
                     int2 && reference ? speedup(kInt2) : 0)
                    .c_str(),
                mark(int2 && reference && n >= 16384,
                     int2 && reference && speedup(kInt2) >= kTargetInt2Speedup),
                cell(graph, "%.1f", r.graphUsPerStep).c_str(),
                cell(graph && int2, "%.2f",
                     graph && int2 ? r.usPerStep[kInt2] / r.graphUsPerStep
                                   : 0)
                    .c_str(),
                cell(int4, "%.2f", r.bytesPerStep[kInt4] / 1e6).c_str(),
                cell(int4, "%.1f", r.usPerStep[kInt4]).c_str(),
                cell(int4, "%.0f", int4 ? gbs(kInt4) : 0).c_str(),
                cell(int4 && reference, "%.2fx",
                     int4 && reference ? speedup(kInt4) : 0)
                    .c_str());
            for (int v = 0; v < kNumKivi; ++v) {
              if (!r.ok[v] && o.variants[kNumVariants + v])
                std::printf("     %s: %s\n", kVariantNames[kNumVariants + v],
                            r.error[v].c_str());
              if (r.ok[v])
                csv("%s,%d,%d,%d,%d,%d,%.0f,us,%.3f,%.3f,,%.1f,%.1f\n",
                    kVariantNames[kNumVariants + v], g.dim, g.group,
                    kKvHeads * g.group, batch, n, r.bytesPerStep[v],
                    reference ? t16 : NAN, r.usPerStep[v], gbs(v), copy.best());
            }
            if (!graph && o.variants[kNumVariants + kInt2])
              std::printf("     int2 graph: %s\n", r.graphError.c_str());
            if (graph)
              csv("int2_graph,%d,%d,%d,%d,%d,,us,%.3f,%.3f,,,%.1f\n", g.dim,
                  g.group, kKvHeads * g.group, batch, n,
                  reference ? t16 : NAN, r.graphUsPerStep, copy.best());
            std::fflush(stdout);
          });
    }

    bool alternatives = false;
    for (const BenchGeometry &g : kBenchGeometries)
      alternatives = alternatives || (g.hasAlternatives() &&
                                      selected(o.dims, g.dim) &&
                                      selected(o.groups, g.group));
    if (alternatives && !o.alternativeContexts.empty()) {
      std::printf(
          "\nKernel alternatives: the shipped decode kernels against the "
          "same policies built with a kernel choice overridden "
          "(runtime/kvc_cuda.cuh, bench/gpu/GpuBenchPolicies.cmake), timed "
          "one after the other in each cell as the tables above (16-bit: as "
          "plain; int2: as the KIVI table).\n"
          "16b tc = plain's decode (tensor cores, decodeMmaRows); 16b cc = "
          "plain_cc (KVC_CUDA_TENSOR_CORES=0: decodeStagedRows); len us = "
          "plain_len (KVC_CUDA_SPLIT_PLAN=0: the attention's splits by "
          "length, not by whole waves of resident blocks); late us = "
          "plain_late (KVC_CUDA_ISSUE_AHEAD=0: a tile's copies issued after "
          "the wait for the tile before, one stage fewer in flight); regq "
          "us = plain_regq (KVC_CUDA_MMA_SHARED_QUERY=0: the query "
          "fragments in registers, three blocks per SM at head dim 128, "
          "not four); rowv us = plain_rowv "
          "(KVC_CUDA_MMA_TRANSPOSED_VALUES=0: the weights as A of the value "
          "sums at G <= 4, 8 channels an mma, not 16); int2 tc = "
          "kivi2 (tensor cores, launch bounds for 4 blocks of 128 threads "
          "per SM); int2 cc = kivi2_cc (decodeKiviTiles); int2 free = "
          "kivi2_free (KVC_CUDA_KIVI_MMA_BLOCKS=0: tensor cores, registers "
          "left to ptxas); i2 rowv us = kivi2_rowv "
          "(KVC_CUDA_MMA_TRANSPOSED_VALUES=0, as rowv at head dim 128); "
          "i2 late us = kivi2_late (KVC_CUDA_ISSUE_AHEAD=0: a tile's "
          "positions and KIVI words loaded when it is entered, not a tile "
          "ahead into shared memory); b5 us = kivi2_b5 "
          "(KVC_CUDA_KIVI_MMA_BLOCKS=5: launch bounds for 5 blocks per SM, "
          "96 registers, not 4 and 128); "
          "fused us = fused's decode (its cache read under "
          "an L2 evict-first policy, its fold in planFold's blocks); lru us "
          "= fused_lru (KVC_CUDA_EVICT_FIRST=0: the default policy); split "
          "us = fused_split (KVC_CUDA_FOLD_PLAN=0: one fold block per "
          "attention split); ser us = fused_serial "
          "(KVC_CUDA_DEPENDENT_LAUNCH=0: the attention and the fold launched "
          "after the kernel before each ends, not as programmatic "
          "dependents); first us = fused_first (KVC_CUDA_FOLD_AHEAD=0: the "
          "fold asks L2 for its first pass of slots only, not for each pass "
          "two ahead of its loads); keep us = fused_keep "
          "(KVC_CUDA_DISCARD_LOGITS=0: the fold leaves the logits it has "
          "read in L2, to be written back, not dropped, and the attention "
          "stores them under the default L2 policy); norm us = fused_norm "
          "(KVC_CUDA_LOGITS_EVICT_LAST=0: the attention stores the logits "
          "under the default L2 policy, not a share of them evict-last); "
          "grid us = fused_grid (KVC_CUDA_FOLD_IN_GRID=1: the statistics "
          "folded in the attention grid, each block folding a range of a "
          "head about a wave behind its own, not in a fold kernel after the "
          "grid).\n"
          "cc/tc, len/tc, lt/tc, rq/tc, rv/tc, cc/i2, fr/i2, rv/i2, lt/i2, "
          "b5/i2, lru/fu, "
          "sp/fu, se/fu, fi/fu, kp/fu, no/fu, gr/fu = the "
          "alternative's "
          "time / the "
          "shipped one's (> 1: the shipped kernel is faster).\n\n");
      std::printf("%4s %3s %4s %3s %7s | %9s %9s %6s %9s %6s %9s %6s %9s %6s "
                  "%9s %6s | %9s %9s %6s %9s %6s %10s %6s %10s %6s %9s %6s | "
                  "%9s %9s %6s %9s %6s %9s %6s %9s %6s %9s %6s %9s %6s %9s "
                  "%6s\n",
                  "dim", "G", "qh", "B", "context", "16b tc us", "16b cc us",
                  "cc/tc", "len us", "len/tc", "late us", "lt/tc", "regq us",
                  "rq/tc", "rowv us", "rv/tc", "int2 us", "int2cc us",
                  "cc/i2", "free us", "fr/i2", "i2 rowv us", "rv/i2",
                  "i2 late us", "lt/i2", "b5 us", "b5/i2",
                  "fused us", "lru us", "lru/fu", "split us", "sp/fu",
                  "ser us", "se/fu", "first us", "fi/fu", "keep us", "kp/fu",
                  "norm us", "no/fu", "grid us", "gr/fu");
      sweepCells(
          o, o.alternativeContexts,
          [&](const BenchGeometry &g, int batch, int n) {
            return benchAlternatives(g, buffers, batch, n, o, stream);
          },
          [&](const BenchGeometry &g, int batch, int n,
              const AlternativesResult &r) {
            std::printf(
                "%4d %3d %4d %3d %7d | %9s %9s %6s %9s %6s %9s %6s %9s %6s "
                "%9s %6s | %9s %9s %6s %9s %6s %10s %6s %10s %6s %9s %6s | "
                "%9s %9s %6s %9s %6s %9s %6s %9s %6s %9s %6s %9s %6s %9s "
                "%6s\n",
                g.dim, g.group, kKvHeads * g.group, batch, n,
                r.us(kAltPlain).c_str(), r.us(kAltPlainCc).c_str(),
                r.ratio(kAltPlainCc, kAltPlain).c_str(),
                r.us(kAltPlainLen).c_str(),
                r.ratio(kAltPlainLen, kAltPlain).c_str(),
                r.us(kAltPlainLate).c_str(),
                r.ratio(kAltPlainLate, kAltPlain).c_str(),
                r.us(kAltPlainRegq).c_str(),
                r.ratio(kAltPlainRegq, kAltPlain).c_str(),
                r.us(kAltPlainRowv).c_str(),
                r.ratio(kAltPlainRowv, kAltPlain).c_str(),
                r.us(kAltInt2).c_str(), r.us(kAltInt2Cc).c_str(),
                r.ratio(kAltInt2Cc, kAltInt2).c_str(),
                r.us(kAltInt2Free).c_str(),
                r.ratio(kAltInt2Free, kAltInt2).c_str(),
                r.us(kAltInt2Rowv).c_str(),
                r.ratio(kAltInt2Rowv, kAltInt2).c_str(),
                r.us(kAltInt2Late).c_str(),
                r.ratio(kAltInt2Late, kAltInt2).c_str(),
                r.us(kAltInt2B5).c_str(), r.ratio(kAltInt2B5, kAltInt2).c_str(),
                r.us(kAltFused).c_str(), r.us(kAltFusedLru).c_str(),
                r.ratio(kAltFusedLru, kAltFused).c_str(),
                r.us(kAltFusedSplit).c_str(),
                r.ratio(kAltFusedSplit, kAltFused).c_str(),
                r.us(kAltFusedSerial).c_str(),
                r.ratio(kAltFusedSerial, kAltFused).c_str(),
                r.us(kAltFusedFirst).c_str(),
                r.ratio(kAltFusedFirst, kAltFused).c_str(),
                r.us(kAltFusedKeep).c_str(),
                r.ratio(kAltFusedKeep, kAltFused).c_str(),
                r.us(kAltFusedNorm).c_str(),
                r.ratio(kAltFusedNorm, kAltFused).c_str(),
                r.us(kAltFusedGrid).c_str(),
                r.ratio(kAltFusedGrid, kAltFused).c_str());
            r.details(kAlternativeNames, g.dim, g.group, batch, n, copy.best());
          },
          [](const BenchGeometry &g) { return g.hasAlternatives(); });
    }

    bool g1Alternatives = false;
    for (const BenchGeometry &g : kBenchGeometries)
      g1Alternatives =
          g1Alternatives || (g.hasG1Alternatives() && selected(o.dims, g.dim) &&
                             selected(o.groups, g.group));
    if (g1Alternatives && !o.alternativeContexts.empty()) {
      std::printf(
          "\nKernel alternatives at G = 1: kivi2's CUDA-core decode "
          "(decodeKiviTiles: keys on tensor cores, values by dp2a; registers "
          "left to ptxas, each tile's positions and KIVI words copied into "
          "shared memory a tile ahead) and fused's decode step (the 16-bit "
          "register path, a fold kernel after the attention) against the "
          "same policies built with a kernel choice overridden, timed one "
          "after the other in each cell (int2: as the KIVI table; fused: as "
          "the decode table).\n"
          "int2 us = kivi2; late us = kivi2_late (KVC_CUDA_ISSUE_AHEAD=0: a "
          "tile's positions and KIVI words loaded when it is entered); b9 us "
          "= kivi2_b9 (KVC_CUDA_KIVI_TILE_BLOCKS=9: launch bounds for 9 "
          "blocks of 128 threads per SM, 56 registers); fused us = fused's "
          "decode; ser us = fused_serial (KVC_CUDA_DEPENDENT_LAUNCH=0); keep "
          "us = fused_keep (KVC_CUDA_DISCARD_LOGITS=0); norm us = fused_norm "
          "(KVC_CUDA_LOGITS_EVICT_LAST=0); grid us = fused_grid "
          "(KVC_CUDA_FOLD_IN_GRID=1).\n"
          "lt/i2, b9/i2, se/fu, kp/fu, no/fu, gr/fu = the alternative's time "
          "/ the shipped one's (> 1: the shipped kernel is faster).\n\n");
      std::printf("%4s %3s %4s %3s %7s | %9s | %9s %6s | %9s %6s | %9s | %9s "
                  "%6s | %9s %6s | %9s %6s | %9s %6s\n",
                  "dim", "G", "qh", "B", "context", "int2 us", "late us",
                  "lt/i2", "b9 us", "b9/i2", "fused us", "ser us", "se/fu",
                  "keep us", "kp/fu", "norm us", "no/fu", "grid us", "gr/fu");
      sweepCells(
          o, o.alternativeContexts,
          [&](const BenchGeometry &g, int batch, int n) {
            return benchG1Alternatives(g, buffers, batch, n, o, stream);
          },
          [&](const BenchGeometry &g, int batch, int n,
              const G1AlternativesResult &r) {
            std::printf(
                "%4d %3d %4d %3d %7d | %9s | %9s %6s | %9s %6s | %9s | %9s "
                "%6s | %9s %6s | %9s %6s | %9s %6s\n",
                g.dim, g.group, kKvHeads * g.group, batch, n,
                r.us(kG1Int2).c_str(), r.us(kG1Int2Late).c_str(),
                r.ratio(kG1Int2Late, kG1Int2).c_str(), r.us(kG1Int2B9).c_str(),
                r.ratio(kG1Int2B9, kG1Int2).c_str(), r.us(kG1Fused).c_str(),
                r.us(kG1FusedSerial).c_str(),
                r.ratio(kG1FusedSerial, kG1Fused).c_str(),
                r.us(kG1FusedKeep).c_str(),
                r.ratio(kG1FusedKeep, kG1Fused).c_str(),
                r.us(kG1FusedNorm).c_str(),
                r.ratio(kG1FusedNorm, kG1Fused).c_str(),
                r.us(kG1FusedGrid).c_str(),
                r.ratio(kG1FusedGrid, kG1Fused).c_str());
            r.details(kG1AlternativeNames, g.dim, g.group, batch, n,
                      copy.best());
          },
          [](const BenchGeometry &g) { return g.hasG1Alternatives(); });
    }

    if (!o.prefillContexts.empty()) {
      std::printf(
          "\nPrefill of one layer, batch 1: plain = causal attention and "
          "every entry stored (the cheapest way to fill the cache through "
          "the ABI); snapkv = policies/snapkv.mlir (window statistics over "
          "the last 64 queries, pooling, top-1024); h2o = policies/h2o.mlir "
          "(accumulated attention over every query, top-1024). frac = "
          "(policy - plain) / plain, the compression's share on top of plain "
          "prefill. plain, snapkv and h2o run their attention and "
          "statistics on tensor cores (prefillAttentionMma, "
          "prefillColumnStatsMma). CUDA cores (KVC_CUDA_PREFILL_MMA=0, "
          "geometries with G >= 2): cc = the plain prefill with "
          "prefillAttentionTiles (prefill_cc), cc/plain its time over "
          "plain's; h2o cc = H2O's prefill with prefillAttentionTiles and "
          "prefillColumnStatsTiles (h2o_cc), frac its share on top of cc. "
          "cudaEvent time per call, "
          ">= %g ms and >= 3 calls.\n\n",
          o.minMs);
      std::printf("%4s %3s %4s %7s | %9s | %9s %8s | %9s %8s | %9s %8s | "
                  "%9s %8s\n",
                  "dim", "G", "qh", "prompt", "plain ms", "snapkv ms", "frac",
                  "h2o ms", "frac", "cc ms", "cc/plain", "h2o cc ms", "frac");
      for (const BenchGeometry &g : kBenchGeometries) {
        if (!selected(o.dims, g.dim) || !selected(o.groups, g.group))
          continue;
        for (int n : o.prefillContexts) {
          PrefillResult r;
          try {
            r = benchPrefill(g, buffers, n, o, stream);
          } catch (const BenchError &e) {
            std::printf("%4d %3d %4d %7d  error: %s\n", g.dim, g.group,
                        kKvHeads * g.group, n, e.what());
            cudaGetLastError();
            ++gCellErrors;
            continue;
          }
          auto frac = [&](int v) {
            return r.ok[v] && r.ok[kPrefillPlain]
                       ? format("%+.1f%%",
                                100 * (r.ms[v] / r.ms[kPrefillPlain] - 1))
                       : std::string("error");
          };
          // The CUDA-core columns: "-" where not compiled in.
          const bool cc = g.prefillCc != nullptr && g.h2oCc != nullptr;
          auto ccCell = [&](int v) {
            return cc ? cell(r.ok[v], "%.3f", r.ms[v]) : std::string("-");
          };
          auto ccRatio = [&](int v, int base, const char *fmt, double scale,
                             double shift) {
            return !cc ? std::string("-")
                   : r.ok[v] && r.ok[base]
                       ? format(fmt, scale * (r.ms[v] / r.ms[base] - shift))
                       : std::string("error");
          };
          std::printf("%4d %3d %4d %7d | %9s | %9s %8s | %9s %8s | %9s %8s | "
                      "%9s %8s\n",
                      g.dim, g.group, kKvHeads * g.group, n,
                      cell(r.ok[0], "%.3f", r.ms[0]).c_str(),
                      cell(r.ok[1], "%.3f", r.ms[1]).c_str(), frac(1).c_str(),
                      cell(r.ok[2], "%.3f", r.ms[2]).c_str(), frac(2).c_str(),
                      ccCell(kPrefillPlainCc).c_str(),
                      ccRatio(kPrefillPlainCc, kPrefillPlain, "%.2fx", 1, 0)
                          .c_str(),
                      ccCell(kPrefillH2OCc).c_str(),
                      ccRatio(kPrefillH2OCc, kPrefillPlainCc, "%+.1f%%", 100, 1)
                          .c_str());
          for (int v = 0; v < kNumPrefill; ++v)
            if (!r.ok[v] && !r.error[v].empty())
              std::printf("     %s: %s\n", kPrefillNames[v], r.error[v].c_str());
          csv("prefill,%d,%d,%d,1,%d,,ms,%.4f,%.4f,%.4f,,\n", g.dim, g.group,
              kKvHeads * g.group, n, r.ok[0] ? r.ms[0] : NAN,
              r.ok[1] ? r.ms[1] : NAN, r.ok[2] ? r.ms[2] : NAN);
          // CUDA cores: t_plain is prefill_cc's time, t_unfused_or_h2o
          // h2o_cc's.
          if (r.ok[kPrefillPlainCc] || r.ok[kPrefillH2OCc])
            csv("alt_prefill_cc,%d,%d,%d,1,%d,,ms,%.4f,,%.4f,,\n", g.dim,
                g.group, kKvHeads * g.group, n,
                r.ok[kPrefillPlainCc] ? r.ms[kPrefillPlainCc] : NAN,
                r.ok[kPrefillH2OCc] ? r.ms[kPrefillH2OCc] : NAN);
          std::fflush(stdout);
        }
      }
    }
    if ((o.variants[kPlain] || o.variants[kFused] ||
         o.variants[kNumVariants + kInt2]) &&
        !o.hostContexts.empty()) {
      std::printf(
          "\nHost side of a decode call: CPU time of one _decode_batch call "
          "issued after cudaStreamSynchronize (so it waits for nothing), "
          "median over >= %d rounds of %d calls: the runtime's appends and "
          "evictions, the device tables' words and the CUDA runtime calls "
          "that queue the step's copies and launches%s. A pipelined decode "
          "leaves the GPU idle whenever this exceeds the step's kernel time. "
          "plain = the plain decode, fused = H2O's, int2 = KIVI int2's (over "
          "its own pool, positions growing, the oldest entries evicted between "
          "rounds as in the KIVI table; - where int2 is not selected); "
          "ns/head = per kv-head of the batch.%s\n\n",
          o.minRounds, o.steps,
          kCountsRuntimeCalls ? " (on the emulator: less the time spent "
                                "running the emulated kernels inside the call)"
                              : "",
          kCountsRuntimeCalls
              ? " Per call (emulator counts): pl.lnch, i2.lnch = kernel "
                "launches of a plain and of an int2 call; of a fused call: "
                "launch = kernel launches, "
                "copy = copies and memsets, event = event records, wait = "
                "synchronizations and synchronous copies, alloc = memory and "
                "event allocations, pgbl = asynchronous copies from or to "
                "pageable host memory (which may synchronize with the "
                "stream)."
              : "");
      std::printf("%4s %3s %4s %3s %7s | %9s %8s | %9s %8s | %9s %8s", "dim",
                  "G", "qh", "B", "context", "plain us", "ns/head",
                  "fused us", "ns/head", "int2 us", "ns/head");
      if (kCountsRuntimeCalls)
        std::printf(" | %7s %8s | %6s %5s %5s %5s %5s %5s", "pl.lnch",
                    "i2.lnch", "launch", "copy", "event", "wait", "alloc",
                    "pgbl");
      std::printf("\n");
      sweepCells(
          o, o.hostContexts,
          [&](const BenchGeometry &g, int batch, int n) {
            return benchHost(g, buffers, batch, n, o, stream);
          },
          [&](const BenchGeometry &g, int batch, int n, const HostResult &r) {
            const double heads = double(batch) * kKvHeads;
            std::printf(
                "%4d %3d %4d %3d %7d | %9s %8s | %9s %8s | %9s %8s", g.dim,
                g.group, kKvHeads * g.group, batch, n,
                cell(r.ok[kHostPlain], "%.1f", r.us[kHostPlain]).c_str(),
                cell(r.ok[kHostPlain], "%.0f", 1e3 * r.us[kHostPlain] / heads)
                    .c_str(),
                cell(r.ok[kHostFused], "%.1f", r.us[kHostFused]).c_str(),
                cell(r.ok[kHostFused], "%.0f", 1e3 * r.us[kHostFused] / heads)
                    .c_str(),
                cell(r.ok[kHostInt2], "%.1f", r.us[kHostInt2]).c_str(),
                cell(r.ok[kHostInt2], "%.0f", 1e3 * r.us[kHostInt2] / heads)
                    .c_str());
            if (kCountsRuntimeCalls) {
              const RuntimeCounts &c = r.perCall[kHostFused];
              const bool ok = r.ok[kHostFused];
              std::printf(" | %7s %8s",
                          cell(r.ok[kHostPlain], "%.1f",
                               r.perCall[kHostPlain].launches)
                              .c_str(),
                          cell(r.ok[kHostInt2], "%.1f",
                               r.perCall[kHostInt2].launches)
                              .c_str());
              std::printf(" | %6s %5s %5s %5s %5s %5s",
                          cell(ok, "%.1f", c.launches).c_str(),
                          cell(ok, "%.1f", c.copies).c_str(),
                          cell(ok, "%.1f", c.eventRecords).c_str(),
                          cell(ok, "%.1f", c.waits).c_str(),
                          cell(ok, "%.1f", c.allocations).c_str(),
                          cell(ok, "%.1f", c.pageable).c_str());
            }
            std::printf("\n");
            const char *kHostNames[] = {"plain", "fused", "int2"};
            for (int v = 0; v < kNumHost; ++v)
              if (!r.ok[v] && (v != kHostInt2 ||
                               o.variants[kNumVariants + kInt2]))
                std::printf("     %s: %s\n", kHostNames[v],
                            r.error[v].c_str());
            csv("host,%d,%d,%d,%d,%d,,us,%.3f,%.3f,%.3f,,\n", g.dim, g.group,
                kKvHeads * g.group, batch, n,
                r.ok[kHostPlain] ? r.us[kHostPlain] : NAN,
                r.ok[kHostFused] ? r.us[kHostFused] : NAN,
                r.ok[kHostInt2] ? r.us[kHostInt2] : NAN);
            std::fflush(stdout);
          });
    }
    buffers.releaseAll();
    cudaStreamDestroy(stream);
  } catch (const BenchError &e) {
    std::fprintf(stderr, "kvc-bench-gpu: %s\n", e.what());
    if (gCsv)
      std::fclose(gCsv);
    return 1;
  }
  if (gCsv)
    std::fclose(gCsv);
  // The whole run's wall time, for planning time on a GPU machine.
  std::printf("\nkvc-bench-gpu: done in %.0f s\n",
              std::chrono::duration<double>(std::chrono::steady_clock::now() -
                                            start)
                  .count());
  if (gCellErrors) {
    std::fprintf(stderr, "kvc-bench-gpu: %d measurement(s) failed\n",
                 gCellErrors);
    return 1;
  }
  return 0;
}
