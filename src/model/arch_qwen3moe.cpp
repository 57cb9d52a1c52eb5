// Qwen3-MoE: GQA attention with per-head RMS-normed q and k, NeoX RoPE, and an MoE FFN in
// every layer (softmax router over all experts, top-k, weights renormalised to sum to 1).
#include "core/error.h"
#include "model/arch.h"

namespace bmoe {

namespace {

void read_qwen3moe(ArchLoader& a, ModelConfig& c) {
  load_common_hparams(a, c);
  if (c.n_expert == 0) fail("qwen3moe: expert_count must be > 0");
  c.rope.style = RopeStyle::NeoX;
  c.moe.gating = Gating::SoftmaxTopK;
  c.moe.norm_topk = true;
  c.moe.activation = ExpertActivation::SwiGLU;
  if (c.n_ff_exp == 0) fail("qwen3moe: missing required key 'qwen3moe.expert_feed_forward_length'");
  read_vocab_and_expert_width(a, c);
  c.plan_every_layer(MixerKind::Attention, FfnKind::Moe);
  c.plan_norms({.qk = QkNorm::PerHead});
}

using D = Dim;
using L = LayerWeights;
using Attn = AttentionWeights;

std::vector<TensorSpec> tensors() {
  return rows({{token_embedding(constant(1.0f))},
               attention_inputs(),
               {attention_output(), norm("attn_q_norm.weight", {D::HeadDim}, &Attn::q_norm),
                norm("attn_k_norm.weight", {D::HeadDim}, &Attn::k_norm), norm("ffn_norm.weight", {D::Embd}, &L::ffn_norm),
                router()},
               swiglu_experts(),
               output_head()});
}

}  // namespace

const Architecture& qwen3moe_architecture() {
  static const std::vector<TensorSpec> table = tensors();
  static const Architecture arch{"qwen3moe", "Qwen3 MoE (Qwen3-30B-A3B, 235B-A22B)", read_qwen3moe, table};
  return arch;
}

}  // namespace bmoe
