// Generation on a session: stop strings, prefix reuse that changes nothing but the work done,
// cancellation.
#include <gtest/gtest.h>

#include <atomic>
#include <vector>

#include "core/error.h"
#include "core/thread_pool.h"
#include "engine/generate.h"
#include "engine/loader.h"
#include "test_util.h"

namespace bmoe {
namespace {

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
  p.max_tokens = 24;
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
  for (const char* preset : {"tiny-qwen35moe", "tiny-lfm2moe"}) {
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

}  // namespace
}  // namespace bmoe
