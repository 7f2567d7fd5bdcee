//===- CudaEmu.cpp - Fibers and runtime API of the CUDA emulator ----------===//
//
// The scheduler that runs the threads of a block as fibers, and the subset
// of the CUDA runtime API that kvc's CUDA code and its tests call, over
// host memory. See kvc_cuda_emu.h for what the emulator does and does not
// check.
//
//===----------------------------------------------------------------------===//

#include "kvc_cuda_emu.h"
#include "MmaTiles.h"

#include <link.h>
#include <pthread.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <new>
#include <string>
#include <thread>
#include <vector>

#if __has_include(<valgrind/callgrind.h>)
#include <valgrind/callgrind.h>
#define KVC_EMU_CALLGRIND 1
#endif

#if defined(__SANITIZE_ADDRESS__)
#include <sanitizer/asan_interface.h>
#include <sanitizer/common_interface_defs.h>
#endif

#if !defined(__x86_64__)
#error "the CUDA emulator switches fibers with x86-64 code"
#endif

// kvc_emu_switch(from, to): saves the callee-saved registers on the current
// stack, stores the stack pointer in *from, and resumes the fiber whose
// stack pointer is `to`. The floating-point control words are not switched:
// no kernel changes them.
extern "C" void kvc_emu_switch(void **from, void *to);
asm(R"(
  .text
  .globl kvc_emu_switch
  .type kvc_emu_switch, @function
kvc_emu_switch:
  pushq %rbp
  pushq %rbx
  pushq %r12
  pushq %r13
  pushq %r14
  pushq %r15
  movq %rsp, (%rdi)
  movq %rsi, %rsp
  popq %r15
  popq %r14
  popq %r13
  popq %r12
  popq %rbx
  popq %rbp
  ret
  .size kvc_emu_switch, .-kvc_emu_switch
  .section .note.GNU-stack,"",@progbits
)");

