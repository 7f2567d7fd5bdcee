//===- decode_bench.cpp - fused vs unfused decode on the CPU --------------===//
//
// Times one decode step of one layer (SmolLM2-135M geometry: 9 query heads,
// 3 kv-heads, head dim 64, f16 cache) at contexts from 1k to 32k entries:
//  - plain:   attention only (the decode kernel of a policy without decode
//             statistics);
//  - fused:   the generated H2O decode kernel, whose one pass over keys and
//             values also folds the accumulated attention and selects victims;
//  - unfused: the same policy compiled with the unfused pipeline, attention
//             then a scoring kernel that reads the keys again;
//  - oracle:  the double-precision reference (attention and weights).
// Prints ms per step, bytes of cache read per step and the ratios, side by
// side from one run. Usage: kvc-bench-decode [max_context] [min_seconds].
//
//===----------------------------------------------------------------------===//

#include "kvc_fused_cpu.h"
#include "kvc_plain_cpu.h"
#include "kvc_unfused_cpu.h"

#include "test/reference/Reference.h"

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <algorithm>
#include <functional>
#include <random>
#include <vector>

namespace ref = kvc::ref;

namespace {

constexpr int kQHeads = 9, kKvHeads = 3, kDim = 64, kGroup = 3;
constexpr int kPageSize = 64;

using DecodeFn = std::function<kvc_status_t(kvc_context_t *, const float *,
                                            const float *, const float *,
                                            int32_t, float *, void *,
                                            uint64_t)>;

/// A runtime context holding `n` random entries in every kv-head of layer 0.
struct Cache {
  kvc_context_t *context = nullptr;
  std::vector<char> pool;
  Cache(void (*configure)(kvc_config_t *), int n, std::mt19937 &rng) {
    kvc_config_t config{};
    configure(&config);
    config.page_size = kPageSize;
    config.num_pages = kKvHeads * (n / kPageSize + 8);
    config.max_sequences = 1;
    config.memory = KVC_MEMORY_HOST;
    uint64_t bytes = 0;
    check(kvc_pool_bytes_required(&config, &bytes));
    pool.resize(bytes + KVC_POOL_ALIGNMENT);
    void *base = pool.data() + (KVC_POOL_ALIGNMENT -
                                reinterpret_cast<uintptr_t>(pool.data()) %
                                    KVC_POOL_ALIGNMENT);
    check(kvc_context_create(&config, base, bytes, &context));
    check(kvc_sequence_add(context, 0));
    std::normal_distribution<float> normal;
    std::vector<float> k(static_cast<size_t>(n) * kDim), v(k.size());
    std::vector<int32_t> positions(n);
    for (int h = 0; h < kKvHeads; ++h) {
      for (float &x : k)
        x = normal(rng);
      for (float &x : v)
        x = normal(rng);
      for (int i = 0; i < n; ++i)
        positions[i] = i;
      check(kvc_append(context, 0, 0, h, n, kDim, k.data(), v.data(),
                       positions.data(), nullptr));
    }
  }
  ~Cache() { kvc_context_destroy(context); }
  static void check(kvc_status_t s) {
    if (s != KVC_STATUS_OK) {
      std::fprintf(stderr, "kvc-bench-decode: %s: %s\n", kvc_status_string(s),
                   kvc_last_error());
      std::exit(1);
    }
  }
};

/// Milliseconds per decode step, repeated for at least `seconds`.
double timeDecode(void (*configure)(kvc_config_t *), uint64_t (*bytes)(int32_t),
                  const DecodeFn &decode, int n, double seconds,
                  std::mt19937 &rng) {
  Cache cache(configure, n, rng);
  std::vector<float> q(kQHeads * kDim), k(kKvHeads * kDim), v(k.size()),
      out(q.size());
  std::normal_distribution<float> normal;
  for (float &x : q)
    x = normal(rng);
  for (float &x : k)
    x = normal(rng);
  for (float &x : v)
    x = normal(rng);
  std::vector<char> ws(bytes(n + 1024));
  int steps = 0;
  auto start = std::chrono::steady_clock::now();
  double elapsed = 0.0;
  do {
    Cache::check(decode(cache.context, q.data(), k.data(), v.data(), n + steps,
                        out.data(), ws.data(), ws.size()));
    ++steps;
    elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() -
                                            start)
                  .count();
  } while (elapsed < seconds || steps < 3);
  return 1e3 * elapsed / steps;
}

