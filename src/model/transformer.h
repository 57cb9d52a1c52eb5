// The decoder shared by every MoE family: attention with a KV cache, then a routed-expert FFN
// (optionally with a shared expert or dense FFN layers). Architecture files fill the weights
// and the config; this file holds the forward pass.
#pragma once

#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <span>
#include <vector>

#include "core/thread_pool.h"
#include "model/attention.h"
#include "model/config.h"
#include "model/delta_net.h"
#include "model/matmul.h"
#include "moe/expert_source.h"
#include "moe/router_hook.h"  // RoutingOptions, RouterHook
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

struct LayerWeights {
  Vector attn_norm;
  Weight wq, wk, wv, wo;
  Vector bq, bk, bv, bo;
  Vector q_norm, k_norm;
  Vector attn_sinks;
  Vector post_attn_norm;  // applied to the attention output before the residual (gemma)
  Vector rope_freqs;      // per-pair RoPE frequency factors, or empty (gemma4 full layers)

  Vector ffn_norm;
  Vector post_ffn_norm;
  // Routed experts.
  bool has_experts = false;
  Weight router;       // [n_expert rows x n_embd]
  Vector router_bias;  // per expert, added to the logits
  Vector exp_gate_bias, exp_up_bias, exp_down_bias;  // [n_expert * n] (gpt-oss)
  ExpertRoles roles;
  Vector exp_down_scale;  // per expert, multiplies its down projection (gemma4)
  // Shared expert (qwen2moe) with its sigmoid gate, or a dense FFN (non-MoE layers).
  Weight shexp_gate, shexp_up, shexp_down, shexp_router;
  Weight ffn_gate, ffn_up, ffn_down;

  // Gemma 4 MoE layers run a dense FFN and the routed experts side by side, each with its own
  // norms; the router reads the RMS-normalised residual scaled by router_in_scale / sqrt(n_embd).
  Vector moe_norm;          // pre-norm of the expert branch (the dense branch uses ffn_norm)
  Vector post_dense_norm;   // post-norm of the dense branch
  Vector post_moe_norm;     // post-norm of the expert branch
  Vector router_in_scale;
  Vector out_scale;         // one value multiplying the layer's output, or empty

  // Gated DeltaNet (linear attention) layers of hybrid models (qwen35moe).
  Weight ssm_qkv;    // x -> q | k | v before the convolution
  Weight ssm_z;      // x -> the output gate z
  Weight ssm_alpha;  // x -> per value head decay input
  Weight ssm_beta;   // x -> per value head update strength
  Weight ssm_out;    // gated, normalised heads -> n_embd
  Vector ssm_conv;   // depthwise kernel, [conv_kernel][channels] (transposed from the file at load)
  Vector ssm_dt;     // per value head bias of the decay input
  Vector ssm_a;      // per value head -exp(A_log), negative
  Vector ssm_norm;   // [head_dim] weight of the gated RMS norm

  // Short-convolution layers (lfm2moe): x -> b | c | x', out = W (c * conv(b * x')).
  Weight shortconv_in, shortconv_out;
  Vector shortconv_kernel;  // [taps][n_embd] (transposed from the file at load)
  Vector expert_select_bias;  // per expert, added to the gate scores for the choice only (lfm2moe)
};

struct ModelWeights {
  Weight tok_embd;
  float embd_scale = 1.0f;
  Vector rope_freqs;  // per-pair RoPE frequency factors of the full layers (gemma4), or empty
  Vector output_norm;
  Weight output;
  std::vector<LayerWeights> layers;
};

// Observes (and may replace) each routing decision: used for route traces and replay.
struct RouteEvent {
  int layer = 0;
  int position = 0;     // token position in the sequence
  bool prefill = false; // part of the prompt (set by the caller with set_prefill)
  const float* logits = nullptr;  // router logits, n_expert values
  int n_expert = 0;
  std::vector<int32_t>* experts;  // selected ids, slot order
  std::vector<float>* weights;    // their weights, same order
};
using RouteHook = std::function<void(RouteEvent&)>;

class Transformer {
 public:
  Transformer(ModelConfig config, ModelWeights weights, ExpertSource* experts);

  const ModelConfig& config() const { return config_; }
  ExpertSource& experts() { return *experts_; }
  void set_experts(ExpertSource* experts) { experts_ = experts; }
  const ModelWeights& weights() const { return weights_; }

 private:
  friend class InferenceState;
  ModelConfig config_;
  ModelWeights weights_;
  ExpertSource* experts_;
};

// Activations converted once per activation format for a block of matmuls that read the same
// rows (q, k and v; the gate and up projections of many experts). reset() forgets the
// conversions but keeps their buffers for the next block.
class Activations {
 public:
  const ActivationBuffer& get(ThreadPool& pool, TensorType weight_type, const float* x, int64_t n, int64_t cols);
  void reset() { used_ = 0; }

 private:
  struct Entry {
    const float* source = nullptr;
    ActivationBuffer buffer;
  };
  std::deque<Entry> entries_;  // a deque: get() hands out references that must survive later gets
  size_t used_ = 0;
};

// Per-sequence state: KV cache, position, scratch buffers. Routing-time decisions beyond the
// model's own gating (prefetch, route-ahead, drop-cold) are its RouterHook's; the state offers
// the hook its routers (ResidualRouter).
class InferenceState : private ResidualRouter {
 public:
  InferenceState(Transformer& model, ThreadPool& pool, int n_ctx, KvType kv_type = KvType::F16);

  // Runs tokens at positions [n_past, n_past + n). Returns logits of the last token, or of
  // every token when all_logits (row i = token i).
  const std::vector<float>& eval(const int32_t* tokens, int n, bool all_logits = false);

