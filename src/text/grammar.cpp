// GBNF grammars: a parser to a flat table of rules, a nondeterministic matcher over persistent
// parse stacks, and the token filter that walks a byte trie of the vocabulary.
//
// How matching works. A rule is a list of alternatives, each a run of elements (a character
// class or a rule reference) ended by an End element, all in one array. A parse stack is a
// linked list of element positions: the top is the class the next character must match, the
// nodes below are where to continue once the rule above finishes. Stacks live in an arena and
// are interned (one node per (position, parent) pair), so equal stacks are equal ids: the set
// of stacks is deduplicated by id, and an ambiguous grammar cannot double it on every character.
//
// Everything that happens between two characters (entering rules, skipping rules that can be
// empty, returning from finished ones) is precomputed at parse time: for each rule reference,
// its closure lists each class it can reach with the continuations to push on the way, and
// whether it can reach the end of its alternative ("pops"). Advancing a stack on a character is
// then: check the class at the top, and continue at the position after it (a class: push it; a
// reference: apply its closure; an end: return to the parent). Left recursion would make a
// closure infinite, so the parser refuses it.
#include "text/grammar.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <mutex>
#include <span>
#include <unordered_map>

#include "core/error.h"

namespace bmoe {

namespace {

constexpr uint32_t kNone = 0xFFFFFFFFu;  // no parent / the empty (finished) stack
constexpr uint32_t kMaxCodePoint = 0x10FFFF;
constexpr size_t kMaxGrammarBytes = size_t{4} << 20;
constexpr size_t kMaxElements = size_t{2} << 20;
constexpr uint32_t kMaxRepeat = 10000;
constexpr int kMaxNesting = 200;
constexpr size_t kMaxClosureWords = size_t{4} << 20;
constexpr size_t kMaxStacks = 1024;

}  // namespace

struct Grammar::Tables {
  enum Kind : uint8_t { kEnd, kChars, kRef };
  struct Element {
    Kind kind;
    uint32_t value;  // class id (kChars), rule id (kRef)
  };
  struct Range {
    uint32_t lo, hi;  // inclusive
  };
  struct CharClass {
    uint64_t ascii[2];  // membership of code points < 128, the common case
    uint32_t first, count;  // sorted, disjoint ranges
    bool any_valid;  // holds a code point that UTF-8 can encode (not only surrogates)
  };
  struct Rule {
    std::vector<uint32_t> alts;  // start position of each alternative
    std::string name;
    size_t offset;  // where it was defined (or first referenced) in the text, for errors
    bool defined = false;
  };
  // What continuing at a position can reach without reading a character.
  struct Closure {
    uint32_t first = 0, count = 0;  // into steps
    bool pops = false;              // can reach the end of the alternative
  };
  // One reachable class: push conts (bottom first), then the class position on top.
  struct Step {
    uint32_t chars_pos, conts_first, conts_count;
  };

  std::vector<Element> elements;
  std::vector<CharClass> classes;
  std::vector<Range> ranges;
  std::vector<Rule> rules;
  uint32_t root = 0;
  std::vector<Closure> closure;     // per element position; only references use theirs
  std::vector<Closure> rule_start;  // per rule: the union over its alternatives
  std::vector<Step> steps;
  std::vector<uint32_t> conts;

  const CharClass& class_at(uint32_t pos) const { return classes[elements[pos].value]; }

  bool contains(const CharClass& c, uint32_t cp) const {
    if (cp < 128) return (c.ascii[cp >> 6] >> (cp & 63)) & 1;
    const Range* begin = ranges.data() + c.first;
    const Range* end = begin + c.count;
    const Range* it = std::upper_bound(begin, end, cp, [](uint32_t v, const Range& r) { return v < r.lo; });
    return it != begin && (it - 1)->hi >= cp;
  }

