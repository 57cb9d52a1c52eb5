// Chat prompt formats. bmoe renders the common templates itself (no Jinja engine): ChatML for
// Qwen, harmony for gpt-oss, Gemma's turn formats (Gemma 2/3 and Gemma 4), Llama 3 headers.
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace bmoe {

struct ChatMessage {
  std::string role;  // "system", "user", "assistant"
  std::string content;
};

enum class ChatFormat { None, ChatML, Harmony, Gemma, Llama3, Gemma4 };

// The format to use for a model: from its architecture and chat template text.
ChatFormat detect_chat_format(const std::string& arch, const std::string& chat_template);
const char* chat_format_name(ChatFormat f);

// Renders messages followed by the assistant's turn opening. no_think: Qwen3 gets an empty
// think block; gpt-oss is primed straight into its final channel.
std::string render_chat(ChatFormat format, const std::vector<ChatMessage>& messages, bool no_think);

// Splits an answer into reasoning and content as llama-server's "deepseek" reasoning format
// does: an answer that opens with <think> (leading whitespace aside) is reasoning up to
// </think>, and what follows is content (each without its leading newlines); any other answer is all
// content. Fed piece by piece (a streamed answer), it holds back only what could still be the
// start of a tag, so concatenating the deltas gives the same split as feeding the whole text.
class ReasoningSplitter {
 public:
  struct Delta {
    std::string reasoning;
    std::string content;
  };
  Delta feed(std::string_view piece);
  Delta finish();  // flushes what was held back (an unclosed think block is all reasoning)

 private:
  enum class State { Start, ReasoningStart, Reasoning, ContentStart, Content };
  State state_ = State::Start;
  std::string held_;
};

}  // namespace bmoe
