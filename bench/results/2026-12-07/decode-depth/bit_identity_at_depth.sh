#!/bin/bash
# Decode-path outputs at depth, main vs branch: the prompt in batches of 32 rows (under 64: every row on
# the decode attention path), logits after the prompt and 16 greedy tokens.
text=$(python3 -c "print(' '.join(['The harbour town woke slowly that spring, and the bakers lit their ovens before the light came over the hills.']*85))")
for side in main branch; do
  cli=/work/wt/kern35/build/tools/bmoe-cli; [ $side = main ] && cli=/tmp/k35/mainbuild/tools/bmoe-cli
  for p in tiny-qwen3moe tiny-gpt-oss tiny-gemma4; do
    for kv in f16 f32; do
      $cli -m $p.gguf -p "$text" -n 16 -c 8192 -b 32 -t 2 --json --ignore-eos --kv-type $kv --dump-logits $side.$p.$kv.logits > $side.$p.$kv.json 2>$side.$p.$kv.err || echo "exit $?" >> $side.$p.$kv.json
    done
    $cli -m $p.gguf -p "$text" -n 16 -c 8192 -b 32 -t 2 --json --ignore-eos --moe-stream --cache-mb 1 --dump-logits $side.$p.stream.logits > $side.$p.stream.json 2>$side.$p.stream.err || echo "exit $?" >> $side.$p.stream.json
  done
done
