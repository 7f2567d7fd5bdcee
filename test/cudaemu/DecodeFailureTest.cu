//===- DecodeFailureTest.cu - A CUDA decode step that cannot append -------===//
//
// The generated CUDA decode of H2O (geometry g1: two kv-heads) on the
// emulator, over a pool with one free page: after a step that fits, a batch
// step whose appends need more pages than the pool holds must fail with
// KVC_STATUS_POOL_EXHAUSTED and the runtime's message, and leave every
// sequence as it was (the head that did get a page gives it back), with
// the device tables of the step before written back. A workspace too
// small fails with its message and changes nothing as well. The context
// then serves the next step once a sequence is removed. Then each launch
// of a step refused in turn (the emulator's failLaunches: the rows' store,
// the attention, the fold) on a sequence whose append opens a page and on
// one whose append does not: the step reports the CUDA error under its
// name and takes its appends back, and the step called again gives the
// outputs and the metadata of a twin context that never failed; so does a
// step that finds no device memory for the tables it builds after its
// appends (failDeviceAllocations). Exits 1 on the first difference.
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

/// The inputs and buffers of one-sequence steps on two contexts of the
/// same configuration: `failing`, whose steps are refused launches first,
/// and `twin`, which takes the same steps without failures.
struct Twins {
  kvc_config_t config{};
  void *pools[2] = {};
  kvc_context_t *contexts[2] = {};
  float *q = nullptr, *k = nullptr, *v = nullptr, *out = nullptr;
  void *workspace = nullptr;
  uint64_t workspaceBytes = 0;

  explicit Twins(const kvc_config_t &base) : config(base) {
    config.num_pages = 8;
    config.max_sequences = 1;
    uint64_t poolBytes = 0;
    CHECK(kvc_pool_bytes_required(&config, &poolBytes) == KVC_STATUS_OK,
          "twins: pool");
    for (int c = 0; c < 2; ++c) {
      CHECK(cudaMalloc(&pools[c], poolBytes) == cudaSuccess &&
                cudaMemset(pools[c], 0, poolBytes) == cudaSuccess,
            "twins: pool");
      CHECK(kvc_context_create(&config, pools[c], poolBytes, &contexts[c]) ==
                KVC_STATUS_OK,
            "twins: context");
      CHECK(kvc_sequence_add(contexts[c], 1) == KVC_STATUS_OK, "twins: add");
    }
    const int qh = config.num_q_heads, kv = config.num_kv_heads;
    const int dim = config.head_dim;
    workspaceBytes = kvc_h2o_cuda_decode_batch_workspace_bytes(1, 4 * kPageSize);
    CHECK(cudaMalloc(reinterpret_cast<void **>(&q), 4 * qh * dim) ==
                  cudaSuccess &&
              cudaMalloc(reinterpret_cast<void **>(&k), 4 * kv * dim) ==
                  cudaSuccess &&
              cudaMalloc(reinterpret_cast<void **>(&v), 4 * kv * dim) ==
                  cudaSuccess &&
              cudaMalloc(reinterpret_cast<void **>(&out), 4 * qh * dim) ==
                  cudaSuccess &&
              cudaMalloc(&workspace, workspaceBytes) == cudaSuccess,
          "twins: buffers");
  }
  ~Twins() {
    for (kvc_context_t *c : contexts)
      kvc_context_destroy(c);
    for (void *p : pools)
      cudaFree(p);
    cudaFree(workspace);
    cudaFree(out);
    cudaFree(v);
    cudaFree(k);
    cudaFree(q);
  }

  /// Inputs of the token at `position` (the same for both contexts).
  void inputs(int32_t position) {
    const int qh = config.num_q_heads, kv = config.num_kv_heads;
    const int dim = config.head_dim;
    std::vector<float> hq(qh * dim), hk(kv * dim), hv(kv * dim);
    for (size_t i = 0; i < hq.size(); ++i)
      hq[i] = 0.05f * static_cast<float>((i + 3 * position) % 11) - 0.2f;
    for (size_t i = 0; i < hk.size(); ++i) {
      hk[i] = 0.03f * static_cast<float>((i * 7 + position) % 13) - 0.15f;
      hv[i] = 0.04f * static_cast<float>((i + 5 * position) % 9) - 0.1f;
    }
    cudaMemcpy(q, hq.data(), 4 * hq.size(), cudaMemcpyHostToDevice);
    cudaMemcpy(k, hk.data(), 4 * hk.size(), cudaMemcpyHostToDevice);
    cudaMemcpy(v, hv.data(), 4 * hv.size(), cudaMemcpyHostToDevice);
  }

  /// One step of sequence 1 of context `c` at `position`; its outputs.
  kvc_status_t step(int c, int32_t position, std::vector<float> *outputs) {
    inputs(position);
    const uint64_t sequence = 1;
    const kvc_status_t status = kvc_h2o_cuda_decode_batch(
        contexts[c], 1, &sequence, 0, q, k, v, &position, out, workspace,
        workspaceBytes, nullptr);
    if (status == KVC_STATUS_OK && outputs) {
      outputs->resize(config.num_q_heads * config.head_dim);
      cudaMemcpy(outputs->data(), out, 4 * outputs->size(),
                 cudaMemcpyDeviceToHost);
    }
    return status;
  }

