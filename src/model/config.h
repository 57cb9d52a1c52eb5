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
};

enum class ExpertActivation { SwiGLU, SwiGLU_OAI, GeGLU };

// What mixes tokens in a layer.
enum class LayerMixer : uint8_t { Attention, GatedDeltaNet, ShortConv };

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
  int n_layer = 0;
  int n_embd = 0;
  int n_head = 0;
  int n_head_kv = 0;
  int head_dim = 0;    // key/query head size
  int head_dim_v = 0;  // value head size
  int n_vocab = 0;
  int n_ctx_train = 0;
  float norm_eps = 1e-6f;

  int n_expert = 0;
  int n_expert_used = 0;
  int n_ff_exp = 0;
  int n_ff_shexp = 0;                // shared expert width (qwen2moe)
  std::vector<int> layer_n_ff;       // per layer: dense FFN width beside the experts (gemma4)
  std::vector<uint8_t> moe_layers;   // per layer: 1 = routed experts; empty: every layer has them
  bool norm_topk = true;            // renormalise the k selected weights to sum to 1
  float expert_weights_scale = 0.0f;  // 0 or 1: none
  Gating gating = Gating::SoftmaxTopK;
  ExpertActivation activation = ExpertActivation::SwiGLU;

  RopeConfig rope;
  float attn_scale = 0.0f;  // 0: 1/sqrt(head_dim)
  float attn_softcap = 0.0f;
  float final_softcap = 0.0f;

  bool qk_norm_per_head = false;  // RMS-norm q and k per head (qwen3)
  bool qk_norm_full = false;      // RMS-norm q and k over all heads (olmoe)

  std::vector<int> sliding_window;  // per layer; 0 = full attention

  // Per-layer attention geometry where it varies (gemma4: sliding layers have more, smaller
  // kv heads and their own RoPE). Empty: every layer uses the scalars above.
  std::vector<int> layer_n_head_kv;
  std::vector<int> layer_head_dim;  // key and value head size
  std::vector<RopeConfig> layer_rope;
  // Hybrid models mix attention with layers that keep a recurrent state instead of KV rows:
  // Gated DeltaNet (qwen35moe) or short convolutions (lfm2moe). Empty: every layer attends.
  std::vector<LayerMixer> layer_mixer;
  int short_conv_kernel = 0;  // lfm2moe: taps of the short convolution
  struct DeltaNet {
    int conv_kernel = 0;  // causal depthwise convolution width
    int head_dim = 0;     // key and value head size (the state is head_dim x head_dim per value head)
    int k_heads = 0;      // query/key heads; value head h reads key head h % k_heads
    int v_heads = 0;
    int key_dim() const { return k_heads * head_dim; }
    int value_dim() const { return v_heads * head_dim; }
    int conv_channels() const { return 2 * key_dim() + value_dim(); }  // q | k | v
  } delta_net;
  bool attn_output_gate = false;  // the q projection holds [query | gate] per head (qwen35moe)
  bool shared_gate_sigmoid = false;  // shared expert gate: sigmoid (else silu(x)/x, qwen2moe's form)
  bool v_rms_norm = false;          // RMS-normalise each value head without a weight (gemma4)
  ExpertActivation dense_activation = ExpertActivation::SwiGLU;  // dense FFN / shared expert

  int sliding_at(int l) const { return sliding_window.empty() ? 0 : sliding_window[static_cast<size_t>(l)]; }
  LayerMixer mixer_at(int l) const { return layer_mixer.empty() ? LayerMixer::Attention : layer_mixer[static_cast<size_t>(l)]; }
  bool is_recurrent(int l) const { return mixer_at(l) != LayerMixer::Attention; }
  bool has_recurrent_layers() const {
    for (LayerMixer m : layer_mixer) {
      if (m != LayerMixer::Attention) return true;
    }
    return false;
  }
  bool has_experts_at(int l) const { return moe_layers.empty() ? n_expert > 0 : moe_layers[static_cast<size_t>(l)] != 0; }
  int n_ff_dense_at(int l) const { return layer_n_ff.empty() ? 0 : layer_n_ff[static_cast<size_t>(l)]; }
  int n_head_kv_at(int l) const { return layer_n_head_kv.empty() ? n_head_kv : layer_n_head_kv[static_cast<size_t>(l)]; }
  int head_dim_at(int l) const { return layer_head_dim.empty() ? head_dim : layer_head_dim[static_cast<size_t>(l)]; }
  int head_dim_v_at(int l) const { return layer_head_dim.empty() ? head_dim_v : layer_head_dim[static_cast<size_t>(l)]; }
  const RopeConfig& rope_at(int l) const { return layer_rope.empty() ? rope : layer_rope[static_cast<size_t>(l)]; }

  // f32 bytes of one sequence's recurrent state: each Gated DeltaNet layer's convolution history
  // and head_dim^2 per value head, each short-convolution layer's history.
  int64_t recurrent_state_bytes() const {
    int64_t floats = 0;
    for (int l = 0; l < n_layer; ++l) {
      if (mixer_at(l) == LayerMixer::GatedDeltaNet) {
        floats += int64_t{delta_net.conv_channels()} * (delta_net.conv_kernel - 1) +
                  int64_t{delta_net.v_heads} * delta_net.head_dim * delta_net.head_dim;
      } else if (mixer_at(l) == LayerMixer::ShortConv) {
        floats += int64_t{n_embd} * (short_conv_kernel - 1);
      }
    }
    return floats * 4;
  }

  int64_t kv_bytes_per_token() const {
    int64_t total = 0;
    for (int l = 0; l < n_layer; ++l) {
      if (!is_recurrent(l)) total += int64_t{n_head_kv_at(l)} * (head_dim_at(l) + head_dim_v_at(l)) * 2;
    }
    return total;  // f16 K and V
  }
};

}  // namespace bmoe