namespace kvc::emu {

uint3 threadIndex;
uint3 blockIndex;
Counters counterValues;
const Counters &counters() { return counterValues; }

/// Events: the number of the last record, the records that a wait covered
/// (every record up to it), and whether records are held (holdEvents).
uint64_t lastRecord = 0, finishedRecords = 0;
bool eventsHeld = false;
/// Host-to-device copies from pinned memory queued while events are held
/// and not known to have run: the source and the number of the last record
/// before the copy (the stream's next record covers it).
struct PendingSource {
  const char *begin;
  size_t bytes;
  uint64_t before;
};
std::vector<PendingSource> pendingSources;
void holdEvents(bool hold) {
  eventsHeld = hold;
  if (!hold) {
    finishedRecords = lastRecord;
    pendingSources.clear();
  }
}
dim3 blockDimension;
dim3 gridDimension;

namespace {

constexpr int kWarpSize = 32;
constexpr size_t kStackBytes = 256 * 1024;
constexpr unsigned kFullMask = 0xffffffffu;

/// AtGridWait: at awaitPriorGrids, in a kernel launched as a programmatic
/// dependent whose block still reads memory as it was before the kernel
/// ahead of it ran (PriorWrites).
enum class State { Runnable, AtBlockBarrier, AtWarpBarrier, AtGridWait, Done };

/// What a primary kernel (the kernel ahead of a programmatic dependent in
/// its stream) changed in device memory: the ranges it changed, and for
/// each the bytes of the view that memory does not show now. show(true)
/// puts the bytes from before the primary ran back in place, show(false)
/// its results; each exchanges the two, so that what a dependent writes
/// in either view stays with that view.
struct PriorWrites {
  struct Range {
    char *at;
    size_t bytes;
    size_t offset; // into `other`
  };
  std::vector<Range> ranges;
  std::vector<char> other;
  bool before = false; // memory shows the bytes from before the primary
  void show(bool wantBefore) {
    if (before == wantBefore)
      return;
    for (const Range &r : ranges)
      std::swap_ranges(r.at, r.at + r.bytes, other.data() + r.offset);
    before = wantBefore;
  }
};

/// An asynchronous copy into shared memory (copyAsync), performed when a
/// wait covers its group: as late as the device may perform it, so that a
/// kernel reading a tile before its wait, or before the barrier after the
/// other threads' waits, reads stale bytes and fails its test.
struct AsyncCopy {
  void *dst;
  const void *src;
  int bytes;
  int group; // -1 until committed
};

struct Fiber {
  void *stack = nullptr; // saved stack pointer while switched out
  State state = State::Runnable;
  uint3 index{};
  int linear = 0;
  int parity = 0; // which of the two word buffers the next collective uses
  std::vector<AsyncCopy> copies;
  int committed = 0; // groups committed so far
};

struct Exchange;

struct BlockRun {
  const char *file = nullptr;
  int line = 0;
  const char *kernel = nullptr;
  const std::function<void()> *body = nullptr;
  std::vector<Fiber> fibers;
  // Per warp: lanes not ended, and lanes waiting at a warp barrier.
  std::vector<int> liveLanes, waitingLanes;
  // Per warp: the barriers opened so far, and the barrier whose shared
  // result (publishShared) has been formed.
  std::vector<uint64_t> opened, formed;
  // Two exchange words per thread, used alternately by successive warp
  // collectives: a lane that runs ahead into its next collective writes the
  // other buffer, so the words of this one stay valid for the slower lanes
  // until they too pass the next barrier.
  std::vector<uint64_t> words[2];
  // The same for publishWords, kPublishWords per thread, and the warps'
  // results of publishShared (`exchanges`, one set per block slot).
  // publishWords shares the lanes' parity with publish: a lane can be at
  // most one collective ahead of the slowest, whichever kind each is.
  Exchange *exchange = nullptr;
  void *scheduler = nullptr;   // the scheduler's saved stack pointer
  // The scheduler's stack (the calling thread's), for AddressSanitizer.
  const void *schedulerBottom = nullptr;
  size_t schedulerBytes = 0;
  Fiber *current = nullptr;
  // KVC_EMU_THREAD_ORDER=reverse: warps from the last, lanes from the
  // highest.
  bool reverseThreads = false;
  // The fibers' stacks (one of StackPool's sets).
  std::vector<char *> *stacks = nullptr;
  // The block's index, and with blocks in flight
  // (KVC_EMU_CONCURRENT_BLOCKS): whether it has started, and whether an
  // atomic asks it to pause at its next barrier.
  uint3 index{};
  bool started = false, pauseAsked = false;
  // Whether other blocks are in flight beside it (runConcurrent).
  bool inFlight = false;
  // A programmatic dependent's launch: what the primary wrote, and whether
  // the block has passed awaitPriorGrids (every thread that waits there
  // goes on once no other live thread of the block can run before its own
  // wait). Until then the block reads memory as it was before the primary.
  PriorWrites *prior = nullptr;
  bool waited = true;
};

/// Shows `run`'s block the memory it reads now: from before its launch's
/// primary until the block has passed awaitPriorGrids, the primary's
/// results after.
void showMemory(BlockRun &run) {
  if (run.prior)
    run.prior->show(!run.waited);
}

BlockRun *active = nullptr;

/// The buffers of publishWords and publishShared for a block in flight:
/// kPublishWords words per thread twice, kSharedWords per warp. Kept from
/// launch to launch and only grown: a collective reads only the words its
/// lanes have just written.
struct Exchange {
  std::vector<uint64_t> wide[2];
  std::vector<uint64_t> shared;
  void fit(uint64_t threads) {
    const size_t words = static_cast<size_t>(threads) * kPublishWords;
    for (std::vector<uint64_t> &w : wide)
      if (w.size() < words)
        w.resize(words);
    const size_t results =
        static_cast<size_t>((threads + kWarpSize - 1) / kWarpSize) *
        kSharedWords;
    if (shared.size() < results)
      shared.resize(results);
  }
};
std::vector<Exchange> exchanges;

/// The fibers' stacks, one set per block in flight, reused by every
/// launch, freed at exit.
struct StackPool {
  std::vector<std::vector<char *>> sets;
  ~StackPool() {
    for (std::vector<char *> &set : sets)
      for (char *stack : set)
        ::operator delete(stack, std::align_val_t(64));
  }
};
StackPool pool;

/// Switches from the running context to the one whose saved stack pointer
/// is `to` and whose stack is [bottom, bottom + bytes). Under
/// AddressSanitizer the switch is announced, so that it tracks the stack in
/// use; `ending` marks the last switch out of a fiber that has ended.
void transfer(void **save, void *to, const void *bottom, size_t bytes,
              bool ending = false) {
#if defined(__SANITIZE_ADDRESS__)
  void *fake = nullptr;
  __sanitizer_start_switch_fiber(ending ? nullptr : &fake, bottom, bytes);
  kvc_emu_switch(save, to);
  __sanitizer_finish_switch_fiber(fake, nullptr, nullptr);
#else
  (void)bottom;
  (void)bytes;
  (void)ending;
  kvc_emu_switch(save, to);
#endif
}

const void *stackOf(const Fiber &f);
cudaError_t lastError = cudaSuccess;

[[noreturn]] void fatal(const char *what) {
  const Fiber *f = active ? active->current : nullptr;
  std::fprintf(stderr,
               "kvc CUDA emulator: %s\n  launched at %s:%d\n  kernel: %s\n"
               "  block (%u, %u, %u)",
               what, active ? active->file : "?", active ? active->line : 0,
               active ? active->kernel : "?",
               blockIndex.x, blockIndex.y, blockIndex.z);
  if (f)
    std::fprintf(stderr, ", thread (%u, %u, %u)", f->index.x, f->index.y,
                 f->index.z);
  std::fprintf(stderr, "\n");
  if (const char *order = std::getenv("KVC_EMU_BLOCK_ORDER"); order && *order)
    std::fprintf(stderr, "  block order: %s\n", order);
  if (const char *order = std::getenv("KVC_EMU_THREAD_ORDER");
      order && *order)
    std::fprintf(stderr, "  thread order: %s\n", order);
  if (const char *flight = std::getenv("KVC_EMU_CONCURRENT_BLOCKS");
      flight && *flight)
    std::fprintf(stderr, "  blocks in flight: %s\n", flight);
  std::fflush(stderr);
  std::_Exit(3);
}

/// The calling fiber has just changed state (reached a barrier or ended):
/// opens its warp's barrier if every live lane waits at it, then passes
/// control to the next runnable lane of the warp (the caller itself, last;
/// the next lower one first under a reverse thread order) or, when none
/// is, back to the scheduler.
void block() {
  BlockRun &run = *active;
  Fiber *self = run.current;
  const int begin = self->linear / kWarpSize * kWarpSize;
  const int end =
      std::min(begin + kWarpSize, static_cast<int>(run.fibers.size()));
  const int warp = begin / kWarpSize;
  if (self->state == State::Done)
    --run.liveLanes[warp];
  else if (self->state == State::AtWarpBarrier)
    ++run.waitingLanes[warp];
  if (run.waitingLanes[warp] > 0 &&
      run.waitingLanes[warp] == run.liveLanes[warp]) {
    for (int i = begin; i < end; ++i)
      if (run.fibers[i].state == State::AtWarpBarrier)
        run.fibers[i].state = State::Runnable;
    run.waitingLanes[warp] = 0;
    ++run.opened[warp];
  }
  const int width = end - begin;
  const int stride = run.reverseThreads ? width - 1 : 1;
  for (int step = 1; step <= width; ++step) {
    Fiber &next =
        run.fibers[begin + (self->linear - begin + step * stride) % width];
    if (next.state != State::Runnable)
      continue;
    if (&next == self)
      return; // released by its own arrival: runs on
    run.current = &next;
    threadIndex = next.index;
    transfer(&self->stack, next.stack, stackOf(next), kStackBytes,
             self->state == State::Done);
    return;
  }
  run.current = nullptr;
  transfer(&self->stack, run.scheduler, run.schedulerBottom,
           run.schedulerBytes, self->state == State::Done);
}

[[noreturn]] void fiberEntry() {
#if defined(__SANITIZE_ADDRESS__)
  __sanitizer_finish_switch_fiber(nullptr, nullptr, nullptr);
#endif
  (*active->body)();
  // Copies still in flight at exit complete all the same.
  waitCopies(0);
  active->current->state = State::Done;
  block();
  __builtin_unreachable();
}

void *initialStack(char *base, int thread) {
  // The stacks start at different offsets within a page so that the hot
  // tops of a warp's stacks fall into different cache sets (equal offsets
  // would make the 32 lanes of a warp evict each other at every switch).
  const size_t color = static_cast<size_t>(thread % 64) * 64 * 7 % 4096 +
                       static_cast<size_t>(thread / 64 % 8) * 4096;
  // The frame kvc_emu_switch pops: six registers, the return address
  // (fiberEntry), then a null frame so that fiberEntry starts with the
  // stack alignment of a called function.
  auto *top = reinterpret_cast<uint64_t *>(base + kStackBytes - color);
  uint64_t *sp = top - 8;
  for (int r = 0; r < 6; ++r)
    sp[r] = 0;
  sp[6] = reinterpret_cast<uint64_t>(&fiberEntry);
  sp[7] = 0;
  return sp;
}

const void *stackOf(const Fiber &f) { return (*active->stacks)[f.linear]; }

/// Runs the lanes of warp [begin, end) until none is runnable: the lanes
/// pass control among themselves (block()) and return here when the warp
/// waits at __syncthreads, has ended, or is stuck.
void runWarp(BlockRun &run, int begin, int end) {
  for (int k = begin; k < end; ++k) {
    Fiber &f = run.fibers[run.reverseThreads ? begin + end - 1 - k : k];
    if (f.state != State::Runnable)
      continue;
    run.current = &f;
    threadIndex = f.index;
    transfer(&run.scheduler, f.stack, stackOf(f), kStackBytes);
  }
}

/// Makes every thread of the block runnable from the kernel's start.
void startBlock(BlockRun &run) {
  const int threads = static_cast<int>(run.fibers.size());
  std::vector<char *> &stacks = *run.stacks;
  while (stacks.size() < run.fibers.size())
    stacks.push_back(static_cast<char *>(
        ::operator new(kStackBytes, std::align_val_t(64))));
  for (int i = 0; i < threads; ++i) {
    Fiber &f = run.fibers[i];
    const unsigned u = static_cast<unsigned>(i);
    f.state = State::Runnable;
    f.linear = i;
    f.parity = 0;
    f.copies.clear();
    f.committed = 0;
    f.index = uint3{u % blockDimension.x, u / blockDimension.x % blockDimension.y,
                    u / (blockDimension.x * blockDimension.y)};
#if defined(__SANITIZE_ADDRESS__)
    // A stack reused from an earlier block may still carry the poisoned
    // redzones of frames that never returned.
    ASAN_UNPOISON_MEMORY_REGION(stacks[i], kStackBytes);
#endif
    f.stack = initialStack(stacks[i], i);
  }
  const int warps = (threads + kWarpSize - 1) / kWarpSize;
  run.liveLanes.assign(warps, 0);
  run.waitingLanes.assign(warps, 0);
  run.opened.assign(warps, 0);
  run.formed.assign(warps, 0);
  for (int i = 0; i < threads; ++i)
    ++run.liveLanes[i / kWarpSize];
  run.waited = run.prior == nullptr;
}

/// Runs the block's warps one by one, each until it waits at
/// __syncthreads or ends, then opens that barrier (every live thread waits
/// at it): false once every thread has ended.
bool runPhase(BlockRun &run) {
  const int threads = static_cast<int>(run.fibers.size());
  const int warps = (threads + kWarpSize - 1) / kWarpSize;
  for (;;) {
    for (int k = 0; k < warps; ++k) {
      const int w = kWarpSize * (run.reverseThreads ? warps - 1 - k : k);
      runWarp(run, w, std::min(w + kWarpSize, threads));
    }
    // No thread can run on: those at awaitPriorGrids go on, and from now
    // the block reads the primary's results (a thread still short of its
    // wait waits at a barrier or collective that a waiting thread must
    // reach first, or never waits).
    bool waiting = false;
    for (Fiber &f : run.fibers)
      if (f.state == State::AtGridWait) {
        f.state = State::Runnable;
        waiting = true;
      }
    if (!waiting)
      break;
    run.waited = true;
    showMemory(run);
  }
  run.current = nullptr;
  bool live = false, ready = true;
  for (Fiber &f : run.fibers) {
    if (f.state == State::Done)
      continue;
    live = true;
    if (f.state != State::AtBlockBarrier && !run.current)
      run.current = &f;
    ready &= f.state == State::AtBlockBarrier;
  }
  if (!live)
    return false;
  if (!ready)
    fatal("deadlock: a thread waits at a warp barrier or collective that "
          "a live lane of its warp never reaches (it waits at "
          "__syncthreads or has exited)");
  for (Fiber &f : run.fibers)
    if (f.state == State::AtBlockBarrier)
      f.state = State::Runnable;
  return true;
}

void waitAt(State barrier) {
  active->current->state = barrier;
  block();
}

void checkMask(unsigned mask) {
  if (mask != kFullMask)
    fatal("warp collective with a partial mask (the emulator runs full warps "
          "only)");
}

} // namespace

void syncBlock() {
  if (!active || !active->current)
    fatal("__syncthreads outside a kernel");
  waitAt(State::AtBlockBarrier);
}

void syncWarp(unsigned mask) {
  if (!active || !active->current)
    fatal("__syncwarp outside a kernel");
  checkMask(mask);
  waitAt(State::AtWarpBarrier);
}

int laneId() { return active->current->linear % kWarpSize; }

void awaitPriorGrids() {
  if (!active || !active->current)
    fatal("awaitPriorGrids outside a kernel");
  if (!active->waited)
    waitAt(State::AtGridWait);
}

void releaseDependents() {
  if (!active || !active->current)
    fatal("releaseDependents outside a kernel");
  if (!active->waited)
    fatal("releaseDependents before awaitPriorGrids in a programmatic "
          "dependent that started early: its own dependents could start "
          "before the kernel ahead of it has ended, which the emulator does "
          "not model");
}

namespace {
/// Bytes of the program's own thread-local block (PT_TLS of the
/// executable, rounded up to its alignment): the thread-local __shared__
/// variables of kvc_cuda_emu.h. 0 without one.
size_t programTlsBytes() {
  static const size_t bytes = [] {
    size_t found = 0;
    dl_iterate_phdr(
        [](dl_phdr_info *info, size_t, void *out) {
          if (info->dlpi_tls_modid != 1)
            return 0;
          for (int i = 0; i < info->dlpi_phnum; ++i) {
            const ElfW(Phdr) &h = info->dlpi_phdr[i];
            if (h.p_type == PT_TLS) {
              const size_t align = h.p_align ? h.p_align : 1;
              *static_cast<size_t *>(out) =
                  (h.p_memsz + align - 1) / align * align;
              return 1;
            }
          }
          return 0;
        },
        &found);
    return found;
  }();
  return bytes;
}

/// Whether `address` is in the calling thread's shared memory: the
/// program's thread-local block, which on x86-64 ends at the thread
/// pointer.
bool inSharedMemory(const void *address) {
  const auto at = reinterpret_cast<uintptr_t>(address);
  const auto end = reinterpret_cast<uintptr_t>(__builtin_thread_pointer());
  return at < end && at >= end - programTlsBytes();
}
} // namespace

void afterAtomic(const void *address) {
  if (active && !inSharedMemory(address))
    active->pauseAsked = true;
}

void awaitOthers() {
  if (!active || !active->inFlight)
    fatal("a block waits for a count that other blocks write, but blocks run "
          "one at a time (the count's blocks started after it, or never)");
  active->pauseAsked = true;
}

namespace {
std::mutex prefetchMutex;
std::vector<const void *> *prefetchLog = nullptr;
} // namespace

void prefetch(const void *address) {
  std::lock_guard<std::mutex> lock(prefetchMutex);
  if (prefetchLog)
    prefetchLog->push_back(address);
}

void setPrefetchLog(std::vector<const void *> *log) {
  std::lock_guard<std::mutex> lock(prefetchMutex);
  prefetchLog = log;
}

void discard(void *line) {
  if (reinterpret_cast<uintptr_t>(line) % 128 != 0)
    fatal("discard of a line that is not 128-byte aligned");
  if (inSharedMemory(line))
    fatal("discard of shared memory");
  std::memset(line, 0xff, 128);
}

void copyAsync(void *shared, const void *global, int bytes) {
  if (bytes != 4 && bytes != 8 && bytes != 16)
    fatal("copyAsync of other than 4, 8 or 16 bytes");
  if (reinterpret_cast<uintptr_t>(shared) % bytes != 0 ||
      reinterpret_cast<uintptr_t>(global) % bytes != 0)
    fatal("copyAsync with a misaligned address");
  active->current->copies.push_back(AsyncCopy{shared, global, bytes, -1});
}

void commitCopies() {
  Fiber &f = *active->current;
  for (AsyncCopy &c : f.copies)
    if (c.group < 0)
      c.group = f.committed;
  ++f.committed;
}

void waitCopies(int newest) {
  Fiber &f = *active->current;
  const int limit = f.committed - newest;
  std::vector<AsyncCopy> pending;
  for (const AsyncCopy &c : f.copies) {
    if (c.group >= 0 && c.group < limit)
      std::memcpy(c.dst, c.src, static_cast<size_t>(c.bytes));
    else
      pending.push_back(c);
  }
  f.copies.swap(pending);
}

int lanes() {
  const int base = active->current->linear / kWarpSize * kWarpSize;
  return std::min(kWarpSize, static_cast<int>(active->fibers.size()) - base);
}

const uint64_t *publish(unsigned mask, uint64_t value) {
  if (!active || !active->current)
    fatal("warp collective outside a kernel");
  checkMask(mask);
  Fiber &f = *active->current;
  std::vector<uint64_t> &words = active->words[f.parity];
  f.parity ^= 1;
  words[f.linear] = value;
  waitAt(State::AtWarpBarrier);
  return words.data() + f.linear / kWarpSize * kWarpSize;
}

const uint64_t *publishWords(unsigned mask, const uint64_t *values,
                             int count) {
  if (!active || !active->current)
    fatal("warp collective outside a kernel");
  checkMask(mask);
  if (count < 1 || count > kPublishWords)
    fatal("publishWords of other than 1 to kPublishWords words");
  Fiber &f = *active->current;
  std::vector<uint64_t> &words = active->exchange->wide[f.parity];
  f.parity ^= 1;
  std::memcpy(words.data() + static_cast<size_t>(f.linear) * kPublishWords,
              values, sizeof(uint64_t) * static_cast<size_t>(count));
  waitAt(State::AtWarpBarrier);
  return words.data() +
         static_cast<size_t>(f.linear / kWarpSize * kWarpSize) * kPublishWords;
}

const uint64_t *publishShared(unsigned mask, const uint64_t *values,
                              int count, uint64_t **result, bool *form) {
  const uint64_t *words = publishWords(mask, values, count);
  BlockRun &run = *active;
  const int warp = run.current->linear / kWarpSize;
  // The first lane back from this barrier forms the result; the warp's
  // next barrier opens only after every lane has passed this one, so the
  // result is not formed again before the slower lanes have read it.
  *form = run.formed[warp] != run.opened[warp];
  run.formed[warp] = run.opened[warp];
  *result = run.exchange->shared.data() +
            static_cast<size_t>(warp) * kSharedWords;
  return words;
}

void formMmaTiles(const uint64_t *words, int accumulators, int products,
                  int halves, float *tiles) {
  if (accumulators < 1 || products < 1 || products > kPublishWords / 6 ||
      2 * accumulators + 4 * products + 2 * accumulators * products >
          kPublishWords ||
      accumulators * 16 * 8 > 2 * kSharedWords || halves < 1 || halves > 2)
    fatal("formMmaTiles: operands or tiles beyond the exchange");
  sumMmaTiles(words, accumulators, products, halves, tiles);
}

/// The order in which a launch runs its blocks (KVC_EMU_BLOCK_ORDER, read at
/// every launch): `forward` (unset or empty: blockIdx order, x fastest),
/// `reverse`, or `shuffle[:SEED]` (a permutation drawn per launch from SEED,
/// default 1, and the launch's number, so that a run is reproducible and
/// its launches differ). A device runs blocks in no promised order, and
/// concurrently: a kernel whose results depend on the order (one block
/// reading what another wrote without an arrival count, or shared memory
/// read before it is written) fails a suite under one of them.
struct BlockOrder {
  enum Kind { Forward, Reverse, Shuffle } kind = Forward;
  uint64_t seed = 1;
};

/// Ends the run (status 2) on a setting the emulator does not know.
[[noreturn]] void badSetting(const char *variable, const char *value,
                             const char *expected) {
  std::fprintf(stderr, "kvc CUDA emulator: %s=%s: expected %s\n", variable,
               value, expected);
  std::fflush(stderr);
  std::_Exit(2);
}

/// Whether the setting `variable` of two values is `on`: false unset, empty
/// or `off`; any other value ends the run (badSetting).
bool switchedOn(const char *variable, const char *off, const char *on) {
  const char *v = std::getenv(variable);
  if (!v || !*v || !std::strcmp(v, off))
    return false;
  if (!std::strcmp(v, on))
    return true;
  badSetting(variable, v, (std::string(off) + " or " + on).c_str());
}

/// Whether KVC_EMU_THREAD_ORDER (read at every launch) asks for the
/// reverse thread order: `forward` (unset or empty: a block's warps from
/// the first, each warp's lanes from the lowest, each until its next
/// barrier or collective) or `reverse` (warps from the last, lanes from the
/// highest). Between two barriers a device's threads run in no promised
/// order either: a thread that reads shared memory another wrote since
/// their last common barrier sees the write in one order and not in the
/// other, so a suite run under both shows such a race.
bool reverseThreadOrder() {
  return switchedOn("KVC_EMU_THREAD_ORDER", "forward", "reverse");
}

/// KVC_EMU_BLOCK_ORDER as a BlockOrder (see there).
BlockOrder blockOrder() {
  BlockOrder order;
  const char *v = std::getenv("KVC_EMU_BLOCK_ORDER");
  if (!v || !*v || !std::strcmp(v, "forward"))
    return order;
  if (!std::strcmp(v, "reverse")) {
    order.kind = BlockOrder::Reverse;
    return order;
  }
  if (!std::strncmp(v, "shuffle", 7) && (!v[7] || v[7] == ':')) {
    order.kind = BlockOrder::Shuffle;
    char *end = nullptr;
    if (v[7] == ':') {
      errno = 0;
      order.seed = std::strtoull(v + 8, &end, 10);
      if (v[8] >= '0' && v[8] <= '9' && !*end && errno == 0)
        return order;
    } else {
      return order;
    }
  }
  badSetting("KVC_EMU_BLOCK_ORDER", v,
             "forward, reverse, shuffle or shuffle:SEED (SEED a decimal "
             "integer)");
}

/// KVC_EMU_CONCURRENT_BLOCKS (read at every launch): how many blocks may
/// be in flight at once (unset or empty: 1, one block after another), and
/// the seed of the draws that pick which of them runs on whenever one
/// pauses (`N:SEED`; default 1). See kvc_cuda_emu.h.
struct Concurrency {
  uint64_t blocks = 1;
  uint64_t seed = 1;
};

Concurrency concurrency() {
  Concurrency c;
  const char *v = std::getenv("KVC_EMU_CONCURRENT_BLOCKS");
  if (!v || !*v)
    return c;
  char *end = nullptr;
  errno = 0;
  c.blocks = std::strtoull(v, &end, 10);
  bool ok = *v >= '0' && *v <= '9' && errno == 0 && c.blocks >= 1 &&
            c.blocks <= 64;
  if (ok && *end == ':') {
    const char *seed = end + 1;
    c.seed = std::strtoull(seed, &end, 10);
    ok = *seed >= '0' && *seed <= '9' && errno == 0;
  }
  if (!ok || *end)
    badSetting("KVC_EMU_CONCURRENT_BLOCKS", v,
               "N or N:SEED (N from 1 to 64, SEED a decimal integer)");
#if defined(__SANITIZE_ADDRESS__)
  if (c.blocks > 1)
    badSetting("KVC_EMU_CONCURRENT_BLOCKS", v,
               "1 in an AddressSanitizer build (its shared memory is plain "
               "statics, which blocks in flight would share)");
#endif
  return c;
}

/// splitmix64: the emulator's reproducible draws.
struct SplitMix {
  uint64_t state;
  uint64_t operator()() {
    uint64_t z = (state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
  }
};

/// The linear block indices of a launch of `count` blocks, in the order
/// that `order` gives the launch numbered `launch`.
std::vector<uint64_t> blockSequence(const BlockOrder &order, uint64_t count,
                                    uint64_t launch) {
  std::vector<uint64_t> sequence(count);
  for (uint64_t i = 0; i < count; ++i)
    sequence[i] = order.kind == BlockOrder::Reverse ? count - 1 - i : i;
  if (order.kind != BlockOrder::Shuffle)
    return sequence;
  // Fisher-Yates over splitmix64 of the seed and the launch's number.
  SplitMix next{order.seed * 0x9e3779b97f4a7c15ull + launch};
  for (uint64_t i = count; i > 1; --i)
    std::swap(sequence[i - 1], sequence[next() % i]);
  return sequence;
}

/// The threads that run the blocks in flight (KVC_EMU_CONCURRENT_BLOCKS):
/// slot i's blocks run on thread i, whose thread-local __shared__
/// variables (kvc_cuda_emu.h) are thus the slot's shared memory. One
/// thread runs at a time: the launching thread hands a slot its turn and
/// waits until the slot hands it back, so a run stays deterministic.
class Slots {
public:
  ~Slots() {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      quit_ = true;
    }
    for (std::unique_ptr<std::condition_variable> &turn : turns_)
      turn->notify_one();
    for (std::thread &t : threads_)
      t.join();
  }
  /// Runs `step` on slot `slot`'s thread; returns once it has.
  void runOn(size_t slot, const std::function<void()> &step) {
    std::unique_lock<std::mutex> lock(mutex_);
    while (threads_.size() <= slot) {
      turns_.push_back(std::make_unique<std::condition_variable>());
      threads_.emplace_back(&Slots::serve, this, threads_.size());
    }
    step_ = &step;
    turn_ = static_cast<long>(slot);
    // Only the slot's thread wakes (a wake of every slot thread per turn
    // would be dozens of context switches for each).
    turns_[slot]->notify_one();
    back_.wait(lock, [this] { return turn_ < 0; });
  }

private:
  void serve(size_t slot) {
    std::unique_lock<std::mutex> lock(mutex_);
    std::condition_variable &turn = *turns_[slot];
    for (;;) {
      turn.wait(lock, [&] {
        return quit_ || turn_ == static_cast<long>(slot);
      });
      if (quit_)
        return;
      lock.unlock();
      (*step_)();
      lock.lock();
      turn_ = -1;
      back_.notify_one();
    }
  }

