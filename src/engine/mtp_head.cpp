#include "engine/mtp_head.h"

namespace bmoe {

SessionMtpHead::SessionMtpHead(Transformer& model, InferenceState& trunk, ThreadPool& pool, int n_ctx, KvType kv_type)
    : trunk_(trunk), head_(model, pool, n_ctx, kv_type) {
  trunk_.keep_hidden_states(true);
}

std::vector<std::vector<float>> SessionMtpHead::take_hidden_states() {
  int first = 0;
  return rows_since(first);
}

std::vector<std::vector<float>> SessionMtpHead::rows_since(int& first) {
  std::vector<std::vector<float>> rows = trunk_.take_hidden_states(&first);
  // The held row still holds where the trunk kept its position and the new rows follow it.
  const bool follows = rows.empty() ? held_position_ < trunk_.n_past() : first == held_position_ + 1;
  if (held_position_ >= 0 && follows) {
    rows.insert(rows.begin(), std::move(held_));
    first = held_position_;
  }
  held_.clear();
  held_position_ = -1;
  return rows;
}

void SessionMtpHead::read_prompt(const std::vector<int32_t>& sequence) {
  int first = 0;
  std::vector<std::vector<float>> rows = rows_since(first);
  if (rows.empty()) return;
  held_ = std::move(rows.back());
  held_position_ = first + static_cast<int>(rows.size()) - 1;
  rows.pop_back();
  // The sequence's last token plays the one about to be fed: the head runs over the rows before
  // the held one (its one step's logits are not used).
  if (!rows.empty()) mtp_steps_over(*this, std::move(rows), sequence, 1);
}

MtpStep SessionMtpHead::draft(int position, std::span<const float> hidden, std::span<const int32_t> tokens) {
  // Attention sees only position differences (RoPE), so a head restarted at a gap runs its rows
  // from its own position 0, as a window over the newest positions; so does one sent back
  // further than its rows reach (a ring whose older rows were overwritten).
  const int at = position - origin_;
  if (position < origin_ || at > head_.n_past() || head_.n_past() - at > head_.rewind_reach()) origin_ = position;
  head_.forward(position - origin_, hidden, tokens);
  return {head_.logits(), head_.hidden()};
}

}  // namespace bmoe
