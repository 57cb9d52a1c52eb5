// Model-level tests on synthetic models: determinism (batch size, threads), KV truncation,
// and loader errors for malformed models.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <set>

#include "core/error.h"
#include "engine/loader.h"
#include "engine/session.h"
#include "gguf/gguf.h"
#include "gguf/gguf_writer.h"
#include "model/arch.h"
#include "synth/synth.h"
#include "test_util.h"

namespace bmoe {
namespace {

std::vector<float> logits_after(LoadedModel& model, int threads, int batch, const std::vector<int32_t>& prompt) {
  ThreadPool pool(threads);
  Session session(model, pool, 256, batch, SamplerConfig{});
  session.prefill(prompt);
  return session.logits();
}

TEST(Model, BatchSizeAndThreadsDoNotChangeLogits) {
  const std::string path = test_model_path("tiny-qwen3moe");
  auto model = load_model(path, LoadOptions{});
  const auto prompt = model->tokenizer->encode("the quick brown fox jumps over the lazy dog again and again", false, false);
  ASSERT_GT(prompt.size(), 8u);
  const auto reference = logits_after(*model, 1, 512, prompt);
  for (auto [threads, batch] : {std::pair{2, 512}, {3, 5}, {2, 1}, {4, 7}}) {
    EXPECT_EQ(logits_after(*model, threads, batch, prompt), reference) << threads << " threads, batch " << batch;
  }
  for (float v : reference) ASSERT_TRUE(std::isfinite(v));
}

// Prompt batches of 64 rows or more take the tiled attention path; a row's result there does not
// depend on the batch it is in, so any split into such batches gives the same logits.
TEST(Model, PromptBatchesOf64OrMoreGiveTheSameLogits) {
  auto model = load_model(test_model_path("tiny-qwen3moe"), LoadOptions{});
  std::vector<int32_t> prompt;
  for (int i = 0; i < 192; ++i) prompt.push_back(static_cast<int32_t>((i * 7919 + 13) % 400 + 3));
  const auto reference = logits_after(*model, 1, 192, prompt);
  for (auto [threads, batch] : {std::pair{3, 64}, {2, 96}, {2, 512}}) {
    EXPECT_EQ(logits_after(*model, threads, batch, prompt), reference) << threads << " threads, batch " << batch;
  }
  for (float v : reference) ASSERT_TRUE(std::isfinite(v));
}

// A long prompt reports its progress layer by layer: counts rise to the prompt's length, and
// the logits are those of a run without progress.
TEST(Model, PromptProgressRisesToTheTotal) {
  auto model = load_model(test_model_path("tiny-qwen3moe"), LoadOptions{});
  std::vector<int32_t> prompt;
  for (int i = 0; i < 100; ++i) prompt.push_back(static_cast<int32_t>((i * 31 + 7) % 400 + 3));
  ThreadPool pool(2);
  Session s(*model, pool, 256, 32, SamplerConfig{});
  std::vector<double> seen;
  s.prefill(prompt, [&](double done, int total, double seconds) {
    EXPECT_EQ(total, 100);
    EXPECT_GE(seconds, 0.0);
    seen.push_back(done);
  });
  const int n_layer = model->transformer->config().n_layer;
  ASSERT_EQ(seen.size(), static_cast<size_t>(4 * n_layer));  // batches of 32, 32, 32, 4
  EXPECT_TRUE(std::is_sorted(seen.begin(), seen.end()));
  EXPECT_DOUBLE_EQ(seen.back(), 100.0);
  EXPECT_DOUBLE_EQ(seen[static_cast<size_t>(n_layer - 1)], 32.0);
  EXPECT_EQ(s.logits(), logits_after(*model, 2, 32, prompt));
}

// q, k and v in three weight types need three activation formats (Q8_K, Q8_0, F16) in one
// batch of matmuls. The converted activations once lived in a vector that reallocated under
// the earlier jobs' feet (a crash on a Gemma shape with attn_v=Q8_0; ASan names the bug).
TEST(Model, MixedActivationFormatsInOneBatch) {
  const std::string path = test_model_path("tiny-qwen3moe", 0, {"attn_q=Q4_K", "attn_k=Q8_0", "attn_v=F16"});
  auto model = load_model(path, LoadOptions{});
  const auto prompt = model->tokenizer->encode("mixed formats in one batch of matmuls", false, false);
  const auto reference = logits_after(*model, 1, 512, prompt);
  EXPECT_EQ(logits_after(*model, 2, 1, prompt), reference);
  for (float v : reference) ASSERT_TRUE(std::isfinite(v));
}

TEST(Model, TruncateThenReplayMatchesFreshRun) {
  auto model = load_model(test_model_path("tiny-qwen3moe"), LoadOptions{});
  ThreadPool pool(2);
  const auto a = model->tokenizer->encode("hello world this is", false, false);
  const auto b = model->tokenizer->encode(" a different ending", false, false);
  Session s(*model, pool, 256, 64, SamplerConfig{});
  s.prefill(a);
  s.prefill(model->tokenizer->encode(" something else", false, false));
  s.state().truncate(static_cast<int>(a.size()));  // keep only the shared prefix
  s.prefill(b);
  std::vector<int32_t> ab = a;
  ab.insert(ab.end(), b.begin(), b.end());
  EXPECT_EQ(s.logits(), logits_after(*model, 2, 64, ab));
}

TEST(Model, GreedyOutputIsNotDegenerate) {
  // Random weights must still give varied, finite logits (realistic scales).
  auto model = load_model(test_model_path("tiny-qwen3moe"), LoadOptions{});
  ThreadPool pool(2);
  Session s(*model, pool, 256, 64, SamplerConfig{});
  s.prefill(model->tokenizer->encode("once upon a time", false, false));
  std::set<int32_t> distinct;
  for (int i = 0; i < 24; ++i) {
    const int32_t t = s.sample();
    distinct.insert(t);
    s.accept(t);
  }
  EXPECT_GE(distinct.size(), 4u);
  float max = -1e30f, min = 1e30f;
  for (float v : s.logits()) {
    max = std::max(max, v);
    min = std::min(min, v);
  }
  EXPECT_GT(max - min, 1.0f);
  EXPECT_LT(max - min, 200.0f);
}

TEST(Model, ContextOverflowIsAnError) {
  auto model = load_model(test_model_path("tiny-qwen3moe"), LoadOptions{});
  ThreadPool pool(1);
  Session s(*model, pool, 16, 64, SamplerConfig{});
  std::vector<int32_t> prompt(17, 5);
  EXPECT_THROW(s.prefill(prompt), Error);
}

// Rewrites the tiny model with one change, to check the loader's errors.
std::string rewrite_model(const std::string& name, const std::function<void(GgufWriter&, const GgufModel&)>& edit,
                          const std::string& drop_tensor = "", const std::string& reshape_tensor = "") {
  const std::string src = test_model_path("tiny-qwen3moe");
  const auto model = GgufModel::open(src);
  const auto bytes = read_file_bytes(src);
  GgufWriter w;
  for (const auto& [k, v] : model->primary().metadata) w.set(k, v);
  for (const TensorInfo& t : model->tensors()) {
    if (t.name == drop_tensor) continue;
    auto dims = t.dims;
    if (t.name == reshape_tensor) dims.back() += 1;
    const uint64_t offset = t.file_offset, size = t.nbytes;
    w.add_tensor(t.name, dims, t.type, [&bytes, offset, size](uint8_t* out, uint64_t n) {
      std::memset(out, 0, n);
      std::memcpy(out, bytes.data() + offset, std::min(n, size));
    });
  }
  edit(w, *model);
  const std::string path = temp_path(name);
  w.write(path);
  return path;
}

std::string load_error(const std::string& path) {
  try {
    load_model(path, LoadOptions{});
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(Loader, UnknownArchitectureIsNamed) {
  const auto path = rewrite_model("arch.gguf", [](GgufWriter& w, const GgufModel&) {
    w.set("general.architecture", GgufValue::string("mamba9"));
  });
  const std::string err = load_error(path);
  EXPECT_NE(err.find("unsupported architecture 'mamba9'"), std::string::npos) << err;
  EXPECT_NE(err.find("qwen3moe"), std::string::npos) << err;
}

TEST(Loader, MissingTensorIsNamed) {
  const auto path = rewrite_model("missing.gguf", [](GgufWriter&, const GgufModel&) {}, "blk.1.attn_k.weight");
  EXPECT_NE(load_error(path).find("missing tensor 'blk.1.attn_k.weight'"), std::string::npos) << load_error(path);
}

TEST(Loader, ShapeMismatchIsNamed) {
  const auto path = rewrite_model("shape.gguf", [](GgufWriter&, const GgufModel&) {}, "", "blk.0.ffn_norm.weight");
  EXPECT_NE(load_error(path).find("blk.0.ffn_norm.weight' has shape"), std::string::npos) << load_error(path);
}

TEST(Loader, MissingRequiredKeyIsNamed) {
  const auto path = rewrite_model("key.gguf", [](GgufWriter& w, const GgufModel& m) {
    GgufWriter copy;
    (void)m;
    w.set("qwen3moe.block_count", GgufValue::string("two"));
  });
  EXPECT_NE(load_error(path).find("qwen3moe.block_count"), std::string::npos) << load_error(path);
}

// The table is the one description of a family: the tensors bmoe-synth writes are exactly those
// the table expands to for the config the loader reads back from the file, and every row the
// loader binds exists in that file.
TEST(ArchTable, SynthesizedFilesHoldExactlyTheTablesTensors) {
  for (const char* preset : {"tiny-qwen3moe", "tiny-qwen2moe", "tiny-olmoe", "tiny-mixtral", "tiny-gpt-oss", "tiny-gemma4"}) {
    const std::string path = test_model_path(preset);
    const auto model = load_model(path, LoadOptions{});
    const Architecture* arch = find_architecture(model->arch);
    ASSERT_NE(arch, nullptr) << preset;
    std::set<std::string> in_file, in_table;
    for (const TensorInfo& t : model->gguf->tensors()) in_file.insert(t.name);
    for (const TableTensor& t : synth_tensors(arch->tensors, model->transformer->config())) {
      EXPECT_TRUE(in_table.insert(t.name).second) << preset << ": " << t.name << " listed twice";
      const TensorInfo* info = model->gguf->find_tensor(t.name);
      ASSERT_NE(info, nullptr) << preset << ": " << t.name;
      EXPECT_EQ(info->dims, t.dims) << preset << ": " << t.name;
    }
    EXPECT_EQ(in_file, in_table) << preset;
  }
}

TEST(ArchTable, EveryFamilyListsItsTensors) {
  ASSERT_GE(architectures().size(), 6u);
  for (const Architecture& a : architectures()) {
    const std::string text = describe_tensors(a);
    EXPECT_NE(text.find("token_embd.weight"), std::string::npos) << a.name;
    EXPECT_NE(text.find("routed expert"), std::string::npos) << a.name;
  }
}

}  // namespace
}  // namespace bmoe
