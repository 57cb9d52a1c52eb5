#include "moe/read_lanes.h"

#include <chrono>

#include "core/error.h"

namespace bmoe {

bool ReadTicket::failed() const {
  std::lock_guard<std::mutex> lock(error_mutex_);
  return !error_.empty();
}

std::string ReadTicket::error() const {
  std::lock_guard<std::mutex> lock(error_mutex_);
  return error_;
}

ReadLanes::ReadLanes(int lanes) {
  if (lanes < 1 || lanes > 64) fail("--io-threads must be between 1 and 64 (got {})", lanes);
  for (int i = 0; i < lanes; ++i) threads_.emplace_back([this] { lane_loop(); });
}

ReadLanes::~ReadLanes() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
  }
  work_.notify_all();
  for (auto& t : threads_) t.join();
}

void ReadLanes::submit(const ReadRequest& request, ReadTicket* ticket) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    (request.priority > 0 ? speculative_ : urgent_).push_back({request, ticket});
  }
  work_.notify_one();
}

void ReadLanes::complete(ReadTicket* ticket, const std::string& error) {
  if (!error.empty()) {
    std::lock_guard<std::mutex> lock(ticket->error_mutex_);
    if (ticket->error_.empty()) ticket->error_ = error;
  }
  {
    std::lock_guard<std::mutex> lock(mutex_);
    ticket->pending_.fetch_sub(1, std::memory_order_acq_rel);
  }
  done_.notify_all();
}

void ReadLanes::lane_loop() {
  for (;;) {
    Job job;
    {
      std::unique_lock<std::mutex> lock(mutex_);
      work_.wait(lock, [&] { return stopping_ || !urgent_.empty() || !speculative_.empty(); });
      if (stopping_) return;
      auto& queue = urgent_.empty() ? speculative_ : urgent_;
      job = queue.front();
      queue.pop_front();
    }
    const auto start = std::chrono::steady_clock::now();
    std::string error;
    try {
      const ReadRequest& r = job.request;
      r.file->read_window(r.offset, r.length, r.dst, r.required);
    } catch (const std::exception& e) {
      error = e.what();
    }
    busy_ns_.fetch_add(static_cast<uint64_t>(
        std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - start).count()));
    complete(job.ticket, error);
  }
}

bool ReadLanes::wait(ReadTicket& ticket) {
  std::unique_lock<std::mutex> lock(mutex_);
  done_.wait(lock, [&] { return ticket.done(); });
  return !ticket.failed();
}

int ReadLanes::wait_any(const std::vector<ReadTicket*>& tickets) {
  std::unique_lock<std::mutex> lock(mutex_);
  int found = -1;
  done_.wait(lock, [&] {
    bool any = false;
    for (size_t i = 0; i < tickets.size(); ++i) {
      if (tickets[i] == nullptr) continue;
      any = true;
      if (tickets[i]->done()) {
        found = static_cast<int>(i);
        return true;
      }
    }
    return !any;
  });
  return found;
}

std::vector<ReadLanes::Job> ReadLanes::take_speculative(ReadTicket* ticket) {
  std::vector<Job> taken;
  for (auto it = speculative_.begin(); it != speculative_.end();) {
    if (it->ticket == ticket) {
      taken.push_back(*it);
      it = speculative_.erase(it);
    } else {
      ++it;
    }
  }
  return taken;
}

int ReadLanes::cancel(ReadTicket* ticket) {
  size_t cancelled = 0;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    cancelled = take_speculative(ticket).size();
    ticket->pending_.fetch_sub(static_cast<int>(cancelled));
  }
  if (cancelled) done_.notify_all();
  return static_cast<int>(cancelled);
}

int ReadLanes::promote(ReadTicket* ticket) {
  std::lock_guard<std::mutex> lock(mutex_);
  const std::vector<Job> jobs = take_speculative(ticket);
  urgent_.insert(urgent_.end(), jobs.begin(), jobs.end());
  return static_cast<int>(jobs.size());
}

double ReadLanes::busy_seconds() const { return static_cast<double>(busy_ns_.load()) * 1e-9; }

}  // namespace bmoe
