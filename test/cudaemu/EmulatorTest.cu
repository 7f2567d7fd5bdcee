//===- EmulatorTest.cu - The CUDA emulator's own semantics ----------------===//
//
// Kernels whose results on a device are known exactly, run on the emulator
// (built like the GPU test: launches rewritten, kvc_cuda_emu.h first):
//  - warp collectives: __shfl_sync, __shfl_xor_sync, __shfl_up_sync with a
//    width, __ballot_sync, __match_any_sync; the emulator's publishWords
//    (several words per lane, what the emulated mma.sync exchanges)
//    alternating with shuffles;
//  - __syncthreads orders shared memory: a block reverses an array through
//    it; threads that exit early do not hold the barrier;
//  - built-in variables of a 3-D grid of 2-D blocks;
//  - launch limits set cudaErrorInvalidConfiguration;
//  - failLaunches refuses the launches of the kernels it names with
//    cudaErrorLaunchOutOfResources, without running them;
//    failDeviceAllocations makes cudaMalloc and pool allocations fail with
//    cudaErrorMemoryAllocation, and not cudaMallocHost;
//  - a wait for a non-blocking stream finishes no other stream's event;
//  - device allocations start as kFreshByte, not zeros;
//  - the block orders of KVC_EMU_BLOCK_ORDER (forward, reverse, shuffle)
//    and the thread orders of KVC_EMU_THREAD_ORDER (forward, reverse);
//  - blocks in flight (KVC_EMU_CONCURRENT_BLOCKS): overlapping, at most N
//    open, each with its own shared memory, paused by an atomic on device
//    memory and not by one on shared memory, and a write made after
//    counting in that the last arrival misses;
//  - deferred device work (KVC_EMU_DEVICE_WORK=deferred): what runs at
//    each kind of wait, and what a copy reads from pinned and pageable
//    memory;
//  - programmatic dependents (markDependentLaunch, awaitPriorGrids): with
//    deferred work, a dependent of a queued kernel reads that kernel's
//    results only after its wait (a thread that never waits, never), its
//    waiting threads go on once the rest of the block waits at a barrier,
//    an event record between the two changes nothing, and a copy between
//    them, a wait for the stream, or immediate work makes it an ordinary
//    launch; a graph's replay keeps the dependence.
// With an argument, it runs one kernel that must be reported instead (ctest
// matches the report):
//  - `deadlock`: lanes of a warp wait at different barriers;
//  - `deadlock-through-template`: the same in a kernel template's instance
//    that a function template launches through its parameter;
//  - `partial-mask`: a collective with a partial mask;
//  - `device-overflow` and `shared-overflow` (the AddressSanitizer build):
//    a write one element past a cudaMalloc'd buffer, and past a __shared__
//    array;
//  - `release-before-wait`: a dependent that started early releases its
//    own dependents before its wait;
//  - `misaligned-vector`, `wide-shift` and `float-cast` (the same build,
//    under UBSan's alignment, shift and float-cast-overflow checks): three
//    operations that a device and the host do differently, so that a
//    kernel that passes on the emulator could fail or differ on a GPU: a
//    16-byte load from an address 4 bytes past a 16-byte boundary (a
//    misaligned address fault on a device, a plain load on x86), a shift
//    of a 32-bit word by 32 (0 on a device, whose shifts clamp; the word
//    itself on x86, whose shifts take the count mod 32), and a float
//    beyond int's range converted to int (saturated on a device,
//    INT_MIN on x86).
//
//===----------------------------------------------------------------------===//

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

