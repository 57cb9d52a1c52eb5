#include "model/transformer.h"

#include <algorithm>
#include <cmath>

#include "core/error.h"
#include "model/hyper_connections.h"
#include "model/ops.h"
#include "quant/quant.h"

namespace bmoe {

Transformer::Transformer(ModelConfig config, ModelWeights weights, ExpertSource* experts)
    : config_(std::move(config)), weights_(std::move(weights)), experts_(experts) {}

InferenceState::InferenceState(Transformer& model, ThreadPool& pool, int n_ctx, KvType kv_type, int rewind_slack)
    : model_(model), cfg_(model.config_), pool_(pool), n_ctx_(n_ctx),
      mixers_(model.config_, n_ctx > 0 ? n_ctx : 1, kv_type, rewind_slack),
      ffns_(model.config_),
      experts_(model.config_, model.weights_, pool, hooks_, *this) {
  if (n_ctx <= 0) fail("context size must be positive");
  rewind_reach_ = mixers_.rewind_reach();
}

void InferenceState::truncate(int n) {
  n = std::clamp(n, 0, n_past_);
  forget_hidden_rows(n);
  if (!rewinds_by_replay()) {
    n_past_ = n;
    token_batch_path_.resize(static_cast<size_t>(n));
    return;
  }
  if (n == n_past_ && !recurrent_dirty_) return;
  if (!recurrent_dirty_ && n_past_ - n <= rewind_reach_) {  // the state still holds what n needs
    n_past_ = n;
    tokens_.resize(static_cast<size_t>(n));
    token_batch_path_.resize(static_cast<size_t>(n));
    if (checkpoint_pos_ > n) checkpoint_pos_ = -1;  // the copy holds tokens that are gone
    return;
  }
  if (restore_row_state(n)) return;
  int start = 0;
  if (!recurrent_dirty_ && checkpoint_pos_ >= 0 && checkpoint_pos_ <= n) {
    mixers_.restore_state();
    start = checkpoint_pos_;
  } else {
    mixers_.clear_state();
    checkpoint_pos_ = -1;  // it may hold tokens that are gone
    row_states_n_ = 0;
  }
  recurrent_dirty_ = false;
  replay(start, n);
}

// A rewind into the last eval's rows, when it kept copies: the state after the row at n - 1 is
// its copy, bit for bit what that row left (the rows are the tokens the sequence keeps).
bool InferenceState::restore_row_state(int n) {
  const int row = n - row_states_from_ - 1;
  if (recurrent_dirty_ || row < 0 || row >= row_states_n_) return false;
  mixers_.restore_row_state(row);
  n_past_ = n;
  tokens_.resize(static_cast<size_t>(n));
  token_batch_path_.resize(static_cast<size_t>(n));
  row_states_n_ = row;  // copies past n hold tokens that are gone
  ++row_state_rewinds_;
  return true;
}

// Before an eval of n rows: copies of the state after each row but the last when n is short (a
// verification pass is 1 + k rows; longer evals, prompts, keep none), so the copies cost at most
// row_state_limit_ times the recurrent state.
void InferenceState::keep_row_states(int n) {
  const int rows = n > 1 && n - 1 <= row_state_limit_ ? n - 1 : 0;
  const bool kept = mixers_.keep_row_states(rows) && rows > 0;
  row_states_from_ = n_past_;
  row_states_n_ = kept ? rows : 0;
}

// Evaluates tokens_[start, end) again from position start, each on the attention path it first
// took (the batch path for rows of an eval of >= kAttentionBatchRows, the decode path otherwise):
// a row's result then equals its first one, whatever batches the replay uses.
void InferenceState::replay(int start, int end) {
  const std::vector<int32_t> ids(tokens_.begin() + start, tokens_.begin() + end);
  const std::vector<uint8_t> paths(token_batch_path_.begin() + start, token_batch_path_.begin() + end);
  n_past_ = start;
  tokens_.resize(static_cast<size_t>(start));
  token_batch_path_.resize(static_cast<size_t>(start));
  hooks_.replay = true;  // the route hook sees these rows as replayed (RouteEvent::replay)
  std::function<void(int)> layer_hook = std::move(layer_hook_);
  layer_hook_ = nullptr;
  replaying_ = true;  // the replayed rows' hidden states were kept (or taken) the first time
  try {
    for (size_t i = 0; i < ids.size();) {
      const bool first_batch = paths[i] != 0;
      const size_t limit = first_batch ? 512 : kAttentionBatchRows - 1;
      size_t j = i;
      while (j < ids.size() && paths[j] == paths[i] && j - i < limit) ++j;
      replay_batch_path_ = first_batch;
      eval(ids.data() + i, static_cast<int>(j - i));
      i = j;
    }
  } catch (...) {
    replay_batch_path_ = false;
    replaying_ = false;
    hooks_.replay = false;
    layer_hook_ = std::move(layer_hook);
    throw;
  }
  replay_batch_path_ = false;
  replaying_ = false;
  hooks_.replay = false;
  layer_hook_ = std::move(layer_hook);
}

const std::vector<float>& InferenceState::eval(const int32_t* tokens, int n, bool all_logits) {
  advance(tokens, n);
  return output_head(all_logits ? 0 : n - 1, n);
}

const std::vector<float>& InferenceState::eval_hidden(const int32_t* tokens, int n) {
  advance(tokens, n);
  normalize_rows(0, n);
  return head_.h;
}

void InferenceState::advance(const int32_t* tokens, int n) {
  begin_rows(tokens, n);
  try {
    run_layers(n);
  } catch (...) {
    abandon_rows(n);
    throw;
  }
  if (keep_hidden_ && !replaying_) keep_hidden_rows(residual_, 0, n);
  n_past_ += n;
}

// Checks that n tokens fit, embeds them and books them for a recurrent rewind (saving the state
// before a multi-token eval); the layers then run, and n_past_ moves on, or abandon_rows undoes.
void InferenceState::begin_rows(const int32_t* tokens, int n) {
  if (n <= 0) fail("eval: no tokens");
  if (recurrent_dirty_) truncate(n_past_);  // first rebuild what a failed eval left half done
  if (n_past_ + n > n_ctx_) {
    fail("context is full: {} tokens do not fit in a context of {} (raise -c)", n_past_ + n, n_ctx_);
  }
  embed(tokens, n);
  token_batch_path_.resize(static_cast<size_t>(n_past_));
  token_batch_path_.insert(token_batch_path_.end(), static_cast<size_t>(n), n >= kAttentionBatchRows || batch_path() ? 1 : 0);
  if (!rewinds_by_replay()) return;
  if (n > 1) {
    mixers_.save_state();
    checkpoint_pos_ = n_past_;
  }
  keep_row_states(n);
  tokens_.resize(static_cast<size_t>(n_past_));
  tokens_.insert(tokens_.end(), tokens, tokens + n);
}

// Layers that ran have moved the recurrent state on: go back to the copy begin_rows took, or,
// after a one-token eval (no copy), rebuild it before the next use.
void InferenceState::abandon_rows(int n) {
  token_batch_path_.resize(static_cast<size_t>(n_past_));
  if (!rewinds_by_replay()) return;
  tokens_.resize(static_cast<size_t>(n_past_));
  row_states_n_ = 0;  // the copies of rows that did not finish
  if (n > 1) mixers_.restore_state();
  else recurrent_dirty_ = true;
}

// A row's hidden state for an MTP head, as llama.cpp's h_nextn: the output-normed row, or with
// hyper-connections (deepseek4) the token's streams as the last layer left them, unmixed.
int InferenceState::hidden_width() const { return cfg_.n_embd * std::max(1, cfg_.hc.streams); }

void InferenceState::keep_hidden_rows(const ResidualStream& rows, int first, int n) {
  const size_t W = static_cast<size_t>(hidden_width());
  forget_hidden_rows(n_past_);  // rows being evaluated again
  if (hidden_rows_.empty() || hidden_first_ + static_cast<int>(hidden_rows_.size() / W) != n_past_) {
    hidden_rows_.clear();
    hidden_first_ = n_past_;
  }
  const size_t at = hidden_rows_.size();
  hidden_rows_.resize(at + static_cast<size_t>(n) * W);
  for (int i = 0; i < n; ++i) {
    float* out = hidden_rows_.data() + at + i * W;
    if (rows.streams() > 1) {
      std::copy_n(rows.streams_of(first + i), W, out);
    } else {
      ops::rms_norm(rows.row(first + i), model_.weights_.output_norm.data(), out, cfg_.n_embd, cfg_.norm_eps);
    }
  }
}

void InferenceState::forget_hidden_rows(int from) {
  const size_t W = static_cast<size_t>(hidden_width());
  const int keep = std::max(0, from - hidden_first_);
  if (static_cast<size_t>(keep) * W < hidden_rows_.size()) hidden_rows_.resize(static_cast<size_t>(keep) * W);
}

std::vector<std::vector<float>> InferenceState::take_hidden_states(int* first_position) {
  const size_t E = static_cast<size_t>(hidden_width());
  std::vector<std::vector<float>> rows;
  for (size_t at = 0; at < hidden_rows_.size(); at += E) {
    rows.emplace_back(hidden_rows_.begin() + static_cast<std::ptrdiff_t>(at),
                      hidden_rows_.begin() + static_cast<std::ptrdiff_t>(at + E));
  }
  if (first_position) *first_position = hidden_first_;
  hidden_rows_.clear();
  return rows;
}

// The residual stream starts as the tokens' embeddings, at positions from n_past.
void InferenceState::embed(const int32_t* tokens, int n) {
  const int E = cfg_.n_embd;
  const ModelWeights& w = model_.weights_;
  const int streams = std::max(1, cfg_.hc.streams);
  residual_.resize(n, E, streams);
  positions_.resize(static_cast<size_t>(n));
  batch_tokens_.assign(tokens, tokens + n);
  for (int i = 0; i < n; ++i) {
    if (tokens[i] < 0 || tokens[i] >= w.tok_embd.rows) fail("token id {} is outside the vocabulary", tokens[i]);
    positions_[static_cast<size_t>(i)] = n_past_ + i;
    float* x = residual_.streams_of(i);
    dequantize_row(w.tok_embd.type, w.tok_embd.row(tokens[i]), x, E);
    if (w.embd_scale != 1.0f) ops::scale(x, w.embd_scale, E);
    for (int s = 1; s < streams; ++s) std::copy(x, x + E, x + static_cast<size_t>(s) * E);  // every stream starts as the embedding
  }
}

// Each layer as the plan declares it: its mixer, then its FFN.
void InferenceState::run_layers(int n) {
  const ModelWeights& w = model_.weights_;
  if (hooks_.router) hooks_.router->begin_pass(cfg_.n_layer);
  const LayerPass pass{pool_, cfg_, residual_, positions_.data(), n, batch_path()};
  const FfnContext ffn{experts_, *model_.experts_};
  experts_.set_tokens(batch_tokens_.data());
  experts_.hint_hashed_layers(n, *model_.experts_);
  for (int l = 0; l < cfg_.n_layer; ++l) {
    const LayerWeights& L = w.layers[static_cast<size_t>(l)];
    if (L.hyper) hyper::pre_mix(pool_, residual_, L.hyper->attn(), cfg_);
    mixers_.at(l).forward(L, l, pass);
    if (L.hyper) hyper::pre_mix(pool_, residual_, L.hyper->ffn(), cfg_);
    ffns_.at(l).forward(L, l, pass, ffn);
    if (layer_hook_) layer_hook_(l);
  }
}

// Residual rows [first, n) after the output norm, into h.
void output_norm_rows(ThreadPool& pool, const Transformer& model, ResidualStream& residual, int first, int n,
                      std::vector<float>& h) {
  const ModelConfig& cfg = model.config();
  const int E = cfg.n_embd;
  const int rows = n - first;
  h.resize(static_cast<size_t>(rows) * E);
  if (residual.streams() > 1) hyper::head_mix(pool, residual, model.weights().output_hc(), cfg, first, n);
  for (int i = 0; i < rows; ++i) {
    ops::rms_norm(residual.row(first + i), model.weights().output_norm.data(), h.data() + static_cast<size_t>(i) * E, E,
                  cfg.norm_eps);
  }
}

void output_logits(ThreadPool& pool, const Transformer& model, ResidualStream& residual, int first, int n,
                   HeadScratch& scratch) {
  const ModelWeights& w = model.weights();
  const float softcap = model.config().output.softcap;
  output_norm_rows(pool, model, residual, first, n, scratch.h);
  scratch.logits.resize(static_cast<size_t>(n - first) * w.output.rows);
  matmul(pool, w.output, scratch.h.data(), n - first, scratch.logits.data(), scratch.act);
  if (softcap > 0.0f) {
    // scale by the reciprocal, tanh, scale back: ggml's three operations
    const float inv = 1.0f / softcap;
    for (float& v : scratch.logits) v = std::tanh(v * inv) * softcap;
  }
}

void InferenceState::normalize_rows(int first, int n) { output_norm_rows(pool_, model_, residual_, first, n, head_.h); }

const std::vector<float>& InferenceState::output_head(int first, int n) {
  output_logits(pool_, model_, residual_, first, n, head_);
  return head_.logits;
}

void InferenceState::set_routing_options(const RoutingOptions& options) {
  if (hooks_.router) {
    hooks_.router->set_options(options);
    return;
  }
  if (options.prefetch != 0 || options.route_ahead != 0 || options.drop_cold != 0.0f) {
    fail("internal: routing options need a router hook (set_router_hook)");
  }
}

const RoutingOptions& InferenceState::routing_options() const {
  static const RoutingOptions kNone;
  return hooks_.router ? hooks_.router->options() : kNone;
}

bool InferenceState::has_router(int layer) const { return cfg_.has_experts_at(layer); }

// A later layer's router on the residual rows as they stand when the router hook asks (after the
// current layer's mixer, before its FFN).
void InferenceState::route_residual(int layer, std::span<TokenRoute> rows) {
  experts_.route_residual(layer, rows, residual_);
}

}  // namespace bmoe
