// bmoe-synth's Mixtral (llama) presets and the metadata keys its reader needs beyond the common ones
// (the family: model/arch_llama_moe.cpp).
#include "synth/synth_family.h"

#include "core/error.h"

namespace bmoe {

namespace {

SynthSpec preset(const std::string& name) {
  SynthSpec s;
  if (name == "tiny-mixtral") {
    s = synth_shape(name, "llama", 2, 256, 4, 2, 64, 8, 2, 512, 2048, 1000000.0f, "tiny");
    q4_k_m_mix(s);
  } else if (name == "mixtral-8x7b") {
    s = synth_shape(name, "llama", 32, 4096, 32, 8, 128, 8, 2, 14336, 32768, 1000000.0f, "llama3");
    q4_k_m_mix(s);
  } else {
    fail("internal: {} is not a {} preset", name, "llama");
  }
  return s;
}

}  // namespace

const SynthFamily& llama_moe_synth() {
  static const SynthFamily family{"llama", {"tiny-mixtral", "mixtral-8x7b"}, preset, nullptr, true, nullptr};
  return family;
}

}  // namespace bmoe
