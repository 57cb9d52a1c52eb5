// llama-architecture MoE (Mixtral): GQA attention, adjacent-pair ("normal") RoPE, routed experts
// (softmax, top-k, weights renormalised). Dense llama layers (no expert_count) are rejected:
// bmoe runs MoE models.
#include "core/error.h"
#include "model/arch.h"

namespace bmoe {

namespace {

void read_llama_moe(ArchLoader& a, ModelConfig& c) {
  load_common_hparams(a, c);
  if (c.n_expert == 0) fail("llama: this is a dense model (no expert_count); bmoe runs Mixture-of-Experts models");
  c.rope.style = RopeStyle::Normal;
  c.gating = Gating::SoftmaxTopK;
  c.norm_topk = true;
  if (!a.has_tensor("blk.0.ffn_gate_exps.weight") && a.has_tensor("blk.0.ffn_gate.0.weight")) {
    fail("llama: experts stored one tensor per expert (blk.N.ffn_gate.E.weight) are not supported; "
         "convert the model with a current llama.cpp (merged *_exps tensors)");
  }
  read_vocab_and_expert_width(a, c);
}

using D = Dim;
using C = TensorClass;
using L = LayerWeights;

// Mixtral files carry no biases; llama files that do are read.
const TensorSpec kTensors[] = {
    global_matrix("token_embd.weight", {D::Embd, D::Vocab}, &ModelWeights::tok_embd, C::Embedding, constant(1.0f)),
    norm("attn_norm.weight", {D::Embd}, &L::attn_norm),
    matrix("attn_q.weight", {D::Embd, D::QWidth}, &L::wq, C::AttnQ, fan_in(1.0f)),
    matrix("attn_k.weight", {D::Embd, D::KWidth}, &L::wk, C::AttnK, fan_in(1.0f)),
    matrix("attn_v.weight", {D::Embd, D::VWidth}, &L::wv, C::AttnV, fan_in(1.0f)),
    optional(norm("attn_q.bias", {D::QWidth}, &L::bq), Layers::Never),
    optional(norm("attn_k.bias", {D::KWidth}, &L::bk), Layers::Never),
    optional(norm("attn_v.bias", {D::VWidth}, &L::bv), Layers::Never),
    matrix("attn_output.weight", {D::OutWidth, D::Embd}, &L::wo, C::AttnOut, fan_in(0.5f)),
    optional(norm("attn_output.bias", {D::Embd}, &L::bo), Layers::Never),
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

const Architecture& llama_moe_architecture() {
  static const Architecture arch{"llama", "llama-architecture MoE (Mixtral 8x7B, 8x22B)", read_llama_moe, kTensors};
  return arch;
}

}  // namespace bmoe
