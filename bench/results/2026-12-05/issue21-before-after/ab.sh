#!/bin/bash
# Alternated before/after: resident and streamed decode on the same file, same machine.
M=/work/main/bench/out/models/qwen3-30b-a3b.gguf
T=/work/shared/data/route-traces/qwen3-30b-a3b-k6.route.csv
P="The harbour town woke slowly that spring, and the bakers had already lit their ovens."
cat $M > /dev/null  # page the file in once (resident runs map it)
for pair in ${PAIRS:-1 2}; do
  for which in ${ORDER:-before after}; do
    if [ $which = before ]; then CLI=/work/bin-before/bmoe-cli; else CLI=/work/main/build/tools/bmoe-cli; fi
    for mode in resident streamed; do
      if [ $mode = resident ]; then F=""; else F="--moe-stream --cache-mb 4000 --io-threads 4 --overlap --prefetch 2 --predictor affinity"; fi
      $CLI -m $M -p "$P" -n 128 -t 2 --ignore-eos --route-replay $T $F > /dev/null 2> $which-$mode-$pair.log
      echo "$which $mode $pair $(grep -o 'generation: .*' $which-$mode-$pair.log)"
      sleep 3
    done
  done
done
