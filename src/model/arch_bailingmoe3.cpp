// Ling 3.0 (bailingmoe3: Ling-3.0 7.9B-A1.3B, 124B-A5.1B): a hybrid of Kimi Delta Attention
// layers (recurrent, model/mixer_kimi_delta.cpp) and, where attention.head_count_kv is 1,
// multi-head latent attention layers (model/mixer_latent.cpp). The first
// leading_dense_block_count layers run a dense SwiGLU FFN; the others route by sigmoid scores
// with a selection bias and group-limited top-k, weights renormalised and scaled, beside an
// ungated shared expert; SwiGLU limited per layer where the file sets limits. Multi-token-prediction
// blocks (nextn_predict_layers) are not bound.
#include <fmt/format.h>

#include "core/error.h"
#include "model/arch.h"
#include "model/delta_net.h"

namespace bmoe {

namespace {

void read_kimi_delta(ArchLoader& a, ModelConfig& c) {
  const int64_t kernel = a.get_int(".ssm.conv_kernel"), head_dim = a.get_int(".kda.head_dim");
  const double bound = a.get_float(".kda.gate_lower_bound");
  if (kernel < 2 || kernel > delta_net::kMaxConvKernel) fail("bailingmoe3: ssm.conv_kernel {} is out of range", kernel);
  if (head_dim < 16 || head_dim > delta_net::kMaxHeadDim || head_dim % 16 != 0 || c.n_head > delta_net::kMaxHeads) {
    fail("bailingmoe3: kda.head_dim {} with {} heads is not supported", head_dim, c.n_head);
  }
  if (!(bound < 0.0) || bound < -1000.0) fail("bailingmoe3: kda.gate_lower_bound {} must be negative", bound);
  if (a.has_key(".kda.safe_gate") && a.get_int(".kda.safe_gate") == 0) fail("bailingmoe3: kda.safe_gate false is not supported");
  c.kda.conv_kernel = static_cast<int>(kernel);
  c.kda.head_dim = static_cast<int>(head_dim);
  c.kda.gate_lower_bound = static_cast<float>(bound);
}

void read_latent_attention(ArchLoader& a, ModelConfig& c) {
  ModelConfig::LatentAttention& m = c.mla;
  const int64_t dq = a.get_int(".attention.key_length_mla"), dv = a.get_int(".attention.value_length_mla");
  const int64_t kv_rank = a.get_int(".attention.kv_lora_rank"), q_rank = a.get_int_or(".attention.q_lora_rank", 0);
  const int64_t rope = c.rope.n_rot;
  if (kv_rank < 1 || kv_rank > 8192 || q_rank < 0 || q_rank > 65536 || dv < 1 || dv > 4096 || dq <= rope ||
      dq > 4096 || c.head_dim != kv_rank + rope) {
    fail("bailingmoe3: invalid latent attention shape (key_length {}, key_length_mla {}, value_length_mla {}, "
         "kv_lora_rank {}, q_lora_rank {}, {} rope dims)", c.head_dim, dq, dv, kv_rank, q_rank, rope);
  }
  m.q_lora_rank = static_cast<int>(q_rank);
  m.kv_lora_rank = static_cast<int>(kv_rank);
  m.qk_rope = static_cast<int>(rope);
  m.qk_nope = static_cast<int>(dq - rope);
  m.v_head_dim = static_cast<int>(dv);
  c.head_dim_v = m.kv_lora_rank;  // the attention kernel's value rows are the latent
  c.rope.style = RopeStyle::Normal;
}

void read_routing(ArchLoader& a, ModelConfig& c) {
  if (c.n_expert < 2 || c.n_ff_exp == 0) fail("bailingmoe3: needs experts and expert_feed_forward_length");
  if (a.get_int(".expert_gating_func") != 2) fail("bailingmoe3: only sigmoid gating (expert_gating_func 2) is supported");
  c.moe.gating = Gating::SigmoidTopK;
  c.moe.norm_topk = a.get_int_or(".expert_weights_norm", 0) != 0;
  c.moe.weights_scale = static_cast<float>(a.get_float_or(".expert_weights_scale", 0.0));
  const int64_t groups = a.get_int_or(".expert_group_count", 0), used = a.get_int_or(".expert_group_used_count", 0);
  if (groups > 1 && (c.n_expert % groups != 0 || groups >= c.n_expert || c.n_expert / groups < 2 || used < 1 ||
                     used >= groups || used * (c.n_expert / groups) < c.n_expert_used)) {
    fail("bailingmoe3: {} expert groups ({} used) do not fit {} experts, top-{}", groups, used, c.n_expert, c.n_expert_used);
  }
  c.moe.n_groups = static_cast<int>(groups);
  c.moe.n_group_used = static_cast<int>(used);
  const int64_t shared = a.get_int(".expert_shared_count");
  if (shared < 1) fail("bailingmoe3: expert_shared_count {} is not supported", shared);
  c.shared_expert.n_ff = static_cast<int>(a.get_int_or(".expert_shared_feed_forward_length", c.n_ff_exp * shared));
  c.shared_expert.ungated = true;
}

// Per-layer SwiGLU limits (float arrays, written only where the checkpoint sets them; 0: none).
std::vector<float> read_swiglu_limits(ArchLoader& a, const char* key, int n_layer_all) {
  if (!a.has_key(key)) return {};
  const std::vector<double> values = a.get_float_array(key);
  if (values.size() != static_cast<size_t>(n_layer_all)) {
    fail("bailingmoe3: {} has {} entries for {} blocks", key + 1, values.size(), n_layer_all);
  }
  std::vector<float> out;
  for (double v : values) {
    if (!(v >= 0.0) || v > 1e30) fail("bailingmoe3: {} holds {}, not a limit", key + 1, v);
    out.push_back(static_cast<float>(v));
  }
  return out;
}

void read_bailingmoe3(ArchLoader& a, ModelConfig& c) {
  load_common_hparams(a, c, /*zero_kv_heads_allowed=*/true);
  const int n_layer_all = c.n_layer;
  const int64_t nextn = a.get_int_or(".nextn_predict_layers", 0);
  if (nextn < 0 || nextn >= n_layer_all) fail("bailingmoe3: {} prediction layers of {} blocks", nextn, n_layer_all);
  c.n_layer = n_layer_all - static_cast<int>(nextn);
  read_kimi_delta(a, c);
  read_latent_attention(a, c);
  read_vocab_and_expert_width(a, c);
  read_routing(a, c);
  c.moe.activation = ExpertActivation::SwiGLU;
  c.moe.clamp.layer_limit = read_swiglu_limits(a, ".swiglu_clamp_exp", n_layer_all);
  c.dense.clamp.layer_limit = read_swiglu_limits(a, ".swiglu_clamp_shexp", n_layer_all);
  const auto kv_heads = a.get_per_layer_int(".attention.head_count_kv", n_layer_all, c.n_head);
  const int64_t dense = a.get_int(".leading_dense_block_count");
  const int64_t dense_ff = a.get_int_or(".feed_forward_length", 0);
  if (dense < 0 || dense > c.n_layer || (dense > 0 && dense_ff <= 0)) {
    fail("bailingmoe3: {} leading dense layers with feed_forward_length {}", dense, dense_ff);
  }
  c.attention.layer_n_head_kv.clear();
  for (int l = 0; l < c.n_layer; ++l) {
    const int64_t h = kv_heads[static_cast<size_t>(l)];
    if (h != 0 && h != 1) fail("bailingmoe3: layer {} has {} kv heads (0: Kimi Delta, 1: latent attention)", l, h);
    c.plan.push_back({h == 0 ? MixerKind::KimiDelta : MixerKind::LatentAttention, l < dense ? FfnKind::Dense : FfnKind::MoeShared});
    c.dense.layer_n_ff.push_back(l < dense ? static_cast<int>(dense_ff) : 0);
  }
  c.n_head_kv = 1;
}

// causal_conv reads one kernel over q | k | v, tap by tap across the channels.
void finish_bailingmoe3(const ModelConfig& c, ModelWeights& w) {
  const int I = c.kda.inner(c.n_head), K = c.kda.conv_kernel;
  for (int l = 0; l < c.n_layer; ++l) {
    if (c.mixer_at(l) != MixerKind::KimiDelta) continue;
    KimiDeltaWeights& L = *w.layers[static_cast<size_t>(l)].kimi_delta;
    L.conv.assign(static_cast<size_t>(3) * I * K, 0.0f);
    const Vector* parts[] = {&L.conv_q, &L.conv_k, &L.conv_v};
    for (int p = 0; p < 3; ++p) {
      const Vector t = delta_net::transpose_conv(*parts[p], I, K);
      for (int j = 0; j < K; ++j) {
        std::copy_n(t.begin() + static_cast<ptrdiff_t>(j) * I, I, L.conv.begin() + (static_cast<ptrdiff_t>(j) * 3 + p) * I);
      }
    }
    L.conv_q.clear();
    L.conv_k.clear();
    L.conv_v.clear();
  }
}

using D = Dim;
using C = TensorClass;
using L = LayerWeights;
using Kda = KimiDeltaWeights;
using Mla = LatentAttentionWeights;
using Dense = DenseFfnWeights;
using Moe = RoutedExpertWeights;
using Shared = SharedExpertWeights;

TensorSpec kda(TensorSpec t) {
  t.role = Role::Recurrent;
  return on(Layers::KimiDelta, t);
}

std::vector<TensorSpec> kimi_delta_rows() {
  return {kda(matrix("attn_q.weight", {D::Embd, D::KdaInner}, &Kda::wq, C::AttnQ, fan_in(1.0f))),
          kda(matrix("attn_k.weight", {D::Embd, D::KdaInner}, &Kda::wk, C::AttnK, fan_in(1.0f))),
          kda(matrix("attn_v.weight", {D::Embd, D::KdaInner}, &Kda::wv, C::AttnV, fan_in(1.0f))),
          kda(small("ssm_conv1d_q.weight", {D::KdaKernel, D::One, D::KdaInner}, &Kda::conv_q, constant(0.5f))),
          kda(small("ssm_conv1d_k.weight", {D::KdaKernel, D::One, D::KdaInner}, &Kda::conv_k, constant(0.5f))),
          kda(small("ssm_conv1d_v.weight", {D::KdaKernel, D::One, D::KdaInner}, &Kda::conv_v, constant(0.5f))),
          kda(matrix("ssm_f_a.weight", {D::Embd, D::KdaInner}, &Kda::w_decay, C::Dense, fan_in(1.0f))),
          kda(small("ssm_dt.bias", {D::KdaInner}, &Kda::dt_bias, constant(0.5f))),
          kda(small("ssm_a", {D::One, D::Heads}, &Kda::a, fixed(Fixed::DecayStrengths))),
          kda(matrix("ssm_beta.weight", {D::Embd, D::Heads}, &Kda::w_beta, C::Dense, fan_in(1.0f))),
          kda(matrix("ssm_g_a.weight", {D::Embd, D::KdaInner}, &Kda::w_gate, C::AttnQ, fan_in(1.0f))),
          kda(norm("ssm_norm.weight", {D::KdaHeadDim}, &Kda::norm)),
          kda(matrix("attn_output.weight", {D::KdaInner, D::Embd}, &Kda::wo, C::AttnOut, fan_in(0.5f)))};
}

TensorSpec mla(Layers set, TensorSpec t) { return on(set, t); }

std::vector<TensorSpec> latent_rows() {
  const Layers M = Layers::Latent, Low = Layers::LatentLowRankQ, Plain = Layers::LatentPlainQ;
  return {mla(Low, matrix("attn_q_a.weight", {D::Embd, D::MlaQRank}, &Mla::wq_a, C::AttnQ, fan_in(1.0f))),
          mla(Low, norm("attn_q_a_norm.weight", {D::MlaQRank}, &Mla::q_a_norm)),
          mla(Low, matrix("attn_q_b.weight", {D::MlaQRank, D::MlaQWidth}, &Mla::wq_b, C::AttnQ, fan_in(1.0f))),
          mla(Plain, matrix("attn_q.weight", {D::Embd, D::MlaQWidth}, &Mla::wq, C::AttnQ, fan_in(1.0f))),
          mla(M, matrix("attn_kv_a_mqa.weight", {D::Embd, D::MlaKvA}, &Mla::wkv_a, C::AttnK, fan_in(1.0f))),
          mla(M, norm("attn_kv_a_norm.weight", {D::MlaKvRank}, &Mla::kv_a_norm)),
          // The per-head up-projections are read as f32 whatever the file stores (Q5_0/Q8_0
          // in quantized files): llama.cpp's quantized product differs by rounding only.
          mla(M, small("attn_k_b.weight", {D::MlaNope, D::MlaKvRank, D::Heads}, &Mla::k_b, fan_in(1.0f))),
          mla(M, small("attn_v_b.weight", {D::MlaKvRank, D::MlaValueDim, D::Heads}, &Mla::v_b, fan_in(1.0f))),
          mla(M, matrix("attn_gate.weight", {D::Embd, D::Heads}, &Mla::w_gate, C::Dense, fan_in(1.0f))),
          mla(M, matrix("attn_output.weight", {D::MlaOutWidth, D::Embd}, &Mla::wo, C::AttnOut, fan_in(0.5f)))};
}

std::vector<TensorSpec> ffn_rows() {
  const Layers Dn = Layers::Dense, M = Layers::Moe;
  return {norm("ffn_norm.weight", {D::Embd}, &L::ffn_norm),
          on(Dn, matrix("ffn_gate.weight", {D::Embd, D::DenseFF}, &Dense::ffn_gate, C::Dense, fan_in(1.0f))),
          on(Dn, matrix("ffn_up.weight", {D::Embd, D::DenseFF}, &Dense::ffn_up, C::Dense, fan_in(1.0f))),
          on(Dn, matrix("ffn_down.weight", {D::DenseFF, D::Embd}, &Dense::ffn_down, C::Dense, fan_in(0.5f))),
          on(M, matrix("ffn_gate_inp.weight", {D::Embd, D::Experts}, &Moe::router, C::Router, fan_in(1.5f), Role::Router)),
          on(M, small("exp_probs_b.bias", {D::Experts}, &Moe::expert_select_bias, constant(0.05f))),
          on(M, experts("ffn_gate_exps.weight", {D::Embd, D::ExpertFF, D::Experts}, &ExpertRoles::gate, C::Experts, fan_in(1.0f))),
          on(M, experts("ffn_up_exps.weight", {D::Embd, D::ExpertFF, D::Experts}, &ExpertRoles::up, C::Experts, fan_in(1.0f))),
          on(M, experts("ffn_down_exps.weight", {D::ExpertFF, D::Embd, D::Experts}, &ExpertRoles::down, C::ExpertsDown, fan_in(1.0f))),
          on(M, matrix("ffn_gate_shexp.weight", {D::Embd, D::SharedFF}, &Shared::shexp_gate, C::Dense, fan_in(1.0f), Role::SharedExpert)),
          on(M, matrix("ffn_up_shexp.weight", {D::Embd, D::SharedFF}, &Shared::shexp_up, C::Dense, fan_in(1.0f), Role::SharedExpert)),
          on(M, matrix("ffn_down_shexp.weight", {D::SharedFF, D::Embd}, &Shared::shexp_down, C::Dense, fan_in(0.5f), Role::SharedExpert))};
}

std::vector<TensorSpec> tensors() {
  return rows({{token_embedding(constant(1.0f)), norm("attn_norm.weight", {D::Embd}, &L::attn_norm)},
               kimi_delta_rows(),
               latent_rows(),
               ffn_rows(),
               output_head()});
}

}  // namespace

const Architecture& bailingmoe3_architecture() {
  static const std::vector<TensorSpec> table = tensors();
  static const Architecture arch{"bailingmoe3",
                                 "Ling 3.0 (bailingmoe3; Kimi Delta Attention + latent attention, grouped sigmoid routing)",
                                 read_bailingmoe3, table, finish_bailingmoe3};
  return arch;
}

}  // namespace bmoe
