// Registry of architectures and the hyperparameters and tensors most families share.
#include <fmt/format.h>

#include "core/error.h"
#include "model/arch.h"

namespace bmoe {

void load_qwen3moe(ArchLoader& loader, ModelConfig& config, ModelWeights& weights);

const std::vector<Architecture>& architectures() {
  static const std::vector<Architecture> archs = {
      {"qwen3moe", "Qwen3 MoE (Qwen3-30B-A3B, 235B-A22B)", load_qwen3moe},
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
  const double scale = a.get_float_or(".rope.scaling.factor", 0.0);
  if (scale > 0.0) c.rope.freq_scale = static_cast<float>(1.0 / scale);
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
