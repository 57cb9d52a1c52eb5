#include "serve/anthropic_messages.h"

#include "serve/json_fields.h"
#include "serve/response.h"

namespace bmoe {

using namespace json_fields;

namespace {

// A block list's text (string content, or its text blocks joined); other blocks are refused.
std::string text_of(const json& content, const std::string& where) {
  if (content.is_string()) return content.get<std::string>();
  if (!content.is_array()) bad_request(where + " must be a string or a list of content blocks", "messages");
  std::string out;
  for (const json& b : content) {
    if (string_member(b, "type") != "text" || !b.contains("text") || !b["text"].is_string()) {
      bad_request(where + ": only text blocks are supported here", "messages");
    }
    out += b["text"].get<std::string>();
  }
  return out;
}

// A user turn: its tool_result blocks become tool messages (first, in order), its text one
// user message.
void add_user_turn(const json& content, size_t i, json& out) {
  const std::string where = fmt::format("messages[{}].content", i);
  if (content.is_string()) return out.push_back({{"role", "user"}, {"content", content}});
  if (!content.is_array()) bad_request(where + " must be a string or a list of content blocks", "messages");
  std::string text;
  for (const json& b : content) {
    const std::string type = string_member(b, "type");
    if (type == "text" && b.contains("text") && b["text"].is_string()) {
      text += b["text"].get<std::string>();
    } else if (type == "tool_result") {
      const std::string result = b.contains("content") ? text_of(b["content"], where + " tool_result") : "";
      out.push_back({{"role", "tool"}, {"tool_call_id", string_member(b, "tool_use_id")}, {"content", result}});
    } else {
      bad_request(fmt::format("{}: unsupported block type '{}' (text, tool_result)", where, utf8_sanitize(type)), "messages");
    }
  }
  if (!text.empty()) out.push_back({{"role", "user"}, {"content", text}});
}

// An assistant turn: text, thinking (as reasoning_content) and tool_use blocks (as tool_calls).
json assistant_turn(const json& content, size_t i) {
  const std::string where = fmt::format("messages[{}].content", i);
  json m = {{"role", "assistant"}};
  if (content.is_string()) return m["content"] = content, m;
  if (!content.is_array()) bad_request(where + " must be a string or a list of content blocks", "messages");
  std::string text, thinking;
  json calls = json::array();
  for (const json& b : content) {
    const std::string type = string_member(b, "type");
    if (type == "text") text += string_member(b, "text");
    else if (type == "thinking") thinking += string_member(b, "thinking");
    else if (type == "redacted_thinking") continue;
    else if (type == "tool_use") {
      const json input = b.contains("input") ? b["input"] : json::object();
      calls.push_back({{"id", string_member(b, "id")}, {"type", "function"},
                       {"function", {{"name", string_member(b, "name")}, {"arguments", input.dump()}}}});
    } else {
      bad_request(fmt::format("{}: unsupported block type '{}' (text, thinking, tool_use)", where, utf8_sanitize(type)), "messages");
    }
  }
  m["content"] = text;
  if (!thinking.empty()) m["reasoning_content"] = thinking;
  if (!calls.empty()) m["tool_calls"] = calls;
  return m;
}

json chat_messages_of(const json& body) {
  json out = json::array();
  if (body.contains("system") && !body["system"].is_null()) {
    out.push_back({{"role", "system"}, {"content", text_of(body["system"], "'system'")}});
  }
  if (!body.contains("messages") || !body["messages"].is_array() || body["messages"].empty()) {
    bad_request("'messages' must be a non-empty array", "messages");
  }
  size_t i = 0;
  for (const json& m : body["messages"]) {
    const std::string role = string_member(m, "role");
    if (!m.is_object() || !m.contains("content")) bad_request(fmt::format("messages[{}] needs 'role' and 'content'", i), "messages");
    if (role == "user") add_user_turn(m["content"], i, out);
    else if (role == "assistant") out.push_back(assistant_turn(m["content"], i));
    else bad_request(fmt::format("messages[{}]: role must be \"user\" or \"assistant\"", i), "messages");
    ++i;
  }
  return out;
}

json tools_of(const json& tools) {
  if (!tools.is_array()) bad_request("'tools' must be an array", "tools");
  json out = json::array();
  for (const json& t : tools) {
    if (!t.is_object() || !t.contains("name")) bad_request("each tool needs a 'name'", "tools");
    json f = {{"name", t["name"]}};
    if (t.contains("description")) f["description"] = t["description"];
    f["parameters"] = t.contains("input_schema") ? t["input_schema"] : json{{"type", "object"}};
    out.push_back({{"type", "function"}, {"function", f}});
  }
  return out;
}

// tool_choice {type: auto | any | tool (with name) | none, disable_parallel_tool_use}.
void tool_choice_of(const json& choice, json& chat) {
  if (!choice.is_object()) bad_request("'tool_choice' must be an object with a 'type'", "tool_choice");
  const std::string type = string_member(choice, "type");
  if (type == "auto") chat["tool_choice"] = "auto";
  else if (type == "any") chat["tool_choice"] = "required";
  else if (type == "none") chat["tool_choice"] = "none";
  else if (type == "tool") chat["tool_choice"] = {{"type", "function"}, {"function", {{"name", string_member(choice, "name")}}}};
  else bad_request("'tool_choice' type must be \"auto\", \"any\", \"tool\" or \"none\"", "tool_choice");
  if (bool_field(choice, "disable_parallel_tool_use", false)) chat["parallel_tool_calls"] = false;
}

// thinking {type: enabled (budget_tokens) | disabled}: the template's enable_thinking, and the
// budget as llama-server's reasoning_budget_tokens (the close tag forced after that many).
void thinking_of(const json& thinking, json& chat) {
  const std::string type = thinking.is_object() ? string_member(thinking, "type") : "";
  if (type != "enabled" && type != "disabled") bad_request("'thinking' must be {\"type\": \"enabled\"} or {\"type\": \"disabled\"}", "thinking");
  chat["chat_template_kwargs"] = {{"enable_thinking", type == "enabled"}};
  if (type == "enabled" && thinking.contains("budget_tokens") && !thinking["budget_tokens"].is_null()) {
    chat["reasoning_budget_tokens"] = int_field(thinking, "budget_tokens", 1, 1, 1 << 24);
  }
}

}  // namespace

json messages_to_chat_body(const json& body, bool count_only) {
  static const std::set<std::string> kFields = {"model", "messages", "max_tokens", "system", "stop_sequences", "stream",
                                                "temperature", "top_p", "top_k", "tools", "tool_choice", "thinking",
                                                "metadata", "service_tier"};
  reject_unknown_fields(body, kFields);
  if (!count_only && !body.contains("max_tokens")) bad_request("max_tokens: Field required", "max_tokens");
  if (!body.contains("model") || !body["model"].is_string()) bad_request("model: Field required", "model");
  json chat = {{"model", body["model"]}, {"messages", chat_messages_of(body)}};
  for (const char* key : {"max_tokens", "temperature", "top_p", "top_k", "stream"}) {
    if (body.contains(key) && !body[key].is_null()) chat[key] = body[key];
  }
  number_field(body, "temperature", 1.0, 0.0, 1.0);  // Anthropic's range
  if (body.contains("stop_sequences") && !body["stop_sequences"].is_null()) chat["stop"] = body["stop_sequences"];
  if (body.contains("tools") && !body["tools"].is_null()) chat["tools"] = tools_of(body["tools"]);
  if (body.contains("tool_choice") && !body["tool_choice"].is_null()) tool_choice_of(body["tool_choice"], chat);
  if (body.contains("thinking") && !body["thinking"].is_null()) thinking_of(body["thinking"], chat);
  return chat;
}

MessagesRequest parse_messages_request(const std::string& text, const RequestContext& context, bool count_only) {
  const json body = parse_body(text);
  const json chat = messages_to_chat_body(body, count_only);
  MessagesRequest r;
  r.chat = parse_completion_request(chat.dump(), true, context);
  r.stop_sequences = r.chat.params.stop;
  return r;
}

json anthropic_error(int status, const std::string& message) {
  const char* type = status == 401   ? "authentication_error"
                     : status == 403 ? "permission_error"
                     : status == 404 ? "not_found_error"
                     : status == 413 ? "request_too_large"
                     : status == 429 ? "rate_limit_error"
                     : status == 503 ? "overloaded_error"
                     : status >= 500 ? "api_error"
                                     : "invalid_request_error";
  return {{"type", "error"}, {"error", {{"type", type}, {"message", message}}}};
}

namespace {

std::string tool_use_id(const ToolCall& call) {
  return call.id.empty() ? "toolu_" + new_response_id("x").substr(2) : call.id;
}

json input_of(const ToolCall& call) {
  try {
    return json::parse(call.arguments);
  } catch (const json::exception&) {
    return json::object();  // the parser only passes objects; kept safe all the same
  }
}

std::string stop_reason(const MessagesAnswer& a, const GenerateResult& r, bool called, std::string& sequence) {
  if (r.finish_reason == "length") return "max_tokens";
  if (called) return "tool_use";
  sequence = stop_sequence_hit(r, a.stop_sequences, *a.tokenizer);
  return sequence.empty() ? "end_turn" : "stop_sequence";
}

json usage(int input, int output) { return {{"input_tokens", input}, {"output_tokens", output}}; }

}  // namespace

json messages_response(const MessagesAnswer& a, const GenerateResult& r) {
  const ReplyParts parts = reply_parts(a.reply, r.text);
  json content = json::array();
  if (!parts.reasoning.empty()) content.push_back({{"type", "thinking"}, {"thinking", parts.reasoning}, {"signature", ""}});
  if (!parts.text.empty() || (parts.calls.empty() && parts.reasoning.empty())) content.push_back({{"type", "text"}, {"text", parts.text}});
  for (const ToolCall& call : parts.calls) {
    content.push_back({{"type", "tool_use"}, {"id", tool_use_id(call)}, {"name", utf8_sanitize(call.name)}, {"input", input_of(call)}});
  }
  std::string sequence;
  const std::string reason = stop_reason(a, r, !parts.calls.empty(), sequence);
  return {{"id", a.id}, {"type", "message"}, {"role", "assistant"}, {"model", a.model}, {"content", content},
          {"stop_reason", reason}, {"stop_sequence", sequence.empty() ? json(nullptr) : json(sequence)},
          {"usage", usage(r.prompt_tokens, static_cast<int>(r.tokens.size()))}};
}

namespace {

class MessagesStream : public PartStream {
 public:
  MessagesStream(MessagesAnswer a, int input_tokens) : PartStream(a.reply), a_(std::move(a)), input_(input_tokens) {}

