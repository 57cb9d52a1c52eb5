#!/usr/bin/env bash
# Configures build-asan: the ASan + UBSan build of the C++ test suite. With clang 14 and its
# libFuzzer runtime installed it is a clang build that also holds the fuzz targets, so
# scripts/test.sh and scripts/fuzz.sh share one sanitizer build; otherwise g++ without fuzzers.
set -euo pipefail
cd "$(dirname "$0")/.."
# Debug information as line tables only: a sanitizer report needs file:line in its stack, not
# variables, and full -g made this build (7.6 of CI's minutes) 13 % slower to compile.
flags=(-G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DBMOE_SANITIZE=ON -DBMOE_BUILD_BENCH=OFF)
if command -v clang++-14 >/dev/null 2>&1 && dpkg -s libclang-rt-14-dev >/dev/null 2>&1; then
  flags+=(-DCMAKE_C_COMPILER=clang-14 -DCMAKE_CXX_COMPILER=clang++-14 -DBMOE_FUZZ=ON)
  lines="-gline-tables-only"
else
  lines="-g1"
fi
flags+=("-DCMAKE_CXX_FLAGS_RELWITHDEBINFO=-O2 $lines -DNDEBUG" "-DCMAKE_C_FLAGS_RELWITHDEBINFO=-O2 $lines -DNDEBUG")
cmake -S . -B build-asan "${flags[@]}" >/dev/null