  int n_past() const { return n_past_; }
  int n_ctx() const { return cache_.capacity(); }
  // Forgets positions >= n (prefix reuse keeps the cache rows below n). A recurrent state
  // cannot forget: it goes back to the state saved at the start of the last multi-token
  // eval() (or to the empty state) and runs the tokens from there to n again, each row on the
  // attention path it first took, which gives the state those tokens gave the first time.
  // truncate(n_past()) also repairs a state that a failed eval() left half updated.
  void truncate(int n);
  size_t recurrent_bytes() const { return recurrent_.bytes(); }
  void set_route_hook(RouteHook hook) { route_hook_ = std::move(hook); }
  // Called after each layer of each eval() with the layer just done (progress of long batches).
  void set_layer_hook(std::function<void(int layer)> hook) { layer_hook_ = std::move(hook); }
  // Whether the next eval() calls process prompt tokens (reported to the route hook).
  void set_prefill(bool prefill) { prefill_ = prefill; }
  size_t kv_bytes() const { return cache_.bytes(); }
  // The hook that makes the routing-time decisions (Session installs a RoutingPolicy); without
  // one the model routes by its gating alone.
  void set_router_hook(std::unique_ptr<RouterHook> hook) { router_hook_ = std::move(hook); }
  // The router hook's options; setting any but the defaults needs a hook.
  void set_routing_options(const RoutingOptions& options);
  const RoutingOptions& routing_options() const;
  // Experts skipped by drop_cold so far.
  uint64_t dropped_experts() const { return router_hook_ ? router_hook_->dropped_experts() : 0; }

 private:
  void attention_block(int layer, int n);
  void delta_net_block(int layer, int n);
  void short_conv_block(int layer, int n);
  void replay(int start, int end);
  // The q projection of gated attention holds [query | gate] per head: split it in place.
  void split_query_gate(int n, int n_head, int head_dim);
  void ffn_block(int layer, int n);
  // Experts of `layer` on inputs h, routed by the router applied to router_in.
  void routed_experts(int layer, int n, const float* h, const float* router_in, float* out);
  void parallel_ffn(int layer, int n);
  void dense_ffn(const Weight& gate, const Weight& up, const Weight& down, int n, const float* h, float* out);

  // Routing (routed_experts' first half): routes_ for each token of the pass.
  void route_tokens(int layer, int n, const float* router_in);
  void report_route(int layer, int token, const float* logits);
  // The model's gating of one token: logits (bias added in place) -> ids and weights.
  void gate(const LayerWeights& L, float* logits, std::vector<int32_t>& ids, std::vector<float>& wts) const;
  // What the router of `layer` reads, computed from a residual row (for prediction).
  void router_input(int layer, const float* x, float* out) const;
  // ResidualRouter: the router hook scores later layers' routers on the residual x_.
  int layers() const override { return cfg_.n_layer; }
  bool has_router(int layer) const override;
  void route_residual(int layer, std::span<TokenRoute> rows) override;

  // Expert compute (routed_experts' second half), on the experts the source hands out.
  struct ExpertUses;
  struct ExpertGroup;
  ExpertUses group_by_expert(int n) const;
  void compute_ready_experts(int layer, int n, const float* h, const ExpertUses& uses, float* slot_out);
  void compute_group(int layer, int n, const float* h, const ExpertUses& uses, std::span<const int> ready,
                     float* slot_out);
  void expert_gate_up(const LayerWeights& L, int n, const float* h, ExpertGroup& group);
  void expert_activation(const LayerWeights& L, const ExpertUses& uses, ExpertGroup& group);
  void expert_down(const LayerWeights& L, const ExpertUses& uses, const ExpertGroup& group, float* slot_out);
  void sum_slots(int n, int max_slots, const float* slot_out, float* out) const;

  Transformer& model_;
  const ModelConfig& cfg_;
  ThreadPool& pool_;
  KvCache cache_;
  int n_past_ = 0;
  bool prefill_ = false;
  RouteHook route_hook_;
  std::function<void(int)> layer_hook_;

  // Recurrent layers (Gated DeltaNet, short convolutions): the live state, the one saved at the
  // start of the last multi-token eval (at checkpoint_pos_; -1: none), the tokens at positions
  // [0, n_past) with the attention path each took, to run again after a rewind; dirty after an
  // eval that failed part-way without a copy to go back to.
  RecurrentState recurrent_;
  RecurrentState checkpoint_;
  int checkpoint_pos_ = -1;
  std::vector<int32_t> tokens_;
  std::vector<uint8_t> token_batch_path_;
  bool recurrent_dirty_ = false;
  bool replay_batch_path_ = false;  // set while replay() runs rows that first took the batch path

  // Scratch, sized for the current batch.
  std::vector<float> x_, h_, q_, k_, v_, attn_, proj_, ffn_out_, logits_;
  std::vector<int> positions_;
  ActivationBuffer act_a_, act_b_, act_c_;
  Activations acts_;
  std::vector<float> slot_out_, expert_gate_, expert_up_, expert_act_, expert_fused_, expert_down_;
  std::vector<float> dense_gate_, dense_up_, dense_act_, shared_out_, shared_gate_;
  std::vector<float> dense_in_, moe_in_, router_in_, moe_out_;
  std::vector<float> attn_gate_, dn_mixed_, dn_z_, dn_beta_, dn_alpha_, dn_conv_, dn_out_;
  // Routing of the current layer: per token, its experts and weights in slot order.
  std::vector<TokenRoute> routes_;
  std::vector<float> router_logits_;
  std::vector<float> residual_router_in_, residual_router_logits_;  // route_residual's scratch

  std::unique_ptr<RouterHook> router_hook_;
};

}  // namespace bmoe
