// What a tool's --version prints: the release, the commit it was built from, the build type
// and the kernel path this machine uses (the facts a bug report needs).
#pragma once

#include <string>

namespace bmoe {

// e.g. "bmoe 0.1.0 (commit 9a6615d1c2e3, Release build, isa avx2+avx512)"
std::string version_text();

}  // namespace bmoe
