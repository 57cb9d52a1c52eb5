#include "model/transformer.h"

#include <algorithm>
#include <cmath>
#include <deque>
#include <map>
#include <numeric>

#include "core/error.h"
#include "model/ops.h"
#include "quant/float_kernels.h"
#include "quant/quant.h"

namespace bmoe {

Transformer::Transformer(ModelConfig config, ModelWeights weights, ExpertSource* experts)
    : config_(std::move(config)), weights_(std::move(weights)), experts_(experts) {}

InferenceState::InferenceState(Transformer& model, ThreadPool& pool, int n_ctx, KvType kv_type)
    : model_(model), cfg_(model.config_), pool_(pool) {
  if (n_ctx <= 0) fail("context size must be positive");
  std::vector<int> k_widths, v_widths;
  for (int l = 0; l < cfg_.n_layer; ++l) {
    const bool attends = !cfg_.is_recurrent(l);  // recurrent layers keep no KV rows
    k_widths.push_back(attends ? cfg_.n_head_kv_at(l) * cfg_.head_dim_at(l) : 0);
    v_widths.push_back(attends ? cfg_.n_head_kv_at(l) * cfg_.head_dim_v_at(l) : 0);
  }
  cache_.init(n_ctx, k_widths, v_widths, kv_type);
  if (cfg_.has_recurrent_layers()) recurrent_.init(cfg_);
}

const ActivationBuffer& Activations::get(ThreadPool& pool, TensorType weight_type, const float* x, int64_t n,
                                         int64_t cols) {
  const TensorType format = kernels(weight_type).activation_type;
  for (size_t i = 0; i < used_; ++i) {
    Entry& e = entries_[i];
    if (e.source == x && e.buffer.format() == format && e.buffer.rows() == n) return e.buffer;
  }
  if (used_ == entries_.size()) entries_.emplace_back();
  Entry& e = entries_[used_++];
  e.source = x;
  e.buffer.convert(weight_type, x, n, cols, cols, &pool);
  return e.buffer;
}

void InferenceState::truncate(int n) {
  n = std::clamp(n, 0, n_past_);
  if (!cfg_.has_recurrent_layers()) {
    n_past_ = n;
    return;
  }
  if (n == n_past_ && !recurrent_dirty_) return;
  int start = 0;
  if (!recurrent_dirty_ && checkpoint_pos_ >= 0 && checkpoint_pos_ <= n) {
    recurrent_ = checkpoint_;
    start = checkpoint_pos_;
  } else {
    recurrent_.clear();
    checkpoint_pos_ = -1;  // it may hold tokens that are gone
  }
  recurrent_dirty_ = false;
  replay(start, n);
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
  RouteHook hook = std::move(route_hook_);  // replayed routes were reported the first time
  route_hook_ = nullptr;
  std::function<void(int)> layer_hook = std::move(layer_hook_);
  layer_hook_ = nullptr;
  try {
    for (size_t i = 0; i < ids.size();) {
      const bool batch_path = paths[i] != 0;
      const size_t limit = batch_path ? 512 : kAttentionBatchRows - 1;
      size_t j = i;
      while (j < ids.size() && paths[j] == paths[i] && j - i < limit) ++j;
      replay_batch_path_ = batch_path;
      eval(ids.data() + i, static_cast<int>(j - i));
      i = j;
    }
  } catch (...) {
    replay_batch_path_ = false;
    route_hook_ = std::move(hook);
    layer_hook_ = std::move(layer_hook);
    throw;
  }
  replay_batch_path_ = false;
  route_hook_ = std::move(hook);
  layer_hook_ = std::move(layer_hook);
}

namespace {
// Scratch of at least n floats; its contents are not kept (buffers only grow, so a steady run
// neither allocates nor faults in fresh pages).
float* scratch(std::vector<float>& buffer, size_t n) {
  if (buffer.size() < n) buffer.resize(n);
  return buffer.data();
}

void add_bias(float* rows, const Vector& bias, int64_t n, int64_t width) {
  if (bias.empty()) return;
  for (int64_t i = 0; i < n; ++i) ops::add(rows + i * width, bias.data(), width);
}

// Indices of the k largest values, largest first (ties: lower index first).
void top_k(const float* values, int n, int k, std::vector<int32_t>& out) {
  out.resize(static_cast<size_t>(n));
  std::iota(out.begin(), out.end(), 0);
  std::partial_sort(out.begin(), out.begin() + k, out.end(), [&](int32_t a, int32_t b) {
    return values[a] > values[b] || (values[a] == values[b] && a < b);
  });
  out.resize(static_cast<size_t>(k));
}

}  // namespace

const std::vector<float>& InferenceState::eval(const int32_t* tokens, int n, bool all_logits) {
  if (n <= 0) fail("eval: no tokens");
  if (recurrent_dirty_) truncate(n_past_);  // first rebuild what a failed eval left half done
  if (n_past_ + n > cache_.capacity()) {
    fail("context is full: {} tokens do not fit in a context of {} (raise -c)", n_past_ + n, cache_.capacity());
  }
  const int E = cfg_.n_embd;
  const ModelWeights& w = model_.weights_;
  x_.resize(static_cast<size_t>(n) * E);
  positions_.resize(static_cast<size_t>(n));
  for (int i = 0; i < n; ++i) {
    if (tokens[i] < 0 || tokens[i] >= w.tok_embd.rows) fail("token id {} is outside the vocabulary", tokens[i]);
    positions_[static_cast<size_t>(i)] = n_past_ + i;
    dequantize_row(w.tok_embd.type, w.tok_embd.row(tokens[i]), x_.data() + static_cast<size_t>(i) * E, E);
    if (w.embd_scale != 1.0f) ops::scale(x_.data() + static_cast<size_t>(i) * E, w.embd_scale, E);
  }
  const bool recurrent = cfg_.has_recurrent_layers();
  if (recurrent) {
    if (n > 1) {
      checkpoint_ = recurrent_;
      checkpoint_pos_ = n_past_;
    }
    tokens_.resize(static_cast<size_t>(n_past_));
    tokens_.insert(tokens_.end(), tokens, tokens + n);
    token_batch_path_.resize(static_cast<size_t>(n_past_));
    token_batch_path_.insert(token_batch_path_.end(), static_cast<size_t>(n),
                             n >= kAttentionBatchRows || replay_batch_path_ ? 1 : 0);
  }
  if (router_hook_) router_hook_->begin_pass(cfg_.n_layer);
  try {
    for (int l = 0; l < cfg_.n_layer; ++l) {
      attention_block(l, n);
      ffn_block(l, n);
      if (layer_hook_) layer_hook_(l);
    }
  } catch (...) {
    // Layers that ran have moved the recurrent state on: go back to the copy taken above, or,
    // after a one-token eval (no copy), rebuild it before the next use.
    if (recurrent) {
      tokens_.resize(static_cast<size_t>(n_past_));
      token_batch_path_.resize(static_cast<size_t>(n_past_));
      if (n > 1) recurrent_ = checkpoint_;
      else recurrent_dirty_ = true;
    }
    throw;
  }
  n_past_ += n;

  // Output head on the rows the caller wants.
  const int first = all_logits ? 0 : n - 1;
  const int rows = n - first;
  h_.resize(static_cast<size_t>(rows) * E);
  for (int i = 0; i < rows; ++i) {
    ops::rms_norm(x_.data() + static_cast<size_t>(first + i) * E, w.output_norm.data(),
                  h_.data() + static_cast<size_t>(i) * E, E, cfg_.norm_eps);
  }
  logits_.resize(static_cast<size_t>(rows) * w.output.rows);
  matmul(pool_, w.output, h_.data(), rows, logits_.data(), act_a_);
  if (cfg_.final_softcap > 0.0f) {
    // scale by the reciprocal, tanh, scale back: ggml's three operations
    const float inv = 1.0f / cfg_.final_softcap;
    for (float& v : logits_) v = std::tanh(v * inv) * cfg_.final_softcap;
  }
  return logits_;
}

// q_ holds rows of [query(head_dim) | gate(head_dim)] per head; afterwards q_ holds the
// queries (rows of n_head * head_dim) and attn_gate_ the gates, in the same layout.
void InferenceState::split_query_gate(int n, int n_head, int head_dim) {
  const size_t width = static_cast<size_t>(n_head) * head_dim;
  float* gate = scratch(attn_gate_, static_cast<size_t>(n) * width);
  for (size_t i = 0; i < static_cast<size_t>(n); ++i) {
    for (size_t h = 0; h < static_cast<size_t>(n_head); ++h) {
      const float* g = q_.data() + (i * 2 * n_head + 2 * h + 1) * head_dim;
      std::copy(g, g + head_dim, gate + i * width + h * head_dim);
    }
  }
  // Compacting forward: each query moves to a lower or equal offset.
  for (size_t i = 0; i < static_cast<size_t>(n); ++i) {
    for (size_t h = 0; h < static_cast<size_t>(n_head); ++h) {
      const float* q = q_.data() + (i * 2 * n_head + 2 * h) * head_dim;
      std::copy(q, q + head_dim, q_.data() + i * width + h * head_dim);
    }
  }
}

void InferenceState::attention_block(int layer, int n) {
  if (cfg_.mixer_at(layer) == LayerMixer::GatedDeltaNet) {
    delta_net_block(layer, n);
    return;
  }
  if (cfg_.mixer_at(layer) == LayerMixer::ShortConv) {
    short_conv_block(layer, n);
    return;
  }
  const LayerWeights& L = model_.weights_.layers[static_cast<size_t>(layer)];
  const int E = cfg_.n_embd, H = cfg_.n_head, HKV = cfg_.n_head_kv_at(layer);
  const int dk = cfg_.head_dim_at(layer), dv = cfg_.head_dim_v_at(layer);
  const int64_t q_width = static_cast<int64_t>(H) * dk, k_width = static_cast<int64_t>(HKV) * dk,
                v_width = static_cast<int64_t>(HKV) * dv, attn_width = static_cast<int64_t>(H) * dv;
  h_.resize(static_cast<size_t>(n) * E);
  for (int i = 0; i < n; ++i) {
    ops::rms_norm(x_.data() + static_cast<size_t>(i) * E, L.attn_norm.data(), h_.data() + static_cast<size_t>(i) * E,
                  E, cfg_.norm_eps);
  }
  const int64_t q_rows = cfg_.attn_output_gate ? 2 * q_width : q_width;
  q_.resize(static_cast<size_t>(n * q_rows));
  k_.resize(static_cast<size_t>(n * k_width));
  v_.resize(static_cast<size_t>(n * v_width));
  Activations& acts = acts_;
  acts.reset();
  std::vector<MatmulJob> jobs = {
      {&L.wq, &acts.get(pool_, L.wq.type, h_.data(), n, E), n, nullptr, q_.data(), q_rows},
      {&L.wk, &acts.get(pool_, L.wk.type, h_.data(), n, E), n, nullptr, k_.data(), k_width},
  };
  if (L.wv.present()) jobs.push_back({&L.wv, &acts.get(pool_, L.wv.type, h_.data(), n, E), n, nullptr, v_.data(), v_width});
  run_matmuls(pool_, jobs);
  if (!L.wv.present()) {
    if (dk != dv) fail("internal: layer {} shares K as V with different head sizes", layer);
    std::copy(k_.begin(), k_.end(), v_.begin());  // no V projection: values are the raw keys
  }
  if (cfg_.attn_output_gate) split_query_gate(n, H, dk);
  add_bias(q_.data(), L.bq, n, q_width);
  add_bias(k_.data(), L.bk, n, k_width);
  add_bias(v_.data(), L.bv, n, v_width);

  for (int i = 0; i < n; ++i) {
    float* q = q_.data() + static_cast<size_t>(i) * q_width;
    float* k = k_.data() + static_cast<size_t>(i) * k_width;
    if (cfg_.qk_norm_per_head) {
      for (int h = 0; h < H; ++h) ops::rms_norm(q + h * dk, L.q_norm.data(), q + h * dk, dk, cfg_.norm_eps);
      for (int h = 0; h < HKV; ++h) ops::rms_norm(k + h * dk, L.k_norm.data(), k + h * dk, dk, cfg_.norm_eps);
    } else if (cfg_.qk_norm_full) {
      ops::rms_norm(q, L.q_norm.data(), q, q_width, cfg_.norm_eps);
      ops::rms_norm(k, L.k_norm.data(), k, k_width, cfg_.norm_eps);
    }
    float* v = v_.data() + static_cast<size_t>(i) * v_width;
    if (cfg_.v_rms_norm) {
      for (int h = 0; h < HKV; ++h) ops::rms_norm(v + h * dv, nullptr, v + h * dv, dv, cfg_.norm_eps);
    }
    const RopeConfig& rope = cfg_.rope_at(layer);
    const float* freq_factors = L.rope_freqs.empty() ? nullptr : L.rope_freqs.data();
    ops::rope(q, H, dk, positions_[static_cast<size_t>(i)], rope, freq_factors);
    ops::rope(k, HKV, dk, positions_[static_cast<size_t>(i)], rope, freq_factors);
    cache_.store(layer, positions_[static_cast<size_t>(i)], k, v);
  }

  AttentionParams p;
  p.n_head = H;
  p.n_head_kv = HKV;
  p.head_dim_k = dk;
  p.head_dim_v = dv;
  p.scale = cfg_.attn_scale > 0.0f ? cfg_.attn_scale : 1.0f / std::sqrt(static_cast<float>(dk));
  p.softcap = cfg_.attn_softcap;
  p.sliding_window = cfg_.sliding_window.empty() ? 0 : cfg_.sliding_window[static_cast<size_t>(layer)];
  p.sinks = L.attn_sinks.empty() ? nullptr : L.attn_sinks.data();
  // An f32 cache is compared against llama.cpp's classic path (its flash attention rounds to
  // f16 whatever the cache type); an f16 cache follows its default flash attention.
  p.numerics = cache_.type() == KvType::F32 ? AttentionNumerics::Classic : AttentionNumerics::Flash;
  p.batch_path = replay_batch_path_;
  attn_.resize(static_cast<size_t>(n * attn_width));
  attention(pool_, cache_, layer, p, q_.data(), positions_.data(), n, attn_.data());
  if (cfg_.attn_output_gate) {
    const float* gate = attn_gate_.data();
    for (size_t i = 0; i < static_cast<size_t>(n * attn_width); ++i) attn_[i] *= 1.0f / (1.0f + std::exp(-gate[i]));
  }

  proj_.resize(static_cast<size_t>(n) * E);
  matmul(pool_, L.wo, attn_.data(), n, proj_.data(), act_a_);
  add_bias(proj_.data(), L.bo, n, E);
  for (int i = 0; i < n; ++i) {
    float* row = proj_.data() + static_cast<size_t>(i) * E;
    if (!L.post_attn_norm.empty()) ops::rms_norm(row, L.post_attn_norm.data(), row, E, cfg_.norm_eps);
    ops::add(x_.data() + static_cast<size_t>(i) * E, row, E);
  }
}

// Gated DeltaNet: projections for the whole batch, the convolution and the delta rule token by
// token (in parallel over channels and value heads), a gated RMS norm per head, the output
// projection added to the residual.
void InferenceState::delta_net_block(int layer, int n) {
  const LayerWeights& L = model_.weights_.layers[static_cast<size_t>(layer)];
  const ModelConfig::DeltaNet& d = cfg_.delta_net;
  const int E = cfg_.n_embd, C = d.conv_channels(), VD = d.value_dim(), HV = d.v_heads, S = d.head_dim;
  const size_t rows = static_cast<size_t>(n);
  h_.resize(rows * E);
  for (size_t i = 0; i < rows; ++i) ops::rms_norm(x_.data() + i * E, L.attn_norm.data(), h_.data() + i * E, E, cfg_.norm_eps);
  float* mixed = scratch(dn_mixed_, rows * C);
  float* z = scratch(dn_z_, rows * VD);
  float* beta = scratch(dn_beta_, rows * HV);
  float* alpha = scratch(dn_alpha_, rows * HV);
  Activations& acts = acts_;
  acts.reset();
  const MatmulJob jobs[] = {
      {&L.ssm_qkv, &acts.get(pool_, L.ssm_qkv.type, h_.data(), n, E), n, nullptr, mixed, C},
      {&L.ssm_z, &acts.get(pool_, L.ssm_z.type, h_.data(), n, E), n, nullptr, z, VD},
      {&L.ssm_beta, &acts.get(pool_, L.ssm_beta.type, h_.data(), n, E), n, nullptr, beta, HV},
      {&L.ssm_alpha, &acts.get(pool_, L.ssm_alpha.type, h_.data(), n, E), n, nullptr, alpha, HV},
  };
  run_matmuls(pool_, jobs);

  float* conv = scratch(dn_conv_, rows * C);
  float* conv_state = recurrent_.conv[static_cast<size_t>(layer)].data();
  constexpr int kChannelsPerJob = 256;
  pool_.run((C + kChannelsPerJob - 1) / kChannelsPerJob, [&](int64_t job, int) {
    const int first = static_cast<int>(job) * kChannelsPerJob;
    const int end = std::min(C, first + kChannelsPerJob);
    delta_net::causal_conv(mixed, n, C, d.conv_kernel, L.ssm_conv.data(), conv_state, conv, first, end);
    for (size_t t = 0; t < rows; ++t) float_kernels().silu(conv + t * C + first, conv + t * C + first, end - first);
  });
  const int key_dim = d.key_dim();
  for (size_t t = 0; t < rows; ++t) {
    float* row = conv + t * C;
    for (int h = 0; h < 2 * d.k_heads; ++h) delta_net::l2_norm(row + h * S, S, cfg_.norm_eps);  // q heads, then k heads
    for (int h = 0; h < HV; ++h) {
      const size_t o = t * HV + static_cast<size_t>(h);
      beta[o] = 1.0f / (1.0f + std::exp(-beta[o]));
      alpha[o] = std::exp(delta_net::softplus(alpha[o] + L.ssm_dt[static_cast<size_t>(h)]) * L.ssm_a[static_cast<size_t>(h)]);
    }
  }
  float* out = scratch(dn_out_, rows * VD);
  float* state = recurrent_.delta[static_cast<size_t>(layer)].data();
  const float scale = 1.0f / std::sqrt(static_cast<float>(S));
  pool_.run(HV, [&](int64_t h, int) {
    const int hk = static_cast<int>(h) % d.k_heads;  // value head h reads key head h mod k_heads
    float* head_state = state + static_cast<size_t>(h) * S * S;
    for (size_t t = 0; t < rows; ++t) {
      const float* row = conv + t * C;
      const size_t o = t * HV + static_cast<size_t>(h);
      delta_net::step(head_state, S, row + hk * S, row + key_dim + hk * S, row + 2 * key_dim + h * S, alpha[o], beta[o],
                      scale, out + t * VD + h * S);
    }
  });
  for (size_t t = 0; t < rows; ++t) {
    for (int h = 0; h < HV; ++h) {
      float* y = out + t * VD + static_cast<size_t>(h) * S;
      const float* g = z + t * VD + static_cast<size_t>(h) * S;
      ops::rms_norm(y, L.ssm_norm.data(), y, S, cfg_.norm_eps);
      float gate[delta_net::kMaxHeadDim];
      float_kernels().silu(g, gate, S);
      for (int j = 0; j < S; ++j) y[j] *= gate[j];
    }
  }
  proj_.resize(rows * E);
  matmul(pool_, L.ssm_out, out, n, proj_.data(), act_a_);
  for (size_t i = 0; i < rows; ++i) ops::add(x_.data() + i * E, proj_.data() + i * E, E);
}

// Short convolution (lfm2moe): b | c | x from one projection; the causal convolution runs over
// b * x and its output is gated by c before the output projection.
void InferenceState::short_conv_block(int layer, int n) {
  const LayerWeights& L = model_.weights_.layers[static_cast<size_t>(layer)];
  const int E = cfg_.n_embd;
  const size_t rows = static_cast<size_t>(n);
  h_.resize(rows * E);
  for (size_t i = 0; i < rows; ++i) ops::rms_norm(x_.data() + i * E, L.attn_norm.data(), h_.data() + i * E, E, cfg_.norm_eps);
  float* bcx = scratch(dn_mixed_, rows * 3 * E);
  matmul(pool_, L.shortconv_in, h_.data(), n, bcx, act_a_);
  float* bx = scratch(dn_z_, rows * E);
  for (size_t t = 0; t < rows; ++t) {
    const float* b = bcx + t * 3 * E;
    for (int c = 0; c < E; ++c) bx[t * E + c] = b[c] * b[2 * E + c];
  }
  float* conv = scratch(dn_conv_, rows * E);
  float* state = recurrent_.conv[static_cast<size_t>(layer)].data();
  constexpr int kChannelsPerJob = 256;
  pool_.run((E + kChannelsPerJob - 1) / kChannelsPerJob, [&](int64_t job, int) {
    const int first = static_cast<int>(job) * kChannelsPerJob;
    delta_net::causal_conv(bx, n, E, cfg_.short_conv_kernel, L.shortconv_kernel.data(), state, conv, first,
                           std::min(E, first + kChannelsPerJob));
  });
  for (size_t t = 0; t < rows; ++t) {
    const float* c = bcx + t * 3 * E + E;
    for (int j = 0; j < E; ++j) conv[t * E + j] *= c[j];
  }
  proj_.resize(rows * E);
  matmul(pool_, L.shortconv_out, conv, n, proj_.data(), act_b_);
  for (size_t i = 0; i < rows; ++i) ops::add(x_.data() + i * E, proj_.data() + i * E, E);
}

void InferenceState::ffn_block(int layer, int n) {
  const LayerWeights& L = model_.weights_.layers[static_cast<size_t>(layer)];
  if (L.has_experts && L.ffn_up.present()) {
    parallel_ffn(layer, n);
    return;
  }
  const int E = cfg_.n_embd;
  h_.resize(static_cast<size_t>(n) * E);
  for (int i = 0; i < n; ++i) {
    ops::rms_norm(x_.data() + static_cast<size_t>(i) * E, L.ffn_norm.data(), h_.data() + static_cast<size_t>(i) * E,
                  E, cfg_.norm_eps);
  }
  ffn_out_.assign(static_cast<size_t>(n) * E, 0.0f);
  if (L.has_experts) {
    routed_experts(layer, n, h_.data(), h_.data(), ffn_out_.data());
    if (L.shexp_up.present()) {
      float* shared = scratch(shared_out_, static_cast<size_t>(n) * E);
      dense_ffn(L.shexp_gate, L.shexp_up, L.shexp_down, n, h_.data(), shared);
      float* gate = scratch(shared_gate_, static_cast<size_t>(n) * L.shexp_router.rows);
      matmul(pool_, L.shexp_router, h_.data(), n, gate, act_b_);
      for (int i = 0; i < n; ++i) {
        // qwen2moe's graph computes the sigmoid as silu(x) / x, qwen35moe's as 1 / (1 + e^-x)
        const float x = gate[static_cast<size_t>(i) * L.shexp_router.rows];
        const float g = cfg_.shared_gate_sigmoid ? 1.0f / (1.0f + std::exp(-x)) : ops::silu(x) / x;
        float* out = ffn_out_.data() + static_cast<size_t>(i) * E;
        const float* s = shared + static_cast<size_t>(i) * E;
        for (int d = 0; d < E; ++d) out[d] += s[d] * g;
      }
    }
  } else {
    dense_ffn(L.ffn_gate, L.ffn_up, L.ffn_down, n, h_.data(), ffn_out_.data());
  }
  for (int i = 0; i < n; ++i) {
    float* row = ffn_out_.data() + static_cast<size_t>(i) * E;
    if (!L.post_ffn_norm.empty()) ops::rms_norm(row, L.post_ffn_norm.data(), row, E, cfg_.norm_eps);
    ops::add(x_.data() + static_cast<size_t>(i) * E, row, E);
  }
}

// Gemma 4: dense FFN and routed experts on the same residual, each normalised before and
// after, summed, normalised again and added back; then the layer's output scale.
void InferenceState::parallel_ffn(int layer, int n) {
  const LayerWeights& L = model_.weights_.layers[static_cast<size_t>(layer)];
  const int E = cfg_.n_embd;
  const size_t total = static_cast<size_t>(n) * E;
  float* dense_in = scratch(dense_in_, total);
  float* moe_in = scratch(moe_in_, total);
  float* router_in = scratch(router_in_, total);
  float* moe_out = scratch(moe_out_, total);
  const float inv_sqrt_e = 1.0f / std::sqrt(static_cast<float>(E));
  for (int i = 0; i < n; ++i) {
    const float* x = x_.data() + static_cast<size_t>(i) * E;
    const size_t o = static_cast<size_t>(i) * E;
    ops::rms_norm(x, L.ffn_norm.data(), dense_in + o, E, cfg_.norm_eps);
    ops::rms_norm(x, L.moe_norm.data(), moe_in + o, E, cfg_.norm_eps);
    float* r = router_in + o;
    ops::rms_norm(x, nullptr, r, E, cfg_.norm_eps);
    for (int d = 0; d < E; ++d) r[d] = r[d] * inv_sqrt_e * L.router_in_scale[static_cast<size_t>(d)];
  }
  ffn_out_.assign(total, 0.0f);
  dense_ffn(L.ffn_gate, L.ffn_up, L.ffn_down, n, dense_in, ffn_out_.data());
  routed_experts(layer, n, moe_in, router_in, moe_out);
  for (int i = 0; i < n; ++i) {
    float* dense = ffn_out_.data() + static_cast<size_t>(i) * E;
    float* moe = moe_out + static_cast<size_t>(i) * E;
    ops::rms_norm(dense, L.post_dense_norm.data(), dense, E, cfg_.norm_eps);
    ops::rms_norm(moe, L.post_moe_norm.data(), moe, E, cfg_.norm_eps);
    ops::add(dense, moe, E);
    ops::rms_norm(dense, L.post_ffn_norm.data(), dense, E, cfg_.norm_eps);
    float* x = x_.data() + static_cast<size_t>(i) * E;
    ops::add(x, dense, E);
    if (!L.out_scale.empty()) ops::scale(x, L.out_scale[0], E);
  }
}

void InferenceState::dense_ffn(const Weight& gate, const Weight& up, const Weight& down, int n,
                               const float* h, float* out) {
  const int E = cfg_.n_embd;
  const int64_t F = up.rows;
  const size_t size = static_cast<size_t>(n * F);
  float* g = scratch(dense_gate_, size);
  float* u = scratch(dense_up_, size);
  float* a = scratch(dense_act_, size);
  Activations& acts = acts_;
  acts.reset();
  const MatmulJob jobs[] = {
      {&gate, &acts.get(pool_, gate.type, h, n, E), n, nullptr, g, F},
      {&up, &acts.get(pool_, up.type, h, n, E), n, nullptr, u, F},
  };
  run_matmuls(pool_, jobs);
  if (cfg_.dense_activation == ExpertActivation::GeGLU) ops::geglu(g, u, a, n * F);
  else ops::swiglu(g, u, a, n * F);
  matmul(pool_, down, a, n, out, act_c_);
}

void InferenceState::gate(const LayerWeights& L, float* logits, std::vector<int32_t>& ids,
                          std::vector<float>& wts) const {
  const int NE = cfg_.n_expert;
  const int k = cfg_.n_expert_used;
  if (!L.router_bias.empty()) ops::add(logits, L.router_bias.data(), NE);
  switch (cfg_.gating) {
    case Gating::SoftmaxTopK:
    case Gating::SigmoidTopK: {
      std::vector<float> probs(logits, logits + NE);
      if (cfg_.gating == Gating::SoftmaxTopK) ops::softmax(probs.data(), NE);
      else for (float& p : probs) p = 1.0f / (1.0f + std::exp(-p));
      if (L.expert_select_bias.empty()) {
        top_k(probs.data(), NE, k, ids);
      } else {  // the bias steers the choice; the weights stay the unbiased probabilities
        std::vector<float> scores(probs);
        ops::add(scores.data(), L.expert_select_bias.data(), NE);
        top_k(scores.data(), NE, k, ids);
      }
      wts.resize(static_cast<size_t>(k));
      for (int s = 0; s < k; ++s) wts[static_cast<size_t>(s)] = probs[static_cast<size_t>(ids[static_cast<size_t>(s)])];
      break;
    }
    case Gating::TopKSoftmax: {
      top_k(logits, NE, k, ids);
      wts.resize(static_cast<size_t>(k));
      for (int s = 0; s < k; ++s) wts[static_cast<size_t>(s)] = logits[ids[static_cast<size_t>(s)]];
      ops::softmax(wts.data(), k);
      break;
    }
  }
  if (cfg_.norm_topk) {
    double total = 0.0;  // summed in double, as ggml's row sum does
    for (float v : wts) total += v;
    const float sum = std::max(static_cast<float>(total), 6.103515625e-5f);  // llama.cpp's clamp
    for (float& v : wts) v /= sum;
  }
  if (cfg_.expert_weights_scale != 0.0f && cfg_.expert_weights_scale != 1.0f) {
    for (float& v : wts) v *= cfg_.expert_weights_scale;
  }
}

void InferenceState::set_routing_options(const RoutingOptions& options) {
  if (router_hook_) {
    router_hook_->set_options(options);
    return;
  }
  if (options.prefetch != 0 || options.route_ahead != 0 || options.drop_cold != 0.0f) {
    fail("internal: routing options need a router hook (set_router_hook)");
  }
}

const RoutingOptions& InferenceState::routing_options() const {
  static const RoutingOptions kNone;
  return router_hook_ ? router_hook_->options() : kNone;
}

// The router's logits, then per token the model's gating, unless the router hook decided the
// routing layers earlier (route-ahead); the route hook sees each token's routing and may
// replace it; the router hook settles it last (drop-cold), so what it drops is what is computed.
void InferenceState::route_tokens(int layer, int n, const float* router_in) {
  const LayerWeights& L = model_.weights_.layers[static_cast<size_t>(layer)];
  const int NE = cfg_.n_expert;
  router_logits_.resize(static_cast<size_t>(n) * NE);
  matmul(pool_, L.router, router_in, n, router_logits_.data(), act_b_);
  routes_.resize(static_cast<size_t>(n));
  const std::span<TokenRoute> routes(routes_);
  const bool decided_early = router_hook_ && router_hook_->take_early_routes(layer, routes);
  for (int i = 0; i < n; ++i) {
    float* logits = router_logits_.data() + static_cast<size_t>(i) * NE;
    TokenRoute& route = routes_[static_cast<size_t>(i)];
    if (!decided_early) gate(L, logits, route.experts, route.weights);
    report_route(layer, i, logits);
  }
  if (router_hook_) router_hook_->finish_routes(layer, routes, *model_.experts_);
}

void InferenceState::report_route(int layer, int token, const float* logits) {
  if (!route_hook_) return;
  TokenRoute& route = routes_[static_cast<size_t>(token)];
  RouteEvent ev;
  ev.layer = layer;
  ev.position = positions_[static_cast<size_t>(token)];
  ev.prefill = prefill_;
  ev.logits = logits;
  ev.n_expert = cfg_.n_expert;
  ev.experts = &route.experts;
  ev.weights = &route.weights;
  route_hook_(ev);
}

void InferenceState::router_input(int layer, const float* x, float* out) const {
  const LayerWeights& L = model_.weights_.layers[static_cast<size_t>(layer)];
  const int E = cfg_.n_embd;
  if (!L.router_in_scale.empty()) {
    // Gemma 4: plain RMS norm, scaled by router_in_scale / sqrt(n_embd).
    ops::rms_norm(x, nullptr, out, E, cfg_.norm_eps);
    const float inv_sqrt_e = 1.0f / std::sqrt(static_cast<float>(E));
    for (int d = 0; d < E; ++d) out[d] = out[d] * inv_sqrt_e * L.router_in_scale[static_cast<size_t>(d)];
  } else {
    ops::rms_norm(x, L.ffn_norm.data(), out, E, cfg_.norm_eps);
  }
}

bool InferenceState::has_router(int layer) const {
  return model_.weights_.layers[static_cast<size_t>(layer)].has_experts;
}

// A later layer's router on the residual rows as they stand when the router hook asks (after the
// current layer's attention, before its FFN): the prediction the hook hints, and with
// route-ahead the routing that layer then takes.
void InferenceState::route_residual(int layer, std::span<TokenRoute> rows) {
  const LayerWeights& L = model_.weights_.layers[static_cast<size_t>(layer)];
  const int E = cfg_.n_embd, NE = cfg_.n_expert;
  const int n = static_cast<int>(rows.size());
  float* in = scratch(residual_router_in_, static_cast<size_t>(n) * E);
  float* logits = scratch(residual_router_logits_, static_cast<size_t>(n) * NE);
  for (int i = 0; i < n; ++i) router_input(layer, x_.data() + static_cast<size_t>(i) * E, in + static_cast<size_t>(i) * E);
  matmul(pool_, L.router, in, n, logits, act_b_);
  for (int i = 0; i < n; ++i) {
    TokenRoute& row = rows[static_cast<size_t>(i)];
    gate(L, logits + static_cast<size_t>(i) * NE, row.experts, row.weights);
  }
}

// The (token, slot) pairs of a layer's routing grouped by expert, experts in order of first use:
// what the source is asked for (experts, weight sums, use counts) and which rows each computes.
struct InferenceState::ExpertUses {
  struct Use {
    int32_t token;
    int32_t slot;
  };
  std::vector<int32_t> experts;
  std::vector<float> weight_sums;
  std::vector<int32_t> use_counts;
  std::vector<std::vector<Use>> uses;  // per expert, same order
  int max_slots = 0;                   // the most experts one token routes to

