#!/usr/bin/env python3
"""Continuous batching, resident, against llama.cpp with the same number of parallel sequences:
`bmoe-cli --parallel B --no-moe-stream` and llama.cpp's batched decode (node-llama-cpp, one
context with B sequences: bench/llama_parallel.mjs) on the same file, B = 1, 2, 4, 8, the same
B prompts, greedy, the same token count and thread count.

Both rates count the decode steps only, the same way: the tokens generated after every
sequence's first token (which each engine takes from its prompt pass) over those steps' time,
so B x (N - 1) tokens over N - 1 batched passes. (bmoe-cli's own aggregate line counts all N
tokens; its rate here is (tokens - B) / its decode-step seconds.) After one untimed warm-up run
of each engine, each repeat runs every B with the engines alternated (bmoe, llama.cpp, ...), so
both see the same machine state; the load average is printed beside each repeat. Prints a
markdown table (mean over repeats, ratio of the means); with --out, keeps a CSV of every run.

    bench/bench_parallel_resident.py [--model M] [--layers 12] [--batches 1,2,4,8] [--tokens 32]
                                     [--threads 2] [--repeats 2] [--out DIR]
"""
import argparse
import csv
import json
import os
import re
import statistics
import subprocess
import tempfile

from bench_parallel import PROMPTS
from common import REPO, ensure_model, log, machine, tool

AGG_RE = re.compile(r"parallel: (\d+) sequences, (\d+) at once: (\d+) tokens in ([\d.]+) s of decode steps")
LAT_RE = re.compile(r"token latency p50 ([\d.]+) ms, p95 ([\d.]+) ms over (\d+) steps")
PEER = os.path.join(REPO, "bench", "llama_parallel.mjs")


def loadavg():
    with open("/proc/loadavg") as f:
        return f.read().split()[0]


def run_bmoe(model, batch, args):
    with tempfile.NamedTemporaryFile("w", suffix=".txt", delete=False) as f:
        f.write("\n".join(PROMPTS[i % len(PROMPTS)] for i in range(batch)) + "\n")
        prompts = f.name
    cmd = [tool("bmoe-cli"), "-m", model, "-f", prompts, "--parallel", str(batch), "-n", str(args.tokens),
           "-t", str(args.threads), "-c", str(args.ctx * batch), "--ignore-eos", "--temp", "0", "--no-moe-stream"]
    p = subprocess.run(cmd, capture_output=True, text=True)
    os.unlink(prompts)
    agg, lat = AGG_RE.search(p.stderr), LAT_RE.search(p.stderr)
    if p.returncode != 0 or not agg or not lat:
        log(p.stderr[-2000:])
        return None
    tokens, seconds = int(agg.group(3)), float(agg.group(4))
    return {"tokens": tokens - batch, "seconds": seconds, "tok_s": (tokens - batch) / seconds,
            "p50_ms": float(lat.group(1)), "p95_ms": float(lat.group(2))}


def run_llama(model, batch, args):
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
        json.dump([PROMPTS[i % len(PROMPTS)] for i in range(batch)], f)
        prompts = f.name
    cmd = ["node", PEER, model, prompts, str(batch), str(args.tokens), str(args.threads), str(args.ctx)]
    p = subprocess.run(cmd, capture_output=True, text=True, cwd=REPO)
    os.unlink(prompts)
    try:
        r = json.loads(p.stdout.strip().splitlines()[-1])
    except (IndexError, json.JSONDecodeError):
        log((p.stderr or "")[-2000:] + f" (exit {p.returncode})")
        return None
    return {"tokens": r["tokens"], "seconds": r["seconds"], "tok_s": r["tok_s"],
            "p50_ms": r["token_ms_p50"], "p95_ms": r["token_ms_p95"]}


def mean_of(runs, key):
    v = [r[key] for r in runs if r]
    return statistics.mean(v) if v else None


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--layers", type=int, default=12)
    ap.add_argument("--model", default=None, help="default: /work/models/qwen3-30b-a3b-l<layers>.gguf if present, "
                                                  "else bench/out/models/qwen3-30b-a3b-<layers>l.gguf (written once)")
    ap.add_argument("--batches", default="1,2,4,8")
    ap.add_argument("--tokens", type=int, default=32, help="tokens per sequence")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--ctx", type=int, default=512, help="context per sequence")
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--out", default=None, help="directory for runs.csv")
    args = ap.parse_args()
    model = args.model
    if not model:
        shared = f"/work/models/qwen3-30b-a3b-l{args.layers}.gguf"
        model = shared if os.path.exists(shared) else os.path.join(
            REPO, "bench", "out", "models", f"qwen3-30b-a3b-{args.layers}l.gguf")
    ensure_model(model, "qwen3-30b-a3b", "--layers", str(args.layers))
    batches = [int(b) for b in args.batches.split(",")]
    log(f"warm-up (untimed), load {loadavg()}")
    run_bmoe(model, 1, argparse.Namespace(**{**vars(args), "tokens": 8}))
    run_llama(model, 1, argparse.Namespace(**{**vars(args), "tokens": 8}))
    rows, loads = [], []
    for r in range(args.repeats):
        for b in batches:
            for engine, fn in (("bmoe", run_bmoe), ("llama.cpp", run_llama)):
                load = loadavg()
                res = fn(model, b, args)
                loads.append(float(load))
                rows.append({"repeat": r + 1, "B": b, "engine": engine, "load1": load, **(res or {"tok_s": None})})
                log(f"repeat {r + 1} B {b} {engine}: {res and round(res['tok_s'], 2)} tok/s (load {load})")
    if args.out:
        os.makedirs(args.out, exist_ok=True)
        with open(os.path.join(args.out, "runs.csv"), "w", newline="") as f:
            w = csv.DictWriter(f, ["repeat", "B", "engine", "load1", "tokens", "seconds", "tok_s", "p50_ms", "p95_ms"])
            w.writeheader()
            w.writerows(rows)
    print(f"{os.path.basename(model)}, resident, {args.tokens} tokens per sequence greedy, -t {args.threads}, "
          f"{args.repeats} alternated repeats, load average {min(loads):.1f}-{max(loads):.1f}, {machine()}\n")
    print("| B | bmoe tok/s | llama.cpp tok/s | ratio | bmoe token ms p50 / p95 | llama.cpp token ms p50 / p95 | "
          "bmoe vs its B=1 | llama.cpp vs its B=1 |")
    print("|---|---|---|---|---|---|---|---|")
    base = {}
    for b in batches:
        ours = [x for x in rows if x["B"] == b and x["engine"] == "bmoe" and x["tok_s"]]
        theirs = [x for x in rows if x["B"] == b and x["engine"] == "llama.cpp" and x["tok_s"]]
        if not ours or not theirs:
            print(f"| {b} | {'failed' if not ours else ''} | {'failed' if not theirs else ''} | | | | | |")
            continue
        a, t = mean_of(ours, "tok_s"), mean_of(theirs, "tok_s")
        base.setdefault("bmoe", a)
        base.setdefault("llama", t)
        print(f"| {b} | {a:.2f} | {t:.2f} | **{a / t:.2f}x** | {mean_of(ours, 'p50_ms'):.1f} / {mean_of(ours, 'p95_ms'):.1f} | "
              f"{mean_of(theirs, 'p50_ms'):.1f} / {mean_of(theirs, 'p95_ms'):.1f} | {a / base['bmoe']:.2f}x | "
              f"{t / base['llama']:.2f}x |")


if __name__ == "__main__":
    main()
