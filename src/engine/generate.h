// The decode loop, one for every tool: samples (or drafts and verifies) up to a limit, stops at
// end-of-generation tokens or stop strings, streams complete UTF-8 pieces, reports each step and
// can be cancelled between tokens. generate() runs one completion on a Session (the prompt fed
// reusing the cached prefix, then the loop): bmoe-cli -i and bmoe-server. decode_tokens() is the
// loop alone, after a prompt the caller fed: bmoe-cli's plain run, teacher forcing included.
#pragma once

#include <atomic>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "engine/session.h"
#include "engine/session_batch.h"
#include "engine/speculative.h"
#include "text/grammar.h"

namespace bmoe {

struct GenerateParams {
  int max_tokens = 128;
  SamplerConfig sampler;
  std::vector<std::string> stop;  // the text ends before the first occurrence of any
  bool ignore_eos = false;
  bool show_special = false;
  DraftConfig draft;  // speculative decoding (greedy or sampling without penalties; else ignored)
  // >= 0: report each generated token's log-probability with this many most likely
  // alternatives (GenerateResult::logprobs); turns drafting off, whose kept tokens have no logits.
  int logprobs = -1;
  // With logprobs: report the probabilities after the sampler's chain (truncation, temperature)
  // instead of the raw logits' (llama-server's post_sampling_probs); the alternatives are the
  // candidates left with a probability above zero.
  bool post_sampling_probs = false;
  // Constrains the answer to this grammar (text/grammar.h): only tokens that keep the text a
  // prefix of a sentence are sampled, and end-of-generation tokens only once it is a whole
  // one; turns drafting off. The answer then ends at the first end token even with ignore_eos.
  std::shared_ptr<const Grammar> grammar;
  // Not empty: the grammar waits until the answer has written this text (the close tag of a
  // think block the prompt opened), so the reasoning before it is free; the tokens from the one
  // that completes it on are constrained.
  std::string grammar_after;
  // Teacher forcing (bmoe-cli --teacher-force): for the first forced.size() steps the model is
  // fed forced[i] instead of its own pick. The picks are still the answer's `tokens` (and
  // GenerateResult::forced_equal counts those equal to the reference), but they emit no text and
  // an end token among them does not stop. Turns drafting off; the caller refuses a grammar.
  std::vector<int32_t> forced;
};

// What one kind of decode step cost a drafting run, summed: its wall time, the expert lookups
// (one per distinct expert per layer and pass) and the bytes they read. The profile of where a
// drafting run's time goes (bmoe-cli prints it).
struct StepCost {
  int64_t steps = 0;
  int64_t rows = 0;  // tokens the steps' passes ran (a drafter: tokens it proposed)
  double seconds = 0;
  uint64_t lookups = 0;
  uint64_t hits = 0;  // of the lookups, those served from memory (streamed: the cache)
  uint64_t bytes_read = 0;

  StepCost& operator+=(const StepCost& part) {
    steps += part.steps;
    rows += part.rows;
    seconds += part.seconds;
    lookups += part.lookups;
    hits += part.hits;
    bytes_read += part.bytes_read;
    return *this;
  }
};

struct DraftProfile {
  StepCost plain;    // one-token steps (no draft: paused, or the drafter had no guess)
  StepCost verify;   // verification passes, the drafter's work left out
  StepCost drafter;  // the drafter's proposals (an MTP head's passes and reads)

