//===- Status.cpp - Status names and the thread-local last error ----------===//
//
// The error half of the kvc runtime ABI: kvc_status_string, kvc_last_error
// and the helpers the other sources use to report failures.
//
//===----------------------------------------------------------------------===//

#include "runtime/Support.h"

#include <cstdarg>
#include <cstdio>

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
