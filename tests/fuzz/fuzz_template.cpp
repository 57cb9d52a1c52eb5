// libFuzzer target: the Jinja chat-template engine (chat/jinja.h) and ChatTemplate. Any input
// must parse and render, or be refused with JinjaError; a crash, a sanitizer report, unbounded
// memory or a hang is a bug (the engine caps nesting, steps and output).
#include <cstdint>
#include <string>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "chat/chat.h"
#include "chat/jinja.h"

namespace {

const nlohmann::ordered_json& conversation() {
  static const nlohmann::ordered_json messages = nlohmann::ordered_json::parse(R"([
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "Weather in Paris?"},
    {"role": "assistant", "content": "", "reasoning_content": "Use the tool.",
     "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris"}}}]},
    {"role": "tool", "tool_call_id": "c1", "content": "21 C"},
    {"role": "user", "content": [{"type": "text", "text": "Thanks"}]}])");
  return messages;
}

const nlohmann::ordered_json& tools() {
  static const nlohmann::ordered_json t = nlohmann::ordered_json::parse(R"([{"type": "function", "function": {
    "name": "get_weather", "description": "Weather", "parameters": {"type": "object",
    "properties": {"city": {"type": "string"}}, "required": ["city"]}}}])");
  return t;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string source(reinterpret_cast<const char*>(data), size);
  try {
    const bmoe::ChatTemplate t =
        bmoe::ChatTemplate::for_model("", source, "", "<s>", "</s>", true, nullptr);
    bmoe::ChatInputs in;
    in.messages = conversation();
    in.tools = tools();
    for (bool thinking : {true, false}) {
      in.enable_thinking = thinking;
      (void)t.apply(in);
    }
  } catch (const bmoe::jinja::JinjaError&) {
  }
  return 0;
}
