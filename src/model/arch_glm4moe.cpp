// GLM-4.5 / 4.6 / 4.5-Air (glm4moe): GQA attention with q/k/v biases, per-head RMS-normed q and k
// where the file has the norms (GLM-4.5 and 4.6; Air has none), NeoX RoPE on the first
// rope.dimension_count dims of each head. The first leading_dense_block_count layers run a dense
// SwiGLU FFN; the others route top-k of the experts by sigmoid scores (a per-expert bias steers
// the choice only), renormalise and scale the weights, and add an ungated shared expert. The
// pre-FFN norm is stored as post_attention_norm. block_count counts the trailing nextn (MTP)
// blocks too: the trunk is block_count - nextn_predict_layers; the MTP blocks are checked, and
// bound and run as the MTP head only for --mtp (model/nextn_head.h).
#include <fmt/format.h>

#include "core/error.h"
#include "model/arch.h"

namespace bmoe {

namespace {

// Trunk depth: block_count less the MTP blocks stored after it.
void read_trunk(ArchLoader& a, ModelConfig& c) {
  const int64_t nextn = a.get_int_or(".nextn_predict_layers", 0);
  if (nextn < 0 || nextn >= c.n_layer) {
    fail("glm4moe: nextn_predict_layers {} leaves no trunk of the {} blocks", nextn, c.n_layer);
  }
  c.n_nextn_layer = static_cast<int>(nextn);
  c.n_layer -= c.n_nextn_layer;
}

// Routing as llama.cpp reads it: sigmoid (0 or absent maps to it), no group-limited selection.
void read_routing(ArchLoader& a, ModelConfig& c) {
  if (c.n_expert == 0) fail("glm4moe: expert_count must be > 0");
  const int64_t gating = a.get_int_or(".expert_gating_func", 0);
  if (gating != 0 && gating != 2) fail("glm4moe: expert_gating_func {} is not supported (2 = sigmoid)", gating);
  if (a.get_int_or(".expert_group_count", 0) > 1) fail("glm4moe: group-limited expert routing is not supported");
  c.moe.gating = Gating::SigmoidTopK;
  c.moe.activation = ExpertActivation::SwiGLU;
  c.moe.norm_topk = a.get_int_or(".expert_weights_norm", 0) != 0;
  c.moe.weights_scale = static_cast<float>(a.get_float_or(".expert_weights_scale", 0.0));
}

void read_glm4moe(ArchLoader& a, ModelConfig& c) {
  load_common_hparams(a, c);
  const int blocks = c.n_layer;
  read_trunk(a, c);
  c.norm_eps = static_cast<float>(a.get_float(".attention.layer_norm_rms_epsilon"));
  if (c.head_dim != c.head_dim_v) fail("glm4moe: key_length {} and value_length {} differ", c.head_dim, c.head_dim_v);
  if (a.has_key(".rope.dimension_sections")) {
    const auto sections = a.get_int_array(".rope.dimension_sections");
    if (sections.size() >= 2 && sections[0] > 0 && sections[1] > 0) fail("glm4moe: M-RoPE (GLM-4.5V) is not supported");
  }
  c.rope.style = RopeStyle::NeoX;
  const bool qk_norm = a.has_tensor("blk.0.attn_q_norm.weight");  // optional in the family's files
  if (a.has_tensor("blk.0.attn_k_norm.weight") != qk_norm) {
    fail("glm4moe: the file has one of attn_q_norm and attn_k_norm without the other");
  }
  read_routing(a, c);
  const int64_t dense = a.get_int_or(".leading_dense_block_count", 0);
  if (dense < 0 || dense > c.n_layer) fail("glm4moe: leading_dense_block_count {} of {} layers", dense, c.n_layer);
  if (c.n_ff_exp == 0 && dense < c.n_layer) {
    c.n_ff_exp = static_cast<int>(a.tensor_dim(fmt::format("blk.{}.ffn_gate_exps.weight", dense), 1));
  }
  const int64_t shared = a.get_int(".expert_shared_count");
  if (shared < 0) fail("glm4moe: expert_shared_count {} is negative", shared);
  c.shared_expert.n_ff = static_cast<int>(shared * c.n_ff_exp);
  c.n_vocab = static_cast<int>(a.tensor_dim("token_embd.weight", 1));
  const auto dense_ff = a.get_per_layer_int(".feed_forward_length", blocks, 0);
  for (int l = 0; l < c.n_layer; ++l) {
    const bool moe = l >= dense;
    c.plan.push_back({MixerKind::Attention, !moe ? FfnKind::Dense : shared > 0 ? FfnKind::MoeUngatedShared : FfnKind::Moe});
    c.nextn_plan = c.plan.back();  // the MTP block is a block like the last trunk layer
    c.dense.layer_n_ff.push_back(static_cast<int>(dense_ff[static_cast<size_t>(l)]));
    if (!moe && dense_ff[static_cast<size_t>(l)] <= 0) fail("glm4moe: dense layer {} has no feed_forward_length", l);
  }
  c.plan_norms({.qk = qk_norm ? QkNorm::PerHead : QkNorm::None});
}

using D = Dim;
using C = TensorClass;
using L = LayerWeights;
using Attn = AttentionWeights;
using Dense = DenseFfnWeights;
using Moe = RoutedExpertWeights;
using Shared = SharedExpertWeights;

std::vector<TensorSpec> tensors() {
  const Role sh = Role::SharedExpert;
  return rows({{token_embedding(constant(1.0f))},
               attention_inputs(),
               {optional(small("attn_q.bias", {D::QWidth}, &Attn::bq, constant(0.1f))),
                optional(small("attn_k.bias", {D::KWidth}, &Attn::bk, constant(0.1f))),
                optional(small("attn_v.bias", {D::VWidth}, &Attn::bv, constant(0.1f))),
                optional(norm("attn_q_norm.weight", {D::HeadDim}, &Attn::q_norm)),
                optional(norm("attn_k_norm.weight", {D::HeadDim}, &Attn::k_norm)), attention_output(),
                norm("post_attention_norm.weight", {D::Embd}, &L::ffn_norm),
                on(Layers::Dense, matrix("ffn_gate.weight", {D::Embd, D::DenseFF}, &Dense::ffn_gate, C::Dense, fan_in(1.0f))),
                on(Layers::Dense, matrix("ffn_up.weight", {D::Embd, D::DenseFF}, &Dense::ffn_up, C::Dense, fan_in(1.0f))),
                on(Layers::Dense, matrix("ffn_down.weight", {D::DenseFF, D::Embd}, &Dense::ffn_down, C::Dense, fan_in(0.5f))),
                // Sigmoid scores: a narrower spread than softmax routers get (as lfm2moe's).
                on(Layers::Moe, matrix("ffn_gate_inp.weight", {D::Embd, D::Experts}, &Moe::router, C::Router,
                                       fan_in(1.5f), Role::Router)),
                on(Layers::Moe, small("exp_probs_b.bias", {D::Experts}, &Moe::expert_select_bias, constant(0.05f)))},
               {on(Layers::Moe, experts("ffn_gate_exps.weight", {D::Embd, D::ExpertFF, D::Experts}, &ExpertRoles::gate,
                                        C::Experts, fan_in(1.0f))),
                on(Layers::Moe, experts("ffn_up_exps.weight", {D::Embd, D::ExpertFF, D::Experts}, &ExpertRoles::up,
                                        C::Experts, fan_in(1.0f))),
                on(Layers::Moe, experts("ffn_down_exps.weight", {D::ExpertFF, D::Embd, D::Experts}, &ExpertRoles::down,
                                        C::ExpertsDown, fan_in(1.0f))),
                on(Layers::Shared, matrix("ffn_gate_shexp.weight", {D::Embd, D::SharedFF}, &Shared::shexp_gate, C::Dense,
                                          fan_in(1.0f), sh)),
                on(Layers::Shared, matrix("ffn_up_shexp.weight", {D::Embd, D::SharedFF}, &Shared::shexp_up, C::Dense,
                                          fan_in(1.0f), sh)),
                on(Layers::Shared, matrix("ffn_down_shexp.weight", {D::SharedFF, D::Embd}, &Shared::shexp_down, C::Dense,
                                          fan_in(0.5f), sh))},
               nextn_rows(),
               output_head()});
}

}  // namespace

const Architecture& glm4moe_architecture() {
  static const std::vector<TensorSpec> table = tensors();
  static const Architecture arch{"glm4moe", "GLM-4.5 / 4.6 / 4.5-Air (sigmoid-routed experts, shared expert, nextn MTP head)",
                                 read_glm4moe, table};
  return arch;
}

}  // namespace bmoe
