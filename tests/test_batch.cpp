// Continuous batching (engine/generate.h ParallelDecode): every sequence of a batch produces
// exactly the tokens it produces alone, greedy or seeded sampling, resident or streamed, in every
// family (hybrid and sliding-window ones included), while sequences join and leave mid-run and
// one is cancelled; the rows of a step share the experts they chose.
#include <gtest/gtest.h>

#include <atomic>
#include <cctype>
#include <memory>
#include <string>
#include <vector>

#include "core/thread_pool.h"
#include "engine/generate.h"
#include "engine/loader.h"
#include "moe/streaming_experts.h"
#include "test_util.h"

namespace bmoe {
namespace {

constexpr int kCtx = 256;

// Four conversations of different lengths, samplers and limits: greedy, seeded sampling at two
// temperatures, greedy with a stop-free long answer (past gemma4's and gpt-oss's windows).
struct Job {
  std::string prompt;
  int limit;
  SamplerConfig sampler;
};

std::vector<Job> jobs() {
  SamplerConfig warm;
  warm.temperature = 0.8f;
  warm.seed = 11;
  SamplerConfig hot;
  hot.temperature = 1.3f;
  hot.top_k = 0;
  hot.seed = 97;
  return {{"the quick brown fox jumps over the lazy dog", 80, SamplerConfig{}},
          {"once upon a time", 40, warm},
          {"a b c d e f g h i j k l m n o p q r s t u v w x y z and then some more words", 64, hot},
          {"hello", 24, SamplerConfig{}}};
}

std::unique_ptr<LoadedModel> open_model(const std::string& path, bool stream) {
  LoadOptions lo;
  lo.stream_experts = stream;
  auto model = load_model(path, lo);
  if (stream) {
    StreamingOptions so;
    so.cache_bytes = 256 << 10;  // smaller than the experts: reads every step
    so.top_k = model->transformer->config().n_expert_used;
    attach_streaming(*model, so);
  }
  return model;
}

std::vector<int32_t> prompt_of(LoadedModel& model, const Job& job) {
  return model.tokenizer->encode(job.prompt, false, model.tokenizer->vocab().add_bos);
}

GenerateParams params_of(const Job& job) {
  GenerateParams p;
  p.max_tokens = job.limit;
  p.sampler = job.sampler;
  p.ignore_eos = true;
  return p;
}

std::vector<int32_t> alone(LoadedModel& model, const Job& job) {
  ThreadPool pool(2);
  Session s(model, pool, kCtx, 64, job.sampler);
  return generate(s, prompt_of(model, job), params_of(job)).tokens;
}

class BatchIdentity : public ::testing::TestWithParam<std::tuple<std::string, bool>> {};

// Sequences 0 and 1 start together, 2 joins after 3 steps, 3 after 10; 1 is cancelled after
// 12 steps; 3 and 1 leave long before 0. Each answer equals the sequence's own run alone (the
// cancelled one: a prefix of it).
TEST_P(BatchIdentity, EverySequenceEqualsItselfAlone) {
  const auto& [preset, stream] = GetParam();
  const std::string path = test_model_path(preset, 4);
  auto model = open_model(path, stream);
  const std::vector<Job> js = jobs();
  std::vector<std::vector<int32_t>> want;
  for (const Job& j : js) want.push_back(alone(*model, j));

  ThreadPool pool(2);
  std::vector<std::unique_ptr<Session>> sessions;
  ParallelDecode batch(*model, pool);
  std::atomic<bool> cancel_1{false};
  std::vector<int> ids(js.size(), -1);
  auto join = [&](size_t i) {
    sessions.push_back(std::make_unique<Session>(*model, pool, kCtx, 64, js[i].sampler));
    sessions.back()->prefill(prompt_of(*model, js[i]));
    DecodeHooks hooks;
    if (i == 1) hooks.cancel = &cancel_1;
    ids[i] = batch.add(*sessions.back(), js[i].limit, params_of(js[i]), hooks);
  };
  join(0);
  join(1);
  std::vector<GenerateResult> got(js.size());
  int steps = 0, widest = 0;
  while (batch.running() > 0 || steps == 0) {
    if (steps == 3) join(2);
    if (steps == 10) join(3);
    if (steps == 12) cancel_1 = true;
    widest = std::max(widest, batch.running());
    for (int id : batch.step()) {
      for (size_t i = 0; i < ids.size(); ++i) {
        if (ids[i] == id) got[i] = batch.take(id);
      }
    }
    ++steps;
  }
  EXPECT_EQ(widest, 4);
  for (size_t i = 0; i < js.size(); ++i) {
    if (i == 1) {
      EXPECT_EQ(got[i].finish_reason, "cancelled");
      ASSERT_LT(got[i].tokens.size(), want[i].size());
      EXPECT_EQ(got[i].tokens, std::vector<int32_t>(want[i].begin(), want[i].begin() + static_cast<std::ptrdiff_t>(got[i].tokens.size())))
          << preset << " sequence " << i;
      continue;
    }
    EXPECT_EQ(got[i].finish_reason, "length");
    EXPECT_EQ(got[i].tokens, want[i]) << preset << (stream ? " streamed" : " resident") << " sequence " << i;
  }
  // One lookup per distinct expert per layer and step: rows that chose the same expert share it.
  const SessionBatch& b = batch.batch();
  EXPECT_GT(b.steps(), 0u);
  EXPECT_LT(b.distinct_experts(), b.routed_slots()) << preset;
}

INSTANTIATE_TEST_SUITE_P(Families, BatchIdentity,
                         ::testing::Combine(::testing::Values("tiny-qwen3moe", "tiny-qwen2moe", "tiny-olmoe", "tiny-mixtral",
                                                              "tiny-gpt-oss", "tiny-gemma4", "tiny-qwen35moe",
                                                              "tiny-lfm2moe", "tiny-glm4moe", "tiny-bailingmoe3"),
                                            ::testing::Bool()),
                         [](const auto& info) {
                           std::string n = std::get<0>(info.param) + (std::get<1>(info.param) ? "_streamed" : "_resident");
                           for (char& ch : n) ch = std::isalnum(static_cast<unsigned char>(ch)) ? ch : '_';
                           return n;
                         });

}  // namespace
}  // namespace bmoe
