// Route hooks: recording each routing decision to a trace (--route-trace) and forcing the
// routing from a recorded trace (--route-replay, benchmark-only and lossy: a synthetic model
// then requests experts the way a real model did).
#pragma once

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "engine/loader.h"
#include "model/transformer.h"
#include "moe/route_trace.h"

namespace bmoe {

class RouteRecorder {
 public:
  RouteRecorder(const std::string& path, LoadedModel& model);
  void on_route(const RouteEvent& e);

 private:
  std::unique_ptr<RouteTraceWriter> writer_;
  LoadedModel& model_;
  std::vector<uint64_t> expert_bytes_;
};

class RouteReplayer {
 public:
  // Checks the trace fits the model (layers, expert ids).
  RouteReplayer(const std::string& path, const ModelConfig& config);
  // The same trace (shared, not copied) replayed `offset` steps further on in both phases, for a
  // sequence of its own: with --parallel, sequence i replays from i x stride, so the rows of a
  // batch route as different stretches of one real conversation.
  RouteReplayer starting_at(int offset) const;
  // Replaces the event's experts and weights with the trace's for the same phase and step:
  // prompt position i takes the trace's (offset + i)-th prompt step, decode token j its
  // (offset + j)-th decode step, both cycling when the trace is shorter.
  void on_route(RouteEvent& e);
  int decode_steps() const { return static_cast<int>(steps_->decode.size()); }
  int prompt_steps() const { return static_cast<int>(steps_->prompt.size()); }

 private:
  using Step = std::vector<std::vector<std::pair<int, float>>>;  // [layer] -> (expert, weight) by slot
  struct Steps {
    std::vector<Step> prompt;
    std::vector<Step> decode;
  };
  RouteReplayer() = default;
  std::shared_ptr<const Steps> steps_;
  int offset_ = 0;
  int first_decode_position_ = -1;
};

}  // namespace bmoe
