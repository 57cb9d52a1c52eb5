#include <sys/stat.h>

#include <algorithm>
#include <cstdio>
#include <regex>

#include "core/error.h"
#include "gguf/gguf.h"

namespace bmoe {

const char* gguf_value_type_name(GgufValueType t) {
  switch (t) {
    case GgufValueType::UINT8: return "u8";
    case GgufValueType::INT8: return "i8";
    case GgufValueType::UINT16: return "u16";
    case GgufValueType::INT16: return "i16";
    case GgufValueType::UINT32: return "u32";
    case GgufValueType::INT32: return "i32";
    case GgufValueType::FLOAT32: return "f32";
    case GgufValueType::BOOL: return "bool";
    case GgufValueType::STRING: return "string";
    case GgufValueType::ARRAY: return "array";
    case GgufValueType::UINT64: return "u64";
    case GgufValueType::INT64: return "i64";
    case GgufValueType::FLOAT64: return "f64";
  }
  return "?";
}

GgufValue GgufValue::u32(uint32_t v) {
  GgufValue x;
  x.type = GgufValueType::UINT32;
  x.integer = v;
  return x;
}
GgufValue GgufValue::i32(int32_t v) {
  GgufValue x;
  x.type = GgufValueType::INT32;
  x.integer = v;
  return x;
}
GgufValue GgufValue::u64(uint64_t v) {
  GgufValue x;
  x.type = GgufValueType::UINT64;
  x.integer = static_cast<int64_t>(v);
  return x;
}
GgufValue GgufValue::u16(uint16_t v) {
  GgufValue x;
  x.type = GgufValueType::UINT16;
  x.integer = v;
  return x;
}
GgufValue GgufValue::f32(float v) {
  GgufValue x;
  x.type = GgufValueType::FLOAT32;
  x.real = v;
  return x;
}
GgufValue GgufValue::boolean(bool v) {
  GgufValue x;
  x.type = GgufValueType::BOOL;
  x.integer = v ? 1 : 0;
  return x;
}
GgufValue GgufValue::string(std::string v) {
  GgufValue x;
  x.type = GgufValueType::STRING;
  x.text = std::move(v);
  return x;
}
GgufValue GgufValue::string_array(const std::vector<std::string>& v) {
  GgufValue x;
  x.type = GgufValueType::ARRAY;
  x.element_type = GgufValueType::STRING;
  x.elements.reserve(v.size());
  for (const auto& s : v) x.elements.push_back(string(s));
  return x;
}
GgufValue GgufValue::i32_array(const std::vector<int32_t>& v) {
  GgufValue x;
  x.type = GgufValueType::ARRAY;
  x.element_type = GgufValueType::INT32;
  for (int32_t i : v) x.elements.push_back(i32(i));
  return x;
}
GgufValue GgufValue::bool_array(const std::vector<bool>& v) {
  GgufValue x;
  x.type = GgufValueType::ARRAY;
  x.element_type = GgufValueType::BOOL;
  for (bool b : v) x.elements.push_back(boolean(b));
  return x;
}
GgufValue GgufValue::u32_array(const std::vector<uint32_t>& v) {
  GgufValue x;
  x.type = GgufValueType::ARRAY;
  x.element_type = GgufValueType::UINT32;
  for (uint32_t i : v) x.elements.push_back(u32(i));
  return x;
}
GgufValue GgufValue::f32_array(const std::vector<float>& v) {
  GgufValue x;
  x.type = GgufValueType::ARRAY;
  x.element_type = GgufValueType::FLOAT32;
  for (float f : v) x.elements.push_back(f32(f));
  return x;
}

bool GgufValue::is_integer() const {
  switch (type) {
    case GgufValueType::UINT8:
    case GgufValueType::INT8:
    case GgufValueType::UINT16:
    case GgufValueType::INT16:
    case GgufValueType::UINT32:
    case GgufValueType::INT32:
    case GgufValueType::UINT64:
    case GgufValueType::INT64:
    case GgufValueType::BOOL: return true;
    default: return false;
  }
}

int64_t TensorInfo::elements() const {
  int64_t n = 1;
  for (int64_t d : dims) n *= d;
  return n;
}

std::string split_shard_path(const std::string& prefix, int index, int count) {
  char suffix[64];
  std::snprintf(suffix, sizeof suffix, "-%05d-of-%05d.gguf", index, count);
  return prefix + suffix;
}

std::optional<SplitName> parse_split_name(const std::string& path) {
  static const std::regex pattern(R"((.*)-(\d{5})-of-(\d{5})\.gguf$)");
  std::smatch m;
  if (!std::regex_match(path, m, pattern)) return std::nullopt;
  SplitName name{m[1].str(), std::stoi(m[2].str()), std::stoi(m[3].str())};
  if (name.index < 1 || name.count < 1 || name.index > name.count) return std::nullopt;
  return name;
}

namespace {

int64_t shard_int(const GgufShard& shard, const std::string& key, int64_t fallback) {
  for (const auto& [k, v] : shard.metadata) {
    if (k == key) {
      if (!v.is_integer()) fail("{}: key '{}' must be an integer", shard.path, key);
      return v.integer;
    }
  }
  return fallback;
}

bool file_exists(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0;
}

}  // namespace

std::unique_ptr<GgufModel> GgufModel::open(const std::string& path) {
  auto model = std::make_unique<GgufModel>();
  GgufShard first = read_gguf_shard(path);
  const int64_t split_count = shard_int(first, "split.count", 1);
  if (split_count < 1 || split_count > 9999) fail("{}: invalid split.count {}", path, split_count);
  if (split_count == 1) {
    model->shards_.push_back(std::move(first));
  } else {
    const auto name = parse_split_name(path);
    if (!name) {
      fail("{}: file has split.count = {} but its name is not of the form NAME-00001-of-{:05d}.gguf",
           path, split_count, split_count);
    }
    if (name->count != split_count) {
      fail("{}: name says {} shards but split.count = {}", path, name->count, split_count);
    }
    for (int i = 1; i <= split_count; ++i) {
      const std::string shard_path = split_shard_path(name->prefix, i, static_cast<int>(split_count));
      if (i == name->index) {
        model->shards_.push_back(std::move(first));
        continue;
      }
      if (!file_exists(shard_path)) fail("missing shard {} of {}: {}", i, split_count, shard_path);
      model->shards_.push_back(read_gguf_shard(shard_path));
    }
    for (int i = 0; i < split_count; ++i) {
      const GgufShard& s = model->shards_[static_cast<size_t>(i)];
      const int64_t no = shard_int(s, "split.no", -1);
      if (no != i) fail("{}: split.no is {} but the file is shard {} of the set", s.path, no, i + 1);
      if (shard_int(s, "split.count", -1) != split_count) {
        fail("{}: split.count differs from the first shard's", s.path);
      }
    }
  }

  // Merge: metadata from every shard (first occurrence wins), tensors from all.
  model->source_ = model->primary().path;
  for (size_t s = 0; s < model->shards_.size(); ++s) {
    GgufShard& shard = model->shards_[s];
    for (const auto& [key, value] : shard.metadata) model->values_.emplace(key, value);
    for (TensorInfo& t : shard.tensors) {
      t.shard = static_cast<int>(s);
      if (model->tensor_index_.count(t.name)) fail("{}: duplicate tensor '{}'", shard.path, t.name);
      model->tensor_index_[t.name] = model->tensors_.size();
      model->tensors_.push_back(t);
    }
  }
  if (split_count > 1) {
    const int64_t expected = shard_int(model->primary(), "split.tensors.count", -1);
    if (expected >= 0 && expected != static_cast<int64_t>(model->tensors_.size())) {
      fail("{}: split set holds {} tensors but split.tensors.count = {}", path,
           model->tensors_.size(), expected);
    }
  }
  return model;
}

GgufMetadata::GgufMetadata(std::string source, const std::vector<std::pair<std::string, GgufValue>>& values)
    : source_(std::move(source)) {
  for (const auto& [key, value] : values) values_.emplace(key, value);
}

const GgufValue* GgufMetadata::find(const std::string& key) const {
  const auto it = values_.find(key);
  return it == values_.end() ? nullptr : &it->second;
}

const TensorInfo* GgufModel::find_tensor(const std::string& name) const {
  const auto it = tensor_index_.find(name);
  return it == tensor_index_.end() ? nullptr : &tensors_[it->second];
}

const TensorInfo& GgufModel::tensor(const std::string& name) const {
  const TensorInfo* t = find_tensor(name);
  if (t == nullptr) fail("{}: missing tensor '{}'", primary().path, name);
  return *t;
}

namespace {
const GgufValue& require(const GgufMetadata& m, const std::string& source, const std::string& key) {
  const GgufValue* v = m.find(key);
  if (v == nullptr) fail("{}: missing required key '{}'", source, key);
  return *v;
}
[[noreturn]] void type_mismatch(const std::string& source, const std::string& key, const GgufValue& v,
                                const char* wanted) {
  fail("{}: key '{}' has type {}, expected {}", source, key, gguf_value_type_name(v.type), wanted);
}
}  // namespace

std::string GgufMetadata::get_string(const std::string& key) const {
  const GgufValue& v = require(*this, source_, key);
  if (v.type != GgufValueType::STRING) type_mismatch(source_, key, v, "string");
  return v.text;
}

std::string GgufMetadata::get_string_or(const std::string& key, const std::string& fallback) const {
  return find(key) ? get_string(key) : fallback;
}

int64_t GgufMetadata::get_int(const std::string& key) const {
  const GgufValue& v = require(*this, source_, key);
  if (!v.is_integer()) type_mismatch(source_, key, v, "integer");
  return v.integer;
}

int64_t GgufMetadata::get_int_or(const std::string& key, int64_t fallback) const {
  return find(key) ? get_int(key) : fallback;
}

double GgufMetadata::get_float(const std::string& key) const {
  const GgufValue& v = require(*this, source_, key);
  if (v.is_float()) return v.real;
  if (v.is_integer()) return static_cast<double>(v.integer);
  type_mismatch(source_, key, v, "float");
}

double GgufMetadata::get_float_or(const std::string& key, double fallback) const {
  return find(key) ? get_float(key) : fallback;
}

bool GgufMetadata::get_bool_or(const std::string& key, bool fallback) const {
  const GgufValue* v = find(key);
  if (v == nullptr) return fallback;
  if (!v->is_integer()) type_mismatch(source_, key, *v, "bool");
  return v->integer != 0;
}

std::vector<std::string> GgufMetadata::get_string_array(const std::string& key) const {
  const GgufValue& v = require(*this, source_, key);
  if (v.type != GgufValueType::ARRAY || v.element_type != GgufValueType::STRING) {
    type_mismatch(source_, key, v, "array of strings");
  }
  std::vector<std::string> out;
  out.reserve(v.elements.size());
  for (const GgufValue& e : v.elements) out.push_back(e.text);
  return out;
}

std::vector<int64_t> GgufMetadata::get_int_array(const std::string& key) const {
  const GgufValue& v = require(*this, source_, key);
  if (v.type != GgufValueType::ARRAY) type_mismatch(source_, key, v, "array of integers");
  std::vector<int64_t> out;
  for (const GgufValue& e : v.elements) {
    if (!e.is_integer()) type_mismatch(source_, key, v, "array of integers");
    out.push_back(e.integer);
  }
  return out;
}

std::vector<double> GgufMetadata::get_float_array(const std::string& key) const {
  const GgufValue& v = require(*this, source_, key);
  if (v.type != GgufValueType::ARRAY) type_mismatch(source_, key, v, "array of floats");
  std::vector<double> out;
  for (const GgufValue& e : v.elements) {
    if (e.is_float()) out.push_back(e.real);
    else if (e.is_integer()) out.push_back(static_cast<double>(e.integer));
    else type_mismatch(source_, key, v, "array of floats");
  }
  return out;
}

std::vector<int64_t> GgufMetadata::get_per_layer_int(const std::string& key, int n_layers,
                                                  std::optional<int64_t> fallback) const {
  const GgufValue* v = find(key);
  if (v == nullptr) {
    if (!fallback) require(*this, source_, key);
    return std::vector<int64_t>(static_cast<size_t>(n_layers), *fallback);
  }
  if (v->type == GgufValueType::ARRAY) {
    std::vector<int64_t> values = get_int_array(key);
    if (static_cast<int>(values.size()) != n_layers) {
      fail("{}: key '{}' has {} entries for {} layers", source_, key, values.size(), n_layers);
    }
    return values;
  }
  return std::vector<int64_t>(static_cast<size_t>(n_layers), get_int(key));
}

uint64_t GgufModel::total_tensor_bytes() const {
  uint64_t total = 0;
  for (const TensorInfo& t : tensors_) total += t.nbytes;
  return total;
}

}  // namespace bmoe
