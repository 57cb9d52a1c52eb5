// Read lanes: a pool of reader threads that run positioned reads in parallel (`--io-threads`).
// Each read reports its completion through a ticket the caller waits on; lane busy time is
// accounted so the engine can report I/O time separately from stalls.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "moe/direct_io.h"

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

class ReadLanes {
 public:
  explicit ReadLanes(int lanes);
  ~ReadLanes();
  ReadLanes(const ReadLanes&) = delete;
  ReadLanes& operator=(const ReadLanes&) = delete;

  int lanes() const { return static_cast<int>(threads_.size()); }
  // Queues a read; `ticket` is decremented when it completes (or fails).
  void submit(const ReadRequest& request, ReadTicket* ticket);
  // Blocks until the ticket's reads are done; returns false if any failed.
  bool wait(ReadTicket& ticket);
  // Blocks until any of `tickets` is done, returns its index (-1 if all are null).
  int wait_any(const std::vector<ReadTicket*>& tickets);
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
  void lane_loop();
  // Removes the queued speculative jobs of `ticket` (caller holds mutex_).
  std::vector<Job> take_speculative(ReadTicket* ticket);
  void complete(ReadTicket* ticket, const std::string& error);

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
