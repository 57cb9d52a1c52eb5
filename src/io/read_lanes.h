// Read lanes: positioned reads in parallel (`--io-threads`), run either by a pool of reader
// threads or through io_uring (`--io-engine`). Each read reports its completion through a
// ticket the caller waits on; lane busy time is accounted so the engine can report I/O time
// separately from stalls.
//
// Why two engines: a reader thread must be scheduled for every read it finishes and starts.
// While compute keeps every core busy (overlap), each of those wake-ups preempts a compute
// thread, and a parallel kernel waits for its slowest thread. io_uring needs no thread: the
// owner submits reads and collects completions (poll(), wait(), wait_any()) between kernels.
// The kernel's work to start a read (pinning the buffer's pages, building the request) then runs
// on the owner instead: measured on a 2-vCPU VM it cut involuntary context switches 6x and the
// time spent waiting on reads by a third, and added about as much to compute (docs/benchmarks.md),
// so threads stay the default.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "io/direct_io.h"

namespace bmoe {

struct ReadRequest {
  const DirectFile* file = nullptr;
  uint64_t offset = 0;
  uint64_t length = 0;
  uint64_t required = 0;
  uint8_t* dst = nullptr;
  int priority = 0;  // lower runs first; 0 = needed now, >0 = speculative (prefetch)
};

// Completion of a group of reads (e.g. all matrices of one expert).
class ReadTicket {
 public:
  explicit ReadTicket(int pending = 0) : pending_(pending) {}
  void add(int n) { pending_.fetch_add(n); }
  bool done() const { return pending_.load(std::memory_order_acquire) == 0; }
  bool failed() const;
  std::string error() const;

 private:
  friend class ReadLanes;
  std::atomic<int> pending_;
  mutable std::mutex error_mutex_;
  std::string error_;
};

enum class IoEngine { Threads, Uring };

// True when this build can use io_uring (liburing was found at configure time).
bool io_uring_built();

class ReadLanes {
 public:
  // With IoEngine::Uring every call must come from one thread (the owner); if the kernel refuses
  // io_uring (old kernel, seccomp) the lanes fall back to threads and note() says why.
  explicit ReadLanes(int lanes, IoEngine engine = IoEngine::Threads);
  ~ReadLanes();
  ReadLanes(const ReadLanes&) = delete;
  ReadLanes& operator=(const ReadLanes&) = delete;

  int lanes() const { return lanes_; }
  bool uring() const { return uring_ != nullptr; }
  const std::string& note() const { return note_; }
  // io_uring: collects finished reads and starts queued ones without blocking (threads: no-op).
  // Call it before checking tickets' done().
  void poll();
  // Queues a read; `ticket` is decremented when it completes (or fails).
  void submit(const ReadRequest& request, ReadTicket* ticket);
  // Blocks until the ticket's reads are done; returns false if any failed.
  bool wait(ReadTicket& ticket);
  // Blocks until any of `tickets` is done, returns its index (-1 if all are null).
  int wait_any(const std::vector<ReadTicket*>& tickets);
  // Blocks until every non-null ticket is done; returns false if any read failed. With
  // io_uring one sleep waits for as many completions as the tickets still lack, instead of
  // waking for each read.
  bool wait_all(const std::vector<ReadTicket*>& tickets);
  // Drops queued requests with priority > 0 whose ticket is `ticket` (cancelled prefetch).
  int cancel(ReadTicket* ticket);
  // Moves queued priority > 0 requests of `ticket` to the urgent queue (a prefetch that is now
  // needed). Returns how many moved.
  int promote(ReadTicket* ticket);

  double busy_seconds() const;  // summed over lanes

 private:
  struct Job {
    ReadRequest request;
    ReadTicket* ticket;
  };
  struct Uring;
  void lane_loop();
  // Runs one read on the calling thread and completes its ticket.
  void run_job(const Job& job);
  // io_uring: starts queued reads (urgent ones up to the ring's depth, reads ahead up to
  // `lanes` in flight) and collects finished ones, first sleeping until `wait_for` of those
  // in flight have finished (0: no sleep).
  void pump_uring();
  void reap_uring(int wait_for);
  // Removes the queued speculative jobs of `ticket` (caller holds mutex_).
  std::vector<Job> take_speculative(ReadTicket* ticket);
  void complete(ReadTicket* ticket, const std::string& error);

  int lanes_ = 0;
  std::unique_ptr<Uring> uring_;
  std::string note_;
  std::vector<std::thread> threads_;
  std::mutex mutex_;
  std::condition_variable work_;
  std::condition_variable done_;
  std::deque<Job> urgent_;
  std::deque<Job> speculative_;
  bool stopping_ = false;
  std::atomic<uint64_t> busy_ns_{0};
};

}  // namespace bmoe
