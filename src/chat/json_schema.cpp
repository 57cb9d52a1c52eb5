// JSON Schema to GBNF (see json_schema.h for the subset and where the output is stricter).
//
// Each schema becomes a rule body; a sub-schema that is not a single rule name gets a rule of
// its own, named after its place (root-address-city). Shapes are chosen so the matcher stays
// cheap: no two whitespace rules next to each other, repetitions over things that cannot be
// empty, literal sets (enum) and key exclusions as tries, so the number of live parse stacks
// does not grow with the number of alternatives.
#include "chat/json_schema.h"

#include <cmath>
#include <cstdint>
#include <functional>
#include <map>
#include <optional>

#include <nlohmann/json.hpp>

#include "chat/schema_pattern.h"
#include "chat/schema_walk.h"
#include "core/error.h"

namespace bmoe {

using json = nlohmann::ordered_json;

namespace {

constexpr int64_t kMaxCount = 10000;      // minItems / minLength; a larger maximum is unbounded
constexpr int64_t kRepeatBudget = 100000; // all counted repetitions of one grammar together
constexpr size_t kMaxGrammarText = size_t{1} << 20;
constexpr size_t kMaxOptional = 256;      // optional properties of one object
constexpr int64_t kMaxMagnitude = 9999999999999999;  // 16 digits, as json-uint writes them
constexpr uint64_t kMaxMultipleOf = 100;  // multipleOf as digit states; above, the values are listed
constexpr int64_t kMaxListed = 256;       // multiples listed one by one

struct SharedRule {
  const char* name;
  const char* body;
  std::vector<const char*> uses;
};

const std::vector<SharedRule>& shared_rules() {
  static const std::vector<SharedRule> rules = {
      {"json-ws", R"(( " " | "\n" [ \t]{0,20} )?)", {}},
      {"json-value", R"(json-object | json-array | json-string | json-number | "true" | "false" | "null")",
       {"json-object", "json-array", "json-string", "json-number"}},
      {"json-object", R"("{" json-ws ( json-member ( json-ws "," json-ws json-member )* json-ws )? "}")",
       {"json-ws", "json-member"}},
      {"json-member", R"(json-string json-ws ":" json-ws json-value)", {"json-string", "json-ws", "json-value"}},
      {"json-array", R"("[" json-ws ( json-value ( json-ws "," json-ws json-value )* json-ws )? "]")",
       {"json-ws", "json-value"}},
      {"json-string", R"("\"" json-char* "\"")", {"json-char"}},
      // Raw characters but '"', '\' and controls; escapes, with \u surrogates only as valid pairs.
      {"json-char", R"([^"\\\x00-\x1F] | "\\" ( ["\\/bfnrt] | "u" json-unicode ))", {"json-unicode"}},
      {"json-unicode",
       R"([0-9a-cA-CeEfF] json-hex{3} | [dD] [0-7] json-hex{2} | [dD] [89abAB] json-hex{2} "\\u" [dD] [c-fC-F] json-hex{2})",
       {"json-hex"}},
      {"json-hex", "[0-9a-fA-F]", {}},
      {"json-uint", R"("0" | [1-9] [0-9]{0,15})", {}},
      {"json-number", R"("-"? json-uint ( "." [0-9]{1,16} )? ( [eE] [-+]? [0-9]{1,2} )?)", {"json-uint"}},
      {"json-integer", R"("-"? json-uint)", {"json-uint"}},
      {"json-boolean", R"("true" | "false")", {}},
      {"json-null", R"("null")", {}},
      {"json-fmt-date",
       R"([0-9]{4} "-" ( ( "0" [13578] | "1" [02] ) "-" ( "0" [1-9] | [12] [0-9] | "3" [01] ) | ( "0" [469] | "11" ) "-" ( "0" [1-9] | [12] [0-9] | "30" ) | "02" "-" ( "0" [1-9] | "1" [0-9] | "2" [0-8] ) ))",
       {}},
      {"json-fmt-time",
       R"(( [01] [0-9] | "2" [0-3] ) ":" [0-5] [0-9] ":" [0-5] [0-9] ( "." [0-9]{1,9} )? ( "Z" | [+-] ( [01] [0-9] | "2" [0-3] ) ":" [0-5] [0-9] ))",
       {}},
      {"json-fmt-uuid", R"([0-9a-fA-F]{8} "-" [0-9a-fA-F]{4} "-" [0-9a-fA-F]{4} "-" [0-9a-fA-F]{4} "-" [0-9a-fA-F]{12})", {}},
      {"json-fmt-octet", R"("25" [0-5] | "2" [0-4] [0-9] | "1" [0-9] [0-9] | [1-9] [0-9] | [0-9])", {}},
      {"json-fmt-ipv4", R"(json-fmt-octet "." json-fmt-octet "." json-fmt-octet "." json-fmt-octet)", {"json-fmt-octet"}},
      {"json-fmt-h16", "[0-9a-fA-F]{1,4}", {}},
      // Eight groups, or "::" with at most seven groups around it (to keep the rule short: after
      // one to six groups on the left, at most one on the right).
      {"json-fmt-ipv6",
       R"(json-fmt-h16 ( ":" json-fmt-h16 ){7} | "::" ( json-fmt-h16 ( ":" json-fmt-h16 ){0,6} )? | json-fmt-h16 ( ":" json-fmt-h16 ){0,5} "::" json-fmt-h16? | json-fmt-h16 ( ":" json-fmt-h16 ){6} "::")",
       {"json-fmt-h16"}},
      {"json-fmt-label", R"([a-zA-Z0-9] ( [a-zA-Z0-9-]{0,20} [a-zA-Z0-9] )?)", {}},
      {"json-fmt-hostname", R"(json-fmt-label ( "." json-fmt-label ){0,7})", {"json-fmt-label"}},
      // Inside what both RFC 5322 validators and the usual library patterns accept.
      {"json-fmt-email",
       R"([a-zA-Z0-9_+-]{1,32} ( "." [a-zA-Z0-9_+-]{1,32} ){0,3} "@" ( json-fmt-label "." ){1,4} [a-zA-Z]{2,10})",
       {"json-fmt-label"}},
      {"json-fmt-duration",
       R"("P" ( json-fmt-dur-date ( "T" json-fmt-dur-time )? | "T" json-fmt-dur-time | [0-9]{1,6} "W" ))",
       {"json-fmt-dur-date", "json-fmt-dur-time"}},
      {"json-fmt-dur-date",
       R"([0-9]{1,6} "Y" ( [0-9]{1,6} "M" )? ( [0-9]{1,6} "D" )? | [0-9]{1,6} "M" ( [0-9]{1,6} "D" )? | [0-9]{1,6} "D")", {}},
      {"json-fmt-dur-time",
       R"([0-9]{1,6} "H" ( [0-9]{1,6} "M" )? ( [0-9]{1,6} "S" )? | [0-9]{1,6} "M" ( [0-9]{1,6} "S" )? | [0-9]{1,6} "S")", {}},
  };
  return rules;
}

std::string join(const std::vector<std::string>& parts, const char* sep) {
  std::string out;
  for (size_t i = 0; i < parts.size(); ++i) {
    if (i) out += sep;
    out += parts[i];
  }
  return out;
}

std::string alternatives(const std::vector<std::string>& alts) {
  return alts.size() == 1 ? alts[0] : "( " + join(alts, " | ") + " )";
}

std::string seq(std::initializer_list<std::string> parts) {
  std::string out;
  for (const auto& p : parts) {
    if (p.empty()) continue;
    if (!out.empty()) out += ' ';
    out += p;
  }
  return out;
}

// A code point as it may appear inside [...] or "..." in GBNF.
std::string gbnf_char(uint32_t cp) {
  if ((cp >= 'a' && cp <= 'z') || (cp >= 'A' && cp <= 'Z') || (cp >= '0' && cp <= '9')) return std::string(1, static_cast<char>(cp));
  if (cp <= 0xFFFF) return fmt::format("\\u{:04X}", cp);
  return fmt::format("\\U{:08X}", cp);
}

// Decodes valid UTF-8 (nlohmann's parser guarantees it for strings it produced).
std::vector<uint32_t> code_points(std::string_view s) {
  std::vector<uint32_t> out;
  for (size_t i = 0; i < s.size();) {
    const auto b = static_cast<uint8_t>(s[i]);
    const int n = b < 0x80 ? 1 : (b & 0xE0) == 0xC0 ? 2 : (b & 0xF0) == 0xE0 ? 3 : (b & 0xF8) == 0xF0 ? 4 : 1;
    uint32_t cp = n == 1 ? b : n == 2 ? b & 0x1F : n == 3 ? b & 0x0F : b & 0x07;
    for (int k = 1; k < n && i + static_cast<size_t>(k) < s.size(); ++k) cp = (cp << 6) | (static_cast<uint8_t>(s[i + static_cast<size_t>(k)]) & 0x3F);
    out.push_back(n == 1 && b >= 0x80 ? 0xFFFD : cp);
    i += static_cast<size_t>(n);
  }
  return out;
}

size_t utf8_length(char lead) {
  const auto b = static_cast<uint8_t>(lead);
  return b < 0xC0 ? 1 : b < 0xE0 ? 2 : b < 0xF0 ? 3 : 4;
}

bool is_rule_name(std::string_view s) {
  return !s.empty() && std::all_of(s.begin(), s.end(), [](char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-';
  });
}

std::string dump(const json& value) { return value.dump(-1, ' ', false, json::error_handler_t::replace); }

// Decimal digit strings without sign whose value is a multiple of `k` (k = 1: every value),
// as GBNF. Walks the digits left to right with the prefix's remainder modulo k as the state
// (while a prefix still equals the low or high bound's, that is part of the state too); the
// states once both bounds are left behind are shared rules, so the grammar has at most
// 16 * k of them.
class DigitRanges {
 public:
  DigitRanges(uint64_t k, std::function<std::string(const std::string&)> add_rule)
      : k_(k), add_rule_(std::move(add_rule)) {}

  // The strings of one length between a and b (same length, a <= b); nullopt when none.
  std::optional<std::string> same_length(const std::string& a, const std::string& b) {
    a_ = a;
    b_ = b;
    return state(0, 0, true, true);
  }

  static constexpr uint64_t kNoHigh = UINT64_MAX;

  // Magnitudes from lo to hi (kNoHigh: up to 16 digits), no leading zeros; nullopt when none.
  std::optional<std::string> magnitudes(uint64_t lo, uint64_t high) {
    std::vector<std::string> alts;
    const bool bounded = high != kNoHigh;
    const int first = digit_count(lo);
    const int last = bounded ? digit_count(high) : 16;
    if (!bounded && k_ == 1) {  // the common case stays one short body
      const auto head = same_length(std::to_string(lo), std::string(static_cast<size_t>(first), '9'));
      if (head) alts.push_back(*head);
      if (first < 16) alts.push_back(fmt::format("[1-9] [0-9]{{{},15}}", first));
      return alternatives(alts);
    }
    for (int n = first; n <= last; ++n) {
      const uint64_t a = n == first ? lo : power10(n - 1);
      const uint64_t b = bounded && n == last ? high : power10(n) - 1;
      if (const auto body = same_length(std::to_string(a), std::to_string(b))) alts.push_back(*body);
    }
    if (alts.empty()) return std::nullopt;
    return alternatives(alts);
  }

 private:
  static int digit_count(uint64_t v) { return static_cast<int>(std::to_string(v).size()); }
  static uint64_t power10(int n) {
    uint64_t p = 1;
    while (n-- > 0) p *= 10;
    return p;
  }

  // What may follow a prefix of length pos with remainder rem (tight_*: the prefix equals the
  // bound's). "" is the empty sequence.
  std::optional<std::string> state(size_t pos, uint64_t rem, bool tight_lo, bool tight_hi) {
    const size_t n = a_.size();
    if (!tight_lo && !tight_hi) return free(n - pos, rem);
    if (pos == n) return rem == 0 ? std::optional<std::string>("") : std::nullopt;
    const int lo = tight_lo ? a_[pos] - '0' : 0, hi = tight_hi ? b_[pos] - '0' : 9;
    std::vector<std::string> alts;
    std::map<uint64_t, std::string> middle;  // digits that leave both bounds, by next remainder
    for (int d = lo; d <= hi; ++d) {
      const bool next_lo = tight_lo && d == lo, next_hi = tight_hi && d == hi;
      const uint64_t next_rem = (rem * 10 + static_cast<uint64_t>(d)) % k_;
      if (!next_lo && !next_hi) {
        middle[next_rem] += static_cast<char>('0' + d);
        continue;
      }
      if (const auto rest = state(pos + 1, next_rem, next_lo, next_hi)) alts.push_back(step(std::string(1, static_cast<char>('0' + d)), *rest));
    }
    for (const auto& [next_rem, digits] : middle) {
      if (const auto rest = free(n - pos - 1, next_rem)) alts.push_back(step(digits, *rest));
    }
    if (alts.empty()) return std::nullopt;
    return alts.size() == 1 ? alts[0] : "( " + join(alts, " | ") + " )";
  }

  // Any `left` digits that bring remainder rem to 0; a shared rule per (left, rem).
  std::optional<std::string> free(size_t left, uint64_t rem) {
    if (left == 0) return rem == 0 ? std::optional<std::string>("") : std::nullopt;
    if (k_ == 1) return left == 1 ? std::string("[0-9]") : fmt::format("[0-9]{{{}}}", left);
    const auto key = std::make_pair(left, rem);
    if (const auto it = free_rules_.find(key); it != free_rules_.end()) return it->second;
    std::map<uint64_t, std::string> by_next;
    for (int d = 0; d <= 9; ++d) by_next[(rem * 10 + static_cast<uint64_t>(d)) % k_] += static_cast<char>('0' + d);
    std::vector<std::string> alts;
    for (const auto& [next_rem, digits] : by_next) {
      if (const auto rest = free(left - 1, next_rem)) alts.push_back(step(digits, *rest));
    }
    std::optional<std::string> out;
    if (!alts.empty()) out = left == 1 ? join(alts, " | ") : add_rule_(join(alts, " | "));
    if (out && left == 1 && alts.size() > 1) out = "( " + *out + " )";
    free_rules_[key] = out;
    return out;
  }

  // A digit set (ascending), then what follows it.
  static std::string step(const std::string& digits, const std::string& rest) {
    std::string head;
    if (digits.size() == 1) {
      head = "\"" + digits + "\"";
    } else if (digits.back() - digits.front() + 1 == static_cast<int>(digits.size())) {
      head = fmt::format("[{}-{}]", digits.front(), digits.back());
    } else {
      head = "[" + digits + "]";
    }
    return rest.empty() ? head : head + " " + rest;
  }

  uint64_t k_;
  std::function<std::string(const std::string&)> add_rule_;
  std::string a_, b_;
  std::map<std::pair<size_t, uint64_t>, std::optional<std::string>> free_rules_;
};

// Magnitudes from lo to hi (no hi: up to 16 digits), any value.
std::string uint_range(int64_t lo, std::optional<int64_t> hi) {
  DigitRanges ranges(1, nullptr);
  return ranges.magnitudes(static_cast<uint64_t>(lo), hi ? static_cast<uint64_t>(*hi) : DigitRanges::kNoHigh).value();
}

// A bound of a number range: a whole value, inclusive or not.
struct Bound {
  int64_t value;
  bool exclusive;
};

// Magnitudes m = I.F (I the integer part, F the fraction) between whole bounds a and b, by the
// integer part: I strictly between them takes any fraction; I == a needs a non-zero fraction
// when a is exclusive; I == b needs a zero fraction (b inclusive) or is out (b exclusive). No
// exponent: it would break the comparison on the integer part.
std::string magnitude_range(Bound a, const Bound* b) {  // b null: no upper bound
  const std::string frac = R"(( "." [0-9]{1,16} )?)";
  const int64_t any_lo = a.exclusive ? a.value + 1 : a.value;
  std::vector<std::string> alts;
  if (!b || any_lo <= b->value - 1) {
    alts.push_back(seq({uint_range(any_lo, b ? std::optional<int64_t>(b->value - 1) : std::nullopt), frac}));
  }
  if (a.exclusive && (!b || a.value < b->value)) {
    alts.push_back(seq({JsonGrammarBuilder::literal(std::to_string(a.value)), R"("." "0"{0,15} [1-9] [0-9]{0,15})"}));
  }
  if (b && !b->exclusive && (b->value > a.value || !a.exclusive)) {
    alts.push_back(seq({JsonGrammarBuilder::literal(std::to_string(b->value)), R"(( "." "0"{1,16} )?)"}));
  }
  return alts.empty() ? "" : alternatives(alts);
}

// Numbers between whole bounds: the non-negative ones as magnitudes, the negative ones as "-"
// and a magnitude with the bounds mirrored. "" when none.
std::string number_range(std::optional<Bound> lo, std::optional<Bound> hi) {
  std::vector<std::string> alts;
  if (!hi || hi->value > 0 || (hi->value == 0 && !hi->exclusive)) {
    const Bound a = lo && lo->value >= 0 ? *lo : Bound{0, false};
    if (const auto m = magnitude_range(a, hi ? &*hi : nullptr); !m.empty()) alts.push_back(m);
  }
  if (!lo || lo->value < 0) {
    const Bound a = hi && hi->value <= 0 ? Bound{-hi->value, hi->exclusive} : Bound{0, false};
    const Bound b = lo ? Bound{-lo->value, lo->exclusive} : Bound{0, false};
    if (const auto m = magnitude_range(a, lo ? &b : nullptr); !m.empty()) alts.push_back(seq({"\"-\"", m}));
  }
  return alts.empty() ? "" : alternatives(alts);
}

}  // namespace

// One add_schema call: walks a schema document and adds its rules to the builder.
// The JSON syntax of the one schema walk (chat/schema_walk.h): GBNF for JSON values.
class SchemaConverter final : public SchemaWalk {
 public:
  using StringText = JsonGrammarBuilder::StringText;

