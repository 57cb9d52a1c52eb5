// Kimi Delta Attention (bailingmoe3), as llama.cpp's CPU backend computes it: q, k and v each
// projected and passed through its own causal short convolution and SiLU, L2-normed q and k,
// then per head the delta rule on a head_dim x head_dim state whose key channels decay each by
// their own gate (a log-decay in (gate_lower_bound, 0)), a per-head RMS norm of the output times
// sigmoid(output gate), the output projection added to the residual.
//
// A layer's state is its convolution history (q | k | v channels, kernel - 1 inputs each, the
// layout llama.cpp keeps), then one state per head stored as rows j = value channel, so the
// scalar-decay delta_step (which reads the same layout) runs the rule once the rows carry the
// per-channel decay.
#include <algorithm>
#include <cmath>
#include <cstring>

#include "model/delta_net.h"
#include "model/mixer_units.h"
#include "model/ops.h"
#include "quant/float_kernels.h"
#include "quant/isa_target.h"

namespace bmoe::mixer_units {

namespace {

float sigmoid(float x) { return 1.0f / (1.0f + std::exp(-x)); }

class KimiDeltaMixer final : public Mixer {
 public:
  explicit KimiDeltaMixer(const ModelConfig& c) : state_(c, MixerKind::KimiDelta) {}

  void forward(const LayerWeights& weights, int layer, const LayerPass& pass) override {
    const KimiDeltaWeights& L = *weights.kimi_delta;
    pre_norm(pass, weights.attn_norm, h_);
    project(L, pass);
    convolve(L, layer, pass);
    gates(L, pass);
    recur(layer, pass);
    output(L, pass);
  }

  uint64_t recurrent_bytes() const override { return state_.bytes(); }
  void save_state() override { state_.save(); }
  void restore_state() override { state_.restore(); }
  void clear_state() override { state_.clear(); }

 private:
  void project(const KimiDeltaWeights& L, const LayerPass& pass);
  void convolve(const KimiDeltaWeights& L, int layer, const LayerPass& pass);
  void gates(const KimiDeltaWeights& L, const LayerPass& pass);
  void recur(int layer, const LayerPass& pass);
  void output(const KimiDeltaWeights& L, const LayerPass& pass);

