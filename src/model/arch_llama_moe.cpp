// llama-architecture MoE (Mixtral): GQA attention, adjacent-pair ("normal") RoPE, routed experts
// (softmax, top-k, weights renormalised). Dense llama layers (no expert_count) are rejected:
// bmoe runs MoE models.
#include <fmt/format.h>

#include "core/error.h"
#include "model/arch.h"

namespace bmoe {

void load_llama_moe(ArchLoader& a, ModelConfig& c, ModelWeights& w) {
  load_common_hparams(a, c);
  if (c.n_expert == 0) fail("llama: this is a dense model (no expert_count); bmoe runs Mixture-of-Experts models");
  c.rope.style = RopeStyle::Normal;
  c.gating = Gating::SoftmaxTopK;
  c.norm_topk = true;
  c.n_vocab = static_cast<int>(a.tensor_dim("token_embd.weight", 1));
  load_common_io(a, c, w);
  const int64_t E = c.n_embd, q_width = int64_t{c.n_head} * c.head_dim, kv_width = int64_t{c.n_head_kv} * c.head_dim;
  const int64_t NE = c.n_expert;
  if (!a.has_tensor("blk.0.ffn_gate_exps.weight") && a.has_tensor("blk.0.ffn_gate.0.weight")) {
    fail("llama: experts stored one tensor per expert (blk.N.ffn_gate.E.weight) are not supported; "
         "convert the model with a current llama.cpp (merged *_exps tensors)");
  }
  const int64_t F = c.n_ff_exp > 0 ? c.n_ff_exp : a.tensor_dim("blk.0.ffn_gate_exps.weight", 1);
  w.layers.resize(static_cast<size_t>(c.n_layer));
  for (int l = 0; l < c.n_layer; ++l) {
    LayerWeights& L = w.layers[static_cast<size_t>(l)];
    auto name = [l](const char* suffix) { return fmt::format("blk.{}.{}", l, suffix); };
    L.attn_norm = a.vector(name("attn_norm.weight"), {E});
    L.wq = a.matrix(name("attn_q.weight"), {E, q_width});
    L.wk = a.matrix(name("attn_k.weight"), {E, kv_width});
    L.wv = a.matrix(name("attn_v.weight"), {E, kv_width});
    L.bq = a.optional_vector(name("attn_q.bias"), {q_width});
    L.bk = a.optional_vector(name("attn_k.bias"), {kv_width});
    L.bv = a.optional_vector(name("attn_v.bias"), {kv_width});
    L.wo = a.matrix(name("attn_output.weight"), {q_width, E});
    L.bo = a.optional_vector(name("attn_output.bias"), {E});
    L.ffn_norm = a.vector(name("ffn_norm.weight"), {E});
    L.has_experts = true;
    L.router = a.matrix(name("ffn_gate_inp.weight"), {E, NE});
    L.roles.gate = a.expert_matrix(l, name("ffn_gate_exps.weight"), {E, F, NE});
    L.roles.up = a.expert_matrix(l, name("ffn_up_exps.weight"), {E, F, NE});
    L.roles.down = a.expert_matrix(l, name("ffn_down_exps.weight"), {F, E, NE});
  }
}

}  // namespace bmoe
