#!/bin/bash
# Decode-path outputs at depth, main (a84623a) vs branch depth35 (e0d7805): the prompt (5185 tokens) in
# batches of 32 rows (under 64: every row on the decode attention path), logits after the prompt and 16
# greedy tokens, f16 KV / f32 KV / streamed, on three families (full attention; sinks + sliding window;
# gemma4). Same method as ../decode-depth/bit_identity_at_depth.sh. Result: bit_identity_at_depth.txt
# (.err files hold timings and differ; every .logits and .json is byte-identical).
text=$(python3 -c "print(' '.join(['The harbour town woke slowly that spring, and the bakers lit their ovens before the light came over the hills.']*85))")
M=/work/main/build/test-models
for side in main branch; do
  cli=/tmp/d35/bmoe-cli-v4; [ $side = main ] && cli=/tmp/d35/bmoe-cli-main
  for p in tiny-qwen3moe tiny-gpt-oss tiny-gemma4; do
    for kv in f16 f32; do
      $cli -m $M/$p.gguf -p "$text" -n 16 -c 8192 -b 32 -t 2 --json --ignore-eos --kv-type $kv --dump-logits $side.$p.$kv.logits > $side.$p.$kv.json 2>$side.$p.$kv.err || echo "exit $?" >> $side.$p.$kv.json
    done
    $cli -m $M/$p.gguf -p "$text" -n 16 -c 8192 -b 32 -t 2 --json --ignore-eos --moe-stream --cache-mb 1 --dump-logits $side.$p.stream.logits > $side.$p.stream.json 2>$side.$p.stream.err || echo "exit $?" >> $side.$p.stream.json
  done
done
for f in main.*; do b=branch.${f#main.}; if cmp -s $f $b; then echo "same $f"; else echo "DIFF $f"; fi; done > result.txt
