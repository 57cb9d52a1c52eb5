// gpt-oss (20b, 120b): attention with q/k/v/o biases and per-head sink logits, alternating
// sliding-window (even layers) and full attention, YaRN-scaled NeoX RoPE; routed experts with
// a router bias, top-k over the logits then a softmax over the k, per-expert biases, and the
// clamped SwiGLU variant (x * sigmoid(1.702 x) * (up + 1)).
#include <fmt/format.h>

#include "core/error.h"
#include "model/arch.h"

namespace bmoe {

void load_gpt_oss(ArchLoader& a, ModelConfig& c, ModelWeights& w) {
  load_common_hparams(a, c);
  if (c.n_expert == 0) fail("gpt-oss: expert_count must be > 0");
  c.rope.style = RopeStyle::NeoX;
  c.gating = Gating::TopKSoftmax;
  c.norm_topk = false;
  c.activation = ExpertActivation::SwiGLU_OAI;
  c.n_vocab = static_cast<int>(a.tensor_dim("token_embd.weight", 1));
  const int window = static_cast<int>(a.get_int(".attention.sliding_window"));
  const int period = static_cast<int>(a.get_int_or(".attention.sliding_window_pattern", 2));
  c.sliding_window.assign(static_cast<size_t>(c.n_layer), 0);
  for (int l = 0; l < c.n_layer; ++l) {
    if (period == 0 || l % period < period - 1) c.sliding_window[static_cast<size_t>(l)] = window;
  }
  load_common_io(a, c, w);
  const int64_t E = c.n_embd, q_width = int64_t{c.n_head} * c.head_dim, kv_width = int64_t{c.n_head_kv} * c.head_dim;
  const int64_t NE = c.n_expert;
  const int64_t F = c.n_ff_exp > 0 ? c.n_ff_exp : a.tensor_dim("blk.0.ffn_gate_exps.weight", 1);
  w.layers.resize(static_cast<size_t>(c.n_layer));
  for (int l = 0; l < c.n_layer; ++l) {
    LayerWeights& L = w.layers[static_cast<size_t>(l)];
    auto name = [l](const char* suffix) { return fmt::format("blk.{}.{}", l, suffix); };
    L.attn_norm = a.vector(name("attn_norm.weight"), {E});
    L.wq = a.matrix(name("attn_q.weight"), {E, q_width});
    L.wk = a.matrix(name("attn_k.weight"), {E, kv_width});
    L.wv = a.matrix(name("attn_v.weight"), {E, kv_width});
    L.bq = a.vector(name("attn_q.bias"), {q_width});
    L.bk = a.vector(name("attn_k.bias"), {kv_width});
    L.bv = a.vector(name("attn_v.bias"), {kv_width});
    L.wo = a.matrix(name("attn_output.weight"), {q_width, E});
    L.bo = a.vector(name("attn_output.bias"), {E});
    L.attn_sinks = a.vector(name("attn_sinks.weight"), {c.n_head});
    L.ffn_norm = a.vector(name("post_attention_norm.weight"), {E});
    L.has_experts = true;
    L.router = a.matrix(name("ffn_gate_inp.weight"), {E, NE});
    L.router_bias = a.vector(name("ffn_gate_inp.bias"), {NE});
    L.roles.gate = a.expert_matrix(l, name("ffn_gate_exps.weight"), {E, F, NE});
    L.roles.up = a.expert_matrix(l, name("ffn_up_exps.weight"), {E, F, NE});
    L.roles.down = a.expert_matrix(l, name("ffn_down_exps.weight"), {F, E, NE});
    L.exp_gate_bias = a.vector(name("ffn_gate_exps.bias"), {F, NE});
    L.exp_up_bias = a.vector(name("ffn_up_exps.bias"), {F, NE});
    L.exp_down_bias = a.vector(name("ffn_down_exps.bias"), {E, NE});
  }
}

}  // namespace bmoe
