// Token sampling: greedy by default; repetition penalties, then top-k, min-p, temperature and
// top-p with a seeded generator. Also the log-probabilities that servers report per token.
#pragma once

#include <cstdint>
#include <unordered_map>
#include <utility>
#include <vector>

#include "core/rng.h"

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

  // Whether anything changes the raw logits before the choice.
  bool penalized() const {
    return presence_penalty != 0.0f || frequency_penalty != 0.0f || (repeat_penalty != 1.0f && repeat_last_n != 0) ||
           !logit_bias.empty();
  }
};

// Restricts which tokens may be sampled (a grammar). allows() must agree with mask().
class TokenFilter {
 public:
  virtual ~TokenFilter() = default;
  virtual bool allows(int32_t token) const = 0;
  virtual void mask(float* logits, int n_vocab) const = 0;  // -infinity on every refused token
};

class Sampler {
 public:
  explicit Sampler(SamplerConfig config) : config_(config), rng_(config.seed) {}
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

 private:
  // The logits with the penalties applied (a copy; `logits` itself is left alone).
  const float* penalize(const float* logits, int n_vocab);
  int32_t draw(const float* logits, int n_vocab);

  SamplerConfig config_;
  Rng rng_;
  std::vector<std::pair<float, int32_t>> candidates_;
  std::unordered_map<int32_t, int> answer_counts_;  // tokens of this answer -> occurrences
  std::vector<int32_t> recent_;                    // the repetition penalty's window, oldest first
  std::vector<float> penalized_;
  std::vector<float> masked_;
};

// A chosen token's log-probability under the raw logits (log-softmax, before any temperature or
// penalty, as OpenAI and llama-server report it) and the `top_n` most likely tokens, best first
// (lowest id on ties).
struct TokenLogprob {
  int32_t token = -1;
  float logprob = 0.0f;
  std::vector<std::pair<int32_t, float>> top;
};
TokenLogprob token_logprob(const float* logits, int n_vocab, int32_t token, int top_n);

}  // namespace bmoe