  SchemaConverter(JsonGrammarBuilder& b, const json& document) : SchemaWalk(document), b_(b) {}

  // A rule body for the schema's values.
  std::string body(const json& s, const std::string& name) { return walk(s, name); }

 private:
  template <typename... Args>
  [[noreturn]] void error(fmt::format_string<Args...> format, Args&&... args) const {
    refuse(fmt::format(format, std::forward<Args>(args)...));
  }

  [[noreturn]] void refuse(const std::string& what) const override {
    const std::string where = path().empty() ? "" : " at " + join(path(), "/");
    fail("JSON schema{}: {}", where, what);
  }

  void check_keywords(const json& s) override {
    for (const auto& [k, v] : s.items()) {
      if (is_unsupported_keyword(k)) error("'{}' is not supported", k);
      if (k == "uniqueItems" && v != json(false)) error("'uniqueItems' is not supported");
    }
  }

  std::string any_value() override { return b_.shared_rule("json-value"); }
  std::string either(const std::vector<std::string>& alts) override { return join(alts, " | "); }
  std::string branch(const json& s, const std::string& name) override { return item(s, name); }

  std::string new_ref_rule(const std::string& ref) override {
    const std::string rule = b_.unique_name("ref-" + ref.substr(ref.rfind('/') + 1));
    ref_slots_[rule] = b_.reserve_rule(rule);
    return rule;
  }
  void define_ref_rule(const std::string& rule, std::string body) override {
    check_size(body.size());
    b_.rules_[ref_slots_.at(rule)].second = std::move(body);
  }

