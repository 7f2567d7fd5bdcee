//===- DecodeFailureTest.cu - A CUDA decode step that cannot append -------===//
//
// The generated CUDA decode of H2O (geometry g1: two kv-heads) on the
// emulator, over a pool with one free page: after a step that fits, a batch
// step whose appends need more pages than the pool holds must fail with
// KVC_STATUS_POOL_EXHAUSTED and the runtime's message, and leave every
// sequence as it was (the head that did get a page gives it back), with
// the device tables of the step before written back. A workspace too
// small fails with its message and changes nothing as well. The context
// then serves the next step once a sequence is removed. Exits 1 on the
// first difference.
//
//===----------------------------------------------------------------------===//

#include "kvc_h2o_cuda.h"
#include "test/cudaemu/EmuCheck.h"

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

namespace {

constexpr int kPageSize = 4;
constexpr int kPrompt = 3;

/// Every head of `sequence` holds positions 0 .. count-1, in as many pages
/// as they need.
void expectEntries(kvc_context_t *ctx, const kvc_config_t &config,
                   uint64_t sequence, int count, const char *when) {
  for (int h = 0; h < config.num_kv_heads; ++h) {
    int32_t entries = 0, pages = 0;
    CHECK(kvc_get_num_entries(ctx, sequence, 0, h, &entries) ==
                  KVC_STATUS_OK &&
              kvc_get_num_pages(ctx, sequence, 0, h, &pages) == KVC_STATUS_OK,
          "%s: queries", when);
    CHECK(entries == count && pages == (count + kPageSize - 1) / kPageSize,
          "%s: sequence %llu head %d holds %d entries in %d pages, expected "
          "%d",
          when, static_cast<unsigned long long>(sequence), h, entries, pages,
          count);
    kvc_metadata_t meta;
    CHECK(kvc_get_metadata(ctx, sequence, 0, h, &meta) == KVC_STATUS_OK,
          "%s: metadata", when);
    for (int s = 0; s < count; ++s)
      CHECK(meta.position[s] == s,
            "%s: sequence %llu head %d slot %d holds position %d", when,
            static_cast<unsigned long long>(sequence), h, s,
            meta.position[s]);
  }
}

} // namespace

