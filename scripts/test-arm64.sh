#!/usr/bin/env bash
# Cross-builds bmoe for arm64 (Debian's g++-aarch64-linux-gnu, arm64 multiarch libraries) and
# runs the C++ test suites under qemu-aarch64 -cpu max (dotprod, i8mm, fp16), so the NEON
# kernels are the ones selected. Installs what it needs on Debian (root or sudo).
set -euo pipefail
cd "$(dirname "$0")/.."

SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
need=()
command -v aarch64-linux-gnu-g++ >/dev/null 2>&1 || need+=(g++-aarch64-linux-gnu)
command -v qemu-aarch64 >/dev/null 2>&1 || need+=(qemu-user)
for p in libpcre2-dev:arm64 libfmt-dev:arm64 libgtest-dev:arm64; do dpkg -s "$p" >/dev/null 2>&1 || need+=("$p"); done
if [ ${#need[@]} -gt 0 ]; then
  echo "test-arm64: installing ${need[*]}"
  $SUDO dpkg --add-architecture arm64
  $SUDO apt-get update -qq
  $SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${need[@]}"
fi

cmake -S . -B build-arm64 -G Ninja -DCMAKE_BUILD_TYPE=Release -DBMOE_BUILD_BENCH=OFF \
      -DCMAKE_TOOLCHAIN_FILE=cmake/aarch64-linux-gnu.cmake
cmake --build build-arm64
# The C++ suites (kernels incl. the NEON bit-exactness and dispatch checks, GGUF, tokenizer,
# model, streaming byte-identity, generation) run through the toolchain's qemu emulator.
ctest --test-dir build-arm64 --output-on-failure -j "$(nproc)" "$@"
