// The MtpHead a session offers when its model's MTP block is bound (--mtp): the trunk's kept
// hidden states (InferenceState::keep_hidden_states) and the block run as a NextnHead. The
// head's expert reads go through the model's ExpertSource, so a run's reads and cache counters
// include them, and its compute falls in the decode step that drafts; its pass over a prompt
// falls in the prefill (read_prompt).
#pragma once

#include <memory>

#include "engine/speculative.h"
#include "model/nextn_head.h"
#include "model/transformer.h"

namespace bmoe {

class SessionMtpHead : public MtpHead {
 public:
  SessionMtpHead(Transformer& model, InferenceState& trunk, ThreadPool& pool, int n_ctx, KvType kv_type);
  // The trunk's new rows, after the one read_prompt held back where they follow it.
  std::vector<std::vector<float>> take_hidden_states() override;
  MtpStep draft(int position, std::span<const float> hidden, std::span<const int32_t> tokens) override;
  // After a prefill of `sequence` (the session's whole history): runs the head over the prompt's
  // new rows but the last, whose pair (the next token) is not sampled yet and is held for the
  // first proposal. The head's pass over a prompt then counts in the prefill, as the trunk's
  // does, not in the first drafting step.
  void read_prompt(const std::vector<int32_t>& sequence);

 private:
  // The trunk's new rows, after the held one where they follow it; `first`: the first's position.
  std::vector<std::vector<float>> rows_since(int& first);
  InferenceState& trunk_;
  NextnHead head_;
  std::vector<float> held_;  // read_prompt's last row
  int held_position_ = -1;   // its position; -1: none held
  int origin_ = 0;  // the trunk position of the head's position 0 (it restarts after a gap)
};

}  // namespace bmoe
