#!/usr/bin/env python3
"""KL divergence between engines and between settings of one engine, on the same file and text:
is bmoe's KLD against llama.cpp larger than llama.cpp's own spread?

Every run scores the same token ids with llama-perplexity's method (chunks of --ctx from an empty
context, the second half of each scored) and saves its scored next-token distributions in
llama-perplexity's base-logits format:
  bmoe-<name>  bmoe-perplexity --kl-divergence-base (its settings: -b, -t, BMOE_ISA)
  llama-<level>-u<N>  tests/oracle/llama_kld.cpp, linked against node-llama-cpp's prebuilt
                 library (the pinned peer), one CPU level loaded (zen4 = AVX-512, haswell = AVX2),
                 each chunk one batch split into micro-batches of N (n_ubatch)
Then each pair (A, B) is compared with `llama_kld compare A B`: llama-perplexity's KLD sum
(over tokens with log p_A > -16, A's saved distribution as the base) per scored row, its mean,
median, 99th percentile and maximum, and how often the top token agrees. Both sides are the
saved 16-bit rows (llama_kld eval also prints the full-precision KLD of the first llama run
against bmoe-default, to show what the saving costs). PPL is each run's own, at full precision.

    bench/bench_kld_spread.py MODEL TEXT WORKDIR [--ctx 512] [--chunks 3] [--threads 2]
        [--runs bmoe-default,bmoe-avx2,bmoe-b32,bmoe-t1,llama-zen4-u512,llama-haswell-u512,...]
        [--pairs A:B,...] [--csv OUT.csv]

--routes also records which experts each token of the first chunk routes to, layer by layer:
bmoe-cli --route-trace (the chunk's ids as one prompt) and llama_kld with LLAMA_KLD_ROUTES for
each llama CPU level at micro-batches of n_ctx; it prints, per layer, the share of tokens whose
expert set differs between two runs and the share whose first difference is at that layer, then
the first flips (a differing set with none at an earlier layer and an earlier or equal position:
where rounding alone parted the runs) with the router's probability gap between its k-th and
(k+1)-th expert there (llama.cpp's), and that gap's median over all tokens and layers.

A run whose file is in WORKDIR already is not repeated (its PPL and load come from its .json).
Delete WORKDIR afterwards: each file is n_chunk * (ctx/2 - 1) rows of 2 bytes per token (235 MB
for 3 chunks of 512 on a 151,936-token vocabulary).
"""
import argparse
import csv
import json
import math
import os
import re
import struct
import subprocess
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tests", "conformance"))
from common import PEER_BINS, build_llama_program, tool  # noqa: E402

PPL_RE = re.compile(r"Final estimate: PPL = ([\d.einf+]+)")
DEFAULT_RUNS = "bmoe-default,bmoe-avx2,bmoe-b32,bmoe-t1,llama-zen4-u512,llama-zen4-u32,llama-haswell-u512,llama-haswell-u32"
BMOE_SETTINGS = {  # name -> (extra flags, BMOE_ISA)
    "default": ([], None), "avx2": ([], "avx2"), "scalar": ([], "scalar"),
    "b32": (["-b", "32"], None), "b1": (["-b", "1"], None), "t1": (["-t", "1"], None)}


def loadavg():
    with open("/proc/loadavg") as f:
        return float(f.read().split()[0])


def log(msg):
    print(msg, file=sys.stderr, flush=True)


def bmoe_run(name, args, path):
    flags, isa = BMOE_SETTINGS[name]
    env = dict(os.environ)
    if isa:
        env["BMOE_ISA"] = isa
    threads = ["-t", str(args.threads)] if "-t" not in flags else []
    cmd = [tool("bmoe-perplexity"), "-m", args.model, "-f", args.text, "-c", str(args.ctx), "--chunks",
           str(args.chunks), "--no-moe-stream", *threads, *flags, "--kl-divergence-base", path]
    p = subprocess.run(cmd, capture_output=True, text=True, env=env, check=True)
    return {"ppl": float(PPL_RE.search(p.stdout).group(1)), "log": p.stderr.strip().splitlines()[-1]}


def backend_dir(level, workdir):
    """A folder holding only llama.cpp's CPU library of this level (LLAMA_BACKEND_DIR)."""
    folder = os.path.join(workdir, "backend-" + level)
    os.makedirs(folder, exist_ok=True)
    lib = f"libggml-cpu-{level}.so"
    if not os.path.exists(os.path.join(folder, lib)):
        os.symlink(os.path.join(PEER_BINS, lib), os.path.join(folder, lib))
    return folder


