// Built-in chat formats, the reasoning splitter and the reply parser (chat/chat.h,
// chat/reply.h): each split must not depend on how the text is cut into pieces.
#include <gtest/gtest.h>

#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "chat/chat.h"
#include "chat/reply.h"
#include "chat/tool_calls.h"

namespace bmoe {
namespace {

TEST(Chat, ChatMLAndNoThink) {
  const std::vector<ChatMessage> m = {{"user", "hi"}};
  EXPECT_EQ(render_chat(ChatFormat::ChatML, m, false), "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n");
  EXPECT_EQ(render_chat(ChatFormat::ChatML, m, true),
            "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n");
}

TEST(Chat, Gemma4Turns) {
  const std::string out = render_chat(detect_chat_format("gemma4", ""), {{"system", "be brief"}, {"user", "hi"}}, false);
  EXPECT_EQ(out, "<|turn>system\nbe brief<turn|>\n<|turn>user\nhi<turn|>\n<|turn>model\n");
}

TEST(Chat, HarmonyAndLlama3) {
  const std::vector<ChatMessage> m = {{"system", "be brief"}, {"user", "hi"}};
  EXPECT_EQ(render_chat(ChatFormat::Harmony, m, false),
            "<|start|>developer<|message|>be brief<|end|><|start|>user<|message|>hi<|end|><|start|>assistant");
  EXPECT_EQ(render_chat(ChatFormat::Harmony, {{"user", "hi"}}, true),
            "<|start|>user<|message|>hi<|end|><|start|>assistant<|channel|>final<|message|>");
  EXPECT_EQ(render_chat(ChatFormat::Llama3, {{"user", "hi"}}, false),
            "<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nhi<|eot_id|>"
            "<|start_header_id|>assistant<|end_header_id|>\n\n");
  // A family's declared format wins; otherwise the template's markers decide; a family name is
  // not a format (chat code knows no families).
  EXPECT_EQ(detect_chat_format("harmony", ""), ChatFormat::Harmony);
  EXPECT_EQ(detect_chat_format("gemma4", "<|im_start|>"), ChatFormat::Gemma4);
  EXPECT_EQ(detect_chat_format("", "<|start|>assistant<|channel|>final"), ChatFormat::Harmony);
  EXPECT_EQ(detect_chat_format("", "<|turn>user"), ChatFormat::Gemma4);
  EXPECT_EQ(detect_chat_format("gpt-oss", ""), ChatFormat::ChatML);
  EXPECT_EQ(detect_chat_format("", "<|im_start|>"), ChatFormat::ChatML);
}

TEST(Chat, ReasoningSplitterSeparatesTheThinkBlock) {
  struct Case {
    std::string text, reasoning, content;
  };
  const std::vector<Case> cases = {
      {"<think>\nweigh the options\n</think>\n\nThe answer.", "weigh the options\n", "The answer."},
      {"Plain answer, no thinking.", "", "Plain answer, no thinking."},
      {"  <think>x</think>y", "x", "y"},
      {"<think>\n\n</think>\n\nEmpty think block.", "", "Empty think block."},
      {"<think>never closed", "never closed", ""},
      {"<thinking is not a tag", "", "<thinking is not a tag"},
      {"a </think> in content", "", "a </think> in content"},
      {"<think>a < b, and </thin is not the end</think>ok", "a < b, and </thin is not the end", "ok"},
      {"", "", ""},
  };
  for (const Case& c : cases) {
    // Whole, and in two or three pieces split at every pair of positions: the same result.
    for (size_t i = 0; i <= c.text.size(); ++i) {
      for (size_t j = i; j <= c.text.size(); ++j) {
        ReasoningSplitter s;
        std::string reasoning, content;
        for (const std::string_view piece : {std::string_view(c.text).substr(0, i), std::string_view(c.text).substr(i, j - i),
                                             std::string_view(c.text).substr(j)}) {
          const ReasoningSplitter::Delta d = s.feed(piece);
          reasoning += d.reasoning;
          content += d.content;
        }
        const ReasoningSplitter::Delta d = s.finish();
        reasoning += d.reasoning;
        content += d.content;
        EXPECT_EQ(reasoning, c.reasoning) << c.text << " split " << i << "," << j;
        EXPECT_EQ(content, c.content) << c.text << " split " << i << "," << j;
      }
    }
  }
}

}  // namespace

namespace {
// The reply fed whole and fed one byte at a time: the deltas must add up to the same split.
struct Split {
  std::string reasoning, content;
  std::vector<ToolCall> calls;
};
Split split_reply(const ReplyOptions& options, const std::string& text, bool bytewise) {
  ReplyParser p(options);
  ReplyDelta all;
  if (bytewise) {
    for (char c : text) all.append(p.feed(std::string(1, c)));
  } else {
    all.append(p.feed(text));
  }
  all.append(p.finish());
  return {all.reasoning, all.content, p.tool_calls()};
}
Split split_both_ways(const ReplyOptions& options, const std::string& text) {
  const Split whole = split_reply(options, text, false);
  const Split bytes = split_reply(options, text, true);
  EXPECT_EQ(whole.reasoning, bytes.reasoning) << text;
  EXPECT_EQ(whole.content, bytes.content) << text;
  EXPECT_EQ(whole.calls.size(), bytes.calls.size()) << text;
  return whole;
}
}  // namespace

TEST(Reply, HarmonyChannelsBecomeReasoningContentAndCalls) {
  ReplyOptions o;
  o.harmony = true;
  o.prompt_tail = "<|start|>assistant";
  Split s = split_both_ways(o, "<|channel|>analysis<|message|>Need the weather.<|end|><|start|>assistant"
                               "<|channel|>final<|message|>It is sunny.");
  EXPECT_EQ(s.reasoning, "Need the weather.");
  EXPECT_EQ(s.content, "It is sunny.");
  EXPECT_TRUE(s.calls.empty());

  s = split_both_ways(o, "<|channel|>analysis<|message|>Need it.<|end|><|start|>assistant<|channel|>commentary "
                         "to=functions.get_weather <|constrain|>json<|message|>{\"city\": \"Paris\", \"days\": 2}");
  EXPECT_EQ(s.reasoning, "Need it.");
  EXPECT_EQ(s.content, "");
  ASSERT_EQ(s.calls.size(), 1u);
  EXPECT_EQ(s.calls[0].name, "get_weather");
  EXPECT_EQ(s.calls[0].arguments, "{\"city\":\"Paris\",\"days\":2}");

  // A preamble in the commentary channel is content; reasoning off keeps analysis as content.
  s = split_both_ways(o, "<|channel|>commentary<|message|>P<|end|><|start|>assistant<|channel|>final<|message|>F");
  EXPECT_EQ(s.content, "PF");
  o.split_reasoning = false;
  s = split_both_ways(o, "<|channel|>analysis<|message|>A<|end|><|start|>assistant<|channel|>final<|message|>F");
  EXPECT_EQ(s.reasoning, "");
  EXPECT_EQ(s.content, "AF");
}

TEST(Reply, HarmonyStartsWhereThePromptLeftIt) {
  ReplyOptions o;
  o.harmony = true;
  o.prompt_tail = "<|start|>assistant<|channel|>final<|message|>";
  Split s = split_both_ways(o, "Straight to the answer.");
  EXPECT_EQ(s.content, "Straight to the answer.");
  EXPECT_EQ(s.reasoning, "");
  // What is not a header (a model that ignores the format) is shown as content, not swallowed.
  o.prompt_tail = "<|start|>assistant";
  s = split_both_ways(o, "hello <|channel|> world");
  EXPECT_EQ(s.content, "hello <|channel|> world");
  s = split_both_ways(o, "<|channel|>analysis");  // cut off inside a header
  EXPECT_EQ(s.content, "<|channel|>analysis");
}

TEST(Reply, HarmonyHeadersDoNotDependOnHowTheTextIsCut) {
  ReplyOptions o;
  o.harmony = true;
  o.prompt_tail = "<|start|>assistant";
  // Found by review: text before a <|message|> used to be taken as a header when fed whole.
  Split s = split_both_ways(o, "<b>hi</b> and <|message|>x");
  EXPECT_EQ(s.content, "<b>hi</b> and <|message|>x");
  s = split_both_ways(o, "Sure! <|channel|>final<|message|>x");
  EXPECT_EQ(s.content, "Sure! <|channel|>final<|message|>x");
  // A call whose body is not a JSON object is shown as text, not returned as a call.
  s = split_both_ways(o, "<|channel|>commentary to=functions.f <|constrain|>json<|message|>not json");
  EXPECT_TRUE(s.calls.empty());
  EXPECT_EQ(s.content, "not json");
}

TEST(Reply, ThinkBlockOpenedByThePrompt) {
  ReplyOptions o;
  o.prompt_tail = "<|im_start|>assistant\n<think>\n";
  Split s = split_both_ways(o, "step one\n</think>\n\nThe answer.");
  EXPECT_EQ(s.reasoning, "step one\n");
  EXPECT_EQ(s.content, "The answer.");
  o.prompt_tail = "<|im_start|>assistant\n<think>\n\n</think>\n\n";  // thinking off: all content
  s = split_both_ways(o, "The answer.");
  EXPECT_EQ(s.content, "The answer.");
  EXPECT_EQ(s.reasoning, "");
  // Ling 3.0's prompt opens the block with no newline after the tag, and closes it when off.
  o.prompt_tail = "<|role_end|><role>ASSISTANT</role>\n<think>";
  s = split_both_ways(o, "step one\n</think>\n\nThe answer.");
  EXPECT_EQ(s.reasoning, "step one\n");
  EXPECT_EQ(s.content, "The answer.");
  o.prompt_tail = "<|role_end|><role>ASSISTANT</role>\n<think></think>";
  s = split_both_ways(o, "The answer.");
  EXPECT_EQ(s.content, "The answer.");
  EXPECT_EQ(s.reasoning, "");
  // A user message that ends in "<think>" does not open a block for the answer.
  o.prompt_tail = "say <think><|im_end|>\n<|im_start|>assistant\n";
  EXPECT_FALSE(prompt_opens_think_block(o.prompt_tail));
  s = split_both_ways(o, "The answer.");
  EXPECT_EQ(s.content, "The answer.");
}

TEST(Reply, Gemma4ThoughtChannelIsReasoning) {
  ReplyOptions o;
  o.reasoning_tags = reasoning_tags(ChatFormat::Gemma4);
  o.prompt_tail = "<|turn>model\n";
  Split s = split_both_ways(o, "<|channel>thought\nI'm\nthinking<channel|>Hello, world!");
  EXPECT_EQ(s.reasoning, "I'm\nthinking");
  EXPECT_EQ(s.content, "Hello, world!");
  s = split_both_ways(o, "<|channel>thought<channel|>No thoughts.");
  EXPECT_EQ(s.reasoning, "");
  EXPECT_EQ(s.content, "No thoughts.");
  s = split_both_ways(o, "Straight answer, <think>not a tag here</think>");
  EXPECT_EQ(s.content, "Straight answer, <think>not a tag here</think>");
  s = split_both_ways(o, "<|channel>thought\nall reasoning");  // cut before the channel closed
  EXPECT_EQ(s.reasoning, "all reasoning");
  EXPECT_EQ(s.content, "");
  // Reasoning kept as content where the split is off (--reasoning-format none).
  o.split_reasoning = false;
  s = split_both_ways(o, "<|channel>thought\nx<channel|>y");
  EXPECT_EQ(s.content, "<|channel>thought\nx<channel|>y");
  EXPECT_EQ(reasoning_tags(ChatFormat::ChatML).open, "<think>");
}

TEST(Reply, ToolCallsAreHeldAndParsedWhenTheAnswerEnds) {
  ReplyOptions o;
  o.tools = ToolFormat::Hermes;
  o.tool_list = nlohmann::ordered_json::parse(R"([{"type": "function", "function": {"name": "get_weather",
      "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}])");
  Split s = split_both_ways(o, "<think>\nhmm\n</think>\n\nLet me check.\n<tool_call>\n{\"name\": \"get_weather\", "
                               "\"arguments\": {\"city\": \"Paris\"}}\n</tool_call>");
  EXPECT_EQ(s.reasoning, "hmm\n");
  EXPECT_EQ(s.content, "Let me check.\n");
  ASSERT_EQ(s.calls.size(), 1u);
  EXPECT_EQ(s.calls[0].name, "get_weather");
  EXPECT_EQ(nlohmann::json::parse(s.calls[0].arguments), nlohmann::json::parse(R"({"city": "Paris"})"));
  // The start of a marker is held back while it could still become one, then released.
  ReplyParser p(o);
  EXPECT_EQ(p.feed("a <tool").content, "a ");
  EXPECT_EQ(p.finish().content, "<tool");
  // A marker followed by what is not a call: all of it is content after all.
  s = split_both_ways(o, "x <tool_call> not json");
  EXPECT_EQ(s.content, "x <tool_call> not json");
  EXPECT_TRUE(s.calls.empty());
  // A call to a function the request did not offer is text too.
  const std::string other = "<tool_call>\n{\"name\": \"launch\", \"arguments\": {}}\n</tool_call>";
  s = split_both_ways(o, other);
  EXPECT_TRUE(s.calls.empty());
  EXPECT_EQ(s.content, other);
  // parallel_tool_calls false: only the first call counts.
  const std::string call = "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"A\"}}\n</tool_call>";
  EXPECT_EQ(split_both_ways(o, call + "\n" + call).calls.size(), 2u);
  o.parallel_calls = false;
  EXPECT_EQ(split_both_ways(o, call + "\n" + call).calls.size(), 1u);
}

// DeepSeek-R1's prompt opens the think block; its calls follow the reasoning and any content,
// streamed or whole; a second call cut off by max_tokens stays text. V3.1's prompt without
// thinking closes the block, and its calls follow each other directly.
TEST(Reply, DeepseekCallsAfterTheThinkBlock) {
  const auto token = [](const std::string& words) {
    std::string out = "<\xEF\xBD\x9C";
    for (const char c : words) out += c == ' ' ? std::string("\xE2\x96\x81") : std::string(1, c);
    return out + "\xEF\xBD\x9C>";
  };
  const std::string begin = token("tool calls begin"), end = token("tool calls end"), call = token("tool call begin"),
                    call_end = token("tool call end"), sep = token("tool sep");
  ReplyOptions o;
  o.tools = ToolFormat::DeepseekR1;
  o.tool_list = nlohmann::ordered_json::parse(R"([{"type": "function", "function": {"name": "get_weather",
      "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}])");
  o.prompt_tail = "<\xEF\xBD\x9C" "Assistant\xEF\xBD\x9C><think>\n";
  const std::string paris = call + "function" + sep + "get_weather\n```json\n{\"city\": \"Paris\"}\n```" + call_end;
  Split s = split_both_ways(o, "Sunny?\n</think>\n\nLet me check." + begin + paris + "\n" + paris + end);
  EXPECT_EQ(s.reasoning, "Sunny?\n");
  EXPECT_EQ(s.content, "Let me check.");
  ASSERT_EQ(s.calls.size(), 2u);
  EXPECT_EQ(s.calls[1].name, "get_weather");
  EXPECT_EQ(s.calls[1].arguments, R"({"city":"Paris"})");
  const std::string cut = "\n" + call + "function" + sep + "get_weather\n```json\n{\"ci";
  s = split_both_ways(o, "</think>" + begin + paris + cut);
  EXPECT_EQ(s.calls.size(), 1u);
  EXPECT_EQ(s.content, cut);
  s = split_both_ways(o, "</think>I would write " + begin + " here.");
  EXPECT_TRUE(s.calls.empty());
  EXPECT_EQ(s.content, "I would write " + begin + " here.");
  o.tools = ToolFormat::DeepseekV31;
  o.prompt_tail = "<\xEF\xBD\x9C" "Assistant\xEF\xBD\x9C><think></think>";
  const std::string oslo = call + "get_weather" + sep + "{\"city\": \"Oslo\"}" + call_end;
  s = split_both_ways(o, "Checking." + begin + oslo + oslo + end);
  EXPECT_EQ(s.reasoning, "");
  EXPECT_EQ(s.content, "Checking.");
  ASSERT_EQ(s.calls.size(), 2u);
  EXPECT_EQ(s.calls[0].arguments, R"({"city":"Oslo"})");
}

}  // namespace bmoe