 private:
  bool event(const json& j) { return send(named_event(j["type"].get<std::string>(), j.dump())); }

  bool start() override {
    json message = {{"id", a_.id}, {"type", "message"}, {"role", "assistant"}, {"model", a_.model},
                    {"content", json::array()}, {"stop_reason", nullptr}, {"stop_sequence", nullptr}, {"usage", usage(input_, 0)}};
    return event({{"type", "message_start"}, {"message", message}});
  }

  // Opens a block of `type` unless it is the open one (closing that first).
  bool open(const std::string& type, json block) {
    if (open_ == type) return true;
    if (!close()) return false;
    open_ = type;
    return event({{"type", "content_block_start"}, {"index", index_}, {"content_block", std::move(block)}});
  }

  bool close() {
    if (open_.empty()) return true;
    if (open_ == "thinking" && !event({{"type", "content_block_delta"}, {"index", index_}, {"delta", {{"type", "signature_delta"}, {"signature", ""}}}})) {
      return false;
    }
    open_.clear();
    return event({{"type", "content_block_stop"}, {"index", index_++}});
  }

  bool reasoning(const std::string& text) override {
    return open("thinking", {{"type", "thinking"}, {"thinking", ""}, {"signature", ""}}) &&
           event({{"type", "content_block_delta"}, {"index", index_}, {"delta", {{"type", "thinking_delta"}, {"thinking", text}}}});
  }