def llama_run(name, args, path, base):
    level, ubatch = re.fullmatch(r"([a-z0-9]+)-u(\d+)", name).groups()
    env = {**os.environ, "LLAMA_BACKEND_DIR": backend_dir(level, args.workdir)}
    p = subprocess.run([args.driver, "eval", args.model, base, ubatch, str(args.threads), path],
                       capture_output=True, text=True, env=env, check=True)
    answer = json.loads(p.stdout.strip().splitlines()[-1])
    return {"ppl": math.exp(answer["nll_mean"]), "vs_base_full_precision": answer}


def ensure_run(run, args, base):
    """The run's saved file and facts (PPL, load average), running it unless saved already."""
    path = os.path.join(args.workdir, run + ".logits")
    facts_path = path + ".json"
    if os.path.exists(path) and os.path.exists(facts_path):
        with open(facts_path) as f:
            return path, json.load(f)
    load_before = loadavg()
    log(f"{run}: running (load {load_before:.2f})")
    engine, name = run.split("-", 1)
    facts = bmoe_run(name, args, path) if engine == "bmoe" else llama_run(name, args, path, base)
    facts.update(load_before=load_before, load_after=loadavg())
    with open(facts_path, "w") as f:
        json.dump(facts, f)
    log(f"{run}: {facts}")
    return path, facts


