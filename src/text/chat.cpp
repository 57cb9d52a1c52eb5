#include "text/chat.h"

#include <algorithm>

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

namespace {
constexpr std::string_view kThinkOpen = "<think>";
constexpr std::string_view kThinkClose = "</think>";

// Length of the longest suffix of `text` that is a proper prefix of `tag`.
size_t partial_tag_suffix(std::string_view text, std::string_view tag) {
  for (size_t n = std::min(text.size(), tag.size() - 1); n > 0; --n) {
    if (text.substr(text.size() - n) == tag.substr(0, n)) return n;
  }
  return 0;
}
}  // namespace

ReasoningSplitter::Delta ReasoningSplitter::feed(std::string_view piece) {
  Delta d;
  held_.append(piece);
  for (bool progress = true; progress;) {
    progress = false;
    switch (state_) {
      case State::Start: {
        const size_t first = held_.find_first_not_of(" \t\r\n");
        if (first == std::string::npos) return d;  // only whitespace so far
        const std::string_view rest = std::string_view(held_).substr(first);
        if (rest.substr(0, kThinkOpen.size()) == kThinkOpen) {
          held_.erase(0, first + kThinkOpen.size());
          state_ = State::ReasoningStart;
          progress = true;
        } else if (kThinkOpen.substr(0, rest.size()) == rest) {
          return d;  // could still become <think>
        } else {
          state_ = State::Content;
          progress = true;
        }
        break;
      }
      case State::Reasoning: {
        const size_t close = held_.find(kThinkClose);
        if (close != std::string::npos) {
          d.reasoning += held_.substr(0, close);
          held_.erase(0, close + kThinkClose.size());
          state_ = State::ContentStart;
          progress = true;
        } else {
          const size_t keep = partial_tag_suffix(held_, kThinkClose);
          d.reasoning += held_.substr(0, held_.size() - keep);
          held_.erase(0, held_.size() - keep);
        }
        break;
      }
      case State::ReasoningStart:
      case State::ContentStart: {
        const size_t first = held_.find_first_not_of('\n');
        if (first == std::string::npos) {
          held_.clear();
          return d;
        }
        held_.erase(0, first);
        state_ = state_ == State::ReasoningStart ? State::Reasoning : State::Content;
        progress = true;
        break;
      }
      case State::Content:
        d.content += held_;
        held_.clear();
        break;
    }
  }
  return d;
}

ReasoningSplitter::Delta ReasoningSplitter::finish() {
  Delta d;
  if (state_ == State::Reasoning) d.reasoning = held_;
  else if (state_ == State::Start || state_ == State::Content) d.content = held_;
  held_.clear();
  return d;
}

}  // namespace bmoe
