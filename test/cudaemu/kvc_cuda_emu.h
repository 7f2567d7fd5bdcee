//===- kvc_cuda_emu.h - Run kvc's CUDA code on the host ---------*- C++ -*-===//
//
// The CUDA emulator of the test suite. A host C++ compiler builds the
// generated CUDA backend and runtime/kvc_cuda.cuh with this header included
// first (-include), after the launches `k<<<grid, block, smem, s>>>(args)`
// were rewritten to
// `k * ::kvc::emu::Launch(__FILE__, __LINE__,
// ::kvc::emu::kernelName<k>(), grid, block, smem, s)(args)`
// (test/cudaemu/RewriteLaunches.cmake). Kernels then run on the calling
// thread when launched:
//  - blocks one after another, in blockIdx order (x fastest), or in the
//    order KVC_EMU_BLOCK_ORDER asks for: `reverse`, or `shuffle[:SEED]` (a
//    permutation per launch, reproducible from SEED): a kernel whose
//    results depend on the order in which its blocks run has a race on a
//    device, and a suite run under another order shows it;
//  - the threads of a block as fibers on one stack each, switched only at
//    __syncthreads, __syncwarp and the warp collectives (shuffles,
//    ballot), so a block's run is deterministic: warp by warp from the
//    first, lanes from the lowest, or under KVC_EMU_THREAD_ORDER=reverse
//    from the last warp and the highest lane, so that a thread reading
//    shared memory that another wrote since their last common barrier
//    sees the write in one order and not in the other;
//  - one block at a time by default; under KVC_EMU_CONCURRENT_BLOCKS=N
//    (or N:SEED) up to N blocks are in flight at once, each on a host
//    thread of its own (one runs at a time), and a block pauses at the
//    first __syncthreads after an atomic on device memory (where blocks
//    count themselves in, lastArrival) while the others go on, new ones
//    first, then paused ones drawn from SEED: a block that writes what the
//    last arrival reads after counting itself in has a race on a device,
//    and a suite run so shows it;
//  - __shared__ variables are function statics, thread-local outside
//    AddressSanitizer builds: the shared memory of the block that runs,
//    and with blocks in flight each host thread's own (a block finds what
//    the last block on its thread left, as on a device's multiprocessor);
//  - device memory is host memory, every byte of a new allocation set to
//    kFreshByte (0x7f), since a device's holds whatever was there before;
//  - by default every call completes its device work before it returns;
//    under KVC_EMU_DEVICE_WORK=deferred the work a stream is given
//    (kernels, copies from and to pinned or device memory, memsets,
//    stream-ordered frees, event records) waits in a queue until the host
//    waits for it: a stream, an event or the device synchronized, a
//    synchronous copy or memset (the legacy stream, which waits for the
//    blocking streams' work), a copy into pageable memory, a free. A
//    stream's work runs in order, after what it depends on (the legacy
//    stream's and the blocking streams' work on each other); no other
//    order is kept, so a host that reads what a kernel wrote into pinned
//    memory before it waits for the kernel, or rewrites a pinned buffer
//    that a queued copy has not read yet, or two streams that use each
//    other's data without a wait between them, get other bytes than a
//    device would give in some runs, and a suite run so fails;
//  - the device has 132 SMs, and an SM holds as many blocks of a kernel as
//    its 2,048 threads allow, at most 32, whatever the kernel's registers
//    and shared memory; KVC_EMU_SMS=N and KVC_EMU_SM_BLOCKS=N (read at
//    every query) make it a device of N SMs and of at most N blocks an SM,
//    for the plans that size a grid by the blocks the device holds at once
//    (a small device: few splits' waves, folds in the attention grid that
//    follow a head or two behind);
//  - a kernel launched as a programmatic dependent (launchDependent of
//    runtime/kvc_cuda.cuh, which tells the emulator: markDependentLaunch)
//    runs, under KVC_EMU_DEVICE_WORK=deferred, as early as an sm_90 device
//    may start it: when the work ahead of it in its stream is a kernel that
//    has not run when the dependent is queued (event records between them
//    order nothing), every byte that kernel (the primary) changes holds its
//    earlier value for each block of the dependent until the block passes
//    awaitPriorGrids, and a thread that waits there goes on only once no
//    other live thread of its block can run (each has waited, ended, or
//    waits at a barrier or collective). So a dependent that reads the
//    primary's results before its wait reads stale bytes and fails its
//    test; what it writes before the wait stays in the view it wrote (the
//    primary's own ranges are exchanged, not copied). A primary costs a copy
//    of every device allocation and a comparison after it. A dependent
//    that started early and calls releaseDependents before its wait is
//    reported (its dependents could overlap the work before it, which is
//    not modelled). Immediate work runs a dependent after its primary, as
//    an ordinary launch;
//  - a stream capture (cudaStreamBeginCapture) records the kernels, copies
//    and memsets its stream is given, in order, and a graph launch gives a
//    stream that work again with the arguments it was captured with; while
//    a stream captures in the global or thread-local mode, the calls a
//    device refuses then (stream, event and device synchronizations,
//    synchronous copies and memsets, cudaMalloc, cudaFree and their host
//    forms, event queries) fail with cudaErrorStreamCaptureUnsupported and
//    invalidate the capture, and so do an event record on the capturing
//    stream and a copy there from or to pageable memory (the emulator
//    captures neither).
// A barrier that some live thread of the block (or warp) never reaches, a
// warp collective with a partial mask, or a launch configuration outside the
// device limits (block > 1024 threads, grid y or z > 65535) is reported:
// the first two end the process with status 3 after naming the launch site,
// the kernel's parameter types, the block and the thread; the last sets the
// error cudaGetLastError returns, as a device would. So does a launch of a
// kernel whose name holds the text of KVC_EMU_FAIL_LAUNCHES (or of
// failLaunches), refused with cudaErrorLaunchOutOfResources as a device
// refuses a kernel that asks for more registers than it has: the test of
// what a program does when one of its launches fails.
//
// It checks the logic of the kernels (indexing, merges, selection, host
// staging and transfers) against the CPU backend without a GPU. It says
// nothing about speed, about memory ordering (a write is everyone's at
// once, fence or not: a missing __threadfence goes unseen), about blocks
// interleaved at other points than their atomics, or about races inside a
// block beyond the barriers the code declares: those need the device
// (test/gpu, scripts/gpu-sanitize.sh).
//
//===----------------------------------------------------------------------===//

