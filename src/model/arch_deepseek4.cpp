// DeepSeek-V4 (deepseek4): four residual streams per token mixed around each sublayer
// (hyper-connections), an attention with one K=V head of head_dim over a raw window of recent
// tokens plus, per layer, compressed history rows (ratio 4, picked per query by the lightning
// indexer, or ratio 128, all used), a low-rank query and a grouped low-rank output; experts
// routed by sqrt(softplus) scores (the first hash_layer_count layers by token id) beside an
// ungated shared expert, with a SwiGLU whose gate is clamped before the SiLU. block_count
// counts the MTP block too: a block of the same kinds (window attention only, biased routing)
// fed by the trunk's streams, run as the MTP head for --mtp (model/nextn_head.h). Facts from
// docs/families/deepseek4.md.
#include <fmt/format.h>

#include <cmath>

#include "core/error.h"
#include "model/arch.h"

namespace bmoe {

namespace {

int checked_key(ArchLoader& a, const char* key, int64_t lo, int64_t hi) {
  const int64_t v = a.get_int(key);
  if (v < lo || v > hi) fail("deepseek4: {} is {}, outside [{}, {}]", key + 1, v, lo, hi);
  return static_cast<int>(v);
}

// Trunk depth: block_count less the MTP block, which counts only where its first tensor exists.
void read_trunk(ArchLoader& a, ModelConfig& c) {
  const int64_t nextn = a.get_int_or(".nextn_predict_layers", 0);
  if (nextn < 0 || nextn >= c.n_layer) fail("deepseek4: nextn_predict_layers {} leaves no trunk of {} blocks", nextn, c.n_layer);
  const bool present = nextn > 0 && a.has_tensor(fmt::format("blk.{}.nextn.eh_proj.weight", c.n_layer - nextn));
  c.n_nextn_layer = present ? static_cast<int>(nextn) : 0;
  c.n_layer -= static_cast<int>(nextn);
}

std::vector<float> read_limits(ArchLoader& a, const char* key, int blocks) {
  const std::vector<double> v = a.get_float_array(key);
  if (v.size() < static_cast<size_t>(blocks)) fail("deepseek4: {} has {} entries for {} blocks", key + 1, v.size(), blocks);
  std::vector<float> out;
  for (double x : v) {
    if (!(x >= 0.0) || x > 1e30) fail("deepseek4: {} holds {}, not a limit", key + 1, x);
    out.push_back(static_cast<float>(x));
  }
  return out;
}

// The window layers' RoPE is plain; the compressed layers' (and their rows' and the indexer's)
// uses compress_rope_freq_base with YaRN frequencies at unit magnitude.
void read_rope(ArchLoader& a, ModelConfig& c) {
  RopeConfig yarn = c.rope;
  c.rope.style = RopeStyle::Normal;
  c.rope.freq_scale = 1.0f;
  c.rope.ext_factor = 0.0f;
  c.rope.attn_factor = 1.0f;
  yarn.style = RopeStyle::Normal;
  yarn.freq_base = static_cast<float>(a.get_float(".attention.compress_rope_freq_base"));
  yarn.beta_fast = 32.0f;  // the converter writes the betas; llama.cpp keeps its defaults for this family
  yarn.beta_slow = 1.0f;
  yarn.attn_factor = yarn.ext_factor != 0.0f ? 1.0f / (1.0f + 0.1f * std::log(1.0f / yarn.freq_scale)) : 1.0f;
  if (!(yarn.freq_base > 0.0f)) fail("deepseek4: compress_rope_freq_base {} is not positive", yarn.freq_base);
  c.csa.rope = yarn;
  if (c.rope.n_rot % 2 != 0 || (c.head_dim - c.rope.n_rot) % 2 != 0) {
    fail("deepseek4: {} rotated of {} head dims must both be even", c.rope.n_rot, c.head_dim);
  }
}

void read_attention(ArchLoader& a, ModelConfig& c, int blocks) {
  if (c.n_head_kv != 1 || c.head_dim != c.head_dim_v) {
    fail("deepseek4: expects one K=V head (got {} kv heads, key/value sizes {}/{})", c.n_head_kv, c.head_dim, c.head_dim_v);
  }
  ModelConfig::CompressedAttention& s = c.csa;
  s.q_lora_rank = checked_key(a, ".attention.q_lora_rank", 1, 1 << 16);
  s.o_groups = checked_key(a, ".attention.output_group_count", 1, c.n_head);
  s.o_lora_rank = checked_key(a, ".attention.output_lora_rank", 1, 1 << 16);
  s.indexer_heads = checked_key(a, ".attention.indexer.head_count", 1, 1024);
  s.indexer_head_dim = checked_key(a, ".attention.indexer.key_length", 2, 4096);
  s.indexer_top_k = checked_key(a, ".attention.indexer.top_k", 1, 1 << 20);
  if (c.n_head % s.o_groups != 0) fail("deepseek4: {} heads do not split into {} output groups", c.n_head, s.o_groups);
  if (s.indexer_head_dim < c.rope.n_rot || (s.indexer_head_dim & (s.indexer_head_dim - 1)) != 0) {
    fail("deepseek4: indexer head size {} must be a power of two >= the {} rotated dims", s.indexer_head_dim, c.rope.n_rot);
  }
  const std::vector<int64_t> ratios = a.get_int_array(".attention.compress_ratios");
  if (ratios.size() < static_cast<size_t>(blocks)) fail("deepseek4: compress_ratios has {} entries for {} blocks", ratios.size(), blocks);
  for (int l = 0; l < blocks; ++l) {
    const int64_t r = ratios[static_cast<size_t>(l)];
    if (r != 0 && r != 4 && r != 128) fail("deepseek4: compress ratio {} of layer {} is not 0, 4 or 128", r, l);
    s.ratio.push_back(static_cast<int>(r));
  }
  // llama.cpp's MTP graph attends the block's window alone (it asserts a ratio of 0 there): a
  // head to run (--mtp) must have one.
  for (int l = c.n_layer; a.wants_nextn() && l < c.n_layer + c.n_nextn_layer; ++l) {
    if (s.ratio[static_cast<size_t>(l)] != 0) fail("deepseek4: the MTP block's compress ratio is {}, not 0", s.ratio[static_cast<size_t>(l)]);
  }
  const int window = checked_key(a, ".attention.sliding_window", 1, 1 << 20);
  c.attention.sliding_window.assign(static_cast<size_t>(c.n_layer), window);
}

void read_hyper_connections(ArchLoader& a, ModelConfig& c) {
  c.hc.streams = checked_key(a, ".hyper_connection.count", 4, 4);  // llama.cpp's graph asserts 4
  c.hc.sinkhorn_iters = checked_key(a, ".hyper_connection.sinkhorn_iterations", 1, 1000);
  c.hc.eps = static_cast<float>(a.get_float(".hyper_connection.epsilon"));
  if (!(c.hc.eps >= 0.0f && c.hc.eps < 1.0f)) fail("deepseek4: hyper_connection.epsilon {} is out of range", c.hc.eps);
}

void read_routing(ArchLoader& a, ModelConfig& c, int blocks) {
  if (c.n_expert <= 0) fail("deepseek4: expert_count must be > 0");
  if (a.get_int(".expert_gating_func") != 4) fail("deepseek4: expert_gating_func {} is not 4 (sqrt-softplus)", a.get_int(".expert_gating_func"));
  c.moe.gating = Gating::SqrtSoftplusTopK;
  c.moe.activation = ExpertActivation::SwiGLU;
  c.moe.clamp.gate_before_silu = true;
  c.dense.clamp.gate_before_silu = true;
  c.moe.norm_topk = a.get_int(".expert_weights_norm") != 0;
  c.moe.weights_scale = static_cast<float>(a.get_float(".expert_weights_scale"));
  c.n_ff_exp = checked_key(a, ".expert_feed_forward_length", 1, 1 << 20);
  const int shared = checked_key(a, ".expert_shared_count", 0, 64);
  c.shared_expert.n_ff = shared * c.n_ff_exp;
  c.shared_expert.ungated = true;
  c.moe.n_hash_layers = checked_key(a, ".hash_layer_count", 0, c.n_layer);
  c.moe.clamp.layer_limit = read_limits(a, ".swiglu_clamp_exp", blocks);
  c.dense.clamp.layer_limit = a.has_key(".swiglu_clamp_shexp") ? read_limits(a, ".swiglu_clamp_shexp", blocks) : c.moe.clamp.layer_limit;
  for (int l = 0; l < c.n_layer; ++l) {
    c.plan.push_back({MixerKind::CompressedAttention, shared > 0 ? FfnKind::MoeUngatedShared : FfnKind::Moe});
  }
  c.nextn_plan = c.plan.back();  // the MTP block is a block like the trunk's
}

void read_deepseek4(ArchLoader& a, ModelConfig& c) {
  load_common_hparams(a, c);
  const int blocks = c.n_layer;
  read_trunk(a, c);
  c.norm_eps = static_cast<float>(a.get_float(".attention.layer_norm_rms_epsilon"));
  read_rope(a, c);
  read_attention(a, c, blocks);
  read_hyper_connections(a, c);
  read_routing(a, c, blocks);
  c.n_vocab = static_cast<int>(a.tensor_dim("token_embd.weight", 1));
}

using D = Dim;
using C = TensorClass;
using L = LayerWeights;
using Csa = CompressedAttentionWeights;
using Hc = HyperConnectionWeights;
using Moe = RoutedExpertWeights;
using Shared = SharedExpertWeights;

std::vector<TensorSpec> attention_rows() {
  return {norm("attn_norm.weight", {D::Embd}, &L::attn_norm),
          small("attn_sinks.weight", {D::Heads}, &Csa::sinks, constant(1.0f)),
          matrix("attn_q_a.weight", {D::Embd, D::CsaQRank}, &Csa::wq_a, C::AttnQ, fan_in(1.0f)),
          norm("attn_q_a_norm.weight", {D::CsaQRank}, &Csa::q_a_norm),
          matrix("attn_q_b.weight", {D::CsaQRank, D::QWidth}, &Csa::wq_b, C::AttnQ, fan_in(1.0f)),
          matrix("attn_kv.weight", {D::Embd, D::HeadDim}, &Csa::wkv, C::AttnK, fan_in(1.0f)),
          norm("attn_kv_a_norm.weight", {D::HeadDim}, &Csa::kv_norm),
          matrix("attn_output_a.weight", {D::CsaOGroupIn, D::CsaORank}, &Csa::wo_a, C::AttnOut, fan_in(1.0f)),
          matrix("attn_output_b.weight", {D::CsaORank, D::Embd}, &Csa::wo_b, C::AttnOut, fan_in(0.5f)),
          on(Layers::Compressed, matrix("attn_compressor_kv.weight", {D::Embd, D::CsaCompWidth}, &Csa::comp_kv, C::Dense, fan_in(1.0f))),
          on(Layers::Compressed, matrix("attn_compressor_gate.weight", {D::Embd, D::CsaCompWidth}, &Csa::comp_gate, C::Dense, fan_in(1.0f))),
          on(Layers::Compressed, small("attn_compressor_ape.weight", {D::CsaCompWidth, D::CsaRatio}, &Csa::comp_ape, constant(0.5f))),
          on(Layers::Compressed, norm("attn_compressor_norm.weight", {D::HeadDim}, &Csa::comp_norm)),
          on(Layers::Indexed, matrix("indexer.proj.weight", {D::Embd, D::IdxHeads}, &Csa::idx_proj, C::Dense, fan_in(1.0f))),
          on(Layers::Indexed, matrix("indexer.attn_q_b.weight", {D::CsaQRank, D::IdxQWidth}, &Csa::idx_q_b, C::Dense, fan_in(1.0f))),
          on(Layers::Indexed, matrix("indexer_compressor_kv.weight", {D::Embd, D::IdxCompWidth}, &Csa::idx_comp_kv, C::Dense, fan_in(1.0f))),
          on(Layers::Indexed, matrix("indexer_compressor_gate.weight", {D::Embd, D::IdxCompWidth}, &Csa::idx_comp_gate, C::Dense, fan_in(1.0f))),
          on(Layers::Indexed, small("indexer_compressor_ape.weight", {D::IdxCompWidth, D::CsaRatio}, &Csa::idx_comp_ape, constant(0.5f))),
          on(Layers::Indexed, norm("indexer_compressor_norm.weight", {D::IdxHeadDim}, &Csa::idx_comp_norm))};
}

// The mix weights spread the streams' pre weights around sigmoid(0) and keep comb near uniform.
std::vector<TensorSpec> hyper_rows() {
  return {small("hc_attn_fn.weight", {D::HcWidth, D::HcMix}, &Hc::attn_fn, fan_in(1.0f)),
          small("hc_attn_base.weight", {D::HcMix}, &Hc::attn_base, constant(0.5f)),
          small("hc_attn_scale.weight", {D::Three}, &Hc::attn_scale, constant(0.5f)),
          small("hc_ffn_fn.weight", {D::HcWidth, D::HcMix}, &Hc::ffn_fn, fan_in(1.0f)),
          small("hc_ffn_base.weight", {D::HcMix}, &Hc::ffn_base, constant(0.5f)),
          small("hc_ffn_scale.weight", {D::Three}, &Hc::ffn_scale, constant(0.5f))};
}

TensorSpec hash_table() {
  TensorSpec t = small("ffn_gate_tid2eid.weight", {D::ExpertsUsed, D::Vocab}, &Moe::hash_experts, fixed(Fixed::HashExperts));
  t.type_class = C::Index;
  return on(Layers::Hashed, t);
}

std::vector<TensorSpec> ffn_rows() {
  const Role sh = Role::SharedExpert;
  return {norm("ffn_norm.weight", {D::Embd}, &L::ffn_norm),
          on(Layers::Moe, matrix("ffn_gate_inp.weight", {D::Embd, D::Experts}, &Moe::router, C::Router, fan_in(2.0f), Role::Router)),
          on(Layers::Biased, small("exp_probs_b.bias", {D::Experts}, &Moe::expert_select_bias, constant(0.05f))),
          hash_table(),
          on(Layers::Moe, experts("ffn_gate_exps.weight", {D::Embd, D::ExpertFF, D::Experts}, &ExpertRoles::gate, C::Experts, fan_in(1.0f))),
          on(Layers::Moe, experts("ffn_up_exps.weight", {D::Embd, D::ExpertFF, D::Experts}, &ExpertRoles::up, C::Experts, fan_in(1.0f))),
          on(Layers::Moe, experts("ffn_down_exps.weight", {D::ExpertFF, D::Embd, D::Experts}, &ExpertRoles::down, C::ExpertsDown, fan_in(1.0f))),
          on(Layers::Shared, matrix("ffn_gate_shexp.weight", {D::Embd, D::SharedFF}, &Shared::shexp_gate, C::Dense, fan_in(1.0f), sh)),
          on(Layers::Shared, matrix("ffn_up_shexp.weight", {D::Embd, D::SharedFF}, &Shared::shexp_up, C::Dense, fan_in(1.0f), sh)),
          on(Layers::Shared, matrix("ffn_down_shexp.weight", {D::SharedFF, D::Embd}, &Shared::shexp_down, C::Dense, fan_in(0.5f), sh))};
}

// The MTP block's own rows (the shared nextn_rows() but for what the synthetic files hold: the
// block's shared_head_norm, and the inits the family's presets were written with).
std::vector<TensorSpec> nextn_rows() {
  using N = NextnWeights;
  const auto own = [](TensorSpec t) { return on(Layers::NextN, t); };
  return {own(matrix("nextn.eh_proj.weight", {D::Embd2, D::Embd}, &N::eh_proj, C::Dense, fan_in(1.0f))),
          own(norm("nextn.enorm.weight", {D::Embd}, &N::enorm)),
          own(norm("nextn.hnorm.weight", {D::Embd}, &N::hnorm)),
          optional(own(norm("nextn.shared_head_norm.weight", {D::Embd}, &N::shared_head_norm))),
          optional(own(matrix("nextn.embed_tokens.weight", {D::Embd, D::Vocab}, &N::embed_tokens, C::Embedding, constant(1.0f))),
                   Layers::Never),
          optional(own(matrix("nextn.shared_head_head.weight", {D::Embd, D::Vocab}, &N::shared_head_head, C::Output, fan_in(1.0f))),
                   Layers::Never)};
}

std::vector<TensorSpec> head_rows() {
  TensorSpec fn = global_vector("output_hc_fn.weight", {D::HcWidth, D::HcStreams}, &ModelWeights::output_hc_fn);
  fn.init = fan_in(1.0f);
  TensorSpec base = global_vector("output_hc_base.weight", {D::HcStreams}, &ModelWeights::output_hc_base);
  base.init = constant(0.5f);
  TensorSpec scale = global_vector("output_hc_scale.weight", {D::One}, &ModelWeights::output_hc_scale);
  scale.init = constant(0.5f);
  return {fn, base, scale,
          global_vector("output_norm.weight", {D::Embd}, &ModelWeights::output_norm),
          global_matrix("output.weight", {D::Embd, D::Vocab}, &ModelWeights::output, C::Output, fan_in(kOutputLogitStd))};
}

std::vector<TensorSpec> tensors() {
  return rows({{token_embedding(constant(1.0f))}, attention_rows(), hyper_rows(), ffn_rows(), nextn_rows(), head_rows()});
}

// Hash tables must name experts that exist: a bad id would index past the expert tensors.
void check_hash_tables(const ModelConfig& c, ModelWeights& w) {
  for (int l = 0; l < c.n_layer; ++l) {
    const LayerWeights& L = w.layers[static_cast<size_t>(l)];
    if (!L.experts) continue;
    for (float e : L.experts->hash_experts) {
      if (!(e >= 0.0f && e < static_cast<float>(c.n_expert))) fail("deepseek4: layer {}'s hash routing table names expert {} of {}", l, e, c.n_expert);
    }
  }
}

}  // namespace

const Architecture& deepseek4_architecture() {
  static const std::vector<TensorSpec> table = tensors();
  static const Architecture arch{"deepseek4",
                                 "DeepSeek-V4 (hyper-connections, compressed sparse attention, hash and sqrt-softplus routing, MTP head)",
                                 read_deepseek4, table, check_hash_tables};
  return arch;
}

}  // namespace bmoe