namespace {

constexpr unsigned kFull = 0xffffffffu;

int failures = 0;

void expect(bool ok, const char *what) {
  if (!ok) {
    std::printf("FAIL: %s\n", what);
    ++failures;
  }
}

__global__ void collectives(int *out) {
  const int t = threadIdx.x, lane = t % 32;
  const int base = t * 7;
  out[base + 0] = __shfl_sync(kFull, t * 10, 3);          // lane 3 of my warp
  out[base + 1] = __shfl_xor_sync(kFull, t, 1);           // neighbour
  out[base + 2] = __shfl_up_sync(kFull, t, 2);            // 2 below, or mine
  out[base + 3] = __shfl_xor_sync(kFull, t, 8, 16);       // within 16 lanes
  out[base + 4] = static_cast<int>(__ballot_sync(kFull, lane % 3 == 0));
  int sum = lane;
  for (int o = 16; o > 0; o /= 2)
    sum += __shfl_xor_sync(kFull, sum, o);
  out[base + 5] = sum;
  out[base + 6] = static_cast<int>(__match_any_sync(kFull, lane / 5));
}

/// Rounds of two three-word exchanges and a shuffle: in round r lane l
/// reads word r % 3 of lane (l + r + 1) % 32 in the first exchange, word (r
/// + 1) % 3 of lane (l + 31 - r) % 32 in the second, then the shuffled word
/// of lane (l + 5) % 32. A lane runs ahead of its warp to its next
/// collective, so neither exchange may overwrite what a slower lane has
/// still to read of the one before.
__global__ void wideExchange(uint64_t *out) {
  constexpr int kRounds = 4;
  const int t = threadIdx.x, lane = t % 32;
  for (int r = 0; r < kRounds; ++r) {
    uint64_t *o = out + (t * kRounds + r) * 3;
    for (int e = 0; e < 2; ++e) {
      uint64_t words[3];
      for (int i = 0; i < 3; ++i)
        words[i] = uint64_t(t) << 32 | uint64_t(100 * e + 3 * r + i);
      const uint64_t *w = ::kvc::emu::publishWords(kFull, words, 3);
      const int source = e == 0 ? (lane + r + 1) % 32 : (lane + 31 - r) % 32;
      o[e] = w[source * ::kvc::emu::kPublishWords + (r + e) % 3];
    }
    o[2] = __shfl_sync(kFull, uint64_t(t) * 1000 + r, (lane + 5) % 32);
  }
}

__global__ void reverse(const int *in, int *out, int n) {
  __shared__ int staged[256];
  const int t = threadIdx.x;
  staged[t] = in[t];
  __syncthreads();
  out[t] = staged[n - 1 - t];
}

__global__ void earlyExit(int *out) {
  __shared__ int total;
  if (threadIdx.x == 0)
    total = 0;
  __syncthreads();
  if (threadIdx.x >= 48)
    return; // the barrier below waits for the 48 live threads only
  atomicAdd(&total, 1);
  __syncthreads();
  if (threadIdx.x == 0)
    *out = total;
}

__global__ void indices(int *out) {
  const int block =
      blockIdx.x + gridDim.x * (blockIdx.y + gridDim.y * blockIdx.z);
  const int thread = threadIdx.x + blockDim.x * threadIdx.y;
  out[block * blockDim.x * blockDim.y + thread] = block * 1000 + thread;
}

__global__ void nothing() {}

/// Thread 0 of each block writes the order in which its block ran at the
/// block's linear index (the emulator runs one block at a time).
__global__ void blockTurns(int *next, int *turns) {
  if (threadIdx.x == 0)
    turns[blockIdx.x + gridDim.x * (blockIdx.y + gridDim.y * blockIdx.z)] =
        (*next)++;
}

__global__ void deadlock() {
  if (threadIdx.x % 32 == 0)
    __syncwarp();
  else
    __syncthreads();
}

/// deadlock's barriers in a kernel template, launched through a template
/// parameter as kvc::cuda::launchDependent launches: the report names the
/// instance (`deadlockIn<3>`), not the parameter.
template <int N> __global__ void deadlockIn() {
  if (threadIdx.x % 32 == N)
    __syncwarp();
  else
    __syncthreads();
}

template <auto Kernel> void launchThrough() { Kernel<<<1, 64>>>(); }

__global__ void partialMask(int *out) {
  out[threadIdx.x] = __shfl_sync(0x0000ffffu, 1, 0);
}

__global__ void writeAt(int *out, int index) { out[index] = 1; }

__global__ void misalignedVector(const int *in, int offset, int *out) {
  const uint4 v = *reinterpret_cast<const uint4 *>(in + offset);
  *out = static_cast<int>(v.x + v.y + v.z + v.w);
}

__global__ void wideShift(uint32_t word, int bits, int *out) {
  *out = static_cast<int>(word >> bits);
}

__global__ void floatCast(float x, int *out) { *out = static_cast<int>(x); }

__global__ void sharedOverflow(int index, int *out) {
  __shared__ int staged[32];
  staged[threadIdx.x] = 0;
  __syncthreads();
  if (threadIdx.x == 0) {
    staged[index] = 1;
    *out = staged[0];
  }
}

void checkCollectives() {
  constexpr int kThreads = 64;
  int *d = nullptr;
  cudaMalloc(&d, sizeof(int) * kThreads * 7);
  collectives<<<1, kThreads>>>(d);
  std::vector<int> h(kThreads * 7);
  cudaMemcpy(h.data(), d, sizeof(int) * h.size(), cudaMemcpyDeviceToHost);
  cudaFree(d);
  unsigned ballot = 0;
  for (int lane = 0; lane < 32; ++lane)
    ballot |= (lane % 3 == 0 ? 1u : 0u) << lane;
  bool ok = true;
  for (int t = 0; t < kThreads; ++t) {
    const int lane = t % 32, warp0 = t - lane;
    const int *r = &h[t * 7];
    unsigned peers = 0;
    for (int other = 0; other < 32; ++other)
      peers |= (other / 5 == lane / 5 ? 1u : 0u) << other;
    ok &= r[0] == (warp0 + 3) * 10;
    ok &= r[1] == (t ^ 1);
    ok &= r[2] == (lane >= 2 ? t - 2 : t);
    ok &= r[3] == (t ^ 8);
    ok &= static_cast<unsigned>(r[4]) == ballot;
    ok &= r[5] == 31 * 32 / 2;
    ok &= static_cast<unsigned>(r[6]) == peers;
  }
  expect(ok, "warp collectives");
}

void checkWideExchange() {
  constexpr int kThreads = 64, kRounds = 4;
  uint64_t *d = nullptr;
  cudaMalloc(&d, sizeof(uint64_t) * kThreads * kRounds * 3);
  wideExchange<<<1, kThreads>>>(d);
  std::vector<uint64_t> h(kThreads * kRounds * 3);
  cudaMemcpy(h.data(), d, sizeof(uint64_t) * h.size(), cudaMemcpyDeviceToHost);
  cudaFree(d);
  bool ok = true;
  for (int t = 0; t < kThreads; ++t) {
    const int lane = t % 32, warp0 = t - lane;
    for (int r = 0; r < kRounds; ++r) {
      const uint64_t *o = &h[(t * kRounds + r) * 3];
      const uint64_t first = warp0 + (lane + r + 1) % 32;
      const uint64_t second = warp0 + (lane + 31 - r) % 32;
      ok &= o[0] == (first << 32 | uint64_t(3 * r + r % 3));
      ok &= o[1] == (second << 32 | uint64_t(100 + 3 * r + (r + 1) % 3));
      ok &= o[2] == uint64_t(warp0 + (lane + 5) % 32) * 1000 + r;
    }
  }
  expect(ok, "publishWords twice, then a shuffle");
}

void checkBarriers() {
  constexpr int kThreads = 256;
  std::vector<int> in(kThreads), out(kThreads);
  for (int i = 0; i < kThreads; ++i)
    in[i] = i * 7 + 1;
  int *dIn = nullptr, *dOut = nullptr;
  cudaMalloc(&dIn, sizeof(int) * kThreads);
  cudaMalloc(&dOut, sizeof(int) * kThreads);
  cudaMemcpy(dIn, in.data(), sizeof(int) * kThreads, cudaMemcpyHostToDevice);
  reverse<<<1, kThreads>>>(dIn, dOut, kThreads);
  cudaMemcpy(out.data(), dOut, sizeof(int) * kThreads, cudaMemcpyDeviceToHost);
  bool ok = true;
  for (int i = 0; i < kThreads; ++i)
    ok &= out[i] == in[kThreads - 1 - i];
  expect(ok, "__syncthreads orders shared memory");
  earlyExit<<<1, 64>>>(dOut);
  int total = 0;
  cudaMemcpy(&total, dOut, sizeof total, cudaMemcpyDeviceToHost);
  expect(total == 48, "exited threads do not hold __syncthreads");
  cudaFree(dIn);
  cudaFree(dOut);
}

void checkIndices() {
  const dim3 grid(3, 2, 2), block(8, 4);
  const int blocks = 12, threads = 32;
  int *d = nullptr;
  cudaMalloc(&d, sizeof(int) * blocks * threads);
  indices<<<grid, block>>>(d);
  std::vector<int> h(blocks * threads);
  cudaMemcpy(h.data(), d, sizeof(int) * h.size(), cudaMemcpyDeviceToHost);
  cudaFree(d);
  bool ok = true;
  for (int b = 0; b < blocks; ++b)
    for (int t = 0; t < threads; ++t)
      ok &= h[b * threads + t] == b * 1000 + t;
  expect(ok, "blockIdx, threadIdx, gridDim, blockDim of a 3-D grid");
}

void checkLimits() {
  cudaGetLastError();
  nothing<<<1, 1024>>>();
  expect(cudaGetLastError() == cudaSuccess, "1024 threads launch");
  nothing<<<1, 1025>>>();
  expect(cudaGetLastError() == cudaErrorInvalidConfiguration,
         "1025 threads are refused");
  nothing<<<dim3(1, 65536), 32>>>();
  expect(cudaGetLastError() == cudaErrorInvalidConfiguration,
         "grid y of 65536 is refused");
  expect(cudaGetLastError() == cudaSuccess, "the error is cleared once read");
}

/// failLaunches: a launch of a kernel whose name holds the text is refused
/// and does not run; the others run; nullptr refuses none again.
void checkRefusedLaunches() {
  int *d = nullptr;
  cudaMalloc(&d, sizeof(int) * 32);
  cudaMemset(d, 0, sizeof(int) * 32);
  cudaGetLastError();
  ::kvc::emu::failLaunches("indices");
  nothing<<<1, 32>>>();
  expect(cudaGetLastError() == cudaSuccess,
         "a kernel failLaunches does not name launches");
  indices<<<1, 32>>>(d);
  expect(cudaGetLastError() == cudaErrorLaunchOutOfResources,
         "a kernel failLaunches names is refused");
  expect(!std::strcmp(cudaGetErrorString(cudaErrorLaunchOutOfResources),
                      "too many resources requested for launch"),
         "the refusal's message");
  int first = -1;
  cudaMemcpy(&first, d + 1, sizeof first, cudaMemcpyDeviceToHost);
  expect(first == 0, "a refused kernel does not run");
  ::kvc::emu::failLaunches(nullptr);
  indices<<<1, 32>>>(d);
  cudaMemcpy(&first, d + 1, sizeof first, cudaMemcpyDeviceToHost);
  expect(cudaGetLastError() == cudaSuccess && first == 1,
         "after failLaunches(nullptr) the kernel runs again");
  cudaFree(d);
}

/// A wait for a non-blocking stream waits for that stream's work only:
/// an event recorded on another stream and held unfinished stays so, until
/// a wait for the legacy default stream.
void checkStreams() {
  cudaStream_t own = nullptr;
  cudaEvent_t event = nullptr;
  expect(cudaStreamCreateWithFlags(&own, cudaStreamNonBlocking) ==
                 cudaSuccess &&
             cudaEventCreate(&event) == cudaSuccess,
         "a non-blocking stream and an event");
  kvc::emu::holdEvents(true);
  cudaEventRecord(event, nullptr);
  const uint64_t waits = kvc::emu::counters().nonBlockingWaits;
  expect(cudaStreamSynchronize(own) == cudaSuccess &&
             kvc::emu::counters().nonBlockingWaits == waits + 1,
         "a wait for a non-blocking stream is counted as one");
  expect(cudaEventQuery(event) == cudaErrorNotReady,
         "a wait for a non-blocking stream leaves another stream's event "
         "unfinished");
  cudaStreamSynchronize(nullptr);
  expect(cudaEventQuery(event) == cudaSuccess &&
             kvc::emu::counters().nonBlockingWaits == waits + 1,
         "a wait for the default stream finishes it");
  kvc::emu::holdEvents(false);
  cudaEventDestroy(event);
  cudaStreamDestroy(own);
}

/// A memory pool of the device.
cudaMemPool_t devicePool() {
  cudaMemPool_t pool = nullptr;
  cudaMemPoolProps props = {};
  props.allocType = cudaMemAllocationTypePinned;
  props.location.type = cudaMemLocationTypeDevice;
  expect(cudaMemPoolCreate(&pool, &props) == cudaSuccess, "a memory pool");
  return pool;
}

/// Device allocations, from cudaMalloc and from a pool, small and large,
/// start as kvc::emu::kFreshByte in every byte, not as the zeros of fresh
/// host pages.
void checkFreshMemory() {
  cudaMemPool_t pool = devicePool();
  for (size_t bytes : {size_t{40}, size_t{4} << 20})
    for (bool fromPool : {false, true}) {
      unsigned char *d = nullptr;
      const cudaError_t error =
          fromPool ? cudaMallocFromPoolAsync(reinterpret_cast<void **>(&d),
                                             bytes, pool, nullptr)
                   : cudaMalloc(&d, bytes);
      bool filled = error == cudaSuccess && d;
      for (size_t i = 0; filled && i < bytes; ++i)
        filled = d[i] == kvc::emu::kFreshByte;
      expect(filled, fromPool ? "a pool allocation starts as kFreshByte"
                              : "a cudaMalloc allocation starts as "
                                "kFreshByte");
      if (fromPool)
        cudaFreeAsync(d, nullptr);
      else
        cudaFree(d);
    }
  cudaMemPoolDestroy(pool);
}

/// failDeviceAllocations: device allocations fail and leave a null
/// pointer, pinned host memory does not; then they succeed again.
void checkRefusedAllocations() {
  cudaMemPool_t pool = devicePool();
  cudaGetLastError();
  ::kvc::emu::failDeviceAllocations(true);
  void *d = &d, *p = &p, *h = nullptr;
  expect(cudaMalloc(&d, 64) == cudaErrorMemoryAllocation && !d,
         "a refused cudaMalloc");
  expect(cudaMallocFromPoolAsync(&p, 64, pool, nullptr) ==
                 cudaErrorMemoryAllocation &&
             !p,
         "a refused pool allocation");
  expect(cudaGetLastError() == cudaErrorMemoryAllocation,
         "the refusal is the last error");
  expect(cudaMallocHost(&h, 64) == cudaSuccess && h,
         "pinned host memory while device allocations are refused");
  cudaFreeHost(h);
  ::kvc::emu::failDeviceAllocations(false);
  expect(cudaMalloc(&d, 64) == cudaSuccess && d,
         "cudaMalloc once allocations are allowed again");
  cudaFree(d);
  cudaMemPoolDestroy(pool);
}

/// `run()` with the environment variable `name` set to `value` (null:
/// unset), then as it was.
template <typename Run>
auto withSetting(const char *name, const char *value, Run run) {
  const char *was = std::getenv(name);
  const std::string saved = was ? was : "";
  if (value)
    setenv(name, value, 1);
  else
    unsetenv(name);
  auto result = run();
  if (was)
    setenv(name, saved.c_str(), 1);
  else
    unsetenv(name);
  return result;
}

/// Thread t of a block of 64 writes when it ran in three rounds: before any
/// barrier, after a __syncwarp, after a __syncthreads (a device counter
/// read and incremented by one thread at a time, as the emulator runs them).
__global__ void threadTurns(int *next, int *turns) {
  const int t = threadIdx.x;
  turns[t] = (*next)++;
  __syncwarp();
  turns[64 + t] = (*next)++;
  __syncthreads();
  turns[128 + t] = (*next)++;
}

/// Turns of threadTurns under KVC_EMU_THREAD_ORDER `order` (null: unset).
std::vector<int> threadTurnsUnder(const char *order) {
  return withSetting("KVC_EMU_THREAD_ORDER", order, [] {
    int *d = nullptr;
    cudaMalloc(&d, sizeof(int) * (1 + 3 * 64));
    cudaMemset(d, 0, sizeof(int) * (1 + 3 * 64));
    threadTurns<<<1, 64>>>(d, d + 1);
    std::vector<int> turns(3 * 64);
    cudaMemcpy(turns.data(), d + 1, sizeof(int) * turns.size(),
               cudaMemcpyDeviceToHost);
    cudaFree(d);
    return turns;
  });
}

/// KVC_EMU_THREAD_ORDER: warps from the first and lanes from the lowest by
/// default and as `forward`; under `reverse` warps from the last and lanes
/// from the highest, after a warp barrier and a block barrier too.
void checkThreadOrder() {
  std::vector<int> forward(3 * 64), reverse(3 * 64);
  for (int t = 0; t < 64; ++t) {
    // Round 0: warp 0's lanes, then warp 1's; round 1 (after __syncwarp):
    // each warp passes its own barrier, so warp 0 runs its second round
    // before warp 1 starts its first; round 2 after the block barrier.
    const int w = t / 32, lane = t % 32;
    forward[t] = 64 * w + lane;
    forward[64 + t] = 64 * w + 32 + lane;
    forward[128 + t] = 128 + t;
    reverse[t] = 64 * (1 - w) + 31 - lane;
    reverse[64 + t] = 64 * (1 - w) + 32 + 31 - lane;
    reverse[128 + t] = 128 + 63 - t;
  }
  expect(threadTurnsUnder(nullptr) == forward,
         "threads run warp by warp, lanes in order, by default");
  expect(threadTurnsUnder("forward") == forward,
         "KVC_EMU_THREAD_ORDER=forward: the default order");
  expect(threadTurnsUnder("reverse") == reverse,
         "KVC_EMU_THREAD_ORDER=reverse: warps from the last, lanes from the "
         "highest");
}

/// Turns of the 60 blocks of a 5 x 4 x 3 grid under KVC_EMU_BLOCK_ORDER
/// `order` (null: unset): turns[b] is when linear block b ran.
std::vector<int> blockTurnsUnder(const char *order) {
  return withSetting("KVC_EMU_BLOCK_ORDER", order, [] {
    const int blocks = 60;
    int *d = nullptr;
    cudaMalloc(&d, sizeof(int) * (blocks + 1));
    cudaMemset(d, 0, sizeof(int) * (blocks + 1));
    blockTurns<<<dim3(5, 4, 3), 64>>>(d, d + 1);
    std::vector<int> turns(blocks);
    cudaMemcpy(turns.data(), d + 1, sizeof(int) * blocks,
               cudaMemcpyDeviceToHost);
    cudaFree(d);
    return turns;
  });
}

/// KVC_EMU_BLOCK_ORDER: blockIdx order by default and as `forward`, its
/// reverse, and under `shuffle` a permutation that is neither and that
/// differs from one launch to the next and from one seed to another.
void checkBlockOrder() {
  const int blocks = 60;
  std::vector<int> forward(blocks), reverse(blocks);
  for (int b = 0; b < blocks; ++b) {
    forward[b] = b;
    reverse[b] = blocks - 1 - b;
  }
  expect(blockTurnsUnder(nullptr) == forward,
         "blocks run in blockIdx order (x fastest) by default");
  expect(blockTurnsUnder("forward") == forward,
         "KVC_EMU_BLOCK_ORDER=forward: blockIdx order");
  expect(blockTurnsUnder("reverse") == reverse,
         "KVC_EMU_BLOCK_ORDER=reverse: the reverse of blockIdx order");
  const std::vector<int> first = blockTurnsUnder("shuffle");
  const std::vector<int> second = blockTurnsUnder("shuffle");
  const std::vector<int> seeded = blockTurnsUnder("shuffle:12345");
  for (const std::vector<int> *turns : {&first, &second, &seeded}) {
    std::vector<bool> seen(blocks, false);
    bool permutation = true;
    for (int t : *turns) {
      permutation &= t >= 0 && t < blocks && !seen[t];
      if (t >= 0 && t < blocks)
        seen[t] = true;
    }
    expect(permutation && *turns != forward && *turns != reverse,
           "KVC_EMU_BLOCK_ORDER=shuffle: every block once, in neither "
           "blockIdx order nor its reverse");
  }
  expect(first != second, "KVC_EMU_BLOCK_ORDER=shuffle: a new order per "
                          "launch");
  expect(seeded != first && seeded != second,
         "KVC_EMU_BLOCK_ORDER=shuffle:SEED: another seed, other orders");
}

/// Thread 0 of each block logs its block's start and end (2 b and 2 b + 1)
/// at the places a device counter hands out, a barrier between them (where
/// a block pauses after an atomic under KVC_EMU_CONCURRENT_BLOCKS). It
/// keeps its block index in shared memory across that barrier.
__global__ void inFlight(int *counter, int *events, int *kept) {
  __shared__ int mine;
  if (threadIdx.x == 0) {
    mine = static_cast<int>(blockIdx.x);
    events[atomicAdd(counter, 1)] = 2 * static_cast<int>(blockIdx.x);
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    kept[blockIdx.x] = mine;
    events[atomicAdd(counter, 1)] = 2 * static_cast<int>(blockIdx.x) + 1;
  }
  __syncthreads();
}

/// A race that one block at a time cannot show: each block counts itself
/// in, then writes its flag; the last to arrive counts the flags set.
__global__ void lateWriter(int *arrivals, int *flags, int *seen) {
  __shared__ bool last;
  if (threadIdx.x == 0)
    last = atomicAdd(arrivals, 1) == static_cast<int>(gridDim.x) - 1;
  __syncthreads();
  if (threadIdx.x == 0)
    flags[blockIdx.x] = 1; // after the arrival: the bug
  __syncthreads();
  if (last && threadIdx.x == 0) {
    int set = 0;
    for (unsigned b = 0; b < gridDim.x; ++b)
      set += flags[b] == 1;
    *seen = set;
  }
}

/// inFlight's log without atomics on device memory (a device counter read
/// and incremented by thread 0, as blocks never overlap between pauses),
/// and an atomic on shared memory between start and end, which must not
/// pause the block.
__global__ void sharedAtomic(int *next, int *events) {
  __shared__ int count;
  if (threadIdx.x == 0) {
    count = 0;
    events[(*next)++] = 2 * static_cast<int>(blockIdx.x);
  }
  __syncthreads();
  atomicAdd(&count, 1);
  __syncthreads();
  if (threadIdx.x == 0)
    events[(*next)++] = 2 * static_cast<int>(blockIdx.x) + (count == 64);
}

struct FlightLog {
  std::vector<int> events, kept, sharedEvents;
  /// The fewest flags that the last arrival of kLateLaunches launches of
  /// lateWriter saw.
  int lateSeen = 0;
};
constexpr int kLateLaunches = 8;

/// inFlight, then lateWriter kLateLaunches times, over 16 blocks of 64
/// threads under KVC_EMU_CONCURRENT_BLOCKS `setting` (null: unset).
FlightLog flightUnder(const char *setting) {
  return withSetting("KVC_EMU_CONCURRENT_BLOCKS", setting, [] {
    const int blocks = 16;
    int *d = nullptr;
    const int words = 1 + 2 * blocks + blocks + 1 + blocks + 1 + 1 +
                      2 * blocks;
    cudaMalloc(&d, sizeof(int) * words);
    cudaMemset(d, 0, sizeof(int) * words);
    int *events = d + 1, *kept = events + 2 * blocks;
    int *arrivals = kept + blocks, *flags = arrivals + 1,
        *seen = flags + blocks, *next = seen + 1,
        *sharedEvents = next + 1;
    inFlight<<<blocks, 64>>>(d, events, kept);
    sharedAtomic<<<blocks, 64>>>(next, sharedEvents);
    FlightLog log;
    log.lateSeen = blocks;
    for (int i = 0; i < kLateLaunches; ++i) {
      cudaMemset(arrivals, 0, sizeof(int) * (blocks + 2));
      lateWriter<<<blocks, 64>>>(arrivals, flags, seen);
      int set = 0;
      cudaMemcpy(&set, seen, sizeof(int), cudaMemcpyDeviceToHost);
      log.lateSeen = std::min(log.lateSeen, set);
    }
    log.events.resize(2 * blocks);
    log.kept.resize(blocks);
    log.sharedEvents.resize(2 * blocks);
    cudaMemcpy(log.sharedEvents.data(), sharedEvents,
               sizeof(int) * 2 * blocks, cudaMemcpyDeviceToHost);
    cudaMemcpy(log.events.data(), events, sizeof(int) * 2 * blocks,
               cudaMemcpyDeviceToHost);
    cudaMemcpy(log.kept.data(), kept, sizeof(int) * blocks,
               cudaMemcpyDeviceToHost);
    cudaFree(d);
    return log;
  });
}

/// KVC_EMU_CONCURRENT_BLOCKS: one block at a time by default; with N in
/// flight, blocks overlap (at most N open at once), each keeps its own
/// shared memory, and the late writer's race shows.
void checkConcurrentBlocks() {
  const int blocks = 16;
  std::vector<int> sequential(2 * blocks);
  for (int i = 0; i < 2 * blocks; ++i)
    sequential[i] = i;
  const FlightLog one = flightUnder(nullptr);
  expect(one.events == sequential,
         "blocks run one after another by default");
  expect(one.lateSeen == blocks,
         "one block at a time: the last arrival sees every late write, "
         "launch after launch");
  expect(flightUnder("1").events == sequential,
         "KVC_EMU_CONCURRENT_BLOCKS=1: one block at a time");
  const struct {
    const char *setting;
    int inFlight;
  } settings[] = {{"4", 4}, {"3:99", 3}, {"16:7", 16}};
  for (const auto &[setting, inFlight] : settings) {
    const FlightLog log = flightUnder(setting);
    std::vector<int> started(blocks, 0), ended(blocks, 0);
    int open = 0, widest = 0;
    bool ordered = true;
    for (int e : log.events) {
      if (e < 0 || e >= 2 * blocks) {
        ordered = false;
        continue;
      }
      const int b = e / 2;
      if (e % 2 == 0) {
        ordered &= ++started[b] == 1 && ended[b] == 0;
        widest = std::max(widest, ++open);
      } else {
        ordered &= started[b] == 1 && ++ended[b] == 1;
        --open;
      }
    }
    expect(ordered && open == 0,
           "blocks in flight: every block starts once, then ends once");
    expect(widest > 1 && widest <= inFlight,
           "KVC_EMU_CONCURRENT_BLOCKS=N: blocks overlap, at most N open");
    bool kept = true;
    for (int b = 0; b < blocks; ++b)
      kept &= log.kept[b] == b;
    expect(kept, "blocks in flight keep their own shared memory");
    // sharedAtomic: start 2 b, end 2 b + 1 (with the block's 64 adds).
    std::vector<int> oneByOne(2 * blocks);
    for (int i = 0; i < 2 * blocks; ++i)
      oneByOne[i] = i;
    expect(log.sharedEvents == oneByOne,
           "blocks in flight: an atomic on shared memory does not pause");
    expect(log.lateSeen < blocks,
           "blocks in flight: the last arrival misses a write made after "
           "counting in, in one launch or more");
  }
}

__global__ void setWord(int *word, int value) { *word = value; }

/// KVC_EMU_DEVICE_WORK: by default a kernel has run when its launch
/// returns; deferred, a stream's work runs when the host waits for it (a
/// stream, an event, a synchronous copy), in order, and not before.
void checkDeferredWork() {
  int *pinned = nullptr, *device = nullptr;
  cudaMallocHost(reinterpret_cast<void **>(&pinned), 4 * sizeof(int));
  cudaMalloc(&device, 4 * sizeof(int));
  pinned[0] = 0;
  withSetting("KVC_EMU_DEVICE_WORK", nullptr, [&] {
    setWord<<<1, 1>>>(pinned, 3);
    return 0;
  });
  expect(pinned[0] == 3, "by default a kernel has run when its launch "
                         "returns");
  withSetting("KVC_EMU_DEVICE_WORK", "deferred", [&] {
    cudaStream_t a = nullptr, b = nullptr, blocking = nullptr;
    cudaStreamCreateWithFlags(&a, cudaStreamNonBlocking);
    cudaStreamCreateWithFlags(&b, cudaStreamNonBlocking);
    cudaStreamCreate(&blocking);
    cudaEvent_t event = nullptr;
    cudaEventCreate(&event);
    pinned[0] = 0;
    pinned[1] = 0;
    setWord<<<1, 1, 0, a>>>(pinned, 1);
    cudaEventRecord(event, a);
    setWord<<<1, 1, 0, a>>>(pinned + 1, 2);
    expect(pinned[0] == 0, "deferred: a kernel has not run before the host "
                           "waits for it");
    expect(cudaEventQuery(event) == cudaErrorNotReady,
           "deferred: an event whose work is queued is not ready");
    cudaStreamSynchronize(b);
    expect(pinned[0] == 0, "deferred: waiting for one non-blocking stream "
                           "runs nothing of another");
    cudaEventSynchronize(event);
    expect(pinned[0] == 1 && pinned[1] == 0,
           "deferred: an event's wait runs its stream's work up to the "
           "record, not beyond");
    expect(cudaEventQuery(event) == cudaSuccess,
           "deferred: an event is ready once its work ran");
    cudaStreamSynchronize(a);
    expect(pinned[1] == 2, "deferred: a stream's wait runs its work");
    // A copy from pinned memory reads it when it runs; one from pageable
    // memory at the call; one into pageable memory returns when it ran.
    int pageable = 5, back[2] = {0, 0};
    pinned[2] = 5;
    cudaMemcpyAsync(device, pinned + 2, sizeof(int), cudaMemcpyHostToDevice,
                    a);
    cudaMemcpyAsync(device + 1, &pageable, sizeof(int),
                    cudaMemcpyHostToDevice, a);
    pinned[2] = 6;
    pageable = 6;
    cudaMemcpyAsync(back, device, sizeof back, cudaMemcpyDeviceToHost, a);
    expect(back[0] == 6 && back[1] == 5,
           "deferred: a copy reads pinned memory when it runs, pageable "
           "memory at the call");
    // The legacy stream waits for the blocking streams' work.
    setWord<<<1, 1, 0, blocking>>>(device + 2, 7);
    int word = 0;
    cudaMemcpy(&word, device + 2, sizeof(int), cudaMemcpyDeviceToHost);
    expect(word == 7, "deferred: a synchronous copy waits for a blocking "
                      "stream's work");
    setWord<<<1, 1, 0, b>>>(pinned + 3, 8);
    pinned[3] = 0;
    cudaDeviceSynchronize();
    expect(pinned[3] == 8, "deferred: the device's wait runs everything");
    cudaEventDestroy(event);
    cudaStreamDestroy(a);
    cudaStreamDestroy(b);
    cudaStreamDestroy(blocking);
    return 0;
  });
  cudaFree(device);
  cudaFreeHost(pinned);
}

__global__ void addWord(int *word, int value) { *word += value; }

/// Stream capture: the captured work does not run at the capture, and
/// runs in order, with its captured arguments, at every launch of the
/// graph; a call a device refuses during a global-mode capture fails and
/// invalidates it; immediate and deferred work alike.
void checkCapture() {
  for (const char *work : {static_cast<const char *>(nullptr), "deferred"})
    withSetting("KVC_EMU_DEVICE_WORK", work, [&] {
      int *pinned = nullptr, *device = nullptr;
      cudaMallocHost(reinterpret_cast<void **>(&pinned), 2 * sizeof(int));
      cudaMalloc(&device, sizeof(int));
      cudaStream_t s = nullptr;
      cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
      pinned[0] = 1;
      pinned[1] = 0;
      expect(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal) ==
                 cudaSuccess,
             "capture: begins on a stream of the program's own");
      cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
      cudaStreamIsCapturing(s, &status);
      expect(status == cudaStreamCaptureStatusActive,
             "capture: the stream reports it");
      cudaMemcpyAsync(device, pinned, sizeof(int), cudaMemcpyHostToDevice, s);
      addWord<<<1, 1, 0, s>>>(device, 10);
      cudaMemcpyAsync(pinned + 1, device, sizeof(int),
                      cudaMemcpyDeviceToHost, s);
      cudaGraph_t graph = nullptr;
      expect(cudaStreamEndCapture(s, &graph) == cudaSuccess && graph,
             "capture: ends with a graph");
      cudaStreamSynchronize(s);
      expect(pinned[1] == 0, "capture: the captured work does not run");
      cudaGraphExec_t exec = nullptr;
      cudaGraphInstantiate(&exec, graph, 0);
      cudaGraphDestroy(graph);
      pinned[0] = 2;
      cudaGraphLaunch(exec, s);
      cudaStreamSynchronize(s);
      expect(pinned[1] == 12, "graph: a launch runs the work in order, "
                              "reading pinned memory when it runs");
      pinned[0] = 5;
      cudaGraphLaunch(exec, s);
      cudaStreamSynchronize(s);
      expect(pinned[1] == 15, "graph: every launch runs it again");
      cudaGraphExecDestroy(exec);

      // A wait during the capture: refused, the capture invalidated.
      cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal);
      addWord<<<1, 1, 0, s>>>(device, 1);
      expect(cudaStreamSynchronize(s) == cudaErrorStreamCaptureUnsupported,
             "capture: a stream's wait is refused");
      cudaGetLastError();
      int *more = nullptr;
      expect(cudaMalloc(&more, 4) == cudaErrorStreamCaptureUnsupported,
             "capture: an allocation is refused");
      cudaGetLastError();
      graph = nullptr;
      expect(cudaStreamEndCapture(s, &graph) ==
                     cudaErrorStreamCaptureInvalidated &&
                 !graph,
             "capture: a refused call invalidates it");
      cudaGetLastError();
      cudaStreamDestroy(s);
      cudaFree(device);
      cudaFreeHost(pinned);
      return 0;
    });
}

