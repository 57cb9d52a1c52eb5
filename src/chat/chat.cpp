#include "chat/chat.h"

#include <algorithm>
#include <filesystem>

#include "chat/jinja.h"
#include "core/error.h"
#include "text/tag_scan.h"

namespace bmoe {

ChatFormat detect_chat_format(std::string_view family_format, const std::string& chat_template) {
  if (const ChatFormat declared = chat_format_by_name(family_format); declared != ChatFormat::None) return declared;
  if (chat_template.find("<|channel|>") != std::string::npos) return ChatFormat::Harmony;
  if (chat_template.find("<|turn>") != std::string::npos) return ChatFormat::Gemma4;
  if (chat_template.find("<start_of_turn>") != std::string::npos) return ChatFormat::Gemma;
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

ChatFormat chat_format_by_name(std::string_view name) {
  for (ChatFormat f : {ChatFormat::ChatML, ChatFormat::Harmony, ChatFormat::Gemma, ChatFormat::Llama3, ChatFormat::Gemma4}) {
    if (name == chat_format_name(f)) return f;
  }
  return ChatFormat::None;
}

class JinjaTemplateHolder {
 public:
  explicit JinjaTemplateHolder(std::string_view text) : tmpl(text), source(text) {}
  jinja::Template tmpl;
  std::string source;
};

namespace {

// An assistant's tool calls with their arguments as objects: OpenAI sends them as JSON text,
// and templates iterate over them or write them with tojson (as llama.cpp hands them over).
void object_arguments(nlohmann::ordered_json& message) {
  const auto calls = message.find("tool_calls");
  if (calls == message.end() || !calls->is_array()) return;
  for (auto& call : *calls) {
    if (!call.is_object() || !call.contains("function") || !call["function"].is_object()) continue;
    auto& f = call["function"];
    if (!f.contains("arguments") || !f["arguments"].is_string()) continue;
    // Nesting is bounded as in a request body (recursion per level); deeper stays text.
    bool too_deep = false;
    const auto bounded = [&](int depth, nlohmann::ordered_json::parse_event_t, nlohmann::ordered_json&) {
      too_deep = too_deep || depth > 128;
      return !too_deep;
    };
    auto parsed = nlohmann::ordered_json::parse(f["arguments"].get<std::string>(), bounded, false);
    if (parsed.is_object() && !too_deep) f["arguments"] = std::move(parsed);
  }
}

// Messages as templates expect them: content a string (text parts joined, null as ""), as
// llama-server hands them to templates that take strings.
nlohmann::ordered_json normalized_messages(const nlohmann::ordered_json& messages) {
  nlohmann::ordered_json out = nlohmann::ordered_json::array();
  for (const auto& m : messages) {
    nlohmann::ordered_json copy = m;
    if (copy.is_object()) {
      const auto c = copy.find("content");
      if (c == copy.end() || c->is_null()) {
        copy["content"] = "";
      } else if (c->is_array()) {
        std::string text;
        for (const auto& part : *c) {
          if (part.is_object() && part.contains("text") && part["text"].is_string()) text += part["text"].get<std::string>();
        }
        *c = text;
      }
      object_arguments(copy);
    }
    out.push_back(std::move(copy));
  }
  return out;
}

}  // namespace

std::string_view ChatTemplate::source() const { return jinja_ ? std::string_view(jinja_->source) : std::string_view(); }

ChatTemplateChoice chat_template_choice(const std::string& choice) {
  if (choice.empty()) return ChatTemplateChoice::ModelOwn;
  if (chat_format_by_name(choice) != ChatFormat::None) return ChatTemplateChoice::Builtin;
  std::error_code ec;
  if (std::filesystem::is_regular_file(choice, ec)) return ChatTemplateChoice::File;
  if (choice.find("{{") != std::string::npos || choice.find("{%") != std::string::npos) return ChatTemplateChoice::Text;
  return ChatTemplateChoice::Invalid;
}

std::string chat_template_choice_error(const std::string& choice) {
  return fmt::format("'{}' is neither a built-in format (chatml, harmony, gemma, gemma4, llama3), a file nor a Jinja "
                     "template", choice);
}

ChatTemplate ChatTemplate::builtin(ChatFormat format) {
  ChatTemplate t;
  t.format_ = format;
  t.description_ = fmt::format("built-in {}", chat_format_name(format));
  return t;
}

ChatTemplate ChatTemplate::for_model(std::string_view family_format, const std::string& model_template,
                                     const std::string& choice, std::string bos_text, std::string eos_text,
                                     bool tokenizer_adds_bos, std::string* warning,
                                     const std::optional<std::string>& file_text) {
  const ChatFormat closest = detect_chat_format(family_format, model_template);
  std::string source = model_template;
  std::string origin = "the model's chat template";
  switch (chat_template_choice(choice)) {
    case ChatTemplateChoice::ModelOwn: break;
    case ChatTemplateChoice::Builtin: return builtin(chat_format_by_name(choice));
    case ChatTemplateChoice::File:
      if (!file_text) fail("--chat-template: {} names a file its caller did not read", choice);
      source = *file_text;
      origin = "chat template " + choice;
      break;
    case ChatTemplateChoice::Text:
      source = choice;
      origin = "the chat template given on the command line";
      break;
    case ChatTemplateChoice::Invalid: fail("--chat-template: {}", chat_template_choice_error(choice));
  }
  ChatTemplate t = builtin(choice.empty() ? closest : detect_chat_format(family_format, source));
  if (source.empty()) {
    if (warning) *warning = fmt::format("the model has no chat template: using the built-in {} format", chat_format_name(t.format_));
    return t;
  }
  try {
    t.jinja_ = std::make_shared<const JinjaTemplateHolder>(source);
  } catch (const jinja::JinjaError& e) {
    if (!choice.empty()) fail("--chat-template: {}", e.what());
    if (warning) *warning = fmt::format("{} does not parse ({}): using the built-in {} format", origin, e.what(), chat_format_name(t.format_));
    return t;
  }
  t.bos_text_ = std::move(bos_text);
  t.eos_text_ = std::move(eos_text);
  t.strip_bos_ = tokenizer_adds_bos && !t.bos_text_.empty();
  t.description_ = origin;
  return t;
}

std::string ChatTemplate::apply(const ChatInputs& in) const {
  if (!jinja_) {
    std::vector<ChatMessage> messages;
    for (const auto& m : normalized_messages(in.messages)) {
      messages.push_back({m.value("role", ""), m["content"].is_string() ? m["content"].get<std::string>() : m["content"].dump()});
    }
    return render_chat(format_, messages, !in.enable_thinking);
  }
  nlohmann::ordered_json context = in.kwargs.is_object() ? in.kwargs : nlohmann::ordered_json::object();
  context["messages"] = normalized_messages(in.messages);
  if (!in.tools.is_null() && !in.tools.empty()) context["tools"] = in.tools;
  context["add_generation_prompt"] = in.add_generation_prompt;
  if (!context.contains("enable_thinking")) context["enable_thinking"] = in.enable_thinking;
  context["bos_token"] = bos_text_;
  context["eos_token"] = eos_text_;
  std::string out = jinja_->tmpl.render(jinja::Value::from_json(context));
  if (strip_bos_ && out.starts_with(bos_text_)) out.erase(0, bos_text_.size());
  return out;
}

std::string ChatTemplate::apply(const std::vector<ChatMessage>& messages, bool no_think) const {
  ChatInputs in;
  for (const auto& m : messages) in.messages.push_back({{"role", m.role}, {"content", m.content}});
  in.enable_thinking = !no_think;
  return apply(in);
}

ReasoningTags reasoning_tags(ChatFormat format) {
  if (format == ChatFormat::Gemma4) return {"<|channel>thought", "<channel|>"};
  return {};
}

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
        const std::string_view open = tags_.open;
        if (rest.substr(0, open.size()) == open) {
          held_.erase(0, first + open.size());
          state_ = State::ReasoningStart;
          progress = true;
        } else if (open.substr(0, rest.size()) == rest) {
          return d;  // could still become the open tag
        } else {
          state_ = State::Content;
          progress = true;
        }
        break;
      }
      case State::Reasoning: {
        const size_t close = held_.find(tags_.close);
        if (close != std::string::npos) {
          d.reasoning += held_.substr(0, close);
          held_.erase(0, close + tags_.close.size());
          state_ = State::ContentStart;
          progress = true;
        } else {
          const size_t keep = partial_tag_length(held_, {tags_.close});
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
