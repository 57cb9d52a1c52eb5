// JSON Schema's `pattern` (an ECMA-262 regular expression) as a GBNF body for the text between
// a JSON string's quotes, so what the grammar writes decodes to a string the pattern matches.
//
// The subset: literals (UTF-8), '.', classes [...] and [^...] with ranges, the escapes \d \D \w
// \W \s \S \t \n \r \f \v \0 \xHH \uHHHH and escaped punctuation, groups ( ), (?: ) and (?<name> ),
// alternation |, the quantifiers * + ? {n} {n,} {n,m} (lazy ones too: laziness changes what a
// search finds, not which strings match), '^' at the start and '$' at the end of the pattern (or
// of each top-level alternative). Anchored or not, the grammar writes whole matches: a string the
// pattern matches whole is also one in which a search finds a match.
// Refused, with the construct named: lookaround, backreferences, \b \B, \p{...}, \cX, anchors
// elsewhere, counts above 1000, and an unbounded repetition of a part that can be empty.
//
// Stricter than the pattern where that keeps the grammar simple: characters that JSON must
// escape are written escaped ('"', '\\', and of the controls only \n \r \t \f \b; others are never
// written); everything else is written raw, never as \u escapes.
#pragma once

#include <optional>
#include <string>
#include <string_view>

namespace bmoe {

struct PatternGrammar {
  std::string body;                  // GBNF sequence (no quotes around it)
  size_t min_chars = 0;              // the fewest characters a match may have
  std::optional<size_t> max_chars;   // the most; none when unbounded
  // When the whole pattern is one character class or character repeated (^[a-z]+$, \d{2,5}):
  // that character's GBNF, so minLength / maxLength can bound the count instead. "" otherwise.
  std::string repeated_unit;
  size_t weight = 0;  // grammar elements once its repetitions are expanded (at most 100000)
};

// How the matched text is written: inside a JSON string (escaped as above), or raw, as formats
// that write parameter values unquoted do (then '<', which could begin the closing tag, and
// control characters are never written: a class leaves them out, a literal one fails).
enum class PatternText { Json, Raw };

// Fails (bmoe::Error, a message without prefix) on what the subset above does not cover.
PatternGrammar pattern_to_gbnf(std::string_view pattern, PatternText text = PatternText::Json);

}  // namespace bmoe
