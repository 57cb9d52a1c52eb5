#include "gguf/gguf_writer.h"

#include <cstdio>
#include <cstring>
#include <memory>

#include "core/error.h"

namespace bmoe {
namespace {

// Appends little-endian encodings to a byte buffer (the header is built in memory).
class Encoder {
 public:
  template <typename T>
  void scalar(T v) {
    const auto* p = reinterpret_cast<const uint8_t*>(&v);
    bytes_.insert(bytes_.end(), p, p + sizeof v);
  }
  void string(const std::string& s) {
    scalar<uint64_t>(s.size());
    bytes_.insert(bytes_.end(), s.begin(), s.end());
  }
  void value(const GgufValue& v) {
    switch (v.type) {
      case GgufValueType::UINT8: scalar<uint8_t>(static_cast<uint8_t>(v.integer)); break;
      case GgufValueType::INT8: scalar<int8_t>(static_cast<int8_t>(v.integer)); break;
      case GgufValueType::UINT16: scalar<uint16_t>(static_cast<uint16_t>(v.integer)); break;
      case GgufValueType::INT16: scalar<int16_t>(static_cast<int16_t>(v.integer)); break;
      case GgufValueType::UINT32: scalar<uint32_t>(static_cast<uint32_t>(v.integer)); break;
      case GgufValueType::INT32: scalar<int32_t>(static_cast<int32_t>(v.integer)); break;
      case GgufValueType::UINT64: scalar<uint64_t>(static_cast<uint64_t>(v.integer)); break;
      case GgufValueType::INT64: scalar<int64_t>(v.integer); break;
      case GgufValueType::FLOAT32: scalar<float>(static_cast<float>(v.real)); break;
      case GgufValueType::FLOAT64: scalar<double>(v.real); break;
      case GgufValueType::BOOL: scalar<uint8_t>(v.integer ? 1 : 0); break;
      case GgufValueType::STRING: string(v.text); break;
      case GgufValueType::ARRAY:
        scalar<uint32_t>(static_cast<uint32_t>(v.element_type));
        scalar<uint64_t>(v.elements.size());
        for (const GgufValue& e : v.elements) value(e);
        break;
    }
  }
  void pad_to(uint32_t alignment) {
    while (bytes_.size() % alignment != 0) bytes_.push_back(0);
  }
  const std::vector<uint8_t>& bytes() const { return bytes_; }

