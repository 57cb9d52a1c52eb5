// Regular expression (JSON Schema `pattern`) to GBNF: a recursive-descent parser over the
// pattern that writes each part's GBNF as it goes, with the fewest and most characters it can
// match (json_schema.cpp checks those against minLength / maxLength).
#include "chat/schema_pattern.h"

#include <algorithm>
#include <cstdint>
#include <utility>
#include <vector>

#include "core/error.h"
#include "text/utf8.h"

namespace bmoe {

namespace {

constexpr size_t kMaxCount = 1000;       // {n,m} counts
constexpr int kMaxNesting = 100;         // nested groups
constexpr size_t kMaxWeight = 100000;    // expanded grammar elements of one pattern
constexpr uint32_t kMaxCodePoint = 0x10FFFF;

using Ranges = std::vector<std::pair<uint32_t, uint32_t>>;  // inclusive, sorted, disjoint once normalized

Ranges normalized(Ranges r) {
  std::sort(r.begin(), r.end());
  Ranges out;
  for (const auto& [lo, hi] : r) {
    if (!out.empty() && lo <= out.back().second + 1) {
      out.back().second = std::max(out.back().second, hi);
    } else {
      out.emplace_back(lo, hi);
    }
  }
  return out;
}

Ranges complement(const Ranges& r) {
  Ranges out;
  uint32_t next = 0;
  for (const auto& [lo, hi] : normalized(r)) {
    if (lo > next) out.emplace_back(next, lo - 1);
    next = hi + 1;
  }
  if (next <= kMaxCodePoint) out.emplace_back(next, kMaxCodePoint);
  return out;
}

Ranges minus(const Ranges& r, uint32_t lo, uint32_t hi) {
  Ranges out;
  for (const auto& [a, b] : r) {
    if (b < lo || a > hi) {
      out.emplace_back(a, b);
      continue;
    }
    if (a < lo) out.emplace_back(a, lo - 1);
    if (b > hi) out.emplace_back(hi + 1, b);
  }
  return out;
}

bool contains(const Ranges& r, uint32_t cp) {
  return std::any_of(r.begin(), r.end(), [cp](const auto& range) { return cp >= range.first && cp <= range.second; });
}

const Ranges& digit_set() {
  static const Ranges r = {{'0', '9'}};
  return r;
}
const Ranges& word_set() {
  static const Ranges r = normalized({{'0', '9'}, {'A', 'Z'}, {'_', '_'}, {'a', 'z'}});
  return r;
}
const Ranges& space_set() {  // ECMA's WhiteSpace and LineTerminator
  static const Ranges r = normalized({{0x09, 0x0D}, {0x20, 0x20}, {0xA0, 0xA0}, {0x1680, 0x1680}, {0x2000, 0x200A},
                                      {0x2028, 0x2029}, {0x202F, 0x202F}, {0x205F, 0x205F}, {0x3000, 0x3000}, {0xFEFF, 0xFEFF}});
  return r;
}

std::string joined(const std::vector<std::string>& parts, const char* sep) {
  std::string out;
  for (size_t i = 0; i < parts.size(); ++i) out += (i ? sep : "") + parts[i];
  return out;
}

std::string gbnf_literal(std::string_view text) {
  std::string out = "\"";
  for (const char c : text) {
    const auto b = static_cast<uint8_t>(c);
    if (c == '"' || c == '\\') {
      out += '\\';
      out += c;
    } else if (b < 0x20 || b == 0x7F) {
      out += fmt::format("\\x{:02X}", b);
    } else {
      out += c;
    }
  }
  return out + "\"";
}

// How JSON writes the character inside a string.
std::string json_text(uint32_t cp) {
  switch (cp) {
    case '"': return "\\\"";
    case '\\': return "\\\\";
    case '\b': return "\\b";
    case '\f': return "\\f";
    case '\n': return "\\n";
    case '\r': return "\\r";
    case '\t': return "\\t";
    default: break;
  }
  if (cp < 0x20) return fmt::format("\\u{:04x}", cp);
  std::string out;
  append_utf8(out, cp);
  return out;
}

std::string class_char(uint32_t cp) {
  if ((cp >= 'a' && cp <= 'z') || (cp >= 'A' && cp <= 'Z') || (cp >= '0' && cp <= '9')) return std::string(1, static_cast<char>(cp));
  return cp <= 0xFFFF ? fmt::format("\\u{:04X}", cp) : fmt::format("\\U{:08X}", cp);
}

// A part of the pattern: its GBNF and how many characters it matches.
struct Piece {
  std::string gbnf;
  size_t min = 0;
  std::optional<size_t> max = 0;
  bool single = true;  // one GBNF item (a quantifier may follow it without parentheses)
  std::string unit;    // when the piece is one character repeated: that character's GBNF
  size_t weight = 1;   // grammar elements once repetitions are expanded (Grammar::parse caps them)
};

std::optional<size_t> add(std::optional<size_t> a, std::optional<size_t> b) {
  return a && b ? std::optional<size_t>(*a + *b) : std::nullopt;
}

// A character set as GBNF: raw characters but those JSON escapes, then the escapes (Raw text:
// no escapes, and neither '<' nor controls).
Piece set_piece(const Ranges& set, PatternText text) {
  Ranges raw = minus(minus(normalized(set), 0, 0x1F), 0xD800, 0xDFFF);
  raw = text == PatternText::Json ? minus(minus(raw, '"', '"'), '\\', '\\') : minus(raw, '<', '<');
  std::vector<std::string> alts;
  if (!raw.empty()) {
    std::string cls = "[";
    for (const auto& [lo, hi] : raw) cls += lo == hi ? class_char(lo) : class_char(lo) + "-" + class_char(hi);
    alts.push_back(cls + "]");
  }
  for (const uint32_t cp : {uint32_t{'"'}, uint32_t{'\\'}, uint32_t{'\b'}, uint32_t{'\f'}, uint32_t{'\n'}, uint32_t{'\r'}, uint32_t{'\t'}}) {
    if (text == PatternText::Json && contains(set, cp)) alts.push_back(gbnf_literal(json_text(cp)));
  }
  if (alts.empty()) fail("a character class that matches no character bmoe can write");
  std::string gbnf = alts.size() == 1 ? alts[0] : "( " + joined(alts, " | ") + " )";
  return Piece{gbnf, 1, 1, true};
}

class PatternParser {
 public:
  PatternParser(std::string_view p, PatternText text) : p_(p), text_(text) {}

