//===- kvc_prefill.h - What the generated prefills share ---------*- C++ -*-===//
//
// A host helper of the prefill entry points that both backends generate
// (kvc_<p>_cpu_prefill, kvc_<p>_cuda_prefill): kvc_cpu.h and kvc_cuda.cuh
// include it.
//
//===----------------------------------------------------------------------===//

#ifndef KVC_RUNTIME_KVC_PREFILL_H
#define KVC_RUNTIME_KVC_PREFILL_H

#include "runtime/kvc_runtime.h"

#include <cstdint>
#include <cstdio>

namespace kvc {

/// The appends of a prefill to one layer of one sequence, whose kv-heads it
/// found empty. A prefill appends head after head, so one that fails part
/// way (the pool exhausted at a later head, a failed launch after the
/// appends) would leave some heads filled and the layer refused by the
/// next prefill. Unless keep() was called, the destructor empties the layer
/// again (kvc_clear_layer): the failed prefill leaves it as it found it and
/// can be called again, and the caller sees the status and message
/// (kvc_last_error) of the call that failed.
class LayerAppends {
public:
  LayerAppends(kvc_context_t *context, uint64_t sequence, int32_t layer)
      : context_(context), sequence_(sequence), layer_(layer) {}
  LayerAppends(const LayerAppends &) = delete;
  LayerAppends &operator=(const LayerAppends &) = delete;
  ~LayerAppends() {
    if (kept_)
      return;
    char message[512];
    std::snprintf(message, sizeof message, "%s", kvc_last_error());
    kvc_clear_layer(context_, sequence_, layer_);
    kvc_report_error(KVC_STATUS_OK, message);
  }

  /// Every head's entries are in: the layer keeps them.
  void keep() { kept_ = true; }

private:
  kvc_context_t *context_;
  uint64_t sequence_;
  int32_t layer_;
  bool kept_ = false;
};

} // namespace kvc

#endif // KVC_RUNTIME_KVC_PREFILL_H
