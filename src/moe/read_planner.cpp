#include "moe/read_planner.h"

#include <algorithm>

#include "core/error.h"

namespace bmoe {

ReadPlanner::ReadPlanner(ExpertLayout layout, bool odirect, uint64_t read_chunk_bytes, ReadLanes& lanes,
                         ExpertStats& counters)
    : layout_(std::move(layout)), read_chunk_bytes_(read_chunk_bytes), lanes_(lanes), counters_(counters) {
  for (const std::string& path : layout_.files) {
    files_.push_back(std::make_unique<DirectFile>(path, odirect));
    if (!files_.back()->direct_note().empty()) notes_.push_back(path + ": " + files_.back()->direct_note());
  }
  for (int l = 0; l < n_layers(); ++l) {
    const uint64_t largest = largest_slot_of(layer_of(l));
    cached_bytes_.push_back(largest);
    largest_slot_ = std::max(largest_slot_, largest);
  }
  if (read_chunk_bytes_ == 0 || read_chunk_bytes_ % kDirectAlignment != 0) {
    fail("internal: read chunk of {} bytes is not a multiple of {}", read_chunk_bytes_, kDirectAlignment);
  }
}

bool ReadPlanner::streams(int layer) const {
  return layer >= 0 && layer < n_layers() && !layer_of(layer).matrices.empty();
}

ReadPlanner::Window ReadPlanner::window_of(const ExpertMatrixLayout& m, int expert) {
  const uint64_t offset = m.offset + static_cast<uint64_t>(expert) * m.expert_stride;
  return {align_down(offset, kDirectAlignment), align_up(offset + m.bytes, kDirectAlignment)};
}

uint64_t ReadPlanner::slot_of(const ExpertLayerLayout& layer, int expert) {
  uint64_t total = 0;
  for (const ExpertMatrixLayout& m : layer.matrices) total += window_of(m, expert).bytes();
  return total;
}

uint64_t ReadPlanner::largest_slot_of(const ExpertLayerLayout& layer) {
  uint64_t largest = 0;
  for (int e = 0; e < layer.n_expert && !layer.matrices.empty(); ++e) largest = std::max(largest, slot_of(layer, e));
  return largest;
}

uint64_t ReadPlanner::slot_bytes(int layer, int expert) const { return slot_of(layer_of(layer), expert); }

uint64_t ReadPlanner::every_expert_bytes(const ExpertLayout& layout) {
  uint64_t total = 0;
  for (const ExpertLayerLayout& l : layout.layers) total += largest_slot_of(l) * static_cast<uint64_t>(l.n_expert);
  return total;
}

// Large windows go out in chunks so that every lane has work until a layer's reads are done:
// whole matrices (1-4 MB) on 4 lanes left lanes idle at the end of each layer, and the cache-0
// Gemma-shape run read at 67 % of the drive's ceiling. The chunks of a window are equal (to the
// alignment) and between 2/3 and 3/2 of read_chunk_bytes: a 2.01 MiB matrix cut at 1 MiB left a
// 10 KiB tail read that cost nearly a whole read's latency, and on the drive here 256 KiB reads
// reach 70 % of 1 MiB reads' bandwidth.
uint64_t ReadPlanner::chunk_size(uint64_t window) const {
  const uint64_t target = read_chunk_bytes_;
  const uint64_t count = std::max<uint64_t>(1, (window + target / 2) / target);  // nearest count
  return align_up((window + count - 1) / count, kDirectAlignment);
}

uint64_t ReadPlanner::chunk_count(uint64_t window) const {
  const uint64_t chunk = chunk_size(window);
  return (window + chunk - 1) / chunk;
}

int ReadPlanner::count_reads(int layer, int expert) const {
  int reads = 0;
  for (const ExpertMatrixLayout& m : layer_of(layer).matrices) {
    reads += static_cast<int>(chunk_count(window_of(m, expert).bytes()));
  }
  return reads;
}

void ReadPlanner::queue(int layer, int expert, BufferPool::Buffer& buffer, ReadTicket& ticket, int priority) {
  if (buffer.capacity < slot_bytes(layer, expert)) {
    fail("internal: a {}-byte buffer for a {}-byte expert", buffer.capacity, slot_bytes(layer, expert));
  }
  buffer.views.clear();
  ticket.add(count_reads(layer, expert));
  uint64_t at = 0;
  for (const ExpertMatrixLayout& m : layer_of(layer).matrices) {
    const DirectFile& file = *files_[static_cast<size_t>(m.file)];
    const Window w = window_of(m, expert);
    const uint64_t offset = m.offset + static_cast<uint64_t>(expert) * m.expert_stride;
    Weight view;
    view.type = m.type;
    view.rows = m.rows;
    view.cols = m.cols;
    view.row_stride = m.bytes / static_cast<uint64_t>(m.rows);
    view.data = buffer.data + at + (offset - w.begin);
    buffer.views.push_back(view);
    submit_window(file, w, offset + m.bytes - w.begin, buffer.data + at, ticket, priority);
    counters_.bytes_read += w.bytes();
    if (!file.direct_active()) counters_.copied_bytes += w.bytes();
    at += w.bytes();
  }
}

void ReadPlanner::submit_window(const DirectFile& file, const Window& w, uint64_t required, uint8_t* dst,
                                ReadTicket& ticket, int priority) {
  const uint64_t length = w.bytes();
  const uint64_t chunk = chunk_size(length);
  for (uint64_t begin = 0; begin < length; begin += chunk) {
    ReadRequest r;
    r.file = &file;
    r.offset = w.begin + begin;
    r.length = std::min(chunk, length - begin);
    r.required = required > begin ? std::min(r.length, required - begin) : 0;  // past the end of file: padding
    r.dst = dst + begin;
    r.priority = priority;
    lanes_.submit(r, &ticket);
  }
}

}  // namespace bmoe
