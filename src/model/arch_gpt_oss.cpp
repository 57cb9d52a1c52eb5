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
  c.gating = Gating::TopKSoftmax;
  c.norm_topk = false;
  c.activation = ExpertActivation::SwiGLU_OAI;
  read_vocab_and_expert_width(a, c);
  const int window = static_cast<int>(a.get_int(".attention.sliding_window"));
  const int period = static_cast<int>(a.get_int_or(".attention.sliding_window_pattern", 2));
  c.sliding_window.assign(static_cast<size_t>(c.n_layer), 0);
  for (int l = 0; l < c.n_layer; ++l) {
    if (period == 0 || l % period < period - 1) c.sliding_window[static_cast<size_t>(l)] = window;
  }
}

using D = Dim;
using C = TensorClass;
using L = LayerWeights;

const TensorSpec kTensors[] = {
    global_matrix("token_embd.weight", {D::Embd, D::Vocab}, &ModelWeights::tok_embd, C::Embedding, constant(1.0f)),
    norm("attn_norm.weight", {D::Embd}, &L::attn_norm),
    matrix("attn_q.weight", {D::Embd, D::QWidth}, &L::wq, C::AttnQ, fan_in(1.0f)),
    matrix("attn_k.weight", {D::Embd, D::KWidth}, &L::wk, C::AttnK, fan_in(1.0f)),
    matrix("attn_v.weight", {D::Embd, D::VWidth}, &L::wv, C::AttnV, fan_in(1.0f)),
    small("attn_q.bias", {D::QWidth}, &L::bq, constant(0.1f)),
    small("attn_k.bias", {D::KWidth}, &L::bk, constant(0.1f)),
    small("attn_v.bias", {D::VWidth}, &L::bv, constant(0.1f)),
    matrix("attn_output.weight", {D::OutWidth, D::Embd}, &L::wo, C::AttnOut, fan_in(0.5f)),
    small("attn_output.bias", {D::Embd}, &L::bo, constant(0.05f)),
    small("attn_sinks.weight", {D::Heads}, &L::attn_sinks, constant(1.0f)),
    norm("post_attention_norm.weight", {D::Embd}, &L::ffn_norm),
    matrix("ffn_gate_inp.weight", {D::Embd, D::Experts}, &L::router, C::Router, fan_in(kRouterLogitStd), Role::Router),
    small("ffn_gate_inp.bias", {D::Experts}, &L::router_bias, constant(0.5f)),
    experts("ffn_gate_exps.weight", {D::Embd, D::ExpertFF, D::Experts}, &ExpertRoles::gate, C::Experts, fan_in(1.0f)),
    experts("ffn_up_exps.weight", {D::Embd, D::ExpertFF, D::Experts}, &ExpertRoles::up, C::Experts, fan_in(1.0f)),
    experts("ffn_down_exps.weight", {D::ExpertFF, D::Embd, D::Experts}, &ExpertRoles::down, C::ExpertsDown, fan_in(1.0f)),
    small("ffn_gate_exps.bias", {D::ExpertFF, D::Experts}, &L::exp_gate_bias, constant(0.1f)),
    small("ffn_up_exps.bias", {D::ExpertFF, D::Experts}, &L::exp_up_bias, constant(0.1f)),
    small("ffn_down_exps.bias", {D::Embd, D::Experts}, &L::exp_down_bias, constant(0.05f)),
    global_vector("output_norm.weight", {D::Embd}, &ModelWeights::output_norm),
    optional(global_matrix("output.weight", {D::Embd, D::Vocab}, &ModelWeights::output, C::Output,
                           fan_in(kOutputLogitStd)), Layers::Global),
};

}  // namespace

const Architecture& gpt_oss_architecture() {
  static const Architecture arch{"gpt-oss", "gpt-oss (20b, 120b; MXFP4 experts, attention sinks, sliding window)",
                                 read_gpt_oss, kTensors};
  return arch;
}

}  // namespace bmoe