  DraftProfile& operator+=(const DraftProfile& part) {
    plain += part.plain;
    verify += part.verify;
    drafter += part.drafter;
    return *this;
  }
};

struct GenerateResult {
  std::string text;
  std::vector<int32_t> tokens;
  int prompt_tokens = 0;
  int reused_tokens = 0;      // prompt tokens whose KV rows were kept from before
  std::string finish_reason;  // "stop" (end token or stop string), "length", "cancelled"
  std::string stop_word;      // the stop string that ended it (finish_reason "stop"), else empty
  double prefill_seconds = 0;
  double decode_seconds = 0;
  int64_t drafted = 0;       // speculative: tokens proposed
  int64_t accepted = 0;      // speculative: proposals kept
  int64_t verify_steps = 0;  // speculative: verification passes
  DraftProfile draft_profile;  // speculative: where the decode time and reads went
  int forced_steps = 0;      // teacher forcing: steps fed a reference token
  int forced_equal = 0;      // teacher forcing: of those, steps whose own pick equalled it
  std::vector<TokenLogprob> logprobs;  // one per token of `tokens` when GenerateParams::logprobs >= 0
};

// Receives each new piece of text; returning false cancels the generation.
using PieceCallback = std::function<bool(const std::string& piece)>;
// Receives each token's log-probabilities (GenerateParams::logprobs >= 0) before its text.
using LogprobCallback = std::function<void(const TokenLogprob&)>;
// Called after each decode step that fed the model its own pick (not a teacher-forced token),
// with the index of the step's first record in Session::records(): a verification pass records
// every token it kept.
using StepCallback = std::function<void(size_t first_record)>;

// What a caller of the decode loop observes, and how it stops it: `cancel` is read between tokens.
struct DecodeHooks {
  PieceCallback on_piece;
  LogprobCallback on_logprob;
  StepCallback on_step;
  const std::atomic<bool>* cancel = nullptr;
};

// Feeds `prompt` (keeping the KV rows of the prefix the session already holds), then runs the
// decode loop for up to min(max_tokens, room left in the context) tokens with params.sampler.
// Fails (bmoe::Error) on an empty prompt or one that fills the context.
// `on_prefill` (optional) sees the prompt's progress while it is read (Session::prefill_reusing),
// `on_step` (optional) each decode pass (DecodeHooks::on_step).
GenerateResult generate(Session& session, const std::vector<int32_t>& prompt, const GenerateParams& params,
                        const PieceCallback& on_piece = {}, const std::atomic<bool>* cancel = nullptr,
                        const LogprobCallback& on_logprob = {}, const PrefillProgress& on_prefill = {},
                        const StepCallback& on_step = {});

// The decode loop on a session whose prompt was fed (Session::prefill or prefill_reusing):
// up to `limit` tokens, sampled with the session's sampler (params.sampler only decides whether
// drafting is possible). The last token of the limit, and a token sampled with the context full,
// are emitted but not fed. Fills the result's tokens, text, finish reason, decode time and
// drafting and forcing counts; the prompt fields are the caller's.
GenerateResult decode_tokens(Session& session, int limit, const GenerateParams& params, const DecodeHooks& hooks = {});

// Continuous batching over sessions of one model: each sequence runs decode_tokens' loop (its own
// sampler, grammar, stop strings, limit and hooks), and every step feeds the next token of all
// running sequences in one pass (SessionBatch), so an expert several of them chose is read and
// computed once. A sequence joins between steps, its prompt fed already, and leaves at the step
// its answer ends (end token, stop string, limit, full context, cancel flag). A sequence whose
// parameters draft (drafts_with) drafts for itself, as decode_tokens would (its own drafter,
// adaptive length and pauses): its rows in a step are its token and its draft, every sequence's
// verified in the same pass, so a routed expert is read once for all of them. Each sequence's
// result equals decode_tokens' on its session alone (and, drafting being lossless, its result
// without drafting).
class ParallelDecode {
 public:
  ParallelDecode(LoadedModel& model, ThreadPool& pool);
  ~ParallelDecode();
  void set_routing_options(const RoutingOptions& options);
  // Adds a sequence whose prompt `session` was fed; returns its id (0, 1, ... in order of adding).
  int add(Session& session, int limit, GenerateParams params, DecodeHooks hooks = {});
  // One step: every running sequence emits its next token, then those that go on are fed in one
  // pass, which also reads `chunk` when given (a prompt being read, SessionBatch::accept).
  // Returns the ids of the sequences whose answers ended in this step.
  std::vector<int> step(const PromptChunk* chunk = nullptr);
  int running() const;
  // The answer of a sequence that ended (once; it is then forgotten).
  GenerateResult take(int id);
  const SessionBatch& batch() const;

 private:
  struct Sequence;
  std::unique_ptr<SessionBatch> batch_;
  std::vector<std::unique_ptr<Sequence>> sequences_;  // by id; null once taken
};

// Whether the decode loop drafts with these parameters: drafting_possible, and no log-probabilities,
// grammar or teacher forcing asked for.
bool drafts_with(const GenerateParams& params);

// A grammar as the sampler's token filter over a tokenizer's vocabulary: the decode loop samples
// through it and accepts each emitted token (end tokens are the loop's to stop at).
class GrammarFilter : public TokenFilter {
 public:
  GrammarFilter(std::shared_ptr<const Grammar> grammar, const Tokenizer& tok);
  bool allows(int32_t token) const override { return constraint_.allows(token); }
  void mask(float* logits, int n_vocab) const override { constraint_.mask(logits, n_vocab); }
  void accept(int32_t token) { constraint_.accept(token); }

 private:
  TokenConstraint constraint_;
};

// Whether speculative decoding can run with these settings (lossless needs greedy sampling).
bool drafting_possible(const DraftConfig& draft, const SamplerConfig& sampler);

// Holds back text that could be the start of a stop string; finds complete stop strings.
class StopMatcher {
 public:
  explicit StopMatcher(std::vector<std::string> stops) : stops_(std::move(stops)) {}
  // Adds text; returns what can be emitted now. Sets stopped() when a stop string completes
  // (the stop string and anything after it are dropped).
  std::string push(const std::string& text);
  std::string flush();  // what was held back, at the end
  bool stopped() const { return stopped_; }
  const std::string& matched() const { return matched_; }  // the stop string found, once stopped

 private:
  std::vector<std::string> stops_;
  std::string pending_;
  std::string matched_;
  bool stopped_ = false;
};

}  // namespace bmoe
