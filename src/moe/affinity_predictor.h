// Predicts a token's experts in later layers from the experts it routed to in earlier ones,
// using statistics learned online from the routing seen so far ("inter-layer expert affinity").
//
// Trained MoE models route consistently across depth: on the phone trace of Qwen3-30B-A3B an
// expert of layer l is followed by particular experts of layer l+1 far more often than chance.
// Counting those pairs as tokens are decoded gives a predictor that needs no model weights:
// it works on routing alone, so it predicts a replayed trace (--route-replay) as well as the
// model's own router. The streaming engine reads its guesses ahead (prefetch) and bmoe-replay
// simulates the same thing with this same class.
//
// It knows nothing about files or models: layers and experts are numbers.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

namespace bmoe {

struct AffinityOptions {
  int window = 1;  // layers ahead it learns and predicts (1..8)
  // A candidate is predicted when its score reaches this: the mean, over the experts the token
  // routed at the source layer, of P(candidate at the target layer | that expert), as counted.
  // Chosen on the phone trace with bmoe-replay (see docs/benchmarks.md): lower guesses more and
  // wastes more reads, higher guesses little.
  double min_score = 0.25;
};

class AffinityPredictor {
 public:
  // experts_per_layer[l]: how many experts layer l has (0: a layer without experts).
  AffinityPredictor(std::vector<int> experts_per_layer, const AffinityOptions& options);

  // The experts one token routed to at `layer` (unique ids). A token's layers come in
  // increasing order; a layer at or below the previous one starts the next token. Learns the
  // pairs between this layer and the token's earlier layers within the window.
  void observe(int layer, std::span<const int32_t> experts);
  // Forgets the current token's routing (the next observe() starts a new token): for visits
  // that mix several tokens, which are neither learned from nor predicted from.
  void break_token();

  // The experts predicted for layer `layer + distance` from what the current token routed at
  // `layer` (observed last), best first, only those scoring at least min_score.
  std::vector<int32_t> predict(int layer, int distance) const;

  const AffinityOptions& options() const { return options_; }
  uint64_t tokens_learned() const { return tokens_learned_; }

 private:
  // Pair counts from source layer `from` to layer from + distance: counts[e * n_to + f] tokens
  // routed e at `from` and f at the target; seen[e] tokens routed e at `from` while the target
  // was observed too.
  struct PairCounts {
    std::vector<uint32_t> counts;
    std::vector<uint32_t> seen;
    bool used = false;  // counted at least once
  };
  PairCounts& pairs(int from, int distance);
  const PairCounts* find_pairs(int from, int distance) const;
  int experts_at(int layer) const;

  std::vector<int> experts_per_layer_;
  AffinityOptions options_;
  // [from * window + distance - 1], all allocated (and so touched) up front: tables that appeared
  // as layers were first seen were page faults on the decode path.
  std::vector<PairCounts> pairs_;
  // The current token's routing per layer (empty: not observed for this token).
  std::vector<std::vector<int32_t>> current_;
  int last_layer_ = -1;
  uint64_t tokens_learned_ = 0;
};

}  // namespace bmoe
