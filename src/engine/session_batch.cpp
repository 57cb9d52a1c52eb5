#include "engine/session_batch.h"

#include <memory>

#include "core/error.h"
#include "core/timer.h"
#include "moe/routing_policy.h"

namespace bmoe {

SessionBatch::SessionBatch(LoadedModel& model, ThreadPool& pool) : model_(model), pass_(*model.transformer, pool) {
  pass_.set_router_hook(std::make_unique<RoutingPolicy>());
}

void SessionBatch::accept(std::span<Session* const> sessions, std::span<const int32_t> tokens) {
  if (sessions.size() != tokens.size()) fail("internal: {} sessions but {} tokens", sessions.size(), tokens.size());
  states_.clear();
  for (Session* s : sessions) {
    if (&s->model_ != &model_) fail("internal: a session of another model in a batch");
    states_.push_back(&s->state_);
  }
  const Session::StepStart before = sessions.front()->step_start();
  Stopwatch timer;
  pass_.decode(states_, tokens);
  const double wall = timer.seconds();
  ++steps_;
  rows_ += sessions.size();
  const int n = static_cast<int>(sessions.size());
  for (int i = 0; i < n; ++i) {
    Session& s = *sessions[static_cast<size_t>(i)];
    s.took(tokens[static_cast<size_t>(i)]);
    s.record(tokens[static_cast<size_t>(i)], wall, before, i, n, n);
  }
}

}  // namespace bmoe
