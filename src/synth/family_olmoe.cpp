// bmoe-synth's OLMoE presets and the metadata keys its reader needs beyond the common ones
// (the family: model/arch_olmoe.cpp).
#include "synth/synth_family.h"

#include "core/error.h"

namespace bmoe {

namespace {

SynthSpec preset(const std::string& name) {
  SynthSpec s;
  if (name == "tiny-olmoe") {
    s = synth_shape(name, "olmoe", 2, 256, 4, 4, 64, 8, 2, 256, 2048, 10000.0f, "tiny");
    q4_k_m_mix(s);
  } else if (name == "olmoe-1b-7b") {
    s = synth_shape(name, "olmoe", 16, 2048, 16, 16, 128, 64, 8, 1024, 4096, 10000.0f, "llama3");
    q4_k_m_mix(s);
  } else {
    fail("internal: {} is not a {} preset", name, "olmoe");
  }
  return s;
}

}  // namespace

const SynthFamily& olmoe_synth() {
  static const SynthFamily family{"olmoe", {"tiny-olmoe", "olmoe-1b-7b"}, preset, nullptr, true, nullptr};
  return family;
}

}  // namespace bmoe
