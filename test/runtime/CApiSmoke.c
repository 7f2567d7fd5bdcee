/*===- CApiSmoke.c - The runtime header compiles and works from C --------===*\
|*                                                                          *|
|* Engines written in C include kvc_runtime.h directly; this file is built  *|
|* as C11 so that any C++-only construct in the header breaks the build.    *|
|*                                                                          *|
\*===----------------------------------------------------------------------===*/

#include "runtime/kvc_runtime.h"

#include <stdlib.h>
#include <string.h>

/* Creates a context, appends two entries, reads one back; returns 0 on
 * success and a distinct positive number for each failed step. */
int kvcCApiSmoke(void) {
  kvc_config_t config;
  memset(&config, 0, sizeof(config));
  config.num_layers = 1;
  config.num_q_heads = 2;
  config.num_kv_heads = 1;
  config.head_dim = 4;
  config.dtype = KVC_DTYPE_F16;
  config.format = KVC_FORMAT_FULL;
  config.page_size = 2;
  config.num_pages = 2;
  config.max_sequences = 1;
  config.memory = KVC_MEMORY_HOST;

  uint64_t bytes = 0;
  if (kvc_pool_bytes_required(&config, &bytes) != KVC_STATUS_OK)
    return 1;
  void *pool = aligned_alloc(KVC_POOL_ALIGNMENT, (size_t)bytes);
  if (!pool)
    return 2;
  kvc_context_t *ctx = NULL;
  int result = 0;
  if (kvc_context_create(&config, pool, bytes, &ctx) != KVC_STATUS_OK) {
    free(pool);
    return 3;
  }
  /* Room for three entries: the failing append below passes three. */
  float keys[12] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12};
  float values[12] = {-1, -2, -3, -4, -5, -6, -7, -8, -9, -10, -11, -12};
  int32_t positions[3] = {0, 1, 2};
  int32_t slots[2] = {-1, -1};
  float key[4], value[4];
  if (kvc_sequence_add(ctx, 42) != KVC_STATUS_OK)
    result = 4;
  else if (kvc_append(ctx, 42, 0, 0, 2, 4, keys, values, positions, slots) !=
           KVC_STATUS_OK)
    result = 5;
  else if (kvc_read_entry(ctx, 42, 0, 0, slots[1], 4, key, value) !=
           KVC_STATUS_OK)
    result = 6;
  else if (key[3] != 8.0f || value[0] != -5.0f)
    result = 7;
  else if (kvc_append(ctx, 42, 0, 0, 3, 4, keys, values, positions, NULL) !=
           KVC_STATUS_POOL_EXHAUSTED)
    result = 8; /* 5 entries do not fit in 2 pages of 2 */
  else if (strlen(kvc_last_error()) == 0)
    result = 9;
  kvc_context_destroy(ctx);
  free(pool);
  return result;
}
