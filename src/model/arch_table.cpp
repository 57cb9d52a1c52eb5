#include "model/arch_table.h"

#include <fmt/format.h>

#include <algorithm>

#include "core/error.h"
#include "model/arch.h"

namespace bmoe {

const char* dim_name(Dim d) {
  switch (d) {
    case Dim::None: return "";
    case Dim::One: return "1";
    case Dim::Embd: return "n_embd";
    case Dim::Vocab: return "n_vocab";
    case Dim::QWidth: return "n_head*head_dim";
    case Dim::KWidth: return "n_head_kv*head_dim";
    case Dim::VWidth: return "n_head_kv*head_dim_v";
    case Dim::OutWidth: return "n_head*head_dim_v";
    case Dim::HeadDim: return "head_dim";
    case Dim::Heads: return "n_head";
    case Dim::RopePairs: return "head_dim/2";
    case Dim::Experts: return "n_expert";
    case Dim::ExpertFF: return "n_ff_exp";
    case Dim::ExpertFF2: return "2*n_ff_exp";
    case Dim::SharedFF: return "n_ff_shexp";
    case Dim::DenseFF: return "n_ff";
    case Dim::QGateWidth: return "2*n_head*head_dim";
    case Dim::ConvKernel: return "ssm.conv_kernel";
    case Dim::ConvChannels: return "2*key_dim+value_dim";
    case Dim::DeltaValueDim: return "value_dim";
    case Dim::DeltaVHeads: return "v_heads";
    case Dim::DeltaHeadDim: return "ssm.state_size";
    case Dim::Embd3: return "3*n_embd";
    case Dim::ShortConvKernel: return "shortconv.l_cache";
    case Dim::Embd2: return "2*n_embd";
    case Dim::KdaKernel: return "ssm.conv_kernel";
    case Dim::KdaInner: return "n_head*kda.head_dim";
    case Dim::KdaHeadDim: return "kda.head_dim";
    case Dim::MlaQRank: return "q_lora_rank";
    case Dim::MlaQWidth: return "n_head*key_length_mla";
    case Dim::MlaKvA: return "kv_lora_rank+rope_dims";
    case Dim::MlaKvRank: return "kv_lora_rank";
    case Dim::MlaNope: return "key_length_mla-rope_dims";
    case Dim::MlaValueDim: return "value_length_mla";
    case Dim::MlaOutWidth: return "n_head*value_length_mla";
    case Dim::CsaQRank: return "q_lora_rank";
    case Dim::CsaOGroupIn: return "n_head*head_dim/output_group_count";
    case Dim::CsaORank: return "output_group_count*output_lora_rank";
    case Dim::CsaCompWidth: return "(ratio==4?2:1)*head_dim";
    case Dim::CsaRatio: return "compress_ratio";
    case Dim::IdxHeads: return "indexer.head_count";
    case Dim::IdxQWidth: return "indexer.head_count*indexer.key_length";
    case Dim::IdxHeadDim: return "indexer.key_length";
    case Dim::IdxCompWidth: return "2*indexer.key_length";
    case Dim::HcWidth: return "hc*n_embd";
    case Dim::HcMix: return "(2+hc)*hc";
    case Dim::HcStreams: return "hc";
    case Dim::Three: return "3";
    case Dim::ExpertsUsed: return "n_expert_used";
  }
  return "?";
}

int64_t dim_value(Dim d, const ModelConfig& c, int layer) {
  // An MTP block after the trunk has the shapes of the last trunk layer.
  const int l = layer < 0 ? 0 : std::min(layer, c.n_layer - 1);
  switch (d) {
    case Dim::None: return 0;
    case Dim::One: return 1;
    case Dim::Embd: return c.n_embd;
    case Dim::Vocab: return c.n_vocab;
    case Dim::QWidth: return int64_t{c.n_head} * c.head_dim_at(l);
    case Dim::KWidth: return int64_t{c.n_head_kv_at(l)} * c.head_dim_at(l);
    case Dim::VWidth: return int64_t{c.n_head_kv_at(l)} * c.head_dim_v_at(l);
    case Dim::OutWidth: return int64_t{c.n_head} * c.head_dim_v_at(l);
    case Dim::HeadDim: return c.head_dim_at(l);
    case Dim::Heads: return c.n_head;
    case Dim::RopePairs: return c.head_dim / 2;
    case Dim::Experts: return c.n_expert;
    case Dim::ExpertFF: return c.n_ff_exp;
    case Dim::ExpertFF2: return 2 * int64_t{c.n_ff_exp};
    case Dim::SharedFF: return c.shared_expert.n_ff;
    case Dim::DenseFF: return c.n_ff_dense_at(l);
    case Dim::QGateWidth: return 2 * int64_t{c.n_head} * c.head_dim_at(l);
    case Dim::ConvKernel: return c.delta_net.conv_kernel;
    case Dim::ConvChannels: return c.delta_net.conv_channels();
    case Dim::DeltaValueDim: return c.delta_net.value_dim();
    case Dim::DeltaVHeads: return c.delta_net.v_heads;
    case Dim::DeltaHeadDim: return c.delta_net.head_dim;
    case Dim::Embd3: return 3 * int64_t{c.n_embd};
    case Dim::ShortConvKernel: return c.short_conv.kernel;
    case Dim::Embd2: return 2 * int64_t{c.n_embd};
    case Dim::KdaKernel: return c.kda.conv_kernel;
    case Dim::KdaInner: return c.kda.inner(c.n_head);
    case Dim::KdaHeadDim: return c.kda.head_dim;
    case Dim::MlaQRank: return c.mla.q_lora_rank;
    case Dim::MlaQWidth: return int64_t{c.n_head} * c.mla.qk_head_dim();
    case Dim::MlaKvA: return c.mla.cache_row();
    case Dim::MlaKvRank: return c.mla.kv_lora_rank;
    case Dim::MlaNope: return c.mla.qk_nope;
    case Dim::MlaValueDim: return c.mla.v_head_dim;
    case Dim::MlaOutWidth: return int64_t{c.n_head} * c.mla.v_head_dim;
    case Dim::CsaQRank: return c.csa.q_lora_rank;
    case Dim::CsaOGroupIn: return c.csa.o_groups > 0 ? int64_t{c.n_head} * c.head_dim / c.csa.o_groups : 0;
    case Dim::CsaORank: return int64_t{c.csa.o_groups} * c.csa.o_lora_rank;
    case Dim::CsaCompWidth: return (c.csa.ratio_at(l) == 4 ? 2 : 1) * int64_t{c.head_dim};
    case Dim::CsaRatio: return c.csa.ratio_at(l);
    case Dim::IdxHeads: return c.csa.indexer_heads;
    case Dim::IdxQWidth: return int64_t{c.csa.indexer_heads} * c.csa.indexer_head_dim;
    case Dim::IdxHeadDim: return c.csa.indexer_head_dim;
    case Dim::IdxCompWidth: return 2 * int64_t{c.csa.indexer_head_dim};
    case Dim::HcWidth: return int64_t{c.hc.streams} * c.n_embd;
    case Dim::HcMix: return int64_t{2 + c.hc.streams} * c.hc.streams;
    case Dim::HcStreams: return c.hc.streams;
    case Dim::Three: return 3;
    case Dim::ExpertsUsed: return c.n_expert_used;
  }
  return 0;
}

const char* layers_name(Layers l) {
  switch (l) {
    case Layers::Global: return "model";
    case Layers::All: return "every layer";
    case Layers::Sliding: return "sliding-window layers";
    case Layers::Full: return "full-attention layers";
    case Layers::Moe: return "MoE layers";
    case Layers::Attention: return "attention layers";
    case Layers::Recurrent: return "Gated DeltaNet layers";
    case Layers::ShortConv: return "short-convolution layers";
    case Layers::KimiDelta: return "Kimi Delta Attention layers";
    case Layers::Latent: return "latent attention layers";
    case Layers::LatentLowRankQ: return "latent attention layers with q_lora_rank > 0";
    case Layers::LatentPlainQ: return "latent attention layers with q_lora_rank 0";
    case Layers::Dense: return "dense-FFN layers";
    case Layers::Shared: return "shared-expert layers";
    case Layers::Compressed: return "compressed layers (ratio 4 or 128)";
    case Layers::Indexed: return "ratio-4 layers (lightning indexer)";
    case Layers::Hashed: return "hash-routed layers";
    case Layers::Biased: return "routed layers that are not hash-routed";
    case Layers::NextN: return "nextn (MTP) blocks";
    case Layers::Never: return "never";
  }
  return "?";
}

namespace {

// Whether a layer of plan `p` (at `layer`, for its attention window; at `own`, for what a block
// has of its own: an MTP block's compression ratio, and it is never hash-routed) is in `set`.
bool plan_in(Layers set, const LayerPlan& p, const ModelConfig& c, int layer, int own) {
  const bool experts = p.ffn != FfnKind::Dense;
  const bool nextn = own >= c.n_layer;
  switch (set) {
    case Layers::Global: return layer < 0;
    case Layers::All: return layer >= 0;
    case Layers::Sliding: return layer >= 0 && c.sliding_at(layer) != 0;
    case Layers::Full: return layer >= 0 && c.sliding_at(layer) == 0;
    case Layers::Moe: return layer >= 0 && experts;
    case Layers::Attention:
      return layer >= 0 && (p.mixer == MixerKind::Attention || p.mixer == MixerKind::GatedAttention ||
                            p.mixer == MixerKind::LatentAttention || p.mixer == MixerKind::CompressedAttention);
    case Layers::Recurrent: return layer >= 0 && p.mixer == MixerKind::GatedDeltaNet;
    case Layers::ShortConv: return layer >= 0 && p.mixer == MixerKind::ShortConv;
    case Layers::KimiDelta: return layer >= 0 && p.mixer == MixerKind::KimiDelta;
    case Layers::Latent: return layer >= 0 && p.mixer == MixerKind::LatentAttention;
    case Layers::LatentLowRankQ: return layer >= 0 && p.mixer == MixerKind::LatentAttention && c.mla.q_lora_rank > 0;
    case Layers::LatentPlainQ: return layer >= 0 && p.mixer == MixerKind::LatentAttention && c.mla.q_lora_rank == 0;
    case Layers::Dense: return layer >= 0 && !experts;
    case Layers::Shared: return layer >= 0 && (p.ffn == FfnKind::MoeShared || p.ffn == FfnKind::MoeUngatedShared);
    case Layers::Compressed: return layer >= 0 && c.csa.ratio_at(own) != 0;
    case Layers::Indexed: return layer >= 0 && c.csa.ratio_at(own) == 4;
    case Layers::Hashed: return layer >= 0 && experts && !nextn && own < c.moe.n_hash_layers;
    case Layers::Biased: return layer >= 0 && experts && (nextn || own >= c.moe.n_hash_layers);
    case Layers::NextN: return false;
    case Layers::Never: return false;
  }
  return false;
}

}  // namespace

bool layer_in(Layers set, const ModelConfig& c, int layer) {
  if (layer >= c.n_layer) {  // an MTP block: a decoder block of its own plan, plus its own rows
    if (layer >= c.n_layer + c.n_nextn_layer || set == Layers::Global || set == Layers::Never) return false;
    return set == Layers::NextN || plan_in(set, c.nextn_plan, c, c.n_layer - 1, layer);
  }
  if (layer < 0) return set == Layers::Global;
  return plan_in(set, c.plan[static_cast<size_t>(layer)], c, layer, layer);
}

const char* role_name(Role r) {
  switch (r) {
    case Role::Dense: return "dense";
    case Role::Small: return "small";
    case Role::Router: return "router";
    case Role::RoutedExpert: return "routed expert";
    case Role::SharedExpert: return "shared expert";
    case Role::Recurrent: return "recurrent";
  }
  return "?";
}

std::string TensorSpec::tensor_name(int layer) const {
  return per_layer() ? fmt::format("blk.{}.{}", layer, name) : std::string(name);
}

std::vector<int64_t> TensorSpec::shape(const ModelConfig& c, int layer) const {
  std::vector<int64_t> out;
  for (Dim d : dims) {
    if (d != Dim::None) out.push_back(dim_value(d, c, layer));
  }
  return out;
}

std::vector<TableTensor> synth_tensors(std::span<const TensorSpec> table, const ModelConfig& c) {
  std::vector<TableTensor> out;
  auto emit = [&](const TensorSpec& t, int layer) {
    if (t.alternative == Alternative::Fallback) return;
    if (layer >= 0 ? !layer_in(t.synth_layers, c, layer) || !layer_in(t.layers, c, layer)
                   : t.synth_layers == Layers::Never) {
      return;
    }
    out.push_back({&t, layer, t.tensor_name(layer), t.shape(c, layer)});
  };
  for (size_t i = 0; i < table.size();) {
    if (!table[i].per_layer()) {
      emit(table[i++], -1);
      continue;
    }
    size_t end = i;
    while (end < table.size() && table[end].per_layer()) ++end;
    for (int l = 0; l < c.n_layer + c.n_nextn_layer; ++l) {
      for (size_t j = i; j < end; ++j) emit(table[j], l);
    }
    i = end;
  }
  return out;
}

namespace {

void bind_one(const TensorSpec& t, ArchLoader& a, const ModelConfig& c, ModelWeights& w, int layer) {
  const std::string name = t.tensor_name(layer);
  std::vector<int64_t> dims = t.shape(c, layer);
  if (t.optional && !a.has_tensor(name)) return;
  const Binding& b = t.bind;
  if (b.model_matrix) {
    w.*b.model_matrix = a.matrix(name, std::move(dims));
  } else if (b.model_vector) {
    w.*b.model_vector = a.vector(name, std::move(dims));
  } else {
    LayerWeights& L = layer < c.n_layer ? w.layers[static_cast<size_t>(layer)]
                                        : w.nextn_layers[static_cast<size_t>(layer - c.n_layer)];
    Weight* matrix = b.matrix ? b.matrix(L) : nullptr;
    Vector* vector = b.vector ? b.vector(L) : nullptr;
    int* role = b.expert && L.experts ? &(L.experts->roles.*b.expert) : nullptr;
    if (matrix == nullptr && vector == nullptr && role == nullptr) {
      fail("internal: {} belongs to a kind that layer {}'s plan does not have", name, layer);
    }
    if (matrix) *matrix = a.matrix(name, std::move(dims));
    else if (vector) *vector = a.vector(name, std::move(dims));
    else *role = a.expert_matrix(layer, name, std::move(dims));
  }
}

// Whether a layer stores the Preferred form of its alternative rows.
bool prefers(std::span<const TensorSpec> table, ArchLoader& a, const ModelConfig& c, int layer) {
  for (const TensorSpec& t : table) {
    if (t.alternative == Alternative::Preferred && layer_in(t.layers, c, layer)) return a.has_tensor(t.tensor_name(layer));
  }
  return true;
}

}  // namespace

LayerWeights layer_weights_for(const LayerPlan& plan) {
  LayerWeights L;
  switch (plan.mixer) {
    case MixerKind::Attention:
    case MixerKind::GatedAttention: L.attention.emplace(); break;
    case MixerKind::GatedDeltaNet: L.delta_net.emplace(); break;
    case MixerKind::ShortConv: L.short_conv.emplace(); break;
    case MixerKind::KimiDelta: L.kimi_delta.emplace(); break;
    case MixerKind::LatentAttention: L.latent.emplace(); break;
    case MixerKind::CompressedAttention:
      L.compressed.emplace();
      L.hyper.emplace();  // the family's residual streams go with its attention kind
      break;
  }
  switch (plan.ffn) {
    case FfnKind::Dense: L.dense.emplace(); break;
    case FfnKind::Moe: L.experts.emplace(); break;
    case FfnKind::MoeShared:
    case FfnKind::MoeUngatedShared:
      L.experts.emplace();
      L.shared.emplace();
      break;
    case FfnKind::ParallelDenseMoe:
      L.dense.emplace();
      L.experts.emplace();
      L.parallel.emplace();
      break;
  }
  return L;
}

namespace {

// A norm the plan declares must have its weight; a weight the plan does not declare would be
// ignored (a file of another variant): both fail the load.
void check_norm(bool declared, const Vector& weight, const char* tensor, int layer) {
  if (declared == !weight.empty()) return;
  fail("layer {}: {} {}", layer, tensor, declared ? "is missing" : "is in the file but not in the family's layer plan");
}

void check_plan_norms(const ModelConfig& c, const ModelWeights& w) {
  const size_t trunk = w.layers.size();
  for (size_t i = 0; i < trunk + w.nextn_layers.size(); ++i) {
    const LayerWeights& L = i < trunk ? w.layers[i] : w.nextn_layers[i - trunk];
    const LayerNorms& n = i < trunk ? c.plan[i].norms : c.nextn_plan.norms;
    const int layer = static_cast<int>(i);
    if (L.attention) {
      check_norm(n.qk != QkNorm::None, L.attention->q_norm, "attn_q_norm", layer);
      check_norm(n.qk != QkNorm::None, L.attention->k_norm, "attn_k_norm", layer);
      check_norm(n.post_mixer, L.attention->post_attn_norm, "post_attention_norm", layer);
    }
    check_norm(n.post_ffn, L.post_ffn_norm, "post_ffw_norm", layer);
    check_norm(n.output_scale, L.out_scale, "layer_output_scale", layer);
  }
}

}  // namespace

void bind_tensors(std::span<const TensorSpec> table, ArchLoader& a, const ModelConfig& c, ModelWeights& w) {
  w.layers.clear();
  for (const LayerPlan& plan : c.plan) w.layers.push_back(layer_weights_for(plan));
  for (const TensorSpec& t : table) {
    if (!t.per_layer()) bind_one(t, a, c, w, -1);
  }
  w.nextn_layers.clear();
  const bool nextn = a.wants_nextn() && has_nextn_tensors(table, a, c);
  for (int i = 0; nextn && i < c.n_nextn_layer; ++i) {
    w.nextn_layers.push_back(layer_weights_for(c.nextn_plan));
    w.nextn_layers.back().nextn.emplace();
  }
  const int layers = c.n_layer + static_cast<int>(w.nextn_layers.size());
  for (int l = 0; l < layers; ++l) {
    const bool preferred = prefers(table, a, c, l);
    for (const TensorSpec& t : table) {
      if (!t.per_layer() || !layer_in(t.layers, c, l)) continue;
      if (t.alternative == (preferred ? Alternative::Fallback : Alternative::Preferred)) continue;
      bind_one(t, a, c, w, l);
    }
  }
  if (!w.output.present()) w.output = w.tok_embd;  // tied embeddings
  check_plan_norms(c, w);
}

namespace {

void check_nextn_block(std::span<const TensorSpec> table, ArchLoader& a, const ModelConfig& c, int layer) {
  for (const TensorSpec& t : table) {
    if (!t.per_layer() || t.alternative == Alternative::Fallback || !layer_in(t.layers, c, layer)) continue;
    const std::string name = t.tensor_name(layer);
    if (!a.has_tensor(name)) {
      if (t.optional) continue;
      fail("missing tensor '{}' (the file declares {} nextn layers after {} trunk layers)", name, c.n_nextn_layer,
           c.n_layer);
    }
    const std::vector<int64_t> dims = t.shape(c, layer);
    for (size_t d = 0; d < dims.size(); ++d) {
      const int64_t got = a.tensor_dim(name, static_cast<int>(d));
      if (got != dims[d]) fail("tensor '{}': dimension {} is {}, expected {}", name, d, got, dims[d]);
    }
  }
}

// The first required row of the MTP blocks' own: where a block holds it, it holds the rest.
const TensorSpec* nextn_marker(std::span<const TensorSpec> table) {
  for (const TensorSpec& t : table) {
    if (t.layers == Layers::NextN && !t.optional) return &t;
  }
  return nullptr;
}

}  // namespace

void check_nextn_tensors(std::span<const TensorSpec> table, ArchLoader& a, const ModelConfig& c) {
  const TensorSpec* marker = nextn_marker(table);
  for (int l = c.n_layer; marker != nullptr && l < c.n_layer + c.n_nextn_layer; ++l) {
    if (a.has_tensor(marker->tensor_name(l))) check_nextn_block(table, a, c, l);
  }
}

bool has_nextn_tensors(std::span<const TensorSpec> table, ArchLoader& a, const ModelConfig& c) {
  const TensorSpec* marker = nextn_marker(table);
  if (marker == nullptr || c.n_nextn_layer <= 0) return false;
  for (int l = c.n_layer; l < c.n_layer + c.n_nextn_layer; ++l) {
    if (!a.has_tensor(marker->tensor_name(l))) return false;
  }
  return true;
}

TensorSpec global_matrix(const char* name, std::array<Dim, 3> dims, Weight ModelWeights::* to, TensorClass cls,
                         SynthInit init) {
  TensorSpec t{name, dims, Role::Dense, cls, {}};
  t.bind.model_matrix = to;
  t.layers = t.synth_layers = Layers::Global;
  t.init = init;
  return t;
}

TensorSpec global_vector(const char* name, std::array<Dim, 3> dims, Vector ModelWeights::* to) {
  TensorSpec t{name, dims, Role::Small, TensorClass::Norm, {}};
  t.bind.model_vector = to;
  t.layers = t.synth_layers = Layers::Global;
  return t;
}

TensorSpec experts(const char* name, std::array<Dim, 3> dims, int ExpertRoles::* to, TensorClass cls, SynthInit init) {
  TensorSpec t{name, dims, Role::RoutedExpert, cls, {}};
  t.bind.expert = to;
  t.init = init;
  return t;
}

std::vector<TensorSpec> rows(std::initializer_list<std::vector<TensorSpec>> groups) {
  std::vector<TensorSpec> out;
  for (const auto& g : groups) out.insert(out.end(), g.begin(), g.end());
  return out;
}

TensorSpec token_embedding(SynthInit init) {
  return global_matrix("token_embd.weight", {Dim::Embd, Dim::Vocab}, &ModelWeights::tok_embd, TensorClass::Embedding,
                       init);
}

std::vector<TensorSpec> attention_inputs() {
  using L = AttentionWeights;
  return {norm("attn_norm.weight", {Dim::Embd}, &LayerWeights::attn_norm),
          matrix("attn_q.weight", {Dim::Embd, Dim::QWidth}, &L::wq, TensorClass::AttnQ, fan_in(1.0f)),
          matrix("attn_k.weight", {Dim::Embd, Dim::KWidth}, &L::wk, TensorClass::AttnK, fan_in(1.0f)),
          matrix("attn_v.weight", {Dim::Embd, Dim::VWidth}, &L::wv, TensorClass::AttnV, fan_in(1.0f))};
}

TensorSpec attention_output() {
  return matrix("attn_output.weight", {Dim::OutWidth, Dim::Embd}, &AttentionWeights::wo, TensorClass::AttnOut, fan_in(0.5f));
}

TensorSpec router() {
  return matrix("ffn_gate_inp.weight", {Dim::Embd, Dim::Experts}, &RoutedExpertWeights::router, TensorClass::Router,
                fan_in(kRouterLogitStd), Role::Router);
}

std::vector<TensorSpec> swiglu_experts() {
  const std::array<Dim, 3> in = {Dim::Embd, Dim::ExpertFF, Dim::Experts};
  return {experts("ffn_gate_exps.weight", in, &ExpertRoles::gate, TensorClass::Experts, fan_in(1.0f)),
          experts("ffn_up_exps.weight", in, &ExpertRoles::up, TensorClass::Experts, fan_in(1.0f)),
          experts("ffn_down_exps.weight", {Dim::ExpertFF, Dim::Embd, Dim::Experts}, &ExpertRoles::down,
                  TensorClass::ExpertsDown, fan_in(1.0f))};
}

std::vector<TensorSpec> shared_expert() {
  using L = SharedExpertWeights;
  const Role r = Role::SharedExpert;
  return {matrix("ffn_gate_inp_shexp.weight", {Dim::Embd}, &L::shexp_router, TensorClass::Router, fan_in(1.0f), r),
          matrix("ffn_gate_shexp.weight", {Dim::Embd, Dim::SharedFF}, &L::shexp_gate, TensorClass::Dense, fan_in(1.0f), r),
          matrix("ffn_up_shexp.weight", {Dim::Embd, Dim::SharedFF}, &L::shexp_up, TensorClass::Dense, fan_in(1.0f), r),
          matrix("ffn_down_shexp.weight", {Dim::SharedFF, Dim::Embd}, &L::shexp_down, TensorClass::Dense, fan_in(0.5f), r)};
}

std::vector<TensorSpec> output_head() {
  return {global_vector("output_norm.weight", {Dim::Embd}, &ModelWeights::output_norm),
          optional(global_matrix("output.weight", {Dim::Embd, Dim::Vocab}, &ModelWeights::output, TensorClass::Output,
                                 fan_in(kOutputLogitStd)),
                   Layers::Global)};
}

std::vector<TensorSpec> nextn_rows() {
  using N = NextnWeights;
  auto own = [](TensorSpec t) { return on(Layers::NextN, t); };
  auto maybe = [&](TensorSpec t) { return optional(own(t), Layers::Never); };
  return {own(matrix("nextn.eh_proj.weight", {Dim::Embd2, Dim::Embd}, &N::eh_proj, TensorClass::Dense, fan_in(1.0f))),
          own(norm("nextn.enorm.weight", {Dim::Embd}, &N::enorm)),
          own(norm("nextn.hnorm.weight", {Dim::Embd}, &N::hnorm)),
          maybe(matrix("nextn.embed_tokens.weight", {Dim::Embd, Dim::Vocab}, &N::embed_tokens, TensorClass::Embedding,
                       constant(1.0f))),
          maybe(matrix("nextn.shared_head_head.weight", {Dim::Embd, Dim::Vocab}, &N::shared_head_head,
                       TensorClass::Output, fan_in(kOutputLogitStd))),
          maybe(norm("nextn.shared_head_norm.weight", {Dim::Embd}, &N::shared_head_norm))};
}

}  // namespace bmoe
