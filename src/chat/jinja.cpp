#include "chat/jinja.h"

#include <algorithm>
#include <charconv>
#include <cstring>
#include <optional>
#include <cmath>
#include <ctime>
#include <map>
#include <string_view>
#include <unordered_map>
#include <nlohmann/json.hpp>

#include <fmt/format.h>

namespace bmoe::jinja {

namespace {

// Bounds that keep a hostile template finite: parser nesting, macro recursion, evaluation steps
// (each statement and expression node counts one), output bytes and range() lengths.
constexpr int kMaxNesting = 200;
constexpr int kMaxCallDepth = 64;
constexpr int64_t kMaxSteps = 2'000'000;
constexpr size_t kMaxOutput = 64u << 20;
constexpr int64_t kMaxRange = 1'000'000;

[[noreturn]] void fail(int line, const std::string& what) {
  throw JinjaError(line > 0 ? fmt::format("chat template line {}: {}", line, what) : "chat template: " + what);
}

// A string a template built (joined, repeated, replaced): refused past the output bound, so a
// loop that doubles a string fails quickly instead of exhausting memory.
Value checked_text(std::string s, int line) {
  if (s.size() > kMaxOutput) fail(line, "a string grew larger than 64 MiB");
  return Value(std::move(s));
}

// ---------------------------------------------------------------- UTF-8 helpers

// Splits a string into its code points (Python indexes and measures strings by them).
std::vector<std::string> code_points(const std::string& s) {
  std::vector<std::string> out;
  for (size_t i = 0; i < s.size();) {
    size_t n = 1;
    const auto c = static_cast<unsigned char>(s[i]);
    if (c >= 0xF0) n = 4;
    else if (c >= 0xE0) n = 3;
    else if (c >= 0xC0) n = 2;
    n = std::min(n, s.size() - i);
    out.push_back(s.substr(i, n));
    i += n;
  }
  return out;
}

bool is_space(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v'; }

std::string strip_chars(const std::string& s, const std::string* chars, bool left, bool right) {
  const auto strip = [&](char c) { return chars ? chars->find(c) != std::string::npos : is_space(c); };
  size_t b = 0, e = s.size();
  if (left) while (b < e && strip(s[b])) ++b;
  if (right) while (e > b && strip(s[e - 1])) --e;
  return s.substr(b, e - b);
}

void json_escape(std::string& out, const std::string& s) {
  out += '"';
  for (const char ch : s) {
    const auto c = static_cast<unsigned char>(ch);
    switch (ch) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\r': out += "\\r"; break;
      case '\t': out += "\\t"; break;
      case '\b': out += "\\b"; break;
      case '\f': out += "\\f"; break;
      default:
        if (c < 0x20) out += fmt::format("\\u{:04x}", c);
        else out += ch;
    }
  }
  out += '"';
}

std::string format_double(double d, bool literal_style) {
  if (std::isnan(d)) return "NaN";
  if (std::isinf(d)) return d > 0 ? "Infinity" : "-Infinity";
  char buf[64];
  const auto r = std::to_chars(buf, buf + sizeof buf, d);
  std::string s(buf, r.ptr);
  if (literal_style && s.find_first_of(".e") == std::string::npos) s += ".0";
  return s;
}

}  // namespace

// ---------------------------------------------------------------- Value

namespace {
// Template data nests at most this deep (each level recurses here and when rendered).
constexpr int kMaxDataDepth = 256;

template <typename Json>
Value value_from_json(const Json& j, int depth = 0) {
  if (depth > kMaxDataDepth) throw JinjaError(fmt::format("template data nests deeper than {} levels", kMaxDataDepth));
  switch (j.type()) {
    case Json::value_t::null: return Value::none();
    case Json::value_t::boolean: return Value(j.template get<bool>());
    case Json::value_t::number_integer:
    case Json::value_t::number_unsigned: return Value(j.template get<int64_t>());
    case Json::value_t::number_float: {
      // JSON has one number type: 2.0 is the integer 2, as JavaScript (and the reference
      // renderer) sees it.
      const double d = j.template get<double>();
      if (std::nearbyint(d) == d && std::fabs(d) < 9e15) return Value(static_cast<int64_t>(d));
      return Value(d);
    }
    case Json::value_t::string: return Value(j.template get<std::string>());
    case Json::value_t::array: {
      Array a;
      for (const auto& e : j) a.push_back(value_from_json(e, depth + 1));
      return Value(std::move(a));
    }
    case Json::value_t::object: {
      Object o;
      for (const auto& [k, v] : j.items()) o.emplace_back(k, value_from_json(v, depth + 1));
      return Value(std::move(o));
    }
    default: return Value();
  }
}
}  // namespace

Value Value::from_json(const nlohmann::json& j) { return value_from_json(j); }
Value Value::from_json(const nlohmann::ordered_json& j) { return value_from_json(j); }

Value Value::get(std::string_view key) const {
  if (kind_ != Kind::Object) return Value();
  for (const auto& [k, v] : *object_) {
    if (k == key) return v;
  }
  return Value();
}

void Value::set(const std::string& key, Value v) const {
  for (auto& [k, old] : *object_) {
    if (k == key) {
      old = std::move(v);
      return;
    }
  }
  object_->emplace_back(key, std::move(v));
}

bool Value::truthy() const {
  switch (kind_) {
    case Kind::Undefined:
    case Kind::None: return false;
    case Kind::Bool:
    case Kind::Int: return int_ != 0;
    case Kind::Float: return float_ != 0.0;
    case Kind::String: return !string_->empty();
    case Kind::Array: return !array_->empty();
    case Kind::Object: return !object_->empty();
    case Kind::Function: return true;
  }
  return false;
}

std::string Value::to_string() const {
  switch (kind_) {
    case Kind::Undefined:
    case Kind::None: return "";
    case Kind::Bool: return int_ ? "true" : "false";
    case Kind::Int: return std::to_string(int_);
    case Kind::Float: return format_double(float_, true);
    case Kind::String: return *string_;
    case Kind::Array:
    case Kind::Object: return to_json();
    case Kind::Function: return "<function>";
  }
  return "";
}

namespace {
void append_json(std::string& out, const Value& v, int indent, int depth) {
  if (depth > kMaxNesting) fail(0, "tojson: value nested too deeply");
  const auto newline = [&](int d) {
    out += '\n';
    out.append(static_cast<size_t>(indent * d), ' ');
  };
  const char* item_sep = indent >= 0 ? "," : ", ";
  switch (v.kind()) {
    case Value::Kind::Undefined:
    case Value::Kind::None: out += "null"; return;
    case Value::Kind::Bool: out += v.as_bool() ? "true" : "false"; return;
    case Value::Kind::Int: out += std::to_string(v.as_int()); return;
    case Value::Kind::Float: out += format_double(v.as_double(), false); return;
    case Value::Kind::String: json_escape(out, v.as_string()); return;
    case Value::Kind::Array: {
      out += '[';
      const Array& a = v.as_array();
      for (size_t i = 0; i < a.size(); ++i) {
        if (i) out += item_sep;
        if (indent >= 0) newline(depth + 1);
        append_json(out, a[i], indent, depth + 1);
      }
      if (indent >= 0 && !a.empty()) newline(depth);
      out += ']';
      return;
    }
    case Value::Kind::Object: {
      out += '{';
      const Object& o = v.as_object();
      for (size_t i = 0; i < o.size(); ++i) {
        if (i) out += item_sep;
        if (indent >= 0) newline(depth + 1);
        json_escape(out, o[i].first);
        out += ": ";
        append_json(out, o[i].second, indent, depth + 1);
      }
      if (indent >= 0 && !o.empty()) newline(depth);
      out += '}';
      return;
    }
    case Value::Kind::Function: fail(0, "tojson: cannot convert a function to JSON");
  }
}
}  // namespace

std::string Value::to_json(int indent) const {
  std::string out;
  append_json(out, *this, indent, 0);
  return out;
}

bool Value::equals(const Value& o) const {
  if (is_number() && o.is_number()) {
    if (is_int() && o.is_int()) return int_ == o.int_;
    return as_double() == o.as_double();
  }
  if (kind_ != o.kind_) {
    // Booleans compare with numbers as Python's do (True == 1).
    if ((is_bool() && o.is_number()) || (is_number() && o.is_bool())) return as_double() == o.as_double();
    return false;
  }
  switch (kind_) {
    case Kind::Undefined:
    case Kind::None: return true;
    case Kind::Bool: return int_ == o.int_;
    case Kind::String: return *string_ == *o.string_;
    case Kind::Array: {
      if (array_->size() != o.array_->size()) return false;
      for (size_t i = 0; i < array_->size(); ++i) {
        if (!(*array_)[i].equals((*o.array_)[i])) return false;
      }
      return true;
    }
    case Kind::Object: {
      if (object_->size() != o.object_->size()) return false;
      for (const auto& [k, v] : *object_) {
        if (!v.equals(o.get(k))) return false;
      }
      return true;
    }
    case Kind::Function: return function_ == o.function_;
    default: return false;
  }
}

const char* Value::kind_name() const {
  switch (kind_) {
    case Kind::Undefined: return "undefined";
    case Kind::None: return "none";
    case Kind::Bool: return "boolean";
    case Kind::Int: return "integer";
    case Kind::Float: return "float";
    case Kind::String: return "string";
    case Kind::Array: return "list";
    case Kind::Object: return "mapping";
    case Kind::Function: return "function";
  }
  return "?";
}

Value Arguments::at(size_t index, std::string_view name, Value fallback) const {
  if (index < positional.size()) return positional[index];
  return named(name, std::move(fallback));
}

Value Arguments::named(std::string_view name, Value fallback) const {
  for (const auto& [k, v] : keyword) {
    if (k == name) return v;
  }
  return fallback;
}

// ---------------------------------------------------------------- lexer

namespace {

enum class Tok { Text, ExprOpen, ExprClose, StmtOpen, StmtClose, Name, Int, Float, String, Op, End };

struct Token {
  Tok type;
  std::string text;
  int line;
};

// trim_blocks and lstrip_blocks as the reference renderer applies them: a block or comment
// tag's line indentation goes, and so does the newline right after one.
std::string preprocess(std::string_view source) {
  std::string s(source);
  if (!s.empty() && s.back() == '\n') s.pop_back();
  std::string out;
  out.reserve(s.size());
  size_t line_start = 0;
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] == '{' && i + 1 < s.size() && (s[i + 1] == '%' || s[i + 1] == '#' || s[i + 1] == '-')) {
      // Drop the spaces and tabs between the line start and this tag.
      size_t j = out.size();
      while (j > line_start && (out[j - 1] == ' ' || out[j - 1] == '\t')) --j;
      if (j == line_start) out.resize(j);
    }
    out += s[i];
    if (s[i] == '\n') line_start = out.size();
    if (s[i] == '}' && i > 0 && (s[i - 1] == '%' || s[i - 1] == '#' || s[i - 1] == '-') && i + 1 < s.size() &&
        s[i + 1] == '\n') {
      ++i;  // the newline after a block tag
      line_start = out.size();
    }
  }
  return out;
}

