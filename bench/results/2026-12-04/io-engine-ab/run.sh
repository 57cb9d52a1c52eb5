#!/bin/bash
cd "$(dirname "$0")/../../../.."
M=bench/out/models/qwen3-30b-a3b.gguf
T=../shared/data/route-traces/qwen3-30b-a3b-k6.route.csv
P="Write a detailed essay about the history of computing, from the abacus and the Antikythera mechanism to modern processors, covering the key inventions and people."
N=${N:-96}
for rep in ${REPS:-1 2 3}; do
 for eng in threads uring; do
  for mode in "" "--overlap-always"; do
    out=$(/usr/bin/time -f "invol %c" build/tools/bmoe-cli -m $M -p "$P" -n $N -t 2 --ignore-eos --moe-stream --cache-mb ${C:-4000} --io-threads 4 --io-engine $eng $mode --route-replay $T 2>&1 >/dev/null | grep -E "^generation|moe-stream:|invol")
    echo "$eng c${C:-4000} '$mode' r$rep :: $(echo $out | tr '\n' ' ')"
  done
 done
done
