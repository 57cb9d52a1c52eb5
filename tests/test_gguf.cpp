// GGUF reader/writer tests: round trips of every metadata type, split shards, and malformed
// files, each of which must fail with a clear one-line error (never crash or read garbage).
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <vector>

#include "core/error.h"
#include "core/rng.h"
#include "gguf/gguf.h"
#include "gguf/gguf_writer.h"
#include "quant/types.h"
#include "synth/synth.h"

namespace bmoe {
namespace {

namespace fs = std::filesystem;

class TempDir {
 public:
  TempDir() {
    path_ = fs::temp_directory_path() / fs::path("bmoe-gguf-" + std::to_string(::getpid()) + "-" + std::to_string(counter_++));
    fs::create_directories(path_);
  }
  ~TempDir() { fs::remove_all(path_); }
  std::string file(const std::string& name) const { return (path_ / name).string(); }

 private:
  fs::path path_;
  static inline int counter_ = 0;
};

std::vector<uint8_t> read_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::vector<uint8_t>(std::istreambuf_iterator<char>(in), {});
}

void write_bytes(const std::string& path, const std::vector<uint8_t>& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
}

GgufWriter::Fill pattern(uint8_t seed) {
  return [seed](uint8_t* out, uint64_t n) {
    for (uint64_t i = 0; i < n; ++i) out[i] = static_cast<uint8_t>(seed + i * 7);
  };
}

GgufWriter sample_writer() {
  GgufWriter w;
  w.set("general.architecture", GgufValue::string("test"));
  w.set("test.u32", GgufValue::u32(4000000000u));
  w.set("test.i32", GgufValue::i32(-5));
  w.set("test.f32", GgufValue::f32(0.25f));
  w.set("test.bool", GgufValue::boolean(true));
  w.set("test.u64", GgufValue::u64(1ull << 40));
  w.set("test.strings", GgufValue::string_array({"a", "", "ünïcode"}));
  GgufValue nested;
  nested.type = GgufValueType::ARRAY;
  nested.element_type = GgufValueType::ARRAY;
  nested.elements.push_back(GgufValue::i32_array({1, 2, 3}));
  nested.elements.push_back(GgufValue::i32_array({}));
  w.set("test.nested", nested);
  GgufValue small;
  small.type = GgufValueType::INT8;
  small.integer = -7;
  w.set("test.i8", small);
  GgufValue dbl;
  dbl.type = GgufValueType::FLOAT64;
  dbl.real = 1.0 / 3.0;
  w.set("test.f64", dbl);
  w.add_tensor("a.weight", {64, 3}, TensorType::F32, pattern(1));
  w.add_tensor("b.weight", {256, 2}, TensorType::Q4_K, pattern(2));
  w.add_tensor("c.weight", {32}, TensorType::Q8_0, pattern(3));
  return w;
}

TEST(Gguf, RoundTripsMetadataAndTensors) {
  TempDir dir;
  const std::string path = dir.file("m.gguf");
  sample_writer().write(path);
  const auto m = GgufModel::open(path);
  EXPECT_EQ(m->primary().version, 3u);
  EXPECT_EQ(m->get_string("general.architecture"), "test");
  EXPECT_EQ(m->get_int("test.u32"), 4000000000ll);
  EXPECT_EQ(m->get_int("test.i32"), -5);
  EXPECT_EQ(m->get_int("test.i8"), -7);
  EXPECT_FLOAT_EQ(static_cast<float>(m->get_float("test.f32")), 0.25f);
  EXPECT_DOUBLE_EQ(m->get_float("test.f64"), 1.0 / 3.0);
  EXPECT_TRUE(m->get_bool_or("test.bool", false));
  EXPECT_EQ(m->get_int("test.u64"), 1ll << 40);
  EXPECT_EQ(m->get_string_array("test.strings"), (std::vector<std::string>{"a", "", "ünïcode"}));
  const GgufValue* nested = m->find("test.nested");
  ASSERT_NE(nested, nullptr);
  ASSERT_EQ(nested->elements.size(), 2u);
  EXPECT_EQ(nested->elements[0].elements.size(), 3u);
  EXPECT_EQ(nested->elements[0].elements[2].integer, 3);
  ASSERT_EQ(m->tensors().size(), 3u);
  const TensorInfo& b = m->tensor("b.weight");
  EXPECT_EQ(b.type, TensorType::Q4_K);
  EXPECT_EQ(b.dims, (std::vector<int64_t>{256, 2}));
  EXPECT_EQ(b.nbytes, 2u * 144u);
  EXPECT_EQ(b.file_offset % 32, 0u);
  const auto bytes = read_bytes(path);
  for (uint64_t i = 0; i < b.nbytes; ++i) ASSERT_EQ(bytes[b.file_offset + i], static_cast<uint8_t>(2 + i * 7));
}

TEST(Gguf, TypedAccessorsReportMissingAndMismatchedKeys) {
  TempDir dir;
  const std::string path = dir.file("m.gguf");
  sample_writer().write(path);
  const auto m = GgufModel::open(path);
  EXPECT_THROW(m->get_int("nope.key"), Error);
  EXPECT_EQ(m->get_int_or("nope.key", 9), 9);
  try {
    m->get_string("test.u32");
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("test.u32"), std::string::npos);
    EXPECT_NE(std::string(e.what()).find("expected string"), std::string::npos);
  }
  try {
    m->get_int("missing.key");
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("missing required key 'missing.key'"), std::string::npos);
  }
  EXPECT_THROW(m->tensor("zzz"), Error);
}

