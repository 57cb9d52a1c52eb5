// Prefetch for the streaming source: experts predicted for later layers, read ahead into a
// staging area outside the cache budget.
//
// Predictions come from the model's routers (hint()) and from the routing history: learn()
// feeds each single-token visit to an AffinityPredictor and takes its guesses for the next
// layers. Exact hints (hint() with LayerPrediction::exact: a hash-routed layer's experts, known
// from the token ids at the start of a pass) are read ahead the same way but never kept, scored
// or paused: they are the routing, and count as early reads. Each prediction is kept for its layer (the latest per distance and source) and,
// unless its source is paused, the experts it names that are not in memory are read ahead at
// priority = distance, behind every urgent read, while the staging area has room (full: the
// read is skipped, never evicted for). An affinity prediction reads only its best
// affinity_reads guesses.
//
// When the layer routes, the coordinator (StreamingExperts) calls, in this order:
//   settle(layer, routed)   scores the layer's predictions; a source pauses while its moving
//                           accuracy is below 30 % and resumes above 45 %
//   adopt(key)              per routed miss: hands over its staged buffer and reads, now urgent
//   discard_layer(layer)    cancels the layer's read-aheads the routing did not pick
//   learn(layer, routed)    affinity: learns from the visit and predicts the layers after it
//
// Buffers: a staged buffer belongs to the prefetcher until adopt() hands it over or a discard
// cancels it. A cancelled read may still be in flight (a lane writes into its buffer), so the
// buffer drains: the prefetcher keeps it until reap() sees its ticket done and gives it back to
// the pool. The prefetcher never holds a buffer anyone else holds (buffer invariant,
// streaming_experts.h); held_buffers() lists those it holds.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <unordered_map>
#include <vector>

#include "moe/affinity_predictor.h"
#include "moe/buffer_pool.h"
#include "moe/cache_policy.h"
#include "expert_source/expert_source.h"
#include "moe/read_planner.h"

namespace bmoe {

struct PrefetchOptions {
  uint64_t staging_bytes = 0;  // the staging area (0: prefetch off)
  int top_k = 0;               // experts a layer routes per token
  bool keep_log = false;       // keep one PredictionRecord per prediction
  // Read exact hints (routing known before the layer runs) ahead; false: ignore them, so a run
  // that turned early reads off (or forces its routing) spends no staging room on them.
  bool early_reads = true;
  // Prefetch from the routing history (0: off; needs staging_bytes): layers ahead, and reads per
  // predicted layer (0: top_k / 2, at least 1).
  int affinity_window = 0;
  int affinity_reads = 0;
  double affinity_min_score = AffinityOptions{}.min_score;
};

// One prediction, checked when its layer routes (--predict-log).
struct PredictionRecord {
  uint64_t token = 0;
  int layer = 0;
  int distance = 0;
  int predicted = 0;
  int correct = 0;
  int prefetched = 0;  // of the correct ones, how many had been read ahead
  PredictionSource source = PredictionSource::Router;
};

class Prefetcher {
 public:
  using Buffer = BufferPool::Buffer;
  // Reads go through `planner` onto `lanes` into buffers of `pool`; `cache` says what is in
  // memory already; predictions and reads ahead are counted into `counters`. All must outlive
  // the prefetcher.
  Prefetcher(const PrefetchOptions& options, ReadPlanner& planner, ReadLanes& lanes, BufferPool& pool,
             const ExpertCache& cache, ExpertStats& counters);
  // Cancels what is still staged and waits for every read into the prefetcher's buffers.
  ~Prefetcher();
  Prefetcher(const Prefetcher&) = delete;
  Prefetcher& operator=(const Prefetcher&) = delete;

  bool enabled() const { return options_.staging_bytes > 0; }
  // Takes the routers' predictions (each replaces the previous one of its layer, distance and
  // source) and reads them ahead.
  void hint(std::span<const LayerPrediction> predictions);
  // Scores the predictions for `layer` against what it `routed` and forgets them.
  void settle(int layer, std::span<const int32_t> routed, uint64_t token);
  // The router predictions for the layers right after `layer`, as many consecutive layers as
  // have one (`window`): the cache policy's view of the future.
  std::vector<ExpertKey> router_guesses_after(int layer, int& window) const;
  bool staged(ExpertKey key) const { return staged_.count(key) != 0; }
  // A staged expert the routing asked for: its buffer and the ticket of its reads, promoted to
  // urgent. Both null when it was not staged.
  struct Adopted {
    std::unique_ptr<Buffer> buffer;
    std::unique_ptr<ReadTicket> ticket;
  };
  Adopted adopt(ExpertKey key);
  // Cancels the read-aheads of `layer` that were not adopted.
  void discard_layer(int layer);
  // After a visit of `layer`: with affinity prefetch, learns from it (a single token's visit)
  // and reads ahead what the history predicts for the next layers.
  void learn(int layer, std::span<const int32_t> routed);

  // Whether prefetch from `source` is paused now (its recent predictions were mostly wrong).
  bool paused(PredictionSource source) const { return paused_[static_cast<int>(source)]; }
  const std::vector<PredictionRecord>& log() const { return log_; }
  // Buffers held now: staged, and draining after a cancel.
  size_t buffers() const { return staged_.size() + draining_.size(); }
  // Appends every buffer it holds (for the buffer invariant's check).
  void held_buffers(std::vector<const Buffer*>& out) const;

 private:
  struct Staged {
    int layer = 0;
    std::unique_ptr<Buffer> buffer;
    std::unique_ptr<ReadTicket> ticket;
    uint64_t bytes = 0;
    PredictionSource source = PredictionSource::Router;
    bool exact = false;  // an exact hint's read (counted as an early read)
  };
  // Keeps `p` for its layer and reads it ahead unless its source is paused.
  void take(const LayerPrediction& p);
  void read_ahead(const LayerPrediction& p);
  // Reads (layer, expert) ahead unless it is in memory or being read ahead already, or the
  // staging area is full.
  void stage(int layer, int expert, int distance, PredictionSource source, bool exact);
  // Scores one prediction and moves its source's accuracy (pausing or resuming it).
  PredictionRecord score(const LayerPrediction& p, std::span<const int32_t> routed);
  void judge(const LayerPrediction& p, int predicted, std::span<const int32_t> routed);
  // Cancels a staged read; its buffer drains until reads in flight land.
  void discard(Staged staged);
  // Gives drained buffers back to the pool (waiting for their reads if `wait`).
  void reap(bool wait);

  PrefetchOptions options_;
  ReadPlanner& planner_;
  ReadLanes& lanes_;
  BufferPool& pool_;
  const ExpertCache& cache_;
  ExpertStats& counters_;

  std::unordered_map<ExpertKey, Staged> staged_;
  std::vector<Staged> draining_;  // discarded, reads still in flight
  uint64_t staged_bytes_ = 0;
  std::unordered_map<int, std::vector<LayerPrediction>> predictions_;  // per layer, latest per (distance, source)
  std::vector<PredictionRecord> log_;
  // Prefetch from a source switches itself off while its predictions are mostly wrong (reads
  // would only add bytes), and back on when they recover; predictions keep being checked
  // either way. (Under --route-replay the routers guess the trace's routing 5 % right, while
  // the routing history still predicts it.)
  double accuracy_[kPredictionSources] = {1.0, 1.0};  // moving averages
  bool paused_[kPredictionSources] = {false, false};
  std::unique_ptr<AffinityPredictor> affinity_;  // null: affinity prefetch off
};

}  // namespace bmoe
