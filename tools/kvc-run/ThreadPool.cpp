//===- ThreadPool.cpp - Fork-join parallel loops --------------------------===//
//
// Part of kvc, the KV-cache policy compiler.
//
//===----------------------------------------------------------------------===//

#include "tools/kvc-run/ThreadPool.h"

#include <algorithm>

namespace kvc {
namespace run {

ThreadPool::ThreadPool(unsigned numThreads) {
  for (unsigned i = 1; i < std::max(1u, numThreads); ++i)
    workers_.emplace_back([this, i] { workerLoop(i); });
}

ThreadPool::~ThreadPool() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stop_ = true;
  }
  start_.notify_all();
  for (std::thread &t : workers_)
    t.join();
}

void ThreadPool::parallelFor(size_t n, const Body &body, size_t grain) {
  grain = std::max<size_t>(1, grain);
  size_t grains = (n + grain - 1) / grain;
  if (workers_.empty() || grains < 2) {
    body(0, n);
    return;
  }
  size_t threads = std::min<size_t>(numThreads(), grains);
  size_t chunk = (grains + threads - 1) / threads * grain;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    body_ = &body;
    n_ = n;
    chunk_ = chunk;
    pending_ = unsigned(workers_.size());
    ++generation_;
  }
  start_.notify_all();
  body(0, std::min(n, chunk));
  std::unique_lock<std::mutex> lock(mutex_);
  done_.wait(lock, [this] { return pending_ == 0; });
  body_ = nullptr;
}

void ThreadPool::workerLoop(unsigned index) {
  size_t seen = 0;
  for (;;) {
    const Body *body;
    size_t begin, end;
    {
      std::unique_lock<std::mutex> lock(mutex_);
      start_.wait(lock, [&] { return stop_ || generation_ != seen; });
      if (stop_)
        return;
      seen = generation_;
      body = body_;
      begin = std::min(n_, index * chunk_);
      end = std::min(n_, begin + chunk_);
    }
    if (begin < end)
      (*body)(begin, end);
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (--pending_ == 0)
        done_.notify_one();
    }
  }
}

} // namespace run
} // namespace kvc
