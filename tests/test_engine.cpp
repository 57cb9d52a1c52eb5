// Generation on a session: stop strings, prefix reuse that changes nothing but the work done,
// cancellation; the thread pool every step runs on.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <thread>
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

// Every task of every job runs exactly once, whether the workers are spinning (jobs back to back)
// or asleep (a pause longer than their spin between jobs), and a job never returns before all of
// its tasks finished.
TEST(ThreadPoolTest, EveryTaskRunsOnceWithSpinningOrSleepingWorkers) {
  for (const int threads : {2, 4}) {
    ThreadPool pool(threads);
    for (int job = 0; job < 300; ++job) {
      const int64_t n = 1 + job % 37;
      std::vector<std::atomic<int>> runs(static_cast<size_t>(n));
      std::atomic<int64_t> finished{0};
      pool.run(n, [&](int64_t task, int thread) {
        EXPECT_GE(thread, 0);
        EXPECT_LT(thread, threads);
        if (task % 5 == 0) std::this_thread::sleep_for(std::chrono::microseconds(50));
        runs[static_cast<size_t>(task)].fetch_add(1);
        finished.fetch_add(1);
      });
      ASSERT_EQ(finished.load(), n) << "job " << job << " returned before its tasks finished";
      for (int64_t t = 0; t < n; ++t) ASSERT_EQ(runs[static_cast<size_t>(t)].load(), 1);
      // Every tenth job waits long enough for the workers to fall asleep.
      if (job % 10 == 9) std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
  }
}

// Workers still help: a job of slow tasks runs on more than one thread.
TEST(ThreadPoolTest, WorkersShareALongJob) {
  ThreadPool pool(2);
  std::atomic<int> by_worker{0};
  pool.run(64, [&](int64_t, int thread) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
    if (thread != 0) by_worker.fetch_add(1);
  });
  EXPECT_GT(by_worker.load(), 0);
}

}  // namespace
}  // namespace bmoe