  PatternGrammar top() {
    std::vector<Piece> branches;
    do branches.push_back(top_branch());
    while (eat('|'));
    if (pos_ < p_.size()) fail("unbalanced ')' at offset {}", pos_);
    const Piece all = either(branches);
    return PatternGrammar{all.gbnf, all.min, all.max, branches.size() == 1 ? all.unit : "", all.weight};
  }

 private:
  // One top-level alternative. Anchors or not, the whole text matches it: a string that matches
  // the pattern whole also contains a match, and free text around it would let a model wander.
  Piece top_branch() {
    eat('^');
    Piece body = sequence(true);
    eat('$');
    if (pos_ < p_.size() && p_[pos_] != '|' && p_[pos_] != ')') fail("'^' and '$' are supported only at the ends of the pattern");
    return body;
  }

  Piece alternation() {
    std::vector<Piece> branches;
    do branches.push_back(sequence(false));
    while (eat('|'));
    return either(branches);
  }

  static Piece either(const std::vector<Piece>& branches) {
    if (branches.size() == 1) {
      Piece only = branches[0];
      if (only.gbnf.empty()) only.gbnf = "\"\"";
      return only;
    }
    Piece out{"", branches[0].min, branches[0].max, true};
    std::vector<std::string> alts;
    for (const auto& b : branches) {
      alts.push_back(b.gbnf.empty() ? "\"\"" : b.gbnf);
      out.weight += b.weight;
      out.min = std::min(out.min, b.min);
      out.max = out.max && b.max ? std::optional<size_t>(std::max(*out.max, *b.max)) : std::nullopt;
    }
    out.gbnf = "( " + joined(alts, " | ") + " )";
    return out;
  }

  // Items up to '|', ')' or the end ('$' at the top level ends it too). "" when empty.
  Piece sequence(bool top_level) {
    Piece out{"", 0, 0, true};
    std::vector<std::string> items;
    while (pos_ < p_.size() && p_[pos_] != '|' && p_[pos_] != ')') {
      if (p_[pos_] == '$') {
        if (top_level && (pos_ + 1 == p_.size() || p_[pos_ + 1] == '|')) break;
        fail("'$' is supported only at the end of the pattern");
      }
      if (p_[pos_] == '^') fail("'^' is supported only at the start of the pattern");
      const Piece q = quantified();
      out.unit = items.empty() ? q.unit : "";
      items.push_back(q.gbnf);
      out.min += q.min;
      out.weight += q.weight;
      out.max = add(out.max, q.max);
    }
    out.single = items.size() <= 1;
    out.gbnf = joined(items, " ");
    return out;
  }

