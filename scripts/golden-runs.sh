#!/usr/bin/env bash
# Writes a fixed set of bmoe outputs over every family into OUT_DIR, so that a refactor can be
# checked byte-identical against the tree before it: run it on both builds and `diff -r` the
# folders. Covers the synthetic presets (sha256 of each tiny file: the generator's output),
# and bmoe-cli resident, streamed (small cache, overlap, prefetch), strict f32 KV, chat, n-gram
# drafts, MTP drafts (--mtp; a family without an MTP block records its one-line error), seeded
# sampling and a grammar, all as --json token ids.
# Usage: scripts/golden-runs.sh OUT_DIR [BUILD_DIR]   (GOLDEN_PRESETS="p1 p2": only those presets)
set -euo pipefail
out="${1:?usage: golden-runs.sh OUT_DIR [BUILD_DIR]}"
build="${2:-build}"
mkdir -p "$out/models"
cli="$build/tools/bmoe-cli"
synth="$build/tools/bmoe-synth"
families=(tiny-qwen3moe tiny-qwen2moe tiny-olmoe tiny-mixtral tiny-gpt-oss tiny-gemma4 tiny-qwen35moe tiny-lfm2moe
          tiny-glm4moe tiny-glm4moe-air tiny-bailingmoe3 tiny-bailingmoe3-plain-q tiny-deepseek4 tiny-deepseek4-mtp)
if [[ -n "${GOLDEN_PRESETS:-}" ]]; then read -r -a families <<< "$GOLDEN_PRESETS"; fi
prompt="The harbour town woke slowly that spring. Before the light came over the hills, the bakers had lit their ovens, 1 2 3 1 2 3 1 2 3"
runs=(
  "resident|"
  "kv-f32|--kv-type f32"
  "stream|--moe-stream --cache-mb 1"
  "stream-overlap-prefetch|--moe-stream --cache-mb 2 --overlap-always --prefetch 2"
  "chat|--chat --system be brief"
  "draft|--draft 4 --ngram"
  "stream-draft|--moe-stream --cache-mb 1 --draft 4 --ngram"
  "sampled|--temp 0.9 --top-k 40 --top-p 0.9 -s 7"
  "grammar|--grammar root::=[a-z ]+"
  "batch1|-b 1"
  "mtp|--mtp --draft 3"
  "stream-mtp|--moe-stream --cache-mb 1 --mtp --draft 3"
)
for fam in "${families[@]}"; do
  model="$out/models/$fam.gguf"
  "$synth" --preset "$fam" -o "$model" >/dev/null 2>&1
  sha256sum "$model" | cut -d' ' -f1 > "$out/$fam.synth.sha256"
  for r in "${runs[@]}"; do
    name="${r%%|*}"; flags="${r#*|}"
    # shellcheck disable=SC2086
    if [[ "$name" == grammar ]]; then
      "$cli" -m "$model" -p "$prompt" -n 24 -t 2 --json --grammar 'root ::= [a-z ]+' \
        > "$out/$fam.$name.json" 2>/dev/null || echo "exit $?" > "$out/$fam.$name.json"
    elif [[ "$name" == chat ]]; then
      "$cli" -m "$model" -p "$prompt" -n 24 -t 2 --json --ignore-eos --chat --system "be brief" \
        > "$out/$fam.$name.json" 2>/dev/null || echo "exit $?" > "$out/$fam.$name.json"
    else
      "$cli" -m "$model" -p "$prompt" -n 24 -t 2 --json --ignore-eos $flags \
        > "$out/$fam.$name.json" 2>/dev/null || echo "exit $?" > "$out/$fam.$name.json"
    fi
  done
  rm -f "$model"
done
echo "golden-runs: $(ls "$out"/*.json | wc -l) runs, ${#families[@]} presets in $out"
