#include "moe/learned_policy.h"

#include <algorithm>
#include <bit>
#include <cmath>

namespace bmoe {
namespace {

constexpr double kMinHazard = 1e-4;    // keeps waits finite for histories never seen reused
constexpr float kMultiTokenUse = 0.5f; // a batch visit marks the experts most of its tokens used

}  // namespace

LearnedReusePolicy::LearnedReusePolicy(int n_layers, const LearnedPolicyOptions& options)
    : n_layers_(std::max(1, n_layers)),
      options_(options),
      decay_(std::pow(0.5, 1.0 / std::max(1.0, options.half_life_visits))),
      layers_(static_cast<size_t>(std::max(1, n_layers))) {}

// The hazard cell: (lag, uses among the last 8) when used within 8 visits, else a lag bucket;
// times how many uses the older 56 visits held (none, 1-3, 4+): the long-run frequency.
int LearnedReusePolicy::cell_of(History h) {
  const int older = std::popcount(h >> 8);
  return short_cell(h) * 3 + (older == 0 ? 0 : older < 4 ? 1 : 2);
}

int LearnedReusePolicy::short_cell(History h) {
  const History recent = h & 0xFF;
  if (recent) {
    const int lag = std::countr_zero(recent);      // 0..7
    const int uses = std::popcount(recent) - 1;    // 0..7
    return lag * kRecent + uses;
  }
  if (h == 0) return kRecent * kRecent + 3;
  const int lag = std::countr_zero(h) + 1;         // 9..64
  return kRecent * kRecent + (lag <= 16 ? 0 : lag <= 32 ? 1 : 2);
}

double LearnedReusePolicy::cell_hazard(int layer, int cell) const {
  const Cell& p = pooled_[static_cast<size_t>(cell)];
  const double pooled = (p.used + options_.prior_hazard) / (p.seen + 1.0);
  const Cell& c = layers_[static_cast<size_t>(layer)].cells[static_cast<size_t>(cell)];
  const double m = options_.layer_prior_weight;
  if (c.seen + m <= 0.0) return std::clamp(pooled, kMinHazard, 1.0);
  return std::clamp((c.used + m * pooled) / (c.seen + m), kMinHazard, 1.0);
}

double LearnedReusePolicy::hazard(int layer, History h) const {
  if (layer < 0 || layer >= static_cast<int>(layers_.size())) return options_.prior_hazard;
  return cell_hazard(layer, cell_of(h));
}

void LearnedReusePolicy::learn(Layer& layer, const std::vector<bool>& used, double decay) {
  const double pooled_decay = std::pow(decay, 1.0 / n_layers_);
  for (Cell& c : layer.cells) c.seen *= decay, c.used *= decay;
  for (Cell& c : pooled_) c.seen *= pooled_decay, c.used *= pooled_decay;
  for (size_t e = 0; e < layer.history.size(); ++e) {
    const size_t cell = static_cast<size_t>(cell_of(layer.history[e]));
    layer.cells[cell].seen += 1.0;
    pooled_[cell].seen += 1.0;
    if (used[e]) {
      layer.cells[cell].used += 1.0;
      pooled_[cell].used += 1.0;
    }
  }
}

// The visit is complete: learn from it (single-token visits only: a batch's experts are not one
// token's routing), then shift every history of the layer.
void LearnedReusePolicy::finish_visit() {
  pending_ = false;
  Layer& layer = layers_[static_cast<size_t>(layer_)];
  bool single_token = !visit_.empty();
  for (const auto& [expert, share] : visit_) {
    if (static_cast<size_t>(expert) >= layer.history.size()) layer.history.resize(static_cast<size_t>(expert) + 1, 0);
    single_token = single_token && share >= 0.999f;
  }
  std::vector<bool> used(layer.history.size(), false);
  for (const auto& [expert, share] : visit_) used[static_cast<size_t>(expert)] = single_token || share >= kMultiTokenUse;
  if (single_token) learn(layer, used, decay_);
  for (size_t e = 0; e < layer.history.size(); ++e) layer.history[e] = (layer.history[e] << 1) | (used[e] ? 1 : 0);
  layer.expected.resize(layer.history.size());
  for (size_t e = 0; e < layer.history.size(); ++e) layer.expected[e] = static_cast<float>(expected_layer_visits(layer_, layer.history[e]));
}

void LearnedReusePolicy::on_access(const Access& a, bool) {
  if (pending_ && a.time != time_) finish_visit();
  if (!pending_) {
    pending_ = true;
    time_ = a.time;
    layer_ = key_layer(a.key);
    if (layer_ >= static_cast<int>(layers_.size())) layers_.resize(static_cast<size_t>(layer_) + 1);
    visit_.clear();
  }
  visit_.emplace_back(key_expert(a.key), a.share);
}

LearnedReusePolicy::History LearnedReusePolicy::history(ExpertKey k) const {
  const size_t l = static_cast<size_t>(key_layer(k)), e = static_cast<size_t>(key_expert(k));
  if (l >= layers_.size() || e >= layers_[l].history.size()) return 0;
  return layers_[l].history[e];
}

// Rolls the history forward unused: E = sum over j of P(no use in the first j visits), with a
// geometric tail once the history is empty.
double LearnedReusePolicy::expected_layer_visits(int layer, History h) {
  if (layer < 0 || layer >= static_cast<int>(layers_.size())) return 1.0 / options_.prior_hazard;
  double wait = 0.0, survive = 1.0;
  for (; h != 0 && survive > 1e-9; h <<= 1) {
    wait += survive;
    survive *= 1.0 - cell_hazard(layer, cell_of(h));
  }
  return wait + survive / cell_hazard(layer, cell_of(0));
}

double LearnedReusePolicy::expected_wait(ExpertKey k) {
  if (pending_) finish_visit();
  const int n = std::max(n_layers_, static_cast<int>(layers_.size()));
  const int d = ((key_layer(k) - layer_ - 1) % n + n) % n + 1;
  const size_t l = static_cast<size_t>(key_layer(k)), e = static_cast<size_t>(key_expert(k));
  const double visits = l < layers_.size() && e < layers_[l].expected.size() ? layers_[l].expected[e]
                                                                            : expected_layer_visits(key_layer(k), 0);
  return d + n * (visits - 1.0);
}

bool LearnedReusePolicy::choose_victim(const Access& incoming, const ResidentSet& residents, ExpertKey& victim) {
  if (pending_) finish_visit();
  return pick_farthest(incoming, residents, true, [&](ExpertKey k) { return expected_wait(k); }, victim);
}

size_t LearnedReusePolicy::state_bytes() const {
  size_t bytes = sizeof(*this) + visit_.capacity() * sizeof(visit_[0]);
  for (const Layer& l : layers_) bytes += sizeof(Layer) + l.history.capacity() * sizeof(History) + l.expected.capacity() * sizeof(float);
  return bytes;
}

size_t LearnedReusePolicy::state_bound(int n_layers, int n_experts_per_layer) {
  const size_t n = static_cast<size_t>(std::max(1, n_layers)), e = static_cast<size_t>(std::max(1, n_experts_per_layer));
  // Histories may grow to twice the experts (vector growth); a visit lists at most every expert.
  return sizeof(LearnedReusePolicy) + n * (sizeof(Layer) + 2 * e * (sizeof(History) + sizeof(float))) + 2 * e * sizeof(std::pair<int, float>);
}

}  // namespace bmoe