__global__ void fillWords(int *words, int value) {
  words[threadIdx.x] = value;
}

/// Thread t reads word t before awaitPriorGrids and again after; the
/// threads t % 4 == 3 never wait.
__global__ void readAroundWait(const int *words, int *seen) {
  const int t = threadIdx.x;
  const int early = words[t];
  if (t % 4 != 3)
    kvc::emu::awaitPriorGrids();
  seen[2 * t] = early;
  seen[2 * t + 1] = words[t];
}

/// Lets its own dependents start before it has waited for the kernel
/// ahead of it (the `release-before-wait` case).
__global__ void releaseBeforeWait(int *words) {
  kvc::emu::releaseDependents();
  kvc::emu::awaitPriorGrids();
  words[threadIdx.x] = 3;
}

/// Thread 0 waits, then every thread reads its word after a barrier.
__global__ void waitThenBarrier(const int *words, int *seen) {
  const int t = threadIdx.x;
  if (t == 0)
    kvc::emu::awaitPriorGrids();
  __syncthreads();
  seen[t] = words[t];
}

/// KVC_EMU_DEVICE_WORK=deferred: a dependent launched behind a queued
/// kernel (fillWords, which turns every word from 1 to 2) reads 1 before
/// its wait and 2 after; whatever ends the kernel before the dependent may
/// start makes it read 2 throughout.
void checkDependentLaunch() {
  constexpr int kThreads = 64;
  int *words = nullptr, *seen = nullptr, *other = nullptr;
  cudaMalloc(&words, kThreads * sizeof(int));
  cudaMalloc(&seen, 2 * kThreads * sizeof(int));
  cudaMalloc(&other, sizeof(int));
  cudaStream_t s = nullptr;
  cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
  cudaEvent_t event = nullptr;
  cudaEventCreate(&event);
  const std::vector<int> ones(kThreads, 1);
  // Runs `between` after the primary and before the dependent, and returns
  // what each thread of the dependent read before and after its wait.
  auto step = [&](auto between, bool dependent = true) {
    cudaMemcpy(words, ones.data(), kThreads * sizeof(int),
               cudaMemcpyHostToDevice);
    fillWords<<<1, kThreads, 0, s>>>(words, 2);
    between();
    if (dependent)
      kvc::emu::markDependentLaunch();
    readAroundWait<<<1, kThreads, 0, s>>>(words, seen);
    std::vector<int> read(2 * kThreads);
    cudaMemcpyAsync(read.data(), seen, read.size() * sizeof(int),
                    cudaMemcpyDeviceToHost, s);
    cudaStreamSynchronize(s);
    return read;
  };
  auto early = [&](const std::vector<int> &read) {
    bool ok = true;
    for (int t = 0; t < kThreads; ++t)
      ok &= read[2 * t] == 1 && read[2 * t + 1] == (t % 4 == 3 ? 1 : 2);
    return ok;
  };
  auto ordinary = [&](const std::vector<int> &read) {
    return std::all_of(read.begin(), read.end(),
                       [](int v) { return v == 2; });
  };
  auto nothing = [] {};
  withSetting("KVC_EMU_DEVICE_WORK", "deferred", [&] {
    const uint64_t before = kvc::emu::counters().earlyDependents;
    expect(early(step(nothing)),
           "dependent: reads the primary's results only after its wait, a "
           "thread that never waits never");
    expect(kvc::emu::counters().earlyDependents == before + 1,
           "dependent: counted as started early");
    expect(ordinary(step(nothing, false)),
           "dependent: an ordinary launch reads the results throughout");
    expect(early(step([&] { cudaEventRecord(event, s); })),
           "dependent: an event record between the two changes nothing");
    expect(ordinary(step([&] {
             cudaMemcpyAsync(other, ones.data(), sizeof(int),
                             cudaMemcpyHostToDevice, s);
           })),
           "dependent: a copy between the two makes an ordinary launch");
    expect(ordinary(step([&] { cudaStreamSynchronize(s); })),
           "dependent: a wait for the primary makes an ordinary launch");
    // Thread 0 waits, the others wait at the barrier: all read 2 after.
    cudaMemcpy(words, ones.data(), kThreads * sizeof(int),
               cudaMemcpyHostToDevice);
    fillWords<<<1, kThreads, 0, s>>>(words, 2);
    kvc::emu::markDependentLaunch();
    waitThenBarrier<<<1, kThreads, 0, s>>>(words, seen);
    std::vector<int> read(kThreads);
    cudaMemcpyAsync(read.data(), seen, read.size() * sizeof(int),
                    cudaMemcpyDeviceToHost, s);
    cudaStreamSynchronize(s);
    expect(ordinary(read), "dependent: a thread past a barrier that a "
                           "waiting thread reached reads the results");
    // A graph of the two: its replays keep the dependence.
    cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal);
    fillWords<<<1, kThreads, 0, s>>>(words, 2);
    kvc::emu::markDependentLaunch();
    readAroundWait<<<1, kThreads, 0, s>>>(words, seen);
    cudaGraph_t graph = nullptr;
    cudaStreamEndCapture(s, &graph);
    cudaGraphExec_t exec = nullptr;
    cudaGraphInstantiate(&exec, graph, 0);
    cudaGraphDestroy(graph);
    cudaMemcpy(words, ones.data(), kThreads * sizeof(int),
               cudaMemcpyHostToDevice);
    cudaGraphLaunch(exec, s);
    std::vector<int> replay(2 * kThreads);
    cudaMemcpyAsync(replay.data(), seen, replay.size() * sizeof(int),
                    cudaMemcpyDeviceToHost, s);
    cudaStreamSynchronize(s);
    expect(early(replay), "dependent: a graph's replay keeps it");
    cudaGraphExecDestroy(exec);
    return 0;
  });
  expect(ordinary(step(nothing)),
         "dependent: immediate work runs it as an ordinary launch");
  cudaEventDestroy(event);
  cudaStreamDestroy(s);
  cudaFree(other);
  cudaFree(seen);
  cudaFree(words);
}

} // namespace

