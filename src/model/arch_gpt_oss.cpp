// gpt-oss (20b, 120b): attention with q/k/v/o biases and per-head sink logits, alternating
// sliding-window (even layers) and full attention, YaRN-scaled NeoX RoPE; routed experts with
// a router bias, top-k over the logits then a softmax over the k, per-expert biases, and the
// clamped SwiGLU variant (x * sigmoid(1.702 x) * (up + 1)).
#include "core/error.h"
#include "model/arch.h"

namespace bmoe {

namespace {

void read_gpt_oss(ArchLoader& a, ModelConfig& c) {
  load_common_hparams(a, c);
  if (c.n_expert == 0) fail("gpt-oss: expert_count must be > 0");
  c.rope.style = RopeStyle::NeoX;
  c.moe.gating = Gating::TopKSoftmax;
  c.moe.norm_topk = false;
  c.moe.activation = ExpertActivation::SwiGLU_OAI;
  read_vocab_and_expert_width(a, c);
  c.plan_every_layer(MixerKind::Attention, FfnKind::Moe);
  const int window = static_cast<int>(a.get_int(".attention.sliding_window"));
  const int period = static_cast<int>(a.get_int_or(".attention.sliding_window_pattern", 2));
  c.attention.sliding_window.assign(static_cast<size_t>(c.n_layer), 0);
  for (int l = 0; l < c.n_layer; ++l) {
    if (period == 0 || l % period < period - 1) c.attention.sliding_window[static_cast<size_t>(l)] = window;
  }
}

using D = Dim;
using L = LayerWeights;
using Attn = AttentionWeights;
using Moe = RoutedExpertWeights;

std::vector<TensorSpec> tensors() {
  return rows({{token_embedding(constant(1.0f))},
               attention_inputs(),
               {small("attn_q.bias", {D::QWidth}, &Attn::bq, constant(0.1f)),
                small("attn_k.bias", {D::KWidth}, &Attn::bk, constant(0.1f)),
                small("attn_v.bias", {D::VWidth}, &Attn::bv, constant(0.1f)), attention_output(),
                small("attn_output.bias", {D::Embd}, &Attn::bo, constant(0.05f)),
                small("attn_sinks.weight", {D::Heads}, &Attn::attn_sinks, constant(1.0f)),
                norm("post_attention_norm.weight", {D::Embd}, &L::ffn_norm), router(),
                small("ffn_gate_inp.bias", {D::Experts}, &Moe::router_bias, constant(0.5f))},
               swiglu_experts(),
               {small("ffn_gate_exps.bias", {D::ExpertFF, D::Experts}, &Moe::exp_gate_bias, constant(0.1f)),
                small("ffn_up_exps.bias", {D::ExpertFF, D::Experts}, &Moe::exp_up_bias, constant(0.1f)),
                small("ffn_down_exps.bias", {D::Embd, D::Experts}, &Moe::exp_down_bias, constant(0.05f))},
               output_head()});
}

}  // namespace

const Architecture& gpt_oss_architecture() {
  static const std::vector<TensorSpec> table = tensors();
  static const Architecture arch{"gpt-oss", "gpt-oss (20b, 120b; MXFP4 experts, attention sinks, sliding window)",
                                 read_gpt_oss, table, nullptr, "harmony"};
  return arch;
}

}  // namespace bmoe
