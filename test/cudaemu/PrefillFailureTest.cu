//===- PrefillFailureTest.cu - A CUDA prefill that fails part way ---------===//
//
// The generated CUDA prefill of H2O (geometry g1: two kv-heads) on the
// emulator appends the kept entries head after head and then stores their
// rows. A prefill that fails after the first head's append must leave the
// layer empty again (kvc::LayerAppends, kvc_clear_layer) with the failure's
// status and message, so that the same prefill can be called again; once
// it succeeds it gives the outputs and metadata of a twin context that
// never failed. The failures: the pool exhausted at the second head (one
// free page for two heads), and the rows' store refused (failLaunches:
// storeEntries, after every append), and the attention refused (before
// any). Exits 1 on the first difference.
//
//===----------------------------------------------------------------------===//

#include "kvc_h2o_cuda.h"
#include "test/cudaemu/EmuCheck.h"

#include <cmath>
#include <cstdio>
#include <cstring>
#include <vector>

namespace {

constexpr int kPageSize = 8;
constexpr int kPrompt = 6;

/// A device context of H2O's geometry over `pages` pages with two
/// sequences, and a prompt's inputs shared by every context.
struct DeviceContext {
  void *pool = nullptr;
  kvc_context_t *ctx = nullptr;

  explicit DeviceContext(int pages) {
    kvc_config_t config{};
    kvc_h2o_cuda_configure(&config);
    config.page_size = kPageSize;
    config.num_pages = pages;
    config.max_sequences = 2;
    uint64_t bytes = 0;
    CHECK(kvc_pool_bytes_required(&config, &bytes) == KVC_STATUS_OK, "pool");
    CHECK(cudaMalloc(&pool, bytes) == cudaSuccess &&
              cudaMemset(pool, 0, bytes) == cudaSuccess,
          "pool");
    CHECK(kvc_context_create(&config, pool, bytes, &ctx) == KVC_STATUS_OK,
          "context");
  }
  ~DeviceContext() {
    kvc_context_destroy(ctx);
    cudaFree(pool);
  }
};

struct Prompt {
  kvc_config_t config{};
  float *q = nullptr, *k = nullptr, *v = nullptr, *out = nullptr;
  void *workspace = nullptr;
  uint64_t workspaceBytes = 0;
  int32_t positions[kPrompt] = {0, 1, 2, 3, 4, 5};

  Prompt() {
    kvc_h2o_cuda_configure(&config);
    const size_t qSize = size_t(kPrompt) * config.num_q_heads * config.head_dim;
    const size_t kvSize =
        size_t(kPrompt) * config.num_kv_heads * config.head_dim;
    std::vector<float> hq(qSize), hk(kvSize), hv(kvSize);
    for (size_t i = 0; i < qSize; ++i)
      hq[i] = 0.05f * static_cast<float>(i % 11) - 0.2f;
    for (size_t i = 0; i < kvSize; ++i) {
      hk[i] = 0.03f * static_cast<float>((i * 7) % 13) - 0.15f;
      hv[i] = 0.04f * static_cast<float>(i % 9) - 0.1f;
    }
    workspaceBytes = kvc_h2o_cuda_prefill_workspace_bytes(kPrompt);
    CHECK(cudaMalloc(reinterpret_cast<void **>(&q), 4 * qSize) ==
                  cudaSuccess &&
              cudaMalloc(reinterpret_cast<void **>(&k), 4 * kvSize) ==
                  cudaSuccess &&
              cudaMalloc(reinterpret_cast<void **>(&v), 4 * kvSize) ==
                  cudaSuccess &&
              cudaMalloc(reinterpret_cast<void **>(&out), 4 * qSize) ==
                  cudaSuccess &&
              cudaMalloc(&workspace, workspaceBytes) == cudaSuccess,
          "buffers");
    cudaMemcpy(q, hq.data(), 4 * qSize, cudaMemcpyHostToDevice);
    cudaMemcpy(k, hk.data(), 4 * kvSize, cudaMemcpyHostToDevice);
    cudaMemcpy(v, hv.data(), 4 * kvSize, cudaMemcpyHostToDevice);
  }
  ~Prompt() {
    cudaFree(workspace);
    cudaFree(out);
    cudaFree(v);
    cudaFree(k);
    cudaFree(q);
  }

