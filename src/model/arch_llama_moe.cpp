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
  c.moe.gating = Gating::SoftmaxTopK;
  c.moe.norm_topk = true;
  if (!a.has_tensor("blk.0.ffn_gate_exps.weight") && a.has_tensor("blk.0.ffn_gate.0.weight")) {
    fail("llama: experts stored one tensor per expert (blk.N.ffn_gate.E.weight) are not supported; "
         "convert the model with a current llama.cpp (merged *_exps tensors)");
  }
  read_vocab_and_expert_width(a, c);
  c.plan_every_layer(MixerKind::Attention, FfnKind::Moe);
}

using D = Dim;
using L = LayerWeights;
using Attn = AttentionWeights;

// Mixtral files carry no biases; llama files that do are read.
// Mixtral files carry no biases; llama files that do are read.
std::vector<TensorSpec> tensors() {
  return rows({{token_embedding(constant(1.0f))},
               attention_inputs(),
               {optional(norm("attn_q.bias", {D::QWidth}, &Attn::bq), Layers::Never),
                optional(norm("attn_k.bias", {D::KWidth}, &Attn::bk), Layers::Never),
                optional(norm("attn_v.bias", {D::VWidth}, &Attn::bv), Layers::Never), attention_output(),
                optional(norm("attn_output.bias", {D::Embd}, &Attn::bo), Layers::Never),
                norm("ffn_norm.weight", {D::Embd}, &L::ffn_norm), router()},
               swiglu_experts(),
               output_head()});
}

}  // namespace

const Architecture& llama_moe_architecture() {
  static const std::vector<TensorSpec> table = tensors();
  static const Architecture arch{"llama", "llama-architecture MoE (Mixtral 8x7B, 8x22B)", read_llama_moe, table};
  return arch;
}

}  // namespace bmoe
