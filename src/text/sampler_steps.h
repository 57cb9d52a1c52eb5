// The truncation and shaping steps a sampler chain is made of (llama.cpp's samplers, as
// llama-server's request fields name them), each a function of a candidate list so the tests
// can check it against distributions worked out by hand. A list is sorted by logit, best first
// (lowest id on ties); every step keeps it so and keeps at least one candidate.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "core/rng.h"

namespace bmoe {

// One step of the chain, as llama-server's `samplers` field names them.
enum class SamplerStep { TopNSigma, TopK, Typical, TopP, MinP, Xtc, Temperature };

// Parses a step's name (llama.cpp's names and aliases: "top_k", "top-k", "topk", "typ_p",
// "typical_p", "nucleus", "temp"...) or one letter of its short form ("kyps mxt"); false if
// unknown. "penalties" and "dry" are known but are no step here: `*step` is left alone and
// `*penalty` says which (they act on the logits before any step).
bool sampler_step_named(const std::string& name, SamplerStep* step, std::string* penalty);

struct CandidateList {
  std::vector<std::pair<float, int32_t>> items;  // (logit, token), best first
  float temperature = 1.0f;  // set by the temperature step; probabilities are taken at it

  // Unnormalised weights exp((logit - best) / temperature), and their sum.
  void weights(std::vector<float>& w, double& total) const;
  // Probabilities at the temperature (they sum to 1).
  std::vector<double> probabilities() const;
  void keep_first(size_t n) { items.resize(std::max<size_t>(1, std::min(n, items.size()))); }
};

// Sorts `logits` into a list (only the best `k` when 0 < k < n_vocab: a partial sort).
void fill_candidates(CandidateList& c, const float* logits, int n_vocab, int k);

void keep_top_k(CandidateList& c, int k);
// Tokens whose probability is at least p times the best one's.
void keep_min_p(CandidateList& c, float p, int min_keep);
// The smallest head whose probability reaches p.
void keep_top_p(CandidateList& c, float p, int min_keep);
// Locally typical sampling: the tokens whose surprise is closest to the entropy, until their
// probability exceeds p.
void keep_typical(CandidateList& c, float p, int min_keep);
// Tokens whose logit is within n standard deviations of the best one (n <= 0: off).
void keep_top_n_sigma(CandidateList& c, float n);
// XTC's exclusion (once its coin came up): of the tokens at or above `threshold`, all but the
// least likely go, when there are two or more.
void exclude_top_choices(CandidateList& c, float threshold, int min_keep);
// Dynamic temperature: from t - range (at no uncertainty) to t + range (at the entropy of a
// uniform list), along normalised entropy ^ exponent.
float dynamic_temperature(const CandidateList& c, float t, float range, float exponent);

// Draws from the list at its temperature.
int32_t draw_candidate(const CandidateList& c, Rng& rng);

// Mirostat: targets a surprise of `tau` bits per token, `mu` carrying the running estimate
// (2 tau at the start of an answer). Version 1 estimates Zipf's exponent from the top `m`
// tokens to choose a top-k; version 2 keeps the tokens whose surprise is below mu. Both
// update mu by eta times the error of the token drawn.
int32_t mirostat_v1(CandidateList& c, float tau, float eta, int m, int n_vocab, float& mu, Rng& rng);
int32_t mirostat_v2(CandidateList& c, float tau, float eta, float& mu, Rng& rng);

// DRY ("don't repeat yourself"): a token that would extend a repeat of the text's end of at
// least `allowed_length` tokens loses multiplier * base ^ (length - allowed_length) from its
// logit. Repeats do not run across a breaker token. `history` is the window looked at, oldest
// first. Linear in its length (Z-algorithm on the reversed window).
void dry_penalize(const std::vector<int32_t>& history, const std::vector<int32_t>& breakers, float multiplier, float base,
                  int allowed_length, float* logits, int n_vocab);

}  // namespace bmoe
