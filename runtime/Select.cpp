//===- Select.cpp - Selection of entries under a shared budget ------------===//
//
// Part of kvc, the KV-cache policy compiler.
//
//===----------------------------------------------------------------------===//
//
// kvc_select_candidates: the top-k that a budget shared by several heads
// (a global budget's select kernel) runs over the entries of every head.
//
//===----------------------------------------------------------------------===//

#include "runtime/kvc_runtime.h"

#include <algorithm>

extern "C" kvc_status_t kvc_select_candidates(kvc_candidate_t *candidates,
                                              int64_t count, int64_t keep,
                                              int32_t prefer_recent) {
  if (count < 0)
    return kvc_report_error(KVC_STATUS_INVALID_ARGUMENT,
                            "kvc_select_candidates: negative count");
  if (count > 0 && !candidates)
    return kvc_report_error(KVC_STATUS_NULL_POINTER,
                            "kvc_select_candidates: candidates is NULL");
  keep = std::max<int64_t>(0, std::min(keep, count));
  const bool recent = prefer_recent != 0;
  // A strict total order: entries of one head have distinct positions.
  auto better = [recent](const kvc_candidate_t &a, const kvc_candidate_t &b) {
    if (a.score != b.score)
      return a.score > b.score;
    if (a.position != b.position)
      return recent ? a.position > b.position : a.position < b.position;
    return a.head > b.head;
  };
  if (keep < count)
    std::nth_element(candidates, candidates + keep, candidates + count,
                     better);
  std::sort(candidates + keep, candidates + count,
            [](const kvc_candidate_t &a, const kvc_candidate_t &b) {
              return a.head != b.head ? a.head < b.head : a.slot < b.slot;
            });
  return KVC_STATUS_OK;
}
