// Registry of architectures and the hyperparameters and tensors most families share.
#include <fmt/format.h>

#include "core/error.h"
#include "model/arch.h"

namespace bmoe {

void load_qwen3moe(ArchLoader& loader, ModelConfig& config, ModelWeights& weights);
void load_qwen2moe(ArchLoader& loader, ModelConfig& config, ModelWeights& weights);
void load_olmoe(ArchLoader& loader, ModelConfig& config, ModelWeights& weights);
void load_llama_moe(ArchLoader& loader, ModelConfig& config, ModelWeights& weights);
void load_gpt_oss(ArchLoader& loader, ModelConfig& config, ModelWeights& weights);
void load_gemma4(ArchLoader& loader, ModelConfig& config, ModelWeights& weights);

const std::vector<Architecture>& architectures() {
  static const std::vector<Architecture> archs = {
      {"qwen3moe", "Qwen3 MoE (Qwen3-30B-A3B, 235B-A22B)", load_qwen3moe},
      {"qwen2moe", "Qwen2 MoE with shared expert (Qwen1.5-MoE-A2.7B, Qwen2-57B-A14B)", load_qwen2moe},
      {"olmoe", "OLMoE (OLMoE-1B-7B)", load_olmoe},
      {"llama", "llama-architecture MoE (Mixtral 8x7B, 8x22B)", load_llama_moe},
      {"gpt-oss", "gpt-oss (20b, 120b; MXFP4 experts, attention sinks, sliding window)", load_gpt_oss},
      {"gemma4", "Gemma 4 MoE (26B-A4B; dense FFN beside the experts, fused gate+up)", load_gemma4},
  };
  return archs;
}

const Architecture* find_architecture(const std::string& name) {
  for (const Architecture& a : architectures()) {
    if (name == a.name) return &a;
  }
  return nullptr;
}

void load_common_hparams(ArchLoader& a, ModelConfig& c) {
  c.n_layer = static_cast<int>(a.get_int(".block_count"));
  c.n_embd = static_cast<int>(a.get_int(".embedding_length"));
  c.n_head = static_cast<int>(a.get_int(".attention.head_count"));
  c.n_head_kv = static_cast<int>(a.get_int_or(".attention.head_count_kv", c.n_head));
  if (c.n_layer <= 0 || c.n_embd <= 0 || c.n_head <= 0 || c.n_head_kv <= 0 || c.n_head % c.n_head_kv != 0) {
    fail("invalid model shape: {} layers, {} embedding, {} heads, {} kv heads", c.n_layer, c.n_embd, c.n_head,
         c.n_head_kv);
  }
  c.head_dim = static_cast<int>(a.get_int_or(".attention.key_length", c.n_embd / c.n_head));
  c.head_dim_v = static_cast<int>(a.get_int_or(".attention.value_length", c.head_dim));
  c.n_ctx_train = static_cast<int>(a.get_int_or(".context_length", 4096));
  c.norm_eps = static_cast<float>(a.get_float_or(".attention.layer_norm_rms_epsilon", 1e-6));
  c.n_expert = static_cast<int>(a.get_int_or(".expert_count", 0));
  c.n_expert_used = static_cast<int>(a.get_int_or(".expert_used_count", 0));
  c.n_ff_exp = static_cast<int>(a.get_int_or(".expert_feed_forward_length", 0));
  c.rope.freq_base = static_cast<float>(a.get_float_or(".rope.freq_base", 10000.0));
  c.rope.n_rot = static_cast<int>(a.get_int_or(".rope.dimension_count", c.head_dim));
  c.rope.n_ctx_orig = c.n_ctx_train;
  // RoPE scaling: linear or YaRN (llama.cpp's defaults: ext_factor 1 for YaRN, beta 32/1).
  const std::string scaling = a.get_string_or(".rope.scaling.type", "none");
  const double factor = a.get_float_or(".rope.scaling.factor", 0.0);
  if (scaling != "none" && factor > 1.0) c.rope.freq_scale = static_cast<float>(1.0 / factor);
  if (scaling == "yarn") {
    c.rope.ext_factor = 1.0f;
    c.rope.n_ctx_orig = static_cast<int>(a.get_int_or(".rope.scaling.original_context_length", c.n_ctx_train));
    c.rope.beta_fast = static_cast<float>(a.get_float_or(".rope.scaling.yarn_beta_fast", 32.0));
    c.rope.beta_slow = static_cast<float>(a.get_float_or(".rope.scaling.yarn_beta_slow", 1.0));
    // The attention factor llama.cpp passes to RoPE: its YaRN magnitude correction is applied
    // inside the rotation, so the factor itself cancels to 1 (times any explicit attn_factor).
    c.rope.attn_factor = 1.0f;
  }
  c.rope.attn_factor *= static_cast<float>(a.get_float_or(".rope.scaling.attn_factor", 1.0));
  if (scaling != "none" && scaling != "linear" && scaling != "yarn") {
    fail("unsupported RoPE scaling type '{}'", scaling);
  }
  if (c.n_expert > 0 && (c.n_expert_used <= 0 || c.n_expert_used > c.n_expert)) {
    fail("invalid expert routing: {} of {} experts", c.n_expert_used, c.n_expert);
  }
}

void load_common_io(ArchLoader& a, const ModelConfig& c, ModelWeights& w) {
  w.tok_embd = a.matrix("token_embd.weight", {c.n_embd, c.n_vocab});
  w.output_norm = a.vector("output_norm.weight", {c.n_embd});
  w.output = a.optional_matrix("output.weight", {c.n_embd, c.n_vocab});
  if (!w.output.present()) w.output = w.tok_embd;  // tied embeddings
}

}  // namespace bmoe