#ifndef KVC_TEST_CUDAEMU_KVC_CUDA_EMU_H
#define KVC_TEST_CUDAEMU_KVC_CUDA_EMU_H

#if defined(__CUDACC__)
#error "kvc_cuda_emu.h is for a host C++ compiler, not nvcc"
#endif

#define KVC_CUDA_EMULATED 1

// Shared memory: a function static is the shared memory of the block that
// runs. Outside AddressSanitizer builds it is thread-local, and the
// emulator runs each block in flight on a thread of its own
// (KVC_EMU_CONCURRENT_BLOCKS); an AddressSanitizer build keeps plain
// statics, which it guards with redzones (it does not guard thread-local
// variables), and runs one block at a time. Must precede the CUDA headers,
// which define __shared__ only where it is not defined yet.
#if defined(__SANITIZE_ADDRESS__)
#define __shared__ static
#else
#define __shared__ static thread_local
#endif
#define __launch_bounds__(...)

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

namespace kvc::emu {

/// The built-in variables of the running thread, updated at every switch.
extern uint3 threadIndex;
extern uint3 blockIndex;
extern dim3 blockDimension;
extern dim3 gridDimension;

/// The byte every new device allocation (cudaMalloc, a pool's, and
/// cudaMallocHost's pinned memory) starts as, in every byte: on a device an
/// allocation holds what was there before (a pool's freed block, an
/// engine's reused workspace), so code that reads what it never wrote must
/// not find the zeros of fresh host pages. 0x7f7f7f7f is an index past any
/// array and the float 3.4e38.
constexpr unsigned char kFreshByte = 0x7f;

/// Block-wide barrier (__syncthreads) and warp-wide barrier (__syncwarp).
void syncBlock();
void syncWarp(unsigned mask);
/// A warp collective: stores `value` as the calling lane's word, waits
/// until every live lane of the warp has stored its own, and returns the
/// warp's words (lane 0 first). They stay valid until the caller's next
/// collective. Lanes past the block's last thread have no word: callers
/// read only lanes below lanes().
const uint64_t *publish(unsigned mask, uint64_t value);
/// The most words a lane stores in one publishWords.
constexpr int kPublishWords = 74;
/// publish of `count` (1 to kPublishWords) words per lane in one barrier:
/// lane i's words are at [i * kPublishWords, i * kPublishWords + count).
/// For the emulated tensor-core operations, whose operands span several
/// registers of every lane.
const uint64_t *publishWords(unsigned mask, const uint64_t *values,
                             int count);
/// The words of the warp's result that publishShared holds: four 16 x 8
/// float tiles (mmaEmulatedColumns of runtime/kvc_cuda.cuh).
constexpr int kSharedWords = 256;
/// publishWords for a warp operation whose result every lane reads from
/// one place (an emulated mma.sync: the tile's products, formed once
/// instead of once per lane): also returns the warp's kSharedWords words
/// in *result and sets *form for the first lane of the warp to return from
/// the barrier. That lane writes the result from the warp's words before
/// its next collective, and the other lanes read it before theirs.
const uint64_t *publishShared(unsigned mask, const uint64_t *values,
                              int count, uint64_t **result, bool *form);
/// The tiles of an emulated mma.sync (mmaEmulatedColumns of
/// runtime/kvc_cuda.cuh), formed from a publishShared's words: per lane
/// (kPublishWords apart), 2 words per accumulator C_j (its four floats as
/// lane (g, t) holds them: C[g][2t, 2t+1], C[g+8][2t, 2t+1]), 4 per
/// product's A_i (A[g][2t, 2t+1], A[g+8][2t, 2t+1], A[g][2t+8, 2t+9],
/// A[g+8][2t+8, 2t+9]) and 2 per B_{j,i} (B[2t, 2t+1][g], B[2t+8,
/// 2t+9][g]), i fastest; `tiles` receives each C_j + A_0 B_{j,0} + ... +
/// A_{N-1} B_{j,N-1} (16 x 8 floats, row-major, one tile after another),
/// each product's sums formed per half of k (halves: 1 for k = 8, 2 for k
/// = 16) in the order of one lane's sums and then added to C_j. At most
/// kPublishWords / 6 products.
void formMmaTiles(const uint64_t *words, int accumulators, int products,
                  int halves, float *tiles);
/// cp.async of the calling thread: copyAsync records a copy of `bytes`
/// (4, 8 or 16, both addresses aligned to it) into shared memory,
/// commitCopies closes the group of the copies recorded since the last,
/// waitCopies(n) performs every copy of the groups but the n newest ones.
/// A copy thus lands at the wait, not before: reading its destination
/// earlier reads what was there (the device gives no better guarantee).
void copyAsync(void *shared, const void *global, int bytes);
void commitCopies();
void waitCopies(int newest);
/// The calling thread has just read and written `address` in one atomic
/// operation. On device memory, under KVC_EMU_CONCURRENT_BLOCKS, its block
/// then pauses at its next __syncthreads (or its end), and another block
/// in flight may run on; an atomic on shared memory does not pause.
void afterAtomic(const void *address);
/// The calling thread's block waits for what other blocks write (a count
/// that awaitCount of runtime/kvc_cuda.cuh reads short of its target):
/// under KVC_EMU_CONCURRENT_BLOCKS it pauses at its next __syncthreads, so
/// that the blocks in flight run on; with one block at a time it is a
/// fatal error, since nothing else runs until the block ends (a kernel
/// whose blocks wait only for blocks that started before them never waits
/// so).
void awaitOthers();
/// An L2 prefetch of the calling thread (prefetchL2 of
/// runtime/kvc_cuda.cuh): a hint that changes no result. While a log is set
/// (setPrefetchLog), the address is appended to it, so that a test can
/// check which lines a kernel asks for; setPrefetchLog(nullptr) ends it.
void prefetch(const void *address);
void setPrefetchLog(std::vector<const void *> *log);
/// An L2 discard of the calling thread (discardL2 of runtime/kvc_cuda.cuh):
/// the 128 bytes at `line` become indeterminate, which the emulator makes
/// 0xff bytes (a NaN in every float), so that a read after the discard
/// shows in a test's results. A line that is not 128-byte aligned, or in
/// shared memory, is a fatal error (undefined on a device).
void discard(void *line);
/// Programmatic dependent launch (see the top of this file): the next
/// kernel launched is a dependent of the kernel before it in its stream
/// (launchDependent), and awaitPriorGrids of the calling thread, which
/// returns once the primary's results are what its block reads.
void markDependentLaunch();
void awaitPriorGrids();
/// releaseDependents of the calling thread. In a dependent that started
/// early, a release before its block has passed awaitPriorGrids is a fatal
/// error: its own dependents could then start before the kernel ahead of
/// it has ended, which the emulator does not model (its dependents see the
/// memory from before their own primary only).
void releaseDependents();
/// The number of lanes of the calling thread's warp (32 but in a last,
/// partial warp).
int lanes();
/// The lane of the calling thread within its warp.
int laneId();

/// What the emulated runtime did since the program started. A program
/// times the host side of a call as its wall time less the kernelSeconds
/// it added (kvc-bench-gpu's host table), and counts what the call queued
/// on a device: the CUDA runtime calls the same code makes there.
struct Counters {
  /// Kernel launches (run) and the host time spent running them.
  uint64_t launches = 0;
  double kernelSeconds = 0.0;
  /// cudaMemcpyAsync and cudaMemcpy2DAsync; cudaMemcpy (which waits);
  /// cudaMemsetAsync, cudaMemset2DAsync and cudaMemset; cudaEventRecord.
  uint64_t asyncCopies = 0, syncCopies = 0, memsets = 0, eventRecords = 0;
  /// Asynchronous copies between a device and host memory that is not
  /// pinned (not from cudaMallocHost): on a device they may synchronize
  /// with the stream.
  uint64_t pageableCopies = 0;
  /// Host-to-device copies from pinned memory that an earlier copy, not
  /// yet run while events are held (holdEvents), also reads: on a device
  /// the host rewrote bytes before the earlier copy read them.
  uint64_t unfinishedSourceCopies = 0;
  /// cudaStreamSynchronize, cudaEventSynchronize, cudaDeviceSynchronize.
  uint64_t waits = 0;
  /// Of those, cudaStreamSynchronize on a stream made with
  /// cudaStreamNonBlocking, which waits for that stream's own work only
  /// (not for the events recorded on others, which stay unfinished while
  /// held).
  uint64_t nonBlockingWaits = 0;
  /// Resources made or released: cudaMalloc, cudaMallocHost, cudaFree,
  /// cudaFreeHost, cudaEventCreate(WithFlags), cudaEventDestroy,
  /// cudaMemPoolCreate, cudaMemPoolDestroy. On a device the allocations
  /// and frees among them synchronize (the device, or its streams).
  uint64_t allocations = 0;
  /// Stream-ordered allocations from a memory pool (cudaMallocFromPoolAsync)
  /// and their frees (cudaFreeAsync), which do not synchronize.
  uint64_t poolAllocations = 0, poolFrees = 0;
  /// cudaGraphLaunch: the replays of captured work (whose kernels count in
  /// `launches` once, when captured).
  uint64_t graphLaunches = 0;
  /// Launches as programmatic dependents (markDependentLaunch), and the
  /// dependents' runs that started early: with bytes their primary changed
  /// shown as they were before it until awaitPriorGrids.
  uint64_t dependentLaunches = 0, earlyDependents = 0;
};
const Counters &counters();

/// Runs every piece of device work still queued (KVC_EMU_DEVICE_WORK=
/// deferred), as a device does in time, without the host waiting for
/// anything: for tests that look at device memory from the host, which
/// only the emulator allows.
void runQueuedWork();

/// While held, the events recorded stay unfinished to cudaEventQuery
/// (cudaErrorNotReady) until a wait covers them: cudaEventSynchronize on
/// one of them finishes it and every event recorded before it (one stream
/// order), cudaStreamSynchronize and cudaDeviceSynchronize finish all, and
/// so does releasing the hold. It models work still running on a device,
/// for code that polls events; the work itself has run at the launch.
void holdEvents(bool hold);

/// From now on, the launches of the kernels whose name (kernelName, for
/// instance "kvc::cuda::storeAppended<64, ...>") contains `kernel` are
/// refused with cudaErrorLaunchOutOfResources; nullptr or "" refuses none.
/// Until the first call, KVC_EMU_FAIL_LAUNCHES (read at the first launch)
/// gives the text.
void failLaunches(const char *kernel);
/// While `refuse` holds, device allocations (cudaMalloc,
/// cudaMallocFromPoolAsync; not cudaMallocHost) fail with
/// cudaErrorMemoryAllocation: a device out of memory.
void failDeviceAllocations(bool refuse);

/// Runs `body` for every thread of every block of `grid` x `block`, at once
/// or, under KVC_EMU_DEVICE_WORK=deferred, when the host waits for
/// `stream`'s work; records cudaErrorInvalidConfiguration instead when the
/// configuration is outside the device limits, and
/// cudaErrorLaunchOutOfResources when failLaunches names the kernel. Under callgrind with
/// KVC_EMU_CALLGRIND_HOST_ONLY=1 in the environment, the kernel's run is
/// left out of the collected costs, so that a profile holds the host code
/// alone.
void run(const char *file, int line, const char *kernel, dim3 grid,
         dim3 block, cudaStream_t stream, std::function<void()> body);

/// The template argument that `signature`, a __PRETTY_FUNCTION__ of
/// kernelName<K>, names for K ("kvc::cuda::storeEntries<128, ...>").
const char *templateArgumentOf(const char *signature);

/// The name of kernel `K` in reports: as the compiler spells it, template
/// arguments included, also where the launch names a template parameter
/// (`Kernel<<<...>>>` in kvc::cuda::launchDependent).
template <auto K> const char *kernelName() {
  static const char *const name = templateArgumentOf(__PRETTY_FUNCTION__);
  return name;
}

template <typename... A> struct Pending {
  const char *file;
  int line;
  const char *kernel;
  dim3 grid, block;
  cudaStream_t stream;
  std::tuple<std::decay_t<A>...> args;
};

/// `k * Launch(file, line, kernelName<k>(), grid, block, smem,
/// stream)(args...)`: the rewritten form of `k<<<grid, block, smem,
/// stream>>>(args...)` at line `line` of `file`. The call binds first and
/// captures the arguments; `operator*` with the kernel runs it.
struct Launch {
  const char *file;
  int line;
  const char *kernel;
  dim3 grid, block;
  cudaStream_t stream;
  Launch(const char *file, int line, const char *kernel, dim3 grid,
         dim3 block, size_t = 0, cudaStream_t stream = nullptr)
      : file(file), line(line), kernel(kernel), grid(grid), block(block),
        stream(stream) {}
  template <typename... A> Pending<A...> operator()(A &&...args) const {
    return Pending<A...>{file, line, kernel, grid, block, stream,
                         std::tuple<std::decay_t<A>...>(
                             std::forward<A>(args)...)};
  }
};

template <typename... P, typename... A>
void operator*(void (*kernel)(P...), Pending<A...> &&launch) {
  // Every thread receives its own copies of the arguments, converted to the
  // kernel's parameter types, as a device launch does; the launch keeps
  // the values it was given until it runs.
  run(launch.file, launch.line, launch.kernel, launch.grid,
      launch.block, launch.stream,
      [kernel, args = std::move(launch.args)] {
        std::apply([&](const auto &...a) { kernel(a...); }, args);
      });
}

template <typename T> T shuffle(unsigned mask, T value, int source) {
  static_assert(sizeof(T) <= sizeof(uint64_t) &&
                std::is_trivially_copyable_v<T>);
  uint64_t word = 0;
  std::memcpy(&word, &value, sizeof(T));
  const uint64_t *words = publish(mask, word);
  if (source >= 0 && source < lanes())
    word = words[source];
  T result;
  std::memcpy(&result, &word, sizeof(T));
  return result;
}

} // namespace kvc::emu

