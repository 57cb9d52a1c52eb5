#!/usr/bin/env python3
"""Continuous batching on a streamed model: B = 1, 2, 4, 8 sequences decoded at once by
`bmoe-cli --parallel B`, inside a cgroup-v1 memory cap, each run cold (page cache dropped).

Per run: aggregate tok/s (all sequences' tokens over the decode steps' time), token latency
p50/p95 (one step's time: every running sequence gets one token per step), flash MiB read per
generated token, the expert cache's hit %, and how many of the routed (token, slot) pairs were
distinct experts (what one read per expert per step saves). The routing is the model's own (a
synthetic model with random weights routes near-uniformly, so its sequences share fewer experts
than a trained model's would). Prints a markdown table; with --out, keeps each run's stderr.

    bench/bench_parallel.py [--model M] [--ram-gib 11] [--caches 0,4000] [--batches 1,2,4,8] [--tokens 32]
"""
import argparse
import os
import re
import subprocess
import tempfile
import time

from cgroup import MemoryCap, available as cgroup_available, drop_page_cache
from common import REPO, ensure_model, log, tool

PROMPTS = [
    "Write a detailed essay about the history of computing.",
    "Explain how a steam engine works, step by step.",
    "List the planets of the solar system and one fact about each.",
    "Tell me a story about a lighthouse keeper and a storm.",
    "What are the main causes of inflation in an economy?",
    "Describe the water cycle to a ten year old.",
    "Translate a short greeting into five languages and explain each.",
    "Summarise the plot of a famous tragedy in a few sentences.",
]
AGG_RE = re.compile(r"parallel: (\d+) sequences, (\d+) at once: (\d+) tokens in ([\d.]+) s of decode steps, ([\d.]+) tok/s")
LAT_RE = re.compile(r"token latency p50 ([\d.]+) ms, p95 ([\d.]+) ms")
FLASH_RE = re.compile(r"flash ([\d.]+) MiB per generated token \(([\d.]+) MiB in decode steps, hit ([\d.]+) %\); "
                      r"experts (\d+) distinct of (\d+) routed")


def run(model, batch, cache, args, prefix):
    with tempfile.NamedTemporaryFile("w", suffix=".txt", delete=False) as f:
        f.write("\n".join(PROMPTS[i % len(PROMPTS)] for i in range(args.sequences or batch)) + "\n")
        prompts = f.name
    flags = ["--moe-stream", "--cache-mb", str(cache), *(args.extra.split() if cache > 0 else [])]
    if args.route_replay:
        flags += ["--route-replay", args.route_replay, "--route-replay-stride", str(args.stride)]
    cmd = [*prefix, tool("bmoe-cli"), "-m", model, "-f", prompts, "--parallel", str(batch), "-n", str(args.tokens),
           "-t", str(args.threads), "-c", str(512 * batch), "--ignore-eos", "--temp", "0", *flags]
    start = time.time()
    p = subprocess.run(cmd, capture_output=True, text=True)
    os.unlink(prompts)
    out = {"exit": p.returncode, "wall_s": time.time() - start, "log": p.stderr, "cmd": " ".join(cmd)}
    if m := AGG_RE.search(p.stderr):
        out["tokens"], out["tok_s"] = int(m.group(3)), float(m.group(5))
    if m := LAT_RE.search(p.stderr):
        out["p50_ms"], out["p95_ms"] = float(m.group(1)), float(m.group(2))
    if m := FLASH_RE.search(p.stderr):
        out["mib_per_token"], out["hit_pct"] = float(m.group(1)), float(m.group(3))
        out["distinct"], out["routed"] = int(m.group(4)), int(m.group(5))
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default=os.path.join(REPO, "bench", "out", "models", "qwen3-30b-a3b.gguf"))
    ap.add_argument("--preset", default="qwen3-30b-a3b", help="bmoe-synth preset written to --model when missing")
    ap.add_argument("--ram-gib", type=float, default=11.0)
    ap.add_argument("--caches", default="0,4000")
    ap.add_argument("--batches", default="1,2,4,8")
    ap.add_argument("--tokens", type=int, default=32, help="tokens per sequence")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--extra", default="--overlap", help="bmoe-cli flags for the runs with a cache")
    ap.add_argument("--route-replay", default=None, metavar="TRACE",
                    help="force the routing from this trace, sequence i from its decode step i x --stride")
    ap.add_argument("--stride", type=int, default=16, help="trace steps between two sequences' replays")
    ap.add_argument("--sequences", type=int, default=0, help="prompts per run, the same at every B (default: B)")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    ensure_model(args.model, args.preset, "--vocab", "tiny")
    if not cgroup_available():
        raise SystemExit("bench_parallel: needs root and a writable cgroup-v1 memory controller for the cap")
    if args.out:
        os.makedirs(args.out, exist_ok=True)
    rows = []
    for cache in (int(c) for c in args.caches.split(",")):
        base = None
        for batch in (int(b) for b in args.batches.split(",")):
            drop_page_cache()
            with MemoryCap("bmoe-bench-parallel", int(args.ram_gib * (1 << 30))) as cap:
                r = run(args.model, batch, cache, args, cap.prefix())
            log(f"cache {cache} B {batch}: exit {r['exit']}, {r.get('tok_s')} tok/s, {r.get('mib_per_token')} MiB/token")
            if args.out:
                with open(os.path.join(args.out, f"c{cache}-b{batch}.log"), "w") as f:
                    f.write(r["cmd"] + "\n" + r["log"])
            if r["exit"] != 0 or "tok_s" not in r:
                rows.append(f"| {cache} | {batch} | failed (exit {r['exit']}) | | | | | | |")
                continue
            base = base or r
            rows.append(f"| {cache} | {batch} | {r['tok_s']:.2f} | {r['tok_s'] / base['tok_s']:.2f}x | {r['p50_ms']:.0f} / "
                        f"{r['p95_ms']:.0f} | {r['mib_per_token']:.1f} | {r['mib_per_token'] / base['mib_per_token']:.2f} | "
                        f"{r['hit_pct']:.1f} | {r['distinct'] / r['routed']:.2f} |")
    routing = (f"routing replayed from {os.path.basename(args.route_replay)}, sequence i from its decode step i x {args.stride}"
               if args.route_replay else "the model's own routing (random weights)")
    runs = f"{args.sequences} sequences per run, B at once" if args.sequences else "B sequences per run"
    print(f"{os.path.basename(args.model)}, --moe-stream under a {args.ram_gib:g} GiB cgroup cap, {args.threads} threads, "
          f"{args.tokens} tokens per sequence, {runs}, greedy, {routing}\n")
    print("| cache MiB | B | aggregate tok/s | vs B=1 | token latency p50 / p95 ms | flash MiB / token | vs B=1 | hit % | "
          "distinct / routed experts |")
    print("|---|---|---|---|---|---|---|---|---|")
    print("\n".join(rows))


if __name__ == "__main__":
    main()
