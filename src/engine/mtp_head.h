// The MtpHead a session offers when its model's MTP block is bound (--mtp): the trunk's kept
// hidden states (InferenceState::keep_hidden_states) and the block run as a NextnHead. The
// head's expert reads go through the model's ExpertSource, so a run's reads and cache counters
// include them, and its compute falls in the decode step that drafts.
#pragma once

#include <memory>

#include "engine/speculative.h"
#include "model/nextn_head.h"
#include "model/transformer.h"

namespace bmoe {

class SessionMtpHead : public MtpHead {
 public:
  SessionMtpHead(Transformer& model, InferenceState& trunk, ThreadPool& pool, int n_ctx, KvType kv_type);
  std::vector<std::vector<float>> take_hidden_states() override;
  MtpStep draft(int position, std::span<const float> hidden, std::span<const int32_t> tokens) override;

 private:
  InferenceState& trunk_;
  NextnHead head_;
  int origin_ = 0;  // the trunk position of the head's position 0 (it restarts after a gap)
};

}  // namespace bmoe
