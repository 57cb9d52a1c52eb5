// Positioned reads that bypass the page cache (O_DIRECT), with the alignment bookkeeping that
// requires, a buffered fallback, and a fault-injection hook for tests.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>

namespace bmoe {

constexpr size_t kDirectAlignment = 4096;  // offsets, lengths and buffers of O_DIRECT reads

// Memory aligned for O_DIRECT, freed with free().
struct AlignedFree {
  void operator()(void* p) const;
};
using AlignedBuffer = std::unique_ptr<uint8_t, AlignedFree>;
AlignedBuffer allocate_aligned(size_t bytes);

inline uint64_t align_down(uint64_t x, uint64_t a) { return x / a * a; }
inline uint64_t align_up(uint64_t x, uint64_t a) { return (x + a - 1) / a * a; }

class DirectFile {
 public:
  // Opens `path` read-only; with `direct`, tries O_DIRECT and falls back to buffered reads
  // (see direct_requested/direct_active/direct_note).
  DirectFile(const std::string& path, bool direct);
  ~DirectFile();
  DirectFile(const DirectFile&) = delete;
  DirectFile& operator=(const DirectFile&) = delete;

  const std::string& path() const { return path_; }
  uint64_t size() const { return size_; }
  bool direct_active() const { return direct_; }
  // Why O_DIRECT is not in effect (unsupported, or accepted but not enforced, e.g. FUSE); empty
  // when it is.
  const std::string& direct_note() const { return note_; }
  int fd() const { return fd_; }

  // Reads up to `length` bytes at `offset` into `dst` and requires at least `required` of them
  // (a window rounded up past the end of the file comes back short). With O_DIRECT active,
  // offset, length and dst must be kDirectAlignment-aligned. Throws bmoe::Error naming the
  // file on an I/O error or a short read, and says so when the file changed under us.
  void read_window(uint64_t offset, uint64_t length, uint8_t* dst, uint64_t required) const;

  // Reads [offset, offset+length) of the file into `dst` whatever the alignment: the read
  // window is rounded out to the alignment through `bounce` (resized as needed).
  void read_span(uint64_t offset, uint64_t length, uint8_t* dst) const;

 private:
  std::string path_;
  int fd_ = -1;
  bool direct_ = false;
  std::string note_;
  uint64_t size_ = 0;
  int64_t mtime_ns_ = 0;
};

// Test hook: called before every read; may throw or sleep to simulate EIO, short or slow
// reads. Returns the number of bytes the read should pretend to deliver (length = no fault).
using ReadFaultHook = std::function<uint64_t(const std::string& path, uint64_t offset, uint64_t length)>;
void set_read_fault_hook(ReadFaultHook hook);
// True while a hook is installed (io_uring reads then run through read_window so it applies).
bool read_fault_hook_active();

}  // namespace bmoe
