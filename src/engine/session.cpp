#include "engine/session.h"

#include <algorithm>

#include "core/error.h"
#include "core/timer.h"

namespace bmoe {

Session::Session(LoadedModel& model, ThreadPool& pool, int n_ctx, int n_batch, SamplerConfig sampler,
                 KvType kv_type)
    : model_(model), pool_(pool), state_(*model.transformer, pool, n_ctx, kv_type), n_batch_(std::max(1, n_batch)),
      sampler_(sampler) {}

std::vector<int32_t> Session::tokenize(const std::string& text, bool parse_special) const {
  return model_.tokenizer->encode(text, parse_special, model_.tokenizer->vocab().add_bos);
}

PrefillRecord Session::prefill(const std::vector<int32_t>& tokens) {
  if (tokens.empty()) fail("the prompt is empty");
  Stopwatch timer;
  state_.set_prefill(true);
  for (size_t i = 0; i < tokens.size(); i += static_cast<size_t>(n_batch_)) {
    const int n = static_cast<int>(std::min<size_t>(static_cast<size_t>(n_batch_), tokens.size() - i));
    logits_ = &state_.eval(tokens.data() + i, n);
  }
  state_.set_prefill(false);
  history_.insert(history_.end(), tokens.begin(), tokens.end());
  return {static_cast<int>(tokens.size()), timer.seconds()};
}

int Session::prefill_reusing(const std::vector<int32_t>& prompt, PrefillRecord* record) {
  if (prompt.empty()) fail("the prompt is empty");
  size_t keep = 0;
  while (keep < history_.size() && keep < prompt.size() && history_[keep] == prompt[keep]) ++keep;
  keep = std::min(keep, prompt.size() - 1);
  state_.truncate(static_cast<int>(keep));
  history_.resize(keep);
  const PrefillRecord r = prefill(std::vector<int32_t>(prompt.begin() + static_cast<std::ptrdiff_t>(keep), prompt.end()));
  if (record) *record = r;
  return static_cast<int>(keep);
}

int32_t Session::sample() {
  if (logits_ == nullptr) fail("internal: sample() before prefill()");
  return sampler_.sample(logits_->data(), model_.transformer->config().n_vocab);
}

const TokenRecord& Session::accept(int32_t token) {
  const ExpertStats before = model_.experts->stats();
  Stopwatch timer;
  logits_ = &state_.eval(&token, 1);
  history_.push_back(token);
  const double wall = timer.seconds();
  const ExpertStats after = model_.experts->stats();
  TokenRecord r;
  r.index = static_cast<int>(records_.size());
  r.token = token;
  r.wall_ms = wall * 1e3;
  r.stall_ms = (after.stall_seconds - before.stall_seconds) * 1e3;
  r.io_ms = (after.io_busy_seconds - before.io_busy_seconds) * 1e3;
  r.compute_ms = std::max(0.0, r.wall_ms - r.stall_ms);
  r.routed = after.requests - before.requests;
  r.hits = after.hits - before.hits;
  r.misses = after.misses - before.misses;
  r.bytes_read = after.bytes_read - before.bytes_read;
  r.cache_used = after.cache_used_bytes;
  records_.push_back(r);
  return records_.back();
}

void Session::reset() {
  state_.truncate(0);
  history_.clear();
  logits_ = nullptr;
  records_.clear();
}

}  // namespace bmoe
