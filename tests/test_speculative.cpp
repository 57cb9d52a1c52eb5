// Speculative decoding: the drafters (n-gram, oracle, MTP over a hand-made head) and their
// factory, the adaptive controller, and the property everything rests on: verifying a draft in
// one batch gives exactly the tokens plain greedy decoding gives, for every family, resident and
// streamed.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <deque>
#include <random>

#include "core/error.h"
#include "engine/generate.h"
#include "engine/loader.h"
#include "engine/run.h"
#include "engine/speculative.h"
#include "model/nextn_head.h"
#include "test_util.h"

namespace bmoe {
namespace {

TEST(OracleDraft, ContinuesOnlyWhileTheSequenceIsItsPrefix) {
  const std::vector<int32_t> oracle = {1, 2, 3, 4, 5, 6};
  EXPECT_EQ(oracle_draft(oracle, {1, 2}, 3), (std::vector<int32_t>{3, 4, 5}));
  EXPECT_EQ(oracle_draft(oracle, {1, 2, 3, 4, 5}, 3), (std::vector<int32_t>{6}));
  EXPECT_TRUE(oracle_draft(oracle, {1, 9}, 3).empty());           // left the oracle
  EXPECT_TRUE(oracle_draft(oracle, {1, 2, 3, 4, 5, 6}, 3).empty());  // at its end
  EXPECT_TRUE(oracle_draft(oracle, {1}, 0).empty());
}

TEST(NgramDraft, ContinuesTheLatestEarlierMatchOfTheLongestSuffix) {
  // ... 5 6 7 | 9 5 6 7 | 8 ... 5 6 7 -> the latest "5 6 7" was followed by 8 1 2.
  const std::vector<int32_t> seq = {5, 6, 7, 9, 5, 6, 7, 8, 1, 2, 3, 5, 6, 7};
  EXPECT_EQ(ngram_draft(seq, 3, 4, 1), (std::vector<int32_t>{8, 1, 2}));
  EXPECT_EQ(ngram_draft(seq, 10, 4, 1), (std::vector<int32_t>{8, 1, 2, 3, 5, 6, 7}));
  EXPECT_EQ(ngram_draft(seq, 0, 4, 1), std::vector<int32_t>{});
}

TEST(NgramDraft, FallsBackToShorterSuffixesAndStopsAtTheMinimum) {
  const std::vector<int32_t> seq = {1, 2, 3, 4, 9, 3};  // only "3" recurs
  EXPECT_EQ(ngram_draft(seq, 2, 4, 1), (std::vector<int32_t>{4, 9}));
  EXPECT_TRUE(ngram_draft(seq, 2, 4, 2).empty());
  EXPECT_TRUE(ngram_draft({1, 2, 3}, 2, 4, 1).empty());
  EXPECT_TRUE(ngram_draft({}, 2, 4, 1).empty());
  EXPECT_TRUE(ngram_draft({7}, 2, 4, 1).empty());
}

TEST(Drafter, NgramAndOracleDraftersProposeWhatTheirFunctionsDo) {
  const std::vector<int32_t> seq = {5, 6, 7, 9, 5, 6, 7, 8, 1, 2, 3, 5, 6, 7};
  NgramDrafter ngram(4, 1);
  EXPECT_EQ(ngram.propose(seq, 3), (std::vector<int32_t>{8, 1, 2}));
  EXPECT_TRUE(NgramDrafter(4, 4).propose(seq, 3).empty()) << "no earlier 4-gram match";
  OracleDrafter oracle({1, 2, 3, 4, 5, 6});
  EXPECT_EQ(oracle.propose({1, 2}, 2), (std::vector<int32_t>{3, 4}));
  EXPECT_TRUE(oracle.propose({1, 9}, 2).empty());
}

// A hand-made MTP head: hands out the trunk rows the test queued, records each draft step, and
// guesses "token + 1" (token + 2 when chained on its own output), with its output marked + 100.
class FakeMtpHead : public MtpHead {
 public:
  struct Call {
    int position;
    float hidden;
    int32_t token;
  };
  std::vector<std::vector<float>> take_hidden_states() override {
    std::vector<std::vector<float>> rows(pending.begin(), pending.end());
    pending.clear();
    return rows;
  }
  MtpStep draft(int position, std::span<const float> hidden, std::span<const int32_t> tokens) override {
    for (size_t i = 0; i < tokens.size(); ++i) calls.push_back({position + static_cast<int>(i), hidden[i], tokens[i]});
    const float h = hidden.back();
    const int32_t token = tokens.back();
    MtpStep step{std::vector<float>(64, 0.0f), {h + 100.0f}};
    step.logits[static_cast<size_t>(token + (h >= 100.0f ? 2 : 1))] = 1.0f;
    return step;
  }
  std::deque<std::vector<float>> pending;
  std::vector<Call> calls;
};

bool operator==(const FakeMtpHead::Call& a, const FakeMtpHead::Call& b) {
  return a.position == b.position && a.hidden == b.hidden && a.token == b.token;
}
void PrintTo(const FakeMtpHead::Call& c, std::ostream* os) {
  *os << "{" << c.position << ", " << c.hidden << ", " << c.token << "}";
}

TEST(MtpDrafter, RunsTheHeadOverNewTrunkRowsThenChainsOnItsOwnOutput) {
  FakeMtpHead head;
  MtpDrafter drafter(head);
  // After the prompt 10 11 12 (positions 0-2), 13 is about to be fed.
  head.pending = {{0.0f}, {1.0f}, {2.0f}};
  EXPECT_EQ(drafter.propose({10, 11, 12, 13}, 3), (std::vector<int32_t>{14, 16, 18}));
  using Call = FakeMtpHead::Call;
  // Position 0 has no hidden state before it: its token is paired with zeros, as llama.cpp does.
  EXPECT_EQ(head.calls,
            (std::vector<Call>{{0, 0, 10}, {1, 0, 11}, {2, 1, 12}, {3, 2, 13}, {4, 102, 14}, {5, 202, 16}}));
  // Verification kept 14 only and 20 comes next: the trunk rows of 13 and 14 overwrite the
  // head's chained row at position 4.
  head.calls.clear();
  head.pending = {{3.0f}, {4.0f}};
  EXPECT_EQ(drafter.propose({10, 11, 12, 13, 14, 20}, 1), (std::vector<int32_t>{21}));
  EXPECT_EQ(head.calls, (std::vector<Call>{{4, 3, 14}, {5, 4, 20}}));
  // Nothing new from the trunk: no guess.
  EXPECT_TRUE(drafter.propose({10, 11, 12, 13, 14, 20}, 2).empty());
  // A pause left six trunk rows (positions 5..10): the head is caught up on the newest
  // kMtpMaxCatchUp of them only (the prompt's first catch-up was whole).
  ASSERT_EQ(kMtpMaxCatchUp, 4);
  head.calls.clear();
  head.pending = {{5.0f}, {6.0f}, {7.0f}, {8.0f}, {9.0f}, {10.0f}};
  EXPECT_EQ(drafter.propose({10, 11, 12, 13, 14, 20, 30, 31, 32, 33, 34, 35}, 1), (std::vector<int32_t>{36}));
  EXPECT_EQ(head.calls, (std::vector<Call>{{8, 7, 32}, {9, 8, 33}, {10, 9, 34}, {11, 10, 35}}));
}

TEST(MtpDrafter, RefusesMoreHiddenStatesThanPositions) {
  FakeMtpHead head;
  MtpDrafter drafter(head);
  head.pending = {{0.0f}, {1.0f}};
  EXPECT_THROW(drafter.propose({10, 11}, 2), Error);
}

TEST(MakeDrafter, ChoosesNgramOracleOrMtpAndRefusesMtpWithoutAHead) {
  DraftConfig c{4, 4, 1, {}};
  EXPECT_NE(dynamic_cast<NgramDrafter*>(make_drafter(c).get()), nullptr);
  c.oracle = {1, 2, 3};
  EXPECT_NE(dynamic_cast<OracleDrafter*>(make_drafter(c).get()), nullptr);
  c.mtp = true;
  FakeMtpHead head;
  EXPECT_NE(dynamic_cast<OracleOverMtpDrafter*>(make_drafter(c, &head).get()), nullptr);
  c.oracle.clear();
  EXPECT_NE(dynamic_cast<MtpDrafter*>(make_drafter(c, &head).get()), nullptr);
  try {
    make_drafter(c);
    FAIL() << "--mtp without a head was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("--mtp"), std::string::npos) << e.what();
  }
}

// --draft-accept: each position's oracle token stays right with the set probability, decided by
// (seed, position) alone, so a re-proposed position gets the same token.
TEST(OracleDrafter, CorruptsTokensAtTheSetRate) {
  std::vector<int32_t> oracle(20001);
  for (size_t i = 0; i < oracle.size(); ++i) oracle[i] = static_cast<int32_t>(i % 97);
  for (double accept : {0.0, 0.5, 0.7, 0.9}) {
    OracleDrafter drafter(oracle, accept, 7);
    const std::vector<int32_t> prefix(oracle.begin(), oracle.begin() + 1);
    const std::vector<int32_t> draft = drafter.propose(prefix, 20000);
    ASSERT_EQ(draft.size(), 20000u);
    int right = 0;
    for (size_t i = 0; i < draft.size(); ++i) right += draft[i] == oracle[i + 1];
    EXPECT_NEAR(right / 20000.0, accept, 0.015) << accept;
    std::vector<int32_t> again = oracle_draft(oracle, prefix, 5);
    corrupt_draft(again, 1, accept, 7);
    EXPECT_EQ(again, std::vector<int32_t>(draft.begin(), draft.begin() + 5));
  }
}

// With --mtp, --draft-oracle replaces the head's proposals but the head still runs (and is paid).
TEST(OracleOverMtpDrafter, RunsTheHeadAndProposesTheOraclesTokens) {
  FakeMtpHead head;
  DraftConfig c{4, 4, 1, {}};
  c.mtp = true;
  c.oracle = {10, 11, 12, 13, 50, 51, 52};
  const auto drafter = make_drafter(c, &head);
  head.pending = {{0.0f}, {1.0f}, {2.0f}};
  EXPECT_EQ(drafter->propose({10, 11, 12, 13}, 3), (std::vector<int32_t>{50, 51, 52}));
  EXPECT_EQ(head.calls.size(), 6u) << "the head ran over the prompt and chained twice";
}

TEST(DraftController, GrowsOnFullAcceptanceShrinksOnRejectionAndPausesWhenLow) {
  DraftController c(DraftConfig{6, 4, 1, {}});
  EXPECT_EQ(c.length(), 1) << "an untried drafter starts with the cheapest try";
  for (int want = 2; want <= 6; ++want) {
    c.report(c.length(), c.length());
    EXPECT_EQ(c.length(), want);
  }
  c.report(6, 6);
  EXPECT_EQ(c.length(), 6) << "up to --draft";
  c.report(6, 2);
  EXPECT_EQ(c.length(), 3);  // the accepted prefix plus one
  c.report(3, 3);
  EXPECT_EQ(c.length(), 4);
  int fruitless = 0;
  for (; fruitless < 30 && c.length() > 0; ++fruitless) c.report(c.length(), 0);
  EXPECT_EQ(c.length(), 0) << "low acceptance pauses drafting";
  EXPECT_GT(fruitless, 4) << "a drafter right for a long while is paused by a few misses";
  int plain = 0;
  while (c.length() == 0 && plain < 100) {
    c.report(0, 0);
    ++plain;
  }
  EXPECT_GT(plain, 1);
  EXPECT_LT(plain, 100) << "the pause runs out";
  EXPECT_GT(c.length(), 0);
  EXPECT_EQ(c.accepted_total(), 1 + 2 + 3 + 4 + 5 + 6 + 2 + 3);
}

// A drafter that is never right costs few verifications: two fruitless ones pause it at first,
// one after each pause, and the pauses double (the policy behind --mtp's cost at 0 %
// acceptance; a drafter right 70 % of the time is paused by two misses in a row only).
TEST(DraftController, AUselessDrafterIsTriedRarely) {
  DraftController c(DraftConfig{3, 4, 1, {}});
  std::vector<int> tries;  // the steps that verified a draft
  for (int step = 0; step < 200; ++step) {
    const int length = c.length();
    if (length > 0) tries.push_back(step);
    c.report(length, 0);
  }
  EXPECT_EQ(tries, (std::vector<int>{0, 1, 34, 99}));
}

// Verification judges draft tokens until the first wrong one; a drafter right 70 % of the time
// (each token kept with that chance, as --draft-accept 0.7 sets it) is paused for a small share
// of the steps (it was a third of them when the average counted every drafted token and forgot
// within three passes), while a drafter right 10 % of the time is paused for most of them.
TEST(DraftController, ADrafterThatPaysIsRarelyPaused) {
  auto paused_share = [](int percent_right) {
    int64_t paused = 0, steps = 0;
    for (uint32_t seed = 1; seed <= 20; ++seed) {
      std::mt19937 rng(seed);
      DraftController c(DraftConfig{3, 4, 1, {}});
      for (int step = 0; step < 1000;) {
        const int length = c.length();
        int kept = 0;
        while (kept < length && static_cast<int>(rng() % 100) < percent_right) ++kept;
        c.report(length, kept);
        if (length == 0) ++paused;
        step += kept + 1;
      }
      steps += 1000;
    }
    return static_cast<double>(paused) / static_cast<double>(steps);
  };
  EXPECT_LT(paused_share(70), 0.05);
  EXPECT_LT(paused_share(90), 0.02);
  EXPECT_GT(paused_share(10), 0.5);
}

// A drafter that is never right: each pause after another is twice as long, so drafting costs
// a vanishing share of the steps; a kept draft brings the short pause back.
TEST(DraftController, PausesGrowWhileNothingIsKept) {
  DraftController c(DraftConfig{4, 4, 1, {}});
  auto pause_length = [&c] {
    while (c.length() > 0) c.report(c.length(), 0);
    int plain = 0;
    for (; c.length() == 0 && plain < 10000; ++plain) c.report(0, 0);
    return plain;
  };
  const int first = pause_length();
  const int second = pause_length();
  EXPECT_EQ(second, 2 * first);
  EXPECT_EQ(pause_length(), 4 * first);
  c.report(c.length(), 1);
  EXPECT_EQ(pause_length(), first);
}

GenerateResult run(LoadedModel& model, const std::vector<int32_t>& prompt, int draft, int n = 48) {
  ThreadPool pool(2);
  Session s(model, pool, 256, 64, SamplerConfig{});
  GenerateParams p;
  p.max_tokens = n;
  p.ignore_eos = true;
  p.draft.max_draft = draft;
  return generate(s, prompt, p);
}

std::unique_ptr<LoadedModel> streamed_model(const std::string& path, uint64_t cache_bytes) {
  LoadOptions lo;
  lo.stream_experts = true;
  auto model = load_model(path, lo);
  StreamingOptions so;
  so.cache_bytes = cache_bytes;
  so.io_threads = 2;
  attach_streaming(*model, so);
  return model;
}

class SpeculativeIdentity : public ::testing::TestWithParam<std::string> {};

TEST_P(SpeculativeIdentity, DraftedOutputEqualsPlainGreedy) {
  const std::string path = test_model_path(GetParam(), 3);
  auto resident = load_model(path, LoadOptions{});
  // A repetitive prompt gives the n-gram drafter something to find.
  const std::vector<int32_t> prompt =
      resident->tokenizer->encode("1 2 3 4 1 2 3 4 1 2 3 4 a b c a b c a b c", false, false);
  const GenerateResult plain = run(*resident, prompt, 0);
  ASSERT_EQ(plain.tokens.size(), 48u);
  EXPECT_EQ(plain.drafted, 0);
  int64_t drafted = 0, accepted = 0;
  for (int draft : {1, 3, 8}) {
    const GenerateResult r = run(*resident, prompt, draft);
    EXPECT_EQ(r.tokens, plain.tokens) << GetParam() << " resident, draft " << draft;
    EXPECT_EQ(r.text, plain.text);
    drafted += r.drafted;
    accepted += r.accepted;
  }
  auto model = streamed_model(path, 1 << 20);
  const GenerateResult s = run(*model, prompt, 4);
  EXPECT_EQ(s.tokens, plain.tokens) << GetParam() << " streamed, draft 4";
  EXPECT_GT(model->experts->stats().misses, 0u);
  EXPECT_GT(drafted + s.drafted, 0) << "the n-gram drafter never proposed anything";
  EXPECT_LE(accepted, drafted);
}

INSTANTIATE_TEST_SUITE_P(Families, SpeculativeIdentity,
                         ::testing::Values("tiny-qwen3moe", "tiny-qwen2moe", "tiny-olmoe", "tiny-mixtral", "tiny-gpt-oss",
                                           "tiny-gemma4", "tiny-qwen35moe", "tiny-lfm2moe", "tiny-glm4moe",
                                           "tiny-bailingmoe3", "tiny-deepseek4"),
                         [](const auto& info) {
                           std::string n = info.param;
                           for (char& ch : n) ch = std::isalnum(static_cast<unsigned char>(ch)) ? ch : '_';
                           return n;
                         });

// A model with its MTP block bound (--mtp), resident or streamed through a cache (small by default).
std::unique_ptr<LoadedModel> mtp_model(const std::string& path, bool streamed, uint64_t cache_bytes = 1 << 20) {
  LoadOptions lo;
  lo.nextn = true;
  lo.stream_experts = streamed;
  auto model = load_model(path, lo);
  if (streamed) {
    StreamingOptions so;
    so.cache_bytes = cache_bytes;
    so.io_threads = 2;
    attach_streaming(*model, so);
  }
  return model;
}

// `records`, when given, gets the session's token records.
GenerateResult run_mtp(LoadedModel& model, const std::vector<int32_t>& prompt, int draft,
                       std::vector<TokenRecord>* records = nullptr, int64_t* row_state_rewinds = nullptr) {
  ThreadPool pool(2);
  Session s(model, pool, 256, 64, SamplerConfig{});
  EXPECT_NE(s.mtp_head(), nullptr);
  GenerateParams p;
  p.max_tokens = 48;
  p.ignore_eos = true;
  p.draft.max_draft = draft;
  p.draft.mtp = true;
  GenerateResult r = generate(s, prompt, p);
  if (records) *records = s.records();
  if (row_state_rewinds) *row_state_rewinds = s.state().row_state_rewinds();
  return r;
}

// --mtp drafts from the model's own MTP block; verification keeps only what plain greedy
// decoding gives, resident and streamed. A 3-layer qwen35moe cut ends in a Gated DeltaNet layer
// while its MTP block is gated attention, and its random-weight head is mostly wrong: drafts are
// rejected mid-run and the recurrent state is rolled back each time.
class MtpIdentity : public ::testing::TestWithParam<std::string> {};

TEST_P(MtpIdentity, MtpDraftedOutputEqualsPlainGreedy) {
  const std::string path = test_model_path(GetParam(), 3);
  auto trunk_only = load_model(path, LoadOptions{});
  const std::vector<int32_t> prompt = trunk_only->tokenizer->encode("the harbour town woke slowly", false, false);
  const GenerateResult plain = run(*trunk_only, prompt, 0);
  ASSERT_EQ(plain.tokens.size(), 48u);
  auto resident = mtp_model(path, false);
  EXPECT_EQ(run(*resident, prompt, 0).tokens, plain.tokens) << "binding the MTP block changed the trunk";
  // A hybrid trunk (qwen35moe) rolls its recurrent state back to a row copy of the pass.
  const bool hybrid = resident->transformer->config().delta_net.v_heads > 0;
  for (int draft : {1, 3}) {
    int64_t row_rewinds = 0;
    const GenerateResult r = run_mtp(*resident, prompt, draft, nullptr, &row_rewinds);
    EXPECT_EQ(r.tokens, plain.tokens) << GetParam() << " resident, draft " << draft;
    EXPECT_GT(r.drafted, 0) << "the MTP head never proposed";
    EXPECT_LT(r.accepted, r.drafted) << "no draft was rejected: the rollback went untested";
    if (hybrid) {
      EXPECT_GT(row_rewinds, 0) << "no rewind restored a row copy";
    }
  }
  auto streamed = mtp_model(path, true);
  int64_t row_rewinds = 0;
  const GenerateResult s = run_mtp(*streamed, prompt, 3, nullptr, &row_rewinds);
  EXPECT_EQ(s.tokens, plain.tokens) << GetParam() << " streamed, draft 3";
  if (hybrid) {
    EXPECT_GT(row_rewinds, 0) << "streamed: no rewind restored a row copy";
  }
  EXPECT_GT(s.drafted, 0);
  EXPECT_GT(streamed->experts->stats().misses, 0u);
}

INSTANTIATE_TEST_SUITE_P(Families, MtpIdentity, ::testing::Values("tiny-qwen35moe", "tiny-glm4moe", "tiny-deepseek4-mtp"),
                         [](const auto& info) {
                           std::string n = info.param;
                           for (char& ch : n) ch = std::isalnum(static_cast<unsigned char>(ch)) ? ch : '_';
                           return n;
                         });

// The MTP head's compute and expert reads belong to the step that drafts: the records (the run's
// tok/s and MiB per token) count them, and the profile's three kinds of step add up to them.
TEST(MtpIdentity, TheHeadsCostCountsInTheRecords) {
  auto model = mtp_model(test_model_path("tiny-qwen35moe", 3), true);
  std::vector<TokenRecord> records;
  const GenerateResult r = run_mtp(*model, model->tokenizer->encode("the harbour town woke slowly", false, false), 3, &records);
  const DraftProfile& d = r.draft_profile;
  EXPECT_GT(d.drafter.bytes_read, 0u) << "the streamed head read none of its experts";
  EXPECT_GT(d.verify.steps, 0);
  uint64_t recorded = 0;
  for (const TokenRecord& t : records) recorded += t.bytes_read;
  EXPECT_EQ(recorded, d.plain.bytes_read + d.verify.bytes_read + d.drafter.bytes_read);
  EXPECT_EQ(d.plain.steps + d.verify.steps, static_cast<int64_t>(r.tokens.size() - 1 - r.accepted));
}

// The head's experts (its block is the streamed layer n_layer) stream like the trunk's, through
// the same cache: each head pass looks its experts up (counted in the drafter's cost), and with a
// cache that holds every expert each of them is read once and found there by every later draft.
// The output stays plain greedy's.
TEST(MtpIdentity, TheHeadsExpertsGoThroughTheCache) {
  const std::string path = test_model_path("tiny-qwen35moe", 3);
  auto model = mtp_model(path, true, 32u << 20);  // holds every expert of the tiny model
  const ModelConfig& cfg = model->transformer->config();
  const auto prompt = model->tokenizer->encode("the harbour town woke slowly", false, false);
  const GenerateResult r = run_mtp(*model, prompt, 3);
  const StepCost& head = r.draft_profile.drafter;
  ASSERT_GT(head.lookups, static_cast<uint64_t>(cfg.n_expert)) << "too few head lookups to tell";
  EXPECT_GT(head.hits, 0u) << "no draft found the head's experts in the cache";
  EXPECT_LE(head.lookups - head.hits, static_cast<uint64_t>(cfg.n_expert)) << "a head expert was read twice";
  const std::vector<ExpertKey> cached = model->streamer()->cache().residents();
  const auto in_head = [&](ExpertKey k) { return key_layer(k) == cfg.n_layer; };
  EXPECT_TRUE(std::any_of(cached.begin(), cached.end(), in_head)) << "the cache holds none of the head's experts";
  EXPECT_FALSE(std::all_of(cached.begin(), cached.end(), in_head)) << "the cache holds none of the trunk's experts";
  auto trunk_only = load_model(path, LoadOptions{});
  EXPECT_EQ(r.tokens, run(*trunk_only, prompt, 0).tokens);
}

// The memory a drafting run reserves (the mode choice's and the automatic cache budget's figure)
// holds what its sessions allocate besides the trunk's KV and state: per draft token a copy of
// the hybrid trunk's recurrent state (a verification pass keeps one per row but the last, up to
// kMaxRowStates) and the MTP head's own KV rows; a run that does not draft keeps no copies.
TEST(MtpMemory, ThePlannersFigureHoldsTheRowCopiesAndTheHead) {
  RunConfig c;
  c.model = test_model_path("tiny-qwen35moe", 3);
  c.ctx_size = 256;
  c.moe_mode = MoeMode::Resident;
  c.mtp = true;
  c.draft = 3;
  LoadedRun run = load_run(c);
  const ModelConfig& cfg = run.model->transformer->config();
  const uint64_t state = static_cast<uint64_t>(cfg.recurrent_state_bytes());
  ASSERT_GT(state, 0u) << "a hybrid trunk";
  const ContextMemory planned = context_memory(run.config, cfg);
  EXPECT_EQ(planned.row_copies, 3 * state);
  ThreadPool pool(2);
  NextnHead head(*run.model->transformer, pool, c.ctx_size);
  EXPECT_EQ(planned.mtp_head, head.kv_bytes()) << "the head's KV rows at the run's context";
  const std::unique_ptr<Session> session = open_session(run, pool);
  GenerateParams p;
  p.max_tokens = 48;
  p.ignore_eos = true;
  p.draft = draft_config(run);
  const GenerateResult r = generate(*session, run.model->tokenizer->encode("the harbour town woke slowly", false, false), p);
  ASSERT_GT(r.drafted, r.accepted) << "no rejected draft";
  const InferenceState& st = session->state();
  EXPECT_GT(st.row_state_bytes(), 0u) << "no verification pass kept a copy";
  EXPECT_LE(st.row_state_bytes(), planned.row_copies);
  EXPECT_EQ(st.kv_bytes(), planned.kv);
  EXPECT_EQ(2 * st.recurrent_bytes(), planned.recurrent);
  // A pass keeps a copy per row but the last up to the session's limit, none beyond it.
  InferenceState limited(*run.model->transformer, pool, c.ctx_size);
  limited.set_row_state_limit(row_state_copies(run.config));
  const std::vector<int32_t> rows = {5, 9, 13, 17, 21, 25, 29, 33, 37};
  limited.eval(rows.data(), 5);  // 5 rows: 4 copies would pass the limit
  EXPECT_EQ(limited.row_state_bytes(), 0u);
  limited.eval(rows.data() + 5, 4);
  EXPECT_EQ(limited.row_state_bytes(), planned.row_copies) << "a 4-row pass keeps 3 copies";
  // deepseek4's head holds no KV rows but its window ring, which the plan counts with its copy.
  LoadOptions nextn;
  nextn.nextn = true;
  auto ds4 = load_model(test_model_path("tiny-deepseek4-mtp"), nextn);
  NextnHead ring(*ds4->transformer, pool, c.ctx_size);
  EXPECT_GT(ring.recurrent_bytes(), 0u);
  EXPECT_GE(context_memory(c, ds4->transformer->config()).mtp_head, ring.kv_bytes() + 2 * ring.recurrent_bytes());
  // deepseek4's rings keep no per-row copies (a rewind of a few rows needs none): none planned.
  EXPECT_EQ(context_memory(c, load_model(test_model_path("tiny-deepseek4"), LoadOptions{})->transformer->config()).row_copies, 0u);
  // Longer drafts keep copies up to the limit; no drafting, none (and none are planned).
  c.draft = 12;
  EXPECT_EQ(context_memory(c, cfg).row_copies, InferenceState::kMaxRowStates * state);
  c.draft = 0;
  c.mtp = false;
  const ContextMemory plain = context_memory(c, cfg);
  EXPECT_EQ(plain.row_copies + plain.mtp_head, 0u);
  EXPECT_EQ(plain.total() + planned.row_copies + planned.mtp_head, planned.total());
  run.config = c;
  const std::unique_ptr<Session> undrafted = open_session(run, pool);
  p.draft = DraftConfig{};
  generate(*undrafted, run.model->tokenizer->encode("the harbour town woke slowly", false, false), p);
  EXPECT_EQ(undrafted->state().row_state_bytes(), 0u) << "the short prompt kept copies nobody planned";
}

// A drafted batch step feeds every sequence's token and drafts (--parallel x (1 + --draft)
// rows), so one layer's visit may route to top-k experts per row: the streaming store keeps
// buffers for all of them (at most the layer's experts) rather than for the plain step's.
TEST(DraftMemory, AWideStepsVisitKeepsBuffersForEveryRow) {
  auto reserved = [](int draft) {
    RunConfig c;
    c.model = test_model_path("tiny-qwen3moe");
    c.ctx_size = 256;
    c.moe_mode = MoeMode::Stream;
    c.cache_bytes = 0;
    c.parallel = 2;
    c.draft = draft;
    c.ngram = draft > 0;
    LoadedRun run = load_run(c);
    const ModelConfig& cfg = run.model->transformer->config();
    EXPECT_EQ(step_rows(c), 2 * (1 + draft));
    EXPECT_EQ(visit_experts(c, cfg), std::min(cfg.n_expert, cfg.n_expert_used * step_rows(c)));
    // A prompt chunk routes top-k experts per row: on the tiny model every expert of a layer.
    EXPECT_EQ(widest_visit_experts(c, cfg), cfg.n_expert);
    RunConfig one_row_chunks = c;
    one_row_chunks.batch_size = 1;
    EXPECT_EQ(widest_visit_experts(one_row_chunks, cfg), visit_experts(c, cfg));
    return std::pair{visit_experts(c, cfg), run.model->streamer()->buffer_pool().reserved_bytes()};
  };
  const auto [plain_visit, plain_bytes] = reserved(0);
  const auto [drafted_visit, drafted_bytes] = reserved(3);
  ASSERT_GT(drafted_visit, plain_visit) << "the tiny model's experts must exceed a plain step's";
  EXPECT_GT(drafted_bytes, plain_bytes);
  // With no cache every reserved buffer is a visit's, all of one size here.
  EXPECT_EQ((drafted_bytes - plain_bytes) % static_cast<uint64_t>(drafted_visit - plain_visit), 0u);
}

// Routing forced by position (as --route-replay forces a trace's) stays forced when a rejected
// draft rewinds a hybrid model's recurrent state and replays the kept rows: drafted output
// equals plain decoding under the same routing.
TEST(Speculative, ForcedRoutingHoldsThroughARecurrentRewind) {
  auto model = load_model(test_model_path("tiny-qwen35moe", 3), LoadOptions{});
  const auto force = [](RouteEvent& e) {
    const int a = 7 * e.position + e.layer;
    for (size_t i = 0; i < e.experts->size(); ++i) (*e.experts)[i] = (a + static_cast<int>(i)) % e.n_expert;
  };
  const std::vector<int32_t> prompt = model->tokenizer->encode("x y z x y z x y z x y z", false, false);
  auto run = [&](const DraftConfig& draft) {
    ThreadPool pool(2);
    Session s(*model, pool, 256, 64, SamplerConfig{});
    s.state().set_route_hook(force);
    GenerateParams p;
    p.max_tokens = 48;
    p.ignore_eos = true;
    p.draft = draft;
    return generate(s, prompt, p);
  };
  const GenerateResult plain = run(DraftConfig{});
  // The plain run's own tokens, each right with probability 0.6: drafts kept and rejected.
  DraftConfig oracle;
  oracle.max_draft = 3;
  oracle.oracle = prompt;
  oracle.oracle.insert(oracle.oracle.end(), plain.tokens.begin(), plain.tokens.end());
  oracle.oracle_accept = 0.6;
  const GenerateResult drafted = run(oracle);
  EXPECT_EQ(drafted.tokens, plain.tokens);
  EXPECT_GT(drafted.accepted, 0);
  EXPECT_GT(drafted.drafted, drafted.accepted) << "no rejection: no rewind was replayed";
}

// The head's rows are its own KV state: a batch equals the same rows one at a time, bit for bit,
// and running again from an earlier position (after other rows were written there) gives what
// the first run gave, so the head rewinds exactly with the trunk.
TEST(NextnHead, RowsDoNotDependOnTheBatchAndRewindExactly) {
  for (const char* preset : {"tiny-qwen35moe", "tiny-deepseek4-mtp"}) {
    auto model = mtp_model(test_model_path(preset, 3), false);
    ASSERT_TRUE(has_nextn_head(*model->transformer)) << preset;
    ThreadPool pool(2);
    NextnHead batched(*model->transformer, pool, 64), single(*model->transformer, pool, 64);
    const size_t W = static_cast<size_t>(batched.hidden_width());  // deepseek4: its 4 streams
    std::vector<float> hidden(6 * W);
    for (size_t i = 0; i < hidden.size(); ++i) hidden[i] = std::sin(0.37f * static_cast<float>(i));
    const std::vector<int32_t> tokens = {5, 9, 13, 17, 21, 25};
    batched.forward(0, hidden, tokens);
    const std::vector<float> want = batched.logits(), want_hidden = batched.hidden();
    ASSERT_EQ(want_hidden.size(), W) << preset << ": a chained guess reads what the head writes";
    for (int i = 0; i < 6; ++i) {
      single.forward(i, std::span<const float>(hidden).subspan(i * W, W), std::span<const int32_t>(tokens).subspan(i, 1));
    }
    EXPECT_EQ(single.logits(), want) << preset;
    EXPECT_EQ(single.hidden(), want_hidden) << preset;
    // Other rows at positions 3..5, then the true ones again from 3.
    const std::vector<int32_t> other = {40, 41, 42};
    single.forward(3, std::span<const float>(hidden).subspan(0, 3 * W), other);
    EXPECT_NE(single.logits(), want) << preset;
    single.forward(3, std::span<const float>(hidden).subspan(3 * W), std::span<const int32_t>(tokens).subspan(3));
    EXPECT_EQ(single.logits(), want) << preset;
    EXPECT_THROW(single.forward(8, std::span<const float>(hidden).subspan(0, W), std::span<const int32_t>(tokens).subspan(0, 1)),
                 Error)
        << "a position past the head's rows";
  }
}

// Drafts are both kept and rejected somewhere in the suite's runs (so both paths of the
// verification, including the KV truncation, are exercised), and per-token records add up.
TEST(Speculative, AcceptsAndRejectsAndRecordsEveryToken) {
  auto model = load_model(test_model_path("tiny-qwen3moe", 3), LoadOptions{});
  ThreadPool pool(2);
  Session s(*model, pool, 512, 64, SamplerConfig{});
  GenerateParams p;
  p.max_tokens = 120;
  p.ignore_eos = true;
  p.draft.max_draft = 6;
  const std::vector<int32_t> prompt = model->tokenizer->encode("x y z x y z x y z x y z", false, false);
  const GenerateResult r = generate(s, prompt, p);
  EXPECT_GT(r.accepted, 0);
  EXPECT_GT(r.drafted, r.accepted);
  // Every generated token but the last was fed, each with its record.
  EXPECT_EQ(s.records().size(), r.tokens.size() - 1);
  EXPECT_EQ(s.history().size(), prompt.size() + r.tokens.size() - 1);
  bool batched = false;
  for (const TokenRecord& t : s.records()) batched |= t.batch > 1;
  EXPECT_TRUE(batched);
}

// The oracle drafter through the decode loop: drafts from an earlier greedy run are all right,
// so every one is kept and the output is that run's. --mtp has no drafter to run.
TEST(Speculative, OracleDraftsAreAllKeptAndMtpIsRefused) {
  auto model = load_model(test_model_path("tiny-qwen3moe", 3), LoadOptions{});
  const std::vector<int32_t> prompt = model->tokenizer->encode("the harbour town woke slowly", false, false);
  const GenerateResult plain = run(*model, prompt, 0, 32);
  ThreadPool pool(2);
  Session s(*model, pool, 256, 64, SamplerConfig{});
  GenerateParams p;
  p.max_tokens = 32;
  p.ignore_eos = true;
  p.draft.max_draft = 4;
  p.draft.oracle = prompt;
  p.draft.oracle.insert(p.draft.oracle.end(), plain.tokens.begin(), plain.tokens.end());
  const GenerateResult r = generate(s, prompt, p);
  EXPECT_EQ(r.tokens, plain.tokens);
  EXPECT_GT(r.drafted, 0);
  EXPECT_EQ(r.accepted, r.drafted);
  EXPECT_LT(r.verify_steps, 32 / 2) << "right drafts need few verification passes";
  p.draft.oracle.clear();
  p.draft.mtp = true;
  EXPECT_THROW(generate(s, prompt, p), Error);
}

TEST(Speculative, PenaltiesTurnDraftingOffSamplingDoesNot) {
  SamplerConfig sampled;
  sampled.temperature = 0.7f;
  EXPECT_TRUE(drafting_possible(DraftConfig{4, 4, 1, {}}, sampled));
  sampled.presence_penalty = 0.5f;
  EXPECT_FALSE(drafting_possible(DraftConfig{4, 4, 1, {}}, sampled));
  EXPECT_TRUE(drafting_possible(DraftConfig{4, 4, 1, {}}, SamplerConfig{}));
  EXPECT_FALSE(drafting_possible(DraftConfig{0, 4, 1, {}}, SamplerConfig{}));
}

// Runs a seeded sampled generation of MAX_TOKENS from PROMPT with DRAFT, ignoring EOS.
GenerateResult sample_with_drafts(LoadedModel& model, const std::vector<int32_t>& prompt, uint64_t seed,
                                  int max_tokens, const DraftConfig& draft) {
  SamplerConfig sampler;
  sampler.temperature = 0.9f;
  sampler.seed = seed;
  ThreadPool pool(2);
  Session s(model, pool, 256, 64, sampler);
  GenerateParams p;
  p.sampler = sampler;
  p.max_tokens = max_tokens;
  p.ignore_eos = true;
  p.draft = draft;
  return generate(s, prompt, p);
}

// Seeded sampling prints the same tokens with and without drafts: a verification draws from each
// row in order, as one token at a time would, keeping a draft token only when it is the draw.
// The oracle (the plain run's own output) has every draft kept; the MTP head on the hybrid
// qwen35moe cut has them refused at once, its draw then the next token.
TEST(Speculative, SeededSamplingIsTheSameWithDrafts) {
  const std::string path = test_model_path("tiny-qwen35moe", 3);
  auto model = mtp_model(path, false);
  const std::vector<int32_t> prompt = model->tokenizer->encode("the harbour town woke slowly", false, false);
  auto sample = [&](const DraftConfig& draft) { return sample_with_drafts(*model, prompt, 1234, 40, draft); };
  const GenerateResult plain = sample(DraftConfig{});
  DraftConfig oracle{4, 4, 1, {}};
  oracle.oracle = prompt;
  oracle.oracle.insert(oracle.oracle.end(), plain.tokens.begin(), plain.tokens.end());
  const GenerateResult o = sample(oracle);
  EXPECT_EQ(o.tokens, plain.tokens);
  EXPECT_GT(o.accepted, 0);
  oracle.oracle.back() ^= 1;  // the last draft token wrong: refused, the draw kept
  EXPECT_EQ(sample(oracle).tokens, plain.tokens);
  DraftConfig mtp{3, 4, 1, {}};
  mtp.mtp = true;
  const GenerateResult m = sample(mtp);
  EXPECT_EQ(m.tokens, plain.tokens);
  EXPECT_GT(m.drafted, m.accepted);
}

// The same on deepseek4, whose head takes the trunk's hyper-connection streams: seeded sampling
// prints the same tokens with and without --mtp.
TEST(Speculative, SeededSamplingIsTheSameWithMtpDraftsOnDeepSeek4) {
  auto model = mtp_model(test_model_path("tiny-deepseek4-mtp", 3), false);
  const std::vector<int32_t> prompt = model->tokenizer->encode("the harbour town woke slowly", false, false);
  auto sample = [&](const DraftConfig& draft) { return sample_with_drafts(*model, prompt, 99, 32, draft); };
  const GenerateResult plain = sample(DraftConfig{});
  DraftConfig mtp{3, 4, 1, {}};
  mtp.mtp = true;
  const GenerateResult m = sample(mtp);
  EXPECT_EQ(m.tokens, plain.tokens);
  EXPECT_GT(m.drafted, 0) << "the head never proposed";
}

}  // namespace
}  // namespace bmoe
