#include "moe/learned_policy.h"

#include <algorithm>
#include <bit>
#include <cmath>

namespace bmoe {
namespace {

constexpr int kNeverState = 256 + 56;  // states 256..311 are lags 9..64
constexpr double kMinHazard = 1e-4;    // keeps waits finite for histories never seen reused
constexpr float kMultiTokenUse = 0.5f; // a batch visit marks the experts most of its tokens used

// A history that reaches `state` (the inverse of state_of for a representative).
LearnedReusePolicy::History history_of_state(int state) {
  if (state < 256) return static_cast<LearnedReusePolicy::History>(state);
  if (state >= kNeverState) return 0;
  return LearnedReusePolicy::History{1} << (state - 256 + 8);
}

}  // namespace

LearnedReusePolicy::LearnedReusePolicy(int n_layers, const LearnedPolicyOptions& options)
    : n_layers_(std::max(1, n_layers)),
      options_(options),
      decay_(std::pow(0.5, 1.0 / std::max(1.0, options.half_life_visits))),
      layers_(static_cast<size_t>(std::max(1, n_layers))) {}

// The state of a history as far as its future goes: the last 8 visits exactly, or else how long
// ago the last use was (9..64 visits), or never within 64.
int LearnedReusePolicy::state_of(History h) {
  if (h & 0xFF) return static_cast<int>(h & 0xFF);
  if (h == 0) return kNeverState;
  return 256 + std::countr_zero(h) - 8;
}

// The hazard cell: (lag, uses among the last 8) when used within 8 visits, else a lag bucket.
int LearnedReusePolicy::cell_of(History h) {
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

// Expected visits until the next use, for every state of the layer: unused, a history only
// shifts (the state after `s` is fixed), so E[s] = 1 + (1 - hazard(s)) * E[next(s)], solved from
// "never" (a geometric wait) back to the most recent histories.
void LearnedReusePolicy::refresh_waits(int layer) {
  Layer& l = layers_[static_cast<size_t>(layer)];
  const auto step = [&](int s, double next_wait) {
    const double h = cell_hazard(layer, cell_of(history_of_state(s)));
    return 1.0 + (1.0 - h) * next_wait;
  };
  const double never = 1.0 / cell_hazard(layer, cell_of(0));
  l.wait[kNeverState] = static_cast<float>(never);
  double next = never;
  for (int s = kNeverState - 1; s >= 256; --s) {
    next = step(s, next);
    l.wait[static_cast<size_t>(s)] = static_cast<float>(next);
  }
  // Shifting a recent history moves its oldest bit out: states with more trailing zeros first.
  for (int tz = 7; tz >= 0; --tz) {
    for (int s = 1; s < 256; ++s) {
      if (std::countr_zero(static_cast<unsigned>(s)) != tz) continue;
      const int after = (s << 1) & 0xFF;
      const double w = l.wait[static_cast<size_t>(after ? after : 256)];
      l.wait[static_cast<size_t>(s)] = static_cast<float>(step(s, w));
    }
  }
  l.wait_valid = true;
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
  refresh_waits(layer_);
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

double LearnedReusePolicy::expected_layer_visits(int layer, History h) {
  if (layer < 0 || layer >= static_cast<int>(layers_.size())) return 1.0 / options_.prior_hazard;
  if (!layers_[static_cast<size_t>(layer)].wait_valid) refresh_waits(layer);
  return layers_[static_cast<size_t>(layer)].wait[static_cast<size_t>(state_of(h))];
}

double LearnedReusePolicy::expected_wait(ExpertKey k) {
  if (pending_) finish_visit();
  const int n = std::max(n_layers_, static_cast<int>(layers_.size()));
  const int d = ((key_layer(k) - layer_ - 1) % n + n) % n + 1;
  return d + n * (expected_layer_visits(key_layer(k), history(k)) - 1.0);
}

bool LearnedReusePolicy::choose_victim(const Access& incoming, const ResidentSet& residents, ExpertKey& victim) {
  if (pending_) finish_visit();
  return pick_farthest(incoming, residents, true, [&](ExpertKey k) { return expected_wait(k); }, victim);
}

size_t LearnedReusePolicy::state_bytes() const {
  size_t bytes = sizeof(*this) + visit_.capacity() * sizeof(visit_[0]);
  for (const Layer& l : layers_) bytes += sizeof(Layer) + l.history.capacity() * sizeof(History);
  return bytes;
}

size_t LearnedReusePolicy::state_bound(int n_layers, int n_experts_per_layer) {
  const size_t n = static_cast<size_t>(std::max(1, n_layers)), e = static_cast<size_t>(std::max(1, n_experts_per_layer));
  // Histories may grow to twice the experts (vector growth); a visit lists at most every expert.
  return sizeof(LearnedReusePolicy) + n * (sizeof(Layer) + 2 * e * sizeof(History)) + 2 * e * sizeof(std::pair<int, float>);
}

}  // namespace bmoe
