// LFM2-MoE (LiquidAI LFM2-8B-A1B): short-convolution layers (one projection to b | c | x, a
// causal depthwise convolution over b * x, gated by c) and GQA attention layers with per-head
// RMS-normed q and k and NeoX RoPE; a layer without kv heads is a convolution layer. The first
// leading_dense_block_count layers run a dense SwiGLU FFN, the rest route 4 of 32 experts by
// sigmoid scores, a per-expert bias steering the choice only, weights renormalised. The final
// norm is stored as token_embd_norm; the output head is tied to the embeddings.
#include <fmt/format.h>

#include "core/error.h"
#include "model/arch.h"
#include "model/delta_net.h"

namespace bmoe {

namespace {

void read_lfm2moe(ArchLoader& a, ModelConfig& c) {
  load_common_hparams(a, c, /*zero_kv_heads_allowed=*/true);
  if (c.n_expert == 0) fail("lfm2moe: expert_count must be > 0");
  if (c.n_ff_exp == 0) fail("lfm2moe: missing required key 'lfm2moe.expert_feed_forward_length'");
  c.rope.style = RopeStyle::NeoX;
  c.moe.gating = Gating::SigmoidTopK;
  c.moe.norm_topk = true;
  c.moe.activation = ExpertActivation::SwiGLU;
  const int64_t gating = a.get_int(".expert_gating_func");
  if (gating != 2) fail("lfm2moe: expert_gating_func {} is not supported (2 = sigmoid)", gating);
  const int64_t taps = a.get_int(".shortconv.l_cache");
  if (taps < 2 || taps > delta_net::kMaxConvKernel) fail("lfm2moe: shortconv.l_cache {} is out of range", taps);
  c.short_conv.kernel = static_cast<int>(taps);
  c.n_vocab = static_cast<int>(a.tensor_dim("token_embd.weight", 1));
  const auto kv_heads = a.get_per_layer_int(".attention.head_count_kv", c.n_layer, c.n_head);
  const int64_t dense = a.get_int_or(".leading_dense_block_count", 0);
  const auto dense_ff = a.get_per_layer_int(".feed_forward_length", c.n_layer, 0);
  for (int l = 0; l < c.n_layer; ++l) {
    c.plan.push_back({kv_heads[static_cast<size_t>(l)] == 0 ? MixerKind::ShortConv : MixerKind::Attention,
                      l >= dense ? FfnKind::Moe : FfnKind::Dense});
    c.dense.layer_n_ff.push_back(static_cast<int>(dense_ff[static_cast<size_t>(l)]));
    if (l < dense && dense_ff[static_cast<size_t>(l)] <= 0) fail("lfm2moe: dense layer {} has no feed_forward_length", l);
  }
  c.plan_norms({.qk = QkNorm::PerHead});
}

// causal_conv reads the kernel tap by tap across channels.
void finish_lfm2moe(const ModelConfig& c, ModelWeights& w) {
  for (int l = 0; l < c.n_layer; ++l) {
    if (c.mixer_at(l) != MixerKind::ShortConv) continue;
    Vector& k = w.layers[static_cast<size_t>(l)].short_conv->shortconv_kernel;
    k = delta_net::transpose_conv(k, c.n_embd, c.short_conv.kernel);
  }
}

using D = Dim;
using C = TensorClass;
using L = LayerWeights;
using Attn = AttentionWeights;
using Dense = DenseFfnWeights;
using Moe = RoutedExpertWeights;
using Conv = ShortConvWeights;

TensorSpec short_conv(TensorSpec t) {
  t.role = Role::Recurrent;
  return on(Layers::ShortConv, t);
}

const TensorSpec kTensors[] = {
    global_matrix("token_embd.weight", {D::Embd, D::Vocab}, &ModelWeights::tok_embd, C::Embedding, constant(1.0f)),
    norm("attn_norm.weight", {D::Embd}, &L::attn_norm),
    short_conv(matrix("shortconv.in_proj.weight", {D::Embd, D::Embd3}, &Conv::shortconv_in, C::AttnQ, fan_in(1.0f))),
    short_conv(small("shortconv.conv.weight", {D::ShortConvKernel, D::Embd}, &Conv::shortconv_kernel, constant(0.5f))),
    short_conv(matrix("shortconv.out_proj.weight", {D::Embd, D::Embd}, &Conv::shortconv_out, C::AttnOut, fan_in(0.5f))),
    on(Layers::Attention, matrix("attn_q.weight", {D::Embd, D::QWidth}, &Attn::wq, C::AttnQ, fan_in(1.0f))),
    on(Layers::Attention, matrix("attn_k.weight", {D::Embd, D::KWidth}, &Attn::wk, C::AttnK, fan_in(1.0f))),
    on(Layers::Attention, matrix("attn_v.weight", {D::Embd, D::VWidth}, &Attn::wv, C::AttnV, fan_in(1.0f))),
    on(Layers::Attention, norm("attn_q_norm.weight", {D::HeadDim}, &Attn::q_norm)),
    on(Layers::Attention, norm("attn_k_norm.weight", {D::HeadDim}, &Attn::k_norm)),
    on(Layers::Attention, matrix("attn_output.weight", {D::OutWidth, D::Embd}, &Attn::wo, C::AttnOut, fan_in(0.5f))),
    norm("ffn_norm.weight", {D::Embd}, &L::ffn_norm),
    on(Layers::Dense, matrix("ffn_gate.weight", {D::Embd, D::DenseFF}, &Dense::ffn_gate, C::Dense, fan_in(1.0f))),
    on(Layers::Dense, matrix("ffn_up.weight", {D::Embd, D::DenseFF}, &Dense::ffn_up, C::Dense, fan_in(1.0f))),
    on(Layers::Dense, matrix("ffn_down.weight", {D::DenseFF, D::Embd}, &Dense::ffn_down, C::Dense, fan_in(0.5f))),
    // Sigmoid scores: a narrower synthetic spread than softmax routers get keeps the top ones
    // apart instead of all near 1.
    on(Layers::Moe, matrix("ffn_gate_inp.weight", {D::Embd, D::Experts}, &Moe::router, C::Router, fan_in(1.5f),
                           Role::Router)),
    on(Layers::Moe, experts("ffn_gate_exps.weight", {D::Embd, D::ExpertFF, D::Experts}, &ExpertRoles::gate,
                            C::Experts, fan_in(1.0f))),
    on(Layers::Moe, experts("ffn_up_exps.weight", {D::Embd, D::ExpertFF, D::Experts}, &ExpertRoles::up, C::Experts,
                            fan_in(1.0f))),
    on(Layers::Moe, experts("ffn_down_exps.weight", {D::ExpertFF, D::Embd, D::Experts}, &ExpertRoles::down,
                            C::ExpertsDown, fan_in(1.0f))),
    on(Layers::Moe, small("exp_probs_b.bias", {D::Experts}, &Moe::expert_select_bias, constant(0.05f))),
    global_vector("token_embd_norm.weight", {D::Embd}, &ModelWeights::output_norm),
    // LFM2-8B-A1B ties its output head to the embeddings. Synthetic files carry their own: a
    // random tied head mostly predicts the token it just read, which would make a weak test.
    optional(global_matrix("output.weight", {D::Embd, D::Vocab}, &ModelWeights::output, C::Output,
                           fan_in(kOutputLogitStd)), Layers::Global),
};

}  // namespace

const Architecture& lfm2moe_architecture() {
  static const Architecture arch{"lfm2moe", "LFM2-MoE (LFM2-8B-A1B; short convolutions + GQA, sigmoid-routed experts)",
                                 read_lfm2moe, kTensors, finish_lfm2moe};
  return arch;
}

}  // namespace bmoe
