// Qwen3.5 / Qwen3.6 MoE (35B-A3B, 122B-A10B): a hybrid of Gated DeltaNet layers (linear
// attention with a recurrent state: causal depthwise convolution, L2-normed q and k, the gated
// delta rule, a gated RMS norm) and, every full_attention_interval-th layer, gated full
// attention (per-head RMS-normed q and k, partial NeoX RoPE, output times sigmoid(gate)). Every
// layer routes 8 of 256 experts (softmax, top-k, renormalised) beside a sigmoid-gated shared
// expert. The multi-token-prediction block (nextn_predict_layers) after the trunk is a gated
// attention block with the MoE FFN plus its nextn rows, run as the MTP head for --mtp.
#include <fmt/format.h>

#include <numeric>

#include "core/error.h"
#include "model/arch.h"
#include "model/delta_net.h"

namespace bmoe {

namespace {

// Text positions give all three M-RoPE components the same value, so the interleaved M-RoPE
// equals NeoX RoPE when every rotated pair draws its angle from one of them (llama.cpp's
// IMROPE sector rule); a fourth section would leave pairs unrotated, which bmoe does not model.
void check_rope_sections(const std::vector<int64_t>& sections, int n_rot) {
  if (sections.size() != 4) fail("qwen35moe: rope.dimension_sections must have 4 entries, has {}", sections.size());
  for (int64_t s : sections) {
    if (s < 0 || s > (1 << 16)) fail("qwen35moe: rope section {} is out of range", s);
  }
  const int64_t total = std::accumulate(sections.begin(), sections.end(), int64_t{0});
  if (total <= 0) fail("qwen35moe: rope.dimension_sections are all zero");
  for (int i = 0; i < n_rot / 2; ++i) {
    const int64_t sector = i % total;
    const bool text_angle = (sector % 3 == 0 && sector < 3 * sections[0]) ||
                            (sector % 3 == 1 && sector < 3 * sections[1]) ||
                            (sector % 3 == 2 && sector < 3 * sections[2]);
    if (!text_angle) {
      fail("qwen35moe: rope sections [{}, {}, {}, {}] leave pair {} to the fourth component; not supported",
           sections[0], sections[1], sections[2], sections[3], i);
    }
  }
}

void read_delta_net(ArchLoader& a, ModelConfig& c, int n_layer_all) {
  ModelConfig::DeltaNet& d = c.delta_net;
  const int64_t conv = a.get_int(".ssm.conv_kernel"), state = a.get_int(".ssm.state_size");
  const int64_t v_heads = a.get_int(".ssm.time_step_rank"), k_heads = a.get_int(".ssm.group_count");
  const int64_t inner = a.get_int(".ssm.inner_size");
  if (conv < 2 || conv > delta_net::kMaxConvKernel || state < 16 || state > delta_net::kMaxHeadDim || state % 16 != 0 ||
      k_heads < 1 || v_heads < 1 || k_heads > delta_net::kMaxHeads || v_heads > delta_net::kMaxHeads ||
      v_heads % k_heads != 0 || inner != v_heads * state) {
    fail("qwen35moe: invalid Gated DeltaNet shape (conv {}, state {}, {} key heads, {} value heads, inner {})", conv,
         state, k_heads, v_heads, inner);
  }
  d.conv_kernel = static_cast<int>(conv);
  d.head_dim = static_cast<int>(state);
  d.v_heads = static_cast<int>(v_heads);
  d.k_heads = static_cast<int>(k_heads);
  std::vector<int64_t> recurrent;
  if (a.has_key(".attention.recurrent_layers")) {
    recurrent = a.get_per_layer_int(".attention.recurrent_layers", n_layer_all, std::nullopt);
  } else {
    const int64_t interval = a.get_int_or(".full_attention_interval", 4);
    if (interval < 1) fail("qwen35moe: full_attention_interval must be >= 1");
    for (int l = 0; l < n_layer_all; ++l) recurrent.push_back((l + 1) % interval != 0 ? 1 : 0);
  }
  for (int l = 0; l < c.n_layer; ++l) {
    const bool linear = recurrent[static_cast<size_t>(l)] != 0;
    c.plan.push_back({linear ? MixerKind::GatedDeltaNet : MixerKind::GatedAttention, FfnKind::MoeShared});
  }
}

void read_qwen35moe(ArchLoader& a, ModelConfig& c) {
  load_common_hparams(a, c);
  const int n_layer_all = c.n_layer;
  const int64_t nextn = a.get_int_or(".nextn_predict_layers", 0);
  if (nextn < 0 || nextn >= n_layer_all) fail("qwen35moe: {} prediction layers of {} blocks", nextn, n_layer_all);
  c.n_layer = n_layer_all - static_cast<int>(nextn);
  c.n_nextn_layer = static_cast<int>(nextn);
  c.nextn_plan = {MixerKind::GatedAttention, FfnKind::MoeShared};
  if (c.n_expert == 0) fail("qwen35moe: expert_count must be > 0");
  if (c.n_ff_exp == 0) fail("qwen35moe: missing required key 'qwen35moe.expert_feed_forward_length'");
  if (c.head_dim != c.head_dim_v) fail("qwen35moe: key and value head sizes must be equal");
  c.rope.style = RopeStyle::NeoX;
  check_rope_sections(a.get_int_array(".rope.dimension_sections"), c.rope.n_rot);
  c.moe.gating = Gating::SoftmaxTopK;
  c.moe.norm_topk = true;
  c.moe.activation = ExpertActivation::SwiGLU;
  c.shared_expert.gate_sigmoid = true;
  read_vocab_and_expert_width(a, c);
  c.shared_expert.n_ff = static_cast<int>(a.get_int_or(".expert_shared_feed_forward_length", 0));
  if (c.shared_expert.n_ff == 0) c.shared_expert.n_ff = static_cast<int>(a.tensor_dim("blk.0.ffn_gate_shexp.weight", 1));
  read_delta_net(a, c, n_layer_all);
  c.plan_norms({.qk = QkNorm::PerHead});
}

// causal_conv reads the kernel tap by tap across channels.
void finish_qwen35moe(const ModelConfig& c, ModelWeights& w) {
  for (int l = 0; l < c.n_layer; ++l) {
    if (c.mixer_at(l) != MixerKind::GatedDeltaNet) continue;
    Vector& conv = w.layers[static_cast<size_t>(l)].delta_net->ssm_conv;
    conv = delta_net::transpose_conv(conv, c.delta_net.conv_channels(), c.delta_net.conv_kernel);
  }
}

using D = Dim;
using C = TensorClass;
using L = LayerWeights;
using Attn = AttentionWeights;
using Delta = DeltaNetWeights;

TensorSpec recurrent(TensorSpec t) {
  t.role = Role::Recurrent;
  return on(Layers::Recurrent, t);
}

std::vector<TensorSpec> tensors() {
  return rows({{token_embedding(constant(1.0f)),
               norm("attn_norm.weight", {D::Embd}, &L::attn_norm),
               // Gated full attention.
               on(Layers::Attention, matrix("attn_q.weight", {D::Embd, D::QGateWidth}, &Attn::wq, C::AttnQ, fan_in(1.0f))),
               on(Layers::Attention, matrix("attn_k.weight", {D::Embd, D::KWidth}, &Attn::wk, C::AttnK, fan_in(1.0f))),
               on(Layers::Attention, matrix("attn_v.weight", {D::Embd, D::VWidth}, &Attn::wv, C::AttnV, fan_in(1.0f))),
               on(Layers::Attention, attention_output()),
               on(Layers::Attention, norm("attn_q_norm.weight", {D::HeadDim}, &Attn::q_norm)),
               on(Layers::Attention, norm("attn_k_norm.weight", {D::HeadDim}, &Attn::k_norm)),
               // Gated DeltaNet. Q4_K_M files give attn_qkv attn_v's type rule.
               recurrent(matrix("attn_qkv.weight", {D::Embd, D::ConvChannels}, &Delta::ssm_qkv, C::AttnV, fan_in(1.0f))),
               recurrent(matrix("attn_gate.weight", {D::Embd, D::DeltaValueDim}, &Delta::ssm_z, C::AttnQ, fan_in(1.0f))),
               recurrent(small("ssm_conv1d.weight", {D::ConvKernel, D::ConvChannels}, &Delta::ssm_conv, constant(0.5f))),
               recurrent(small("ssm_dt.bias", {D::DeltaVHeads}, &Delta::ssm_dt, constant(0.5f))),
               recurrent(small("ssm_a", {D::DeltaVHeads}, &Delta::ssm_a, fixed(Fixed::DecayRates))),
               recurrent(matrix("ssm_beta.weight", {D::Embd, D::DeltaVHeads}, &Delta::ssm_beta, C::Dense, fan_in(1.0f))),
               recurrent(matrix("ssm_alpha.weight", {D::Embd, D::DeltaVHeads}, &Delta::ssm_alpha, C::Dense, fan_in(1.0f))),
               recurrent(norm("ssm_norm.weight", {D::DeltaHeadDim}, &Delta::ssm_norm)),
               recurrent(matrix("ssm_out.weight", {D::DeltaValueDim, D::Embd}, &Delta::ssm_out, C::AttnOut, fan_in(0.5f))),
               // The pre-FFN norm.
               norm("post_attention_norm.weight", {D::Embd}, &L::ffn_norm),
               router(),
               alternative(Alternative::Preferred,
                           experts("ffn_gate_exps.weight", {D::Embd, D::ExpertFF, D::Experts}, &ExpertRoles::gate,
                                   C::Experts, fan_in(1.0f))),
               alternative(Alternative::Preferred,
                           experts("ffn_up_exps.weight", {D::Embd, D::ExpertFF, D::Experts}, &ExpertRoles::up,
                                   C::Experts, fan_in(1.0f))),
               alternative(Alternative::Fallback,
                           experts("ffn_gate_up_exps.weight", {D::Embd, D::ExpertFF2, D::Experts},
                                   &ExpertRoles::gate_up, C::Experts, fan_in(1.0f))),
               experts("ffn_down_exps.weight", {D::ExpertFF, D::Embd, D::Experts}, &ExpertRoles::down,
                       C::ExpertsDown, fan_in(1.0f))},
               shared_expert(),
               nextn_rows(),
               output_head()});
}

}  // namespace

const Architecture& qwen35moe_architecture() {
  static const std::vector<TensorSpec> table = tensors();
  static const Architecture arch{"qwen35moe",
                                 "Qwen3.5/3.6 MoE (Qwen3.6-35B-A3B; Gated DeltaNet + gated attention, shared expert)",
                                 read_qwen35moe, table, finish_qwen35moe};
  return arch;
}

}  // namespace bmoe