  // A single sequence item for the schema: a rule name (a new rule when the body is more).
  std::string item(const json& s, const std::string& name) {
    const std::string b = walk(s, name);
    return is_rule_name(b) ? b : add_rule(name, b);
  }

  std::string add_rule(const std::string& name, const std::string& body) {
    const std::string rule = b_.unique_name(name);
    b_.rules_[b_.reserve_rule(rule)].second = body;
    check_size(body.size());
    return rule;
  }

  void check_size(size_t more) {
    text_size_ += more;
    if (text_size_ > kMaxGrammarText) error("the grammar would be over {} bytes", kMaxGrammarText);
  }

  void spend_repeats(int64_t n) {
    repeats_ += n;
    if (repeats_ > kRepeatBudget) error("minItems/maxItems/minLength/maxLength add up to over {}", kRepeatBudget);
  }

  std::string typed_branch(const std::string& type, const json& s, const std::string& name) override {
    const std::string b = typed(type, s, name);
    return is_rule_name(b) ? b : add_rule(name, b);
  }

  std::string typed(const std::string& type, const json& s, const std::string& name) override {
    if (type == "null") return b_.shared_rule("json-null");
    if (type == "boolean") return b_.shared_rule("json-boolean");
    if (type == "integer") return integer(s, name);
    if (type == "number") return number(s, name);
    if (type == "string") return string(s);
    if (type == "array") return array(s, name);
    return object(s, name);
  }

