// Tool calls in each family's format (see tool_calls.h): detection, parsers and grammars.
//
// Parsers work on string_views with an explicit position and return nullopt for anything they do
// not recognise; every nested value goes one level deeper and gives up past kMaxDepth, and JSON
// text is measured (json_extent, depth-bounded) before nlohmann parses it, so hostile input costs
// linear time and bounded stack.
//
// Grammars are built with one JsonGrammarBuilder: JSON arguments come from add_schema; the
// syntaxes that are not JSON (gemma4 values, qwen-xml raw strings, lfm2 keyword arguments) are
// written here, reusing the builder's rules for numbers, dates and nested JSON values. Every
// string the grammar lets a model write is one the parser reads back unchanged: raw strings
// cannot contain their terminator (excluding()), and keys are written in a form the parser
// accepts or the tool is refused.
#include "chat/tool_calls.h"

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <map>
#include <optional>
#include <set>

#include "chat/json_schema.h"
#include "chat/schema_walk.h"
#include "core/error.h"
#include "core/rng.h"
#include "text/utf8.h"

namespace bmoe {

namespace {

using json = nlohmann::ordered_json;
constexpr size_t npos = std::string_view::npos;
constexpr int kMaxDepth = 64;
constexpr std::string_view kGemmaQuote = "<|\"|>";

// ---------------------------------------------------------------------------------------------
// Text helpers

bool has(std::string_view s, std::string_view what) { return s.find(what) != npos; }
bool is_space(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }
bool is_alnum(char c) { return std::isalnum(static_cast<unsigned char>(c)) != 0; }

size_t skip_ws(std::string_view s, size_t p) {
  while (p < s.size() && is_space(s[p])) ++p;
  return p;
}

bool at(std::string_view s, size_t p, std::string_view lit) { return p <= s.size() && s.substr(p, lit.size()) == lit; }

std::string_view trim(std::string_view s) {
  size_t b = 0, e = s.size();
  while (b < e && is_space(s[b])) ++b;
  while (e > b && is_space(s[e - 1])) --e;
  return s.substr(b, e - b);
}

std::string compact(const json& v) { return v.dump(-1, ' ', false, json::error_handler_t::replace); }

const json* field(const json& obj, const char* key) {
  if (!obj.is_object()) return nullptr;
  const auto it = obj.find(key);
  return it == obj.end() ? nullptr : &*it;
}


// ---------------------------------------------------------------------------------------------
// JSON values inside other text

// The end of the JSON value that starts at p, or npos. Only the extent is found here (strings,
// brackets, nesting bounded); nlohmann checks the rest.
size_t json_extent(std::string_view s, size_t p, int depth) {
  if (p >= s.size() || depth > kMaxDepth) return npos;
  const char c = s[p];
  if (c == '"') {
    for (size_t i = p + 1; i < s.size(); ++i) {
      if (s[i] == '\\') {
        ++i;
      } else if (s[i] == '"') {
        return i + 1;
      }
    }
    return npos;
  }
  if (c == '{' || c == '[') {
    const char close = c == '{' ? '}' : ']';
    size_t i = skip_ws(s, p + 1);
    if (i < s.size() && s[i] == close) return i + 1;
    for (;;) {
      if (c == '{') {
        if (i >= s.size() || s[i] != '"') return npos;
        i = json_extent(s, i, depth + 1);
        if (i == npos) return npos;
        i = skip_ws(s, i);
        if (i >= s.size() || s[i] != ':') return npos;
        i = skip_ws(s, i + 1);
      }
      i = json_extent(s, i, depth + 1);
      if (i == npos) return npos;
      i = skip_ws(s, i);
      if (i >= s.size()) return npos;
      if (s[i] == close) return i + 1;
      if (s[i] != ',') return npos;
      i = skip_ws(s, i + 1);
    }
  }
  size_t i = p;
  while (i < s.size() && (is_alnum(s[i]) || s[i] == '-' || s[i] == '+' || s[i] == '.')) ++i;
  return i == p ? npos : i;
}

std::optional<json> parse_json_exact(std::string_view s) {
  try {
    json v = json::parse(s.begin(), s.end(), nullptr, false);
    if (v.is_discarded()) return std::nullopt;
    return v;
  } catch (const std::exception&) {
    return std::nullopt;
  }
}

// The JSON value at p (no leading whitespace); advances p past it on success.
std::optional<json> json_at(std::string_view s, size_t& p) {
  const size_t end = json_extent(s, p, 0);
  if (end == npos) return std::nullopt;
  auto v = parse_json_exact(s.substr(p, end - p));
  if (v) p = end;
  return v;
}

// The whole text (whitespace around it aside) as one JSON value.
std::optional<json> json_whole(std::string_view s) {
  size_t p = skip_ws(s, 0);
  auto v = json_at(s, p);
  if (!v || skip_ws(s, p) != s.size()) return std::nullopt;
  return v;
}

// A number token in JSON or Python spelling ("2", "-1.5e3", "1.", ".5", "+3").
std::optional<json> number_token(std::string_view t) {
  if (t.empty() || t.size() > 64) return std::nullopt;
  for (const char c : t) {
    if (!std::isdigit(static_cast<unsigned char>(c)) && c != '-' && c != '+' && c != '.' && c != 'e' && c != 'E') {
      return std::nullopt;
    }
  }
  if (auto v = parse_json_exact(t); v && v->is_number()) return v;
  const std::string text(t);
  char* end = nullptr;
  errno = 0;
  const double d = std::strtod(text.c_str(), &end);
  if (end != text.c_str() + text.size() || errno != 0 || !std::isfinite(d)) return std::nullopt;
  return json(d);
}

// A literal word: JSON's and Python's true/false/null, or a number.
std::optional<json> literal_token(std::string_view t) {
  if (t == "true" || t == "True") return json(true);
  if (t == "false" || t == "False") return json(false);
  if (t == "null" || t == "None") return json(nullptr);
  return number_token(t);
}

// ---------------------------------------------------------------------------------------------
// Calls written as JSON objects

// "arguments": an object, a JSON string holding an object, or absent / null (no arguments).
std::optional<json> arguments_value(const json* v) {
  if (!v || v->is_null()) return json::object();
  if (v->is_object()) return *v;
  if (v->is_string()) {
    auto parsed = json_whole(v->get_ref<const std::string&>());
    if (parsed && parsed->is_object()) return parsed;
  }
  return std::nullopt;
}

bool valid_mistral_id(std::string_view id) {
  return id.size() == 9 && std::all_of(id.begin(), id.end(), is_alnum);
}

std::optional<ToolCall> call_from_json(const json& obj, std::initializer_list<const char*> arg_keys, bool with_id) {
  if (!obj.is_object()) return std::nullopt;
  const json* name = field(obj, "name");
  if (!name || !name->is_string() || trim(name->get_ref<const std::string&>()).empty()) return std::nullopt;
  const json* args = nullptr;
  for (const char* key : arg_keys) {
    if ((args = field(obj, key)) != nullptr) break;
  }
  const auto a = arguments_value(args);
  if (!a) return std::nullopt;
  ToolCall call{"", std::string(trim(name->get_ref<const std::string&>())), compact(*a)};
  if (with_id) {
    if (const json* id = field(obj, "id")) {
      const std::string text = id->is_string() ? id->get<std::string>() : id->is_number_unsigned() ? id->dump() : "";
      if (valid_mistral_id(text)) call.id = text;
    }
  }
  return call;
}

ParsedToolCalls finish(std::vector<ToolCall> calls, std::string_view text, size_t end) {
  ParsedToolCalls out;
  if (calls.empty()) return out;
  out.ok = true;
  out.calls = std::move(calls);
  const std::string_view rest = text.substr(std::min(end, text.size()));
  if (!trim(rest).empty()) out.rest = std::string(rest);
  return out;
}

// <tool_call>\n{"name": ..., "arguments": ...}\n</tool_call>, several objects in one block
// separated by commas, blocks separated by whitespace.
ParsedToolCalls parse_hermes(std::string_view s) {
  std::vector<ToolCall> calls;
  size_t pos = 0;
  for (;;) {
    size_t p = skip_ws(s, pos);
    if (!at(s, p, "<tool_call>")) break;
    p = skip_ws(s, p + 11);
    std::vector<ToolCall> block;
    for (;;) {
      const auto v = json_at(s, p);
      const auto call = v ? call_from_json(*v, {"arguments", "parameters"}, false) : std::nullopt;
      if (!call) {
        block.clear();
        break;
      }
      block.push_back(*call);
      p = skip_ws(s, p);
      if (p < s.size() && s[p] == ',') {
        p = skip_ws(s, p + 1);
        continue;
      }
      break;
    }
    if (block.empty()) break;
    if (at(s, p, "</tool_call>")) {
      p += 12;
    } else if (p != s.size()) {  // a missing closer is fine only at the end of the answer
      break;
    }
    calls.insert(calls.end(), block.begin(), block.end());
    pos = p;
  }
  return finish(std::move(calls), s, pos);
}

// {"name": ..., "parameters": ...} (or "arguments"), with an optional "type": "function";
// several separated by whitespace or ';'.
ParsedToolCalls parse_llama3(std::string_view s) {
  std::vector<ToolCall> calls;
  size_t pos = 0;
  for (;;) {
    size_t p = skip_ws(s, pos);
    if (!calls.empty() && p < s.size() && s[p] == ';') p = skip_ws(s, p + 1);
    if (p >= s.size() || s[p] != '{') break;
    const auto v = json_at(s, p);
    if (!v) break;
    const json* type = field(*v, "type");
    if (type && *type != "function") break;
    const auto call = call_from_json(*v, {"parameters", "arguments"}, false);
    if (!call) break;
    calls.push_back(*call);
    pos = p;
  }
  return finish(std::move(calls), s, pos);
}

// Both Mistral forms: [TOOL_CALLS][{"name", "arguments", "id"}, ...] (Nemo) and
// [TOOL_CALLS]NAME[CALL_ID]ID[ARGS]{...} (Small 3.2; Ministral and Devstral without [CALL_ID]).
ParsedToolCalls parse_mistral(std::string_view s) {
  std::vector<ToolCall> calls;
  size_t pos = 0;
  for (;;) {
    size_t p = skip_ws(s, pos);
    if (!at(s, p, "[TOOL_CALLS]")) break;
    p = skip_ws(s, p + 12);
    std::vector<ToolCall> block;
    if (p < s.size() && (s[p] == '[' || s[p] == '{')) {
      auto v = json_at(s, p);
      if (!v) break;
      if (v->is_object()) {
        json list = json::array();
        list.push_back(std::move(*v));
        v = std::move(list);
      }
      for (const auto& item : *v) {
        const auto call = call_from_json(item, {"arguments", "parameters"}, true);
        if (!call) {
          block.clear();
          break;
        }
        block.push_back(*call);
      }
      if (block.empty()) break;
    } else {
      size_t e = p;
      while (e < s.size() && s[e] != '[' && s[e] != '{' && s[e] != '\n') ++e;
      const std::string_view name = trim(s.substr(p, e - p));
      if (name.empty()) break;
      p = e;
      std::string id;
      if (at(s, p, "[CALL_ID]")) {
        const size_t args = s.find("[ARGS]", p + 9);
        if (args == npos) break;
        const std::string_view written = trim(s.substr(p + 9, args - p - 9));
        if (valid_mistral_id(written)) id = std::string(written);
        p = args;
      }
      if (!at(s, p, "[ARGS]")) break;
      p = skip_ws(s, p + 6);
      const auto v = json_at(s, p);
      const auto a = v ? arguments_value(&*v) : std::nullopt;
      if (!a) break;
      block.push_back({id, std::string(name), compact(*a)});
    }
    calls.insert(calls.end(), block.begin(), block.end());
    pos = p;
  }
  return finish(std::move(calls), s, pos);
}

// ---------------------------------------------------------------------------------------------
// Qwen XML: <tool_call>\n<function=NAME>\n<parameter=KEY>\nVALUE\n</parameter>\n...</function>\n</tool_call>

// How a parameter's value is read: raw text (schema type "string", or an enum/const of strings
// without a type), JSON checked against a type list that includes "string" (the raw text where
// it does not fit), or JSON (the raw text where it is not JSON).
enum class XmlKind { Raw, Typed, Json };

XmlKind xml_kind(const json* schema) {
  if (!schema || !schema->is_object()) return XmlKind::Json;
  const json* type = field(*schema, "type");
  if (type && type->is_string()) return *type == "string" ? XmlKind::Raw : XmlKind::Json;
  if (type && type->is_array()) {
    return std::find(type->begin(), type->end(), json("string")) != type->end() ? XmlKind::Typed : XmlKind::Json;
  }
  if (!type) {
    const json* e = field(*schema, "enum");
    if (e && e->is_array() && !e->empty() && std::all_of(e->begin(), e->end(), [](const json& v) { return v.is_string(); })) {
      return XmlKind::Raw;
    }
    const json* c = field(*schema, "const");
    if (c && c->is_string()) return XmlKind::Raw;
  }
  return XmlKind::Json;
}

bool json_type_in(const json& v, const json& types) {
  for (const auto& t : types) {
    if (!t.is_string()) continue;
    const auto& n = t.get_ref<const std::string&>();
    if ((n == "null" && v.is_null()) || (n == "boolean" && v.is_boolean()) || (n == "object" && v.is_object()) ||
        (n == "array" && v.is_array()) || (n == "string" && v.is_string()) || (n == "number" && v.is_number()) ||
        (n == "integer" && v.is_number_integer())) {
      return true;
    }
  }
  return false;
}

// The schema of parameter `key` of the tool named `name` in an OpenAI tools array, or null.
const json* param_schema(const json& tools, std::string_view name, std::string_view key) {
  if (!tools.is_array()) return nullptr;
  for (const auto& t : tools) {
    const json* f = field(t, "function");
    const json* n = f ? field(*f, "name") : nullptr;
    if (!n || !n->is_string() || n->get_ref<const std::string&>() != name) continue;
    const json* params = field(*f, "parameters");
    const json* props = params ? field(*params, "properties") : nullptr;
    if (!props || !props->is_object()) return nullptr;
    const auto it = props->find(std::string(key));
    return it == props->end() ? nullptr : &*it;
  }
  return nullptr;
}

json xml_value(std::string_view raw, const json* schema) {
  const XmlKind kind = xml_kind(schema);
  if (kind == XmlKind::Raw) return json(std::string(raw));
  const std::string_view t = trim(raw);
  std::optional<json> v = json_whole(t);
  if (!v && (t == "True" || t == "False" || t == "None")) v = literal_token(t);
  if (v && kind == XmlKind::Typed && !json_type_in(*v, (*schema)["type"])) v.reset();
  return v ? *v : json(std::string(raw));
}

// Where the value starting at `from` ends: the first `close` tag that `next` or `last` (the next
// argument's opener, the call's closer) follows, else the first `close` (npos if none).
size_t find_value_close(std::string_view s, size_t from, std::string_view close, std::string_view next,
                        std::string_view last) {
  size_t first = npos;
  int looked = 0;
  for (size_t e = s.find(close, from); e != npos && looked < 64; e = s.find(close, e + 1), ++looked) {
    if (first == npos) first = e;
    const size_t n = skip_ws(s, e + close.size());
    if (at(s, n, next) || at(s, n, last)) return e;
  }
  return first;
}

// Where a value of `schema` starting at `q` ends: a JSON value decides its own end where
// `close` follows it; raw text (and text that is not JSON) ends as find_value_close says.
size_t xml_value_end(std::string_view s, size_t q, const json* schema, std::string_view close, std::string_view next,
                     std::string_view last) {
  if (xml_kind(schema) != XmlKind::Raw) {
    size_t e = skip_ws(s, q);
    if (json_at(s, e)) {
      e = skip_ws(s, e);
      if (at(s, e, close)) return e;
    }
  }
  return find_value_close(s, q, close, next, last);
}

// A tag's value up to '>': trimmed, one line, no '<'.
std::optional<std::string_view> tag_value(std::string_view s, size_t& p) {
  const size_t gt = s.find('>', p);
  if (gt == npos) return std::nullopt;
  const std::string_view v = trim(s.substr(p, gt - p));
  if (v.empty() || has(v, "\n") || has(v, "<")) return std::nullopt;
  p = gt + 1;
  return v;
}

ParsedToolCalls parse_qwen_xml(std::string_view s, const json& tools) {
  std::vector<ToolCall> calls;
  size_t pos = 0;
  for (;;) {
    size_t p = skip_ws(s, pos);
    if (at(s, p, "<tool_call>")) p = skip_ws(s, p + 11);
    if (!at(s, p, "<function=")) break;
    p += 10;
    const auto name = tag_value(s, p);
    if (!name) break;
    json args = json::object();
    bool closed = false;
    for (;;) {
      size_t q = skip_ws(s, p);
      if (at(s, q, "</function>")) {
        p = q + 11;
        closed = true;
        break;
      }
      if (!at(s, q, "<parameter=")) break;
      q += 11;
      const auto key = tag_value(s, q);
      if (!key) break;
      const json* schema = param_schema(tools, *name, *key);
      const size_t close = xml_value_end(s, q, schema, "</parameter>", "<parameter=", "</function>");
      if (close == npos) break;
      std::string_view raw = s.substr(q, close - q);
      if (!raw.empty() && raw.front() == '\n') raw.remove_prefix(1);
      if (!raw.empty() && raw.back() == '\n') raw.remove_suffix(1);
      args[std::string(*key)] = xml_value(raw, schema);
      p = close + 12;
    }
    if (!closed) break;
    const size_t q = skip_ws(s, p);
    if (at(s, q, "</tool_call>")) p = q + 12;
    calls.push_back({"", std::string(*name), compact(args)});
    pos = p;
  }
  return finish(std::move(calls), s, pos);
}

// ---------------------------------------------------------------------------------------------
// DeepSeek-V4's DSML: <｜DSML｜tool_calls>\n<｜DSML｜invoke name="NAME">\n<｜DSML｜parameter
// name="K" string="true|false">V</｜DSML｜parameter>\n...</｜DSML｜invoke>\n</｜DSML｜tool_calls>.
// string="true" values are raw text, string="false" ones JSON (raw text where they are not).

constexpr std::string_view kDsml = "\xEF\xBD\x9C" "DSML" "\xEF\xBD\x9C";  // ｜DSML｜ (U+FF5C around DSML)

std::string dsml(std::string_view prefix, std::string_view tag) { return std::string(prefix) + std::string(kDsml) + std::string(tag); }

// A quoted attribute value at `p` (just after the opening quote), up to the closing quote:
// one line, no '<', not empty.
std::optional<std::string_view> dsml_quoted(std::string_view s, size_t& p) {
  const size_t q = s.find('"', p);
  if (q == npos) return std::nullopt;
  const std::string_view v = s.substr(p, q - p);
  if (v.empty() || has(v, "\n") || has(v, "<")) return std::nullopt;
  p = q + 1;
  return v;
}

// One <｜DSML｜parameter name="K" string="B">V</｜DSML｜parameter> at `p` (after whitespace) into `args`.
bool dsml_argument(std::string_view s, size_t& p, json& args) {
  static const std::string open = dsml("<", "parameter name=\""), close = dsml("</", "parameter>"),
                           last = dsml("</", "invoke>");
  size_t q = skip_ws(s, p);
  if (!at(s, q, open)) return false;
  q += open.size();
  const auto key = dsml_quoted(s, q);
  if (!key) return false;
  const bool raw = at(s, q, " string=\"true\">");
  if (!raw && !at(s, q, " string=\"false\">")) return false;
  q += raw ? 15 : 16;
  const size_t end = find_value_close(s, q, close, open, last);
  if (end == npos) return false;
  const std::string_view text = s.substr(q, end - q);
  std::optional<json> value;
  if (!raw) value = json_whole(trim(text));
  args[std::string(*key)] = value ? *value : json(std::string(text));
  p = end + close.size();
  return true;
}

ParsedToolCalls parse_deepseek_dsml(std::string_view s, const json&) {
  static const std::string block = dsml("<", "tool_calls>"), block_end = dsml("</", "tool_calls>"),
                           invoke = dsml("<", "invoke name=\""), invoke_end = dsml("</", "invoke>");
  std::vector<ToolCall> calls;
  size_t pos = 0;
  for (bool in_block = false;;) {
    size_t p = skip_ws(s, pos);
    if (!in_block && at(s, p, block)) {
      in_block = true;
      pos = p + block.size();
      continue;
    }
    if (in_block && at(s, p, block_end)) {
      in_block = false;
      pos = p + block_end.size();
      continue;
    }
    if (!in_block || !at(s, p, invoke)) break;
    p += invoke.size();
    const auto name = dsml_quoted(s, p);
    if (!name || !at(s, p, ">")) break;
    ++p;
    json args = json::object();
    while (dsml_argument(s, p, args)) {
    }
    p = skip_ws(s, p);
    if (at(s, p, invoke_end)) p += invoke_end.size();
    else if (p < s.size()) break;  // only the end of the answer may stand for the closing tags
    calls.push_back({"", std::string(*name), compact(args)});
    pos = p;
  }
  return finish(std::move(calls), s, pos);
}

// ---------------------------------------------------------------------------------------------
// DeepSeek's earlier calls, between special tokens spelled <｜...｜> (U+FF5C bars, U+2581 for spaces):
//   deepseek-r1   (V3, R1 and its distills) <｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>NAME\n
//                 ```json\n{...}\n```<｜tool▁call▁end｜>, parallel calls joined by "\n", then <｜tool▁calls▁end｜>
//   deepseek-v3.1 <｜tool▁calls▁begin｜><｜tool▁call▁begin｜>NAME<｜tool▁sep｜>{...}<｜tool▁call▁end｜>... <｜tool▁calls▁end｜>
// Both read the fence as optional and the closing tokens as optional at the end of the answer.

// A DeepSeek special token from its words: "tool calls begin" -> <｜tool▁calls▁begin｜>.
std::string deepseek_token(std::string_view words) {
  std::string out = "<\xEF\xBD\x9C";
  for (const char c : words) out += c == ' ' ? std::string("\xE2\x96\x81") : std::string(1, c);
  return out + "\xEF\xBD\x9C>";
}

struct DeepseekTokens {
  std::string calls_begin = deepseek_token("tool calls begin"), calls_end = deepseek_token("tool calls end"),
              call_begin = deepseek_token("tool call begin"), call_end = deepseek_token("tool call end"),
              sep = deepseek_token("tool sep");
};

const DeepseekTokens& deepseek() {
  static const DeepseekTokens tokens;
  return tokens;
}

// The arguments at `p` (after whitespace): a JSON object, or a JSON string holding one, inside an
// optional ```json fence; `p` ends past the fence.
std::optional<json> deepseek_arguments(std::string_view s, size_t& p) {
  size_t q = skip_ws(s, p);
  const bool fenced = at(s, q, "```");
  if (fenced) q = skip_ws(s, q + (at(s, q, "```json") ? 7 : 3));
  const auto v = json_at(s, q);
  const auto args = v ? arguments_value(&*v) : std::nullopt;
  if (!args) return std::nullopt;
  q = skip_ws(s, q);
  if (fenced && at(s, q, "```")) q += 3;
  else if (fenced && q < s.size()) return std::nullopt;  // only the end of the answer may stand for the fence
  p = q;
  return args;
}

// A function name: not empty, no whitespace or '<' (which would start a token), at most 256 bytes.
bool deepseek_name_ok(std::string_view name) {
  return !name.empty() && name.size() <= 256 &&
         std::none_of(name.begin(), name.end(), [](char c) { return is_space(c) || c == '<'; });
}

// A call's arguments at `e`, then its end token (or the answer's end): the call, with `p` moved
// past it; nullopt where either is missing.
std::optional<ToolCall> deepseek_call_tail(std::string_view s, size_t e, std::string_view name, size_t& p) {
  const DeepseekTokens& t = deepseek();
  const auto args = deepseek_arguments(s, e);
  if (!args) return std::nullopt;
  if (at(s, e, t.call_end)) e += t.call_end.size();
  else if (e < s.size()) return std::nullopt;
  p = e;
  return ToolCall{"", std::string(name), compact(*args)};
}

// One R1 call at `p` (at <｜tool▁call▁begin｜>); `p` ends past <｜tool▁call▁end｜> (or at the end of the answer).
std::optional<ToolCall> deepseek_r1_call(std::string_view s, size_t& p) {
  const DeepseekTokens& t = deepseek();
  size_t q = skip_ws(s, p + t.call_begin.size());
  if (at(s, q, "function")) q = skip_ws(s, q + 8);
  if (!at(s, q, t.sep)) return std::nullopt;
  q += t.sep.size();
  size_t e = q;
  while (e < s.size() && s[e] != '\n' && s[e] != '`' && s[e] != '{' && s[e] != '<') ++e;
  const std::string_view name = trim(s.substr(q, e - q));
  if (!deepseek_name_ok(name)) return std::nullopt;
  return deepseek_call_tail(s, e, name, p);
}

// One V3.1 call at `p` (at <｜tool▁call▁begin｜>), as deepseek_r1_call.
std::optional<ToolCall> deepseek_v31_call(std::string_view s, size_t& p) {
  const DeepseekTokens& t = deepseek();
  const size_t q = p + t.call_begin.size();
  const size_t sep = s.substr(0, std::min(s.size(), q + 300)).find(t.sep, q);
  if (sep == npos) return std::nullopt;
  const std::string_view name = trim(s.substr(q, sep - q));
  if (!deepseek_name_ok(name)) return std::nullopt;
  return deepseek_call_tail(s, sep + t.sep.size(), name, p);
}

// Blocks of calls: <｜tool▁calls▁begin｜> (left out by some answers), calls, <｜tool▁calls▁end｜>.
ParsedToolCalls parse_deepseek_calls(std::string_view s, std::optional<ToolCall> (*one_call)(std::string_view, size_t&)) {
  const DeepseekTokens& t = deepseek();
  std::vector<ToolCall> calls;
  size_t pos = 0;
  for (;;) {
    size_t p = skip_ws(s, pos);
    if (at(s, p, t.calls_begin)) p += t.calls_begin.size();
    size_t block_calls = 0;
    for (;;) {
      size_t q = skip_ws(s, p);
      if (!at(s, q, t.call_begin)) break;
      auto call = one_call(s, q);
      if (!call) break;
      calls.push_back(std::move(*call));
      ++block_calls;
      p = q;
    }
    if (block_calls == 0) break;
    const size_t q = skip_ws(s, p);
    if (at(s, q, t.calls_end)) p = q + t.calls_end.size();
    pos = p;
  }
  return finish(std::move(calls), s, pos);
}

ParsedToolCalls parse_deepseek_r1(std::string_view s, const json&) { return parse_deepseek_calls(s, deepseek_r1_call); }
ParsedToolCalls parse_deepseek_v31(std::string_view s, const json&) { return parse_deepseek_calls(s, deepseek_v31_call); }

// ---------------------------------------------------------------------------------------------
// GLM-4.5 / 4.6: <tool_call>NAME\n<arg_key>K</arg_key>\n<arg_value>V</arg_value>\n</tool_call>;
// GLM-4.7 writes the same tags with no newlines, so whitespace between tags is optional. Values
// as qwen-xml's: raw text for string schemas (kept exactly), JSON for the others.

// The function name after <tool_call>: up to the first '<' or newline, trimmed, one word.
std::optional<std::string_view> glm_name(std::string_view s, size_t& p) {
  size_t e = p;
  while (e < s.size() && s[e] != '<' && s[e] != '\n') ++e;
  const std::string_view v = trim(s.substr(p, e - p));
  if (v.empty() || std::any_of(v.begin(), v.end(), is_space)) return std::nullopt;
  p = e;
  return v;
}

// One <arg_key>K</arg_key><arg_value>V</arg_value> pair at `p` (after whitespace) into `args`.
bool glm_argument(std::string_view s, size_t& p, std::string_view name, const json& tools, json& args) {
  size_t q = skip_ws(s, p);
  if (!at(s, q, "<arg_key>")) return false;
  q += 9;
  const size_t key_end = s.find("</arg_key>", q);
  if (key_end == npos) return false;
  const std::string_view key = trim(s.substr(q, key_end - q));
  if (key.empty() || has(key, "<") || has(key, "\n")) return false;
  q = skip_ws(s, key_end + 10);
  if (!at(s, q, "<arg_value>")) return false;
  q += 11;
  const json* schema = param_schema(tools, name, key);
  const size_t close = xml_value_end(s, q, schema, "</arg_value>", "<arg_key>", "</tool_call>");
  if (close == npos) return false;
  args[std::string(key)] = xml_value(s.substr(q, close - q), schema);
  p = close + 12;
  return true;
}

ParsedToolCalls parse_glm_xml(std::string_view s, const json& tools) {
  std::vector<ToolCall> calls;
  size_t pos = 0;
  for (;;) {
    size_t p = skip_ws(s, pos);
    if (!at(s, p, "<tool_call>")) break;
    p += 11;
    const auto name = glm_name(s, p);
    if (!name) break;
    json args = json::object();
    while (glm_argument(s, p, *name, tools, args)) {
    }
    p = skip_ws(s, p);
    if (at(s, p, "</tool_call>")) p += 12;
    else if (p < s.size()) break;  // only the end of the answer may stand for the closing tag
    calls.push_back({"", std::string(*name), compact(args)});
    pos = p;
  }
  return finish(std::move(calls), s, pos);
}

// ---------------------------------------------------------------------------------------------
// Gemma 4: <|tool_call>call:NAME{key:value,...}<tool_call|>, strings as <|"|>text<|"|>

std::optional<json> gemma_value(std::string_view s, size_t& p, int depth);

std::optional<std::string> gemma_key(std::string_view s, size_t& p) {
  if (at(s, p, kGemmaQuote)) {
    const size_t e = s.find(kGemmaQuote, p + kGemmaQuote.size());
    if (e == npos) return std::nullopt;
    std::string k(s.substr(p + kGemmaQuote.size(), e - p - kGemmaQuote.size()));
    p = e + kGemmaQuote.size();
    return k;
  }
  if (p < s.size() && s[p] == '"') {
    auto v = json_at(s, p);
    if (v && v->is_string()) return v->get<std::string>();
    return std::nullopt;
  }
  size_t e = p;
  while (e < s.size() && s[e] != ':') {
    if (std::string_view("{}[],<").find(s[e]) != npos) return std::nullopt;
    ++e;
  }
  const std::string_view k = trim(s.substr(p, e - p));
  if (e >= s.size() || k.empty()) return std::nullopt;
  p = e;
  return std::string(k);
}

std::optional<json> gemma_value(std::string_view s, size_t& p, int depth) {
  if (depth > kMaxDepth) return std::nullopt;
  p = skip_ws(s, p);
  if (p >= s.size()) return std::nullopt;
  if (at(s, p, kGemmaQuote)) {
    const size_t e = s.find(kGemmaQuote, p + kGemmaQuote.size());
    if (e == npos) return std::nullopt;
    json v = std::string(s.substr(p + kGemmaQuote.size(), e - p - kGemmaQuote.size()));
    p = e + kGemmaQuote.size();
    return v;
  }
  const char c = s[p];
  if (c == '{' || c == '[') {
    const bool dict = c == '{';
    const char close = dict ? '}' : ']';
    json out = dict ? json::object() : json::array();
    p = skip_ws(s, p + 1);
    for (;;) {
      if (p < s.size() && s[p] == close) {  // also after a trailing comma
        ++p;
        return out;
      }
      if (dict) {
        auto k = gemma_key(s, p);
        if (!k) return std::nullopt;
        p = skip_ws(s, p);
        if (p >= s.size() || s[p] != ':') return std::nullopt;
        ++p;
        auto v = gemma_value(s, p, depth + 1);
        if (!v) return std::nullopt;
        out[*k] = std::move(*v);
      } else {
        auto v = gemma_value(s, p, depth + 1);
        if (!v) return std::nullopt;
        out.push_back(std::move(*v));
      }
      p = skip_ws(s, p);
      if (p < s.size() && s[p] == ',') {
        p = skip_ws(s, p + 1);
      } else if (p >= s.size() || s[p] != close) {
        return std::nullopt;
      }
    }
  }
  if (c == '"') {
    auto v = json_at(s, p);
    return v && v->is_string() ? v : std::nullopt;
  }
  size_t e = p;
  while (e < s.size() && std::string_view(",}]{[:<").find(s[e]) == npos && !is_space(s[e])) ++e;
  const std::string_view word = s.substr(p, e - p);
  if (word.empty()) return std::nullopt;
  auto v = literal_token(word);
  if (!v && std::isalpha(static_cast<unsigned char>(word[0]))) v = json(std::string(word));  // a bare word: a string
  if (v) p = e;
  return v;
}

ParsedToolCalls parse_gemma4(std::string_view s) {
  std::vector<ToolCall> calls;
  size_t pos = 0;
  for (;;) {
    size_t p = skip_ws(s, pos);
    if (!at(s, p, "<|tool_call>")) break;
    p = skip_ws(s, p + 12);
    if (!at(s, p, "call:")) break;
    p += 5;
    size_t brace = p;
    while (brace < s.size() && s[brace] != '{' && s[brace] != '<' && s[brace] != '\n') ++brace;
    if (brace >= s.size() || s[brace] != '{') break;
    const std::string_view name = trim(s.substr(p, brace - p));
    if (name.empty()) break;
    p = brace;
    const auto args = gemma_value(s, p, 0);
    if (!args || !args->is_object()) break;
    const size_t q = skip_ws(s, p);
    if (at(s, q, "<tool_call|>")) {
      p = q + 12;
    } else if (q != s.size()) {
      break;
    }
    calls.push_back({"", std::string(name), compact(*args)});
    pos = p;
  }
  return finish(std::move(calls), s, pos);
}

// ---------------------------------------------------------------------------------------------
// LFM2: <|tool_call_start|>[name(key=value, ...), ...]<|tool_call_end|>, Python or JSON values

std::optional<json> py_value(std::string_view s, size_t& p, int depth);

int hex_digit(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

// n hex digits at s[i..], or -1.
long hex_at(std::string_view s, size_t i, int n) {
  if (i + static_cast<size_t>(n) > s.size()) return -1;
  long v = 0;
  for (int k = 0; k < n; ++k) {
    const int d = hex_digit(s[i + static_cast<size_t>(k)]);
    if (d < 0) return -1;
    v = v * 16 + d;
  }
  return v;
}

// A quoted string (' or "), with Python's escapes and JSON's (\/ and \u surrogate pairs).
std::optional<std::string> py_string(std::string_view s, size_t& p) {
  const char quote = s[p];
  std::string out;
  size_t i = p + 1;
  while (i < s.size()) {
    const char c = s[i];
    if (c == quote) {
      p = i + 1;
      return out;
    }
    if (c != '\\') {
      out += c;
      ++i;
      continue;
    }
    if (i + 1 >= s.size()) return std::nullopt;
    const char e = s[i + 1];
    i += 2;
    switch (e) {
      case 'n': out += '\n'; break;
      case 't': out += '\t'; break;
      case 'r': out += '\r'; break;
      case 'b': out += '\b'; break;
      case 'f': out += '\f'; break;
      case 'v': out += '\v'; break;
      case 'a': out += '\a'; break;
      case '0': out += '\0'; break;
      case '\n': break;  // a line continuation
      case '\\': case '\'': case '"': case '/': out += e; break;
      case 'x': case 'u': case 'U': {
        const int n = e == 'x' ? 2 : e == 'u' ? 4 : 8;
        long cp = hex_at(s, i, n);
        if (cp < 0) return std::nullopt;
        i += static_cast<size_t>(n);
        if (e == 'u' && cp >= 0xD800 && cp <= 0xDBFF && at(s, i, "\\u")) {
          const long low = hex_at(s, i + 2, 4);
          if (low >= 0xDC00 && low <= 0xDFFF) {
            cp = 0x10000 + ((cp - 0xD800) << 10) + (low - 0xDC00);
            i += 6;
          }
        }
        append_utf8(out, static_cast<uint32_t>(std::min<long>(cp, 0x110000)));
        break;
      }
      default:  // Python keeps an unknown escape as written
        out += '\\';
        out += e;
    }
  }
  return std::nullopt;
}

std::optional<json> py_value(std::string_view s, size_t& p, int depth) {
  if (depth > kMaxDepth) return std::nullopt;
  p = skip_ws(s, p);
  if (p >= s.size()) return std::nullopt;
  const char c = s[p];
  if (c == '"' || c == '\'') {
    auto str = py_string(s, p);
    return str ? std::optional<json>(json(std::move(*str))) : std::nullopt;
  }
  if (c == '{' || c == '[' || c == '(') {
    const bool dict = c == '{';
    const char close = dict ? '}' : c == '[' ? ']' : ')';
    json out = dict ? json::object() : json::array();
    p = skip_ws(s, p + 1);
    for (;;) {
      if (p < s.size() && s[p] == close) {
        ++p;
        return out;
      }
      if (dict) {
        auto k = py_value(s, p, depth + 1);
        if (!k) return std::nullopt;
        p = skip_ws(s, p);
        if (p >= s.size() || s[p] != ':') return std::nullopt;
        ++p;
        auto v = py_value(s, p, depth + 1);
        if (!v) return std::nullopt;
        out[k->is_string() ? k->get<std::string>() : compact(*k)] = std::move(*v);
      } else {
        auto v = py_value(s, p, depth + 1);
        if (!v) return std::nullopt;
        out.push_back(std::move(*v));
      }
      p = skip_ws(s, p);
      if (p < s.size() && s[p] == ',') {
        p = skip_ws(s, p + 1);
      } else if (p >= s.size() || s[p] != close) {
        return std::nullopt;
      }
    }
  }
  size_t e = p;
  while (e < s.size() && (is_alnum(s[e]) || s[e] == '_' || s[e] == '.' || s[e] == '+' || s[e] == '-')) ++e;
  auto v = literal_token(s.substr(p, e - p));
  if (v) p = e;
  return v;
}

bool is_ident_start(char c) { return std::isalpha(static_cast<unsigned char>(c)) || c == '_'; }
bool is_ident_char(char c) { return is_alnum(c) || c == '_'; }

// name(key=value, ...)
std::optional<ToolCall> py_call(std::string_view s, size_t& p) {
  size_t e = p;
  while (e < s.size() && (is_alnum(s[e]) || s[e] == '_' || s[e] == '.' || s[e] == '-')) ++e;
  if (e == p) return std::nullopt;
  const std::string name(s.substr(p, e - p));
  size_t q = skip_ws(s, e);
  if (q >= s.size() || s[q] != '(') return std::nullopt;
  q = skip_ws(s, q + 1);
  json args = json::object();
  for (;;) {
    if (q < s.size() && s[q] == ')') break;
    if (q >= s.size() || !is_ident_start(s[q])) return std::nullopt;
    size_t k = q;
    while (k < s.size() && is_ident_char(s[k])) ++k;
    const std::string key(s.substr(q, k - q));
    q = skip_ws(s, k);
    if (q >= s.size() || s[q] != '=' || at(s, q, "==")) return std::nullopt;
    ++q;
    auto v = py_value(s, q, 1);
    if (!v) return std::nullopt;
    args[key] = std::move(*v);
    q = skip_ws(s, q);
    if (q < s.size() && s[q] == ',') {
      q = skip_ws(s, q + 1);
    } else if (q >= s.size() || s[q] != ')') {
      return std::nullopt;
    }
  }
  p = q + 1;
  return ToolCall{"", name, compact(args)};
}

ParsedToolCalls parse_lfm2(std::string_view s) {
  std::vector<ToolCall> calls;
  size_t pos = 0;
  for (;;) {
    size_t p = skip_ws(s, pos);
    if (!at(s, p, "<|tool_call_start|>")) break;
    p = skip_ws(s, p + 19);
    const bool bracket = p < s.size() && s[p] == '[';
    if (bracket) ++p;
    std::vector<ToolCall> block;
    bool good = true;
    for (;;) {
      p = skip_ws(s, p);
      if (bracket && !block.empty() && p < s.size() && s[p] == ']') break;  // a trailing comma
      auto call = py_call(s, p);
      if (!call) {
        good = false;
        break;
      }
      block.push_back(std::move(*call));
      p = skip_ws(s, p);
      if (p < s.size() && s[p] == ',') {
        ++p;
        continue;
      }
      break;
    }
    if (!good || block.empty()) break;
    if (bracket) {
      if (p >= s.size() || s[p] != ']') break;
      p = skip_ws(s, p + 1);
    }
    if (at(s, p, "<|tool_call_end|>")) {
      p += 17;
    } else if (p != s.size()) {
      break;
    }
    calls.insert(calls.end(), block.begin(), block.end());
    pos = p;
  }
  return finish(std::move(calls), s, pos);
}

// ---------------------------------------------------------------------------------------------
// Harmony: [<|start|>assistant]<|channel|>commentary to=functions.NAME [<|constrain|>]json<|message|>ARGS[<|call|>]
// (or the recipient before <|channel|>)

ParsedToolCalls parse_harmony(std::string_view s) {
  std::vector<ToolCall> calls;
  size_t pos = 0;
  for (;;) {
    size_t p = skip_ws(s, pos);
    if (at(s, p, "<|start|>")) {
      p += 9;
      if (at(s, p, "assistant")) p += 9;
    }
    const size_t msg = s.find("<|message|>", p);
    if (msg == npos) break;
    const std::string_view header = s.substr(p, msg - p);
    if (!has(header, "<|channel|>") || has(header, "<|end|>") || has(header, "<|call|>") || has(header, "<|start|>") ||
        has(header, "<|return|>")) {
      break;
    }
    const size_t to = header.find("to=");
    if (to == npos) break;
    size_t re = to + 3;
    while (re < header.size() && !is_space(header[re]) && header[re] != '<') ++re;
    const std::string_view recipient = header.substr(to + 3, re - to - 3);
    if (recipient.substr(0, 10) != "functions.") break;
    const size_t body = msg + 11;
    size_t end = s.size();
    for (const std::string_view stop : {"<|call|>", "<|end|>", "<|start|>", "<|return|>"}) end = std::min(end, s.find(stop, body));
    const auto one = parse_harmony_call(recipient, s.substr(body, end - body));
    if (!one.ok) break;
    calls.push_back(one.calls.front());
    p = end;
    if (at(s, p, "<|call|>")) p += 8;
    else if (at(s, p, "<|end|>")) p += 7;
    pos = p;
  }
  return finish(std::move(calls), s, pos);
}

// ---------------------------------------------------------------------------------------------
// Grammars

struct Tool {
  size_t index;
  std::string name;
  const json* params;  // null: no "parameters"
};

bool valid_tool_name(const std::string& n) {
  return !n.empty() && n.size() <= 256 &&
         std::all_of(n.begin(), n.end(), [](char c) { return is_alnum(c) || c == '_' || c == '-' || c == '.'; });
}

std::vector<Tool> usable_tools(const json& tools, std::string_view only) {
  if (!tools.is_array() || tools.empty()) fail("tools: a tool call needs a non-empty array of tools");
  std::vector<Tool> out;
  std::map<std::string, size_t> seen;
  for (size_t i = 0; i < tools.size(); ++i) {
    const json& t = tools[i];
    if (!t.is_object()) fail("tools[{}]: not an object", i);
    const json* type = field(t, "type");
    if (type && *type != "function") fail("tools[{}].type: only \"function\" tools can be called", i);
    const json* f = field(t, "function");
    if (!f || !f->is_object()) fail("tools[{}].function: missing or not an object", i);
    const json* n = field(*f, "name");
    if (!n || !n->is_string()) fail("tools[{}].function.name: missing or not a string", i);
    const std::string name = n->get<std::string>();
    if (!valid_tool_name(name)) {
      fail("tools[{}].function.name {}: a tool name is 1 to 256 letters, digits, '_', '-' or '.'", i, compact(*n));
    }
    if (const auto it = seen.find(name); it != seen.end()) {
      fail("tools[{}].function.name \"{}\": tools[{}] has the same name", i, name, it->second);
    }
    seen[name] = i;
    const json* params = field(*f, "parameters");
    if (params && params->is_null()) params = nullptr;
    if (params && !params->is_object()) fail("tools[{}].function.parameters: not an object (a JSON schema)", i);
    if (params) {
      const json* ptype = field(*params, "type");
      if (ptype && *ptype != "object") fail("tools[{}].function.parameters: \"type\" must be \"object\"", i);
    }
    if (!only.empty() && name != only) continue;
    out.push_back({i, name, params});
  }
  if (!only.empty() && out.empty()) fail("tools: no function named \"{}\" for tool_choice", only);
  return out;
}

std::string lit(std::string_view text) { return JsonGrammarBuilder::literal(text); }

// One character of a GBNF class, escaped where the class syntax needs it.
std::string class_char(char c) {
  if (c == '\\' || c == ']' || c == '[' || c == '-' || c == '^') return std::string("\\") + c;
  if (c == '\n') return "\\n";
  return std::string(1, c);
}

std::string alternatives(const std::vector<std::string>& alts) {
  if (alts.size() == 1) return alts[0];
  std::string out = "( ";
  for (size_t i = 0; i < alts.size(); ++i) out += (i ? " | " : "") + alts[i];
  return out + " )";
}

// Properties sorted as Jinja's dictsort sorts them (case-insensitively, stable).
std::vector<std::pair<std::string, const json*>> dictsorted(const json& props) {
  std::vector<std::pair<std::string, const json*>> out;
  for (auto it = props.begin(); it != props.end(); ++it) out.emplace_back(it.key(), &it.value());
  auto lower = [](std::string s) {
    for (char& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    return s;
  };
  std::stable_sort(out.begin(), out.end(), [&](const auto& a, const auto& b) { return lower(a.first) < lower(b.first); });
  return out;
}

// How a format's calls follow each other in an answer.
struct CallList {
  const char* open;       // before the first call ("": nothing)
  const char* separator;  // between two calls ("": none, the calls follow each other directly)
  const char* close;      // after the last call
  bool one_per_turn;      // the template takes one call per turn: a grammar never asks for more
};

class GemmaValues;

class CallGrammar {
 public:
  explicit CallGrammar(ToolFormat format) : format_(format) {}

  using CallRule = std::string (CallGrammar::*)(const Tool& t);

  // The grammar of a tool-call text: one call of `call_rule` per tool as alternatives, joined
  // as `list` says (several calls when `parallel`).
  std::string build(const std::vector<Tool>& tools, CallRule call_rule, const CallList& list, bool parallel) {
    std::vector<std::string> alts;
    for (const auto& t : tools) {
      tool_ = &t;
      alts.push_back((this->*call_rule)(t));
    }
    b_.add_rule("tool-call", alternatives(alts));
    b_.add_rule("root", root_rule(list, parallel && !list.one_per_turn));
    return b_.gbnf();
  }

  // ---- one call to tool `t`, in each format (FormatSpec::call)

  std::string hermes_call(const Tool& t) {
    return lit("<tool_call>\n{\"name\": \"" + t.name + "\", \"arguments\": ") + " " + json_args(t) + " " + lit("}\n</tool_call>");
  }
  std::string llama3_call(const Tool& t) {
    return lit("{\"name\": \"" + t.name + "\", \"parameters\": ") + " " + json_args(t) + " " + lit("}");
  }
  std::string mistral_list_call(const Tool& t) {
    return lit("{\"name\": \"" + t.name + "\", \"arguments\": ") + " " + json_args(t) + " " + lit(", \"id\": \"") +
           " [a-zA-Z0-9]{9} " + lit("\"}");
  }
  std::string mistral_args_call(const Tool& t) {
    return lit("[TOOL_CALLS]" + t.name) + " ( " + lit("[CALL_ID]") + " [a-zA-Z0-9]{9} )? " + lit("[ARGS]") + " " + json_args(t);
  }
  std::string harmony_call(const Tool& t) {
    return lit("<|channel|>commentary to=functions." + t.name + " <|constrain|>json<|message|>") + " " + json_args(t);
  }
  std::string qwen_xml_call(const Tool& t) {
    return lit("<tool_call>\n<function=" + t.name + ">\n") + " " + xml_params(t, kQwenXmlItem) + " " +
           lit("</function>\n</tool_call>");
  }
  std::string glm_xml_call(const Tool& t) {
    return lit("<tool_call>" + t.name + "\n") + " " + xml_params(t, kGlmXmlItem) + " " + lit("</tool_call>");
  }
  std::string deepseek_dsml_call(const Tool& t) {
    const std::string params = xml_params(t, kDsmlItem);
    return lit(dsml("<", "invoke name=\"") + t.name + "\">\n") + " " + (params.empty() ? lit("\n") : params) + " " +
           lit(dsml("</", "invoke>") + "\n");
  }
  std::string deepseek_r1_call(const Tool& t) {
    const DeepseekTokens& d = deepseek();
    return lit(d.call_begin + "function" + d.sep + t.name + "\n```json\n") + " " + json_args(t) + " " +
           lit("\n```" + d.call_end);
  }
  std::string deepseek_v31_call(const Tool& t) {
    const DeepseekTokens& d = deepseek();
    return lit(d.call_begin + t.name + d.sep) + " " + json_args(t) + " " + lit(d.call_end);
  }
  std::string gemma4_call(const Tool& t) {
    return lit("<|tool_call>call:" + t.name + "{") + " " + gemma_params(t) + " " + lit("}<tool_call|>");
  }
  std::string lfm2_call(const Tool& t) { return lit(t.name + "(") + " " + lfm2_params(t) + " " + lit(")"); }

 private:
  // The calls one after the other: "tool-call", or several joined by the separator (directly
  // when it is empty), inside the list's opening and closing text.
  static std::string root_rule(const CallList& list, bool parallel) {
    const std::string one = "tool-call";
    std::string calls = one;
    if (parallel) calls = *list.separator ? one + " ( " + lit(list.separator) + " " + one + " )*" : one + "+";
    if (!*list.open) return calls;
    return lit(list.open) + " " + calls + " " + lit(list.close);
  }

  [[noreturn]] void schema_error(const std::string& where, const std::string& what) const {
    fail("tools[{}].function.parameters{}: {}", tool_->index, where, what);
  }

  std::string fresh(const char* kind) { return fmt::format("tc-{}{}", kind, counter_++); }

  std::string rule(const std::string& body) {
    const std::string name = fresh("x");
    b_.add_rule(name, body);
    return name;
  }

  // A JSON value for `schema` (the tool's $defs / definitions attached so "#/$defs/..." refs resolve).
  std::string json_value(const json& schema, const std::string& where) {
    json s = schema;
    if (s.is_object() && tool_->params) {
      for (const char* defs : {"$defs", "definitions"}) {
        if (const json* d = field(*tool_->params, defs); d && !s.contains(defs)) s[defs] = *d;
      }
    }
    try {
      return b_.add_schema(s, fresh("a"));
    } catch (const Error& e) {
      schema_error(where, e.what());
    }
  }

  std::string json_args(const Tool& t) {
    if (!t.params) return lit("{}");
    json s = *t.params;
    if (!s.contains("type")) s["type"] = "object";
    return json_value(s, "");
  }

  struct Prop {
    std::string key;
    const json* schema;
    bool required;
  };

  // The top-level properties of a tool whose calls name their arguments one by one.
  std::vector<Prop> properties(const Tool& t) {
    std::vector<Prop> out;
    if (!t.params) return out;
    const json& s = *t.params;
    for (const char* k : {"anyOf", "oneOf", "allOf", "not", "if", "$ref", "enum", "const", "minProperties",
                          "maxProperties", "patternProperties", "propertyNames", "dependentRequired",
                          "dependentSchemas", "dependencies", "unevaluatedProperties"}) {
      if (s.contains(k)) schema_error("", fmt::format("\"{}\" at the top is not supported for {} tool calls", k, tool_format_name(format_)));
    }
    const json* props = field(s, "properties");
    if (props && !props->is_object()) schema_error(".properties", "not an object");
    std::set<std::string> required;
    if (const json* r = field(s, "required")) {
      if (!r->is_array()) schema_error(".required", "not an array");
      for (const auto& k : *r) {
        if (!k.is_string()) schema_error(".required", "not an array of strings");
        if (!props || !props->contains(k.get<std::string>())) schema_error(".required", fmt::format("{} is not in properties", compact(k)));
        required.insert(k.get<std::string>());
      }
    }
    if (!props) return out;
    for (auto it = props->begin(); it != props->end(); ++it) {
      if (!it.value().is_object() && it.value() != json(true)) {
        schema_error(".properties." + it.key(), "not a schema object");
      }
      out.push_back({it.key(), &it.value(), required.count(it.key()) > 0});
    }
    return out;
  }

  // Items joined by sep, each required one present and each optional one possibly left out, in
  // the order given. first(i): nothing written yet, items i.. remain; rest(i): something written.
  std::string join_optional(const std::vector<std::pair<std::string, bool>>& items, const std::string& sep) {
    const size_t n = items.size();
    if (n == 0) return "";
    const bool all_required = std::all_of(items.begin(), items.end(), [](const auto& i) { return i.second; });
    if (all_required) {
      std::string out;
      for (size_t i = 0; i < n; ++i) out += (i ? " " + sep + " " : "") + items[i].first;
      return out;
    }
    std::vector<std::string> rest(n + 1);
    for (size_t i = n; i-- > 1;) {
      std::string body = items[i].second ? sep + " " + items[i].first : "( " + sep + " " + items[i].first + " )?";
      if (!rest[i + 1].empty()) body += " " + rest[i + 1];
      rest[i] = rule(body);
    }
    std::vector<bool> needed(n, false);  // first(i) is reachable: items before i are all optional
    for (size_t i = 0; i < n && (i == 0 || !items[i - 1].second); ++i) needed[i] = true;
    std::vector<std::string> first(n);
    for (size_t i = n; i-- > 0;) {
      if (!needed[i]) continue;
      const std::string emit = items[i].first + (i + 1 < n ? " " + rest[i + 1] : "");
      first[i] = rule(items[i].second || i + 1 == n ? emit : emit + " | " + first[i + 1]);
    }
    const bool any_required = std::any_of(items.begin(), items.end(), [](const auto& i) { return i.second; });
    return any_required ? first[0] : "( " + first[0] + " )?";
  }

  // A rule for any text (empty included) that does not contain `word`; word[0] must not occur
  // again in word. State k: the text so far ends with word[0..k).
  std::string excluding(const std::string& name, std::string_view word) {
    if (added_.count(name)) return name;
    added_.insert(name);
    // Character by character (a grammar class holds characters, not the bytes of one).
    std::vector<std::string> chars;
    for (size_t i = 0; i < word.size();) {
      const size_t len = std::min<size_t>(std::max(utf8_sequence_length(static_cast<uint8_t>(word[i])), 1), word.size() - i);
      chars.emplace_back(word.substr(i, len));
      i += len;
    }
    const size_t n = chars.size();
    auto state = [&](size_t k) { return k == 0 ? name : name + "-" + std::to_string(k); };
    auto class_of = [](const std::string& c) { return c.size() == 1 ? class_char(c[0]) : c; };
    const std::string w0 = class_of(chars[0]);
    for (size_t k = 0; k < n; ++k) {
      std::vector<std::string> alts;
      if (k == 0) {
        alts.push_back("[^" + w0 + "] " + state(0));
      } else {
        if (k + 1 < n) alts.push_back(lit(chars[k]) + " " + state(k + 1));
        alts.push_back("[^" + class_of(chars[k]) + w0 + "] " + state(0));
      }
      if (n > 1) alts.push_back(lit(chars[0]) + " " + state(1));
      alts.push_back("\"\"");
      std::string body;
      for (size_t i = 0; i < alts.size(); ++i) body += (i ? " | " : "") + alts[i];
      b_.add_rule(state(k), body);
    }
    return name;
  }

  // The text of a string in a syntax without escapes, ended by `end` (which it must not hold).
  std::string raw_string(const json& s, const std::string& where, std::string_view end, const std::string& text_rule) {
    std::vector<std::string> values;
    bool listed = false;
    auto take = [&](const json& v) {
      if (v.is_string() && !has(v.get_ref<const std::string&>(), end)) values.push_back(lit(v.get<std::string>()));
    };
    if (const json* c = field(s, "const")) {
      listed = true;
      take(*c);
    } else if (const json* e = field(s, "enum")) {
      if (!e->is_array()) schema_error(where + ".enum", "not an array");
      listed = true;
      for (const auto& v : *e) take(v);
    }
    if (listed) {
      if (values.empty()) schema_error(where, "no string value of enum/const can be written in this format");
      return alternatives(values);
    }
    // A pattern or a format: the JSON-schema string walker, writing raw text.
    const json* format = field(s, "format");
    if (field(s, "pattern") || (format && format->is_string() && JsonGrammarBuilder::known_format(format->get<std::string>()))) {
      try {
        return b_.string_text(s, JsonGrammarBuilder::StringText::Raw);
      } catch (const Error& e) {
        schema_error(where, e.what());
      }
    }
    const auto count = [&](const char* key) -> std::optional<int64_t> {
      const json* v = field(s, key);
      if (!v) return std::nullopt;
      if (!v->is_number() || v->get<double>() < 0) schema_error(where + "." + key, "not a non-negative number");
      return static_cast<int64_t>(std::min(v->get<double>(), 1e9));
    };
    const int64_t min = count("minLength").value_or(0);
    std::optional<int64_t> max = count("maxLength");
    if (min > 10000) schema_error(where + ".minLength", "above 10000");
    if (max && *max < min) schema_error(where + ".maxLength", "below minLength");
    if (max && *max > 10000) max.reset();
    if (min == 0 && !max) return text_rule;
    if (max && *max == 0) return "\"\"";
    // Counted strings hold no '<' (so no terminator can start inside them).
    return max ? fmt::format("[^<]{{{},{}}}", min, *max) : fmt::format("[^<]{{{},}}", min);
  }

  // --- qwen-xml

  // How an XML-like format writes one argument: open + key + middle, the value, then close + after.
  struct XmlItem {
    const char* format;  // its name, for errors
    const char* open;
    const char* middle;
    const char* close;  // ends the value (raw text must not hold it)
    const char* before_close;
    const char* after;
    const char* middle_json;  // the middle before a JSON value, where it differs (DSML's string="false"); or null
  };
  static constexpr XmlItem kQwenXmlItem = {"qwen-xml", "<parameter=", ">\n", "</parameter>", "\n", "\n", nullptr};
  static constexpr XmlItem kGlmXmlItem = {"glm-xml", "<arg_key>", "</arg_key>\n<arg_value>", "</arg_value>", "", "\n", nullptr};
  static constexpr XmlItem kDsmlItem = {"deepseek-dsml", "<\xEF\xBD\x9C" "DSML\xEF\xBD\x9C" "parameter name=\"",
                                        "\" string=\"true\">", "</\xEF\xBD\x9C" "DSML\xEF\xBD\x9C" "parameter>", "", "\n",
                                        "\" string=\"false\">"};

  std::string xml_params(const Tool& t, const XmlItem& layout) {
    const auto props = properties(t);
    std::string out;
    for (const bool pass_required : {true, false}) {
      for (const auto& p : props) {
        if (p.required != pass_required) continue;
        const std::string where = ".properties." + p.key;
        if (p.key.empty() || p.key.find_first_of("<>\n\"") != std::string::npos || trim(p.key) != p.key) {
          schema_error(where, std::string("a ") + layout.format +
                                  " parameter name cannot be empty, hold '<', '>', '\"' or a newline, or start or end with spaces");
        }
        std::string value;
        const bool raw = xml_kind(p.schema) == XmlKind::Raw;
        if (raw) {
          value = raw_string(*p.schema, where, layout.close, excluding("xml-text", layout.close));
        } else {
          value = json_value(*p.schema, where);
        }
        const char* middle = raw || !layout.middle_json ? layout.middle : layout.middle_json;
        const std::string item = lit(layout.open + p.key + middle) + " " + value + " " +
                                 lit(std::string(layout.before_close) + layout.close + layout.after);
        out += (out.empty() ? "" : " ") + (p.required ? item : "( " + item + " )?");
      }
    }
    return out;
  }

  // --- lfm2

  std::string lfm2_params(const Tool& t) {
    std::vector<std::pair<std::string, bool>> items;
    for (const auto& p : properties(t)) {
      const std::string where = ".properties." + p.key;
      if (p.key.empty() || !is_ident_start(p.key[0]) || !std::all_of(p.key.begin(), p.key.end(), is_ident_char)) {
        schema_error(where, "an lfm2 argument name must be a Python identifier");
      }
      items.emplace_back(lit(p.key + "=") + " " + json_value(*p.schema, where), p.required);
    }
    return join_optional(items, lit(", "));
  }

  // --- gemma4: the values are the one schema walk's (chat/schema_walk.h) in Gemma's syntax,
  // GemmaValues below; the top-level arguments are named one by one, in dictsort order.

  friend class GemmaValues;
  std::string gemma_params(const Tool& t);

  std::string gemma_key_text(const std::string& key, const std::string& where) {
    const bool bare = !key.empty() && key.find_first_of(":{}[],<\"' \t\r\n") == std::string::npos;
    if (bare) return key;
    if (has(key, kGemmaQuote)) schema_error(where, "this property name cannot be written in gemma4 calls");
    return std::string(kGemmaQuote) + key + std::string(kGemmaQuote);
  }

  // A value in gemma4's syntax, as a single GBNF literal (for enum / const), or nullopt.
  std::optional<std::string> gemma_text(const json& v, int depth) {
    if (depth > kMaxDepth) return std::nullopt;
    if (v.is_string()) {
      if (has(v.get_ref<const std::string&>(), kGemmaQuote)) return std::nullopt;
      return std::string(kGemmaQuote) + v.get<std::string>() + std::string(kGemmaQuote);
    }
    if (v.is_array()) {
      std::string out = "[";
      for (size_t i = 0; i < v.size(); ++i) {
        auto item = gemma_text(v[i], depth + 1);
        if (!item) return std::nullopt;
        out += (i ? "," : "") + *item;
      }
      return out + "]";
    }
    if (v.is_object()) {
      std::string out = "{";
      bool first = true;
      for (const auto& [k, item] : dictsorted(v)) {
        if (k.empty() || k.find_first_of(":{}[],<\"' \t\r\n") != std::string::npos) return std::nullopt;
        auto text = gemma_text(*item, depth + 1);
        if (!text) return std::nullopt;
        out += (first ? "" : ",") + k + ":" + *text;
        first = false;
      }
      return out + "}";
    }
    return v.dump();
  }

  void add_generic_gemma() {
    if (added_.count("gemma-value")) return;
    added_.insert("gemma-value");
    const std::string text = excluding("gemma-text", kGemmaQuote);
    const std::string q = lit(kGemmaQuote);
    b_.add_rule("gemma-value", "gemma-string | gemma-dict | gemma-list | " + b_.shared_rule("json-number") +
                                   " | \"true\" | \"false\" | \"null\"");
    b_.add_rule("gemma-string", q + " " + text + " " + q);
    b_.add_rule("gemma-dict", "\"{\" ( gemma-key \":\" gemma-value ( \",\" gemma-key \":\" gemma-value )* )? \"}\"");
    b_.add_rule("gemma-list", "\"[\" ( gemma-value ( \",\" gemma-value )* )? \"]\"");
    b_.add_rule("gemma-key", "[A-Za-z_] [A-Za-z0-9_]*");
  }

  std::string gemma_generic() {
    add_generic_gemma();
    return "gemma-value";
  }

  ToolFormat format_;
  JsonGrammarBuilder b_;
  const Tool* tool_ = nullptr;
  int counter_ = 0;
  std::set<std::string> added_;
};

// Gemma 4's value syntax for the one schema walk: strings between <|"|> quote tokens (their text
// from the JSON-schema string walker, raw), objects {key:value,...} with the keys in dictsort
// order (as the template writes them), arrays [a,b], numbers, booleans and null as JSON writes
// them. Refuses what the syntax cannot keep to (propertyNames, tuples, ...).
class GemmaValues final : public SchemaWalk {
 public:
  // $refs point into the tool's parameters.
  GemmaValues(CallGrammar& g, const Tool& t) : SchemaWalk(*t.params), g_(g) {}

  // The grammar of the argument `key` (a top-level property) for `s`.
  std::string value(const json& s, const std::string& key) {
    const PathGuard at(*this, "properties/" + key);
    return walk(s, "g");
  }

 private:
  // The place as the tool-call errors write it: .properties.city.anyOf[0] ($ref hops unnamed).
  std::string where() const {
    std::string out;
    for (const auto& part : path()) {
      if (part.empty() || part[0] == '#') continue;
      const size_t slash = part.find('/');
      if (slash == std::string::npos) {
        out += "." + part;
        continue;
      }
      const std::string rest = part.substr(slash + 1);
      const bool index = !rest.empty() && std::all_of(rest.begin(), rest.end(), [](char c) { return c >= '0' && c <= '9'; });
      out += "." + part.substr(0, slash) + (index ? "[" + rest + "]" : "." + rest);
    }
    return out;
  }

  [[noreturn]] void refuse(const std::string& what) const override { g_.schema_error(where(), what); }

  void check_keywords(const json& s) override {
    for (const char* k : {"patternProperties", "propertyNames", "minProperties", "maxProperties",
                          "dependencies", "dependentRequired", "dependentSchemas", "if", "then", "else", "not",
                          "contains", "minContains", "maxContains", "unevaluatedProperties",
                          "unevaluatedItems", "prefixItems", "$dynamicRef", "$recursiveRef"}) {
      if (s.contains(k)) refuse(fmt::format("\"{}\" is not supported for gemma4 tool calls", k));
    }
    if (const json* u = field(s, "uniqueItems"); u && *u != json(false)) {
      refuse("\"uniqueItems\" is not supported for gemma4 tool calls");
    }
  }

  std::string any_value() override { return g_.gemma_generic(); }
  std::string either(const std::vector<std::string>& alts) override { return alternatives(alts); }
  std::string new_ref_rule(const std::string&) override { return g_.fresh("r"); }
  void define_ref_rule(const std::string& rule, std::string body) override { g_.b_.add_rule(rule, body); }

  // enum / const: each value as gemma4 writes it (those it cannot write are left out).
  std::string values(const json& allowed, const std::string&) override {
    std::vector<std::string> alts;
    for (const auto& v : allowed) {
      if (auto text = g_.gemma_text(v, 0)) alts.push_back(lit(*text));
    }
    if (alts.empty()) refuse("no value of enum/const can be written in gemma4 calls");
    return alternatives(alts);
  }

  std::string typed(const std::string& t, const json& s, const std::string&) override {
    if (t == "string") {
      const std::string text = g_.excluding("gemma-text", kGemmaQuote);
      return lit(kGemmaQuote) + " " + g_.raw_string(s, where(), kGemmaQuote, text) + " " + lit(kGemmaQuote);
    }
    if (t == "object") return object(s);
    if (t == "array") return array(s);
    json scalar = json::object();  // integer, number, boolean, null: as JSON writes them
    scalar["type"] = t;
    for (const char* k : {"minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "multipleOf"}) {
      if (const json* v = field(s, k)) scalar[k] = *v;
    }
    return g_.json_value(scalar, where());
  }

  std::set<std::string> required_keys(const json& s, const json* props) {
    std::set<std::string> required;
    const json* r = field(s, "required");
    if (!r) return required;
    if (!r->is_array()) g_.schema_error(where() + ".required", "not an array");
    for (const auto& k : *r) {
      if (!k.is_string() || !props || !props->contains(k.get<std::string>())) {
        g_.schema_error(where() + ".required", fmt::format("{} is not in properties", compact(k)));
      }
      required.insert(k.get<std::string>());
    }
    return required;
  }

  std::string object(const json& s) {
    const Opened opened(*this);
    const json* props = field(s, "properties");
    if (props && !props->is_object()) g_.schema_error(where() + ".properties", "not an object");
    const std::set<std::string> required = required_keys(s, props);
    if (props && !props->empty()) {
      std::vector<std::pair<std::string, bool>> items;
      for (const auto& [key, schema] : dictsorted(*props)) {
        const PathGuard at(*this, "properties/" + key);
        items.emplace_back(lit(g_.gemma_key_text(key, where()) + ":") + " " + walk(*schema, "g"), required.count(key) > 0);
      }
      return lit("{") + " " + g_.join_optional(items, lit(",")) + " " + lit("}");
    }
    const json* extra = field(s, "additionalProperties");
    if (extra && *extra == json(false)) return lit("{}");
    g_.add_generic_gemma();
    if (!extra || *extra == json(true)) return "gemma-dict";
    const PathGuard at(*this, "additionalProperties");
    const std::string member = "gemma-key \":\" " + walk(*extra, "g");
    return "\"{\" ( " + member + " ( \",\" " + member + " )* )? \"}\"";
  }

  std::optional<int64_t> count(const json& s, const char* key) {
    const json* v = field(s, key);
    if (!v) return std::nullopt;
    if (!v->is_number() || v->get<double>() < 0) g_.schema_error(where() + "." + key, "not a non-negative number");
    return static_cast<int64_t>(std::min(v->get<double>(), 1e9));
  }

  std::string array(const json& s) {
    const Opened opened(*this);
    std::string item;
    if (const json* items = field(s, "items")) {
      if (items->is_array()) refuse("a list of item schemas is not supported for gemma4 tool calls");
      const PathGuard at(*this, "items");
      item = walk(*items, "g");
    } else {
      item = g_.gemma_generic();
    }
    const int64_t min = count(s, "minItems").value_or(0);
    std::optional<int64_t> max = count(s, "maxItems");
    if (min > 10000) g_.schema_error(where() + ".minItems", "above 10000");
    if (max && *max < min) g_.schema_error(where() + ".maxItems", "below minItems");
    if (max && *max > 10000) max.reset();
    if (max && *max == 0) return lit("[]");
    const std::string more = "( \",\" " + item + " )";
    const int64_t lo = std::max<int64_t>(min - 1, 0);
    std::string reps = max ? fmt::format("{{{},{}}}", lo, *max - 1) : lo == 0 ? "*" : fmt::format("{{{},}}", lo);
    const std::string list = item + " " + more + reps;
    return lit("[") + " " + (min == 0 ? "( " + list + " )?" : list) + " " + lit("]");
  }

  CallGrammar& g_;
};

std::string CallGrammar::gemma_params(const Tool& t) {
  std::vector<std::pair<std::string, bool>> items;
  const auto props = properties(t);
  if (props.empty()) return join_optional(items, lit(","));
  GemmaValues values(*this, t);  // one per tool: its $refs' rules are shared by its arguments
  json as_object = json::object();
  for (const auto& p : props) as_object[p.key] = *p.schema;
  std::set<std::string> required;
  for (const auto& p : props) {
    if (p.required) required.insert(p.key);
  }
  for (const auto& [key, schema] : dictsorted(as_object)) {
    items.emplace_back(lit(gemma_key_text(key, ".properties." + key) + ":") + " " + values.value(*schema, key),
                       required.count(key) > 0);
  }
  return join_optional(items, lit(","));
}

// ---------------------------------------------------------------------------------------------
// The formats

// Everything one tool-call format is, in one row of format_table(): a new format is its parser,
// its call rule in CallGrammar and a row.
struct FormatSpec {
  ToolFormat format;
  const char* name;                        // tool_format_name
  bool (*detect)(std::string_view source);  // whether a chat template's source writes this format
  std::vector<std::string> markers;        // tool_call_markers
  ParsedToolCalls (*parse)(std::string_view text, const json& tools);
  CallGrammar::CallRule call;              // one call's grammar
  CallList list;                           // how calls follow each other
  bool mistral_ids;                        // call ids of exactly 9 letters/digits (the template checks)
};

// The rows in detection order: tool_format_of takes the first whose detect accepts the source,
// so a format whose markers include another's comes first (qwen-xml and glm-xml before hermes).
const std::vector<FormatSpec>& format_table() {
  static const std::vector<FormatSpec> table = {
      {ToolFormat::Harmony, "harmony", [](std::string_view t) { return has(t, "<|channel|>"); }, {},
       [](std::string_view s, const json&) { return parse_harmony(s); }, &CallGrammar::harmony_call,
       {"", "", "", true}, false},
      {ToolFormat::Lfm2, "lfm2",
       [](std::string_view t) { return has(t, "<|tool_list_start|>") || has(t, "<|tool_call_start|>"); },
       {"<|tool_call_start|>"}, [](std::string_view s, const json&) { return parse_lfm2(s); }, &CallGrammar::lfm2_call,
       {"<|tool_call_start|>[", ", ", "]<|tool_call_end|>", false}, false},
      {ToolFormat::Gemma4, "gemma4", [](std::string_view t) { return has(t, "'<|tool_call>call:'") || has(t, "<|tool_call>"); },
       {"<|tool_call>"}, [](std::string_view s, const json&) { return parse_gemma4(s); }, &CallGrammar::gemma4_call,
       {"", "", "", false}, false},
      {ToolFormat::QwenXml, "qwen-xml",
       [](std::string_view t) { return has(t, "<tool_call>") && has(t, "<function=") && has(t, "<parameter="); },
       {"<tool_call>", "<function="}, parse_qwen_xml, &CallGrammar::qwen_xml_call, {"", "\n", "", false}, false},
      {ToolFormat::GlmXml, "glm-xml", [](std::string_view t) { return has(t, "<tool_call>") && has(t, "<arg_key>"); },
       {"<tool_call>"}, parse_glm_xml, &CallGrammar::glm_xml_call, {"", "\n", "", false}, false},
      {ToolFormat::DeepseekDsml, "deepseek-dsml", [](std::string_view t) { return has(t, kDsml); },
       {dsml("<", "tool_calls>")}, parse_deepseek_dsml, &CallGrammar::deepseek_dsml_call,
       {"<\xEF\xBD\x9C" "DSML\xEF\xBD\x9C" "tool_calls>\n", "", "</\xEF\xBD\x9C" "DSML\xEF\xBD\x9C" "tool_calls>", false}, false},
      {ToolFormat::DeepseekR1, "deepseek-r1",
       [](std::string_view t) { return has(t, deepseek().sep) && has(t, "```json"); },
       {deepseek().calls_begin, deepseek().call_begin}, parse_deepseek_r1, &CallGrammar::deepseek_r1_call,
       {deepseek().calls_begin.c_str(), "\n", deepseek().calls_end.c_str(), false}, false},
      {ToolFormat::DeepseekV31, "deepseek-v3.1", [](std::string_view t) { return has(t, deepseek().sep); },
       {deepseek().calls_begin, deepseek().call_begin}, parse_deepseek_v31, &CallGrammar::deepseek_v31_call,
       {deepseek().calls_begin.c_str(), "", deepseek().calls_end.c_str(), false}, false},
      {ToolFormat::Hermes, "hermes", [](std::string_view t) { return has(t, "<tool_call>"); }, {"<tool_call>"},
       [](std::string_view s, const json&) { return parse_hermes(s); }, &CallGrammar::hermes_call,
       {"", "\n", "", false}, false},
      {ToolFormat::MistralArgs, "mistral-args", [](std::string_view t) { return has(t, "[TOOL_CALLS]") && has(t, "[ARGS]"); },
       {"[TOOL_CALLS]"}, [](std::string_view s, const json&) { return parse_mistral(s); }, &CallGrammar::mistral_args_call,
       {"", "", "", false}, true},
      {ToolFormat::MistralList, "mistral", [](std::string_view t) { return has(t, "[TOOL_CALLS]"); }, {"[TOOL_CALLS]"},
       [](std::string_view s, const json&) { return parse_mistral(s); }, &CallGrammar::mistral_list_call,
       {"[TOOL_CALLS][", ", ", "]", false}, true},
      {ToolFormat::Llama3Json, "llama3-json",
       [](std::string_view t) { return has(t, "Respond in the format {\"name\": function name"); },
       {"{\"name\"", "{\"type\""}, [](std::string_view s, const json&) { return parse_llama3(s); },
       &CallGrammar::llama3_call, {"", "", "", true}, false},
  };
  return table;
}

// The row of `format`; nullptr for None.
const FormatSpec* spec_of(ToolFormat format) {
  for (const FormatSpec& spec : format_table()) {
    if (spec.format == format) return &spec;
  }
  return nullptr;
}

}  // namespace

// ---------------------------------------------------------------------------------------------

ToolFormat tool_format_of(std::string_view t) {
  for (const FormatSpec& spec : format_table()) {
    if (spec.detect(t)) return spec.format;
  }
  return ToolFormat::None;
}

const char* tool_format_name(ToolFormat format) {
  const FormatSpec* spec = spec_of(format);
  return spec ? spec->name : "none";
}

std::vector<std::string> tool_call_markers(ToolFormat format) {
  const FormatSpec* spec = spec_of(format);
  return spec ? spec->markers : std::vector<std::string>{};
}

ParsedToolCalls parse_tool_calls(ToolFormat format, std::string_view text, const nlohmann::ordered_json& tools) {
  const FormatSpec* spec = spec_of(format);
  return spec ? spec->parse(text, tools) : ParsedToolCalls{};
}

ParsedToolCalls parse_harmony_call(std::string_view recipient, std::string_view body) {
  ParsedToolCalls out;
  std::string_view name = trim(recipient);
  if (name.substr(0, 10) == "functions.") name.remove_prefix(10);
  if (name.empty() || std::any_of(name.begin(), name.end(), is_space) || has(name, "<")) return out;
  std::string_view b = trim(body);
  if (b.size() >= 8 && b.substr(b.size() - 8) == "<|call|>") b = trim(b.substr(0, b.size() - 8));
  const auto args = json_whole(b);
  if (!args || !args->is_object()) return out;
  out.ok = true;
  out.calls.push_back({"", std::string(name), compact(*args)});
  return out;
}

std::string tool_call_gbnf(ToolFormat format, const nlohmann::ordered_json& tools, bool parallel,
                           std::string_view only_function) {
  const FormatSpec* spec = spec_of(format);
  if (!spec) fail("tools: this chat template has no known tool-call format");
  const auto usable = usable_tools(tools, only_function);
  return CallGrammar(format).build(usable, spec->call, spec->list, parallel);
}

std::string new_tool_call_id(ToolFormat format, uint64_t random_bits_seed) {
  static constexpr char kAlnum[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789";
  const FormatSpec* spec = spec_of(format);
  const bool mistral = spec && spec->mistral_ids;
  Rng rng(random_bits_seed);
  std::string id = mistral ? "" : "call_";
  for (int i = 0; i < (mistral ? 9 : 24); ++i) id += kAlnum[rng.below(62)];
  return id;
}

}  // namespace bmoe
