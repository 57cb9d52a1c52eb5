// Model-level tests on synthetic models: determinism (batch size, threads), KV truncation,
// and loader errors for malformed models.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <functional>
#include <set>
#include <tuple>

#include "core/error.h"
#include "engine/loader.h"
#include "engine/session.h"
#include "gguf/gguf.h"
#include "gguf/gguf_writer.h"
#include "model/arch.h"
#include "model/delta_net.h"
#include "core/rng.h"
#include "synth/synth.h"
#include "sanitized.h"
#include "test_util.h"

namespace bmoe {
namespace {

std::vector<float> logits_after(LoadedModel& model, int threads, int batch, const std::vector<int32_t>& prompt) {
  ThreadPool pool(threads);
  Session session(model, pool, 256, batch, SamplerConfig{});
  session.prefill(prompt);
  return session.logits();
}

// Batch invariance: each row of a batched evaluation equals evaluating the tokens one at a
// time, bit for bit (needed for lossless speculative verification, engine/speculative.h).
TEST(Speculative, BatchedLogitsEqualOneTokenAtATime) {
  auto model = load_model(test_model_path("tiny-qwen3moe", 2), LoadOptions{});
  ThreadPool pool(2);
  const std::vector<int32_t> prompt = model->tokenizer->encode("one two three four", false, false);
  const std::vector<int32_t> batch = {11, 42, 7, 300, 5};
  const int n_vocab = model->transformer->config().n_vocab;
  InferenceState a(*model->transformer, pool, 128), b(*model->transformer, pool, 128);
  a.eval(prompt.data(), static_cast<int>(prompt.size()));
  b.eval(prompt.data(), static_cast<int>(prompt.size()));
  const std::vector<float> batched = a.eval(batch.data(), static_cast<int>(batch.size()), true);
  for (size_t i = 0; i < batch.size(); ++i) {
    const std::vector<float>& one = b.eval(&batch[i], 1);
    ASSERT_EQ(std::memcmp(one.data(), batched.data() + i * static_cast<size_t>(n_vocab), n_vocab * sizeof(float)), 0)
        << "row " << i;
  }
}

// Attention layers and qwen35moe's recurrent ones alike.
TEST(Model, BatchSizeAndThreadsDoNotChangeLogits) {
  for (const char* preset : {"tiny-qwen3moe", "tiny-qwen35moe", "tiny-lfm2moe", "tiny-glm4moe", "tiny-bailingmoe3",
                             "tiny-deepseek4"}) {
    auto model = load_model(test_model_path(preset), LoadOptions{});
    const auto prompt = model->tokenizer->encode("the quick brown fox jumps over the lazy dog again and again", false, false);
    ASSERT_GT(prompt.size(), 8u);
    const auto reference = logits_after(*model, 1, 512, prompt);
    // Under the sanitizers the two splits that differ most from the reference's (odd batches on
    // odd threads, one token at a time); the Release run takes all four.
    const std::vector<std::pair<int, int>> splits =
        kAddressSanitized ? std::vector<std::pair<int, int>>{{3, 5}, {2, 1}}
                          : std::vector<std::pair<int, int>>{{2, 512}, {3, 5}, {2, 1}, {4, 7}};
    for (auto [threads, batch] : splits) {
      EXPECT_EQ(logits_after(*model, threads, batch, prompt), reference) << preset << ", " << threads << " threads, batch " << batch;
    }
    for (float v : reference) ASSERT_TRUE(std::isfinite(v));
  }
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

// For a recurrent state the rewind goes back to the state saved at the start of the last
// multi-token eval (here: the start of " something else", which is <= the prefix) or, when
// that lies past the cut, to the empty state; both must give the fresh run's logits.
TEST(Model, TruncateThenReplayMatchesFreshRun) {
  for (const char* preset : {"tiny-qwen3moe", "tiny-qwen35moe", "tiny-lfm2moe", "tiny-bailingmoe3"}) {
    auto model = load_model(test_model_path(preset), LoadOptions{});
    ThreadPool pool(2);
    const auto a = model->tokenizer->encode("hello world this is", false, false);
    const auto b = model->tokenizer->encode(" a different ending", false, false);
    std::vector<int32_t> ab = a;
    ab.insert(ab.end(), b.begin(), b.end());
    for (int cut_back : {0, 2}) {  // 2: the cut lies before the saved state
      Session s(*model, pool, 256, 64, SamplerConfig{});
      s.prefill(a);
      s.prefill(model->tokenizer->encode(" something else", false, false));
      const int keep = static_cast<int>(a.size()) - cut_back;
      s.state().truncate(keep);  // keep only (part of) the shared prefix
      s.prefill(std::vector<int32_t>(ab.begin() + keep, ab.end()));
      EXPECT_EQ(s.logits(), logits_after(*model, 2, 64, ab)) << preset << ", cut back " << cut_back;
    }
  }
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
// What a rewrite does to one tensor.
enum class TensorEdit { Keep, Drop, Poison };  // Poison: every byte 0xFF (NaN in f32)

// Rewrites a synthetic model with changes, to check the loader's errors and what it reads.
std::string rewrite_preset(const std::string& preset, const std::string& name,
                           const std::function<void(GgufWriter&, const GgufModel&)>& edit,
                           const std::function<TensorEdit(const std::string&)>& tensor_edit,
                           const std::string& reshape_tensor = "") {
  const std::string src = test_model_path(preset);
  const auto model = GgufModel::open(src);
  const auto bytes = read_file_bytes(src);
  GgufWriter w;
  for (const auto& [k, v] : model->primary().metadata) w.set(k, v);
  for (const TensorInfo& t : model->tensors()) {
    const TensorEdit what = tensor_edit(t.name);
    if (what == TensorEdit::Drop) continue;
    auto dims = t.dims;
    if (t.name == reshape_tensor) dims.back() += 1;
    const uint64_t offset = t.file_offset, size = t.nbytes;
    const bool poison = what == TensorEdit::Poison;
    w.add_tensor(t.name, dims, t.type, [&bytes, offset, size, poison](uint8_t* out, uint64_t n) {
      std::memset(out, poison ? 0xFF : 0, n);
      if (!poison) std::memcpy(out, bytes.data() + offset, std::min(n, size));
    });
  }
  edit(w, *model);
  const std::string path = temp_path(name);
  w.write(path);
  return path;
}

std::string rewrite_model(const std::string& name, const std::function<void(GgufWriter&, const GgufModel&)>& edit,
                          const std::string& drop_tensor = "", const std::string& reshape_tensor = "",
                          const std::string& preset = "tiny-qwen3moe") {
  return rewrite_preset(
      preset, name, edit,
      [&](const std::string& t) { return t == drop_tensor ? TensorEdit::Drop : TensorEdit::Keep; }, reshape_tensor);
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

// A layer count far beyond any model is refused before per-layer keys are read into arrays of
// that size (the loader fuzzer found a 654-million-layer header allocating 5 GB).
TEST(Loader, AbsurdLayerCountIsRefused) {
  const auto path = rewrite_model("layers.gguf", [](GgufWriter& w, const GgufModel&) {
    w.set("qwen3moe.block_count", GgufValue::u32(654311426));
  });
  EXPECT_NE(load_error(path).find("invalid model shape"), std::string::npos) << load_error(path);
}

TEST(Loader, MissingRequiredKeyIsNamed) {
  const auto path = rewrite_model("key.gguf", [](GgufWriter& w, const GgufModel& m) {
    GgufWriter copy;
    (void)m;
    w.set("qwen3moe.block_count", GgufValue::string("two"));
  });
  EXPECT_NE(load_error(path).find("qwen3moe.block_count"), std::string::npos) << load_error(path);
}

// bailingmoe3's shape keys: misshapen latent ranks, a Kimi Delta head size the kernels cannot
// take, a decay bound that is not negative, a layer that is neither kind, expert groups that do
// not split the experts and malformed SwiGLU limits each give a one-line error naming the problem.
// deepseek4's keys and tensors: absurd compression ratios, a hyper-connection count the graph
// does not take, a top-k above the expert count, output groups that do not split the heads, a
// missing or misshapen tensor each give a one-line error naming the problem.
TEST(Loader, DeepSeek4BadInputIsOneLineErrors) {
  const std::string a = "deepseek4.";
  using Edit = std::function<void(GgufWriter&)>;
  const std::vector<std::tuple<Edit, std::string, std::string, std::string>> cases = {
      {[&](GgufWriter& w) { w.set(a + "attention.compress_ratios", GgufValue::i32_array({0, 4, 5, 4})); }, "", "", "compress ratio 5"},
      {[&](GgufWriter& w) { w.set(a + "attention.compress_ratios", GgufValue::i32_array({0, 4})); }, "", "", "compress_ratios has 2 entries"},
      {[&](GgufWriter& w) { w.set(a + "hyper_connection.count", GgufValue::u32(3)); }, "", "", "hyper_connection.count"},
      {[&](GgufWriter& w) { w.set(a + "expert_used_count", GgufValue::u32(9)); }, "", "", "invalid expert routing"},
      {[&](GgufWriter& w) { w.set(a + "attention.output_group_count", GgufValue::u32(3)); }, "", "", "output groups"},
      {[&](GgufWriter& w) { w.set(a + "hash_layer_count", GgufValue::u32(99)); }, "", "", "hash_layer_count"},
      {[&](GgufWriter& w) { w.set(a + "expert_gating_func", GgufValue::u32(2)); }, "", "", "sqrt-softplus"},
      {[](GgufWriter&) {}, "blk.1.indexer.proj.weight", "", "blk.1.indexer.proj.weight"},
      {[](GgufWriter&) {}, "", "blk.2.attn_compressor_ape.weight", "blk.2.attn_compressor_ape.weight"},
  };
  for (size_t i = 0; i < cases.size(); ++i) {
    // Not a structured binding: clang 14 cannot capture one in the lambda.
    const Edit& edit = std::get<0>(cases[i]);
    const std::string& drop = std::get<1>(cases[i]);
    const std::string& reshape = std::get<2>(cases[i]);
    const std::string& want = std::get<3>(cases[i]);
    const auto path = rewrite_model("deepseek4-" + std::to_string(i) + ".gguf",
                                    [&](GgufWriter& w, const GgufModel&) { edit(w); }, drop, reshape, "tiny-deepseek4");
    const std::string err = load_error(path);
    EXPECT_NE(err.find(want), std::string::npos) << i << ": " << err;
    EXPECT_EQ(err.find('\n'), std::string::npos) << i << ": " << err;
  }
  EXPECT_EQ(load_error(rewrite_model("deepseek4-ok.gguf", [](GgufWriter&, const GgufModel&) {}, "", "", "tiny-deepseek4")), "");
}

// deepseek4's MTP block is checked at every load and bound only for --mtp (tests/
// test_speculative.cpp runs it): the trunk is block_count less the block, and a misshapen MTP
// tensor is an error (llama.cpp's logits on the same file: tests/conformance/deepseek4_logits.py).
TEST(Loader, DeepSeek4MtpBlockIsCheckedAtLoad) {
  auto model = load_model(test_model_path("tiny-deepseek4-mtp"), LoadOptions{});
  EXPECT_EQ(model->transformer->config().n_layer, 4);
  EXPECT_EQ(model->transformer->config().n_nextn_layer, 1);
  EXPECT_EQ(model->transformer->weights().layers.size(), 4u);
  const auto bad = rewrite_model("deepseek4-mtp-bad.gguf", [](GgufWriter&, const GgufModel&) {}, "",
                                 "blk.4.nextn.eh_proj.weight", "tiny-deepseek4-mtp");
  const std::string err = load_error(bad);
  EXPECT_NE(err.find("blk.4.nextn.eh_proj.weight"), std::string::npos) << err;
  // A block to run as the head (--mtp) attends its window alone, as llama.cpp's MTP graph.
  const auto ratio = rewrite_model("deepseek4-mtp-ratio.gguf", [](GgufWriter& w, const GgufModel&) {
    w.set("deepseek4.attention.compress_ratios", GgufValue::i32_array({0, 4, 128, 4, 128}));
  }, "", "", "tiny-deepseek4-mtp");
  LoadOptions mtp;
  mtp.nextn = true;
  try {
    load_model(ratio, mtp);
    ADD_FAILURE() << "an MTP block with compressed rows was bound";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("MTP block's compress ratio is 128, not 0"), std::string::npos) << e.what();
  }
}

TEST(Loader, BailingMoe3BadShapesAreOneLineErrors) {
  const std::string a = "bailingmoe3.";
  const std::vector<std::pair<std::function<void(GgufWriter&)>, std::string>> cases = {
      {[&](GgufWriter& w) { w.set(a + "attention.key_length", GgufValue::u32(81)); }, "invalid latent attention shape"},
      {[&](GgufWriter& w) { w.set(a + "attention.key_length_mla", GgufValue::u32(8)); }, "invalid latent attention shape"},
      {[&](GgufWriter& w) { w.set(a + "attention.kv_lora_rank", GgufValue::u32(0)); }, "invalid latent attention shape"},
      {[&](GgufWriter& w) { w.set(a + "kda.head_dim", GgufValue::u32(60)); }, "kda.head_dim 60"},
      {[&](GgufWriter& w) { w.set(a + "kda.gate_lower_bound", GgufValue::f32(0.5f)); }, "must be negative"},
      {[&](GgufWriter& w) { w.set(a + "kda.safe_gate", GgufValue::boolean(false)); }, "safe_gate"},
      {[&](GgufWriter& w) { w.set(a + "attention.head_count_kv", GgufValue::i32_array({0, 2, 0, 1})); }, "2 kv heads"},
      {[&](GgufWriter& w) { w.set(a + "expert_group_count", GgufValue::u32(3)); }, "expert groups"},
      {[&](GgufWriter& w) { w.set(a + "expert_group_used_count", GgufValue::u32(4)); }, "expert groups"},
      {[&](GgufWriter& w) { w.set(a + "swiglu_clamp_exp", GgufValue::f32(7.0f)); }, "swiglu_clamp_exp"},
      {[&](GgufWriter& w) { w.set(a + "swiglu_clamp_shexp", GgufValue::f32_array({1.0f})); }, "1 entries for 4 blocks"},
      {[&](GgufWriter& w) { w.set(a + "swiglu_clamp_exp", GgufValue::f32_array({0, 0, -1, 0})); }, "not a limit"},
      {[&](GgufWriter& w) { w.set(a + "leading_dense_block_count", GgufValue::u32(9)); }, "leading dense layers"},
  };
  for (size_t i = 0; i < cases.size(); ++i) {
    const auto path = rewrite_model("bailingmoe3-" + std::to_string(i) + ".gguf",
                                    [&](GgufWriter& w, const GgufModel&) { cases[i].first(w); }, "", "",
                                    "tiny-bailingmoe3");
    const std::string err = load_error(path);
    EXPECT_NE(err.find(cases[i].second), std::string::npos) << i << ": " << err;
    EXPECT_EQ(err.find('\n'), std::string::npos) << i << ": " << err;
  }
  EXPECT_EQ(load_error(rewrite_model("bailingmoe3-ok.gguf", [](GgufWriter&, const GgufModel&) {}, "", "",
                                     "tiny-bailingmoe3")), "");
}

std::vector<int32_t> some_tokens(int n, int salt) {
  std::vector<int32_t> t;
  for (int i = 0; i < n; ++i) t.push_back(static_cast<int32_t>((i * 37 + salt * 11 + 5) % 300 + 3));
  return t;
}

// Prefix reuse gives a fresh read's bits (default f16 cache): a conversation's next prompt
// (its earlier prompt, whose last chunk of 36 rows took the decode path, then generated tokens,
// then more) reuses only rows that took the path a fresh read of the new prompt gives them, and
// reads the rest on the fresh read's paths, whole or in pieces of any size.
TEST(Model, ReusedPrefixGivesTheFreshReadsLogits) {
  for (const char* preset : {"tiny-qwen3moe", "tiny-qwen35moe"}) {
    auto model = load_model(test_model_path(preset), LoadOptions{});
    ThreadPool pool(2);
    const std::vector<int32_t> first = some_tokens(100, 6);
    std::vector<int32_t> next = first;
    for (int32_t t : some_tokens(5, 7)) next.push_back(t);   // the answer, one row at a time
    for (int32_t t : some_tokens(60, 8)) next.push_back(t);  // the next message
    const std::vector<float> want = logits_after(*model, 2, 64, next);
    for (int piece : {0, 1, 50}) {  // 0: prefill_reusing, else keep_prefix and pieces
      Session s(*model, pool, 256, 64, SamplerConfig{});
      s.prefill(first);
      for (size_t i = 100; i < 105; ++i) s.accept(next[i]);
      if (piece == 0) {
        EXPECT_EQ(s.prefill_reusing(next), 64) << preset;  // rows 64-104 took the decode path
      } else {
        const int kept = s.keep_prefix(next);
        for (size_t at = static_cast<size_t>(kept); at < next.size(); at += static_cast<size_t>(piece)) {
          const size_t end = std::min(next.size(), at + static_cast<size_t>(piece));
          s.prefill(std::vector<int32_t>(next.begin() + static_cast<std::ptrdiff_t>(at), next.begin() + static_cast<std::ptrdiff_t>(end)),
                    {}, static_cast<int>(next.size()));
        }
      }
      EXPECT_EQ(s.logits(), want) << preset << ", pieces of " << piece;
    }
  }
}

// glm4moe's nextn (MTP) block, blk.3 of tiny-glm4moe's 4 blocks, is never read: poisoned, left
// out (a trunk-only file), or cut off with block_count, the logits stay those of the whole file.
TEST(Glm4Moe, TheNextnBlockIsNeverRead) {
  const auto logits_of = [](const std::string& path) {
    auto model = load_model(path, LoadOptions{});
    EXPECT_EQ(model->transformer->config().n_layer, 3);
    return logits_after(*model, 2, 512, some_tokens(12, 1));
  };
  const auto nextn = [](TensorEdit e) {
    return [e](const std::string& t) { return t.starts_with("blk.3.") ? e : TensorEdit::Keep; };
  };
  const auto same = [](GgufWriter&, const GgufModel&) {};
  const auto want = logits_of(test_model_path("tiny-glm4moe"));
  for (float v : want) ASSERT_TRUE(std::isfinite(v));
  EXPECT_EQ(logits_of(rewrite_preset("tiny-glm4moe", "nan-nextn.gguf", same, nextn(TensorEdit::Poison))), want);
  EXPECT_EQ(logits_of(rewrite_preset("tiny-glm4moe", "trunk-only.gguf", same, nextn(TensorEdit::Drop))), want);
  const auto no_mtp = [](GgufWriter& w, const GgufModel&) {
    w.set("glm4moe.block_count", GgufValue::u32(3));
    w.set("glm4moe.nextn_predict_layers", GgufValue::u32(0));
  };
  EXPECT_EQ(logits_of(rewrite_preset("tiny-glm4moe", "no-mtp.gguf", no_mtp, nextn(TensorEdit::Drop))), want);
}

// A file that holds the nextn block must hold all of it; a header whose nextn count leaves no
// trunk is refused.
TEST(Glm4Moe, BadNextnBlocksAreOneLineErrors) {
  const auto same = [](GgufWriter&, const GgufModel&) {};
  const auto drop = [](const std::string& name) {
    return [name](const std::string& t) { return t == name ? TensorEdit::Drop : TensorEdit::Keep; };
  };
  std::string err = load_error(rewrite_preset("tiny-glm4moe", "nextn-part.gguf", same, drop("blk.3.ffn_up_exps.weight")));
  EXPECT_NE(err.find("missing tensor 'blk.3.ffn_up_exps.weight'"), std::string::npos) << err;
  err = load_error(rewrite_preset("tiny-glm4moe", "nextn-shape.gguf", same, drop(""), "blk.3.nextn.enorm.weight"));
  EXPECT_NE(err.find("blk.3.nextn.enorm.weight': dimension 0 is 257"), std::string::npos) << err;
  const auto all_mtp = [](GgufWriter& w, const GgufModel&) { w.set("glm4moe.nextn_predict_layers", GgufValue::u32(4)); };
  err = load_error(rewrite_preset("tiny-glm4moe", "nextn-all.gguf", all_mtp, drop("")));
  EXPECT_NE(err.find("nextn_predict_layers 4 leaves no trunk"), std::string::npos) << err;
  err = load_error(rewrite_preset("tiny-glm4moe", "qk-half.gguf", same, drop("blk.0.attn_k_norm.weight")));
  EXPECT_NE(err.find("attn_q_norm and attn_k_norm"), std::string::npos) << err;
  // The layer plan declares the q/k norms of every layer (blk.0 has them): a layer without them
  // is refused, not run with weightless norms.
  err = load_error(rewrite_preset("tiny-glm4moe", "qk-layer.gguf", same, drop("blk.1.attn_q_norm.weight")));
  EXPECT_NE(err.find("layer 1: attn_q_norm is missing"), std::string::npos) << err;
}

// Gemma 4's layer_output_scale is declared in the layer plan where the file holds it and applies
// to every FFN kind: a dense layer (no router) with the weight is scaled, as llama.cpp scales it.
TEST(Gemma4, DenseLayersApplyTheirOutputScale) {
  const auto same = [](GgufWriter&, const GgufModel&) {};
  const auto dense_layer1 = [](bool keep_scale) {
    return [keep_scale](const std::string& t) {
      if (!t.starts_with("blk.1.")) return TensorEdit::Keep;
      if (t == "blk.1.layer_output_scale.weight") return keep_scale ? TensorEdit::Keep : TensorEdit::Drop;
      const bool moe = t.find("ffn_gate_inp") != std::string::npos || t.find("_exps") != std::string::npos ||
                       t.find("pre_ffw_norm_2") != std::string::npos || t.find("post_ffw_norm_") != std::string::npos;
      return moe ? TensorEdit::Drop : TensorEdit::Keep;
    };
  };
  const auto run = [](const std::string& path, bool scaled) {
    auto model = load_model(path, LoadOptions{});
    const ModelConfig& c = model->transformer->config();
    EXPECT_EQ(c.ffn_at(1), FfnKind::Dense);
    EXPECT_EQ(c.plan[1].norms.output_scale, scaled);
    EXPECT_TRUE(c.plan[0].norms.output_scale);
    return logits_after(*model, 2, 512, some_tokens(12, 1));
  };
  const auto with = run(rewrite_preset("tiny-gemma4", "dense-scaled.gguf", same, dense_layer1(true)), true);
  const auto without = run(rewrite_preset("tiny-gemma4", "dense-unscaled.gguf", same, dense_layer1(false)), false);
  for (float v : with) ASSERT_TRUE(std::isfinite(v));
  EXPECT_NE(with, without);  // the old forward pass scaled only the parallel dense + MoE kind
}

// Rows decoded one at a time after a long prompt are replayed on the decode path, the prompt's
// rows on the batch path: a rewind into the decoded part gives the state of the first run.
TEST(RecurrentRewind, ReplayKeepsEachRowsAttentionPath) {
  for (const char* preset : {"tiny-qwen35moe", "tiny-lfm2moe", "tiny-bailingmoe3", "tiny-deepseek4"}) {
    auto model = load_model(test_model_path(preset), LoadOptions{});
    ThreadPool pool(2);
    const auto prompt = some_tokens(100, 1), decoded = some_tokens(10, 2);
    InferenceState a(*model->transformer, pool, 256), b(*model->transformer, pool, 256);
    a.eval(prompt.data(), 100);
    b.eval(prompt.data(), 100);
    for (int i = 0; i < 5; ++i) a.eval(&decoded[i], 1);
    for (int i = 0; i < 10; ++i) b.eval(&decoded[i], 1);
    b.truncate(105);
    EXPECT_EQ(a.eval(&decoded[5], 1), b.eval(&decoded[5], 1)) << preset;
  }
}

// A rejected draft's rewind into a short eval (a verification pass) restores the copy of the
// recurrent state that eval kept after the last kept row, without running any row again: the
// state is bit for bit what decoding the kept tokens one at a time gives, and so is what follows.
TEST(RecurrentRewind, ARejectedDraftRestoresTheKeptRowsStateWithoutReplay) {
  for (const char* preset : {"tiny-qwen35moe", "tiny-lfm2moe"}) {
    auto model = load_model(test_model_path(preset), LoadOptions{});
    ThreadPool pool(2);
    const auto prompt = some_tokens(20, 6), good = some_tokens(4, 7), bad = some_tokens(4, 8);
    for (int kept = 0; kept < 4; ++kept) {  // rows of the 5-row pass that stay: 1 + kept
      InferenceState plain(*model->transformer, pool, 256), drafted(*model->transformer, pool, 256);
      plain.eval(prompt.data(), 20);
      drafted.eval(prompt.data(), 20);
      for (int i = 0; i <= kept; ++i) plain.eval(&good[i], 1);
      std::vector<int32_t> pass(good.begin(), good.begin() + kept + 1);
      pass.insert(pass.end(), bad.begin(), bad.begin() + 4 - kept);  // rejected drafts after the kept rows
      drafted.eval(pass.data(), 5, true);
      int routed = 0;
      drafted.set_route_hook([&](RouteEvent&) { ++routed; });
      drafted.truncate(21 + kept);
      EXPECT_EQ(routed, 0) << preset << ": the rewind ran rows again";
      EXPECT_EQ(drafted.row_state_rewinds(), 1) << preset;
      EXPECT_EQ(drafted.n_past(), plain.n_past());
      EXPECT_EQ(drafted.recurrent_state(), plain.recurrent_state()) << preset << ", " << kept << " kept";
      const int32_t next = bad[3];
      EXPECT_EQ(drafted.eval(&next, 1), plain.eval(&next, 1)) << preset << ", " << kept << " kept";
      EXPECT_EQ(drafted.recurrent_state(), plain.recurrent_state()) << preset << ", after the next token";
    }
  }
}

// Rewinds the copies cannot serve replay as before: to before the pass (the copy saved at its
// start), and after a one-token eval that followed the pass (the copies are gone).
TEST(RecurrentRewind, RewindsOutsideThePassStillReplay) {
  auto model = load_model(test_model_path("tiny-qwen35moe"), LoadOptions{});
  ThreadPool pool(2);
  const auto t = some_tokens(16, 9);
  InferenceState a(*model->transformer, pool, 256), fresh(*model->transformer, pool, 256);
  a.eval(t.data(), 8);
  a.eval(t.data() + 8, 4);  // keeps copies after positions 9, 10, 11
  a.eval(t.data() + 12, 1);  // the copies no longer describe the sequence's newest rows
  a.truncate(10);
  EXPECT_EQ(a.row_state_rewinds(), 0);
  for (int i = 0; i < 10; ++i) fresh.eval(&t[i], 1);
  EXPECT_EQ(a.recurrent_state(), fresh.recurrent_state());
  a.eval(t.data() + 10, 3);
  a.truncate(8);  // before the pass: the saved copy of its start, no row copy
  EXPECT_EQ(a.row_state_rewinds(), 0);
  InferenceState fresh8(*model->transformer, pool, 256);
  for (int i = 0; i < 8; ++i) fresh8.eval(&t[i], 1);
  EXPECT_EQ(a.recurrent_state(), fresh8.recurrent_state());
}

// A cut before the saved state clears it and drops the saved copy, which holds tokens that are
// gone: a later rewind must not restore it.
TEST(RecurrentRewind, AClearedStateForgetsItsSavedCopy) {
  for (const char* preset : {"tiny-qwen35moe", "tiny-lfm2moe", "tiny-bailingmoe3", "tiny-deepseek4"}) {
    auto model = load_model(test_model_path(preset), LoadOptions{});
    ThreadPool pool(2);
    const auto first = some_tokens(20, 3), second = some_tokens(16, 4);
    InferenceState a(*model->transformer, pool, 256), fresh(*model->transformer, pool, 256);
    a.eval(first.data(), 10);
    a.eval(first.data() + 10, 10);  // saves the state at position 10
    a.truncate(0);
    for (int i = 0; i < 15; ++i) a.eval(&second[i], 1);
    a.truncate(12);
    for (int i = 0; i < 12; ++i) fresh.eval(&second[i], 1);
    EXPECT_EQ(a.eval(&second[12], 1), fresh.eval(&second[12], 1)) << preset;
  }
}

// An eval that fails part-way (here: a layer hook throws) leaves the state as if it had not
// run, with and without a saved copy to go back to.
TEST(RecurrentRewind, AFailedEvalLeavesNoTrace) {
  for (const char* preset : {"tiny-qwen35moe", "tiny-lfm2moe", "tiny-bailingmoe3", "tiny-deepseek4"}) {
    auto model = load_model(test_model_path(preset), LoadOptions{});
    ThreadPool pool(2);
    const auto t = some_tokens(8, 5);
    for (int n : {1, 4}) {
      InferenceState a(*model->transformer, pool, 256), fresh(*model->transformer, pool, 256);
      a.eval(t.data(), 3);
      fresh.eval(t.data(), 3);
      a.set_layer_hook([](int layer) {
        if (layer == 1) throw Error("stop");
      });
      EXPECT_THROW(a.eval(t.data() + 3, n), Error);
      a.set_layer_hook(nullptr);
      EXPECT_EQ(a.n_past(), 3);
      EXPECT_EQ(a.eval(t.data() + 3, n), fresh.eval(t.data() + 3, n)) << preset << ", " << n << " tokens";
    }
  }
}

// deepseek4's bounded state (rings of the window and the pending blocks plus a slack) gives, bit
// for bit, the logits of a state that keeps every position (slack >= context), past the raw
// ring (window 16 + 32), the HCA block (128) and the HCA ring (128 + 32); through passes on the
// batch path longer than the slack, on the decode path, one-token steps; through rewinds within
// the slack (in place), beyond it (the saved copy restored and replayed) and before the saved
// copy (replayed from the start). Its ring bytes do not grow with the context.
TEST(DeepSeek4State, BoundedRingsGiveTheKeepEverythingLogits) {
  auto model = load_model(test_model_path("tiny-deepseek4"), LoadOptions{});
  ThreadPool pool(2);
  const int n_ctx = 512;
  InferenceState all(*model->transformer, pool, n_ctx, KvType::F16, n_ctx), ring(*model->transformer, pool, n_ctx);
  const auto t = some_tokens(260, 6), u = some_tokens(60, 7);
  int at = 0;
  auto both = [&](const std::vector<int32_t>& v, int from, int n, const char* what) {
    ASSERT_EQ(all.n_past(), ring.n_past());
    const std::vector<float> want = all.eval(v.data() + from, n, true);
    EXPECT_EQ(ring.eval(v.data() + from, n, true), want) << what << " at " << all.n_past() - n;
  };
  for (int n : {100, 70, 20}) {  // batch path (>= 64 rows, longer than the slack), decode path
    both(t, at, n, "pass");
    at += n;
  }
  for (; at < 215; ++at) both(t, at, 1, "step");
  // In place; the copy saved by the 3-token pass restored and replayed; before that copy.
  for (const auto& [back, steps] : {std::pair{10, 45}, std::pair{40, 5}, std::pair{200, 5}}) {
    all.truncate(at - back);
    ring.truncate(at - back);
    at -= back;
    both(u, 0, 3, "after a rewind");
    at += 3;
    for (int i = 3; i < 3 + steps; ++i, ++at) both(u, i, 1, "step after a rewind");
  }
  const ModelConfig& c = model->transformer->config();
  InferenceState longer(*model->transformer, pool, 8 * n_ctx);
  EXPECT_EQ(static_cast<int64_t>(ring.recurrent_bytes()), c.recurrent_state_bytes());
  EXPECT_EQ(longer.recurrent_bytes(), ring.recurrent_bytes());
  EXPECT_LT(ring.recurrent_bytes() + ring.kv_bytes(), all.recurrent_bytes() + all.kv_bytes());
}

// The gated delta rule against its textbook form in double precision: S <- decay * S, then
// S <- S + k (beta (v - S^T k))^T, out = S^T q * scale.
TEST(DeltaNet, StepMatchesTheDeltaRule) {
  constexpr int S = 32;
  Rng rng(7);
  std::vector<float> state(S * S, 0.0f);
  std::vector<double> ref(S * S, 0.0);  // ref[i][j]: key index i, value index j
  for (int t = 0; t < 20; ++t) {
    std::vector<float> q(S), k(S), v(S), out(S);
    for (int i = 0; i < S; ++i) {
      q[i] = static_cast<float>(rng.normal());
      k[i] = static_cast<float>(rng.normal());
      v[i] = static_cast<float>(rng.normal());
    }
    delta_net::l2_norm(q.data(), S, 1e-6f);
    delta_net::l2_norm(k.data(), S, 1e-6f);
    const float decay = 0.5f + 0.02f * static_cast<float>(t), beta = 0.3f + 0.03f * static_cast<float>(t);
    const float scale = 1.0f / std::sqrt(static_cast<float>(S));
    delta_net::step(state.data(), S, q.data(), k.data(), v.data(), decay, beta, scale, out.data());
    for (double& x : ref) x *= decay;
    for (int j = 0; j < S; ++j) {
      double kv = 0.0;
      for (int i = 0; i < S; ++i) kv += ref[i * S + j] * k[i];
      const double delta = (v[j] - kv) * beta;
      for (int i = 0; i < S; ++i) ref[i * S + j] += k[i] * delta;
    }
    for (int j = 0; j < S; ++j) {
      double o = 0.0;
      for (int i = 0; i < S; ++i) o += ref[i * S + j] * q[i];
      EXPECT_NEAR(out[j], o * scale, 1e-5) << "token " << t << " value " << j;
    }
  }
}

// The convolution continues across calls: one call over n tokens equals n calls of one token,
// bit for bit, and each output is the kernel over the last inputs.
TEST(DeltaNet, ConvolutionCarriesItsStateAcrossCalls) {
  constexpr int C = 6, K = 4, N = 9;
  Rng rng(3);
  std::vector<float> in(N * C), w(C * K);
  for (float& x : in) x = static_cast<float>(rng.normal());
  for (float& x : w) x = static_cast<float>(rng.normal());
  std::vector<float> state_a(C * (K - 1), 0.0f), state_b = state_a, out_a(N * C), out_b(N * C);
  const std::vector<float> wt = delta_net::transpose_conv(w, C, K);
  delta_net::causal_conv(in.data(), N, C, K, wt.data(), state_a.data(), out_a.data(), 0, C);
  for (int t = 0; t < N; ++t) {
    delta_net::causal_conv(in.data() + t * C, 1, C, K, wt.data(), state_b.data(), out_b.data() + t * C, 0, C);
  }
  EXPECT_EQ(out_a, out_b);
  EXPECT_EQ(state_a, state_b);
  for (int t = 0; t < N; ++t) {
    for (int c = 0; c < C; ++c) {
      double sum = 0.0;
      for (int j = 0; j < K; ++j) {
        const int pos = t - (K - 1) + j;  // inputs before the first are zero
        if (pos >= 0) sum += static_cast<double>(in[pos * C + c]) * w[c * K + j];
      }
      EXPECT_NEAR(out_a[t * C + c], sum, 1e-5);
    }
  }
}

// The table is the one description of a family: the tensors bmoe-synth writes are exactly those
// the table expands to for the config the loader reads back from the file, and every row the
// loader binds exists in that file (an optional row a preset leaves out, as tiny-glm4moe-air's
// q/k norms, is in neither).
TEST(ArchTable, SynthesizedFilesHoldExactlyTheTablesTensors) {
  for (const char* preset : {"tiny-qwen3moe", "tiny-qwen2moe", "tiny-olmoe", "tiny-mixtral", "tiny-gpt-oss", "tiny-gemma4",
                             "tiny-qwen35moe", "tiny-lfm2moe", "tiny-glm4moe", "tiny-glm4moe-air",
                             "tiny-bailingmoe3", "tiny-deepseek4"}) {
    const std::string path = test_model_path(preset);
    const auto model = load_model(path, LoadOptions{});
    const Architecture* arch = find_architecture(model->arch);
    ASSERT_NE(arch, nullptr) << preset;
    std::set<std::string> in_file, in_table;
    for (const TensorInfo& t : model->gguf->tensors()) in_file.insert(t.name);
    for (const TableTensor& t : synth_tensors(arch->tensors, model->transformer->config())) {
      const TensorInfo* info = model->gguf->find_tensor(t.name);
      if (t.spec->optional && info == nullptr && synth_preset(preset).omit_tensors.count(t.spec->name)) continue;
      EXPECT_TRUE(in_table.insert(t.name).second) << preset << ": " << t.name << " listed twice";
      ASSERT_NE(info, nullptr) << preset << ": " << t.name;
      EXPECT_EQ(info->dims, t.dims) << preset << ": " << t.name;
    }
    EXPECT_EQ(in_file, in_table) << preset;
  }
}

// The budget's estimate of a sequence's recurrent state is what the state holds.
TEST(ArchTable, RecurrentStateBytesMatchTheState) {
  for (const char* preset : {"tiny-qwen35moe", "tiny-lfm2moe", "tiny-bailingmoe3", "tiny-qwen3moe"}) {
    auto model = load_model(test_model_path(preset), LoadOptions{});
    ThreadPool pool(1);
    InferenceState state(*model->transformer, pool, 64);
    EXPECT_EQ(static_cast<int64_t>(state.recurrent_bytes()), model->transformer->config().recurrent_state_bytes()) << preset;
  }
}

TEST(ArchTable, EveryFamilyListsItsTensors) {
  ASSERT_GE(architectures().size(), 8u);
  for (const Architecture& a : architectures()) {
    const std::string text = describe_tensors(a);
    EXPECT_NE(text.find("token_embd.weight"), std::string::npos) << a.name;
    EXPECT_NE(text.find("routed expert"), std::string::npos) << a.name;
  }
}

}  // namespace
}  // namespace bmoe
