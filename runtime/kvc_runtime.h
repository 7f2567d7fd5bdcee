/*===- kvc_runtime.h - kvc minimal runtime C ABI ---------------*- C -*-===*\
|*                                                                          *|
|* Public C interface of the kvc runtime: paged per-head KV storage inside  *|
|* memory the engine owns, quantized page formats and their pack/unpack     *|
|* routines, and the error model. Generated policy libraries and engines    *|
|* link this library (CMake target KvcRuntime).                             *|
|*                                                                          *|
\*===----------------------------------------------------------------------===*/

/* ABI rules (read these before calling anything)
 *
 * Ownership
 *   The engine owns every byte of KV data. kvc_context_create receives a pool
 *   buffer (host or device memory) sized with kvc_pool_bytes_required; the
 *   runtime never allocates, frees or hides KV memory. It allocates only host
 *   bookkeeping (page tables, free lists, per-entry metadata), released by
 *   kvc_context_destroy. The pool buffer must outlive the context.
 *
 * Errors
 *   Every function that can fail returns kvc_status_t. On failure the state of
 *   the context is exactly what it was before the call (nothing allocated,
 *   nothing evicted, no data written) and kvc_last_error() returns a readable
 *   message for the calling thread (every call that returns kvc_status_t
 *   clears it first). No C++ exception and no abort crosses this interface;
 *   a host allocation failure is reported as KVC_STATUS_OUT_OF_MEMORY.
 *   Output parameters are written only on success, except the count of
 *   needed moves that kvc_compact reports with KVC_STATUS_BUFFER_TOO_SMALL.
 *
 * Thread-safety
 *   A context is not internally synchronized. Calls that mutate a context
 *   (everything except the kvc_get_* / kvc_read_* / kvc_pool_* queries) must
 *   not run concurrently with any other call on the same context. Queries may
 *   run concurrently with each other. Distinct contexts are independent.
 *   Conversion and quantization functions are pure and reentrant.
 *   kvc_last_error() is thread-local. Kernels may write the score and weight
 *   arrays of kvc_get_metadata concurrently for distinct heads; that counts
 *   as mutating the head it writes.
 *
 * Addressing
 *   Sequences are named by caller-chosen 64-bit ids. Entries of one
 *   (sequence, layer, kv-head) live in slots numbered 0 .. num_slots-1; slot s
 *   is offset s % page_size of the s / page_size-th page of that head's page
 *   table. A slot is free when its position metadata is KVC_POSITION_NONE.
 *   Slots are stable across appends and evictions; only kvc_compact (and the
 *   removal of a sequence) renumbers them, and it reports every renumbering.
 *
 * Memory kinds
 *   KVC_MEMORY_HOST pools are ordinary host memory: the runtime writes and
 *   reads entry data (append, read, write, compaction moves, KIVI flushes).
 *   KVC_MEMORY_DEVICE pools are only ever addressed by byte offsets: the
 *   runtime keeps the bookkeeping and generated kernels move the data. Calls
 *   that would touch entry data on a device pool return
 *   KVC_STATUS_UNSUPPORTED, except kvc_compact, which reports the moves the
 *   engine must perform, and kvc_append on a KIVI pool, which records the
 *   staging and quantization the engine must perform
 *   (kvc_kivi_pending_work).
 */

#ifndef KVC_RUNTIME_KVC_RUNTIME_H
#define KVC_RUNTIME_KVC_RUNTIME_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/*===--------------------------------------------------------------------===*/
/* Status codes                                                             */
/*===--------------------------------------------------------------------===*/

/// Result of every fallible runtime call. Values are stable ABI.
typedef enum kvc_status_t {
  KVC_STATUS_OK = 0,
  /// A required pointer argument was NULL.
  KVC_STATUS_NULL_POINTER = 1,
  /// An argument is outside its documented domain (negative count, bad enum).
  KVC_STATUS_INVALID_ARGUMENT = 2,
  /// The geometry or a dimension does not fit the context or the format.
  KVC_STATUS_GEOMETRY_MISMATCH = 3,
  /// A sequence, layer, head, page or slot index is out of range or free.
  KVC_STATUS_OUT_OF_RANGE = 4,
  /// The pool (or the sequence capacity) has no room for the request.
  KVC_STATUS_POOL_EXHAUSTED = 5,
  /// A budget exceeds what the pool could ever hold.
  KVC_STATUS_BUDGET_OVER_CAPACITY = 6,
  /// An append would exceed the budget set for that head.
  KVC_STATUS_OVER_BUDGET = 7,
  /// A buffer does not have the alignment the layout requires.
  KVC_STATUS_MISALIGNED = 8,
  /// The operation does not exist for this memory kind or format.
  KVC_STATUS_UNSUPPORTED = 9,
  /// kvc_sequence_add with an id that is already present.
  KVC_STATUS_ALREADY_EXISTS = 10,
  /// A host bookkeeping allocation failed.
  KVC_STATUS_OUT_OF_MEMORY = 11,
  /// An output array is too small; the required size is reported.
  KVC_STATUS_BUFFER_TOO_SMALL = 12,
  /// A bug in the runtime (an internal invariant failed).
  KVC_STATUS_INTERNAL = 13,
} kvc_status_t;

