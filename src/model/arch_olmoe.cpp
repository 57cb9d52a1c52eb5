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
  c.moe.gating = Gating::SoftmaxTopK;
  c.moe.norm_topk = false;
  read_vocab_and_expert_width(a, c);
  c.plan_every_layer(MixerKind::Attention, FfnKind::Moe);
  c.plan_norms({.qk = QkNorm::Full});
}

using D = Dim;
using L = LayerWeights;
using Attn = AttentionWeights;

std::vector<TensorSpec> tensors() {
  return rows({{token_embedding(constant(1.0f))},
               attention_inputs(),
               {attention_output(), norm("attn_q_norm.weight", {D::QWidth}, &Attn::q_norm),
                norm("attn_k_norm.weight", {D::KWidth}, &Attn::k_norm), norm("ffn_norm.weight", {D::Embd}, &L::ffn_norm),
                router()},
               swiglu_experts(),
               output_head()});
}

}  // namespace

const Architecture& olmoe_architecture() {
  static const std::vector<TensorSpec> table = tensors();
  static const Architecture arch{"olmoe", "OLMoE (OLMoE-1B-7B)", read_olmoe, table};
  return arch;
}

}  // namespace bmoe
