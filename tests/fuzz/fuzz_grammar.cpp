// libFuzzer target: the GBNF parser, matcher and token constraint (text/grammar.h). The input
// is a grammar, optionally followed by a NUL byte and text to feed it. Parsing either succeeds
// or fails with bmoe::Error; a grammar that parses must then run any text without a crash, a
// hang or a sanitizer report (the matcher may refuse an ambiguous input with bmoe::Error), and
// mask() must agree with allows() on every token of a small vocabulary.
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "core/error.h"
#include "text/grammar.h"

namespace {

// Single bytes, a few pieces of text (some cutting a UTF-8 sequence) and one control token.
const std::shared_ptr<const std::vector<std::string>>& vocabulary() {
  static const auto v = [] {
    auto t = std::make_shared<std::vector<std::string>>();
    t->push_back("");
    for (int b = 0; b < 256; ++b) t->emplace_back(1, static_cast<char>(b));
    for (const char* s : {"ab", "abc", "a b", "{\"", "\":", "true", "null", "12", "-0.5", "\n  ", "\xC3\xA9", "\xE4\xB8",
                          "\xAD!", "\xF0\x9F\x98\x80", "<end>"}) {
      t->emplace_back(s);
    }
    return std::shared_ptr<const std::vector<std::string>>(t);
  }();
  return v;
}

void check_mask(const bmoe::TokenConstraint& c) {
  const int n = static_cast<int>(vocabulary()->size());
  std::vector<float> logits(static_cast<size_t>(n), 0.0f);
  c.mask(logits.data(), n);
  for (int t = 0; t < n; ++t) {
    if (std::isfinite(logits[static_cast<size_t>(t)]) != c.allows(t)) {
      std::fprintf(stderr, "mask() and allows() disagree on token %d\n", t);
      std::abort();
    }
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view input(reinterpret_cast<const char*>(data), size);
  const size_t split = input.find('\0');
  const std::string_view gbnf = input.substr(0, split);
  const std::string_view text = split == std::string_view::npos ? std::string_view("ab{\"x\": 1}\xC3\xA9") : input.substr(split + 1);
  std::shared_ptr<const bmoe::Grammar> grammar;
  try {
    grammar = bmoe::Grammar::parse(gbnf);
  } catch (const bmoe::Error&) {
    return 0;
  }
  try {
    bmoe::GrammarMatcher matcher(grammar);
    bmoe::TokenConstraint constraint(grammar, vocabulary(), {static_cast<int32_t>(vocabulary()->size() - 1)});
    check_mask(constraint);
    // Feed the text in pieces of 1-3 bytes; a refused piece is skipped (the state must not move).
    for (size_t i = 0, step = 1; i < text.size(); i += step, step = step % 3 + 1) {
      const std::string_view piece = text.substr(i, step);
      const bool would = matcher.accepts(piece);
      if (matcher.accept(piece) != would) std::abort();
      (void)matcher.complete();
      (void)matcher.can_continue();
    }
    // Walk the constraint along the text's bytes as single-byte tokens while it allows them.
    for (size_t i = 0; i < text.size() && i < 64; ++i) {
      const auto token = static_cast<int32_t>(1 + static_cast<uint8_t>(text[i]));
      if (!constraint.allows(token)) break;
      constraint.accept(token);
      if (i % 8 == 7) check_mask(constraint);
    }
    check_mask(constraint);
  } catch (const bmoe::Error&) {
  }
  return 0;
}
