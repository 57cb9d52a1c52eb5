// Qwen2-MoE (Qwen1.5-MoE, Qwen2-57B-A14B): GQA attention with q/k/v biases, NeoX RoPE, routed
// experts (softmax, top-k, weights not renormalised) plus a shared expert scaled by a sigmoid
// gate of its own.
#include "core/error.h"
#include "model/arch.h"

namespace bmoe {

namespace {

void read_qwen2moe(ArchLoader& a, ModelConfig& c) {
  load_common_hparams(a, c);
  if (c.n_expert == 0) fail("qwen2moe: expert_count must be > 0");
  c.rope.style = RopeStyle::NeoX;
  c.gating = Gating::SoftmaxTopK;
  c.norm_topk = false;
  read_vocab_and_expert_width(a, c);
  c.n_ff_shexp = static_cast<int>(a.get_int_or(".expert_shared_feed_forward_length", 0));
  if (c.n_ff_shexp == 0) c.n_ff_shexp = static_cast<int>(a.tensor_dim("blk.0.ffn_gate_shexp.weight", 1));
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
    optional(small("attn_q.bias", {D::QWidth}, &L::bq, constant(0.1f))),
    optional(small("attn_k.bias", {D::KWidth}, &L::bk, constant(0.1f))),
    optional(small("attn_v.bias", {D::VWidth}, &L::bv, constant(0.1f))),
    matrix("attn_output.weight", {D::OutWidth, D::Embd}, &L::wo, C::AttnOut, fan_in(0.5f)),
    norm("ffn_norm.weight", {D::Embd}, &L::ffn_norm),
    matrix("ffn_gate_inp.weight", {D::Embd, D::Experts}, &L::router, C::Router, fan_in(kRouterLogitStd), Role::Router),
    experts("ffn_gate_exps.weight", {D::Embd, D::ExpertFF, D::Experts}, &ExpertRoles::gate, C::Experts, fan_in(1.0f)),
    experts("ffn_up_exps.weight", {D::Embd, D::ExpertFF, D::Experts}, &ExpertRoles::up, C::Experts, fan_in(1.0f)),
    experts("ffn_down_exps.weight", {D::ExpertFF, D::Embd, D::Experts}, &ExpertRoles::down, C::ExpertsDown, fan_in(1.0f)),
    matrix("ffn_gate_inp_shexp.weight", {D::Embd}, &L::shexp_router, C::Router, fan_in(1.0f), Role::SharedExpert),
    matrix("ffn_gate_shexp.weight", {D::Embd, D::SharedFF}, &L::shexp_gate, C::Dense, fan_in(1.0f), Role::SharedExpert),
    matrix("ffn_up_shexp.weight", {D::Embd, D::SharedFF}, &L::shexp_up, C::Dense, fan_in(1.0f), Role::SharedExpert),
    matrix("ffn_down_shexp.weight", {D::SharedFF, D::Embd}, &L::shexp_down, C::Dense, fan_in(0.5f), Role::SharedExpert),
    global_vector("output_norm.weight", {D::Embd}, &ModelWeights::output_norm),
    optional(global_matrix("output.weight", {D::Embd, D::Vocab}, &ModelWeights::output, C::Output,
                           fan_in(kOutputLogitStd)), Layers::Global),
};

}  // namespace

const Architecture& qwen2moe_architecture() {
  static const Architecture arch{"qwen2moe", "Qwen2 MoE with shared expert (Qwen1.5-MoE-A2.7B, Qwen2-57B-A14B)",
                                 read_qwen2moe, kTensors};
  return arch;
}

}  // namespace bmoe
