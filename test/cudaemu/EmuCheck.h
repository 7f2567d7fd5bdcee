//===- EmuCheck.h - Checks and copies of the emulator test programs -------===//
//
// CHECK(cond, format, ...): unless `cond` holds, prints the location, the
// formatted message and the runtime's last error, and exits 1.
// upload(host) copies a vector into a new device allocation (at least one
// element); download(d, n) copies n elements back. Included after the CUDA
// API (the emulator's or the toolkit's): the kernel tests that include it
// are also built for a GPU (test/gpu, gpu.kernel.*), where
// skipWithoutDevice() makes them skip without one.
//
//===----------------------------------------------------------------------===//

#ifndef KVC_TEST_CUDAEMU_EMUCHECK_H
#define KVC_TEST_CUDAEMU_EMUCHECK_H

#include "runtime/kvc_runtime.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <vector>

#define CHECK(cond, ...)                                                       \
  do {                                                                         \
    if (!(cond)) {                                                             \
      std::fprintf(stderr, "FAIL %s:%d: ", __FILE__, __LINE__);                \
      std::fprintf(stderr, __VA_ARGS__);                                       \
      std::fprintf(stderr, "\n%s\n", kvc_last_error());                        \
      std::exit(1);                                                            \
    }                                                                          \
  } while (0)

/// 77, after a line that says so, where no CUDA device is usable (the
/// exit status ctest and scripts/gpu-test.sh take as skipped); 0 otherwise,
/// the emulator's device included.
inline int skipWithoutDevice(const char *program) {
  int devices = 0;
  const cudaError_t error = cudaGetDeviceCount(&devices);
  if (error == cudaSuccess && devices > 0)
    return 0;
  std::printf("SKIP: no usable CUDA device (%s); %s needs one\n",
              error == cudaSuccess ? "none found" : cudaGetErrorString(error),
              program);
  return 77;
}

template <typename T> T *upload(const std::vector<T> &host) {
  T *d = nullptr;
  CHECK(cudaMalloc(&d, sizeof(T) * std::max<size_t>(host.size(), 1)) ==
            cudaSuccess,
        "cudaMalloc");
  if (!host.empty())
    cudaMemcpy(d, host.data(), sizeof(T) * host.size(), cudaMemcpyHostToDevice);
  return d;
}

template <typename T> std::vector<T> download(const T *d, size_t n) {
  std::vector<T> host(n);
  if (n)
    cudaMemcpy(host.data(), d, sizeof(T) * n, cudaMemcpyDeviceToHost);
  return host;
}

#endif // KVC_TEST_CUDAEMU_EMUCHECK_H