#define threadIdx (::kvc::emu::threadIndex)
#define blockIdx (::kvc::emu::blockIndex)
#define blockDim (::kvc::emu::blockDimension)
#define gridDim (::kvc::emu::gridDimension)

inline void __syncthreads() { ::kvc::emu::syncBlock(); }
inline void __syncwarp(unsigned mask = 0xffffffffu) {
  ::kvc::emu::syncWarp(mask);
}

template <typename T>
T __shfl_sync(unsigned mask, T value, int source, int width = 32) {
  const int lane = ::kvc::emu::laneId();
  return ::kvc::emu::shuffle(mask, value,
                             (lane & ~(width - 1)) + (source & (width - 1)));
}
template <typename T>
T __shfl_xor_sync(unsigned mask, T value, int laneMask, int width = 32) {
  const int lane = ::kvc::emu::laneId();
  const int source = lane ^ laneMask;
  return ::kvc::emu::shuffle(
      mask, value, (source & ~(width - 1)) == (lane & ~(width - 1)) ? source
                                                                    : lane);
}
template <typename T>
T __shfl_up_sync(unsigned mask, T value, unsigned delta, int width = 32) {
  const int lane = ::kvc::emu::laneId();
  const int source = lane - static_cast<int>(delta);
  return ::kvc::emu::shuffle(
      mask, value, source >= (lane & ~(width - 1)) ? source : lane);
}
inline unsigned __ballot_sync(unsigned mask, int predicate) {
  const uint64_t *words = ::kvc::emu::publish(mask, predicate ? 1 : 0);
  unsigned ballot = 0;
  for (int lane = 0; lane < ::kvc::emu::lanes(); ++lane)
    ballot |= static_cast<unsigned>(words[lane]) << lane;
  return ballot;
}

