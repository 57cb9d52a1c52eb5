#include "engine/mtp_head.h"

namespace bmoe {

SessionMtpHead::SessionMtpHead(Transformer& model, InferenceState& trunk, ThreadPool& pool, int n_ctx, KvType kv_type)
    : trunk_(trunk), head_(model, pool, n_ctx, kv_type) {
  trunk_.keep_hidden_states(true);
}

std::vector<std::vector<float>> SessionMtpHead::take_hidden_states() { return trunk_.take_hidden_states(); }

MtpStep SessionMtpHead::draft(int position, std::span<const float> hidden, std::span<const int32_t> tokens) {
  // Attention sees only position differences (RoPE), so a head restarted at a gap runs its rows
  // from its own position 0, as a window over the newest positions.
  if (position < origin_ || position - origin_ > head_.n_past()) origin_ = position;
  head_.forward(position - origin_, hidden, tokens);
  return {head_.logits(), head_.hidden()};
}

}  // namespace bmoe
