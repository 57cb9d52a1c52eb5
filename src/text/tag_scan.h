// Scanning streamed text for tags (stop strings, <think>, tool-call markers, harmony's <|end|>):
// a streaming scanner emits what cannot belong to a tag and holds back the rest.
#pragma once

#include <algorithm>
#include <string>
#include <string_view>
#include <vector>

namespace bmoe {

// Length of the longest suffix of `text` that is a proper prefix of one of `tags` (empty tags
// aside): what may still grow into a tag, and must be held back until more text arrives.
inline size_t partial_tag_length(std::string_view text, const std::vector<std::string>& tags) {
  size_t hold = 0;
  for (const std::string& tag : tags) {
    if (tag.empty()) continue;
    for (size_t n = std::min(text.size(), tag.size() - 1); n > hold; --n) {
      if (text.substr(text.size() - n) == std::string_view(tag).substr(0, n)) {
        hold = n;
        break;
      }
    }
  }
  return hold;
}

// Where the first of `tags` (empty tags aside) occurs in `text`, or npos.
inline size_t first_tag(std::string_view text, const std::vector<std::string>& tags) {
  size_t first = std::string_view::npos;
  for (const std::string& tag : tags) {
    if (!tag.empty()) first = std::min(first, text.find(tag));
  }
  return first;
}

}  // namespace bmoe