  LayerStates state_;
  std::vector<float> h_, mixed_, decay_, beta_, gate_, conv_, out_, proj_;
  Activations acts_;
  ActivationBuffer out_act_;
};

// q, k, v into the rows of mixed_ (q | k | v per token, as the convolution reads them), the
// decay input, beta and the output gate.
void KimiDeltaMixer::project(const KimiDeltaWeights& L, const LayerPass& pass) {
  const int n = pass.n, E = pass.cfg.n_embd, H = pass.cfg.n_head, I = pass.cfg.kda.inner(H);
  const size_t rows = static_cast<size_t>(n);
  float* mixed = scratch(mixed_, rows * 3 * I);
  float* decay = scratch(decay_, rows * I);
  float* beta = scratch(beta_, rows * H);
  float* gate = scratch(gate_, rows * I);
  acts_.reset();
  auto job = [&](const Weight& w, float* out, int64_t stride) {
    return MatmulJob{&w, &acts_.get(pass.pool, w.type, h_.data(), n, E), n, nullptr, out, stride};
  };
  const MatmulJob jobs[] = {
      job(L.wq, mixed, 3 * I),  job(L.wk, mixed + I, 3 * I),   job(L.wv, mixed + 2 * I, 3 * I),
      job(L.w_decay, decay, I), job(L.w_beta, beta, H), job(L.w_gate, gate, I),
  };
  run_matmuls(pass.pool, jobs);
}

// The short convolutions and SiLU over q | k | v, then L2-normed q and k heads.
void KimiDeltaMixer::convolve(const KimiDeltaWeights& L, int layer, const LayerPass& pass) {
  const ModelConfig& c = pass.cfg;
  const int n = pass.n, H = c.n_head, D = c.kda.head_dim, C = 3 * c.kda.inner(H);
  const size_t rows = static_cast<size_t>(n);
  const float* mixed = mixed_.data();
  float* conv = scratch(conv_, rows * C);
  float* conv_state = state_.at(layer);
  constexpr int kChannelsPerJob = 256;
  pass.pool.run((C + kChannelsPerJob - 1) / kChannelsPerJob, [&](int64_t job, int) {
    const int first = static_cast<int>(job) * kChannelsPerJob;
    const int end = std::min(C, first + kChannelsPerJob);
    delta_net::causal_conv(mixed, n, C, c.kda.conv_kernel, L.conv.data(), conv_state, conv, first, end);
    for (size_t t = 0; t < rows; ++t) float_kernels().silu(conv + t * C + first, conv + t * C + first, end - first);
  });
  for (size_t t = 0; t < rows; ++t) {
    for (int h = 0; h < 2 * H; ++h) delta_net::l2_norm(conv + t * C + static_cast<size_t>(h) * D, D, c.norm_eps);
  }
}

// Per channel the decay factor exp(LB * sigmoid(A_h * (x + dt_bias))), per head beta.
void KimiDeltaMixer::gates(const KimiDeltaWeights& L, const LayerPass& pass) {
  const ModelConfig& c = pass.cfg;
  const int H = c.n_head, D = c.kda.head_dim, I = c.kda.inner(H);
  const float bound = c.kda.gate_lower_bound;
  for (size_t t = 0; t < static_cast<size_t>(pass.n); ++t) {
    float* decay = decay_.data() + t * I;
    for (int ch = 0; ch < I; ++ch) {
      const float a = L.a[static_cast<size_t>(ch / D)];
      decay[ch] = std::exp(bound * sigmoid(a * (decay[ch] + L.dt_bias[static_cast<size_t>(ch)])));
    }
    float* beta = beta_.data() + t * H;
    for (int h = 0; h < H; ++h) beta[h] = sigmoid(beta[h]);
  }
}

// Every row of a head's D x D state times the per-channel decay. Products round alike in any
// vector width, so the AVX2 clone (picked at load time) gives the baseline's bits; the compiler
// at -O2 left the scalar loop unvectorised, 6.6 % of a Ling prompt.
BMOE_CLONES_FOR("avx2") void decay_state(float* S, const float* decay, int D) {
  typedef float F8 __attribute__((vector_size(32)));
  for (int j = 0; j < D; ++j) {
    float* s = S + static_cast<size_t>(j) * D;
    int i = 0;
    for (; i + 8 <= D; i += 8) {
      F8 x, d;
      std::memcpy(&x, s + i, sizeof x);
      std::memcpy(&d, decay + i, sizeof d);
      x *= d;
      std::memcpy(s + i, &x, sizeof x);
    }
    for (; i < D; ++i) s[i] *= decay[i];
  }
}

// The delta rule token by token, each head on its own worker: the state's rows (one per value
// channel) decay along the key channels, then the scalar-decay step runs with decay 1 (exact).
void KimiDeltaMixer::recur(int layer, const LayerPass& pass) {
  const ModelConfig& c = pass.cfg;
  const int H = c.n_head, D = c.kda.head_dim, I = c.kda.inner(H), C = 3 * I;
  const size_t rows = static_cast<size_t>(pass.n);
  float* out = scratch(out_, rows * I);
  float* state = state_.at(layer) + static_cast<size_t>(C) * (c.kda.conv_kernel - 1);
  const float scale = 1.0f / std::sqrt(static_cast<float>(D));
  pass.pool.run(H, [&](int64_t head, int) {
    const size_t h = static_cast<size_t>(head);
    float* S = state + h * D * D;
    for (size_t t = 0; t < rows; ++t) {
      const float* row = conv_.data() + t * C + h * D;
      const float* decay = decay_.data() + t * I + h * D;
      decay_state(S, decay, D);
      delta_net::step(S, D, row, row + I, row + 2 * I, 1.0f, beta_[t * H + h], scale, out + t * I + h * D);
    }
  });
}

// Per head RMS norm times sigmoid(gate), the output projection, added to the residual.
void KimiDeltaMixer::output(const KimiDeltaWeights& L, const LayerPass& pass) {
  const ModelConfig& c = pass.cfg;
  const int E = c.n_embd, H = c.n_head, D = c.kda.head_dim, I = c.kda.inner(H);
  const size_t rows = static_cast<size_t>(pass.n);
  float* out = out_.data();
  for (size_t t = 0; t < rows; ++t) {
    for (int h = 0; h < H; ++h) {
      float* y = out + t * I + static_cast<size_t>(h) * D;
      const float* g = gate_.data() + t * I + static_cast<size_t>(h) * D;
      ops::rms_norm(y, L.norm.data(), y, D, c.norm_eps);
      for (int j = 0; j < D; ++j) y[j] *= sigmoid(g[j]);
    }
  }
  proj_.resize(rows * E);
  matmul(pass.pool, L.wo, out, pass.n, proj_.data(), out_act_);
  for (int i = 0; i < pass.n; ++i) pass.residual.add(i, proj_.data() + static_cast<size_t>(i) * E);
}

}  // namespace

std::unique_ptr<Mixer> make_kimi_delta(const ModelConfig& c) { return std::make_unique<KimiDeltaMixer>(c); }

}  // namespace bmoe::mixer_units