 private:
  std::vector<uint8_t> bytes_;
};

uint64_t align_up(uint64_t x, uint64_t a) { return (x + a - 1) / a * a; }

struct FileCloser {
  void operator()(FILE* f) const {
    if (f) std::fclose(f);
  }
};

void write_all(FILE* f, const void* data, size_t n, const std::string& path) {
  if (n > 0 && std::fwrite(data, 1, n, f) != n) fail_errno("cannot write " + path);
}

}  // namespace

void GgufWriter::set(const std::string& key, GgufValue value) {
  for (auto& [k, v] : metadata_) {
    if (k == key) {
      v = std::move(value);
      return;
    }
  }
  metadata_.emplace_back(key, std::move(value));
}

void GgufWriter::add_tensor(const std::string& name, std::vector<int64_t> dims, TensorType type,
                            Fill fill) {
  const TypeInfo& info = type_info(type);
  if (dims.empty() || dims[0] % info.block_size != 0) {
    fail("gguf writer: tensor '{}' row is not a multiple of the {} block size", name, info.name);
  }
  int64_t elements = 1;
  for (int64_t d : dims) elements *= d;
  const uint64_t nbytes = static_cast<uint64_t>(elements / info.block_size) * info.block_bytes;
  tensors_.push_back({name, std::move(dims), type, nbytes, std::move(fill)});
}

uint64_t GgufWriter::tensor_bytes() const {
  uint64_t total = 0;
  for (const auto& t : tensors_) total += t.nbytes;
  return total;
}

void GgufWriter::write_shard(const std::string& path,
                             const std::vector<std::pair<std::string, GgufValue>>& kv,
                             const std::vector<const PendingTensor*>& tensors, uint64_t& done,
                             uint64_t total, const OnProgress& on_progress) const {
  Encoder header;
  header.scalar<uint32_t>(0x46554747);  // "GGUF"
  header.scalar<uint32_t>(3);
  header.scalar<uint64_t>(tensors.size());
  header.scalar<uint64_t>(kv.size());
  for (const auto& [key, value] : kv) {
    header.string(key);
    header.scalar<uint32_t>(static_cast<uint32_t>(value.type));
    header.value(value);
  }
  uint64_t offset = 0;
  for (const PendingTensor* t : tensors) {
    header.string(t->name);
    header.scalar<uint32_t>(static_cast<uint32_t>(t->dims.size()));
    for (int64_t d : t->dims) header.scalar<uint64_t>(static_cast<uint64_t>(d));
    header.scalar<uint32_t>(static_cast<uint32_t>(t->type));
    header.scalar<uint64_t>(offset);
    offset = align_up(offset + t->nbytes, alignment_);
  }
  header.pad_to(alignment_);

  std::unique_ptr<FILE, FileCloser> file(std::fopen(path.c_str(), "wb"));
  if (!file) fail_errno("cannot create " + path);
  write_all(file.get(), header.bytes().data(), header.bytes().size(), path);

  std::vector<uint8_t> buffer;
  static const uint8_t zeros[256] = {};
  for (const PendingTensor* t : tensors) {
    buffer.resize(static_cast<size_t>(t->nbytes));
    t->fill(buffer.data(), t->nbytes);
    write_all(file.get(), buffer.data(), buffer.size(), path);
    const uint64_t padding = align_up(t->nbytes, alignment_) - t->nbytes;
    write_all(file.get(), zeros, static_cast<size_t>(padding), path);
    done += t->nbytes;
    if (on_progress) on_progress(done, total);
  }
  if (std::fflush(file.get()) != 0) fail_errno("cannot write " + path);
}

std::vector<std::string> GgufWriter::write(const std::string& path, int n_shards,
                                           const OnProgress& on_progress) const {
  if (n_shards < 1) fail("gguf writer: shard count must be >= 1");
  if (n_shards > static_cast<int>(tensors_.size())) {
    fail("gguf writer: cannot split {} tensors into {} shards", tensors_.size(), n_shards);
  }
  const uint64_t total = tensor_bytes();
  uint64_t done = 0;
  if (n_shards == 1) {
    std::vector<const PendingTensor*> all;
    for (const auto& t : tensors_) all.push_back(&t);
    write_shard(path, metadata_, all, done, total, on_progress);
    return {path};
  }

  // Balance shards by bytes, keeping tensor order; every shard gets at least one tensor.
  std::vector<std::vector<const PendingTensor*>> groups(static_cast<size_t>(n_shards));
  uint64_t running = 0;
  for (size_t i = 0; i < tensors_.size(); ++i) {
    const size_t tensors_left = tensors_.size() - i;
    size_t shard = static_cast<size_t>(running * static_cast<uint64_t>(n_shards) / std::max<uint64_t>(total, 1));
    shard = std::min(shard, static_cast<size_t>(n_shards - 1));
    // Never leave later shards empty.
    const size_t min_shard = static_cast<size_t>(n_shards) > tensors_left ? static_cast<size_t>(n_shards) - tensors_left : 0;
    size_t last_used = 0;
    for (size_t g = 0; g < groups.size(); ++g) if (!groups[g].empty()) last_used = g;
    shard = std::max({shard, min_shard, last_used});
    groups[shard].push_back(&tensors_[i]);
    running += tensors_[i].nbytes;
  }
  std::string prefix = path;
  if (prefix.size() > 5 && prefix.compare(prefix.size() - 5, 5, ".gguf") == 0) {
    prefix.resize(prefix.size() - 5);
  }
  std::vector<std::string> paths;
  for (int s = 0; s < n_shards; ++s) {
    std::vector<std::pair<std::string, GgufValue>> kv;
    if (s == 0) kv = metadata_;
    auto set_kv = [&](const std::string& key, GgufValue v) {
      for (auto& [k, old] : kv) {
        if (k == key) {
          old = std::move(v);
          return;
        }
      }
      kv.emplace_back(key, std::move(v));
    };
    set_kv("split.no", GgufValue::u16(static_cast<uint16_t>(s)));
    set_kv("split.count", GgufValue::u16(static_cast<uint16_t>(n_shards)));
    set_kv("split.tensors.count", GgufValue::i32(static_cast<int32_t>(tensors_.size())));
    const std::string shard_path = split_shard_path(prefix, s + 1, n_shards);
    write_shard(shard_path, kv, groups[static_cast<size_t>(s)], done, total, on_progress);
    paths.push_back(shard_path);
  }
  return paths;
}

}  // namespace bmoe
