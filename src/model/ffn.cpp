#include "model/ffn.h"

#include <cmath>

#include "model/ops.h"

namespace bmoe {

namespace {

// gate, up, activation, down: the dense FFN and the shared expert.
class DenseMlp {
 public:
  // limit: the layer's SwiGLU limit (ModelConfig::DenseFfn::clamp), 0 for none.
  void run(const LayerPass& pass, const Weight& gate, const Weight& up, const Weight& down, const float* h,
           float* out, float limit = 0.0f) {
    const int n = pass.n, E = pass.cfg.n_embd;
    const int64_t F = up.rows;
    const size_t size = static_cast<size_t>(n * F);
    float* g = scratch(gate_, size);
    float* u = scratch(up_, size);
    float* a = scratch(act_, size);
    acts_.reset();
    const MatmulJob jobs[] = {
        {&gate, &acts_.get(pass.pool, gate.type, h, n, E), n, nullptr, g, F},
        {&up, &acts_.get(pass.pool, up.type, h, n, E), n, nullptr, u, F},
    };
    run_matmuls(pass.pool, jobs);
    if (pass.cfg.dense.activation == ExpertActivation::GeGLU) ops::geglu(g, u, a, n * F);
    else ops::swiglu_clamped(pass.cfg.dense.clamp, g, u, a, n * F, limit);
    matmul(pass.pool, down, a, n, out, down_act_);
  }

 private:
  std::vector<float> gate_, up_, act_;
  Activations acts_;
  ActivationBuffer down_act_;
};

// Row i of the layer's output times its output scale, where the plan declares one (the loader
// has checked the weight is there).
void scale_output(const LayerWeights& L, int layer, const LayerPass& pass, int i) {
  if (pass.cfg.norms_at(layer).output_scale) ops::scale(pass.residual.row(i), L.out_scale[0], pass.cfg.n_embd);
}

// The kinds that pre-norm the residual (ffn_norm), compute one output per token and add it back
// (after the post-norm where the plan has one).
class PreNormFfn : public Ffn {
 public:
  void forward(const LayerWeights& L, int layer, const LayerPass& pass, const FfnContext& ctx) final {
    const int n = pass.n, E = pass.cfg.n_embd;
    h_.resize(static_cast<size_t>(n) * E);
    for (int i = 0; i < n; ++i) {
      ops::rms_norm(pass.residual.row(i), L.ffn_norm.data(), h_.data() + static_cast<size_t>(i) * E, E,
                    pass.cfg.norm_eps);
    }
    out_.assign(static_cast<size_t>(n) * E, 0.0f);
    body(L, layer, pass, ctx);
    const bool post_norm = pass.cfg.norms_at(layer).post_ffn;
    for (int i = 0; i < n; ++i) {
      float* row = out_.data() + static_cast<size_t>(i) * E;
      if (post_norm) ops::rms_norm(row, L.post_ffn_norm.data(), row, E, pass.cfg.norm_eps);
      pass.residual.add(i, row);
      scale_output(L, layer, pass, i);
    }
  }

