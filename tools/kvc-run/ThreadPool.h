//===- ThreadPool.h - Fork-join parallel loops ------------------*- C++ -*-===//
//
// Part of kvc, the KV-cache policy compiler.
//
//===----------------------------------------------------------------------===//
//
// A fixed set of worker threads that run one parallel loop at a time. The
// engine calls parallelFor a few hundred times per token, so the workers stay
// alive between loops instead of being created per call.
//
//===----------------------------------------------------------------------===//

#ifndef KVC_TOOLS_KVCRUN_THREADPOOL_H
#define KVC_TOOLS_KVCRUN_THREADPOOL_H

#include <condition_variable>
#include <cstddef>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace kvc {
namespace run {

/// Runs loops over [0, n) split into contiguous chunks, one per thread. The
/// calling thread takes the first chunk, so a pool of one thread runs
/// everything inline.
class ThreadPool {
public:
  /// Body of a loop: processes indices [begin, end).
  using Body = std::function<void(size_t begin, size_t end)>;

  /// Starts `numThreads - 1` workers (the caller is the last thread).
  explicit ThreadPool(unsigned numThreads);
  ~ThreadPool();
  ThreadPool(const ThreadPool &) = delete;
  ThreadPool &operator=(const ThreadPool &) = delete;

  unsigned numThreads() const { return unsigned(workers_.size()) + 1; }

  /// Runs `body` over [0, n) and returns when every chunk is done. Chunks are
  /// aligned to `grain` indices so callers can keep blocks together; fewer
  /// than two grains run inline.
  void parallelFor(size_t n, const Body &body, size_t grain = 1);

private:
  void workerLoop(unsigned index);

  std::vector<std::thread> workers_;
  std::mutex mutex_;
  std::condition_variable start_;
  std::condition_variable done_;
  const Body *body_ = nullptr;
  size_t n_ = 0;
  size_t chunk_ = 0;
  /// Incremented for every loop so sleeping workers know a new one began.
  size_t generation_ = 0;
  unsigned pending_ = 0;
  bool stop_ = false;
};

} // namespace run
} // namespace kvc

#endif // KVC_TOOLS_KVCRUN_THREADPOOL_H
