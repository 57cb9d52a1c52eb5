#include "moe/affinity_predictor.h"

#include <algorithm>

#include "core/error.h"

namespace bmoe {

AffinityPredictor::AffinityPredictor(std::vector<int> experts_per_layer, const AffinityOptions& options)
    : experts_per_layer_(std::move(experts_per_layer)), options_(options) {
  if (options_.window < 1 || options_.window > 8) fail("internal: affinity window {} outside 1..8", options_.window);
  pairs_.resize(experts_per_layer_.size() * static_cast<size_t>(options_.window));
  for (int from = 0; from < static_cast<int>(experts_per_layer_.size()); ++from) {
    for (int distance = 1; distance <= options_.window; ++distance) {
      PairCounts& p = pairs_[static_cast<size_t>(from) * static_cast<size_t>(options_.window) + static_cast<size_t>(distance - 1)];
      const size_t n_from = static_cast<size_t>(experts_at(from));
      p.seen.assign(n_from, 0);
      p.counts.assign(n_from * static_cast<size_t>(experts_at(from + distance)), 0);
    }
  }
  current_.resize(experts_per_layer_.size());
}

int AffinityPredictor::experts_at(int layer) const {
  if (layer < 0 || layer >= static_cast<int>(experts_per_layer_.size())) return 0;
  return experts_per_layer_[static_cast<size_t>(layer)];
}

AffinityPredictor::PairCounts& AffinityPredictor::pairs(int from, int distance) {
  PairCounts& p = pairs_[static_cast<size_t>(from) * static_cast<size_t>(options_.window) + static_cast<size_t>(distance - 1)];
  p.used = true;
  return p;
}

const AffinityPredictor::PairCounts* AffinityPredictor::find_pairs(int from, int distance) const {
  const PairCounts& p = pairs_[static_cast<size_t>(from) * static_cast<size_t>(options_.window) + static_cast<size_t>(distance - 1)];
  return p.used && !p.seen.empty() ? &p : nullptr;
}

void AffinityPredictor::break_token() {
  for (auto& experts : current_) experts.clear();
  last_layer_ = -1;
}

void AffinityPredictor::observe(int layer, std::span<const int32_t> experts) {
  const int n_here = experts_at(layer);
  if (n_here == 0) return;
  if (layer <= last_layer_) break_token();
  if (last_layer_ < 0) ++tokens_learned_;
  last_layer_ = layer;
  std::vector<int32_t>& here = current_[static_cast<size_t>(layer)];
  here.clear();
  for (int32_t e : experts) {
    if (e >= 0 && e < n_here) here.push_back(e);
  }
  for (int distance = 1; distance <= options_.window; ++distance) {
    const int from = layer - distance;
    if (from < 0 || current_[static_cast<size_t>(from)].empty()) continue;
    PairCounts& p = pairs(from, distance);
    for (int32_t e : current_[static_cast<size_t>(from)]) {
      ++p.seen[static_cast<size_t>(e)];
      uint32_t* row = p.counts.data() + static_cast<size_t>(e) * static_cast<size_t>(n_here);
      for (int32_t f : here) ++row[f];
    }
  }
}

std::vector<int32_t> AffinityPredictor::predict(int layer, int distance) const {
  if (distance < 1 || distance > options_.window || layer < 0 || layer >= static_cast<int>(current_.size())) return {};
  const int n_to = experts_at(layer + distance);
  const std::vector<int32_t>& routed = current_[static_cast<size_t>(layer)];
  const PairCounts* p = n_to > 0 && !routed.empty() ? find_pairs(layer, distance) : nullptr;
  if (p == nullptr) return {};
  std::vector<double> score(static_cast<size_t>(n_to), 0.0);
  for (int32_t e : routed) {
    const uint32_t seen = p->seen[static_cast<size_t>(e)];
    if (seen == 0) continue;
    const uint32_t* row = p->counts.data() + static_cast<size_t>(e) * static_cast<size_t>(n_to);
    for (int f = 0; f < n_to; ++f) score[static_cast<size_t>(f)] += static_cast<double>(row[f]) / seen;
  }
  std::vector<int32_t> picked;
  const double threshold = options_.min_score * static_cast<double>(routed.size());
  for (int f = 0; f < n_to; ++f) {
    if (score[static_cast<size_t>(f)] > 0.0 && score[static_cast<size_t>(f)] >= threshold) picked.push_back(f);
  }
  // Best first; ties by id so results never depend on anything but the counts.
  std::sort(picked.begin(), picked.end(), [&](int32_t a, int32_t b) {
    const double sa = score[static_cast<size_t>(a)], sb = score[static_cast<size_t>(b)];
    return sa != sb ? sa > sb : a < b;
  });
  return picked;
}

}  // namespace bmoe
