#include "core/error.h"

#include <cerrno>
#include <cstring>

namespace bmoe {

void fail_errno(const std::string& what) {
  const int saved = errno;
  throw Error(fmt::format("{}: {}", what, std::strerror(saved)));
}

}  // namespace bmoe
