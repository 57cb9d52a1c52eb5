#!/usr/bin/env python3
"""MTP drafting (--mtp) at set acceptance rates, against plain decoding in the same run.

Random weights make the MTP head's own guesses almost always wrong, so the rates trained heads
reach are set with --draft-oracle FILE --draft-accept P: the head still runs over every new
trunk row and chains its guesses (its compute and its own expert reads are paid), and only its
proposals are replaced by the plain run's tokens, each right with probability P. Every drafted
run must print exactly the plain run's tokens (checked). Plain decoding runs before every drafted
run and once after the last (A/B/A/B...), and each drafted run is compared with the mean of the
two plain runs beside it, so a load that drifts during the sweep moves both sides of a ratio;
the 1-minute load average is recorded before every run.

Per run: tok/s, acceptance (kept / drafted), tokens per forward pass (generated tokens over
trunk passes), and, streamed, flash MiB per *generated* token; bmoe-cli's profile of the
verification passes and the drafter (time, distinct expert lookups, their cache hits, and MiB
per pass or call).
Model: the family's real shape (bmoe-synth preset with its MTP block), greedy, its own routing
(random weights) or a real trace's (--route-replay in --stream).

    bench/bench_mtp.py --model /work/models-mtp/qwen36-cut4.gguf --out bench/results/DATE/mtp-resident
    bench/bench_mtp.py --model M --stream "--moe-stream --cache-mb 3000 --overlap" --ram-gib 11 --out ...
"""
import argparse
import datetime
import json
import os
import re
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from cgroup import run_capped  # noqa: E402
from common import REPO, log, machine, tool  # noqa: E402

PROMPT = ("Write a detailed essay about the history of computing, from the abacus and the "
          "Antikythera mechanism to modern processors, covering the key inventions and people.")
GEN_RE = re.compile(r"generation: (\d+) tokens, ([\d.]+) s/token, ([\d.]+) tok/s")
READ_RE = re.compile(r"flash read ([\d.]+) MiB/tok")
SPEC_RE = re.compile(r"speculative: drafted (\d+), accepted (\d+) \([\d.]+ %\), (\d+) verify passes")
# bmoe-cli's per-step profile: "  verify: N steps, R rows each, T ms, L expert lookups (H % hits), M MiB read"
# (resident runs, and builds before the hits were counted, print no "(H % hits)")
STEP_RE = re.compile(r"  (plain|verify|drafter): (\d+) steps, ([\d.]+) [a-z ]+ each, ([\d.]+) ms, ([\d.]+) expert lookups"
                     r"(?: \((\d+) % hits\))?, ([\d.]+) MiB read")


def loadavg():
    with open("/proc/loadavg") as f:
        return float(f.read().split()[0])


RUNS = [0]


def run(args, flags, tag):
    load = loadavg()
    RUNS[0] += 1
    cmd = [tool("bmoe-cli"), "-m", args.model, "-p", PROMPT, "-n", str(args.tokens), "-t", str(args.threads),
           "--ignore-eos", "--json", *args.stream.split(), *flags]
    p = run_capped(cmd, "bmoe-mtp", args.ram_gib, capture_output=True, text=True, cwd=REPO, timeout=args.timeout)
    with open(os.path.join(args.out, tag + ".log"), "w") as f:
        f.write(p.stderr)
    m = GEN_RE.search(p.stderr)
    if p.returncode != 0 or not m:
        sys.exit(f"{tag}: failed (exit {p.returncode}): {p.stderr.strip().splitlines()[-1:]}")
    out = json.loads(p.stdout.strip().splitlines()[-1])
    r = {"tag": tag, "flags": flags, "tok_s": float(m.group(3)), "tokens": out["tokens"], "prompt": out["prompt"],
         "load": load, "seq": RUNS[0]}
    # The report's MiB/tok divides by generated tokens: a verification pass's reads are shared
    # by the tokens it kept.
    if (mr := READ_RE.search(p.stderr)):
        r["mib_per_token"] = float(mr.group(1))
    passes = len(r["tokens"]) - 1  # tokens fed after the prompt: one pass each when plain
    if (ms := SPEC_RE.search(p.stderr)):
        r["drafted"], r["accepted"] = int(ms.group(1)), int(ms.group(2))
        passes -= r["accepted"]  # a kept draft token rode on an earlier pass
    r["tokens_per_pass"] = len(r["tokens"]) / max(1, passes)
    for kind, steps, rows, ms, lookups, hits, mib in STEP_RE.findall(p.stderr):
        r[kind] = {"steps": int(steps), "rows": float(rows), "ms": float(ms), "lookups": float(lookups),
                   "hit_pct": int(hits) if hits else "?", "mib": float(mib)}
    log(f"  {tag}: {r['tok_s']:.2f} tok/s" + (f", {r['mib_per_token']:.1f} MiB/tok" if "mib_per_token" in r else "")
        + f", load {load:.1f}")
    return r


def route_replay(flags):
    f = flags.split()
    return f[f.index("--route-replay") + 1] if "--route-replay" in f else ""


