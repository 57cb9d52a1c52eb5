// The routed experts of a layer, per sequence: the router and the family's gating turn each
// token's router input into experts and weights (the route and router hooks may look, replace,
// decide early or drop), then the experts the ExpertSource hands out are computed in groups and
// summed in slot order. The FFN kinds with experts (ffn.h) call it; it owns the scratch of both
// halves.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <vector>

#include "core/thread_pool.h"
#include "model/config.h"
#include "model/matmul.h"
#include "model/residual.h"
#include "model/weights.h"
#include "expert_source/expert_source.h"
#include "expert_source/router_hook.h"  // RoutingOptions, RouterHook

namespace bmoe {

// Observes (and may replace) each routing decision: used for route traces and replay.
struct RouteEvent {
  int layer = 0;
  int position = 0;     // token position in the sequence
  int row = 0;          // the token's row in the pass (a batch of sequences: which sequence)
  bool prefill = false; // part of the prompt (set by the caller with set_prefill)
  // A recurrent rewind's replay of rows routed before: a hook that forces routing forces it
  // again (so the replayed rows equal their first run), one that records skips them.
  bool replay = false;
  const float* logits = nullptr;  // router logits, n_expert values
  int n_expert = 0;
  std::vector<int32_t>* experts;  // selected ids, slot order
  std::vector<float>* weights;    // their weights, same order
};
using RouteHook = std::function<void(RouteEvent&)>;

// A sequence's hooks on routing (InferenceState's setters fill them).
struct RoutingHooks {
  RouteHook route;
  std::unique_ptr<RouterHook> router;
  bool prefill = false;  // the next evals process prompt tokens (reported to the route hook)
  bool replay = false;   // the next evals replay rows for a rewind (reported to the route hook)
};

class RoutedExperts {
 public:
  // `owner` is what the router hook scores later layers' routers through.
  RoutedExperts(const ModelConfig& c, const ModelWeights& w, ThreadPool& pool, RoutingHooks& hooks,
                ResidualRouter& owner)
      : cfg_(c), weights_(w), pool_(pool), hooks_(hooks), owner_(owner) {}

  // out[i] (n_embd floats) = the experts of `layer` on h[i], routed by the router on
  // router_in[i]; positions[i] is token i's position (for the route hook).
  void run(int layer, int n, const float* h, const float* router_in, const int* positions, ExpertSource& source,
           float* out);
  // The token ids of the pass's rows (hash-routed layers route by them), or null.
  void set_tokens(const int32_t* tokens) { tokens_ = tokens; }
  // At the start of a pass of `n` rows (after set_tokens): the hash-routed layers' experts for
  // these tokens are known before those layers run, so they go to `source` as exact hints and
  // their reads may start while the earlier layers compute. Changes only what is read when.
  void hint_hashed_layers(int n, ExpertSource& source);
  // What the router of `layer` reads, computed from a residual row.
  void router_input(int layer, const float* x, float* out) const;
  // The router of `layer` and the gating on residual rows (the router hook's predictions).
  void route_residual(int layer, std::span<TokenRoute> rows, const ResidualStream& residual);
  // Since construction: (token, slot) pairs routed, and the distinct experts asked of the source
  // for them (their ratio is how much the rows of a pass share their experts).
  uint64_t routed_slots() const { return routed_slots_; }
  uint64_t distinct_experts() const { return distinct_experts_; }

 private:
  // Routing: routes_ for each token of the pass.
  void route_tokens(int layer, int n, const float* router_in, const int* positions, ExpertSource& source);
  void report_route(int layer, int token, const float* logits, const int* positions);
  // The model's gating of one token: logits (bias added in place) -> ids and weights.
  // token: the row's token id, for hash-routed layers (-1: none, as for predictions).
  void gate(const RoutedExpertWeights& L, float* logits, std::vector<int32_t>& ids, std::vector<float>& wts,
            int32_t token = -1) const;
  void hashed_experts(const RoutedExpertWeights& L, int32_t token, std::vector<int32_t>& ids) const;

  // Expert compute, on the experts the source hands out.
  struct ExpertUses;
  struct ExpertGroup;
  ExpertUses group_by_expert(int n) const;
  void compute_ready_experts(int layer, int n, const float* h, const ExpertUses& uses, ExpertSource& source,
                             float* slot_out);
  void compute_group(int layer, int n, const float* h, const ExpertUses& uses, std::span<const int> ready,
                     ExpertSource& source, float* slot_out);
  void expert_gate_up(const RoutedExpertWeights& L, int n, const float* h, ExpertGroup& group);
  void expert_activation(const RoutedExpertWeights& L, int layer, const ExpertUses& uses, ExpertGroup& group);
  void expert_down(const RoutedExpertWeights& L, const ExpertUses& uses, const ExpertGroup& group, float* slot_out);
  void sum_slots(int n, int max_slots, const float* slot_out, float* out) const;

  const ModelConfig& cfg_;
  const ModelWeights& weights_;
  ThreadPool& pool_;
  RoutingHooks& hooks_;
  ResidualRouter& owner_;

  const int32_t* tokens_ = nullptr;
  // Routing of the current layer: per token, its experts and weights in slot order.
  std::vector<TokenRoute> routes_;
  std::vector<float> router_logits_;
  std::vector<float> residual_router_in_, residual_router_logits_;  // route_residual's scratch
  ActivationBuffer router_act_, residual_router_act_, down_act_;
  Activations acts_;
  uint64_t routed_slots_ = 0, distinct_experts_ = 0;
  std::vector<float> slot_out_, expert_gate_, expert_up_, expert_act_, expert_fused_, expert_down_;
};

}  // namespace bmoe
