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
  const int n = static_cast<int>(sessions.size());
  for (int i = 0; i < n; ++i) {
    Session& s = *sessions[static_cast<size_t>(i)];
    s.took(tokens[static_cast<size_t>(i)]);
    s.record(tokens[static_cast<size_t>(i)], wall, before, i, n, n);
  }
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
