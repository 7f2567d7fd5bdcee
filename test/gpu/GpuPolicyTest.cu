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
//    window sum);
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
#include "kvc_merge_nearest_cpu.h"
#include "kvc_merge_nearest_cuda.h"
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
#include "kvc_streaming_llm_cpu.h"
#include "kvc_streaming_llm_cuda.h"
#include "kvc_tova_cpu.h"
#include "kvc_tova_cuda.h"
#if KVC_TEST_HEAD_CLASSES
#include "kvc_duo_small_cpu.h"
#include "kvc_duo_small_cuda.h"
#endif

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

using PrefillFn = kvc_status_t (*)(kvc_context_t *, uint64_t, int32_t, int32_t,
                                   const float *, const float *, const float *,
                                   const int32_t *, float *, void *, uint64_t);
using DecodeFn = kvc_status_t (*)(kvc_context_t *, uint64_t, int32_t,
                                  const float *, const float *, const float *,
                                  int32_t, float *, void *, uint64_t);
using CudaPrefillFn = kvc_status_t (*)(kvc_context_t *, uint64_t, int32_t,
                                       int32_t, const float *, const float *,
                                       const float *, const int32_t *, float *,
                                       void *, uint64_t, void *);
using CudaDecodeFn = kvc_status_t (*)(kvc_context_t *, uint64_t, int32_t,
                                      const float *, const float *,
                                      const float *, int32_t, float *, void *,
                                      uint64_t, void *);

/// Both backends of one policy.
struct Api {
  const char *name;
  /// The policy keeps score state into decode (importance bits are always
  /// compared).
  bool state;
  /// The policy merges evicted prompt entries into kept ones.
  bool merges;
  void (*cpuConfigure)(kvc_config_t *);
  uint64_t (*cpuPrefillBytes)(int32_t);
  PrefillFn cpuPrefill;
  uint64_t (*cpuDecodeBytes)(int32_t);
  DecodeFn cpuDecode;
  void (*cudaConfigure)(kvc_config_t *);
  uint64_t (*cudaPrefillBytes)(int32_t);
  CudaPrefillFn cudaPrefill;
  uint64_t (*cudaDecodeBytes)(int32_t);
  CudaDecodeFn cudaDecode;
};

