#!/usr/bin/env python3
"""Resident decode speed, bmoe vs llama.cpp, on the same file with the same thread count.

Default: a 12-layer cut of the qwen3-30b-a3b shape (Q4_K_M-like mix), 128 tokens, 2 threads,
runs alternated (bmoe, llama.cpp, bmoe, ...) so both see the same machine state. Prints a
markdown table with the ratio.

    bench/bench_resident.py [--layers 12] [--tokens 128] [--threads 2] [--repeats 3]
"""
import argparse
import os
import statistics

from common import REPO, describe, ensure_model, log, machine, run_bmoe, run_llama


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--layers", type=int, default=12)
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--model", default=None)
    args = ap.parse_args()
    model = args.model or os.path.join(REPO, "bench", "out", "models", f"qwen3-30b-a3b-{args.layers}l.gguf")
    ensure_model(model, "qwen3-30b-a3b", "--layers", str(args.layers))
    ours, theirs = [], []
    for r in range(args.repeats):
        t, err = run_bmoe(model, args.tokens, args.threads)
        if t is None:
            log(err)
        ours.append(t)
        log(f"repeat {r + 1}: bmoe {t} tok/s")
        t, err = run_llama(model, args.tokens, args.threads)
        if t is None:
            log(err)
        theirs.append(t)
        log(f"repeat {r + 1}: llama.cpp {t} tok/s")
    a = [x for x in ours if x]
    b = [x for x in theirs if x]
    ratio = statistics.mean(a) / statistics.mean(b) if a and b else float("nan")
    print(f"| engine | decode tok/s (mean) |\n|---|---|")
    print(f"| bmoe | {describe(ours)} |")
    print(f"| llama.cpp (node-llama-cpp 3.21.1, mmap) | {describe(theirs)} |")
    print(f"\nratio bmoe / llama.cpp: **{ratio:.2f}x** — {os.path.basename(model)}, {args.tokens} tokens, "
          f"-t {args.threads}, {machine()}")


if __name__ == "__main__":
    main()
