// Expert buffers for the streaming cache, allocated and touched before the first token.
//
// A fresh multi-megabyte buffer is new memory: the kernel faults in and zeroes every page while
// the read lands in it (15 % of a streamed run's samples on the 2-core VM, docs/benchmarks.md).
// The pool reserves the buffers a run needs up front, one arena per buffer size, touches their
// pages once (on transparent huge pages where the kernel gives them), and recycles buffers for
// good. The touch is bounded (kTouchBytes, kTouchSeconds, for the whole pool): an automatic
// budget of 17.8 GB took 36 s to touch, longer than the load, where the kernel compacted memory
// for huge pages; buffers past the bound fault their pages in when their first read lands, and
// take() hands out touched ones first. A buffer the reservation did not cover is allocated on demand and counted
// (allocations()), so a report and a test can show that a steady state allocates nothing.
//
// Sizes differ by layer (a Q4_K_M file's Q6_K down projections), and the cache's mix of sizes
// drifts from the reservation's guess. trim() keeps the pool's resident memory bounded by
// handing the pages of surplus free buffers (the size with the most of them free) back to the
// kernel; a released reserved buffer stays in the pool and counts as an allocation when it is
// taken again. So the pool follows the mix with a few allocations and then holds still.
//
// Invariant: every buffer is in exactly one place: the pool's free list, or the hands of the
// one owner that took it (the cache, the staging area, the open layer visit). take() and give()
// move it. Builds with BMOE_CHECK_INVARIANTS (Debug and sanitizer builds, CMakeLists.txt) check
// that a buffer given back is not already free; check_held() checks the whole invariant from
// the owners' side (StreamingExperts::check_buffers).
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <vector>

#include "quant/weight.h"

namespace bmoe {

class BufferPool {
 public:
  // The up-front touch stops at whichever comes first: about 1.5 token cycles of Qwen3-30B's
  // experts, or 1 s (2 GiB took 2.3 s on plain pages, 14 s on huge pages under memory
  // pressure, on the 2-core VM).
  static constexpr uint64_t kTouchBytes = 1ull << 30;
  static constexpr double kTouchSeconds = 1.0;

  struct Buffer {
    uint8_t* data = nullptr;
    uint64_t capacity = 0;
    std::vector<Weight> views;  // the expert's matrices inside data, set by whoever fills it
    bool reserved = false;      // part of an arena (false: allocated on demand)
  };

  // `touch_limit`: the bytes touched up front (tests give a small one).
  explicit BufferPool(uint64_t touch_limit = kTouchBytes) : touch_limit_(touch_limit) {}
  ~BufferPool();
  BufferPool(const BufferPool&) = delete;
  BufferPool& operator=(const BufferPool&) = delete;

  // Adds `count` free buffers of `capacity` bytes (a multiple of 4 KiB) in one arena whose
  // pages are touched now, as far as the pool's touch bound allows.
  void reserve(uint64_t capacity, int count);
  // A free buffer of at least `need` bytes, the smallest such; else a released one or a new
  // one of exactly `need` bytes (both counted: their pages are fresh).
  std::unique_ptr<Buffer> take(uint64_t need);
  void give(std::unique_ptr<Buffer> buffer);
  // Releases the pages of free buffers of the size with the most free ones until the pool's
  // resident memory is at most `limit_bytes`.
  void trim(uint64_t limit_bytes);
  // The same with the limit its owner set (none until then).
  void set_resident_limit(uint64_t limit_bytes) { resident_limit_ = limit_bytes; }
  void trim() { trim(resident_limit_); }

  // Buffers take() handed out that have not been given back.
  size_t outstanding() const { return buffers_ - free_count_ - released_count(); }
  // Checks the invariant: `held`, every buffer the pool's owners hold, must be exactly the
  // outstanding buffers: each one of this pool's, none listed twice, none also free. Throws
  // Error naming the first breach. Costs a sort of all buffers: for checks, not the hot path.
  void check_held(std::vector<const Buffer*> held) const;

  uint64_t allocations() const { return allocations_; }  // buffers whose pages take() made fresh
  uint64_t reserved_bytes() const { return reserved_bytes_; }
  uint64_t touched_bytes() const { return touched_bytes_; }  // of those, touched up front
  uint64_t resident_bytes() const { return resident_bytes_; }  // buffers holding pages, free or taken
  size_t free_count() const { return free_count_; }

 private:
  struct Region {
    uint8_t* base = nullptr;
    uint64_t bytes = 0;
  };
  static Region map_region(uint64_t bytes);  // untouched
  // Touches the pages of `arena` from its end (the buffers take() hands out first) while the
  // touch bound lasts.
  void touch_tail(const Region& arena);
  static void unmap_region(const Region& r);

  std::vector<Region> arenas_;
  std::map<uint8_t*, Region> on_demand_;  // by data pointer
  using ByCapacity = std::map<uint64_t, std::vector<std::unique_ptr<Buffer>>>;
  static std::unique_ptr<Buffer> take_fitting(ByCapacity& lists, uint64_t need);
  size_t released_count() const;
  bool owns(const Buffer& b) const;  // its memory is one of the pool's arenas or on-demand regions
  bool is_free(const Buffer& buffer) const;  // in the free or released lists (linear: checks only)
  ByCapacity free_;      // free buffers holding their pages
  ByCapacity released_;  // free reserved buffers whose pages went back to the kernel
  size_t free_count_ = 0;
  size_t buffers_ = 0;  // that exist: reserved ones and live on-demand ones, free or taken
  uint64_t resident_limit_ = UINT64_MAX;
  uint64_t allocations_ = 0;
  uint64_t reserved_bytes_ = 0;
  uint64_t touch_limit_ = kTouchBytes;
  uint64_t touched_bytes_ = 0;
  double touch_seconds_ = 0;
  uint64_t resident_bytes_ = 0;
};

}  // namespace bmoe
