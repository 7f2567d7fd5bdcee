//===- runtime_bench.cpp - the runtime's host work per decode step --------===//
//
// Times what a decode step of the CUDA backend asks of the runtime for every
// kv-head of its batch, on the CPU alone (a device pool: the runtime keeps
// the bookkeeping and never touches the pool's bytes):
//  - append: kvc_get_num_slots, then kvc_append of one entry without data
//    (the generated _decode_batch's slot allocation);
//  - step: kvc_get_num_slots per head and one kvc_append_step for the
//    whole batch (what _decode_batch calls);
//  - +evict: either, then kvc_evict of one live entry per head chosen at
//    random (what a budgeted policy's step costs once the victims of the
//    step before come back: the next append reuses the freed slot).
// Batch {1, 8, 32} sequences of 8 kv-heads, head dim 128, f16, pages of 64
// entries, contexts of 1k, 4k and 32k entries per head. Prints nanoseconds
// per head and step, and the ratio of the per-head appends to the batched
// ones measured in the same run.
// Then the check of a batch's sequence list that every generated
// decode_batch entry point makes first (kvc_check_batch) against the
// pairwise loop the entry points ran before, at batch 8 to 1024:
// nanoseconds per call and their ratio.
// Usage: kvc-bench-runtime [min_seconds_per_cell] (default 0.2).
//
//===----------------------------------------------------------------------===//

#include "runtime/kvc_runtime.h"

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <vector>

namespace {

constexpr int kKvHeads = 8, kDim = 128, kPageSize = 64;

void check(kvc_status_t status, const char *what) {
  if (status != KVC_STATUS_OK) {
    std::fprintf(stderr, "kvc-bench-runtime: %s: %s\n", what,
                 kvc_last_error());
    std::exit(1);
  }
}

/// A device-pool context of `batch` sequences with `n` entries in every
/// kv-head of its one layer. The pool is address space only: the runtime
/// does not read or write a device pool's pages.
struct Cache {
  kvc_context_t *context = nullptr;
  void *pool = nullptr;
  Cache(int batch, int n) {
    kvc_config_t config{};
    config.num_layers = 1;
    config.num_q_heads = kKvHeads;
    config.num_kv_heads = kKvHeads;
    config.head_dim = kDim;
    config.dtype = KVC_DTYPE_F16;
    config.format = KVC_FORMAT_FULL;
    config.low_format = KVC_FORMAT_FULL;
    config.memory = KVC_MEMORY_DEVICE;
    config.page_size = kPageSize;
    config.num_pages = batch * kKvHeads * (n / kPageSize + 4);
    config.max_sequences = batch;
    uint64_t bytes = 0;
    check(kvc_pool_bytes_required(&config, &bytes), "kvc_pool_bytes_required");
    if (posix_memalign(&pool, KVC_POOL_ALIGNMENT, bytes) != 0) {
      std::fprintf(stderr, "kvc-bench-runtime: cannot reserve the pool\n");
      std::exit(1);
    }
    check(kvc_context_create(&config, pool, bytes, &context),
          "kvc_context_create");
    std::vector<int32_t> positions(n);
    for (int i = 0; i < n; ++i)
      positions[i] = i;
    for (int b = 0; b < batch; ++b) {
      check(kvc_sequence_add(context, b), "kvc_sequence_add");
      for (int h = 0; h < kKvHeads; ++h)
        check(kvc_append(context, b, 0, h, n, kDim, nullptr, nullptr,
                         positions.data(), nullptr),
              "kvc_append");
    }
  }
  ~Cache() {
    kvc_context_destroy(context);
    std::free(pool);
  }
};

/// Nanoseconds per (head, step) of `steps` steps over the batch, repeated
/// until `minSeconds` passed; `batched`: the appends of a step in one
/// kvc_append_step.
double timeCell(int batch, int n, bool evict, bool batched,
                double minSeconds) {
  Cache cache(batch, n);
  std::mt19937 rng(7);
  int32_t position = n;
  std::vector<uint64_t> sequences(batch);
  std::vector<int32_t> positions(batch), stepSlots(batch * kKvHeads),
      stepPages(batch * kKvHeads);
  for (int b = 0; b < batch; ++b)
    sequences[b] = static_cast<uint64_t>(b);
  auto step = [&] {
    if (batched) {
      int32_t maxSlots = 0;
      for (int b = 0; b < batch; ++b)
        for (int h = 0; h < kKvHeads; ++h) {
          int32_t slots = 0;
          check(kvc_get_num_slots(cache.context, b, 0, h, &slots),
                "kvc_get_num_slots");
          maxSlots = slots > maxSlots ? slots : maxSlots;
        }
      for (int b = 0; b < batch; ++b)
        positions[b] = position;
      check(kvc_append_step(cache.context, 0, batch, sequences.data(), kDim,
                            nullptr, nullptr, positions.data(),
                            stepSlots.data(), stepPages.data()),
            "kvc_append_step");
    }
    for (int b = 0; b < batch; ++b)
      for (int h = 0; h < kKvHeads; ++h) {
        if (!batched) {
          int32_t slots = 0, slot = 0;
          check(kvc_get_num_slots(cache.context, b, 0, h, &slots),
                "kvc_get_num_slots");
          check(kvc_append(cache.context, b, 0, h, 1, kDim, nullptr, nullptr,
                           &position, &slot),
                "kvc_append");
        }
        if (!evict)
          continue;
        // A live victim: every slot below n + 1 is live after the append.
        const int32_t victim = static_cast<int32_t>(rng() % (n + 1));
        check(kvc_evict(cache.context, b, 0, h, 1, &victim), "kvc_evict");
      }
    ++position;
  };
  for (int i = 0; i < 16; ++i)
    step();
  int64_t steps = 0;
  double seconds = 0.0;
  const int perRound = 64;
  while (seconds < minSeconds) {
    const auto start = std::chrono::steady_clock::now();
    for (int i = 0; i < perRound; ++i)
      step();
    seconds += std::chrono::duration<double>(
                   std::chrono::steady_clock::now() - start)
                   .count();
    steps += perRound;
    if (evict)
      continue;
    // Untimed: the round's entries (slots n .. n + perRound + 15 after the
    // warm-up) leave again, so that every round starts at the same context.
    std::vector<int32_t> tail;
    for (int32_t s = n; s < position; ++s)
      tail.push_back(s);
    for (int b = 0; b < batch; ++b)
      for (int h = 0; h < kKvHeads; ++h)
        check(kvc_evict(cache.context, b, 0, h, int32_t(tail.size()),
                        tail.data()),
              "kvc_evict");
    position = n;
  }
  return 1e9 * seconds / (double(steps) * batch * kKvHeads);
}

/// The sequence check of the generated decode_batch entry points before
/// kvc_check_batch: every pair, in the entry point.
int pairwiseRepeat(int32_t batch, const uint64_t *sequences) {
  for (int32_t b = 1; b < batch; ++b)
    for (int32_t c = 0; c < b; ++c)
      if (sequences[b] == sequences[c])
        return b;
  return batch;
}

/// Nanoseconds per call of `check` over `minSeconds` or more.
template <typename Check> double timeCheck(Check check, double minSeconds) {
  using Clock = std::chrono::steady_clock;
  volatile int64_t sink = 0;
  int64_t calls = 0;
  const auto start = Clock::now();
  double seconds = 0;
  do {
    for (int i = 0; i < 64; ++i)
      sink = sink + check();
    calls += 64;
    seconds = std::chrono::duration<double>(Clock::now() - start).count();
  } while (seconds < minSeconds);
  return 1e9 * seconds / double(calls);
}

} // namespace