  // A numeric keyword's exact value (long double holds every int64 and double).
  std::optional<long double> read_number(const json& s, const char* key) {
    if (!s.contains(key)) return std::nullopt;
    const json& v = s[key];
    if (!v.is_number()) error("'{}' must be a number", key);
    const long double d = v.is_number_unsigned() ? static_cast<long double>(v.get<uint64_t>())
                          : v.is_number_integer() ? static_cast<long double>(v.get<int64_t>())
                                                  : static_cast<long double>(v.get<double>());
    if (!std::isfinite(d)) error("'{}' must be finite", key);
    return d;
  }

  // Draft 4 writes exclusiveMinimum as a flag on minimum, later drafts as a number.
  bool exclusive_flag(const json& s, const char* key) {
    return s.contains(key) && s[key].is_boolean() && s[key].get<bool>();
  }
  std::optional<long double> exclusive_bound(const json& s, const char* key) {
    if (!s.contains(key) || s[key].is_boolean()) return std::nullopt;
    return read_number(s, key);
  }

  // A whole lower bound as written values go: below -16 digits it bounds nothing bmoe writes.
  std::optional<int64_t> whole_low(long double v, const char* key) {
    if (v < -static_cast<long double>(kMaxMagnitude)) return std::nullopt;
    if (v > static_cast<long double>(kMaxMagnitude)) error("'{}' {} needs more than 16 digits", key, static_cast<double>(v));
    return static_cast<int64_t>(v);
  }
  std::optional<int64_t> whole_high(long double v, const char* key) {
    if (v > static_cast<long double>(kMaxMagnitude)) return std::nullopt;
    if (v < -static_cast<long double>(kMaxMagnitude)) error("'{}' {} needs more than 16 digits", key, static_cast<double>(v));
    return static_cast<int64_t>(v);
  }

  // The whole values an integer may take: [lo, hi], each end optional.
  std::pair<std::optional<int64_t>, std::optional<int64_t>> integer_bounds(const json& s) {
    std::optional<int64_t> lo, hi;
    auto raise = [&](long double v, const char* key) {
      if (const auto w = whole_low(v, key)) lo = lo ? std::max(*lo, *w) : *w;
    };
    auto lower = [&](long double v, const char* key) {
      if (const auto w = whole_high(v, key)) hi = hi ? std::min(*hi, *w) : *w;
    };
    if (const auto m = read_number(s, "minimum")) raise(exclusive_flag(s, "exclusiveMinimum") ? std::floor(*m) + 1 : std::ceil(*m), "minimum");
    if (const auto m = read_number(s, "maximum")) lower(exclusive_flag(s, "exclusiveMaximum") ? std::ceil(*m) - 1 : std::floor(*m), "maximum");
    if (const auto m = exclusive_bound(s, "exclusiveMinimum")) raise(std::floor(*m) + 1, "exclusiveMinimum");
    if (const auto m = exclusive_bound(s, "exclusiveMaximum")) lower(std::ceil(*m) - 1, "exclusiveMaximum");
    if (lo && hi && *lo > *hi) error("no integer lies between the minimum and the maximum");
    return {lo, hi};
  }

  // multipleOf as a whole number k >= 1 (1 when absent).
  uint64_t whole_multiple(const json& s) {
    const auto m = read_number(s, "multipleOf");
    if (!m) return 1;
    if (*m <= 0 || *m != std::floor(*m)) error("'multipleOf' {} is only supported as a whole number above 0", static_cast<double>(*m));
    if (*m > static_cast<long double>(kMaxMagnitude)) error("'multipleOf' {} needs more than 16 digits", static_cast<double>(*m));
    return static_cast<uint64_t>(*m);
  }

