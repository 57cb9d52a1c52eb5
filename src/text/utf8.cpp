#include "text/utf8.h"

namespace bmoe {
namespace {
constexpr const char* kReplacement = "\xEF\xBF\xBD";

bool is_continuation(uint8_t b) { return (b & 0xC0) == 0x80; }

// Decodes one sequence at text[i]; returns its length, or 0 if it is invalid, or -1 if it is
// a valid but incomplete prefix at the end of the text.
int decode_one(std::string_view text, size_t i, uint32_t& cp) {
  const auto lead = static_cast<uint8_t>(text[i]);
  if (lead < 0x80) {
    cp = lead;
    return 1;
  }
  int length;
  uint32_t min;
  if ((lead & 0xE0) == 0xC0) {
    length = 2;
    cp = lead & 0x1F;
    min = 0x80;
  } else if ((lead & 0xF0) == 0xE0) {
    length = 3;
    cp = lead & 0x0F;
    min = 0x800;
  } else if ((lead & 0xF8) == 0xF0) {
    length = 4;
    cp = lead & 0x07;
    min = 0x10000;
  } else {
    return 0;
  }
  for (int k = 1; k < length; ++k) {
    if (i + static_cast<size_t>(k) >= text.size()) return -1;
    const auto b = static_cast<uint8_t>(text[i + static_cast<size_t>(k)]);
    if (!is_continuation(b)) return 0;
    cp = (cp << 6) | (b & 0x3F);
  }
  if (cp < min || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return 0;
  return length;
}

}  // namespace

int utf8_sequence_length(uint8_t lead) {
  if (lead < 0x80) return 1;
  if ((lead & 0xE0) == 0xC0) return 2;
  if ((lead & 0xF0) == 0xE0) return 3;
  if ((lead & 0xF8) == 0xF0) return 4;
  return 1;
}

void append_utf8(std::string& out, uint32_t cp) {
  if (cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) cp = 0xFFFD;  // not a character: U+FFFD
  if (cp < 0x80) {
    out += static_cast<char>(cp);
  } else if (cp < 0x800) {
    out += static_cast<char>(0xC0 | (cp >> 6));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else if (cp < 0x10000) {
    out += static_cast<char>(0xE0 | (cp >> 12));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else {
    out += static_cast<char>(0xF0 | (cp >> 18));
    out += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  }
}

std::vector<uint32_t> utf8_codepoints(std::string_view text) {
  std::vector<uint32_t> out;
  out.reserve(text.size());
  for (size_t i = 0; i < text.size();) {
    uint32_t cp = 0;
    const int n = decode_one(text, i, cp);
    if (n <= 0) {
      out.push_back(0xFFFD);
      ++i;
    } else {
      out.push_back(cp);
      i += static_cast<size_t>(n);
    }
  }
  return out;
}

size_t utf8_complete_prefix(std::string_view bytes) {
  size_t i = 0;
  while (i < bytes.size()) {
    uint32_t cp = 0;
    const int n = decode_one(bytes, i, cp);
    if (n < 0) break;  // incomplete tail
    i += n == 0 ? 1 : static_cast<size_t>(n);
  }
  return i;
}

std::string utf8_sanitize(std::string_view bytes) {
  std::string out;
  out.reserve(bytes.size());
  for (size_t i = 0; i < bytes.size();) {
    uint32_t cp = 0;
    const int n = decode_one(bytes, i, cp);
    if (n <= 0) {
      out += kReplacement;
      ++i;
    } else {
      out.append(bytes.substr(i, static_cast<size_t>(n)));
      i += static_cast<size_t>(n);
    }
  }
  return out;
}

bool utf8_valid(std::string_view bytes) {
  for (size_t i = 0; i < bytes.size();) {
    uint32_t cp = 0;
    const int n = decode_one(bytes, i, cp);
    if (n <= 0) return false;
    i += static_cast<size_t>(n);
  }
  return true;
}

std::string Utf8Stream::push(std::string_view bytes) {
  pending_.append(bytes);
  const size_t complete = utf8_complete_prefix(pending_);
  std::string out = utf8_sanitize(std::string_view(pending_).substr(0, complete));
  pending_.erase(0, complete);
  return out;
}

std::string Utf8Stream::flush() {
  std::string out = utf8_sanitize(pending_);
  pending_.clear();
  return out;
}

}  // namespace bmoe