class Lexer {
 public:
  explicit Lexer(std::string_view source) : src_(preprocess(source)) {}

  std::vector<Token> run() {
    while (pos_ < src_.size()) {
      const size_t open = find_tag(pos_);
      std::string text = src_.substr(pos_, open - pos_);
      count_lines(pos_, open);
      pos_ = open;
      if (pos_ < src_.size() && src_[pos_ + 2] == '-') text = strip_chars(text, nullptr, false, true);
      if (strip_next_) text = strip_chars(text, nullptr, true, false);
      strip_next_ = false;
      if (!text.empty()) tokens_.push_back({Tok::Text, std::move(text), text_line_});
      if (pos_ >= src_.size()) break;
      lex_tag();
    }
    tokens_.push_back({Tok::End, "", line_});
    return std::move(tokens_);
  }

 private:
  size_t find_tag(size_t from) const {
    for (size_t i = from; i + 1 < src_.size(); ++i) {
      if (src_[i] == '{' && (src_[i + 1] == '{' || src_[i + 1] == '%' || src_[i + 1] == '#')) return i;
    }
    return src_.size();
  }

  void count_lines(size_t from, size_t to) {
    text_line_ = line_;
    line_ += static_cast<int>(std::count(src_.begin() + static_cast<std::ptrdiff_t>(from),
                                         src_.begin() + static_cast<std::ptrdiff_t>(to), '\n'));
  }

  void lex_tag() {
    const char kind = src_[pos_ + 1];
    pos_ += 2;
    if (pos_ < src_.size() && (src_[pos_] == '-' || src_[pos_] == '+')) ++pos_;
    if (kind == '#') return skip_comment();
    tokens_.push_back({kind == '{' ? Tok::ExprOpen : Tok::StmtOpen, "", line_});
    const std::string close = kind == '{' ? "}}" : "%}";
    lex_inside(close);
    if (kind == '%' && is_raw_open()) lex_raw();
  }

  void skip_comment() {
    const size_t end = src_.find("#}", pos_);
    if (end == std::string::npos) fail(line_, "unclosed comment");
    strip_next_ = end > pos_ && src_[end - 1] == '-';
    count_lines(pos_, end);
    pos_ = end + 2;
  }

  // Tokens up to the closing delimiter (a "-" before it strips the following text).
  void lex_inside(const std::string& close) {
    for (;;) {
      while (pos_ < src_.size() && is_space(src_[pos_])) {
        if (src_[pos_] == '\n') ++line_;
        ++pos_;
      }
      if (pos_ >= src_.size()) fail(line_, "unclosed tag");
      if (src_.compare(pos_, 3, "-" + close) == 0 || src_.compare(pos_, 3, "+" + close) == 0) {
        strip_next_ = src_[pos_] == '-';
        pos_ += 3;
        break;
      }
      if (src_.compare(pos_, 2, close) == 0) {
        pos_ += 2;
        break;
      }
      lex_one();
    }
    tokens_.push_back({close == "}}" ? Tok::ExprClose : Tok::StmtClose, "", line_});
  }

  void lex_one() {
    const char c = src_[pos_];
    if (std::isalpha(static_cast<unsigned char>(c)) || c == '_') {
      const size_t start = pos_;
      while (pos_ < src_.size() && (std::isalnum(static_cast<unsigned char>(src_[pos_])) || src_[pos_] == '_')) ++pos_;
      tokens_.push_back({Tok::Name, src_.substr(start, pos_ - start), line_});
    } else if (std::isdigit(static_cast<unsigned char>(c))) {
      lex_number();
    } else if (c == '\'' || c == '"') {
      lex_string(c);
    } else {
      static const char* const kOps[] = {"//", "**", "==", "!=", "<=", ">=", "+", "-", "*", "/", "%", "~", "<",
                                         ">", "(", ")", "[", "]", "{", "}", ",", ".", ":", "|", "="};
      for (const char* op : kOps) {
        if (src_.compare(pos_, std::strlen(op), op) == 0) {
          tokens_.push_back({Tok::Op, op, line_});
          pos_ += std::strlen(op);
          return;
        }
      }
      fail(line_, fmt::format("unexpected character '{}'", c));
    }
  }

  void lex_number() {
    const size_t start = pos_;
    while (pos_ < src_.size() && (std::isdigit(static_cast<unsigned char>(src_[pos_])) || src_[pos_] == '_')) ++pos_;
    bool is_float = false;
    if (pos_ + 1 < src_.size() && src_[pos_] == '.' && std::isdigit(static_cast<unsigned char>(src_[pos_ + 1]))) {
      is_float = true;
      ++pos_;
      while (pos_ < src_.size() && std::isdigit(static_cast<unsigned char>(src_[pos_]))) ++pos_;
    }
    std::string text = src_.substr(start, pos_ - start);
    std::erase(text, '_');
    tokens_.push_back({is_float ? Tok::Float : Tok::Int, text, line_});
  }

  void lex_string(char quote) {
    std::string s;
    ++pos_;
    for (;;) {
      if (pos_ >= src_.size()) fail(line_, "unclosed string");
      const char c = src_[pos_++];
      if (c == quote) break;
      if (c == '\n') ++line_;
      if (c != '\\') {
        s += c;
        continue;
      }
      if (pos_ >= src_.size()) fail(line_, "unclosed string");
      const char e = src_[pos_++];
      switch (e) {
        case 'n': s += '\n'; break;
        case 't': s += '\t'; break;
        case 'r': s += '\r'; break;
        case 'b': s += '\b'; break;
        case 'f': s += '\f'; break;
        case '\\': s += '\\'; break;
        case '\'': s += '\''; break;
        case '"': s += '"'; break;
        default: s += '\\'; s += e;
      }
    }
    tokens_.push_back({Tok::String, std::move(s), line_});
  }

  // After "{% raw %}" everything up to "{% endraw %}" is text.
  bool is_raw_open() const {
    const size_t n = tokens_.size();
    return n >= 3 && tokens_[n - 2].type == Tok::Name && tokens_[n - 2].text == "raw" &&
           tokens_[n - 3].type == Tok::StmtOpen;
  }

  void lex_raw() {
    tokens_.resize(tokens_.size() - 3);
    size_t search = pos_;
    for (;;) {
      const size_t open = src_.find("{%", search);
      if (open == std::string::npos) fail(line_, "unclosed raw block");
      size_t i = open + 2;
      if (i < src_.size() && (src_[i] == '-' || src_[i] == '+')) ++i;
      while (i < src_.size() && is_space(src_[i])) ++i;
      if (src_.compare(i, 6, "endraw") != 0) {
        search = open + 2;
        continue;
      }
      std::string text = src_.substr(pos_, open - pos_);
      if (src_[open + 2] == '-') text = strip_chars(text, nullptr, false, true);
      if (strip_next_) text = strip_chars(text, nullptr, true, false);
      count_lines(pos_, open);
      if (!text.empty()) tokens_.push_back({Tok::Text, std::move(text), text_line_});
      const size_t end = src_.find("%}", i);
      if (end == std::string::npos) fail(line_, "unclosed tag");
      strip_next_ = src_[end - 1] == '-';
      pos_ = end + 2;
      return;
    }
  }

  std::string src_;
  size_t pos_ = 0;
  int line_ = 1;
  int text_line_ = 1;
  bool strip_next_ = false;
  std::vector<Token> tokens_;
};

}  // namespace

// ---------------------------------------------------------------- syntax tree

enum class NodeKind {
  // expressions
  Literal, Name, List, Dict, Tuple, Attr, Index, Slice, Call, Filter, Test, Not, Neg, Binary, And, Or, Ternary,
  // statements
  Body, Text, Output, If, For, Set, SetBlock, Macro, Break, Continue
};

struct Node {
  NodeKind kind;
  int line = 0;
  std::string str;                          // name, operator, text
  Value literal;                            // Literal
  std::vector<std::unique_ptr<Node>> kids;  // operands, bodies (nullptr where optional and absent)
  std::vector<std::string> names;           // argument keywords ("" positional), loop targets, macro params
  bool flag = false;                        // Test: negated; If: has else; For: has else
};

using NodePtr = std::unique_ptr<Node>;

