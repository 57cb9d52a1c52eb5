// bmoe-synth's Qwen3.5 MoE presets and the metadata keys its reader needs beyond the common ones
// (the family: model/arch_qwen35moe.cpp).
#include "synth/synth_family.h"

#include "core/error.h"

namespace bmoe {

namespace {

// Qwen3.5 MoE: every interval-th layer attends (the others are Gated DeltaNet layers), a
// quarter of each attention head rotated, and a shared expert.
void qwen35moe_shape(SynthSpec& s, int interval, int n_rot, int shared_ff, int ssm_head_dim, int k_heads, int v_heads) {
  s.n_rot = n_rot;
  s.n_ff_shexp = shared_ff;
  s.full_attention_interval = interval;
  s.ssm_conv_kernel = 4;
  s.ssm_head_dim = ssm_head_dim;
  s.ssm_k_heads = k_heads;
  s.ssm_v_heads = v_heads;
  s.n_nextn_layer = 1;  // the MTP block, as Qwen3.5/3.6's converter writes it
}

// The Gated DeltaNet shape, the attention interval and the M-RoPE sections (text positions
// use the first three; they cover the rotated pairs as 11/11/10 of 32 do); block_count holds
// the trunk and the MTP block.
void set_qwen35moe_metadata(GgufWriter& w, const SynthSpec& s) {
  const std::string a = "qwen35moe.";
  w.set(a + "block_count", GgufValue::u32(static_cast<uint32_t>(s.n_layer + s.n_nextn_layer)));
  w.set(a + "nextn_predict_layers", GgufValue::u32(static_cast<uint32_t>(s.n_nextn_layer)));
  w.set(a + "rope.dimension_count", GgufValue::u32(static_cast<uint32_t>(s.n_rot)));
  const int pairs = s.n_rot / 2;
  const int third = (pairs + 2) / 3;
  w.set(a + "rope.dimension_sections",
        GgufValue::i32_array({third, third, pairs - 2 * third, 0}));
  w.set(a + "full_attention_interval", GgufValue::u32(static_cast<uint32_t>(s.full_attention_interval)));
  w.set(a + "ssm.conv_kernel", GgufValue::u32(static_cast<uint32_t>(s.ssm_conv_kernel)));
  w.set(a + "ssm.state_size", GgufValue::u32(static_cast<uint32_t>(s.ssm_head_dim)));
  w.set(a + "ssm.group_count", GgufValue::u32(static_cast<uint32_t>(s.ssm_k_heads)));
  w.set(a + "ssm.time_step_rank", GgufValue::u32(static_cast<uint32_t>(s.ssm_v_heads)));
  w.set(a + "ssm.inner_size", GgufValue::u32(static_cast<uint32_t>(s.ssm_v_heads * s.ssm_head_dim)));
}

SynthSpec preset(const std::string& name) {
  SynthSpec s;
  if (name == "tiny-qwen35moe") {
    s = synth_shape(name, "qwen35moe", 4, 256, 4, 2, 64, 8, 2, 256, 4096, 10000000.0f, "tiny");
    qwen35moe_shape(s, 2, 16, 256, 64, 2, 4);  // every second layer attends: a 3-layer cut holds both kinds
    q4_k_m_mix(s);
  } else if (name == "qwen3.6-35b-a3b") {
    // As Qwen3.6-35B-A3B-Q4_K_M: 40 layers (30 Gated DeltaNet, 10 gated attention), 256 experts
    // of 512, a 512-wide shared expert; the Qwen3 tokenizer stands in for Qwen3.5's (no npm
    // package ships it), padded to its 248,320 ids.
    s = synth_shape(name, "qwen35moe", 40, 2048, 16, 2, 256, 256, 8, 512, 262144, 10000000.0f, "qwen3");
    qwen35moe_shape(s, 4, 64, 512, 128, 16, 32);
    s.vocab_size = 248320;
    q4_k_m_mix(s);
    s.more_bits_classes = {TensorClass::AttnV, TensorClass::ExpertsDown};
    s.more_bits_layers = s.n_layer;
  } else {
    fail("internal: {} is not a {} preset", name, "qwen35moe");
  }
  return s;
}

}  // namespace

const SynthFamily& qwen35moe_synth() {
  static const SynthFamily family{"qwen35moe", {"tiny-qwen35moe", "qwen3.6-35b-a3b"}, preset, set_qwen35moe_metadata, false, nullptr};
  return family;
}

}  // namespace bmoe