/// Static name of a status code ("KVC_STATUS_OK", ...); never NULL, and
/// "KVC_STATUS_UNKNOWN" for a value that is not a kvc_status_t.
const char *kvc_status_string(int32_t status);

/// Message describing the most recent failure on the calling thread; "" if
/// the most recent call succeeded. The pointer stays valid until the next
/// runtime call on this thread.
const char *kvc_last_error(void);

/// Records `message` as the calling thread's last error and returns
/// `status`. Generated policy kernels report their own validation failures
/// through it, so that engines read every error from kvc_last_error().
kvc_status_t kvc_report_error(kvc_status_t status, const char *message);

/// Checks the sequence list of a batch entry point named `entry` (for the
/// message; NULL: "kvc_check_batch"): at least one sequence, and none
/// listed twice. Fails with KVC_STATUS_INVALID_ARGUMENT and "<entry>: the
/// batch is empty" or "<entry>: sequence S appears twice in the batch
/// (index i)", i the first index whose sequence an earlier index lists;
/// KVC_STATUS_NULL_POINTER when `sequences` is NULL; KVC_STATUS_OK (and
/// no last error) otherwise. Compares side by side up to 16 sequences and
/// sorts a copy beyond, so that the check of a batch of B sequences that
/// passes costs about B log B: the generated decode_batch entry points
/// call it first.
kvc_status_t kvc_check_batch(const char *entry, int32_t batch,
                             const uint64_t *sequences);

/*===--------------------------------------------------------------------===*/
/* Types and formats                                                        */
/*===--------------------------------------------------------------------===*/

/// Element type of full-precision keys and values.
typedef enum kvc_dtype_t {
  KVC_DTYPE_F32 = 0,
  KVC_DTYPE_F16 = 1,
  KVC_DTYPE_BF16 = 2,
} kvc_dtype_t;

/// Storage format of the pages of a context (and, per entry, of its key and
/// its value). Byte layouts are documented at kvc_page_layout_t.
typedef enum kvc_format_t {
  /// Keys and values in the context's element type.
  KVC_FORMAT_FULL = 0,
  /// int8 symmetric per token: q = rne(x / s), s = max|x| / 127, q in
  /// [-127, 127]; one float scale per key and per value vector.
  KVC_FORMAT_INT8 = 1,
  /// fp8 e4m3 (bias 7, no infinities, max 448) per token with one float
  /// scale s = max|x| / 448 per key and per value vector; q = e4m3(x / s).
  KVC_FORMAT_FP8_E4M3 = 2,
  /// KIVI 2-bit asymmetric: keys per channel over blocks of G tokens, values
  /// per token over groups of G channels, full-precision residual window R.
  KVC_FORMAT_KIVI_INT2 = 3,
  /// KIVI 4-bit, same structure as KVC_FORMAT_KIVI_INT2.
  KVC_FORMAT_KIVI_INT4 = 4,
  /// 2-bit asymmetric per token, keys and values alike: each vector in
  /// groups of G channels, one {scale, min} record per group (the layout
  /// of a KIVI value). Only the low class of a mixed-precision
  /// context (kvc_config_t.low_format) uses it.
  KVC_FORMAT_INT2 = 5,
  /// 4-bit, same structure as KVC_FORMAT_INT2.
  KVC_FORMAT_INT4 = 6,
} kvc_format_t;

/// Where the pool lives.
typedef enum kvc_memory_t {
  KVC_MEMORY_HOST = 0,
  KVC_MEMORY_DEVICE = 1,
} kvc_memory_t;

/// Position metadata of a free slot.
#define KVC_POSITION_NONE (-1)

/// Alignment, in bytes, of the pool buffer and of every page in it.
#define KVC_POOL_ALIGNMENT 256

/// Everything a context needs to know; validated by kvc_context_create.
/// Enumerated fields are int32_t holding the enum's values: the size of a C
/// enum is up to the compiler, and a fixed-width field keeps the layout of
/// this struct the same for every caller.
typedef struct kvc_config_t {
  int32_t num_layers;   ///< Transformer layers (> 0).
  int32_t num_q_heads;  ///< Query heads per layer (multiple of num_kv_heads).
  int32_t num_kv_heads; ///< KV heads per layer (> 0).
  int32_t head_dim;     ///< Channels per head (> 0, even).
  int32_t dtype;        ///< kvc_dtype_t of full-precision data.
  int32_t format;       ///< kvc_format_t of the pages.
  int32_t page_size;    ///< Entry slots per page (> 0; multiple of G for KIVI).
  int32_t group_size;   ///< KIVI group G (divides head_dim); else ignored.
  int32_t residual_length; ///< KIVI window R (multiple of G); else ignored.
  int32_t num_pages;       ///< Pages in the pool (> 0).
  int32_t max_sequences;   ///< Sequences that may exist at once (> 0).
  int32_t memory;          ///< kvc_memory_t: host or device pool.
  /// Mixed precision: kvc_format_t of the low page class, KVC_FORMAT_INT2
  /// or KVC_FORMAT_INT4 (groups of group_size channels), with `format`
  /// FULL, INT8 or FP8_E4M3 as the high class; KVC_FORMAT_FULL (0, what a
  /// zeroed configuration holds) for a context with one class.
  int32_t low_format;
} kvc_config_t;