  bool intersects(const CharClass& c, uint32_t lo, uint32_t hi) const {
    const Range* begin = ranges.data() + c.first;
    const Range* end = begin + c.count;
    const Range* it = std::lower_bound(begin, end, lo, [](const Range& r, uint32_t v) { return r.hi < v; });
    return it != end && it->lo <= hi;
  }
};

namespace {

using Tables = Grammar::Tables;
using Element = Tables::Element;
using Sequence = std::vector<Element>;

bool is_name_char(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-' || c == '_';
}

int hex_value(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

// Sorts and merges ranges, negates them if asked, and adds the class; returns its id.
uint32_t add_class(Tables& t, std::vector<Tables::Range> ranges, bool negate) {
  std::sort(ranges.begin(), ranges.end(), [](const auto& a, const auto& b) { return a.lo < b.lo; });
  std::vector<Tables::Range> merged;
  for (const auto& r : ranges) {
    if (!merged.empty() && r.lo <= merged.back().hi + 1) {
      merged.back().hi = std::max(merged.back().hi, r.hi);
    } else {
      merged.push_back(r);
    }
  }
  if (negate) {
    std::vector<Tables::Range> complement;
    uint32_t next = 0;
    for (const auto& r : merged) {
      if (r.lo > next) complement.push_back({next, r.lo - 1});
      next = r.hi + 1;
    }
    if (next <= kMaxCodePoint) complement.push_back({next, kMaxCodePoint});
    merged.swap(complement);
  }
  Tables::CharClass c{{0, 0}, static_cast<uint32_t>(t.ranges.size()), static_cast<uint32_t>(merged.size()), false};
  for (const auto& r : merged) {
    for (uint32_t cp = r.lo; cp <= std::min<uint32_t>(r.hi, 127); ++cp) c.ascii[cp >> 6] |= uint64_t{1} << (cp & 63);
    // Surrogates never come out of valid UTF-8, so a class of only those can never match.
    if (r.lo < 0xD800 || r.hi > 0xDFFF) c.any_valid = true;
    t.ranges.push_back(r);
  }
  t.classes.push_back(c);
  return static_cast<uint32_t>(t.classes.size() - 1);
}

// Recursive-descent GBNF parser that fills Tables (rules and elements; closures come later).
class Parser {
 public:
  Parser(std::string_view text, Tables& t) : text_(text), t_(t) {}

  void parse() {
    skip_space(true);
    while (pos_ < text_.size()) parse_rule();
  }

  [[noreturn]] void error_at(size_t offset, const std::string& message) const {
    size_t line = 1, column = 1;
    for (size_t i = 0; i < offset && i < text_.size(); ++i) {
      if (text_[i] == '\n') {
        ++line;
        column = 1;
      } else if ((static_cast<uint8_t>(text_[i]) & 0xC0) != 0x80) {
        ++column;  // counts code points, not bytes
      }
    }
    fail("grammar: line {}, column {}: {}", line, column, message);
  }

  // The id of a named rule, created (undefined) at its first mention.
  uint32_t symbol(const std::string& name, size_t offset) {
    const auto it = ids_.find(name);
    if (it != ids_.end()) return it->second;
    const auto id = new_rule(name, offset);
    ids_.emplace(name, id);
    return id;
  }

  const std::unordered_map<std::string, uint32_t>& ids() const { return ids_; }

 private:
  bool at_end() const { return pos_ >= text_.size(); }
  char peek(size_t ahead = 0) const { return pos_ + ahead < text_.size() ? text_[pos_ + ahead] : '\0'; }

  // Skips blanks and comments; newlines only where the syntax allows them.
  void skip_space(bool newlines) { pos_ = space_end(pos_, newlines); }
  size_t space_end(size_t p, bool newlines) const {
    while (p < text_.size()) {
      const char c = text_[p];
      if (c == '#') {
        while (p < text_.size() && text_[p] != '\n' && text_[p] != '\r') ++p;
      } else if (c == ' ' || c == '\t' || (newlines && (c == '\n' || c == '\r'))) {
        ++p;
      } else {
        break;
      }
    }
    return p;
  }

  uint32_t new_rule(std::string name, size_t offset) {
    t_.rules.push_back({{}, std::move(name), offset, false});
    return static_cast<uint32_t>(t_.rules.size() - 1);
  }

  void count_elements(size_t n) {
    n_elements_ += n;
    if (n_elements_ > kMaxElements) error_at(pos_, fmt::format("grammar too large (over {} elements)", kMaxElements));
  }

  // Appends the alternatives as the rule's body (each ended by End).
  void define(uint32_t id, const std::vector<Sequence>& alts) {
    auto& rule = t_.rules[id];
    rule.defined = true;
    for (const auto& seq : alts) {
      rule.alts.push_back(static_cast<uint32_t>(t_.elements.size()));
      t_.elements.insert(t_.elements.end(), seq.begin(), seq.end());
      t_.elements.push_back({Tables::kEnd, 0});
    }
    count_elements(alts.size());
  }

  uint32_t generated_rule(const std::string& owner, size_t offset, const std::vector<Sequence>& alts) {
    const auto id = new_rule(owner + "-" + std::to_string(t_.rules.size()), offset);
    define(id, alts);
    return id;
  }

  void parse_rule() {
    const size_t start = pos_;
    const std::string name = parse_name("a rule name");
    skip_space(false);
    if (text_.substr(pos_, 3) != "::=") error_at(pos_, "expected '::=' after the rule name '" + name + "'");
    pos_ += 3;
    skip_space(true);
    const uint32_t id = symbol(name, start);
    if (t_.rules[id].defined) error_at(start, "rule '" + name + "' is defined twice");
    t_.rules[id].offset = start;
    const auto alts = parse_alternates(name, false, 0);
    define(id, alts);
    if (!at_end() && peek() != '\n' && peek() != '\r') error_at(pos_, "expected the end of the line, found " + describe_here());
    skip_space(true);
  }

  std::string parse_name(const char* what) {
    const size_t start = pos_;
    while (!at_end() && is_name_char(peek())) ++pos_;
    if (pos_ == start) error_at(pos_, std::string("expected ") + what + ", found " + describe_here());
    return std::string(text_.substr(start, pos_ - start));
  }

  std::string describe_here() const {
    if (at_end()) return "the end of the text";
    const char c = peek();
    if (c == '\n' || c == '\r') return "the end of the line";
    if (static_cast<uint8_t>(c) < 0x20 || static_cast<uint8_t>(c) >= 0x7F) return fmt::format("byte 0x{:02X}", static_cast<uint8_t>(c));
    return fmt::format("'{}'", c);
  }

  // alternatives := sequence ('|' sequence)*. At the top level a rule may also continue on a
  // new line that starts with '|'.
  std::vector<Sequence> parse_alternates(const std::string& owner, bool nested, int depth) {
    std::vector<Sequence> alts;
    alts.push_back(parse_sequence(owner, nested, depth));
    for (;;) {
      if (peek() == '|') {
        ++pos_;
        skip_space(true);
      } else if (!nested) {
        const size_t next = space_end(pos_, true);
        if (next >= text_.size() || text_[next] != '|') break;
        pos_ = next + 1;
        skip_space(true);
      } else {
        break;
      }
      alts.push_back(parse_sequence(owner, nested, depth));
    }
    return alts;
  }

  Sequence parse_sequence(const std::string& owner, bool nested, int depth) {
    Sequence seq;
    size_t item_start = 0;  // where the last item (what a repetition repeats) begins in seq
    bool have_item = false;
    for (;;) {
      const size_t at = pos_;
      const char c = peek();
      if (c == '"') {
        item_start = seq.size();
        parse_literal(seq);
      } else if (c == '[') {
        item_start = seq.size();
        seq.push_back({Tables::kChars, parse_class()});
      } else if (c == '.') {
        ++pos_;
        item_start = seq.size();
        seq.push_back({Tables::kChars, add_class(t_, {{0, kMaxCodePoint}}, false)});
      } else if (c == '(') {
        if (depth >= kMaxNesting) error_at(pos_, fmt::format("groups nested deeper than {}", kMaxNesting));
        ++pos_;
        skip_space(true);
        const auto alts = parse_alternates(owner, true, depth + 1);
        if (peek() != ')') error_at(pos_, "expected ')', found " + describe_here());
        ++pos_;
        item_start = seq.size();
        seq.push_back({Tables::kRef, generated_rule(owner, at, alts)});
      } else if (!at_end() && is_name_char(c)) {
        const std::string name = parse_name("a rule name");
        item_start = seq.size();
        seq.push_back({Tables::kRef, symbol(name, at)});
      } else if (c == '*' || c == '+' || c == '?' || c == '{') {
        if (!have_item) error_at(pos_, std::string("'") + c + "' has nothing before it to repeat");
        uint32_t min = 0, max = kNone;
        parse_repetition(min, max);
        repeat(seq, item_start, min, max, owner, at);
      } else if (c == '<' || (c == '!' && peek(1) == '<')) {
        error_at(pos_, "token references (<...>) are not supported");
      } else {
        break;
      }
      have_item = true;
      count_elements(1);
      skip_space(nested);
    }
    return seq;
  }

  // One character of a literal or class: an escape or a UTF-8 code point.
  uint32_t parse_char() {
    if (at_end()) error_at(pos_, "unexpected end of the text");
    const auto lead = static_cast<uint8_t>(peek());
    if (lead == '\\') return parse_escape();
    if (lead < 0x80) {
      ++pos_;
      return lead;
    }
    int length = (lead & 0xE0) == 0xC0 ? 2 : (lead & 0xF0) == 0xE0 ? 3 : (lead & 0xF8) == 0xF0 ? 4 : 0;
    uint32_t cp = length == 2 ? lead & 0x1F : length == 3 ? lead & 0x0F : lead & 0x07;
    for (int k = 1; k < length; ++k) {
      const auto b = static_cast<uint8_t>(peek(static_cast<size_t>(k)));
      if ((b & 0xC0) != 0x80) length = 0;
      cp = (cp << 6) | (b & 0x3F);
    }
    static constexpr uint32_t kMin[] = {0, 0, 0x80, 0x800, 0x10000};
    if (length == 0 || cp < kMin[length] || cp > kMaxCodePoint || (cp >= 0xD800 && cp <= 0xDFFF)) {
      error_at(pos_, "invalid UTF-8");
    }
    pos_ += static_cast<size_t>(length);
    return cp;
  }

  uint32_t parse_escape() {
    const size_t at = pos_;
    if (pos_ + 1 >= text_.size()) error_at(at, "unexpected end of the text after '\\'");
    const char kind = peek(1);
    pos_ += 2;
    switch (kind) {
      case 'n': return '\n';
      case 'r': return '\r';
      case 't': return '\t';
      case '\\': case '"': case '[': case ']': case '-': return static_cast<uint32_t>(kind);
      case 'x': return parse_hex(2, at);
      case 'u': return parse_hex(4, at);
      case 'U': return parse_hex(8, at);
      default: break;
    }
    const auto k = static_cast<uint8_t>(kind);
    error_at(at, k > 0x20 && k < 0x7F ? fmt::format("unknown escape '\\{}'", kind) : fmt::format("unknown escape '\\' + byte 0x{:02X}", k));
  }

  uint32_t parse_hex(int digits, size_t at) {
    uint32_t value = 0;
    for (int i = 0; i < digits; ++i) {
      const int v = hex_value(peek());
      if (v < 0) error_at(at, fmt::format("expected {} hex digits in the escape", digits));
      value = value * 16 + static_cast<uint32_t>(v);
      ++pos_;
    }
    if (value > kMaxCodePoint) error_at(at, fmt::format("code point U+{:X} is beyond U+10FFFF", value));
    return value;
  }

  void parse_literal(Sequence& seq) {
    const size_t start = pos_++;
    while (peek() != '"') {
      if (at_end() || peek() == '\n' || peek() == '\r') error_at(start, "unterminated string literal");
      const uint32_t cp = parse_char();
      seq.push_back({Tables::kChars, add_class(t_, {{cp, cp}}, false)});
      count_elements(1);
    }
    ++pos_;
  }

  uint32_t parse_class() {
    const size_t start = pos_++;
    const bool negate = peek() == '^';
    if (negate) ++pos_;
    std::vector<Tables::Range> ranges;
    while (peek() != ']') {
      if (at_end()) error_at(start, "unterminated character class");
      const size_t at = pos_;
      const uint32_t lo = parse_char();
      uint32_t hi = lo;
      if (peek() == '-' && peek(1) != ']' && pos_ + 1 < text_.size()) {
        ++pos_;
        hi = parse_char();
        if (hi < lo) error_at(at, fmt::format("reversed range U+{:04X}-U+{:04X} in a character class", lo, hi));
      }
      ranges.push_back({lo, hi});
    }
    ++pos_;
    if (ranges.empty()) error_at(start, "empty character class");
    return add_class(t_, std::move(ranges), negate);
  }

  uint32_t parse_count() {
    const size_t start = pos_;
    uint64_t value = 0;
    while (peek() >= '0' && peek() <= '9') {
      value = value * 10 + static_cast<uint64_t>(peek() - '0');
      if (value > kMaxRepeat) error_at(start, fmt::format("repetition count above {}", kMaxRepeat));
      ++pos_;
    }
    if (pos_ == start) error_at(pos_, "expected a number, found " + describe_here());
    return static_cast<uint32_t>(value);
  }

  // * + ? {m} {m,} {m,n}; max = kNone for no bound.
  void parse_repetition(uint32_t& min, uint32_t& max) {
    const char c = peek();
    ++pos_;
    if (c == '*') return;
    if (c == '+') {
      min = 1;
      return;
    }
    if (c == '?') {
      max = 1;
      return;
    }
    const size_t at = pos_ - 1;
    skip_space(false);
    min = parse_count();
    skip_space(false);
    if (peek() == ',') {
      ++pos_;
      skip_space(false);
      if (peek() != '}') max = parse_count();
      skip_space(false);
    } else {
      max = min;
    }
    if (peek() != '}') error_at(pos_, "expected '}', found " + describe_here());
    ++pos_;
    if (max != kNone && max < min) error_at(at, fmt::format("repetition {{{},{}}} has its maximum below its minimum", min, max));
  }

  // Replaces the item at seq[item_start..] by min copies and a chain for the optional rest:
  // x{2,4} becomes x x R2 with R2 ::= x R1 | "" and R1 ::= x | "" (right recursion, so the
  // matcher's stacks stay flat); x{2,} becomes x x S with S ::= x S | "".
  void repeat(Sequence& seq, size_t item_start, uint32_t min, uint32_t max, const std::string& owner, size_t at) {
    if (seq.size() == item_start) return;  // "" repeated is still ""
    Element item = seq[item_start];
    if (seq.size() - item_start > 1) {  // a literal of several characters: make it one rule
      item = {Tables::kRef, generated_rule(owner, at, {Sequence(seq.begin() + static_cast<ptrdiff_t>(item_start), seq.end())})};
    }
    seq.resize(item_start);
    count_elements(min);
    seq.insert(seq.end(), min, item);
    if (max == kNone) {
      const auto star = new_rule(owner + "-" + std::to_string(t_.rules.size()), at);
      define(star, {{item, {Tables::kRef, star}}, {}});
      seq.push_back({Tables::kRef, star});
      return;
    }
    uint32_t prev = kNone;
    for (uint32_t k = min; k < max; ++k) {
      Sequence body{item};
      if (prev != kNone) body.push_back({Tables::kRef, prev});
      prev = generated_rule(owner, at, {body, {}});
      count_elements(2);
    }
    if (prev != kNone) seq.push_back({Tables::kRef, prev});
  }

  std::string_view text_;
  Tables& t_;
  size_t pos_ = 0;
  size_t n_elements_ = 0;
  std::unordered_map<std::string, uint32_t> ids_;
};

// Computes every closure (see the top of this file), refusing left recursion and closures
// beyond kMaxClosureWords.
class ClosureBuilder {
 public:
  ClosureBuilder(Tables& t, const Parser& parser) : t_(t), parser_(parser) {}

  void build() {
    t_.closure.assign(t_.elements.size(), {});
    t_.rule_start.assign(t_.rules.size(), {});
    done_pos_.assign(t_.elements.size(), 0);
    order_rules();
    for (uint32_t p = 0; p < t_.elements.size(); ++p) {
      if (!done_pos_[p] && t_.elements[p].kind == Tables::kRef) t_.closure[p] = collect_and_store(p);
    }
  }

 private:
  struct Pending {
    uint32_t chars_pos, first, count;  // into tmp_conts_
  };

  // Depth-first over "rule A can start with rule B" (B reached before any character), without
  // recursion so that long chains of rules cannot overflow the stack. A rule's start closure is
  // computed once all the rules it can start with are done; meeting a rule in progress is left
  // recursion.
  void order_rules() {
    std::vector<uint8_t> state(t_.rules.size(), 0);  // 0 new, 1 in progress, 2 done
    struct Frame {
      uint32_t rule, alt, pos;
    };
    std::vector<Frame> stack;
    for (uint32_t r0 = 0; r0 < t_.rules.size(); ++r0) {
      if (state[r0]) continue;
      state[r0] = 1;
      stack.push_back({r0, 0, t_.rules[r0].alts[0]});
      while (!stack.empty()) {
        Frame& f = stack.back();
        const auto& alts = t_.rules[f.rule].alts;
        if (f.alt == alts.size()) {
          finish_rule(f.rule);
          state[f.rule] = 2;
          stack.pop_back();
          continue;
        }
        const Element e = t_.elements[f.pos];
        if (e.kind == Tables::kRef && state[e.value] != 2) {
          if (state[e.value] == 1) left_recursion(e.value);
          state[e.value] = 1;
          stack.push_back({e.value, 0, t_.rules[e.value].alts[0]});
          continue;
        }
        if (e.kind == Tables::kRef && t_.rule_start[e.value].pops) {
          ++f.pos;  // the rule can be empty: what follows is also at the start
          continue;
        }
        if (++f.alt < alts.size()) f.pos = alts[f.alt];
      }
    }
  }

  [[noreturn]] void left_recursion(uint32_t rule) const {
    const auto& r = t_.rules[rule];
    parser_.error_at(r.offset, "left recursion: rule '" + r.name +
                                   "' can start with itself (a * or + over something that can be empty does this too)");
  }

  void finish_rule(uint32_t rule) {
    std::vector<Pending> all;
    std::vector<uint32_t> all_conts;
    bool pops = false;
    for (const uint32_t start : t_.rules[rule].alts) {
      const auto c = collect_and_store(start);
      if (t_.elements[start].kind == Tables::kRef) t_.closure[start] = c;
      done_pos_[start] = 1;
      pops = pops || c.pops;
      for (uint32_t i = 0; i < c.count; ++i) {
        const auto& s = t_.steps[c.first + i];
        all.push_back({s.chars_pos, static_cast<uint32_t>(all_conts.size()), s.conts_count});
        all_conts.insert(all_conts.end(), t_.conts.begin() + s.conts_first, t_.conts.begin() + s.conts_first + s.conts_count);
      }
    }
    tmp_ = std::move(all);
    tmp_conts_ = std::move(all_conts);
    t_.rule_start[rule] = store(pops);
  }

  // Walks forward from pos through rules that can be empty, collecting every class reachable
  // before a character is read.
  Tables::Closure collect_and_store(uint32_t pos) {
    tmp_.clear();
    tmp_conts_.clear();
    for (uint32_t p = pos;; ++p) {
      const Element e = t_.elements[p];
      if (e.kind == Tables::kEnd) return store(true);
      if (e.kind == Tables::kChars) {
        tmp_.push_back({p, static_cast<uint32_t>(tmp_conts_.size()), 0});
        return store(false);
      }
      const auto& start = t_.rule_start[e.value];
      const bool tail = t_.elements[p + 1].kind == Tables::kEnd;  // nothing to return to: push nothing
      for (uint32_t i = 0; i < start.count; ++i) {
        const auto s = t_.steps[start.first + i];
        const auto first = static_cast<uint32_t>(tmp_conts_.size());
        if (!tail) tmp_conts_.push_back(p + 1);
        tmp_conts_.insert(tmp_conts_.end(), t_.conts.begin() + s.conts_first, t_.conts.begin() + s.conts_first + s.conts_count);
        tmp_.push_back({s.chars_pos, first, static_cast<uint32_t>(tmp_conts_.size()) - first});
        check_budget();
      }
      if (!start.pops) return store(false);
    }
  }

  void check_budget() const {
    if (t_.conts.size() + tmp_conts_.size() + 3 * (t_.steps.size() + tmp_.size()) > kMaxClosureWords) {
      fail("grammar: too large or too ambiguous (over {} entries in the table of how each position can begin; "
           "nested optional repetitions do this)", kMaxClosureWords);
    }
  }

  // Deduplicates tmp_ and appends it to the tables.
  Tables::Closure store(bool pops) {
    check_budget();
    auto conts_of = [&](const Pending& p) { return std::span<const uint32_t>(tmp_conts_.data() + p.first, p.count); };
    auto less = [&](const Pending& a, const Pending& b) {
      const auto ca = conts_of(a), cb = conts_of(b);
      if (a.chars_pos != b.chars_pos) return a.chars_pos < b.chars_pos;
      return std::lexicographical_compare(ca.begin(), ca.end(), cb.begin(), cb.end());
    };
    auto same = [&](const Pending& a, const Pending& b) {
      const auto ca = conts_of(a), cb = conts_of(b);
      return a.chars_pos == b.chars_pos && std::equal(ca.begin(), ca.end(), cb.begin(), cb.end());
    };
    std::sort(tmp_.begin(), tmp_.end(), less);
    Tables::Closure c{static_cast<uint32_t>(t_.steps.size()), 0, pops};
    for (size_t i = 0; i < tmp_.size(); ++i) {
      if (i > 0 && same(tmp_[i], tmp_[i - 1])) continue;
      const auto first = static_cast<uint32_t>(t_.conts.size());
      const auto conts = conts_of(tmp_[i]);
      t_.conts.insert(t_.conts.end(), conts.begin(), conts.end());
      t_.steps.push_back({tmp_[i].chars_pos, first, tmp_[i].count});
      ++c.count;
    }
    return c;
  }

  Tables& t_;
  const Parser& parser_;
  std::vector<uint8_t> done_pos_;
  std::vector<Pending> tmp_;
  std::vector<uint32_t> tmp_conts_;
};

}  // namespace

Grammar::Grammar(std::unique_ptr<Tables> tables) : tables_(std::move(tables)) {}
Grammar::~Grammar() = default;
size_t Grammar::rule_count() const { return tables_->rules.size(); }
size_t Grammar::element_count() const { return tables_->elements.size(); }

std::shared_ptr<const Grammar> Grammar::parse(std::string_view gbnf, std::string_view root) {
  if (gbnf.size() > kMaxGrammarBytes) fail("grammar: {} bytes is more than the {} allowed", gbnf.size(), kMaxGrammarBytes);
  auto t = std::make_unique<Tables>();
  Parser parser(gbnf, *t);
  parser.parse();
  for (const auto& rule : t->rules) {
    if (!rule.defined) parser.error_at(rule.offset, "undefined rule '" + rule.name + "'");
  }
  const auto it = parser.ids().find(std::string(root));
  if (it == parser.ids().end()) fail("grammar: no rule named '{}' (the start rule)", root);
  t->root = it->second;
  ClosureBuilder(*t, parser).build();
  return std::shared_ptr<const Grammar>(new Grammar(std::move(t)));
}

// ---------------------------------------------------------------------------------------------
// Matching.

namespace {

// Interned parse-stack nodes. Lookups go through an open-addressing table whose slots keep
// their key forever (until a rehash), so truncate() can drop the newest nodes cheaply: a slot
// whose node is gone, or was reused for another key, is simply refilled.
class StackArena {
 public:
  struct Node {
    uint32_t pos, parent;
  };