def step_cell(c, rows):
    if not c or not c["steps"]:
        return "—"
    return (f"{c['steps']}, " + (f"{c['rows']:.2f}, " if rows else "") +
            f"{c['ms']:.0f}, {c['lookups']:.1f}, {c['hit_pct']} %, {c['mib']:.1f}")


def write_csv(path, rows):
    """One line per run, in the order they ran (plain and drafted alternate)."""
    order = sorted(rows, key=lambda r: r["seq"])
    cols = ["seq", "tag", "load", "tok_s", "mib_per_token", "set_accept", "k", "drafted", "accepted", "tokens_per_pass"]
    with open(path, "w") as f:
        f.write(",".join(cols + ["drafter_hit_pct", "drafter_mib_per_call"]) + "\n")
        for r in order:
            d = r.get("drafter") or {}
            cells = [r.get(c, "") for c in cols] + [d.get("hit_pct", ""), d.get("mib", "")]
            f.write(",".join(f"{c:.3f}" if isinstance(c, float) else str(c) for c in cells) + "\n")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--stream", default="", help="run flags for the streamed case, e.g. '--moe-stream --cache-mb 3000'")
    ap.add_argument("--ram-gib", type=float, default=0, help="cgroup memory cap (0: none)")
    ap.add_argument("--accept", default="0,0.5,0.7,0.9")
    ap.add_argument("--drafts", default="1,2,3,4")
    ap.add_argument("--timeout", type=int, default=3600)
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    plain = [run(args, [], "plain-0")]
    oracle = os.path.join(args.out, "plain.json")
    with open(oracle, "w") as f:
        json.dump({"prompt": plain[0]["prompt"], "tokens": plain[0]["tokens"]}, f)
    drafted = []
    for acc in args.accept.split(","):
        for k in args.drafts.split(","):
            flags = ["--mtp", "--draft", k, "--draft-oracle", oracle, "--draft-accept", acc]
            r = run(args, flags, f"mtp-accept{acc}-k{k}")
            r["set_accept"], r["k"] = float(acc), int(k)
            r["plain_before"] = plain[-1]["tag"]
            drafted.append(r)
            plain.append(run(args, [], f"plain-{len(plain)}"))
    rows = plain + drafted
    by_tag = {r["tag"]: r for r in plain}
    base = sum(r["tok_s"] for r in plain) / len(plain)
    base_mib = sum(r.get("mib_per_token", 0) for r in plain) / len(plain)
    loads = [r["load"] for r in rows]
    table = [f"Plain decoding, {len(plain)} runs alternated with the drafted ones: {base:.2f} tok/s mean "
             f"({min(r['tok_s'] for r in plain):.2f}-{max(r['tok_s'] for r in plain):.2f})"
             + (f", {base_mib:.1f} flash MiB per token" if base_mib else "")
             + f"; 1-minute load average {min(loads):.1f}-{max(loads):.1f} over the sweep.", "",
             "| set acceptance | k | tok/s | plain tok/s beside it | vs plain | load | measured acceptance | tokens/pass "
             "| flash MiB per generated token | tokens = plain "
             "| verify: passes, rows, ms, expert lookups, hits, MiB | drafter: calls, ms, expert lookups, hits, MiB (per call) |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in drafted:
        before = by_tag[r["plain_before"]]
        after = plain[plain.index(before) + 1]
        beside = (before["tok_s"] + after["tok_s"]) / 2
        r["plain_beside"] = beside
        acc = f"{100 * r['accepted'] / r['drafted']:.0f} % of {r['drafted']}" if r.get("drafted") else "none drafted"
        mib = f"{r['mib_per_token']:.1f}" if "mib_per_token" in r else "— (resident)"
        table.append(f"| {r['set_accept']:.0%} | {r['k']} | {r['tok_s']:.2f} | {beside:.2f} | {r['tok_s'] / beside:.2f}x | "
                     f"{r['load']:.1f} | {acc} | "
                     f"{r['tokens_per_pass']:.2f} | {mib} | {'yes' if r['tokens'] == plain[0]['tokens'] else '**NO**'} | "
                     f"{step_cell(r.get('verify'), True)} | {step_cell(r.get('drafter'), False)} |")
    header = [f"# MTP drafting: {os.path.basename(args.model)}", "",
              f"{datetime.date.today()}, {machine()}; {args.tokens} tokens, {args.threads} threads, greedy, "
              + (f"routing replayed from `{os.path.basename(replay)}` (the MTP head's own layer routes itself)"
                 if (replay := route_replay(args.stream)) else "the model's own routing (random weights)")
              + f"; flags: `{args.stream or 'resident'}`"
              + (f", cgroup cap {args.ram_gib} GiB" if args.ram_gib else "") + ".", ""]
    with open(os.path.join(args.out, "results.md"), "w") as f:
        f.write("\n".join(header + table) + "\n")
    with open(os.path.join(args.out, "results.json"), "w") as f:
        json.dump([{k: v for k, v in r.items() if k not in ("tokens", "prompt")} for r in rows], f, indent=1)
    write_csv(os.path.join(args.out, "results.csv"), rows)
    print("\n".join(header + table))
    if any(r["tokens"] != plain[0]["tokens"] for r in rows):
        sys.exit("a drafted run's tokens differ from plain decoding")


if __name__ == "__main__":
    main()
