/* A C engine using a kvc policy library: creates the runtime context the
 * policy asks for, prefills a prompt longer than the policy's budget, runs
 * decode steps, and checks that the cache keeps exactly the budget. It calls
 * the policy through a table of the entry points' types, as an engine that
 * picks its policy at run time would (built with
 * -Werror=incompatible-pointer-types, so that the generated declarations
 * must have those types). */
#include "kvc_streaming_llm_cpu.h"
#include "runtime/kvc_policy_api.h"

#include <stdio.h>
#include <stdlib.h>

enum { kLayers = 2, kQHeads = 4, kKvHeads = 2, kDim = 64, kPrompt = 1100 };

static const struct {
  kvc_configure_fn configure;
  kvc_workspace_bytes_fn prefill_workspace_bytes;
  kvc_cpu_prefill_fn prefill;
  kvc_workspace_bytes_fn decode_workspace_bytes;
  kvc_cpu_decode_fn decode;
} policy = {kvc_streaming_llm_cpu_configure,
            kvc_streaming_llm_cpu_prefill_workspace_bytes,
            kvc_streaming_llm_cpu_prefill,
            kvc_streaming_llm_cpu_decode_workspace_bytes,
            kvc_streaming_llm_cpu_decode};

static int fail(const char *what, kvc_status_t status) {
  fprintf(stderr, "engine: %s: %s: %s\n", what, kvc_status_string(status),
          kvc_last_error());
  return 1;
}

int main(void) {
  kvc_config_t config = {0};
  policy.configure(&config);
  config.page_size = 64;
  config.num_pages = kLayers * kKvHeads * (kPrompt / 64 + 4);
  config.max_sequences = 1;
  config.memory = KVC_MEMORY_HOST;
  uint64_t bytes = 0;
  kvc_status_t s = kvc_pool_bytes_required(&config, &bytes);
  if (s != KVC_STATUS_OK)
    return fail("pool size", s);
  void *pool = aligned_alloc(KVC_POOL_ALIGNMENT,
                             (bytes + KVC_POOL_ALIGNMENT - 1) /
                                 KVC_POOL_ALIGNMENT * KVC_POOL_ALIGNMENT);
  kvc_context_t *context = NULL;
  if ((s = kvc_context_create(&config, pool, bytes, &context)) != KVC_STATUS_OK)
    return fail("context", s);
  if ((s = kvc_sequence_add(context, 7)) != KVC_STATUS_OK)
    return fail("sequence", s);

  float *q = malloc(sizeof(float) * kPrompt * kQHeads * kDim);
  float *k = malloc(sizeof(float) * kPrompt * kKvHeads * kDim);
  float *v = malloc(sizeof(float) * kPrompt * kKvHeads * kDim);
  float *out = malloc(sizeof(float) * kPrompt * kQHeads * kDim);
  int32_t *positions = malloc(sizeof(int32_t) * kPrompt);
  for (int i = 0; i < kPrompt * kQHeads * kDim; ++i)
    q[i] = (float)((i * 37) % 101) / 101.0f - 0.5f;
  for (int i = 0; i < kPrompt * kKvHeads * kDim; ++i) {
    k[i] = (float)((i * 53) % 97) / 97.0f - 0.5f;
    v[i] = (float)((i * 29) % 89) / 89.0f - 0.5f;
  }
  for (int i = 0; i < kPrompt; ++i)
    positions[i] = i;

  uint64_t wsBytes = policy.prefill_workspace_bytes(kPrompt);
  uint64_t decodeBytes = policy.decode_workspace_bytes(kPrompt + 128);
  if (decodeBytes > wsBytes)
    wsBytes = decodeBytes;
  void *workspace = malloc(wsBytes);
  for (int layer = 0; layer < kLayers; ++layer)
    if ((s = policy.prefill(context, 7, layer, kPrompt, q, k, v, positions,
                            out, workspace, wsBytes)) != KVC_STATUS_OK)
      return fail("prefill", s);
  for (int step = 0; step < 3; ++step)
    for (int layer = 0; layer < kLayers; ++layer)
      if ((s = policy.decode(context, 7, layer, q, k, v, kPrompt + step, out,
                             workspace, wsBytes)) != KVC_STATUS_OK)
        return fail("decode", s);

  int32_t entries = 0;
  if ((s = kvc_get_num_entries(context, 7, 1, 1, &entries)) != KVC_STATUS_OK)
    return fail("entries", s);
  printf("engine: streaming_llm keeps %d of %d entries\n", entries,
         kPrompt + 3);
  kvc_context_destroy(context);
  free(workspace);
  free(positions);
  free(out);
  free(v);
  free(k);
  free(q);
  free(pool);
  return entries == 1024 ? 0 : 1;
}
