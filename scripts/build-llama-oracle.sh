#!/usr/bin/env bash
# Builds llama.cpp from a source tree (CPU only, static) and tests/oracle/llama_logits.cpp
# against it: the oracle for families the prebuilt node-llama-cpp library cannot run
# (deepseek4). Usage: scripts/build-llama-oracle.sh [LLAMA_SRC] [BUILD_DIR] [JOBS]
set -euo pipefail
src="${1:-/work/llama-src}"
out="${2:-/tmp/llama-build}"
jobs="${3:-2}"
here="$(cd "$(dirname "$0")/.." && pwd)"
cmake -S "$src" -B "$out" -G Ninja -DCMAKE_BUILD_TYPE=Release -DGGML_CCACHE=ON -DGGML_NATIVE=ON \
  -DBUILD_SHARED_LIBS=OFF -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_TESTS=OFF \
  -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=OFF -DLLAMA_BUILD_TOOLS=OFF >/dev/null
cmake --build "$out" -j"$jobs" --target llama
libs=$(find "$out" -name 'libllama.a' -o -name 'libggml*.a' | sort -r)
g++ -O2 -std=c++17 -I"$src/include" -I"$src/ggml/include" "$here/tests/oracle/llama_logits.cpp" \
  -Wl,--start-group $libs -Wl,--end-group -fopenmp -lpthread -o "$out/llama_logits"
echo "$out/llama_logits"
