// The engine's RouterHook: prefetch by the routers of later layers, route-ahead and drop-cold
// (RoutingOptions, expert_source/router_hook.h). Session installs one in every InferenceState it owns.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "expert_source/router_hook.h"

namespace bmoe {

class RoutingPolicy final : public RouterHook {
 public:
  void set_options(const RoutingOptions& options) override { options_ = options; }
  const RoutingOptions& options() const override { return options_; }
  uint64_t dropped_experts() const override { return dropped_experts_; }

  void begin_pass(int layers) override;
  // Route-ahead: a one-token pass takes the route fixed route_ahead layers earlier.
  bool take_early_routes(int layer, std::span<TokenRoute> tokens) override;
  // Drop-cold: on a one-token pass, skips light experts that are not in memory.
  void finish_routes(int layer, std::span<TokenRoute> tokens, const ExpertSource& source) override;
  // Prefetch and route-ahead: scores the routers of the next layers on the current residual.
  void after_request(int layer, int tokens, ResidualRouter& router, ExpertSource& source) override;

 private:
  // A later layer's route fixed early (route-ahead), valid until that layer takes it.
  struct EarlyRoute {
    bool valid = false;
    TokenRoute route;
  };

  // The prediction for `layer`, made `distance` layers before it; false when it is not hinted.
  bool predict(int layer, int distance, int tokens, ResidualRouter& router, LayerPrediction& prediction);
  void drop_cold(int layer, TokenRoute& route, const ExpertSource& source);

  RoutingOptions options_;
  std::vector<EarlyRoute> early_;  // per layer; empty while neither prefetch nor route-ahead is on
  std::vector<TokenRoute> scored_;  // scratch: the routers' picks per token of the pass
  std::vector<LayerPrediction> predictions_;
  TokenRoute kept_;  // scratch of drop_cold
  uint64_t dropped_experts_ = 0;
};

}  // namespace bmoe