  Piece quantified() {
    Piece a = atom();
    size_t lo = 0;
    std::optional<size_t> hi;
    if (eat('*')) {
      hi.reset();
    } else if (eat('+')) {
      lo = 1;
    } else if (eat('?')) {
      hi = 1;
    } else if (!braces(lo, hi)) {
      return a;
    }
    eat('?');  // lazy: the same strings match
    if (!hi && a.min == 0) fail("an unbounded repetition of a part that can be empty");
    const std::string base = a.single ? a.gbnf : "( " + a.gbnf + " )";
    std::string suffix;
    if (!hi) {
      suffix = lo == 0 ? "*" : lo == 1 ? "+" : fmt::format("{{{},}}", lo);
    } else if (lo == 0 && *hi == 1) {
      suffix = "?";
    } else {
      suffix = lo == *hi ? fmt::format("{{{}}}", lo) : fmt::format("{{{},{}}}", lo, *hi);
    }
    Piece out{base + suffix, a.min * lo, hi && a.max ? std::optional<size_t>(*a.max * *hi) : std::nullopt, true, ""};
    if (a.min == 1 && a.max == std::optional<size_t>(1) && a.unit.empty()) out.unit = base;
    out.weight = a.weight * (hi ? std::max<size_t>(*hi, 1) : lo + 1);
    if (out.weight > kMaxWeight) fail("the pattern's repetitions expand to more than {} grammar elements", kMaxWeight);
    if (hi && *hi == 0) out = Piece{"\"\"", 0, 0, true};
    return out;
  }

  // {n}, {n,} or {n,m}; false (nothing read) when the brace does not open one (then it is a literal).
  bool braces(size_t& lo, std::optional<size_t>& hi) {
    if (pos_ >= p_.size() || p_[pos_] != '{') return false;
    size_t i = pos_ + 1;
    auto number = [&](size_t& v) {
      const size_t start = i;
      v = 0;
      while (i < p_.size() && p_[i] >= '0' && p_[i] <= '9' && i - start < 7) v = v * 10 + static_cast<size_t>(p_[i++] - '0');
      return i > start;
    };
    size_t a = 0, b = 0;
    if (!number(a)) return false;
    bool open = false;
    if (i < p_.size() && p_[i] == ',') {
      ++i;
      open = !number(b);
    } else {
      b = a;
    }
    if (i >= p_.size() || p_[i] != '}') return false;
    if (a > kMaxCount || b > kMaxCount) fail("a count above {} in '{}'", kMaxCount, p_.substr(pos_, i + 1 - pos_));
    if (!open && b < a) fail("a count range out of order in '{}'", p_.substr(pos_, i + 1 - pos_));
    pos_ = i + 1;
    lo = a;
    hi = open ? std::nullopt : std::optional<size_t>(b);
    return true;
  }

  Piece atom() {
    const char c = p_[pos_];
    if (c == '(') return group();
    if (c == '[') return set_piece(char_class(), text_);
    if (c == '.') {
      ++pos_;
      return set_piece(complement({{'\n', '\n'}, {'\r', '\r'}, {0x2028, 0x2029}}), text_);
    }
    if (c == '*' || c == '+' || c == '?') fail("nothing to repeat before '{}' at offset {}", c, pos_);
    if (c == '{') {
      size_t lo = 0;
      std::optional<size_t> hi;
      const size_t at = pos_;
      if (braces(lo, hi)) fail("nothing to repeat before '{}' at offset {}", p_.substr(at, pos_ - at), at);
    }
    if (c == '\\') {
      ++pos_;
      if (const auto set = escape_set()) return set_piece(*set, text_);
      return char_piece(escape_char());
    }
    return char_piece(next_code_point());
  }

  Piece char_piece(uint32_t cp) {
    if (text_ == PatternText::Json) return Piece{gbnf_literal(json_text(cp)), 1, 1, true, ""};
    if (cp == '<' || cp < 0x20) fail("the character U+{:04X} cannot be written in this tool-call format", cp);
    std::string utf8;
    append_utf8(utf8, cp);
    return Piece{gbnf_literal(utf8), 1, 1, true, ""};
  }

  Piece group() {
    ++pos_;  // '('
    if (p_.substr(pos_, 2) == "?:") {
      pos_ += 2;
    } else if (p_.substr(pos_, 2) == "?=" || p_.substr(pos_, 2) == "?!" || p_.substr(pos_, 3) == "?<=" || p_.substr(pos_, 3) == "?<!") {
      fail("lookaround '({}' is not supported", p_.substr(pos_, p_[pos_ + 1] == '<' ? 3 : 2));
    } else if (p_.substr(pos_, 2) == "?<") {
      const size_t end = p_.find('>', pos_);
      if (end == std::string_view::npos) fail("an unterminated group name");
      pos_ = end + 1;
    } else if (pos_ < p_.size() && p_[pos_] == '?') {
      fail("'(?{}' is not supported", p_.substr(pos_ + 1, 1));
    }
    if (++nesting_ > kMaxNesting) fail("groups nested deeper than {}", kMaxNesting);
    Piece inner = alternation();
    --nesting_;
    if (!eat(')')) fail("a '(' without its ')'");
    if (inner.gbnf.empty()) inner.gbnf = "\"\"";
    if (!inner.single) inner.gbnf = "( " + inner.gbnf + " )";
    inner.single = true;
    return inner;
  }

