// Where routed experts' weights come from. The model asks, layer by layer, for the experts its
// router picked; a source hands back their matrices when they are in memory. The resident
// source points into the mapped file; the streaming source reads them from flash into a
// bounded cache. Neither knows what a "gate" or an architecture is: an expert is a list of
// matrices (in the order the layout gives them) identified by (layer, expert).
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <vector>

#include "quant/weight.h"

namespace bmoe {

// Where one stacked expert matrix lives in a file: expert e's rows start at
// offset + e * expert_stride and take `bytes` bytes.
struct ExpertMatrixLayout {
  int file = 0;  // index into ExpertLayout::files
  uint64_t offset = 0;
  uint64_t expert_stride = 0;
  uint64_t bytes = 0;
  TensorType type = TensorType::F32;
  int64_t rows = 0;
  int64_t cols = 0;
};

struct ExpertLayerLayout {
  int n_expert = 0;
  std::vector<ExpertMatrixLayout> matrices;  // e.g. {gate, up, down} or {gate_up, down}
  uint64_t expert_bytes() const {
    uint64_t total = 0;
    for (const auto& m : matrices) total += m.bytes;
    return total;
  }
};

struct ExpertLayout {
  std::vector<std::string> files;
  std::vector<ExpertLayerLayout> layers;  // empty entries for layers without experts
  uint64_t total_bytes() const;
  // Sum over layers of top_k x expert bytes: what one token touches (the LRU "cycle").
  uint64_t token_cycle_bytes(int top_k) const;
};

// Who made a prediction: the model's routers applied early (--predictor router), or the
// routing history (--predictor affinity, see affinity_predictor.h).
enum class PredictionSource { Router = 0, Affinity = 1 };
constexpr int kPredictionSources = 2;
const char* prediction_source_name(PredictionSource source);

// The experts a predictor expects `layer` to route, made `distance` layers before it.
struct LayerPrediction {
  int layer = 0;
  int distance = 1;
  std::vector<int32_t> experts;
  PredictionSource source = PredictionSource::Router;
  // Known, not guessed: the layer routes by token id (deepseek4's hash-routed layers), so these
  // are its experts unless a route hook replaces them. Read early whatever the predictors'
  // state, and counted as early reads rather than scored as predictions.
  bool exact = false;
};

// Counters every source keeps (cumulative since creation).
struct ExpertStats {
  uint64_t requests = 0;     // expert lookups (one per unique expert per layer visit)
  uint64_t hits = 0;         // served from memory without reading
  uint64_t misses = 0;       // had to be read
  uint64_t bytes_read = 0;
  // Of those, bytes copied on the way into a buffer: buffered reads (no O_DIRECT) go through
  // the page cache and the kernel copies them. O_DIRECT reads land by DMA; a hit copies nothing.
  uint64_t copied_bytes = 0;
  uint64_t evictions = 0;
  double io_busy_seconds = 0;  // sum of read time over lanes
  double stall_seconds = 0;    // time compute waited for reads
  // Predictive prefetch (--prefetch): experts predicted for later layers and read early into
  // a staging area outside the cache budget. A used prefetch still counts as a cache miss (the
  // cache did not hold it) but costs no wait for its reads if they landed in time.
  uint64_t predicted = 0;          // predicted experts, summed over the predictions made
  uint64_t predicted_correct = 0;  // of those, experts the layer then really routed
  static constexpr int kMaxDistance = 8;
  uint64_t predicted_at[kMaxDistance + 1] = {};  // the same split by distance (layers ahead)
  uint64_t correct_at[kMaxDistance + 1] = {};
  uint64_t predicted_by[kPredictionSources] = {};  // the same split by source
  uint64_t correct_by[kPredictionSources] = {};
  uint64_t prefetch_reads = 0;     // experts read ahead
  uint64_t prefetch_used = 0;      // read-ahead experts the routing then asked for
  uint64_t prefetch_wasted_bytes = 0;  // bytes read ahead that nobody used
  uint64_t prefetch_reads_by[kPredictionSources] = {};  // the same split by the source that asked first
  uint64_t prefetch_used_by[kPredictionSources] = {};
  // Early reads: experts of layers whose routing is known before they run (exact hints: the
  // hash-routed layers, from the pass's token ids), read into the staging area at the start of
  // the pass so they land while the earlier layers compute. Like a used prefetch, a used early
  // read still counts as a cache miss.
  uint64_t early_reads = 0;
  uint64_t early_used = 0;          // early reads the layer's routing then asked for
  uint64_t early_wasted_bytes = 0;  // bytes read early that nobody used (a route hook moved them)
  uint64_t cache_used_bytes = 0;
  uint64_t cache_budget_bytes = 0;
  // The cache holds as much as its budget allows: from here on every cached miss evicts, and a
  // run is in its steady state (a run's warm-up is the time until this first holds).
  bool cache_full = false;
  // Expert buffers that had to be allocated while tokens were being served (new memory, whose
  // pages the kernel faults in and zeroes under the read): zero in a steady state.
  uint64_t buffer_allocations = 0;
  // --overlap: forward passes run in each mode, and the latest probe's median pass times.
  uint64_t overlapped_passes = 0;
  uint64_t serial_passes = 0;
  double probe_overlap_seconds = 0;
  double probe_serial_seconds = 0;
};

// One layer's routing in a forward pass of `tokens` tokens: the unique experts the router
// picked, and for each (same order) its router weight summed over the tokens and how many of
// the tokens chose it. A prompt batch routes to most experts of a layer, each used by a few of
// its tokens; a decode step to top-k experts, each used by its one token.
struct LayerRouting {
  int layer = 0;
  std::span<const int32_t> experts;
  std::span<const float> weights;
  std::span<const int32_t> uses;  // empty: one use each
  int tokens = 1;
};

// Passes of at least this many tokens are prompt batches to the streaming layer: their reads
// always overlap compute, whatever --overlap's probe chose for decode steps.
constexpr int kPromptBatchTokens = 16;

class ExpertSource {
 public:
  virtual ~ExpertSource() = default;

  // Called by take_ready() right before it blocks on reads (the model parks its idle compute
  // threads there, so they do not spin on cores the reads need). Optional.
  void set_wait_hook(std::function<void()> hook) { wait_hook_ = std::move(hook); }

  // The router of `routing.layer` picked `routing.experts`; fetching may start now.
  virtual void begin_layer(const LayerRouting& routing) = 0;
  // Appends to `ready` the indices (into begin_layer's list) of experts now in memory that
  // were not handed out before, blocking until there is at least one. Returns how many were
  // appended; 0 once every expert has been handed out. Order may differ from the list's.
  virtual int take_ready(std::vector<int>& ready) = 0;
  // The matrices of the expert at `index`; valid until end_layer().
  virtual std::span<const Weight> matrices(int index) = 0;
  virtual void end_layer() = 0;

  // Optional: experts predicted for later layers (prefetch), or known for them (exact hints:
  // hash-routed layers, given at the start of a pass). Only what is read changes, never what is
  // computed. Each prediction replaces the previous one for its layer.
  virtual void hint(std::span<const LayerPrediction> predictions) {}
  // Whether the expert is in memory now (a lossy knob skips cold experts; default: resident).
  virtual bool resident(int layer, int expert) const { return true; }

  virtual ExpertStats stats() const = 0;
  virtual std::string describe() const = 0;

 protected:
  void before_wait() const {
    if (wait_hook_) wait_hook_();
  }

 private:
  std::function<void()> wait_hook_;
};

}  // namespace bmoe