namespace {

NodePtr make(NodeKind kind, int line, std::string str = {}) {
  auto n = std::make_unique<Node>();
  n->kind = kind;
  n->line = line;
  n->str = std::move(str);
  return n;
}

class Parser {
 public:
  explicit Parser(std::vector<Token> tokens) : t_(std::move(tokens)) {}

  NodePtr parse_template() {
    auto body = parse_body({});
    if (peek().type != Tok::End) fail(peek().line, fmt::format("unexpected '{{% {} %}}'", stmt_keyword()));
    return body;
  }

 private:
  // ---- statements

  // Statements up to (not including) a "{% word" with word in `until`, or the end.
  NodePtr parse_body(std::initializer_list<std::string_view> until) {
    Nest nest(*this);
    auto body = make(NodeKind::Body, peek().line);
    for (;;) {
      const Token& t = peek();
      if (t.type == Tok::End) return body;
      if (t.type == Tok::Text) {
        body->kids.push_back(make(NodeKind::Text, t.line, t.text));
        ++i_;
      } else if (t.type == Tok::ExprOpen) {
        ++i_;
        auto out = make(NodeKind::Output, t.line);
        out->kids.push_back(parse_expression());
        expect(Tok::ExprClose, "}}");
        body->kids.push_back(std::move(out));
      } else if (t.type == Tok::StmtOpen) {
        const std::string word = stmt_keyword();
        if (std::find(until.begin(), until.end(), word) != until.end()) return body;
        auto stmt = parse_statement();
        if (stmt) body->kids.push_back(std::move(stmt));
      } else {
        fail(t.line, "unexpected token");
      }
    }
  }

  std::string stmt_keyword() const {
    return i_ + 1 < t_.size() && t_[i_ + 1].type == Tok::Name ? t_[i_ + 1].text : "";
  }

  NodePtr parse_statement() {
    const int line = peek().line;
    ++i_;  // {%
    const std::string word = take_name();
    if (word == "if") return parse_if(line);
    if (word == "for") return parse_for(line);
    if (word == "set") return parse_set(line);
    if (word == "macro") return parse_macro(line);
    if (word == "break" || word == "continue") {
      expect(Tok::StmtClose, "%}");
      return make(word == "break" ? NodeKind::Break : NodeKind::Continue, line);
    }
    if (word == "generation" || word == "endgeneration") {  // training markers: render nothing
      expect(Tok::StmtClose, "%}");
      return nullptr;
    }
    fail(line, fmt::format("unknown or misplaced statement '{}'", word));
  }

  NodePtr parse_if(int line) {
    auto node = make(NodeKind::If, line);
    node->kids.push_back(parse_expression());
    expect(Tok::StmtClose, "%}");
    node->kids.push_back(parse_body({"elif", "else", "endif"}));
    for (;;) {
      const std::string word = end_keyword("if");
      if (word == "elif") {
        node->kids.push_back(parse_expression());
        expect(Tok::StmtClose, "%}");
        node->kids.push_back(parse_body({"elif", "else", "endif"}));
      } else if (word == "else") {
        expect(Tok::StmtClose, "%}");
        node->flag = true;
        node->kids.push_back(parse_body({"endif"}));
        close_block("endif");
        return node;
      } else {
        expect(Tok::StmtClose, "%}");
        return node;
      }
    }
  }

  NodePtr parse_for(int line) {
    auto node = make(NodeKind::For, line);
    node->names.push_back(take_name());
    while (accept_op(",")) node->names.push_back(take_name());
    if (take_name() != "in") fail(line, "expected 'in' in a for loop");
    node->kids.push_back(parse_ternary(false));
    node->kids.push_back(accept_name("if") ? parse_expression() : nullptr);
    accept_name("recursive");
    expect(Tok::StmtClose, "%}");
    node->kids.push_back(parse_body({"else", "endfor"}));
    if (end_keyword("for") == "else") {
      expect(Tok::StmtClose, "%}");
      node->flag = true;
      node->kids.push_back(parse_body({"endfor"}));
      close_block("endfor");
    } else {
      expect(Tok::StmtClose, "%}");
    }
    return node;
  }

  NodePtr parse_set(int line) {
    auto target = parse_primary_postfix();
    if (peek().type == Tok::Op && peek().text == ",") {
      auto tuple = make(NodeKind::Tuple, line);
      tuple->kids.push_back(std::move(target));
      while (accept_op(",")) tuple->kids.push_back(parse_primary_postfix());
      target = std::move(tuple);
    }
    if (accept_op("=")) {
      auto node = make(NodeKind::Set, line);
      node->kids.push_back(std::move(target));
      node->kids.push_back(parse_expression());
      expect(Tok::StmtClose, "%}");
      return node;
    }
    if (target->kind != NodeKind::Name) fail(line, "a set block needs a plain name");
    expect(Tok::StmtClose, "%}");
    auto node = make(NodeKind::SetBlock, line, target->str);
    node->kids.push_back(parse_body({"endset"}));
    close_block("endset");
    return node;
  }

  NodePtr parse_macro(int line) {
    auto node = make(NodeKind::Macro, line, take_name());
    expect_op("(");
    if (!accept_op(")")) {
      do {
        node->names.push_back(take_name());
        node->kids.push_back(accept_op("=") ? parse_expression() : nullptr);
      } while (accept_op(","));
      expect_op(")");
    }
    expect(Tok::StmtClose, "%}");
    node->kids.push_back(parse_body({"endmacro"}));
    close_block("endmacro");
    return node;
  }

  // At "{% word": consumes it and returns word, which must continue or end a `block`.
  std::string end_keyword(const std::string& block) {
    if (peek().type != Tok::StmtOpen) fail(peek().line, fmt::format("'{}' is never closed (end{})", block, block));
    ++i_;
    return take_name();
  }

  void close_block(const std::string& word) {
    if (peek().type != Tok::StmtOpen || stmt_keyword() != word) fail(peek().line, fmt::format("expected {}", word));
    i_ += 2;
    expect(Tok::StmtClose, "%}");
  }

  // ---- expressions (Jinja's precedence: ternary, or, and, not, comparison, + -, ~, * / // %,
  // **, unary minus, then primaries with their postfixes, filters and tests)

  NodePtr parse_expression() { return parse_ternary(true); }

  NodePtr parse_ternary(bool allow_if) {
    Nest nest(*this);
    auto value = parse_or();
    if (!allow_if || !accept_name("if")) return value;
    auto node = make(NodeKind::Ternary, value->line);
    node->kids.push_back(parse_or());
    node->kids.push_back(std::move(value));
    node->kids.push_back(accept_name("else") ? parse_ternary(true) : nullptr);
    return node;
  }

  NodePtr parse_or() {
    auto left = parse_and();
    while (accept_name("or")) left = binary(NodeKind::Or, "or", std::move(left), parse_and());
    return left;
  }

  NodePtr parse_and() {
    auto left = parse_not();
    while (accept_name("and")) left = binary(NodeKind::And, "and", std::move(left), parse_not());
    return left;
  }

  NodePtr parse_not() {
    Nest nest(*this);
    if (peek().type == Tok::Name && peek().text == "not") {
      const int line = peek().line;
      ++i_;
      auto node = make(NodeKind::Not, line);
      node->kids.push_back(parse_not());
      return node;
    }
    return parse_compare();
  }

  NodePtr parse_compare() {
    auto left = parse_additive();
    for (;;) {
      const Token& t = peek();
      std::string op;
      if (t.type == Tok::Op && (t.text == "==" || t.text == "!=" || t.text == "<" || t.text == ">" ||
                                t.text == "<=" || t.text == ">=")) {
        op = t.text;
        ++i_;
      } else if (t.type == Tok::Name && t.text == "in") {
        op = "in";
        ++i_;
      } else if (t.type == Tok::Name && t.text == "not" && i_ + 1 < t_.size() && t_[i_ + 1].type == Tok::Name &&
                 t_[i_ + 1].text == "in") {
        op = "not in";
        i_ += 2;
      } else {
        return left;
      }
      left = binary(NodeKind::Binary, op, std::move(left), parse_additive());
    }
  }

  // One left-associative level of binary operators: operands from `next`, joined by any of `ops`.
  NodePtr parse_operators(std::initializer_list<std::string_view> ops, NodePtr (Parser::*next)()) {
    auto left = (this->*next)();
    for (;;) {
      const Token& t = peek();
      if (t.type != Tok::Op || std::find(ops.begin(), ops.end(), t.text) == ops.end()) return left;
      const std::string op = t_[i_++].text;
      left = binary(NodeKind::Binary, op, std::move(left), (this->*next)());
    }
  }

  NodePtr parse_additive() { return parse_operators({"+", "-"}, &Parser::parse_concat); }
  NodePtr parse_concat() { return parse_operators({"~"}, &Parser::parse_multiplicative); }
  NodePtr parse_multiplicative() { return parse_operators({"*", "/", "//", "%"}, &Parser::parse_power); }
  NodePtr parse_power() { return parse_operators({"**"}, &Parser::parse_unary); }

  NodePtr parse_unary() {
    Nest nest(*this);
    if (peek().type == Tok::Op && (peek().text == "-" || peek().text == "+")) {
      const bool negate = t_[i_].text == "-";
      const int line = t_[i_++].line;
      auto operand = parse_unary();
      if (!negate) return operand;
      auto node = make(NodeKind::Neg, line);
      node->kids.push_back(std::move(operand));
      return node;
    }
    return parse_filters(parse_primary_postfix());
  }

