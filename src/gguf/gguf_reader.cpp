#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>

#include "core/error.h"
#include "gguf/gguf.h"

namespace bmoe {
namespace {

constexpr uint32_t kMagic = 0x46554747;  // "GGUF" little-endian
constexpr uint64_t kMaxCount = 1ull << 28;  // sanity cap on tensor/kv/array counts
constexpr int kMaxDims = 4;
constexpr int kMaxArrayDepth = 8;

// Reads a file front to back in large chunks with bounds checks, so that a truncated or
// corrupted header ends in a clear error instead of reading garbage.
class HeaderReader {
 public:
  explicit HeaderReader(const std::string& path) : path_(path) {
    fd_ = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd_ < 0) fail_errno("cannot open " + path);
    struct stat st {};
    if (::fstat(fd_, &st) != 0) fail_errno("cannot stat " + path);
    if (!S_ISREG(st.st_mode)) fail("{}: not a regular file", path);
    size_ = static_cast<uint64_t>(st.st_size);
  }
  ~HeaderReader() {
    if (fd_ >= 0) ::close(fd_);
  }
  HeaderReader(const HeaderReader&) = delete;
  HeaderReader& operator=(const HeaderReader&) = delete;

  uint64_t size() const { return size_; }
  uint64_t position() const { return pos_; }

  void read(void* out, uint64_t n, const char* what) {
    if (n > size_ || pos_ > size_ - n) {
      fail("{}: truncated file (reading {} at offset {}, file has {} bytes)", path_, what, pos_,
           size_);
    }
    auto* dst = static_cast<uint8_t*>(out);
    while (n > 0) {
      if (pos_ < buffer_start_ || pos_ >= buffer_start_ + buffer_.size()) fill();
      const uint64_t available = buffer_start_ + buffer_.size() - pos_;
      const uint64_t take = std::min(n, available);
      std::memcpy(dst, buffer_.data() + (pos_ - buffer_start_), take);
      dst += take;
      pos_ += take;
      n -= take;
    }
  }

  template <typename T>
  T scalar(const char* what) {
    T v;
    read(&v, sizeof v, what);
    return v;
  }

  std::string string(const char* what) {
    const uint64_t length = scalar<uint64_t>(what);
    if (length > size_ - std::min(size_, pos_)) {
      fail("{}: corrupted file (string of {} bytes at offset {} runs past the end)", path_, length,
           pos_);
    }
    std::string s(length, '\0');
    read(s.data(), length, what);
    return s;
  }

 private:
  void fill() {
    constexpr uint64_t kChunk = 4u << 20;
    buffer_start_ = pos_;
    buffer_.resize(static_cast<size_t>(std::min(kChunk, size_ - pos_)));
    size_t done = 0;
    while (done < buffer_.size()) {
      const ssize_t got = ::pread(fd_, buffer_.data() + done, buffer_.size() - done,
                                  static_cast<off_t>(buffer_start_ + done));
      if (got < 0) fail_errno("cannot read " + path_);
      if (got == 0) fail("{}: file shrank while reading", path_);
      done += static_cast<size_t>(got);
    }
  }

