#include "serve/responses_api.h"

#include "serve/json_fields.h"
#include "serve/response.h"

namespace bmoe {

using namespace json_fields;

void ResponseStore::put(const std::string& id, json messages) {
  std::lock_guard<std::mutex> lock(mutex_);
  conversations_[id] = std::move(messages);
  order_.push_back(id);
  while (order_.size() > capacity_) {
    conversations_.erase(order_.front());
    order_.pop_front();
  }
}

bool ResponseStore::get(const std::string& id, json& messages) const {
  std::lock_guard<std::mutex> lock(mutex_);
  const auto it = conversations_.find(id);
  if (it == conversations_.end()) return false;
  messages = it->second;
  return true;
}

namespace {

// An id for an output item: "<prefix>_" and hex digits.
std::string item_id(const char* prefix) {
  std::string id = new_response_id(prefix);
  id[std::string(prefix).size()] = '_';
  return id;
}

// A message item's content: a string, or input_text / output_text parts joined.
std::string content_text(const json& content, size_t i) {
  if (content.is_string()) return content.get<std::string>();
  if (!content.is_array()) bad_request(fmt::format("input[{}].content must be a string or a list of parts", i), "input");
  std::string out;
  for (const json& part : content) {
    const std::string type = string_member(part, "type");
    if (type != "input_text" && type != "output_text" && type != "text") {
      bad_request(fmt::format("input[{}].content: unsupported part type '{}' (input_text, output_text)", i, utf8_sanitize(type)), "input");
    }
    out += string_member(part, "text");
  }
  return out;
}

// The assistant message that the next function_call or reasoning item belongs to.
json& assistant_at_end(json& out) {
  if (out.empty() || out.back()["role"] != "assistant") out.push_back({{"role", "assistant"}, {"content", ""}});
  return out.back();
}

void add_item(const json& item, size_t i, json& out) {
  const std::string type = item.contains("type") ? string_member(item, "type") : "message";
  if (type == "message") {
    std::string role = string_member(item, "role");
    if (role == "developer") role = "system";
    if (role != "user" && role != "system" && role != "assistant") bad_request(fmt::format("input[{}]: unsupported role '{}'", i, utf8_sanitize(role)), "input");
    if (!item.contains("content")) bad_request(fmt::format("input[{}] needs 'content'", i), "input");
    return out.push_back({{"role", role}, {"content", content_text(item["content"], i)}});
  }
  if (type == "function_call") {
    json& m = assistant_at_end(out);
    if (!m.contains("tool_calls")) m["tool_calls"] = json::array();
    m["tool_calls"].push_back({{"id", string_member(item, "call_id")}, {"type", "function"},
                               {"function", {{"name", string_member(item, "name")}, {"arguments", string_member(item, "arguments")}}}});
    return;
  }
  if (type == "function_call_output") {
    const json output = item.contains("output") ? item["output"] : json("");
    return out.push_back({{"role", "tool"}, {"tool_call_id", string_member(item, "call_id")},
                          {"content", output.is_string() ? output.get<std::string>() : content_text(output, i)}});
  }
  if (type == "reasoning") {
    std::string text;
    for (const char* key : {"content", "summary"}) {
      if (item.contains(key) && item[key].is_array()) {
        for (const json& part : item[key]) text += string_member(part, "text");
      }
    }
    out.push_back({{"role", "assistant"}, {"content", ""}, {"reasoning_content", text}});
    return;
  }
  bad_request(fmt::format("input[{}]: unsupported item type '{}' (message, function_call, function_call_output, reasoning)", i,
                          utf8_sanitize(type)), "input");
}

// Consecutive assistant messages (reasoning, then text, then calls) merged into one turn.
json merged(const json& messages) {
  json out = json::array();
  for (const json& m : messages) {
    const bool joins = !out.empty() && m["role"] == "assistant" && out.back()["role"] == "assistant" && !out.back().contains("tool_calls");
    if (!joins) {
      out.push_back(m);
      continue;
    }
    json& last = out.back();
    last["content"] = last["content"].get<std::string>() + m["content"].get<std::string>();
    if (m.contains("reasoning_content")) last["reasoning_content"] = m["reasoning_content"];
    if (m.contains("tool_calls")) last["tool_calls"] = m["tool_calls"];
  }
  return out;
}

json input_messages(const json& body) {
  if (!body.contains("input")) bad_request("'input' is required", "input");
  const json& input = body["input"];
  if (input.is_string()) return json::array({{{"role", "user"}, {"content", input}}});
  if (!input.is_array() || input.empty()) bad_request("'input' must be a string or a non-empty list of items", "input");
  json out = json::array();
  for (size_t i = 0; i < input.size(); ++i) {
    if (!input[i].is_object()) bad_request(fmt::format("input[{}] must be an object", i), "input");
    add_item(input[i], i, out);
  }
  return merged(out);
}

json chat_tools(const json& tools) {
  if (!tools.is_array()) bad_request("'tools' must be an array", "tools");
  json out = json::array();
  for (const json& t : tools) {
    if (string_member(t, "type") != "function") bad_request("only function tools are supported ({\"type\": \"function\", \"name\": ...})", "tools");
    json f = {{"name", t.contains("name") ? t["name"] : json("")}};
    if (t.contains("description")) f["description"] = t["description"];
    if (t.contains("parameters") && !t["parameters"].is_null()) f["parameters"] = t["parameters"];
    out.push_back({{"type", "function"}, {"function", f}});
  }
  return out;
}

json chat_tool_choice(const json& choice) {
  if (choice.is_string()) return choice;
  if (string_member(choice, "type") == "function") return {{"type", "function"}, {"function", {{"name", string_member(choice, "name")}}}};
  bad_request("'tool_choice' must be \"auto\", \"none\", \"required\" or {\"type\": \"function\", \"name\": ...}", "tool_choice");
}

// text.format: text, json_object or json_schema (name, schema, strict) as response_format.
json response_format(const json& text) {
  if (!text.is_object()) bad_request("'text' must be an object", "text");
  if (!text.contains("format") || text["format"].is_null()) return nullptr;
  const json& f = text["format"];
  const std::string type = string_member(f, "type");
  if (type == "text" || type == "json_object") return {{"type", type}};
  if (type != "json_schema") bad_request("'text.format' type must be \"text\", \"json_object\" or \"json_schema\"", "text");
  json schema = {{"name", f.contains("name") ? f["name"] : json("answer")}, {"schema", f.contains("schema") ? f["schema"] : json(nullptr)}};
  return {{"type", "json_schema"}, {"json_schema", schema}};
}

// The request's settings that the response object repeats.
json echo_of(const json& body) {
  json e = json::object();
  const json defaults = {{"instructions", nullptr}, {"max_output_tokens", nullptr}, {"parallel_tool_calls", true},
                         {"previous_response_id", nullptr}, {"reasoning", {{"effort", nullptr}, {"summary", nullptr}}},
                         {"store", true}, {"temperature", 1.0}, {"text", {{"format", {{"type", "text"}}}}},
                         {"tool_choice", "auto"}, {"tools", json::array()}, {"top_p", 1.0}, {"truncation", "disabled"},
                         {"metadata", json::object()}};
  for (const auto& [key, fallback] : defaults.items()) e[key] = body.contains(key) && !body[key].is_null() ? body[key] : fallback;
  return e;
}

json chat_body(const json& body, const json& messages) {
  json chat = {{"model", body.contains("model") ? body["model"] : json("")}, {"messages", messages}};
  if (body.contains("max_output_tokens") && !body["max_output_tokens"].is_null()) chat["max_tokens"] = body["max_output_tokens"];
  for (const char* key : {"temperature", "top_p", "stream", "parallel_tool_calls", "top_logprobs"}) {
    if (body.contains(key) && !body[key].is_null()) chat[key] = body[key];
  }
  if (body.contains("tools") && !body["tools"].is_null()) chat["tools"] = chat_tools(body["tools"]);
  if (body.contains("tool_choice") && !body["tool_choice"].is_null()) chat["tool_choice"] = chat_tool_choice(body["tool_choice"]);
  if (body.contains("text") && !body["text"].is_null()) {
    const json format = response_format(body["text"]);
    if (!format.is_null()) chat["response_format"] = format;
  }
  if (body.contains("reasoning") && body["reasoning"].is_object() && body["reasoning"].contains("effort") &&
      body["reasoning"]["effort"].is_string()) {
    chat["reasoning_effort"] = body["reasoning"]["effort"];
  }
  if (chat.contains("top_logprobs") && chat["top_logprobs"] == 0) chat.erase("top_logprobs");
  return chat;
}

}  // namespace

ResponsesRequest parse_responses_request(const std::string& text, const RequestContext& context, const ResponseStore& store) {
  const json body = parse_body(text);
  static const std::set<std::string> kFields = {
      "model", "input", "instructions", "max_output_tokens", "temperature", "top_p", "stream", "tools", "tool_choice",
      "parallel_tool_calls", "previous_response_id", "reasoning", "text", "store", "metadata", "user", "service_tier",
      "prompt_cache_key", "safety_identifier", "truncation", "include", "background", "stream_options", "top_logprobs",
      "max_tool_calls"};
  reject_unknown_fields(body, kFields);
  bool_field(body, "store", true);  // read again when the answer is kept
  if (bool_field(body, "background", false)) bad_request("'background' is not supported (only false)", "background");
  ResponsesRequest r;
  r.history = json::array();
  if (body.contains("previous_response_id") && !body["previous_response_id"].is_null()) {
    const json& prev = body["previous_response_id"];
    if (!prev.is_string() || !store.get(prev.get<std::string>(), r.history)) {
      throw RequestError(404, "invalid_request_error", fmt::format("Previous response with id '{}' not found.",
                                                                   prev.is_string() ? utf8_sanitize(prev.get<std::string>()) : prev.dump()),
                         "previous_response_id", "previous_response_not_found");
    }
  }
  for (const json& m : input_messages(body)) r.history.push_back(m);
  json messages = json::array();
  if (body.contains("instructions") && body["instructions"].is_string()) messages.push_back({{"role", "system"}, {"content", body["instructions"]}});
  for (const json& m : r.history) messages.push_back(m);
  r.chat = parse_completion_request(chat_body(body, messages).dump(), true, context);
  r.echo = echo_of(body);
  return r;
}

namespace {

struct ItemIds {
  std::string reasoning = item_id("rs"), message = item_id("msg");
  std::vector<std::string> calls, call_ids;
  void cover(size_t n) {
    while (calls.size() < n) calls.push_back(item_id("fc")), call_ids.push_back(item_id("call"));
  }
};

json reasoning_item(const ItemIds& ids, const std::string& text) {
  return {{"id", ids.reasoning}, {"type", "reasoning"}, {"summary", json::array()},
          {"content", json::array({{{"type", "reasoning_text"}, {"text", text}}})}};
}

json text_part(const std::string& text) {
  return {{"type", "output_text"}, {"text", text}, {"annotations", json::array()}, {"logprobs", json::array()}};
}

json message_item(const ItemIds& ids, const std::string& text, const char* status) {
  return {{"id", ids.message}, {"type", "message"}, {"status", status}, {"role", "assistant"},
          {"content", text.empty() && std::string(status) != "completed" ? json::array() : json::array({text_part(text)})}};
}

json call_item(const ItemIds& ids, size_t i, const ToolCall& c, const std::string& arguments, const char* status) {
  return {{"id", ids.calls[i]}, {"type", "function_call"}, {"status", status}, {"arguments", arguments},
          {"call_id", ids.call_ids[i]}, {"name", utf8_sanitize(c.name)}};
}

json output_of(ItemIds& ids, const ReplyParts& p) {
  json out = json::array();
  if (!p.reasoning.empty()) out.push_back(reasoning_item(ids, p.reasoning));
  if (!p.text.empty() || (p.calls.empty() && p.reasoning.empty())) out.push_back(message_item(ids, p.text, "completed"));
  ids.cover(p.calls.size());
  for (size_t i = 0; i < p.calls.size(); ++i) out.push_back(call_item(ids, i, p.calls[i], utf8_sanitize(p.calls[i].arguments), "completed"));
  return out;
}

// The response object; `r` null while in progress.
json response_object(const ResponsesAnswer& a, const json& output, const GenerateResult* r) {
  json o = {{"id", a.id}, {"object", "response"}, {"created_at", a.created}, {"status", "in_progress"}, {"background", false},
            {"error", nullptr}, {"incomplete_details", nullptr}, {"model", a.model}, {"output", output}};
  for (const auto& [key, value] : a.echo.items()) o[key] = value;
  o["usage"] = nullptr;
  if (r == nullptr) return o;
  const bool cut = r->finish_reason == "length";
  o["status"] = cut ? "incomplete" : "completed";
  if (cut) o["incomplete_details"] = {{"reason", "max_output_tokens"}};
  const int out_tokens = static_cast<int>(r->tokens.size());
  o["usage"] = {{"input_tokens", r->prompt_tokens}, {"input_tokens_details", {{"cached_tokens", r->reused_tokens}}},
                {"output_tokens", out_tokens}, {"output_tokens_details", {{"reasoning_tokens", 0}}},
                {"total_tokens", r->prompt_tokens + out_tokens}};
  return o;
}

// The finished turn into the store, as a chat message after the conversation so far.
void remember(const ResponsesAnswer& a, const ItemIds& ids, const ReplyParts& p) {
  if (a.store == nullptr || !a.echo.value("store", true)) return;
  json turn = {{"role", "assistant"}, {"content", p.text}};
  if (!p.reasoning.empty()) turn["reasoning_content"] = p.reasoning;
  if (!p.calls.empty()) {
    turn["tool_calls"] = json::array();
    for (size_t i = 0; i < p.calls.size(); ++i) {
      turn["tool_calls"].push_back({{"id", ids.call_ids[i]}, {"type", "function"},
                                    {"function", {{"name", p.calls[i].name}, {"arguments", p.calls[i].arguments}}}});
    }
  }
  json history = a.history;
  history.push_back(std::move(turn));
  a.store->put(a.id, std::move(history));
}

}  // namespace

json responses_response(const ResponsesAnswer& a, const GenerateResult& r) {
  const ReplyParts parts = reply_parts(a.reply, r.text);
  ItemIds ids;
  const json output = output_of(ids, parts);
  remember(a, ids, parts);
  return response_object(a, output, &r);
}

namespace {

class ResponsesStream : public PartStream {
 public:
  explicit ResponsesStream(ResponsesAnswer a) : PartStream(a.reply), a_(std::move(a)) {}

