#include "io/read_lanes.h"

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>

#ifdef BMOE_HAVE_URING
#include <liburing.h>
#endif

#include "core/error.h"

namespace bmoe {
namespace {
using Clock = std::chrono::steady_clock;

// Submission queue entries: enough for every urgent read of a layer (a few per missing expert).
[[maybe_unused]] constexpr unsigned kRingEntries = 256;

uint64_t nanoseconds_since(Clock::time_point start) {
  return static_cast<uint64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now() - start).count());
}
}  // namespace

bool io_uring_built() {
#ifdef BMOE_HAVE_URING
  return true;
#else
  return false;
#endif
}

struct ReadLanes::Uring {
  // One read in flight in the ring (its address is the entry's user data).
  struct InFlight {
    Job job;
    Clock::time_point start;
  };
#ifdef BMOE_HAVE_URING
  io_uring ring{};
#endif
  int in_flight = 0;
};

bool ReadTicket::failed() const {
  std::lock_guard<std::mutex> lock(error_mutex_);
  return !error_.empty();
}

std::string ReadTicket::error() const {
  std::lock_guard<std::mutex> lock(error_mutex_);
  return error_;
}

ReadLanes::ReadLanes(int lanes, IoEngine engine) : lanes_(lanes) {
  if (lanes < 1 || lanes > 64) fail("--io-threads must be between 1 and 64 (got {})", lanes);
  if (engine == IoEngine::Uring) {
#ifdef BMOE_HAVE_URING
    auto u = std::make_unique<Uring>();
    const int rc = io_uring_queue_init(kRingEntries, &u->ring, 0);
    if (rc == 0) {
      uring_ = std::move(u);
      return;
    }
    note_ = std::string("io_uring unavailable (") + std::strerror(-rc) + "): using read threads";
#else
    note_ = "built without liburing: using read threads";
#endif
  }
  for (int i = 0; i < lanes; ++i) threads_.emplace_back([this] { lane_loop(); });
}

ReadLanes::~ReadLanes() {
  if (uring_) {
    // The kernel writes into our callers' buffers until each read completes: let them land.
    // A failing wait cannot be reported from a destructor: stop waiting rather than terminate.
    try {
      while (uring_->in_flight > 0) reap_uring(1);
    } catch (const std::exception&) {
    }
#ifdef BMOE_HAVE_URING
    io_uring_queue_exit(&uring_->ring);
#endif
    return;
  }
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
  }
  work_.notify_all();
  for (auto& t : threads_) t.join();
}

void ReadLanes::submit(const ReadRequest& request, ReadTicket* ticket) {
  if (uring_ && read_fault_hook_active()) {
    run_job({request, ticket});  // tests' injected faults go through read_window
    return;
  }
  {
    std::lock_guard<std::mutex> lock(mutex_);
    (request.priority > 0 ? speculative_ : urgent_).push_back({request, ticket});
  }
  if (uring_) {
    pump_uring();
    return;
  }
  work_.notify_one();
}

void ReadLanes::run_job(const Job& job) {
  const auto start = Clock::now();
  std::string error;
  try {
    const ReadRequest& r = job.request;
    r.file->read_window(r.offset, r.length, r.dst, r.required);
  } catch (const std::exception& e) {
    error = e.what();
  }
  busy_ns_.fetch_add(nanoseconds_since(start));
  complete(job.ticket, error);
}

void ReadLanes::poll() {
  if (!uring_) return;
  reap_uring(0);
  pump_uring();
}

void ReadLanes::pump_uring() {
#ifdef BMOE_HAVE_URING
  int queued = 0;
  for (;;) {
    Job job;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      const bool room = uring_->in_flight < static_cast<int>(kRingEntries);
      if (room && !urgent_.empty()) {
        job = urgent_.front();
        urgent_.pop_front();
      } else if (room && uring_->in_flight < lanes_ && !speculative_.empty()) {
        job = speculative_.front();
        speculative_.pop_front();
      } else {
        break;
      }
    }
    io_uring_sqe* sqe = io_uring_get_sqe(&uring_->ring);
    if (sqe == nullptr) {  // full submission queue: hand over what is there and retry
      io_uring_submit(&uring_->ring);
      sqe = io_uring_get_sqe(&uring_->ring);
      if (sqe == nullptr) {
        run_job(job);
        continue;
      }
    }
    const ReadRequest& r = job.request;
    io_uring_prep_read(sqe, r.file->fd(), r.dst, static_cast<unsigned>(r.length), r.offset);
    io_uring_sqe_set_data(sqe, new Uring::InFlight{job, Clock::now()});
    ++uring_->in_flight;
    ++queued;
  }
  if (queued > 0) io_uring_submit(&uring_->ring);
