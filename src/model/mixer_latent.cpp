// Multi-head latent attention (bailingmoe3; the DeepSeek-style kind), as llama.cpp computes it
// with the key up-projection absorbed into the query:
//  - query: q_b(rms(q_a x)) where the layer has a low-rank query, else q x; per head the part
//    without RoPE (qk_nope) and the RoPE part (qk_rope, adjacent-pair rotation);
//  - one compressed row per token, kv_a x = latent | rope key: the latent RMS-normed, the rope
//    key rotated. The cache holds that row (kv_lora_rank + qk_rope values) as K and the latent
//    again as V, never per-head keys or values;
//  - per head the query row [k_b(q_nope) | roped q_pe] attends over the rows like one KV head
//    (scale 1/sqrt(qk_nope + qk_rope)), the attended latent goes through v_b, times
//    sigmoid(head gate of x), then the output projection.
#include <algorithm>
#include <cmath>

#include "model/mixer_units.h"
#include "model/ops.h"
#include "quant/quant.h"

namespace bmoe::mixer_units {

namespace {

// out[r] = <row r of w, x> for `rows` rows of n floats, each through the f32 one-row dot kernel,
// so a token's result depends on neither batch nor path.
void dot_rows_f32(const float* w, int64_t rows, const float* x, int64_t n, float* out) {
  const DotFn dot = kernels(TensorType::F32).dot;
  for (int64_t r = 0; r < rows; ++r) out[r] = dot(w + r * n, x, n);
}

class LatentAttentionMixer final : public Mixer {
 public:
  LatentAttentionMixer(const ModelConfig& c, int n_ctx, KvType kv_type) {
    std::vector<int> k_widths, v_widths;
    for (int l = 0; l < c.n_layer; ++l) {
      const bool latent = c.mixer_at(l) == MixerKind::LatentAttention;
      k_widths.push_back(latent ? c.mla.cache_row() : 0);
      v_widths.push_back(latent ? c.mla.kv_lora_rank : 0);
    }
    cache_.init(n_ctx, k_widths, v_widths, kv_type);
  }

  void forward(const LayerWeights& weights, int layer, const LayerPass& pass) override {
    const LatentAttentionWeights& L = *weights.latent;
    pre_norm(pass, weights.attn_norm, h_);
    project(L, pass);
    store_rows(L, layer, pass);
    queries(L, pass);
    attend(L, layer, pass);
    output(L, pass);
  }

  uint64_t kv_bytes() const override { return cache_.bytes(); }

 private:
  void project(const LatentAttentionWeights& L, const LayerPass& pass);
  void store_rows(const LatentAttentionWeights& L, int layer, const LayerPass& pass);
  void queries(const LatentAttentionWeights& L, const LayerPass& pass);
  void attend(const LatentAttentionWeights& L, int layer, const LayerPass& pass);
  void output(const LatentAttentionWeights& L, const LayerPass& pass);

