// JSON grammars for constrained sampling: GBNF (text/grammar.h) for any JSON object
// (response_format json_object) and for the JSON Schema subset clients send in response_format
// json_schema and in tool parameters.
//
// Supported keywords: type (object, array, string, number, integer, boolean, null, or a list),
// nullable (OpenAPI), properties, required, additionalProperties (false, true or a schema),
// propertyNames (the schema of the keys beyond properties: only where no property is declared
// beside extra keys), items (a schema, or a list as a tuple), prefixItems, minItems, maxItems,
// enum, const, anyOf, oneOf (generated as anyOf: the output matches at least one branch), allOf
// (merged: properties and required are combined, other keywords must agree), $ref to "#",
// "#/$defs/...", "#/definitions/..." or any JSON pointer inside the schema (recursion allowed),
// minLength, maxLength, pattern (chat/schema_pattern.h: an ECMA regex subset), format date /
// time / date-time / duration / email / hostname / ipv4 / ipv6 / uuid (other formats are
// annotations and ignored), minimum / maximum / exclusiveMinimum / exclusiveMaximum of any size
// (draft 4's boolean exclusiveMinimum / exclusiveMaximum too), multipleOf (whole numbers; on a
// number it makes the output an integer). Descriptive keywords (title, description, default,
// examples, $schema, $id, $comment, ...) and unknown ones are ignored. Keywords that change
// validity but are not supported (not, if/then/else, minProperties, patternProperties,
// uniqueItems: true, a pattern's lookaround, a fractional multipleOf, ...) fail with the keyword
// named.
//
// The output is stricter than the schema where that keeps the grammar simple; whatever the
// grammar accepts validates against the schema:
//  - properties come in the schema's order, required ones first, then the optional ones, each
//    optional; without additionalProperties no other keys are produced (a schema with no
//    properties and no additionalProperties allows any keys); extra keys never repeat a
//    declared one (and use no escapes while they could still spell one);
//  - whitespace is bounded: one space, or a newline and up to 20 spaces/tabs, between tokens, so
//    a constrained model cannot spin on whitespace; numbers have at most 16 integer digits, 16
//    fraction digits and 2 exponent digits, and no exponent when bounded; a bound beyond 16
//    digits bounds nothing bmoe writes (the safe-integer range +-(2^53 - 1) is exact); a
//    fractional bound on a number is rounded inward to a whole one;
//  - multipleOf k: the digits walk the remainders modulo k (k <= 100); above 100, the multiples
//    between a minimum and a maximum are listed (at most 256);
//  - dates give February at most 28 days, times no leap second, date-times an upper-case T;
//    emails, hostnames and IPv6 addresses take a common subset (dotted atoms of [A-Za-z0-9_+-],
//    labels of up to 22 characters, "::" with at most one group after it);
//  - a pattern is written as a whole match (anchored or not); beside a known format, a pattern
//    that cannot be converted (zod's email, with lookaheads) gives way to the format's grammar,
//    which lies inside what such library patterns accept; minLength / maxLength beside a pattern
//    or format are kept only where its text fits them, or bound the count when the whole pattern
//    is one repeated character class;
//  - with propertyNames, an extra key may repeat (JSON parsers keep the last value);
//  - maxItems / maxLength above 10000 are not enforced (treated as unbounded), minItems /
//    minLength above 10000 fail.
// Every failure is a bmoe::Error whose message starts "JSON schema:".
#pragma once

#include <map>
#include <set>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <nlohmann/json_fwd.hpp>

namespace bmoe {

// GBNF whose root is any JSON object (with nested values of any kind).
std::string json_object_gbnf();
// GBNF whose root matches the schema's JSON values.
std::string json_schema_to_gbnf(const nlohmann::ordered_json& schema);

// Builds one grammar from several schemas and hand-written rules, e.g. a tool-call grammar:
//   JsonGrammarBuilder b;
//   const auto args = b.add_schema(tool["parameters"], "get-weather-args");
//   b.add_rule("root", JsonGrammarBuilder::literal("{\"name\": \"get_weather\", \"arguments\": ") + " " + args + " \"}\"");
//   Grammar::parse(b.gbnf());
// Rule names are made of letters, digits and '-'. The shared rules are named json-* (json-ws,
// json-value, json-object, json-array, json-string, json-char, json-number, json-integer, ...);
// a requested name that is taken gets a numeric suffix, so schemas never collide.
class JsonGrammarBuilder {
 public:
  JsonGrammarBuilder();

  // Adds the rules for one JSON value valid against `schema` and returns the name of the rule to
  // reference (the sanitized `name`, or that name with a suffix if it was taken). $ref resolves
  // inside `schema`. Fails (bmoe::Error) on what the subset above does not cover.
  std::string add_schema(const nlohmann::ordered_json& schema, const std::string& name);
  // What lies between the quotes of a string valid against `schema` (pattern, format, minLength,
  // maxLength), as a GBNF sequence: JSON-escaped, or Raw for formats that write strings as they
  // are (qwen-xml's parameters; then '<' and control characters come only from lengths alone,
  // as "[^<]"). The one string walker for response_format, tool parameters and those formats.
  enum class StringText { Json, Raw };
  std::string string_text(const nlohmann::ordered_json& schema, StringText mode);
  // Whether string_text writes this "format" (the others are annotations).
  static bool known_format(const std::string& format);
  // Adds `name ::= body` (body is GBNF). Fails if the name is taken or not a valid rule name.
  void add_rule(const std::string& name, const std::string& body);
  // Adds a shared rule (and what it uses) if not there yet and returns its name. Fails for other
  // names. The shared rules (names stable):
  //   json-ws       bounded whitespace (may be empty)   json-value   any JSON value
  //   json-object   any object                          json-array   any array
  //   json-member   "key": value                        json-string  a JSON string, quotes included
  //   json-char     one character inside a string (raw, or an escape; \u surrogates only paired)
  //   json-unicode  the 4 hex digits after \u (or a pair)  json-hex  one hex digit
  //   json-number   any number                          json-integer an integer (no fraction/exponent)
  //   json-uint     0 or digits without a leading zero  json-boolean, json-null
  //   json-fmt-date YYYY-MM-DD (no quotes)              json-fmt-time HH:MM:SS[.f](Z|+HH:MM) (no quotes)
  //   json-fmt-uuid 8-4-4-4-12 hex digits (no quotes)
  std::string shared_rule(const std::string& name);
  // A GBNF literal that matches `text` exactly.
  static std::string literal(std::string_view text);
  // The grammar: every rule added, in order.
  std::string gbnf() const;

 private:
  friend class SchemaConverter;
  std::string unique_name(const std::string& wanted);
  size_t reserve_rule(const std::string& name);  // a slot to fill later (keeps definition order)

  std::vector<std::pair<std::string, std::string>> rules_;
  std::set<std::string> taken_;
  std::map<std::string, int> next_suffix_;  // unique_name: the next suffix to try per base name
  std::set<std::string> added_shared_;      // shared rules already in rules_
};

}  // namespace bmoe
