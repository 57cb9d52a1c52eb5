#include "model/batch_pass.h"

#include <algorithm>

#include "core/error.h"
#include "model/hyper_connections.h"

namespace bmoe {

BatchPass::BatchPass(Transformer& model, ThreadPool& pool)
    : model_(model), cfg_(model.config()), pool_(pool), ffns_(model.config()),
      experts_(model.config(), model.weights(), pool, hooks_, *this) {
  // Each state's own route hook sees its own rows, numbered as in its own pass, with its own
  // prefill and replay flags, as when it runs alone.
  hooks_.route = [this](RouteEvent& ev) {
    const size_t seq = static_cast<size_t>(row_state_[static_cast<size_t>(ev.row)]);
    InferenceState& s = *states_[seq];
    if (!s.hooks_.route) return;
    ev.row -= first_[seq];
    ev.prefill = s.hooks_.prefill;
    ev.replay = s.hooks_.replay;
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
  ones_.assign(states.size(), 1);
  run(states, tokens, ones_);
}

void BatchPass::check(std::span<InferenceState* const> states, std::span<const int32_t> tokens,
                      std::span<const int> counts) {
  if (states.empty()) fail("internal: a batch without sequences");
  if (states.size() != counts.size()) fail("internal: {} sequences but {} row counts", states.size(), counts.size());
  size_t rows = 0;
  for (size_t i = 0; i < states.size(); ++i) {
    if (counts[i] <= 0) fail("internal: a sequence without rows in a batch");
    rows += static_cast<size_t>(counts[i]);
    if (&states[i]->model_ != &model_) fail("internal: a batch of sequences of different models");
    if (std::find(states.begin(), states.begin() + static_cast<std::ptrdiff_t>(i), states[i]) != states.begin() + static_cast<std::ptrdiff_t>(i)) {
      fail("internal: a sequence twice in one batch");
    }
  }
  if (rows != tokens.size()) fail("internal: {} rows but {} tokens", rows, tokens.size());
}

void BatchPass::run(std::span<InferenceState* const> states, std::span<const int32_t> tokens, std::span<const int> counts,
                    std::span<const uint8_t> all_logits) {
  check(states, tokens, counts);
  if (!all_logits.empty() && all_logits.size() != states.size()) fail("internal: {} logits flags for {} sequences", all_logits.size(), states.size());
  states_ = states;
  first_.clear();
  count_.assign(counts.begin(), counts.end());
  all_logits_.assign(states.size(), 0);
  std::copy(all_logits.begin(), all_logits.end(), all_logits_.begin());
  row_state_.clear();
  for (size_t i = 0; i < states.size(); ++i) {
    first_.push_back(static_cast<int>(row_state_.size()));
    row_state_.insert(row_state_.end(), static_cast<size_t>(counts[i]), static_cast<int>(i));
  }
  size_t begun = 0;
  try {
    for (; begun < states.size(); ++begun) states[begun]->begin_rows(&tokens[static_cast<size_t>(first_[begun])], count_[begun]);
    begin(states, tokens);
    run_layers(states);
    keep_hidden_rows(states);
    output_head(states);
  } catch (...) {
    for (size_t i = 0; i < begun; ++i) states[i]->abandon_rows(count_[i]);
    states_ = {};
    throw;
  }
  for (size_t i = 0; i < states.size(); ++i) states[i]->n_past_ += count_[i];
  states_ = {};
}

// The batch's residual rows start as the states' embedded rows (every hyper-connection stream of
// them, deepseek4), at their own positions; each row's token id goes to the hash-routed layers.
void BatchPass::begin(std::span<InferenceState* const> states, std::span<const int32_t> tokens) {
  const int streams = std::max(1, cfg_.hc.streams);
  const size_t width = static_cast<size_t>(cfg_.n_embd) * static_cast<size_t>(streams);
  residual_.resize(static_cast<int>(tokens.size()), cfg_.n_embd, streams);
  positions_.resize(tokens.size());
  tokens_.assign(tokens.begin(), tokens.end());
  for (size_t i = 0; i < states.size(); ++i) {
    InferenceState& s = *states[i];
    for (int r = 0; r < count_[i]; ++r) {
      std::copy_n(s.residual_.streams_of(r), width, residual_.streams_of(first_[i] + r));
      positions_[static_cast<size_t>(first_[i] + r)] = s.n_past_ + r;
    }
  }
  experts_.set_tokens(tokens_.data());
}

// A mixer that cannot run the rows together runs each state's rows alone on the state's own
// residual, as its own pass: the rows' streams, and with several streams the pre-mix's rows, post
// and comb that its add() mixes the output back with, go there and come back.
void BatchPass::mix_alone(InferenceState& s, Mixer& unit, const LayerWeights& L, int layer, const Mixer::SequenceRows& rows) {
  const int E = cfg_.n_embd, streams = residual_.streams();
  const size_t width = static_cast<size_t>(E) * static_cast<size_t>(streams);
  ResidualStream& own = s.residual_;
  for (int r = 0; r < rows.n; ++r) {
    std::copy_n(residual_.streams_of(rows.first + r), width, own.streams_of(r));
    if (streams > 1) {
      std::copy_n(residual_.row(rows.first + r), E, own.row(r));
      std::copy_n(residual_.post(rows.first + r), streams, own.post(r));
      std::copy_n(residual_.comb(rows.first + r), streams * streams, own.comb(r));
    }
  }
  unit.forward(L, layer, LayerPass{pool_, cfg_, own, s.positions_.data(), rows.n, rows.batch_path});
  for (int r = 0; r < rows.n; ++r) std::copy_n(own.streams_of(r), width, residual_.streams_of(rows.first + r));
}

// Per layer: the mixer on every row at once where its kind can (attention: projections and output
// batched, each sequence's rows attending over its own KV rows on its own path), else each
// state's mixer on its own rows (the recurrent kinds); then the layer's FFN on all rows at once.
void BatchPass::run_layers(std::span<InferenceState* const> states) {
  const ModelWeights& w = model_.weights();
  hooks_.prefill = false;
  if (hooks_.router) hooks_.router->begin_pass(cfg_.n_layer);
  const LayerPass pass{pool_, cfg_, residual_, positions_.data(), static_cast<int>(tokens_.size()), false};
  const FfnContext ffn{experts_, model_.experts()};
  experts_.hint_hashed_layers(pass.n, model_.experts());
  for (int l = 0; l < cfg_.n_layer; ++l) {
    const LayerWeights& L = w.layers[static_cast<size_t>(l)];
    units_.clear();
    for (size_t i = 0; i < states.size(); ++i) {
      InferenceState& s = *states[i];
      // The path s's own eval() of these rows takes (InferenceState::begin_rows records it).
      units_.push_back({&s.mixers_.at(l), first_[i], count_[i], count_[i] >= kAttentionBatchRows || s.batch_path()});
    }
    if (L.hyper) hyper::pre_mix(pool_, residual_, L.hyper->attn(), cfg_);
    if (!units_[0].unit->forward_sequences(units_, L, l, pass)) {
      for (size_t i = 0; i < states.size(); ++i) mix_alone(*states[i], *units_[i].unit, L, l, units_[i]);
    }
    if (L.hyper) hyper::pre_mix(pool_, residual_, L.hyper->ffn(), cfg_);
    ffns_.at(l).forward(L, l, pass, ffn);
  }
}

// The rows an MTP head reads, for the states that keep them, as their own eval() keeps them (a
// rewind's replay never runs in a batch).
void BatchPass::keep_hidden_rows(std::span<InferenceState* const> states) {
  for (size_t i = 0; i < states.size(); ++i) {
    InferenceState& s = *states[i];
    if (s.keep_hidden_ && !s.replaying_) s.keep_hidden_rows(residual_, first_[i], count_[i]);
  }
}

// The output norm and head on each state's last row, or on all its rows when flagged (all rows
// at once when each state has one); each state gets the logits its eval() gives it.
void BatchPass::output_head(std::span<InferenceState* const> states) {
  const int n = static_cast<int>(states.size());
  head_rows_.clear();
  for (int i = 0; i < n; ++i) {
    const int first = first_[static_cast<size_t>(i)], count = count_[static_cast<size_t>(i)];
    for (int r = all_logits_[static_cast<size_t>(i)] ? first : first + count - 1; r < first + count; ++r) head_rows_.push_back(r);
  }
  const int m = static_cast<int>(head_rows_.size());
  ResidualStream* rows = &residual_;
  if (static_cast<size_t>(m) != tokens_.size()) {
    const size_t width = static_cast<size_t>(cfg_.n_embd) * static_cast<size_t>(residual_.streams());
    last_rows_.resize(m, cfg_.n_embd, residual_.streams());
    for (int k = 0; k < m; ++k) std::copy_n(residual_.streams_of(head_rows_[static_cast<size_t>(k)]), width, last_rows_.streams_of(k));
    rows = &last_rows_;
  }
  output_logits(pool_, model_, *rows, 0, m, head_);
  const size_t V = static_cast<size_t>(model_.weights().output.rows);
  size_t at = 0;
  for (int i = 0; i < n; ++i) {
    const size_t k = all_logits_[static_cast<size_t>(i)] ? static_cast<size_t>(count_[static_cast<size_t>(i)]) : 1;
    const float* row = head_.logits.data() + at * V;
    states[static_cast<size_t>(i)]->head_.logits.assign(row, row + k * V);
    at += k;
  }
}

void BatchPass::route_residual(int layer, std::span<TokenRoute> rows) { experts_.route_residual(layer, rows, residual_); }

}  // namespace bmoe
