#include "model/batch_pass.h"

#include <algorithm>

#include "core/error.h"

namespace bmoe {

BatchPass::BatchPass(Transformer& model, ThreadPool& pool)
    : model_(model), cfg_(model.config()), pool_(pool), ffns_(model.config()),
      experts_(model.config(), model.weights(), pool, hooks_, *this) {
  // One row per sequence in one residual stream, routed by the router alone: a model with
  // several residual streams or token-hashed routing (deepseek4) runs one sequence at a time.
  if (cfg_.hc.streams > 1 || cfg_.n_hash_layers > 0) {
    fail("{} cannot decode several sequences in one pass yet (hyper-connections, hash routing): use --parallel 1",
         cfg_.arch);
  }
  // Each state's own route hook sees its rows, as when it decodes alone.
  hooks_.route = [this](RouteEvent& ev) {
    InferenceState& s = *states_[static_cast<size_t>(ev.row)];
    if (!s.hooks_.route) return;
    ev.row = 0;
    s.hooks_.route(ev);
  };
}

void BatchPass::set_routing_options(const RoutingOptions& options) {
  if (hooks_.router) {
    hooks_.router->set_options(options);
    return;
  }
  if (options.prefetch != 0 || options.route_ahead != 0 || options.drop_cold != 0.0f) {
    fail("internal: routing options need a router hook (set_router_hook)");
  }
}

void BatchPass::decode(std::span<InferenceState* const> states, std::span<const int32_t> tokens) {
  if (states.empty()) fail("internal: a batch without sequences");
  if (states.size() != tokens.size()) fail("internal: {} sequences but {} tokens", states.size(), tokens.size());
  for (size_t i = 0; i < states.size(); ++i) {
    if (&states[i]->model_ != &model_) fail("internal: a batch of sequences of different models");
    if (std::find(states.begin(), states.begin() + static_cast<std::ptrdiff_t>(i), states[i]) != states.begin() + static_cast<std::ptrdiff_t>(i)) {
      fail("internal: a sequence twice in one batch");
    }
  }
  states_ = states;
  size_t begun = 0;
  try {
    for (; begun < states.size(); ++begun) states[begun]->begin_rows(&tokens[begun], 1);
    begin(states, tokens);
    run_layers(states);
    output_head(states);
  } catch (...) {
    for (size_t i = 0; i < begun; ++i) states[i]->abandon_rows(1);
    states_ = {};
    throw;
  }
  for (InferenceState* s : states) ++s->n_past_;
  states_ = {};
}

// The batch's residual rows start as the states' embedded rows, at their own positions.
void BatchPass::begin(std::span<InferenceState* const> states, std::span<const int32_t>) {
  const int n = static_cast<int>(states.size());
  residual_.resize(n, cfg_.n_embd);
  positions_.resize(states.size());
  for (int i = 0; i < n; ++i) {
    const InferenceState& s = *states[static_cast<size_t>(i)];
    std::copy_n(s.residual_.row(0), cfg_.n_embd, residual_.row(i));
    positions_[static_cast<size_t>(i)] = s.n_past_;
  }
}

// Per layer: the mixer on every row at once where its kind can (attention: projections and output
// batched, each row attending over its own sequence's KV rows), else each state's mixer on its own
// row (the recurrent kinds); then the layer's FFN on all rows at once.
void BatchPass::run_layers(std::span<InferenceState* const> states) {
  const ModelWeights& w = model_.weights();
  const int n = static_cast<int>(states.size()), E = cfg_.n_embd;
  hooks_.prefill = false;
  if (hooks_.router) hooks_.router->begin_pass(cfg_.n_layer);
  const LayerPass pass{pool_, cfg_, residual_, positions_.data(), n, false};
  const FfnContext ffn{experts_, model_.experts()};
  for (int l = 0; l < cfg_.n_layer; ++l) {
    const LayerWeights& L = w.layers[static_cast<size_t>(l)];
    units_.clear();
    for (InferenceState* s : states) units_.push_back(&s->mixers_.at(l));
    if (!units_[0]->forward_sequences(units_, L, l, pass)) {
      for (int i = 0; i < n; ++i) {
        InferenceState& s = *states[static_cast<size_t>(i)];
        std::copy_n(residual_.row(i), E, s.residual_.row(0));
        units_[static_cast<size_t>(i)]->forward(L, l, LayerPass{pool_, cfg_, s.residual_, s.positions_.data(), 1, false});
        std::copy_n(s.residual_.row(0), E, residual_.row(i));
      }
    }
    ffns_.at(l).forward(L, l, pass, ffn);
  }
}

// The output norm and head on every row at once; each state gets its row's logits.
void BatchPass::output_head(std::span<InferenceState* const> states) {
  const int n = static_cast<int>(states.size());
  output_logits(pool_, model_, residual_, 0, n, head_);
  const size_t V = static_cast<size_t>(model_.weights().output.rows);
  for (int i = 0; i < n; ++i) {
    const float* row = head_.logits.data() + static_cast<size_t>(i) * V;
    states[static_cast<size_t>(i)]->head_.logits.assign(row, row + V);
  }
}

void BatchPass::route_residual(int layer, std::span<TokenRoute> rows) { experts_.route_residual(layer, rows, residual_); }

}  // namespace bmoe
