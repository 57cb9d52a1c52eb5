// Chat prompts. A model's own template (tokenizer.chat_template, Jinja) is rendered with bmoe's
// Jinja engine (chat/jinja.h); built-in formats (ChatML for Qwen, harmony for gpt-oss, Gemma's
// turn formats, Llama 3 headers) remain for files without a usable template and by name.
#pragma once

#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace bmoe {

struct ChatMessage {
  std::string role;  // "system", "user", "assistant"
  std::string content;
};

enum class ChatFormat { None, ChatML, Harmony, Gemma, Llama3, Gemma4 };

// The format to use for a model: the one its family declares (a format's name, as
// chat_format_name writes it; empty or unknown: none), else the one its chat template's markers
// show, else ChatML.
ChatFormat detect_chat_format(std::string_view family_format, const std::string& chat_template);
const char* chat_format_name(ChatFormat f);

// Renders messages followed by the assistant's turn opening. no_think: Qwen3 gets an empty
// think block; gpt-oss is primed straight into its final channel.
std::string render_chat(ChatFormat format, const std::vector<ChatMessage>& messages, bool no_think);

// What a chat template is rendered with (the variables llama.cpp and transformers pass).
struct ChatInputs {
  nlohmann::ordered_json messages = nlohmann::ordered_json::array();  // OpenAI messages
  nlohmann::ordered_json tools;  // OpenAI tool list, or null
  bool add_generation_prompt = true;
  bool enable_thinking = true;
  nlohmann::ordered_json kwargs = nlohmann::ordered_json::object();  // chat_template_kwargs, passed as variables
};

class JinjaTemplateHolder;

// A model's chat template: its own Jinja template, or a built-in format.
class ChatTemplate {
 public:
  // The template to use for a model. `choice` is what the user asked for (--chat-template):
  // empty for the model's own, a built-in format's name, a file, or template text. Where it
  // names a file, `file_text` holds what the caller read from it (text reads no files). A model
  // template that does not parse falls back to the family's declared or the closest built-in format, and
  // `warning` says so. Throws Error for a choice that names nothing usable.
  static ChatTemplate for_model(std::string_view family_format, const std::string& model_template, const std::string& choice,
                                std::string bos_text, std::string eos_text, bool tokenizer_adds_bos,
                                std::string* warning, const std::optional<std::string>& file_text = std::nullopt);
  static ChatTemplate builtin(ChatFormat format);

  // Renders a conversation. The BOS a template writes at the start is dropped when the
  // tokenizer adds one (otherwise the prompt would open with two). Throws jinja::JinjaError
  // where the template refuses the conversation (raise_exception) or fails.
  std::string apply(const ChatInputs& inputs) const;
  std::string apply(const std::vector<ChatMessage>& messages, bool no_think) const;

  bool is_jinja() const { return jinja_ != nullptr; }
  std::string_view source() const;  // the Jinja text ("" for a built-in format)
  ChatFormat format() const { return format_; }  // the built-in format, or the closest one
  const std::string& description() const { return description_; }  // for logs and /props

 private:
  std::shared_ptr<const JinjaTemplateHolder> jinja_;
  ChatFormat format_ = ChatFormat::ChatML;
  std::string bos_text_, eos_text_;
  bool strip_bos_ = false;
  std::string description_;
};

// What a --chat-template value names: nothing (the model's own), a built-in format, a file, or
// Jinja text (it holds "{{" or "{%").
enum class ChatTemplateChoice { ModelOwn, Builtin, File, Text, Invalid };
ChatTemplateChoice chat_template_choice(const std::string& choice);
std::string chat_template_choice_error(const std::string& choice);  // for Invalid

// A built-in format by name ("chatml", "harmony", ...), or None.
ChatFormat chat_format_by_name(std::string_view name);

// The tags around a model's reasoning: <think> ... </think> for most, Gemma 4's thought channel
// <|channel>thought ... <channel|> for Gemma 4.
struct ReasoningTags {
  std::string open = "<think>";
  std::string close = "</think>";
};
ReasoningTags reasoning_tags(ChatFormat format);

// Splits an answer into reasoning and content as llama-server's "deepseek" reasoning format
// does: an answer that opens with the open tag (leading whitespace aside) is reasoning up to
// the close tag, and what follows is content (each without its leading newlines); any other answer is all
// content. Fed piece by piece (a streamed answer), it holds back only what could still be the
// start of a tag, so concatenating the deltas gives the same split as feeding the whole text.
class ReasoningSplitter {
 public:
  // `opened`: the prompt already opened the think block (the answer starts as reasoning).
  explicit ReasoningSplitter(bool opened = false, ReasoningTags tags = {})
      : state_(opened ? State::ReasoningStart : State::Start), tags_(std::move(tags)) {}
  struct Delta {
    std::string reasoning;
    std::string content;
  };
  Delta feed(std::string_view piece);
  Delta finish();  // flushes what was held back (an unclosed think block is all reasoning)

 private:
  enum class State { Start, ReasoningStart, Reasoning, ContentStart, Content };
  State state_;
  ReasoningTags tags_;
  std::string held_;
};

}  // namespace bmoe
