#!/usr/bin/env python3
"""Early reads of hash-routed layers (deepseek4), off vs on, streamed under a cgroup-v1 memory cap.

Each round runs bmoe-cli twice on the same streamed model, once with --no-early-reads (A) and
once with the default (B, the hash-routed layers' experts read at the start of every pass), in
alternating order (A B, then B A, ...) so the shared machine's load falls on both alike; every
run starts from a dropped page cache inside the cap and records the load average. Output is the
same either way (the runs' generated text is compared); what changes is when the bytes arrive.
Prints a Markdown table of medians (prompt and decode tok/s, flash MiB/token, hit %, early reads)
and writes every run as CSV.

    bench/bench_early_reads.py --model M.gguf [--ram-gib 2] [--cache-mb 0] [--rounds 3] [-n 32]
                               [--csv out.csv] [-- extra bmoe-cli flags]
"""
import argparse
import csv
import os
import re
import statistics
import sys

sys.path.insert(0, os.path.dirname(__file__))
from common import PROMPT, log, machine, tool  # noqa: E402
from cgroup import available as cgroup_available, run_capped  # noqa: E402

PATTERNS = {
    "prompt_tps": re.compile(r"^prompt: \d+ tokens, [\d.]+ s, ([\d.]+) tok/s", re.M),
    "decode_tps": re.compile(r"^generation: \d+ tokens, [\d.]+ s/token, ([\d.]+) tok/s", re.M),
    "flash_mib_per_tok": re.compile(r"flash read ([\d.]+) MiB/tok", re.M),
    "stall_s_per_tok": re.compile(r"stall ([\d.]+) s/tok", re.M),
    "compute_s_per_tok": re.compile(r"^moe-stream: compute ([\d.]+)", re.M),
    "budget_mib": re.compile(r"^moe-cache: budget (\d+) MiB", re.M),
    "hit_pct": re.compile(r"^moe-cache: budget \d+ MiB, hit ([\d.]+) %", re.M),
    "early_reads": re.compile(r"^moe-early: (\d+) experts", re.M),
    "early_used": re.compile(r"^moe-early: \d+ experts .*?, (\d+) used", re.M),
}


def run_once(args, early, extra):
    load = open("/proc/loadavg").read().split()[0]
    cmd = [tool("bmoe-cli"), "-m", args.model, "-p", PROMPT, "-n", str(args.n), "-t", str(args.threads),
           "--ignore-eos", "--moe-stream", "--cache-mb", str(args.cache_mb), *extra]
    if not early:
        cmd.append("--no-early-reads")
    p = run_capped(cmd, "bmoe-early", args.ram_gib, capture_output=True, text=True, timeout=args.timeout)
    if p.returncode != 0:
        sys.exit(f"{' '.join(cmd)} failed ({p.returncode}): {p.stderr[-1500:]}")
    row = {"early": int(early), "loadavg1_before": float(load)}
    for key, pattern in PATTERNS.items():
        m = pattern.search(p.stderr)
        row[key] = float(m.group(1)) if m else 0.0
    row["loadavg1_after"] = float(open("/proc/loadavg").read().split()[0])
    return row, p.stdout


def median(rows, key):
    return statistics.median(r[key] for r in rows)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", required=True)
    ap.add_argument("--ram-gib", type=float, default=2.0, help="cgroup-v1 memory cap (0: none)")
    ap.add_argument("--cache-mb", default="0", help="bmoe-cli --cache-mb (0: every expert read every step)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("-n", type=int, default=32, help="tokens generated per run")
    ap.add_argument("-t", "--threads", type=int, default=2)
    ap.add_argument("--timeout", type=int, default=1800)
    ap.add_argument("--csv", default="")
    args, extra = ap.parse_known_args()
    extra = [x for x in extra if x != "--"]
    if args.ram_gib > 0 and not cgroup_available():
        sys.exit("cgroup-v1 memory controller not writable (run as root, or --ram-gib 0)")
    rows, texts = [], {}
    for r in range(args.rounds):
        for early in ((False, True) if r % 2 == 0 else (True, False)):
            row, text = run_once(args, early, extra)
            row["round"] = r + 1
            rows.append(row)
            texts.setdefault(early, text)
            log(f"round {r + 1} early={int(early)}: prompt {row['prompt_tps']} tok/s, decode {row['decode_tps']} tok/s, "
                f"{row['flash_mib_per_tok']} MiB/tok, load {row['loadavg1_before']}")
    if texts.get(False) != texts.get(True):
        sys.exit("the generated text differs with and without early reads: the lossless rule is broken")
    if args.csv:
        with open(args.csv, "w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=list(rows[0].keys()))
            w.writeheader()
            w.writerows(rows)
    print(f"{os.path.basename(args.model)}, cap {args.ram_gib} GiB, --cache-mb {args.cache_mb}, {args.n} tokens, "
          f"{args.threads} threads, {args.rounds} rounds alternated; {machine()}; extra flags: {' '.join(extra) or 'none'}\n")
    print("| early reads | prompt tok/s | decode tok/s | compute s/tok | stall s/tok | flash MiB/tok | cache MiB | hit % | "
          "early reads (used) | load avg |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for early in (False, True):
        sel = [r for r in rows if r["early"] == int(early)]
        loads = ", ".join(f"{r['loadavg1_before']:.1f}" for r in sel)
        print(f"| {'on' if early else 'off (--no-early-reads)'} | {median(sel, 'prompt_tps'):.3f} | "
              f"{median(sel, 'decode_tps'):.3f} | {median(sel, 'compute_s_per_tok'):.3f} | "
              f"{median(sel, 'stall_s_per_tok'):.3f} | {median(sel, 'flash_mib_per_tok'):.1f} | "
              f"{median(sel, 'budget_mib'):.0f} | {median(sel, 'hit_pct'):.1f} | "
              f"{median(sel, 'early_reads'):.0f} ({median(sel, 'early_used'):.0f}) | {loads} |")
    off = [r for r in rows if not r["early"]]
    on = [r for r in rows if r["early"]]
    print(f"\nratio on/off (medians): prompt {median(on, 'prompt_tps') / max(median(off, 'prompt_tps'), 1e-9):.3f}x, "
          f"decode {median(on, 'decode_tps') / max(median(off, 'decode_tps'), 1e-9):.3f}x; generated text identical.")


if __name__ == "__main__":
    main()
