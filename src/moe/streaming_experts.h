// Experts read from flash on demand into a bounded cache (--moe-stream).
//
// StreamingExperts is the ExpertSource the model sees, and the coordinator of four parts:
//   BufferPool   (buffer_pool.h)    expert buffers, reserved and touched before the first token
//   ReadPlanner  (read_planner.h)   (layer, expert) -> aligned O_DIRECT windows -> chunked reads
//   Prefetcher   (prefetcher.h)     predictions, reads ahead into a staging area, their accuracy
//   ExpertCache  (cache_policy.h)   which experts stay in memory (hits, admissions, evictions)
// It runs the begin_layer / take_ready / matrices / end_layer protocol: after a layer routes,
// hits need no I/O and each miss adopts the prefetcher's read-ahead or is read into a buffer of
// its own at once. Serial mode hands experts out once every read has landed; overlap mode hands
// out hits at once and each miss as soon as its reads complete, so compute proceeds while flash
// works. Nothing is handed out before all its reads completed without error.
//
// A buffer's life (docs/design.md, section 4):
//   free --take--> a miss of the open visit: reading (in cached_ if the cache admitted it, else
//          in the visit's buffers) --ticket done--> handed out --end_layer--> stays in cached_,
//          or free
//   free --take--> staged (read ahead by the Prefetcher)
//          --routed: adopt--> a miss of the open visit, as above (its reads promoted to urgent)
//          --not routed: discard--> draining while a lane still writes into it --reap--> free
//   cached --evicted by a later visit, or its read failed--> free
//
// Buffer invariant: every buffer the pool made is in exactly one place:
//   - BufferPool's free (or released) lists,
//   - cached_ (the cache's residents; exactly ExpertCache's keys),
//   - the Prefetcher's staged or draining buffers,
//   - the open visit's buffers (misses the cache did not admit; back to the pool at end_layer).
// The open visit's buffer_of points into cached_ or its own buffers, never owns. Moves between
// places go through unique_ptr, so a buffer cannot be in two places without a raw copy, nor
// lost without a destroyed holder. check_buffers() verifies the invariant; builds with
// BMOE_CHECK_INVARIANTS (Debug and sanitizer builds) run it at every layer boundary.
#pragma once

