#include "model/mixers.h"

#include <algorithm>
#include <cmath>

#include "core/error.h"
#include "model/delta_net.h"
#include "model/mixer_units.h"
#include "model/ops.h"
#include "quant/float_kernels.h"

namespace bmoe {

namespace {

void add_bias(float* rows, const Vector& bias, int64_t n, int64_t width) {
  if (bias.empty()) return;
  for (int64_t i = 0; i < n; ++i) ops::add(rows + i * width, bias.data(), width);
}

using mixer_units::LayerStates;
using mixer_units::pre_norm;

// What attention and gated attention share: q, k, v projections, per-head norms, RoPE, the rows
// stored in the KV cache (one per unit, holding its own kind's layers), causal attention, the
// output projected, post-normed where the plan has the norm, added. The kinds differ in what
// they do around the attention (run()).
class AttentionBase : public Mixer {
 public:
  AttentionBase(const ModelConfig& c, MixerKind kind, int n_ctx, KvType kv_type) {
    std::vector<int> k_widths, v_widths;
    for (int l = 0; l < c.n_layer; ++l) {
      const bool own = c.mixer_at(l) == kind;
      k_widths.push_back(own ? c.n_head_kv_at(l) * c.head_dim_at(l) : 0);
      v_widths.push_back(own ? c.n_head_kv_at(l) * c.head_dim_v_at(l) : 0);
    }
    cache_.init(n_ctx, k_widths, v_widths, kv_type);
  }

  void forward(const LayerWeights& weights, int layer, const LayerPass& pass) final {
    const CacheRows own{&cache_, 0, pass.n, pass.batch_path};
    run(weights, layer, pass, std::span<const CacheRows>(&own, 1));
  }

  // The projections, norms, RoPE and output of every row at once; each sequence's rows' K and V
  // stored in, and their queries attending over, its own cache, in one attention call per
  // sequence on its own path: the call its own pass makes, so its rows get the same bits.
  bool forward_sequences(std::span<const SequenceRows> seqs, const LayerWeights& weights, int layer,
                         const LayerPass& pass) final {
    caches_.clear();
    for (const SequenceRows& q : seqs) {
      auto* unit = dynamic_cast<AttentionBase*>(q.unit);
      if (unit == nullptr) return false;
      caches_.push_back({&unit->cache_, q.first, q.n, q.batch_path});
    }
    run(weights, layer, pass, caches_);
    return true;
  }

  uint64_t kv_bytes() const final { return cache_.bytes(); }

 protected:
  // A run of consecutive rows of the pass that belong to one sequence: its cache, and the
  // attention path its own pass takes.
  struct CacheRows {
    KvCache* cache;
    int first, n;
    bool batch_path;
  };
  // The layer on the pass's rows; seqs: one run of every row (a sequence's own pass) or one per
  // sequence (a batch of sequences).
  virtual void run(const LayerWeights& weights, int layer, const LayerPass& pass, std::span<const CacheRows> seqs) = 0;
  // q_, k_, v_ from h_; q_parts: query-sized parts per head in the q rows (2: [query | gate]).
  void project(const AttentionWeights& L, int layer, const LayerPass& pass, int q_parts);
  void add_biases(const AttentionWeights& L, int layer, const LayerPass& pass);
  void prepare_rows(const AttentionWeights& L, int layer, const LayerPass& pass, std::span<const CacheRows> seqs);
  void attend(const AttentionWeights& L, int layer, const LayerPass& pass, std::span<const CacheRows> seqs);
  void output(const AttentionWeights& L, int layer, const LayerPass& pass);

  std::vector<float> h_, q_, k_, v_, attn_, proj_;

 private:
  KvCache cache_;
  std::vector<CacheRows> caches_;  // forward_sequences: each sequence's rows and cache
  Activations acts_;
  ActivationBuffer out_act_;
};

// Causal attention over the KV cache.
class AttentionMixer final : public AttentionBase {
 public:
  AttentionMixer(const ModelConfig& c, int n_ctx, KvType kv_type) : AttentionBase(c, MixerKind::Attention, n_ctx, kv_type) {}

