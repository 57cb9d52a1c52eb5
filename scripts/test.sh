#!/usr/bin/env bash
# The test suite: unit, kernel, model, streaming and conformance tests (Release build), then the
# C++ tests again under AddressSanitizer + UndefinedBehaviorSanitizer (clang when installed).
set -euo pipefail
cd "$(dirname "$0")/.."
JOBS="${BMOE_TEST_JOBS:-$(nproc)}"

# The real-shape conformance cuts need up to 2.6 GB of disk at a time; say what there is.
echo "test: free disk $(df -h --output=avail . | tail -1 | tr -d ' ')"
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build build
ctest --test-dir build --output-on-failure -j "$JOBS"

if [ "${BMOE_SKIP_SANITIZERS:-0}" != "1" ]; then
  # With clang the same build also holds the libFuzzer targets (scripts/fuzz.sh reuses it).
  scripts/configure-asan.sh
  cmake --build build-asan
  ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
    ctest --test-dir build-asan --output-on-failure -j "$JOBS" -L unit
fi
echo "test: all passed"