  std::string integer(const json& s, const std::string& name) {
    const auto [lo, hi] = integer_bounds(s);
    const uint64_t k = whole_multiple(s);
    if (k > kMaxMultipleOf) return listed_multiples(lo, hi, k, name);
    if (!lo && !hi && k == 1) return b_.shared_rule("json-integer");
    DigitRanges ranges(k, [&](const std::string& body) { return add_rule(name + "-digits", body); });
    std::vector<std::string> alts;
    if (!hi || *hi >= 0) {
      const uint64_t hi_mag = hi ? static_cast<uint64_t>(*hi) : DigitRanges::kNoHigh;
      if (const auto m = ranges.magnitudes(lo && *lo > 0 ? static_cast<uint64_t>(*lo) : 0, hi_mag)) alts.push_back(*m);
    }
    if (!lo || *lo < 0) {
      const uint64_t mag_lo = hi && *hi < 0 ? static_cast<uint64_t>(-*hi) : 1;
      const uint64_t mag_hi = lo ? static_cast<uint64_t>(-*lo) : DigitRanges::kNoHigh;
      if (const auto m = ranges.magnitudes(mag_lo, mag_hi)) alts.push_back(seq({"\"-\"", *m}));
    }
    if (alts.empty()) error("no multiple of {} lies between the minimum and the maximum", k);
    return alternatives(alts);
  }

  // A large multipleOf: the multiples in a short bounded range, listed.
  std::string listed_multiples(std::optional<int64_t> lo, std::optional<int64_t> hi, uint64_t k, const std::string& name) {
    const auto step = static_cast<int64_t>(k);
    if (!lo || !hi || (*hi - *lo) / step > kMaxListed) {
      error("'multipleOf' {} above {} needs a minimum and a maximum with at most {} multiples between them", k, kMaxMultipleOf, kMaxListed);
    }
    std::vector<std::string> texts;
    const int64_t first = *lo >= 0 ? (*lo + step - 1) / step * step : -((-*lo) / step * step);
    for (int64_t v = first; v <= *hi; v += step) texts.push_back(std::to_string(v));
    if (texts.empty()) error("no multiple of {} lies between the minimum and the maximum", k);
    return literal_set(texts, name);
  }

  // Bounds on numbers are whole; a fractional bound is rounded inward (stricter, never wrong).
  std::string number(const json& s, const std::string& name) {
    if (s.contains("multipleOf")) return integer(s, name);  // whole multiples: integers are the valid subset
    std::optional<Bound> lo, hi;
    auto low = [&](long double m, bool exclusive, const char* key) {
      const bool whole = m == std::floor(m);
      const auto w = whole_low(whole ? m : std::ceil(m), key);
      if (w && (!lo || *w > lo->value || (*w == lo->value && exclusive && whole))) lo = Bound{*w, exclusive && whole};
    };
    auto high = [&](long double m, bool exclusive, const char* key) {
      const bool whole = m == std::floor(m);
      const auto w = whole_high(whole ? m : std::floor(m), key);
      if (w && (!hi || *w < hi->value || (*w == hi->value && exclusive && whole))) hi = Bound{*w, exclusive && whole};
    };
    if (const auto m = read_number(s, "minimum")) low(*m, exclusive_flag(s, "exclusiveMinimum"), "minimum");
    if (const auto m = read_number(s, "maximum")) high(*m, exclusive_flag(s, "exclusiveMaximum"), "maximum");
    if (const auto m = exclusive_bound(s, "exclusiveMinimum")) low(*m, true, "exclusiveMinimum");
    if (const auto m = exclusive_bound(s, "exclusiveMaximum")) high(*m, true, "exclusiveMaximum");
    if (!lo && !hi) return b_.shared_rule("json-number");
    const bool empty = lo && hi && (lo->value > hi->value || (lo->value == hi->value && (lo->exclusive || hi->exclusive)));
    const std::string body = empty ? "" : number_range(lo, hi);
    if (body.empty()) error("no number lies between the minimum and the maximum (fractional bounds are rounded inward to whole numbers)");
    return body;
  }

  // A count keyword (minItems...): a whole number >= 0.
  std::optional<int64_t> read_count(const json& s, const char* key) {
    if (!s.contains(key)) return std::nullopt;
    const json& v = s[key];
    if (!v.is_number() || v.get<double>() < 0 || v.get<double>() != std::floor(v.get<double>())) {
      error("'{}' must be a whole number >= 0", key);
    }
    return v.get<double>() > 1e15 ? int64_t{1000000000000000} : static_cast<int64_t>(v.get<double>());
  }

  // min and max of a count pair; max is nullopt when absent or too large to enforce.
  std::pair<int64_t, std::optional<int64_t>> counts(const json& s, const char* min_key, const char* max_key) {
    const int64_t min = read_count(s, min_key).value_or(0);
    std::optional<int64_t> max = read_count(s, max_key);
    if (min > kMaxCount) error("'{}' {} is above {}", min_key, min, kMaxCount);
    if (max && *max < min) error("'{}' is below '{}'", max_key, min_key);
    if (max && *max > kMaxCount) max.reset();
    spend_repeats(max ? *max : min);
    return {min, max};
  }

  static std::string repetition(int64_t min, std::optional<int64_t> max) {
    if (!max) return min == 0 ? "*" : min == 1 ? "+" : fmt::format("{{{},}}", min);
    if (min == *max) return fmt::format("{{{}}}", min);
    return fmt::format("{{{},{}}}", min, *max);
  }

  // The string formats bmoe writes, with the fewest and most characters each one's grammar writes.
 public:
  struct FormatInfo {
    const char* format;
    size_t min_chars;
    std::optional<size_t> max_chars;
  };
  static const FormatInfo* format_info(const std::string& format) {
    static const FormatInfo formats[] = {
        {"date", 10, 10},  {"time", 9, 24},       {"date-time", 20, 35},      {"uuid", 36, 36},
        {"ipv4", 7, 15},   {"ipv6", 2, 39},       {"hostname", 1, 183},       {"email", 6, std::nullopt},
        {"duration", 3, std::nullopt}};
    for (const auto& f : formats) {
      if (format == f.format) return &f;
    }
    return nullptr;
  }

