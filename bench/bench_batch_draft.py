#!/usr/bin/env python3
"""Drafting inside a batch (--parallel B with --draft k): aggregate tok/s and flash MiB per
generated token, drafting on vs off, in the same run.

Random weights make drafts almost always wrong, so the acceptance trained drafters reach is set
with --draft-oracle FILE --draft-accept P, FILE being the plain --parallel run's own --json output
(each prompt its own line, so each sequence drafts from its own continuation, each token right
with probability P); n-gram drafting (--ngram) runs as it is. Every drafted run must print exactly
the plain run's tokens for every sequence (checked). Plain runs alternate with the drafted ones
(A/B/A/B..., the last one plain) and each drafted run is compared with the mean of the two plain
runs beside it; the 1-minute load average is recorded before every run.

    bench/bench_batch_draft.py --model /work/models/qwen3.6-35b-a3b-l4.gguf \
        --stream "--moe-stream --cache-mb 600" --out bench/results/2026-12-07/batch-draft
"""
import argparse
import csv
import datetime
import json
import os
import re
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import REPO, log, tool  # noqa: E402

PROMPTS = [
    "Write a detailed essay about the history of computing, from the abacus to modern processors.",
    "Explain how a mixture-of-experts language model routes each token to a few experts.",
    "List the planets of the solar system and describe each one in two sentences.",
    "Describe a walk through an old harbour town early in the morning, in the first person.",
]
AGG_RE = re.compile(r"parallel: \d+ sequences, \d+ at once: (\d+) tokens in ([\d.]+) s of decode steps, ([\d.]+) tok/s")
FLASH_RE = re.compile(r"parallel: flash ([\d.]+) MiB per generated token .*experts (\d+) distinct of (\d+) routed")
SPEC_RE = re.compile(r"speculative: drafted (\d+), accepted (\d+) \([\d.]+ %\), (\d+) verify passes, max draft \d+; "
                     r"([\d.]+) tokens per sequence and step")


def loadavg():
    with open("/proc/loadavg") as f:
        return float(f.read().split()[0])


def run(args, flags, tag):
    load = loadavg()
    cmd = [tool("bmoe-cli"), "-m", args.model, "-f", args.prompts, "--parallel", str(args.parallel), "-n",
           str(args.tokens), "-t", str(args.threads), "--ignore-eos", "--json", *args.stream.split(), *flags]
    p = subprocess.run(cmd, capture_output=True, text=True, cwd=REPO, timeout=args.timeout)
    with open(os.path.join(args.out, tag + ".log"), "w") as f:
        f.write(" ".join(cmd) + "\n" + p.stderr)
    if p.returncode != 0:
        sys.exit(f"{tag}: bmoe-cli failed: {p.stderr[-2000:]}")
    with open(os.path.join(args.out, tag + ".jsonl"), "w") as f:
        f.write(p.stdout)
    answers = {j["index"]: j["tokens"] for j in map(json.loads, p.stdout.splitlines())}
    agg, flash, spec = AGG_RE.search(p.stderr), FLASH_RE.search(p.stderr), SPEC_RE.search(p.stderr)
    row = {"run": tag, "load1": load, "tokens": int(agg.group(1)), "decode_s": float(agg.group(2)),
           "tok_s": float(agg.group(3)), "mib_per_token": float(flash.group(1)),
           "sharing": int(flash.group(2)) / max(int(flash.group(3)), 1)}
    if spec:
        drafted, accepted = int(spec.group(1)), int(spec.group(2))
        row.update(drafted=drafted, accepted=accepted, acceptance=accepted / drafted if drafted else 0.0,
                   tokens_per_seq_step=float(spec.group(4)))
    log(f"{tag}: {row}")
    return row, answers


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", required=True)
    ap.add_argument("--stream", default="", help="extra flags, e.g. '--moe-stream --cache-mb 600'")
    ap.add_argument("--parallel", type=int, default=4)
    ap.add_argument("--tokens", type=int, default=48)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--drafts", default="2,4", help="draft lengths k")
    ap.add_argument("--accept", default="0.7,0", help="oracle acceptance rates")
    ap.add_argument("--mtp", action="store_true", help="also the MTP head at the first rate (its guesses replaced by the oracle's)")
    ap.add_argument("--timeout", type=int, default=1800)
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    args.prompts = os.path.join(args.out, "prompts.txt")
    with open(args.prompts, "w") as f:
        f.write("\n".join(PROMPTS) + "\n")
    plain, want = run(args, [], "plain-0")
    oracle = os.path.join(args.out, "plain-0.jsonl")
    cases = [(f"oracle-p{a}-k{k}", ["--draft", k, "--draft-oracle", oracle, "--draft-accept", a])
             for a in args.accept.split(",") for k in args.drafts.split(",")]
    k = args.drafts.split(",")[-1]
    cases.append((f"ngram-k{k}", ["--draft", k, "--ngram"]))
    if args.mtp:
        a = args.accept.split(",")[0]
        cases.append((f"mtp-oracle-p{a}-k{k}", ["--draft", k, "--mtp", "--draft-oracle", oracle, "--draft-accept", a]))
    rows, plains = [plain], [plain]
    for i, (tag, flags) in enumerate(cases):
        row, answers = run(args, flags, tag)
        if answers != want:
            sys.exit(f"{tag}: the drafted batch printed other tokens than the plain batch")
        after, _ = run(args, [], f"plain-{i + 1}")
        base = (plains[-1]["tok_s"] + after["tok_s"]) / 2
        row["speedup_vs_plain"] = row["tok_s"] / base
        row["mib_vs_plain"] = row["mib_per_token"] / ((plains[-1]["mib_per_token"] + after["mib_per_token"]) / 2 or 1)
        plains.append(after)
        rows += [row, after]
    fields = ["run", "load1", "tokens", "decode_s", "tok_s", "mib_per_token", "sharing", "drafted", "accepted",
              "acceptance", "tokens_per_seq_step", "speedup_vs_plain", "mib_vs_plain"]
    with open(os.path.join(args.out, "runs.csv"), "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=fields)
        w.writeheader()
        w.writerows(rows)
    with open(os.path.join(args.out, "table.md"), "w") as f:
        f.write(f"# Drafting in a batch, {datetime.date.today()}\n\n`{os.path.basename(args.model)}` {args.stream}, "
                f"--parallel {args.parallel}, {args.tokens} tokens each, {args.threads} threads; every drafted run "
                "printed the plain run's tokens for every sequence.\n\n"
                "| run | load | tok/s | vs plain | MiB/token | vs plain | acceptance | tokens/seq/step |\n|---|---|---|---|---|---|---|---|\n")
        for r in rows:
            if "drafted" not in r:
                f.write(f"| {r['run']} | {r['load1']:.2f} | {r['tok_s']:.2f} | | {r['mib_per_token']:.2f} | | | 1 |\n")
                continue
            f.write(f"| {r['run']} | {r['load1']:.2f} | {r['tok_s']:.2f} | {r['speedup_vs_plain']:.2f}x | "
                    f"{r['mib_per_token']:.2f} | {r['mib_vs_plain']:.2f}x | {100 * r['acceptance']:.0f} % | "
                    f"{r['tokens_per_seq_step']:.2f} |\n")


if __name__ == "__main__":
    main()