  // Ready experts are computed in groups of at most kGroupRows token rows (at least one expert
  // each), so the group buffers stay bounded however large a prompt batch is. Returns the end
  // of the group that starts at ready[first].
  static constexpr size_t kGroupRows = 4096;
  size_t group_end(std::span<const int> ready, size_t first) const {
    size_t last = first, rows = 0;
    do {
      rows += uses[static_cast<size_t>(ready[last])].size();
      ++last;
    } while (last < ready.size() && rows + uses[static_cast<size_t>(ready[last])].size() <= kGroupRows);
    return last;
  }
};

// Ready experts computed together: each one's matrices and token rows, its rows' place in the
// group buffers, and those buffers once filled.
struct InferenceState::ExpertGroup {
  struct Member {
    int index;  // into ExpertUses
    std::vector<Weight> m;
    std::vector<int32_t> rows;  // token rows of h
    size_t offset;              // first row in the group buffers
  };
  std::vector<Member> members;
  size_t rows = 0;
  int64_t width = 0;  // the experts' hidden width (F)
  float* gate = nullptr;
  float* up = nullptr;
  float* act = nullptr;
};

InferenceState::ExpertUses InferenceState::group_by_expert(int n) const {
  ExpertUses u;
  std::map<int32_t, size_t> index_of;
  for (int i = 0; i < n; ++i) {
    const TokenRoute& route = routes_[static_cast<size_t>(i)];
    u.max_slots = std::max(u.max_slots, static_cast<int>(route.experts.size()));
    for (size_t s = 0; s < route.experts.size(); ++s) {
      auto [it, inserted] = index_of.emplace(route.experts[s], u.experts.size());
      if (inserted) {
        u.experts.push_back(route.experts[s]);
        u.weight_sums.push_back(0.0f);
        u.use_counts.push_back(0);
        u.uses.emplace_back();
      }
      u.uses[it->second].push_back({i, static_cast<int32_t>(s)});
      u.weight_sums[it->second] += route.weights[s];
      ++u.use_counts[it->second];
    }
  }
  return u;
}

void InferenceState::routed_experts(int layer, int n, const float* h, const float* router_in, float* out) {
  route_tokens(layer, n, router_in);
  const ExpertUses uses = group_by_expert(n);
  // Every (token, slot) row is written once below, and only those rows are summed.
  float* slot_out = scratch(slot_out_, static_cast<size_t>(n) * uses.max_slots * cfg_.n_embd);
  ExpertSource& source = *model_.experts_;
  source.begin_layer(LayerRouting{layer, uses.experts, uses.weight_sums, uses.use_counts, n});
  // After begin_layer, so this layer's reads are queued before any read ahead for later ones.
  if (router_hook_) router_hook_->after_request(layer, n, *this, source);
  compute_ready_experts(layer, n, h, uses, slot_out);
  sum_slots(n, uses.max_slots, slot_out, out);
}

void InferenceState::compute_ready_experts(int layer, int n, const float* h, const ExpertUses& uses, float* slot_out) {
  ExpertSource& source = *model_.experts_;
  acts_.reset();
  // While the source waits on reads, this pass's idle workers sleep instead of spinning on the
  // cores the reads' kernel work needs (on 2 cores, spinning through waits slowed decode).
  ThreadPool& pool = pool_;
  source.set_wait_hook([&pool] { pool.park(); });
  std::vector<int> ready;
  while (true) {
    ready.clear();
    if (source.take_ready(ready) == 0) break;
    for (size_t first = 0; first < ready.size();) {
      const size_t last = uses.group_end(ready, first);
      compute_group(layer, n, h, uses, std::span<const int>(ready).subspan(first, last - first), slot_out);
      first = last;
    }
  }
  source.end_layer();
  source.set_wait_hook({});
}

// Gate, up and down projections of a group of ready experts, each stage one parallel pass.
void InferenceState::compute_group(int layer, int n, const float* h, const ExpertUses& uses,
                                   std::span<const int> ready, float* slot_out) {
  const LayerWeights& L = model_.weights_.layers[static_cast<size_t>(layer)];
  ExpertGroup group;
  for (int idx : ready) {
    ExpertGroup::Member member{idx, {}, {}, group.rows};
    const auto mats = model_.experts_->matrices(idx);
    member.m.assign(mats.begin(), mats.end());
    for (const ExpertUses::Use& u : uses.uses[static_cast<size_t>(idx)]) member.rows.push_back(u.token);
    group.rows += member.rows.size();
    group.members.push_back(std::move(member));
  }
  expert_gate_up(L, n, h, group);
  expert_activation(L, uses, group);
  expert_down(L, uses, group, slot_out);
}

// Gate and up projections (or the fused gate_up rows) of every expert of the group in one pass.
void InferenceState::expert_gate_up(const LayerWeights& L, int n, const float* h, ExpertGroup& group) {
  const int E = cfg_.n_embd;
  const ExpertRoles& R = L.roles;
  const bool fused_rows = R.gate_up >= 0;
  const Weight& first_up = group.members[0].m[static_cast<size_t>(fused_rows ? R.gate_up : R.up)];
  const int64_t F = fused_rows ? first_up.rows / 2 : first_up.rows;
  group.width = F;
  group.gate = scratch(expert_gate_, group.rows * F);
  group.up = scratch(expert_up_, group.rows * F);
  group.act = scratch(expert_act_, group.rows * F);
  float* fused = fused_rows ? scratch(expert_fused_, group.rows * 2 * F) : nullptr;
  std::vector<MatmulJob> jobs;
  for (const ExpertGroup::Member& mb : group.members) {
    const int64_t m = static_cast<int64_t>(mb.rows.size());
    if (fused_rows) {
      // Fused rows: the first F outputs are the gate, the next F the up projection.
      const Weight& gu = mb.m[static_cast<size_t>(R.gate_up)];
      jobs.push_back({&gu, &acts_.get(pool_, gu.type, h, n, E), m, mb.rows.data(), fused + mb.offset * 2 * F, 2 * F});
    } else {
      const Weight& g = mb.m[static_cast<size_t>(R.gate)];
      const Weight& u = mb.m[static_cast<size_t>(R.up)];
      jobs.push_back({&g, &acts_.get(pool_, g.type, h, n, E), m, mb.rows.data(), group.gate + mb.offset * F, F});
      jobs.push_back({&u, &acts_.get(pool_, u.type, h, n, E), m, mb.rows.data(), group.up + mb.offset * F, F});
    }
  }
  run_matmuls(pool_, jobs);
  if (!fused_rows) return;
  for (size_t r = 0; r < group.rows; ++r) {
    std::copy_n(fused + r * 2 * F, F, group.gate + r * F);
    std::copy_n(fused + r * 2 * F + F, F, group.up + r * F);
  }
}

// Per-expert biases (gpt-oss), then the activation into group.act.
void InferenceState::expert_activation(const LayerWeights& L, const ExpertUses& uses, ExpertGroup& group) {
  const int64_t F = group.width;
  for (const ExpertGroup::Member& mb : group.members) {
    const int32_t expert = uses.experts[static_cast<size_t>(mb.index)];
    for (size_t j = 0; j < mb.rows.size(); ++j) {
      float* g = group.gate + (mb.offset + j) * F;
      float* u = group.up + (mb.offset + j) * F;
      if (!L.exp_gate_bias.empty()) ops::add(g, L.exp_gate_bias.data() + static_cast<size_t>(expert) * F, F);
      if (!L.exp_up_bias.empty()) ops::add(u, L.exp_up_bias.data() + static_cast<size_t>(expert) * F, F);
      float* a = group.act + (mb.offset + j) * F;
      switch (cfg_.activation) {
        case ExpertActivation::SwiGLU: ops::swiglu(g, u, a, F); break;
        case ExpertActivation::SwiGLU_OAI: ops::swiglu_oai(g, u, a, F, 1.702f, 7.0f); break;
        case ExpertActivation::GeGLU: ops::geglu(g, u, a, F); break;
      }
    }
  }
}

// Down projections of the group in one pass, then each (token, slot) result, with the expert's
// down bias and scale, times its routing weight into its own row of slot_out.
void InferenceState::expert_down(const LayerWeights& L, const ExpertUses& uses, const ExpertGroup& group,
                                 float* slot_out) {
  const int E = cfg_.n_embd;
  const int64_t F = group.width;
  const size_t down = static_cast<size_t>(L.roles.down);
  const Weight& first_down = group.members[0].m[down];
  ActivationBuffer& down_in = act_c_;
  down_in.convert(first_down.type, group.act, static_cast<int64_t>(group.rows), F, F, &pool_);
  float* down_buf = scratch(expert_down_, group.rows * E);
  std::vector<std::vector<int32_t>> down_rows(group.members.size());
  std::vector<MatmulJob> jobs;
  for (size_t gi = 0; gi < group.members.size(); ++gi) {
    const ExpertGroup::Member& mb = group.members[gi];
    const Weight& d = mb.m[down];
    if (d.type != first_down.type) fail("internal: experts of one layer use different down types");
    down_rows[gi].resize(mb.rows.size());
    std::iota(down_rows[gi].begin(), down_rows[gi].end(), static_cast<int32_t>(mb.offset));
    jobs.push_back({&d, &down_in, static_cast<int64_t>(mb.rows.size()), down_rows[gi].data(), down_buf + mb.offset * E, E});
  }
  run_matmuls(pool_, jobs);
  for (const ExpertGroup::Member& mb : group.members) {
    const int32_t expert = uses.experts[static_cast<size_t>(mb.index)];
    const auto& u = uses.uses[static_cast<size_t>(mb.index)];
    for (size_t j = 0; j < u.size(); ++j) {
      float* d = down_buf + (mb.offset + j) * E;
      if (!L.exp_down_bias.empty()) ops::add(d, L.exp_down_bias.data() + static_cast<size_t>(expert) * E, E);
      if (!L.exp_down_scale.empty()) ops::scale(d, L.exp_down_scale[static_cast<size_t>(expert)], E);
      const float wt = routes_[static_cast<size_t>(u[j].token)].weights[static_cast<size_t>(u[j].slot)];
      float* dst = slot_out + (static_cast<size_t>(u[j].token) * uses.max_slots + u[j].slot) * E;
      for (int e = 0; e < E; ++e) dst[e] = d[e] * wt;
    }
  }
}

// The slots summed in slot order, as llama.cpp adds them (after every expert is done, so the
// order experts arrive in cannot change the sum).
void InferenceState::sum_slots(int n, int max_slots, const float* slot_out, float* out) const {
  const int E = cfg_.n_embd;
  for (int i = 0; i < n; ++i) {
    float* dst = out + static_cast<size_t>(i) * E;
    const size_t k = routes_[static_cast<size_t>(i)].experts.size();
    const float* first = slot_out + static_cast<size_t>(i) * max_slots * E;
    std::copy_n(first, E, dst);
    for (size_t s = 1; s < k; ++s) ops::add(dst, first + s * E, E);
  }
}

}  // namespace bmoe