  std::string path_;
  int fd_ = -1;
  uint64_t size_ = 0;
  uint64_t pos_ = 0;
  uint64_t buffer_start_ = 0;
  std::vector<uint8_t> buffer_;
};

// The fewest bytes one value of `type` takes in the file: bounds the counts a header may claim
// by what is left to read, so a corrupted count fails before anything is allocated for it.
uint64_t min_encoded_bytes(GgufValueType type) {
  switch (type) {
    case GgufValueType::UINT8:
    case GgufValueType::INT8:
    case GgufValueType::BOOL: return 1;
    case GgufValueType::UINT16:
    case GgufValueType::INT16: return 2;
    case GgufValueType::UINT32:
    case GgufValueType::INT32:
    case GgufValueType::FLOAT32: return 4;
    case GgufValueType::STRING:  // the length
    case GgufValueType::UINT64:
    case GgufValueType::INT64:
    case GgufValueType::FLOAT64: return 8;
    case GgufValueType::ARRAY: return 12;  // element type + count
  }
  return 1;
}
constexpr uint64_t kMinKvBytes = 8 + 4 + 1;         // key length, value type, a value byte
constexpr uint64_t kMinTensorInfoBytes = 8 + 4 + 8 + 4 + 8;  // name length, dims, one dim, type, offset
constexpr size_t kMaxReserve = 1 << 20;             // elements reserved up front; more grow as read

GgufValue read_value(HeaderReader& in, GgufValueType type, const std::string& key, int depth,
                     const std::string& path);

GgufValueType checked_value_type(uint32_t raw, const std::string& key, const std::string& path) {
  if (raw > static_cast<uint32_t>(GgufValueType::FLOAT64)) {
    fail("{}: corrupted metadata: key '{}' has unknown value type {}", path, key, raw);
  }
  return static_cast<GgufValueType>(raw);
}

GgufValue read_value(HeaderReader& in, GgufValueType type, const std::string& key, int depth,
                     const std::string& path) {
  GgufValue v;
  v.type = type;
  switch (type) {
    case GgufValueType::UINT8: v.integer = in.scalar<uint8_t>("u8"); break;
    case GgufValueType::INT8: v.integer = in.scalar<int8_t>("i8"); break;
    case GgufValueType::UINT16: v.integer = in.scalar<uint16_t>("u16"); break;
    case GgufValueType::INT16: v.integer = in.scalar<int16_t>("i16"); break;
    case GgufValueType::UINT32: v.integer = in.scalar<uint32_t>("u32"); break;
    case GgufValueType::INT32: v.integer = in.scalar<int32_t>("i32"); break;
    case GgufValueType::UINT64: v.integer = static_cast<int64_t>(in.scalar<uint64_t>("u64")); break;
    case GgufValueType::INT64: v.integer = in.scalar<int64_t>("i64"); break;
    case GgufValueType::FLOAT32: v.real = in.scalar<float>("f32"); break;
    case GgufValueType::FLOAT64: v.real = in.scalar<double>("f64"); break;
    case GgufValueType::BOOL: {
      const uint8_t b = in.scalar<uint8_t>("bool");
      if (b > 1) fail("{}: corrupted metadata: key '{}' has bool value {}", path, key, b);
      v.integer = b;
      break;
    }
    case GgufValueType::STRING: v.text = in.string("string value"); break;
    case GgufValueType::ARRAY: {
      if (depth >= kMaxArrayDepth) fail("{}: corrupted metadata: key '{}' nests too deep", path, key);
      v.element_type = checked_value_type(in.scalar<uint32_t>("array type"), key, path);
      const uint64_t count = in.scalar<uint64_t>("array length");
      // A count whose elements could not fit in the rest of the file is corruption.
      if (count > kMaxCount || count > (in.size() - in.position()) / min_encoded_bytes(v.element_type)) {
        fail("{}: corrupted metadata: key '{}' claims an array of {} elements", path, key, count);
      }
      v.elements.reserve(std::min(static_cast<size_t>(count), kMaxReserve));
      for (uint64_t i = 0; i < count; ++i) {
        v.elements.push_back(read_value(in, v.element_type, key, depth + 1, path));
      }
      break;
    }
  }
  return v;
}

bool is_power_of_two(uint64_t x) { return x != 0 && (x & (x - 1)) == 0; }

void read_tensor_infos(HeaderReader& in, GgufShard& shard, uint64_t n_tensors) {
  shard.tensors.reserve(std::min(static_cast<size_t>(n_tensors), kMaxReserve));
  for (uint64_t t = 0; t < n_tensors; ++t) {
    TensorInfo info;
    info.name = in.string("tensor name");
    const uint32_t n_dims = in.scalar<uint32_t>("tensor dims");
    if (n_dims == 0 || n_dims > kMaxDims) {
      fail("{}: corrupted tensor info: '{}' has {} dimensions", shard.path, info.name, n_dims);
    }
    uint64_t elements_so_far = 1;
    for (uint32_t d = 0; d < n_dims; ++d) {
      const uint64_t dim = in.scalar<uint64_t>("tensor dim");
      if (dim == 0 || dim > (1ull << 40)) {
        fail("{}: corrupted tensor info: '{}' has dimension {} = {}", shard.path, info.name, d, dim);
      }
      // The element count must stay representable (TensorInfo::elements multiplies the dims).
      if (__builtin_mul_overflow(elements_so_far, dim, &elements_so_far) || elements_so_far > (1ull << 40)) {
        fail("{}: corrupted tensor info: '{}' has more than 2^40 elements", shard.path, info.name);
      }
      info.dims.push_back(static_cast<int64_t>(dim));
    }
    const uint32_t raw_type = in.scalar<uint32_t>("tensor type");
    const auto geometry = type_info(raw_type);
    if (!geometry) fail("{}: tensor '{}' has unknown tensor type {}", shard.path, info.name, raw_type);
    info.type = static_cast<TensorType>(raw_type);
    if (info.dims[0] % geometry->block_size != 0) {
      fail("{}: tensor '{}' ({}) row of {} elements is not a multiple of the block size {}",
           shard.path, info.name, geometry->name, info.dims[0], geometry->block_size);
    }
    info.data_offset = in.scalar<uint64_t>("tensor offset");
    const int64_t elements = info.elements();
    if (elements <= 0 || elements > (1ll << 40)) {
      fail("{}: corrupted tensor info: '{}' has {} elements", shard.path, info.name, elements);
    }
    info.nbytes = static_cast<uint64_t>(elements / geometry->block_size) * geometry->block_bytes;
    shard.tensors.push_back(std::move(info));
  }
}

// Checks every tensor lies inside the file, is aligned, and overlaps no other tensor.
void validate_tensor_ranges(GgufShard& shard) {
  std::vector<const TensorInfo*> by_offset;
  for (TensorInfo& t : shard.tensors) {
    if (t.data_offset % shard.alignment != 0) {
      fail("{}: tensor '{}' data offset {} is not aligned to {}", shard.path, t.name, t.data_offset,
           shard.alignment);
    }
    t.file_offset = shard.data_section + t.data_offset;
    if (t.data_offset > shard.file_size || t.file_offset > shard.file_size ||
        t.nbytes > shard.file_size - t.file_offset) {
      fail("{}: tensor '{}' data out of range ({} bytes at offset {}, file has {}): truncated file?",
           shard.path, t.name, t.nbytes, t.file_offset, shard.file_size);
    }
    by_offset.push_back(&t);
  }
  std::sort(by_offset.begin(), by_offset.end(),
            [](const TensorInfo* a, const TensorInfo* b) { return a->data_offset < b->data_offset; });
  for (size_t i = 1; i < by_offset.size(); ++i) {
    const TensorInfo& prev = *by_offset[i - 1];
    const TensorInfo& next = *by_offset[i];
    if (prev.data_offset + prev.nbytes > next.data_offset) {
      fail("{}: tensors '{}' and '{}' overlap", shard.path, prev.name, next.name);
    }
  }
}

}  // namespace

