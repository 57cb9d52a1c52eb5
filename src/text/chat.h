// Chat prompt formats. bmoe renders the common templates itself (no Jinja engine): ChatML for
// Qwen, harmony for gpt-oss, Gemma's turn formats (Gemma 2/3 and Gemma 4), Llama 3 headers.
#pragma once

#include <string>
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

}  // namespace bmoe