def first_chunk_base(args, base):
    """A copy of the base file holding only its first chunk (for the route records)."""
    path = os.path.join(args.workdir, "chunk0.logits")
    with open(base, "rb") as f:
        data = f.read()
    n_ctx, n_vocab, n_chunk = struct.unpack_from("<Iii", data, 8)
    row_bytes = 2 * (2 * ((n_vocab + 1) // 2) + 4)
    rows_at = 20 + 4 * n_ctx * n_chunk
    with open(path, "wb") as f:
        f.write(data[:8] + struct.pack("<Iii", n_ctx, n_vocab, 1) + data[20:20 + 4 * n_ctx])
        f.write(data[rows_at:rows_at + row_bytes * (n_ctx - 1 - n_ctx // 2)])
    return path, list(struct.unpack_from(f"<{n_ctx}i", data, 20))


def bmoe_routes(args, ids, path):
    """{(layer, pos): frozenset(experts)} of bmoe evaluating ids as one prompt."""
    if not os.path.exists(path):
        subprocess.run([tool("bmoe-cli"), "-m", args.model, "--prompt-ids", ",".join(map(str, ids)), "-n", "1",
                        "-t", str(args.threads), "--no-moe-stream", "--route-trace", path],
                       capture_output=True, text=True, check=True)
    routes = {}
    with open(path) as f:
        for line in f:
            if line[0] == "#" or line.startswith("turn"):
                continue
            turn, phase, step, layer, slot, expert = map(int, line.split(",")[:6])
            if phase == 0:
                routes.setdefault((layer, step), set()).add(expert)
    return {key: frozenset(v) for key, v in routes.items()}, {}


def llama_routes(args, level, chunk0, path):
    """({(layer, pos): frozenset(experts)}, {(layer, pos): router gap}) of llama.cpp at this level."""
    if not os.path.exists(path):
        env = {**os.environ, "LLAMA_BACKEND_DIR": backend_dir(level, args.workdir), "LLAMA_KLD_ROUTES": path}
        subprocess.run([args.driver, "eval", args.model, chunk0, str(args.ctx), str(args.threads), path + ".logits"],
                       capture_output=True, text=True, env=env, check=True)
    routes, gaps = {}, {}
    with open(path) as f:
        for line in f:
            v = line.split()
            if v[0] == "0":
                key = (int(v[1]), int(v[2]))
                routes[key], gaps[key] = frozenset(map(int, v[3:-1])), float(v[-1])
    last = max(layer for layer, _ in routes)
    if min(pos for layer, pos in routes if layer == last) == 0:  # a driver that counted from 0 there
        routes = {(l, p + (args.ctx // 2 if l == last else 0)): v for (l, p), v in routes.items()}
        gaps = {(l, p + (args.ctx // 2 if l == last else 0)): v for (l, p), v in gaps.items()}
    return routes, gaps


def route_table(name_a, a, name_b, b, gaps):
    """Per layer: tokens whose expert set differs, and whose first difference is at that layer;
    then the first flips (a differing set with none at an earlier layer and an earlier or equal
    position, over every position both runs recorded) and their router gaps."""
    layers = sorted({layer for layer, _ in a})
    # llama.cpp runs the last layer on the scored rows only: compare the positions both have there.
    positions = sorted({pos for _, pos in a if all((layer, pos) in a and (layer, pos) in b for layer in layers)})
    first = {}
    for pos in positions:
        for layer in layers:
            if a[(layer, pos)] != b[(layer, pos)]:
                first[pos] = layer
                break
    lines = [f"routes {name_a} vs {name_b} ({len(positions)} tokens): layer, tokens differing, first differing here"]
    for layer in layers:
        differ = sum(a[(layer, p)] != b[(layer, p)] for p in positions)
        here = sum(1 for p in positions if first.get(p) == layer)
        lines.append(f"  {layer:3d}  {differ / len(positions):7.2%}  {here / len(positions):7.2%}")
    differ = {key for key in a if key in b and a[key] != b[key]}
    earliest = {}  # layer -> the smallest differing position there
    for layer, pos in differ:
        earliest[layer] = min(pos, earliest.get(layer, pos))
    seeds = sorted((layer, pos) for layer, pos in differ
                   if not any(earliest.get(l2, pos + 1) <= pos for l2 in range(layer)))
    lines.append(f"  first flips (layer, position, router gap): {len(seeds)}: " +
                 ", ".join(f"({l}, {p}, {gaps.get((l, p), float('nan')):.2g})" for l, p in seeds))
    if gaps:
        every = sorted(gaps.values())
        lines.append(f"  router gap k-th minus (k+1)-th (llama.cpp's): median {every[len(every) // 2]:.3g} "
                     f"over all tokens and layers")
    return "\n".join(lines)


def route_report(args, base, llama_levels):
    chunk0, ids = first_chunk_base(args, base)
    runs = {"bmoe": bmoe_routes(args, ids, os.path.join(args.workdir, "routes-bmoe.csv"))}
    for level in llama_levels:
        runs["llama-" + level] = llama_routes(args, level, chunk0, os.path.join(args.workdir, f"routes-{level}.txt"))
    names = list(runs)
    tables = []
    for i, a in enumerate(names):
        for b in names[i + 1:]:
            tables.append(route_table(a, runs[a][0], b, runs[b][0], runs[b][1] or runs[a][1]))
    return "\n".join(tables)


def compare(args, a, b):
    p = subprocess.run([args.driver, "compare", a, b], capture_output=True, text=True, check=True)
    return json.loads(p.stdout.strip().splitlines()[-1])


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("model")
    ap.add_argument("text")
    ap.add_argument("workdir")
    ap.add_argument("--ctx", type=int, default=512)
    ap.add_argument("--chunks", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--runs", default=DEFAULT_RUNS)
    ap.add_argument("--pairs", default="", help="A:B,... (default: bmoe-default against every other run, "
                                                "and each llama run against the first llama run)")
    ap.add_argument("--csv")
    ap.add_argument("--routes", action="store_true", help="also compare the expert choices of the first chunk")
    args = ap.parse_args()
    os.makedirs(args.workdir, exist_ok=True)
    args.driver = build_llama_program("llama_kld", ["-O2"])
    runs = args.runs.split(",")
    if runs[0] != "bmoe-default":
        sys.exit("bench_kld_spread: the first run must be bmoe-default (its file holds the token ids)")
    files, facts = {}, {}
    for run in runs:
        files[run], facts[run] = ensure_run(run, args, files.get("bmoe-default"))
    llama = [r for r in runs if r.startswith("llama-")]
    pairs = ([p.split(":") for p in args.pairs.split(",")] if args.pairs else
             [("bmoe-default", r) for r in runs[1:]] + [(llama[0], r) for r in llama[1:]])
    rows = []
    for a, b in pairs:
        kl = compare(args, files[a], files[b])
        rows.append({"model": os.path.basename(args.model), "base": a, "other": b,
                     "kld_mean": kl["kld_mean"], "kld_median": kl["kld_median"], "kld_p99": kl["kld_p99"],
                     "kld_max": kl["kld_max"], "same_top": kl["same_top"], "rows": kl["count"],
                     "ppl_base": facts[a]["ppl"], "ppl_other": facts[b]["ppl"],
                     "load_base": facts[a]["load_before"], "load_other": facts[b]["load_before"]})
        log(f"{a} vs {b}: KLD mean {kl['kld_mean']:.6f} p99 {kl['kld_p99']:.6f} same top {kl['same_top']:.4f}")
    for run in llama[:1]:
        full = facts[run]["vs_base_full_precision"]
        log(f"bmoe-default vs {run} at full precision on {run}'s side: KLD mean {full['kld_mean']:.6f} "
            f"p99 {full['kld_p99']:.6f} same top {full['same_top']:.4f}")
    if args.csv:
        with open(args.csv, "w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=list(rows[0]))
            w.writeheader()
            w.writerows(rows)
    print(json.dumps(rows, indent=1))
    if args.routes:
        levels = sorted({re.fullmatch(r"llama-([a-z0-9]+)-u\d+", r).group(1) for r in llama})
        print(route_report(args, files["bmoe-default"], levels))


if __name__ == "__main__":
    main()
