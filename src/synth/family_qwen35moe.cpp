// bmoe-synth's Qwen3.5 MoE presets and the metadata keys its reader needs beyond the common ones
// (the family: model/arch_qwen35moe.cpp).
#include "synth/synth_family.h"

#include "core/error.h"

namespace bmoe {

namespace {

// Qwen3.5 MoE: every interval-th layer attends (the others are Gated DeltaNet layers), a
// quarter of each attention head rotated, and a shared expert.
void qwen35moe_shape(SynthSpec& s, int interval, int n_rot, int shared_ff, int ssm_head_dim, int k_heads, int v_heads) {
  s.n_rot = n_rot;
  s.n_ff_shexp = shared_ff;
  s.full_attention_interval = interval;
  s.ssm_conv_kernel = 4;
  s.ssm_head_dim = ssm_head_dim;
  s.ssm_k_heads = k_heads;
  s.ssm_v_heads = v_heads;
  s.n_nextn_layer = 1;  // the MTP block, as Qwen3.5/3.6's converter writes it
}

// The Gated DeltaNet shape, the attention interval and the M-RoPE sections (text positions
// use the first three; they cover the rotated pairs as 11/11/10 of 32 do); block_count holds
// the trunk and the MTP block.
void set_qwen35moe_metadata(GgufWriter& w, const SynthSpec& s) {
  const std::string a = "qwen35moe.";
  w.set(a + "block_count", GgufValue::u32(static_cast<uint32_t>(s.n_layer + s.n_nextn_layer)));
  w.set(a + "nextn_predict_layers", GgufValue::u32(static_cast<uint32_t>(s.n_nextn_layer)));
  w.set(a + "rope.dimension_count", GgufValue::u32(static_cast<uint32_t>(s.n_rot)));
  const int pairs = s.n_rot / 2;
  const int third = (pairs + 2) / 3;
  w.set(a + "rope.dimension_sections",
        GgufValue::i32_array({third, third, pairs - 2 * third, 0}));
  w.set(a + "full_attention_interval", GgufValue::u32(static_cast<uint32_t>(s.full_attention_interval)));
  w.set(a + "ssm.conv_kernel", GgufValue::u32(static_cast<uint32_t>(s.ssm_conv_kernel)));
  w.set(a + "ssm.state_size", GgufValue::u32(static_cast<uint32_t>(s.ssm_head_dim)));
  w.set(a + "ssm.group_count", GgufValue::u32(static_cast<uint32_t>(s.ssm_k_heads)));
  w.set(a + "ssm.time_step_rank", GgufValue::u32(static_cast<uint32_t>(s.ssm_v_heads)));
  w.set(a + "ssm.inner_size", GgufValue::u32(static_cast<uint32_t>(s.ssm_v_heads * s.ssm_head_dim)));
}

SynthSpec preset(const std::string& name) {
  SynthSpec s;
  if (name == "tiny-qwen35moe") {
    s = synth_shape(name, "qwen35moe", 4, 256, 4, 2, 64, 8, 2, 256, 4096, 10000000.0f, "tiny");
    qwen35moe_shape(s, 2, 16, 256, 64, 2, 4);  // every second layer attends: a 3-layer cut holds both kinds
    q4_k_m_mix(s);
  } else if (name == "qwen3.6-35b-a3b") {
    // As Qwen3.6-35B-A3B-Q4_K_M: 40 layers (30 Gated DeltaNet, 10 gated attention), 256 experts
    // of 512, a 512-wide shared expert; the Qwen3 tokenizer stands in for Qwen3.5's (no npm
    // package ships it), padded to its 248,320 ids.
    s = synth_shape(name, "qwen35moe", 40, 2048, 16, 2, 256, 256, 8, 512, 262144, 10000000.0f, "qwen3");
    qwen35moe_shape(s, 4, 64, 512, 128, 16, 32);
    s.vocab_size = 248320;
    q4_k_m_mix(s);
    s.more_bits_classes = {TensorClass::AttnV, TensorClass::ExpertsDown};
    s.more_bits_layers = s.n_layer;
  } else {
    fail("internal: {} is not a {} preset", name, "qwen35moe");
  }
  return s;
}

// Qwen3.5's chat template (tools as Qwen3-Coder's XML calls, a thinking block opened in the
// generation prompt), as Qwen3.5's tokenizer_config.json ships it and llama.cpp keeps it
// (models/templates/Qwen3.5-4B.jinja). Qwen3.6's own is not available offline; Qwen3.6 kept the
// Qwen3.5 architecture, tokens and tool syntax, so this is the closest real one.
const char* const kQwen35Template = R"qwen35(
{%- set image_count = namespace(value=0) %}
{%- set video_count = namespace(value=0) %}
{%- macro render_content(content, do_vision_count, is_system_content=false) %}
    {%- if content is string %}
        {{- content }}
    {%- elif content is iterable and content is not mapping %}
        {%- for item in content %}
            {%- if 'image' in item or 'image_url' in item or item.type == 'image' %}
                {%- if is_system_content %}
                    {{- raise_exception('System message cannot contain images.') }}
                {%- endif %}
                {%- if do_vision_count %}
                    {%- set image_count.value = image_count.value + 1 %}
                {%- endif %}
                {%- if add_vision_id %}
                    {{- 'Picture ' ~ image_count.value ~ ': ' }}
                {%- endif %}
                {{- '<|vision_start|><|image_pad|><|vision_end|>' }}
            {%- elif 'video' in item or item.type == 'video' %}
                {%- if is_system_content %}
                    {{- raise_exception('System message cannot contain videos.') }}
                {%- endif %}
                {%- if do_vision_count %}
                    {%- set video_count.value = video_count.value + 1 %}
                {%- endif %}
                {%- if add_vision_id %}
                    {{- 'Video ' ~ video_count.value ~ ': ' }}
                {%- endif %}
                {{- '<|vision_start|><|video_pad|><|vision_end|>' }}
            {%- elif 'text' in item %}
                {{- item.text }}
            {%- else %}
                {{- raise_exception('Unexpected item type in content.') }}
            {%- endif %}
        {%- endfor %}
    {%- elif content is none or content is undefined %}
        {{- '' }}
    {%- else %}
        {{- raise_exception('Unexpected content type.') }}
    {%- endif %}
{%- endmacro %}
{%- if not messages %}
    {{- raise_exception('No messages provided.') }}
{%- endif %}
{%- if tools and tools is iterable and tools is not mapping %}
    {{- '<|im_start|>system\n' }}
    {{- "# Tools\n\nYou have access to the following functions:\n\n<tools>" }}
    {%- for tool in tools %}
        {{- "\n" }}
        {{- tool | tojson }}
    {%- endfor %}
    {{- "\n</tools>" }}
    {{- '\n\nIf you choose to call a function ONLY reply in the following format with NO suffix:\n\n<tool_call>\n<function=example_function_name>\n<parameter=example_parameter_1>\nvalue_1\n</parameter>\n<parameter=example_parameter_2>\nThis is the value for the second parameter\nthat can span\nmultiple lines\n</parameter>\n</function>\n</tool_call>\n\n<IMPORTANT>\nReminder:\n- Function calls MUST follow the specified format: an inner <function=...></function> block must be nested within <tool_call></tool_call> XML tags\n- Required parameters MUST be specified\n- You may provide optional reasoning for your function call in natural language BEFORE the function call, but NOT after\n- If there is no function call available, answer the question like normal with your current knowledge and do not tell the user about function calls\n</IMPORTANT>' }}
    {%- if messages[0].role == 'system' %}
        {%- set content = render_content(messages[0].content, false, true)|trim %}
        {%- if content %}
            {{- '\n\n' + content }}
        {%- endif %}
    {%- endif %}
    {{- '<|im_end|>\n' }}
{%- else %}
    {%- if messages[0].role == 'system' %}
        {%- set content = render_content(messages[0].content, false, true)|trim %}
        {{- '<|im_start|>system\n' + content + '<|im_end|>\n' }}
    {%- endif %}
{%- endif %}
{%- set ns = namespace(multi_step_tool=true, last_query_index=messages|length - 1) %}
{%- for message in messages[::-1] %}
    {%- set index = (messages|length - 1) - loop.index0 %}
    {%- if ns.multi_step_tool and message.role == "user" %}
        {%- set content = render_content(message.content, false)|trim %}
        {%- if not(content.startswith('<tool_response>') and content.endswith('</tool_response>')) %}
            {%- set ns.multi_step_tool = false %}
            {%- set ns.last_query_index = index %}
        {%- endif %}
    {%- endif %}
{%- endfor %}
{%- if ns.multi_step_tool %}
    {{- raise_exception('No user query found in messages.') }}
{%- endif %}
{%- for message in messages %}
    {%- set content = render_content(message.content, true)|trim %}
    {%- if message.role == "system" %}
        {%- if not loop.first %}
            {{- raise_exception('System message must be at the beginning.') }}
        {%- endif %}
    {%- elif message.role == "user" %}
        {{- '<|im_start|>' + message.role + '\n' + content + '<|im_end|>' + '\n' }}
    {%- elif message.role == "assistant" %}
        {%- set reasoning_content = '' %}
        {%- if message.reasoning_content is string %}
            {%- set reasoning_content = message.reasoning_content %}
        {%- else %}
            {%- if '</think>' in content %}
                {%- set reasoning_content = content.split('</think>')[0].rstrip('\n').split('<think>')[-1].lstrip('\n') %}
                {%- set content = content.split('</think>')[-1].lstrip('\n') %}
            {%- endif %}
        {%- endif %}
        {%- set reasoning_content = reasoning_content|trim %}
        {%- if loop.index0 > ns.last_query_index %}
            {{- '<|im_start|>' + message.role + '\n<think>\n' + reasoning_content + '\n</think>\n\n' + content }}
        {%- else %}
            {{- '<|im_start|>' + message.role + '\n' + content }}
        {%- endif %}
        {%- if message.tool_calls and message.tool_calls is iterable and message.tool_calls is not mapping %}
            {%- for tool_call in message.tool_calls %}
                {%- if tool_call.function is defined %}
                    {%- set tool_call = tool_call.function %}
                {%- endif %}
                {%- if loop.first %}
                    {%- if content|trim %}
                        {{- '\n\n<tool_call>\n<function=' + tool_call.name + '>\n' }}
                    {%- else %}
                        {{- '<tool_call>\n<function=' + tool_call.name + '>\n' }}
                    {%- endif %}
                {%- else %}
                    {{- '\n<tool_call>\n<function=' + tool_call.name + '>\n' }}
                {%- endif %}
                {%- if tool_call.arguments is defined %}
                    {%- for args_name, args_value in tool_call.arguments|items %}
                        {{- '<parameter=' + args_name + '>\n' }}
                        {%- set args_value = args_value | tojson | safe if args_value is mapping or (args_value is sequence and args_value is not string) else args_value | string %}
                        {{- args_value }}
                        {{- '\n</parameter>\n' }}
                    {%- endfor %}
                {%- endif %}
                {{- '</function>\n</tool_call>' }}
            {%- endfor %}
        {%- endif %}
        {{- '<|im_end|>\n' }}
    {%- elif message.role == "tool" %}
        {%- if loop.previtem and loop.previtem.role != "tool" %}
            {{- '<|im_start|>user' }}
        {%- endif %}
        {{- '\n<tool_response>\n' }}
        {{- content }}
        {{- '\n</tool_response>' }}
        {%- if not loop.last and loop.nextitem.role != "tool" %}
            {{- '<|im_end|>\n' }}
        {%- elif loop.last %}
            {{- '<|im_end|>\n' }}
        {%- endif %}
    {%- else %}
        {{- raise_exception('Unexpected message role.') }}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\n' }}
    {%- if enable_thinking is defined and enable_thinking is false %}
        {{- '<think>\n\n</think>\n\n' }}
    {%- else %}
        {{- '<think>\n' }}
    {%- endif %}
{%- endif %})qwen35";

}  // namespace

void qwen35_vocab(Vocabulary& v) {
  v.pre = "qwen35";  // Qwen3.5's pre-tokenizer on the Qwen3 vocabulary
  v.chat_template = kQwen35Template + 1;  // past the raw string's first newline
}

const SynthFamily& qwen35moe_synth() {
  static const SynthFamily family{"qwen35moe", {"tiny-qwen35moe", "qwen3.6-35b-a3b"}, preset, set_qwen35moe_metadata, false, nullptr};
  return family;
}

}  // namespace bmoe
