// Hyperparameters of a MoE decoder, filled by each architecture from its GGUF keys.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace bmoe {

enum class RopeStyle { Normal, NeoX };  // adjacent pairs vs. split halves

// How router logits become expert weights.
enum class Gating {
  SoftmaxTopK,      // softmax over all experts, pick top-k of the probabilities
  TopKSoftmax,      // pick top-k logits, softmax over the k (gpt-oss)
  SigmoidTopK,
  SqrtSoftplusTopK,  // sqrt(softplus(logit)) scores, top-k of the (bias-steered) scores (deepseek4)
};

enum class ExpertActivation { SwiGLU, SwiGLU_OAI, GeGLU };

// What mixes tokens in a layer: the kinds of src/model/mixers.h.
enum class MixerKind : uint8_t {
  Attention,       // causal attention over a KV cache
  GatedAttention,  // attention whose q projection also holds a per-head output gate (qwen35moe)
  GatedDeltaNet,   // linear attention with a recurrent state (qwen35moe)
  ShortConv,       // gated short convolution with a recurrent state (lfm2moe)
  KimiDelta,       // Kimi Delta Attention: gated delta rule with a per-channel decay (bailingmoe3)
  LatentAttention, // multi-head latent attention: a compressed KV latent is cached (bailingmoe3)
  CompressedAttention,  // one K=V head over a raw window plus compressed history rows (deepseek4)
};

// What runs on each token after the mixer: the kinds of src/model/ffn.h.
enum class FfnKind : uint8_t {
  Dense,             // one dense FFN
  Moe,               // routed experts
  MoeShared,         // routed experts plus a gated shared expert (qwen2moe, qwen35moe)
  MoeUngatedShared,  // routed experts plus a shared expert added as it is (glm4moe)
  ParallelDenseMoe,  // a dense FFN and routed experts side by side, each with its norms (gemma4)
};

// How the attention kinds normalise q and k (weights attn_q_norm, attn_k_norm).
enum class QkNorm : uint8_t {
  None,
  PerHead,  // each head RMS-normed with a head_dim weight (qwen3, glm4moe, gemma4, ...)
  Full,     // RMS-normed over all heads at once (olmoe)
};

// The norms of a layer besides the two every layer has (attn_norm before its mixer, ffn_norm
// before its FFN; the FFN and mixer kinds' own inner norms are theirs). The forward pass runs
// what the plan declares; the loader checks the file holds the weights of exactly these.
struct LayerNorms {
  QkNorm qk = QkNorm::None;  // attention kinds
  bool v = false;            // attention kinds: each value head RMS-normed without a weight (gemma4)
  bool post_mixer = false;   // attention kinds: their output normed before the residual add (gemma4)
  bool post_ffn = false;     // the FFN's output normed before the residual add (gemma4)
  // The layer's output (the residual after the FFN's add) times the layer's one-float weight
  // layer_output_scale (gemma4, in the layers whose file holds it: optional there as in llama.cpp).
  bool output_scale = false;
};

// A layer as its family declares it: the forward pass runs the plan, it does not infer the
// layer's kinds or norms from which tensors the file holds.
struct LayerPlan {
  MixerKind mixer = MixerKind::Attention;
  FfnKind ffn = FfnKind::Moe;
  LayerNorms norms;
};

struct RopeConfig {
  float freq_base = 10000.0f;
  float freq_scale = 1.0f;
  int n_rot = 0;  // rotated dimensions per head
  RopeStyle style = RopeStyle::NeoX;
  // YaRN
  float ext_factor = 0.0f;
  float attn_factor = 1.0f;
  float beta_fast = 32.0f;
  float beta_slow = 1.0f;
  int n_ctx_orig = 0;
};

struct ModelConfig {
  std::string arch;
  std::string name;
  int n_layer = 0;       // the trunk: the blocks the forward pass runs
  // MTP (nextn) blocks stored after the trunk (glm4moe, qwen35moe): checked at load, bound and
  // run as the MTP head (model/nextn_head.h) only when the loader asks for them (--mtp).
  int n_nextn_layer = 0;
  int n_embd = 0;
  int n_head = 0;
  int n_head_kv = 0;
  int head_dim = 0;    // key/query head size
  int head_dim_v = 0;  // value head size
  int n_vocab = 0;
  int n_ctx_train = 0;
  float norm_eps = 1e-6f;