#endif
}

void ReadLanes::reap_uring(int wait_for) {
#ifdef BMOE_HAVE_URING
  io_uring_cqe* cqe = nullptr;
  wait_for = std::min(wait_for, uring_->in_flight);  // more would never come
  if (wait_for > 0) {
    const int rc = io_uring_wait_cqe_nr(&uring_->ring, &cqe, static_cast<unsigned>(wait_for));
    if (rc < 0 && rc != -EINTR && rc != -EAGAIN) fail("io_uring wait failed: {}", std::strerror(-rc));
  }
  while (io_uring_peek_cqe(&uring_->ring, &cqe) == 0) {
    std::unique_ptr<Uring::InFlight> read(static_cast<Uring::InFlight*>(io_uring_cqe_get_data(cqe)));
    const int res = cqe->res;
    io_uring_cqe_seen(&uring_->ring, cqe);
    --uring_->in_flight;
    busy_ns_.fetch_add(nanoseconds_since(read->start));
    const ReadRequest& r = read->job.request;
    if (res >= 0 && (static_cast<uint64_t>(res) == r.length || static_cast<uint64_t>(res) >= r.required)) {
      complete(read->job.ticket, "");  // whole, or short only past the end of the file
      continue;
    }
    // Failed, interrupted or short: finish the rest the plain way, which retries what can be
    // retried and names the file, the offset and the cause of what cannot.
    const uint64_t got = res > 0 ? align_down(static_cast<uint64_t>(res), kDirectAlignment) : 0;
    ReadRequest rest = r;
    rest.offset += got;
    rest.length -= got;
    rest.dst += got;
    rest.required = r.required > got ? r.required - got : 0;
    run_job({rest, read->job.ticket});
  }
#else
  (void)wait_for;
#endif
}

void ReadLanes::complete(ReadTicket* ticket, const std::string& error) {
  if (!error.empty()) {
    std::lock_guard<std::mutex> lock(ticket->error_mutex_);
    if (ticket->error_.empty()) ticket->error_ = error;
  }
  bool finished = false;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    finished = ticket->pending_.fetch_sub(1, std::memory_order_acq_rel) == 1;
  }
  // Waiters only ever wait for whole tickets: waking them for each of a ticket's reads (an
  // expert is three matrices, often in several chunks) was a context switch per read.
  if (finished) done_.notify_all();
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
    run_job(job);
  }
}

bool ReadLanes::wait(ReadTicket& ticket) {
  if (uring_) {
    wait_any({&ticket});
    return !ticket.failed();
  }
  std::unique_lock<std::mutex> lock(mutex_);
  done_.wait(lock, [&] { return ticket.done(); });
  return !ticket.failed();
}

int ReadLanes::wait_any(const std::vector<ReadTicket*>& tickets) {
  if (uring_) {
    for (poll();; poll()) {
      bool any = false;
      for (size_t i = 0; i < tickets.size(); ++i) {
        if (tickets[i] == nullptr) continue;
        any = true;
        if (tickets[i]->done()) return static_cast<int>(i);
      }
      if (!any) return -1;
      if (uring_->in_flight == 0) fail("internal: waiting on reads that were never started");
      reap_uring(1);
    }
  }
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

bool ReadLanes::wait_all(const std::vector<ReadTicket*>& tickets) {
  if (uring_) {
    for (poll();; poll()) {
      int lacking = 0;  // reads the tickets still wait for: at least as many completions to come
      for (const ReadTicket* t : tickets) {
        if (t) lacking += t->pending_.load(std::memory_order_acquire);
      }
      if (lacking == 0) break;
      if (uring_->in_flight == 0) fail("internal: waiting on reads that were never started");
      reap_uring(lacking);
    }
  } else {
    std::unique_lock<std::mutex> lock(mutex_);
    done_.wait(lock, [&] {
      return std::all_of(tickets.begin(), tickets.end(), [](const ReadTicket* t) { return t == nullptr || t->done(); });
    });
  }
  return std::none_of(tickets.begin(), tickets.end(), [](const ReadTicket* t) { return t != nullptr && t->failed(); });
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
  size_t moved = 0;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    const std::vector<Job> jobs = take_speculative(ticket);
    urgent_.insert(urgent_.end(), jobs.begin(), jobs.end());
    moved = jobs.size();
  }
  if (uring_ && moved > 0) pump_uring();
  return static_cast<int>(moved);
}

double ReadLanes::busy_seconds() const { return static_cast<double>(busy_ns_.load()) * 1e-9; }

}  // namespace bmoe