  bool text(const std::string& text) override {
    return open("text", {{"type", "text"}, {"text", ""}}) &&
           event({{"type", "content_block_delta"}, {"index", index_}, {"delta", {{"type", "text_delta"}, {"text", text}}}});
  }

  bool call(const ToolCall& c) {
    json block = {{"type", "tool_use"}, {"id", tool_use_id(c)}, {"name", utf8_sanitize(c.name)}, {"input", json::object()}};
    if (!close() || !event({{"type", "content_block_start"}, {"index", index_}, {"content_block", block}})) return false;
    open_ = "tool_use";
    return event({{"type", "content_block_delta"}, {"index", index_}, {"delta", {{"type", "input_json_delta"}, {"partial_json", input_of(c).dump()}}}});
  }

  bool finish(const Job& job, const std::vector<ToolCall>& calls) override {
    const bool called = a_.reply.tools != ToolFormat::None && !calls.empty();
    for (size_t i = 0; called && i < calls.size(); ++i) {
      if (!call(calls[i])) return false;
    }
    if (index_ == 0 && open_.empty() && !open("text", {{"type", "text"}, {"text", ""}})) return false;  // never no block
    if (!close()) return false;
    const GenerateResult& r = job.results.front();
    std::string sequence;
    const std::string reason = stop_reason(a_, r, called, sequence);
    json delta = {{"stop_reason", reason}, {"stop_sequence", sequence.empty() ? json(nullptr) : json(sequence)}};
    return event({{"type", "message_delta"}, {"delta", delta}, {"usage", {{"output_tokens", r.tokens.size()}}}}) &&
           event({{"type", "message_stop"}});
  }

  bool fail(const Job& job) override { return event(anthropic_error(job.error_status, job.error)); }
  bool keep_alive() override { return event({{"type", "ping"}}); }

  MessagesAnswer a_;
  int input_;
  std::string open_;  // the open block's type ("" for none)
  int index_ = 0;
};

}  // namespace

std::shared_ptr<JobStream> messages_stream(const MessagesAnswer& a, int input_tokens) {
  return std::make_shared<MessagesStream>(a, input_tokens);
}

}  // namespace bmoe
