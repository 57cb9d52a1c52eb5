#include "chat/reply.h"

#include <algorithm>

#include "text/tag_scan.h"

namespace bmoe {

namespace {

constexpr std::string_view kStart = "<|start|>";
constexpr std::string_view kChannel = "<|channel|>";
constexpr std::string_view kMessage = "<|message|>";
constexpr std::string_view kEnd = "<|end|>";
const std::vector<std::string> kEndTag = {std::string(kEnd)};
constexpr std::string_view kConstrain = "<|constrain|>";
constexpr size_t kMaxHeader = 256;  // longer "headers" are text the model wrote, not a header

// The word after `key` in a harmony header ("analysis" after <|channel|>, "functions.f" after
// "to="), up to whitespace or the next marker.
std::string header_word(std::string_view header, std::string_view key) {
  const size_t at = header.find(key);
  if (at == std::string_view::npos) return {};
  std::string_view rest = header.substr(at + key.size());
  const size_t end = std::min(rest.find_first_of(" \t\n<"), rest.size());
  return std::string(rest.substr(0, end));
}

// Whether `text` could be (the start of) a harmony header.
bool could_be_header(std::string_view text) {
  for (std::string_view opener : {kChannel, kStart, kConstrain, std::string_view(" to="), std::string_view("to=")}) {
    const size_t n = std::min(text.size(), opener.size());
    if (text.substr(0, n) == opener.substr(0, n)) return true;
  }
  return false;
}

}  // namespace

// The harmony format: messages `[<|start|>ROLE]<|channel|>CHANNEL[ to=RECIPIENT][ <|constrain|>json]
// <|message|>BODY<|end|>`. analysis -> reasoning; final and commentary -> content; a message to
// functions.NAME -> a tool call whose arguments are the body.
class ReplyParser::Harmony {
 public:
  Harmony(bool split_reasoning, std::string_view prompt_tail, std::vector<ToolCall>* calls)
      : split_reasoning_(split_reasoning), calls_(calls) {
    // The prompt may already have opened a message (e.g. "<|channel|>final<|message|>").
    const size_t start = prompt_tail.rfind(kStart);
    const std::string_view last = start == std::string_view::npos ? prompt_tail : prompt_tail.substr(start);
    if (last.size() >= kMessage.size() && last.substr(last.size() - kMessage.size()) == kMessage) {
      open_message(last.substr(0, last.size() - kMessage.size()));
    }
  }

  ReplyDelta feed(std::string_view piece) {
    ReplyDelta d;
    held_.append(piece);
    while (in_body_ ? body_step(d) : header_step()) {
    }
    return d;
  }

  ReplyDelta finish() {
    ReplyDelta d;
    if (in_body_) {
      emit(d, held_);
      close_message(d);
    } else {
      d.content += held_;  // an unfinished header is text after all
    }
    held_.clear();
    return d;
  }

 private:
  enum class Kind { Reasoning, Content, Call };

  // Consumes a header once its <|message|> arrives; false when it needs more text.
  bool header_step() {
    if (held_.empty()) return false;
    // A header opens with a marker and is short; anything else is text, shown as content (so
    // where the answer was cut into pieces cannot change what counts as a header).
    if (!could_be_header(held_)) {
      open_message({});
      return true;
    }
    const size_t message = held_.find(kMessage);
    if (message == std::string::npos || message > kMaxHeader) {
      if (held_.size() <= kMaxHeader) return false;
      open_message({});
      return true;
    }
    open_message(std::string_view(held_).substr(0, message));
    held_.erase(0, message + kMessage.size());
    return true;
  }

  // Emits body text up to <|end|> (or all but a possible start of it); false when it needs more.
  bool body_step(ReplyDelta& d) {
    const size_t end = held_.find(kEnd);
    if (end == std::string::npos) {
      const size_t keep = partial_tag_length(held_, kEndTag);
      emit(d, std::string_view(held_).substr(0, held_.size() - keep));
      held_.erase(0, held_.size() - keep);
      return false;
    }
    emit(d, std::string_view(held_).substr(0, end));
    held_.erase(0, end + kEnd.size());
    close_message(d);
    return true;
  }

  void open_message(std::string_view header) {
    in_body_ = true;
    const std::string recipient = header_word(header, "to=");
    const std::string channel = header_word(header, kChannel);
    if (recipient.rfind("functions.", 0) == 0) {
      kind_ = Kind::Call;
      call_recipient_ = recipient;
      call_body_.clear();
    } else {
      kind_ = channel == "analysis" ? Kind::Reasoning : Kind::Content;
    }
  }

  void emit(ReplyDelta& d, std::string_view text) {
    if (kind_ == Kind::Call) call_body_ += text;
    else if (kind_ == Kind::Reasoning && split_reasoning_) d.reasoning += text;
    else d.content += text;
  }

