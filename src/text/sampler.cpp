#include "text/sampler.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "core/error.h"

namespace bmoe {

// The first index holding the largest logit; NaNs never win, except a NaN at index 0, which
// nothing beats (as in a left-to-right `>` scan). Two passes instead of that scan: its index
// chain is serial (about a millisecond per token over a 248k vocabulary, on the decode's one
// thread), while a max over independent lanes vectorizes; the first index equal to that max is
// exactly the scan's answer, since the scan only moves on a strictly greater value.
int32_t Sampler::argmax(const float* logits, int n_vocab) {
  if (n_vocab <= 0 || std::isnan(logits[0])) return 0;
  constexpr int kLanes = 16;
  float lane[kLanes];
  std::fill(lane, lane + kLanes, logits[0]);
  int32_t i = 0;
  for (; i + kLanes <= n_vocab; i += kLanes) {
    for (int l = 0; l < kLanes; ++l) lane[l] = logits[i + l] > lane[l] ? logits[i + l] : lane[l];
  }
  float best = lane[0];
  for (int l = 1; l < kLanes; ++l) best = lane[l] > best ? lane[l] : best;
  for (; i < n_vocab; ++i) best = logits[i] > best ? logits[i] : best;
  int32_t first = 0;
  while (!(logits[first] == best)) ++first;
  return first;
}

const std::vector<SamplerStep> kDefaultSamplerOrder = {SamplerStep::TopNSigma, SamplerStep::TopK, SamplerStep::Typical,
                                                       SamplerStep::MinP, SamplerStep::Xtc, SamplerStep::Temperature,
                                                       SamplerStep::TopP};

namespace {
// The last `n` tokens of `sequence` (n < 0: all of it).
std::vector<int32_t> tail_of(const std::vector<int32_t>& sequence, int n) {
  const size_t k = n < 0 ? sequence.size() : std::min(sequence.size(), static_cast<size_t>(n));
  return std::vector<int32_t>(sequence.end() - static_cast<std::ptrdiff_t>(k), sequence.end());
}

void push_bounded(std::vector<int32_t>& window, int32_t token, int limit) {
  window.push_back(token);
  if (limit > 0 && window.size() > static_cast<size_t>(limit)) window.erase(window.begin());
}
}  // namespace

void Sampler::begin(const std::vector<int32_t>& sequence) {
  answer_counts_.clear();
  recent_ = tail_of(sequence, config_.repeat_last_n);
  if (config_.dry()) dry_window_ = tail_of(sequence, config_.dry_penalty_last_n);
  mu_ = 2.0f * config_.mirostat_tau;
}

void Sampler::accept(int32_t token) {
  if (!config_.penalized()) return;  // nothing reads them: keep the plain paths free of bookkeeping
  ++answer_counts_[token];
  if (config_.dry()) push_bounded(dry_window_, token, config_.dry_penalty_last_n);
  if (config_.repeat_last_n == 0) return;
  push_bounded(recent_, token, config_.repeat_last_n);
}

const float* Sampler::penalize(const float* logits, int n_vocab) {
  penalized_.assign(logits, logits + n_vocab);
  auto in_vocab = [n_vocab](int32_t t) { return t >= 0 && t < n_vocab; };
  for (const auto& [t, bias] : config_.logit_bias) {
    if (in_vocab(t)) penalized_[static_cast<size_t>(t)] += bias;
  }
  if (config_.dry()) {
    dry_penalize(dry_window_, config_.dry_breakers, config_.dry_multiplier, config_.dry_base, config_.dry_allowed_length,
                 penalized_.data(), n_vocab);
  }
  if (!config_.use_penalties) return penalized_.data();
  if (config_.repeat_penalty != 1.0f) {
    // Each token in the window once, however often it occurs (as llama.cpp).
    std::vector<int32_t> seen(recent_);
    std::sort(seen.begin(), seen.end());
    seen.erase(std::unique(seen.begin(), seen.end()), seen.end());
    for (int32_t t : seen) {
      if (!in_vocab(t)) continue;
      float& l = penalized_[static_cast<size_t>(t)];
      l = l > 0.0f ? l / config_.repeat_penalty : l * config_.repeat_penalty;
    }
  }
  for (const auto& [t, count] : answer_counts_) {
    if (!in_vocab(t)) continue;
    penalized_[static_cast<size_t>(t)] -= config_.presence_penalty + config_.frequency_penalty * static_cast<float>(count);
  }
  return penalized_.data();
}

int32_t Sampler::sample(const float* logits, int n_vocab) {
  // Neutral penalties leave the logits untouched, so greedy stays a plain argmax.
  if (config_.penalized()) logits = penalize(logits, n_vocab);
  if (!config_.logit_bias.empty() && !std::isfinite(*std::max_element(logits, logits + n_vocab))) {
    fail("logit_bias bans every token");
  }
  last_greedy_ = config_.temperature <= 0.0f;
  if (last_greedy_) return argmax(logits, n_vocab);
  return draw(logits, n_vocab);
}

TokenLogprob Sampler::last_distribution(int32_t token, int top_n) const {
  TokenLogprob out;
  out.token = token;
  if (last_greedy_) {
    // llama.cpp's temperature 0 leaves the best token alone at probability 1 (log 1 = 0).
    if (top_n > 0) out.top.emplace_back(token, 0.0f);
    return out;
  }
  // The candidates are sorted by logit, so by probability too: the head is the top.
  const std::vector<double> p = candidates_.probabilities();
  out.logprob = -std::numeric_limits<float>::infinity();
  for (size_t i = 0; i < p.size(); ++i) {
    const float lp = p[i] > 0.0 ? static_cast<float>(std::log(p[i])) : -std::numeric_limits<float>::infinity();
    if (candidates_.items[i].second == token) out.logprob = lp;
    if (static_cast<int>(out.top.size()) < top_n && p[i] > 0.0) out.top.emplace_back(candidates_.items[i].second, lp);
  }
  return out;
}


int32_t Sampler::sample(const float* logits, int n_vocab, const TokenFilter& filter) {
  const float mu = mu_;  // a refused pick must not move Mirostat's target
  const int32_t first = sample(logits, n_vocab);
  if (filter.allows(first)) return first;
  mu_ = mu;
  masked_.assign(logits, logits + n_vocab);
  filter.mask(masked_.data(), n_vocab);
  if (std::none_of(masked_.begin(), masked_.end(), [](float l) { return std::isfinite(l); })) {
    fail("the grammar allows no token here");
  }
  return sample(masked_.data(), n_vocab);
}

void Sampler::run_step(SamplerStep step) {
  CandidateList& c = candidates_;
  const SamplerConfig& k = config_;
  switch (step) {
    case SamplerStep::TopNSigma: return keep_top_n_sigma(c, k.top_n_sigma);
    case SamplerStep::TopK: return keep_top_k(c, k.top_k);
    case SamplerStep::Typical: return keep_typical(c, k.typical_p, k.min_keep);
    case SamplerStep::TopP: return keep_top_p(c, k.top_p, k.min_keep);
    case SamplerStep::MinP: return keep_min_p(c, k.min_p, k.min_keep);
    case SamplerStep::Xtc:
      // The coin is thrown only where XTC can act, so other settings keep their draws.
      if (k.xtc_probability > 0.0f && k.xtc_threshold <= 0.5f && rng_.uniform() < k.xtc_probability) {
        exclude_top_choices(c, k.xtc_threshold, k.min_keep);
      }
      return;
    case SamplerStep::Temperature:
      c.temperature = dynamic_temperature(c, k.temperature, k.dynatemp_range, k.dynatemp_exponent);
      // A dynamic temperature can reach 0: the best token then.
      if (c.temperature <= 0.0f) {
        c.keep_first(1);
        c.temperature = 1.0f;
      }
      return;
  }
}

int32_t Sampler::draw(const float* logits, int n_vocab) {
  const std::vector<SamplerStep>& order = config_.order.empty() ? kDefaultSamplerOrder : config_.order;
  candidates_.temperature = 1.0f;
  if (config_.mirostat != 0) {
    fill_candidates(candidates_, logits, n_vocab, 0);
    candidates_.temperature = config_.temperature;
    return config_.mirostat == 1
               ? mirostat_v1(candidates_, config_.mirostat_tau, config_.mirostat_eta, 100, n_vocab, mu_, rng_)
               : mirostat_v2(candidates_, config_.mirostat_tau, config_.mirostat_eta, mu_, rng_);
  }
  // Top-k as the first step that acts needs only a partial sort (the default: top-n-sigma off).
  const auto first = std::find_if(order.begin(), order.end(), [&](SamplerStep s) {
    return s != SamplerStep::TopNSigma || config_.top_n_sigma > 0.0f;
  });
  fill_candidates(candidates_, logits, n_vocab, first != order.end() && *first == SamplerStep::TopK ? config_.top_k : 0);
  for (SamplerStep step : order) run_step(step);
  return draw_candidate(candidates_, rng_);
}

TokenLogprob token_logprob(const float* logits, int n_vocab, int32_t token, int top_n) {
  // log p_i = l_i - (max + log sum exp(l - max)); the sum in double for large vocabularies.
  float max = logits[0];
  for (int i = 1; i < n_vocab; ++i) max = std::max(max, logits[i]);
  double sum = 0.0;
  for (int i = 0; i < n_vocab; ++i) sum += std::exp(static_cast<double>(logits[i] - max));
  const double log_z = static_cast<double>(max) + std::log(sum);
  auto logprob = [&](int32_t i) { return static_cast<float>(static_cast<double>(logits[i]) - log_z); };
  TokenLogprob out;
  out.token = token;
  out.logprob = logprob(token);
  const size_t n = static_cast<size_t>(std::clamp(top_n, 0, n_vocab));
  if (n == 0) return out;
  // A min-heap of the best n seen so far: one pass over the vocabulary, O(V log n).
  const auto better = [&](int32_t a, int32_t b) { return logits[a] > logits[b] || (logits[a] == logits[b] && a < b); };
  std::vector<int32_t> heap;
  heap.reserve(n + 1);
  for (int32_t i = 0; i < n_vocab; ++i) {
    if (heap.size() == n && !better(i, heap.front())) continue;
    heap.push_back(i);
    std::push_heap(heap.begin(), heap.end(), better);
    if (heap.size() > n) {
      std::pop_heap(heap.begin(), heap.end(), better);
      heap.pop_back();
    }
  }
  std::sort_heap(heap.begin(), heap.end(), better);
  for (int32_t i : heap) out.top.emplace_back(i, logprob(i));
  return out;
}

}  // namespace bmoe
