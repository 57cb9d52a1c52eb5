// Error reporting: every user-facing failure is a bmoe::Error whose message is one line.
// Tools catch it at main() and print "error: <message>" with a non-zero exit code.
#pragma once

#include <fmt/format.h>

#include <stdexcept>
#include <string>

namespace bmoe {

class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& message) : std::runtime_error(message) {}
};

// Throws bmoe::Error with a fmt-formatted message.
template <typename... Args>
[[noreturn]] void fail(fmt::format_string<Args...> format, Args&&... args) {
  throw Error(fmt::format(format, std::forward<Args>(args)...));
}

// Throws with strerror(errno) appended, for failed system calls.
[[noreturn]] void fail_errno(const std::string& what);

}  // namespace bmoe