  NodePtr parse_filters(NodePtr node) {
    for (;;) {
      if (accept_op("|")) {
        auto filter = make(NodeKind::Filter, node->line, take_name());
        filter->kids.push_back(std::move(node));
        if (accept_op("(")) parse_arguments(*filter);
        node = std::move(filter);
      } else if (accept_name("is")) {
        auto test = make(NodeKind::Test, node->line);
        test->flag = accept_name("not");
        test->str = take_name();
        test->kids.push_back(std::move(node));
        if (accept_op("(")) {
          parse_arguments(*test);
        } else if (starts_test_argument()) {
          test->kids.push_back(parse_primary_postfix());
          test->names.emplace_back();
        }
        node = std::move(test);
      } else {
        return node;
      }
    }
  }

  // "x is divisibleby 3", "x is equalto y": a test's single argument without parentheses.
  bool starts_test_argument() const {
    const Token& t = peek();
    if (t.type == Tok::Int || t.type == Tok::Float || t.type == Tok::String) return true;
    if (t.type != Tok::Name) return false;
    static const char* const kNotStart[] = {"and", "or", "if", "else", "not", "in", "is"};
    return std::none_of(std::begin(kNotStart), std::end(kNotStart), [&](const char* w) { return t.text == w; });
  }

  NodePtr parse_primary_postfix() {
    auto node = parse_primary();
    for (;;) {
      if (accept_op(".")) {
        auto attr = make(NodeKind::Attr, node->line, take_name());
        attr->kids.push_back(std::move(node));
        node = std::move(attr);
      } else if (accept_op("[")) {
        node = parse_subscript(std::move(node));
      } else if (accept_op("(")) {
        auto call = make(NodeKind::Call, node->line);
        call->kids.push_back(std::move(node));
        parse_arguments(*call);
        node = std::move(call);
      } else {
        return node;
      }
    }
  }

  NodePtr parse_subscript(NodePtr target) {
    const int line = target->line;
    NodePtr parts[3];
    int colons = 0;
    for (;;) {
      if (accept_op("]")) break;
      if (accept_op(":")) {
        if (++colons > 2) fail(line, "bad slice");
        continue;
      }
      if (parts[colons]) fail(line, "expected ']'");
      parts[colons] = parse_expression();
    }
    if (colons == 0) {
      if (!parts[0]) fail(line, "empty subscript");
      auto node = make(NodeKind::Index, line);
      node->kids.push_back(std::move(target));
      node->kids.push_back(std::move(parts[0]));
      return node;
    }
    auto node = make(NodeKind::Slice, line);
    node->kids.push_back(std::move(target));
    for (auto& p : parts) node->kids.push_back(std::move(p));
    return node;
  }

  // After "(": positional then keyword arguments, up to ")".
  void parse_arguments(Node& node) {
    if (accept_op(")")) return;
    do {
      if (peek().type == Tok::Name && i_ + 1 < t_.size() && t_[i_ + 1].type == Tok::Op && t_[i_ + 1].text == "=") {
        node.names.push_back(t_[i_].text);
        i_ += 2;
      } else {
        node.names.emplace_back();
      }
      node.kids.push_back(parse_expression());
    } while (accept_op(","));
    expect_op(")");
  }

  NodePtr parse_primary() {
    Nest nest(*this);
    const Token& t = peek();
    const int line = t.line;
    switch (t.type) {
      case Tok::String: {
        std::string s;
        while (peek().type == Tok::String) s += t_[i_++].text;  // adjacent literals join
        return literal(line, Value(std::move(s)));
      }
      case Tok::Int: {
        ++i_;
        int64_t v = 0;
        const auto r = std::from_chars(t.text.data(), t.text.data() + t.text.size(), v);
        if (r.ec != std::errc()) fail(line, "integer literal out of range");
        return literal(line, Value(v));
      }
      case Tok::Float: ++i_; return literal(line, Value(std::strtod(t.text.c_str(), nullptr)));
      case Tok::Name: return parse_name();
      case Tok::Op:
        if (accept_op("(")) return parse_parenthesized(line);
        if (accept_op("[")) return parse_list(line);
        if (accept_op("{")) return parse_dict(line);
        [[fallthrough]];
      default: fail(line, t.type == Tok::End ? "unexpected end of template" : "expected an expression");
    }
  }

  NodePtr parse_name() {
    const Token& t = t_[i_++];
    if (t.text == "true" || t.text == "True") return literal(t.line, Value(true));
    if (t.text == "false" || t.text == "False") return literal(t.line, Value(false));
    if (t.text == "none" || t.text == "None") return literal(t.line, Value::none());
    return make(NodeKind::Name, t.line, t.text);
  }

  NodePtr parse_parenthesized(int line) {
    auto first = parse_expression();
    if (accept_op(")")) return first;
    auto tuple = make(NodeKind::Tuple, line);
    tuple->kids.push_back(std::move(first));
    while (accept_op(",")) {
      if (peek().type == Tok::Op && peek().text == ")") break;
      tuple->kids.push_back(parse_expression());
    }
    expect_op(")");
    return tuple;
  }

  NodePtr parse_list(int line) {
    auto list = make(NodeKind::List, line);
    while (!accept_op("]")) {
      list->kids.push_back(parse_expression());
      if (!accept_op(",")) {
        expect_op("]");
        break;
      }
    }
    return list;
  }

  NodePtr parse_dict(int line) {
    auto dict = make(NodeKind::Dict, line);
    while (!accept_op("}")) {
      dict->kids.push_back(parse_expression());
      expect_op(":");
      dict->kids.push_back(parse_expression());
      if (!accept_op(",")) {
        expect_op("}");
        break;
      }
    }
    return dict;
  }

  // ---- helpers

  static NodePtr literal(int line, Value v) {
    auto n = make(NodeKind::Literal, line);
    n->literal = std::move(v);
    return n;
  }

  static NodePtr binary(NodeKind kind, std::string op, NodePtr l, NodePtr r) {
    auto n = make(kind, l->line, std::move(op));
    n->kids.push_back(std::move(l));
    n->kids.push_back(std::move(r));
    return n;
  }

  const Token& peek() const { return t_[i_]; }

  bool accept_op(std::string_view op) {
    if (peek().type == Tok::Op && peek().text == op) {
      ++i_;
      return true;
    }
    return false;
  }

  bool accept_name(std::string_view name) {
    if (peek().type == Tok::Name && peek().text == name) {
      ++i_;
      return true;
    }
    return false;
  }

  void expect_op(std::string_view op) {
    if (!accept_op(op)) fail(peek().line, fmt::format("expected '{}'", op));
  }

  void expect(Tok type, std::string_view what) {
    if (peek().type != type) fail(peek().line, fmt::format("expected '{}'", what));
    ++i_;
  }

  std::string take_name() {
    if (peek().type != Tok::Name) fail(peek().line, "expected a name");
    return t_[i_++].text;
  }

  // Counts recursion so that "((((...": a template nested past kMaxNesting is refused, not a
  // stack overflow.
  struct Nest {
    explicit Nest(Parser& p) : p_(p) {
      if (++p_.depth_ > kMaxNesting * 8) fail(p_.peek().line, "template nested too deeply");
    }
    ~Nest() { --p_.depth_; }
    Parser& p_;
  };

  std::vector<Token> t_;
  size_t i_ = 0;
  int depth_ = 0;
};

}  // namespace

// ---------------------------------------------------------------- rendering

namespace {

using Scope = std::map<std::string, Value, std::less<>>;

enum class Flow { Normal, Break, Continue };

class Renderer {
 public:
  explicit Renderer(const Value& context) {
    auto globals = std::make_shared<Scope>();
    install_globals(*globals);
    if (context.is_object()) {
      for (const auto& [k, v] : context.as_object()) (*globals)[k] = v;
    }
    scopes_.push_back(std::move(globals));
    scopes_.push_back(std::make_shared<Scope>());  // the template's own top level
  }

  std::string run(const Node& root) {
    exec(root);
    return std::move(out_);
  }

 private:
  // ---- statements

  Flow exec(const Node& n) {
    step(n);
    switch (n.kind) {
      case NodeKind::Body:
        for (const auto& k : n.kids) {
          const Flow f = exec(*k);
          if (f != Flow::Normal) return f;
        }
        return Flow::Normal;
      case NodeKind::Text: emit(n.str); return Flow::Normal;
      case NodeKind::Output: emit(eval(*n.kids[0]).to_string()); return Flow::Normal;
      case NodeKind::If: return exec_if(n);
      case NodeKind::For: return exec_for(n);
      case NodeKind::Set: assign(*n.kids[0], eval(*n.kids[1]), n.line); return Flow::Normal;
      case NodeKind::SetBlock: (*scopes_.back())[n.str] = Value(capture(*n.kids[0])); return Flow::Normal;
      case NodeKind::Macro: (*scopes_.back())[n.str] = make_macro(n); return Flow::Normal;
      case NodeKind::Break: return Flow::Break;
      case NodeKind::Continue: return Flow::Continue;
      default: fail(n.line, "expression used as a statement");
    }
  }

  Flow exec_if(const Node& n) {
    const size_t conditions = (n.kids.size() - (n.flag ? 1 : 0)) / 2;
    for (size_t i = 0; i < conditions; ++i) {
      if (eval(*n.kids[2 * i]).truthy()) return exec(*n.kids[2 * i + 1]);
    }
    return n.flag ? exec(*n.kids.back()) : Flow::Normal;
  }

  Flow exec_for(const Node& n) {
    std::vector<Value> items = iterate(eval(*n.kids[0]), n.line);
    if (n.kids[1]) {  // "for x in xs if cond": filtered before loop.* counts
      std::vector<Value> kept;
      for (auto& item : items) {
        ScopeGuard guard(*this);
        bind_targets(n, item);
        if (eval(*n.kids[1]).truthy()) kept.push_back(std::move(item));
      }
      items = std::move(kept);
    }
    if (items.empty()) {
      if (n.flag) return exec(*n.kids[3]);
      return Flow::Normal;
    }
    for (size_t i = 0; i < items.size(); ++i) {
      ScopeGuard guard(*this);
      bind_targets(n, items[i]);
      (*scopes_.back())["loop"] = loop_object(items, i);
      if (exec(*n.kids[2]) == Flow::Break) break;
    }
    return Flow::Normal;
  }