/// Byte layout of one page, relative to the page's first byte. Slot s of a
/// page stores its key at key_offset + s * key_stride (likewise values).
/// The per-entry parameters:
///  - FULL: no parameters; key/value rows are head_dim elements of dtype.
///  - INT8: rows of head_dim int8; key/value parameter record = {scale},
///    one float32.
///  - FP8_E4M3: rows of head_dim e4m3 bytes; parameter record = {scale},
///    one float32.
///  - KIVI: rows of head_dim * bits / 8 packed bytes (layout at
///    kvc_pack_bits). Value parameter record of slot s: head_dim / G pairs
///    {scale, min}, one per group of G channels. Key parameter record of
///    block b (slots b*G .. b*G+G-1): head_dim pairs {scale, min}, one per
///    channel, at key_param_offset + b * key_param_stride.
///  - INT2/INT4 (the low class of a mixed-precision context): rows of
///    head_dim * bits / 8 packed bytes; key and value parameter records of
///    slot s: head_dim / G pairs {scale, min}.
/// A {scale, min} pair is two f16, scale first (4 bytes), rounded as
/// kvc_kivi_quantize_value states.
/// Parameter strides are 0 where a format has no parameters.
///
/// Mixed precision. A context with a low_format has two page classes of
/// page_size slots each. A high page is one pool page (the layout of
/// kvc_page_layout); a low page is one of the low_pages_per_page
/// sub-pages of a pool page (the layout of kvc_low_page_layout, whose
/// page_bytes is the sub-page stride, a multiple of 256), so an entry of
/// the low class takes the bytes of its format only. A pool page serves
/// one class at a time and returns to the pool when all of its sub-pages
/// are free. All slots of a page-table entry are of its page's class.
typedef struct kvc_page_layout_t {
  uint64_t page_bytes;         ///< Stride between pages (multiple of 256).
  uint64_t key_offset;         ///< First key row.
  uint64_t key_stride;         ///< Bytes per key row.
  uint64_t value_offset;       ///< First value row.
  uint64_t value_stride;       ///< Bytes per value row.
  uint64_t key_param_offset;   ///< First key parameter record.
  uint64_t key_param_stride;   ///< Bytes per key record (per slot or block).
  uint64_t value_param_offset; ///< First value parameter record.
  uint64_t value_param_stride; ///< Bytes per value record (per slot).
  uint64_t residual_offset;    ///< Start of the KIVI residual region in pool.
  uint64_t residual_bytes;     ///< Residual bytes per (sequence, layer, head).
  uint64_t pages_offset;       ///< Byte offset of page 0 in the pool.
} kvc_page_layout_t;

/// Opaque runtime context.
typedef struct kvc_context kvc_context_t;

/*===--------------------------------------------------------------------===*/
/* Sizing and lifetime                                                      */
/*===--------------------------------------------------------------------===*/

/// Writes the page layout a configuration implies (no context needed, so
/// code generators and engines can size buffers before creating one).
kvc_status_t kvc_page_layout(const kvc_config_t *config,
                             kvc_page_layout_t *layout);

/// The page layout of the low class of a mixed-precision configuration
/// (KVC_STATUS_UNSUPPORTED without a low_format): offsets relative to a
/// low page's first byte, page_bytes its stride inside a pool page;
/// pages_offset is the pool's. *pages_per_page (may be NULL) receives how
/// many low pages one pool page holds (>= 1).
kvc_status_t kvc_low_page_layout(const kvc_config_t *config,
                                 kvc_page_layout_t *layout,
                                 int32_t *pages_per_page);

/// Bytes of pool buffer a configuration needs: the KIVI residual region (R
/// full-precision entries per sequence, layer and head; 0 for other
/// formats) followed by config->num_pages pages.
kvc_status_t kvc_pool_bytes_required(const kvc_config_t *config,
                                     uint64_t *bytes);

/// Creates a context over the caller's pool. `pool` must be aligned to
/// KVC_POOL_ALIGNMENT and hold at least kvc_pool_bytes_required bytes. On a
/// host pool the runtime may read and write it; on a device pool it only
/// computes offsets from it. On a KIVI device pool the runtime records the
/// quantization work of each append (kvc_kivi_pending_work) for kernels.
kvc_status_t kvc_context_create(const kvc_config_t *config, void *pool,
                                uint64_t pool_bytes, kvc_context_t **context);

