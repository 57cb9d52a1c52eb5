// A persistent pool of worker threads for data-parallel kernels.
//
// run(n, fn) calls fn(task, thread) for every task in [0, n) across the pool and the calling
// thread, and returns when all are done. Workers spin briefly between jobs (a decode step issues
// hundreds of small jobs per token, so sleeping on a condition variable each time would cost more
// than the work), then fall back to blocking so an idle engine does not burn CPU.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace bmoe {

class ThreadPool {
 public:
  using Task = std::function<void(int64_t task, int thread)>;

  explicit ThreadPool(int n_threads);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int size() const { return n_threads_; }

  // Runs fn over [0, n_tasks). Tasks are claimed dynamically, so uneven tasks balance.
  void run(int64_t n_tasks, const Task& fn);

  // The caller is about to block for a while (on reads): workers stop spinning and sleep until
  // the next run(), leaving the cores to whatever the caller waits for. Cheap; call it only
  // before a real wait, since the next run() must then wake them.
  void park();

  // Convenience: splits [0, n) into contiguous chunks of about `grain` items and calls
  // fn(begin, end, thread) once per chunk.
  void parallel_for(int64_t n, int64_t grain,
                    const std::function<void(int64_t begin, int64_t end, int thread)>& fn);

 private:
  void worker_loop(int thread_index);
  void work_on_current_job(int thread_index);

  const int n_threads_;
  std::vector<std::thread> workers_;

  // Current job, published by bumping generation_.
  const Task* job_ = nullptr;
  int64_t job_tasks_ = 0;
  std::atomic<int64_t> next_task_{0};
  std::atomic<int> active_workers_{0};
  std::atomic<uint64_t> generation_{0};
  std::atomic<bool> stopping_{false};
  std::atomic<bool> parked_{false};  // spinning workers go to sleep now

  std::mutex sleep_mutex_;
  std::condition_variable wake_;
  std::atomic<int> sleepers_{0};
};

}  // namespace bmoe