  void bind_targets(const Node& n, const Value& item) {
    Scope& scope = *scopes_.back();
    if (n.names.size() == 1) {
      scope[n.names[0]] = item;
      return;
    }
    if (!item.is_array() || item.as_array().size() != n.names.size()) {
      fail(n.line, fmt::format("cannot unpack a {} into {} names", item.kind_name(), n.names.size()));
    }
    for (size_t i = 0; i < n.names.size(); ++i) scope[n.names[i]] = item.as_array()[i];
  }

  static Value loop_object(const std::vector<Value>& items, size_t i) {
    const auto n = static_cast<int64_t>(items.size());
    const auto k = static_cast<int64_t>(i);
    Object loop = {{"index", Value(k + 1)},        {"index0", Value(k)},
                   {"revindex", Value(n - k)},     {"revindex0", Value(n - k - 1)},
                   {"first", Value(k == 0)},       {"last", Value(k == n - 1)},
                   {"length", Value(n)},
                   {"previtem", k > 0 ? items[i - 1] : Value()},
                   {"nextitem", k + 1 < n ? items[i + 1] : Value()}};
    loop.emplace_back("cycle", Value(Function([k](Arguments& a) {
      if (a.positional.empty()) return Value();
      return a.positional[static_cast<size_t>(k) % a.positional.size()];
    })));
    return Value(std::move(loop));
  }

  void assign(const Node& target, const Value& v, int line) {
    if (target.kind == NodeKind::Name) {
      (*scopes_.back())[target.str] = v;
    } else if (target.kind == NodeKind::Attr) {
      const Value obj = eval(*target.kids[0]);
      if (!obj.is_object()) fail(line, "can only set attributes of a namespace or mapping");
      obj.set(target.str, v);
    } else if (target.kind == NodeKind::Tuple) {
      if (!v.is_array() || v.as_array().size() != target.kids.size()) fail(line, "cannot unpack for set");
      for (size_t i = 0; i < target.kids.size(); ++i) assign(*target.kids[i], v.as_array()[i], line);
    } else {
      fail(line, "cannot assign to this expression");
    }
  }

  std::string capture(const Node& body) {
    std::string saved = std::move(out_);
    out_.clear();
    exec(body);
    std::string captured = std::move(out_);
    out_ = std::move(saved);
    return captured;
  }

  Value make_macro(const Node& n) {
    const Node* node = &n;
    return Value(Function([this, node](Arguments& args) { return call_macro(*node, args); }));
  }

  Value call_macro(const Node& n, Arguments& args) {
    if (++call_depth_ > kMaxCallDepth) fail(n.line, "macro calls nested too deeply");
    auto frame = std::make_shared<Scope>();
    for (size_t i = 0; i < n.names.size(); ++i) {
      Value v = args.at(i, n.names[i]);
      if (v.is_undefined() && n.kids[i]) v = eval(*n.kids[i]);
      (*frame)[n.names[i]] = v;
    }
    // A macro sees the globals and the template's top level, not its caller's locals.
    std::vector<std::shared_ptr<Scope>> saved = std::move(scopes_);
    scopes_ = {saved[0], saved[1], frame};
    std::string result;
    try {
      result = capture(*n.kids.back());
    } catch (...) {
      scopes_ = std::move(saved);
      --call_depth_;
      throw;
    }
    scopes_ = std::move(saved);
    --call_depth_;
    return Value(std::move(result));
  }

  // ---- expressions

  Value eval(const Node& n) {
    step(n);
    switch (n.kind) {
      case NodeKind::Literal: return n.literal;
      case NodeKind::Name: return lookup(n.str);
      case NodeKind::List:
      case NodeKind::Tuple: {
        Array a;
        for (const auto& k : n.kids) a.push_back(eval(*k));
        return Value(std::move(a));
      }
      case NodeKind::Dict: {
        Value o{Object{}};
        for (size_t i = 0; i + 1 < n.kids.size(); i += 2) {
          const Value key = eval(*n.kids[i]);
          if (!key.is_string()) fail(n.line, "dictionary keys must be strings");
          o.set(key.as_string(), eval(*n.kids[i + 1]));
        }
        return o;
      }
      case NodeKind::Attr: return attribute(eval(*n.kids[0]), n.str, n.line);
      case NodeKind::Index: return index(eval(*n.kids[0]), eval(*n.kids[1]), n.line);
      case NodeKind::Slice: return slice(n);
      case NodeKind::Call: return call(n);
      case NodeKind::Filter: return filter(n);
      case NodeKind::Test: return Value(test(n) != n.flag);
      case NodeKind::Not: return Value(!eval(*n.kids[0]).truthy());
      case NodeKind::Neg: {
        const Value v = eval(*n.kids[0]);
        if (v.is_int()) return Value(-v.as_int());
        if (v.kind() == Value::Kind::Float) return Value(-v.as_double());
        fail(n.line, fmt::format("cannot negate a {}", v.kind_name()));
      }
      case NodeKind::And: {
        Value l = eval(*n.kids[0]);
        return l.truthy() ? eval(*n.kids[1]) : l;
      }
      case NodeKind::Or: {
        Value l = eval(*n.kids[0]);
        return l.truthy() ? l : eval(*n.kids[1]);
      }
      case NodeKind::Ternary:
        if (eval(*n.kids[0]).truthy()) return eval(*n.kids[1]);
        return n.kids[2] ? eval(*n.kids[2]) : Value();
      case NodeKind::Binary: return binary(n);
      default: fail(n.line, "statement used as an expression");
    }
  }

  Value lookup(const std::string& name) const {
    for (auto it = scopes_.rbegin(); it != scopes_.rend(); ++it) {
      const auto found = (*it)->find(name);
      if (found != (*it)->end()) return found->second;
    }
    return Value();
  }

  Value attribute(const Value& v, const std::string& name, int line) {
    if (v.is_object()) {
      Value member = v.get(name);
      if (!member.is_undefined()) return member;
    }
    if (v.is_string() || v.is_object() || v.is_array()) {
      if (Value m = method(v, name, line); !m.is_undefined()) return m;
    }
    return Value();
  }

  static int64_t normalize_index(int64_t i, size_t size) { return i < 0 ? i + static_cast<int64_t>(size) : i; }

  Value index(const Value& v, const Value& key, int line) {
    if (v.is_array() && key.is_int()) {
      const int64_t i = normalize_index(key.as_int(), v.as_array().size());
      if (i < 0 || i >= static_cast<int64_t>(v.as_array().size())) return Value();
      return v.as_array()[static_cast<size_t>(i)];
    }
    if (v.is_string() && key.is_int()) {
      const auto cps = code_points(v.as_string());
      const int64_t i = normalize_index(key.as_int(), cps.size());
      if (i < 0 || i >= static_cast<int64_t>(cps.size())) return Value();
      return Value(cps[static_cast<size_t>(i)]);
    }
    if (v.is_object() && key.is_string()) return attribute(v, key.as_string(), line);
    return Value();
  }

  Value slice(const Node& n) {
    const Value target = eval(*n.kids[0]);
    const auto bound = [&](int k) -> std::optional<int64_t> {
      if (!n.kids[static_cast<size_t>(k)]) return std::nullopt;
      const Value v = eval(*n.kids[static_cast<size_t>(k)]);
      if (v.is_none()) return std::nullopt;
      if (!v.is_int()) fail(n.line, "slice bounds must be integers");
      return v.as_int();
    };
    const auto start = bound(1), stop = bound(2), stride = bound(3);
    if (target.is_array()) return Value(slice_items(target.as_array(), start, stop, stride, n.line));
    if (target.is_string()) {
      const auto cps = code_points(target.as_string());
      std::vector<Value> pieces(cps.begin(), cps.end());
      std::string s;
      for (const auto& p : slice_items(pieces, start, stop, stride, n.line)) s += p.as_string();
      return Value(std::move(s));
    }
    fail(n.line, fmt::format("cannot slice a {}", target.kind_name()));
  }

  // Python's slice rules.
  static Array slice_items(const Array& items, std::optional<int64_t> start, std::optional<int64_t> stop,
                           std::optional<int64_t> stride, int line) {
    const int64_t size = static_cast<int64_t>(items.size());
    const int64_t step_by = stride.value_or(1);
    if (step_by == 0) fail(line, "slice step cannot be zero");
    const auto clamp = [&](std::optional<int64_t> b, int64_t dflt) {
      if (!b) return dflt;
      int64_t v = *b < 0 ? *b + size : *b;
      if (step_by > 0) return std::clamp<int64_t>(v, 0, size);
      return std::clamp<int64_t>(v, -1, size - 1);
    };
    Array out;
    if (step_by > 0) {
      for (int64_t i = clamp(start, 0), end = clamp(stop, size); i < end; i += step_by) out.push_back(items[static_cast<size_t>(i)]);
    } else {
      for (int64_t i = clamp(start, size - 1), end = clamp(stop, -1); i > end; i += step_by) out.push_back(items[static_cast<size_t>(i)]);
    }
    return out;
  }

  Arguments arguments(const Node& n, size_t first) {
    Arguments a;
    for (size_t i = first; i < n.kids.size(); ++i) {
      const std::string& name = n.names[i - first];
      if (name.empty()) a.positional.push_back(eval(*n.kids[i]));
      else a.keyword.emplace_back(name, eval(*n.kids[i]));
    }
    return a;
  }