/// Destroys a context and its bookkeeping; the pool is untouched and stays
/// the caller's. Accepts NULL.
kvc_status_t kvc_context_destroy(kvc_context_t *context);

/// Copies the configuration the context was created with.
kvc_status_t kvc_context_config(const kvc_context_t *context,
                                kvc_config_t *config);

/*===--------------------------------------------------------------------===*/
/* Sequences and entries                                                    */
/*===--------------------------------------------------------------------===*/

/// Registers a sequence with empty page tables for every (layer, kv-head).
kvc_status_t kvc_sequence_add(kvc_context_t *context, uint64_t sequence);

/// Removes a sequence and returns all of its pages to the pool.
kvc_status_t kvc_sequence_remove(kvc_context_t *context, uint64_t sequence);

/// Empties one layer of a sequence: the entries of its kv-heads are dropped
/// and their pages go back to the pool, which leaves the heads as those of a
/// sequence just added (KIVI: the residual window and the key blocks start
/// again). Budgets set with kvc_set_budget stay. A record attached to the
/// layer (kvc_attach) is released without a flush. The generated prefills
/// call it when they fail after their first append (runtime/kvc_prefill.h);
/// an engine can call it to prefill a layer again.
kvc_status_t kvc_clear_layer(kvc_context_t *context, uint64_t sequence,
                             int32_t layer);

/// Caps the live entries of one (sequence, layer, head); -1 removes the cap.
/// Fails with KVC_STATUS_BUDGET_OVER_CAPACITY when the budget exceeds the
/// pool's total slots, and KVC_STATUS_INVALID_ARGUMENT when it is below the
/// live entries (evict first: a budget never drops entries by itself).
kvc_status_t kvc_set_budget(kvc_context_t *context, uint64_t sequence,
                            int32_t layer, int32_t head, int32_t budget);

/// Appends `count` entries to one (sequence, layer, kv-head). `keys` and
/// `values` are count x dim float32 rows (dim must equal head_dim), encoded
/// into the context's format; `positions` are the original token positions
/// (>= 0). A new entry takes the lowest free slot (an evicted slot is
/// reused; KIVI reuses whole free blocks of G slots). The slots taken are
/// written to `slots` (may be NULL). All or nothing: when the pool cannot
/// hold all entries nothing is allocated. On device pools keys and values
/// must be NULL (kernels write the data); on host pools they are required,
/// and quantized formats reject non-finite values (one NaN would poison a
/// whole quantization group).
/// KIVI: each entry starts in the full-precision residual window; when R
/// entries have accumulated since the last flush their keys are quantized
/// as blocks of G, and an entry's value is quantized once R newer entries
/// have been appended. On device pools that data work is recorded instead
/// (kvc_kivi_pending_work).
kvc_status_t kvc_append(kvc_context_t *context, uint64_t sequence,
                        int32_t layer, int32_t head, int32_t count, int32_t dim,
                        const float *keys, const float *values,
                        const int32_t *positions, int32_t *slots);

/// kvc_append into the pages of one class of a mixed-precision context:
/// `format` is the context's format (the high class, what kvc_append
/// uses) or its low_format. New entries take the lowest free slot of a
/// page of that class, or a new page of it; the entries are encoded in that
/// format. KVC_STATUS_INVALID_ARGUMENT for any other format.
kvc_status_t kvc_append_format(kvc_context_t *context, uint64_t sequence,
                               int32_t layer, int32_t head, int32_t format,
                               int32_t count, int32_t dim, const float *keys,
                               const float *values, const int32_t *positions,
                               int32_t *slots);

/// A decode step's appends for a batch, in one call: one entry for every
/// kv-head of each of the `batch` distinct `sequences` at `layer`, the
/// entries of sequence b at positions[b]. Each head's entry takes the slot
/// that kvc_append of one entry would give it, and
/// slots[b * num_kv_heads + h] receives the slot of kv-head h of sequence
/// b; num_pages (may be NULL), at the same index, the head's page-table
/// length after the append. `keys` and `values` hold batch x num_kv_heads
/// rows of dim floats (dim must equal head_dim) in that order: required on
/// host pools, NULL on device pools, as for kvc_append. All or nothing for
/// the whole batch: an unknown or repeated sequence, a head at its budget
/// (KVC_STATUS_OVER_BUDGET) or a pool without the pages the batch needs
/// (KVC_STATUS_POOL_EXHAUSTED) change nothing. The same as kvc_append on
/// every head in that order, with one lookup per sequence and no host
/// allocation once a batch of that size has stepped.
kvc_status_t kvc_append_step(kvc_context_t *context, int32_t layer,
                             int32_t batch, const uint64_t *sequences,
                             int32_t dim, const float *keys,
                             const float *values, const int32_t *positions,
                             int32_t *slots, int32_t *num_pages);

/// Evicts `count` distinct live slots of one head. A page whose slots are
/// all free is returned to the pool immediately (its page-table entry
/// becomes -1; slots of other pages keep their numbers).
kvc_status_t kvc_evict(kvc_context_t *context, uint64_t sequence, int32_t layer,
                       int32_t head, int32_t count, const int32_t *slots);

