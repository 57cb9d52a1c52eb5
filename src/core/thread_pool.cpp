#include "core/thread_pool.h"

#include <algorithm>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define BMOE_CPU_RELAX() _mm_pause()
#elif defined(__aarch64__)
#define BMOE_CPU_RELAX() asm volatile("yield")
#else
#define BMOE_CPU_RELAX() ((void)0)
#endif

namespace bmoe {
namespace {
// Spin iterations before a worker goes to sleep; about a millisecond of polling.
constexpr int kSpinIterations = 20000;
}  // namespace

ThreadPool::ThreadPool(int n_threads) : n_threads_(std::max(1, n_threads)) {
  for (int i = 1; i < n_threads_; ++i) workers_.emplace_back([this, i] { worker_loop(i); });
}

ThreadPool::~ThreadPool() {
  {
    std::lock_guard<std::mutex> lock(sleep_mutex_);
    stopping_.store(true);
    generation_.fetch_add(1);
  }
  wake_.notify_all();
  for (auto& t : workers_) t.join();
}

void ThreadPool::work_on_current_job(int thread_index) {
  for (;;) {
    const int64_t task = next_task_.fetch_add(1, std::memory_order_relaxed);
    if (task >= job_tasks_) break;
    (*job_)(task, thread_index);
  }
}

void ThreadPool::worker_loop(int thread_index) {
  uint64_t seen = 0;
  for (;;) {
    uint64_t gen = generation_.load(std::memory_order_acquire);
    for (int spin = 0; gen == seen && spin < kSpinIterations && !parked_.load(std::memory_order_relaxed); ++spin) {
      BMOE_CPU_RELAX();
      gen = generation_.load(std::memory_order_acquire);
    }
    if (gen == seen) {
      std::unique_lock<std::mutex> lock(sleep_mutex_);
      sleepers_.fetch_add(1);
      wake_.wait(lock, [&] { return generation_.load() != seen; });
      sleepers_.fetch_sub(1);
      gen = generation_.load();
    }
    seen = gen;
    if (stopping_.load()) return;
    work_on_current_job(thread_index);
    active_workers_.fetch_sub(1, std::memory_order_acq_rel);
  }
}

void ThreadPool::run(int64_t n_tasks, const Task& fn) {
  if (n_tasks <= 0) return;
  if (n_threads_ == 1 || n_tasks == 1) {
    for (int64_t t = 0; t < n_tasks; ++t) fn(t, 0);
    return;
  }
  parked_.store(false, std::memory_order_relaxed);
  job_ = &fn;
  job_tasks_ = n_tasks;
  next_task_.store(0, std::memory_order_relaxed);
  active_workers_.store(n_threads_ - 1, std::memory_order_relaxed);
  {
    // Publishing under the mutex pairs with the sleepers' predicate check, so no wake-up is lost.
    std::lock_guard<std::mutex> lock(sleep_mutex_);
    generation_.fetch_add(1, std::memory_order_acq_rel);
  }
  if (sleepers_.load() > 0) wake_.notify_all();
  work_on_current_job(0);
  while (active_workers_.load(std::memory_order_acquire) != 0) BMOE_CPU_RELAX();
  job_ = nullptr;
}

void ThreadPool::park() { parked_.store(true, std::memory_order_relaxed); }

void ThreadPool::parallel_for(int64_t n, int64_t grain,
                              const std::function<void(int64_t, int64_t, int)>& fn) {
  if (n <= 0) return;
  grain = std::max<int64_t>(1, grain);
  const int64_t chunks = (n + grain - 1) / grain;
  run(chunks, [&](int64_t chunk, int thread) {
    const int64_t begin = chunk * grain;
    fn(begin, std::min(n, begin + grain), thread);
  });
}

}  // namespace bmoe
