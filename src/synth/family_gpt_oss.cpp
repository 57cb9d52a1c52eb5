// bmoe-synth's gpt-oss presets and the metadata keys its reader needs beyond the common ones
// (the family: model/arch_gpt_oss.cpp).
#include "synth/synth_family.h"

#include "core/error.h"

namespace bmoe {

namespace {

// gpt-oss rows are 2880 wide, not a multiple of 256: no K-quants. Its GGUFs keep MXFP4
// experts and 8-bit everything else.
void gpt_oss_types(SynthSpec& s) {
  set_types(s, TensorType::Q8_0);
  s.types[TensorClass::Experts] = TensorType::MXFP4;
  s.types[TensorClass::ExpertsDown] = TensorType::MXFP4;
}

SynthSpec preset(const std::string& name) {
  SynthSpec s;
  if (name == "tiny-gpt-oss") {
    s = synth_shape(name, "gpt-oss", 2, 256, 4, 2, 64, 8, 2, 256, 2048, 150000.0f, "tiny");
    s.sliding_window = 16;
    s.yarn_factor = 32.0f;
    s.yarn_orig_ctx = 256;
    gpt_oss_types(s);
  } else if (name == "gpt-oss-20b" || name == "gpt-oss-120b") {
    const bool big = name == "gpt-oss-120b";
    s = synth_shape(name, "gpt-oss", big ? 36 : 24, 2880, 64, 8, 64, big ? 128 : 32, 4, 2880, 131072, 150000.0f, "gptoss");
    s.sliding_window = 128;
    s.yarn_factor = 32.0f;
    s.yarn_orig_ctx = 4096;
    s.vocab_size = 201088;
    s.norm_eps = 1e-5f;
    gpt_oss_types(s);
  } else {
    fail("internal: {} is not a {} preset", name, "gpt-oss");
  }
  return s;
}

}  // namespace

const SynthFamily& gpt_oss_synth() {
  static const SynthFamily family{"gpt-oss", {"tiny-gpt-oss", "gpt-oss-20b", "gpt-oss-120b"}, preset, nullptr, false, nullptr};
  return family;
}

}  // namespace bmoe