#define KVC_API(p, state, merges)                                              \
  Api {                                                                        \
    #p, state, merges, kvc_##p##_cpu_configure, kvc_##p##_cpu_prefill_workspace_bytes,        \
        kvc_##p##_cpu_prefill, kvc_##p##_cpu_decode_workspace_bytes,           \
        kvc_##p##_cpu_decode, kvc_##p##_cuda_configure,                        \
        kvc_##p##_cuda_prefill_workspace_bytes, kvc_##p##_cuda_prefill,        \
        kvc_##p##_cuda_decode_workspace_bytes, kvc_##p##_cuda_decode           \
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

/// Random q, k, v for `tokens` tokens; structured inputs add attention
/// sinks and heavy hitters as test/codegen does.
struct Inputs {
  std::vector<float> q, k, v;
};

Inputs makeInputs(std::mt19937 &rng, int tokens, bool structured,
                  int firstPosition) {
  std::normal_distribution<float> normal(0.0f, 1.0f);
  Inputs in;
  in.q.resize(static_cast<size_t>(tokens) * kQHeads * kDim);
  in.k.resize(static_cast<size_t>(tokens) * kKvHeads * kDim);
  in.v.resize(in.k.size());
  for (float &x : in.q)
    x = normal(rng);
  for (float &x : in.k)
    x = normal(rng);
  for (float &x : in.v)
    x = normal(rng);
  if (structured)
    for (int t = 0; t < tokens; ++t) {
      const int pos = firstPosition + t;
      for (int h = 0; h < kQHeads; ++h)
        in.q[(static_cast<size_t>(t) * kQHeads + h) * kDim] += 3.0f;
      if (pos < 4 || pos % 97 == 13)
        for (int h = 0; h < kKvHeads; ++h)
          in.k[(static_cast<size_t>(t) * kKvHeads + h) * kDim] += 4.0f;
    }
  return in;
}

/// A device buffer freed on scope exit.
struct DeviceBuffer {
  void *ptr = nullptr;
  size_t bytes = 0;
  cudaError_t allocate(size_t n) {
    bytes = n;
    return cudaMalloc(&ptr, n ? n : 1);
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

/// Compares the two caches of one (layer, head): kept positions, score
/// state and stored rows.
void compareHeads(const std::string &where, kvc_context_t *cpu,
                  kvc_context_t *gpu, const std::vector<uint8_t> &gpuPool,
                  const uint8_t *gpuPoolBase, const kvc_page_layout_t &layout,
                  int layer, int head, bool compareState, bool merged) {
  std::map<int, int> a = liveSlots(cpu, layer, head);
  std::map<int, int> b = liveSlots(gpu, layer, head);
  std::vector<int> onlyCpu, onlyGpu;
  for (auto &[pos, slot] : a)
    if (!b.count(pos))
      onlyCpu.push_back(pos);
  for (auto &[pos, slot] : b)
    if (!a.count(pos))
      onlyGpu.push_back(pos);
  if (a.size() != b.size())
    fail(where + ": kept " + std::to_string(b.size()) + " entries, cpu " +
         std::to_string(a.size()));
  else if (onlyCpu.size() > static_cast<size_t>(kMaxBoundarySwaps))
    fail(where + ": " + std::to_string(onlyCpu.size()) +
         " kept entries differ from the cpu backend (first: cpu " +
         std::to_string(onlyCpu[0]) + ", gpu " + std::to_string(onlyGpu[0]) +
         ")");
  kvc_metadata_t ma{}, mb{};
  if (kvc_get_metadata(cpu, 0, layer, head, &ma) != KVC_STATUS_OK ||
      kvc_get_metadata(gpu, 0, layer, head, &mb) != KVC_STATUS_OK) {
    fail(where + ": metadata");
    return;
  }
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
}

double maxDifference(const std::vector<float> &a, const std::vector<float> &b) {
  double worst = 0.0;
  for (size_t i = 0; i < a.size(); ++i)
    worst = std::max(worst, static_cast<double>(std::fabs(a[i] - b[i])));
  return worst;
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
  for (kvc_config_t *c : {&cpuConfig, &gpuConfig}) {
    c->page_size = kPageSize;
    c->num_pages = kLayers * kKvHeads * ((kPrompt + 64) / kPageSize + 2);
    c->max_sequences = 1;
  }
  cpuConfig.memory = KVC_MEMORY_HOST;
  uint64_t poolBytes = 0;
  KVC_OK(kvc_pool_bytes_required(&gpuConfig, &poolBytes));
  kvc_page_layout_t layout{};
  KVC_OK(kvc_page_layout(&gpuConfig, &layout));
  std::vector<uint8_t> hostPoolStorage(poolBytes + KVC_POOL_ALIGNMENT);
  void *hostPool = hostPoolStorage.data() +
                   (KVC_POOL_ALIGNMENT -
                    reinterpret_cast<uintptr_t>(hostPoolStorage.data()) %
                        KVC_POOL_ALIGNMENT) %
                       KVC_POOL_ALIGNMENT;
  DeviceBuffer devicePool;
  CUDA_OK(devicePool.allocate(poolBytes));
  CUDA_OK(cudaMemset(devicePool.ptr, 0, poolBytes));
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

  std::mt19937 rng(4321 + structured);
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

  auto compareLayer = [&](const std::string &where, int layer) {
    CUDA_OK(cudaMemcpy(gpuPool.data(), devicePool.ptr, poolBytes,
                       cudaMemcpyDeviceToHost));
    for (int h = 0; h < kKvHeads; ++h)
      compareHeads(where + " head " + std::to_string(h), cpu, gpu, gpuPool,
                   devicePool.as<uint8_t>(), layout, layer, h, api.state,
                   api.merges);
  };

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
    compareLayer(where, layer);
  }

  for (int step = 0; step < kDecodeSteps; ++step) {
    const int32_t position = kPrompt + step;
    for (int layer = 0; layer < kLayers; ++layer) {
      Inputs in = makeInputs(rng, 1, structured, position);
      int32_t slots = 0;
      KVC_OK(kvc_get_num_slots(cpu, 0, layer, 0, &slots));
      std::vector<char> ws(api.cpuDecodeBytes(slots + 2 * kPageSize));
      std::vector<float> cpuOut(kQHeads * kDim), gpuOut(kQHeads * kDim);
      KVC_OK(api.cpuDecode(cpu, 0, layer, in.q.data(), in.k.data(),
                           in.v.data(), position, cpuOut.data(), ws.data(),
                           ws.size()));
      int32_t maxSlots = 0;
      for (int h = 0; h < kKvHeads; ++h) {
        int32_t n = 0;
        KVC_OK(kvc_get_num_slots(gpu, 0, layer, h, &n));
        maxSlots = std::max(maxSlots, n);
      }
      DeviceBuffer decodeWorkspace;
      CUDA_OK(decodeWorkspace.allocate(
          api.cudaDecodeBytes(maxSlots + kPageSize)));
      CUDA_OK(cudaMemcpy(q.ptr, in.q.data(), in.q.size() * 4,
                         cudaMemcpyHostToDevice));
      CUDA_OK(cudaMemcpy(k.ptr, in.k.data(), in.k.size() * 4,
                         cudaMemcpyHostToDevice));
      CUDA_OK(cudaMemcpy(v.ptr, in.v.data(), in.v.size() * 4,
                         cudaMemcpyHostToDevice));
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
      if (!(worst < kOutputTolerance))
        fail(where + ": output differs by " + std::to_string(worst));
      compareLayer(where, layer);
    }
  }
  std::printf("    %s\n", failures == before ? "ok" : "FAILED");
}

} // namespace

int main() {
  int devices = 0;
  const cudaError_t error = cudaGetDeviceCount(&devices);
  if (error != cudaSuccess || devices == 0) {
    std::printf("SKIP: no usable CUDA device (%s); the GPU test needs one\n",
                error != cudaSuccess ? cudaGetErrorString(error)
                                     : "zero devices");
    return 77;
  }
  cudaDeviceProp prop{};
  cudaGetDeviceProperties(&prop, 0);
  std::printf("kvc GPU test on %s: geometry layers=%d q_heads=%d kv_heads=%d "
              "head_dim=%d\n",
              prop.name, kLayers, kQHeads, kKvHeads, kDim);
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
#if KVC_TEST_HEAD_CLASSES
      KVC_API(duo_small, false, false),
#endif
  };
  for (const Api &api : apis)
    for (bool structured : {false, true})
      runPolicy(api, structured, stream);
  cudaStreamDestroy(stream);
  std::printf("%s: %d failure(s)\n", failures ? "FAILED" : "PASSED", failures);
  return failures ? 1 : 0;
}
