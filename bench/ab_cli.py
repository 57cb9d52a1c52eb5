#!/usr/bin/env python3
"""Prompt and decode tok/s of two bmoe-cli builds (A = before a change, B = after), alternated
A/B/A/B on each model so that the machine's load falls on both alike; the load average is
recorded beside every run. On a shared machine wall-clock rates swing with the load, so each
run also records CPU time: the CLI's decode CPU seconds per token and the whole process's CPU
seconds (load, prompt and decode; from the child's rusage). Prints a Markdown table of medians
and the B/A ratios, and writes the runs as CSV.

  bench/ab_cli.py --a OLD/bmoe-cli --b NEW/bmoe-cli --model M.gguf [--model ...]
                  [--rounds 5] [-n 128] [-t 1] [--prompt-repeat 12] [--csv out.csv]
"""

import argparse
import csv
import os
import re
import statistics
import subprocess
import sys

PROMPT = "The harbour town woke slowly that spring. "


def run_once(cli, model, n, threads, repeat):
    load = open("/proc/loadavg").read().split()[0]
    cmd = [cli, "-m", model, "-p", PROMPT * repeat, "-n", str(n), "-t", str(threads), "--ignore-eos"]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    err = proc.stderr.read()
    _, status, usage = os.wait4(proc.pid, 0)
    if status != 0:
        sys.exit(f"{' '.join(cmd)} failed: {err[-500:]}")
    prompt = re.search(r"^prompt: (\d+) tokens, [\d.]+ s, ([\d.]+) tok/s", err, re.M)
    gen = re.search(r"^generation: (\d+) tokens, [\d.]+ s/token, ([\d.]+) tok/s", err, re.M)
    cpu = re.search(r"^process: cpu ([\d.]+) s/tok", err, re.M)
    if not prompt or not gen or not cpu:
        sys.exit(f"no timing lines in the output of {' '.join(cmd)}")
    return {"prompt_tps": float(prompt.group(2)), "decode_tps": float(gen.group(2)),
            "decode_cpu_ms_per_tok": 1000 * float(cpu.group(1)), "process_cpu_s": usage.ru_utime + usage.ru_stime,
            "loadavg1": float(load)}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--a", required=True)
    ap.add_argument("--b", required=True)
    ap.add_argument("--model", action="append", required=True)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("-n", type=int, default=128)
    ap.add_argument("-t", type=int, default=1)
    ap.add_argument("--prompt-repeat", type=int, default=12)
    ap.add_argument("--csv")
    args = ap.parse_args()
    rows = []
    for model in args.model:
        for r in range(args.rounds):
            for build, cli in (("A", args.a), ("B", args.b)) if r % 2 == 0 else (("B", args.b), ("A", args.a)):
                rows.append({"model": model, "round": r, "build": build,
                             **run_once(cli, model, args.n, args.t, args.prompt_repeat)})
    if args.csv:
        with open(args.csv, "w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=list(rows[0]))
            w.writeheader()
            w.writerows(rows)
    keys = [("prompt_tps", "prompt tok/s"), ("decode_tps", "decode tok/s"),
            ("decode_cpu_ms_per_tok", "decode CPU ms/tok"), ("process_cpu_s", "process CPU s")]
    print("| model | " + " | ".join(f"{label} A | B | B/A" for _, label in keys) + " | load (1 min) |")
    print("|---" * (1 + 3 * len(keys) + 1) + "|")
    for model in args.model:
        cells = []
        for key, _ in keys:
            a, b = (statistics.median(x[key] for x in rows if x["model"] == model and x["build"] == build)
                    for build in ("A", "B"))
            cells += [f"{a:.3g}", f"{b:.3g}", f"{b / a:.3f}" if a else "-"]
        loads = [x["loadavg1"] for x in rows if x["model"] == model]
        print(f"| {model.split('/')[-1]} | " + " | ".join(cells) + f" | {min(loads):.1f}-{max(loads):.1f} |")
    print(f"\nmedians of {args.rounds} runs per build, alternated A/B; -n {args.n}, -t {args.t}, resident")

if __name__ == "__main__":
    main()