  // After '\\': the class escapes (\d \w \s and their negations); nullopt for the others.
  std::optional<Ranges> escape_set() {
    if (pos_ >= p_.size()) fail("a pattern that ends in '\\'");
    const char c = p_[pos_];
    const Ranges* set = c == 'd' || c == 'D' ? &digit_set() : c == 'w' || c == 'W' ? &word_set() : c == 's' || c == 'S' ? &space_set() : nullptr;
    if (!set) return std::nullopt;
    ++pos_;
    return c >= 'a' ? *set : complement(*set);
  }

  // After '\\': one character.
  uint32_t escape_char() {
    const char c = p_[pos_++];
    switch (c) {
      case 't': return '\t';
      case 'n': return '\n';
      case 'r': return '\r';
      case 'f': return '\f';
      case 'v': return '\v';
      case '0': return 0;
      case 'x': return hex_digits(2);
      case 'u': return hex_digits(4);
      case 'b':
      case 'B': fail("'\\{}' (a word boundary) is not supported", c);
      case 'p':
      case 'P': fail("'\\{}{{...}}' (a Unicode property) is not supported", c);
      case 'c': fail("'\\c' (a control letter) is not supported");
      case 'k': fail("'\\k' (a named backreference) is not supported");
      default: break;
    }
    if (c >= '1' && c <= '9') fail("a backreference '\\{}' is not supported", c);
    if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z')) fail("the escape '\\{}' is not supported", c);
    --pos_;
    return next_code_point();
  }

  uint32_t hex_digits(int n) {
    uint32_t v = 0;
    for (int k = 0; k < n; ++k) {
      const char h = pos_ < p_.size() ? p_[pos_] : '\0';
      const int d = h >= '0' && h <= '9' ? h - '0' : h >= 'a' && h <= 'f' ? h - 'a' + 10 : h >= 'A' && h <= 'F' ? h - 'A' + 10 : -1;
      if (d < 0) fail("a hex escape needs {} hex digits", n);
      v = v * 16 + static_cast<uint32_t>(d);
      ++pos_;
    }
    return v;
  }

  // [...] or [^...]: the characters it matches.
  Ranges char_class() {
    ++pos_;  // '['
    const bool negated = eat('^');
    Ranges set;
    while (pos_ < p_.size() && p_[pos_] != ']') {
      std::optional<uint32_t> lo = class_atom(set);
      if (!lo) continue;
      if (p_.substr(pos_, 1) == "-" && pos_ + 1 < p_.size() && p_[pos_ + 1] != ']') {
        ++pos_;
        const std::optional<uint32_t> hi = class_atom(set);
        if (!hi) fail("a class range with a class escape at its end");
        if (*hi < *lo) fail("a class range out of order");
        set.emplace_back(*lo, *hi);
      } else {
        set.emplace_back(*lo, *lo);
      }
    }
    if (!eat(']')) fail("a '[' without its ']'");
    return negated ? complement(set) : normalized(set);
  }

  // One class member: a character (returned) or a class escape (added to `set`, nullopt).
  std::optional<uint32_t> class_atom(Ranges& set) {
    if (p_[pos_] != '\\') return next_code_point();
    ++pos_;
    if (const auto escaped = escape_set()) {
      set.insert(set.end(), escaped->begin(), escaped->end());
      return std::nullopt;
    }
    if (pos_ < p_.size() && p_[pos_] == 'b') {  // inside a class, \b is the backspace
      ++pos_;
      return '\b';
    }
    return escape_char();
  }

  uint32_t next_code_point() {
    if (pos_ >= p_.size()) fail("the pattern ends too early");
    const auto len = std::min(static_cast<size_t>(utf8_sequence_length(static_cast<uint8_t>(p_[pos_]))), p_.size() - pos_);
    const uint32_t cp = utf8_codepoints(p_.substr(pos_, len))[0];
    pos_ += len;
    return cp;
  }

  bool eat(char c) {
    if (pos_ < p_.size() && p_[pos_] == c) {
      ++pos_;
      return true;
    }
    return false;
  }

  std::string_view p_;
  PatternText text_;
  size_t pos_ = 0;
  int nesting_ = 0;
};

}  // namespace

PatternGrammar pattern_to_gbnf(std::string_view pattern, PatternText text) {
  return PatternParser(pattern, text).top();
}

}  // namespace bmoe