/// One renumbering performed by kvc_compact.
typedef struct kvc_move_t {
  int32_t from_slot; ///< Slot before compaction.
  int32_t to_slot;   ///< Slot after compaction.
  /// 1 when the entry's bytes must be copied from the old location to the
  /// new one (the runtime did it on host pools; on device pools the engine
  /// must, in the order given, before the next kernel reads the cache).
  /// 0 when only the page table changed. For KIVI, moves are whole blocks.
  int32_t copy_data;
  /// Page id and in-page slot of the old and new location. A page id is
  /// the pool page id, or for a low page of a mixed-precision context
  /// num_pages + pool page * low_pages_per_page + its index in the pool
  /// page (kvc_get_page gives its byte offset). Entries move only between
  /// pages of one class.
  int32_t from_page, from_offset, to_page, to_offset;
} kvc_move_t;

/// Releases nearly empty pages of one head: every mapped page with at most
/// max_occupancy * page_size live entries is emptied into free slots of
/// other pages of its class when they have room, then returned to the pool
/// (a low page to its pool page's free sub-pages), and holes in
/// the page table are closed. Every renumbered entry is reported in `moves`
/// (capacity `max_moves`; may be NULL on host pools when the caller does
/// not need them). When the array is too small nothing changes and
/// KVC_STATUS_BUFFER_TOO_SMALL reports the count needed in *num_moves.
kvc_status_t kvc_compact(kvc_context_t *context, uint64_t sequence,
                         int32_t layer, int32_t head, float max_occupancy,
                         kvc_move_t *moves, int32_t max_moves,
                         int32_t *num_moves, int32_t *pages_released);

/*===--------------------------------------------------------------------===*/
/* Attachments: backend state beside one (sequence, layer)                  */
/*===--------------------------------------------------------------------===*/

/// State a backend keeps beside the runtime's bookkeeping of one (sequence,
/// layer), such as device-resident copies of its slot tables and score
/// state that the backend updates in place of the host metadata, or
/// evictions the backend decided on the device and has not handed to the
/// runtime yet. The runtime owns an attached record and *settles* it before
/// any call that reads or changes that bookkeeping on the host: every
/// accessor of any head of the layer (kvc_get_num_entries,
/// kvc_get_num_slots, kvc_get_num_pages, kvc_get_page, kvc_get_page_format,
/// kvc_get_slot_location, kvc_get_metadata, kvc_read_entry,
/// kvc_kivi_pending_work), kvc_kivi_step_work and kvc_append_step (every
/// sequence of their batch), kvc_append, kvc_append_format, kvc_evict,
/// kvc_compact, kvc_set_budget and kvc_write_entry; kvc_pool_stats and
/// kvc_pool_check settle every record of the context. So every call reports
/// the cache as the backend left it. Settling detaches the record, calls
/// `flush` (which writes back what the record holds newer than the host
/// bookkeeping; it may call the runtime, which then sees no attachment, for
/// instance kvc_evict) and then `release`. A failed flush makes that call
/// fail with the flush's status and changes nothing else; the record is
/// released either way. Settling is the one change the accessors make to
/// their (const) context. kvc_sequence_remove and kvc_context_destroy
/// release records without flushing them.
typedef struct kvc_attachment_t {
  void *data;
  kvc_status_t (*flush)(void *data, kvc_context_t *context, uint64_t sequence,
                        int32_t layer); ///< May be NULL: nothing to write back.
  void (*release)(void *data);          ///< May be NULL: nothing to free.
} kvc_attachment_t;

/// Attaches `attachment` to (sequence, layer); a record attached there
/// before is settled first. When the call fails the caller still owns
/// `attachment`.
kvc_status_t kvc_attach(kvc_context_t *context, uint64_t sequence,
                        int32_t layer, const kvc_attachment_t *attachment);

/// Hands the record attached to (sequence, layer) back to the caller
/// without flushing or releasing it (*attachment is all NULL when there is
/// none); the caller owns it from then on.
kvc_status_t kvc_detach(kvc_context_t *context, uint64_t sequence,
                        int32_t layer, kvc_attachment_t *attachment);

/*===--------------------------------------------------------------------===*/
/* Accessors used by generated kernels                                      */
/*===--------------------------------------------------------------------===*/

/// Live entries of one head.
kvc_status_t kvc_get_num_entries(const kvc_context_t *context,
                                 uint64_t sequence, int32_t layer, int32_t head,
                                 int32_t *num_entries);

/// Slots of one head (page-table length x page_size), free ones included.
kvc_status_t kvc_get_num_slots(const kvc_context_t *context, uint64_t sequence,
                               int32_t layer, int32_t head, int32_t *num_slots);

/// Page-table length of one head (unmapped holes included).
kvc_status_t kvc_get_num_pages(const kvc_context_t *context, uint64_t sequence,
                               int32_t layer, int32_t head, int32_t *num_pages);