  size_t size() const { return nodes_.size(); }
  const Node& operator[](uint32_t i) const { return nodes_[i]; }

  uint32_t intern(uint32_t pos, uint32_t parent) {
    if ((used_ + 1) * 2 > slots_.size()) rehash();
    const uint64_t key = (uint64_t{pos} << 32) | parent;
    const size_t mask = slots_.size() - 1;
    for (size_t i = hash(key) & mask;; i = (i + 1) & mask) {
      Slot& s = slots_[i];
      if (s.index == kNone) {
        ++used_;
        s.key = key;
        return s.index = push(pos, parent);
      }
      if (s.key == key) {
        if (s.index < nodes_.size() && nodes_[s.index].pos == pos && nodes_[s.index].parent == parent) return s.index;
        return s.index = push(pos, parent);
      }
    }
  }

  void truncate(size_t n) {
    nodes_.resize(n);
    out_mark_.resize(n);
    pop_mark_.resize(n);
  }

  // Per-step marks: whether a node is already in the output set / already returned to.
  uint32_t next_generation() {
    if (++generation_ == 0) {
      std::fill(out_mark_.begin(), out_mark_.end(), 0);
      std::fill(pop_mark_.begin(), pop_mark_.end(), 0);
      generation_ = 1;
    }
    return generation_;
  }
  bool mark_out(uint32_t node) { return mark(out_mark_, node); }
  bool mark_pop(uint32_t node) { return mark(pop_mark_, node); }

