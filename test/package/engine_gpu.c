/* The CUDA backend of the same policy, linked from C: its configuration
 * must equal the CPU backend's except for the pool's memory kind, which the
 * engine chooses. Runs without a GPU (configure touches no device). */
#include "kvc_streaming_gpu_cpu.h"
#include "kvc_streaming_gpu_cuda.h"

#include <stdio.h>
#include <string.h>

int main(void) {
  kvc_config_t cpu, cuda;
  memset(&cpu, 0, sizeof cpu);
  memset(&cuda, 0, sizeof cuda);
  kvc_streaming_gpu_cpu_configure(&cpu);
  kvc_streaming_gpu_cuda_configure(&cuda);
  cpu.memory = cuda.memory = 0;
  if (memcmp(&cpu, &cuda, sizeof cpu) != 0) {
    fprintf(stderr, "the cpu and cuda backends configure differently\n");
    return 1;
  }
  printf("cuda backend linked: %d layers, %d kv-heads, head dim %d\n",
         cuda.num_layers, cuda.num_kv_heads, cuda.head_dim);
  return 0;
}
