#!/usr/bin/env python3
"""Decode speed deep in the context: bmoe (and optionally an earlier bmoe build) vs llama.cpp.

For each depth D the same D token ids (bench/prompts/one-page.txt tokenized with the model's
vocabulary, repeated to length) are fed to each engine, which then generates --tokens tokens;
the rate counts the generated tokens after the first (bmoe-cli's "generation:" line, the
oracle's decode mode), so the prompt is not in it. Runs alternate (before, bmoe, llama.cpp, ...)
so all see the same machine state; the load average at each run's start is logged and
summarised, since this machine is shared. Default flags on every side: bmoe-cli resident (the
cut fits), f16 KV, its default attention; llama.cpp's defaults through node-llama-cpp (f16 KV,
flash attention "auto").

    bench/bench_decode_depth.py [--layers 12] [--depths 512,2048,8192] [--tokens 32] [--threads 2]
                                [--repeats 1] [--before PATH/TO/OLD/bmoe-cli] [--peer-depths 512,2048]
                                [--model PATH.gguf] [--csv runs.csv]

Besides the wall rate, each bmoe run's process CPU time per generated token is kept (bmoe-cli's
"process: cpu" line, both threads): on a shared machine it moves less with the load.
"""
import argparse
import json
import os
import re
import statistics
import subprocess
import tempfile

from bench_prompt import prompt_ids
from common import ORACLE, REPO, ensure_model, log, machine, tool

GEN_RE = re.compile(r"generation: (\d+) tokens, ([\d.]+) s/token, ([\d.]+) tok/s")
CPU_RE = re.compile(r"process: cpu ([\d.]+) s/tok")
CPU_MS = {}  # (cli, number of ids) -> CPU ms per token of the last run


def load():
    with open("/proc/loadavg") as f:
        return float(f.read().split()[0])


def run_bmoe(cli, model, ids, n, threads):
    p = subprocess.run([cli, "-m", model, "--prompt-ids", ",".join(map(str, ids)), "-n", str(n), "-t", str(threads),
                        "-c", str(max(4096, len(ids) + n + 64)), "--ignore-eos", "--no-moe-stream"],
                       capture_output=True, text=True)
    m = GEN_RE.search(p.stderr)
    if p.returncode != 0 or not m:
        log(p.stderr[-2000:])
        return None
    c = CPU_RE.search(p.stderr)
    CPU_MS[(cli, len(ids))] = float(c.group(1)) * 1e3 if c else None
    return float(m.group(3))


def run_llama(model, ids, n, threads):
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
        json.dump(ids, f)
        name = f.name
    try:
        p = subprocess.run(["node", ORACLE, "decode", model, name, str(n), str(threads)], capture_output=True,
                           text=True, cwd=REPO)
        return json.loads(p.stdout.strip().splitlines()[-1])["tok_s"]
    except Exception:
        log((p.stderr or "")[-2000:])
        return None
    finally:
        os.unlink(name)


def mean(values):
    v = [x for x in values if x]
    return statistics.mean(v) if v else float("nan")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--layers", type=int, default=12)
    ap.add_argument("--depths", default="512,2048,8192")
    ap.add_argument("--tokens", type=int, default=32)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument("--before", default=None, help="an earlier build's bmoe-cli, run alternated with this one")
    ap.add_argument("--peer-depths", default=None, help="depths at which llama.cpp runs too (default: all)")
    ap.add_argument("--model", default=None, help="an existing cut (default: bench/out/models/, written if absent)")
    ap.add_argument("--csv", default=None, help="write every run (depth, repeat, engine, tok/s, CPU ms/token, load)")
    args = ap.parse_args()
    model = args.model or os.path.join(REPO, "bench", "out", "models", f"qwen3-30b-a3b-{args.layers}l.gguf")
    if not args.model:
        ensure_model(model, "qwen3-30b-a3b", "--layers", str(args.layers))
    clis = {"before": args.before, "bmoe": tool("bmoe-cli")}
    rows = []
    engines = [("before", lambda ids: run_bmoe(args.before, model, ids, args.tokens, args.threads))] if args.before else []
    engines += [("bmoe", lambda ids: run_bmoe(tool("bmoe-cli"), model, ids, args.tokens, args.threads)),
                ("llama.cpp", lambda ids: run_llama(model, ids, args.tokens, args.threads))]
    for _, run in engines:  # untimed: the file comes into the page cache for every engine
        run(prompt_ids(model, 64))
    results, loads = {}, []
    peer_depths = [int(x) for x in (args.peer_depths or args.depths).split(",")]
    for depth in [int(x) for x in args.depths.split(",")]:
        ids = prompt_ids(model, depth)
        for r in range(args.repeats):
            for name, run in engines:
                if name == "llama.cpp" and depth not in peer_depths:
                    continue
                loads.append(load())
                t = run(ids)
                results.setdefault((depth, name), []).append(t)
                cpu = CPU_MS.get((clis.get(name), len(ids))) if name in clis else None
                rows.append((depth, r + 1, name, t, cpu, loads[-1]))
                log(f"depth {depth} repeat {r + 1}: {name} {t} tok/s, cpu {cpu} ms/token (load {loads[-1]:.1f})")
    if args.csv:
        with open(args.csv, "w") as f:
            f.write("depth,repeat,engine,tok_s,cpu_ms_per_token,load_at_start\n")
            for row in rows:
                f.write(",".join("" if x is None else str(x) for x in row) + "\n")
    names = [n for n, _ in engines]
    print(f"Decode at depth: {os.path.basename(model)}, {args.tokens} tokens, -t {args.threads}; {machine()}; "
          f"load average at run starts {min(loads):.1f}-{max(loads):.1f} (mean {mean(loads):.1f})\n")
    print("| depth | " + " | ".join(f"{n} tok/s" for n in names) + " | bmoe / llama.cpp |"
          + (" bmoe / before |" if args.before else "") + " bmoe / bmoe at the first depth |")
    print("|---" * (len(names) + 3 + (1 if args.before else 0)) + "|")
    first = None
    for depth in [int(x) for x in args.depths.split(",")]:
        m = {n: mean(results.get((depth, n), [])) for n in names}
        first = first or m["bmoe"]
        row = [str(depth)] + [f"{m[n]:.2f}" for n in names] + [f"{m['bmoe'] / m['llama.cpp']:.2f}x"]
        if args.before:
            row.append(f"{m['bmoe'] / m['before']:.2f}x")
        row.append(f"{m['bmoe'] / first:.0%}")
        print("| " + " | ".join(row) + " |")
    bmoe_names = [n for n in names if n in clis]
    print("\nProcess CPU ms per generated token (both threads; mean of the repeats), and the speed in CPU terms "
          "against the first depth:\n")
    print("| depth | " + " | ".join(f"{n} CPU ms" for n in bmoe_names) + " | "
          + " | ".join(f"{n} at the first depth" for n in bmoe_names) + " |")
    print("|---" * (1 + 2 * len(bmoe_names)) + "|")
    firsts = {}
    for depth in [int(x) for x in args.depths.split(",")]:
        c = {n: mean([row[4] for row in rows if row[0] == depth and row[2] == n]) for n in bmoe_names}
        for n in bmoe_names:
            firsts.setdefault(n, c[n])
        print("| " + " | ".join([str(depth)] + [f"{c[n]:.0f}" for n in bmoe_names]
                                + [f"{firsts[n] / c[n]:.0%}" for n in bmoe_names]) + " |")


if __name__ == "__main__":
    main()
