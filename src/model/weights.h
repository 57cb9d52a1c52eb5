// The weights of a model as its architecture table binds them (model/arch_table.h).
#pragma once

#include <optional>
#include <vector>

#include "quant/weight.h"

namespace bmoe {

// Small vectors (norm weights, biases) are kept as f32 copies, whatever their file type.
using Vector = std::vector<float>;

// Roles of the matrices an ExpertSource returns for one expert.
struct ExpertRoles {
  int gate = -1;
  int up = -1;
  int gate_up = -1;  // fused [gate; up] rows (gemma4)
  int down = -1;
};

// Each kind of src/model/mixers.h and ffn.h has its weights; a layer holds the parts its plan
// (ModelConfig::plan) has, the others stay empty.

// Attention and gated attention.
struct AttentionWeights {
  Weight wq, wk, wv, wo;  // wv absent: the values are the raw keys (gemma4 full layers)
  Vector bq, bk, bv, bo;
  Vector q_norm, k_norm;
  Vector attn_sinks;
  Vector post_attn_norm;  // applied to the attention output before the residual (gemma)
  Vector rope_freqs;      // per-pair RoPE frequency factors, or empty (gemma4 full layers)
};

// Gated DeltaNet (linear attention) layers of hybrid models (qwen35moe).
struct DeltaNetWeights {
  Weight ssm_qkv;    // x -> q | k | v before the convolution
  Weight ssm_z;      // x -> the output gate z
  Weight ssm_alpha;  // x -> per value head decay input
  Weight ssm_beta;   // x -> per value head update strength
  Weight ssm_out;    // gated, normalised heads -> n_embd
  Vector ssm_conv;   // depthwise kernel, [conv_kernel][channels] (transposed from the file at load)
  Vector ssm_dt;     // per value head bias of the decay input
  Vector ssm_a;      // per value head -exp(A_log), negative
  Vector ssm_norm;   // [head_dim] weight of the gated RMS norm
};

// Short-convolution layers (lfm2moe): x -> b | c | x', out = W (c * conv(b * x')).
struct ShortConvWeights {
  Weight shortconv_in, shortconv_out;
  Vector shortconv_kernel;  // [taps][n_embd] (transposed from the file at load)
};

// Kimi Delta Attention layers (bailingmoe3).
struct KimiDeltaWeights {
  Weight wq, wk, wv;  // x -> q, k, v before their short convolutions
  Weight w_decay;     // x -> per-channel decay input (ssm_f_a)
  Weight w_beta;      // x -> per-head update strength
  Weight w_gate;      // x -> per-channel output gate (ssm_g_a)
  Weight wo;
  Vector conv_q, conv_k, conv_v;  // [kernel][inner] each as loaded; finish joins them into conv
  Vector conv;        // [kernel][3 * inner]: the q | k | v kernels, tap-major
  Vector dt_bias;     // per channel, added to the decay input
  Vector a;           // per head exp(A_log), positive
  Vector norm;        // [head_dim] weight of the per-head output RMS norm
};

// Multi-head latent attention layers (bailingmoe3; deepseek2-style).
struct LatentAttentionWeights {
  Weight wq_a, wq_b;  // low-rank query (q_lora_rank > 0)
  Weight wq;          // plain query (q_lora_rank == 0)
  Weight wkv_a;       // x -> latent | rope key
  Weight w_gate;      // x -> per-head output gate
  Weight wo;
  Vector q_a_norm, kv_a_norm;
  Vector k_b;  // [n_head][kv_lora_rank][qk_nope]: per head, the query's no-RoPE part -> latent
  Vector v_b;  // [n_head][v_head_dim][kv_lora_rank]: per head, attended latent -> value
};

// DeepSeek-V4's attention (deepseek4): low-rank query, one K=V head, grouped low-rank output, and
// on compressed layers the compressor (ratio 4 and 128) and the lightning indexer (ratio 4).
struct CompressedAttentionWeights {
  Weight wq_a, wq_b, wkv;
  Weight wo_a;  // [o_groups * o_lora_rank rows x n_head * head_dim / o_groups]: group g is rows g*o_lora_rank..
  Weight wo_b;
  Vector q_a_norm, kv_norm, sinks;
  Weight comp_kv, comp_gate;  // x -> the compressor's per-token values and scores
  Vector comp_ape;            // [ratio][width]: score bias by position in the block
  Vector comp_norm;
  Weight idx_proj, idx_q_b, idx_comp_kv, idx_comp_gate;  // the indexer (ratio-4 layers)
  Vector idx_comp_ape, idx_comp_norm;
};

// Hyper-connection mixing weights of one sublayer or of the output head (f32 as loaded):
// fn [mix][streams * n_embd], base [mix], scale [3] (sublayers) or [1] (head).
struct HyperMixWeights {
  const Vector* fn = nullptr;
  const Vector* base = nullptr;
  const Vector* scale = nullptr;
};
struct HyperConnectionWeights {
  Vector attn_fn, attn_base, attn_scale;  // around the attention sublayer
  Vector ffn_fn, ffn_base, ffn_scale;     // around the FFN sublayer
  HyperMixWeights attn() const { return {&attn_fn, &attn_base, &attn_scale}; }
  HyperMixWeights ffn() const { return {&ffn_fn, &ffn_base, &ffn_scale}; }
};

// A dense FFN: the dense kind, and the dense branch beside the experts.
struct DenseFfnWeights {
  Weight ffn_gate, ffn_up, ffn_down;
};

// Routed experts: the router and what the family adds around the expert matrices (which the
// ExpertSource holds).
struct RoutedExpertWeights {
  Weight router;       // [n_expert rows x n_embd]
  Vector router_bias;  // per expert, added to the logits
  Vector expert_select_bias;  // per expert, added to the gate scores for the choice only (lfm2moe)
  Vector hash_experts;        // [n_vocab][n_expert_used] expert ids by token id (deepseek4 hash layers)
  Vector router_in_scale;     // the dense-beside-MoE kind's router input scale (gemma4)
  Vector exp_gate_bias, exp_up_bias, exp_down_bias;  // [n_expert * n] (gpt-oss)
  ExpertRoles roles;
  Vector exp_down_scale;  // per expert, multiplies its down projection (gemma4)
};

// The shared expert beside the routed ones, with its gate.
struct SharedExpertWeights {
  Weight shexp_gate, shexp_up, shexp_down, shexp_router;
};

// Gemma 4's dense FFN and experts side by side, each with its own norms.
struct ParallelFfnNorms {
  Vector moe_norm;         // pre-norm of the expert branch (the dense branch uses ffn_norm)
  Vector post_dense_norm;  // post-norm of the dense branch
  Vector post_moe_norm;    // post-norm of the expert branch
};

// What an MTP (nextn) block holds beside its decoder block: its input projection of the next
// token's embedding and the trunk's hidden state, their norms, and optional own copies of the
// embeddings and the output head (absent: the model's are shared).
struct NextnWeights {
  Weight eh_proj;  // [enorm(embedding) | hnorm(hidden)] (2 n_embd) -> n_embd
  Vector enorm, hnorm;
  Weight embed_tokens;      // or absent
  Weight shared_head_head;  // or absent
  Vector shared_head_norm;  // or empty
};

struct LayerWeights {
  Vector attn_norm;      // the mixer's pre-norm
  Vector ffn_norm;       // the FFN's pre-norm
  Vector post_ffn_norm;  // or empty
  Vector out_scale;      // one value multiplying the layer's output, or empty

