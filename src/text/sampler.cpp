#include "text/sampler.h"

#include <algorithm>
#include <cmath>

#include "core/error.h"

namespace bmoe {

int32_t Sampler::argmax(const float* logits, int n_vocab) {
  int32_t best = 0;
  for (int32_t i = 1; i < n_vocab; ++i) {
    if (logits[i] > logits[best]) best = i;
  }
  return best;
}

void Sampler::begin(const std::vector<int32_t>& sequence) {
  answer_counts_.clear();
  const size_t n = config_.repeat_last_n < 0 ? sequence.size() : std::min(sequence.size(), static_cast<size_t>(config_.repeat_last_n));
  recent_.assign(sequence.end() - static_cast<std::ptrdiff_t>(n), sequence.end());
}

void Sampler::accept(int32_t token) {
  if (!config_.penalized()) return;  // nothing reads them: keep the plain paths free of bookkeeping
  ++answer_counts_[token];
  if (config_.repeat_last_n == 0) return;
  recent_.push_back(token);
  if (config_.repeat_last_n > 0 && recent_.size() > static_cast<size_t>(config_.repeat_last_n)) recent_.erase(recent_.begin());
}

const float* Sampler::penalize(const float* logits, int n_vocab) {
  penalized_.assign(logits, logits + n_vocab);
  auto in_vocab = [n_vocab](int32_t t) { return t >= 0 && t < n_vocab; };
  for (const auto& [t, bias] : config_.logit_bias) {
    if (in_vocab(t)) penalized_[static_cast<size_t>(t)] += bias;
  }
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
  if (config_.temperature <= 0.0f) return argmax(logits, n_vocab);
  return draw(logits, n_vocab);
}

int32_t Sampler::sample(const float* logits, int n_vocab, const TokenFilter& filter) {
  const int32_t first = sample(logits, n_vocab);
  if (filter.allows(first)) return first;
  masked_.assign(logits, logits + n_vocab);
  filter.mask(masked_.data(), n_vocab);
  if (std::none_of(masked_.begin(), masked_.end(), [](float l) { return std::isfinite(l); })) {
    fail("the grammar allows no token here");
  }
  return sample(masked_.data(), n_vocab);
}

int32_t Sampler::draw(const float* logits, int n_vocab) {
  candidates_.resize(static_cast<size_t>(n_vocab));
  for (int32_t i = 0; i < n_vocab; ++i) candidates_[static_cast<size_t>(i)] = {logits[i], i};
  const auto by_logit = [](const auto& a, const auto& b) { return a.first > b.first || (a.first == b.first && a.second < b.second); };
  size_t keep = candidates_.size();
  if (config_.top_k > 0 && static_cast<size_t>(config_.top_k) < keep) {
    keep = static_cast<size_t>(config_.top_k);
    std::partial_sort(candidates_.begin(), candidates_.begin() + static_cast<std::ptrdiff_t>(keep), candidates_.end(), by_logit);
  } else {
    std::sort(candidates_.begin(), candidates_.end(), by_logit);
  }
  candidates_.resize(keep);
  const float max = candidates_[0].first;
  if (config_.min_p > 0.0f) {
    // p_i >= min_p * p_max  <=>  logit_i >= logit_max + ln(min_p); the best token always stays.
    const float floor = max + std::log(config_.min_p);
    size_t cut = 1;
    while (cut < candidates_.size() && candidates_[cut].first >= floor) ++cut;
    candidates_.resize(cut);
  }
  // Softmax at the temperature, then the top-p nucleus.
  double total = 0.0;
  for (auto& c : candidates_) {
    c.first = std::exp((c.first - max) / config_.temperature);
    total += c.first;
  }
  if (config_.top_p < 1.0f) {
    double cumulative = 0.0;
    size_t cut = candidates_.size();
    for (size_t i = 0; i < candidates_.size(); ++i) {
      cumulative += candidates_[i].first / total;
      if (cumulative >= config_.top_p) {
        cut = i + 1;
        break;
      }
    }
    candidates_.resize(cut);
    total = 0.0;
    for (const auto& c : candidates_) total += c.first;
  }
  double r = rng_.uniform() * total;
  for (const auto& c : candidates_) {
    r -= c.first;
    if (r <= 0.0) return c.second;
  }
  return candidates_.back().second;
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
