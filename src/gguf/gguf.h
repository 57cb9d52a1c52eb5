// GGUF model files: metadata values, tensor descriptors, and a reader for single files and
// split shard sets ("name-00001-of-00003.gguf") presented as one model.
//
// The reader parses the header with positioned reads and does not map the file: whoever loads
// the model decides which byte ranges to map (resident weights) and which to read on demand
// (streamed experts).
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "quant/types.h"

namespace bmoe {

enum class GgufValueType : uint32_t {
  UINT8 = 0,
  INT8 = 1,
  UINT16 = 2,
  INT16 = 3,
  UINT32 = 4,
  INT32 = 5,
  FLOAT32 = 6,
  BOOL = 7,
  STRING = 8,
  ARRAY = 9,
  UINT64 = 10,
  INT64 = 11,
  FLOAT64 = 12,
};

const char* gguf_value_type_name(GgufValueType t);

// One metadata value. Integers (and bool) live in `integer` (uint64 stored bit-for-bit),
// floats in `real`, strings in `text`; arrays hold their element type and nested values.
struct GgufValue {
  GgufValueType type = GgufValueType::UINT32;
  int64_t integer = 0;
  double real = 0.0;
  std::string text;
  GgufValueType element_type = GgufValueType::UINT32;  // arrays only
  std::vector<GgufValue> elements;                     // arrays only

  static GgufValue u32(uint32_t v);
  static GgufValue i32(int32_t v);
  static GgufValue u64(uint64_t v);
  static GgufValue u16(uint16_t v);
  static GgufValue f32(float v);
  static GgufValue boolean(bool v);
  static GgufValue string(std::string v);
  static GgufValue string_array(const std::vector<std::string>& v);
  static GgufValue i32_array(const std::vector<int32_t>& v);
  static GgufValue f32_array(const std::vector<float>& v);
  static GgufValue u32_array(const std::vector<uint32_t>& v);
  static GgufValue bool_array(const std::vector<bool>& v);

  bool is_integer() const;
  bool is_float() const { return type == GgufValueType::FLOAT32 || type == GgufValueType::FLOAT64; }
};

struct TensorInfo {
  std::string name;
  std::vector<int64_t> dims;  // ggml order: dims[0] is the contiguous (row) dimension
  TensorType type = TensorType::F32;
  uint64_t data_offset = 0;  // relative to the shard's data section, as stored in the file
  uint64_t file_offset = 0;  // absolute byte offset in its shard file
  uint64_t nbytes = 0;
  int shard = 0;             // index into GgufModel::shards()

  int64_t elements() const;
  int64_t rows() const { return elements() / dims.at(0); }  // everything but dims[0]
};

// One parsed GGUF file (header only; the tensor data stays on disk).
struct GgufShard {
  std::string path;
  uint32_t version = 0;
  uint64_t file_size = 0;
  uint64_t data_section = 0;  // absolute offset of the tensor data section
  uint32_t alignment = 32;
  std::vector<std::pair<std::string, GgufValue>> metadata;  // file order
  std::vector<TensorInfo> tensors;                          // file order
};

// Parses one file; throws bmoe::Error with a one-line reason for any malformed input.
GgufShard read_gguf_shard(const std::string& path);

// Typed access to metadata keys: a model's merged keys, or keys about to be written. The *_or
// forms return the fallback when the key is absent, the others throw "missing required key";
// both throw on a type mismatch. Errors name `source`.
class GgufMetadata {
 public:
  GgufMetadata() = default;
  GgufMetadata(std::string source, const std::vector<std::pair<std::string, GgufValue>>& values);

  const GgufValue* find(const std::string& key) const;
  std::string get_string(const std::string& key) const;
  std::string get_string_or(const std::string& key, const std::string& fallback) const;
  int64_t get_int(const std::string& key) const;
  int64_t get_int_or(const std::string& key, int64_t fallback) const;
  double get_float(const std::string& key) const;
  double get_float_or(const std::string& key, double fallback) const;
  bool get_bool_or(const std::string& key, bool fallback) const;
  // Array of strings / numbers; throws when missing or of another type.
  std::vector<std::string> get_string_array(const std::string& key) const;
  std::vector<int64_t> get_int_array(const std::string& key) const;
  std::vector<double> get_float_array(const std::string& key) const;
  // Integer key that may be stored as a per-layer array; returns one value per layer.
  std::vector<int64_t> get_per_layer_int(const std::string& key, int n_layers,
                                         std::optional<int64_t> fallback) const;

 protected:
  std::string source_;
  std::map<std::string, GgufValue> values_;  // the first value of a key wins
};

// A model: one file or a complete set of split shards, validated as a whole. Its metadata is
// the shards' keys merged, the primary shard's first.
class GgufModel : public GgufMetadata {
 public:
  // Opens `path`; when it names a shard of a split set, all shards are opened.
  static std::unique_ptr<GgufModel> open(const std::string& path);

  const std::vector<GgufShard>& shards() const { return shards_; }
  const std::vector<TensorInfo>& tensors() const { return tensors_; }
  const GgufShard& primary() const { return shards_.front(); }

  const TensorInfo* find_tensor(const std::string& name) const;
  const TensorInfo& tensor(const std::string& name) const;  // throws "missing tensor"

  uint64_t total_tensor_bytes() const;

 private:
  std::vector<GgufShard> shards_;
  std::vector<TensorInfo> tensors_;
  std::map<std::string, size_t> tensor_index_;
};

// Split naming: returns "prefix-00002-of-00005.gguf" for (prefix, 2, 5).
std::string split_shard_path(const std::string& prefix, int index, int count);
// If `path` looks like a shard name, returns {prefix, index, count}.
struct SplitName {
  std::string prefix;
  int index = 0;
  int count = 0;
};
std::optional<SplitName> parse_split_name(const std::string& path);

}  // namespace bmoe
