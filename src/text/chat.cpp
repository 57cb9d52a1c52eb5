#include "text/chat.h"

namespace bmoe {

ChatFormat detect_chat_format(const std::string& arch, const std::string& chat_template) {
  if (arch == "gpt-oss" || chat_template.find("<|channel|>") != std::string::npos) return ChatFormat::Harmony;
  if (arch == "gemma4" || chat_template.find("<|turn>") != std::string::npos) return ChatFormat::Gemma4;
  if (arch.starts_with("gemma") || chat_template.find("<start_of_turn>") != std::string::npos) return ChatFormat::Gemma;
  if (chat_template.find("<|start_header_id|>") != std::string::npos) return ChatFormat::Llama3;
  return ChatFormat::ChatML;
}

const char* chat_format_name(ChatFormat f) {
  switch (f) {
    case ChatFormat::None: return "none";
    case ChatFormat::ChatML: return "chatml";
    case ChatFormat::Harmony: return "harmony";
    case ChatFormat::Gemma: return "gemma";
    case ChatFormat::Llama3: return "llama3";
    case ChatFormat::Gemma4: return "gemma4";
  }
  return "?";
}

std::string render_chat(ChatFormat format, const std::vector<ChatMessage>& messages, bool no_think) {
  std::string out;
  switch (format) {
    case ChatFormat::None:
      for (const auto& m : messages) out += m.content;
      return out;
    case ChatFormat::ChatML:
      for (const auto& m : messages) out += "<|im_start|>" + m.role + "\n" + m.content + "<|im_end|>\n";
      out += "<|im_start|>assistant\n";
      if (no_think) out += "<think>\n\n</think>\n\n";
      return out;
    case ChatFormat::Harmony:
      for (const auto& m : messages) {
        const std::string role = m.role == "system" ? "developer" : m.role;
        out += "<|start|>" + role + "<|message|>" + m.content + "<|end|>";
      }
      out += "<|start|>assistant";
      if (no_think) out += "<|channel|>final<|message|>";
      return out;
    case ChatFormat::Gemma:
      for (const auto& m : messages) {
        const std::string role = m.role == "assistant" ? "model" : "user";
        out += "<start_of_turn>" + role + "\n" + m.content + "<end_of_turn>\n";
      }
      out += "<start_of_turn>model\n";
      return out;
    case ChatFormat::Gemma4:
      // Thinking stays off unless a system prompt asks for it with <|think|>.
      for (const auto& m : messages) {
        const std::string role = m.role == "assistant" ? "model" : m.role;
        out += "<|turn>" + role + "\n" + m.content + "<turn|>\n";
      }
      out += "<|turn>model\n";
      return out;
    case ChatFormat::Llama3:
      out += "<|begin_of_text|>";
      for (const auto& m : messages) {
        out += "<|start_header_id|>" + m.role + "<|end_header_id|>\n\n" + m.content + "<|eot_id|>";
      }
      out += "<|start_header_id|>assistant<|end_header_id|>\n\n";
      return out;
  }
  return out;
}

}  // namespace bmoe