#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "io/read_lanes.h"
#include "moe/affinity_predictor.h"
#include "moe/buffer_pool.h"
#include "moe/cache_policy.h"
#include "expert_source/expert_source.h"
#include "moe/overlap_chooser.h"
#include "moe/prefetcher.h"
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
  bool early_reads = true;   // read exact hints ahead (PrefetchOptions::early_reads)
  // Prefetch from the routing history (--predictor affinity; 0: off): after each visit of a
  // single token (at most top_k experts), an AffinityPredictor guesses the next
  // affinity_window layers and up to affinity_reads experts per layer that are not in memory
  // are read ahead, like the routers' guesses. Needs prefetch_bytes.
  int affinity_window = 0;
  int affinity_reads = 0;  // 0: top_k / 2, at least 1
  double affinity_min_score = AffinityOptions{}.min_score;
  int top_k = 0;
  // Experts one layer visit may route at most (0: top_k): a step of B sequences (--parallel)
  // routes up to B x top_k. The pool keeps buffers for that many misses beyond the cache, so a
  // wide step recycles them instead of faulting (and the kernel zeroing) fresh pages each visit.
  int visit_experts = 0;
  // Target read size; longer windows are split into equal reads of 2/3 to 3/2 of this so every
  // lane stays busy to the end of a layer. A multiple of the O_DIRECT alignment (4 KiB).
  uint64_t read_chunk_bytes = 1 << 20;
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

  void hint(std::span<const LayerPrediction> predictions) override { prefetcher_.hint(predictions); }
  bool resident(int layer, int expert) const override;
  const std::vector<PredictionRecord>& prediction_log() const { return prefetcher_.log(); }
  // Whether prefetch from `source` is paused now (its recent predictions were mostly wrong).
  bool prefetch_paused(PredictionSource source = PredictionSource::Router) const { return prefetcher_.paused(source); }
  const std::vector<std::string>& io_notes() const { return notes_; }
  // True when reads go through io_uring; false on reader threads, also where io_uring was asked
  // for and refused (io_notes() then says why), so a test can tell which engine really ran.
  bool io_uring() const { return lanes_.uring(); }
  // Buffers the prefetch staging area holds now: staged, and still draining after a cancel.
  size_t staging_buffers() const { return prefetcher_.buffers(); }
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
  // Checks the buffer invariant (see the top of this file) and throws Error naming the breach.
  // Any build may call it; BMOE_CHECK_INVARIANTS builds call it at every layer boundary.
  void check_buffers() const;

 private:
  using Buffer = BufferPool::Buffer;
  // The open layer visit, from begin_layer to end_layer.
  struct Visit {
    int layer = -1;  // -1: none open
    bool prompt_batch = false;  // serves at least kPromptBatchTokens tokens
    std::vector<int32_t> experts;
    std::vector<Buffer*> buffer_of;  // per expert; held by cached_ or `buffers`
    std::vector<std::unique_ptr<ReadTicket>> tickets;  // per expert; null for hits
    std::vector<bool> handed;
    size_t handed_count = 0;
    // Misses the cache did not admit (read, or adopted from the prefetcher): back to the pool
    // at end_layer().
    std::vector<std::unique_ptr<Buffer>> buffers;
  };

  // Reserves the buffers a run needs (the cache's budget split over the layers' slot sizes,
  // one visit's uncached misses, the staging area) so that no read lands in fresh memory.
  void reserve_buffers();
  // warm()'s steps: queue the reads of the keys the cache takes, then keep those that landed
  // and drop those whose reads failed.
  struct WarmRead {
    ExpertKey key;
    std::unique_ptr<ReadTicket> ticket;
  };
  std::vector<WarmRead> read_into_cache(std::span<const ExpertKey> keys);
  WarmStart keep_landed(std::vector<WarmRead> reads);
  // begin_layer's steps.
  void open_visit(const LayerRouting& routing);
  std::vector<Access> accesses_of(const LayerRouting& routing) const;
  void hint_policy(int layer);
  void drop_evicted(const std::vector<ExpertKey>& evicted);
  // Serves expert `i` of the visit: a hit from the cache, a miss from the prefetcher's staging
  // area or by reading it now; `admit`: the cache keeps the miss.
  void fetch(size_t i, ExpertKey key, bool hit, bool admit);
  // Puts a miss's buffer in the cache if admitted, else with the visit; returns it.
  Buffer* hold(ExpertKey key, bool admit, std::unique_ptr<Buffer> buffer);
  // take_ready's steps: wait for every read of the visit (serial mode), hand out the experts
  // whose reads all landed (returns how many), wait for any read.
  void wait_for_every_read();
  size_t hand_out_landed(std::vector<int>& ready);
  void wait_for_any_read();
  // A read of the visit failed: drain the visit's reads, drop its experts from the cache, close
  // it, and throw.
  [[noreturn]] void fail_layer(const std::string& error);
  void give_visit_buffers();
  // A buffer that holds any expert of `layer`.
  std::unique_ptr<Buffer> take_buffer(int layer) { return pool_.take(cached_bytes(layer)); }
  void update_fill_stats();
  // check_buffers() where BMOE_CHECK_INVARIANTS is defined; nothing in Release (inline, so
  // not even a call to an empty function).
  void check_at_boundary() const {
#ifdef BMOE_CHECK_INVARIANTS
    check_buffers();
#endif
  }

  StreamingOptions options_;
  ExpertStats stats_;  // the planner and the prefetcher count into it too
  std::vector<std::string> notes_;
  // Members are destroyed in reverse order: the pool after every holder of its buffers (see
  // the buffer invariant above), the lanes after the planner and the prefetcher, whose
  // destructor waits for its reads in flight.
  BufferPool pool_;
  ReadLanes lanes_;
  ReadPlanner planner_;
  ExpertCache cache_;
  std::unordered_map<ExpertKey, std::unique_ptr<Buffer>> cached_;
  Prefetcher prefetcher_;
  Visit visit_;

  OverlapChooser overlap_chooser_;
  bool overlap_now_ = false;  // the mode of the current forward pass
  uint64_t token_ = 0;
  uint64_t time_ = 0;
  int last_layer_ = 1 << 30;
};

}  // namespace bmoe
