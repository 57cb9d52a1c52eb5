#!/usr/bin/env python3
"""Speculative decoding and the lossy speed knobs, measured side by side in one run.

Part A (lossless): --draft 0/2/4 --ngram on a repetitive prompt (code editing: the answer
repeats the prompt) and a free-form one; tok/s, flash MiB read per token, acceptance, and a
check that every drafted run produced exactly the draft-0 tokens.

Part B (lossy): each knob (--drop-cold-experts F, --route-ahead N) against the lossless run of
the same streaming configuration over a fixed prompt set: speed-up, and quality measured as
agreement with the lossless greedy output (share of positions with the same token, and the
first position where they differ). No real weights exist here, so agreement with the lossless
output is the only quality measure that does not depend on what our random weights "know".

All runs use the model's own routing (a route replay would override --route-ahead), inside
the cgroup memory cap, page cache dropped before each.

    bench/bench_speculative.py --model bench/out/models/qwen3-30b-a3b.gguf --ram-gib 11 \\
        --out bench/results/2026-12-03/speculative
"""
import argparse
import datetime
import json
import os
import re
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from cgroup import run_capped, available as cgroup_available, drop_page_cache  # noqa: E402
from common import REPO, log, machine, tool  # noqa: E402

REPETITIVE = ("Rename the variable total to sum in this function and print the whole function again:\n"
              "def add_all(values):\n    total = 0\n    for v in values:\n        total = total + v\n"
              "    return total\n\ndef add_all(values):\n    sum = 0\n    for v in values:\n")
FREE_FORM = ("Write a detailed essay about the history of computing, from the abacus and the "
             "Antikythera mechanism to modern processors, covering the key inventions and people.")
PROMPT_SET = [
    FREE_FORM,
    "Explain how a refrigerator works to a ten year old.",
    "List five ideas for a weekend trip in the mountains and say why each is fun.",
    "The meeting notes from Tuesday say that the budget",
]
GEN_RE = re.compile(r"generation: (\d+) tokens, ([\d.]+) s/token, ([\d.]+) tok/s")
READ_RE = re.compile(r"flash read ([\d.]+) MiB/tok")
HIT_RE = re.compile(r"moe-cache: budget \d+ MiB, hit ([\d.]+) %")
SPEC_RE = re.compile(r"speculative: drafted (\d+), accepted (\d+)")
FORCED_RE = re.compile(r"teacher-forced: (\d+) of (\d+) next tokens")


def run(args, prompt, flags, tag):
    cmd = [tool("bmoe-cli"), "-m", args.model, "-p", prompt, "-n", str(args.tokens), "-t", str(args.threads),
           "--ignore-eos", "--json", *args.stream.split(), *flags]
    if args.ram_gib <= 0:
        drop_page_cache()  # every run starts cold, capped or not
    p = run_capped(cmd, "bmoe-spec", args.ram_gib, capture_output=True, text=True, cwd=REPO, timeout=args.timeout)
    with open(os.path.join(args.out, tag + ".log"), "w") as f:
        f.write(p.stderr)
    m = GEN_RE.search(p.stderr)
    if p.returncode != 0 or not m:
        log(f"  {tag}: failed (exit {p.returncode}): {p.stderr.strip().splitlines()[-1:]}")
        return None
    out = json.loads(p.stdout.strip().splitlines()[-1])
    r = {"tag": tag, "flags": flags, "tok_s": float(m.group(3)), "tokens": out["tokens"], "prompt": out["prompt"]}
    if (mr := READ_RE.search(p.stderr)):
        r["mib_per_token"] = float(mr.group(1))
    if (mh := HIT_RE.search(p.stderr)):
        r["hit"] = float(mh.group(1))
    if (mf := FORCED_RE.search(p.stderr)):
        r["forced_equal"], r["forced_steps"] = int(mf.group(1)), int(mf.group(2))
    if (ms := SPEC_RE.search(p.stderr)):
        r["drafted"], r["accepted"] = int(ms.group(1)), int(ms.group(2))
    log(f"  {tag}: {r['tok_s']:.2f} tok/s" + (f", {r['mib_per_token']:.0f} MiB/tok" if "mib_per_token" in r else ""))
    return r


def agreement(ref, out):
    same = sum(1 for a, b in zip(ref, out) if a == b)
    first = next((i for i, (a, b) in enumerate(zip(ref, out)) if a != b), min(len(ref), len(out)))
    return same / max(1, len(ref)), first


def part_a(args, rows):
    table = ["| prompt | drafter | draft | tok/s | vs draft 0 | flash MiB/token | accepted | tokens identical to draft 0 |",
             "|---|---|---|---|---|---|---|---|"]
    for name, prompt in (("repetitive (code edit)", REPETITIVE), ("free-form (essay)", FREE_FORM)):
        base = None
        short = name.split()[0]
        oracle = os.path.join(args.out, f"a-{short}-oracle.json")
        runs = [("n-gram", d, ["--draft", str(d), "--ngram"] if d else []) for d in args.drafts]
        # Drafts that are right (the draft-0 output itself): what verification in one batch
        # gains when drafts are accepted, which random weights never give the n-gram drafter.
        runs += [("oracle", d, ["--draft", str(d), "--draft-oracle", oracle]) for d in args.drafts if d]
        for drafter, d, flags in runs:
            r = run(args, prompt, flags, f"a-{short}-{drafter}-draft{d}")
            rows.append(r)
            if r is None:
                table.append(f"| {name} | {drafter} | {d} | failed | | | | |")
                continue
            if base is None:
                base = r
                with open(oracle, "w") as f:
                    json.dump({"prompt": r["prompt"], "tokens": r["tokens"]}, f)
            acc = f"{100 * r['accepted'] / r['drafted']:.0f} % of {r['drafted']}" if r.get("drafted") else "none drafted"
            if d == 0:
                acc = "—"
            table.append(f"| {name} | {drafter if d else '—'} | {d} | {r['tok_s']:.2f} | {r['tok_s'] / base['tok_s']:.2f}x | "
                         f"{r.get('mib_per_token', 0):.0f} | {acc} | {'yes' if r['tokens'] == base['tokens'] else '**NO**'} |")
    return table


