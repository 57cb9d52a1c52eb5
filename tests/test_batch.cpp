// Continuous batching (engine/generate.h ParallelDecode): every sequence of a batch produces
// exactly the tokens it produces alone, greedy or seeded sampling, resident or streamed, in every
// family (hybrid and sliding-window ones included), while sequences join and leave mid-run (their
// prompts read in chunks inside the decode steps' passes) and one is cancelled; the rows of a
// step share the experts they chose.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <cctype>
#include <map>
#include <memory>
#include <random>
#include <span>
#include <string>
#include <vector>

#include "core/thread_pool.h"
#include "engine/batch_slots.h"
#include "engine/generate.h"
#include "engine/loader.h"
#include "engine/routing.h"
#include "moe/route_trace.h"
#include "moe/streaming_experts.h"
#include "sanitized.h"
#include "text/grammar.h"
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
  size_t tokens = 0;  // > 0: the prompt cut to this many tokens
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
          {"a b c d e f g h i j k l m n o p q r s t u v w x y z a b c d e f g h i j k l m n o p q r s t u v w x y z "
           "a b c d e f g h i j k l m n o p q r s t u v w x y z and then some more words", 64, hot, 70},
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
  std::vector<int32_t> ids = model.tokenizer->encode(job.prompt, false, model.tokenizer->vocab().add_bos);
  if (job.tokens > 0 && ids.size() > job.tokens) ids.resize(job.tokens);
  return ids;
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

// A sequence that reads its prompt inside a ParallelDecode's steps: one chunk per step, cut where
// a fresh read of the prompt in batches of n_batch cuts it; added to the batch once read.
struct ChunkedJoin {
  Session* session = nullptr;
  std::vector<int32_t> prompt;
  size_t fed = 0;
  int n_batch = 64;
  // The next chunk (nullptr when none is being read).
  const PromptChunk* next() {
    if (!session) return nullptr;
    const size_t n = std::min(static_cast<size_t>(n_batch) - fed % static_cast<size_t>(n_batch), prompt.size() - fed);
    chunk = {session, std::span<const int32_t>(prompt).subspan(fed, n), static_cast<int>(prompt.size())};
    return &chunk;
  }
  // After the step that read it: whether the prompt is done (then it is no longer read).
  bool read() {
    if (!session) return false;
    fed += chunk.tokens.size();
    if (fed < prompt.size()) return false;
    session = nullptr;
    return true;
  }
  PromptChunk chunk;
};

class BatchIdentity : public ::testing::TestWithParam<std::tuple<std::string, bool>> {};