/// Pool page id of page-table entry `page` (-1 for a hole), its byte offset
/// in the pool (UINT64_MAX for a hole) and its address (pool + offset; NULL
/// for a hole). For a low page of a mixed-precision context, the pool page
/// that holds it and the offset and address of the low page itself. Any
/// output may be NULL.
kvc_status_t kvc_get_page(const kvc_context_t *context, uint64_t sequence,
                          int32_t layer, int32_t head, int32_t page,
                          int32_t *pool_page, uint64_t *byte_offset,
                          void **address);

/// The class of page-table entry `page`: the kvc_format_t its entries are
/// stored in (config.format, or config.low_format for a low page); -1 for
/// a hole.
kvc_status_t kvc_get_page_format(const kvc_context_t *context,
                                 uint64_t sequence, int32_t layer,
                                 int32_t head, int32_t page, int32_t *format);

/// Maps a slot to (page-table index, offset in page, pool page id).
kvc_status_t kvc_get_slot_location(const kvc_context_t *context,
                                   uint64_t sequence, int32_t layer,
                                   int32_t head, int32_t slot,
                                   int32_t *page_index, int32_t *page_offset,
                                   int32_t *pool_page);

/// Per-slot metadata arrays of one head, each num_slots long. `position`
/// is KVC_POSITION_NONE for a free slot; `score` (policy score state),
/// `weight` (merge weight, 1 for a fresh entry) and `history` (per-step bits
/// of a statistic, the latest step in bit 0; 0 for a fresh entry) may be
/// written by kernels; `key_format`/`value_format` hold kvc_format_t values (KIVI entries in
/// the residual window report KVC_FORMAT_FULL). The pointers stay valid
/// until the next mutating call on that head or its sequence.
typedef struct kvc_metadata_t {
  int32_t num_slots;
  const int32_t *position;
  float *score;
  float *weight;
  uint64_t *history;
  const uint8_t *key_format;
  const uint8_t *value_format;
} kvc_metadata_t;

/// Fills `metadata` for one head.
kvc_status_t kvc_get_metadata(kvc_context_t *context, uint64_t sequence,
                              int32_t layer, int32_t head,
                              kvc_metadata_t *metadata);

/// Reads one live entry as float32 (dequantizing); host pools only.
kvc_status_t kvc_read_entry(const kvc_context_t *context, uint64_t sequence,
                            int32_t layer, int32_t head, int32_t slot,
                            int32_t dim, float *key, float *value);

/// Overwrites one live entry (key and/or value; either may be NULL) in its
/// current storage format; host pools only. A KIVI key that was already
/// quantized is encoded with its block's existing parameters (clamped), so
/// the rest of the block is not disturbed.
kvc_status_t kvc_write_entry(kvc_context_t *context, uint64_t sequence,
                             int32_t layer, int32_t head, int32_t slot,
                             int32_t dim, const float *key, const float *value);

/// One full-precision KIVI row that device work reads or stages.
typedef struct kvc_kivi_row_t {
  int32_t slot;         ///< The entry's slot (as of the recording append).
  int32_t residual_row; ///< Its row in the head's residual window.
  /// Index of the entry among the `count` entries of the kvc_append call
  /// that recorded the work, or -1 when an earlier call appended it. An
  /// entry of the recording call is read from that call's float input row,
  /// first rounded to the context's dtype (what staging would have stored);
  /// an earlier one from its residual row (dtype elements).
  int32_t input;
} kvc_kivi_row_t;

/// KIVI state of one (sequence, layer, head) and the data work the latest
/// kvc_append on it implies. On host pools the runtime has already done the
/// work (the record only describes it); on device pools the engine's
/// kernels must do it, before anything reads the cache, in this order:
///  1. every value and every key block (they read full-precision rows and
///     write disjoint page bytes, so they may run in any order or at once):
///     a value quantizes its row per token over groups of G channels into
///     its slot's value row and value record; a key block quantizes the
///     keys of its members per channel over the members (one
///     kvc_kivi_quantize_keys call) into the members' key rows and the key
///     record of their block;
///  2. every stage: input row `input` of the call, rounded to dtype, into
///     residual key and value row `residual_row`.
/// Quantization and packing are those of kvc_kivi_quantize_keys and
/// kvc_kivi_quantize_value, so device bytes equal a host pool's. Pointers
/// stay valid until the next mutating call on that head or its sequence;
/// any other mutating call on the head (evict, compact) clears the record.
typedef struct kvc_kivi_work_t {
  /// Address (pool + residual_offset) and pool byte offset of the head's
  /// residual region: R key rows, then R value rows, of head_dim dtype
  /// elements each.
  void *residual;
  uint64_t residual_offset;
  int32_t residual_length; ///< R.
  /// Per residual row, the slot of the entry it holds, or -1 (free, or the
  /// entry was evicted). Entries whose key or value format is
  /// KVC_FORMAT_FULL are read from here.
  const int32_t *residual_slot;
  int32_t num_values;
  const kvc_kivi_row_t *values;
  /// Key block b has members key_members[key_block_begin[b] ..
  /// key_block_begin[b + 1]), in token order (num_key_blocks + 1 offsets).
  int32_t num_key_blocks;
  const int32_t *key_block_begin;
  const kvc_kivi_row_t *key_members;
  int32_t num_stages;
  const kvc_kivi_row_t *stages;
  /// Counts the changes of this record: one more with every call that
  /// records a new one (each append) or clears it (each kvc_evict of at
  /// least one entry, each kvc_compact), which are the only calls that
  /// change the residual window or the formats of its entries. Two readings
  /// whose serials differ by one saw exactly one such call: the recorded
  /// append when the record holds stages.
  uint64_t serial;
  /// The head's per-slot key and value formats (num_slots of each, as
  /// kvc_get_metadata gives them), so that which rows of the window are
  /// still read in full precision follows from the record alone.
  int32_t num_slots;
  const uint8_t *key_format;
  const uint8_t *value_format;
  /// Pool page id of each of the head's num_pages page-table entries (-1:
  /// a hole). Page id p starts at byte pages_offset + p * page_bytes of the
  /// pool (kvc_page_layout; a KIVI context has one page class), that is at
  /// (uint8_t *)residual - residual_offset + that offset.
  int32_t num_pages;
  const int32_t *pages;
} kvc_kivi_work_t;

