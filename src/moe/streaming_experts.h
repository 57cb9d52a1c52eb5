// Experts read from flash on demand into a bounded cache (--moe-stream).
//
// After a layer routes, each miss is read with positioned reads on an O_DIRECT descriptor
// straight into its buffer: GGUF tensors are only 32-byte aligned, so every matrix's window is
// rounded out to 4 KiB and the matrix view points at its exact bytes inside. Hits need no I/O.
// Serial mode hands experts out once every read has landed; overlap mode hands out hits at
// once and each miss as soon as its reads complete, so compute proceeds while flash works.
#pragma once

#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "moe/affinity_predictor.h"
#include "moe/buffer_pool.h"
#include "moe/cache_policy.h"
#include "io/direct_io.h"
#include "moe/expert_source.h"
#include "moe/overlap_chooser.h"
#include "io/read_lanes.h"
#include "moe/read_planner.h"

namespace bmoe {

struct StreamingOptions {
  uint64_t cache_bytes = 0;
  std::string policy;  // empty: default_cache_policy()
  int io_threads = 4;
  IoEngine io_engine = IoEngine::Threads;
  bool odirect = true;
  bool overlap = false;
  // With overlap: measure both modes now and then and use the faster (see overlap_chooser.h);
  // false: overlap every pass.
  bool overlap_adapt = true;
  // Staging area for predictive prefetch (0: prefetch off). Outside the cache budget; the
  // loader sizes it to (window + 1) x top-k experts.
  uint64_t prefetch_bytes = 0;
  bool predict_log = false;  // keep one record per prediction (--predict-log)
  // Prefetch from the routing history (--predictor affinity; 0: off): after each visit of a
  // single token (at most top_k experts), an AffinityPredictor guesses the next
  // affinity_window layers and up to affinity_reads experts per layer that are not in memory
  // are read ahead, like the routers' guesses. Needs prefetch_bytes.
  int affinity_window = 0;
  int affinity_reads = 0;  // 0: top_k / 2, at least 1
  double affinity_min_score = AffinityOptions{}.min_score;
  int top_k = 0;
  // Target read size; longer windows are split into equal reads of 2/3 to 3/2 of this so every
  // lane stays busy to the end of a layer. A multiple of the O_DIRECT alignment (4 KiB).
  uint64_t read_chunk_bytes = 1 << 20;
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

class StreamingExperts : public ExpertSource {
 public:
  StreamingExperts(ExpertLayout layout, const StreamingOptions& options);
  ~StreamingExperts() override;

  void begin_layer(const LayerRouting& routing) override;
  int take_ready(std::vector<int>& ready) override;
  std::span<const Weight> matrices(int index) override;
  void end_layer() override;
  ExpertStats stats() const override;
  std::string describe() const override;

  void hint(std::span<const LayerPrediction> predictions) override;
  bool resident(int layer, int expert) const override;
  const std::vector<PredictionRecord>& prediction_log() const { return prediction_log_; }
  // Whether prefetch from `source` is paused now (its recent predictions were mostly wrong).
  bool prefetch_paused(PredictionSource source = PredictionSource::Router) const {
    return prefetch_paused_[static_cast<int>(source)];
  }
  const std::vector<std::string>& io_notes() const { return notes_; }
  // Buffers the prefetch staging area holds now: staged, and still draining after a cancel.
  size_t staging_buffers() const { return staged_.size() + draining_.size(); }
  // Expert buffers the pool reserved at start, and those it had to allocate since (each is new
  // memory the kernel zeroes on first touch; none in a steady state), see buffer_pool.h.
  const BufferPool& buffer_pool() const { return pool_; }
  uint64_t buffer_allocations() const { return pool_.allocations(); }
  ExpertCache& cache() { return cache_; }
  // Warm start (--cache-file): reads `keys` into the cache before the first token, as many as
  // the budget holds. Those reads are nobody's token, so they stay out of the statistics.
  struct WarmStart {
    int experts = 0;
    uint64_t bytes = 0;
    int failed = 0;  // reads that failed: left out of the cache
  };
  WarmStart warm(std::span<const ExpertKey> keys);
  // Bytes one expert of `layer` occupies in a buffer (windows rounded to 4 KiB).
  uint64_t slot_bytes(int layer, int expert) const { return planner_.slot_bytes(layer, expert); }
  // What any expert of `layer` counts against the cache budget: the layer's largest slot. One
  // size per layer, as a route trace records it, so bmoe-replay of this run's routing with
  // these sizes gives exactly the engine's hits (rounding leaves slots a page apart).
  uint64_t cached_bytes(int layer) const { return planner_.cached_bytes(layer); }