template <typename T> unsigned __match_any_sync(unsigned mask, T value) {
  static_assert(sizeof(T) <= sizeof(uint64_t) &&
                std::is_trivially_copyable_v<T>);
  uint64_t word = 0;
  std::memcpy(&word, &value, sizeof(T));
  const uint64_t *words = ::kvc::emu::publish(mask, word);
  unsigned peers = 0;
  for (int lane = 0; lane < ::kvc::emu::lanes(); ++lane)
    if ((mask >> lane & 1u) && words[lane] == word)
      peers |= 1u << lane;
  return peers;
}

template <typename T> T __ldg(const T *p) { return *p; }

// The device's overloaded min and max (the floating-point ones ignore a NaN
// operand, as fminf/fmaxf do).
template <typename A, typename B> constexpr auto max(A a, B b) {
  using C = std::common_type_t<A, B>;
  if constexpr (std::is_floating_point_v<C>)
    return std::fmax(C(a), C(b));
  else
    return C(a) < C(b) ? C(b) : C(a);
}
template <typename A, typename B> constexpr auto min(A a, B b) {
  using C = std::common_type_t<A, B>;
  if constexpr (std::is_floating_point_v<C>)
    return std::fmin(C(a), C(b));
  else
    return C(b) < C(a) ? C(b) : C(a);
}

