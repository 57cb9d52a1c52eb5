#include "engine/session_batch.h"

#include <algorithm>
#include <memory>

#include "core/error.h"
#include "core/timer.h"
#include "moe/routing_policy.h"

namespace bmoe {

SessionBatch::SessionBatch(LoadedModel& model, ThreadPool& pool) : model_(model), pass_(*model.transformer, pool) {
  pass_.set_router_hook(std::make_unique<RoutingPolicy>());
}

void SessionBatch::accept(std::span<Session* const> sessions, std::span<const int32_t> tokens, const PromptChunk* chunk) {
  if (sessions.size() != tokens.size()) fail("internal: {} sessions but {} tokens", sessions.size(), tokens.size());
  if (sessions.empty() && !chunk) fail("internal: a step without rows");
  states_.clear();
  for (Session* s : sessions) {
    if (&s->model_ != &model_) fail("internal: a session of another model in a batch");
    states_.push_back(&s->state_);
  }
  tokens_.assign(tokens.begin(), tokens.end());
  counts_.assign(sessions.size(), 1);
  if (chunk) begin_chunk(*chunk, sessions);
  const Session::StepStart before = (sessions.empty() ? chunk->session : sessions.front())->step_start();
  Stopwatch timer;
  try {
    pass_.run(states_, tokens_, counts_);
  } catch (...) {
    if (chunk) end_chunk(*chunk);
    throw;
  }
  const double wall = timer.seconds();
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
  rows_ += sessions.size();
  for (size_t i = 0; i < sessions.size(); ++i) sessions[i]->took(tokens[i]);
  split_cost(sessions, tokens, chunk ? chunk->tokens.size() : 0, wall, before);
}

// Splits the pass's cost by rows: each decode row's record gets 1/R of its wall time and expert
// counters (R: all its rows), the chunk the rest. Why rows and not a time per part: the pass runs
// every row through the same dense matmuls and one expert lookup (and read) for the union of the
// rows' experts, so only the per-state attention and recurrent mixers have a boundary a timer
// could see; the shared work, most of a pass, has none. A row share makes the parts sum exactly
// to the pass (the chunk's integer counters are the pass's less the records'), counts a shared
// read once, and gives the dense work, which grows with the rows, to the rows that caused it.
void SessionBatch::split_cost(std::span<Session* const> sessions, std::span<const int32_t> tokens, size_t chunk_rows,
                              double wall, const Session::StepStart& before) {
  const int n = static_cast<int>(sessions.size()), rows = n + static_cast<int>(chunk_rows);
  const ExpertStats& b = before.experts;
  const ExpertStats after = model_.experts->stats();
  PassPart pass{1, static_cast<uint64_t>(rows), wall, after.requests - b.requests, after.hits - b.hits,
                after.bytes_read - b.bytes_read, after.buffer_allocations - b.buffer_allocations};
  PassPart decoded{n > 0 ? 1u : 0u, static_cast<uint64_t>(n), 0, 0, 0, 0, 0};
  for (int i = 0; i < n; ++i) {
    Session& s = *sessions[static_cast<size_t>(i)];
    s.record(tokens[static_cast<size_t>(i)], wall, before, i, rows, rows);
    const TokenRecord& r = s.records_.back();
    decoded.seconds += r.wall_ms / 1e3;
    decoded.lookups += r.routed;
    decoded.hits += r.hits;
    decoded.bytes_read += r.bytes_read;
    decoded.buffer_allocations += r.buffer_allocations;
  }
  decode_part_ += decoded;
  if (chunk_rows == 0) return;
  last_chunk_ = {1, chunk_rows, std::max(0.0, pass.seconds - decoded.seconds), pass.lookups - decoded.lookups,
                 pass.hits - decoded.hits, pass.bytes_read - decoded.bytes_read,
                 pass.buffer_allocations - decoded.buffer_allocations};
  prompt_part_ += last_chunk_;
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
void SessionBatch::begin_chunk(const PromptChunk& chunk, std::span<Session* const> sessions) {
  Session& p = *chunk.session;
  if (&p.model_ != &model_) fail("internal: a session of another model in a batch");
  if (std::find(sessions.begin(), sessions.end(), &p) != sessions.end()) fail("internal: a session reads and decodes in one step");
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
}

void SessionBatch::end_chunk(const PromptChunk& chunk) {
  chunk.session->state_.set_batch_path(false);
  chunk.session->state_.set_prefill(false);
}

}  // namespace bmoe
