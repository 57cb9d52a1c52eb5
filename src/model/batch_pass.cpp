#include "model/batch_pass.h"

#include <algorithm>

#include "core/error.h"
#include "model/hyper_connections.h"

namespace bmoe {

BatchPass::BatchPass(Transformer& model, ThreadPool& pool)
    : model_(model), cfg_(model.config()), pool_(pool), ffns_(model.config()),
      experts_(model.config(), model.weights(), pool, hooks_, *this) {
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

// The batch's residual rows start as the states' embedded rows (every hyper-connection stream of
// them, deepseek4), at their own positions; each row's token id goes to the hash-routed layers.
void BatchPass::begin(std::span<InferenceState* const> states, std::span<const int32_t> tokens) {
  const int n = static_cast<int>(states.size());
  const int streams = std::max(1, cfg_.hc.streams);
  const size_t width = static_cast<size_t>(cfg_.n_embd) * static_cast<size_t>(streams);
  residual_.resize(n, cfg_.n_embd, streams);
  positions_.resize(states.size());
  tokens_.assign(tokens.begin(), tokens.end());
  for (int i = 0; i < n; ++i) {
    InferenceState& s = *states[static_cast<size_t>(i)];
    std::copy_n(s.residual_.streams_of(0), width, residual_.streams_of(i));
    positions_[static_cast<size_t>(i)] = s.n_past_;
  }
  experts_.set_tokens(tokens_.data());
}

// A mixer that cannot run the rows together runs each state's row alone on the state's own
// residual: the row's streams, and with several streams the pre-mix's row, post and comb that
// its add() mixes the output back with, go there and come back.
void BatchPass::mix_alone(InferenceState& s, Mixer& unit, const LayerWeights& L, int layer, int i) {
  const int E = cfg_.n_embd, streams = residual_.streams();
  ResidualStream& own = s.residual_;
  std::copy_n(residual_.streams_of(i), static_cast<size_t>(E) * static_cast<size_t>(streams), own.streams_of(0));
  if (streams > 1) {
    std::copy_n(residual_.row(i), E, own.row(0));
    std::copy_n(residual_.post(i), streams, own.post(0));
    std::copy_n(residual_.comb(i), streams * streams, own.comb(0));
  }
  unit.forward(L, layer, LayerPass{pool_, cfg_, own, s.positions_.data(), 1, false});
  std::copy_n(own.streams_of(0), static_cast<size_t>(E) * static_cast<size_t>(streams), residual_.streams_of(i));
}

// Per layer: the mixer on every row at once where its kind can (attention: projections and output
// batched, each row attending over its own sequence's KV rows), else each state's mixer on its own
// row (the recurrent kinds); then the layer's FFN on all rows at once.
void BatchPass::run_layers(std::span<InferenceState* const> states) {
  const ModelWeights& w = model_.weights();
  const int n = static_cast<int>(states.size());
  hooks_.prefill = false;
  if (hooks_.router) hooks_.router->begin_pass(cfg_.n_layer);
  const LayerPass pass{pool_, cfg_, residual_, positions_.data(), n, false};
  const FfnContext ffn{experts_, model_.experts()};
  experts_.hint_hashed_layers(n, model_.experts());
  for (int l = 0; l < cfg_.n_layer; ++l) {
    const LayerWeights& L = w.layers[static_cast<size_t>(l)];
    units_.clear();
    for (InferenceState* s : states) units_.push_back(&s->mixers_.at(l));
    if (L.hyper) hyper::pre_mix(pool_, residual_, L.hyper->attn(), cfg_);
    if (!units_[0]->forward_sequences(units_, L, l, pass)) {
      for (int i = 0; i < n; ++i) mix_alone(*states[static_cast<size_t>(i)], *units_[static_cast<size_t>(i)], L, l, i);
    }
    if (L.hyper) hyper::pre_mix(pool_, residual_, L.hyper->ffn(), cfg_);
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