GgufShard read_gguf_shard(const std::string& path) {
  HeaderReader in(path);
  GgufShard shard;
  shard.path = path;
  shard.file_size = in.size();
  if (in.size() < 4) fail("{}: not a GGUF file (only {} bytes)", path, in.size());
  const uint32_t magic = in.scalar<uint32_t>("magic");
  if (magic != kMagic) fail("{}: not a GGUF file (bad magic)", path);
  shard.version = in.scalar<uint32_t>("version");
  if (shard.version != 2 && shard.version != 3) {
    fail("{}: unsupported GGUF version {} (bmoe reads versions 2 and 3)", path, shard.version);
  }
  const uint64_t n_tensors = in.scalar<uint64_t>("tensor count");
  const uint64_t n_kv = in.scalar<uint64_t>("metadata count");
  const uint64_t rest = in.size() - in.position();
  if (n_tensors > kMaxCount || n_kv > kMaxCount || n_tensors > rest / kMinTensorInfoBytes || n_kv > rest / kMinKvBytes) {
    fail("{}: corrupted header ({} tensors, {} metadata keys)", path, n_tensors, n_kv);
  }
  for (uint64_t i = 0; i < n_kv; ++i) {
    std::string key = in.string("metadata key");
    const GgufValueType type = checked_value_type(in.scalar<uint32_t>("value type"), key, path);
    GgufValue value = read_value(in, type, key, 0, path);
    if (key == "general.alignment") {
      if (!value.is_integer() || !is_power_of_two(static_cast<uint64_t>(value.integer)) ||
          value.integer > (1 << 20)) {
        fail("{}: invalid general.alignment", path);
      }
      shard.alignment = static_cast<uint32_t>(value.integer);
    }
    shard.metadata.emplace_back(std::move(key), std::move(value));
  }
  read_tensor_infos(in, shard, n_tensors);
  const uint64_t header_end = in.position();
  shard.data_section = (header_end + shard.alignment - 1) / shard.alignment * shard.alignment;
  if (n_tensors > 0 && shard.data_section > shard.file_size) {
    fail("{}: truncated file (no tensor data after the header)", path);
  }
  validate_tensor_ranges(shard);
  return shard;
}

}  // namespace bmoe
