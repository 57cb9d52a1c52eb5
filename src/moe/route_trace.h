// Routing traces: which experts each token routed to, layer by layer, in the CSV format of
// shared/data/route-traces (header lines, then turn,phase,step,layer,slot,expert,weight,
// residency,expert_bytes). Written by --route-trace, replayed by --route-replay (forcing a
// synthetic model to route like a real one) and by bmoe-replay (cache policy simulation).
#pragma once

#include <cstdint>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "moe/affinity_predictor.h"
#include "moe/cache_policy.h"

namespace bmoe {

struct RouteRecord {
  int turn = 0;
  int phase = 0;  // 0 prompt, 1 decode
  int step = 0;   // token position
  int layer = 0;
  int slot = 0;
  int expert = 0;
  float weight = 0.0f;
  int residency = 0;  // 1 = the recording engine had it cached
  uint64_t expert_bytes = 0;
};

struct RouteTrace {
  std::string model;
  std::string arch;
  int n_layer = 0;
  int n_expert = 0;
  int n_expert_used = 0;
  std::vector<uint64_t> expert_bytes;  // per layer
  std::vector<uint64_t> dense_bytes;   // per layer
  std::vector<RouteRecord> records;

  static RouteTrace load(const std::string& path);  // throws bmoe::Error on malformed input
};

// Streams a trace to a file as tokens are routed.
class RouteTraceWriter {
 public:
  RouteTraceWriter(const std::string& path, const std::string& model, const std::string& arch, int n_layer,
                   int n_expert, int n_expert_used, const std::vector<uint64_t>& expert_bytes,
                   const std::vector<uint64_t>& dense_bytes);
  ~RouteTraceWriter();
  void write(const RouteRecord& r);
  void flush();

 private:
  FILE* file_ = nullptr;
};

// A cache simulation over a trace: decode-phase lookups only are counted (prompt visits warm
// the cache), one lookup per unique expert per layer visit.
struct ReplayResult {
  uint64_t lookups = 0;
  uint64_t hits = 0;
  uint64_t bytes_read = 0;  // every byte read: misses not read ahead, and all reads ahead
  uint64_t evictions = 0;
  // With prefetch: misses whose expert had been read ahead, reads ahead, and their unused bytes.
  uint64_t covered = 0;
  uint64_t prefetch_reads = 0;
  uint64_t prefetch_wasted_bytes = 0;
  double hit_rate() const { return lookups ? static_cast<double>(hits) / static_cast<double>(lookups) : 0.0; }
  // Lookups that found their expert in memory: cached, or read ahead (assuming every read ahead
  // lands in time, which the engine's stall measures).
  double in_memory_rate() const {
    return lookups ? static_cast<double>(hits + covered) / static_cast<double>(lookups) : 0.0;
  }
};

// The layer visits a trace implies, in order (prompt tokens batched into one visit per layer,
// as bmoe prefills). Times and token counters are filled in.
std::vector<std::vector<Access>> trace_visits(const RouteTrace& trace, std::vector<bool>* decode_visit);

// Replays a trace through a policy. With predict_window > 0, before each decode visit the policy
// is hinted the experts of the current token's next `predict_window` layers as a router-based
// predictor would give them: each true expert is kept with probability predict_accuracy,
// otherwise replaced by another expert of that layer (seeded, reproducible).
//
// With prefetch_window > 0 the replay also reads ahead as the engine's --prefetch N
// --predictor affinity does, with the same AffinityPredictor: after each decode visit it guesses
// the token's next prefetch_window layers, and up to prefetch_reads uncached experts per layer
// are read into a staging area outside the budget ((window + 1) x top-k experts of the largest
// size, as the engine sizes it). A read-ahead expert that its layer then routes to is still a
// cache miss, but one already in memory ("covered").
struct ReplayOptions {
  int predict_window = 0;
  double predict_accuracy = 1.0;
  uint64_t seed = 1;
  int prefetch_window = 0;
  int prefetch_reads = 0;  // 0: top-k / 2, at least 1
  double min_score = AffinityOptions{}.min_score;
  // Counts only the lookups of the decode tokens from this fraction of them on (0.5: the second
  // half, after the policy learned on the first): what a policy does on routing it has not seen.
  double count_from = 0.0;
};
// Whether bmoe-replay runs `policy` with the trace's future: "belady", "layer-belady", and
// "belady-hN" (Belady knowing the next N tokens' routing, nothing beyond).
bool is_offline_policy(const std::string& policy);
ReplayResult replay_trace(const RouteTrace& trace, const std::string& policy, uint64_t budget_bytes,
                          const ReplayOptions& options = {});

}  // namespace bmoe