 private:
  // minLength / maxLength beside a pattern or format: kept only when its grammar keeps to them.
  void check_lengths_fit(const std::string& what, size_t min_chars, std::optional<size_t> max_chars, int64_t min,
                         std::optional<int64_t> max) {
    if (static_cast<int64_t>(min_chars) >= min && (!max || (max_chars && static_cast<int64_t>(*max_chars) <= *max))) return;
    error("'minLength'/'maxLength' next to {} is not supported (its text has {} to {} characters)", what, min_chars,
          max_chars ? std::to_string(*max_chars) : "any number of");
  }

  std::string string(const json& s) {
    const std::string quote = "\"\\\"\"";
    const std::string text = string_text(s, StringText::Json);
    // A string with nothing to keep to: the shared rule (one rule for every such string).
    if (text == b_.shared_rule("json-char") + "*") return b_.shared_rule("json-string");
    return seq({quote, text, quote});
  }

 public:
  // What lies between a string's quotes: its pattern, format, minLength and maxLength.
  std::string string_text(const json& s, StringText mode) {
    const std::string format = s.contains("format") && s["format"].is_string() ? s["format"].get<std::string>() : "";
    const auto [min, max] = counts(s, "minLength", "maxLength");
    const FormatInfo* known = format_info(format);
    if (s.contains("pattern")) {
      if (const auto body = pattern_string(s["pattern"], min, max, known != nullptr, mode)) return *body;
    }
    if (known) {  // format grammars write no character that needs escaping or ends raw text
      check_lengths_fit("'format' " + format, known->min_chars, known->max_chars, min, max);
      if (format == "date-time") return seq({b_.shared_rule("json-fmt-date"), "\"T\"", b_.shared_rule("json-fmt-time")});
      return b_.shared_rule("json-fmt-" + format);
    }
    if (max && *max == 0) return "\"\"";
    return (mode == StringText::Json ? b_.shared_rule("json-char") : std::string("[^<]")) + repetition(min, max);
  }

 private:
  std::optional<std::string> pattern_string(const json& pattern, int64_t min, std::optional<int64_t> max, bool format_fallback,
                                            StringText mode) {
    if (!pattern.is_string()) error("'pattern' must be a string");
    PatternGrammar g;
    try {
      g = pattern_to_gbnf(pattern.get<std::string>(), mode == StringText::Json ? PatternText::Json : PatternText::Raw);
    } catch (const Error& e) {
      if (format_fallback) return std::nullopt;
      error("'pattern' {}: {}", dump(pattern), e.what());
    }
    if (!g.repeated_unit.empty() && (min > 0 || max)) {  // one repeated character: intersect the counts
      const int64_t lo = std::max(min, static_cast<int64_t>(g.min_chars));
      std::optional<int64_t> hi = max;
      if (g.max_chars) hi = hi ? std::min(*hi, static_cast<int64_t>(*g.max_chars)) : static_cast<int64_t>(*g.max_chars);
      if (hi && *hi < lo) error("no string matches 'pattern' {} within minLength/maxLength", dump(pattern));
      if (hi && *hi == 0) return std::string("\"\"");
      spend_repeats(hi ? *hi : lo);
      return g.repeated_unit + repetition(lo, hi);
    }
    check_lengths_fit("'pattern'", g.min_chars, g.max_chars, min, max);
    check_size(g.body.size());
    spend_repeats(static_cast<int64_t>(g.weight));
    return g.body;
  }

  std::string array(const json& s, const std::string& name) {
    const std::string ws = b_.shared_rule("json-ws");
    const std::string sep = ws + " \",\" " + ws;
    const json* tuple = nullptr;
    if (s.contains("prefixItems")) tuple = &s["prefixItems"];
    if (s.contains("items") && s["items"].is_array()) {
      if (tuple) error("both 'prefixItems' and a list in 'items'");
      tuple = &s["items"];
    }
    const Opened opened(*this);
    return tuple ? tuple_array(*tuple, s, name, ws, sep) : list_array(s, name, ws, sep);
  }

  std::string tuple_array(const json& tuple, const json& s, const std::string& name, const std::string& ws, const std::string& sep) {
    if (!tuple.is_array()) error("'prefixItems' must be a list");
    const auto [min, max] = counts(s, "minItems", "maxItems");
    const auto n = static_cast<int64_t>(tuple.size());
    if (n < min || (max && n > *max)) error("a tuple of {} items does not meet minItems/maxItems", n);
    if (n == 0) return seq({"\"[\"", ws, "\"]\""});
    std::vector<std::string> items;
    for (size_t i = 0; i < tuple.size(); ++i) {
      PathGuard g(*this, "prefixItems/" + std::to_string(i));
      items.push_back(item(tuple[i], name + "-" + std::to_string(i)));
    }
    return seq({"\"[\"", ws, join(items, (" " + sep + " ").c_str()), ws, "\"]\""});
  }

  std::string list_array(const json& s, const std::string& name, const std::string& ws, const std::string& sep) {
    auto [min, max] = counts(s, "minItems", "maxItems");
    const json items = s.contains("items") ? s["items"] : json(true);
    if (items == json(false)) {
      if (min > 0) error("'items' false with minItems above 0");
      max = 0;
    }
    if (max && *max == 0) return seq({"\"[\"", ws, "\"]\""});
    std::string element;
    {
      PathGuard g(*this, "items");
      element = item(items, name + "-item");
    }
    // The first element, then (sep element) for the rest of the count.
    const std::optional<int64_t> more_max = max ? std::optional<int64_t>(*max - 1) : std::nullopt;
    const std::string more = more_max && *more_max == 0 ? "" : "( " + sep + " " + element + " )" + repetition(min > 0 ? min - 1 : 0, more_max);
    if (min == 0) return seq({"\"[\"", ws, "(", element, more, ws, ")?", "\"]\""});
    return seq({"\"[\"", ws, element, more, ws, "\"]\""});
  }

