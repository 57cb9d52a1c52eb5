#include "moe/buffer_pool.h"

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <iterator>

#include "core/error.h"

namespace bmoe {
namespace {
constexpr uint64_t kPage = 4096;
// Arenas start on a huge-page boundary so that the kernel can back them with 2 MiB pages.
constexpr uint64_t kHugePage = 2ull << 20;
}  // namespace

BufferPool::~BufferPool() {
  for (const Region& r : arenas_) unmap_region(r);
  for (const auto& [data, r] : on_demand_) unmap_region(r);
}

BufferPool::Region BufferPool::map_region(uint64_t bytes) {
  const bool huge = bytes >= kHugePage;
  const uint64_t slack = huge ? kHugePage : 0;
  void* p = ::mmap(nullptr, bytes + slack, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) fail_errno(fmt::format("cannot allocate {} MiB of expert buffers", bytes >> 20));
  auto* base = static_cast<uint8_t*>(p);
  if (huge) {
    // Trim the mapping to a huge-page-aligned start.
    auto* aligned = reinterpret_cast<uint8_t*>((reinterpret_cast<uintptr_t>(base) + kHugePage - 1) / kHugePage * kHugePage);
    if (aligned > base) ::munmap(base, static_cast<size_t>(aligned - base));
    const uint64_t tail = slack - static_cast<uint64_t>(aligned - base);
    if (tail > 0) ::munmap(aligned + bytes, static_cast<size_t>(tail));
    base = aligned;
    ::madvise(base, bytes, MADV_HUGEPAGE);  // advice only: refused where THP is off
  }
  return {base, bytes};
}

void BufferPool::touch_tail(const Region& arena) {
  const auto start = std::chrono::steady_clock::now();
  uint64_t end = arena.bytes;
  while (end > 0 && touched_bytes_ < touch_limit_) {
    // 2 MiB at a time between looks at the clock, and not past the limit (a page multiple).
    const uint64_t step = std::min({kHugePage, end, (touch_limit_ - touched_bytes_ + kPage - 1) / kPage * kPage});
    const uint64_t begin = end - step;
    for (uint64_t at = begin; at < end; at += kPage) arena.base[at] = 0;
    touched_bytes_ += end - begin;
    end = begin;
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    if (touch_seconds_ + seconds >= kTouchSeconds) break;
  }
  touch_seconds_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

void BufferPool::unmap_region(const Region& r) { ::munmap(r.base, static_cast<size_t>(r.bytes)); }

void BufferPool::reserve(uint64_t capacity, int count) {
  if (count <= 0 || capacity == 0) return;
  if (capacity % kPage != 0) fail("internal: expert buffer of {} bytes is not a multiple of {}", capacity, kPage);
  const Region arena = map_region(capacity * static_cast<uint64_t>(count));
  touch_tail(arena);
  arenas_.push_back(arena);
  auto& list = free_[capacity];
  for (int i = 0; i < count; ++i) {
    auto b = std::make_unique<Buffer>();
    b->data = arena.base + capacity * static_cast<uint64_t>(i);
    b->capacity = capacity;
    b->reserved = true;
    list.push_back(std::move(b));
  }
  free_count_ += static_cast<size_t>(count);
  buffers_ += static_cast<size_t>(count);
  reserved_bytes_ += arena.bytes;
  resident_bytes_ += arena.bytes;
}

std::unique_ptr<BufferPool::Buffer> BufferPool::take_fitting(ByCapacity& lists, uint64_t need) {
  for (auto it = lists.lower_bound(need); it != lists.end(); ++it) {
    if (it->second.empty()) continue;
    std::unique_ptr<Buffer> b = std::move(it->second.back());
    it->second.pop_back();
    b->views.clear();
    return b;
  }
  return nullptr;
}

std::unique_ptr<BufferPool::Buffer> BufferPool::take(uint64_t need) {
  if (auto b = take_fitting(free_, need)) {
    --free_count_;
    return b;
  }
  ++allocations_;
  if (auto b = take_fitting(released_, need)) {
    resident_bytes_ += b->capacity;  // the read that lands in it faults the pages back in
    return b;
  }
  const uint64_t capacity = (std::max<uint64_t>(need, 1) + kPage - 1) / kPage * kPage;
  const Region r = map_region(capacity);  // the read that lands in it faults the pages in
  on_demand_[r.base] = r;
  ++buffers_;
  resident_bytes_ += capacity;
  auto b = std::make_unique<Buffer>();
  b->data = r.base;
  b->capacity = capacity;
  return b;
}

void BufferPool::give(std::unique_ptr<Buffer> buffer) {
  if (!buffer) return;
#ifdef BMOE_CHECK_INVARIANTS
  if (is_free(*buffer)) fail("internal: buffer invariant: a buffer given back twice");
#endif
  ++free_count_;
  free_[buffer->capacity].push_back(std::move(buffer));
}

void BufferPool::trim(uint64_t limit_bytes) {
  while (resident_bytes_ > limit_bytes) {
    auto surplus = free_.end();
    for (auto it = free_.begin(); it != free_.end(); ++it) {
      if (!it->second.empty() && (surplus == free_.end() || it->second.size() >= surplus->second.size())) surplus = it;
    }
    if (surplus == free_.end()) return;  // everything is taken
    std::unique_ptr<Buffer> b = std::move(surplus->second.back());
    surplus->second.pop_back();
    --free_count_;
    resident_bytes_ -= b->capacity;
    if (b->reserved) {
      ::madvise(b->data, static_cast<size_t>(b->capacity), MADV_DONTNEED);
      released_[b->capacity].push_back(std::move(b));
      continue;
    }
    const auto region = on_demand_.find(b->data);
    if (region == on_demand_.end()) fail("internal: a free expert buffer the pool did not allocate");
    unmap_region(region->second);
    on_demand_.erase(region);
    --buffers_;
  }
}

size_t BufferPool::released_count() const {
  size_t n = 0;
  for (const auto& [capacity, list] : released_) n += list.size();
  return n;
}

bool BufferPool::owns(const Buffer& b) const {
  if (on_demand_.count(b.data) != 0) return true;
  return std::any_of(arenas_.begin(), arenas_.end(), [&](const Region& r) {
    return b.data >= r.base && b.data + b.capacity <= r.base + r.bytes;
  });
}

bool BufferPool::is_free(const Buffer& buffer) const {
  for (const ByCapacity* lists : {&free_, &released_}) {
    for (const auto& [capacity, list] : *lists) {
      for (const auto& b : list) {
        if (b->data == buffer.data) return true;
      }
    }
  }
  return false;
}

void BufferPool::check_held(std::vector<const Buffer*> held) const {
  std::vector<const uint8_t*> held_data, free_data;
  for (const Buffer* b : held) {
    if (!b || !owns(*b)) fail("internal: buffer invariant: a holder has a buffer that is not the pool's");
    held_data.push_back(b->data);
  }
  for (const ByCapacity* lists : {&free_, &released_}) {
    for (const auto& [capacity, list] : *lists) {
      for (const auto& b : list) free_data.push_back(b->data);
    }
  }
  std::sort(held_data.begin(), held_data.end());
  std::sort(free_data.begin(), free_data.end());
  if (std::adjacent_find(held_data.begin(), held_data.end()) != held_data.end()) {
    fail("internal: buffer invariant: a buffer is held in two places");
  }
  std::vector<const uint8_t*> both;
  std::set_intersection(held_data.begin(), held_data.end(), free_data.begin(), free_data.end(), std::back_inserter(both));
  if (!both.empty()) fail("internal: buffer invariant: a buffer is both free in the pool and held");
  // Counted against the buffers the pool made, not its free count: a buffer dropped without
  // give() is missing from both lists.
  if (held.size() + free_data.size() != buffers_) {
    fail("internal: buffer invariant: the pool made {} buffers, {} are free and the holders hold {} (lost, or dropped "
         "without give())",
         buffers_, free_data.size(), held.size());
  }
}

}  // namespace bmoe