def part_b(args, rows):
    knobs = [(["--drop-cold-experts", str(f)], f"drop-cold-experts {f}") for f in args.drop] + \
            [(["--route-ahead", str(n)], f"route-ahead {n}") for n in args.route_ahead]
    results = {label: [] for label in ["lossless"] + [k[1] for k in knobs]}
    for i, prompt in enumerate(PROMPT_SET[:args.prompts]):
        ref = run(args, prompt, [], f"b-p{i}-lossless")
        results["lossless"].append(ref)
        reference = os.path.join(args.out, f"b-p{i}-lossless.json")
        if ref:
            with open(reference, "w") as f:
                json.dump({"prompt": ref["prompt"], "tokens": ref["tokens"]}, f)
        for flags, label in knobs:
            # Teacher-forced: the knob's model is fed the lossless tokens, so every position is
            # judged on the same context instead of drifting after the first difference.
            forced = ["--teacher-force", reference] if ref else []
            results[label].append(run(args, prompt, flags + forced, f"b-p{i}-{label.replace(' ', '')}"))
    rows.extend(r for v in results.values() for r in v)
    table = ["| knob | mean tok/s | speed-up | flash MiB/token | next-token agreement (teacher-forced) | "
             "first disagreement (per prompt) |", "|---|---|---|---|---|---|"]
    ref_speed = [r["tok_s"] for r in results["lossless"] if r]
    ref_mean = sum(ref_speed) / len(ref_speed) if ref_speed else 0
    for label, rs in results.items():
        ok = [r for r in rs if r]
        if not ok or not ref_mean:
            table.append(f"| {label} | failed | | | | |")
            continue
        speed = sum(r["tok_s"] for r in ok) / len(ok)
        mib = sum(r.get("mib_per_token", 0) for r in ok) / len(ok)
        if label == "lossless":
            agree, firsts = "100 % (reference)", "—"
        else:
            equal = sum(r.get("forced_equal", 0) for r in ok)
            steps = sum(r.get("forced_steps", 0) for r in ok)
            agree = f"{100 * equal / max(1, steps):.1f} % of {steps}"
            firsts = ", ".join(str(agreement(a["tokens"], b["tokens"])[1]) for a, b in zip(results["lossless"], rs) if a and b)
        table.append(f"| {label} | {speed:.2f} | {speed / ref_mean:.2f}x | {mib:.0f} | {agree} | {firsts} |")
    return table


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", required=True)
    ap.add_argument("--ram-gib", type=float, default=11.0)
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--stream", default="--moe-stream --cache-mb 4000 --io-threads 4 --overlap",
                    help="streaming flags of every run")
    ap.add_argument("--drafts", default="0,2,4")
    ap.add_argument("--drop", default="0.5,1.0", help="--drop-cold-experts values")
    ap.add_argument("--route-ahead", default="1,2", help="--route-ahead values")
    ap.add_argument("--parts", default="a,b")
    ap.add_argument("--prompts", type=int, default=len(PROMPT_SET), help="how many of the fixed prompts part B uses")
    ap.add_argument("--timeout", type=float, default=1800)
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    args.drafts = [int(x) for x in args.drafts.split(",") if x]
    args.drop = [float(x) for x in args.drop.split(",") if x]
    args.route_ahead = [int(x) for x in args.route_ahead.split(",") if x]
    args.out = args.out or os.path.join(REPO, "bench", "results", datetime.date.today().isoformat(), "speculative")
    os.makedirs(args.out, exist_ok=True)
    if args.ram_gib > 0 and not cgroup_available():
        sys.exit("bench_speculative: the cgroup-v1 memory controller is not writable (run as root, or --ram-gib 0)")
    rows = []
    lines = [f"# Speculative decoding and lossy knobs: {os.path.basename(args.model)}", "",
             f"- machine: {machine()}; cap {args.ram_gib} GiB (cgroup v1); -t {args.threads}; {args.tokens} tokens greedy "
             f"(--ignore-eos); streaming `{args.stream}`; the model's own routing; page cache dropped before each run",
             f"- command: `bench/bench_speculative.py {' '.join(sys.argv[1:])}`", ""]
    if "a" in args.parts:
        lines += ["## Lossless speculative decoding (--draft N --ngram)", ""] + part_a(args, rows) + [""]
    if "b" in args.parts:
        lines += ["## Lossy knobs vs the lossless output", "",
                  f"{min(args.prompts, len(PROMPT_SET))} prompts, {args.tokens} tokens each. The knob's model is fed the lossless "
                  "output (--teacher-force) and at each position its own greedy pick is compared with the lossless "
                  "token: the share that agree, and the first position that does not.", ""] + part_b(args, rows) + [""]
    with open(os.path.join(args.out, "summary.md"), "w") as f:
        f.write("\n".join(lines) + "\n")
    with open(os.path.join(args.out, "runs.json"), "w") as f:
        json.dump(rows, f, indent=1)
    print("\n".join(lines))


if __name__ == "__main__":
    main()
