#!/usr/bin/env bash
# Builds the libFuzzer targets with clang (ASan + UBSan) and runs each for a bounded time from
# the committed seed corpus (tests/fuzz/corpus/NAME; new inputs go to a scratch copy, so the
# repository stays clean). Any crash, sanitizer report or timeout fails the script and leaves
# the reproducer in build-asan/artifacts/. Usage: scripts/fuzz.sh [SECONDS_PER_TARGET]
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/stages.sh
trap 'echo "fuzz: stage times"; stage_table' EXIT
SECONDS_EACH="${1:-${BMOE_FUZZ_SECONDS:-60}}"

SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
need=()
command -v clang++-14 >/dev/null 2>&1 || need+=(clang-14)
dpkg -s libclang-rt-14-dev >/dev/null 2>&1 || need+=(libclang-rt-14-dev)
if [ ${#need[@]} -gt 0 ]; then
  echo "fuzz: installing ${need[*]}"
  $SUDO apt-get update -qq
  $SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${need[@]}"
fi

# The sanitizer build of scripts/test.sh (clang: ASan + UBSan + libFuzzer), reused if present.
scripts/configure-asan.sh
B=build-asan
stage "fuzz build" cmake --build $B --target fuzz_gguf fuzz_tokenizer fuzz_chat_request fuzz_template fuzz_tool_calls fuzz_grammar fuzz_json_schema

mkdir -p $B/artifacts
export ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
# One target for SECONDS_EACH from its seed corpus; fails when it left a reproducer.
fuzz_one() {
  local target="$1" work="$B/corpus/$1"
  mkdir -p "$work"
  cp -n tests/fuzz/corpus/$target/* "$work"/
  echo "fuzz: $target for ${SECONDS_EACH} s"
  $B/tests/fuzz/fuzz_$target "$work" -max_total_time="$SECONDS_EACH" -timeout=10 -rss_limit_mb=2048 \
      -max_len=8192 -print_final_stats=1 -artifact_prefix=$B/artifacts/$target- 2>&1 | \
      grep -E "^#[0-9]+ +DONE|stat::number_of_executed_units|ERROR|SUMMARY|Test unit written" || true
  if compgen -G "$B/artifacts/$target-*" >/dev/null; then
    echo "fuzz: $target found a failing input:"; ls $B/artifacts/$target-*
    return 1
  fi
}
# libFuzzer runs one thread: as many targets at once as there are cores, each still for
# SECONDS_EACH, so the wall time shrinks and no target gets less time. Each target's output is
# kept and printed whole when it ends.
fuzz_all() {
  local parallel failed=0 target
  parallel="$(nproc)"
  local -a pids=() names=()
  for target in gguf tokenizer chat_request template tool_calls grammar json_schema; do
    fuzz_one "$target" > "$B/artifacts/.log-$target" 2>&1 &
    pids+=($!); names+=("$target")
    if [ ${#pids[@]} -ge "$parallel" ]; then
      wait "${pids[0]}" || failed=1
      cat "$B/artifacts/.log-${names[0]}"
      pids=("${pids[@]:1}"); names=("${names[@]:1}")
    fi
  done
  for i in "${!pids[@]}"; do
    wait "${pids[$i]}" || failed=1
    cat "$B/artifacts/.log-${names[$i]}"
  done
  rm -f "$B"/artifacts/.log-*
  return $failed
}
stage "fuzz run (7 targets x ${SECONDS_EACH} s, $(nproc) at once)" fuzz_all
echo "fuzz: no crashes"
