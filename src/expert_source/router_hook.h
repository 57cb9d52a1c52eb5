// The routing-time decisions the forward pass leaves to moe: which later layers to predict and
// hint to the expert source (prefetch), whether a layer's routing was decided layers earlier
// (route-ahead), and which cold experts a decode step skips (drop-cold). The model calls a
// RouterHook once or a few times per layer and offers its routers through ResidualRouter; the
// router math (norms, matmul, gating) stays in the model, the decisions live behind this
// interface (moe/routing_policy.h implements it). Like expert_source.h, this header sits below
// both model and moe and includes nothing but expert_source.h.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "expert_source/expert_source.h"

namespace bmoe {

// How routing interacts with the expert source beyond the model's own math.
struct RoutingOptions {
  // Lossless: after a layer routes, apply the routers of the next `prefetch` layers to the
  // current residual and hint their likely experts to the source (it may read them early).
  int prefetch = 0;
  // Lossy: decide layer L's routing from the residual at layer L - route_ahead (its experts
  // are then known, and read, that many layers early). Decode steps only.
  int route_ahead = 0;
  // Lossy: skip a routed expert that is not in memory when its weight is below
  // drop_cold x an even split (1/k); the rest are rescaled to the original weight sum.
  // Decode steps only; the top expert is always kept.
  float drop_cold = 0.0f;
};

// One token's routing at one layer: its experts in slot order and their weights.
struct TokenRoute {
  std::vector<int32_t> experts;
  std::vector<float> weights;
};

// The model's routers as the hook may use them: the hook chooses which layer to score, the model
// does the math on the residual of the pass as it stands at the call.
class ResidualRouter {
 public:
  virtual int layers() const = 0;
  // Whether `layer` routes experts (dense layers have no router).
  virtual bool has_router(int layer) const = 0;
  // Routes each row of the current residual with `layer`'s router input, router and gating,
  // exactly as that layer would if the residual reached it unchanged; `rows` holds one route per
  // token of the pass.
  virtual void route_residual(int layer, std::span<TokenRoute> rows) = 0;

 protected:
  ~ResidualRouter() = default;
};

// Called by the forward pass, in this order for each layer with experts: take_early_routes
// (before the model gates), finish_routes (after the route hook, before the experts are
// requested), after_request (once ExpertSource::begin_layer has the layer's experts).
class RouterHook {
 public:
  virtual ~RouterHook() = default;

  virtual void set_options(const RoutingOptions& options) = 0;
  virtual const RoutingOptions& options() const = 0;
  // Experts skipped by drop-cold so far.
  virtual uint64_t dropped_experts() const = 0;

  // A forward pass over `layers` layers starts: routes decided early live for one pass.
  virtual void begin_pass(int layers) = 0;
  // Fills `tokens` and returns true when `layer`'s routing was already decided by an earlier
  // layer (route-ahead); false leaves them alone and the model gates as usual.
  virtual bool take_early_routes(int layer, std::span<TokenRoute> tokens) = 0;
  // The layer's routing as it will be computed unless the hook changes it: it may drop experts
  // `source` does not hold, rescaling the others' weights (drop-cold).
  virtual void finish_routes(int layer, std::span<TokenRoute> tokens, const ExpertSource& source) = 0;
  // The layer's experts were requested from `source`: the hook may predict later layers with
  // `router` and hint them to `source` (prefetch), fixing some for good (route-ahead).
  virtual void after_request(int layer, int tokens, ResidualRouter& router, ExpertSource& source) = 0;
};

}  // namespace bmoe