  /// Both contexts' sequence hold the same entries in the same slots, with
  /// the same scores, in as many pages, and the pools as many free pages.
  void expectSame(const char *when) {
    for (int h = 0; h < config.num_kv_heads; ++h) {
      kvc_metadata_t meta[2];
      int32_t pages[2] = {};
      for (int c = 0; c < 2; ++c)
        CHECK(kvc_get_metadata(contexts[c], 1, 0, h, &meta[c]) ==
                      KVC_STATUS_OK &&
                  kvc_get_num_pages(contexts[c], 1, 0, h, &pages[c]) ==
                      KVC_STATUS_OK,
              "%s: metadata", when);
      CHECK(meta[0].num_slots == meta[1].num_slots && pages[0] == pages[1],
            "%s: head %d holds %d slots in %d pages, the twin %d in %d", when,
            h, meta[0].num_slots, pages[0], meta[1].num_slots, pages[1]);
      for (int32_t s = 0; s < meta[0].num_slots; ++s) {
        CHECK(meta[0].position[s] == meta[1].position[s],
              "%s: head %d slot %d holds position %d, the twin %d", when, h,
              s, meta[0].position[s], meta[1].position[s]);
        if (meta[0].position[s] != KVC_POSITION_NONE)
          CHECK(meta[0].score[s] == meta[1].score[s],
                "%s: head %d slot %d scores %.9g, the twin %.9g", when, h, s,
                meta[0].score[s], meta[1].score[s]);
      }
    }
    kvc_pool_stats_t stats[2];
    for (int c = 0; c < 2; ++c)
      CHECK(kvc_pool_stats(contexts[c], &stats[c]) == KVC_STATUS_OK &&
                kvc_pool_check(contexts[c]) == KVC_STATUS_OK,
            "%s: pool", when);
    CHECK(stats[0].free_pages == stats[1].free_pages,
          "%s: %d free pages, the twin %d", when, stats[0].free_pages,
          stats[1].free_pages);
  }
};

/// Steps at `position` on the failing context with each of the step's
/// launches refused in turn, then once more without a refusal, and the
/// same step on the twin: the same outputs and metadata.
void refuseEachLaunch(Twins &t, int32_t position, const char *when) {
  const char *kernels[] = {"storeAppended", "decodeAttentionSplit",
                           "decodeFold"};
  for (const char *kernel : kernels) {
    ::kvc::emu::failLaunches(kernel);
    const kvc_status_t status = t.step(0, position, nullptr);
    ::kvc::emu::failLaunches(nullptr);
    CHECK(status == KVC_STATUS_INTERNAL,
          "%s, %s refused: the step returned %d", when, kernel, status);
    CHECK(std::strcmp(kvc_last_error(),
                      "kvc_h2o_cuda_decode_batch: CUDA error: too many "
                      "resources requested for launch") == 0,
          "%s, %s refused: message '%s'", when, kernel, kvc_last_error());
    CHECK(cudaGetLastError() == cudaSuccess, "%s: error left", when);
    // The twin has not taken this step yet: the same state as before it.
    t.expectSame(when);
  }
  std::vector<float> outputs[2];
  for (int c = 0; c < 2; ++c)
    CHECK(t.step(c, position, &outputs[c]) == KVC_STATUS_OK,
          "%s: the step called again (context %d): %s", when, c,
          kvc_last_error());
  for (size_t i = 0; i < outputs[0].size(); ++i)
    CHECK(outputs[0][i] == outputs[1][i] && std::isfinite(outputs[0][i]),
          "%s: output %zu is %.9g, the twin's %.9g", when, i, outputs[0][i],
          outputs[1][i]);
  t.expectSame(when);
}

/// Refused launches on twins of `config`: a prompt of a whole page per
/// head, so that the first step's append opens a page (and builds the
/// device tables), and the second one's does not (and finds them).
void checkRefusedLaunches(const kvc_config_t &config) {
  Twins t(config);
  const int32_t prompt[kPageSize] = {0, 1, 2, 3};
  for (kvc_context_t *c : t.contexts)
    for (int h = 0; h < config.num_kv_heads; ++h)
      CHECK(kvc_append(c, 1, 0, h, kPageSize, config.head_dim, nullptr,
                       nullptr, prompt, nullptr) == KVC_STATUS_OK,
            "twins: prompt");
  t.expectSame("after the prompt");
  // A device without memory for the sequence's device tables, which the
  // first step builds after its appends: out of memory, taken back.
  ::kvc::emu::failDeviceAllocations(true);
  const kvc_status_t status = t.step(0, kPageSize, nullptr);
  ::kvc::emu::failDeviceAllocations(false);
  CHECK(status == KVC_STATUS_OUT_OF_MEMORY,
        "no device memory: the step returned %d", status);
  CHECK(std::strcmp(kvc_last_error(),
                    "kvc_h2o_cuda_decode_batch: CUDA error: out of memory") ==
            0,
        "no device memory: message '%s'", kvc_last_error());
  cudaGetLastError();
  t.expectSame("no device memory");
  refuseEachLaunch(t, kPageSize, "the step that opens a page");
  refuseEachLaunch(t, kPageSize + 1, "the step after it");
  // And the sequence steps on.
  std::vector<float> outputs[2];
  for (int c = 0; c < 2; ++c)
    CHECK(t.step(c, kPageSize + 2, &outputs[c]) == KVC_STATUS_OK,
          "the third step");
  CHECK(outputs[0] == outputs[1], "the third step: outputs differ");
  t.expectSame("after the third step");
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
  checkRefusedLaunches(config);
  cudaFree(workspace);
  cudaFree(dout);
  cudaFree(dv);
  cudaFree(dk);
  cudaFree(dq);
  cudaFree(pool);
  std::printf("decode failure: the step that exhausted the pool changed "
              "nothing, the steps whose launches failed took their appends "
              "back: ok\n");
  return 0;
}
