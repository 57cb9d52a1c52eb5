#!/usr/bin/env bash
# Cross-builds bmoe's C++ test suites for arm64 (Debian's g++-aarch64-linux-gnu, arm64 multiarch
# libraries) and runs, under qemu-aarch64 -cpu max (dotprod, i8mm, fp16, so the NEON kernels are
# the ones selected), the tests whose outcome can differ on arm64 (ARM64_TESTS below). With
# BMOE_ARM64_ALL=1 it builds everything and runs every C++ test instead. Extra arguments go to
# ctest. Installs what it needs on Debian (root or sudo); with BMOE_ARM64_INSTALL_ONLY=1 only that.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/stages.sh
trap 'echo "test-arm64: stage times"; stage_table' EXIT

SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
need=()
command -v aarch64-linux-gnu-g++ >/dev/null 2>&1 || need+=(g++-aarch64-linux-gnu)
command -v qemu-aarch64 >/dev/null 2>&1 || need+=(qemu-user)
for p in libpcre2-dev:arm64 libfmt-dev:arm64 libgtest-dev:arm64; do dpkg -s "$p" >/dev/null 2>&1 || need+=("$p"); done
install_arm64_packages() {
  echo "test-arm64: installing ${need[*]}"
  $SUDO dpkg --add-architecture arm64
  $SUDO apt-get update -qq
  $SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${need[@]}"
}
# BMOE_ARM64_INSTALL_ONLY=1: only the packages (.ci/run installs them while the suite runs: a
# background stage, left out of the table's total).
if [ "${BMOE_ARM64_INSTALL_ONLY:-0}" = "1" ]; then
  if [ ${#need[@]} -gt 0 ]; then stage "arm64 packages (background)" install_arm64_packages; fi
  exit 0
fi
if [ ${#need[@]} -gt 0 ]; then stage "arm64 packages" install_arm64_packages; fi

# What can differ on arm64, by suite (GoogleTest suite names; the rest runs natively only):
# - core: f16/bf16 conversion kernels; the thread pool (atomics on a weaker memory model).
# - quant: every kernel (NEON bit-exactness against the scalar reference) and the dispatch.
# - text: UTF-8 and the tokenizers' byte handling (char is unsigned on arm64).
# - model: the SIMD prompt attention (TiledAttention), the DeltaNet step, logits independent of
#   batch size and threads on one model per layer mix (qwen3moe, qwen35moe, lfm2moe), mixed
#   activation formats in one batch, 64+-token batches, and each row of a batched evaluation
#   equal to one token at a time (the kernels' multi-row and one-row paths: what lossless
#   speculative verification needs).
# - moe: streamed output byte-identical to resident, one model per family (FamilyStreamingIdentity)
#   and on qwen3moe with 150-token prompt batches (Streaming.LongPromptBatchesEqualResident).
# Left out: GGUF parsing and synth (test_gguf), read lanes (test_io), chat templates, tool calls,
# grammars and JSON Schema (test_grammar), the engine and serving layers (test_engine,
# test_serve), the sampler, the loader's errors, the architecture tables, rewind, the 27
# streaming configurations on qwen3moe (cache sizes, lanes, policies, overlap, prefetch, io_uring:
# 20-50 s each natively on a loaded machine), expert caches, predictors and fault injection, drafting on every family, and the engine's bookkeeping: logic with no SIMD path,
# the same code on both architectures.
ARM64_SUITES=(core quant text model moe)
ARM64_TESTS='^(Fp16|Bf16|ThreadPoolTest|Layout|Activations|WeightQuantizers|Dot|Dispatch|FloatKernels|AllTypes/DotTest'
ARM64_TESTS+='|Utf8|Tokenizer|SpmTokenizer|TiledAttention|DeltaNet|Families/FamilyStreamingIdentity)\.'
ARM64_TESTS+='|^Streaming\.LongPromptBatchesEqualResident$'
ARM64_TESTS+='|^Model\.(BatchSizeAndThreadsDoNotChangeLogits|PromptBatchesOf64OrMoreGiveTheSameLogits|MixedActivationFormatsInOneBatch)$'
ARM64_TESTS+='|^Speculative\.BatchedLogitsEqualOneTokenAtATime$'

cmake -S . -B build-arm64 -G Ninja -DCMAKE_BUILD_TYPE=Release -DBMOE_BUILD_BENCH=OFF \
      -DCMAKE_TOOLCHAIN_FILE=cmake/aarch64-linux-gnu.cmake
if [ "${BMOE_ARM64_ALL:-0}" = "1" ]; then
  stage "arm64 build (all)" cmake --build build-arm64
  stage "arm64 run (all)" ctest --test-dir build-arm64 --output-on-failure -j "$(nproc)" "$@"
else
  # Only the test binaries that run (not the tools, the fuzzers or the other suites); their
  # tests are listed under qemu when each is linked.
  stage "arm64 build" cmake --build build-arm64 --target "${ARM64_SUITES[@]/#/test_}"
  stage "arm64 run" ctest --test-dir build-arm64 --output-on-failure -j "$(nproc)" -R "$ARM64_TESTS" "$@"
fi