  std::mutex mutex_;
  // Per slot thread, the signal of its turn; the launching thread's, of
  // the turn's end.
  std::vector<std::unique_ptr<std::condition_variable>> turns_;
  std::condition_variable back_;
  std::vector<std::thread> threads_;
  long turn_ = -1; // the slot whose thread runs; -1: the launching thread
  const std::function<void()> *step_ = nullptr;
  bool quit_ = false;
};
Slots slots;

/// Runs the blocks of `sequence` with up to runs.size() in flight, block i
/// of `runs` on slot i's thread. A block runs until it ends or pauses (at
/// the first barrier after an atomic). New blocks enter in the sequence's
/// order as others end, and each runs before any paused block resumes;
/// once none is new, the block to resume is drawn from `seed` and the
/// launch's number. So every block in flight counts itself in before one
/// goes on, and the last to arrive goes on before some of the others most
/// of the time: what a block writes after its arrival is then still
/// unwritten when the last arrival reads.
void runConcurrent(std::vector<BlockRun> &runs,
                   const std::vector<uint64_t> &sequence, uint64_t seed,
                   uint64_t launch, dim3 grid) {
  std::vector<size_t> flying, idle;
  for (size_t i = runs.size(); i-- > 0;)
    idle.push_back(i);
  SplitMix draw{seed * 0xd1342543de82ef95ull + launch};
  size_t next = 0;
  while (next < sequence.size() || !flying.empty()) {
    while (!idle.empty() && next < sequence.size()) {
      BlockRun &r = runs[idle.back()];
      const uint64_t b = sequence[next++];
      r.index = uint3{static_cast<unsigned>(b % grid.x),
                      static_cast<unsigned>(b / grid.x % grid.y),
                      static_cast<unsigned>(b / grid.x / grid.y)};
      r.started = false;
      flying.push_back(idle.back());
      idle.pop_back();
    }
    size_t pick = 0;
    while (pick < flying.size() && runs[flying[pick]].started)
      ++pick;
    if (pick == flying.size())
      pick = draw() % flying.size();
    const size_t slot = flying[pick];
    BlockRun &r = runs[slot];
    active = &r;
    blockIndex = r.index;
    bool more = true;
    slots.runOn(slot, [&] {
      if (!r.started) {
        // The slot thread's stack is the scheduler's.
        pthread_attr_t attributes;
        void *bottom = nullptr;
        if (pthread_getattr_np(pthread_self(), &attributes) == 0) {
          pthread_attr_getstack(&attributes, &bottom, &r.schedulerBytes);
          pthread_attr_destroy(&attributes);
        }
        r.schedulerBottom = bottom;
        startBlock(r);
        r.started = true;
      }
      showMemory(r);
      r.pauseAsked = false;
      while (more && !r.pauseAsked)
        more = runPhase(r);
    });
    if (!more) {
      idle.push_back(slot);
      flying.erase(flying.begin() + static_cast<std::ptrdiff_t>(pick));
    }
  }
}

/// What a piece of device work is, for the programmatic dependents
/// (markDependentLaunch): a kernel, a kernel launched as a dependent of the
/// one before it, an event's record (which orders nothing in its stream),
/// or anything else (a copy, a memset, a free).
enum class WorkKind { Kernel, Dependent, Record, Other };

/// Queues `work` on `stream` (KVC_EMU_DEVICE_WORK=deferred), or runs it
/// now after any work still queued (the default). Defined with the
/// runtime API below.
void deviceWork(cudaStream_t stream, std::function<void()> work,
                WorkKind kind = WorkKind::Other);

/// markDependentLaunch was called for the next launch.
bool dependentNext = false;

/// The primary's writes for the launch that runs next, when it is a
/// programmatic dependent that may start early (set by runWork).
PriorWrites *launchPrior = nullptr;

/// Runs the launch numbered `launch` (the seed of its block order).
void execute(const char *file, int line, const char *kernel, dim3 grid,
             dim3 block, const std::function<void()> &body,
             uint64_t launch) {
  PriorWrites *prior =
      launchPrior && !launchPrior->ranges.empty() ? launchPrior : nullptr;
  if (prior)
    ++counterValues.earlyDependents;
  const uint64_t threads = uint64_t(block.x) * block.y * block.z;
  const BlockOrder order = blockOrder();
  const bool reverseThreads = reverseThreadOrder();
  const Concurrency concurrent = concurrency();
#if defined(KVC_EMU_CALLGRIND)
  static const bool hostOnly = [] {
    const char *v = std::getenv("KVC_EMU_CALLGRIND_HOST_ONLY");
    return v && v[0] == '1' && RUNNING_ON_VALGRIND;
  }();
  if (hostOnly)
    CALLGRIND_TOGGLE_COLLECT;
#endif
  const auto start = std::chrono::steady_clock::now();
  const uint64_t blocks = uint64_t(grid.x) * grid.y * grid.z;
  // A run per block in flight, each with its own set of stacks.
  std::vector<BlockRun> runs(std::min(concurrent.blocks, blocks));
  if (pool.sets.size() < runs.size())
    pool.sets.resize(runs.size());
  if (exchanges.size() < runs.size())
    exchanges.resize(runs.size());
  pthread_attr_t attributes;
  void *bottom = nullptr;
  size_t bottomBytes = 0;
  if (pthread_getattr_np(pthread_self(), &attributes) == 0) {
    pthread_attr_getstack(&attributes, &bottom, &bottomBytes);
    pthread_attr_destroy(&attributes);
  }
  for (size_t i = 0; i < runs.size(); ++i) {
    BlockRun &run = runs[i];
    run.file = file;
    run.line = line;
    run.kernel = kernel;
    run.body = &body;
    run.reverseThreads = reverseThreads;
    run.stacks = &pool.sets[i];
    run.fibers.resize(threads);
    run.words[0].assign(threads, 0);
    run.words[1].assign(threads, 0);
    run.exchange = &exchanges[i];
    run.exchange->fit(threads);
    run.schedulerBottom = bottom;
    run.schedulerBytes = bottomBytes;
    run.inFlight = runs.size() > 1;
    run.prior = prior;
  }
  blockDimension = block;
  gridDimension = grid;
  if (runs.size() > 1) {
    runConcurrent(runs, blockSequence(order, blocks, launch),
                  concurrent.seed, launch, grid);
  } else {
    BlockRun &run = runs[0];
    active = &run;
    auto runAt = [&](uint64_t b) {
      blockIndex = uint3{static_cast<unsigned>(b % grid.x),
                         static_cast<unsigned>(b / grid.x % grid.y),
                         static_cast<unsigned>(b / grid.x / grid.y)};
      startBlock(run);
      showMemory(run);
      while (runPhase(run)) {
      }
    };
    if (order.kind == BlockOrder::Forward)
      for (uint64_t b = 0; b < blocks; ++b)
        runAt(b);
    else
      for (uint64_t b : blockSequence(order, blocks, launch))
        runAt(b);
  }
  if (prior)
    prior->show(false);
  active = nullptr;
  counterValues.kernelSeconds +=
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start)
          .count();
#if defined(KVC_EMU_CALLGRIND)
  if (hostOnly)
    CALLGRIND_TOGGLE_COLLECT;
#endif
}

