#include "serve/request.h"

#include <fmt/format.h>

#include <algorithm>
#include <cctype>
#include <charconv>
#include <cmath>
#include <map>
#include <nlohmann/json.hpp>
#include <random>
#include <set>

#include "chat/jinja.h"
#include "chat/json_schema.h"
#include "serve/json_fields.h"
#include "serve/llama_fields.h"
#include "core/error.h"
#include "text/grammar.h"
#include "text/utf8.h"

namespace bmoe {
namespace {

using namespace json_fields;

std::vector<std::string> stop_field(const json& body) {
  if (!body.contains("stop") || body["stop"].is_null()) return {};
  const json& s = body["stop"];
  if (s.is_string()) return {s.get<std::string>()};
  if (!s.is_array() || s.size() > 4) bad_request("'stop' must be a string or an array of up to 4 strings", "stop");
  std::vector<std::string> out;
  for (const json& e : s) {
    if (!e.is_string() || e.get<std::string>().empty()) bad_request("'stop' entries must be non-empty strings", "stop");
    out.push_back(e.get<std::string>());
  }
  return out;
}

// Options accepted only at their neutral value (bmoe does not implement them).
void only_default(const json& body, const char* key, const json& neutral) {
  if (body.contains(key) && !body[key].is_null() && body[key] != neutral) {
    bad_request(fmt::format("'{}' is not supported (only {})", key, neutral.dump()), key);
  }
}

// One logit_bias entry's value: a number (-100..100, as OpenAI) or false (llama-server: banned).
float bias_value(const json& v) {
  if (v.is_boolean() && !v.get<bool>()) return -INFINITY;
  if (!v.is_number() || !std::isfinite(v.get<double>()) || std::fabs(v.get<double>()) > 100.0) {
    bad_request("'logit_bias' values must be numbers from -100 to 100 (or false to ban)", "logit_bias");
  }
  return static_cast<float>(v.get<double>());
}

// The tokens a logit_bias key names: a token id ("1234", as OpenAI) or, as llama-server also
// reads it, a text whose every token gets the bias.
std::vector<int32_t> bias_tokens(const std::string& key, const Tokenizer& tok) {
  int64_t id = 0;
  const auto [end, ec] = std::from_chars(key.data(), key.data() + key.size(), id);
  if (ec == std::errc() && end == key.data() + key.size()) {
    if (id < 0 || id >= tok.vocab_size()) bad_request(fmt::format("'logit_bias': token {} is outside the vocabulary", key), "logit_bias");
    return {static_cast<int32_t>(id)};
  }
  return tok.encode(key, false, false);
}

// OpenAI's {"token id": bias} and llama-server's [[token id or text, bias], ...].
std::vector<std::pair<int32_t, float>> logit_bias_field(const json& body, const Tokenizer* tok) {
  if (!body.contains("logit_bias") || body["logit_bias"].is_null()) return {};
  const json& b = body["logit_bias"];
  if (!b.is_object() && !b.is_array()) bad_request("'logit_bias' must be an object of token id -> bias", "logit_bias");
  if (b.size() > 1024) bad_request("'logit_bias' has more than 1024 entries", "logit_bias");
  if (!b.empty() && tok == nullptr) bad_request("'logit_bias' needs the model's tokenizer", "logit_bias");
  std::vector<std::pair<int32_t, float>> out;
  auto add = [&](const std::string& key, const json& value) {
    const float bias = bias_value(value);
    for (int32_t t : bias_tokens(key, *tok)) out.emplace_back(t, bias);
  };
  if (b.is_object()) {
    for (const auto& [key, value] : b.items()) add(key, value);
  } else {
    for (const json& pair : b) {
      if (!pair.is_array() || pair.size() != 2 || !(pair[0].is_string() || pair[0].is_number_integer())) {
        bad_request("'logit_bias' as a list holds [token id or text, bias] pairs", "logit_bias");
      }
      add(pair[0].is_string() ? pair[0].get<std::string>() : std::to_string(pair[0].get<int64_t>()), pair[1]);
    }
  }
  std::set<int32_t> banned;
  for (const auto& [t, bias] : out) {
    if (std::isinf(bias)) banned.insert(t);
  }
  if (static_cast<int64_t>(banned.size()) >= tok->vocab_size()) bad_request("'logit_bias' bans every token", "logit_bias");
  return out;
}

GenerateParams sampling_params(const json& body, const RequestContext& o, int64_t default_max) {
  GenerateParams p;
  // llama-server's n_predict (-1: no limit of its own) under OpenAI's max_tokens.
  const int64_t n_predict = int_field(body, "n_predict", -1, -1, 1 << 24);
  const int64_t max_tokens = int_field(body, "max_tokens", n_predict > 0 ? n_predict : default_max, 1, 1 << 24);
  p.max_tokens = static_cast<int>(int_field(body, "max_completion_tokens", max_tokens, 1, 1 << 24));
  const SamplerConfig& d = o.sampling;
  p.sampler.temperature = static_cast<float>(number_field(body, "temperature", d.temperature, 0.0, 2.0));
  p.sampler.top_p = static_cast<float>(number_field(body, "top_p", d.top_p, 0.0, 1.0));
  p.sampler.top_k = static_cast<int>(int_field(body, "top_k", d.top_k, 0, 1 << 24));
  // No seed (or -1, llama-server's "random"): a fresh one, so seedless requests differ.
  const int64_t seed = int_field(body, "seed", -1, INT64_MIN, INT64_MAX);
  p.sampler.seed = seed == -1 ? (static_cast<uint64_t>(std::random_device{}()) << 32 | std::random_device{}()) : static_cast<uint64_t>(seed);
  p.stop = stop_field(body);
  p.draft = o.draft;  // used by greedy requests only (lossless verification needs argmax)
  p.sampler.min_p = static_cast<float>(number_field(body, "min_p", d.min_p, 0.0, 1.0));
  p.sampler.presence_penalty = static_cast<float>(number_field(body, "presence_penalty", d.presence_penalty, -2.0, 2.0));
  p.sampler.frequency_penalty = static_cast<float>(number_field(body, "frequency_penalty", d.frequency_penalty, -2.0, 2.0));
  // llama-server's repetition penalty (0 would divide by zero: its floor is 0.01).
  // vLLM's repetition_penalty is the same penalty.
  const double repetition = number_field(body, "repetition_penalty", d.repeat_penalty, 0.01, 10.0);
  p.sampler.repeat_penalty = static_cast<float>(number_field(body, "repeat_penalty", repetition, 0.01, 10.0));
  p.sampler.repeat_last_n = static_cast<int>(int_field(body, "repeat_last_n", d.repeat_last_n, -1, 1 << 24));
  p.ignore_eos = bool_field(body, "ignore_eos", o.ignore_eos);  // llama-server's field
  p.sampler.logit_bias = logit_bias_field(body, o.tokenizer);
  read_llama_sampling(body, o.tokenizer, p.sampler);
  return p;
}

// Chat: logprobs (bool) and top_logprobs (0..20, needs logprobs). Completions: the legacy
// logprobs, an integer count of alternatives (0..20; OpenAI's own limit is 5). Returns the
// number of alternatives, or -1 when no log-probabilities are wanted.
int logprobs_field(const json& body, bool chat) {
  constexpr int kMaxTop = 20;  // OpenAI's limit for top_logprobs
  // llama-server's n_probs asks for that many alternatives per token (0: none asked).
  const int n_probs = static_cast<int>(int_field(body, "n_probs", 0, 0, kMaxTop));
  if (n_probs > 0 && !body.contains("logprobs")) return n_probs;
  if (!chat) return static_cast<int>(int_field(body, "logprobs", -1, 0, kMaxTop));
  const bool wanted = bool_field(body, "logprobs", false);
  const int top = static_cast<int>(int_field(body, "top_logprobs", 0, 0, kMaxTop));
  if (top > 0 && !wanted) bad_request("'top_logprobs' needs 'logprobs': true", "top_logprobs");
  return wanted ? top : -1;
}

// The documented request fields bmoe does not act on, as clients send them by default. Each is
// accepted at its neutral value (a feature that is off) and refused otherwise, so a request
// never silently loses what it asked for; the informational ones are accepted with any value.
void check_unused_fields(const json& body, bool chat) {
  // Accepted with any value and ignored (they change nothing in the answer): user, metadata,
  // store, service_tier, prompt_cache_key, safety_identifier, reasoning_effort (a template
  // variable where the template reads it), verbosity, prediction, cache_prompt (the KV prefix is
  // always reused).
  // (stream_options.include_usage is read by parse_completion_request.)
  only_default(body, "suffix", "");
  only_default(body, "audio", nullptr);
  if (body.contains("modalities") && !body["modalities"].is_null() && body["modalities"] != json::array({"text"})) {
    bad_request("'modalities' is not supported (only [\"text\"])", "modalities");
  }
  if (chat) {
    if (body.contains("web_search_options") && !body["web_search_options"].is_null()) {
      bad_request("'web_search_options' is not supported", "web_search_options");
    }
  }
}

std::string message_content(const json& m, size_t index) {
  const std::string where = fmt::format("messages[{}].content", index);
  if (!m.contains("content") || m["content"].is_null()) return {};
  const json& c = m["content"];
  if (c.is_string()) return c.get<std::string>();
  if (!c.is_array()) bad_request(fmt::format("'{}' must be a string or an array of text parts", where), where);
  std::string text;
  for (const json& part : c) {
    if (!part.is_object() || string_member(part, "type") != "text" || !part.contains("text") || !part["text"].is_string()) {
      bad_request(fmt::format("'{}': only text parts are supported", where), where);
    }
    text += part["text"].get<std::string>();
  }
  return text;
}

// The conversation as the template receives it: each message checked (a role the template can
// place, content a string or text parts, an assistant's tool_calls and a tool's answer kept as
// sent), in the request's own key order (a template's tojson shows it).
json chat_messages(const json& body, bool jinja) {
  if (!body.contains("messages") || !body["messages"].is_array() || body["messages"].empty()) {
    bad_request("'messages' must be a non-empty array", "messages");
  }
  json out = json::array();
  size_t i = 0;
  for (const auto& m : body["messages"]) {
    if (!m.is_object() || !m.contains("role") || !m["role"].is_string()) {
      bad_request(fmt::format("messages[{}] needs a string 'role'", i), "messages");
    }
    std::string role = m["role"].get<std::string>();
    if (role == "developer") role = "system";
    const bool tool_role = role == "tool" || role == "function";
    if (role != "system" && role != "user" && role != "assistant" && !(jinja && tool_role)) {
      bad_request(fmt::format("messages[{}]: unsupported role '{}' (system, developer, user, assistant{})", i, role,
                              jinja ? ", tool" : ""), "messages");
    }
    json copy = m;
    copy["role"] = role;
    copy["content"] = message_content(m, i);
    if (m.contains("tool_calls") && !m["tool_calls"].is_null()) {
      if (!jinja || !m["tool_calls"].is_array()) {
        bad_request(fmt::format("messages[{}].tool_calls needs the model's own chat template and a list", i), "messages");
      }
    }
    out.push_back(std::move(copy));
    ++i;
  }
  return out;
}

// ---- tools and constrained output

bool valid_function_name(const std::string& name) {
  // OpenAI's rule: 1 to 64 of a-z, A-Z, 0-9, '_' and '-'.
  if (name.empty() || name.size() > 64) return false;
  return std::all_of(name.begin(), name.end(), [](char c) { return std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '-'; });
}

void check_tool(const json& tool, size_t i) {
  const std::string where = fmt::format("tools[{}]", i);
  if (!tool.is_object() || string_member(tool, "type") != "function" || !tool.contains("function") || !tool["function"].is_object()) {
    bad_request(where + " must be {\"type\": \"function\", \"function\": {\"name\": ...}}", "tools");
  }
  const json& f = tool["function"];
  if (!f.contains("name") || !f["name"].is_string() || !valid_function_name(f["name"].get<std::string>())) {
    bad_request(where + ".function.name must be 1 to 64 letters, digits, '_' or '-'", "tools");
  }
  if (f.contains("parameters") && !f["parameters"].is_null() && !f["parameters"].is_object()) {
    bad_request(where + ".function.parameters must be a JSON schema object", "tools");
  }
}

// The request's tools in OpenAI's form (the legacy `functions` list converted), each checked.
json tools_field(const json& body) {
  json tools = json::array();
  if (body.contains("tools") && !body["tools"].is_null()) {
    if (!body["tools"].is_array()) bad_request("'tools' must be an array", "tools");
    for (const json& t : body["tools"]) tools.push_back(t);
  }
  if (body.contains("functions") && !body["functions"].is_null()) {
    if (!body["functions"].is_array()) bad_request("'functions' must be an array", "functions");
    for (const json& f : body["functions"]) tools.push_back({{"type", "function"}, {"function", f}});
  }
  if (tools.size() > 128) bad_request("'tools' holds more than 128 tools", "tools");  // OpenAI's limit
  for (size_t i = 0; i < tools.size(); ++i) check_tool(tools[i], i);
  return tools;
}

struct ToolChoice {
  enum class Mode { None, Auto, Required } mode = Mode::Auto;
  std::string function;  // Required: only this one (empty: any)
};

// tool_choice ("none", "auto", "required" or {"type": "function", "function": {"name": N}}) or
// the legacy function_call ("none", "auto" or {"name": N}).
ToolChoice tool_choice_field(const json& body, const json& tools) {
  const char* key = body.contains("tool_choice") && !body["tool_choice"].is_null() ? "tool_choice" : "function_call";
  ToolChoice choice;
  if (!body.contains(key) || body[key].is_null()) {
    if (tools.empty()) choice.mode = ToolChoice::Mode::None;
    return choice;
  }
  const json& c = body[key];
  if (c == "none") choice.mode = ToolChoice::Mode::None;
  else if (c == "auto") choice.mode = ToolChoice::Mode::Auto;
  else if (c == "required" && std::string(key) == "tool_choice") choice.mode = ToolChoice::Mode::Required;
  else if (c.is_object()) {
    const json* name = nullptr;
    if (string_member(c, "type") == "function" && c.contains("function") && c["function"].is_object() &&
        c["function"].contains("name")) {
      name = &c["function"]["name"];
    } else if (std::string(key) == "function_call" && c.contains("name")) {
      name = &c["name"];
    }
    if (name == nullptr || !name->is_string()) {
      bad_request(fmt::format("'{}' must be \"none\", \"auto\", \"required\" or {{\"type\": \"function\", \"function\": "
                              "{{\"name\": ...}}}}", key), key);
    }
    choice.mode = ToolChoice::Mode::Required;
    choice.function = name->get<std::string>();
  } else {
    bad_request(fmt::format("'{}' must be \"none\", \"auto\", \"required\" or a function", key), key);
  }
  // "auto" without tools is what clients send by default; forcing a call needs something to call.
  if (choice.mode == ToolChoice::Mode::Required && tools.empty()) bad_request(fmt::format("'{}' needs 'tools'", key), key);
  if (!choice.function.empty()) {
    const bool known = std::any_of(tools.begin(), tools.end(), [&](const json& t) { return t["function"]["name"] == choice.function; });
    if (!known) bad_request(fmt::format("'{}' names '{}', which is not among the tools", key, choice.function), key);
  }
  return choice;
}

// What the answer must look like, as GBNF ("" for free text): a forced tool call, OpenAI's
// response_format (json_object, json_schema) or llama-server's json_schema and grammar fields.
// `param` is set to the field that asked for it.
std::string output_gbnf(const json& body, const ToolChoice& choice, const json& tools, ToolFormat format, std::string& param) {
  std::vector<std::pair<std::string, std::string>> asked;  // field -> grammar
  if (choice.mode == ToolChoice::Mode::Required) {
    param = "tool_choice";
    asked.emplace_back("tool_choice", tool_call_gbnf(format, tools, bool_field(body, "parallel_tool_calls", true), choice.function));
  }
  if (body.contains("response_format") && !body["response_format"].is_null()) {
    const json& f = body["response_format"];
    const std::string type = f.is_object() && f.contains("type") && f["type"].is_string() ? f["type"].get<std::string>() : "";
    param = "response_format";
    if (type == "json_object") {
      asked.emplace_back("response_format", json_object_gbnf());
    } else if (type == "json_schema") {
      if (!f.contains("json_schema") || !f["json_schema"].is_object() || !f["json_schema"].contains("schema") ||
          !f["json_schema"]["schema"].is_object()) {
        bad_request("'response_format' json_schema needs {\"json_schema\": {\"name\": ..., \"schema\": {...}}}", "response_format");
      }
      asked.emplace_back("response_format", json_schema_to_gbnf(f["json_schema"]["schema"]));
    } else if (type != "text") {
      bad_request("'response_format' type must be \"text\", \"json_object\" or \"json_schema\"", "response_format");
    }
  }
  if (body.contains("json_schema") && !body["json_schema"].is_null()) {
    param = "json_schema";
    if (!body["json_schema"].is_object()) bad_request("'json_schema' must be a JSON schema object", "json_schema");
    asked.emplace_back("json_schema", json_schema_to_gbnf(body["json_schema"]));
  }
  if (body.contains("grammar") && !body["grammar"].is_null()) {
    param = "grammar";
    if (!body["grammar"].is_string()) bad_request("'grammar' must be GBNF text", "grammar");
    if (!body["grammar"].get<std::string>().empty()) asked.emplace_back("grammar", body["grammar"].get<std::string>());
  }
  if (asked.empty()) return {};
  if (asked.size() > 1) bad_request(fmt::format("'{}' and '{}' cannot be combined", asked[0].first, asked[1].first), asked[1].first);
  param = asked[0].first;
  return asked[0].second;
}

// The grammar as the generator takes it; any failure is the client's (400 naming the field).
std::shared_ptr<const Grammar> output_grammar(const json& body, const ToolChoice& choice, const json& tools, ToolFormat format) {
  std::string param;
  try {
    const std::string gbnf = output_gbnf(body, choice, tools, format, param);
    if (gbnf.empty()) return nullptr;
    std::shared_ptr<const Grammar> grammar = Grammar::parse(gbnf);
    GrammarMatcher start(grammar);  // a grammar too ambiguous to start fails here, not mid-answer
    return grammar;
  } catch (const Error& e) {
    bad_request(e.what(), param);
  }
}

// A prompt too long for the context whatever its tokens: refused before tokenizing it (a 12 MB
// prompt would take a gigabyte to tokenize only to be refused after).
void refuse_surely_too_long(size_t bytes, const RequestContext& o, bool chat) {
  if (o.max_token_bytes == 0 || bytes <= static_cast<size_t>(o.n_ctx) * o.max_token_bytes) return;
  throw RequestError(400, "invalid_request_error",
                     fmt::format("the prompt has {} bytes, more than this server's context of {} tokens can hold (a token "
                                 "is at most {} bytes)", bytes, o.n_ctx, o.max_token_bytes),
                     chat ? "messages" : "prompt", "context_length_exceeded");
}

// The prompt's text tokenized, once it is known it could fit.
std::vector<int32_t> encode_prompt(const std::string& text, bool chat, const RequestContext& o) {
  refuse_surely_too_long(text.size(), o, chat);
  return o.tokenizer->encode(text, true, o.tokenizer->vocab().add_bos);
}

// Tools on a template with no tool syntax (tool_choice "required" or a named function): the
// model is shown them in a system message and answers with one JSON call under a grammar, in
// the Llama 3.1 JSON layout ({"name": ..., "parameters": {...}}) that the reply parser reads.
constexpr ToolFormat kDescribedToolFormat = ToolFormat::Llama3Json;

std::string tools_description(const json& tools) {
  std::string out =
      "You can call these functions. To call one, answer with only a JSON object "
      "{\"name\": <function name>, \"parameters\": <its arguments as an object>}.\n\nFunctions:";
  for (const auto& t : tools) out += "\n" + t["function"].dump();
  return out;
}

// An assistant message's tool calls as the JSON text the model writes for them (after its content).
std::string calls_as_text(const json& m, std::map<std::string, std::string>& call_names) {
  std::string text = m["content"].is_string() ? m["content"].get<std::string>() : "";
  for (const auto& c : m["tool_calls"]) {
    const json f = c.is_object() && c.contains("function") && c["function"].is_object() ? c["function"] : json::object();
    const std::string name = f.contains("name") && f["name"].is_string() ? f["name"].get<std::string>() : "";
    if (c.is_object() && c.contains("id") && c["id"].is_string()) call_names[c["id"].get<std::string>()] = name;
    json args = f.contains("arguments") ? f["arguments"] : json::object();
    if (args.is_string()) {
      json parsed = json::parse(args.get<std::string>(), nullptr, false);
      if (!parsed.is_discarded()) args = std::move(parsed);
    }
    text += (text.empty() ? "" : "\n") + json{{"name", name}, {"parameters", args}}.dump();
  }
  return text;
}

// The conversation as a template without tool syntax can show it: the tools in the (first)
// system message, earlier calls as the assistant's JSON text, tool results as user messages.
json describe_tools(json messages, const json& tools) {
  std::map<std::string, std::string> call_names;  // tool_call_id -> function name
  for (auto& m : messages) {
    const std::string role = m["role"].get<std::string>();
    if (role == "tool" || role == "function") {
      std::string who = m.contains("name") && m["name"].is_string() ? m["name"].get<std::string>() : "";
      if (m.contains("tool_call_id") && m["tool_call_id"].is_string()) who = call_names[m["tool_call_id"].get<std::string>()];
      m = json{{"role", "user"}, {"content", "Result of " + (who.empty() ? "the call" : who) + ": " + m["content"].get<std::string>()}};
    } else if (m.contains("tool_calls") && m["tool_calls"].is_array()) {
      m["content"] = calls_as_text(m, call_names);
      m.erase("tool_calls");
    }
  }
  if (!messages.empty() && messages[0]["role"] == "system" && messages[0]["content"].is_string()) {
    messages[0]["content"] = messages[0]["content"].get<std::string>() + "\n\n" + tools_description(tools);
  } else {
    messages.insert(messages.begin(), json{{"role", "system"}, {"content", tools_description(tools)}});
  }
  return messages;
}

// llama-server's reasoning_budget_tokens (or its older name thinking_budget_tokens): -1 no
// limit, 0 no reasoning (as thinking off), n > 0 the close tag forced after n reasoning tokens.
int reasoning_budget(const json& body) {
  const char* key = body.contains("reasoning_budget_tokens") ? "reasoning_budget_tokens" : "thinking_budget_tokens";
  return static_cast<int>(int_field(body, key, -1, -1, 1 << 24));
}

bool reasoning_budget_is_zero(const json& body) { return reasoning_budget(body) == 0; }

// Whether the answer thinks: the server's default, chat_template_kwargs.enable_thinking, and a
// reasoning budget of 0.
bool thinking_off(const json& body, const RequestContext& o) {
  bool no_think = o.no_think;
  if (body.contains("chat_template_kwargs")) {
    const json& k = body["chat_template_kwargs"];
    if (!k.is_object()) bad_request("'chat_template_kwargs' must be an object", "chat_template_kwargs");
    if (k.contains("enable_thinking")) {
      if (!k["enable_thinking"].is_boolean()) bad_request("'enable_thinking' must be true or false", "chat_template_kwargs");
      no_think = !k["enable_thinking"].get<bool>();
    }
  }
  return reasoning_budget_is_zero(body) || no_think;
}

// continue_final_message: the conversation rendered without a new turn, cut right after the
// final assistant message's text, so the answer goes on from it (as vLLM and llama-server).
std::string continued_text(const ChatTemplate& tmpl, ChatInputs in) {
  const json& last = in.messages.back();
  if (string_member(last, "role") != "assistant" || !last.contains("content") || !last["content"].is_string()) {
    bad_request("'continue_final_message' needs the last message to be the assistant's, with text content", "continue_final_message");
  }
  const std::string tail = last["content"].get<std::string>();
  in.add_generation_prompt = false;
  const std::string text = tmpl.apply(in);
  const size_t at = tail.empty() ? std::string::npos : text.rfind(tail);
  if (at == std::string::npos) bad_request("'continue_final_message': the template does not show the final message's text", "continue_final_message");
  return text.substr(0, at + tail.size());
}

std::vector<int32_t> chat_prompt(const json& body, const RequestContext& o, const json& tools, bool described) {
  static const ChatTemplate kChatML = ChatTemplate::builtin(ChatFormat::ChatML);
  const ChatTemplate& tmpl = o.chat_template ? *o.chat_template : kChatML;
  ChatInputs in;
  in.enable_thinking = !thinking_off(body, o);
  in.add_generation_prompt = bool_field(body, "add_generation_prompt", true);  // vLLM's and llama-server's
  in.messages = chat_messages(body, tmpl.is_jinja() || described);
  if (described) {
    in.messages = describe_tools(std::move(in.messages), tools);
  } else if (!tools.empty()) {
    in.tools = tools;
  }
  if (body.contains("chat_template_kwargs")) in.kwargs = body["chat_template_kwargs"];
  if (body.contains("reasoning_effort") && body["reasoning_effort"].is_string()) {
    in.kwargs["reasoning_effort"] = body["reasoning_effort"];
  }
  try {
    const bool go_on = bool_field(body, "continue_final_message", false) && !in.messages.empty();
    return encode_prompt(go_on ? continued_text(tmpl, in) : tmpl.apply(in), true, o);
  } catch (const jinja::JinjaError& e) {
    // The template refused the conversation (roles out of order, say): the client's to fix.
    bad_request(fmt::format("the chat template cannot render these messages: {}", e.what()), "messages");
  }
}

// One completions prompt: a string or token ids.
std::vector<int32_t> one_prompt(const json& p, const RequestContext& o) {
  const Tokenizer& tok = *o.tokenizer;
  if (p.is_string()) return encode_prompt(p.get<std::string>(), false, o);
  if (p.is_array() && !p.empty() && p[0].is_number_integer()) {
    std::vector<int32_t> ids;
    for (const json& e : p) {
      if (!e.is_number_integer() || e.get<int64_t>() < 0 || e.get<int64_t>() >= tok.vocab_size()) {
        bad_request("'prompt' token ids must be integers inside the vocabulary", "prompt");
      }
      ids.push_back(static_cast<int32_t>(e.get<int64_t>()));
    }
    return ids;
  }
  bad_request("'prompt' must be a string, token ids, or a list of either", "prompt");
}

// Completions' prompt: a string, token ids, or a list of strings or of token-id lists (one
// answer per prompt).
std::vector<std::vector<int32_t>> completion_prompts(const json& body, const RequestContext& o) {
  if (!body.contains("prompt")) bad_request("'prompt' is required", "prompt");
  const json& p = body["prompt"];
  const bool several = p.is_array() && !p.empty() && (p[0].is_string() || p[0].is_array());
  if (!several) return {one_prompt(p, o)};
  if (p.size() > 128) bad_request("'prompt' holds more than 128 prompts", "prompt");
  std::vector<std::vector<int32_t>> out;
  for (const json& e : p) {
    if (!e.is_string() && !e.is_array()) bad_request("'prompt' as a list holds strings or lists of token ids", "prompt");
    out.push_back(one_prompt(e, o));
  }
  return out;
}

// The decoded end of a prompt, special tokens spelled out.
std::string prompt_tail(const std::vector<int32_t>& prompt, const Tokenizer& tok) {
  constexpr size_t kTail = 8;  // tokens: enough for "<think>\n" or "<|channel|>final<|message|>"
  const std::vector<int32_t> tail(prompt.end() - static_cast<std::ptrdiff_t>(std::min(prompt.size(), kTail)), prompt.end());
  return tok.decode(tail, true);
}

// The reasoning tags of the request's template (Gemma 4's thought channel, else <think>).
ReasoningTags template_reasoning_tags(const RequestContext& o) {
  return reasoning_tags(o.chat_template ? o.chat_template->format() : ChatFormat::ChatML);
}

// A grammar constrains the answer, and could never close a think block the template opened
// (Qwen3.5's "<think>\n"): as llama-server does, the reasoning stays free and the grammar
// applies from the block's close tag on (thinking off, the template closes it itself).
void defer_grammar_past_open_think_block(GenerateParams& params, const std::vector<int32_t>& prompt, const RequestContext& o) {
  const ReasoningTags tags = template_reasoning_tags(o);
  if (prompt_opens_think_block(prompt_tail(prompt, *o.tokenizer), tags.open)) params.grammar_after = tags.close;
}

// How the answer is split for the reply: reasoning, harmony channels, the tools' format, and the
// prompt's last tokens (whether the answer starts inside a think block or a message).
ReplyOptions reply_options(const RequestContext& o, const json& tools, ToolFormat format, const std::vector<int32_t>& prompt) {
  ReplyOptions r;
  r.split_reasoning = o.split_reasoning;
  r.harmony = o.chat_template && o.chat_template->format() == ChatFormat::Harmony;
  r.tools = tools.empty() ? ToolFormat::None : format;
  r.reasoning_tags = template_reasoning_tags(o);
  r.tool_list = tools;
  r.prompt_tail = prompt_tail(prompt, *o.tokenizer);
  return r;
}

// A positive reasoning budget, for the worker: the tags of the template's think block and
// whether the prompt opened it. Refused where it cannot hold: a completion, harmony's channels,
// log-probabilities (the forced tag is not sampled).
void read_reasoning_budget(const json& body, bool chat, CompletionRequest& r) {
  const int budget = reasoning_budget(body);
  if (budget <= 0 || budget >= r.params.max_tokens) return;  // none, or one the answer cannot reach
  const char* key = body.contains("reasoning_budget_tokens") ? "reasoning_budget_tokens" : "thinking_budget_tokens";
  if (!chat) bad_request(fmt::format("'{}' > 0 needs a chat request (a template's think block)", key), key);
  if (r.reply.harmony) bad_request(fmt::format("'{}' > 0: harmony's analysis channel has no close tag to force", key), key);
  if (r.logprobs()) bad_request(fmt::format("'{}' > 0 cannot be combined with log-probabilities", key), key);
  // llama-server's reasoning_budget_message: written before the close tag.
  const std::string message = string_member(body, "reasoning_budget_message");
  r.reasoning_budget = {budget, r.reply.reasoning_tags.open, message + r.reply.reasoning_tags.close,
                        prompt_opens_think_block(r.reply.prompt_tail, r.reply.reasoning_tags.open)};
}

// The fields a completion body may hold: OpenAI's documented ones, llama-server's top_k, min_p,
// repeat_penalty, repeat_last_n, ignore_eos, grammar, json_schema, chat_template_kwargs and the
// rest of its own (serve/llama_fields.h). What bmoe does with each: README ("Request fields").
const std::set<std::string>& known_fields(bool chat) {
  static const auto with_llama = [](std::set<std::string> fields) {
    fields.insert(llama_server_fields().begin(), llama_server_fields().end());
    return fields;
  };
  static const std::set<std::string> kChatFields = with_llama({
      "model", "messages", "max_tokens", "max_completion_tokens", "temperature", "top_p", "top_k", "seed", "stop",
      "stream", "stream_options", "n", "presence_penalty", "frequency_penalty", "user", "chat_template_kwargs",
      "logprobs", "top_logprobs", "logit_bias", "response_format", "tools", "tool_choice", "parallel_tool_calls",
      "functions", "function_call", "store", "metadata", "reasoning_effort", "service_tier", "modalities", "audio",
      "prediction", "prompt_cache_key", "safety_identifier", "verbosity", "web_search_options", "cache_prompt",
      "min_p", "repeat_penalty", "repeat_last_n", "ignore_eos", "grammar", "json_schema"});
  static const std::set<std::string> kCompletionFields = with_llama({
      "model", "prompt", "max_tokens", "temperature", "top_p", "top_k", "seed", "stop", "stream",
      "stream_options", "n", "presence_penalty", "frequency_penalty", "user", "echo", "logprobs", "best_of",
      "logit_bias", "suffix", "cache_prompt", "min_p", "repeat_penalty", "repeat_last_n", "ignore_eos", "grammar",
      "json_schema", "chat_template_kwargs"});
  return chat ? kChatFields : kCompletionFields;
}

void check_fields(const json& body, bool chat) {
  reject_unknown_fields(body, known_fields(chat));
  check_unused_fields(body, chat);
  check_llama_neutral_fields(body);
  if (!chat) {
    only_default(body, "echo", false);
    only_default(body, "best_of", 1);
  }
  if (body.contains("model") && !body["model"].is_string()) bad_request("'model' must be a string", "model");
}

void check_prompt_fits(const std::vector<int32_t>& prompt, bool chat, int n_ctx) {
  if (prompt.empty()) bad_request("the prompt is empty", chat ? "messages" : "prompt");
  if (static_cast<int>(prompt.size()) >= n_ctx) {
    throw RequestError(400, "invalid_request_error",
                       fmt::format("the prompt has {} tokens; this server's context is {} tokens", prompt.size(), n_ctx),
                       chat ? "messages" : "prompt", "context_length_exceeded");
  }
}

// llama-server's per-request reasoning_format: "none" leaves the reasoning in the content.
bool split_reasoning_field(const json& body, bool fallback) {
  if (!body.contains("reasoning_format") || body["reasoning_format"].is_null()) return fallback;
  static const std::set<std::string> kFormats = {"none", "deepseek", "deepseek-legacy", "auto"};
  const json& f = body["reasoning_format"];
  if (!f.is_string() || !kFormats.count(f.get<std::string>())) {
    bad_request("'reasoning_format' must be \"none\", \"deepseek\", \"deepseek-legacy\" or \"auto\"", "reasoning_format");
  }
  return f != "none";
}

// The tools the model is shown; tool_format is the template's, or the described JSON layout where
// the template has no tool syntax and the choice forces a call.
json offered_tools(const json& body, bool chat, const RequestContext& context, ToolChoice& choice, ToolFormat& tool_format) {
  json tools = chat ? tools_field(body) : json::array();
  choice = tool_choice_field(body, tools);
  if (choice.mode == ToolChoice::Mode::None) tools = json::array();  // not shown to the model either
  tool_format = context.tool_format;
  const bool described = !tools.empty() && tool_format == ToolFormat::None;
  if (described && choice.mode != ToolChoice::Mode::Required) {
    bad_request(fmt::format("tools with tool_choice \"auto\" need a chat template that writes tool calls in a format bmoe "
                            "reads (Hermes, Qwen XML, GLM XML, harmony, Gemma 4, LFM2, Mistral, Llama 3.1 JSON, "
                            "DeepSeek's); this model's is {}. "
                            "tool_choice \"required\" or a named function works with any template",
                            context.chat_template && context.chat_template->is_jinja() ? "not one of them" : "a built-in format"),
                "tools");
  }
  if (described) tool_format = kDescribedToolFormat;
  return tools;
}

// The prompt (chat: rendered; completions: each of the list) and how the reply is split.
void read_prompts(const json& body, bool chat, const RequestContext& context, const json& tools, ToolFormat tool_format,
                  CompletionRequest& r) {
  if (chat) {
    r.prompt = chat_prompt(body, context, tools, tool_format != context.tool_format);
    if (r.params.grammar) defer_grammar_past_open_think_block(r.params, r.prompt, context);
    r.reply = reply_options(context, tools, tool_format, r.prompt);
    r.reply.parallel_calls = bool_field(body, "parallel_tool_calls", true);
    r.reply.split_reasoning = split_reasoning_field(body, r.reply.split_reasoning);
    return check_prompt_fits(r.prompt, chat, context.n_ctx);
  }
  std::vector<std::vector<int32_t>> prompts = completion_prompts(body, context);
  for (const auto& p : prompts) check_prompt_fits(p, chat, context.n_ctx);
  r.prompt = prompts.front();
  if (prompts.size() == 1) return;
  if (prompts.size() * static_cast<size_t>(r.n) > 128) bad_request("'prompt' times 'n' is more than 128 choices", "n");
  for (const auto& p : prompts) r.choice_prompts.insert(r.choice_prompts.end(), static_cast<size_t>(r.n), p);
  r.prompts = static_cast<int>(prompts.size());
}

}  // namespace

CompletionRequest parse_completion_request(const std::string& text, bool chat, const RequestContext& context) {
  const json body = parse_body(text);
  check_fields(body, chat);
  CompletionRequest r;
  r.stream = bool_field(body, "stream", false);
  if (body.contains("stream_options") && !body["stream_options"].is_null()) {
    const json& so = body["stream_options"];
    if (!so.is_object()) bad_request("'stream_options' must be an object", "stream_options");
    r.include_usage = bool_field(so, "include_usage", false);
  }
  r.return_tokens = bool_field(body, "return_tokens", false);
  r.return_progress = bool_field(body, "return_progress", false);
  r.timings_per_token = bool_field(body, "timings_per_token", false);
  r.ping_seconds = static_cast<double>(int_field(body, "sse_ping_interval", 1, -1, INT32_MAX));
  r.t_max_predict_ms = std::max<int64_t>(0, int_field(body, "t_max_predict_ms", -1, -1, INT64_MAX / 2));
  r.params = sampling_params(body, context, context.n_predict > 0 ? context.n_predict : (chat ? context.n_ctx : 16));
  r.params.logprobs = logprobs_field(body, chat);
  r.params.post_sampling_probs = bool_field(body, "post_sampling_probs", false);
  // OpenAI's limit; llama-server's n_cmpl is the same count.
  r.n = static_cast<int>(int_field(body, body.contains("n_cmpl") ? "n_cmpl" : "n", 1, 1, 128));
  ToolChoice choice;
  ToolFormat tool_format = ToolFormat::None;
  const json tools = offered_tools(body, chat, context, choice, tool_format);
  r.params.grammar = output_grammar(body, choice, tools, tool_format);
  read_prompts(body, chat, context, tools, tool_format, r);
  read_reasoning_budget(body, chat, r);
  return r;
}

TokenizeRequest parse_tokenize_request(const std::string& text) {
  const json body = parse_body(text);
  reject_unknown_fields(body, {"content", "add_special", "with_pieces", "parse_special"});
  if (!body.contains("content") || !body["content"].is_string()) bad_request("'content' must be a string", "content");
  TokenizeRequest r;
  r.content = body["content"].get<std::string>();
  r.add_special = bool_field(body, "add_special", false);
  r.with_pieces = bool_field(body, "with_pieces", false);
  only_default(body, "parse_special", true);
  return r;
}

std::vector<int32_t> parse_detokenize_request(const std::string& text, int vocab_size) {
  const json body = parse_body(text);
  reject_unknown_fields(body, {"tokens"});
  if (!body.contains("tokens") || !body["tokens"].is_array()) bad_request("'tokens' must be an array of token ids", "tokens");
  std::vector<int32_t> ids;
  for (const json& e : body["tokens"]) {
    if (!e.is_number_integer() || e.get<int64_t>() < 0 || e.get<int64_t>() >= vocab_size) {
      bad_request("'tokens' must be integers inside the vocabulary", "tokens");
    }
    ids.push_back(static_cast<int32_t>(e.get<int64_t>()));
  }
  return ids;
}

}  // namespace bmoe
