#!/usr/bin/env python3
"""Time to first token for a one-page prompt on the full Qwen3-30B-A3B shape, streamed under an
emulated phone's RAM cap, against bmoe's own resident prefill of the same file, and the cache
hit rate of the decode tokens after it (the model's own routing).

Runs, alternated over --repeats, the streamed ones cold (page cache dropped):
  resident        bmoe, the whole file mapped and paged in by an untimed run first, no cap (the
                  18.55 GB file fits this machine's RAM)
  cN-bB           --moe-stream --cache-mb N, prompt batch B, inside the cgroup cap
  short-cN        the same streamed config after a short prompt (the decode hit rate to compare)
Prints a markdown table; with --out, keeps each run's stderr log there.

    bench/bench_prompt_streamed.py [--ram-gib 11] [--caches 0,4000] [--batches 512,2048] [--decode 64]
"""
import argparse
import json
import os
import re
import subprocess
import time

from cgroup import MemoryCap, available as cgroup_available, drop_page_cache
from common import PROMPT, REPO, ensure_model, log, machine, tool

PROMPT_RE = re.compile(r"^prompt: (\d+) tokens, ([\d.]+) s, ([\d.]+) tok/s", re.M)
CACHE_RE = re.compile(r"moe-cache: budget (\d+) MiB, hit ([\d.]+) %")
GEN_RE = re.compile(r"generation: (\d+) tokens, ([\d.]+) s/token, ([\d.]+) tok/s")


def run(model, prompt_file, flags, decode, threads, prefix=()):
    cmd = [*prefix, tool("bmoe-cli"), "-m", model, "-f", prompt_file, "-n", str(decode), "-t", str(threads),
           "--ignore-eos", "-c", "4096", "--progress", *flags]
    start = time.time()
    p = subprocess.run(cmd, capture_output=True, text=True)
    out = {"exit": p.returncode, "wall_s": time.time() - start, "log": p.stderr}
    if m := PROMPT_RE.search(p.stderr):
        out["prompt_tokens"], out["ttft_s"], out["prompt_tok_s"] = int(m.group(1)), float(m.group(2)), float(m.group(3))
    if m := CACHE_RE.search(p.stderr):
        out["decode_hit_pct"] = float(m.group(2))
    if m := GEN_RE.search(p.stderr):
        out["decode_tok_s"] = float(m.group(3))
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default=os.path.join(REPO, "bench", "out", "models", "qwen3-30b-a3b.gguf"))
    ap.add_argument("--ram-gib", type=float, default=11.0)
    ap.add_argument("--caches", default="0,4000")
    ap.add_argument("--batches", default="512,2048")
    ap.add_argument("--decode", type=int, default=64)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument("--extra", default="--overlap", help="bmoe-cli flags for every streamed run")
    ap.add_argument("--no-resident", action="store_true")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    ensure_model(args.model, "qwen3-30b-a3b")
    long_prompt = os.path.join(REPO, "bench", "prompts", "one-page.txt")
    short_prompt = os.path.join(REPO, "bench", "out", "short-prompt.txt")
    os.makedirs(os.path.dirname(short_prompt), exist_ok=True)
    with open(short_prompt, "w") as f:
        f.write(PROMPT)
    if not cgroup_available():
        raise SystemExit("needs the cgroup-v1 memory controller (root)")
    configs = []
    if not args.no_resident:
        configs.append(("resident", long_prompt, [], False))
    for cache in args.caches.split(","):
        for batch in args.batches.split(","):
            configs.append((f"c{cache}-b{batch}", long_prompt,
                            ["--moe-stream", "--cache-mb", cache, "-b", batch, *args.extra.split()], True))
        configs.append((f"short-c{cache}", short_prompt, ["--moe-stream", "--cache-mb", cache, *args.extra.split()], True))
    results = {name: [] for name, *_ in configs}
    for r in range(args.repeats):
        for name, prompt, flags, capped in configs:
            if capped:
                drop_page_cache()
            else:
                # Resident means in memory: an untimed run pages the whole file in first.
                run(args.model, prompt, flags, 1, args.threads)
            time.sleep(5)
            if capped:
                with MemoryCap("bmoe-prompt", int(args.ram_gib * (1 << 30))) as cap:
                    res = run(args.model, prompt, flags, args.decode, args.threads, cap.prefix())
                    res["max_rss_gib"] = cap.max_usage() / (1 << 30)
                    res["oom_kills"] = cap.oom_kills()
            else:
                res = run(args.model, prompt, flags, args.decode, args.threads)
            log(f"repeat {r + 1} {name}: " + json.dumps({k: v for k, v in res.items() if k != "log"}))
            if args.out:
                os.makedirs(args.out, exist_ok=True)
                with open(os.path.join(args.out, f"{name}-r{r + 1}.log"), "w") as f:
                    f.write(res["log"])
            results[name].append(res)
    resident = [x["ttft_s"] for x in results.get("resident", []) if "ttft_s" in x]
    base = min(resident) if resident else None
    print("| run | prompt tokens | time to first token, s | prompt tok/s | vs resident | decode hit % (after) | decode tok/s | peak memory GiB |")
    print("|---|---|---|---|---|---|---|---|")
    for name, *_ in configs:
        for x in results[name]:
            ratio = f"{x['ttft_s'] / base:.2f}x" if base and "ttft_s" in x else "n/a"
            print(f"| {name} | {x.get('prompt_tokens', 'n/a')} | {x.get('ttft_s', float('nan')):.1f} | "
                  f"{x.get('prompt_tok_s', float('nan')):.2f} | {ratio} | {x.get('decode_hit_pct', 'n/a')} | "
                  f"{x.get('decode_tok_s', float('nan')):.2f} | {x.get('max_rss_gib', float('nan')):.2f} |")
    print(f"\n{os.path.basename(args.model)}, -t {args.threads}, {args.decode} decode tokens, cap {args.ram_gib} GiB for "
          f"streamed runs ({args.extra}), own routing, cold page cache per run, {machine()}")


if __name__ == "__main__":
    main()