 private:
  void run(const LayerWeights& weights, int layer, const LayerPass& pass, std::span<const CacheRows> caches) override {
    const AttentionWeights& L = *weights.attention;
    pre_norm(pass, weights.attn_norm, h_);
    project(L, layer, pass, 1);
    add_biases(L, layer, pass);
    prepare_rows(L, layer, pass, caches);
    attend(L, layer, pass, caches);
    output(L, layer, pass);
  }
};

// Gated attention (qwen35moe, Qwen3-Next): the q projection's rows hold [query | gate] per head;
// the attention output is multiplied by sigmoid(gate) before the output projection.
class GatedAttentionMixer final : public AttentionBase {
 public:
  GatedAttentionMixer(const ModelConfig& c, int n_ctx, KvType kv_type)
      : AttentionBase(c, MixerKind::GatedAttention, n_ctx, kv_type) {}

 private:
  void run(const LayerWeights& weights, int layer, const LayerPass& pass, std::span<const CacheRows> caches) override {
    const AttentionWeights& L = *weights.attention;
    pre_norm(pass, weights.attn_norm, h_);
    project(L, layer, pass, 2);
    split_query_gate(pass.n, pass.cfg.n_head, pass.cfg.head_dim_at(layer));
    add_biases(L, layer, pass);
    prepare_rows(L, layer, pass, caches);
    attend(L, layer, pass, caches);
    apply_gate(pass.n * pass.cfg.n_head * pass.cfg.head_dim_v_at(layer));
    output(L, layer, pass);
  }
  void split_query_gate(int n, int n_head, int head_dim);
  void apply_gate(int64_t n) {
    const float* gate = gate_.data();
    for (size_t i = 0; i < static_cast<size_t>(n); ++i) attn_[i] *= 1.0f / (1.0f + std::exp(-gate[i]));
  }

