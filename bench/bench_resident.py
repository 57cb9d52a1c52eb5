#!/usr/bin/env python3
"""Resident decode speed, bmoe vs llama.cpp, on the same file with the same thread count.

Default: a 12-layer cut of the qwen3-30b-a3b shape (Q4_K_M-like mix). With --families, one
cut of every family's real shape (issue: all the model families), each written once. After
one untimed warm-up run of each engine, runs alternate (bmoe, llama.cpp, bmoe, ...) so both
see the same machine state; prints a markdown table with the ratio per model.

    bench/bench_resident.py [--layers 12] [--tokens 128] [--threads 2] [--repeats 3]
    bench/bench_resident.py --families [--tokens 64] [--repeats 2]
"""
import argparse
import os
import statistics

from common import REPO, describe, ensure_model, log, machine, run_bmoe, run_llama

# (preset, layers): cuts small enough to write in seconds and to run resident on 24 GiB.
FAMILIES = [("qwen3-30b-a3b", 12), ("qwen1.5-moe-a2.7b", 8), ("olmoe-1b-7b", 8), ("mixtral-8x7b", 2),
            ("gpt-oss-20b", 8), ("gemma-4-26b-a4b", 6), ("qwen3.6-35b-a3b", 8), ("lfm2-8b-a1b", 8),
            # GLM-4.5-Air: the dense layer and 3 MoE layers (the nextn block is written, never read);
            # Ling 3.0 7.9B: 6 Kimi Delta layers (one dense) and 2 latent attention layers.
            ("glm-4.5-air", 4), ("ling-v3-mini", 8)]


def measure(model, args):
    # One short untimed run of each engine first: the file comes into the page cache and
    # neither engine's first timed run pays for reading it (a cold first run measured 23 tok/s
    # against 30-39 for the next two).
    run_bmoe(model, 8, args.threads)
    run_llama(model, 8, args.threads)
    ours, theirs = [], []
    for r in range(args.repeats):
        t, err = run_bmoe(model, args.tokens, args.threads)
        if t is None:
            log(err[-2000:])
        ours.append(t)
        log(f"  repeat {r + 1}: bmoe {t} tok/s")
        t, err = run_llama(model, args.tokens, args.threads)
        if t is None:
            log(err[-2000:])
        theirs.append(t)
        log(f"  repeat {r + 1}: llama.cpp {t} tok/s")
    a = [x for x in ours if x]
    b = [x for x in theirs if x]
    ratio = statistics.mean(a) / statistics.mean(b) if a and b else float("nan")
    return ours, theirs, ratio


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--layers", type=int, default=12)
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--model", default=None)
    ap.add_argument("--families", action="store_true", help="one cut of every family's real shape")
    ap.add_argument("--only", default="", help="with --families: comma-separated presets to run")
    args = ap.parse_args()
    if args.families:
        print("| model | bmoe tok/s | llama.cpp tok/s | ratio |\n|---|---|---|---|")
        for preset, layers in FAMILIES:
            if args.only and preset not in args.only.split(","):
                continue
            model = os.path.join(REPO, "bench", "out", "models", f"{preset}-{layers}l.gguf")
            ensure_model(model, preset, "--layers", str(layers))
            log(f"{preset} ({layers} layers)")
            ours, theirs, ratio = measure(model, args)
            print(f"| {preset}, {layers} layers | {describe(ours)} | {describe(theirs)} | **{ratio:.2f}x** |", flush=True)
        print(f"\n{args.tokens} tokens greedy, -t {args.threads}, {args.repeats} alternated repeats, {machine()}")
        return
    model = args.model or os.path.join(REPO, "bench", "out", "models", f"qwen3-30b-a3b-{args.layers}l.gguf")
    ensure_model(model, "qwen3-30b-a3b", "--layers", str(args.layers))
    ours, theirs, ratio = measure(model, args)
    print(f"| engine | decode tok/s (mean) |\n|---|---|")
    print(f"| bmoe | {describe(ours)} |")
    print(f"| llama.cpp (node-llama-cpp 3.21.1, mmap) | {describe(theirs)} |")
    print(f"\nratio bmoe / llama.cpp: **{ratio:.2f}x** — {os.path.basename(model)}, {args.tokens} tokens, "
          f"-t {args.threads}, {machine()}")


if __name__ == "__main__":
    main()
