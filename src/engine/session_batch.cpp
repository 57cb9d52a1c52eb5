#include "engine/session_batch.h"

#include <algorithm>
#include <memory>

#include "core/error.h"
#include "core/timer.h"
#include "moe/routing_policy.h"

namespace bmoe {

namespace {

// A drafter's cost, paid before the pass, into the record of the step's first kept token.
void add_drafter_cost(TokenRecord& r, const PassPart& drafter) {
  r.wall_ms += drafter.seconds * 1e3;
  r.compute_ms += drafter.seconds * 1e3;
  r.routed += drafter.lookups;
  r.hits += drafter.hits;
  r.misses = r.routed >= r.hits ? r.routed - r.hits : 0;
  r.bytes_read += drafter.bytes_read;
  r.buffer_allocations += drafter.buffer_allocations;
}

}  // namespace

SessionBatch::SessionBatch(LoadedModel& model, ThreadPool& pool) : model_(model), pass_(*model.transformer, pool) {
  pass_.set_router_hook(std::make_unique<RoutingPolicy>());
}

void SessionBatch::accept(std::span<Session* const> sessions, std::span<const int32_t> tokens, const PromptChunk* chunk) {
  if (sessions.size() != tokens.size()) fail("internal: {} sessions but {} tokens", sessions.size(), tokens.size());
  plain_.resize(sessions.size());
  for (size_t i = 0; i < sessions.size(); ++i) plain_[i] = DecodeRows{sessions[i], tokens[i]};
  accept(plain_, chunk);
}

void SessionBatch::accept(std::span<DecodeRows> rows, const PromptChunk* chunk) {
  if (rows.empty() && !chunk) fail("internal: a step without rows");
  states_.clear();
  tokens_.clear();
  counts_.clear();
  all_logits_.clear();
  for (const DecodeRows& r : rows) {
    if (&r.session->model_ != &model_) fail("internal: a session of another model in a batch");
    states_.push_back(&r.session->state_);
    tokens_.push_back(r.token);
    tokens_.insert(tokens_.end(), r.draft.begin(), r.draft.end());
    counts_.push_back(1 + static_cast<int>(r.draft.size()));
    all_logits_.push_back(r.draft.empty() ? 0 : 1);
  }
  if (chunk) begin_chunk(*chunk, rows);
  const Session::StepStart before = (rows.empty() ? chunk->session : rows.front().session)->step_start();
  Stopwatch timer;
  try {
    pass_.run(states_, tokens_, counts_, all_logits_);
  } catch (...) {
    if (chunk) end_chunk(*chunk);
    throw;
  }
  last_chunk_ = {};
  if (chunk) {
    end_chunk(*chunk);
    Session& p = *chunk->session;
    p.logits_ = &p.state_.logits();
    p.prompt_read(chunk->tokens);
    ++chunk_steps_;
    prompt_rows_ += chunk->tokens.size();
  }
  ++steps_;
  size_t decode_rows = 0;
  for (DecodeRows& r : rows) {
    took(r, r.session->state_.n_past() - 1 - static_cast<int>(r.draft.size()));
    decode_rows += 1 + r.draft.size();
  }
  rows_ += decode_rows;
  split_cost(rows, chunk ? chunk->tokens.size() : 0, timer.seconds(), before);
}

// After the pass: a plain row moves its session on as Session::accept would, a drafted one keeps
// what verification keeps (Session::keep_verified; its truncate may replay, inside the step).
void SessionBatch::took(DecodeRows& r, int first_row) {
  Session& s = *r.session;
  if (r.draft.empty()) {
    r.kept = 0;
    s.took(r.token);
    return;
  }
  std::vector<int32_t> batch{r.token};
  batch.insert(batch.end(), r.draft.begin(), r.draft.end());
  r.kept = s.keep_verified(batch, s.state_.logits().data(), first_row);
}

// Splits the pass's cost by rows: each decode row's record gets 1/R of its wall time and expert
// counters (R: all its rows), the chunk the rest; a session that verified a draft holds its rows'
// parts in its kept tokens' records (whole parts each, the first ones one more where they do not
// divide), and its drafter's cost in the first. Why rows and not a time per part: the pass runs
// every row through the same dense matmuls and one expert lookup (and read) for the union of the
// rows' experts, so only the per-state attention and recurrent mixers have a boundary a timer
// could see; the shared work, most of a pass, has none. A row share makes the parts sum exactly
// to the pass (the chunk's integer counters are the pass's less the records'), counts a shared
// read once, and gives the dense work, which grows with the rows, to the rows that caused it.
void SessionBatch::split_cost(std::span<const DecodeRows> rows, size_t chunk_rows, double wall,
                              const Session::StepStart& before) {
  int decode_rows = 0;
  for (const DecodeRows& r : rows) decode_rows += 1 + static_cast<int>(r.draft.size());
  const int all = decode_rows + static_cast<int>(chunk_rows);
  const ExpertStats& b = before.experts;
  const ExpertStats after = model_.experts->stats();
  PassPart pass{1, static_cast<uint64_t>(all), wall, after.requests - b.requests, after.hits - b.hits,
                after.bytes_read - b.bytes_read, after.buffer_allocations - b.buffer_allocations};
  PassPart decoded{decode_rows > 0 ? 1u : 0u, static_cast<uint64_t>(decode_rows), 0, 0, 0, 0, 0};
  int part = 0;
  for (const DecodeRows& r : rows) {
    Session& s = *r.session;
    const int n = 1 + static_cast<int>(r.draft.size()), records = r.kept + 1;
    const size_t first = s.records_.size();
    for (int j = 0; j < records; ++j) {
      const int parts = n / records + (j < n % records ? 1 : 0);
      s.record(j == 0 ? r.token : r.draft[static_cast<size_t>(j - 1)], wall, before, part, all, all, parts);
      part += parts;
    }
    for (size_t k = first; k < s.records_.size(); ++k) {
      const TokenRecord& t = s.records_[k];
      decoded.seconds += t.wall_ms / 1e3;
      decoded.lookups += t.routed;
      decoded.hits += t.hits;
      decoded.bytes_read += t.bytes_read;
      decoded.buffer_allocations += t.buffer_allocations;
    }
    add_drafter_cost(s.records_[first], r.drafter);
  }
  if (chunk_rows > 0) {
    last_chunk_ = {1, chunk_rows, std::max(0.0, pass.seconds - decoded.seconds), pass.lookups - decoded.lookups,
                   pass.hits - decoded.hits, pass.bytes_read - decoded.bytes_read,
                   pass.buffer_allocations - decoded.buffer_allocations};
    prompt_part_ += last_chunk_;
  }
  for (const DecodeRows& r : rows) decoded += r.drafter;  // a drafter's part has no passes or rows
  decode_part_ += decoded;
}

PassPart& PassPart::operator+=(const PassPart& o) {
  passes += o.passes;
  rows += o.rows;
  seconds += o.seconds;
  lookups += o.lookups;
  hits += o.hits;
  bytes_read += o.bytes_read;
  buffer_allocations += o.buffer_allocations;
  return *this;
}

// The chunk's rows go last in the pass, flagged as prompt rows on the attention path a fresh
// read of its prompt gives them (Session::prefill does the same around its eval).
void SessionBatch::begin_chunk(const PromptChunk& chunk, std::span<const DecodeRows> rows) {
  Session& p = *chunk.session;
  if (&p.model_ != &model_) fail("internal: a session of another model in a batch");
  for (const DecodeRows& r : rows) {
    if (r.session == &p) fail("internal: a session reads and decodes in one step");
  }
  if (!reads_prompts(p)) fail("internal: a session with an MTP head reads its prompt alone");
  if (chunk.tokens.empty()) fail("the prompt is empty");
  const int pos = p.state_.n_past(), n = static_cast<int>(chunk.tokens.size());
  if (pos + n > (pos / p.n_batch_ + 1) * p.n_batch_) fail("internal: a prompt chunk across a fresh read's cut");
  p.pending_sample_.reset();  // a draw from logits the prompt replaces
  p.state_.set_prefill(true);
  p.state_.set_batch_path(p.fresh_batch_path(pos, chunk.prompt_length > 0 ? chunk.prompt_length : pos + n));
  states_.push_back(&p.state_);
  tokens_.insert(tokens_.end(), chunk.tokens.begin(), chunk.tokens.end());
  counts_.push_back(n);
  all_logits_.push_back(0);
}

void SessionBatch::end_chunk(const PromptChunk& chunk) {
  chunk.session->state_.set_batch_path(false);
  chunk.session->state_.set_prefill(false);
}

}  // namespace bmoe