  // Per layer, its mixer and FFN kinds (every family fills it, one entry per layer). Hybrid
  // models mix attention with layers that keep a recurrent state instead of KV rows.
  std::vector<LayerPlan> plan;
  // The kinds of the MTP blocks: a decoder block of the family's attention and FFN (Qwen3.5's is
  // a gated-attention block even where the last trunk layer is a Gated DeltaNet one).
  LayerPlan nextn_plan;

  // The routed experts' geometry: every family here is a MoE (the engine, the expert sources and
  // the streaming cache read these); how a token is routed is the MoE FFN kinds' (moe below).
  int n_expert = 0;
  int n_expert_used = 0;
  int n_ff_exp = 0;

  RopeConfig rope;

  // What only some layer kinds read; a family sets those of the kinds its plan uses.
  // The attention kinds' (Attention, GatedAttention; CompressedAttention reads the window).
  struct Attention {
    float scale = 0.0f;  // 0: 1/sqrt(head_dim)
    float softcap = 0.0f;
    std::vector<int> sliding_window;  // per layer; 0 = full attention; empty: all full
    // Per-layer geometry where it varies (gemma4: sliding layers have more, smaller kv heads
    // and their own RoPE). Empty: every layer uses the model's scalars.
    std::vector<int> layer_n_head_kv;
    std::vector<int> layer_head_dim;  // key and value head size
    std::vector<RopeConfig> layer_rope;
  } attention;
  struct DeltaNet {
    int conv_kernel = 0;  // causal depthwise convolution width
    int head_dim = 0;     // key and value head size (the state is head_dim x head_dim per value head)
    int k_heads = 0;      // query/key heads; value head h reads key head h % k_heads
    int v_heads = 0;
    int key_dim() const { return k_heads * head_dim; }
    int value_dim() const { return v_heads * head_dim; }
    int conv_channels() const { return 2 * key_dim() + value_dim(); }  // q | k | v
  } delta_net;
  struct ShortConv {
    int kernel = 0;  // taps of the short convolution (lfm2moe)
  } short_conv;
  struct KimiDelta {
    int conv_kernel = 0;  // taps of the q, k and v short convolutions
    int head_dim = 0;     // key and value head size; the heads are n_head
    float gate_lower_bound = 0.0f;  // the per-channel log-decay lies in (gate_lower_bound, 0)
    int inner(int n_head) const { return n_head * head_dim; }
  } kda;
  struct LatentAttention {
    int q_lora_rank = 0;   // 0: a plain q projection
    int kv_lora_rank = 0;  // width of the cached latent
    int qk_nope = 0;       // per-head query/key dims without RoPE
    int qk_rope = 0;       // the decoupled RoPE dims (one key part shared by the heads)
    int v_head_dim = 0;
    int qk_head_dim() const { return qk_nope + qk_rope; }
    int cache_row() const { return kv_lora_rank + qk_rope; }  // latent | roped key
  } mla;
  // Per layer SwiGLU limits of one FFN kind (empty or <= 1e-6: no clamp); the limit applies to
  // the gate before the SiLU (deepseek4) or to the SiLU's output (bailingmoe3).
  struct SwigluClamp {
    std::vector<float> layer_limit;
    bool gate_before_silu = false;
    float at(int l) const { return layer_limit.empty() ? 0.0f : layer_limit[static_cast<size_t>(l)]; }
  };
  // The routed-MoE FFN kinds: how the router's logits become experts and weights, and the
  // experts' activation.
  struct Moe {
    Gating gating = Gating::SoftmaxTopK;
    bool norm_topk = true;  // renormalise the k selected weights to sum to 1
    // Group-limited routing (bailingmoe3): the experts split into n_groups consecutive groups,
    // only the n_group_used best (by the sum of each group's two best scores) compete.
    int n_groups = 0;  // 0 or 1: off
    int n_group_used = 0;
    float weights_scale = 0.0f;  // 0 or 1: none
    int n_hash_layers = 0;       // layers [0, n_hash_layers) route by token id through a table (deepseek4)
    ExpertActivation activation = ExpertActivation::SwiGLU;
    SwigluClamp clamp;  // the routed experts'
  } moe;
  struct SharedExpert {
    int n_ff = 0;               // width (qwen2moe, qwen35moe)
    bool gate_sigmoid = false;  // its gate: sigmoid (else silu(x)/x, qwen2moe's form)
    bool ungated = false;       // no gate: the shared expert's output is added as is (bailingmoe3)
  } shared_expert;
  struct DenseFfn {
    std::vector<int> layer_n_ff;  // per layer: width (dense and dense-beside-MoE layers)
    ExpertActivation activation = ExpertActivation::SwiGLU;  // also the shared expert's
    SwigluClamp clamp;  // that of every SwiGLU FFN of a layer but the routed experts (dense, shared expert)
  } dense;
  // DeepSeek-V4's attention (MixerKind::CompressedAttention): a low-rank query, one K=V head of
  // head_dim whose last n_rot dims rotate, a grouped low-rank output, and per layer a compression
  // ratio: 0 (raw window only), 4 (rows of 4 tokens picked by the lightning indexer) or 128.
  struct CompressedAttention {
    int q_lora_rank = 0;
    int o_groups = 0;        // the output projection's groups (consecutive heads)
    int o_lora_rank = 0;     // per group
    int indexer_heads = 0;
    int indexer_head_dim = 0;
    int indexer_top_k = 0;   // compressed rows kept per query on ratio-4 layers
    std::vector<int> ratio;  // per layer: 0, 4 or 128
    RopeConfig rope;         // the compressed layers', their rows' and the indexer's RoPE
    int ratio_at(int l) const { return ratio.empty() ? 0 : ratio[static_cast<size_t>(l)]; }
  } csa;
  // Hyper-connections (deepseek4): streams > 1 keeps that many residual streams per token, mixed
  // around each sublayer by learned, Sinkhorn-normalised weights.
  struct HyperConnections {
    int streams = 0;
    int sinkhorn_iters = 0;
    float eps = 0.0f;
  } hc;
  // The output head's (gemma4): logits = softcap * tanh(logits / softcap); 0: none.
  struct Output {
    float softcap = 0.0f;
  } output;