TEST(Gguf, ReadsVersion2) {
  TempDir dir;
  const std::string path = dir.file("m.gguf");
  sample_writer().write(path);
  auto bytes = read_bytes(path);
  bytes[4] = 2;  // v2 and v3 share the little-endian layout
  write_bytes(path, bytes);
  EXPECT_EQ(GgufModel::open(path)->primary().version, 2u);
}

std::string error_of(const std::string& path) {
  try {
    GgufModel::open(path);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(Gguf, RejectsBadMagicAndVersion) {
  TempDir dir;
  const std::string path = dir.file("m.gguf");
  sample_writer().write(path);
  auto bytes = read_bytes(path);
  auto bad = bytes;
  bad[0] = 'X';
  write_bytes(path, bad);
  EXPECT_NE(error_of(path).find("bad magic"), std::string::npos);
  for (uint8_t v : {0, 1, 4, 200}) {
    bad = bytes;
    bad[4] = v;
    write_bytes(path, bad);
    EXPECT_NE(error_of(path).find("unsupported GGUF version"), std::string::npos) << int(v);
  }
  write_bytes(path, {});
  EXPECT_NE(error_of(path).find("not a GGUF file"), std::string::npos);
}

TEST(Gguf, EveryTruncationFailsCleanly) {
  TempDir dir;
  const std::string path = dir.file("m.gguf");
  sample_writer().write(path);
  const auto bytes = read_bytes(path);
  size_t data_end = 0;  // past this only alignment padding remains, which may be cut
  const auto model = GgufModel::open(path);
  for (const TensorInfo& t : model->tensors()) data_end = std::max<size_t>(data_end, t.file_offset + t.nbytes);
  const std::string cut = dir.file("cut.gguf");
  for (size_t n = 0; n < data_end; ++n) {
    write_bytes(cut, std::vector<uint8_t>(bytes.begin(), bytes.begin() + static_cast<std::ptrdiff_t>(n)));
    const std::string err = error_of(cut);
    ASSERT_FALSE(err.empty()) << "truncation at " << n << " of " << bytes.size() << " was accepted";
    EXPECT_EQ(err.find('\n'), std::string::npos);
  }
}

// Offsets of the fields of the last tensor info, found by re-reading the header.
struct TensorFields {
  size_t type_offset;
  size_t data_offset_offset;
};

TensorFields last_tensor_fields(const std::vector<uint8_t>& bytes, const std::string& name, size_t n_dims) {
  // The tensor name appears once in the header; its fields follow: dims, type, offset.
  const auto it = std::search(bytes.begin(), bytes.end(), name.begin(), name.end());
  const size_t after_name = static_cast<size_t>(it - bytes.begin()) + name.size();
  const size_t type_offset = after_name + 4 + 8 * n_dims;
  return {type_offset, type_offset + 4};
}

TEST(Gguf, RejectsUnknownTensorType) {
  TempDir dir;
  const std::string path = dir.file("m.gguf");
  sample_writer().write(path);
  auto bytes = read_bytes(path);
  const auto f = last_tensor_fields(bytes, "c.weight", 1);
  bytes[f.type_offset] = 77;
  write_bytes(path, bytes);
  EXPECT_NE(error_of(path).find("unknown tensor type 77"), std::string::npos) << error_of(path);
}

TEST(Gguf, RejectsOutOfRangeAndOverlappingTensors) {
  TempDir dir;
  const std::string path = dir.file("m.gguf");
  sample_writer().write(path);
  const auto bytes = read_bytes(path);
  const auto f = last_tensor_fields(bytes, "c.weight", 1);
  auto patched = bytes;
  const uint64_t far = 1ull << 33;
  std::memcpy(&patched[f.data_offset_offset], &far, 8);
  write_bytes(path, patched);
  EXPECT_NE(error_of(path).find("out of range"), std::string::npos) << error_of(path);

  patched = bytes;
  const uint64_t zero = 0;  // c.weight now overlaps a.weight
  std::memcpy(&patched[f.data_offset_offset], &zero, 8);
  write_bytes(path, patched);
  EXPECT_NE(error_of(path).find("overlap"), std::string::npos) << error_of(path);

  patched = bytes;
  const uint64_t unaligned = 8;
  std::memcpy(&patched[f.data_offset_offset], &unaligned, 8);
  write_bytes(path, patched);
  EXPECT_NE(error_of(path).find("not aligned"), std::string::npos) << error_of(path);
}

TEST(Gguf, RandomCorruptionNeverCrashes) {
  TempDir dir;
  const std::string path = dir.file("m.gguf");
  sample_writer().write(path);
  const auto bytes = read_bytes(path);
  const std::string bad = dir.file("bad.gguf");
  Rng rng(99);
  size_t header = 0;
  {
    const auto m = GgufModel::open(path);
    header = m->primary().data_section;
  }
  for (int trial = 0; trial < 400; ++trial) {
    auto b = bytes;
    const int flips = 1 + static_cast<int>(rng.below(4));
    for (int i = 0; i < flips; ++i) b[rng.below(header)] = static_cast<uint8_t>(rng.next());
    write_bytes(bad, b);
    try {
      const auto m = GgufModel::open(bad);
      for (const TensorInfo& t : m->tensors()) ASSERT_LE(t.file_offset + t.nbytes, b.size());
    } catch (const Error&) {
    }
  }
}

TEST(Gguf, SplitShardsReadAsOneModel) {
  TempDir dir;
  const auto paths = sample_writer().write(dir.file("model.gguf"), 3);
  ASSERT_EQ(paths.size(), 3u);
  EXPECT_EQ(paths[0], dir.file("model-00001-of-00003.gguf"));
  for (const auto& p : paths) {
    const auto m = GgufModel::open(p);  // any shard opens the whole set
    EXPECT_EQ(m->shards().size(), 3u);
    EXPECT_EQ(m->tensors().size(), 3u);
    EXPECT_EQ(m->get_string("general.architecture"), "test");
    EXPECT_EQ(m->tensor("c.weight").shard, 2);
  }
  const auto m = GgufModel::open(paths[0]);
  const TensorInfo& c = m->tensor("c.weight");
  const auto shard_bytes = read_bytes(paths[2]);
  for (uint64_t i = 0; i < c.nbytes; ++i) ASSERT_EQ(shard_bytes[c.file_offset + i], static_cast<uint8_t>(3 + i * 7));
}

TEST(Gguf, MissingShardIsNamed) {
  TempDir dir;
  const auto paths = sample_writer().write(dir.file("model.gguf"), 3);
  fs::remove(paths[1]);
  const std::string err = error_of(paths[0]);
  EXPECT_NE(err.find("missing shard 2 of 3"), std::string::npos) << err;
}

TEST(Gguf, ShardNamesParse) {
  const auto n = parse_split_name("/a/b/x-00002-of-00010.gguf");
  ASSERT_TRUE(n);
  EXPECT_EQ(n->prefix, "/a/b/x");
  EXPECT_EQ(n->index, 2);
  EXPECT_EQ(n->count, 10);
  EXPECT_FALSE(parse_split_name("x.gguf"));
  EXPECT_FALSE(parse_split_name("x-00003-of-00002.gguf"));
  EXPECT_EQ(split_shard_path("p", 3, 12), "p-00003-of-00012.gguf");
}

TEST(Gguf, UnreadableFileIsReported) {
  EXPECT_NE(error_of("/nonexistent/dir/model.gguf").find("cannot open"), std::string::npos);
  EXPECT_NE(error_of("/").find("not a regular file"), std::string::npos);
}

// The Qwen3-30B-A3B preset has the real Q4_K_M file's per-layer types: Q6_K down projections
// (and attn_v) on llama.cpp's "more bits" layers, Q4_K elsewhere, so each layer's expert has the
// size the phone trace's header lists for it (3,059,712 or 2,654,208 bytes).
TEST(Synth, Qwen3PresetFollowsTheQ4KMLayerRule) {
  const SynthSpec s = synth_preset("qwen3-30b-a3b");
  const auto expert_bytes = [&](const SynthSpec& spec, int l) {
    return 2 * row_bytes(spec.type_of(TensorClass::Experts, l), spec.n_embd) * static_cast<size_t>(spec.n_ff_exp) +
           row_bytes(spec.type_of(TensorClass::ExpertsDown, l), spec.n_ff_exp) * static_cast<size_t>(spec.n_embd);
  };
  int big = 0;
  for (int l = 0; l < s.n_layer; ++l) {
    const bool more_bits = l < 6 || l >= 42 || (l - 6) % 3 == 2;
    EXPECT_EQ(expert_bytes(s, l), more_bits ? 3059712u : 2654208u) << "layer " << l;
    EXPECT_EQ(s.type_of(TensorClass::AttnV, l), more_bits ? TensorType::Q6_K : TensorType::Q4_K) << "layer " << l;
    EXPECT_EQ(s.type_of(TensorClass::AttnQ, l), TensorType::Q4_K);
    big += more_bits;
  }
  EXPECT_EQ(big, 24);
  // A type asked for explicitly applies to every layer.
  SynthSpec q6 = s;
  apply_type_override(q6, "down=Q6_K");
  for (int l = 0; l < q6.n_layer; ++l) EXPECT_EQ(expert_bytes(q6, l), 3059712u) << "layer " << l;
  // Other presets keep one type per class.
  const SynthSpec olmoe = synth_preset("olmoe-1b-7b");
  EXPECT_EQ(olmoe.type_of(TensorClass::ExpertsDown, 7), olmoe.type_of(TensorClass::ExpertsDown));
}

}  // namespace
}  // namespace bmoe