  // A call whose body is not a JSON object is not a call: its text is shown as content.
  void close_message(ReplyDelta& d) {
    if (in_body_ && kind_ == Kind::Call) {
      ParsedToolCalls parsed = parse_harmony_call(call_recipient_, call_body_);
      if (parsed.ok) calls_->push_back(std::move(parsed.calls.front()));
      else d.content += call_body_;
    }
    in_body_ = false;
  }

  bool split_reasoning_;
  std::vector<ToolCall>* calls_;
  std::string held_;
  bool in_body_ = false;
  Kind kind_ = Kind::Content;
  std::string call_recipient_, call_body_;
};

// The content stream of the other formats: content until a tool-call marker, then everything
// is held and parsed as calls when the answer ends.
class ReplyParser::ToolText {
 public:
  ToolText(ToolFormat format, const nlohmann::ordered_json& tools, bool parallel, std::vector<ToolCall>* calls)
      : format_(format), tools_(tools), parallel_(parallel), markers_(tool_call_markers(format)), calls_(calls) {}

  std::string feed(std::string_view piece) {
    held_.append(piece);
    if (in_calls_) return {};
    const size_t first = first_tag(held_, markers_);
    if (first != std::string::npos) {
      in_calls_ = true;
      std::string out = held_.substr(0, first);
      held_.erase(0, first);
      return out;
    }
    const size_t keep = partial_tag_length(held_, markers_);
    std::string out = held_.substr(0, held_.size() - keep);
    held_.erase(0, held_.size() - keep);
    return out;
  }

  std::string finish() {
    std::string out;
    out.swap(held_);
    if (!in_calls_) return out;
    ParsedToolCalls parsed = parse_tool_calls(format_, out, tools_);
    // Not calls after all (or calls to functions the request does not offer, such as a JSON
    // answer with a "name" key in the Llama 3.1 format): the text is content.
    if (!parsed.ok || !std::all_of(parsed.calls.begin(), parsed.calls.end(), [&](const ToolCall& c) { return offered(c.name); })) {
      return out;
    }
    if (!parallel_) parsed.calls.resize(1);
    calls_->insert(calls_->end(), parsed.calls.begin(), parsed.calls.end());
    return parsed.rest;
  }

 private:
  bool offered(const std::string& name) const {
    return std::any_of(tools_.begin(), tools_.end(), [&](const nlohmann::ordered_json& t) {
      return t.is_object() && t.contains("function") && t["function"].is_object() && t["function"].value("name", "") == name;
    });
  }

  ToolFormat format_;
  nlohmann::ordered_json tools_;
  bool parallel_;
  std::vector<std::string> markers_;
  std::vector<ToolCall>* calls_;
  std::string held_;
  bool in_calls_ = false;
};

bool prompt_opens_think_block(std::string_view prompt_tail, std::string_view open_tag) {
  const size_t end = prompt_tail.find_last_not_of(" \t\r\n");
  if (end == std::string_view::npos) return false;
  const std::string_view text = prompt_tail.substr(0, end + 1);
  return !open_tag.empty() && text.ends_with(open_tag);
}

ReplyParser::ReplyParser(ReplyOptions options)
    : options_(std::move(options)),
      think_(options_.split_reasoning && prompt_opens_think_block(options_.prompt_tail, options_.reasoning_tags.open),
             options_.reasoning_tags) {
  if (options_.harmony) {
    harmony_ = std::make_unique<Harmony>(options_.split_reasoning, options_.prompt_tail, &calls_);
  } else if (options_.tools != ToolFormat::None) {
    tool_text_ = std::make_unique<ToolText>(options_.tools, options_.tool_list, options_.parallel_calls, &calls_);
  }
}

ReplyParser::~ReplyParser() = default;
ReplyParser::ReplyParser(ReplyParser&&) noexcept = default;
ReplyParser& ReplyParser::operator=(ReplyParser&&) noexcept = default;

ReplyDelta ReplyParser::feed(std::string_view piece) {
  if (harmony_) return harmony_->feed(piece);
  if (!options_.split_reasoning) return route({{}, std::string(piece)}, false);
  const ReasoningSplitter::Delta d = think_.feed(piece);
  return route({d.reasoning, d.content}, false);
}

ReplyDelta ReplyParser::finish() {
  if (harmony_) return harmony_->finish();
  ReplyDelta d;
  if (options_.split_reasoning) {
    const ReasoningSplitter::Delta rest = think_.finish();
    d = {rest.reasoning, rest.content};
  }
  return route(std::move(d), true);
}

ReplyDelta ReplyParser::route(ReplyDelta d, bool ending) {
  if (!tool_text_) return d;
  d.content = tool_text_->feed(d.content);
  if (ending) d.content += tool_text_->finish();
  return d;
}

}  // namespace bmoe