int main() {
  kvc_config_t config{};
  kvc_h2o_cuda_configure(&config);
  config.page_size = kPageSize;
  config.num_pages = 5;
  config.max_sequences = 2;
  const int kv = config.num_kv_heads, qh = config.num_q_heads;
  const int dim = config.head_dim;
  CHECK(kv == 2, "the test needs two kv-heads, the policy has %d", kv);
  uint64_t poolBytes = 0;
  CHECK(kvc_pool_bytes_required(&config, &poolBytes) == KVC_STATUS_OK, "pool");
  void *pool = nullptr;
  CHECK(cudaMalloc(&pool, poolBytes) == cudaSuccess, "pool");
  CHECK(cudaMemset(pool, 0, poolBytes) == cudaSuccess, "pool");
  kvc_context_t *ctx = nullptr;
  CHECK(kvc_context_create(&config, pool, poolBytes, &ctx) == KVC_STATUS_OK,
        "context");
  // Two sequences of three entries per head: one page each, four of five.
  const uint64_t sequences[2] = {1, 2};
  const int32_t prompt[kPrompt] = {0, 1, 2};
  for (uint64_t s : sequences) {
    CHECK(kvc_sequence_add(ctx, s) == KVC_STATUS_OK, "add");
    for (int h = 0; h < kv; ++h)
      CHECK(kvc_append(ctx, s, 0, h, kPrompt, dim, nullptr, nullptr, prompt,
                       nullptr) == KVC_STATUS_OK,
            "prompt");
  }
  // Inputs of a batch of two (small values; the numerics are the GPU
  // test's).
  std::vector<float> q(2 * qh * dim), kvRows(2 * kv * dim);
  for (size_t i = 0; i < q.size(); ++i)
    q[i] = 0.01f * static_cast<float>(i % 17);
  for (size_t i = 0; i < kvRows.size(); ++i)
    kvRows[i] = 0.02f * static_cast<float>(i % 13) - 0.1f;
  float *dq = nullptr, *dk = nullptr, *dv = nullptr, *dout = nullptr;
  void *workspace = nullptr;
  const uint64_t workspaceBytes =
      kvc_h2o_cuda_decode_batch_workspace_bytes(2, 4 * kPageSize);
  CHECK(cudaMalloc(reinterpret_cast<void **>(&dq), 4 * q.size()) ==
                cudaSuccess &&
            cudaMalloc(reinterpret_cast<void **>(&dk), 4 * kvRows.size()) ==
                cudaSuccess &&
            cudaMalloc(reinterpret_cast<void **>(&dv), 4 * kvRows.size()) ==
                cudaSuccess &&
            cudaMalloc(reinterpret_cast<void **>(&dout), 4 * q.size()) ==
                cudaSuccess &&
            cudaMalloc(&workspace, workspaceBytes) == cudaSuccess,
        "buffers");
  cudaMemcpy(dq, q.data(), 4 * q.size(), cudaMemcpyHostToDevice);
  cudaMemcpy(dk, kvRows.data(), 4 * kvRows.size(), cudaMemcpyHostToDevice);
  cudaMemcpy(dv, kvRows.data(), 4 * kvRows.size(), cudaMemcpyHostToDevice);
  auto step = [&](int batch, const int32_t *positions) {
    return kvc_h2o_cuda_decode_batch(ctx, batch, sequences,
                                     0, dq, dk, dv, positions, dout,
                                     workspace, workspaceBytes, nullptr);
  };

  // A step that fits the free slot of every page; its tables stay on the
  // device.
  const int32_t first[2] = {3, 3};
  CHECK(step(2, first) == KVC_STATUS_OK, "first step");
  CHECK(cudaDeviceSynchronize() == cudaSuccess, "sync");

  // Every head needs a page now, the pool has one: the batch's appends
  // (one kvc_append_step) fail before any head takes it.
  const int32_t second[2] = {4, 4};
  const kvc_status_t status = step(2, second);
  CHECK(status == KVC_STATUS_POOL_EXHAUSTED, "second step returned %d",
        status);
  CHECK(std::strstr(kvc_last_error(), "kvc_append_step: ") != nullptr &&
            std::strstr(kvc_last_error(), " new pages needed, 1 free") !=
                nullptr,
        "second step: message '%s'", kvc_last_error());
  for (uint64_t s : sequences)
    expectEntries(ctx, config, s, kPrompt + 1, "after the failed step");
  kvc_pool_stats_t stats;
  CHECK(kvc_pool_stats(ctx, &stats) == KVC_STATUS_OK && stats.free_pages == 1,
        "after the failed step: %d free pages, expected 1", stats.free_pages);
  CHECK(kvc_pool_check(ctx) == KVC_STATUS_OK, "pool check");

  // A workspace too small is reported with its message after the tables
  // were checked out (and written back), and changes nothing either.
  CHECK(step(2, second) == KVC_STATUS_POOL_EXHAUSTED, "repeated step");
  CHECK(kvc_h2o_cuda_decode_batch(ctx, 2, sequences, 0, dq, dk, dv, second,
                                  dout, workspace, 64, nullptr) ==
            KVC_STATUS_BUFFER_TOO_SMALL,
        "small workspace");
  CHECK(std::strcmp(kvc_last_error(),
                    "kvc_h2o_cuda_decode_batch: workspace smaller than "
                    "kvc_h2o_cuda_decode_batch_workspace_bytes(batch, slots + "
                    "page_size)") == 0,
        "small workspace: message '%s'", kvc_last_error());
  for (uint64_t s : sequences)
    expectEntries(ctx, config, s, kPrompt + 1, "after the small workspace");

  // Without the second sequence, the first steps on.
  CHECK(kvc_sequence_remove(ctx, sequences[1]) == KVC_STATUS_OK, "remove");
  const int32_t third[1] = {4};
  CHECK(kvc_h2o_cuda_decode_batch(ctx, 1, sequences, 0, dq, dk, dv, third,
                                  dout, workspace, workspaceBytes,
                                  nullptr) == KVC_STATUS_OK,
        "third step");
  std::vector<float> out(qh * dim);
  cudaMemcpy(out.data(), dout, 4 * out.size(), cudaMemcpyDeviceToHost);
  for (float x : out)
    CHECK(std::isfinite(x), "third step: output %g", x);
  expectEntries(ctx, config, sequences[0], kPrompt + 2, "after the third step");
  CHECK(kvc_pool_check(ctx) == KVC_STATUS_OK, "pool check");

  kvc_context_destroy(ctx);
  cudaFree(workspace);
  cudaFree(dout);
  cudaFree(dv);
  cudaFree(dk);
  cudaFree(dq);
  cudaFree(pool);
  std::printf("decode failure: the step that exhausted the pool changed "
              "nothing: ok\n");
  return 0;
}