int main(int argc, char **argv) {
  const double minSeconds = argc > 1 ? std::atof(argv[1]) : 0.2;
  if (!(minSeconds > 0)) {
    std::fprintf(stderr, "usage: kvc-bench-runtime [min_seconds_per_cell]\n");
    return 2;
  }
  std::printf("kvc runtime: host work per kv-head of a decode step (device "
              "pool, %d kv-heads, head dim %d, f16, pages of %d), one "
              "thread\n",
              kKvHeads, kDim, kPageSize);
  std::printf("append = kvc_get_num_slots + kvc_append (1 entry) per head; "
              "step = kvc_get_num_slots per head + one kvc_append_step for "
              "the batch; +evict = the same + kvc_evict (1 random live entry) "
              "per head\n\n");
  std::printf("%3s %7s | %12s %12s %6s | %12s %12s %6s\n", "B", "context",
              "append ns/hd", "step ns/hd", "ratio", "+evict ns/hd",
              "step+ev ns/hd", "ratio");
  for (int batch : {1, 8, 32})
    for (int n : {1024, 4096, 32768}) {
      const double append = timeCell(batch, n, false, false, minSeconds);
      const double step = timeCell(batch, n, false, true, minSeconds);
      const double evict = timeCell(batch, n, true, false, minSeconds);
      const double stepEvict = timeCell(batch, n, true, true, minSeconds);
      std::printf("%3d %7d | %12.1f %12.1f %5.2fx | %12.1f %12.1f %5.2fx\n",
                  batch, n, append, step, append / step, evict, stepEvict,
                  evict / stepEvict);
      std::fflush(stdout);
    }

  std::printf("\nsequence list check of a decode_batch call (distinct "
              "sequences, the list of a passing call): kvc_check_batch "
              "against the pairwise loop before it\n\n");
  std::printf("%5s | %12s %12s %8s\n", "B", "pairwise ns", "check ns",
              "ratio");
  for (int batch : {8, 32, 128, 256, 1024}) {
    std::vector<uint64_t> sequences(batch);
    std::mt19937_64 rng(batch);
    for (uint64_t &id : sequences)
      id = rng(); // distinct with overwhelming probability; checked below
    if (pairwiseRepeat(batch, sequences.data()) != batch)
      return 1;
    const double pairwise = timeCheck(
        [&] { return pairwiseRepeat(batch, sequences.data()); }, minSeconds);
    const double checked = timeCheck(
        [&] {
          return static_cast<int>(
              kvc_check_batch("bench", batch, sequences.data()));
        },
        minSeconds);
    std::printf("%5d | %12.1f %12.1f %7.2fx\n", batch, pairwise, checked,
                pairwise / checked);
    std::fflush(stdout);
  }
  return 0;
}
