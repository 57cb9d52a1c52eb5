// Registry of architectures and the hyperparameters and tensors most families share.
#include <fmt/format.h>

#include <algorithm>

#include "core/error.h"
#include "model/arch.h"

namespace bmoe {

// Each family file defines one of these.
const Architecture& qwen3moe_architecture();
const Architecture& qwen2moe_architecture();
const Architecture& olmoe_architecture();
const Architecture& llama_moe_architecture();
const Architecture& gpt_oss_architecture();
const Architecture& gemma4_architecture();
const Architecture& qwen35moe_architecture();
const Architecture& lfm2moe_architecture();
const Architecture& glm4moe_architecture();
const Architecture& bailingmoe3_architecture();
const Architecture& deepseek4_architecture();

const std::vector<Architecture>& architectures() {
  static const std::vector<Architecture> archs = {
      qwen3moe_architecture(), qwen2moe_architecture(), olmoe_architecture(),
      llama_moe_architecture(), gpt_oss_architecture(), gemma4_architecture(), qwen35moe_architecture(),
      lfm2moe_architecture(),
      glm4moe_architecture(),
      bailingmoe3_architecture(),
      deepseek4_architecture(),
  };
  return archs;
}

std::string describe_tensors(const Architecture& arch) {
  std::string out;
  for (const TensorSpec& t : arch.tensors) {
    std::string shape;
    for (Dim d : t.dims) {
      if (d != Dim::None) shape += (shape.empty() ? "" : ", ") + std::string(dim_name(d));
    }
    std::string notes = layers_name(t.layers);
    if (t.optional) notes += ", optional";
    if (t.alternative == Alternative::Preferred) notes += ", else:";
    if (t.alternative == Alternative::Fallback) notes += ", alternative";
    out += fmt::format("  {:<30} [{}]  {}; {}\n", t.per_layer() ? "blk.N." + std::string(t.name) : t.name, shape,
                       role_name(t.role), notes);
  }
  return out;
}

void load_architecture(const Architecture& arch, ArchLoader& loader, ModelConfig& config, ModelWeights& weights) {
  arch.read_hparams(loader, config);
  if (config.plan.size() != static_cast<size_t>(config.n_layer)) {
    fail("internal: {} declares a plan for {} of its {} layers", arch.name, config.plan.size(), config.n_layer);
  }
  bind_tensors(arch.tensors, loader, config, weights);
  if (config.n_nextn_layer > 0) check_nextn_tensors(arch.tensors, loader, config);
  if (arch.finish) arch.finish(config, weights);
}

const Architecture* find_architecture(const std::string& name) {
  for (const Architecture& a : architectures()) {
    if (name == a.name) return &a;
  }
  return nullptr;
}

void load_common_hparams(ArchLoader& a, ModelConfig& c, bool zero_kv_heads_allowed) {
  c.n_layer = static_cast<int>(a.get_int(".block_count"));
  c.n_embd = static_cast<int>(a.get_int(".embedding_length"));
  c.n_head = static_cast<int>(a.get_int(".attention.head_count"));
  if (c.n_layer <= 0 || c.n_layer > kMaxLayers || c.n_embd <= 0 || c.n_head <= 0) {
    fail("invalid model shape: {} layers, {} embedding, {} heads", c.n_layer, c.n_embd, c.n_head);
  }
  // One count, or one per layer where 0 marks a layer without attention (lfm2moe).
  const std::vector<int64_t> kv_heads = a.get_per_layer_int(".attention.head_count_kv", c.n_layer, c.n_head);
  c.n_head_kv = 0;
  bool uniform = true;
  for (int64_t h : kv_heads) {
    if (h < 0 || (h == 0 && !zero_kv_heads_allowed) || (h > 0 && c.n_head % h != 0)) {
      fail("invalid model shape: {} kv heads for {} heads", h, c.n_head);
    }
    if (h > 0 && c.n_head_kv > 0 && h != c.n_head_kv) uniform = false;
    if (h > 0) c.n_head_kv = std::max(c.n_head_kv, static_cast<int>(h));
  }
  if (c.n_head_kv == 0) fail("invalid model shape: no layer has kv heads");
  if (!uniform) {
    for (int64_t h : kv_heads) c.attention.layer_n_head_kv.push_back(h > 0 ? static_cast<int>(h) : c.n_head_kv);
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
  if (c.head_dim <= 0 || c.head_dim_v <= 0 || c.rope.n_rot <= 0 || c.rope.n_rot > c.head_dim || c.rope.n_rot % 2 != 0) {
    fail("invalid attention shape: head sizes {}/{}, {} rotated dimensions", c.head_dim, c.head_dim_v, c.rope.n_rot);
  }
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

void read_vocab_and_expert_width(ArchLoader& a, ModelConfig& c) {
  c.n_vocab = static_cast<int>(a.tensor_dim("token_embd.weight", 1));
  if (c.n_ff_exp == 0) c.n_ff_exp = static_cast<int>(a.tensor_dim("blk.0.ffn_gate_exps.weight", 1));
}

}  // namespace bmoe