 private:
  bool event(json j) {
    j["sequence_number"] = sequence_++;
    return send(named_event(j["type"].get<std::string>(), j.dump()));
  }
  int index() const { return static_cast<int>(output_.size()); }

  bool start() override {
    const json snapshot = response_object(a_, json::array(), nullptr);
    return event({{"type", "response.created"}, {"response", snapshot}}) &&
           event({{"type", "response.in_progress"}, {"response", snapshot}});
  }

  bool open(const std::string& kind) {
    if (open_ == kind) return true;
    if (!close()) return false;
    open_ = kind;
    const bool thinking = kind == "reasoning";
    json item = thinking ? reasoning_item(ids_, "") : message_item(ids_, "", "in_progress");
    if (thinking) item["content"] = json::array();
    const json part = thinking ? json{{"type", "reasoning_text"}, {"text", ""}} : text_part("");
    const std::string& id = thinking ? ids_.reasoning : ids_.message;
    return event({{"type", "response.output_item.added"}, {"output_index", index()}, {"item", item}}) &&
           event({{"type", "response.content_part.added"}, {"item_id", id}, {"output_index", index()}, {"content_index", 0}, {"part", part}});
  }

  bool close() {
    if (open_.empty()) return true;
    const bool thinking = open_ == "reasoning";
    const std::string& text = thinking ? parts_.reasoning : parts_.text;
    const std::string& id = thinking ? ids_.reasoning : ids_.message;
    const json item = thinking ? reasoning_item(ids_, text) : message_item(ids_, text, "completed");
    const json part = thinking ? json{{"type", "reasoning_text"}, {"text", text}} : text_part(text);
    json done = {{"type", thinking ? "response.reasoning_text.done" : "response.output_text.done"}, {"item_id", id},
                 {"output_index", index()}, {"content_index", 0}, {"text", text}};
    if (!thinking) done["logprobs"] = json::array();
    if (!event(done) ||
        !event({{"type", "response.content_part.done"}, {"item_id", id}, {"output_index", index()}, {"content_index", 0}, {"part", part}}) ||
        !event({{"type", "response.output_item.done"}, {"output_index", index()}, {"item", item}})) {
      return false;
    }
    output_.push_back(item);
    open_.clear();
    return true;
  }