  std::optional<AttentionWeights> attention;
  std::optional<DeltaNetWeights> delta_net;
  std::optional<ShortConvWeights> short_conv;
  std::optional<KimiDeltaWeights> kimi_delta;
  std::optional<LatentAttentionWeights> latent;
  std::optional<CompressedAttentionWeights> compressed;
  std::optional<HyperConnectionWeights> hyper;
  std::optional<DenseFfnWeights> dense;
  std::optional<RoutedExpertWeights> experts;
  std::optional<SharedExpertWeights> shared;
  std::optional<ParallelFfnNorms> parallel;
  std::optional<NextnWeights> nextn;  // the MTP blocks only
};

struct ModelWeights {
  Weight tok_embd;
  float embd_scale = 1.0f;
  Vector rope_freqs;  // per-pair RoPE frequency factors of the full layers (gemma4), or empty
  Vector output_norm;
  Weight output;
  Vector output_hc_fn, output_hc_base, output_hc_scale;  // the head's mix of the residual streams, or empty
  HyperMixWeights output_hc() const { return {&output_hc_fn, &output_hc_base, &output_hc_scale}; }
  std::vector<LayerWeights> layers;
  // The MTP blocks after the trunk, bound only when the loader asks for them (ArchLoader::
  // wants_nextn); empty otherwise.
  std::vector<LayerWeights> nextn_layers;
};

}  // namespace bmoe