int main(int argc, char **argv) {
  if (argc > 1) {
    int *d = nullptr;
    cudaMalloc(&d, sizeof(int) * 32);
    if (!std::strcmp(argv[1], "deadlock"))
      deadlock<<<1, 64>>>();
    else if (!std::strcmp(argv[1], "deadlock-through-template"))
      launchThrough<deadlockIn<3>>();
    else if (!std::strcmp(argv[1], "partial-mask"))
      partialMask<<<1, 32>>>(d);
    else if (!std::strcmp(argv[1], "device-overflow"))
      writeAt<<<1, 1>>>(d, 32);
    else if (!std::strcmp(argv[1], "shared-overflow"))
      sharedOverflow<<<1, 32>>>(32, d);
    else if (!std::strcmp(argv[1], "misaligned-vector"))
      misalignedVector<<<1, 1>>>(d, 1, d + 16);
    else if (!std::strcmp(argv[1], "wide-shift"))
      wideShift<<<1, 1>>>(0x80000000u, 32, d);
    else if (!std::strcmp(argv[1], "float-cast"))
      floatCast<<<1, 1>>>(3.0e9f, d);
    else if (!std::strcmp(argv[1], "release-before-wait")) {
      setenv("KVC_EMU_DEVICE_WORK", "deferred", 1);
      fillWords<<<1, 32>>>(d, 2);
      kvc::emu::markDependentLaunch();
      releaseBeforeWait<<<1, 32>>>(d);
      cudaDeviceSynchronize();
    }
    else {
      std::printf("unknown case %s\n", argv[1]);
      return 2;
    }
    std::printf("not reported: %s\n", argv[1]);
    return 1;
  }
  checkCollectives();
  checkWideExchange();
  checkBarriers();
  checkIndices();
  checkLimits();
  checkRefusedLaunches();
  checkStreams();
  checkBlockOrder();
  checkThreadOrder();
  checkFreshMemory();
  checkRefusedAllocations();
  checkConcurrentBlocks();
  checkDeferredWork();
  checkCapture();
  checkDependentLaunch();
  std::printf("%s: %d failure(s)\n", failures ? "FAILED" : "PASSED", failures);
  return failures ? 1 : 0;
}
