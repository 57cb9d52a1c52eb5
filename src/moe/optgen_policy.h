// "optgen": an expert cache policy trained online against Belady's decisions on the recent past
// (the Hawkeye idea from CPU caches, applied to layer visits).
//
// Belady is offline, but what it *would have done* on the past is computable: for every reuse
// of an expert inside a sliding window of recent visits, OPTgen asks whether the cache could
// have held it since its previous use, given everything Belady would already be holding then
// (an occupancy count per visit of the window: a reuse is an OPT hit when every visit of its
// interval had room for its bytes, and the interval then takes that room). That verdict labels
// the expert's previous access "friendly" (OPT kept it) or "averse" (OPT let it go). A predictor
// learns the label from features of the access: the expert itself, and, shared by the experts of
// its layer (and pooled over layers), its recent token history (used by the previous token? by
// how many of the last 8?). Each estimate is pulled toward the coarser one when it has few
// examples, so an expert seen twice borrows its history cell's rate.
//
// Eviction follows Hawkeye: residents predicted averse go first; inside a class the `reuse`
// policy's expected wait ranks them (Belady's rule on an estimated future). A newcomer
// predicted averse is read without caching when only friendly residents could make room.
//
// It learns from the routing alone, changes only what is kept (lossless), and its state is
// bounded by the model's shape and the window (state_bytes(), state_bound()).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "moe/cache_policy.h"

namespace bmoe {

struct OptgenOptions {
  // How many tokens back Belady is replayed (the occupancy window): reuses farther apart count
  // as averse. Chosen on synthetic traces (bench/synth_route_trace.py seeds 1-4), see
  // docs/benchmarks.md.
  int window_tokens = 16;
  // Pseudo-observations pulling an expert's own rate toward its history cell's, and a layer's
  // cell toward the cell pooled over layers.
  double key_prior = 4.0;
  double cell_prior = 8.0;
  // Learned counts halve every this many tokens (the routing drifts with the topic).
  double half_life_tokens = 64.0;
  // Below this predicted rate an expert is "averse" (Hawkeye's 50 %).
  double averse_below = 0.5;
  // With > 0, friendly residents are also ranked by their rate: wait / rate^rank_power.
  double rank_power = 0.0;
};

// "optgen" alone gives the defaults; "optgen:w32:k2:c8:h128:t0.4:r1" overrides window, key and
// cell priors, half-life, threshold and rank power (for tuning with bmoe-replay). Throws on a bad
// option.
OptgenOptions parse_optgen_options(const std::string& name);

class OptgenPolicy : public CachePolicy {
 public:
  static constexpr int kCells = 18;  // used by the previous token (2) x uses among the last 8 (0-8)

  OptgenPolicy(int n_layers, uint64_t budget_bytes, const OptgenOptions& options, std::unique_ptr<WaitEstimator> base);
  std::string name() const override { return "optgen"; }
  void on_access(const Access& a, bool hit) override;
  void on_insert(const Access& a) override { base_->on_insert(a); }
  void on_evict(ExpertKey key) override { base_->on_evict(key); }
  bool choose_victim(const Access& incoming, const ResidentSet& residents, ExpertKey& victim) override;

  // The predicted probability that Belady keeps `k` until its next use, from what it has seen.
  double friendly(ExpertKey k) const;
  // Labels so far: reuses Belady would have hit, and all reuses judged (inside the window or not).
  uint64_t opt_hits() const { return opt_hits_; }
  uint64_t judged() const { return judged_; }
  // The history cell of an expert's last access.
  int cell(ExpertKey k) const;
  // Bytes of state held now, and the most it can hold for a model's shape.
  size_t state_bytes() const;
  static size_t state_bound(int n_layers, int n_experts_per_layer, int window_tokens);

 private:
  struct Rate {
    float friendly = 0.0f;
    float seen = 0.0f;
  };
  struct Expert {
    uint64_t last_time = 0;
    uint64_t last_token = 0;
    uint32_t token_uses = 0;  // bit i: used i tokens before its last access
    uint8_t cell = 0;
    bool seen = false;
    Rate rate;
    uint64_t rate_token = 0;  // when `rate` was last decayed
  };
  struct Layer {
    std::vector<Expert> experts;  // by expert id
    Rate cells[kCells];
  };
  Expert& expert(ExpertKey k);
  const Expert* find(ExpertKey k) const;
  void advance(uint64_t time, uint64_t token);
  bool opt_would_hit(uint64_t from, uint64_t to, uint64_t bytes);
  void learn(ExpertKey k, Expert& e, bool label);
  double cell_rate(int layer, int cell) const;
  static int cell_of(uint32_t token_uses);

  int n_layers_;
  uint64_t budget_;
  OptgenOptions options_;
  std::unique_ptr<WaitEstimator> base_;
  double token_decay_;
  std::vector<Layer> layers_;
  Rate pooled_[kCells];
  std::vector<uint64_t> occupancy_;  // bytes Belady holds at each visit of the window (ring)
  uint64_t time_ = 0;
  uint64_t token_ = 0;
  bool started_ = false;
  uint64_t opt_hits_ = 0;
  uint64_t judged_ = 0;
};

}  // namespace bmoe
