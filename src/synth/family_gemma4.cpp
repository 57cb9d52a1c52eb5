// bmoe-synth's Gemma 4 presets and the metadata keys its reader needs beyond the common ones
// (the family: model/arch_gemma4.cpp).
#include "synth/synth_family.h"

#include "core/error.h"

namespace bmoe {

namespace {

// Gemma 4's attention pattern and a Q4_K_M-like mix. Rows of the expert down projection (704)
// and the dense FFN (2112) are not multiples of 256, so those fall back to Q8_0 as
// llama.cpp's quantizer falls back for them (it mixes Q5_0 and Q8_0; bmoe has no Q5_0).
void gemma4_shape(SynthSpec& s, int window, int period, int kv_heads_full, int head_dim_full, int ff_dense) {
  s.sliding_window = window;
  s.swa_period = period;
  s.n_head_kv_full = kv_heads_full;
  s.head_dim_full = head_dim_full;
  s.n_ff_dense = ff_dense;
  s.rope_base_swa = 10000.0f;
  s.final_softcap = 30.0f;
  q4_k_m_mix(s);
  s.types[TensorClass::Embedding] = TensorType::Q6_K;
  s.types[TensorClass::ExpertsDown] = TensorType::Q8_0;
  s.types[TensorClass::Dense] = TensorType::Q8_0;
}

bool gemma4_full_layer(const SynthSpec& s, int l) { return s.swa_period > 0 && l % s.swa_period == s.swa_period - 1; }

// Gemma 4's keys beyond the common ones: per-layer kv heads and sliding pattern, the two
// head sizes and RoPEs, the dense FFN width, soft-capping.
void set_gemma4_metadata(GgufWriter& w, const SynthSpec& s) {
  const std::string a = "gemma4.";
  std::vector<bool> swa;
  std::vector<uint32_t> kv_heads;
  for (int l = 0; l < s.n_layer; ++l) {
    const bool full = gemma4_full_layer(s, l);
    swa.push_back(!full);
    kv_heads.push_back(static_cast<uint32_t>(full ? s.n_head_kv_full : s.n_head_kv));
  }
  w.set(a + "attention.sliding_window_pattern", GgufValue::bool_array(swa));
  w.set(a + "attention.head_count_kv", GgufValue::u32_array(kv_heads));
  w.set(a + "attention.key_length", GgufValue::u32(static_cast<uint32_t>(s.head_dim_full)));
  w.set(a + "attention.value_length", GgufValue::u32(static_cast<uint32_t>(s.head_dim_full)));
  w.set(a + "attention.key_length_swa", GgufValue::u32(static_cast<uint32_t>(s.head_dim)));
  w.set(a + "attention.value_length_swa", GgufValue::u32(static_cast<uint32_t>(s.head_dim)));
  w.set(a + "rope.dimension_count", GgufValue::u32(static_cast<uint32_t>(s.head_dim_full)));
  w.set(a + "rope.dimension_count_swa", GgufValue::u32(static_cast<uint32_t>(s.head_dim)));
  w.set(a + "rope.freq_base_swa", GgufValue::f32(s.rope_base_swa));
  w.set(a + "attention.shared_kv_layers", GgufValue::u32(0));
  w.set(a + "embedding_length_per_layer_input", GgufValue::u32(0));
  w.set(a + "feed_forward_length", GgufValue::u32(static_cast<uint32_t>(s.n_ff_dense)));
  w.set(a + "final_logit_softcapping", GgufValue::f32(s.final_softcap));
}

SynthSpec preset(const std::string& name) {
  SynthSpec s;
  if (name == "tiny-gemma4") {
    s = synth_shape(name, "gemma4", 4, 256, 4, 2, 64, 8, 2, 128, 4096, 1000000.0f, "tiny");
    gemma4_shape(s, 64, 2, 1, 128, 256);
    s.types[TensorClass::Embedding] = TensorType::Q6_K;  // tied: also the output head
  } else if (name == "gemma-4-26b-a4b") {
    s = synth_shape(name, "gemma4", 30, 2816, 16, 8, 256, 128, 8, 704, 262144, 1000000.0f, "gemma");
    gemma4_shape(s, 1024, 6, 2, 512, 2112);
  } else {
    fail("internal: {} is not a {} preset", name, "gemma4");
  }
  return s;
}

void validate(const SynthSpec& s) {
  if (s.swa_period < 1 || s.n_head_kv_full < 1 || s.head_dim_full < 8 || s.n_head % s.n_head_kv_full ||
      s.n_ff_dense < 1 || s.sliding_window < 1) {
    fail("bmoe-synth: invalid gemma4 shape");
  }
}

}  // namespace

const SynthFamily& gemma4_synth() {
  static const SynthFamily family{"gemma4", {"tiny-gemma4", "gemma-4-26b-a4b"}, preset, set_gemma4_metadata, false, validate};
  return family;
}

}  // namespace bmoe