  int sliding_at(int l) const {
    return attention.sliding_window.empty() ? 0 : attention.sliding_window[static_cast<size_t>(l)];
  }
  MixerKind mixer_at(int l) const { return plan[static_cast<size_t>(l)].mixer; }
  FfnKind ffn_at(int l) const { return plan[static_cast<size_t>(l)].ffn; }
  bool attends(int l) const {
    const MixerKind k = mixer_at(l);
    return k == MixerKind::Attention || k == MixerKind::GatedAttention || k == MixerKind::LatentAttention ||
           k == MixerKind::CompressedAttention;
  }
  bool is_recurrent(int l) const { return !attends(l); }
  bool has_recurrent_layers() const {
    for (int l = 0; l < n_layer; ++l) {
      if (is_recurrent(l)) return true;
    }
    return false;
  }
  bool has_experts_at(int l) const { return ffn_at(l) != FfnKind::Dense; }
  const LayerNorms& norms_at(int l) const { return plan[static_cast<size_t>(l)].norms; }
  // Every layer of the same kinds (the families without per-layer choices).
  void plan_every_layer(MixerKind mixer, FfnKind ffn) { plan.assign(static_cast<size_t>(n_layer), {mixer, ffn}); }
  // The same norms on every layer of the plan and on the MTP block (set after both): those of
  // the attention kinds on their layers only.
  void plan_norms(const LayerNorms& norms);
  int n_ff_dense_at(int l) const { return dense.layer_n_ff.empty() ? 0 : dense.layer_n_ff[static_cast<size_t>(l)]; }
  int n_head_kv_at(int l) const {
    const std::vector<int>& v = attention.layer_n_head_kv;
    return v.empty() ? n_head_kv : v[static_cast<size_t>(l)];
  }
  int head_dim_at(int l) const {
    const std::vector<int>& v = attention.layer_head_dim;
    return v.empty() ? head_dim : v[static_cast<size_t>(l)];
  }
  int head_dim_v_at(int l) const {
    const std::vector<int>& v = attention.layer_head_dim;
    return v.empty() ? head_dim_v : v[static_cast<size_t>(l)];
  }
  const RopeConfig& rope_at(int l) const {
    return attention.layer_rope.empty() ? rope : attention.layer_rope[static_cast<size_t>(l)];
  }

  // Per sequence: f32 bytes of the recurrent state, f16 KV bytes per token. Each mixer kind
  // declares its own (recurrent_state_floats, kv_bytes_per_token in model/mixers.cpp).
  int64_t recurrent_state_bytes() const;
  int64_t kv_bytes_per_token() const;
};

}  // namespace bmoe
