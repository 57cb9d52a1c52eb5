#!/bin/bash
M=/work/models/ling-v3-flash-l4-ai4.gguf
CLI=/work/wt/cuts31/build/tools/bmoe-cli
P="The harbour town woke slowly that spring. Before the light came over the hills, the bakers had already lit their ovens."
$CLI -m $M -p "$P" -n 4 -t 2 --no-moe-stream --dump-logits /tmp/cuts31-res.bin > /dev/null 2>&1
$CLI -m $M -p "$P" -n 4 -t 2 --moe-stream --cache-mb 256 --dump-logits /tmp/cuts31-str.bin > /dev/null 2>&1
ls -la /tmp/cuts31-res.bin /tmp/cuts31-str.bin
cmp /tmp/cuts31-res.bin /tmp/cuts31-str.bin && echo "logits bit-identical"
