#include "io/direct_io.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <mutex>

#include "core/error.h"

namespace bmoe {
namespace {

std::mutex g_hook_mutex;
ReadFaultHook g_hook;

ReadFaultHook current_hook() {
  std::lock_guard<std::mutex> lock(g_hook_mutex);
  return g_hook;
}

int64_t mtime_of(const struct stat& st) { return static_cast<int64_t>(st.st_mtim.tv_sec) * 1000000000 + st.st_mtim.tv_nsec; }

}  // namespace

void AlignedFree::operator()(void* p) const { std::free(p); }

AlignedBuffer allocate_aligned(size_t bytes) {
  void* p = nullptr;
  if (::posix_memalign(&p, kDirectAlignment, align_up(std::max<size_t>(bytes, 1), kDirectAlignment)) != 0) {
    fail("out of memory allocating {} bytes", bytes);
  }
  return AlignedBuffer(static_cast<uint8_t*>(p));
}

bool read_fault_hook_active() { return static_cast<bool>(current_hook()); }

void set_read_fault_hook(ReadFaultHook hook) {
  std::lock_guard<std::mutex> lock(g_hook_mutex);
  g_hook = std::move(hook);
}

DirectFile::DirectFile(const std::string& path, bool direct) : path_(path) {
  if (direct) {
    fd_ = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_DIRECT);
    if (fd_ >= 0) {
      direct_ = true;
    } else if (errno == EINVAL) {
      note_ = "the filesystem does not support O_DIRECT; using buffered reads";
    } else {
      fail_errno("cannot open " + path);
    }
  }
  if (fd_ < 0) {
    fd_ = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd_ < 0) fail_errno("cannot open " + path);
  }
  struct stat st {};
  if (::fstat(fd_, &st) != 0) fail_errno("cannot stat " + path);
  size_ = static_cast<uint64_t>(st.st_size);
  mtime_ns_ = mtime_of(st);
  if (direct_ && size_ > 1) {
    // Some filesystems (FUSE, e.g. Android's /sdcard) accept O_DIRECT but ignore it: a
    // misaligned read then succeeds where a real O_DIRECT read fails with EINVAL.
    char probe[2];
    if (::pread(fd_, probe, 1, 1) == 1) {
      note_ = "O_DIRECT is accepted but not enforced on this filesystem (FUSE?): reads go through the page cache";
    }
  }
}

DirectFile::~DirectFile() {
  if (fd_ >= 0) ::close(fd_);
}

void DirectFile::read_window(uint64_t offset, uint64_t length, uint8_t* dst, uint64_t required) const {
  uint64_t deliver = length;
  if (const ReadFaultHook hook = current_hook()) deliver = std::min(length, hook(path_, offset, length));
  uint64_t done = 0;
  while (done < deliver) {
    const ssize_t got = ::pread(fd_, dst + done, static_cast<size_t>(deliver - done), static_cast<off_t>(offset + done));
    if (got < 0) {
      if (errno == EINTR) continue;
      fail_errno("read of " + path_ + " failed at offset " + std::to_string(offset + done));
    }
    if (got == 0) break;
    done += static_cast<uint64_t>(got);
  }
  if (done >= required) return;
  struct stat st {};
  if (::fstat(fd_, &st) == 0 && (static_cast<uint64_t>(st.st_size) != size_ || mtime_of(st) != mtime_ns_)) {
    fail("{} changed on disk while in use (size {} -> {} bytes): restart with the new file", path_, size_,
         static_cast<uint64_t>(st.st_size));
  }
  fail("short read of {}: {} of {} bytes at offset {}", path_, done, required, offset);
}

void DirectFile::read_span(uint64_t offset, uint64_t length, uint8_t* dst) const {
  if (!direct_) {
    read_window(offset, length, dst, length);
    return;
  }
  const uint64_t begin = align_down(offset, kDirectAlignment);
  const uint64_t end = align_up(offset + length, kDirectAlignment);
  thread_local AlignedBuffer bounce;
  thread_local size_t bounce_size = 0;
  if (bounce_size < end - begin) {
    bounce = allocate_aligned(end - begin);
    bounce_size = end - begin;
  }
  read_window(begin, end - begin, bounce.get(), offset + length - begin);
  std::memcpy(dst, bounce.get() + (offset - begin), static_cast<size_t>(length));
}

}  // namespace bmoe
