// bmoe-synth's Qwen2 MoE presets and the metadata keys its reader needs beyond the common ones
// (the family: model/arch_qwen2moe.cpp).
#include "synth/synth_family.h"

#include "core/error.h"

namespace bmoe {

namespace {

SynthSpec preset(const std::string& name) {
  SynthSpec s;
  if (name == "tiny-qwen2moe") {
    s = synth_shape(name, "qwen2moe", 2, 256, 4, 4, 64, 8, 2, 256, 2048, 1000000.0f, "tiny");
    s.n_ff_shexp = 512;
    q4_k_m_mix(s);
  } else if (name == "qwen1.5-moe-a2.7b") {
    s = synth_shape(name, "qwen2moe", 24, 2048, 16, 16, 128, 60, 4, 1408, 8192, 1000000.0f, "qwen3");
    s.n_ff_shexp = 5632;
    q4_k_m_mix(s);
    s.types[TensorClass::ExpertsDown] = TensorType::Q8_0;  // 1408-wide rows: no K-quants
  } else {
    fail("internal: {} is not a {} preset", name, "qwen2moe");
  }
  return s;
}

}  // namespace

const SynthFamily& qwen2moe_synth() {
  static const SynthFamily family{"qwen2moe", {"tiny-qwen2moe", "qwen1.5-moe-a2.7b"}, preset, nullptr, false, nullptr};
  return family;
}

}  // namespace bmoe
