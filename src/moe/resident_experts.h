// Experts served straight from memory-mapped model files (the baseline: no streaming).
#pragma once

#include <memory>
#include <vector>

#include "io/mapped_file.h"
#include "expert_source/expert_source.h"

namespace bmoe {

class ResidentExperts : public ExpertSource {
 public:
  // `maps[i]` is the mapping of layout.files[i].
  ResidentExperts(ExpertLayout layout, std::vector<const MappedFile*> maps);

  void begin_layer(const LayerRouting& routing) override;
  int take_ready(std::vector<int>& ready) override;
  std::span<const Weight> matrices(int index) override;
  void end_layer() override;
  ExpertStats stats() const override { return stats_; }
  std::string describe() const override { return "resident (mmap)"; }

 private:
  ExpertLayout layout_;
  std::vector<const MappedFile*> maps_;
  int layer_ = -1;
  std::vector<int32_t> experts_;
  std::vector<std::vector<Weight>> views_;
  bool handed_out_ = false;
  ExpertStats stats_;
};

}  // namespace bmoe
