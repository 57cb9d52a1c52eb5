// libFuzzer target: the tool-call parsers and grammars (chat/tool_calls.h). Any bytes must parse
// for every format, to calls or to ok=false, without a crash, a hang or a sanitizer report; a
// parsed call's arguments must be a JSON object. Input that is a JSON array is also used as the
// request's tools: tool_call_gbnf must build a grammar or refuse with bmoe::Error, and a grammar
// it builds must pass Grammar::parse (a refusal there is a bug in tool_calls.cpp: abort).
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "text/grammar.h"
#include "chat/tool_calls.h"

namespace {

using json = nlohmann::ordered_json;

const json& tools() {
  static const json t = json::parse(R"([
    {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object", "properties": {
      "city": {"type": "string"}, "unit": {"type": "string", "enum": ["c", "f"]}, "days": {"type": "integer"},
      "tags": {"type": ["string", "null"]}}, "required": ["city"]}}},
    {"type": "function", "function": {"name": "get_time"}}])");
  return t;
}

constexpr bmoe::ToolFormat kFormats[] = {bmoe::ToolFormat::Hermes, bmoe::ToolFormat::QwenXml, bmoe::ToolFormat::Harmony,
                                         bmoe::ToolFormat::Gemma4, bmoe::ToolFormat::Lfm2, bmoe::ToolFormat::MistralList,
                                         bmoe::ToolFormat::MistralArgs, bmoe::ToolFormat::Llama3Json, bmoe::ToolFormat::GlmXml,
                                         bmoe::ToolFormat::DeepseekDsml, bmoe::ToolFormat::DeepseekR1,
                                         bmoe::ToolFormat::DeepseekV31, bmoe::ToolFormat::None};

void check(const bmoe::ParsedToolCalls& r) {
  if (r.ok == r.calls.empty()) std::abort();
  for (const auto& c : r.calls) {
    const json args = json::parse(c.arguments, nullptr, false);
    if (!args.is_object() || c.name.empty()) std::abort();
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  const json input = json::parse(text, nullptr, false);
  const bool as_tools = input.is_array();
  for (const auto f : kFormats) {
    check(bmoe::parse_tool_calls(f, text, tools()));
    if (as_tools) check(bmoe::parse_tool_calls(f, text, input));
  }
  const size_t cut = text.find('\n');
  check(bmoe::parse_harmony_call(text.substr(0, cut), cut == std::string::npos ? "" : text.substr(cut + 1)));
  if (!as_tools) return 0;
  for (const auto f : kFormats) {
    for (const bool parallel : {false, true}) {
      std::string gbnf;
      try {
        gbnf = bmoe::tool_call_gbnf(f, input, parallel);
      } catch (const bmoe::Error&) {
        continue;
      }
      try {
        bmoe::GrammarMatcher matcher(bmoe::Grammar::parse(gbnf));
        (void)matcher.accepts("<tool_call>\n{\"name\": ");
      } catch (const bmoe::Error& e) {
        std::fprintf(stderr, "tool-call grammar refused (%s): %s\n%s\n", bmoe::tool_format_name(f), e.what(), gbnf.c_str());
        std::abort();
      }
    }
  }
  return 0;
}
