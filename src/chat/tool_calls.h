// Tool calls in each model family's own format: which format a chat template writes, parsing
// the tool-call text of a finished answer into calls, a GBNF grammar (text/grammar.h) that forces
// a call (tool_choice "required" or a named function), and call ids.
//
// The formats, as the models are trained to write them (one call to get_weather; parallel calls
// repeat the part in brackets with the separator given):
//   hermes        <tool_call>\n{"name": "get_weather", "arguments": {...}}\n</tool_call>   ("\n")
//   qwen-xml      <tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n
//                 </function>\n</tool_call>                                                  ("\n")
//   harmony       <|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{...}
//                 (then the <|call|> end token; one call per turn)
//   glm-xml       <tool_call>get_weather\n<arg_key>city</arg_key>\n<arg_value>Paris</arg_value>\n
//                 </tool_call>   (GLM-4.7: no newlines between tags)                        ("\n")
//   gemma4        <|tool_call>call:get_weather{city:<|"|>Paris<|"|>,days:2}<tool_call|>       ("")
//   lfm2          <|tool_call_start|>[get_weather(city="Paris", days=2)]<|tool_call_end|>   (", " inside [])
//   mistral       [TOOL_CALLS][{"name": "get_weather", "arguments": {...}, "id": "abcDEF123"}] (", " inside [])
//   mistral-args  [TOOL_CALLS]get_weather[CALL_ID]abcDEF123[ARGS]{...}   ([CALL_ID] optional)   ("")
//   llama3-json   {"name": "get_weather", "parameters": {...}}   (one call per turn)
//   deepseek-dsml <｜DSML｜tool_calls>\n<｜DSML｜invoke name="get_weather">\n<｜DSML｜parameter name="city"
//                 string="true">Paris</｜DSML｜parameter>\n</｜DSML｜invoke>\n</｜DSML｜tool_calls>   ("" inside the block)
//   deepseek-r1   <｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>get_weather\n```json\n{...}\n```
//                 <｜tool▁call▁end｜><｜tool▁calls▁end｜>     (DeepSeek-V3, R1 and its distills; "\n" inside the block)
//   deepseek-v3.1 <｜tool▁calls▁begin｜><｜tool▁call▁begin｜>get_weather<｜tool▁sep｜>{...}<｜tool▁call▁end｜>
//                 <｜tool▁calls▁end｜>                         ("" inside the block)
//
// Parsing is lenient where it costs nothing (whitespace, a missing closing tag at the end of the
// answer, "arguments" given as a JSON string, Python literals in lfm2 calls, both Mistral forms
// under either Mistral format) and never recurses deeper than 64 nested values, so any text is
// safe to give it.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

