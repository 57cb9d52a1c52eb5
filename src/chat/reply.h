// A chat answer split the way OpenAI reports it: reasoning_content, content and tool_calls.
//
// The answer arrives piece by piece (a streamed reply). Reasoning is either a <think> block
// (llama-server's "deepseek" reasoning format; the block may have been opened by the prompt, as
// Qwen3.5's template does), Gemma 4's thought channel (<|channel>thought ... <channel|>), or, for the harmony format (gpt-oss), the analysis channel; harmony's
// final and commentary channels are content and a `to=functions.NAME` message is a tool call.
// In the other formats tool calls are found in the content by their format's markers
// (chat/tool_calls.h): from the first marker on, the text is held back and parsed when the
// answer ends; what does not parse as calls, or calls a function the request did not offer, is
// content after all.
//
// Contract: the deltas concatenated do not depend on how the answer was cut into pieces; only
// text that could still turn out to be a tag or a call is held back, and finish() releases it.
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <vector>

#include "chat/chat.h"
#include "chat/tool_calls.h"

namespace bmoe {

struct ReplyOptions {
  bool split_reasoning = true;  // reasoning goes to its own field (false: it stays in content)
  bool harmony = false;         // the answer is in the harmony format
  ReasoningTags reasoning_tags;  // the tags around reasoning (chat/chat.h: reasoning_tags)
  ToolFormat tools = ToolFormat::None;  // None: no tool calls are looked for
  nlohmann::ordered_json tool_list = nlohmann::ordered_json::array();  // the request's tools
  // The end of the rendered prompt (a few tokens, special ones spelled out): whether the answer
  // starts inside a think block or a harmony message.
  std::string prompt_tail;
  bool parallel_calls = true;  // false: only the first call counts (parallel_tool_calls)
};

// Whether a prompt ending in `prompt_tail` leaves the answer inside a think block it opened
// (Qwen3.5's generation prompt ends with "<think>\n"); `open_tag` is the block's opening tag.
bool prompt_opens_think_block(std::string_view prompt_tail, std::string_view open_tag = "<think>");

struct ReplyDelta {
  std::string reasoning;
  std::string content;
  bool empty() const { return reasoning.empty() && content.empty(); }
  void append(const ReplyDelta& d) {
    reasoning += d.reasoning;
    content += d.content;
  }
};

class ReplyParser {
 public:
  explicit ReplyParser(ReplyOptions options);
  ~ReplyParser();
  ReplyParser(ReplyParser&&) noexcept;
  ReplyParser& operator=(ReplyParser&&) noexcept;

  ReplyDelta feed(std::string_view piece);
  ReplyDelta finish();  // the answer has ended: releases what was held, parses the tool calls
  // The calls found (complete after finish()); their ids are left to the caller.
  const std::vector<ToolCall>& tool_calls() const { return calls_; }

 private:
  class Harmony;
  class ToolText;
  ReplyDelta route(ReplyDelta d, bool ending);  // content through the tool-call stage

  ReplyOptions options_;
  ReasoningSplitter think_;
  std::unique_ptr<Harmony> harmony_;
  std::unique_ptr<ToolText> tool_text_;
  std::vector<ToolCall> calls_;
};

}  // namespace bmoe
