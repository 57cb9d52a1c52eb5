#include "engine/session.h"

#include <algorithm>
#include <cmath>
#include <memory>

#include "core/error.h"
#include "core/timer.h"
#include "model/attention.h"
#include "moe/routing_policy.h"

namespace bmoe {

Session::Session(LoadedModel& model, ThreadPool& pool, int n_ctx, int n_batch, SamplerConfig sampler,
                 KvType kv_type)
    : model_(model), pool_(pool), state_(*model.transformer, pool, n_ctx, kv_type), n_batch_(std::max(1, n_batch)),
      sampler_(sampler), sampled_(sampler.temperature > 0.0f) {
  state_.set_router_hook(std::make_unique<RoutingPolicy>());
  if (has_nextn_head(*model.transformer)) {
    mtp_head_ = std::make_unique<SessionMtpHead>(*model.transformer, state_, pool, n_ctx, kv_type);
  }
}

std::vector<int32_t> Session::tokenize(const std::string& text, bool parse_special) const {
  return model_.tokenizer->encode(text, parse_special, model_.tokenizer->vocab().add_bos);
}

bool Session::fresh_batch_path(int pos, int length) const {
  const int start = pos / n_batch_ * n_batch_;
  return std::min(start + n_batch_, length) - start >= kAttentionBatchRows;
}

PrefillRecord Session::prefill(const std::vector<int32_t>& tokens, const PrefillProgress& progress, int prompt_length) {
  if (tokens.empty()) fail("the prompt is empty");
  pending_sample_.reset();  // a draw from logits the prompt replaces
  Stopwatch timer;
  state_.set_prefill(true);
  const int total = static_cast<int>(tokens.size()), start = state_.n_past();
  const int length = prompt_length > 0 ? prompt_length : start + total;
  const int n_layer = model_.transformer->config().n_layer;
  for (int i = 0; i < total;) {
    const int pos = start + i;
    const int n = std::min((pos / n_batch_ + 1) * n_batch_, start + total) - pos;  // to the fresh read's next cut
    if (progress) {
      state_.set_layer_hook([&, i, n](int layer) {
        progress(static_cast<double>(i) + static_cast<double>(n) * (layer + 1) / n_layer, total, timer.seconds());
      });
    }
    state_.set_batch_path(fresh_batch_path(pos, length));
    try {
      logits_ = &state_.eval(tokens.data() + i, n);
    } catch (...) {
      state_.set_batch_path(false);
      state_.set_layer_hook(nullptr);
      state_.set_prefill(false);
      throw;
    }
    i += n;
  }
  state_.set_batch_path(false);
  state_.set_layer_hook(nullptr);
  state_.set_prefill(false);
  prompt_read(tokens);
  return {static_cast<int>(tokens.size()), timer.seconds()};
}

void Session::prompt_read(std::span<const int32_t> tokens) {
  history_.insert(history_.end(), tokens.begin(), tokens.end());
  if (mtp_head_) mtp_head_->read_prompt(history_);  // the MTP head's pass over the prompt
  sampler_.begin(history_);  // an answer starts here: its penalties look back from this point
}

int Session::kept_prefix(const std::vector<int32_t>& prompt) const {
  if (prompt.empty()) return 0;
  const int length = static_cast<int>(prompt.size());
  int keep = 0;
  const int limit = std::min({static_cast<int>(history_.size()), state_.n_past(), length - 1});
  while (keep < limit && history_[static_cast<size_t>(keep)] == prompt[static_cast<size_t>(keep)] &&
         state_.row_took_batch_path(keep) == fresh_batch_path(keep, length)) {
    ++keep;
  }
  return keep;
}

int Session::keep_prefix(const std::vector<int32_t>& prompt) {
  if (prompt.empty()) fail("the prompt is empty");
  const int keep = kept_prefix(prompt);
  try {
    state_.truncate(keep);
  } catch (...) {  // a recurrent state's replay failed part-way: the history ends where it did
    history_.resize(std::min(history_.size(), static_cast<size_t>(state_.n_past())));
    throw;
  }
  history_.resize(static_cast<size_t>(keep));
  return keep;
}

int Session::prefill_reusing(const std::vector<int32_t>& prompt, PrefillRecord* record, const PrefillProgress& progress) {
  const size_t keep = static_cast<size_t>(keep_prefix(prompt));
  PrefillProgress whole;  // the progress over the whole prompt, the kept prefix included
  if (progress) {
    whole = [&progress, keep, total = static_cast<int>(prompt.size())](double done, int, double seconds) {
      progress(static_cast<double>(keep) + done, total, seconds);
    };
  }
  const PrefillRecord r =
      prefill(std::vector<int32_t>(prompt.begin() + static_cast<std::ptrdiff_t>(keep), prompt.end()), whole, static_cast<int>(prompt.size()));
  if (record) *record = r;
  return static_cast<int>(keep);
}

int32_t Session::sample(const TokenFilter* filter) {
  if (logits_ == nullptr) fail("internal: sample() before prefill()");
  if (pending_sample_) {
    const int32_t token = *pending_sample_;
    pending_sample_.reset();
    return token;
  }
  const int n_vocab = model_.transformer->config().n_vocab;
  return filter ? sampler_.sample(logits_->data(), n_vocab, *filter) : sampler_.sample(logits_->data(), n_vocab);
}

Session::StepStart Session::step_start() const { return {model_.experts->stats(), read_process_counters()}; }

const TokenRecord& Session::accept(int32_t token) {
  const StepStart before = step_start();
  Stopwatch timer;
  state_.eval(&token, 1);
  took(token);
  record(token, timer.seconds(), before, 0, 1, 1);
  return records_.back();
}

void Session::took(int32_t token) {
  logits_ = &state_.logits();
  history_.push_back(token);
  sampler_.accept(token);
}

int Session::accept_draft(int32_t token, const std::vector<int32_t>& draft) {
  if (draft.empty()) {
    accept(token);
    return 0;
  }
  const StepStart before = step_start();
  const Stopwatch timer;
  return verify(token, draft, before, timer);
}

int Session::draft_and_accept(int32_t token, const std::function<std::vector<int32_t>()>& propose) {
  const StepStart before = step_start();
  const Stopwatch timer;
  const std::vector<int32_t> draft = propose();
  if (!draft.empty()) return verify(token, draft, before, timer);
  state_.eval(&token, 1);
  took(token);
  record(token, timer.seconds(), before, 0, 1, 1);
  return 0;
}

int Session::verify(int32_t token, const std::vector<int32_t>& draft, const StepStart& before, const Stopwatch& timer) {
  std::vector<int32_t> batch;
  batch.reserve(draft.size() + 1);
  batch.push_back(token);
  batch.insert(batch.end(), draft.begin(), draft.end());
  const int n = static_cast<int>(batch.size());
  const int start = state_.n_past();
  const std::vector<float>& all = state_.eval(batch.data(), n, /*all_logits=*/true);
  const int kept = keep_verified(batch, all.data(), start);
  const double wall = timer.seconds();
  for (int i = 0; i <= kept; ++i) record(batch[static_cast<size_t>(i)], wall, before, i, kept + 1, n);
  return kept;
}

int Session::judge_draft(std::span<const int32_t> draft, const float* rows) {
  const int n_vocab = model_.transformer->config().n_vocab;
  // Row i holds the logits after batch[i]: draft[i] survives when it is their argmax, or the
  // sampler's draw from them.
  int kept = 0;
  for (; kept <= static_cast<int>(draft.size()); ++kept) {
    const float* logits = rows + static_cast<size_t>(kept) * n_vocab;
    if (!sampled_) {
      if (kept == static_cast<int>(draft.size()) || Sampler::argmax(logits, n_vocab) != draft[static_cast<size_t>(kept)]) break;
      continue;
    }
    const int32_t draw = sampler_.sample(logits, n_vocab);
    if (kept == static_cast<int>(draft.size()) || draw != draft[static_cast<size_t>(kept)]) {
      pending_sample_ = draw;
      break;
    }
  }
  return kept;
}

int Session::keep_verified(std::span<const int32_t> batch, const float* rows, int start) {
  const int kept = judge_draft(batch.subspan(1), rows);
  const int n_vocab = model_.transformer->config().n_vocab;
  const float* row = rows + static_cast<size_t>(kept) * n_vocab;
  draft_logits_.assign(row, row + n_vocab);  // before truncate, whose replay may overwrite the rows
  logits_ = &draft_logits_;
  state_.truncate(start + 1 + kept);  // drop the rejected tail's KV rows
  for (int i = 0; i <= kept; ++i) {
    history_.push_back(batch[static_cast<size_t>(i)]);
    sampler_.accept(batch[static_cast<size_t>(i)]);
  }
  return kept;
}

// Appends the record of one kept token: share `share` of `of` equal parts of a pass that cost
// `wall_seconds` and moved the expert counters from `before` to now.
void Session::record(int32_t token, double wall_seconds, const StepStart& start, int share, int of, int batch, int parts) {
  const ExpertStats after = model_.experts->stats();
  const ProcessCounters process = read_process_counters();
  const ExpertStats& before = start.experts;
  auto part = [&](uint64_t total) {
    const uint64_t base = total / static_cast<uint64_t>(of);
    const uint64_t mine = base * static_cast<uint64_t>(parts);
    return share == 0 ? mine + (total - base * static_cast<uint64_t>(of)) : mine;  // remainder on the first
  };
  const double fraction = static_cast<double>(parts) / of;
  TokenRecord r;
  r.index = static_cast<int>(records_.size());
  r.token = token;
  r.batch = batch;
  r.wall_ms = wall_seconds * 1e3 * fraction;
  r.stall_ms = (after.stall_seconds - before.stall_seconds) * 1e3 * fraction;
  r.io_ms = (after.io_busy_seconds - before.io_busy_seconds) * 1e3 * fraction;
  r.compute_ms = std::max(0.0, r.wall_ms - r.stall_ms);
  r.routed = part(after.requests - before.requests);
  r.hits = part(after.hits - before.hits);
  // hits + misses = routed must hold per row: misses follow from the other two shares.
  r.misses = r.routed >= r.hits ? r.routed - r.hits : 0;
  r.bytes_read = part(after.bytes_read - before.bytes_read);
  r.copied_bytes = part(after.copied_bytes - before.copied_bytes);
  r.cache_used = after.cache_used_bytes;
  r.overlapped = after.overlapped_passes > before.overlapped_passes;
  r.steady = before.cache_full || before.cache_budget_bytes == 0;
  r.cpu_ms = (process.cpu_seconds - start.process.cpu_seconds) * 1e3 * fraction;
  r.minor_faults = part(process.minor_faults - start.process.minor_faults);
  r.context_switches = part(process.context_switches() - start.process.context_switches());
  r.involuntary_switches = part(process.involuntary_switches - start.process.involuntary_switches);
  r.buffer_allocations = part(after.buffer_allocations - before.buffer_allocations);
  records_.push_back(r);
}

std::vector<float> Session::embed(const std::vector<int32_t>& tokens, Pooling pooling) {
  if (tokens.empty()) fail("the input is empty");
  reset();
  const int E = model_.transformer->config().n_embd;
  std::vector<double> sum(static_cast<size_t>(E), 0.0);
  for (size_t i = 0; i < tokens.size(); i += static_cast<size_t>(n_batch_)) {
    const int n = static_cast<int>(std::min<size_t>(static_cast<size_t>(n_batch_), tokens.size() - i));
    const std::vector<float>& rows = state_.eval_hidden(tokens.data() + i, n);
    for (int r = 0; r < n; ++r) {
      const size_t position = i + static_cast<size_t>(r);
      const bool pooled = pooling == Pooling::Mean || (pooling == Pooling::Cls && position == 0) ||
                          (pooling == Pooling::Last && position + 1 == tokens.size());
      if (!pooled) continue;
      for (int e = 0; e < E; ++e) sum[static_cast<size_t>(e)] += rows[static_cast<size_t>(r) * E + e];
    }
  }
  history_ = tokens;
  double norm = 0.0;
  for (double& v : sum) {
    if (pooling == Pooling::Mean) v /= static_cast<double>(tokens.size());
    norm += v * v;
  }
  norm = std::sqrt(norm);
  std::vector<float> out(sum.size());
  for (size_t e = 0; e < sum.size(); ++e) out[e] = static_cast<float>(norm > 0.0 ? sum[e] / norm : 0.0);
  return out;
}

void Session::reset() {
  pending_sample_.reset();
  state_.truncate(0);
  history_.clear();
  logits_ = nullptr;
  records_.clear();
}

}  // namespace bmoe
