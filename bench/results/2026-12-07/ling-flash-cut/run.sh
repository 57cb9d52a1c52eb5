#!/bin/bash
# ling-v3-flash 4-layer cut (KDA+dense, KDA+dense, KDA+MoE, MLA+MoE): resident vs streamed, same tokens?
M=/work/models/ling-v3-flash-l4-ai4.gguf
CLI=/work/wt/cuts31/build/tools/bmoe-cli
P2="The harbour town woke slowly that spring. Before the light came over the hills, the bakers had already lit their ovens, and the smell of bread drifted down the narrow streets toward the water, where fishermen were checking nets that had dried overnight on wooden frames."
for p in "The capital of France is" "$P2"; do
  for mode in "--no-moe-stream" "--moe-stream --cache-mb 256" "--moe-stream --cache-mb 0" "--moe-stream --cache-mb 1024 --overlap"; do
    /usr/bin/time -f "%e s wall %U user %S sys %M KiB" $CLI -m $M -p "$p" -n 16 --json --ignore-eos -t 2 $mode 2>/tmp/cuts31-flash-err.txt | tail -1 | python3 -c "import json,sys; d=json.load(sys.stdin); print('$mode'.ljust(40), len(d['prompt']), d['tokens'])"
    tail -1 /tmp/cuts31-flash-err.txt
  done
done
cat /proc/loadavg
