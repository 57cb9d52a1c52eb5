#!/usr/bin/env python3
"""What streaming itself costs: resident vs streamed decode on the same file, per token.

On the full Qwen3-30B-A3B shape (bmoe-synth writes it once), alternated over --pairs:
  resident       bmoe with --no-moe-stream, no cap, the file paged in first (it fits this
                 machine's RAM): the speed streaming is measured against
  cold           --moe-stream --cache-mb N under the RAM cap, page cache dropped, empty expert
                 cache (it saves its cache to a --cache-file at the end)
  warm           the same, warm-started from the cold run's --cache-file
and their variants, parts joined by '-': overlap (--overlap), uring (--io-engine uring), pf
(--prefetch 2 --predictor affinity: the routing history predicts the replayed trace, the
routers do not), e.g. cold-uring, warm-uring-overlap-pf; every run routed by the replayed phone trace (--route-replay), greedy, --tokens tokens. Each run
is wrapped in `perf stat` (context switches, CPU migrations, page faults, task clock over the
whole process life, load included); the per-token figures come from bmoe-cli's --csv, split
into the steady state (tokens whose step began with the expert cache full) and the whole run.
Prints a markdown table and the streamed/resident ratios; --out keeps logs, CSVs and JSON.

    bench/bench_streaming_cost.py --out bench/results/DATE/streaming-cost [--tokens 512] [--pairs 2]
    bench/bench_streaming_cost.py --cli /path/to/old/bmoe-cli ...   (an earlier build, same table)
"""
import argparse
import csv
import json
import os
import statistics
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from cgroup import MemoryCap, available as cgroup_available, drop_page_cache  # noqa: E402
from common import PROMPT, REPO, ensure_model, log, machine, tool  # noqa: E402

TRACE = os.path.join(REPO, "..", "shared", "data", "route-traces", "qwen3-30b-a3b-k6.route.csv")
PERF_EVENTS = "task-clock,context-switches,cpu-migrations,page-faults"


def page_in(path):
    """Reads the whole file so a resident run finds it in the page cache."""
    with open(path, "rb") as f:
        while f.read(64 << 20):
            pass


def perf_totals(path):
    """perf stat -x, output -> {event: value}."""
    out = {}
    try:
        with open(path) as f:
            for line in f:
                parts = line.strip().split(",")
                if len(parts) > 2 and parts[0] and parts[0][0].isdigit():
                    out[parts[2]] = float(parts[0])
    except OSError:
        pass
    return out


def csv_costs(path, steady_only):
    """Per-token means from a bmoe-cli --csv (the steady rows, or all)."""
    try:
        with open(path) as f:
            rows = list(csv.DictReader(f))
    except OSError:
        return None
    if steady_only and rows and "steady" in rows[0]:
        rows = [r for r in rows if r["steady"] == "1"]
    if not rows:
        return None
    n = len(rows)

    def mean(key):
        return sum(float(r[key]) for r in rows) / n if key in rows[0] else None

    hits = sum(int(r["cache_hits"]) for r in rows)
    routed = sum(int(r["experts_routed"]) for r in rows)
    return {"tokens": n, "tok_s": 1000.0 / mean("wall_ms"), "compute_ms": mean("compute_ms"), "stall_ms": mean("stall_ms"),
            "cpu_ms": mean("cpu_ms"), "switches": mean("context_switches"), "faults": mean("minor_faults"),
            "allocations": sum(int(r.get("buffer_allocations", 0) or 0) for r in rows),
            "hit_pct": 100.0 * hits / routed if routed else None, "first": int(rows[0]["index"])}


def run(name, args, model, out, tag, cache_file):
    stem = os.path.join(out, tag)
    cmd = [args.cli, "-m", model, "-p", PROMPT, "-n", str(args.tokens), "-t", str(args.threads), "--ignore-eos",
           "--csv", stem + ".csv", "--route-replay", args.trace]
    cap = None
    if name == "resident":
        page_in(model)
        cmd += ["--no-moe-stream"]  # with neither flag a model that does not fit would stream
    else:
        drop_page_cache()
        cmd += ["--moe-stream", "--cache-mb", str(args.cache_mb), "--io-threads", str(args.lanes), "--cache-file", cache_file]
        parts = name.split("-")
        cmd += ["--overlap"] if "overlap" in parts else []
        cmd += ["--io-engine", "uring"] if "uring" in parts else []
        cmd += ["--prefetch", "2", "--predictor", "affinity"] if "pf" in parts else []
        cap = MemoryCap(f"bmoe-cost-{os.getpid()}-{tag}", int(args.ram_gib * (1 << 30)))
    perf = ["perf", "stat", "-x,", "-e", PERF_EVENTS, "-o", stem + ".perf"]
    start = time.time()
    if cap:
        cap.__enter__()
    try:
        full = perf + (cap.prefix() if cap else []) + cmd
        p = subprocess.run(full, capture_output=True, text=True, cwd=REPO)
    finally:
        if cap:
            cap.__exit__(None, None, None)
    with open(stem + ".log", "w") as f:
        f.write(p.stderr)
    record = {"config": name, "tag": tag, "exit": p.returncode, "seconds": time.time() - start, "command": full,
              "perf": perf_totals(stem + ".perf"), "steady": csv_costs(stem + ".csv", True),
              "whole": csv_costs(stem + ".csv", False)}
    with open(stem + ".run.json", "w") as f:
        json.dump(record, f, indent=1)
    s = record["steady"] or {}
    log(f"  {tag}: exit {p.returncode}, {s.get('tok_s', 0):.2f} tok/s steady over {s.get('tokens', 0)} tokens")
    return record