  std::string object(const json& s, const std::string& name) {
    const std::string ws = b_.shared_rule("json-ws");
    const std::string sep = ws + " \",\" " + ws;
    if (s.contains("properties") && !s["properties"].is_object()) error("'properties' must be an object");
    if (s.contains("required") && !s["required"].is_array()) error("'required' must be a list");
    const json properties = s.contains("properties") ? s["properties"] : json::object();
    std::set<std::string> required;
    for (const auto& r : s.contains("required") ? s["required"] : json::array()) {
      if (!r.is_string()) error("'required' must list strings");
      required.insert(r.get<std::string>());
    }
    // Without additionalProperties no other keys are produced, unless nothing else is said.
    const bool free_form = !s.contains("properties") && !s.contains("required");
    const bool has_additional = s.contains("additionalProperties");
    const json additional = has_additional ? s["additionalProperties"] : json(free_form);
    if (!additional.is_boolean() && !additional.is_object()) error("'additionalProperties' must be a boolean or a schema");

    std::vector<std::string> required_kvs, optional_kvs;
    std::optional<Opened> opened(std::in_place, *this);
    std::vector<std::string> declared;
    for (const auto& [key, sub] : properties.items()) {
      declared.push_back(key);
      PathGuard g(*this, "properties/" + key);
      const std::string kv = seq({literal_json(json(key)), ws, "\":\"", ws, item(sub, name + "-" + key)});
      (required.count(key) ? required_kvs : optional_kvs).push_back(kv);
    }
    for (const auto& r : s.contains("required") ? s["required"] : json::array()) {
      const std::string key = r.get<std::string>();
      if (properties.contains(key) || std::find(declared.begin(), declared.end(), key) != declared.end()) continue;
      if (has_additional && additional == json(false)) error("required property '{}' is not allowed by additionalProperties false", key);
      declared.push_back(key);
      PathGuard g(*this, "required/" + key);
      const json& value = additional.is_object() ? additional : json(true);
      required_kvs.push_back(seq({literal_json(json(key)), ws, "\":\"", ws, item(value, name + "-" + key)}));
    }
    std::string extra;
    const bool no_names = s.contains("propertyNames") && s["propertyNames"] == json(false);
    if (additional != json(false) && !no_names) {
      const std::string key = extra_key(s, declared, name);
      PathGuard g(*this, "additionalProperties");
      extra = seq({key, ws, "\":\"", ws, item(additional, name + "-extra-value")});
    }
    opened.reset();
    if (optional_kvs.size() > kMaxOptional) error("more than {} optional properties in one object", kMaxOptional);
    const std::string members = object_members(required_kvs, optional_kvs, extra, sep, name);
    if (members.empty()) return seq({"\"{\"", ws, "\"}\""});
    return seq({"\"{\"", ws, "(", members, ws, ")" + std::string(required_kvs.empty() ? "?" : ""), "\"}\""});
  }

  // The key of a property beyond the declared ones, quotes included: any text but a declared
  // key, or what propertyNames allows (then nothing may be declared beside it: the grammar
  // cannot keep both apart; a key may repeat, which JSON parsers resolve to the last value).
  std::string extra_key(const json& s, const std::vector<std::string>& declared, const std::string& name) {
    const json names = s.contains("propertyNames") ? s["propertyNames"] : json(true);
    if (names == json(true)) {
      return seq({"\"\\\"\"", key_excluding(declared, name + "-extra-key"), "\"\\\"\""});
    }
    if (!declared.empty()) error("'propertyNames' next to 'properties' or 'required' is not supported (only with additionalProperties false)");
    PathGuard g(*this, "propertyNames");
    json key_schema = names;
    if (key_schema.is_object() && !key_schema.contains("type") && !key_schema.contains("$ref") &&
        !key_schema.contains("anyOf") && !key_schema.contains("oneOf") && !key_schema.contains("allOf")) {
      key_schema["type"] = "string";  // keys are strings whatever the schema says
    }
    return item(key_schema, name + "-key");
  }

  // Required members in order, then each optional one or none, then extra keys. The optional
  // ones share one separator: rest(k) ::= (sep choice(k))?, choice(k) ::= opt(k) rest(k+1) |
  // choice(k+1), so after a comma the live parses are one per remaining candidate.
  std::string object_members(const std::vector<std::string>& required, const std::vector<std::string>& optional,
                             const std::string& extra, const std::string& sep, const std::string& name) {
    const size_t m = optional.size();
    std::string rest = extra.empty() ? "" : add_rule(name + "-rest", "( " + sep + " " + extra + " )*");
    std::string choice = extra.empty() ? "" : add_rule(name + "-first", seq({extra, rest}));
    for (size_t k = m; k-- > 0;) {
      const std::string here = seq({optional[k], rest});
      choice = add_rule(name + "-choice", choice.empty() ? here : here + " | " + choice);
      rest = add_rule(name + "-rest", "( " + sep + " " + choice + " )?");
    }
    if (required.empty()) return choice;
    return seq({join(required, (" " + sep + " ").c_str()), rest});
  }

  // The characters of a JSON string (between the quotes) that do not spell any of `keys`: a
  // trie where every node may diverge with a character that is not a child, end (if no key ends
  // there), or follow a child; escapes only once the text can no longer spell a key.
  std::string key_excluding(const std::vector<std::string>& keys, const std::string& name) {
    const std::string chars = b_.shared_rule("json-char");
    if (keys.empty()) return chars + "*";
    struct Node {
      std::map<uint32_t, size_t> children;
      bool terminal = false;
    };
    std::vector<Node> nodes(1);
    for (const auto& key : keys) {
      size_t n = 0;
      for (const uint32_t cp : code_points(key)) {
        auto it = nodes[n].children.find(cp);
        if (it == nodes[n].children.end()) {
          it = nodes[n].children.emplace(cp, nodes.size()).first;
          nodes.emplace_back();
        }
        n = it->second;
      }
      nodes[n].terminal = true;
    }
    check_size(nodes.size() * 16);
    std::vector<std::string> rule_names(nodes.size());
    for (size_t n = nodes.size(); n-- > 0;) {  // children come after their parent
      const Node& node = nodes[n];
      std::vector<std::string> alts;
      if (node.children.empty()) {
        alts.push_back(chars + "+");  // a whole key: only a longer text differs
      } else {
        std::string diverge = "[^\"\\\\\\x00-\\x1F";
        for (const auto& [cp, child] : node.children) diverge += gbnf_char(cp);
        alts.push_back(diverge + "] " + chars + "*");
        for (const auto& [cp, child] : node.children) {
          if (cp == '"' || cp == '\\' || cp < 0x20) continue;  // needs an escape: not reachable raw
          alts.push_back("\"" + gbnf_char(cp) + "\" " + rule_names[child]);
        }
        if (!node.terminal) alts.push_back("\"\"");
      }
      rule_names[n] = add_rule(name, join(alts, " | "));
    }
    return rule_names[0];
  }