  bool delta(const char* type, const std::string& id, const std::string& text) {
    json e = {{"type", type}, {"item_id", id}, {"output_index", index()}, {"content_index", 0}, {"delta", text}};
    if (std::string(type) == "response.output_text.delta") e["logprobs"] = json::array();
    return event(e);
  }

  bool reasoning(const std::string& text) override {
    parts_.reasoning += text;
    return open("reasoning") && delta("response.reasoning_text.delta", ids_.reasoning, text);
  }

  bool text(const std::string& text) override {
    parts_.text += text;
    return open("message") && delta("response.output_text.delta", ids_.message, text);
  }

  bool call(size_t i, const ToolCall& c) {
    const std::string args = utf8_sanitize(c.arguments);
    const std::string& id = ids_.calls[i];
    if (!event({{"type", "response.output_item.added"}, {"output_index", index()}, {"item", call_item(ids_, i, c, "", "in_progress")}}) ||
        !event({{"type", "response.function_call_arguments.delta"}, {"item_id", id}, {"output_index", index()}, {"delta", args}}) ||
        !event({{"type", "response.function_call_arguments.done"}, {"item_id", id}, {"output_index", index()}, {"arguments", args}})) {
      return false;
    }
    const json item = call_item(ids_, i, c, args, "completed");
    output_.push_back(item);
    return event({{"type", "response.output_item.done"}, {"output_index", index() - 1}, {"item", item}});
  }

