// Several sessions of one model fed together, one token each per step (continuous batching):
// one forward pass (model/batch_pass.h) in which the routed experts that several sequences chose
// are asked of the expert source once. Each session moves on exactly as Session::accept would
// move it (logits, history, sampler, a record), the step's cost shared equally among them.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "engine/session.h"
#include "model/batch_pass.h"

namespace bmoe {

class SessionBatch {
 public:
  SessionBatch(LoadedModel& model, ThreadPool& pool);
  // The lossless options act as in a session; the lossy ones act on batches of one only.
  void set_routing_options(const RoutingOptions& options) { pass_.set_routing_options(options); }
  // Feeds tokens[i] to sessions[i] in one pass; every session must be of this batch's model.
  void accept(std::span<Session* const> sessions, std::span<const int32_t> tokens);
  // Steps run, the rows they fed (a step's rows are its sessions), and how much the rows
  // shared experts (BatchPass::routed_slots).
  uint64_t steps() const { return steps_; }
  uint64_t rows() const { return rows_; }
  uint64_t routed_slots() const { return pass_.routed_slots(); }
  uint64_t distinct_experts() const { return pass_.distinct_experts(); }

 private:
  LoadedModel& model_;
  BatchPass pass_;
  std::vector<InferenceState*> states_;
  uint64_t steps_ = 0;
  uint64_t rows_ = 0;
};

}  // namespace bmoe