  kvc_status_t prefill(kvc_context_t *ctx, uint64_t sequence,
                       std::vector<float> *outputs) {
    const kvc_status_t status =
        kvc_h2o_cuda_prefill(ctx, sequence, 0, kPrompt, q, k, v, positions,
                             out, workspace, workspaceBytes, nullptr);
    if (status == KVC_STATUS_OK && outputs) {
      outputs->resize(size_t(kPrompt) * config.num_q_heads * config.head_dim);
      cudaMemcpy(outputs->data(), out, 4 * outputs->size(),
                 cudaMemcpyDeviceToHost);
    }
    return status;
  }
};

/// Every head of layer 0 of `sequence` is empty, without pages, and the
/// pool has `freePages` free pages.
void expectEmpty(kvc_context_t *ctx, const kvc_config_t &config,
                 uint64_t sequence, int32_t freePages, const char *when) {
  for (int h = 0; h < config.num_kv_heads; ++h) {
    int32_t entries = -1, pages = -1;
    CHECK(kvc_get_num_entries(ctx, sequence, 0, h, &entries) ==
                  KVC_STATUS_OK &&
              kvc_get_num_pages(ctx, sequence, 0, h, &pages) == KVC_STATUS_OK,
          "%s: queries", when);
    CHECK(entries == 0 && pages == 0,
          "%s: head %d holds %d entries in %d pages", when, h, entries, pages);
  }
  kvc_pool_stats_t stats;
  CHECK(kvc_pool_stats(ctx, &stats) == KVC_STATUS_OK &&
            kvc_pool_check(ctx) == KVC_STATUS_OK,
        "%s: pool", when);
  CHECK(stats.free_pages == freePages, "%s: %d free pages, expected %d", when,
        stats.free_pages, freePages);
}

/// The same entries, slots and scores in layer 0 of `sequence` of both
/// contexts.
void expectSame(kvc_context_t *a, kvc_context_t *b,
                const kvc_config_t &config, uint64_t sequence,
                const char *when) {
  for (int h = 0; h < config.num_kv_heads; ++h) {
    kvc_metadata_t ma, mb;
    CHECK(kvc_get_metadata(a, sequence, 0, h, &ma) == KVC_STATUS_OK &&
              kvc_get_metadata(b, sequence, 0, h, &mb) == KVC_STATUS_OK,
          "%s: metadata", when);
    CHECK(ma.num_slots == mb.num_slots, "%s: head %d: %d slots, the twin %d",
          when, h, ma.num_slots, mb.num_slots);
    for (int32_t s = 0; s < ma.num_slots; ++s)
      CHECK(ma.position[s] == mb.position[s] && ma.score[s] == mb.score[s],
            "%s: head %d slot %d: position %d score %.9g, the twin %d %.9g",
            when, h, s, ma.position[s], ma.score[s], mb.position[s],
            mb.score[s]);
  }
}

} // namespace

int main() {
  Prompt prompt;
  const kvc_config_t &config = prompt.config;
  CHECK(config.num_kv_heads == 2,
        "the test needs two kv-heads, the policy has %d", config.num_kv_heads);
  // The twin: room for everything, never fails.
  DeviceContext twin(8);
  CHECK(kvc_sequence_add(twin.ctx, 2) == KVC_STATUS_OK, "twin: add");
  std::vector<float> twinOut;
  CHECK(prompt.prefill(twin.ctx, 2, &twinOut) == KVC_STATUS_OK,
        "twin: prefill: %s", kvc_last_error());

  // Three pages: sequence 1's prompt takes one per head, one is left for
  // sequence 2's two heads.
  DeviceContext a(3);
  CHECK(kvc_sequence_add(a.ctx, 1) == KVC_STATUS_OK &&
            kvc_sequence_add(a.ctx, 2) == KVC_STATUS_OK,
        "add");
  CHECK(prompt.prefill(a.ctx, 1, nullptr) == KVC_STATUS_OK,
        "sequence 1: prefill: %s", kvc_last_error());
  kvc_status_t status = prompt.prefill(a.ctx, 2, nullptr);
  CHECK(status == KVC_STATUS_POOL_EXHAUSTED,
        "the pool exhausted at the second head: returned %d", status);
  CHECK(std::strcmp(kvc_last_error(),
                    "kvc_append: 1 new pages needed, 0 free") == 0,
        "the pool exhausted: message '%s'", kvc_last_error());
  expectEmpty(a.ctx, config, 2, 1, "the pool exhausted");

  // With sequence 1 gone, the rows' store refused (after both heads'
  // appends), then the attention refused (before any).
  CHECK(kvc_sequence_remove(a.ctx, 1) == KVC_STATUS_OK, "remove");
  for (const char *kernel : {"storeEntries", "prefillAttention"}) {
    ::kvc::emu::failLaunches(kernel);
    status = prompt.prefill(a.ctx, 2, nullptr);
    ::kvc::emu::failLaunches(nullptr);
    CHECK(status == KVC_STATUS_INTERNAL, "%s refused: returned %d", kernel,
          status);
    CHECK(std::strcmp(kvc_last_error(),
                      "kvc_h2o_cuda_prefill: CUDA error: too many resources "
                      "requested for launch") == 0,
          "%s refused: message '%s'", kernel, kvc_last_error());
    CHECK(cudaGetLastError() == cudaSuccess, "%s refused: error left",
          kernel);
    expectEmpty(a.ctx, config, 2, 3, kernel);
  }

  // Called again, the prefill is the twin's.
  std::vector<float> outputs;
  CHECK(prompt.prefill(a.ctx, 2, &outputs) == KVC_STATUS_OK,
        "the prefill called again: %s", kvc_last_error());
  for (size_t i = 0; i < outputs.size(); ++i)
    CHECK(outputs[i] == twinOut[i] && std::isfinite(outputs[i]),
          "output %zu is %.9g, the twin's %.9g", i, outputs[i], twinOut[i]);
  expectSame(a.ctx, twin.ctx, config, 2, "the prefill called again");
  std::printf("prefill failure: the prefills that failed part way left the "
              "layer empty, and the prefill called again is the twin's: "
              "ok\n");
  return 0;
}
