#!/usr/bin/env bash
# The test suite: unit, kernel, model, streaming and conformance tests (Release build), then the
# C++ tests again under AddressSanitizer + UndefinedBehaviorSanitizer (clang when installed).
# Ends with each stage's wall time and the names of the tests CTest reported skipped: "all
# passed" only when none was.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/stages.sh
JOBS="${BMOE_TEST_JOBS:-$(nproc)}"
SKIPPED="$(mktemp "${TMPDIR:-/tmp}/bmoe-skipped.XXXXXX")"

# ctest with the given arguments; the names of the tests it reports skipped are added to
# $SKIPPED, each after PREFIX (the build it ran in).
run_ctest() {
  local prefix="$1"; shift
  local log rc=0
  log="$(mktemp "${TMPDIR:-/tmp}/bmoe-ctest.XXXXXX")"
  ctest "$@" 2>&1 | tee "$log" || rc=$?
  sed -n -E "s/^[[:space:]]+[0-9]+ - (.+) \(Skipped\)$/${prefix}\1/p" "$log" >> "$SKIPPED"
  rm -f "$log"
  return $rc
}

# Stage times and skipped tests, also when a stage failed.
report() {
  local rc=$?
  echo "test: stage times"
  stage_table
  if [ $rc -ne 0 ]; then
    echo "test: FAILED (exit $rc)"
  elif [ -s "$SKIPPED" ]; then
    echo "test: passed, $(wc -l < "$SKIPPED") skipped: $(paste -sd, "$SKIPPED" | sed 's/,/, /g')"
  else
    echo "test: all passed"
  fi
  rm -f "$SKIPPED"
}
trap report EXIT

# The real-shape conformance cuts need up to 2.0 GiB of disk at a time; say what there is.
echo "test: free disk $(df -h --output=avail . | tail -1 | tr -d ' ')"
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release >/dev/null
stage "release build" cmake --build build
# One stage per kind, so the table says where the time goes: the C++ suites and other cheap
# tests, the conformance suite against llama.cpp, then the rest (server, tools, bench, memory).
# A failure in one does not stop the others (one CTest run used to report every failure).
release_ctest() { run_ctest "" --test-dir build --output-on-failure -j "$JOBS" "$@"; }
failed=0
stage "release ctest: unit" release_ctest -L unit || failed=1
stage "release ctest: conformance" release_ctest -L conformance || failed=1
stage "release ctest: other" release_ctest -LE 'unit|conformance' || failed=1
[ $failed -eq 0 ]

if [ "${BMOE_SKIP_SANITIZERS:-0}" != "1" ]; then
  # With clang the same build also holds the libFuzzer targets (scripts/fuzz.sh reuses it).
  scripts/configure-asan.sh
  # Only what runs under the sanitizers: the C++ test binaries (-L unit) and, in a clang build,
  # the fuzz targets (every test_* and fuzz_* target the build has); not the tools.
  mapfile -t targets < <(ninja -C build-asan -t targets all | sed -n -E 's/^((test|fuzz)_[a-z0-9_]+): phony$/\1/p' | sort -u)
  stage "sanitizer build" cmake --build build-asan --target "${targets[@]}"
  export ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
  stage "sanitizer unit" run_ctest "asan: " --test-dir build-asan --output-on-failure -j "$JOBS" -L unit
fi
