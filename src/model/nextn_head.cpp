#include "model/nextn_head.h"

#include <algorithm>

#include "core/error.h"
#include "model/hyper_connections.h"
#include "model/layer_pass.h"
#include "model/ops.h"
#include "quant/quant.h"

namespace bmoe {

namespace {

template <class T>
void keep_entry(std::vector<T>& per_layer, int layer) {
  if (per_layer.empty()) return;
  const T value = per_layer[static_cast<size_t>(layer)];
  per_layer.assign(1, value);
}

// The block's own entry where the array has one for every block (deepseek4's compress ratios
// and SwiGLU limits), else the last trunk layer's.
template <class T>
void keep_own_entry(std::vector<T>& per_layer, int own, int last) {
  keep_entry(per_layer, per_layer.size() > static_cast<size_t>(own) ? own : last);
}

}  // namespace

ModelConfig nextn_block_config(const ModelConfig& c) {
  ModelConfig b = c;
  const int last = c.n_layer - 1;
  b.n_layer = 1;
  b.n_nextn_layer = 0;
  b.moe.n_hash_layers = 0;  // the block routes by its router (llama.cpp refuses a hash-routed one)
  b.plan = {c.nextn_plan};
  keep_entry(b.attention.sliding_window, last);
  keep_entry(b.attention.layer_n_head_kv, last);
  keep_entry(b.attention.layer_head_dim, last);
  keep_entry(b.attention.layer_rope, last);
  keep_entry(b.dense.layer_n_ff, last);
  keep_own_entry(b.moe.clamp.layer_limit, c.n_layer, last);
  keep_own_entry(b.dense.clamp.layer_limit, c.n_layer, last);
  keep_own_entry(b.csa.ratio, c.n_layer, last);
  return b;
}

namespace {

ModelWeights block_weights(const Transformer& model) {
  if (!has_nextn_head(model)) fail("internal: the model's MTP block is not bound");
  const ModelWeights& w = model.weights();
  ModelWeights b;
  b.tok_embd = w.tok_embd;
  b.embd_scale = w.embd_scale;
  b.output_norm = w.output_norm;
  b.output = w.output;
  b.output_hc_fn = w.output_hc_fn;
  b.output_hc_base = w.output_hc_base;
  b.output_hc_scale = w.output_hc_scale;
  b.layers = {w.nextn_layers.front()};
  const NextnWeights& n = *b.layers.front().nextn;
  if (n.embed_tokens.present()) b.tok_embd = n.embed_tokens;
  if (!n.shared_head_norm.empty()) b.output_norm = n.shared_head_norm;
  if (n.shared_head_head.present()) b.output = n.shared_head_head;
  return b;
}

}  // namespace

bool has_nextn_head(const Transformer& model) { return !model.weights().nextn_layers.empty(); }

// The model's ExpertSource seen from the one-layer block: its layer 0 is the source's n_layer
// (where the loader put the block's experts).
class NextnHead::LayerShiftedSource : public ExpertSource {
 public:
  LayerShiftedSource(Transformer& model, int shift) : model_(model), shift_(shift) {}
  void begin_layer(const LayerRouting& routing) override {
    LayerRouting shifted = routing;
    shifted.layer += shift_;
    model_.experts().begin_layer(shifted);
  }
  int take_ready(std::vector<int>& ready) override { return model_.experts().take_ready(ready); }
  std::span<const Weight> matrices(int index) override { return model_.experts().matrices(index); }
  void end_layer() override { model_.experts().end_layer(); }
  bool resident(int layer, int expert) const override { return model_.experts().resident(layer + shift_, expert); }
  ExpertStats stats() const override { return model_.experts().stats(); }
  std::string describe() const override { return model_.experts().describe(); }

