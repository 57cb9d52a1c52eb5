// What bmoe-synth knows of a family beyond its tensor table (which it reads from the family's
// architecture, model/arch_<family>.cpp): its presets and the metadata keys its hyperparameter
// reader needs beyond the common ones. One file per family, src/synth/family_<family>.cpp (the
// GGUF writer sits above model, so these cannot live in the architecture file itself).
#pragma once

#include <string>
#include <vector>

#include "gguf/gguf_writer.h"
#include "synth/synth.h"
#include "text/tokenizer.h"

namespace bmoe {

struct SynthFamily {
  const char* arch;                  // general.architecture
  std::vector<std::string> presets;  // in --list-presets order
  SynthSpec (*preset)(const std::string& name);  // one of `presets`
  // The family's keys, written after the common ones (a key written twice keeps its place).
  void (*set_metadata)(GgufWriter& w, const SynthSpec& s) = nullptr;
  bool ff_is_expert = false;  // feed_forward_length is the expert width (olmoe, llama), not the total
  void (*validate)(const SynthSpec& s) = nullptr;  // fails on a shape the family cannot write
};

// Every family, in --list-presets order; the one writing `arch`, or null.
const std::vector<SynthFamily>& synth_families();
const SynthFamily* find_synth_family(const std::string& arch);

// Helpers the presets share (synth.cpp).
SynthSpec synth_shape(const std::string& name, const std::string& arch, int layers, int embd, int heads, int kv_heads,
                      int head_dim, int experts, int used, int ff, int ctx, float rope_base, const std::string& vocab);
void q4_k_m_mix(SynthSpec& s);                // llama.cpp's Q4_K_M types per class
void set_types(SynthSpec& s, TensorType all);  // every class but routers and norms

// GLM's pre-tokenizer, special tokens (added where the vocabulary lacks them), end tokens and
// chat template, on a stand-in vocabulary (family_glm4moe.cpp).
void glm4_vocab(Vocabulary& v);
// Ling's pre-tokenizer, role and tool tokens, end token and a stand-in chat template
// (family_bailingmoe3.cpp).
void ling_vocab(Vocabulary& v);
// The real chat templates where the vocabulary is the real one and its package ships none of the
// model's own: Qwen3.5's (family_qwen35moe.cpp, with Qwen3.5's pre-tokenizer), gpt-oss's
// (family_gpt_oss.cpp) and Gemma 4's (family_gemma4.cpp).
void qwen35_vocab(Vocabulary& v);
void gpt_oss_vocab(Vocabulary& v);
void gemma4_real_vocab(Vocabulary& v);
// LFM2's pre-tokenizer and BOS; on the llama3 vocabulary that stands in for LFM2's, LFM2's control
// tokens (in place of reserved ones), its end token and its real chat template (family_lfm2moe.cpp).
void lfm2_vocab(Vocabulary& v);
// DeepSeek-V4's chat format (thinking switch, DSML tool calls) on DeepSeek's vocabulary
// (family_deepseek4.cpp); a stand-in vocabulary keeps its own.
void deepseek4_vocab(Vocabulary& v);

}  // namespace bmoe
