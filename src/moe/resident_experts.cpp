#include "moe/resident_experts.h"

#include "core/error.h"

namespace bmoe {

ResidentExperts::ResidentExperts(ExpertLayout layout, std::vector<const MappedFile*> maps)
    : layout_(std::move(layout)), maps_(std::move(maps)) {
  if (maps_.size() != layout_.files.size()) fail("internal: resident experts need one map per file");
}

void ResidentExperts::begin_layer(const LayerRouting& routing) {
  const int layer = routing.layer;
  layer_ = layer;
  experts_.assign(routing.experts.begin(), routing.experts.end());
  handed_out_ = false;
  const ExpertLayerLayout& l = layout_.layers.at(static_cast<size_t>(layer));
  views_.resize(experts_.size());
  for (size_t i = 0; i < experts_.size(); ++i) {
    views_[i].clear();
    for (const ExpertMatrixLayout& m : l.matrices) {
      const uint8_t* base = maps_[static_cast<size_t>(m.file)]->data();
      Weight w;
      w.type = m.type;
      w.rows = m.rows;
      w.cols = m.cols;
      w.row_stride = m.bytes / static_cast<uint64_t>(m.rows);
      w.data = base + m.offset + static_cast<uint64_t>(experts_[i]) * m.expert_stride;
      views_[i].push_back(w);
    }
  }
  stats_.requests += experts_.size();
}

int ResidentExperts::take_ready(std::vector<int>& ready) {
  if (handed_out_) return 0;
  handed_out_ = true;
  for (size_t i = 0; i < experts_.size(); ++i) ready.push_back(static_cast<int>(i));
  return static_cast<int>(experts_.size());
}

std::span<const Weight> ResidentExperts::matrices(int index) {
  return views_.at(static_cast<size_t>(index));
}

void ResidentExperts::end_layer() { layer_ = -1; }

}  // namespace bmoe
