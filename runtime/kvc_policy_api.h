/*===- kvc_policy_api.h - entry points of a generated policy ----*- C -*-===*\
|*                                                                          *|
|* The function types of the entry points that kvc-opt --kvc-emit writes   *|
|* into a policy library's header (kvc_<p>_cpu.h, kvc_<p>_cuda.h), for an   *|
|* engine that holds several policies in one table and picks one at run    *|
|* time. The generated header documents each entry point; a function of    *|
|* policy p has the type named after its suffix here, e.g.                 *|
|* kvc_<p>_cpu_decode_batch is a kvc_cpu_decode_batch_fn and                *|
|* kvc_<p>_cuda_decode_run_batch a kvc_cuda_decode_run_batch_fn.           *|
|*                                                                          *|
\*===----------------------------------------------------------------------===*/

#ifndef KVC_POLICY_API_H
#define KVC_POLICY_API_H

#include "runtime/kvc_runtime.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Either backend. */

/* kvc_<p>_<target>_configure: the geometry and storage fields of a runtime
 * configuration for the policy. */
typedef void (*kvc_configure_fn)(kvc_config_t *config);
/* kvc_<p>_<target>_<kernel>_workspace_bytes: the workspace of a prefill or
 * select entry point for n prompt entries, or of a decode entry point for a
 * head of num_slots slots. */
typedef uint64_t (*kvc_workspace_bytes_fn)(int32_t n);
/* kvc_<p>_<target>_<kernel>_batch_workspace_bytes. */
typedef uint64_t (*kvc_batch_workspace_bytes_fn)(int32_t batch,
                                                 int32_t num_slots);
/* kvc_<p>_<target>_select: a global budget's selection over every layer,
 * host code on both backends. */
typedef kvc_status_t (*kvc_select_fn)(kvc_context_t *context,
                                      uint64_t sequence, int32_t n,
                                      void *workspace,
                                      uint64_t workspace_bytes);

/* The CPU backend (kvc_<p>_cpu_*). */

typedef kvc_status_t (*kvc_cpu_prefill_fn)(
    kvc_context_t *context, uint64_t sequence, int32_t layer, int32_t n,
    const float *q, const float *k, const float *v, const int32_t *positions,
    float *out, void *workspace, uint64_t workspace_bytes);
typedef kvc_status_t (*kvc_cpu_decode_fn)(
    kvc_context_t *context, uint64_t sequence, int32_t layer, const float *q,
    const float *k, const float *v, int32_t position, float *out,
    void *workspace, uint64_t workspace_bytes);
typedef kvc_status_t (*kvc_cpu_decode_batch_fn)(
    kvc_context_t *context, int32_t batch, const uint64_t *sequences,
    int32_t layer, const float *q, const float *k, const float *v,
    const int32_t *positions, float *out, void *workspace,
    uint64_t workspace_bytes);
/* The unfused pipeline's scoring kernels (--kvc-form-kernels=unfused=1). */
typedef kvc_status_t (*kvc_cpu_prefill_scoring_fn)(
    kvc_context_t *context, uint64_t sequence, int32_t layer, int32_t n,
    const float *q, const float *k, const float *v, const int32_t *positions,
    void *workspace, uint64_t workspace_bytes);
typedef kvc_status_t (*kvc_cpu_decode_scoring_fn)(
    kvc_context_t *context, uint64_t sequence, int32_t layer, const float *q,
    int32_t position, void *workspace, uint64_t workspace_bytes);
typedef kvc_status_t (*kvc_cpu_decode_scoring_batch_fn)(
    kvc_context_t *context, int32_t batch, const uint64_t *sequences,
    int32_t layer, const float *q, const int32_t *positions, void *workspace,
    uint64_t workspace_bytes);

/* The CUDA backend (kvc_<p>_cuda_*): the same arguments, device pointers
 * where the generated header says so, and a trailing stream (a
 * cudaStream_t). */

typedef kvc_status_t (*kvc_cuda_prefill_fn)(
    kvc_context_t *context, uint64_t sequence, int32_t layer, int32_t n,
    const float *q, const float *k, const float *v, const int32_t *positions,
    float *out, void *workspace, uint64_t workspace_bytes, void *stream);
typedef kvc_status_t (*kvc_cuda_decode_fn)(
    kvc_context_t *context, uint64_t sequence, int32_t layer, const float *q,
    const float *k, const float *v, int32_t position, float *out,
    void *workspace, uint64_t workspace_bytes, void *stream);
typedef kvc_status_t (*kvc_cuda_decode_batch_fn)(
    kvc_context_t *context, int32_t batch, const uint64_t *sequences,
    int32_t layer, const float *q, const float *k, const float *v,
    const int32_t *positions, float *out, void *workspace,
    uint64_t workspace_bytes, void *stream);
/* A decode step in three calls, its run capturable in a CUDA graph. */
typedef kvc_status_t (*kvc_cuda_decode_plan_batch_fn)(
    kvc_context_t *context, int32_t batch, const uint64_t *sequences,
    int32_t layer, const int32_t *positions, int32_t capacity,
    void *workspace, uint64_t workspace_bytes, void *stream);
typedef kvc_status_t (*kvc_cuda_decode_run_batch_fn)(
    kvc_context_t *context, int32_t batch, int32_t layer, const float *q,
    const float *k, const float *v, float *out, int32_t capacity,
    void *workspace, uint64_t workspace_bytes, void *stream);
typedef kvc_status_t (*kvc_cuda_decode_finish_batch_fn)(kvc_context_t *context,
                                                        int32_t layer,
                                                        void *stream);
typedef kvc_status_t (*kvc_cuda_prefill_scoring_fn)(
    kvc_context_t *context, uint64_t sequence, int32_t layer, int32_t n,
    const float *q, const float *k, const float *v, const int32_t *positions,
    void *workspace, uint64_t workspace_bytes, void *stream);
typedef kvc_status_t (*kvc_cuda_decode_scoring_fn)(
    kvc_context_t *context, uint64_t sequence, int32_t layer, const float *q,
    int32_t position, void *workspace, uint64_t workspace_bytes, void *stream);
typedef kvc_status_t (*kvc_cuda_decode_scoring_batch_fn)(
    kvc_context_t *context, int32_t batch, const uint64_t *sequences,
    int32_t layer, const float *q, const int32_t *positions, void *workspace,
    uint64_t workspace_bytes, void *stream);

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* KVC_POLICY_API_H */
