// Gemma 4 MoE (26B-A4B): sliding-window layers and full-attention layers with different head
// sizes, kv head counts and RoPE (the full layers rotate a quarter of each head, through
// per-pair frequency factors, and may use the key projection as values); RMS-normed q, k and
// (weightless) v; attention, FFN and output post-norms; every MoE layer runs a dense GeGLU FFN
// beside the routed experts (fused gate+up tensor, per-expert output scale); the embedding is
// scaled by sqrt(n_embd) and the logits soft-capped.
#include <fmt/format.h>

#include <algorithm>
#include <cmath>

#include "core/error.h"
#include "model/arch.h"

namespace bmoe {

namespace {

void load_gemma4_hparams(ArchLoader& a, ModelConfig& c) {
  c.n_layer = static_cast<int>(a.get_int(".block_count"));
  c.n_embd = static_cast<int>(a.get_int(".embedding_length"));
  c.n_head = static_cast<int>(a.get_int(".attention.head_count"));
  if (c.n_layer <= 0 || c.n_layer > kMaxLayers || c.n_embd <= 0 || c.n_head <= 0) fail("gemma4: invalid model shape");
  const int L = c.n_layer;
  const auto swa = a.get_per_layer_int(".attention.sliding_window_pattern", L, std::nullopt);
  const auto kv_heads = a.get_per_layer_int(".attention.head_count_kv", L, c.n_head);
  const int dim_full = static_cast<int>(a.get_int(".attention.key_length"));
  const int dim_swa = static_cast<int>(a.get_int(".attention.key_length_swa"));
  if (a.get_int_or(".attention.value_length", dim_full) != dim_full ||
      a.get_int_or(".attention.value_length_swa", dim_swa) != dim_swa) {
    fail("gemma4: key and value head sizes must be equal");
  }
  if (a.get_int_or(".attention.shared_kv_layers", 0) != 0) fail("gemma4: layers that share another layer's KV cache are not supported");
  if (a.get_int_or(".embedding_length_per_layer_input", 0) != 0) {
    fail("gemma4: per-layer input embeddings (Gemma 4 E2B/E4B) are not supported; bmoe runs the MoE variants");
  }
  const int window = static_cast<int>(a.get_int(".attention.sliding_window"));
  c.n_ctx_train = static_cast<int>(a.get_int_or(".context_length", 131072));
  c.norm_eps = static_cast<float>(a.get_float_or(".attention.layer_norm_rms_epsilon", 1e-6));
  c.n_expert = static_cast<int>(a.get_int_or(".expert_count", 0));
  c.n_expert_used = static_cast<int>(a.get_int_or(".expert_used_count", 0));
  c.n_ff_exp = static_cast<int>(a.get_int_or(".expert_feed_forward_length", 0));
  c.output.softcap = static_cast<float>(a.get_float_or(".final_logit_softcapping", 0.0));
  c.attention.softcap = static_cast<float>(a.get_float_or(".attn_logit_softcapping", 0.0));

  RopeConfig full;
  full.style = RopeStyle::NeoX;
  full.freq_base = static_cast<float>(a.get_float_or(".rope.freq_base", 10000.0));
  full.n_rot = static_cast<int>(a.get_int_or(".rope.dimension_count", dim_full));
  full.n_ctx_orig = c.n_ctx_train;
  RopeConfig sliding = full;
  sliding.freq_base = static_cast<float>(a.get_float_or(".rope.freq_base_swa", 10000.0));
  sliding.n_rot = static_cast<int>(a.get_int_or(".rope.dimension_count_swa", full.n_rot));
  if (dim_full <= 0 || dim_swa <= 0 || full.n_rot <= 0 || full.n_rot > dim_full || full.n_rot % 2 != 0 ||
      sliding.n_rot <= 0 || sliding.n_rot > dim_swa || sliding.n_rot % 2 != 0) {
    fail("gemma4: invalid attention shape: head sizes {}/{}, rotated dimensions {}/{}", dim_full, dim_swa, full.n_rot,
         sliding.n_rot);
  }

  c.head_dim = dim_full;
  c.head_dim_v = dim_full;
  c.n_head_kv = static_cast<int>(kv_heads[0]);
  c.rope = full;
  for (int l = 0; l < L; ++l) {
    const bool is_swa = swa[static_cast<size_t>(l)] != 0;
    const int hkv = static_cast<int>(kv_heads[static_cast<size_t>(l)]);
    if (hkv <= 0 || c.n_head % hkv != 0) fail("gemma4: layer {} has {} kv heads for {} heads", l, hkv, c.n_head);
    c.attention.layer_n_head_kv.push_back(hkv);
    c.attention.layer_head_dim.push_back(is_swa ? dim_swa : dim_full);
    c.attention.layer_rope.push_back(is_swa ? sliding : full);
    c.attention.sliding_window.push_back(is_swa ? window : 0);
  }
  if (c.n_expert > 0 && (c.n_expert_used <= 0 || c.n_expert_used > c.n_expert)) {
    fail("invalid expert routing: {} of {} experts", c.n_expert_used, c.n_expert);
  }
}

void read_gemma4(ArchLoader& a, ModelConfig& c) {
  load_gemma4_hparams(a, c);
  c.attention.scale = 1.0f;  // q and k are normalised; Gemma 4 applies no 1/sqrt(d)
  c.moe.gating = Gating::SoftmaxTopK;
  c.moe.norm_topk = true;
  c.moe.activation = ExpertActivation::GeGLU;
  c.dense.activation = ExpertActivation::GeGLU;
  c.n_vocab = static_cast<int>(a.tensor_dim("token_embd.weight", 1));
  for (int64_t ff : a.get_per_layer_int(".feed_forward_length", c.n_layer, std::nullopt)) {
    c.dense.layer_n_ff.push_back(static_cast<int>(ff));
  }
  // A layer with a router runs its dense FFN beside the experts; one without is a dense layer.
  for (int l = 0; l < c.n_layer; ++l) {
    const bool moe = a.has_tensor(fmt::format("blk.{}.ffn_gate_inp.weight", l));
    if (moe && (c.n_expert == 0 || c.n_ff_exp == 0)) {
      fail("gemma4: layer {} has a router but the expert count or size is missing", l);
    }
    c.plan.push_back({MixerKind::Attention, moe ? FfnKind::ParallelDenseMoe : FfnKind::Dense});
  }
  c.plan_norms({.qk = QkNorm::PerHead, .v = true, .post_mixer = true, .post_ffn = true});
  for (int l = 0; l < c.n_layer; ++l) {
    c.plan[static_cast<size_t>(l)].norms.output_scale = a.has_tensor(fmt::format("blk.{}.layer_output_scale.weight", l));
  }
}

// The full layers rotate through the model's one table of per-pair frequency factors; the
// embedding is scaled by sqrt(n_embd).
void finish_gemma4(const ModelConfig& c, ModelWeights& w) {
  for (int l = 0; l < c.n_layer; ++l) {
    if (c.sliding_at(l) == 0) w.layers[static_cast<size_t>(l)].attention->rope_freqs = w.rope_freqs;
  }
  w.embd_scale = std::sqrt(static_cast<float>(c.n_embd));
}

using D = Dim;
using C = TensorClass;
using L = LayerWeights;
using Attn = AttentionWeights;
using Dense = DenseFfnWeights;
using Par = ParallelFfnNorms;
using Moe = RoutedExpertWeights;

// The embedding is tied to the output (and scaled by sqrt(n_embd) on input), so its spread
// sets the synthetic logit spread; the router reads an input of RMS 1/sqrt(n_embd).
const TensorSpec kTensors[] = {
    global_matrix("token_embd.weight", {D::Embd, D::Vocab}, &ModelWeights::tok_embd, C::Embedding,
                  fan_in(kOutputLogitStd)),
    [] {
      TensorSpec t = optional(global_vector("rope_freqs.weight", {D::RopePairs}, &ModelWeights::rope_freqs), Layers::Global);
      t.init = fixed(Fixed::RopeQuarter);
      return t;
    }(),
    norm("attn_norm.weight", {D::Embd}, &L::attn_norm),
    matrix("attn_q.weight", {D::Embd, D::QWidth}, &Attn::wq, C::AttnQ, fan_in(1.0f)),
    matrix("attn_k.weight", {D::Embd, D::KWidth}, &Attn::wk, C::AttnK, fan_in(1.0f)),
    // Absent: values = keys (the synthetic full layers do that).
    optional(matrix("attn_v.weight", {D::Embd, D::VWidth}, &Attn::wv, C::AttnV, fan_in(1.0f)), Layers::Sliding),
    matrix("attn_output.weight", {D::OutWidth, D::Embd}, &Attn::wo, C::AttnOut, fan_in(0.5f)),
    norm("attn_q_norm.weight", {D::HeadDim}, &Attn::q_norm),
    norm("attn_k_norm.weight", {D::HeadDim}, &Attn::k_norm),
    norm("post_attention_norm.weight", {D::Embd}, &Attn::post_attn_norm),
    optional(small("layer_output_scale.weight", {D::One}, &L::out_scale, fixed(Fixed::LayerOutputScale))),
    norm("ffn_norm.weight", {D::Embd}, &L::ffn_norm),
    matrix("ffn_gate.weight", {D::Embd, D::DenseFF}, &Dense::ffn_gate, C::Dense, fan_in(1.0f)),
    matrix("ffn_up.weight", {D::Embd, D::DenseFF}, &Dense::ffn_up, C::Dense, fan_in(1.0f)),
    matrix("ffn_down.weight", {D::DenseFF, D::Embd}, &Dense::ffn_down, C::Dense, fan_in(0.5f)),
    norm("post_ffw_norm.weight", {D::Embd}, &L::post_ffn_norm),
    on(Layers::Moe, matrix("ffn_gate_inp.weight", {D::Embd, D::Experts}, &Moe::router, C::Router,
                           constant(kRouterLogitStd), Role::Router)),
    on(Layers::Moe, norm("ffn_gate_inp.scale", {D::Embd}, &Moe::router_in_scale)),
    on(Layers::Moe, norm("pre_ffw_norm_2.weight", {D::Embd}, &Par::moe_norm)),
    on(Layers::Moe, norm("post_ffw_norm_1.weight", {D::Embd}, &Par::post_dense_norm)),
    on(Layers::Moe, norm("post_ffw_norm_2.weight", {D::Embd}, &Par::post_moe_norm)),
    alternative(Alternative::Preferred,
                on(Layers::Moe, experts("ffn_gate_up_exps.weight", {D::Embd, D::ExpertFF2, D::Experts},
                                        &ExpertRoles::gate_up, C::Experts, fan_in(1.0f)))),
    alternative(Alternative::Fallback,
                on(Layers::Moe, experts("ffn_gate_exps.weight", {D::Embd, D::ExpertFF, D::Experts}, &ExpertRoles::gate,
                                        C::Experts, fan_in(1.0f)))),
    alternative(Alternative::Fallback,
                on(Layers::Moe, experts("ffn_up_exps.weight", {D::Embd, D::ExpertFF, D::Experts}, &ExpertRoles::up,
                                        C::Experts, fan_in(1.0f)))),
    on(Layers::Moe, experts("ffn_down_exps.weight", {D::ExpertFF, D::Embd, D::Experts}, &ExpertRoles::down,
                            C::ExpertsDown, fan_in(1.0f))),
    on(Layers::Moe, optional(small("ffn_down_exps.scale", {D::Experts}, &Moe::exp_down_scale, fixed(Fixed::ExpertScales)))),
    global_vector("output_norm.weight", {D::Embd}, &ModelWeights::output_norm),
    optional(global_matrix("output.weight", {D::Embd, D::Vocab}, &ModelWeights::output, C::Output,
                           fan_in(kOutputLogitStd)), Layers::Never),
};

}  // namespace

const Architecture& gemma4_architecture() {
  static const Architecture arch{"gemma4", "Gemma 4 MoE (26B-A4B; dense FFN beside the experts, fused gate+up)",
                                 read_gemma4, kTensors, finish_gemma4, "gemma4"};
  return arch;
}

}  // namespace bmoe
