// Token sampling: greedy by default; repetition penalties and DRY, then a chain of steps
// (text/sampler_steps.h; by default top-k, min-p, temperature and top-p, with top-n-sigma,
// typical-p and XTC where asked) or Mirostat, with a seeded generator. Also the
// log-probabilities that servers report per token.
#pragma once

#include <cstdint>
#include <unordered_map>
#include <utility>
#include <vector>

#include "core/rng.h"
#include "text/sampler_steps.h"

namespace bmoe {

struct SamplerConfig {
  float temperature = 0.0f;  // <= 0: greedy
  int top_k = 40;            // <= 0: all
  float top_p = 0.95f;       // >= 1: off
  uint64_t seed = 0xB30E;
  // Keeps the tokens whose probability is at least min_p times the most likely one's, measured
  // before the temperature as llama.cpp does (0: off).
  float min_p = 0.0f;
  // OpenAI's penalties, over the tokens generated so far in this answer:
  // logit -= presence_penalty * (count > 0) + frequency_penalty * count.
  float presence_penalty = 0.0f;
  float frequency_penalty = 0.0f;
  // llama.cpp's repetition penalty over the last repeat_last_n tokens of the sequence, prompt
  // included (-1: all of it; 0 or a penalty of 1: off): a positive logit is divided by it, a
  // negative one multiplied.
  float repeat_penalty = 1.0f;
  int repeat_last_n = 64;
  // Added to a token's logit before anything else (OpenAI's logit_bias; -infinity bans it).
  std::vector<std::pair<int32_t, float>> logit_bias;

  // llama.cpp's other samplers, off at these values (text/sampler_steps.h says what each does).
  float typical_p = 1.0f;        // >= 1: off
  float top_n_sigma = -1.0f;     // <= 0: off
  float xtc_probability = 0.0f;  // the chance that XTC acts on a step (0: off)
  float xtc_threshold = 0.1f;    // > 0.5: off
  float dynatemp_range = 0.0f;   // 0: the temperature is fixed
  float dynatemp_exponent = 1.0f;
  int min_keep = 0;              // the truncating steps keep at least this many tokens
  int mirostat = 0;              // 1 or 2: Mirostat after the temperature, instead of the chain
  float mirostat_tau = 5.0f;
  float mirostat_eta = 0.1f;
  // DRY over the last dry_penalty_last_n tokens of the sequence, prompt included (-1: all).
  float dry_multiplier = 0.0f;   // 0: off
  float dry_base = 1.75f;
  int dry_allowed_length = 2;
  int dry_penalty_last_n = -1;
  std::vector<int32_t> dry_breakers;  // tokens a repeat does not run across
  // The chain's order (llama-server's `samplers`); steps not listed do not run. Empty: the
  // default, kDefaultSamplerOrder. use_penalties/use_dry false: left out of a `samplers` list.
  std::vector<SamplerStep> order;
  bool use_penalties = true;
  bool use_dry = true;

  bool dry() const { return use_dry && dry_multiplier != 0.0f && dry_penalty_last_n != 0; }
  // Whether anything changes the raw logits before the choice.
  bool penalized() const {
    return (use_penalties && (presence_penalty != 0.0f || frequency_penalty != 0.0f ||
                              (repeat_penalty != 1.0f && repeat_last_n != 0))) ||
           !logit_bias.empty() || dry();
  }
};

// Restricts which tokens may be sampled (a grammar). allows() must agree with mask().
// top-n-sigma, top-k, typical-p, min-p, XTC, temperature, top-p: the first is how bmoe sampled
// before the others existed (top-p at the temperature), the others sit where llama.cpp has them.
extern const std::vector<SamplerStep> kDefaultSamplerOrder;

class TokenFilter {
 public:
  virtual ~TokenFilter() = default;
  virtual bool allows(int32_t token) const = 0;
  virtual void mask(float* logits, int n_vocab) const = 0;  // -infinity on every refused token
};

// A chosen token's log-probability under the raw logits (log-softmax, before any temperature or
// penalty, as OpenAI and llama-server report it) and the `top_n` most likely tokens, best first
// (lowest id on ties).
struct TokenLogprob {
  int32_t token = -1;
  float logprob = 0.0f;
  std::vector<std::pair<int32_t, float>> top;
};

class Sampler {
 public:
  explicit Sampler(SamplerConfig config) : config_(std::move(config)), rng_(config_.seed), mu_(2.0f * config_.mirostat_tau) {}
  int32_t sample(const float* logits, int n_vocab);
  // Samples among the tokens `filter` allows. The unrestricted pick is tried first and the full
  // mask is built only when the filter refuses it (llama.cpp's order: most steps of a grammar
  // cost one check). Greedy gives the best allowed token; fails when the filter allows none.
  int32_t sample(const float* logits, int n_vocab, const TokenFilter& filter);
  void reseed(uint64_t seed) { rng_ = Rng(seed); }
  // Starts an answer after `sequence` (the tokens fed so far): clears the answer's counts and
  // keeps the sequence's tail for the repetition penalty.
  void begin(const std::vector<int32_t>& sequence);
  // Records a token of the answer once it is chosen (the penalties look at it from then on).
  void accept(int32_t token);

  // Index of the largest logit (lowest index on ties).
  static int32_t argmax(const float* logits, int n_vocab);

  // The distribution the last sample() drew `token` from, after the whole chain (llama-server's
  // post_sampling_probs): the log of `token`'s probability there and the `top_n` most likely
  // candidates whose probability is above zero, best first. A greedy pick had probability 1.
  TokenLogprob last_distribution(int32_t token, int top_n) const;

 private:
  // The logits with the penalties applied (a copy; `logits` itself is left alone).
  const float* penalize(const float* logits, int n_vocab);
  int32_t draw(const float* logits, int n_vocab);
  void run_step(SamplerStep step);

  SamplerConfig config_;
  Rng rng_;
  float mu_;  // Mirostat's running target (2 tau at the start of an answer)
  bool last_greedy_ = true;  // the last sample() took the argmax (candidates_ is stale then)
  CandidateList candidates_;
  std::vector<int32_t> dry_window_;  // DRY's window of the sequence, oldest first
  std::unordered_map<int32_t, int> answer_counts_;  // tokens of this answer -> occurrences
  std::vector<int32_t> recent_;                    // the repetition penalty's window, oldest first
  std::vector<float> penalized_;
  std::vector<float> masked_;
};

// Computes a TokenLogprob from the raw logits (see above).
TokenLogprob token_logprob(const float* logits, int n_vocab, int32_t token, int top_n);

}  // namespace bmoe
