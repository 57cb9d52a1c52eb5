// Gemma 4 MoE (26B-A4B): sliding-window layers and full-attention layers with different head
// sizes, kv head counts and RoPE (the full layers rotate a quarter of each head, through
// per-pair frequency factors, and may use the key projection as values); RMS-normed q, k and
// (weightless) v; attention, FFN and output post-norms; every MoE layer runs a dense GeGLU FFN
// beside the routed experts (fused gate+up tensor, per-expert output scale); the embedding is
// scaled by sqrt(n_embd) and the logits soft-capped.
#include <fmt/format.h>

#include <algorithm>
#include <cmath>

#include "core/error.h"
#include "model/arch.h"

namespace bmoe {

namespace {

void load_gemma4_hparams(ArchLoader& a, ModelConfig& c) {
  c.n_layer = static_cast<int>(a.get_int(".block_count"));
  c.n_embd = static_cast<int>(a.get_int(".embedding_length"));
  c.n_head = static_cast<int>(a.get_int(".attention.head_count"));
  if (c.n_layer <= 0 || c.n_embd <= 0 || c.n_head <= 0) fail("gemma4: invalid model shape");
  const int L = c.n_layer;
  const auto swa = a.get_per_layer_int(".attention.sliding_window_pattern", L, std::nullopt);
  const auto kv_heads = a.get_per_layer_int(".attention.head_count_kv", L, c.n_head);
  const int dim_full = static_cast<int>(a.get_int(".attention.key_length"));
  const int dim_swa = static_cast<int>(a.get_int(".attention.key_length_swa"));
  if (a.get_int_or(".attention.value_length", dim_full) != dim_full ||
      a.get_int_or(".attention.value_length_swa", dim_swa) != dim_swa) {
    fail("gemma4: key and value head sizes must be equal");
  }
  if (a.get_int_or(".attention.shared_kv_layers", 0) != 0) fail("gemma4: layers that share another layer's KV cache are not supported");
  if (a.get_int_or(".embedding_length_per_layer_input", 0) != 0) {
    fail("gemma4: per-layer input embeddings (Gemma 4 E2B/E4B) are not supported; bmoe runs the MoE variants");
  }
  const int window = static_cast<int>(a.get_int(".attention.sliding_window"));
  c.n_ctx_train = static_cast<int>(a.get_int_or(".context_length", 131072));
  c.norm_eps = static_cast<float>(a.get_float_or(".attention.layer_norm_rms_epsilon", 1e-6));
  c.n_expert = static_cast<int>(a.get_int_or(".expert_count", 0));
  c.n_expert_used = static_cast<int>(a.get_int_or(".expert_used_count", 0));
  c.n_ff_exp = static_cast<int>(a.get_int_or(".expert_feed_forward_length", 0));
  c.final_softcap = static_cast<float>(a.get_float_or(".final_logit_softcapping", 0.0));
  c.attn_softcap = static_cast<float>(a.get_float_or(".attn_logit_softcapping", 0.0));

  RopeConfig full;
  full.style = RopeStyle::NeoX;
  full.freq_base = static_cast<float>(a.get_float_or(".rope.freq_base", 10000.0));
  full.n_rot = static_cast<int>(a.get_int_or(".rope.dimension_count", dim_full));
  full.n_ctx_orig = c.n_ctx_train;
  RopeConfig sliding = full;
  sliding.freq_base = static_cast<float>(a.get_float_or(".rope.freq_base_swa", 10000.0));
  sliding.n_rot = static_cast<int>(a.get_int_or(".rope.dimension_count_swa", full.n_rot));

  c.head_dim = dim_full;
  c.head_dim_v = dim_full;
  c.n_head_kv = static_cast<int>(kv_heads[0]);
  c.rope = full;
  for (int l = 0; l < L; ++l) {
    const bool is_swa = swa[static_cast<size_t>(l)] != 0;
    const int hkv = static_cast<int>(kv_heads[static_cast<size_t>(l)]);
    if (hkv <= 0 || c.n_head % hkv != 0) fail("gemma4: layer {} has {} kv heads for {} heads", l, hkv, c.n_head);
    c.layer_n_head_kv.push_back(hkv);
    c.layer_head_dim.push_back(is_swa ? dim_swa : dim_full);
    c.layer_rope.push_back(is_swa ? sliding : full);
    c.sliding_window.push_back(is_swa ? window : 0);
  }
  if (c.n_expert > 0 && (c.n_expert_used <= 0 || c.n_expert_used > c.n_expert)) {
    fail("invalid expert routing: {} of {} experts", c.n_expert_used, c.n_expert);
  }
}

}  // namespace

void load_gemma4(ArchLoader& a, ModelConfig& c, ModelWeights& w) {
  load_gemma4_hparams(a, c);
  c.qk_norm_per_head = true;
  c.v_rms_norm = true;
  c.attn_scale = 1.0f;  // q and k are normalised; Gemma 4 applies no 1/sqrt(d)
  c.gating = Gating::SoftmaxTopK;
  c.norm_topk = true;
  c.activation = ExpertActivation::GeGLU;
  c.dense_activation = ExpertActivation::GeGLU;
  c.n_vocab = static_cast<int>(a.tensor_dim("token_embd.weight", 1));
  load_common_io(a, c, w);
  w.embd_scale = std::sqrt(static_cast<float>(c.n_embd));

  const int64_t E = c.n_embd, NE = c.n_expert, F = c.n_ff_exp;
  const auto n_ff = a.get_per_layer_int(".feed_forward_length", c.n_layer, std::nullopt);
  const bool any_full = std::find(c.sliding_window.begin(), c.sliding_window.end(), 0) != c.sliding_window.end();
  Vector rope_freqs;
  if (any_full) rope_freqs = a.optional_vector("rope_freqs.weight", {c.head_dim / 2});
  w.layers.resize(static_cast<size_t>(c.n_layer));
  for (int l = 0; l < c.n_layer; ++l) {
    LayerWeights& L = w.layers[static_cast<size_t>(l)];
    auto name = [l](const char* suffix) { return fmt::format("blk.{}.{}", l, suffix); };
    const int64_t d = c.head_dim_at(l), q_width = c.n_head * d, kv_width = c.n_head_kv_at(l) * d;
    L.attn_norm = a.vector(name("attn_norm.weight"), {E});
    L.wq = a.matrix(name("attn_q.weight"), {E, q_width});
    L.wk = a.matrix(name("attn_k.weight"), {E, kv_width});
    L.wv = a.optional_matrix(name("attn_v.weight"), {E, kv_width});  // absent: values = keys
    L.wo = a.matrix(name("attn_output.weight"), {q_width, E});
    L.q_norm = a.vector(name("attn_q_norm.weight"), {d});
    L.k_norm = a.vector(name("attn_k_norm.weight"), {d});
    L.post_attn_norm = a.vector(name("post_attention_norm.weight"), {E});
    if (c.sliding_window[static_cast<size_t>(l)] == 0) L.rope_freqs = rope_freqs;
    L.out_scale = a.optional_vector(name("layer_output_scale.weight"), {1});

    const int64_t FF = n_ff[static_cast<size_t>(l)];
    L.ffn_norm = a.vector(name("ffn_norm.weight"), {E});
    L.ffn_gate = a.matrix(name("ffn_gate.weight"), {E, FF});
    L.ffn_up = a.matrix(name("ffn_up.weight"), {E, FF});
    L.ffn_down = a.matrix(name("ffn_down.weight"), {FF, E});
    L.post_ffn_norm = a.vector(name("post_ffw_norm.weight"), {E});
    if (!a.has_tensor(name("ffn_gate_inp.weight"))) continue;  // a dense layer

    if (NE == 0 || F == 0) fail("gemma4: layer {} has a router but the expert count or size is missing", l);
    L.has_experts = true;
    L.router = a.matrix(name("ffn_gate_inp.weight"), {E, NE});
    L.router_in_scale = a.vector(name("ffn_gate_inp.scale"), {E});
    L.moe_norm = a.vector(name("pre_ffw_norm_2.weight"), {E});
    L.post_dense_norm = a.vector(name("post_ffw_norm_1.weight"), {E});
    L.post_moe_norm = a.vector(name("post_ffw_norm_2.weight"), {E});
    if (a.has_tensor(name("ffn_gate_up_exps.weight"))) {
      L.roles.gate_up = a.expert_matrix(l, name("ffn_gate_up_exps.weight"), {E, 2 * F, NE});
    } else {
      L.roles.gate = a.expert_matrix(l, name("ffn_gate_exps.weight"), {E, F, NE});
      L.roles.up = a.expert_matrix(l, name("ffn_up_exps.weight"), {E, F, NE});
    }
    L.roles.down = a.expert_matrix(l, name("ffn_down_exps.weight"), {F, E, NE});
    L.exp_down_scale = a.optional_vector(name("ffn_down_exps.scale"), {NE});
  }
}

}  // namespace bmoe
