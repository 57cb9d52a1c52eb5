#include "io/mapped_file.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <fstream>
#include <sstream>
#include <utility>

#include "core/error.h"

namespace bmoe {

std::string read_whole_file(const std::string& path, const std::string& what) {
  std::ifstream in(path, std::ios::binary);
  if (!in) fail("cannot read {}{}", what.empty() ? "" : what + " ", path);
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

MappedFile::MappedFile(const std::string& path) : path_(path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) fail_errno("cannot open " + path);
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    ::close(fd);
    fail_errno("cannot stat " + path);
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd);
    fail("{}: not a regular file", path);
  }
  size_ = static_cast<size_t>(st.st_size);
  if (size_ > 0) {
    void* p = ::mmap(nullptr, size_, PROT_READ, MAP_SHARED, fd, 0);
    if (p == MAP_FAILED) {
      ::close(fd);
      fail_errno("cannot mmap " + path);
    }
    data_ = static_cast<const uint8_t*>(p);
    base_ = data_;
    mapped_ = size_;
  }
  ::close(fd);
}

MappedFile::MappedFile(const std::string& path, uint64_t offset, uint64_t length) : path_(path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) fail_errno("cannot open " + path);
  const uint64_t page = static_cast<uint64_t>(::sysconf(_SC_PAGESIZE));
  const uint64_t begin = offset / page * page;
  mapped_ = static_cast<size_t>(offset + length - begin);
  void* p = ::mmap(nullptr, mapped_, PROT_READ, MAP_SHARED, fd, static_cast<off_t>(begin));
  ::close(fd);
  if (p == MAP_FAILED) fail_errno("cannot mmap " + path);
  base_ = static_cast<const uint8_t*>(p);
  data_ = base_ + (offset - begin);
  size_ = static_cast<size_t>(length);
}

MappedFile::~MappedFile() { release(); }

MappedFile::MappedFile(MappedFile&& other) noexcept
    : path_(std::move(other.path_)), data_(other.data_), size_(other.size_), base_(other.base_), mapped_(other.mapped_) {
  other.data_ = nullptr;
  other.size_ = 0;
  other.base_ = nullptr;
  other.mapped_ = 0;
}

MappedFile& MappedFile::operator=(MappedFile&& other) noexcept {
  if (this != &other) {
    release();
    path_ = std::move(other.path_);
    data_ = other.data_;
    size_ = other.size_;
    base_ = other.base_;
    mapped_ = other.mapped_;
    other.data_ = nullptr;
    other.size_ = 0;
    other.base_ = nullptr;
    other.mapped_ = 0;
  }
  return *this;
}

void MappedFile::release() {
  if (base_ != nullptr) ::munmap(const_cast<uint8_t*>(base_), mapped_);
  base_ = data_ = nullptr;
  size_ = mapped_ = 0;
}

namespace {
void advise(const uint8_t* base, size_t size, size_t offset, size_t length, int advice) {
  if (base == nullptr || offset >= size) return;
  const size_t page = static_cast<size_t>(::sysconf(_SC_PAGESIZE));
  const size_t begin = offset / page * page;
  const size_t end = std::min(size, offset + length);
  ::madvise(const_cast<uint8_t*>(base) + begin, end - begin, advice);
}
}  // namespace

void MappedFile::advise_dontneed(size_t offset, size_t length) const {
  advise(data_, size_, offset, length, MADV_DONTNEED);
}

void MappedFile::advise_willneed(size_t offset, size_t length) const {
  advise(data_, size_, offset, length, MADV_WILLNEED);
}

bool MappedFile::populate() const {
#ifndef MADV_POPULATE_READ
  constexpr int MADV_POPULATE_READ = 22;  // Linux 5.14; older kernels answer EINVAL
#endif
  return base_ != nullptr && ::madvise(const_cast<uint8_t*>(base_), mapped_, MADV_POPULATE_READ) == 0;
}

}  // namespace bmoe
