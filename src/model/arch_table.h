// The architecture table: one declarative description of every tensor a family's GGUF holds.
// The loader binds weights from it, bmoe-synth writes synthetic models from it and
// `bmoe-cli --list-archs` prints it, so a family is described once. A family is its
// hyperparameter reader, its tensor rows and its math (transformer.cpp); see docs/design.md.
//
// Contract: a row names one tensor (global) or one tensor per layer of a layer set. Its
// shape is symbolic (Dim), evaluated on the ModelConfig the family's hyperparameter reader
// filled, so the same row checks a real file's shape and sizes a synthetic one.
#pragma once

#include <array>
#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <type_traits>
#include <vector>

#include "model/config.h"
#include "model/weights.h"

namespace bmoe {

class ArchLoader;

// Symbolic tensor dimensions; per-layer ones are evaluated at the tensor's layer.
enum class Dim : uint8_t {
  None,       // unused slot
  One,        // 1
  Embd,       // n_embd
  Vocab,      // n_vocab
  QWidth,     // n_head * head_dim(l)
  KWidth,     // n_head_kv(l) * head_dim(l)
  VWidth,     // n_head_kv(l) * head_dim_v(l)
  OutWidth,   // n_head * head_dim_v(l): attention output rows
  HeadDim,    // head_dim(l)
  Heads,      // n_head
  RopePairs,  // head_dim / 2 (of the full-attention layers)
  Experts,    // n_expert
  ExpertFF,   // n_ff_exp
  ExpertFF2,  // 2 * n_ff_exp (fused gate+up)
  SharedFF,   // n_ff_shexp
  DenseFF,    // n_ff_dense(l)
  QGateWidth,     // 2 * n_head * head_dim(l): query and output gate (qwen35moe)
  ConvKernel,     // delta_net.conv_kernel
  ConvChannels,   // delta_net.conv_channels(): q | k | v of a Gated DeltaNet layer
  DeltaValueDim,  // delta_net.value_dim()
  DeltaVHeads,    // delta_net.v_heads
  DeltaHeadDim,   // delta_net.head_dim
  Embd3,          // 3 * n_embd: the short convolution's b | c | x
  ShortConvKernel,  // short_conv_kernel
  Embd2,            // 2 * n_embd: the MTP block's input, embedding | hidden state (glm4moe)
  KdaKernel,      // kda conv_kernel
  KdaInner,       // n_head * kda head_dim
  KdaHeadDim,     // kda head_dim
  MlaQRank,       // q_lora_rank
  MlaQWidth,      // n_head * (qk_nope + qk_rope)
  MlaKvA,         // kv_lora_rank + qk_rope: the latent and the rope key
  MlaKvRank,      // kv_lora_rank
  MlaNope,        // qk_nope
  MlaValueDim,    // v_head_dim
  MlaOutWidth,    // n_head * v_head_dim
  CsaQRank,       // q_lora_rank (deepseek4)
  CsaOGroupIn,    // n_head * head_dim / o_groups: one output group's input
  CsaORank,       // o_groups * o_lora_rank
  CsaCompWidth,   // the compressor's width: 2 * head_dim on ratio-4 layers, head_dim on ratio-128
  CsaRatio,       // the layer's compression ratio
  IdxHeads,       // indexer heads
  IdxQWidth,      // indexer heads * indexer head size
  IdxHeadDim,     // indexer head size
  IdxCompWidth,   // 2 * indexer head size
  HcWidth,        // hyper-connection streams * n_embd
  HcMix,          // (2 + streams) * streams: a sublayer's mix weights
  HcStreams,      // hyper-connection streams
  Three,          // 3
  ExpertsUsed,    // n_expert_used
};
const char* dim_name(Dim d);
int64_t dim_value(Dim d, const ModelConfig& c, int layer);

// Which layers hold a per-layer tensor.
enum class Layers : uint8_t {
  Global,   // not per layer: one tensor for the model
  All,
  Sliding,  // sliding-window attention layers
  Full,     // full-attention layers
  Moe,      // layers with routed experts
  Attention,  // layers that attend (not recurrent)
  Recurrent,  // Gated DeltaNet layers
  ShortConv,  // short-convolution layers (lfm2moe)
  KimiDelta,  // Kimi Delta Attention layers
  Latent,     // multi-head latent attention layers
  LatentLowRankQ,  // latent attention layers with a low-rank query
  LatentPlainQ,    // latent attention layers with a plain query
  Dense,      // layers with a dense FFN instead of routed experts
  Shared,     // layers with a shared expert beside the routed ones
  Compressed,  // layers with a compressor (deepseek4 compression ratio 4 or 128)
  Indexed,     // layers with the lightning indexer (ratio 4)
  Hashed,      // layers that route by token id (deepseek4 hash layers)
  Biased,      // routed layers that are not hash-routed (deepseek4)
  NextN,      // only the MTP blocks after the trunk (n_layer .. n_layer + n_nextn_layer - 1)
  Never,    // only as synth_layers: the synthesizer does not write it
};
const char* layers_name(Layers l);
bool layer_in(Layers set, const ModelConfig& c, int layer);

// What a tensor is for (printed by --list-archs). Where a tensor lives follows from its binding: expert rows become streamable expert
// matrices, the others resident weights.
enum class Role : uint8_t { Dense, Small, Router, RoutedExpert, SharedExpert, Recurrent };
const char* role_name(Role r);

// Tensor classes whose quantization type bmoe-synth chooses independently.
enum class TensorClass { Embedding, Output, AttnQ, AttnK, AttnV, AttnOut, Router, Experts, ExpertsDown, Dense, Norm, Index };

// The part of a layer's weights that holds a member (the layer itself for its norms), or null
// when the layer's plan has no such part.
template <class Part>
Part* layer_part(LayerWeights& L) {
  if constexpr (std::is_same_v<Part, LayerWeights>) return &L;
  else if constexpr (std::is_same_v<Part, AttentionWeights>) return L.attention ? &*L.attention : nullptr;
  else if constexpr (std::is_same_v<Part, DeltaNetWeights>) return L.delta_net ? &*L.delta_net : nullptr;
  else if constexpr (std::is_same_v<Part, ShortConvWeights>) return L.short_conv ? &*L.short_conv : nullptr;
  else if constexpr (std::is_same_v<Part, KimiDeltaWeights>) return L.kimi_delta ? &*L.kimi_delta : nullptr;
  else if constexpr (std::is_same_v<Part, LatentAttentionWeights>) return L.latent ? &*L.latent : nullptr;
  else if constexpr (std::is_same_v<Part, CompressedAttentionWeights>) return L.compressed ? &*L.compressed : nullptr;
  else if constexpr (std::is_same_v<Part, HyperConnectionWeights>) return L.hyper ? &*L.hyper : nullptr;
  else if constexpr (std::is_same_v<Part, DenseFfnWeights>) return L.dense ? &*L.dense : nullptr;
  else if constexpr (std::is_same_v<Part, RoutedExpertWeights>) return L.experts ? &*L.experts : nullptr;
  else if constexpr (std::is_same_v<Part, SharedExpertWeights>) return L.shared ? &*L.shared : nullptr;
  else if constexpr (std::is_same_v<Part, ParallelFfnNorms>) return L.parallel ? &*L.parallel : nullptr;
  else if constexpr (std::is_same_v<Part, NextnWeights>) return L.nextn ? &*L.nextn : nullptr;
  else static_assert(sizeof(Part) == 0, "not a part of LayerWeights");
}

// A layer with the parts its plan has, all empty.
LayerWeights layer_weights_for(const LayerPlan& plan);

// Where a bound tensor goes: exactly one member is set. A per-layer matrix or vector goes into
// a member of one of the layer's parts (null: the layer's plan lacks that part).
struct Binding {
  Weight ModelWeights::* model_matrix = nullptr;
  Vector ModelWeights::* model_vector = nullptr;
  std::function<Weight*(LayerWeights&)> matrix;
  std::function<Vector*(LayerWeights&)> vector;
  int ExpertRoles::* expert = nullptr;  // a stacked expert tensor [cols, rows, n_expert] (routed experts' roles)
};

// Contents of a synthetic tensor.
enum class Fixed : uint8_t { None, RopeQuarter, LayerOutputScale, ExpertScales, DecayRates, DecayStrengths, HashExperts };
struct SynthInit {
  float scale = 0.0f;   // 0: all ones (norm weights)
  bool fan_in = false;  // stddev = scale / sqrt(dims[0]) instead of scale
  Fixed fixed = Fixed::None;
};

// Two ways a file may store the same weights (fused gate+up experts or separate ones): in a
// layer, the Preferred rows are bound when the first of them exists, else the Fallback rows.
// The synthesizer writes the Preferred ones.
enum class Alternative : uint8_t { None, Preferred, Fallback };

struct TensorSpec {
  const char* name;  // "token_embd.weight", or a per-layer suffix: "attn_q.weight" -> blk.N.attn_q.weight
  std::array<Dim, 3> dims;
  Role role;
  TensorClass type_class;
  Binding bind;
  Layers layers = Layers::All;
  bool optional = false;
  Layers synth_layers = Layers::All;  // where bmoe-synth writes it (a subset of layers)
  SynthInit init;
  Alternative alternative = Alternative::None;