 private:
  Transformer& model_;
  int shift_;
};

NextnHead::NextnHead(Transformer& model, ThreadPool& pool, int n_ctx, KvType kv_type)
    : model_(model), pool_(pool), n_ctx_(n_ctx), cfg_(nextn_block_config(model.config())),
      weights_(block_weights(model)),
      source_(std::make_unique<LayerShiftedSource>(model, model.config().n_layer)),
      mixers_(cfg_, n_ctx > 0 ? n_ctx : 1, kv_type), ffns_(cfg_),
      experts_(cfg_, weights_, pool, hooks_, *this) {
  if (n_ctx <= 0) fail("context size must be positive");
}

NextnHead::~NextnHead() = default;

void NextnHead::forward(int first_position, std::span<const float> hidden, std::span<const int32_t> tokens) {
  const int n = static_cast<int>(tokens.size());
  if (n <= 0 || hidden.size() != static_cast<size_t>(n) * hidden_width()) {
    fail("internal: MTP head: {} tokens with {} hidden floats", n, hidden.size());
  }
  if (first_position < 0 || first_position > n_past_ || first_position + n > n_ctx_) {
    fail("MTP head: positions {}..{} do not follow its {} rows in a context of {}", first_position,
         first_position + n - 1, n_past_, n_ctx_);
  }
  positions_.resize(static_cast<size_t>(n));
  for (int i = 0; i < n; ++i) positions_[static_cast<size_t>(i)] = first_position + i;
  embed_inputs(hidden, tokens);
  const LayerPass pass{pool_, cfg_, residual_, positions_.data(), n, false};
  const FfnContext ffn{experts_, *source_};
  const LayerWeights& L = weights_.layers.front();
  if (L.hyper) hyper::pre_mix(pool_, residual_, L.hyper->attn(), cfg_);
  mixers_.at(0).forward(L, 0, pass);
  if (L.hyper) hyper::pre_mix(pool_, residual_, L.hyper->ffn(), cfg_);
  ffns_.at(0).forward(L, 0, pass, ffn);
  n_past_ = first_position + n;
  output_head(n);
}

int NextnHead::streams() const { return std::max(1, cfg_.hc.streams); }
int NextnHead::hidden_width() const { return cfg_.n_embd * streams(); }

// The residual stream starts as eh_proj([enorm(embedding) | hnorm(hidden)]), row by row; with
// hyper-connections, stream by stream: each of the row's hidden streams is normed and projected
// beside the same embedding (llama.cpp repeats enorm's output over the streams).
void NextnHead::embed_inputs(std::span<const float> hidden, std::span<const int32_t> tokens) {
  const int n = static_cast<int>(tokens.size());
  const int E = cfg_.n_embd, S = streams();
  const size_t rows = static_cast<size_t>(n) * S;
  const NextnWeights& w = *weights_.layers.front().nextn;
  input_.resize(rows * 2 * E);
  std::vector<float> embedding(static_cast<size_t>(E));
  for (int i = 0; i < n; ++i) {
    const int32_t t = tokens[static_cast<size_t>(i)];
    if (t < 0 || t >= weights_.tok_embd.rows) fail("token id {} is outside the vocabulary", t);
    dequantize_row(weights_.tok_embd.type, weights_.tok_embd.row(t), embedding.data(), E);
    if (weights_.embd_scale != 1.0f) ops::scale(embedding.data(), weights_.embd_scale, E);
    for (int s = 0; s < S; ++s) {
      float* row = input_.data() + (static_cast<size_t>(i) * S + s) * 2 * E;
      ops::rms_norm(embedding.data(), w.enorm.data(), row, E, cfg_.norm_eps);
      ops::rms_norm(hidden.data() + (static_cast<size_t>(i) * S + s) * E, w.hnorm.data(), row + E, E, cfg_.norm_eps);
    }
  }
  residual_.resize(n, E, S);
  projected_.resize(rows * E);
  matmul(pool_, w.eh_proj, input_.data(), static_cast<int>(rows), projected_.data(), proj_act_);
  for (int i = 0; i < n; ++i) std::copy_n(projected_.data() + static_cast<size_t>(i) * S * E, S * E, residual_.streams_of(i));
}

// The last row's hidden state (the input of a chained guess: the output-normed row, or its
// streams unmixed), then the output head on the normed row (the streams folded first).
void NextnHead::output_head(int n) {
  const int E = cfg_.n_embd;
  normed_.resize(static_cast<size_t>(E));
  if (streams() > 1) {
    const float* last = residual_.streams_of(n - 1);
    hidden_.assign(last, last + hidden_width());
    hyper::head_mix(pool_, residual_, weights_.output_hc(), cfg_, n - 1, n);
  }
  ops::rms_norm(residual_.row(n - 1), weights_.output_norm.data(), normed_.data(), E, cfg_.norm_eps);
  if (streams() == 1) hidden_ = normed_;
  logits_.resize(static_cast<size_t>(weights_.output.rows));
  matmul(pool_, weights_.output, normed_.data(), 1, logits_.data(), head_act_);
}

void NextnHead::route_residual(int layer, std::span<TokenRoute> rows) {
  experts_.route_residual(layer, rows, residual_);
}

}  // namespace bmoe