namespace bmoe {

enum class ToolFormat { None, Hermes, QwenXml, Harmony, Gemma4, Lfm2, MistralList, MistralArgs, Llama3Json, GlmXml,
                        DeepseekDsml, DeepseekR1, DeepseekV31 };

// The format a chat template's source writes tool calls in, from substrings of the source (as
// llama.cpp detects them): <|channel|> -> Harmony; <|tool_list_start|> or <|tool_call_start|> ->
// Lfm2; '<|tool_call>call:' or <|tool_call> -> Gemma4; <tool_call> with <function= and
// <parameter= -> QwenXml; <tool_call> with <arg_key> -> GlmXml; <tool_call> -> Hermes;
// [TOOL_CALLS] with [ARGS] -> MistralArgs; [TOOL_CALLS] -> MistralList; Llama 3.1's `Respond in
// the format {"name": function name` -> Llama3Json; ｜DSML｜ (DeepSeek-V3.2 and V4) -> DeepseekDsml;
// <｜tool▁sep｜> with ```json (DeepSeek-V3, R1) -> DeepseekR1; <｜tool▁sep｜> (DeepSeek-V3.1) ->
// DeepseekV31; anything else -> None.
ToolFormat tool_format_of(std::string_view chat_template_source);
// "hermes", "qwen-xml", "glm-xml", "harmony", "gemma4", "lfm2", "mistral", "mistral-args", "llama3-json",
// "deepseek-dsml", "deepseek-r1", "deepseek-v3.1", "none".
const char* tool_format_name(ToolFormat format);

struct ToolCall {
  std::string id;
  std::string name;
  std::string arguments;  // compact JSON object text
};

// Texts that open tool calls in an answer's content: Hermes and GlmXml "<tool_call>"; QwenXml
// "<tool_call>" and "<function=" (Qwen3-Coder may leave the opener out); Gemma4 "<|tool_call>"; Lfm2
// "<|tool_call_start|>"; both Mistral formats "[TOOL_CALLS]"; Llama3Json "{\"name\"" and
// "{\"type\""; DeepseekDsml "<｜DSML｜tool_calls>"; DeepseekR1 and DeepseekV31 "<｜tool▁calls▁begin｜>" and
// "<｜tool▁call▁begin｜>" (an answer may leave the first out). Harmony and None: none (harmony's calls
// are message headers: parse_harmony_call).
std::vector<std::string> tool_call_markers(ToolFormat format);

struct ParsedToolCalls {
  bool ok = false;              // false: no well-formed call at the start; the caller keeps the whole text as content
  std::vector<ToolCall> calls;  // ids empty, except a Mistral call whose text carries a valid id (9 letters/digits)
  std::string rest;             // text after the last call that belongs to no call (kept as content); "" if only whitespace
};

// Parses content text that starts at a marker (leading whitespace allowed) and runs to the end of
// the answer. Calls are read while they are well formed; the first text that is not a call ends
// them and becomes `rest`. `tools` is the request's tools array (OpenAI form
// [{"type":"function","function":{"name","description","parameters"}}], or null): for QwenXml and
// GlmXml a parameter whose schema type is "string" keeps its raw text, others are read as JSON
// (Python's True/False/None too) and fall back to the raw string. Calls to names not in `tools` are still
// returned (the server decides). Harmony accepts the text after "<|start|>assistant" (a header
// with " to=functions.NAME" and its <|message|> body); the reply parser usually calls
// parse_harmony_call instead.
ParsedToolCalls parse_tool_calls(ToolFormat format, std::string_view text, const nlohmann::ordered_json& tools);

// Harmony: one message to a function. `recipient` is the header's "to=" value ("functions.NAME",
// or NAME alone), `body` the message text (a trailing <|call|> is ignored). ok=false (and no call)
// when the name is empty or the body is not a JSON object; otherwise one call, arguments compact.
ParsedToolCalls parse_harmony_call(std::string_view recipient, std::string_view body);

// GBNF (text/grammar.h) whose root is exactly the tool-call text of this format: what the model
// must write when tool_choice is "required" (any of `tools`) or names one function
// (`only_function` non-empty). parallel: one or more calls (Harmony and Llama3Json: always one,
// their templates take one per turn); otherwise exactly one. Arguments follow each tool's
// "parameters" JSON schema (JsonGrammarBuilder, chat/json_schema.h; for gemma4's own value syntax
// and qwen-xml's raw string parameters, converted here), and parse_tool_calls reads every text
// the grammar allows back into calls whose arguments validate against it. Layouts are the
// trained ones with bounded whitespace (inside JSON values only). Harmony: the text after the
// prompt's "<|start|>assistant", i.e. "<|channel|>commentary to=functions.NAME
// <|constrain|>json<|message|>" + arguments; generation then ends with the <|call|> end token. A
// tool without "parameters" takes an empty object. Fails (bmoe::Error) with a "tools..." message
// on unusable tools, names or parameter schemas, or when only_function names no tool.
std::string tool_call_gbnf(ToolFormat format, const nlohmann::ordered_json& tools, bool parallel,
                           std::string_view only_function = {});

// A new call id from the given random bits: Mistral formats need exactly 9 letters/digits (their
// templates raise otherwise); others "call_" + 24 letters/digits.
std::string new_tool_call_id(ToolFormat format, uint64_t random_bits_seed);

}  // namespace bmoe
