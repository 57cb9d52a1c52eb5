// libFuzzer target: the byte-level BPE tokenizer (PCRE2 pre-tokenizer, merges, special tokens).
// Without special-token parsing, decoding what was encoded must give back the input bytes when
// they are valid UTF-8 (invalid bytes become U+FFFD, as in llama.cpp).
#include <cstdint>
#include <cstdlib>
#include <string>

#include "fuzz_common.h"
#include "text/utf8.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const bmoe::Tokenizer& tok = bmoe::fuzz_tokenizer();
  if (size == 0) return 0;
  const bool parse_special = data[0] & 1;
  const std::string text(reinterpret_cast<const char*>(data) + 1, size - 1);
  const std::vector<int32_t> ids = tok.encode(text, parse_special, data[0] & 2);
  for (int32_t id : ids) {
    if (id < 0 || id >= tok.vocab_size()) std::abort();
  }
  const std::string decoded = tok.decode(ids, true);
  if (!parse_special && !(data[0] & 2) && decoded != (bmoe::utf8_valid(text) ? text : bmoe::utf8_sanitize(text))) {
    std::abort();
  }
  return 0;
}