def fmt(v, spec):
    return "-" if v is None else format(v, spec)


def table(records):
    lines = ["| run | steady tokens | tok/s steady | tok/s whole | compute ms/tok | stall ms/tok | CPU ms/tok | "
             "switches/tok | faults/tok | buffer allocs | hit % | migrations (run) | switches (run) |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in records:
        s, w, p = r["steady"] or {}, r["whole"] or {}, r["perf"]
        lines.append(f"| {r['tag']} | {s.get('tokens', 0)} from {s.get('first', '-')} | {fmt(s.get('tok_s'), '.2f')} | "
                     f"{fmt(w.get('tok_s'), '.2f')} | {fmt(s.get('compute_ms'), '.1f')} | {fmt(s.get('stall_ms'), '.1f')} | "
                     f"{fmt(s.get('cpu_ms'), '.1f')} | {fmt(s.get('switches'), '.1f')} | {fmt(s.get('faults'), '.1f')} | "
                     f"{s.get('allocations', '-')} | {fmt(s.get('hit_pct'), '.1f')} | "
                     f"{fmt(p.get('cpu-migrations'), '.0f')} | {fmt(p.get('context-switches'), '.0f')} |")
    by = {}
    for r in records:
        if r["steady"]:
            by.setdefault(r["config"], []).append(r["steady"]["tok_s"])
    med = {k: statistics.median(v) for k, v in by.items()}
    lines.append("")
    if "resident" in med:
        for k in med:
            if k != "resident":
                lines.append(f"- {k} steady / resident, medians: {med[k]:.2f} / {med['resident']:.2f} tok/s = "
                             f"**{100 * med[k] / med['resident']:.0f} %**")
    return "\n".join(lines)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", help="GGUF file (default: the qwen3-30b-a3b shape, written once)")
    ap.add_argument("--cli", default=tool("bmoe-cli"), help="bmoe-cli to run (an earlier build, say)")
    ap.add_argument("--tokens", type=int, default=512)
    ap.add_argument("--pairs", type=int, default=2, help="alternated repeats of resident, cold, warm")
    ap.add_argument("--configs", default="resident,cold,warm")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--lanes", type=int, default=4)
    ap.add_argument("--cache-mb", type=int, default=4000)
    ap.add_argument("--ram-gib", type=float, default=11.0)
    ap.add_argument("--trace", default=TRACE)
    ap.add_argument("--cooldown", type=float, default=5.0)
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    if not cgroup_available():
        sys.exit("bench_streaming_cost: the cgroup-v1 memory controller is not writable (run as root)")
    model = args.model or ensure_model(os.path.join(REPO, "bench", "out", "models", "qwen3-30b-a3b.gguf"), "qwen3-30b-a3b")
    os.makedirs(args.out, exist_ok=True)
    cache_file = os.path.join(args.out, "experts.cache")
    configs = [c for c in args.configs.split(",") if c]
    with open(os.path.join(args.out, "bench.json"), "w") as f:
        json.dump({"model": model, "machine": machine(), "args": vars(args), "started": time.strftime("%Y-%m-%dT%H:%M:%S")}, f,
                  indent=1)
    records = []
    for pair in range(args.pairs):
        for name in configs:
            if name.startswith("cold") and os.path.exists(cache_file):
                os.remove(cache_file)
            if name.startswith("warm") and not os.path.exists(cache_file):
                sys.exit("bench_streaming_cost: a warm run needs a cold run before it (its --cache-file)")
            log(f"[pair {pair + 1}/{args.pairs}] {name}")
            records.append(run(name, args, model, args.out, f"{name}-r{pair + 1}", cache_file))
            time.sleep(args.cooldown)
    if os.path.exists(cache_file):
        os.remove(cache_file)  # a run artifact, not a result
    text = table(records)
    with open(os.path.join(args.out, "table.md"), "w") as f:
        f.write(text + "\n")
    print(text)


if __name__ == "__main__":
    main()
