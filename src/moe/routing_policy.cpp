#include "moe/routing_policy.h"

#include <algorithm>

namespace bmoe {

namespace {
// Predictions serve decode steps and draft verification, not prompt batches: a prompt batch
// routes to most experts of a layer, so there is little left to predict.
constexpr int kMaxPredictedRows = 8;
}  // namespace

void RoutingPolicy::begin_pass(int layers) {
  if (options_.prefetch <= 0 && options_.route_ahead <= 0) {
    early_.clear();
    return;
  }
  early_.resize(static_cast<size_t>(layers));
  for (EarlyRoute& e : early_) e.valid = false;
}

bool RoutingPolicy::take_early_routes(int layer, std::span<TokenRoute> tokens) {
  // A route fixed early comes from a one-token pass, so only a one-token pass can take it.
  if (tokens.size() != 1 || static_cast<size_t>(layer) >= early_.size()) return false;
  EarlyRoute& early = early_[static_cast<size_t>(layer)];
  if (!early.valid) return false;
  tokens[0].experts = early.route.experts;  // copies keep both buffers' capacity for later passes
  tokens[0].weights = early.route.weights;
  early.valid = false;
  return true;
}

void RoutingPolicy::finish_routes(int layer, std::span<TokenRoute> tokens, const ExpertSource& source) {
  // Decode steps only, as RoutingOptions::drop_cold promises: draft verification and prompt
  // batches keep every expert.
  if (options_.drop_cold > 0.0f && tokens.size() == 1) drop_cold(layer, tokens[0], source);
}

void RoutingPolicy::drop_cold(int layer, TokenRoute& route, const ExpertSource& source) {
  const std::vector<int32_t>& ids = route.experts;
  const std::vector<float>& wts = route.weights;
  if (ids.size() < 2) return;
  const float threshold = options_.drop_cold / static_cast<float>(ids.size());
  float total = 0.0f, kept_total = 0.0f;
  for (float v : wts) total += v;
  const size_t top = static_cast<size_t>(std::max_element(wts.begin(), wts.end()) - wts.begin());
  kept_.experts.clear();
  kept_.weights.clear();
  for (size_t s = 0; s < ids.size(); ++s) {
    // Weights compare as a share of the total, so models whose weights do not sum to 1 behave
    // alike. Residency (a virtual call and a cache look-up) is asked only of light experts.
    const bool cold = s != top && wts[s] < threshold * total && !source.resident(layer, ids[s]);
    if (cold) {
      ++dropped_experts_;
      continue;
    }
    kept_.experts.push_back(ids[s]);
    kept_.weights.push_back(wts[s]);
    kept_total += wts[s];
  }
  if (kept_.experts.size() == ids.size()) return;
  // The kept experts carry the whole weight the token had, so the layer's output keeps its scale.
  for (float& v : kept_.weights) v *= total / kept_total;
  std::swap(route, kept_);
}

void RoutingPolicy::after_request(int layer, int tokens, ResidualRouter& router, ExpertSource& source) {
  const int window = std::max(options_.prefetch, options_.route_ahead);
  if (window <= 0 || tokens > kMaxPredictedRows) return;
  predictions_.clear();
  for (int t = layer + 1; t <= layer + window && t < router.layers(); ++t) {
    if (!router.has_router(t)) continue;
    LayerPrediction p;
    p.layer = t;
    p.distance = t - layer;
    if (predict(t, p.distance, tokens, router, p)) predictions_.push_back(std::move(p));
  }
  if (!predictions_.empty()) source.hint(predictions_);
}

bool RoutingPolicy::predict(int layer, int distance, int tokens, ResidualRouter& router, LayerPrediction& prediction) {
  EarlyRoute& early = early_[static_cast<size_t>(layer)];
  if (early.valid) {
    prediction.experts = early.route.experts;  // already fixed by route-ahead: an exact prediction
    return true;
  }
  if (scored_.size() < static_cast<size_t>(tokens)) scored_.resize(static_cast<size_t>(tokens));
  const std::span<TokenRoute> rows = std::span<TokenRoute>(scored_).first(static_cast<size_t>(tokens));
  router.route_residual(layer, rows);
  // Hinted: every expert some token would pick, in order of first pick.
  for (const TokenRoute& row : rows) {
    for (int32_t e : row.experts) {
      if (std::find(prediction.experts.begin(), prediction.experts.end(), e) == prediction.experts.end()) {
        prediction.experts.push_back(e);
      }
    }
  }
  if (tokens == 1 && distance == options_.route_ahead) {
    early.valid = true;
    early.route = rows[0];
  }
  // Scored for route-ahead alone (beyond the prefetch window) and not fixed: nothing to hint.
  return distance <= options_.prefetch || early.valid;
}

}  // namespace bmoe