 private:
  struct Slot {
    uint64_t key;
    uint32_t index = kNone;
  };

  static size_t hash(uint64_t key) { return static_cast<size_t>((key * 0x9E3779B97F4A7C15ull) >> 20); }

  bool mark(std::vector<uint32_t>& marks, uint32_t node) {
    if (marks[node] == generation_) return false;
    marks[node] = generation_;
    return true;
  }

  uint32_t push(uint32_t pos, uint32_t parent) {
    if (nodes_.size() >= kNone - 1) fail("grammar: parse state too large");
    nodes_.push_back({pos, parent});
    out_mark_.push_back(0);
    pop_mark_.push_back(0);
    return static_cast<uint32_t>(nodes_.size() - 1);
  }

  void rehash() {
    std::vector<Slot> live;
    for (const Slot& s : slots_) {
      if (s.index != kNone && s.index < nodes_.size() && ((uint64_t{nodes_[s.index].pos} << 32) | nodes_[s.index].parent) == s.key) {
        live.push_back(s);
      }
    }
    size_t capacity = 1024;
    while (capacity < live.size() * 4) capacity *= 2;
    slots_.assign(capacity, Slot{});
    for (const Slot& s : live) {
      size_t i = hash(s.key) & (capacity - 1);
      while (slots_[i].index != kNone) i = (i + 1) & (capacity - 1);
      slots_[i] = s;
    }
    used_ = live.size();
  }