  Value call(const Node& n) {
    const Value callee = eval(*n.kids[0]);
    if (!callee.is_function()) {
      const std::string what = n.kids[0]->kind == NodeKind::Name || n.kids[0]->kind == NodeKind::Attr ? n.kids[0]->str : "value";
      fail(n.line, fmt::format("'{}' is not callable", what));
    }
    Arguments a = arguments(n, 1);
    try {
      return callee.as_function()(a);
    } catch (const JinjaError&) {
      throw;
    } catch (const std::exception& e) {
      fail(n.line, e.what());
    }
  }

  // Operators as the reference renderer applies them: == and != on anything; arithmetic and
  // ordering on numbers; an undefined operand only in "in" (false) and "~" (empty); none in
  // nothing else; "~" joins text; "+" joins lists, and joins text when either side is a string.
  Value binary(const Node& n) {
    const std::string& op = n.str;
    const Value l = eval(*n.kids[0]);
    const Value r = eval(*n.kids[1]);
    if (op == "==") return Value(l.equals(r));
    if (op == "!=") return Value(!l.equals(r));
    if (l.is_number() && r.is_number() && op != "~") {
      if (op == "<" || op == ">" || op == "<=" || op == ">=") return Value(compare(op, l, r, n.line));
      return arithmetic(op, l, r, n.line);
    }
    if (l.is_undefined() || r.is_undefined()) {
      if (r.is_undefined() && (op == "in" || op == "not in")) return Value(op == "not in");
      if (op == "~" && !l.is_none() && !r.is_none()) return checked_text(l.to_string() + r.to_string(), n.line);
      fail(n.line, fmt::format("cannot apply '{}' to an undefined value", op));
    }
    if (l.is_none() || r.is_none()) fail(n.line, fmt::format("cannot apply '{}' to none", op));
    if (op == "~") return checked_text(l.to_string() + r.to_string(), n.line);
    if (op == "in" || op == "not in") return Value(contains(r, l, n.line) == (op == "in"));
    if (op == "+") {
      if (l.is_array() && r.is_array()) {
        charge(l.as_array().size() + r.as_array().size(), n.line);
        Array a = l.as_array();
        a.insert(a.end(), r.as_array().begin(), r.as_array().end());
        return Value(std::move(a));
      }
      if (l.is_string() || r.is_string()) return checked_text(l.to_string() + r.to_string(), n.line);
    }
    if (op == "<" || op == ">" || op == "<=" || op == ">=") return Value(compare(op, l, r, n.line));
    return arithmetic(op, l, r, n.line);
  }

  static Value arithmetic(const std::string& op, const Value& l, const Value& r, int line) {
    if (!(l.is_number() || l.is_bool()) || !(r.is_number() || r.is_bool())) {
      fail(line, fmt::format("unsupported operands for '{}': {} and {}", op, l.kind_name(), r.kind_name()));
    }
    const bool ints = !(l.kind() == Value::Kind::Float || r.kind() == Value::Kind::Float);
    const double a = l.as_double(), b = r.as_double();
    if (op == "/") {
      if (b == 0) fail(line, "division by zero");
      return Value(a / b);
    }
    if (ints) {
      const int64_t x = l.as_int(), y = r.as_int();
      if (op == "+") return Value(x + y);
      if (op == "-") return Value(x - y);
      if (op == "*") return Value(x * y);
      if (op == "**") return Value(static_cast<int64_t>(std::pow(static_cast<double>(x), static_cast<double>(y))));
      if (y == 0) fail(line, "division by zero");
      const int64_t q = x / y - ((x % y != 0) && ((x < 0) != (y < 0)) ? 1 : 0);  // floor, as Python's
      if (op == "//") return Value(q);
      if (op == "%") return Value(x - q * y);
    } else {
      if (op == "+") return Value(a + b);
      if (op == "-") return Value(a - b);
      if (op == "*") return Value(a * b);
      if (op == "**") return Value(std::pow(a, b));
      if (b == 0) fail(line, "division by zero");
      if (op == "//") return Value(std::floor(a / b));
      if (op == "%") return Value(a - std::floor(a / b) * b);
    }
    fail(line, fmt::format("unknown operator '{}'", op));
  }

  static bool compare(const std::string& op, const Value& l, const Value& r, int line) {
    int c;
    if ((l.is_number() || l.is_bool()) && (r.is_number() || r.is_bool())) {
      c = l.as_double() < r.as_double() ? -1 : l.as_double() > r.as_double() ? 1 : 0;
    } else if (l.is_string() && r.is_string()) {
      c = l.as_string().compare(r.as_string());
    } else {
      fail(line, fmt::format("cannot compare a {} with a {}", l.kind_name(), r.kind_name()));
    }
    if (op == "<") return c < 0;
    if (op == ">") return c > 0;
    if (op == "<=") return c <= 0;
    return c >= 0;
  }

  static bool contains(const Value& haystack, const Value& needle, int line) {
    if (haystack.is_string()) {
      if (!needle.is_string()) fail(line, "'in <string>' needs a string on the left");
      return haystack.as_string().find(needle.as_string()) != std::string::npos;
    }
    if (haystack.is_array()) {
      return std::any_of(haystack.as_array().begin(), haystack.as_array().end(),
                         [&](const Value& v) { return v.equals(needle); });
    }
    if (haystack.is_object()) return needle.is_string() && !haystack.get(needle.as_string()).is_undefined();
    if (haystack.is_undefined() || haystack.is_none()) return false;
    fail(line, fmt::format("'in' needs a string, list or mapping, not a {}", haystack.kind_name()));
  }

 public:
  // ---- what the filter functions (filter_table) call back into

  // The items a for loop would visit: a list's, a mapping's keys, a string's characters.
  std::vector<Value> iterate(const Value& v, int line) {
    if (v.is_array()) {
      charge(v.as_array().size(), line);
      return v.as_array();
    }
    if (v.is_object()) {
      std::vector<Value> keys;
      for (const auto& [k, _] : v.as_object()) keys.emplace_back(k);
      return keys;
    }
    if (v.is_string()) {
      const auto cps = code_points(v.as_string());
      return {cps.begin(), cps.end()};
    }
    if (v.is_undefined() || v.is_none()) return {};
    fail(line, fmt::format("cannot iterate over a {}", v.kind_name()));
  }

  Value string_method(const std::string& s, const std::string& name, Arguments& a, int line);
  Value apply_filter(const std::string& name, const Value& v, Arguments& a, int line);
  bool apply_test(const std::string& name, const Value& v, const Arguments& a, int line);

 private:
  // ---- methods, filters, tests, globals

  Value method(const Value& self, const std::string& name, int line);
  Value filter(const Node& n);
  bool test(const Node& n);
  void install_globals(Scope& g);

  void emit(const std::string& s) {
    out_ += s;
    if (out_.size() > kMaxOutput) fail(0, "output larger than 64 MiB");
  }

  void step(const Node& n) { charge(1, n.line); }

  // Work proportional to `units` (loop steps, list elements copied or made).
  void charge(size_t units, int line) {
    steps_ += static_cast<int64_t>(units);
    if (steps_ > kMaxSteps) fail(line, "template ran too long (more than 2 million steps)");
  }

  struct ScopeGuard {
    explicit ScopeGuard(Renderer& r) : r_(r) { r_.scopes_.push_back(std::make_shared<Scope>()); }
    ~ScopeGuard() { r_.scopes_.pop_back(); }
    Renderer& r_;
  };

