// OLMoE: attention whose q and k are RMS-normed over all heads at once, NeoX RoPE, and routed
// experts in every layer (softmax, top-k, weights not renormalised).
#include "core/error.h"
#include "model/arch.h"

namespace bmoe {

namespace {

void read_olmoe(ArchLoader& a, ModelConfig& c) {
  load_common_hparams(a, c);
  if (c.n_expert == 0) fail("olmoe: expert_count must be > 0");
  c.rope.style = RopeStyle::NeoX;
  c.qk_norm_full = true;
  c.gating = Gating::SoftmaxTopK;
  c.norm_topk = false;
  read_vocab_and_expert_width(a, c);
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
    matrix("attn_output.weight", {D::OutWidth, D::Embd}, &L::wo, C::AttnOut, fan_in(0.5f)),
    norm("attn_q_norm.weight", {D::QWidth}, &L::q_norm),
    norm("attn_k_norm.weight", {D::KWidth}, &L::k_norm),
    norm("ffn_norm.weight", {D::Embd}, &L::ffn_norm),
    matrix("ffn_gate_inp.weight", {D::Embd, D::Experts}, &L::router, C::Router, fan_in(kRouterLogitStd), Role::Router),
    experts("ffn_gate_exps.weight", {D::Embd, D::ExpertFF, D::Experts}, &ExpertRoles::gate, C::Experts, fan_in(1.0f)),
    experts("ffn_up_exps.weight", {D::Embd, D::ExpertFF, D::Experts}, &ExpertRoles::up, C::Experts, fan_in(1.0f)),
    experts("ffn_down_exps.weight", {D::ExpertFF, D::Embd, D::Experts}, &ExpertRoles::down, C::ExpertsDown, fan_in(1.0f)),
    global_vector("output_norm.weight", {D::Embd}, &ModelWeights::output_norm),
    optional(global_matrix("output.weight", {D::Embd, D::Vocab}, &ModelWeights::output, C::Output,
                           fan_in(kOutputLogitStd)), Layers::Global),
};

}  // namespace

const Architecture& olmoe_architecture() {
  static const Architecture arch{"olmoe", "OLMoE (OLMoE-1B-7B)", read_olmoe, kTensors};
  return arch;
}

}  // namespace bmoe