  std::vector<Node> nodes_;
  std::vector<uint32_t> out_mark_, pop_mark_;
  std::vector<Slot> slots_;
  size_t used_ = 0;
  uint32_t generation_ = 0;
};

// A set of stacks (top node ids; kNone is the finished stack) and any incomplete UTF-8 bytes.
struct MatchState {
  std::vector<uint32_t> stacks;
  std::array<uint8_t, 4> pending{};
  uint8_t pending_len = 0, pending_need = 0;
};

// The length a UTF-8 lead byte announces, 0 when it cannot start a sequence.
int lead_length(uint8_t b) {
  if (b >= 0xC2 && b <= 0xDF) return 2;
  if (b >= 0xE0 && b <= 0xEF) return 3;
  if (b >= 0xF0 && b <= 0xF4) return 4;
  return 0;
}

// The code points a UTF-8 sequence of `need` bytes beginning with bytes[0..len) can still
// become, as up to two ranges around the surrogates; returns how many ranges (0: none).
int utf8_prefix_ranges(const uint8_t* bytes, int len, int need, Tables::Range out[2]) {
  static constexpr uint32_t kPayload[] = {0, 0, 0x1F, 0x0F, 0x07};
  static constexpr uint32_t kMin[] = {0, 0, 0x80, 0x800, 0x10000};
  static constexpr uint32_t kMax[] = {0, 0, 0x7FF, 0xFFFF, kMaxCodePoint};
  uint32_t v = bytes[0] & kPayload[need];
  for (int i = 1; i < len; ++i) v = (v << 6) | (bytes[i] & 0x3F);
  const int rest = 6 * (need - len);
  const uint32_t lo = std::max(v << rest, kMin[need]);
  const uint32_t hi = std::min((v << rest) | ((1u << rest) - 1), kMax[need]);
  int n = 0;
  if (lo <= hi && lo < 0xD800) out[n++] = {lo, std::min<uint32_t>(hi, 0xD7FF)};
  if (lo <= hi && hi > 0xDFFF) out[n++] = {std::max<uint32_t>(lo, 0xE000), hi};
  return n;
}

// The matcher states met during one trie walk, numbered, with the transitions found so far: a
// DFA built lazily. Subtrees mostly pass through the same few states (inside a JSON string every
// ordinary byte leads back to the same one), so most trie nodes cost one table lookup. Valid for
// one walk only: state ids name arena nodes that the walk drops at its end.
class LazyDfa {
 public:
  static constexpr uint32_t kUnknown = 0xFFFFFFFFu, kReject = 0xFFFFFFFEu;

