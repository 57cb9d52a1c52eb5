#include "core/version.h"

#include <fmt/format.h>

#include "bmoe_commit.h"  // generated at each build (cmake/commit_info.cmake)
#include "core/cpu_features.h"

namespace bmoe {

std::string version_text() {
  return fmt::format("bmoe {} (commit {}, {} build, isa {})", BMOE_VERSION, BMOE_COMMIT, BMOE_BUILD_TYPE,
                     active_isa_name());
}

}  // namespace bmoe
