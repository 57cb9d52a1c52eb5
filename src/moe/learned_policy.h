// "learned": an expert cache policy that learns, online, how each layer's experts are reused.
//
// Belady evicts the resident needed farthest ahead. The `reuse` policy estimates that wait from
// one hand-made formula (a decayed frequency read as a fixed per-token probability). This one
// measures it instead: each expert carries the bit history of its layer's last 64 visits (bit 0:
// used at the last one), and each layer counts, as its visits go by, how often an expert with a
// given recent history is used at the next visit (a hazard table over the lag since the last use,
// the uses among the last 8 visits and, bucketed, among the 56 before; pooled over layers as a
// prior). An expert's expected
// wait then follows from rolling its history forward through that table: a burst of recent uses
// and a long quiet spell get the waits the routing actually showed, per layer.
//
// What it learns from is the routing itself (one single-token visit = one labelled example per
// expert of the layer), so it needs no model and no offline pass, and it changes only what the
// cache keeps: lossless. Memory is bounded by the layers and experts it has seen (state_bytes()).
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "moe/cache_policy.h"

namespace bmoe {

struct LearnedPolicyOptions {
  // The tables forget with this half-life (in visits of the layer), so a long session follows
  // a change of topic. Chosen a priori (a few pages of text), not fitted to any trace.
  double half_life_visits = 512.0;
  // Pseudo-observations that pull a layer's table toward the table pooled over all layers
  // (a layer with few examples of a history borrows the others' estimate).
  double layer_prior_weight = 8.0;
  // Hazard assumed before anything is observed (pooled table's prior, one observation's worth).
  double prior_hazard = 0.05;
};

class LearnedReusePolicy : public CachePolicy {
 public:
  // Histories of one expert: bit i set = used at the (i+1)-th most recent visit of its layer.
  using History = uint64_t;
  static constexpr int kRecent = 8;  // visits seen exactly: (lag, uses) among the last 8
  static constexpr int kCells = (kRecent * kRecent + 4) * 3;  // and 4 far lags, x 3 older-use buckets

  LearnedReusePolicy(int n_layers, const LearnedPolicyOptions& options = {});
  std::string name() const override { return "learned"; }
  void on_access(const Access& a, bool hit) override;
  bool choose_victim(const Access& incoming, const ResidentSet& residents, ExpertKey& victim) override;

  // Visits (across layers) until `k` is expected to be needed again, from the current visit.
  double expected_wait(ExpertKey k);
  // Expected visits of its own layer until an expert with history `h` is next used (>= 1).
  double expected_layer_visits(int layer, History h);
  // The learned probability that an expert with history `h` is used at its layer's next visit.
  double hazard(int layer, History h) const;
  History history(ExpertKey k) const;
  // Bytes of learned state held now, and the most it can ever hold for a model's shape.
  size_t state_bytes() const;
  static size_t state_bound(int n_layers, int n_experts_per_layer);

 private:
  struct Cell {
    double seen = 0.0;
    double used = 0.0;
  };
  struct Layer {
    std::vector<History> history;  // per expert id
    std::array<Cell, kCells> cells{};
    std::vector<float> expected;   // per expert: expected visits until its next use
  };
  static int cell_of(History h);
  static int short_cell(History h);
  void finish_visit();
  void learn(Layer& layer, const std::vector<bool>& used, double decay);
  double cell_hazard(int layer, int cell) const;

  int n_layers_;
  LearnedPolicyOptions options_;
  double decay_;
  std::vector<Layer> layers_;
  std::array<Cell, kCells> pooled_{};
  // The visit in progress: its layer, time, and the experts it asked for (with their shares).
  int layer_ = 0;
  uint64_t time_ = 0;
  bool pending_ = false;
  std::vector<std::pair<int, float>> visit_;
};

}  // namespace bmoe