  void clear() {
    ids_.clear();
    keys_.clear();
    next_.clear();
  }

  uint32_t& next(uint32_t state, uint8_t byte) { return next_[size_t{state} * 256 + byte]; }

  // The id of a state (equal sets of stacks in any order are one state).
  uint32_t intern(const MatchState& s) {
    sorted_ = s.stacks;
    std::sort(sorted_.begin(), sorted_.end());
    std::string key(6 + 4 * sorted_.size(), '\0');
    key[0] = static_cast<char>(s.pending_len);
    key[1] = static_cast<char>(s.pending_len ? s.pending_need : 0);  // stale without pending bytes
    std::memcpy(&key[2], s.pending.data(), s.pending_len);
    if (!sorted_.empty()) std::memcpy(&key[6], sorted_.data(), 4 * sorted_.size());
    const auto [it, added] = ids_.emplace(key, static_cast<uint32_t>(keys_.size()));
    if (added) {
      keys_.push_back(std::move(key));
      next_.resize(next_.size() + 256, kUnknown);
    }
    return it->second;
  }

  void load(uint32_t state, MatchState& out) const {
    const std::string& key = keys_[state];
    out.pending_len = static_cast<uint8_t>(key[0]);
    out.pending_need = static_cast<uint8_t>(key[1]);
    std::memcpy(out.pending.data(), &key[2], 4);
    out.stacks.resize((key.size() - 6) / 4);
    if (!out.stacks.empty()) std::memcpy(out.stacks.data(), &key[6], key.size() - 6);
  }

 private:
  std::unordered_map<std::string, uint32_t> ids_;
  std::vector<std::string> keys_;  // per id: pending bytes, then the sorted stacks
  std::vector<uint32_t> next_;     // per id, per byte: the next id, kReject or kUnknown
  std::vector<uint32_t> sorted_;
};

}  // namespace

// A byte trie over a vocabulary in preorder: a subtree is skipped by jumping to `end`.
struct TokenConstraint::VocabTrie {
  struct Node {
    uint32_t end;  // index after this node's subtree
    uint32_t tokens_first, tokens_count;
    uint32_t depth;  // 1 for a token's first byte
    uint8_t byte;
  };
  std::vector<Node> nodes;
  std::vector<int32_t> tokens;
  uint32_t max_depth = 0;
  std::shared_ptr<const std::vector<std::string>> text;  // keeps the cache key's address alive

  explicit VocabTrie(std::shared_ptr<const std::vector<std::string>> token_text);
  static std::shared_ptr<const VocabTrie> for_tokens(const std::shared_ptr<const std::vector<std::string>>& token_text);
};

struct GrammarMatcher::Impl {
  explicit Impl(const Tables& tables) : g(&tables) {
    arena.next_generation();
    uint32_t parent = kNone, pos = 0;
    if (emit(g->rule_start[g->root], parent, state.stacks)) pop(parent, pos, state.stacks);
  }

  bool run(std::string_view bytes, MatchState*& result);
  // run(), with the arena cut back to `base` if it throws (the caller decides on success).
  bool run_from(size_t base, std::string_view bytes, MatchState*& result) {
    try {
      return run(bytes, result);
    } catch (...) {
      arena.truncate(base);
      throw;
    }
  }
  bool step(const MatchState& in, uint8_t b, MatchState& out);
  void advance(const std::vector<uint32_t>& in, uint32_t cp, std::vector<uint32_t>& out);
  void expand(uint32_t pos, uint32_t parent, std::vector<uint32_t>& out);
  bool emit(const Tables::Closure& c, uint32_t parent, std::vector<uint32_t>& out);
  bool pop(uint32_t& parent, uint32_t& pos, std::vector<uint32_t>& out);
  void add(uint32_t node, std::vector<uint32_t>& out);
  bool feasible(const std::vector<uint32_t>& stacks, const MatchState& partial) const;
  void compact();
  void allowed_tokens(const TokenConstraint::VocabTrie& trie, uint8_t* allowed, size_t n_vocab);