  KvCache cache_;
  std::vector<float> h_, q_low_, q_, kv_, gate_, rows_, latent_out_, heads_, proj_;
  Activations acts_;
  ActivationBuffer q_b_act_, out_act_;
};

// The query (through the low-rank path where the layer has one), the compressed row, the gate.
void LatentAttentionMixer::project(const LatentAttentionWeights& L, const LayerPass& pass) {
  const ModelConfig& c = pass.cfg;
  const int n = pass.n, E = c.n_embd, H = c.n_head;
  const int64_t q_width = int64_t{H} * c.mla.qk_head_dim(), rank = c.mla.q_lora_rank;
  const size_t rows = static_cast<size_t>(n);
  float* q = scratch(q_, rows * q_width);
  float* kv = scratch(kv_, rows * c.mla.cache_row());
  float* gate = scratch(gate_, rows * H);
  float* q_low = rank > 0 ? scratch(q_low_, rows * rank) : nullptr;
  acts_.reset();
  auto job = [&](const Weight& w, float* out, int64_t stride) {
    return MatmulJob{&w, &acts_.get(pass.pool, w.type, h_.data(), n, E), n, nullptr, out, stride};
  };
  std::vector<MatmulJob> jobs = {job(L.wkv_a, kv, c.mla.cache_row()), job(L.w_gate, gate, H)};
  jobs.push_back(rank > 0 ? job(L.wq_a, q_low, rank) : job(L.wq, q, q_width));
  run_matmuls(pass.pool, jobs);
  if (rank == 0) return;
  for (size_t i = 0; i < rows; ++i) {
    float* r = q_low + i * rank;
    ops::rms_norm(r, L.q_a_norm.data(), r, rank, c.norm_eps);
  }
  matmul(pass.pool, L.wq_b, q_low, n, q, q_b_act_);
}

// Per token the cached row: the normed latent and the rotated rope key (K), the latent (V).
void LatentAttentionMixer::store_rows(const LatentAttentionWeights& L, int layer, const LayerPass& pass) {
  const ModelConfig& c = pass.cfg;
  const int C = c.mla.kv_lora_rank, R = c.mla.qk_rope;
  for (int i = 0; i < pass.n; ++i) {
    float* row = kv_.data() + static_cast<size_t>(i) * c.mla.cache_row();
    ops::rms_norm(row, L.kv_a_norm.data(), row, C, c.norm_eps);
    ops::rope(row + C, 1, R, pass.positions[i], c.rope);
    cache_.store(layer, pass.positions[i], row, row);
  }
}

// Per token and head the attention query [k_b(q_nope) | roped q_pe], a cache row wide.
void LatentAttentionMixer::queries(const LatentAttentionWeights& L, const LayerPass& pass) {
  const ModelConfig& c = pass.cfg;
  const int H = c.n_head, C = c.mla.kv_lora_rank, R = c.mla.qk_rope, N = c.mla.qk_nope, dq = c.mla.qk_head_dim();
  const size_t width = static_cast<size_t>(c.mla.cache_row());
  float* rows = scratch(rows_, static_cast<size_t>(pass.n) * H * width);
  pass.pool.run(int64_t{pass.n} * H, [&](int64_t job, int) {
    const size_t i = static_cast<size_t>(job / H), h = static_cast<size_t>(job % H);
    float* q = q_.data() + (i * H + h) * dq;
    float* out = rows + (i * H + h) * width;
    dot_rows_f32(L.k_b.data() + h * C * N, C, q, N, out);
    std::copy(q + N, q + dq, out + C);
    ops::rope(out + C, 1, R, pass.positions[i], c.rope);
  });
}

// Attention over the latent rows, then per head v_b and the sigmoid head gate.
void LatentAttentionMixer::attend(const LatentAttentionWeights& L, int layer, const LayerPass& pass) {
  const ModelConfig& c = pass.cfg;
  const int H = c.n_head, C = c.mla.kv_lora_rank, V = c.mla.v_head_dim;
  AttentionParams p;
  p.n_head = H;
  p.n_head_kv = 1;
  p.head_dim_k = c.mla.cache_row();
  p.head_dim_v = C;
  p.scale = 1.0f / std::sqrt(static_cast<float>(c.mla.qk_head_dim()));
  p.numerics = cache_.type() == KvType::F32 ? AttentionNumerics::Classic : AttentionNumerics::Flash;
  p.batch_path = pass.batch_path;
  const size_t rows = static_cast<size_t>(pass.n);
  float* latent = scratch(latent_out_, rows * H * C);
  attention(pass.pool, cache_, layer, p, rows_.data(), pass.positions, pass.n, latent);
  float* heads = scratch(heads_, rows * H * V);
  pass.pool.run(int64_t{pass.n} * H, [&](int64_t job, int) {
    const size_t i = static_cast<size_t>(job / H), h = static_cast<size_t>(job % H);
    const float* o = latent + (i * H + h) * C;
    float* y = heads + (i * H + h) * V;
    const float g = 1.0f / (1.0f + std::exp(-gate_[i * H + h]));
    dot_rows_f32(L.v_b.data() + h * V * C, V, o, C, y);
    for (int e = 0; e < V; ++e) y[e] *= g;
  });
}

void LatentAttentionMixer::output(const LatentAttentionWeights& L, const LayerPass& pass) {
  const int E = pass.cfg.n_embd;
  proj_.resize(static_cast<size_t>(pass.n) * E);
  matmul(pass.pool, L.wo, heads_.data(), pass.n, proj_.data(), out_act_);
  for (int i = 0; i < pass.n; ++i) pass.residual.add(i, proj_.data() + static_cast<size_t>(i) * E);
}

}  // namespace

std::unique_ptr<Mixer> make_latent_attention(const ModelConfig& c, int n_ctx, KvType kv_type) {
  return std::make_unique<LatentAttentionMixer>(c, n_ctx, kv_type);
}

}  // namespace bmoe::mixer_units
