#!/usr/bin/env bash
# Configures build-asan: the ASan + UBSan build of the C++ test suite. With clang 14 and its
# libFuzzer runtime installed it is a clang build that also holds the fuzz targets, so
# scripts/test.sh and scripts/fuzz.sh share one sanitizer build; otherwise g++ without fuzzers.
set -euo pipefail
cd "$(dirname "$0")/.."
flags=(-G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DBMOE_SANITIZE=ON -DBMOE_BUILD_BENCH=OFF)
if command -v clang++-14 >/dev/null 2>&1 && dpkg -s libclang-rt-14-dev >/dev/null 2>&1; then
  flags+=(-DCMAKE_C_COMPILER=clang-14 -DCMAKE_CXX_COMPILER=clang++-14 -DBMOE_FUZZ=ON)
fi
cmake -S . -B build-asan "${flags[@]}" >/dev/null
