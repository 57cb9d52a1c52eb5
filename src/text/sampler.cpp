#include "text/sampler.h"

#include <algorithm>
#include <cmath>

namespace bmoe {

int32_t Sampler::argmax(const float* logits, int n_vocab) {
  int32_t best = 0;
  for (int32_t i = 1; i < n_vocab; ++i) {
    if (logits[i] > logits[best]) best = i;
  }
  return best;
}

int32_t Sampler::sample(const float* logits, int n_vocab) {
  if (config_.temperature <= 0.0f) return argmax(logits, n_vocab);
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
  // Softmax at the temperature, then the top-p nucleus.
  const float max = candidates_[0].first;
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

}  // namespace bmoe
