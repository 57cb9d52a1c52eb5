// Writes GGUF v3 files. Tensor data is produced on demand, tensor by tensor, so a model far
// larger than memory can be written. Optionally splits the tensors over N shard files with the
// split.* keys llama.cpp's gguf-split uses.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "gguf/gguf.h"

namespace bmoe {

class GgufWriter {
 public:
  // Fills exactly nbytes of tensor data.
  using Fill = std::function<void(uint8_t* out, uint64_t nbytes)>;
  // Called after each tensor is written with (bytes written so far, total bytes).
  using OnProgress = std::function<void(uint64_t done, uint64_t total)>;

  explicit GgufWriter(uint32_t alignment = 32) : alignment_(alignment) {}

  // Sets a metadata key (replaces an earlier value, keeps its position).
  void set(const std::string& key, GgufValue value);
  void add_tensor(const std::string& name, std::vector<int64_t> dims, TensorType type, Fill fill);

  const std::vector<std::pair<std::string, GgufValue>>& metadata() const { return metadata_; }
  uint64_t tensor_bytes() const;
  size_t tensor_count() const { return tensors_.size(); }

  // Writes `path` (n_shards == 1) or NAME-0000i-of-0000N.gguf files, where NAME is `path`
  // without its .gguf suffix. Returns the paths written.
  std::vector<std::string> write(const std::string& path, int n_shards = 1,
                                 const OnProgress& on_progress = {}) const;

 private:
  struct PendingTensor {
    std::string name;
    std::vector<int64_t> dims;
    TensorType type;
    uint64_t nbytes;
    Fill fill;
  };
  void write_shard(const std::string& path, const std::vector<std::pair<std::string, GgufValue>>& kv,
                   const std::vector<const PendingTensor*>& tensors, uint64_t& done, uint64_t total,
                   const OnProgress& on_progress) const;

  uint32_t alignment_;
  std::vector<std::pair<std::string, GgufValue>> metadata_;
  std::vector<PendingTensor> tensors_;
};

}  // namespace bmoe