  std::string tensor_name(int layer) const;
  std::vector<int64_t> shape(const ModelConfig& c, int layer) const;
  bool per_layer() const { return layers != Layers::Global; }
};

// One tensor of a model, as the table expands for a config.
struct TableTensor {
  const TensorSpec* spec;
  int layer;  // -1: global
  std::string name;
  std::vector<int64_t> dims;
};

// The tensors bmoe-synth writes for `c`, in file order: global rows where they stand, each
// run of per-layer rows layer by layer.
std::vector<TableTensor> synth_tensors(std::span<const TensorSpec> table, const ModelConfig& c);

// Binds every row the file holds; throws naming the tensor when a required one is missing or
// mis-shaped. Ties a missing output head to the embeddings.
void bind_tensors(std::span<const TensorSpec> table, ArchLoader& loader, const ModelConfig& c, ModelWeights& w);

// The MTP blocks after the trunk (ModelConfig::n_nextn_layer): the trunk's forward pass does
// not run them. Where the file holds them, each of their rows must be there with the table's
// shape (a nextn block is in a layer set when its plan, ModelConfig::nextn_plan, is, and in
// NextN); a file without the block's first NextN row is trunk-only and accepted, as llama.cpp
// does. bind_tensors binds them into ModelWeights::nextn_layers only when the loader wants them.
void check_nextn_tensors(std::span<const TensorSpec> table, ArchLoader& loader, const ModelConfig& c);
// Whether the file holds the MTP blocks' own rows (not a trunk-only file).
bool has_nextn_tensors(std::span<const TensorSpec> table, ArchLoader& loader, const ModelConfig& c);

// Row builders, so a family's table reads as a list of tensors.
TensorSpec global_matrix(const char* name, std::array<Dim, 3> dims, Weight ModelWeights::* to, TensorClass cls,
                         SynthInit init);
TensorSpec global_vector(const char* name, std::array<Dim, 3> dims, Vector ModelWeights::* to);
template <class Part>
TensorSpec matrix(const char* name, std::array<Dim, 3> dims, Weight Part::* to, TensorClass cls, SynthInit init,
                  Role role = Role::Dense) {
  TensorSpec t{name, dims, role, cls, {}};
  t.bind.matrix = [to](LayerWeights& L) -> Weight* {
    Part* part = layer_part<Part>(L);
    return part ? &(part->*to) : nullptr;
  };
  t.init = init;
  return t;
}
template <class Part>
TensorSpec norm(const char* name, std::array<Dim, 3> dims, Vector Part::* to) {
  TensorSpec t{name, dims, Role::Small, TensorClass::Norm, {}};
  t.bind.vector = [to](LayerWeights& L) -> Vector* {
    Part* part = layer_part<Part>(L);
    return part ? &(part->*to) : nullptr;
  };
  return t;
}
template <class Part>
TensorSpec small(const char* name, std::array<Dim, 3> dims, Vector Part::* to, SynthInit init) {
  TensorSpec t = norm(name, dims, to);
  t.init = init;
  return t;
}
TensorSpec experts(const char* name, std::array<Dim, 3> dims, int ExpertRoles::* to, TensorClass cls, SynthInit init);

// Row groups most families share, in the order their files hold them.
std::vector<TensorSpec> rows(std::initializer_list<std::vector<TensorSpec>> groups);  // concatenated
TensorSpec token_embedding(SynthInit init);  // token_embd.weight
std::vector<TensorSpec> attention_inputs();  // attn_norm, attn_q, attn_k, attn_v
TensorSpec attention_output();               // attn_output.weight
TensorSpec router();                         // ffn_gate_inp.weight, softmax-router spread
std::vector<TensorSpec> swiglu_experts();    // ffn_gate_exps, ffn_up_exps, ffn_down_exps
std::vector<TensorSpec> shared_expert();     // ffn_gate_inp_shexp (its gate), gate, up, down
std::vector<TensorSpec> output_head();       // output_norm, output (optional: tied when absent)
// The MTP blocks' own rows (nextn.eh_proj, enorm, hnorm; embed_tokens, shared_head_head and
// shared_head_norm optional and not synthesized), as llama.cpp names them for every family.
std::vector<TensorSpec> nextn_rows();

// Chainable adjustments of a row.
inline TensorSpec on(Layers set, TensorSpec t) {
  t.layers = set;
  t.synth_layers = set;
  return t;
}
inline TensorSpec optional(TensorSpec t, Layers synth = Layers::All) {
  t.optional = true;
  t.synth_layers = synth;
  return t;
}
inline TensorSpec alternative(Alternative a, TensorSpec t) {
  t.alternative = a;
  return t;
}

// Spread of synthetic router and output logits (hidden states are RMS-normalised to 1 before
// both). A decisive router (the top expert clearly ahead of the eighth) and a peaked
// next-token distribution keep random-weight models away from the knife-edge ties where float
// noise (which differs between any two correct implementations) flips an expert or a token.
constexpr float kRouterLogitStd = 4.0f;
constexpr float kOutputLogitStd = 8.0f;

// Initialisations of synthetic weights.
inline SynthInit fan_in(float scale) { return {scale, true, Fixed::None}; }
inline SynthInit constant(float stddev) { return {stddev, false, Fixed::None}; }
inline SynthInit fixed(Fixed f) { return {1.0f, false, f}; }

}  // namespace bmoe
