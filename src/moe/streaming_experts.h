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

#include "moe/cache_policy.h"
#include "moe/direct_io.h"
#include "moe/expert_source.h"
#include "moe/read_lanes.h"

namespace bmoe {

struct StreamingOptions {
  uint64_t cache_bytes = 0;
  std::string policy;  // empty: default_cache_policy()
  int io_threads = 4;
  bool odirect = true;
  bool overlap = false;
};

class StreamingExperts : public ExpertSource {
 public:
  StreamingExperts(ExpertLayout layout, const StreamingOptions& options);
  ~StreamingExperts() override;

  void begin_layer(int layer, std::span<const int32_t> experts, std::span<const float> weights) override;
  int take_ready(std::vector<int>& ready) override;
  std::span<const Weight> matrices(int index) override;
  void end_layer() override;
  ExpertStats stats() const override;
  std::string describe() const override;

  bool resident(int layer, int expert) const { return cache_.contains(make_expert_key(layer, expert)); }
  const std::vector<std::string>& io_notes() const { return notes_; }
  ExpertCache& cache() { return cache_; }
  // Bytes one expert of `layer` occupies in a buffer (windows rounded to 4 KiB).
  uint64_t slot_bytes(int layer, int expert) const;

 private:
  struct Buffer {
    AlignedBuffer data;
    uint64_t capacity = 0;
    std::vector<Weight> views;
  };
  // Lays out and queues the reads of expert `expert` of the current layer into `buffer`.
  void start_reads(int expert, Buffer& buffer, ReadTicket& ticket);
  void fail_layer(const std::string& error);

  ExpertLayout layout_;
  StreamingOptions options_;
  std::vector<std::unique_ptr<DirectFile>> files_;
  std::vector<std::string> notes_;
  ReadLanes lanes_;
  ExpertCache cache_;
  std::unordered_map<ExpertKey, std::unique_ptr<Buffer>> cached_;
  std::vector<std::unique_ptr<Buffer>> transient_;  // reused for misses that are not cached

  // The current layer visit.
  int layer_ = -1;
  std::vector<int32_t> experts_;
  std::vector<Buffer*> buffer_of_;
  std::vector<std::unique_ptr<ReadTicket>> tickets_;  // null for hits
  std::vector<bool> handed_;
  size_t handed_count_ = 0;

  ExpertStats stats_;
  uint64_t token_ = 0;
  uint64_t time_ = 0;
  int last_layer_ = 1 << 30;
};

}  // namespace bmoe