/// Fills `work` for one head of a KIVI context (KVC_STATUS_UNSUPPORTED for
/// other formats). A query: it changes nothing. Every pointer in it stays
/// valid until the next call that changes the head (an append, an
/// eviction, a compaction, the sequence's removal).
kvc_status_t kvc_kivi_pending_work(const kvc_context_t *context,
                                   uint64_t sequence, int32_t layer,
                                   int32_t head, kvc_kivi_work_t *work);

/// kvc_kivi_pending_work for every kv-head of `batch` sequences in one
/// call (a decode step's, after kvc_append_step): works[b * num_kv_heads +
/// h] receives the record of kv-head h of sequences[b] in `layer`. Each
/// sequence is looked up once; all or nothing (nothing is written when an
/// argument is wrong).
kvc_status_t kvc_kivi_step_work(const kvc_context_t *context, int32_t layer,
                                int32_t batch, const uint64_t *sequences,
                                kvc_kivi_work_t *works);

/// One live entry competing for a budget that several heads share (a
/// global budget's select kernel): its score, original position, head
/// (layer * num_kv_heads + kv-head) and slot.
typedef struct kvc_candidate_t {
  float score;
  int32_t position;
  int32_t head;
  int32_t slot;
} kvc_candidate_t;

/// Moves the `keep` best of `count` candidates to the front, in no
/// particular order: higher score first; equal scores prefer the more
/// recent position (the older with prefer_recent 0), then the larger head.
/// The others, the victims, are sorted by head, then slot, so that each
/// head's victims are one run for kvc_evict. keep is clamped to [0, count].
kvc_status_t kvc_select_candidates(kvc_candidate_t *candidates,
                                   int64_t count, int64_t keep,
                                   int32_t prefer_recent);

/// Pool-wide page accounting.
typedef struct kvc_pool_stats_t {
  int32_t total_pages;  ///< config.num_pages.
  int32_t free_pages;   ///< Pages on the free list.
  /// Pool pages referenced by some page table (for mixed precision, pool
  /// pages with at least one low page in use count once).
  int32_t mapped_pages;
  int32_t num_sequences;
  int64_t live_entries; ///< Over all sequences, layers and heads.
  /// Mixed precision: pool pages serving the low class, and the low pages
  /// of those in use (both 0 for a context with one class).
  int32_t low_pool_pages;
  int32_t low_pages_used;
} kvc_pool_stats_t;

/// Fills pool-wide accounting figures.
kvc_status_t kvc_pool_stats(const kvc_context_t *context,
                            kvc_pool_stats_t *stats);

/// Verifies the bookkeeping invariants (every page either free or in
/// exactly one page table, live counts consistent, KIVI windows sane);
/// returns KVC_STATUS_INTERNAL with a description when one fails.
kvc_status_t kvc_pool_check(const kvc_context_t *context);

/*===--------------------------------------------------------------------===*/
/* Conversions (round to nearest even)                                      */
/*===--------------------------------------------------------------------===*/

/// float32 -> IEEE binary16 bits; overflow gives infinity, NaN stays NaN.
uint16_t kvc_f32_to_f16(float value);
/// IEEE binary16 bits -> float32 (exact).
float kvc_f16_to_f32(uint16_t bits);
/// float32 -> bfloat16 bits; NaN stays NaN.
uint16_t kvc_f32_to_bf16(float value);
/// bfloat16 bits -> float32 (exact).
float kvc_bf16_to_f32(uint16_t bits);
/// float32 -> fp8 e4m3 bits, saturating to +-448; NaN gives 0x7F.
uint8_t kvc_f32_to_fp8_e4m3(float value);
/// fp8 e4m3 bits -> float32 (exact); 0x7F/0xFF give NaN.
float kvc_fp8_e4m3_to_f32(uint8_t bits);

