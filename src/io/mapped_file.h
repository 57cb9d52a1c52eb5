// Read-only memory mapping of a whole file (RAII).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace bmoe {

// Reads a whole (small) file: a prompt, a template, a JSON list. Throws bmoe::Error
// "cannot read <what> <path>" where it cannot.
std::string read_whole_file(const std::string& path, const std::string& what);

class MappedFile {
 public:
  MappedFile() = default;
  // Maps `path` read-only. Throws bmoe::Error naming the file on failure.
  explicit MappedFile(const std::string& path);
  // Maps [offset, offset + length) of the file (rounded out to pages); data() points at offset.
  MappedFile(const std::string& path, uint64_t offset, uint64_t length);
  ~MappedFile();
  MappedFile(MappedFile&& other) noexcept;
  MappedFile& operator=(MappedFile&& other) noexcept;
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;

  const uint8_t* data() const { return data_; }
  size_t size() const { return size_; }
  const std::string& path() const { return path_; }

  // Tells the kernel that [offset, offset+length) will not be needed soon (page cache hint).
  void advise_dontneed(size_t offset, size_t length) const;
  void advise_willneed(size_t offset, size_t length) const;
  // Reads the whole mapping in and maps every page now (MADV_POPULATE_READ), so later reads
  // take no page faults. Returns false where the kernel cannot (before Linux 5.14).
  bool populate() const;

 private:
  void release();
  std::string path_;
  const uint8_t* data_ = nullptr;
  size_t size_ = 0;
  const uint8_t* base_ = nullptr;  // start of the mapping (page aligned)
  size_t mapped_ = 0;
};

}  // namespace bmoe