  const Tables* g;
  StackArena arena;
  MatchState state;
  MatchState scratch[2];
  LazyDfa dfa;                  // allowed_tokens(): the states of one walk
  std::vector<uint32_t> path;   // allowed_tokens(): the state after each depth of the trie
  bool finished_added = false;
  size_t next_compact = 4096;
};

// Adds to `out` every stack that continuing at `pos` above `parent` reaches before the next
// character: the class there, or the classes a reference can begin with; and when the
// alternative can end, the same from the parent's continuation (and so on down). Each node is
// returned to at most once per step.
void GrammarMatcher::Impl::expand(uint32_t pos, uint32_t parent, std::vector<uint32_t>& out) {
  for (;;) {
    const auto kind = g->elements[pos].kind;
    if (kind == Tables::kChars) {
      add(arena.intern(pos, parent), out);
      return;
    }
    if (kind == Tables::kRef && !emit(g->closure[pos], parent, out)) return;
    if (!pop(parent, pos, out)) return;
  }
}

// Pushes the closure's stacks above `parent`; returns whether the closure can also end.
bool GrammarMatcher::Impl::emit(const Tables::Closure& c, uint32_t parent, std::vector<uint32_t>& out) {
  for (uint32_t i = 0; i < c.count; ++i) {
    const auto& s = g->steps[c.first + i];
    uint32_t node = parent;
    for (uint32_t k = 0; k < s.conts_count; ++k) node = arena.intern(g->conts[s.conts_first + k], node);
    add(arena.intern(s.chars_pos, node), out);
  }
  return c.pops;
}

// Returns from a finished alternative: to the parent's continuation (pos, parent updated), or,
// at the bottom, the finished stack. False when there is nothing (more) to expand.
bool GrammarMatcher::Impl::pop(uint32_t& parent, uint32_t& pos, std::vector<uint32_t>& out) {
  if (parent == kNone) {
    if (!finished_added) out.push_back(kNone);
    finished_added = true;
    return false;
  }
  if (!arena.mark_pop(parent)) return false;
  const auto node = arena[parent];
  pos = node.pos;
  parent = node.parent;
  return true;
}

void GrammarMatcher::Impl::add(uint32_t node, std::vector<uint32_t>& out) {
  if (!arena.mark_out(node)) return;
  out.push_back(node);
  if (out.size() > kMaxStacks) fail("grammar: over {} possible parses at once (the grammar is too ambiguous)", kMaxStacks);
}

void GrammarMatcher::Impl::advance(const std::vector<uint32_t>& in, uint32_t cp, std::vector<uint32_t>& out) {
  out.clear();
  arena.next_generation();
  finished_added = false;
  for (const uint32_t top : in) {
    if (top == kNone) continue;
    const auto node = arena[top];
    if (g->contains(g->class_at(node.pos), cp)) expand(node.pos + 1, node.parent, out);
  }
}

bool GrammarMatcher::Impl::feasible(const std::vector<uint32_t>& stacks, const MatchState& partial) const {
  Tables::Range ranges[2];
  const int n = utf8_prefix_ranges(partial.pending.data(), partial.pending_len, partial.pending_need, ranges);
  for (const uint32_t top : stacks) {
    if (top == kNone) continue;
    const auto& c = g->class_at(arena[top].pos);
    for (int i = 0; i < n; ++i) {
      if (g->intersects(c, ranges[i].lo, ranges[i].hi)) return true;
    }
  }
  return false;
}

// One byte: ASCII advances at once; a multi-byte sequence is held pending (checked against the
// classes it could still match) until its last byte.
bool GrammarMatcher::Impl::step(const MatchState& in, uint8_t b, MatchState& out) {
  if (in.pending_len == 0 && b < 0x80) {
    out.pending_len = 0;
    advance(in.stacks, b, out.stacks);
    return !out.stacks.empty();
  }
  if (in.pending_len == 0) {
    out.pending_need = static_cast<uint8_t>(lead_length(b));
    if (out.pending_need == 0) return false;
    out.pending_len = 0;
  } else {
    if ((b & 0xC0) != 0x80) return false;
    out.pending = in.pending;
    out.pending_len = in.pending_len;
    out.pending_need = in.pending_need;
  }
  out.pending[out.pending_len++] = b;
  if (out.pending_len < out.pending_need) {
    if (!feasible(in.stacks, out)) return false;
    out.stacks = in.stacks;
    return true;
  }
  Tables::Range cp[2];
  if (utf8_prefix_ranges(out.pending.data(), out.pending_len, out.pending_need, cp) == 0) return false;
  out.pending_len = 0;
  advance(in.stacks, cp[0].lo, out.stacks);
  return !out.stacks.empty();
}

// Runs the bytes from the current state; on success `result` is the final state (the current
// one for no bytes). New nodes stay in the arena either way: callers truncate what they drop.
bool GrammarMatcher::Impl::run(std::string_view bytes, MatchState*& result) {
  MatchState* in = &state;
  for (size_t i = 0; i < bytes.size(); ++i) {
    MatchState& out = scratch[i & 1];
    if (!step(*in, static_cast<uint8_t>(bytes[i]), out)) return false;
    in = &out;
  }
  result = in;
  return true;
}

// Copies the live stacks into a fresh arena: accepted text leaves dead nodes behind.
void GrammarMatcher::Impl::compact() {
  StackArena fresh;
  std::unordered_map<uint32_t, uint32_t> moved;
  std::vector<uint32_t> chain;
  for (uint32_t& top : state.stacks) {
    if (top == kNone) continue;
    chain.clear();
    uint32_t n = top;
    while (n != kNone && !moved.count(n)) {
      chain.push_back(n);
      n = arena[n].parent;
    }
    uint32_t parent = n == kNone ? kNone : moved[n];
    for (size_t i = chain.size(); i-- > 0;) {
      parent = fresh.intern(arena[chain[i]].pos, parent);
      moved[chain[i]] = parent;
    }
    top = parent;
  }
  arena = std::move(fresh);
  arena.next_generation();
  next_compact = std::max<size_t>(4096, arena.size() * 4);
}

// Depth-first over the trie with the state after each prefix, skipping a subtree at the first
// byte the grammar refuses; transitions go through a lazily built DFA. Nodes made on the way
// are dropped at the end.
void GrammarMatcher::Impl::allowed_tokens(const TokenConstraint::VocabTrie& trie, uint8_t* allowed, size_t n_vocab) {
  const size_t base = arena.size();
  struct Restore {
    StackArena& arena;
    size_t size;
    ~Restore() { arena.truncate(size); }
  } restore{arena, base};
  dfa.clear();
  path.resize(trie.max_depth + 1);
  path[0] = dfa.intern(state);
  const auto* nodes = trie.nodes.data();
  for (size_t i = 0; i < trie.nodes.size();) {
    const auto& node = nodes[i];
    const uint32_t from = path[node.depth - 1];
    uint32_t to = dfa.next(from, node.byte);
    if (to == LazyDfa::kUnknown) {
      dfa.load(from, scratch[0]);
      to = step(scratch[0], node.byte, scratch[1]) ? dfa.intern(scratch[1]) : LazyDfa::kReject;
      dfa.next(from, node.byte) = to;
    }
    if (to == LazyDfa::kReject) {
      i = node.end;
      continue;
    }
    path[node.depth] = to;
    for (uint32_t k = 0; k < node.tokens_count; ++k) {
      const auto id = static_cast<size_t>(trie.tokens[node.tokens_first + k]);
      if (id < n_vocab) allowed[id] = 1;
    }
    ++i;
  }
}

GrammarMatcher::GrammarMatcher(std::shared_ptr<const Grammar> grammar)
    : grammar_(std::move(grammar)), impl_(std::make_unique<Impl>(grammar_->tables())) {}
GrammarMatcher::~GrammarMatcher() = default;
GrammarMatcher::GrammarMatcher(const GrammarMatcher& other)
    : grammar_(other.grammar_), impl_(std::make_unique<Impl>(*other.impl_)) {}
GrammarMatcher& GrammarMatcher::operator=(const GrammarMatcher& other) {
  if (this != &other) {
    grammar_ = other.grammar_;
    impl_ = std::make_unique<Impl>(*other.impl_);
  }
  return *this;
}
GrammarMatcher::GrammarMatcher(GrammarMatcher&&) noexcept = default;
GrammarMatcher& GrammarMatcher::operator=(GrammarMatcher&&) noexcept = default;

bool GrammarMatcher::accept(std::string_view bytes) {
  const size_t base = impl_->arena.size();
  MatchState* result = nullptr;
  if (!impl_->run_from(base, bytes, result)) {
    impl_->arena.truncate(base);
    return false;
  }
  if (result != &impl_->state) std::swap(impl_->state, *result);
  if (impl_->arena.size() > impl_->next_compact) impl_->compact();
  return true;
}

bool GrammarMatcher::accepts(std::string_view bytes) const {
  const size_t base = impl_->arena.size();
  MatchState* result = nullptr;
  const bool ok = impl_->run_from(base, bytes, result);
  impl_->arena.truncate(base);
  return ok;
}

bool GrammarMatcher::complete() const {
  const auto& s = impl_->state;
  return s.pending_len == 0 && std::find(s.stacks.begin(), s.stacks.end(), kNone) != s.stacks.end();
}

bool GrammarMatcher::can_continue() const {
  const auto& s = impl_->state;
  if (s.pending_len > 0) return true;
  for (const uint32_t top : s.stacks) {
    if (top != kNone && impl_->g->class_at(impl_->arena[top].pos).any_valid) return true;
  }
  return false;
}

// ---------------------------------------------------------------------------------------------
// Token constraint.

TokenConstraint::VocabTrie::VocabTrie(std::shared_ptr<const std::vector<std::string>> token_text)
    : text(std::move(token_text)) {
  const auto& all = *text;
  std::vector<int32_t> order;
  for (size_t i = 0; i < all.size(); ++i) {
    if (!all[i].empty()) order.push_back(static_cast<int32_t>(i));
  }
  std::sort(order.begin(), order.end(), [&](int32_t a, int32_t b) { return all[a] < all[b]; });
  // Sorted order visits the trie in preorder: each token shares a prefix with the one before,
  // closes the nodes deeper than that prefix and opens its own.
  std::vector<uint32_t> open;  // node index per depth - 1
  std::string_view prev;
  for (const int32_t id : order) {
    const std::string_view s = all[static_cast<size_t>(id)];
    size_t common = 0;
    while (common < prev.size() && common < s.size() && prev[common] == s[common]) ++common;
    while (open.size() > common) {
      nodes[open.back()].end = static_cast<uint32_t>(nodes.size());
      open.pop_back();
    }
    for (size_t d = common; d < s.size(); ++d) {
      open.push_back(static_cast<uint32_t>(nodes.size()));
      nodes.push_back({0, 0, 0, static_cast<uint32_t>(d + 1), static_cast<uint8_t>(s[d])});
    }
    Node& last = nodes[open.back()];
    if (last.tokens_count == 0) last.tokens_first = static_cast<uint32_t>(tokens.size());
    ++last.tokens_count;  // equal texts are adjacent, so a node's tokens are contiguous
    tokens.push_back(id);
    max_depth = std::max(max_depth, static_cast<uint32_t>(s.size()));
    prev = s;
  }
  for (const uint32_t n : open) nodes[n].end = static_cast<uint32_t>(nodes.size());
}

std::shared_ptr<const TokenConstraint::VocabTrie> TokenConstraint::VocabTrie::for_tokens(
    const std::shared_ptr<const std::vector<std::string>>& token_text) {
  // Keyed by the vector's address: a trie holds its vector, so while a trie is cached its
  // address cannot be reused by another vocabulary. The last few stay alive even when no
  // constraint uses them, so a server that makes one constraint per request builds its trie
  // once (about 0.1 s for 151k tokens).
  constexpr size_t kKeep = 4;
  static std::mutex mutex;
  static std::vector<std::shared_ptr<const VocabTrie>> recent;  // most recent last
  std::lock_guard<std::mutex> lock(mutex);
  for (size_t i = 0; i < recent.size(); ++i) {
    if (recent[i]->text.get() != token_text.get()) continue;
    auto trie = recent[i];
    recent.erase(recent.begin() + static_cast<ptrdiff_t>(i));
    recent.push_back(trie);
    return trie;
  }
  auto trie = std::make_shared<const VocabTrie>(token_text);
  if (recent.size() == kKeep) recent.erase(recent.begin());
  recent.push_back(trie);
  return trie;
}

TokenConstraint::TokenConstraint(std::shared_ptr<const Grammar> grammar,
                                 std::shared_ptr<const std::vector<std::string>> token_text,
                                 std::vector<int32_t> end_tokens)
    : matcher_(std::move(grammar)), token_text_(std::move(token_text)), end_tokens_(std::move(end_tokens)) {
  if (!token_text_) fail("grammar: no token texts given");
  trie_ = VocabTrie::for_tokens(token_text_);
  std::sort(end_tokens_.begin(), end_tokens_.end());
}
TokenConstraint::~TokenConstraint() = default;
TokenConstraint::TokenConstraint(const TokenConstraint&) = default;
TokenConstraint& TokenConstraint::operator=(const TokenConstraint&) = default;
TokenConstraint::TokenConstraint(TokenConstraint&&) noexcept = default;
TokenConstraint& TokenConstraint::operator=(TokenConstraint&&) noexcept = default;

bool TokenConstraint::is_end(int32_t token) const {
  return std::binary_search(end_tokens_.begin(), end_tokens_.end(), token);
}

bool TokenConstraint::allows(int32_t token) const {
  if (is_end(token)) return matcher_.complete();
  if (token < 0 || static_cast<size_t>(token) >= token_text_->size()) return false;
  const auto& text = (*token_text_)[static_cast<size_t>(token)];
  return !text.empty() && matcher_.accepts(text);
}

void TokenConstraint::mask(float* logits, int n_vocab) const {
  if (n_vocab <= 0) return;
  allowed_.assign(static_cast<size_t>(n_vocab), 0);
  matcher_.impl_->allowed_tokens(*trie_, allowed_.data(), allowed_.size());
  const bool complete = matcher_.complete();
  for (const int32_t e : end_tokens_) {
    if (e >= 0 && e < n_vocab) allowed_[static_cast<size_t>(e)] = complete;
  }
  for (int i = 0; i < n_vocab; ++i) {
    if (!allowed_[static_cast<size_t>(i)]) logits[i] = -INFINITY;
  }
}

void TokenConstraint::accept(int32_t token) {
  if (is_end(token)) {
    if (!matcher_.complete()) fail("grammar: end token {} before the grammar is complete", token);
    return;
  }
  const bool known = token >= 0 && static_cast<size_t>(token) < token_text_->size();
  if (!known || (*token_text_)[static_cast<size_t>(token)].empty() || !matcher_.accept((*token_text_)[static_cast<size_t>(token)])) {
    fail("grammar: token {} is not allowed here", token);
  }
}

bool TokenConstraint::complete() const { return matcher_.complete(); }

}  // namespace bmoe