namespace {
/// The text of the kernel names whose launches fail (failLaunches); empty:
/// none. Set from KVC_EMU_FAIL_LAUNCHES at the first launch unless
/// failLaunches was called before.
std::string failingLaunches;
bool failingLaunchesSet = false;

bool launchRefused(const char *kernel) {
  if (!failingLaunchesSet) {
    failingLaunchesSet = true;
    if (const char *v = std::getenv("KVC_EMU_FAIL_LAUNCHES"))
      failingLaunches = v;
  }
  return !failingLaunches.empty() &&
         std::strstr(kernel, failingLaunches.c_str()) != nullptr;
}
} // namespace

void failLaunches(const char *kernel) {
  failingLaunchesSet = true;
  failingLaunches = kernel ? kernel : "";
}

/// failDeviceAllocations: the device has no memory left.
bool deviceAllocationsRefused = false;

void failDeviceAllocations(bool refuse) { deviceAllocationsRefused = refuse; }

void run(const char *file, int line, const char *kernel, dim3 grid,
         dim3 block, cudaStream_t stream, std::function<void()> body) {
  const uint64_t threads = uint64_t(block.x) * block.y * block.z;
  if (threads == 0 || threads > 1024 || block.z > 64 || grid.x == 0 ||
      grid.y == 0 || grid.z == 0 || grid.y > 65535 || grid.z > 65535) {
    dependentNext = false;
    lastError = cudaErrorInvalidConfiguration;
    return;
  }
  if (launchRefused(kernel)) {
    dependentNext = false;
    lastError = cudaErrorLaunchOutOfResources;
    return;
  }
  if (active)
    fatal("kernel launched from inside a kernel");
  const uint64_t launch = counterValues.launches++;
  const bool dependent = std::exchange(dependentNext, false);
  if (dependent)
    ++counterValues.dependentLaunches;
  deviceWork(
      stream,
      [=] { execute(file, line, kernel, grid, block, body, launch); },
      dependent ? WorkKind::Dependent : WorkKind::Kernel);
}

