// Qwen3-MoE: GQA attention with per-head RMS-normed q and k, NeoX RoPE, and an MoE FFN in
// every layer (softmax router over all experts, top-k, weights renormalised to sum to 1).
#include <fmt/format.h>

#include "core/error.h"
#include "model/arch.h"

namespace bmoe {

void load_qwen3moe(ArchLoader& a, ModelConfig& c, ModelWeights& w) {
  load_common_hparams(a, c);
  if (c.n_expert == 0) fail("qwen3moe: expert_count must be > 0");
  c.rope.style = RopeStyle::NeoX;
  c.qk_norm_per_head = true;
  c.gating = Gating::SoftmaxTopK;
  c.norm_topk = true;
  c.activation = ExpertActivation::SwiGLU;
  c.n_vocab = static_cast<int>(a.tensor_dim("token_embd.weight", 1));
  if (c.n_ff_exp == 0) fail("qwen3moe: missing required key 'qwen3moe.expert_feed_forward_length'");
  load_common_io(a, c, w);

  const int64_t E = c.n_embd, q_width = int64_t{c.n_head} * c.head_dim, kv_width = int64_t{c.n_head_kv} * c.head_dim;
  const int64_t F = c.n_ff_exp, NE = c.n_expert;
  w.layers.resize(static_cast<size_t>(c.n_layer));
  for (int l = 0; l < c.n_layer; ++l) {
    LayerWeights& L = w.layers[static_cast<size_t>(l)];
    auto name = [l](const char* suffix) { return fmt::format("blk.{}.{}", l, suffix); };
    L.attn_norm = a.vector(name("attn_norm.weight"), {E});
    L.wq = a.matrix(name("attn_q.weight"), {E, q_width});
    L.wk = a.matrix(name("attn_k.weight"), {E, kv_width});
    L.wv = a.matrix(name("attn_v.weight"), {E, int64_t{c.n_head_kv} * c.head_dim_v});
    L.wo = a.matrix(name("attn_output.weight"), {int64_t{c.n_head} * c.head_dim_v, E});
    L.q_norm = a.vector(name("attn_q_norm.weight"), {c.head_dim});
    L.k_norm = a.vector(name("attn_k_norm.weight"), {c.head_dim});
    L.ffn_norm = a.vector(name("ffn_norm.weight"), {E});
    L.has_experts = true;
    L.router = a.matrix(name("ffn_gate_inp.weight"), {E, NE});
    L.roles.gate = a.expert_matrix(l, name("ffn_gate_exps.weight"), {E, F, NE});
    L.roles.up = a.expert_matrix(l, name("ffn_up_exps.weight"), {E, F, NE});
    L.roles.down = a.expert_matrix(l, name("ffn_down_exps.weight"), {F, E, NE});
  }
}

}  // namespace bmoe
