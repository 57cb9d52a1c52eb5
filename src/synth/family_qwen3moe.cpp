// bmoe-synth's Qwen3 MoE presets and the metadata keys its reader needs beyond the common ones
// (the family: model/arch_qwen3moe.cpp).
#include "synth/synth_family.h"

#include "core/error.h"

namespace bmoe {

namespace {

SynthSpec preset(const std::string& name) {
  SynthSpec s;
  if (name == "tiny-qwen3moe") {
    s = synth_shape(name, "qwen3moe", 2, 256, 4, 2, 64, 8, 2, 256, 2048, 1000000.0f, "tiny");
    q4_k_m_mix(s);
  } else if (name == "qwen3-30b-a3b") {
    s = synth_shape(name, "qwen3moe", 48, 2048, 32, 4, 128, 128, 8, 768, 40960, 1000000.0f, "qwen3");
    q4_k_m_mix(s);
    // As the real Qwen3-30B-A3B-Q4_K_M: 24 layers with Q6_K down projections (3,059,712-byte
    // experts), 24 with Q4_K (2,654,208), as the phone trace's header lists them layer by layer.
    s.more_bits_classes = {TensorClass::AttnV, TensorClass::ExpertsDown};
    s.more_bits_layers = s.n_layer;
  } else {
    fail("internal: {} is not a {} preset", name, "qwen3moe");
  }
  return s;
}

}  // namespace

const SynthFamily& qwen3moe_synth() {
  static const SynthFamily family{"qwen3moe", {"tiny-qwen3moe", "qwen3-30b-a3b"}, preset, nullptr, false, nullptr};
  return family;
}

}  // namespace bmoe