void markDependentLaunch() { dependentNext = true; }

const char *templateArgumentOf(const char *signature) {
  // GCC: "... kernelName() [with auto K = ns::k<1, 2>]"; Clang:
  // "... kernelName() [K = &ns::k]". Kept for the life of the program, one
  // per kernel that launches.
  std::string text = signature;
  const size_t at = text.find("K = ");
  if (at == std::string::npos || text.back() != ']')
    return strdup(signature);
  std::string name = text.substr(at + 4, text.size() - at - 5);
  if (!name.empty() && name.front() == '&')
    name.erase(0, 1);
  return strdup(name.c_str());
}

} // namespace kvc::emu

// The runtime API over host memory. By default every call completes its
// device work before it returns, so streams and events need no ordering of
// their own; under KVC_EMU_DEVICE_WORK=deferred the work waits in a queue
// until the host waits for it (kvc_cuda_emu.h).
struct CUstream_st {
  int id;
  /// Made with cudaStreamNonBlocking: a wait for it waits for its own work
  /// only.
  bool nonBlocking = false;
};
struct CUevent_st {
  std::chrono::steady_clock::time_point recorded;
  /// The record's number (0: never recorded, or recorded while not held).
  uint64_t record = 0;
  /// Deferred work: the number of the queued record (0: none waiting) and
  /// its stream.
  uint64_t queued = 0;
  cudaStream_t stream = nullptr;
};
struct CUmemPoolHandle_st {
  int device;
};
/// A captured graph and its instance: the captured work, in order.
struct CUgraph_st {
  std::vector<std::pair<kvc::emu::WorkKind, std::function<void()>>> work;
};
struct CUgraphExec_st {
  std::vector<std::pair<kvc::emu::WorkKind, std::function<void()>>> work;
};

namespace kvc::emu {
namespace {

/// What orders a stream's work against another's: the legacy stream (the
/// null handle and cudaStreamLegacy) and the streams made blocking (and
/// the per-thread default stream) wait for each other's earlier work; a
/// non-blocking stream only for its own.
struct StreamKey {
  uintptr_t id;
  bool legacy, blocking;
};

StreamKey keyOf(cudaStream_t stream) {
  const auto id = reinterpret_cast<uintptr_t>(stream);
  if (id <= 1)
    return {0, true, true};
  if (id == 2)
    return {2, false, true};
  return {id, false, !stream->nonBlocking};
}

/// Whether work on `later` waits for earlier work on `earlier`.
bool waitsFor(const StreamKey &later, const StreamKey &earlier) {
  return later.id == earlier.id || (later.legacy && earlier.blocking) ||
         (later.blocking && earlier.legacy);
}

struct QueuedWork {
  uint64_t number;
  StreamKey stream;
  std::function<void()> work;
  WorkKind kind = WorkKind::Other;
  /// A kernel that a programmatic dependent follows: what it writes, for
  /// the dependent (primaryOf); a dependent: its primary's (dependentOn).
  std::shared_ptr<PriorWrites> primaryOf, dependentOn;
};

/// The deferred work, in the order it was queued.
std::vector<QueuedWork> queue;
uint64_t queuedCount = 0;

/// KVC_EMU_DEVICE_WORK (read at every call that gives a stream work):
/// `immediate` (unset or empty) or `deferred`.
bool deferred() {
  return switchedOn("KVC_EMU_DEVICE_WORK", "immediate", "deferred");
}

/// The device memory the program has allocated (cudaMalloc, pinned and
/// pool allocations): its start and bytes.
std::map<char *, size_t> allocations;

/// Device memory as it was before a primary kernel ran.
struct Snapshot {
  std::vector<std::pair<char *, std::vector<char>>> copies;
};

Snapshot takeSnapshot() {
  Snapshot s;
  s.copies.reserve(allocations.size());
  for (const auto &[at, bytes] : allocations)
    s.copies.emplace_back(at, std::vector<char>(at, at + bytes));
  return s;
}

/// What changed since `before`, in 64-byte pieces of each allocation
/// (bytes that did not change are the same in both views).
void changesSince(const Snapshot &before, PriorWrites &writes) {
  constexpr size_t kPiece = 64;
  writes.ranges.clear();
  writes.other.clear();
  writes.before = false;
  for (const auto &[at, copy] : before.copies) {
    const size_t bytes = copy.size();
    size_t start = 0;
    bool open = false;
    for (size_t p = 0; p <= bytes; p += kPiece) {
      const size_t n = std::min(kPiece, bytes - std::min(p, bytes));
      const bool changed =
          n > 0 && std::memcmp(at + p, copy.data() + p, n) != 0;
      if (changed && !open) {
        start = p;
        open = true;
      } else if (!changed && open) {
        const size_t end = std::min(p, bytes);
        writes.ranges.push_back({at + start, end - start,
                                 writes.other.size()});
        writes.other.insert(writes.other.end(), copy.data() + start,
                            copy.data() + end);
        open = false;
      }
      if (n < kPiece)
        break;
    }
    if (open) {
      writes.ranges.push_back({at + start, bytes - start,
                               writes.other.size()});
      writes.other.insert(writes.other.end(), copy.data() + start,
                          copy.data() + bytes);
    }
  }
}

/// Runs one piece of queued work. A primary runs between a snapshot of
/// device memory and its comparison, so that its dependent, which may
/// start before it on a device, reads what it wrote as it was before until
/// the dependent's awaitPriorGrids.
void runWork(QueuedWork &w) {
  Snapshot before;
  if (w.primaryOf)
    before = takeSnapshot();
  launchPrior = w.dependentOn.get();
  w.work();
  launchPrior = nullptr;
  if (w.primaryOf)
    changesSince(before, *w.primaryOf);
}

/// Runs the queued work that work on `stream`, queued after the first
/// `end` entries, would wait for (all of it on a device by then), in
/// queue order, and takes it off the queue.
void finish(const StreamKey &stream, size_t end) {
  std::vector<StreamKey> waiting{stream};
  std::vector<bool> due(end, false);
  for (size_t i = end; i-- > 0;) {
    for (const StreamKey &w : waiting)
      if (waitsFor(w, queue[i].stream)) {
        due[i] = true;
        break;
      }
    if (due[i]) {
      bool known = false;
      for (const StreamKey &w : waiting)
        known |= w.id == queue[i].stream.id;
      if (!known)
        waiting.push_back(queue[i].stream);
    }
  }
  std::vector<QueuedWork> run;
  std::vector<QueuedWork> rest;
  for (size_t i = 0; i < queue.size(); ++i) {
    if (i < end && due[i])
      run.push_back(std::move(queue[i]));
    else
      rest.push_back(std::move(queue[i]));
  }
  queue.swap(rest);
  for (QueuedWork &w : run)
    runWork(w);
}

/// Runs everything queued (the device synchronized).
void finishAll() {
  std::vector<QueuedWork> run;
  run.swap(queue);
  for (QueuedWork &w : run)
    runWork(w);
}

/// Runs what `stream`'s work queued so far, and what it waits for.
void finishStream(cudaStream_t stream) { finish(keyOf(stream), queue.size()); }

/// Runs the work up to `event`'s queued record on its stream (the record
/// included).
void finishEvent(const CUevent_st &event) {
  if (!event.queued)
    return;
  for (size_t i = 0; i < queue.size(); ++i)
    if (queue[i].number == event.queued) {
      finish(keyOf(event.stream), i + 1);
      return;
    }
}

/// Whether `event`'s record still waits in the queue.
bool eventQueued(const CUevent_st &event) {
  if (!event.queued)
    return false;
  for (const QueuedWork &w : queue)
    if (w.number == event.queued)
      return true;
  return false;
}

/// Queues an empty piece of work on `stream` for an event's record and
/// returns its number (0 when work is not deferred).
uint64_t queueRecord(cudaStream_t stream) {
  if (!deferred())
    return 0;
  queue.push_back({++queuedCount, keyOf(stream), [] {}, WorkKind::Record});
  return queuedCount;
}

/// A stream capture (cudaStreamBeginCapture): the work given to its
/// stream goes into `work` instead of running or waiting in the queue.
struct Capture {
  uintptr_t stream;
  cudaStreamCaptureMode mode;
  std::vector<std::pair<WorkKind, std::function<void()>>> work;
  /// A call that a device refuses during a capture was made: the capture
  /// ends with cudaErrorStreamCaptureInvalidated.
  bool invalidated = false;
};
std::vector<Capture> captures;

Capture *captureOf(cudaStream_t stream) {
  for (Capture &c : captures)
    if (c.stream == keyOf(stream).id)
      return &c;
  return nullptr;
}

} // namespace

void runQueuedWork() { finishAll(); }

/// A call that a device refuses while a stream captures in the global or
/// thread-local mode (it may wait for or change what a capture records: a
/// synchronization, a synchronous copy, an allocation, an event's query):
/// cudaErrorStreamCaptureUnsupported, and the captures end invalidated.
/// None in relaxed mode, or without a capture.
bool refusedInCapture() {
  bool refused = false;
  for (Capture &c : captures)
    if (c.mode != cudaStreamCaptureModeRelaxed) {
      c.invalidated = true;
      refused = true;
    }
  if (refused)
    lastError = cudaErrorStreamCaptureUnsupported;
  return refused;
}

void deviceWork(cudaStream_t stream, std::function<void()> work,
                WorkKind kind) {
  if (Capture *c = captureOf(stream)) {
    c->work.emplace_back(kind, std::move(work));
    return;
  }
  if (deferred()) {
    QueuedWork w{++queuedCount, keyOf(stream), std::move(work), kind, {}, {}};
    // A dependent may start while the work it follows still runs when that
    // work is a kernel still queued in its stream (event records between
    // them order nothing); after anything else, or once the kernel has
    // run, it starts as an ordinary launch.
    if (kind == WorkKind::Dependent)
      for (size_t i = queue.size(); i-- > 0;) {
        QueuedWork &q = queue[i];
        if (!waitsFor(w.stream, q.stream))
          continue;
        if (q.kind == WorkKind::Record && q.stream.id == w.stream.id)
          continue;
        if (q.stream.id == w.stream.id && (q.kind == WorkKind::Kernel ||
                                           q.kind == WorkKind::Dependent)) {
          q.primaryOf = std::make_shared<PriorWrites>();
          w.dependentOn = q.primaryOf;
        }
        break;
      }
    queue.push_back(std::move(w));
    return;
  }
  finishAll(); // what an earlier deferred setting left
  work();
}

} // namespace kvc::emu