  std::vector<float> gate_;
};

void AttentionBase::project(const AttentionWeights& L, int layer, const LayerPass& pass, int q_parts) {
  const ModelConfig& c = pass.cfg;
  const int n = pass.n, E = c.n_embd, H = c.n_head, HKV = c.n_head_kv_at(layer);
  const int dk = c.head_dim_at(layer), dv = c.head_dim_v_at(layer);
  const int64_t q_width = static_cast<int64_t>(H) * dk, k_width = static_cast<int64_t>(HKV) * dk,
                v_width = static_cast<int64_t>(HKV) * dv;
  const int64_t q_rows = q_parts * q_width;
  q_.resize(static_cast<size_t>(n * q_rows));
  k_.resize(static_cast<size_t>(n * k_width));
  v_.resize(static_cast<size_t>(n * v_width));
  acts_.reset();
  std::vector<MatmulJob> jobs = {
      {&L.wq, &acts_.get(pass.pool, L.wq.type, h_.data(), n, E), n, nullptr, q_.data(), q_rows},
      {&L.wk, &acts_.get(pass.pool, L.wk.type, h_.data(), n, E), n, nullptr, k_.data(), k_width},
  };
  if (L.wv.present()) {
    jobs.push_back({&L.wv, &acts_.get(pass.pool, L.wv.type, h_.data(), n, E), n, nullptr, v_.data(), v_width});
  }
  run_matmuls(pass.pool, jobs);
  if (!L.wv.present()) {
    if (dk != dv) fail("internal: layer {} shares K as V with different head sizes", layer);
    std::copy(k_.begin(), k_.end(), v_.begin());  // no V projection: values are the raw keys
  }
}

void AttentionBase::add_biases(const AttentionWeights& L, int layer, const LayerPass& pass) {
  const ModelConfig& c = pass.cfg;
  const int n = pass.n, HKV = c.n_head_kv_at(layer);
  add_bias(q_.data(), L.bq, n, static_cast<int64_t>(c.n_head) * c.head_dim_at(layer));
  add_bias(k_.data(), L.bk, n, static_cast<int64_t>(HKV) * c.head_dim_at(layer));
  add_bias(v_.data(), L.bv, n, static_cast<int64_t>(HKV) * c.head_dim_v_at(layer));
}

// q_ holds rows of [query(head_dim) | gate(head_dim)] per head; afterwards q_ holds the
// queries (rows of n_head * head_dim) and gate_ the gates, in the same layout.
void GatedAttentionMixer::split_query_gate(int n, int n_head, int head_dim) {
  const size_t width = static_cast<size_t>(n_head) * head_dim;
  float* gate = scratch(gate_, static_cast<size_t>(n) * width);
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

// Per row: q/k norms (per head or over all heads), the weightless v norm, RoPE, then the row's
// K and V into the cache.
void AttentionBase::prepare_rows(const AttentionWeights& L, int layer, const LayerPass& pass,
                                 std::span<const CacheRows> seqs) {
  const ModelConfig& c = pass.cfg;
  const int H = c.n_head, HKV = c.n_head_kv_at(layer);
  const int dk = c.head_dim_at(layer), dv = c.head_dim_v_at(layer);
  const int64_t q_width = static_cast<int64_t>(H) * dk, k_width = static_cast<int64_t>(HKV) * dk,
                v_width = static_cast<int64_t>(HKV) * dv;
  const LayerNorms& norms = c.norms_at(layer);
  size_t seq = 0;
  for (int i = 0; i < pass.n; ++i) {
    while (i >= seqs[seq].first + seqs[seq].n) ++seq;
    float* q = q_.data() + static_cast<size_t>(i) * q_width;
    float* k = k_.data() + static_cast<size_t>(i) * k_width;
    if (norms.qk == QkNorm::PerHead) {
      for (int h = 0; h < H; ++h) ops::rms_norm(q + h * dk, L.q_norm.data(), q + h * dk, dk, c.norm_eps);
      for (int h = 0; h < HKV; ++h) ops::rms_norm(k + h * dk, L.k_norm.data(), k + h * dk, dk, c.norm_eps);
    } else if (norms.qk == QkNorm::Full) {
      ops::rms_norm(q, L.q_norm.data(), q, q_width, c.norm_eps);
      ops::rms_norm(k, L.k_norm.data(), k, k_width, c.norm_eps);
    }
    float* v = v_.data() + static_cast<size_t>(i) * v_width;
    if (norms.v) {
      for (int h = 0; h < HKV; ++h) ops::rms_norm(v + h * dv, nullptr, v + h * dv, dv, c.norm_eps);
    }
    const RopeConfig& rope = c.rope_at(layer);
    const float* freq_factors = L.rope_freqs.empty() ? nullptr : L.rope_freqs.data();
    ops::rope(q, H, dk, pass.positions[i], rope, freq_factors);
    ops::rope(k, HKV, dk, pass.positions[i], rope, freq_factors);
    seqs[seq].cache->store(layer, pass.positions[i], k, v);
  }
}

// One attention call per sequence over its own cache, with the parameters its own pass gives.
void AttentionBase::attend(const AttentionWeights& L, int layer, const LayerPass& pass, std::span<const CacheRows> seqs) {
  const ModelConfig& c = pass.cfg;
  const int dk = c.head_dim_at(layer), dv = c.head_dim_v_at(layer);
  const int64_t attn_width = static_cast<int64_t>(c.n_head) * dv;
  const int64_t q_width = static_cast<int64_t>(c.n_head) * dk;
  AttentionParams p;
  p.n_head = c.n_head;
  p.n_head_kv = c.n_head_kv_at(layer);
  p.head_dim_k = dk;
  p.head_dim_v = dv;
  p.scale = c.attention.scale > 0.0f ? c.attention.scale : 1.0f / std::sqrt(static_cast<float>(dk));
  p.softcap = c.attention.softcap;
  p.sliding_window = c.sliding_at(layer);
  p.sinks = L.attn_sinks.empty() ? nullptr : L.attn_sinks.data();
  attn_.resize(static_cast<size_t>(pass.n * attn_width));
  for (const CacheRows& q : seqs) {
    // An f32 cache is compared against llama.cpp's classic path (its flash attention rounds to
    // f16 whatever the cache type); an f16 cache follows its default flash attention.
    p.numerics = q.cache->type() == KvType::F32 ? AttentionNumerics::Classic : AttentionNumerics::Flash;
    p.batch_path = q.batch_path;
    attention(pass.pool, *q.cache, layer, p, q_.data() + q.first * q_width, pass.positions + q.first, q.n,
              attn_.data() + q.first * attn_width);
  }
}

void AttentionBase::output(const AttentionWeights& L, int layer, const LayerPass& pass) {
  const int E = pass.cfg.n_embd;
  proj_.resize(static_cast<size_t>(pass.n) * E);
  matmul(pass.pool, L.wo, attn_.data(), pass.n, proj_.data(), out_act_);
  add_bias(proj_.data(), L.bo, pass.n, E);
  const bool post_norm = pass.cfg.norms_at(layer).post_mixer;
  for (int i = 0; i < pass.n; ++i) {
    float* row = proj_.data() + static_cast<size_t>(i) * E;
    if (post_norm) ops::rms_norm(row, L.post_attn_norm.data(), row, E, pass.cfg.norm_eps);
    pass.residual.add(i, row);
  }
}

// Gated DeltaNet: projections for the whole batch, the convolution and the delta rule token by
// token (in parallel over channels and value heads), a gated RMS norm per head, the output
// projection added to the residual. A layer's state is its convolution history, then
// head_dim x head_dim per value head.
class DeltaNetMixer final : public Mixer {
 public:
  explicit DeltaNetMixer(const ModelConfig& c) : state_(c, MixerKind::GatedDeltaNet) {}

  void forward(const LayerWeights& weights, int layer, const LayerPass& pass) override {
    const DeltaNetWeights& L = *weights.delta_net;
    pre_norm(pass, weights.attn_norm, h_);
    project(L, pass);
    convolve(L, layer, pass);
    recur(layer, pass);
    output(L, pass);
  }

  uint64_t recurrent_bytes() const override { return state_.bytes(); }
  void save_state() override { state_.save(); }
  void restore_state() override { state_.restore(); }
  void clear_state() override { state_.clear(); }
  bool keep_row_states(int rows) override {
    state_.keep_rows(rows);
    return true;
  }
  void restore_row_state(int row) override { state_.restore_row(row); }
  uint64_t row_state_bytes() const override { return state_.row_bytes(); }
  void append_state(std::vector<float>& out) const override { state_.append(out); }

 private:
  void project(const DeltaNetWeights& L, const LayerPass& pass);
  void convolve(const DeltaNetWeights& L, int layer, const LayerPass& pass);
  void recur(int layer, const LayerPass& pass);
  void output(const DeltaNetWeights& L, const LayerPass& pass);

  LayerStates state_;
  std::vector<float> h_, mixed_, z_, beta_, alpha_, conv_, out_, proj_;
  Activations acts_;
  ActivationBuffer out_act_;
};

void DeltaNetMixer::project(const DeltaNetWeights& L, const LayerPass& pass) {
  const ModelConfig::DeltaNet& d = pass.cfg.delta_net;
  const int n = pass.n, E = pass.cfg.n_embd, C = d.conv_channels(), VD = d.value_dim(), HV = d.v_heads;
  const size_t rows = static_cast<size_t>(n);
  float* mixed = scratch(mixed_, rows * C);
  float* z = scratch(z_, rows * VD);
  float* beta = scratch(beta_, rows * HV);
  float* alpha = scratch(alpha_, rows * HV);
  acts_.reset();
  const MatmulJob jobs[] = {
      {&L.ssm_qkv, &acts_.get(pass.pool, L.ssm_qkv.type, h_.data(), n, E), n, nullptr, mixed, C},
      {&L.ssm_z, &acts_.get(pass.pool, L.ssm_z.type, h_.data(), n, E), n, nullptr, z, VD},
      {&L.ssm_beta, &acts_.get(pass.pool, L.ssm_beta.type, h_.data(), n, E), n, nullptr, beta, HV},
      {&L.ssm_alpha, &acts_.get(pass.pool, L.ssm_alpha.type, h_.data(), n, E), n, nullptr, alpha, HV},
  };
  run_matmuls(pass.pool, jobs);
}

// The causal convolution and SiLU over q | k | v, L2-normed q and k heads, and per value head
// its update strength (beta) and decay (alpha).
void DeltaNetMixer::convolve(const DeltaNetWeights& L, int layer, const LayerPass& pass) {
  const ModelConfig::DeltaNet& d = pass.cfg.delta_net;
  const int n = pass.n, C = d.conv_channels(), HV = d.v_heads, S = d.head_dim;
  const size_t rows = static_cast<size_t>(n);
  const float* mixed = mixed_.data();
  float* conv = scratch(conv_, rows * C);
  float* conv_state = state_.at(layer);
  constexpr int kChannelsPerJob = 256;
  pass.pool.run((C + kChannelsPerJob - 1) / kChannelsPerJob, [&](int64_t job, int) {
    const int first = static_cast<int>(job) * kChannelsPerJob;
    const int end = std::min(C, first + kChannelsPerJob);
    for (int r = 0; r < std::min(n, state_.kept_rows()); ++r) {  // the history a rewind to row r restores
      delta_net::conv_history_after(mixed, r + 1, C, d.conv_kernel, conv_state, state_.row_copy(layer, r), first, end);
    }
    delta_net::causal_conv(mixed, n, C, d.conv_kernel, L.ssm_conv.data(), conv_state, conv, first, end);
    for (size_t t = 0; t < rows; ++t) float_kernels().silu(conv + t * C + first, conv + t * C + first, end - first);
  });
  float* beta = beta_.data();
  float* alpha = alpha_.data();
  for (size_t t = 0; t < rows; ++t) {
    float* row = conv + t * C;
    for (int h = 0; h < 2 * d.k_heads; ++h) delta_net::l2_norm(row + h * S, S, pass.cfg.norm_eps);  // q heads, then k heads
    for (int h = 0; h < HV; ++h) {
      const size_t o = t * HV + static_cast<size_t>(h);
      beta[o] = 1.0f / (1.0f + std::exp(-beta[o]));
      alpha[o] = std::exp(delta_net::softplus(alpha[o] + L.ssm_dt[static_cast<size_t>(h)]) * L.ssm_a[static_cast<size_t>(h)]);
    }
  }
}

// The gated delta rule, token by token, each value head on its own worker.
void DeltaNetMixer::recur(int layer, const LayerPass& pass) {
  const ModelConfig::DeltaNet& d = pass.cfg.delta_net;
  const int C = d.conv_channels(), VD = d.value_dim(), HV = d.v_heads, S = d.head_dim;
  const size_t rows = static_cast<size_t>(pass.n);
  const int key_dim = d.key_dim();
  const float* conv = conv_.data();
  const float* beta = beta_.data();
  const float* alpha = alpha_.data();
  float* out = scratch(out_, rows * VD);
  // The delta states follow the layer's convolution history.
  float* state = state_.at(layer) + static_cast<size_t>(C) * (d.conv_kernel - 1);
  const float scale = 1.0f / std::sqrt(static_cast<float>(S));
  const size_t head_floats = static_cast<size_t>(S) * S;
  const size_t delta_at = static_cast<size_t>(C) * (d.conv_kernel - 1);  // in a row copy, after the history
  const size_t copies = std::min(rows, static_cast<size_t>(state_.kept_rows()));
  pass.pool.run(HV, [&](int64_t h, int) {
    const int hk = static_cast<int>(h) % d.k_heads;  // value head h reads key head h mod k_heads
    float* head_state = state + static_cast<size_t>(h) * head_floats;
    for (size_t t = 0; t < rows; ++t) {
      const float* row = conv + t * C;
      const size_t o = t * HV + static_cast<size_t>(h);
      delta_net::step(head_state, S, row + hk * S, row + key_dim + hk * S, row + 2 * key_dim + h * S, alpha[o], beta[o],
                      scale, out + t * VD + h * S);
      if (t < copies) {  // the state after row t, for a rewind to it
        float* copy = state_.row_copy(layer, static_cast<int>(t)) + delta_at + static_cast<size_t>(h) * head_floats;
        std::copy(head_state, head_state + head_floats, copy);
      }
    }
  });
}

// Gated RMS norm per head, the output projection, added to the residual.
void DeltaNetMixer::output(const DeltaNetWeights& L, const LayerPass& pass) {
  const ModelConfig::DeltaNet& d = pass.cfg.delta_net;
  const int E = pass.cfg.n_embd, VD = d.value_dim(), HV = d.v_heads, S = d.head_dim;
  const size_t rows = static_cast<size_t>(pass.n);
  float* out = out_.data();
  const float* z = z_.data();
  for (size_t t = 0; t < rows; ++t) {
    for (int h = 0; h < HV; ++h) {
      float* y = out + t * VD + static_cast<size_t>(h) * S;
      const float* g = z + t * VD + static_cast<size_t>(h) * S;
      ops::rms_norm(y, L.ssm_norm.data(), y, S, pass.cfg.norm_eps);
      float gate[delta_net::kMaxHeadDim];
      float_kernels().silu(g, gate, S);
      for (int j = 0; j < S; ++j) y[j] *= gate[j];
    }
  }
  proj_.resize(rows * E);
  matmul(pass.pool, L.ssm_out, out, pass.n, proj_.data(), out_act_);
  for (int i = 0; i < pass.n; ++i) pass.residual.add(i, proj_.data() + static_cast<size_t>(i) * E);
}

// Short convolution (lfm2moe): b | c | x from one projection; the causal convolution runs over
// b * x and its output is gated by c before the output projection. A layer's state is its
// convolution history.
class ShortConvMixer final : public Mixer {
 public:
  explicit ShortConvMixer(const ModelConfig& c) : state_(c, MixerKind::ShortConv) {}
  void forward(const LayerWeights& L, int layer, const LayerPass& pass) override;
  uint64_t recurrent_bytes() const override { return state_.bytes(); }
  void save_state() override { state_.save(); }
  void restore_state() override { state_.restore(); }
  void clear_state() override { state_.clear(); }
  bool keep_row_states(int rows) override {
    state_.keep_rows(rows);
    return true;
  }
  void restore_row_state(int row) override { state_.restore_row(row); }
  uint64_t row_state_bytes() const override { return state_.row_bytes(); }
  void append_state(std::vector<float>& out) const override { state_.append(out); }

 private:
  LayerStates state_;
  std::vector<float> h_, bcx_, bx_, conv_, proj_;
  ActivationBuffer in_act_, out_act_;
};

void ShortConvMixer::forward(const LayerWeights& weights, int layer, const LayerPass& pass) {
  const ShortConvWeights& L = *weights.short_conv;
  const int n = pass.n, E = pass.cfg.n_embd;
  const size_t rows = static_cast<size_t>(n);
  pre_norm(pass, weights.attn_norm, h_);
  float* bcx = scratch(bcx_, rows * 3 * E);
  matmul(pass.pool, L.shortconv_in, h_.data(), n, bcx, in_act_);
  float* bx = scratch(bx_, rows * E);
  for (size_t t = 0; t < rows; ++t) {
    const float* b = bcx + t * 3 * E;
    for (int c = 0; c < E; ++c) bx[t * E + c] = b[c] * b[2 * E + c];
  }
  float* conv = scratch(conv_, rows * E);
  float* state = state_.at(layer);
  constexpr int kChannelsPerJob = 256;
  pass.pool.run((E + kChannelsPerJob - 1) / kChannelsPerJob, [&](int64_t job, int) {
    const int first = static_cast<int>(job) * kChannelsPerJob, end = std::min(E, first + kChannelsPerJob);
    for (int r = 0; r < std::min(n, state_.kept_rows()); ++r) {  // the history a rewind to row r restores
      delta_net::conv_history_after(bx, r + 1, E, pass.cfg.short_conv.kernel, state, state_.row_copy(layer, r), first, end);
    }
    delta_net::causal_conv(bx, n, E, pass.cfg.short_conv.kernel, L.shortconv_kernel.data(), state, conv, first, end);
  });
  for (size_t t = 0; t < rows; ++t) {
    const float* c = bcx + t * 3 * E + E;
    for (int j = 0; j < E; ++j) conv[t * E + j] *= c[j];
  }
  proj_.resize(rows * E);
  matmul(pass.pool, L.shortconv_out, conv, n, proj_.data(), out_act_);
  for (int i = 0; i < n; ++i) pass.residual.add(i, proj_.data() + static_cast<size_t>(i) * E);
}

enum class Unit { Attention, GatedAttention, DeltaNet, ShortConv, KimiDelta, LatentAttention, CompressedAttention, kCount };

Unit unit_of(MixerKind kind) {
  switch (kind) {
    case MixerKind::Attention: return Unit::Attention;
    case MixerKind::GatedAttention: return Unit::GatedAttention;
    case MixerKind::GatedDeltaNet: return Unit::DeltaNet;
    case MixerKind::ShortConv: return Unit::ShortConv;
    case MixerKind::KimiDelta: return Unit::KimiDelta;
    case MixerKind::LatentAttention: return Unit::LatentAttention;
    case MixerKind::CompressedAttention: return Unit::CompressedAttention;
  }
  return Unit::Attention;
}

std::unique_ptr<Mixer> make_unit(Unit unit, const ModelConfig& c, int n_ctx, KvType kv_type, int rewind_slack) {
  switch (unit) {
    case Unit::Attention: return std::make_unique<AttentionMixer>(c, n_ctx, kv_type);
    case Unit::GatedAttention: return std::make_unique<GatedAttentionMixer>(c, n_ctx, kv_type);
    case Unit::DeltaNet: return std::make_unique<DeltaNetMixer>(c);
    case Unit::ShortConv: return std::make_unique<ShortConvMixer>(c);
    case Unit::KimiDelta: return mixer_units::make_kimi_delta(c);
    case Unit::LatentAttention: return mixer_units::make_latent_attention(c, n_ctx, kv_type);
    case Unit::CompressedAttention: return mixer_units::make_compressed_attention(c, n_ctx, kv_type, rewind_slack);
    case Unit::kCount: break;
  }
  return nullptr;
}

}  // namespace

namespace mixer_units {

void pre_norm(const LayerPass& pass, const Vector& weight, std::vector<float>& h) {
  const int E = pass.cfg.n_embd;
  h.resize(static_cast<size_t>(pass.n) * E);
  for (int i = 0; i < pass.n; ++i) {
    ops::rms_norm(pass.residual.row(i), weight.data(), h.data() + static_cast<size_t>(i) * E, E, pass.cfg.norm_eps);
  }
}

LayerStates::LayerStates(const ModelConfig& c, MixerKind kind) : live_(static_cast<size_t>(c.n_layer)) {
  for (int l = 0; l < c.n_layer; ++l) {
    if (c.mixer_at(l) == kind) live_[static_cast<size_t>(l)].assign(static_cast<size_t>(recurrent_state_floats(c, l)), 0.0f);
  }
}

uint64_t LayerStates::bytes() const {
  uint64_t total = 0;
  for (const auto& v : live_) total += v.size() * sizeof(float);
  return total;
}

void LayerStates::clear() {
  for (auto& v : live_) std::fill(v.begin(), v.end(), 0.0f);
  kept_rows_ = 0;
}

void LayerStates::keep_rows(int rows) {
  kept_rows_ = rows;
  if (rows == 0) return;
  rows_.resize(live_.size());
  for (size_t l = 0; l < live_.size(); ++l) {
    const size_t need = static_cast<size_t>(rows) * live_[l].size();
    if (rows_[l].size() < need) rows_[l].resize(need);
  }
}

void LayerStates::restore_row(int row) {
  if (row < 0 || row >= kept_rows_) fail("no copy of the recurrent state after row {}", row);
  for (size_t l = 0; l < live_.size(); ++l) {
    const float* copy = rows_[l].data() + static_cast<size_t>(row) * live_[l].size();
    std::copy(copy, copy + live_[l].size(), live_[l].begin());
  }
}

uint64_t LayerStates::row_bytes() const {
  uint64_t total = 0;
  for (const auto& v : rows_) total += v.capacity() * sizeof(float);
  return total;
}

void LayerStates::append(std::vector<float>& out) const {
  for (const auto& v : live_) out.insert(out.end(), v.begin(), v.end());
}

}  // namespace mixer_units

namespace {

// deepseek4's rings with the default slack, in floats (mixer_compressed.cpp): the f16 raw rows
// of the window, the compressors' f32 inputs (values and scores) of their pending blocks.
int64_t compressed_ring_floats(const ModelConfig& c, int layer) {
  const int ratio = c.csa.ratio_at(layer), D = c.head_dim, ID = c.csa.indexer_head_dim;
  int64_t floats = int64_t{c.sliding_at(layer) + kRewindSlack} * D / 2;
  if (ratio == 0) return floats;
  const int64_t slots = (ratio == 4 ? 2 * ratio : ratio) + kRewindSlack;
  floats += slots * 2 * (ratio == 4 ? 2 : 1) * D;
  if (ratio == 4) floats += slots * 2 * 2 * ID;
  return floats;
}

}  // namespace

int64_t recurrent_state_floats(const ModelConfig& c, int layer) {
  const ModelConfig::DeltaNet& d = c.delta_net;
  switch (c.mixer_at(layer)) {
    case MixerKind::GatedDeltaNet:
      return int64_t{d.conv_channels()} * (d.conv_kernel - 1) + int64_t{d.v_heads} * d.head_dim * d.head_dim;
    case MixerKind::ShortConv: return int64_t{c.n_embd} * (c.short_conv.kernel - 1);
    case MixerKind::KimiDelta:  // the q | k | v convolution histories, then head_dim^2 per head
      return int64_t{3} * c.kda.inner(c.n_head) * (c.kda.conv_kernel - 1) +
             int64_t{c.n_head} * c.kda.head_dim * c.kda.head_dim;
    case MixerKind::CompressedAttention: return compressed_ring_floats(c, layer);
    case MixerKind::Attention:
    case MixerKind::GatedAttention:
    case MixerKind::LatentAttention: return 0;
  }
  return 0;
}

int64_t row_copy_floats(const ModelConfig& c) {
  int64_t floats = 0;
  for (int l = 0; l < c.n_layer; ++l) {
    const MixerKind kind = c.mixer_at(l);
    const bool copies = kind == MixerKind::GatedDeltaNet || kind == MixerKind::ShortConv;
    if (!copies && recurrent_state_floats(c, l) > 0) return 0;  // this kind keeps none: then no unit does
    if (copies) floats += recurrent_state_floats(c, l);
  }
  return floats;
}

int64_t kv_bytes_per_token(const ModelConfig& c, int layer) {
  if (!c.attends(layer)) return 0;
  if (c.mixer_at(layer) == MixerKind::LatentAttention) {
    return int64_t{2} * c.mla.cache_row() + int64_t{2} * c.mla.kv_lora_rank;  // f16 latent | rope key, latent again as V
  }
  if (c.mixer_at(layer) == MixerKind::CompressedAttention) {
    // Per token only its share of the f16 compressed rows: the raw rows and compressor inputs
    // live in fixed rings (compressed_ring_floats).
    const int ratio = c.csa.ratio_at(layer), D = c.head_dim, ID = c.csa.indexer_head_dim;
    if (ratio == 0) return 0;
    int64_t bytes = int64_t{2} * D / ratio;
    if (ratio == 4) bytes += int64_t{2} * ID / 4;
    return bytes;
  }
  return int64_t{c.n_head_kv_at(layer)} * (c.head_dim_at(layer) + c.head_dim_v_at(layer)) * 2;  // f16 K and V
}

void ModelConfig::plan_norms(const LayerNorms& norms) {
  auto apply = [&](LayerPlan& p) {
    const bool attention = p.mixer == MixerKind::Attention || p.mixer == MixerKind::GatedAttention;
    p.norms = norms;
    if (!attention) {
      p.norms.qk = QkNorm::None;
      p.norms.v = false;
      p.norms.post_mixer = false;
    }
  };
  for (LayerPlan& p : plan) apply(p);
  apply(nextn_plan);
}

int64_t ModelConfig::recurrent_state_bytes() const {
  int64_t floats = 0;
  for (int l = 0; l < n_layer; ++l) floats += recurrent_state_floats(*this, l);
  return floats * 4;
}

int64_t ModelConfig::kv_bytes_per_token() const {
  int64_t total = 0;
  for (int l = 0; l < n_layer; ++l) total += bmoe::kv_bytes_per_token(*this, l);
  return total;
}

Mixers::Mixers(const ModelConfig& c, int n_ctx, KvType kv_type, int rewind_slack) {
  Mixer* made[static_cast<int>(Unit::kCount)] = {};
  for (int l = 0; l < c.n_layer; ++l) {
    const Unit unit = unit_of(c.mixer_at(l));
    Mixer*& m = made[static_cast<int>(unit)];
    if (m == nullptr) {
      units_.push_back(make_unit(unit, c, n_ctx, kv_type, rewind_slack));
      m = units_.back().get();
    }
    by_layer_.push_back(m);
  }
}

uint64_t Mixers::kv_bytes() const {
  uint64_t total = 0;
  for (const auto& u : units_) total += u->kv_bytes();
  return total;
}

uint64_t Mixers::recurrent_bytes() const {
  uint64_t total = 0;
  for (const auto& u : units_) total += u->recurrent_bytes();
  return total;
}

void Mixers::save_state() {
  for (const auto& u : units_) u->save_state();
}

void Mixers::restore_state() {
  for (const auto& u : units_) u->restore_state();
}

void Mixers::clear_state() {
  for (const auto& u : units_) u->clear_state();
}

bool Mixers::keep_row_states(int rows) {
  bool all = true;
  for (const auto& u : units_) all = u->keep_row_states(0) && all;  // asks each, allocating nothing
  if (!all || rows == 0) return all;
  for (const auto& u : units_) u->keep_row_states(rows);
  return true;
}

void Mixers::restore_row_state(int row) {
  for (const auto& u : units_) u->restore_row_state(row);
}

uint64_t Mixers::row_state_bytes() const {
  uint64_t total = 0;
  for (const auto& u : units_) total += u->row_state_bytes();
  return total;
}

std::vector<float> Mixers::recurrent_state() const {
  std::vector<float> out;
  for (const auto& u : units_) u->append_state(out);
  return out;
}

int Mixers::rewind_reach() const {
  int reach = INT_MAX;
  for (const auto& u : units_) reach = std::min(reach, u->rewind_reach());
  return reach;
}

}  // namespace bmoe
