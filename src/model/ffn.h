// The FFN kinds (what runs on each token after the mixer) as units: dense, routed MoE, MoE plus
// a gated or an ungated shared expert, and a dense FFN beside the experts (gemma4). A unit reads the residual
// stream, adds its output to it and owns its scratch; the kinds with experts route and compute
// them through the sequence's RoutedExperts. A sequence holds one unit per kind its plan uses.
#pragma once

#include <memory>
#include <vector>

#include "model/config.h"
#include "model/layer_pass.h"
#include "model/matmul.h"
#include "model/routed_experts.h"
#include "model/weights.h"
#include "expert_source/expert_source.h"

namespace bmoe {

// What an FFN unit may use besides the pass: the experts of the sequence and their source.
struct FfnContext {
  RoutedExperts& experts;
  ExpertSource& source;
};

class Ffn {
 public:
  virtual ~Ffn() = default;
  // Runs `layer` (of this unit's kind) on the pass's rows.
  virtual void forward(const LayerWeights& L, int layer, const LayerPass& pass, const FfnContext& ctx) = 0;
};

// The units of one sequence, and which runs each layer.
class Ffns {
 public:
  explicit Ffns(const ModelConfig& c);
  Ffn& at(int layer) { return *by_layer_[static_cast<size_t>(layer)]; }

 private:
  std::vector<std::unique_ptr<Ffn>> units_;
  std::vector<Ffn*> by_layer_;
};

}  // namespace bmoe