inline int __popcll(unsigned long long x) { return __builtin_popcountll(x); }
inline int __popc(unsigned x) { return __builtin_popcount(x); }
inline int __ffs(int x) { return __builtin_ffs(x); }

// Single host thread: read-modify-write is atomic by construction. It is
// also where blocks communicate (an arrival count), so under
// KVC_EMU_CONCURRENT_BLOCKS the block pauses after it (afterAtomic).
template <typename T> T atomicAdd(T *address, T value) {
  const T old = *address;
  *address = old + value;
  ::kvc::emu::afterAtomic(address);
  return old;
}

// The IEEE round-to-nearest intrinsics. The emulator is compiled without
// floating-point contraction (-ffp-contract=off), so each is one rounding.
inline double __dadd_rn(double a, double b) { return a + b; }
inline double __dmul_rn(double a, double b) { return a * b; }
inline double __ddiv_rn(double a, double b) { return a / b; }
inline float __fadd_rn(float a, float b) { return a + b; }
inline float __fsub_rn(float a, float b) { return a - b; }
inline float __fmul_rn(float a, float b) { return a * b; }
inline float __fdiv_rn(float a, float b) { return a / b; }
inline float __double2float_rn(double a) { return static_cast<float>(a); }
template <typename To, typename From> To kvcEmuBitCast(From from) {
  static_assert(sizeof(To) == sizeof(From));
  To to;
  std::memcpy(&to, &from, sizeof to);
  return to;
}
inline float __uint_as_float(unsigned x) { return kvcEmuBitCast<float>(x); }
inline unsigned __float_as_uint(float f) {
  return kvcEmuBitCast<unsigned>(f);
}
inline float __int_as_float(int x) { return kvcEmuBitCast<float>(x); }
inline float rsqrtf(float x) { return 1.0f / std::sqrt(x); }

#endif // KVC_TEST_CUDAEMU_KVC_CUDA_EMU_H