  bool finish(const Job& job, const std::vector<ToolCall>& calls) override {
    if (a_.reply.tools != ToolFormat::None) parts_.calls = calls;
    if (output_.empty() && open_.empty() && parts_.calls.empty() && !open("message")) return false;  // never no item
    if (!close()) return false;
    ids_.cover(parts_.calls.size());
    for (size_t i = 0; i < parts_.calls.size(); ++i) {
      if (!call(i, parts_.calls[i])) return false;
    }
    remember(a_, ids_, parts_);
    const json done = response_object(a_, output_, &job.results.front());
    return event({{"type", done["status"] == "completed" ? "response.completed" : "response.incomplete"}, {"response", done}});
  }

  bool fail(const Job& job) override {
    json failed = response_object(a_, output_, nullptr);
    failed["status"] = "failed";
    failed["error"] = {{"code", "server_error"}, {"message", job.error}};
    return event({{"type", "response.failed"}, {"response", failed}});
  }

  bool keep_alive() override { return send(": keep-alive\n\n"); }

  ResponsesAnswer a_;
  ItemIds ids_;
  ReplyParts parts_;
  json output_ = json::array();
  std::string open_;  // "reasoning", "message" or ""
  int64_t sequence_ = 0;
};

}  // namespace

std::shared_ptr<JobStream> responses_stream(const ResponsesAnswer& a) { return std::make_shared<ResponsesStream>(a); }

}  // namespace bmoe
