// Generation on a session: stop strings, prefix reuse that changes nothing but the work done,
// cancellation. A run's mode: streaming or resident chosen from the model's size and memory.
#include <gtest/gtest.h>

#include <atomic>
#include <cstdlib>
#include <filesystem>
#include <vector>

#include "core/error.h"
#include "core/thread_pool.h"
#include "engine/generate.h"
#include "engine/loader.h"
#include "engine/run.h"
#include "model/arch.h"
#include "moe/read_planner.h"
#include "sanitized.h"
#include "test_util.h"

namespace bmoe {
namespace {

constexpr uint64_t kGiB = 1ull << 30;

MemorySnapshot memory_of(uint64_t mem_available, std::optional<uint64_t> cgroup_available = std::nullopt) {
  MemorySnapshot m;
  m.mem_available = mem_available;
  if (cgroup_available) {
    m.cgroup_limit = *cgroup_available + kGiB;  // part of the limit already used
    m.cgroup_available = cgroup_available;
  }
  return m;
}

TEST(MoeMode, AModelThatFitsStaysResident) {
  const ModeChoice c = choose_moe_mode(MoeMode::Auto, 18 * kGiB, kGiB / 2, memory_of(64 * kGiB));
  EXPECT_FALSE(c.stream);
  EXPECT_NE(c.reason.find("<= available 64.00 GiB"), std::string::npos) << c.reason;
  EXPECT_EQ(c.line().rfind("mode: resident (model 18.00 GiB + KV 512.00 MiB", 0), 0u) << c.line();
}

TEST(MoeMode, AModelThatDoesNotFitStreams) {
  const ModeChoice c = choose_moe_mode(MoeMode::Auto, 18 * kGiB, kGiB / 2, memory_of(12 * kGiB));
  EXPECT_TRUE(c.stream);
  EXPECT_NE(c.reason.find("> available 12.00 GiB"), std::string::npos) << c.reason;
  EXPECT_NE(c.reason.find("--no-moe-stream"), std::string::npos) << c.reason;
  EXPECT_EQ(c.line().rfind("mode: streaming (", 0), 0u);
}

TEST(MoeMode, TheMarginAndBuffersCount) {
  // Fits exactly with the working buffers and the margin (a tenth of 20 GiB) counted; a byte
  // more does not.
  const uint64_t available = 20 * kGiB;
  const uint64_t room = available - kWorkingBufferBytes - memory_margin(available);
  EXPECT_EQ(memory_margin(available), 2 * kGiB);
  EXPECT_EQ(memory_margin(kGiB), 512ull << 20);  // the floor
  EXPECT_FALSE(choose_moe_mode(MoeMode::Auto, room - kGiB, kGiB, memory_of(available)).stream);
  EXPECT_TRUE(choose_moe_mode(MoeMode::Auto, room - kGiB + 1, kGiB, memory_of(available)).stream);
  EXPECT_TRUE(choose_moe_mode(MoeMode::Auto, room - kGiB, kGiB + 1, memory_of(available)).stream);  // the KV counts
}

TEST(MoeMode, ACgroupSmallerThanMemAvailableDecides) {
  const ModeChoice c = choose_moe_mode(MoeMode::Auto, 18 * kGiB, kGiB / 2, memory_of(64 * kGiB, 10 * kGiB));
  EXPECT_TRUE(c.stream);
  EXPECT_NE(c.reason.find("available 10.00 GiB (cgroup limit 11.00 GiB)"), std::string::npos) << c.reason;
  // A cgroup with room to spare changes nothing.
  EXPECT_FALSE(choose_moe_mode(MoeMode::Auto, 18 * kGiB, kGiB / 2, memory_of(64 * kGiB, 100 * kGiB)).stream);
}

TEST(MoeMode, AForcedModeIsKept) {
  const ModeChoice stream = choose_moe_mode(MoeMode::Stream, kGiB, 0, memory_of(64 * kGiB));
  EXPECT_TRUE(stream.stream);
  EXPECT_EQ(stream.line(), "mode: streaming (--moe-stream)");
  const ModeChoice fits = choose_moe_mode(MoeMode::Resident, kGiB, 0, memory_of(64 * kGiB));
  EXPECT_FALSE(fits.stream);
  EXPECT_EQ(fits.line(), "mode: resident (--no-moe-stream)");
  const ModeChoice too_big = choose_moe_mode(MoeMode::Resident, 18 * kGiB, 0, memory_of(12 * kGiB));
  EXPECT_FALSE(too_big.stream);
  EXPECT_NE(too_big.reason.find("does not fit"), std::string::npos) << too_big.reason;
}

TEST(MoeMode, UnknownMemoryStaysResident) {
  const ModeChoice c = choose_moe_mode(MoeMode::Auto, 18 * kGiB, 0, MemorySnapshot{});
  EXPECT_FALSE(c.stream);
  EXPECT_NE(c.reason.find("unknown"), std::string::npos) << c.reason;
}

TEST(MoeMode, ThePreviewCountsEveryShard) {
  const std::string first = test_model_path("tiny-qwen3moe", 2, {}, 3);
  const ModelPreview p = preview_model(first);
  uint64_t total = 0;
  for (int i = 1; i <= 3; ++i) {
    const auto split = parse_split_name(first);
    ASSERT_TRUE(split.has_value());
    total += std::filesystem::file_size(split_shard_path(split->prefix, i, 3));
  }
  EXPECT_EQ(p.file_bytes, total);
  EXPECT_GT(p.file_bytes, std::filesystem::file_size(first));
  EXPECT_EQ(p.config.n_layer, 2);
  EXPECT_GT(p.config.kv_bytes_per_token(), 0);
}

// BMOE_FAKE_MEM_AVAILABLE_MB set for one scope (it stands for the machine's memory figures).
class FakeMemory {
 public:
  explicit FakeMemory(int mib) { ::setenv("BMOE_FAKE_MEM_AVAILABLE_MB", std::to_string(mib).c_str(), 1); }
  ~FakeMemory() { ::unsetenv("BMOE_FAKE_MEM_AVAILABLE_MB"); }
};

TEST(MoeMode, LoadRunChoosesFromTheMemoryItSees) {
  RunConfig config;
  config.model = test_model_path("tiny-qwen3moe", 2);
  config.ctx_size = 256;
  {
    const FakeMemory plenty(64 << 10);
    const LoadedRun run = load_run(config);
    EXPECT_FALSE(run.mode.stream);
    EXPECT_EQ(run.config.moe_mode, MoeMode::Resident);
    EXPECT_EQ(run.config.batch(), 512);
    EXPECT_FALSE(run.model->streaming());
  }
  {
    const FakeMemory scarce(700);  // under the buffers and the 512 MiB margin
    LoadedRun run = load_run(config);
    EXPECT_TRUE(run.mode.stream);
    EXPECT_EQ(run.config.moe_mode, MoeMode::Stream);
    EXPECT_EQ(run.config.batch(), 2048);
    EXPECT_NE(run.model->streamer(), nullptr);
    EXPECT_NE(run.mode.reason.find("available 700.00 MiB"), std::string::npos) << run.mode.reason;
  }
}

TEST(MoeMode, TheAutomaticBudgetStopsAtEveryExpert) {
  RunConfig config;
  config.model = test_model_path("tiny-qwen3moe", 2);
  config.ctx_size = 256;
  config.moe_mode = MoeMode::Stream;
  const FakeMemory plenty(64 << 10);
  LoadedRun run = load_run(config);
  const uint64_t every_expert = ReadPlanner::every_expert_bytes(run.model->expert_layout);
  EXPECT_GE(every_expert, run.model->expert_layout.total_bytes());
  EXPECT_EQ(run.cache_budget, every_expert);
}

// Chat code compares no family names: a family that needs a built-in format declares one, and
// it must be a format chat knows.
TEST(FamilyChatFormat, EveryDeclaredFormatIsAKnownOne) {
  int declared = 0;
  for (const Architecture& a : architectures()) {
    if (!a.chat_format) continue;
    ++declared;
    EXPECT_NE(chat_format_by_name(a.chat_format), ChatFormat::None) << a.name << ": " << a.chat_format;
  }
  EXPECT_EQ(find_architecture("gpt-oss")->chat_format, std::string_view("harmony"));
  EXPECT_EQ(find_architecture("gemma4")->chat_format, std::string_view("gemma4"));
  EXPECT_GE(declared, 2);
}

TEST(StopMatcher, HoldsBackPossibleStartsAndCutsAtTheStop) {
  StopMatcher m({"END", "\n\n"});
  EXPECT_EQ(m.push("hello E"), "hello ");  // "E" may start "END"
  EXPECT_EQ(m.push("x"), "Ex");
  EXPECT_EQ(m.push(" and EN"), " and ");
  EXPECT_EQ(m.push("D tail"), "");
  EXPECT_TRUE(m.stopped());
  EXPECT_EQ(m.push("more"), "");
  EXPECT_EQ(m.flush(), "");
}

TEST(StopMatcher, FlushReleasesAHeldTail) {
  StopMatcher m({"STOP"});
  EXPECT_EQ(m.push("abcST"), "abc");
  EXPECT_FALSE(m.stopped());
  EXPECT_EQ(m.flush(), "ST");
}

TEST(StopMatcher, NoStopsPassesEverything) {
  StopMatcher m({});
  EXPECT_EQ(m.push("abc"), "abc");
  EXPECT_EQ(m.flush(), "");
}

class GenerateTest : public ::testing::Test {
 protected:
  void SetUp() override { model_ = load_model(test_model_path("tiny-qwen3moe", 2), LoadOptions{}); }
  std::vector<int32_t> ids(const std::string& text) { return model_->tokenizer->encode(text, false, false); }
  std::unique_ptr<LoadedModel> model_;
  ThreadPool pool_{2};
};

// A second prompt that extends the first (its answer is dropped) and the same prompt again:
// the reused prefix changes nothing but the work done.
void expect_prefix_reuse_is_exact(LoadedModel& model, ThreadPool& pool) {
  auto ids = [&](const std::string& text) { return model.tokenizer->encode(text, false, false); };
  GenerateParams p;
  p.max_tokens = full_or_sanitized(24, 12);
  const auto first = ids("the quick brown fox");
  auto second = first;
  for (int32_t t : ids(" jumps over the lazy dog")) second.push_back(t);

  Session warm(model, pool, 256, 64, SamplerConfig{});
  const GenerateResult a = generate(warm, first, p);
  const GenerateResult b = generate(warm, second, p);
  EXPECT_EQ(a.reused_tokens, 0);
  EXPECT_EQ(b.reused_tokens, static_cast<int>(first.size()));

  Session fresh(model, pool, 256, 64, SamplerConfig{});
  const GenerateResult c = generate(fresh, second, p);
  EXPECT_EQ(c.reused_tokens, 0);
  EXPECT_EQ(b.tokens, c.tokens);
  EXPECT_EQ(b.text, c.text);

  // The same prompt again: everything but the last token is kept, and the answer repeats.
  const GenerateResult d = generate(warm, second, p);
  EXPECT_EQ(d.reused_tokens, static_cast<int>(second.size()) - 1);
  EXPECT_EQ(d.tokens, c.tokens);
}

TEST_F(GenerateTest, PrefixReuseGivesTheSameTokensAsAFreshSession) { expect_prefix_reuse_is_exact(*model_, pool_); }

// Hybrid models rewind their recurrent state by restoring a saved copy and replaying tokens.
TEST(GenerateHybrid, PrefixReuseGivesTheSameTokensAsAFreshSession) {
  ThreadPool pool(2);
  for (const char* preset : {"tiny-qwen35moe", "tiny-lfm2moe", "tiny-bailingmoe3", "tiny-deepseek4"}) {
    SCOPED_TRACE(preset);
    auto model = load_model(test_model_path(preset), LoadOptions{});
    expect_prefix_reuse_is_exact(*model, pool);
  }
}

TEST_F(GenerateTest, LengthLimitAndCancellation) {
  Session s(*model_, pool_, 256, 64, SamplerConfig{});
  GenerateParams p;
  p.max_tokens = 5;
  p.ignore_eos = true;
  const GenerateResult r = generate(s, ids("hello world"), p);
  EXPECT_EQ(r.tokens.size(), 5u);
  EXPECT_EQ(r.finish_reason, "length");

  std::atomic<bool> cancel{true};
  p.max_tokens = 50;
  EXPECT_EQ(generate(s, ids("hello world"), p, {}, &cancel).finish_reason, "cancelled");

  int pieces = 0;
  const GenerateResult stopped = generate(s, ids("hello there"), p, [&](const std::string&) { return ++pieces < 3; });
  EXPECT_EQ(stopped.finish_reason, "cancelled");
  EXPECT_LE(stopped.tokens.size(), 4u);
}

TEST_F(GenerateTest, PromptLongerThanTheContextIsAnError) {
  Session s(*model_, pool_, 32, 16, SamplerConfig{});
  std::vector<int32_t> long_prompt(40, ids("the")[0]);
  EXPECT_THROW(generate(s, long_prompt, GenerateParams{}), Error);
}


// Embeddings: pooling picks the rows it says (mean, first, last), the batch size changes no
// value, the vector has unit length, and a prompt after it reuses its rows and answers as a
// fresh session does.
TEST_F(GenerateTest, EmbeddingsPoolTheFinalHiddenStates) {
  const auto tokens = ids("the quick brown fox jumps");
  Session big(*model_, pool_, 256, 64, SamplerConfig{}), small(*model_, pool_, 256, 1, SamplerConfig{});
  const std::vector<float> mean = big.embed(tokens, Pooling::Mean);
  const std::vector<float> mean_small = small.embed(tokens, Pooling::Mean);
  double norm = 0.0;
  for (size_t e = 0; e < mean.size(); ++e) {
    norm += static_cast<double>(mean[e]) * mean[e];
    EXPECT_NEAR(mean[e], mean_small[e], 1e-4f) << e;
  }
  EXPECT_NEAR(norm, 1.0, 1e-5);
  // cls is the first token's row alone: the mean over that one token (a causal model's first
  // row does not see the rest).
  const std::vector<float> last = big.embed(tokens, Pooling::Last);
  const std::vector<float> first = big.embed(tokens, Pooling::Cls);
  const std::vector<float> first_alone = big.embed({tokens.front()}, Pooling::Mean);
  for (size_t e = 0; e < first.size(); ++e) EXPECT_NEAR(first[e], first_alone[e], 1e-5f) << e;
  EXPECT_NE(last, first);
  EXPECT_NE(last, mean);
  GenerateParams p;
  p.max_tokens = 8;
  auto prompt = tokens;
  prompt.push_back(tokens.back());
  big.embed(tokens, Pooling::Last);
  const GenerateResult after = generate(big, prompt, p);
  EXPECT_EQ(after.reused_tokens, static_cast<int>(tokens.size()));
  Session fresh(*model_, pool_, 256, 64, SamplerConfig{});
  EXPECT_EQ(after.tokens, generate(fresh, prompt, p).tokens);
}

}  // namespace
}  // namespace bmoe