using kvc::emu::counterValues;
using kvc::emu::deviceWork;
using kvc::emu::eventQueued;
using kvc::emu::eventsHeld;
using kvc::emu::finishAll;
using kvc::emu::finishedRecords;
using kvc::emu::finishEvent;
using kvc::emu::finishStream;
using kvc::emu::lastError;
using kvc::emu::lastRecord;
using kvc::emu::PendingSource;
using kvc::emu::pendingSources;
using kvc::emu::queueRecord;

namespace {
// The emulated device reports 4 GiB, half of it free, so that programs
// that size buffers from the free memory (the benchmark's copy test) stay
// small on the host. Allocations are not limited by it.
constexpr size_t kDeviceBytes = size_t(4) << 30;
} // namespace

namespace {
cudaError_t fail(cudaError_t error) {
  lastError = error;
  return error;
}
} // namespace

extern "C" {

cudaError_t cudaGetLastError() {
  const cudaError_t e = lastError;
  lastError = cudaSuccess;
  return e;
}
cudaError_t cudaPeekAtLastError() { return lastError; }

const char *cudaGetErrorString(cudaError_t error) {
  switch (error) {
  case cudaSuccess:
    return "no error";
  case cudaErrorInvalidValue:
    return "invalid argument";
  case cudaErrorMemoryAllocation:
    return "out of memory";
  case cudaErrorInvalidConfiguration:
    return "invalid configuration argument";
  case cudaErrorLaunchOutOfResources:
    return "too many resources requested for launch";
  default:
    return "unknown error (CUDA emulator)";
  }
}

namespace {
/// A count of the emulated device that `variable` sets (1 to 65536; unset
/// or empty: `fallback`).
int settingCount(const char *variable, int fallback) {
  const char *v = std::getenv(variable);
  if (!v || !*v)
    return fallback;
  char *end = nullptr;
  errno = 0;
  const long n = std::strtol(v, &end, 10);
  if (*v < '0' || *v > '9' || errno != 0 || *end || n < 1 || n > 65536)
    ::kvc::emu::badSetting(variable, v, "a count from 1 to 65536");
  return static_cast<int>(n);
}
} // namespace

cudaError_t cudaGetDeviceCount(int *count) {
  *count = 1;
  return cudaSuccess;
}
cudaError_t cudaGetDevice(int *device) {
  *device = 0;
  return cudaSuccess;
}
cudaError_t cudaSetDevice(int device) {
  return device == 0 ? cudaSuccess : fail(cudaErrorInvalidDevice);
}

cudaError_t cudaGetDeviceProperties(cudaDeviceProp *prop, int device) {
  if (device != 0)
    return fail(cudaErrorInvalidDevice);
  std::memset(prop, 0, sizeof *prop);
  std::snprintf(prop->name, sizeof prop->name, "kvc CUDA emulator (host)");
  prop->major = 9;
  prop->minor = 0;
  prop->multiProcessorCount = 132;
  prop->maxThreadsPerBlock = 1024;
  prop->sharedMemPerBlock = 48 * 1024;
  prop->warpSize = 32;
  prop->totalGlobalMem = kDeviceBytes;
  return cudaSuccess;
}

cudaError_t cudaDeviceGetAttribute(int *value, cudaDeviceAttr attr,
                                   int device) {
  if (device != 0)
    return fail(cudaErrorInvalidDevice);
  switch (attr) {
  case cudaDevAttrMultiProcessorCount:
    *value = settingCount("KVC_EMU_SMS", 132);
    return cudaSuccess;
  case cudaDevAttrMaxThreadsPerBlock:
    *value = 1024;
    return cudaSuccess;
  case cudaDevAttrComputeCapabilityMajor:
    *value = 9;
    return cudaSuccess;
  case cudaDevAttrComputeCapabilityMinor:
    *value = 0;
    return cudaSuccess;
  case cudaDevAttrMemoryPoolsSupported:
    *value = 1;
    return cudaSuccess;
  case cudaDevAttrL2CacheSize: // An H100's or H200's 50 MiB.
    *value = 50 * 1024 * 1024;
    return cudaSuccess;
  default:
    return fail(cudaErrorInvalidValue);
  }
}

// The emulated SM holds as many blocks as its 2,048 threads allow, at
// most 32, whatever a kernel's registers and shared memory. (The template
// of cuda_runtime.h calls the form with flags.)
cudaError_t cudaOccupancyMaxActiveBlocksPerMultiprocessorWithFlags(
    int *numBlocks, const void *func, int blockSize, size_t dynamicSMemSize,
    unsigned int flags) {
  if (!numBlocks || !func)
    return fail(cudaErrorInvalidValue);
  if (blockSize < 1 || blockSize > 1024 || dynamicSMemSize > 48 * 1024 ||
      (flags != cudaOccupancyDefault &&
       flags != cudaOccupancyDisableCachingOverride))
    return fail(cudaErrorInvalidValue);
  *numBlocks = std::min(settingCount("KVC_EMU_SM_BLOCKS", 32),
                        2048 / blockSize);
  return cudaSuccess;
}
cudaError_t cudaOccupancyMaxActiveBlocksPerMultiprocessor(
    int *numBlocks, const void *func, int blockSize, size_t dynamicSMemSize) {
  return cudaOccupancyMaxActiveBlocksPerMultiprocessorWithFlags(
      numBlocks, func, blockSize, dynamicSMemSize, cudaOccupancyDefault);
}

cudaError_t cudaRuntimeGetVersion(int *version) {
  *version = CUDART_VERSION;
  return cudaSuccess;
}
cudaError_t cudaDriverGetVersion(int *version) {
  *version = CUDART_VERSION;
  return cudaSuccess;
}
cudaError_t cudaMemGetInfo(size_t *free, size_t *total) {
  *free = kDeviceBytes / 2;
  *total = kDeviceBytes;
  return cudaSuccess;
}

namespace {
/// A device allocation: 256-byte aligned like a device's, exactly `bytes`
/// long, so that AddressSanitizer reports an access past it, every byte
/// kvc::emu::kFreshByte (kvc_cuda_emu.h).
cudaError_t allocateDevice(void **pointer, size_t bytes) {
  *pointer = nullptr;
  if (bytes && posix_memalign(pointer, 256, bytes) != 0) {
    *pointer = nullptr;
    return fail(cudaErrorMemoryAllocation);
  }
  if (bytes) {
    std::memset(*pointer, kvc::emu::kFreshByte, bytes);
    kvc::emu::allocations[static_cast<char *>(*pointer)] = bytes;
  }
  return cudaSuccess;
}

void freeDevice(void *pointer) {
  kvc::emu::allocations.erase(static_cast<char *>(pointer));
  std::free(pointer);
}
} // namespace

cudaError_t cudaMalloc(void **pointer, size_t bytes) {
  if (kvc::emu::refusedInCapture())
    return cudaErrorStreamCaptureUnsupported;
  if (kvc::emu::deviceAllocationsRefused) {
    *pointer = nullptr;
    return fail(cudaErrorMemoryAllocation);
  }
  ++counterValues.allocations;
  return allocateDevice(pointer, bytes);
}
cudaError_t cudaFree(void *pointer) {
  if (kvc::emu::refusedInCapture())
    return cudaErrorStreamCaptureUnsupported;
  ++counterValues.allocations;
  finishAll(); // a free waits for the device
  freeDevice(pointer);
  return cudaSuccess;
}
// Pinned host memory is a device allocation whose range is remembered, so
// that copies from and to other host memory count as pageable.
namespace {
std::map<const char *, size_t> pinnedRanges;

/// Whether [p, p + bytes) lies in one pinned allocation.
bool isPinned(const void *p, size_t bytes) {
  const char *c = static_cast<const char *>(p);
  auto it = pinnedRanges.upper_bound(c);
  if (it == pinnedRanges.begin())
    return false;
  --it;
  return c >= it->first && c + bytes <= it->first + it->second;
}

/// Counts an asynchronous copy of `kind` whose host side (src or dst,
/// `bytes` long) is not pinned.
void countPageable(cudaMemcpyKind kind, const void *dst, const void *src,
                   size_t bytes) {
  const void *host = kind == cudaMemcpyHostToDevice   ? src
                     : kind == cudaMemcpyDeviceToHost ? dst
                                                      : nullptr;
  if (host && !isPinned(host, bytes))
    ++counterValues.pageableCopies;
}

/// A copy from pinned `src` (`bytes`) was queued: counts it when an earlier
/// copy from those bytes has not run yet (events held).
void notePinnedSource(const void *src, size_t bytes) {
  if (!eventsHeld || !bytes || !isPinned(src, bytes))
    return;
  const char *begin = static_cast<const char *>(src);
  // A copy that a finished record follows has run.
  pendingSources.erase(
      std::remove_if(pendingSources.begin(), pendingSources.end(),
                     [](const PendingSource &p) {
                       return finishedRecords > p.before;
                     }),
      pendingSources.end());
  for (const PendingSource &p : pendingSources)
    if (begin < p.begin + p.bytes && p.begin < begin + bytes) {
      ++counterValues.unfinishedSourceCopies;
      break;
    }
  pendingSources.push_back({begin, bytes, lastRecord});
}
} // namespace

cudaError_t cudaMallocHost(void **pointer, size_t bytes) {
  if (kvc::emu::refusedInCapture())
    return cudaErrorStreamCaptureUnsupported;
  ++counterValues.allocations;
  const cudaError_t error = allocateDevice(pointer, bytes);
  if (error == cudaSuccess && *pointer)
    pinnedRanges[static_cast<const char *>(*pointer)] = bytes;
  return error;
}
cudaError_t cudaFreeHost(void *pointer) {
  if (kvc::emu::refusedInCapture())
    return cudaErrorStreamCaptureUnsupported;
  const char *begin = static_cast<const char *>(pointer);
  auto range = pinnedRanges.find(begin);
  if (range != pinnedRanges.end())
    pendingSources.erase(
        std::remove_if(pendingSources.begin(), pendingSources.end(),
                       [&](const PendingSource &p) {
                         return p.begin >= begin &&
                                p.begin < begin + range->second;
                       }),
        pendingSources.end());
  pinnedRanges.erase(begin);
  return cudaFree(pointer);
}

cudaError_t cudaMemPoolCreate(cudaMemPool_t *pool,
                              const cudaMemPoolProps *props) {
  if (!pool || !props || props->location.type != cudaMemLocationTypeDevice ||
      props->location.id != 0)
    return fail(cudaErrorInvalidValue);
  ++counterValues.allocations;
  *pool = new CUmemPoolHandle_st{0};
  return cudaSuccess;
}
cudaError_t cudaMemPoolDestroy(cudaMemPool_t pool) {
  ++counterValues.allocations;
  finishAll(); // its blocks' stream-ordered frees first
  delete pool;
  return cudaSuccess;
}
cudaError_t cudaMemPoolSetAttribute(cudaMemPool_t pool, cudaMemPoolAttr,
                                    void *value) {
  return pool && value ? cudaSuccess : fail(cudaErrorInvalidValue);
}
// Pool allocations are exact-size host blocks like cudaMalloc's.
cudaError_t cudaMallocFromPoolAsync(void **pointer, size_t bytes,
                                    cudaMemPool_t pool, cudaStream_t) {
  if (!pool)
    return fail(cudaErrorInvalidValue);
  if (kvc::emu::deviceAllocationsRefused) {
    *pointer = nullptr;
    return fail(cudaErrorMemoryAllocation);
  }
  ++counterValues.poolAllocations;
  return allocateDevice(pointer, bytes);
}
cudaError_t cudaFreeAsync(void *pointer, cudaStream_t stream) {
  ++counterValues.poolFrees;
  deviceWork(stream, [pointer] { freeDevice(pointer); });
  return cudaSuccess;
}

namespace {
cudaError_t copyBytes(void *dst, const void *src, size_t bytes) {
  if (bytes && (!dst || !src))
    return fail(cudaErrorInvalidValue);
  std::memmove(dst, src, bytes);
  return cudaSuccess;
}
} // namespace
// A synchronous copy or memset runs on the legacy stream, after the work
// of the blocking streams. An asynchronous copy from pageable memory reads
// its source at the call (the runtime stages it), one into pageable memory
// returns when it has run; the others run with their stream's work.
cudaError_t cudaMemcpy(void *dst, const void *src, size_t bytes,
                       cudaMemcpyKind) {
  if (kvc::emu::refusedInCapture())
    return cudaErrorStreamCaptureUnsupported;
  ++counterValues.syncCopies;
  finishStream(nullptr);
  return copyBytes(dst, src, bytes);
}
namespace {
/// Bytes from the first to the last byte of a copy's host side (the
/// source of a host-to-device copy, else the destination).
size_t hostSpan(cudaMemcpyKind kind, size_t dpitch, size_t spitch,
                size_t width, size_t height) {
  return height ? (height - 1) *
                          (kind == cudaMemcpyHostToDevice ? spitch : dpitch) +
                      width
                : 0;
}

/// The asynchronous copy of `height` rows of `width` bytes on `stream`
/// (cudaMemcpyAsync: one row): from pageable memory staged at the call,
/// into pageable memory run before it returns, otherwise run with the
/// stream's work.
void queueCopy(void *dst, size_t dpitch, const void *src, size_t spitch,
               size_t width, size_t height, cudaMemcpyKind kind,
               cudaStream_t stream) {
  const size_t span = hostSpan(kind, dpitch, spitch, width, height);
  auto copyRows = [=](const char *from, size_t fromPitch) {
    for (size_t r = 0; r < height; ++r)
      std::memmove(static_cast<char *>(dst) + r * dpitch, from + r * fromPitch,
                   width);
  };
  const auto *from = static_cast<const char *>(src);
  if (kind == cudaMemcpyHostToDevice && height && !isPinned(src, span)) {
    std::vector<char> staged(height * width);
    for (size_t r = 0; r < height; ++r)
      std::memcpy(staged.data() + r * width, from + r * spitch, width);
    deviceWork(stream, [copyRows, staged = std::move(staged), width] {
      copyRows(staged.data(), width);
    });
  } else if (kind == cudaMemcpyDeviceToHost && height && !isPinned(dst, span)) {
    finishStream(stream);
    copyRows(from, spitch);
  } else {
    deviceWork(stream, [copyRows, from, spitch] { copyRows(from, spitch); });
  }
}
/// An asynchronous copy on a capturing stream with pageable host memory on
/// one side: a copy whose source the runtime would stage at the call, or
/// that would return only once it ran, has no place in a graph that
/// replays later; the emulator refuses it.
bool capturedPageable(cudaMemcpyKind kind, const void *dst, const void *src,
                      size_t span, cudaStream_t stream) {
  if (!kvc::emu::captureOf(stream) || !span)
    return false;
  if (kind == cudaMemcpyHostToDevice)
    return !isPinned(src, span);
  if (kind == cudaMemcpyDeviceToHost)
    return !isPinned(dst, span);
  return false;
}
} // namespace
cudaError_t cudaMemcpyAsync(void *dst, const void *src, size_t bytes,
                            cudaMemcpyKind kind, cudaStream_t stream) {
  if (capturedPageable(kind, dst, src, bytes, stream))
    return fail(cudaErrorStreamCaptureUnsupported);
  ++counterValues.asyncCopies;
  countPageable(kind, dst, src, bytes);
  if (kind == cudaMemcpyHostToDevice)
    notePinnedSource(src, bytes);
  if (bytes && (!dst || !src))
    return fail(cudaErrorInvalidValue);
  if (bytes)
    queueCopy(dst, bytes, src, bytes, bytes, 1, kind, stream);
  return cudaSuccess;
}
cudaError_t cudaMemcpy2DAsync(void *dst, size_t dpitch, const void *src,
                              size_t spitch, size_t width, size_t height,
                              cudaMemcpyKind kind, cudaStream_t stream) {
  if (height && capturedPageable(kind, dst, src,
                                 hostSpan(kind, dpitch, spitch, width, height),
                                 stream))
    return fail(cudaErrorStreamCaptureUnsupported);
  ++counterValues.asyncCopies;
  if (height)
    countPageable(kind, dst, src,
                  hostSpan(kind, dpitch, spitch, width, height));
  if (width > dpitch || width > spitch)
    return fail(cudaErrorInvalidPitchValue);
  queueCopy(dst, dpitch, src, spitch, width, height, kind, stream);
  return cudaSuccess;
}
cudaError_t cudaMemset(void *pointer, int value, size_t bytes) {
  if (kvc::emu::refusedInCapture())
    return cudaErrorStreamCaptureUnsupported;
  ++counterValues.memsets;
  finishStream(nullptr);
  std::memset(pointer, value, bytes);
  return cudaSuccess;
}
cudaError_t cudaMemsetAsync(void *pointer, int value, size_t bytes,
                            cudaStream_t stream) {
  ++counterValues.memsets;
  deviceWork(stream, [=] { std::memset(pointer, value, bytes); });
  return cudaSuccess;
}
cudaError_t cudaMemset2DAsync(void *pointer, size_t pitch, int value,
                              size_t width, size_t height,
                              cudaStream_t stream) {
  ++counterValues.memsets;
  if (width > pitch)
    return fail(cudaErrorInvalidPitchValue);
  deviceWork(stream, [=] {
    for (size_t r = 0; r < height; ++r)
      std::memset(static_cast<char *>(pointer) + r * pitch, value, width);
  });
  return cudaSuccess;
}

cudaError_t cudaStreamCreate(cudaStream_t *stream) {
  *stream = new CUstream_st{1};
  return cudaSuccess;
}
cudaError_t cudaStreamCreateWithFlags(cudaStream_t *stream,
                                      unsigned int flags) {
  *stream = new CUstream_st{1, (flags & cudaStreamNonBlocking) != 0};
  return cudaSuccess;
}
cudaError_t cudaStreamDestroy(cudaStream_t stream) {
  finishStream(stream); // its work completes all the same
  delete stream;
  return cudaSuccess;
}
cudaError_t cudaStreamSynchronize(cudaStream_t stream) {
  if (kvc::emu::refusedInCapture())
    return cudaErrorStreamCaptureUnsupported;
  ++counterValues.waits;
  finishStream(stream);
  // The special handles (0, cudaStreamLegacy, cudaStreamPerThread) are not
  // objects of the emulator.
  if (reinterpret_cast<uintptr_t>(stream) > 2 && stream->nonBlocking) {
    ++counterValues.nonBlockingWaits;
    return cudaSuccess;
  }
  finishedRecords = lastRecord;
  pendingSources.clear();
  return cudaSuccess;
}
cudaError_t cudaDeviceSynchronize() {
  if (kvc::emu::refusedInCapture())
    return cudaErrorStreamCaptureUnsupported;
  ++counterValues.waits;
  finishAll();
  finishedRecords = lastRecord;
  pendingSources.clear();
  return cudaSuccess;
}

cudaError_t cudaEventCreate(cudaEvent_t *event) {
  ++counterValues.allocations;
  *event = new CUevent_st{};
  return cudaSuccess;
}
cudaError_t cudaEventCreateWithFlags(cudaEvent_t *event, unsigned int) {
  ++counterValues.allocations;
  *event = new CUevent_st{};
  return cudaSuccess;
}
cudaError_t cudaEventDestroy(cudaEvent_t event) {
  ++counterValues.allocations;
  delete event;
  return cudaSuccess;
}
cudaError_t cudaEventRecord(cudaEvent_t event, cudaStream_t stream) {
  // The emulator captures kernels, copies and memsets, not event records
  // (nodes that order a capture's streams or time its replays).
  if (kvc::emu::captureOf(stream))
    return fail(cudaErrorStreamCaptureUnsupported);
  ++counterValues.eventRecords;
  event->recorded = std::chrono::steady_clock::now();
  event->record = eventsHeld ? ++lastRecord : 0;
  event->queued = queueRecord(stream);
  event->stream = stream;
  return cudaSuccess;
}
cudaError_t cudaEventSynchronize(cudaEvent_t event) {
  if (kvc::emu::refusedInCapture())
    return cudaErrorStreamCaptureUnsupported;
  ++counterValues.waits;
  finishEvent(*event);
  if (event->record > finishedRecords)
    finishedRecords = event->record;
  return cudaSuccess;
}
// Not ready is a status, not an error: the last error stays as it was.
cudaError_t cudaEventQuery(cudaEvent_t event) {
  if (kvc::emu::refusedInCapture())
    return cudaErrorStreamCaptureUnsupported;
  return event->record > finishedRecords || eventQueued(*event)
             ? cudaErrorNotReady
             : cudaSuccess;
}
cudaError_t cudaEventElapsedTime(float *ms, cudaEvent_t start,
                                 cudaEvent_t end) {
  *ms = std::chrono::duration<float, std::milli>(end->recorded -
                                                 start->recorded)
            .count();
  return cudaSuccess;
}

// Stream capture and graphs: a capture records the work its stream is
// given (kernels, copies, memsets) in order; an instantiated graph gives a
// stream that work again at every launch, with the arguments it was
// captured with, as a device replays a graph.
cudaError_t cudaStreamBeginCapture(cudaStream_t stream,
                                   cudaStreamCaptureMode mode) {
  if (reinterpret_cast<uintptr_t>(stream) <= 2)
    return fail(cudaErrorStreamCaptureUnsupported); // a legacy or default
  if (kvc::emu::captureOf(stream))
    return fail(cudaErrorIllegalState);
  kvc::emu::captures.push_back({kvc::emu::keyOf(stream).id, mode, {}});
  return cudaSuccess;
}
cudaError_t cudaStreamEndCapture(cudaStream_t stream, cudaGraph_t *graph) {
  if (!graph)
    return fail(cudaErrorInvalidValue);
  *graph = nullptr;
  auto &captures = kvc::emu::captures;
  for (size_t i = 0; i < captures.size(); ++i) {
    if (captures[i].stream != kvc::emu::keyOf(stream).id)
      continue;
    kvc::emu::Capture c = std::move(captures[i]);
    captures.erase(captures.begin() + static_cast<std::ptrdiff_t>(i));
    if (c.invalidated)
      return fail(cudaErrorStreamCaptureInvalidated);
    *graph = new CUgraph_st{std::move(c.work)};
    return cudaSuccess;
  }
  return fail(cudaErrorIllegalState);
}
cudaError_t cudaStreamIsCapturing(cudaStream_t stream,
                                  cudaStreamCaptureStatus *status) {
  if (!status)
    return fail(cudaErrorInvalidValue);
  const kvc::emu::Capture *c = kvc::emu::captureOf(stream);
  *status = !c              ? cudaStreamCaptureStatusNone
            : c->invalidated ? cudaStreamCaptureStatusInvalidated
                             : cudaStreamCaptureStatusActive;
  return cudaSuccess;
}
cudaError_t cudaGraphInstantiate(cudaGraphExec_t *exec, cudaGraph_t graph,
                                 unsigned long long) {
  if (!exec || !graph)
    return fail(cudaErrorInvalidValue);
  *exec = new CUgraphExec_st{graph->work};
  return cudaSuccess;
}
cudaError_t cudaGraphLaunch(cudaGraphExec_t exec, cudaStream_t stream) {
  if (!exec)
    return fail(cudaErrorInvalidValue);
  if (kvc::emu::captureOf(stream))
    return fail(cudaErrorStreamCaptureUnsupported);
  ++counterValues.graphLaunches;
  for (const auto &[kind, work] : exec->work)
    deviceWork(stream, work, kind);
  return cudaSuccess;
}
cudaError_t cudaGraphExecDestroy(cudaGraphExec_t exec) {
  delete exec;
  return cudaSuccess;
}
cudaError_t cudaGraphDestroy(cudaGraph_t graph) {
  delete graph;
  return cudaSuccess;
}

} // extern "C"
