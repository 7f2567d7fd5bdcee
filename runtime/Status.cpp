//===- Status.cpp - Status names and the thread-local last error ----------===//
//
// The error half of the kvc runtime ABI: kvc_status_string, kvc_last_error
// and the helpers the other sources use to report failures.
//
//===----------------------------------------------------------------------===//

#include "runtime/Support.h"

#include <algorithm>
#include <cstdarg>
#include <cstdio>
#include <new>
#include <utility>
#include <vector>

namespace {
// Fixed size so that recording an error never allocates; longer messages are
// truncated, which is acceptable for diagnostics.
thread_local char lastErrorMessage[512] = "";
} // namespace

namespace kvc::rt {

kvc_status_t fail(kvc_status_t status, const char *format, ...) {
  va_list args;
  va_start(args, format);
  std::vsnprintf(lastErrorMessage, sizeof(lastErrorMessage), format, args);
  va_end(args);
  return status;
}

void clearError() noexcept { lastErrorMessage[0] = '\0'; }

} // namespace kvc::rt

extern "C" const char *kvc_status_string(int32_t status) {
  // Switch on the integer: a C caller may pass any value.
  switch (status) {
  case KVC_STATUS_OK:
    return "KVC_STATUS_OK";
  case KVC_STATUS_NULL_POINTER:
    return "KVC_STATUS_NULL_POINTER";
  case KVC_STATUS_INVALID_ARGUMENT:
    return "KVC_STATUS_INVALID_ARGUMENT";
  case KVC_STATUS_GEOMETRY_MISMATCH:
    return "KVC_STATUS_GEOMETRY_MISMATCH";
  case KVC_STATUS_OUT_OF_RANGE:
    return "KVC_STATUS_OUT_OF_RANGE";
  case KVC_STATUS_POOL_EXHAUSTED:
    return "KVC_STATUS_POOL_EXHAUSTED";
  case KVC_STATUS_BUDGET_OVER_CAPACITY:
    return "KVC_STATUS_BUDGET_OVER_CAPACITY";
  case KVC_STATUS_OVER_BUDGET:
    return "KVC_STATUS_OVER_BUDGET";
  case KVC_STATUS_MISALIGNED:
    return "KVC_STATUS_MISALIGNED";
  case KVC_STATUS_UNSUPPORTED:
    return "KVC_STATUS_UNSUPPORTED";
  case KVC_STATUS_ALREADY_EXISTS:
    return "KVC_STATUS_ALREADY_EXISTS";
  case KVC_STATUS_OUT_OF_MEMORY:
    return "KVC_STATUS_OUT_OF_MEMORY";
  case KVC_STATUS_BUFFER_TOO_SMALL:
    return "KVC_STATUS_BUFFER_TOO_SMALL";
  case KVC_STATUS_INTERNAL:
    return "KVC_STATUS_INTERNAL";
  }
  return "KVC_STATUS_UNKNOWN";
}

extern "C" const char *kvc_last_error(void) { return lastErrorMessage; }

extern "C" kvc_status_t kvc_report_error(kvc_status_t status,
                                         const char *message) {
  std::snprintf(lastErrorMessage, sizeof(lastErrorMessage), "%s",
                message ? message : "");
  return status;
}

namespace {
/// The first index whose sequence an earlier index lists, or `batch`:
/// every pair side by side.
int32_t firstRepeat(int32_t batch, const uint64_t *sequences) {
  for (int32_t b = 1; b < batch; ++b)
    for (int32_t c = 0; c < b; ++c)
      if (sequences[b] == sequences[c])
        return b;
  return batch;
}
} // namespace

extern "C" kvc_status_t kvc_check_batch(const char *entry, int32_t batch,
                                        const uint64_t *sequences) {
  using kvc::rt::fail;
  if (!entry)
    entry = "kvc_check_batch";
  if (batch <= 0)
    return fail(KVC_STATUS_INVALID_ARGUMENT, "%s: the batch is empty", entry);
  if (!sequences)
    return fail(KVC_STATUS_NULL_POINTER, "%s: sequences is NULL", entry);
  // Up to kSideBySide sequences every pair is compared (at most 120
  // comparisons); beyond, a sorted copy tells whether any sequence repeats,
  // and only then are the pairs compared, to name the first repeat. The
  // copy stays with the thread between calls.
  constexpr int32_t kSideBySide = 16;
  bool repeats = true;
  if (batch > kSideBySide) {
    thread_local std::vector<uint64_t> sorted;
    try {
      sorted.assign(sequences, sequences + batch);
    } catch (const std::bad_alloc &) {
      return fail(KVC_STATUS_OUT_OF_MEMORY,
                  "%s: host allocation failed (checking %d sequences)", entry,
                  batch);
    }
    std::sort(sorted.begin(), sorted.end());
    repeats = std::adjacent_find(sorted.begin(), sorted.end()) != sorted.end();
  }
  const int32_t first = repeats ? firstRepeat(batch, sequences) : batch;
  if (first < batch)
    return fail(KVC_STATUS_INVALID_ARGUMENT,
                "%s: sequence %llu appears twice in the batch (index %d)",
                entry, static_cast<unsigned long long>(sequences[first]),
                first);
  kvc::rt::clearError();
  return KVC_STATUS_OK;
}
