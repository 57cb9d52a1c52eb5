// UTF-8 helpers: codepoint iteration and a streaming decoder that never emits a broken
// sequence (incomplete tails are held back until the next bytes arrive).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace bmoe {

// Length of the sequence a lead byte announces (1 for invalid leads, so callers advance).
int utf8_sequence_length(uint8_t lead);
// Appends the UTF-8 encoding of a codepoint (U+FFFD for a surrogate or a value past U+10FFFF).
void append_utf8(std::string& out, uint32_t cp);
// Splits text into codepoints; invalid bytes decode to U+FFFD one byte at a time.
std::vector<uint32_t> utf8_codepoints(std::string_view text);
// Length of the longest prefix of `bytes` that ends on a complete sequence boundary.
size_t utf8_complete_prefix(std::string_view bytes);
// Replaces every invalid byte with U+FFFD (one per byte, as llama.cpp's tokenizer does).
std::string utf8_sanitize(std::string_view bytes);
// Whether the bytes are well-formed UTF-8 throughout.
bool utf8_valid(std::string_view bytes);

// Accumulates token bytes and releases only complete UTF-8 text.
class Utf8Stream {
 public:
  // Adds bytes; returns the text that is now complete (invalid bytes become U+FFFD).
  std::string push(std::string_view bytes);
  // Returns what is left (an incomplete tail becomes U+FFFD).
  std::string flush();

 private:
  std::string pending_;
};

}  // namespace bmoe
