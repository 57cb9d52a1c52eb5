#!/usr/bin/env bash
# Builds tests/oracle/llama_logits.cpp, the logits driver deepseek4's conformance check runs.
#   scripts/build-llama-oracle.sh prebuilt [OUT_DIR]
#     links it against node-llama-cpp's prebuilt libraries (the pinned peer; headers from the
#     llama.cpp tree bundled with node-llama-cpp): seconds. The CPU level is chosen at run time
#     (LLAMA_BACKEND_DIR, set by tests/conformance/deepseek4_logits.py).
#   scripts/build-llama-oracle.sh [LLAMA_SRC] [BUILD_DIR] [JOBS]
#     builds llama.cpp from a source tree (CPU only, static, native) and links against it:
#     minutes (411 s on 2 cores).
set -euo pipefail
here="$(cd "$(dirname "$0")/.." && pwd)"
if [ "${1:-}" = "prebuilt" ]; then
  out="${2:-$here/build/llama-oracle}"
  bins="$here/node_modules/@node-llama-cpp/linux-x64/bins/linux-x64"
  mkdir -p "$out"
  if [ ! -f "$out/src/include/llama.h" ]; then
    rm -rf "$out/src"
    git clone -q "$here/node_modules/node-llama-cpp/llama/gitRelease.bundle" "$out/src"
  fi
  g++ -O2 -std=c++17 -I"$out/src/include" -I"$out/src/ggml/include" "$here/tests/oracle/llama_logits.cpp" \
    -L"$bins" -l:libllama.v0.4.0.so -l:libggml.v0.4.0.so -l:libggml-base.so -Wl,-rpath,"$bins" \
    -o "$out/llama_logits"
  echo "$out/llama_logits"
  exit 0
fi
src="${1:-/work/llama-src}"
out="${2:-/tmp/llama-build}"
jobs="${3:-2}"
cmake -S "$src" -B "$out" -G Ninja -DCMAKE_BUILD_TYPE=Release -DGGML_CCACHE=ON -DGGML_NATIVE=ON \
  -DBUILD_SHARED_LIBS=OFF -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_TESTS=OFF \
  -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=OFF -DLLAMA_BUILD_TOOLS=OFF >/dev/null
cmake --build "$out" -j"$jobs" --target llama
libs=$(find "$out" -name 'libllama.a' -o -name 'libggml*.a' | sort -r)
g++ -O2 -std=c++17 -I"$src/include" -I"$src/ggml/include" "$here/tests/oracle/llama_logits.cpp" \
  -Wl,--start-group $libs -Wl,--end-group -fopenmp -lpthread -o "$out/llama_logits"
echo "$out/llama_logits"