 protected:
  // out_ = the kind's output on h_ (the normed rows).
  virtual void body(const LayerWeights& L, int layer, const LayerPass& pass, const FfnContext& ctx) = 0;
  std::vector<float> h_, out_;
};

class DenseFfn final : public PreNormFfn {
  void body(const LayerWeights& L, int layer, const LayerPass& pass, const FfnContext&) override {
    const DenseFfnWeights& D = *L.dense;
    mlp_.run(pass, D.ffn_gate, D.ffn_up, D.ffn_down, h_.data(), out_.data(), pass.cfg.dense.clamp.at(layer));
  }
  DenseMlp mlp_;
};

class MoeFfn final : public PreNormFfn {
  void body(const LayerWeights&, int layer, const LayerPass& pass, const FfnContext& ctx) override {
    ctx.experts.run(layer, pass.n, h_.data(), h_.data(), pass.positions, ctx.source, out_.data());
  }
};

// The routed experts plus the shared expert times its gate (or as is, where it has none).
class MoeSharedFfn final : public PreNormFfn {
  void body(const LayerWeights& L, int layer, const LayerPass& pass, const FfnContext& ctx) override {
    const int n = pass.n, E = pass.cfg.n_embd;
    const SharedExpertWeights& S = *L.shared;
    ctx.experts.run(layer, n, h_.data(), h_.data(), pass.positions, ctx.source, out_.data());
    float* shared = scratch(shared_, static_cast<size_t>(n) * E);
    mlp_.run(pass, S.shexp_gate, S.shexp_up, S.shexp_down, h_.data(), shared, pass.cfg.dense.clamp.at(layer));
    if (pass.cfg.shared_expert.ungated) {
      for (size_t i = 0; i < static_cast<size_t>(n) * E; ++i) out_[i] += shared[i];
      return;
    }
    float* gate = scratch(gate_, static_cast<size_t>(n) * S.shexp_router.rows);
    matmul(pass.pool, S.shexp_router, h_.data(), n, gate, gate_act_);
    for (int i = 0; i < n; ++i) {
      // qwen2moe's graph computes the sigmoid as silu(x) / x, qwen35moe's as 1 / (1 + e^-x)
      const float x = gate[static_cast<size_t>(i) * S.shexp_router.rows];
      const float g = pass.cfg.shared_expert.gate_sigmoid ? 1.0f / (1.0f + std::exp(-x)) : ops::silu(x) / x;
      float* out = out_.data() + static_cast<size_t>(i) * E;
      const float* s = shared + static_cast<size_t>(i) * E;
      for (int d = 0; d < E; ++d) out[d] += s[d] * g;
    }
  }
  DenseMlp mlp_;
  std::vector<float> shared_, gate_;
  ActivationBuffer gate_act_;
};

// The routed experts plus the shared expert as it is, no gate (glm4moe): routed + shared.
class MoeUngatedSharedFfn final : public PreNormFfn {
  void body(const LayerWeights& L, int layer, const LayerPass& pass, const FfnContext& ctx) override {
    const size_t total = static_cast<size_t>(pass.n) * pass.cfg.n_embd;
    const SharedExpertWeights& S = *L.shared;
    ctx.experts.run(layer, pass.n, h_.data(), h_.data(), pass.positions, ctx.source, out_.data());
    float* shared = scratch(shared_, total);
    mlp_.run(pass, S.shexp_gate, S.shexp_up, S.shexp_down, h_.data(), shared, pass.cfg.dense.clamp.at(layer));
    ops::add(out_.data(), shared, static_cast<int64_t>(total));
  }
  DenseMlp mlp_;
  std::vector<float> shared_;
};

// Gemma 4: dense FFN and routed experts on the same residual, each normalised before and
// after, summed, normalised again and added back; then the layer's output scale.
class ParallelDenseMoeFfn final : public Ffn {
 public:
  void forward(const LayerWeights& L, int layer, const LayerPass& pass, const FfnContext& ctx) override {
    const DenseFfnWeights& D = *L.dense;
    const ParallelFfnNorms& P = *L.parallel;
    const int n = pass.n, E = pass.cfg.n_embd;
    const float eps = pass.cfg.norm_eps;
    const size_t total = static_cast<size_t>(n) * E;
    float* dense_in = scratch(dense_in_, total);
    float* moe_in = scratch(moe_in_, total);
    float* router_in = scratch(router_in_, total);
    float* moe_out = scratch(moe_out_, total);
    for (int i = 0; i < n; ++i) {
      const float* x = pass.residual.row(i);
      const size_t o = static_cast<size_t>(i) * E;
      ops::rms_norm(x, L.ffn_norm.data(), dense_in + o, E, eps);
      ops::rms_norm(x, P.moe_norm.data(), moe_in + o, E, eps);
      ctx.experts.router_input(layer, x, router_in + o);
    }
    dense_out_.assign(total, 0.0f);
    mlp_.run(pass, D.ffn_gate, D.ffn_up, D.ffn_down, dense_in, dense_out_.data());
    ctx.experts.run(layer, n, moe_in, router_in, pass.positions, ctx.source, moe_out);
    const bool post_norm = pass.cfg.norms_at(layer).post_ffn;
    for (int i = 0; i < n; ++i) {
      float* dense = dense_out_.data() + static_cast<size_t>(i) * E;
      float* moe = moe_out + static_cast<size_t>(i) * E;
      ops::rms_norm(dense, P.post_dense_norm.data(), dense, E, eps);
      ops::rms_norm(moe, P.post_moe_norm.data(), moe, E, eps);
      ops::add(dense, moe, E);
      if (post_norm) ops::rms_norm(dense, L.post_ffn_norm.data(), dense, E, eps);
      pass.residual.add(i, dense);
      scale_output(L, layer, pass, i);
    }
  }

 private:
  DenseMlp mlp_;
  std::vector<float> dense_in_, moe_in_, router_in_, moe_out_, dense_out_;
};

std::unique_ptr<Ffn> make_unit(FfnKind kind) {
  switch (kind) {
    case FfnKind::Dense: return std::make_unique<DenseFfn>();
    case FfnKind::Moe: return std::make_unique<MoeFfn>();
    case FfnKind::MoeShared: return std::make_unique<MoeSharedFfn>();
    case FfnKind::MoeUngatedShared: return std::make_unique<MoeUngatedSharedFfn>();
    case FfnKind::ParallelDenseMoe: return std::make_unique<ParallelDenseMoeFfn>();
  }
  return nullptr;
}

}  // namespace

Ffns::Ffns(const ModelConfig& c) {
  constexpr int kKinds = 5;
  Ffn* made[kKinds] = {};
  for (int l = 0; l < c.n_layer; ++l) {
    Ffn*& f = made[static_cast<int>(c.ffn_at(l))];
    if (f == nullptr) {
      units_.push_back(make_unit(c.ffn_at(l)));
      f = units_.back().get();
    }
    by_layer_.push_back(f);
  }
}

}  // namespace bmoe
