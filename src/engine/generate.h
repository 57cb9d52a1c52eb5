// One completion on a Session: reuses the cached prefix of the prompt, samples up to a limit,
// stops at end-of-generation tokens or stop strings, streams complete UTF-8 pieces and can be
// cancelled between tokens. Shared by bmoe-cli -i and bmoe-server.
#pragma once

#include <atomic>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "engine/session.h"
#include "engine/speculative.h"
#include "text/grammar.h"

namespace bmoe {

struct GenerateParams {
  int max_tokens = 128;
  SamplerConfig sampler;
  std::vector<std::string> stop;  // the text ends before the first occurrence of any
  bool ignore_eos = false;
  bool show_special = false;
  DraftConfig draft;  // speculative decoding (greedy sampling only; ignored otherwise)
  // >= 0: report each generated token's log-probability with this many most likely
  // alternatives (GenerateResult::logprobs); turns drafting off, whose kept tokens have no logits.
  int logprobs = -1;
  // Constrains the answer to this grammar (text/grammar.h): only tokens that keep the text a
  // prefix of a sentence are sampled, and end-of-generation tokens only once it is a whole
  // one; turns drafting off. The answer then ends at the first end token even with ignore_eos.
  std::shared_ptr<const Grammar> grammar;
};

struct GenerateResult {
  std::string text;
  std::vector<int32_t> tokens;
  int prompt_tokens = 0;
  int reused_tokens = 0;      // prompt tokens whose KV rows were kept from before
  std::string finish_reason;  // "stop" (end token or stop string), "length", "cancelled"
  double prefill_seconds = 0;
  double decode_seconds = 0;
  int64_t drafted = 0;   // speculative: tokens proposed
  int64_t accepted = 0;  // speculative: proposals kept
  std::vector<TokenLogprob> logprobs;  // one per token of `tokens` when GenerateParams::logprobs >= 0
};

// Receives each new piece of text; returning false cancels the generation.
using PieceCallback = std::function<bool(const std::string& piece)>;
// Receives each token's log-probabilities (GenerateParams::logprobs >= 0) before its text.
using LogprobCallback = std::function<void(const TokenLogprob&)>;

GenerateResult generate(Session& session, const std::vector<int32_t>& prompt, const GenerateParams& params,
                        const PieceCallback& on_piece = {}, const std::atomic<bool>* cancel = nullptr,
                        const LogprobCallback& on_logprob = {});

// Feeds `token` (just emitted) so that the next one can be sampled. With a draft controller
// that wants a draft, also proposes and verifies up to `budget` draft tokens; returns the kept
// ones, already fed, to be emitted in order before sampling again.
std::vector<int32_t> feed_token(Session& session, int32_t token, DraftController* drafts, int budget);

// The token source of a decode loop, drafting or not: the tokens of a kept draft were fed by
// the verification pass and come out first, then the session samples again.
class DecodeCursor {
 public:
  DecodeCursor(Session& session, DraftController* drafts, const TokenFilter* filter = nullptr)
      : session_(session), drafts_(drafts), filter_(filter) {}
  // The next token; `fed` says whether the model has seen it already (a kept draft token).
  int32_t next(bool& fed);
  // Feeds `token` so that the next one can be sampled (see feed_token).
  void feed(int32_t token, int budget);

 private:
  Session& session_;
  DraftController* drafts_;
  const TokenFilter* filter_;  // what sampled tokens must pass (a grammar), or nullptr
  std::vector<int32_t> known_;
  size_t next_known_ = 0;
};

// A grammar as the sampler's token filter over a tokenizer's vocabulary: the decode loop passes
// it to DecodeCursor and accepts each emitted token (end tokens are the loop's to stop at).
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

 private:
  std::vector<std::string> stops_;
  std::string pending_;
  bool stopped_ = false;
};

}  // namespace bmoe