/*===--------------------------------------------------------------------===*/
/* Quantization primitives (the page formats are built from these)          */
/*===--------------------------------------------------------------------===*/

/// Packs n codes of `bits` (2, 4 or 8) bits into ceil(n * bits / 8) bytes.
/// Code j goes to byte j * bits / 8 at bit offset (j * bits) % 8, counted
/// from the least significant bit: for 4 bits byte = c0 | c1 << 4, for 2
/// bits byte = c0 | c1 << 2 | c2 << 4 | c3 << 6. Codes must fit in `bits`.
kvc_status_t kvc_pack_bits(const uint8_t *codes, int64_t n, int32_t bits,
                           uint8_t *packed);

/// Inverse of kvc_pack_bits.
kvc_status_t kvc_unpack_bits(const uint8_t *packed, int64_t n, int32_t bits,
                             uint8_t *codes);

/// Asymmetric uniform quantization of n values (one group) to `bits` (2, 4
/// or 8): min = min x, scale = (max x - min) / (2^bits - 1), code =
/// rne((x - min) / scale) clamped to [0, 2^bits - 1] (0 when scale is 0).
/// Writes unpacked codes (one per byte). |x - dequant| <= scale / 2.
/// Like every quantizer below, rejects non-finite input.
kvc_status_t kvc_quantize_asym(const float *x, int64_t n, int32_t bits,
                               uint8_t *codes, float *scale, float *min);

/// x = code * scale + min.
kvc_status_t kvc_dequantize_asym(const uint8_t *codes, int64_t n, float scale,
                                 float min, float *x);

/// KIVI keys: `tokens` x `dim` rows quantized per channel over all the
/// given tokens (one KIVI block). Codes are packed per token row (row t at
/// t * dim * bits / 8); scales and mins have `dim` entries, f16
/// values as kvc_kivi_quantize_value rounds them.
kvc_status_t kvc_kivi_quantize_keys(const float *keys, int32_t tokens,
                                    int32_t dim, int32_t bits, uint8_t *packed,
                                    float *scales, float *mins);

/// Inverse of kvc_kivi_quantize_keys.
kvc_status_t kvc_kivi_dequantize_keys(const uint8_t *packed, int32_t tokens,
                                      int32_t dim, int32_t bits,
                                      const float *scales, const float *mins,
                                      float *keys);

/// KIVI value: one token of `dim` channels quantized per group of `group`
/// channels; dim * bits / 8 packed bytes, dim / group scales and mins.
/// A page stores each {scale, min} pair as two f16 (IEEE half), so both
/// are f16 values: min is the group's least value rounded down to f16,
/// scale = (max - min) / (2^bits - 1) (float32 arithmetic) rounded up to
/// f16 (both saturate at +-65504), and codes are rne((x - min) / scale)
/// clamped to [0, 2^bits - 1] (0 when scale is 0). Every value within the
/// f16 range (|x| <= 65504: any value of an f16 pool) lies in
/// [min, min + (2^bits - 1) * scale], so |x - dequant| <= scale / 2, with
/// scale at most 2^-10 of itself above kvc_quantize_asym's (plus an f16
/// step of min over 2^bits - 1). A group with a value beyond +-65504 (of a
/// bf16 or f32 pool) may not be spanned: its values are clamped to
/// [min, min + (2^bits - 1) * scale] of the saturated record.
kvc_status_t kvc_kivi_quantize_value(const float *value, int32_t dim,
                                     int32_t group, int32_t bits,
                                     uint8_t *packed, float *scales,
                                     float *mins);

/// Inverse of kvc_kivi_quantize_value.
kvc_status_t kvc_kivi_dequantize_value(const uint8_t *packed, int32_t dim,
                                       int32_t group, int32_t bits,
                                       const float *scales, const float *mins,
                                       float *value);

/// int8 symmetric per vector: scale = max|x| / 127 (0 for a zero vector),
/// q = rne(x / scale) in [-127, 127]. |x - q * scale| <= scale / 2.
kvc_status_t kvc_quantize_int8(const float *x, int64_t n, int8_t *q,
                               float *scale);

/// x = q * scale.
kvc_status_t kvc_dequantize_int8(const int8_t *q, int64_t n, float scale,
                                 float *x);

/// fp8 e4m3 per vector: scale = max|x| / 448 (1 for a zero vector), q =
/// e4m3(x / scale). Relative error <= 2^-4 for |x / scale| >= 2^-6, absolute
/// error <= 2^-10 * scale below.
kvc_status_t kvc_quantize_fp8_e4m3(const float *x, int64_t n, uint8_t *q,
                                   float *scale);

/// x = e4m3(q) * scale.
kvc_status_t kvc_dequantize_fp8_e4m3(const uint8_t *q, int64_t n, float scale,
                                     float *x);

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* KVC_RUNTIME_KVC_RUNTIME_H */