 private:
  using Buffer = BufferPool::Buffer;
  // Reserves the buffers a run needs (the cache's budget split over the layers' slot sizes,
  // one visit's uncached misses, the staging area) so that no read lands in fresh memory.
  void reserve_buffers();
  void fail_layer(const std::string& error);
  // Prefetch staging: experts read ahead for a later layer.
  struct Staged {
    int layer = 0;
    std::unique_ptr<Buffer> buffer;
    std::unique_ptr<ReadTicket> ticket;
    uint64_t bytes = 0;
    PredictionSource source = PredictionSource::Router;
  };
  // Reads (layer, expert) ahead unless it is in memory or being read ahead already, or the
  // staging area is full.
  void stage(int layer, int expert, int distance, PredictionSource source);
  // Records a prediction (checked when its layer routes) and reads its experts ahead unless its
  // source is paused: all of a router prediction, the first affinity_reads experts of an
  // affinity prediction that are not cached.
  void take_prediction(const LayerPrediction& p);
  // After a single-token visit of `layer`: learn from it and predict the layers after it.
  void predict_from_history(int layer);
  // Settles predictions and staged reads for the layer about to be visited.
  void check_predictions(int layer);
  // Cancels a staged read nobody needs; its buffer lingers until reads in flight land.
  void discard(Staged staged);
  void reap_draining(bool wait);
  // A buffer that holds any expert of `layer`.
  std::unique_ptr<Buffer> take_buffer(int layer) { return pool_.take(cached_bytes(layer)); }
  // Releases buffers allocated beyond the reservation once they are free again.
  void trim_free();
  void update_fill_stats();

  StreamingOptions options_;
  ExpertStats stats_;  // the planner counts the bytes it reads into it
  std::vector<std::string> notes_;
  // Declared before every holder of its buffers. Each buffer is in exactly one place: the
  // pool's free list, cached_, staged_ / draining_, or the open visit's visit_buffers_.
  BufferPool pool_;
  uint64_t pool_limit_bytes_ = 0;  // trim_free() keeps the pool within this
  ReadLanes lanes_;
  ReadPlanner planner_;
  ExpertCache cache_;
  std::unordered_map<ExpertKey, std::unique_ptr<Buffer>> cached_;

  // The current layer visit.
  int layer_ = -1;
  std::vector<int32_t> experts_;
  std::vector<Buffer*> buffer_of_;
  std::vector<std::unique_ptr<ReadTicket>> tickets_;  // null for hits
  std::vector<bool> handed_;
  size_t handed_count_ = 0;
  bool prompt_batch_ = false;  // the visit serves at least kPromptBatchTokens tokens

  // Prefetch.
  std::unordered_map<ExpertKey, Staged> staged_;
  std::vector<Staged> draining_;              // discarded, reads still in flight
  // Buffers the open visit uses without caching them (misses the cache did not admit, reads
  // ahead it adopts uncached): back to the pool at end_layer().
  std::vector<std::unique_ptr<Buffer>> visit_buffers_;
  uint64_t staged_bytes_ = 0;
  std::unordered_map<int, std::vector<LayerPrediction>> predictions_;  // per layer, latest per (distance, source)
  std::vector<PredictionRecord> prediction_log_;
  // Prefetch from a source switches itself off while its predictions are mostly wrong (reads
  // would only add bytes), and back on when they recover; predictions keep being checked
  // either way. (Under --route-replay the routers guess the trace's routing 5 % right, while
  // the routing history still predicts it.)
  double prediction_accuracy_[kPredictionSources] = {1.0, 1.0};  // moving averages
  bool prefetch_paused_[kPredictionSources] = {false, false};
  std::unique_ptr<AffinityPredictor> affinity_;

  OverlapChooser overlap_chooser_;
  bool overlap_now_ = false;  // the mode of the current forward pass
  uint64_t token_ = 0;
  uint64_t time_ = 0;
  int last_layer_ = 1 << 30;
};

}  // namespace bmoe