  // A GBNF literal for a JSON value's compact text.
  std::string literal_json(const json& value) {
    std::string text = dump(value);
    check_size(text.size());
    return JsonGrammarBuilder::literal(text);
  }

  // enum / const: the values, as a trie of their compact JSON texts.
  std::string values(const json& allowed, const std::string& name) override {
    std::vector<std::string> texts;
    for (const auto& v : allowed) {
      texts.push_back(dump(v));
      check_size(texts.back().size());
    }
    return literal_set(texts, name);
  }

  // Alternatives between fixed texts, as a trie of rules (one per branching point).
  std::string literal_set(std::vector<std::string> texts, const std::string& name) {
    std::sort(texts.begin(), texts.end());
    texts.erase(std::unique(texts.begin(), texts.end()), texts.end());
    return trie_body(texts, 0, texts.size(), 0, name);
  }

  // texts[first, last) share their first `depth` bytes; the body for what follows.
  std::string trie_body(const std::vector<std::string>& texts, size_t first, size_t last, size_t depth, const std::string& name) {
    std::vector<std::string> alts;
    size_t i = first;
    if (texts[i].size() == depth) {
      alts.push_back("\"\"");
      ++i;
    }
    while (i < last) {
      // The run of texts with the same next character, then the bytes they all share, backed
      // off to a character boundary: literals never split a UTF-8 sequence.
      const std::string_view head = std::string_view(texts[i]).substr(depth, utf8_length(texts[i][depth]));
      size_t j = i + 1;
      while (j < last && std::string_view(texts[j]).substr(depth, head.size()) == head) ++j;
      size_t shared = depth + head.size();
      while (shared < texts[i].size() && shared < texts[j - 1].size() && texts[i][shared] == texts[j - 1][shared]) ++shared;
      while (shared > depth + head.size() && shared < texts[i].size() && (static_cast<uint8_t>(texts[i][shared]) & 0xC0) == 0x80) --shared;
      const std::string lit = JsonGrammarBuilder::literal(std::string_view(texts[i]).substr(depth, shared - depth));
      if (j - i == 1 && shared == texts[i].size()) {
        alts.push_back(lit);
      } else {
        const std::string rest = trie_body(texts, i, j, shared, name);
        alts.push_back(lit + " " + (rest.find_first_of(" |") == std::string::npos ? rest : add_rule(name, rest)));
      }
      i = j;
    }
    return join(alts, " | ");
  }

  JsonGrammarBuilder& b_;
  std::map<std::string, size_t> ref_slots_;  // a $ref's rule -> its place in the grammar
  size_t text_size_ = 0;
  int64_t repeats_ = 0;
};

JsonGrammarBuilder::JsonGrammarBuilder() {
  for (const auto& r : shared_rules()) taken_.insert(r.name);
}

std::string JsonGrammarBuilder::unique_name(const std::string& wanted) {
  std::string base;
  for (const char c : wanted) {
    base += ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-') ? c : '-';
    if (base.size() >= 64) break;
  }
  if (base.empty()) base = "rule";
  // Suffixes go on from the last one given for this base: converting a schema with thousands
  // of rules of one base stays linear.
  std::string name = base;
  int& next = next_suffix_[base];
  if (next < 2) next = 2;
  while (taken_.count(name)) name = base + "-" + std::to_string(next++);
  taken_.insert(name);
  return name;
}

size_t JsonGrammarBuilder::reserve_rule(const std::string& name) {
  rules_.emplace_back(name, "");
  return rules_.size() - 1;
}

std::string JsonGrammarBuilder::add_schema(const nlohmann::ordered_json& schema, const std::string& name) {
  const std::string rule = unique_name(name);
  const size_t slot = reserve_rule(rule);
  SchemaConverter converter(*this, schema);
  try {
    rules_[slot].second = converter.body(schema, rule);
  } catch (const nlohmann::json::exception& e) {
    fail("JSON schema: {}", e.what());
  }
  return rule;
}

std::string JsonGrammarBuilder::string_text(const nlohmann::ordered_json& schema, StringText mode) {
  SchemaConverter converter(*this, schema);
  try {
    return converter.string_text(schema, mode);
  } catch (const nlohmann::json::exception& e) {
    fail("JSON schema: {}", e.what());
  }
}

bool JsonGrammarBuilder::known_format(const std::string& format) { return SchemaConverter::format_info(format) != nullptr; }

void JsonGrammarBuilder::add_rule(const std::string& name, const std::string& body) {
  const bool valid = !name.empty() && std::all_of(name.begin(), name.end(), [](char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-';
  });
  if (!valid) fail("JSON schema: '{}' is not a rule name (letters, digits and '-')", name);
  if (taken_.count(name)) fail("JSON schema: the rule name '{}' is already used", name);
  taken_.insert(name);
  rules_.emplace_back(name, body);
}

std::string JsonGrammarBuilder::shared_rule(const std::string& name) {
  for (const auto& r : shared_rules()) {
    if (r.name != name) continue;
    if (added_shared_.insert(name).second) {
      rules_.emplace_back(name, r.body);
      for (const char* use : r.uses) shared_rule(use);
    }
    return name;
  }
  fail("JSON schema: no shared rule named '{}'", name);
}

std::string JsonGrammarBuilder::literal(std::string_view text) {
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

std::string JsonGrammarBuilder::gbnf() const {
  std::string out;
  for (const auto& [name, body] : rules_) out += name + " ::= " + body + "\n";
  return out;
}

std::string json_object_gbnf() {
  JsonGrammarBuilder b;
  b.add_rule("root", b.shared_rule("json-object"));
  return b.gbnf();
}

std::string json_schema_to_gbnf(const nlohmann::ordered_json& schema) {
  JsonGrammarBuilder b;
  b.add_schema(schema, "root");  // a new builder has "root" free
  return b.gbnf();
}

}  // namespace bmoe
