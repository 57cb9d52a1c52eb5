// Constrained generation: GBNF grammars (llama.cpp's grammar format, as llama-server's `grammar`
// field takes them), a matcher over Unicode text, and a token filter for sampling.
//
// GBNF as parsed here: rules `name ::= alternatives` (names of letters, digits, '-' and '_');
// a rule ends at the end of its line unless inside ( ), after a '|', or when the next line starts
// with '|'. Terminals: literals "..." and classes [a-z0-9_] / [^...] with the escapes \n \r \t
// \\ \" \[ \] \- \xHH \uHHHH \UHHHHHHHH, and '.' (any character). Groups ( ), alternation |,
// repetition * + ? {m} {m,} {m,n}, comments from '#' to the end of the line. llama.cpp's token
// references (<...>, <[id]>, !<...>) are refused.
//
// Contracts: Grammar::parse either returns a grammar every other call here can run without
// unbounded time or memory, or fails with one bmoe::Error line naming what is wrong (and where,
// for syntax). A Grammar is immutable and may be shared between threads; a GrammarMatcher or
// TokenConstraint is used by one thread at a time (its const calls use scratch space).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace bmoe {

// A parsed GBNF grammar (immutable, shareable).
class Grammar {
 public:
  // Parses GBNF text with `root` as the start rule. Fails (bmoe::Error) on syntax errors (with
  // line and column), undefined or twice-defined rules, a missing root, left recursion (a rule
  // that can start with itself, which includes `x*` where x can match empty text), and sizes
  // beyond the caps: 4 MiB of text, repetition counts above 10000, 2M grammar elements,
  // 200 nested groups, and an ambiguity table (every way a position can begin) above 4M entries.
  static std::shared_ptr<const Grammar> parse(std::string_view gbnf, std::string_view root = "root");

  ~Grammar();
  size_t rule_count() const;     // named and generated rules (groups, repetitions)
  size_t element_count() const;  // terminals, references and ends of alternatives

  struct Tables;  // the compiled form (grammar.cpp)
  const Tables& tables() const { return *tables_; }

 private:
  explicit Grammar(std::unique_ptr<Tables> tables);
  std::unique_ptr<Tables> tables_;
};

// The state of matching text against a grammar: nondeterministic (a set of parse stacks, at
// most 1024 at once: an input that needs more fails with an error naming the ambiguity), over
// Unicode code points. Input arrives as UTF-8 bytes that may split a code point across calls:
// an incomplete sequence is accepted when some stack could take a code point that starts with
// those bytes, and is kept pending until the rest arrives. Invalid UTF-8 is rejected.
class GrammarMatcher {
 public:
  explicit GrammarMatcher(std::shared_ptr<const Grammar> grammar);
  ~GrammarMatcher();
  GrammarMatcher(const GrammarMatcher& other);
  GrammarMatcher& operator=(const GrammarMatcher& other);
  GrammarMatcher(GrammarMatcher&&) noexcept;
  GrammarMatcher& operator=(GrammarMatcher&&) noexcept;

  bool accept(std::string_view bytes);         // advances; returns false and leaves the state unchanged when rejected
  bool accepts(std::string_view bytes) const;  // would accept, without changing state
  bool complete() const;                       // the text so far is a whole sentence of the grammar (end allowed)
  bool can_continue() const;                   // some further character is possible
  const std::shared_ptr<const Grammar>& grammar() const { return grammar_; }

 private:
  friend class TokenConstraint;
  struct Impl;
  std::shared_ptr<const Grammar> grammar_;
  std::unique_ptr<Impl> impl_;
};

// Constrains a token choice to a grammar. token_text[i] is the text token i stands for (raw
// bytes, as Tokenizer::token_bytes gives them); an empty string means the token is never allowed
// (control tokens). end_tokens are allowed exactly when the matcher is complete(), whatever
// their text. The byte trie over token_text that mask() walks is built once per token_text
// vector (the same shared vector: the last 4 vocabularies' tries stay cached), so making a
// constraint per request is cheap. mask() walks the trie depth-first with the matcher's state,
// skipping a subtree at the first refused byte, through a DFA of the states met that it builds
// as it goes: about 4 ms for Qwen3's 151k tokens inside a JSON string (nearly all allowed),
// well under 1 ms where few tokens fit.
class TokenConstraint {
 public:
  TokenConstraint(std::shared_ptr<const Grammar> grammar, std::shared_ptr<const std::vector<std::string>> token_text,
                  std::vector<int32_t> end_tokens);
  ~TokenConstraint();
  TokenConstraint(const TokenConstraint&);
  TokenConstraint& operator=(const TokenConstraint&);
  TokenConstraint(TokenConstraint&&) noexcept;
  TokenConstraint& operator=(TokenConstraint&&) noexcept;

  bool allows(int32_t token) const;
  // Sets -INFINITY on every token in [0, n_vocab) not allowed (ids past token_text included).
  void mask(float* logits, int n_vocab) const;
  // Advances past the token (an end token leaves the text as it is). Fails (bmoe::Error) if the
  // token is not allowed.
  void accept(int32_t token);
  bool complete() const;
  const GrammarMatcher& matcher() const { return matcher_; }

  struct VocabTrie;  // grammar.cpp

 private:
  bool is_end(int32_t token) const;

  GrammarMatcher matcher_;
  std::shared_ptr<const std::vector<std::string>> token_text_;
  std::shared_ptr<const VocabTrie> trie_;
  std::vector<int32_t> end_tokens_;  // sorted
  mutable std::vector<uint8_t> allowed_;  // mask() scratch
};

}  // namespace bmoe
