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
  c.moe.gating = Gating::SoftmaxTopK;
  c.moe.norm_topk = false;
  read_vocab_and_expert_width(a, c);
  c.plan_every_layer(MixerKind::Attention, FfnKind::MoeShared);
  c.shared_expert.n_ff = static_cast<int>(a.get_int_or(".expert_shared_feed_forward_length", 0));
  if (c.shared_expert.n_ff == 0) c.shared_expert.n_ff = static_cast<int>(a.tensor_dim("blk.0.ffn_gate_shexp.weight", 1));
}

using D = Dim;
using L = LayerWeights;
using Attn = AttentionWeights;

std::vector<TensorSpec> tensors() {
  return rows({{token_embedding(constant(1.0f))},
               attention_inputs(),
               {optional(small("attn_q.bias", {D::QWidth}, &Attn::bq, constant(0.1f))),
                optional(small("attn_k.bias", {D::KWidth}, &Attn::bk, constant(0.1f))),
                optional(small("attn_v.bias", {D::VWidth}, &Attn::bv, constant(0.1f))), attention_output(),
                norm("ffn_norm.weight", {D::Embd}, &L::ffn_norm), router()},
               swiglu_experts(),
               shared_expert(),
               output_head()});
}

}  // namespace

const Architecture& qwen2moe_architecture() {
  static const std::vector<TensorSpec> table = tensors();
  static const Architecture arch{"qwen2moe", "Qwen2 MoE with shared expert (Qwen1.5-MoE-A2.7B, Qwen2-57B-A14B)",
                                 read_qwen2moe, table};
  return arch;
}

}  // namespace bmoe