// Sequences 0 and 1 start together; 2 starts reading its prompt (over 64 tokens: a chunk on the
// batch attention path, then one on the decode path) inside the steps after 3 steps, 3 after 10
// (one short chunk); 1 is cancelled after 12 steps; 3 and 1 leave long before 0. Each answer
// equals the sequence's own run alone (the cancelled one: a prefix of it), and every step is one
// pass, the prompt chunks included.
TEST_P(BatchIdentity, EverySequenceEqualsItselfAlone) {
  const auto& [preset, stream] = GetParam();
  const std::string path = test_model_path(preset, 4);
  auto model = open_model(path, stream);
  const std::vector<Job> js = jobs();
  std::vector<std::vector<int32_t>> want;
  for (const Job& j : js) want.push_back(alone(*model, j));
  ASSERT_GT(prompt_of(*model, js[2]).size(), 64u);
  ASSERT_LT(prompt_of(*model, js[2]).size() + static_cast<size_t>(js[2].limit), static_cast<size_t>(kCtx));

  ThreadPool pool(2);
  std::vector<std::unique_ptr<Session>> sessions;
  ParallelDecode batch(*model, pool);
  std::atomic<bool> cancel_1{false};
  std::vector<int> ids(js.size(), -1);
  auto add = [&](size_t i) {
    DecodeHooks hooks;
    if (i == 1) hooks.cancel = &cancel_1;
    ids[i] = batch.add(*sessions[i], js[i].limit, params_of(js[i]), hooks);
  };
  for (size_t i = 0; i < js.size(); ++i) sessions.push_back(std::make_unique<Session>(*model, pool, kCtx, 64, js[i].sampler));
  sessions[0]->prefill(prompt_of(*model, js[0]));
  add(0);
  sessions[1]->prefill(prompt_of(*model, js[1]));
  add(1);
  ChunkedJoin joining;
  size_t joining_job = 0;
  uint64_t chunks = 0, prompt_rows = 0;
  std::vector<GenerateResult> got(js.size());
  int steps = 0, widest = 0;
  while (batch.running() > 0 || steps == 0) {
    if (steps == 3 || steps == 10) {
      ASSERT_EQ(joining.session, nullptr) << preset << ": the previous prompt is still being read";
      joining_job = steps == 3 ? 2 : 3;
      joining = {sessions[joining_job].get(), prompt_of(*model, js[joining_job])};
    }
    if (steps == 12) cancel_1 = true;
    widest = std::max(widest, batch.running());
    const PromptChunk* chunk = joining.next();
    chunks += chunk != nullptr;
    prompt_rows += chunk ? chunk->tokens.size() : 0;
    for (int id : batch.step(chunk)) {
      for (size_t i = 0; i < ids.size(); ++i) {
        if (ids[i] == id) got[i] = batch.take(id);
      }
    }
    if (joining.read()) add(joining_job);
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
  // Every step that read a chunk was one pass: the chunk rode with the decode rows.
  EXPECT_GE(chunks, 3u);
  EXPECT_EQ(b.chunk_steps(), chunks);
  EXPECT_EQ(b.prompt_rows(), prompt_rows);
  EXPECT_EQ(b.steps(), static_cast<uint64_t>(steps) - 1);  // the last step only ended answers
}

// Resident and streamed weights (false, true). Under the sanitizers only streamed: the batch
// code is the same over either source and the streamed rows add the read paths; the Release run
// checks both.
std::vector<bool> batch_weight_sources() {
  if (kAddressSanitized) return {true};
  return {false, true};
}

INSTANTIATE_TEST_SUITE_P(Families, BatchIdentity,
                         ::testing::Combine(::testing::Values("tiny-qwen3moe", "tiny-qwen2moe", "tiny-olmoe", "tiny-mixtral",
                                                              "tiny-gpt-oss", "tiny-gemma4", "tiny-qwen35moe",
                                                              "tiny-lfm2moe", "tiny-glm4moe", "tiny-bailingmoe3", "tiny-deepseek4"),
                                            ::testing::ValuesIn(batch_weight_sources())),
                         [](const auto& info) {
                           std::string n = std::get<0>(info.param) + (std::get<1>(info.param) ? "_streamed" : "_resident");
                           for (char& ch : n) ch = std::isalnum(static_cast<unsigned char>(ch)) ? ch : '_';
                           return n;
                         });

// A prompt read inside the steps after a kept prefix (the slot's earlier conversation, its
// answer's rows on the decode path), with the f32 KV cache in a plain family and the f16 one in
// a hybrid family (recurrent state: keep_prefix replays): the answer equals the same request on
// a fresh session, and the running answer beside it equals its own alone.
class BatchChunks : public ::testing::TestWithParam<std::tuple<std::string, KvType>> {};

TEST_P(BatchChunks, APromptAfterAKeptPrefixEqualsAFreshRead) {
  const std::string& preset = std::get<0>(GetParam());
  const KvType kv = std::get<1>(GetParam());  // not a structured binding: the lambdas capture it (clang 14)
  auto model = open_model(test_model_path(preset, 4), false);
  const int n_batch = 16;
  GenerateParams params = params_of(jobs()[0]);
  params.max_tokens = 12;
  auto fresh = [&](const std::vector<int32_t>& prompt, const GenerateParams& p) {
    ThreadPool pool(2);
    Session s(*model, pool, kCtx, n_batch, p.sampler, kv);
    return generate(s, prompt, p).tokens;
  };
  const std::vector<int32_t> first = prompt_of(*model, jobs()[1]);
  ThreadPool pool(2);
  Session reader(*model, pool, kCtx, n_batch, params.sampler, kv);
  std::vector<int32_t> second = first;
  const std::vector<int32_t> answer = generate(reader, first, params).tokens;
  second.insert(second.end(), answer.begin(), answer.end());
  const std::vector<int32_t> more = prompt_of(*model, jobs()[2]);
  second.insert(second.end(), more.begin(), more.end());
  const std::vector<int32_t> want = fresh(second, params);
  const Job other = jobs()[0];
  const std::vector<int32_t> want_other = fresh(prompt_of(*model, other), params_of(other));

  Session decoding(*model, pool, kCtx, n_batch, other.sampler, kv);
  decoding.prefill(prompt_of(*model, other));
  ParallelDecode batch(*model, pool);
  const int other_id = batch.add(decoding, other.limit, params_of(other));
  ChunkedJoin joining{&reader, second, static_cast<size_t>(reader.keep_prefix(second)), n_batch};
  ASSERT_GT(joining.fed, first.size() / 2) << "the earlier conversation's rows were not kept";
  int reader_id = -1;
  std::vector<int32_t> got, got_other;
  while (batch.running() > 0) {
    for (int id : batch.step(joining.next())) (id == other_id ? got_other : got) = batch.take(id).tokens;
    if (joining.read()) reader_id = batch.add(reader, params.max_tokens, params);
  }
  ASSERT_GE(reader_id, 0);
  EXPECT_EQ(got, want) << preset;
  EXPECT_EQ(got_other, want_other) << preset;
  EXPECT_GE(batch.batch().chunk_steps(), 2u);
}

INSTANTIATE_TEST_SUITE_P(KvTypes, BatchChunks,
                         ::testing::Values(std::make_tuple(std::string("tiny-qwen3moe"), KvType::F32),
                                           std::make_tuple(std::string("tiny-qwen35moe"), KvType::F16)),
                         [](const auto& info) {
                           return std::string(std::get<0>(info.param) == "tiny-qwen3moe" ? "qwen3moe" : "qwen35moe") +
                                  (std::get<1>(info.param) == KvType::F16 ? "_f16" : "_f32");
                         });

// Grammars, stop strings and a cancel inside one batch: five sequences decoding together (a
// grammar greedy and a grammar sampled with a seed, a stop string that ends one answer early
// while the others go on, a plain long answer, and one cancelled mid-batch); each answer equals
// the same request run alone, token for token, text and finish reason included.
struct Constrained {
  std::string prompt;
  GenerateParams params;
};

GenerateParams constrained(int limit, float temperature, uint64_t seed, std::shared_ptr<const Grammar> grammar) {
  GenerateParams p;
  p.max_tokens = limit;
  p.sampler.temperature = temperature;
  p.sampler.seed = seed;
  p.grammar = std::move(grammar);
  p.ignore_eos = !p.grammar;
  return p;
}

GenerateResult constrained_alone(LoadedModel& model, const Constrained& c) {
  ThreadPool pool(2);
  Session s(model, pool, kCtx, 64, c.params.sampler);
  return generate(s, prompt_of(model, {c.prompt, 0, {}}), c.params);
}

// A stop string taken from the middle of the answer's text without one: the answer with it ends
// there, early.
std::string stop_inside(const std::string& text) {
  const size_t at = text.size() / 3;
  return text.substr(at, std::min<size_t>(3, text.size() - at));
}

TEST(BatchConstraints, GrammarStopAndCancelInsideABatchEqualEachAlone) {
  auto model = open_model(test_model_path("tiny-qwen3moe", 4), true);
  const auto words = Grammar::parse(R"(root ::= word (" " word)* "." | "yes" | "no"
word ::= [a-z]+)");
  std::vector<Constrained> cs = {{"the quick brown fox", constrained(32, 0.0f, 0, words)},
                                 {"once upon a time", constrained(32, 0.9f, 7, words)},
                                 {"a b c d e f g", constrained(48, 0.0f, 0, nullptr)},
                                 {"hello there", constrained(48, 0.0f, 0, nullptr)},
                                 {"the lazy dog", constrained(48, 0.0f, 0, nullptr)}};
  const GenerateResult unstopped = constrained_alone(*model, cs[2]);
  ASSERT_GE(unstopped.text.size(), 6u);
  cs[2].params.stop = {stop_inside(unstopped.text)};
  std::vector<GenerateResult> want;
  for (const Constrained& c : cs) want.push_back(constrained_alone(*model, c));
  ASSERT_EQ(want[2].finish_reason, "stop");
  EXPECT_EQ(want[2].stop_word, cs[2].params.stop[0]);
  ASSERT_LT(want[2].tokens.size(), unstopped.tokens.size());

  ThreadPool pool(2);
  std::vector<std::unique_ptr<Session>> sessions;
  ParallelDecode batch(*model, pool);
  std::atomic<bool> cancel_4{false};
  for (size_t i = 0; i < cs.size(); ++i) {
    sessions.push_back(std::make_unique<Session>(*model, pool, kCtx, 64, cs[i].params.sampler));
    sessions.back()->prefill(prompt_of(*model, {cs[i].prompt, 0, {}}));
    DecodeHooks hooks;
    if (i == 4) hooks.cancel = &cancel_4;
    EXPECT_EQ(batch.add(*sessions.back(), cs[i].params.max_tokens, cs[i].params, hooks), static_cast<int>(i));
  }
  std::vector<GenerateResult> got(cs.size());
  std::vector<int> ended_at(cs.size(), -1);
  for (int step = 0; batch.running() > 0; ++step) {
    if (step == 4) cancel_4 = true;
    for (int id : batch.step()) {
      got[static_cast<size_t>(id)] = batch.take(id);
      ended_at[static_cast<size_t>(id)] = step;
    }
  }
  for (size_t i = 0; i < 2; ++i) {  // the grammar held in the batch: words of a-z, maybe a final '.'
    EXPECT_FALSE(got[i].text.empty());
    EXPECT_EQ(got[i].text.find_first_not_of("abcdefghijklmnopqrstuvwxyz ."), std::string::npos) << got[i].text;
  }
  for (size_t i = 0; i < 4; ++i) {
    EXPECT_EQ(got[i].tokens, want[i].tokens) << "sequence " << i;
    EXPECT_EQ(got[i].text, want[i].text) << "sequence " << i;
    EXPECT_EQ(got[i].finish_reason, want[i].finish_reason) << "sequence " << i;
    EXPECT_EQ(got[i].stop_word, want[i].stop_word) << "sequence " << i;
  }
  // The stop string ended its answer while the plain one went on.
  EXPECT_LT(ended_at[2], ended_at[3]);
  EXPECT_EQ(got[4].finish_reason, "cancelled");
  ASSERT_LT(got[4].tokens.size(), want[4].tokens.size());
  EXPECT_EQ(got[4].tokens, std::vector<int32_t>(want[4].tokens.begin(), want[4].tokens.begin() + static_cast<std::ptrdiff_t>(got[4].tokens.size())));
  EXPECT_LT(ended_at[4], ended_at[3]);
}

// --route-replay under --parallel: each sequence replays its own stretch of one trace, so a
// batch's rows route as a real model's conversations would. A trace of random routing (seeded):
// [phase][step][layer] -> the experts of its slots.
using TraceSteps = std::vector<std::vector<std::vector<std::vector<int32_t>>>>;

TraceSteps write_trace(const std::string& path, const ModelConfig& c, int prompt_steps, int decode_steps) {
  RouteTraceWriter writer(path, "test", c.arch, c.n_layer, c.n_expert, c.n_expert_used, {}, {});
  std::mt19937 rng(5);
  TraceSteps steps(2);
  for (int phase = 0; phase < 2; ++phase) {
    for (int step = 0; step < (phase == 0 ? prompt_steps : decode_steps); ++step) {
      auto& layers = steps[static_cast<size_t>(phase)].emplace_back(static_cast<size_t>(c.n_layer));
      for (int layer = 0; layer < c.n_layer; ++layer) {
        std::vector<int32_t> ids(static_cast<size_t>(c.n_expert));
        for (int e = 0; e < c.n_expert; ++e) ids[static_cast<size_t>(e)] = e;
        std::shuffle(ids.begin(), ids.end(), rng);
        ids.resize(static_cast<size_t>(c.n_expert_used));
        for (size_t slot = 0; slot < ids.size(); ++slot) {
          writer.write({0, phase, step, layer, static_cast<int>(slot), ids[slot], 1.0f / static_cast<float>(slot + 1), 0, 0});
        }
        layers[static_cast<size_t>(layer)] = ids;
      }
    }
  }
  return steps;
}

// The experts each decode row of one sequence was routed to, by (position, layer).
using RouteLog = std::map<std::pair<int, int>, std::vector<int32_t>>;

void replay_into(Session& s, RouteReplayer& replay, RouteLog& log) {
  s.state().set_route_hook([&replay, &log](RouteEvent& e) {
    replay.on_route(e);
    if (!e.prefill) log[{e.position, e.layer}] = *e.experts;
  });
}

TEST(BatchReplay, EachSequenceRoutesAsItsOwnReplayAlone) {
  const std::string path = test_model_path("tiny-qwen3moe", 4);
  auto model = open_model(path, true);
  const ModelConfig& c = model->transformer->config();
  const std::string trace_path = ::testing::TempDir() + "batch-replay.route.csv";
  const int decode_steps = 30, stride = 7, n = 3;
  const TraceSteps trace = write_trace(trace_path, c, 6, decode_steps);
  const RouteReplayer replayer(trace_path, c);
  std::vector<Job> js = jobs();
  js.resize(n);
  for (Job& j : js) j.limit = 20;

  std::vector<RouteLog> want(n), got(n);
  std::vector<std::vector<int32_t>> want_tokens(n);
  std::vector<RouteReplayer> replays;
  for (int i = 0; i < n; ++i) replays.push_back(replayer.starting_at(i * stride));
  ThreadPool pool(2);
  for (int i = 0; i < n; ++i) {
    RouteReplayer alone_replay = replayer.starting_at(i * stride);
    Session s(*model, pool, kCtx, 64, js[static_cast<size_t>(i)].sampler);
    replay_into(s, alone_replay, want[static_cast<size_t>(i)]);
    want_tokens[static_cast<size_t>(i)] = generate(s, prompt_of(*model, js[static_cast<size_t>(i)]), params_of(js[static_cast<size_t>(i)])).tokens;
  }
  std::vector<std::unique_ptr<Session>> sessions;
  ParallelDecode batch(*model, pool);
  for (int i = 0; i < n; ++i) {
    const Job& j = js[static_cast<size_t>(i)];
    sessions.push_back(std::make_unique<Session>(*model, pool, kCtx, 64, j.sampler));
    replay_into(*sessions.back(), replays[static_cast<size_t>(i)], got[static_cast<size_t>(i)]);
    sessions.back()->prefill(prompt_of(*model, j));
    batch.add(*sessions.back(), j.limit, params_of(j));
  }
  std::vector<std::vector<int32_t>> got_tokens(n);
  while (batch.running() > 0) {
    for (int id : batch.step()) got_tokens[static_cast<size_t>(id)] = batch.take(id).tokens;
  }
  for (int i = 0; i < n; ++i) {
    const size_t si = static_cast<size_t>(i);
    EXPECT_EQ(got_tokens[si], want_tokens[si]) << "sequence " << i;
    EXPECT_EQ(got[si], want[si]) << "sequence " << i;
    // The replay forced the trace's routing from this sequence's own offset: decode token j of
    // sequence i took the trace's decode step i x stride + j.
    const int first = static_cast<int>(prompt_of(*model, js[si]).size());
    ASSERT_FALSE(got[si].empty());
    for (const auto& [key, experts] : got[si]) {
      const size_t step = static_cast<size_t>(i * stride + key.first - first) % decode_steps;
      EXPECT_EQ(experts, trace[1][step][static_cast<size_t>(key.second)]) << "sequence " << i << " position " << key.first;
    }
  }
  EXPECT_LT(batch.batch().distinct_experts(), batch.batch().routed_slots());
}

// A mixed step (two decode rows and a prompt chunk of m rows in one pass) splits its cost by rows:
// each decode row's record holds 1/(2 + m) of the pass's wall time and expert lookups, hits and
// bytes, the chunk (SessionBatch::last_chunk, its prompt time) the rest, so records plus chunk
// are exactly the pass's counters and at most its wall time; the batch's decode and prompt parts
// sum to every pass. Before the split, the records alone held the whole pass, and the same
// seconds counted again as the chunk's prompt time.
TEST(BatchAccounting, AMixedStepSplitsItsPassByRows) {
  auto model = open_model(test_model_path("tiny-qwen3moe", 4), true);
  const std::vector<Job> js = jobs();
  ThreadPool pool(2);
  std::vector<std::unique_ptr<Session>> sessions;
  ParallelDecode batch(*model, pool);
  for (size_t i = 0; i < 2; ++i) {
    sessions.push_back(std::make_unique<Session>(*model, pool, kCtx, 64, js[i].sampler));
    sessions.back()->prefill(prompt_of(*model, js[i]));
    batch.add(*sessions.back(), 8, params_of(js[i]));
  }
  Session reader(*model, pool, kCtx, 64, js[0].sampler);
  const std::vector<int32_t> prompt = prompt_of(*model, js[2]);
  const size_t m = 6;  // 8 rows: the 32 lookups of the tiny model's step split into whole parts
  const PromptChunk chunk{&reader, std::span<const int32_t>(prompt).first(m), static_cast<int>(prompt.size())};
  const ExpertStats first = model->experts->stats();
  batch.step();  // a plain step: the records hold the whole pass
  const ExpertStats before = model->experts->stats();
  const size_t r0 = sessions[0]->records().size(), r1 = sessions[1]->records().size();
  Stopwatch outside;
  batch.step(&chunk);
  const double outer = outside.seconds();
  const ExpertStats after = model->experts->stats();
  const PassPart& c = batch.batch().last_chunk();
  const TokenRecord& a = sessions[0]->records().at(r0);
  const TokenRecord& b = sessions[1]->records().at(r1);
  ASSERT_EQ(sessions[0]->records().size(), r0 + 1);
  EXPECT_EQ(a.batch, static_cast<int>(2 + m));
  EXPECT_EQ(c.rows, m);
  const uint64_t lookups = after.requests - before.requests;
  ASSERT_GE(lookups, 2 + m) << "too few lookups to split";
  EXPECT_LT(a.routed + b.routed, lookups) << "the decode rows took the chunk's share";
  EXPECT_EQ(a.routed + b.routed + c.lookups, lookups);
  EXPECT_EQ(a.hits + b.hits + c.hits, after.hits - before.hits);
  EXPECT_EQ(a.bytes_read + b.bytes_read + c.bytes_read, after.bytes_read - before.bytes_read);
  EXPECT_GT(after.bytes_read, before.bytes_read) << "the step read nothing (cache too large)";
  const double decode_seconds = (a.wall_ms + b.wall_ms) / 1e3;
  EXPECT_GT(c.seconds, 0.0);
  EXPECT_LE(decode_seconds + c.seconds, outer) << "the pass counted twice";
  EXPECT_NEAR(decode_seconds / (decode_seconds + c.seconds), 2.0 / static_cast<double>(2 + m), 1e-9);
  // The parts of all passes so far: the plain step's wholly the decode rows', the mixed one's split.
  const SessionBatch& sb = batch.batch();
  EXPECT_EQ(sb.decode_part().lookups + sb.prompt_part().lookups, after.requests - first.requests);
  EXPECT_EQ(sb.prompt_part().lookups, c.lookups);
  EXPECT_EQ(sb.decode_part().rows, 4u);
  EXPECT_EQ(sb.decode_part().passes, 2u);
}

// Drafting inside a batch (issue 36 on issue 32's batch): each sequence drafts for itself and
// every sequence's token + draft rows are verified in one pass per step. Four sequences on an
// attention-only family and a hybrid one (recurrent state rolled back to a row copy on a
// rejection), resident and streamed: greedy and seeded sampling with oracle drafts right about
// two times in three (kept and refused mid-run), n-gram drafts on a repetitive prompt, and one
// sequence that joins with its prompt read inside the drafting steps. Each answer equals the
// sequence's own plain run alone.
class BatchDraft : public ::testing::TestWithParam<std::tuple<std::string, bool>> {};

TEST_P(BatchDraft, EverySequenceEqualsItsPlainRunAlone) {
  const auto& [preset, stream] = GetParam();
  auto model = open_model(test_model_path(preset, 3), stream);
  std::vector<Job> js = jobs();
  for (Job& j : js) j.limit = std::min(j.limit, 32);
  std::vector<std::vector<int32_t>> want;
  for (const Job& j : js) want.push_back(alone(*model, j));
  std::vector<GenerateParams> ps;
  for (size_t i = 0; i < js.size(); ++i) {
    GenerateParams p = params_of(js[i]);
    p.draft.max_draft = 4 - static_cast<int>(i % 3);
    if (i < 2) {  // oracle drafts from the plain run's own output, some tokens made wrong
      p.draft.oracle = prompt_of(*model, js[i]);
      p.draft.oracle.insert(p.draft.oracle.end(), want[i].begin(), want[i].end());
      p.draft.oracle_accept = i == 0 ? 0.6 : 0.75;
      p.draft.oracle_seed = 3 + i;
    }
    ps.push_back(p);
  }
  ThreadPool pool(2);
  std::vector<std::unique_ptr<Session>> sessions;
  for (const Job& j : js) sessions.push_back(std::make_unique<Session>(*model, pool, kCtx, 64, j.sampler));
  ParallelDecode batch(*model, pool);
  std::vector<int> ids(js.size(), -1);
  for (size_t i = 0; i < 3; ++i) {
    sessions[i]->prefill(prompt_of(*model, js[i]));
    ids[i] = batch.add(*sessions[i], js[i].limit, ps[i]);
  }
  ChunkedJoin joining;
  std::vector<GenerateResult> got(js.size());
  int steps = 0;
  for (; batch.running() > 0 || steps < 3; ++steps) {
    if (steps == 2) joining = {sessions[3].get(), prompt_of(*model, js[3])};
    for (int id : batch.step(joining.next())) {
      for (size_t i = 0; i < ids.size(); ++i) {
        if (ids[i] == id) got[i] = batch.take(id);
      }
    }
    if (joining.read()) ids[3] = batch.add(*sessions[3], js[3].limit, ps[3]);
  }
  int64_t drafted = 0, accepted = 0, rewinds = 0;
  for (size_t i = 0; i < js.size(); ++i) {
    EXPECT_EQ(got[i].tokens, want[i]) << preset << (stream ? " streamed" : " resident") << " sequence " << i;
    drafted += got[i].drafted;
    accepted += got[i].accepted;
    rewinds += sessions[i]->state().row_state_rewinds();
  }
  EXPECT_GT(got[0].accepted, 0) << "the greedy oracle's drafts were never kept";
  EXPECT_LT(got[0].accepted, got[0].drafted) << "no greedy draft was refused: the rollback went untested";
  EXPECT_GT(got[1].accepted, 0) << "the sampled oracle's drafts were never kept";
  EXPECT_GT(drafted, accepted);
  if (model->transformer->config().delta_net.v_heads > 0) {
    EXPECT_GT(rewinds, 0) << "no rewind restored a row copy";
  }
  // Each step was one pass: the drafts rode with the other sequences' rows (and the chunk).
  const SessionBatch& b = batch.batch();
  EXPECT_LE(b.steps(), static_cast<uint64_t>(steps));
  EXPECT_LT(b.distinct_experts(), b.routed_slots());
}

INSTANTIATE_TEST_SUITE_P(Families, BatchDraft,
                         ::testing::Combine(::testing::Values("tiny-qwen3moe", "tiny-qwen35moe"),
                                            ::testing::ValuesIn(batch_weight_sources())),
                         [](const auto& info) {
                           std::string n = std::get<0>(info.param) + (std::get<1>(info.param) ? "_streamed" : "_resident");
                           for (char& ch : n) ch = std::isalnum(static_cast<unsigned char>(ch)) ? ch : '_';
                           return n;
                         });

// --mtp in a batch: each sequence's MTP head (its own cache rows, per session) reads the trunk's
// hidden rows that the batch's pass kept for it, and drafts; greedy and seeded sampling (the
// latter with the head run and its guesses replaced by the oracle's, so drafts are kept), and a
// sequence that does not draft beside them. Each equals its plain run alone, resident and
// streamed (the heads' experts read through the same cache).
TEST(BatchDraft, MtpHeadsDraftPerSequenceInsideTheBatch) {
  for (bool stream : batch_weight_sources()) {
    LoadOptions lo;
    lo.nextn = true;
    lo.stream_experts = stream;
    auto model = load_model(test_model_path("tiny-qwen35moe", 3), lo);
    if (stream) {
      StreamingOptions so;
      so.cache_bytes = 256 << 10;
      so.top_k = model->transformer->config().n_expert_used;
      attach_streaming(*model, so);
    }
    std::vector<Job> js = jobs();
    js.resize(3);
    for (Job& j : js) j.limit = 16;
    ThreadPool pool(2);
    std::vector<std::vector<int32_t>> want;
    for (const Job& j : js) want.push_back(alone(*model, j));
    ParallelDecode batch(*model, pool);
    std::vector<std::unique_ptr<Session>> sessions;
    for (size_t i = 0; i < js.size(); ++i) {
      sessions.push_back(std::make_unique<Session>(*model, pool, kCtx, 64, js[i].sampler));
      ASSERT_NE(sessions.back()->mtp_head(), nullptr);
      GenerateParams p = params_of(js[i]);
      if (i < 2) {
        p.draft.max_draft = 3;
        p.draft.mtp = true;
      }
      if (i == 1) {
        p.draft.oracle = prompt_of(*model, js[i]);
        p.draft.oracle.insert(p.draft.oracle.end(), want[i].begin(), want[i].end());
      }
      sessions.back()->prefill(prompt_of(*model, js[i]));
      batch.add(*sessions.back(), js[i].limit, p);
    }
    std::vector<GenerateResult> got(js.size());
    while (batch.running() > 0) {
      for (int id : batch.step()) got[static_cast<size_t>(id)] = batch.take(id);
    }
    for (size_t i = 0; i < js.size(); ++i) EXPECT_EQ(got[i].tokens, want[i]) << (stream ? "streamed" : "resident") << " sequence " << i;
    EXPECT_GT(got[0].drafted, 0) << "the MTP head never proposed";
    EXPECT_LT(got[0].accepted, got[0].drafted);
    EXPECT_GT(got[1].accepted, 0);
    EXPECT_GT(got[1].draft_profile.drafter.steps, 0) << "the head did not run under the oracle";
    EXPECT_EQ(got[2].drafted, 0);
  }
}

// bmoe-cli's and bmoe-server's slots (BatchSlots): three prompts on three slots, the first read
// alone, the other two in chunks inside the running answers' steps; decoding begins before the
// last prompt is read, and each answer equals its prompt's alone.
TEST(BatchSlotsTest, PromptsRideInStepsAndEachAnswerEqualsItsOwnAlone) {
  auto model = open_model(test_model_path("tiny-qwen3moe", 4), false);
  std::vector<Job> js = jobs();
  js.resize(3);
  for (Job& j : js) j.limit = 12;
  ThreadPool pool(2);
  BatchSlots slots(*model, pool, RoutingOptions{}, 3);
  std::vector<std::unique_ptr<Session>> sessions;
  for (size_t i = 0; i < js.size(); ++i) {
    sessions.push_back(std::make_unique<Session>(*model, pool, kCtx, 64, js[i].sampler));
    slots.read(static_cast<int>(i), *sessions.back(), prompt_of(*model, js[i]), 0, {js[i].limit, params_of(js[i]), {}});
  }
  std::vector<std::vector<int32_t>> got(js.size());
  int turn = 0, first_decode = 0, last_read = 0, read = 0, rode = 0;
  for (bool busy = true; busy; ++turn) {
    const BatchSlots::Turn t = slots.turn();
    ASSERT_TRUE(t.reader_error.empty() && t.step_error.empty()) << t.reader_error << t.step_error;
    rode += t.rode;
    if (t.prompt_done && ++read == 3) last_read = turn + 1;
    if (!t.decoded.empty() && first_decode == 0) first_decode = turn + 1;
    for (int s : t.ended) got[static_cast<size_t>(s)] = slots.answer(s).tokens;
    busy = false;
    for (int s = 0; s < 3; ++s) busy = busy || !slots.free(s);
  }
  EXPECT_GE(rode, 2);
  EXPECT_GT(first_decode, 0);
  EXPECT_LT(first_decode, last_read) << "every prompt was read before decoding began";
  for (size_t i = 0; i < js.size(); ++i) EXPECT_EQ(got[i], alone(*model, js[i])) << "sequence " << i;
  const BatchShare share = slots.share();
  EXPECT_EQ(share.chunk_steps, static_cast<uint64_t>(rode));
}

}  // namespace
}  // namespace bmoe
