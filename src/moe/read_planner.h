// Read planning for streamed experts: where the bytes of (layer, expert) are in the files and
// which reads bring them into a buffer.
//
// GGUF tensors are only 32-byte aligned, while O_DIRECT needs offsets, lengths and buffers
// aligned to kDirectAlignment (4 KiB). So each matrix's window is rounded out to 4 KiB at both
// ends (slot_bytes() is their sum), its Weight view points at the exact bytes inside the window,
// and each window goes to the read lanes as equal reads of about read_chunk_bytes, so that
// every lane has work until a layer's reads are done. Without O_DIRECT the windows stay aligned:
// it costs nothing and keeps one code path.
//
// Contract: the planner owns the expert files (one DirectFile per shard) and only queues reads.
// Deciding what to read, waiting, cancelling and promoting belong to its callers (the
// StreamingExperts coordinator and the Prefetcher), as does the buffer, which must hold at
// least slot_bytes(layer, expert) bytes at a 4 KiB-aligned address (BufferPool's are). Its
// views are valid once the ticket is done without failure. Every byte it queues is counted
// into the coordinator's ExpertStats (bytes_read, and copied_bytes for buffered reads).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "io/direct_io.h"
#include "io/read_lanes.h"
#include "moe/buffer_pool.h"
#include "expert_source/expert_source.h"

namespace bmoe {

class ReadPlanner {
 public:
  // Opens the layout's files (O_DIRECT where `odirect` and the filesystem allow). Reads go to
  // `lanes` and are counted into `counters`; both must outlive the planner's reads.
  ReadPlanner(ExpertLayout layout, bool odirect, uint64_t read_chunk_bytes, ReadLanes& lanes, ExpertStats& counters);

  const ExpertLayout& layout() const { return layout_; }
  int n_layers() const { return static_cast<int>(layout_.layers.size()); }
  // Whether `layer` exists and has streamed experts.
  bool streams(int layer) const;
  int n_expert(int layer) const { return layer_of(layer).n_expert; }
  // Bytes one expert of `layer` occupies in a buffer (windows rounded to 4 KiB).
  uint64_t slot_bytes(int layer, int expert) const;
  // What any expert of `layer` takes in the cache and asks of the pool: the layer's largest
  // slot (see StreamingExperts::cached_bytes).
  uint64_t cached_bytes(int layer) const { return cached_bytes_.at(static_cast<size_t>(layer)); }
  uint64_t largest_slot() const { return largest_slot_; }
  // What a cache holding every expert of `layout` counts against its budget (each expert at its
  // layer's cached_bytes): a larger budget could never fill.
  static uint64_t every_expert_bytes(const ExpertLayout& layout);
  // Whether reads of the first file bypass the page cache (for describe()).
  bool direct() const { return files_.front()->direct_active(); }
  // Why a file is read without O_DIRECT, one line per such file.
  const std::vector<std::string>& notes() const { return notes_; }

  // Sets `buffer`'s views to the expert's matrices and queues the reads that fill them, counted
  // into `ticket` before the first is submitted (so it cannot reach zero early). Priority 0 is
  // needed now; > 0 queues behind every urgent read and may be cancelled or promoted.
  void queue(int layer, int expert, BufferPool::Buffer& buffer, ReadTicket& ticket, int priority);

 private:
  // A matrix's window in its file, rounded out to the alignment.
  struct Window {
    uint64_t begin = 0;
    uint64_t end = 0;
    uint64_t bytes() const { return end - begin; }
  };
  static Window window_of(const ExpertMatrixLayout& m, int expert);
  static uint64_t slot_of(const ExpertLayerLayout& layer, int expert);
  static uint64_t largest_slot_of(const ExpertLayerLayout& layer);
  const ExpertLayerLayout& layer_of(int layer) const { return layout_.layers.at(static_cast<size_t>(layer)); }
  // The size of each read a window of `window` bytes is split into, and how many there are.
  uint64_t chunk_size(uint64_t window) const;
  uint64_t chunk_count(uint64_t window) const;
  int count_reads(int layer, int expert) const;
  // Submits one window as chunks; `required` bytes of it must lie inside the file (the rest is
  // padding past its end).
  void submit_window(const DirectFile& file, const Window& w, uint64_t required, uint8_t* dst, ReadTicket& ticket,
                     int priority);

  ExpertLayout layout_;
  uint64_t read_chunk_bytes_ = 0;
  ReadLanes& lanes_;
  ExpertStats& counters_;
  std::vector<std::unique_ptr<DirectFile>> files_;
  std::vector<std::string> notes_;
  std::vector<uint64_t> cached_bytes_;  // per layer
  uint64_t largest_slot_ = 0;
};

}  // namespace bmoe
