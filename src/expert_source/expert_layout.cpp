#include "expert_source/expert_source.h"

namespace bmoe {

uint64_t ExpertLayout::total_bytes() const {
  uint64_t total = 0;
  for (const auto& l : layers) total += l.expert_bytes() * static_cast<uint64_t>(l.n_expert);
  return total;
}

uint64_t ExpertLayout::token_cycle_bytes(int top_k) const {
  uint64_t total = 0;
  for (const auto& l : layers) total += l.expert_bytes() * static_cast<uint64_t>(top_k);
  return total;
}

const char* prediction_source_name(PredictionSource source) {
  return source == PredictionSource::Router ? "router" : "affinity";
}

}  // namespace bmoe