/// Milliseconds of the double-precision oracle for one step of one layer.
double timeOracle(int n, std::mt19937 &rng) {
  std::normal_distribution<double> normal;
  ref::Matrix keys(n, kDim), values(n, kDim);
  for (double &x : keys.data)
    x = normal(rng);
  for (double &x : values.data)
    x = normal(rng);
  auto start = std::chrono::steady_clock::now();
  for (int h = 0; h < kKvHeads; ++h) {
    std::vector<ref::Matrix> queries;
    for (int g = 0; g < kGroup; ++g) {
      ref::Matrix q(1, kDim);
      for (double &x : q.data)
        x = normal(rng);
      queries.push_back(q);
    }
    ref::AttentionResult r = ref::attention(queries, {keys}, {values});
    (void)r;
  }
  return 1e3 * std::chrono::duration<double>(std::chrono::steady_clock::now() -
                                             start)
                   .count();
}

} // namespace

int main(int argc, char **argv) {
  int maxContext = argc > 1 ? std::atoi(argv[1]) : 32768;
  double seconds = argc > 2 ? std::atof(argv[2]) : 0.3;
  std::mt19937 rng(7);

  DecodeFn plain = [](kvc_context_t *c, const float *q, const float *k,
                      const float *v, int32_t pos, float *out, void *ws,
                      uint64_t b) {
    return kvc_plain_cpu_decode(c, 0, 0, q, k, v, pos, out, ws, b);
  };
  DecodeFn fused = [](kvc_context_t *c, const float *q, const float *k,
                      const float *v, int32_t pos, float *out, void *ws,
                      uint64_t b) {
    return kvc_fused_cpu_decode(c, 0, 0, q, k, v, pos, out, ws, b);
  };
  DecodeFn unfused = [](kvc_context_t *c, const float *q, const float *k,
                        const float *v, int32_t pos, float *out, void *ws,
                        uint64_t b) {
    kvc_status_t s = kvc_unfused_cpu_decode(c, 0, 0, q, k, v, pos, out, ws, b);
    if (s != KVC_STATUS_OK)
      return s;
    return kvc_unfused_cpu_decode_scoring(c, 0, 0, q, pos, ws, b);
  };
  auto unfusedBytes = [](int32_t n) {
    return std::max(kvc_unfused_cpu_decode_workspace_bytes(n),
                    kvc_unfused_cpu_decode_scoring_workspace_bytes(n));
  };

  std::printf("kvc-bench-decode: one decode step of one layer, SmolLM2-135M "
              "geometry (9 q heads, 3 kv heads, d=64, f16 cache), CPU\n");
  std::printf("%8s %10s %10s %10s %10s %10s %9s %9s %9s %9s\n", "context",
              "cache MB", "plain ms", "fused ms", "unfused ms", "oracle ms",
              "GB/s fus", "fus/pln", "unf/fus", "orc/fus");
  for (int n = 1024; n <= maxContext; n *= 2) {
    double tPlain = timeDecode(kvc_plain_cpu_configure,
                               kvc_plain_cpu_decode_workspace_bytes, plain, n,
                               seconds, rng);
    double tFused = timeDecode(kvc_fused_cpu_configure,
                               kvc_fused_cpu_decode_workspace_bytes, fused, n,
                               seconds, rng);
    double tUnfused = timeDecode(kvc_unfused_cpu_configure, unfusedBytes,
                                 unfused, n, seconds, rng);
    double tOracle = timeOracle(n, rng);
    // Keys and values in f16, plus the position and score of every slot.
    double bytes = double(n) * kKvHeads * (2.0 * kDim * 2 + 4 + 4);
    std::printf("%8d %10.2f %10.3f %10.3f %10.3f %10.3f %9.2f %9.3f %9.3f "
                "%9.1f\n",
                n, bytes / 1e6, tPlain, tFused, tUnfused, tOracle,
                bytes / (tFused * 1e-3) / 1e9, tFused / tPlain,
                tUnfused / tFused, tOracle / tFused);
    std::fflush(stdout);
  }
  return 0;
}