  std::vector<std::shared_ptr<Scope>> scopes_;
  std::string out_;
  int64_t steps_ = 0;
  int call_depth_ = 0;
};

// Python's str.split: with no separator, runs of whitespace split and the ends are dropped.
Array split_string(const std::string& s, const Value& sep, int64_t max_split) {
  Array out;
  if (sep.is_undefined() || sep.is_none()) {
    size_t i = 0;
    while (i < s.size()) {
      while (i < s.size() && is_space(s[i])) ++i;
      if (i >= s.size()) break;
      if (max_split >= 0 && static_cast<int64_t>(out.size()) == max_split) {
        out.emplace_back(strip_chars(s.substr(i), nullptr, false, true));
        break;
      }
      size_t j = i;
      while (j < s.size() && !is_space(s[j])) ++j;
      out.emplace_back(s.substr(i, j - i));
      i = j;
    }
    return out;
  }
  const std::string& d = sep.as_string();
  if (d.empty()) fail(0, "split: empty separator");
  size_t start = 0;
  for (size_t found; (found = s.find(d, start)) != std::string::npos;) {
    if (max_split >= 0 && static_cast<int64_t>(out.size()) == max_split) break;
    out.emplace_back(s.substr(start, found - start));
    start = found + d.size();
  }
  out.emplace_back(s.substr(start));
  return out;
}

std::string replace_all(std::string s, const std::string& from, const std::string& to, int64_t count) {
  if (from.empty()) return s;
  size_t pos = 0;
  for (int64_t done = 0; (count < 0 || done < count) && (pos = s.find(from, pos)) != std::string::npos; ++done) {
    s.replace(pos, from.size(), to);
    pos += to.size();
    if (s.size() > kMaxOutput) fail(0, "a string grew larger than 64 MiB");
  }
  return s;
}

std::string change_case(std::string s, bool upper) {
  for (char& c : s) c = static_cast<char>(upper ? std::toupper(static_cast<unsigned char>(c)) : std::tolower(static_cast<unsigned char>(c)));
  return s;
}

std::string title_case(std::string s) {
  bool start = true;
  for (char& c : s) {
    const auto u = static_cast<unsigned char>(c);
    c = static_cast<char>(start ? std::toupper(u) : std::tolower(u));
    start = !std::isalnum(u);
  }
  return s;
}

bool affix_matches(const std::string& s, const Value& affix, bool prefix) {
  const auto one = [&](const Value& a) {
    if (!a.is_string()) return false;
    return prefix ? s.starts_with(a.as_string()) : s.ends_with(a.as_string());
  };
  if (affix.is_array()) return std::any_of(affix.as_array().begin(), affix.as_array().end(), one);
  return one(affix);
}

Value Renderer::string_method(const std::string& s, const std::string& name, Arguments& a, int line) {
  const Value arg0 = a.at(0, "");
  const std::string* chars = arg0.is_string() ? &arg0.as_string() : nullptr;
  if (name == "strip") return Value(strip_chars(s, chars, true, true));
  if (name == "lstrip") return Value(strip_chars(s, chars, true, false));
  if (name == "rstrip") return Value(strip_chars(s, chars, false, true));
  if (name == "upper") return Value(change_case(s, true));
  if (name == "lower") return Value(change_case(s, false));
  if (name == "title") return Value(title_case(s));
  if (name == "capitalize") return Value(s.empty() ? s : change_case(s.substr(0, 1), true) + change_case(s.substr(1), false));
  if (name == "split") {
    const Value max = a.at(1, "maxsplit", Value(-1));
    return Value(split_string(s, a.at(0, "sep"), max.is_int() ? max.as_int() : -1));
  }
  if (name == "startswith") return Value(affix_matches(s, arg0, true));
  if (name == "endswith") return Value(affix_matches(s, arg0, false));
  if (name == "replace") {
    const Value from = a.at(0, "old"), to = a.at(1, "new"), count = a.at(2, "count", Value(-1));
    if (!from.is_string() || !to.is_string()) fail(line, "replace needs two strings");
    return Value(replace_all(s, from.as_string(), to.as_string(), count.is_int() ? count.as_int() : -1));
  }
  if (name == "find") return Value(chars ? (s.find(*chars) == std::string::npos ? int64_t{-1} : static_cast<int64_t>(s.find(*chars))) : int64_t{-1});
  if (name == "count") return Value(chars && !chars->empty() ? static_cast<int64_t>(split_string(s, arg0, -1).size() - 1) : int64_t{0});
  if (name == "join") {
    std::string out;
    const Array items = iterate(arg0, line);
    for (size_t i = 0; i < items.size(); ++i) {
      out += (i ? s : "") + items[i].to_string();
      if (out.size() > kMaxOutput) fail(line, "a string grew larger than 64 MiB");
    }
    return Value(std::move(out));
  }
  if (name == "isdigit") return Value(!s.empty() && std::all_of(s.begin(), s.end(), [](char c) { return std::isdigit(static_cast<unsigned char>(c)); }));
  fail(line, fmt::format("strings have no method '{}'", name));
}

Value Renderer::method(const Value& self, const std::string& name, int line) {
  if (self.is_string()) {
    static const char* const kNames[] = {"strip", "lstrip", "rstrip", "upper", "lower", "title", "capitalize", "split",
                                         "startswith", "endswith", "replace", "find", "count", "join", "isdigit"};
    if (std::none_of(std::begin(kNames), std::end(kNames), [&](const char* k) { return name == k; })) return Value();
    const std::string s = self.as_string();
    return Value(Function([this, s, name, line](Arguments& a) { return string_method(s, name, a, line); }));
  }
  if (self.is_object()) {
    if (name == "items") {
      return Value(Function([self](Arguments&) {
        Array out;
        for (const auto& [k, v] : self.as_object()) out.emplace_back(Array{Value(k), v});
        return Value(std::move(out));
      }));
    }
    if (name == "keys" || name == "values") {
      const bool keys = name == "keys";
      return Value(Function([self, keys](Arguments&) {
        Array out;
        for (const auto& [k, v] : self.as_object()) out.push_back(keys ? Value(k) : v);
        return Value(std::move(out));
      }));
    }
    if (name == "get") {
      return Value(Function([self](Arguments& a) {
        const Value key = a.at(0, "key");
        Value v = key.is_string() ? self.get(key.as_string()) : Value();
        return v.is_undefined() ? a.at(1, "default", Value::none()) : v;
      }));
    }
    return Value();
  }
  if (self.is_array()) {
    if (name == "append") {
      return Value(Function([self](Arguments& a) {
        self.as_array().push_back(a.at(0, "item"));
        return Value::none();
      }));
    }
    if (name == "pop") {
      return Value(Function([self, line](Arguments& a) {
        Array& items = self.as_array();
        if (items.empty()) fail(line, "pop from an empty list");
        const int64_t i = normalize_index(a.at(0, "index", Value(-1)).as_int(), items.size());
        if (i < 0 || i >= static_cast<int64_t>(items.size())) fail(line, "pop index out of range");
        Value v = items[static_cast<size_t>(i)];
        items.erase(items.begin() + i);
        return v;
      }));
    }
  }
  return Value();
}

Value Renderer::filter(const Node& n) {
  const Value v = eval(*n.kids[0]);
  Arguments a = arguments(n, 1);
  return apply_filter(n.str, v, a, n.line);
}

// Sorts pairs [key, value] by key, case-insensitively as Jinja's dictsort does by default.
Value dictsort(const Value& v, int line) {
  if (!v.is_object()) fail(line, "dictsort needs a mapping");
  Object items = v.as_object();
  std::stable_sort(items.begin(), items.end(), [](const auto& x, const auto& y) {
    return change_case(x.first, false) < change_case(y.first, false);
  });
  Array out;
  for (auto& [k, val] : items) out.emplace_back(Array{Value(k), val});
  return Value(std::move(out));
}

// ---- filters: one function each, found by name in filter_table()

namespace {

// A filter applied: the value piped in, its arguments, the template line (for errors), and the
// name it was called by (one function serves Jinja's aliases).
struct FilterCall {
  const std::string& name;
  const Value& v;
  Arguments& a;
  int line;
};

Value filter_safe(Renderer&, const FilterCall& c) { return c.v; }

Value filter_tojson(Renderer&, const FilterCall& c) {
  const Value indent = c.a.at(0, "indent");
  return checked_text(c.v.to_json(indent.is_int() ? static_cast<int>(std::clamp<int64_t>(indent.as_int(), 0, 16)) : -1), c.line);
}

Value filter_string(Renderer&, const FilterCall& c) { return Value(c.v.to_string()); }

Value filter_trim(Renderer&, const FilterCall& c) {
  if (!c.v.is_string()) fail(c.line, fmt::format("trim needs a string, not a {}", c.v.kind_name()));
  const Value chars = c.a.at(0, "chars");
  return Value(strip_chars(c.v.as_string(), chars.is_string() ? &chars.as_string() : nullptr, true, true));
}

// upper, lower, title, capitalize: the string methods of the same names, without arguments.
Value filter_case(Renderer& r, const FilterCall& c) {
  if (!c.v.is_string()) fail(c.line, fmt::format("{} needs a string", c.name));
  Arguments none;
  return r.string_method(c.v.as_string(), c.name, none, c.line);
}

Value filter_replace(Renderer& r, const FilterCall& c) {
  if (!c.v.is_string()) fail(c.line, "replace needs a string");
  return r.string_method(c.v.as_string(), c.name, c.a, c.line);
}

Value filter_length(Renderer&, const FilterCall& c) {
  if (c.v.is_string()) return Value(static_cast<int64_t>(code_points(c.v.as_string()).size()));
  if (c.v.is_array()) return Value(static_cast<int64_t>(c.v.as_array().size()));
  if (c.v.is_object()) return Value(static_cast<int64_t>(c.v.as_object().size()));
  fail(c.line, fmt::format("a {} has no length", c.v.kind_name()));
}

Value filter_default(Renderer&, const FilterCall& c) {
  const bool boolean = c.a.at(1, "boolean", Value(false)).truthy();
  const bool use_default = c.v.is_undefined() || (boolean && !c.v.truthy());
  return use_default ? c.a.at(0, "default_value", Value("")) : c.v;
}

// first, last.
Value filter_end(Renderer& r, const FilterCall& c) {
  const Array items = r.iterate(c.v, c.line);
  if (items.empty()) return Value();
  return c.name == "first" ? items.front() : items.back();
}

Value filter_list(Renderer& r, const FilterCall& c) { return Value(r.iterate(c.v, c.line)); }

Value filter_reverse(Renderer& r, const FilterCall& c) {
  if (c.v.is_string()) {
    auto cps = code_points(c.v.as_string());
    std::reverse(cps.begin(), cps.end());
    std::string s;
    for (const auto& cp : cps) s += cp;
    return Value(std::move(s));
  }
  Array items = r.iterate(c.v, c.line);
  std::reverse(items.begin(), items.end());
  return Value(std::move(items));
}

Value filter_join(Renderer& r, const FilterCall& c) {
  const Value sep = c.a.at(0, "d", Value(""));
  const Value attr = c.a.at(1, "attribute");
  std::string out;
  const Array items = r.iterate(c.v, c.line);
  for (size_t i = 0; i < items.size(); ++i) {
    if (i) out += sep.to_string();
    out += (attr.is_string() ? items[i].get(attr.as_string()) : items[i]).to_string();
    if (out.size() > kMaxOutput) fail(c.line, "a string grew larger than 64 MiB");
  }
  return Value(std::move(out));
}

Value filter_items(Renderer&, const FilterCall& c) {
  if (c.v.is_undefined() || c.v.is_none()) return Value(Array{});
  if (!c.v.is_object()) fail(c.line, "items needs a mapping");
  Array out;
  for (const auto& [k, val] : c.v.as_object()) out.emplace_back(Array{Value(k), val});
  return Value(std::move(out));
}

Value filter_dictsort(Renderer&, const FilterCall& c) { return dictsort(c.v, c.line); }

Value filter_int(Renderer&, const FilterCall& c) {
  if (c.v.is_number() || c.v.is_bool()) return Value(c.v.as_int());
  if (c.v.is_string()) {
    int64_t i = 0;
    const std::string s = strip_chars(c.v.as_string(), nullptr, true, true);
    const auto r = std::from_chars(s.data(), s.data() + s.size(), i);
    return r.ec == std::errc() && r.ptr == s.data() + s.size() ? Value(i) : c.a.at(0, "default", Value(0));
  }
  return c.a.at(0, "default", Value(0));
}

Value filter_float(Renderer&, const FilterCall& c) {
  if (c.v.is_number() || c.v.is_bool()) return Value(c.v.as_double());
  if (c.v.is_string()) return Value(std::strtod(c.v.as_string().c_str(), nullptr));
  return Value(0.0);
}

Value filter_abs(Renderer&, const FilterCall& c) {
  if (c.v.is_int()) return Value(c.v.as_int() < 0 ? -c.v.as_int() : c.v.as_int());
  if (c.v.is_number()) return Value(std::fabs(c.v.as_double()));
  fail(c.line, "abs needs a number");
}

Value filter_unique(Renderer& r, const FilterCall& c) {
  Array out;
  for (const auto& item : r.iterate(c.v, c.line)) {
    if (std::none_of(out.begin(), out.end(), [&](const Value& o) { return o.equals(item); })) out.push_back(item);
  }
  return Value(std::move(out));
}

// The positional arguments from `first` on (what a filter passes on to a test or filter).
Arguments arguments_from(const Arguments& a, size_t first) {
  Arguments rest;
  for (size_t i = first; i < a.positional.size(); ++i) rest.positional.push_back(a.positional[i]);
  return rest;
}

// select, reject (items that pass a test, or fail it), selectattr, rejectattr (by an attribute).
Value filter_select(Renderer& r, const FilterCall& c) {
  const bool by_attr = c.name.ends_with("attr");
  const bool keep_if = c.name.starts_with("select");
  const Arguments rest = arguments_from(c.a, by_attr ? 2 : 1);
  const Value test_name = c.a.at(by_attr ? 1 : 0, "");
  const Value attr = by_attr ? c.a.at(0, "") : Value();
  Array out;
  for (const auto& item : r.iterate(c.v, c.line)) {
    const Value subject = by_attr ? item.get(attr.is_string() ? attr.as_string() : "") : item;
    const bool passed = test_name.is_string() ? r.apply_test(test_name.as_string(), subject, rest, c.line) : subject.truthy();
    if (passed == keep_if) out.push_back(item);
  }
  return Value(std::move(out));
}

// map(attribute=...) or map(filter, args...).
Value filter_map(Renderer& r, const FilterCall& c) {
  const Value attr = c.a.named("attribute");
  Array out;
  for (const auto& item : r.iterate(c.v, c.line)) {
    if (attr.is_string()) {
      Value got = item.get(attr.as_string());
      out.push_back(got.is_undefined() ? c.a.named("default") : got);
      continue;
    }
    const Value filter_name = c.a.at(0, "");
    if (!filter_name.is_string()) fail(c.line, "map needs a filter name or attribute=");
    Arguments rest = arguments_from(c.a, 1);
    out.push_back(r.apply_filter(filter_name.as_string(), item, rest, c.line));
  }
  return Value(std::move(out));
}

Value filter_indent(Renderer&, const FilterCall& c) {
  if (!c.v.is_string()) fail(c.line, "indent needs a string");
  const Value width = c.a.at(0, "width", Value(4));
  const std::string pad = width.is_string() ? width.as_string() : std::string(static_cast<size_t>(std::clamp<int64_t>(width.as_int(), 0, 64)), ' ');
  const bool first = c.a.at(1, "first", Value(false)).truthy();
  std::string out = first ? pad : "";
  for (const char ch : c.v.as_string()) {
    out += ch;
    if (ch == '\n') out += pad;
  }
  return checked_text(std::move(out), c.line);
}

using Filter = Value (*)(Renderer&, const FilterCall&);

// Every filter by name (Jinja's aliases included). A new filter: a function above, a row here,
// a case in tests/test_jinja.cpp.
const std::unordered_map<std::string_view, Filter>& filter_table() {
  static const std::unordered_map<std::string_view, Filter> table = {
      {"safe", filter_safe},       {"tojson", filter_tojson},     {"string", filter_string},
      {"trim", filter_trim},       {"upper", filter_case},        {"lower", filter_case},
      {"title", filter_case},      {"capitalize", filter_case},   {"replace", filter_replace},
      {"length", filter_length},   {"count", filter_length},      {"default", filter_default},
      {"d", filter_default},       {"first", filter_end},         {"last", filter_end},
      {"list", filter_list},       {"reverse", filter_reverse},   {"join", filter_join},
      {"items", filter_items},     {"dictsort", filter_dictsort}, {"int", filter_int},
      {"float", filter_float},     {"abs", filter_abs},           {"unique", filter_unique},
      {"select", filter_select},   {"reject", filter_select},     {"selectattr", filter_select},
      {"rejectattr", filter_select}, {"map", filter_map},         {"indent", filter_indent},
  };
  return table;
}

}  // namespace

Value Renderer::apply_filter(const std::string& name, const Value& v, Arguments& a, int line) {
  const auto& table = filter_table();
  const auto it = table.find(name);
  if (it == table.end()) fail(line, fmt::format("unknown filter '{}'", name));
  return it->second(*this, FilterCall{name, v, a, line});
}

bool Renderer::test(const Node& n) {
  const Value v = eval(*n.kids[0]);
  const Arguments a = arguments(n, 1);
  return apply_test(n.str, v, a, n.line);
}

bool Renderer::apply_test(const std::string& name, const Value& v, const Arguments& a, int line) {
  if (name == "defined") return !v.is_undefined();
  if (name == "undefined") return v.is_undefined();
  if (name == "none") return v.is_none();
  if (name == "string") return v.is_string();
  if (name == "number") return v.is_number();
  if (name == "integer") return v.is_int();
  if (name == "float") return v.kind() == Value::Kind::Float;
  if (name == "boolean") return v.is_bool();
  if (name == "true") return v.is_bool() && v.as_bool();
  if (name == "false") return v.is_bool() && !v.as_bool();
  if (name == "mapping") return v.is_object();
  if (name == "sequence" || name == "iterable") return v.is_array() || v.is_string() || v.is_object();
  if (name == "callable") return v.is_function();
  if (name == "odd" || name == "even") {
    if (!v.is_int()) fail(line, fmt::format("'{}' needs an integer", name));
    return (v.as_int() % 2 != 0) == (name == "odd");
  }
  if (name == "divisibleby") {
    const Value d = a.at(0, "num");
    return v.is_int() && d.is_int() && d.as_int() != 0 && v.as_int() % d.as_int() == 0;
  }
  if (name == "equalto" || name == "eq" || name == "sameas" || name == "==") return v.equals(a.at(0, "other"));
  if (name == "ne" || name == "!=") return !v.equals(a.at(0, "other"));
  if (name == "in") return contains(a.at(0, "seq"), v, line);
  if (name == "lower" || name == "upper") {
    return v.is_string() && v.as_string() == change_case(v.as_string(), name == "upper");
  }
  fail(line, fmt::format("unknown test '{}'", name));
}

void Renderer::install_globals(Scope& g) {
  g["range"] = Value(Function([this](Arguments& a) {
    int64_t start = 0, stop = 0, by = 1;
    if (a.positional.size() == 1) {
      stop = a.positional[0].as_int();
    } else if (a.positional.size() >= 2) {
      start = a.positional[0].as_int();
      stop = a.positional[1].as_int();
      if (a.positional.size() >= 3) by = a.positional[2].as_int();
    }
    if (by == 0) throw std::runtime_error("range() step cannot be zero");
    Array out;
    for (int64_t i = start; by > 0 ? i < stop : i > stop; i += by) {
      if (static_cast<int64_t>(out.size()) >= kMaxRange) throw std::runtime_error("range() longer than a million");
      charge(1, 0);
      out.emplace_back(i);
    }
    return Value(std::move(out));
  }));
  g["namespace"] = Value(Function([](Arguments& a) {
    Value ns{Object{}};
    if (!a.positional.empty() && a.positional[0].is_object()) {
      for (const auto& [k, v] : a.positional[0].as_object()) ns.set(k, v);
    }
    for (const auto& [k, v] : a.keyword) ns.set(k, v);
    return ns;
  }));
  g["dict"] = Value(Function([](Arguments& a) {
    Value d{Object{}};
    for (const auto& [k, v] : a.keyword) d.set(k, v);
    return d;
  }));
  // Functions throw plain exceptions; the call site adds the template line.
  g["raise_exception"] = Value(Function([](Arguments& a) -> Value {
    throw std::runtime_error("the template raised: " + a.at(0, "message").to_string());
  }));
  g["strftime_now"] = Value(Function([](Arguments& a) {
    const Value fmt_v = a.at(0, "format");
    if (!fmt_v.is_string()) return Value("");
    const std::time_t now = std::time(nullptr);
    std::tm tm{};
    localtime_r(&now, &tm);
    char buf[256];
    const size_t n = std::strftime(buf, sizeof buf, fmt_v.as_string().c_str(), &tm);
    return Value(std::string(buf, n));
  }));
}

}  // namespace

Template::Template(std::string_view source) {
  Lexer lexer(source);
  Parser parser(lexer.run());
  root_ = parser.parse_template();
}

Template::~Template() = default;
Template::Template(Template&&) noexcept = default;
Template& Template::operator=(Template&&) noexcept = default;

std::string Template::render(const Value& context) const {
  Renderer r(context);
  return r.run(*root_);
}

}  // namespace bmoe::jinja
