//===- Support.h - Error plumbing shared by the runtime sources -*- C++ -*-===//
//
// Internal to KvcRuntime. Every C entry point runs its body through
// `guarded`, which turns C++ exceptions into status codes so that nothing
// unwinds across the C ABI, and records failures in a thread-local message.
//
//===----------------------------------------------------------------------===//

#ifndef KVC_RUNTIME_SUPPORT_H
#define KVC_RUNTIME_SUPPORT_H

#include "runtime/kvc_runtime.h"

#include <cstdint>
#include <new>

namespace kvc::rt {

/// Records `message` (printf-style) as the calling thread's last error and
/// returns `status`. Formats into a fixed thread-local buffer: reporting an
/// error must not allocate, because it also reports allocation failures.
kvc_status_t fail(kvc_status_t status, const char *format, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 2, 3)))
#endif
    ;

/// Clears the calling thread's last error (start of every entry point).
void clearError() noexcept;

/// Runs `body` (returning kvc_status_t) with every exception mapped to a
/// status: std::bad_alloc to KVC_STATUS_OUT_OF_MEMORY, anything else to
/// KVC_STATUS_INTERNAL. `name` prefixes the messages.
template <typename Body>
kvc_status_t guarded(const char *name, Body &&body) noexcept {
  clearError();
  try {
    return body();
  } catch (const std::bad_alloc &) {
    return fail(KVC_STATUS_OUT_OF_MEMORY, "%s: host allocation failed", name);
  } catch (...) {
    return fail(KVC_STATUS_INTERNAL, "%s: unexpected internal exception", name);
  }
}

/// True when `pointer` is aligned for T (ABI arrays must be).
template <typename T> bool isAligned(const void *pointer) {
  return reinterpret_cast<std::uintptr_t>(pointer) % alignof(T) == 0;
}

} // namespace kvc::rt

#endif // KVC_RUNTIME_SUPPORT_H
