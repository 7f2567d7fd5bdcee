//===- EmuCheck.h - The failure check of the emulator test programs -------===//
//
// CHECK(cond, format, ...): unless `cond` holds, prints the location, the
// formatted message and the runtime's last error, and exits 1.
//
//===----------------------------------------------------------------------===//

#ifndef KVC_TEST_CUDAEMU_EMUCHECK_H
#define KVC_TEST_CUDAEMU_EMUCHECK_H

#include "runtime/kvc_runtime.h"

#include <cstdio>
#include <cstdlib>

#define CHECK(cond, ...)                                                       \
  do {                                                                         \
    if (!(cond)) {                                                             \
      std::fprintf(stderr, "FAIL %s:%d: ", __FILE__, __LINE__);                \
      std::fprintf(stderr, __VA_ARGS__);                                       \
      std::fprintf(stderr, "\n%s\n", kvc_last_error());                        \
      std::exit(1);                                                            \
    }                                                                          \
  } while (0)

#endif // KVC_TEST_CUDAEMU_EMUCHECK_H
