#!/usr/bin/env python3
"""The roofline's decode rows: decode's bytes per token against the memory bandwidth at each
context depth (issue 35 item 3; bench/roofline.py has the kernel rows).

For a resident MoE model, one decode token reads
  - every weight that is not a routed expert (attention, norms, router, shared experts, the
    output head), once; the token embedding only as one row;
  - of each routed-expert tensor, expert_used_count / expert_count of its bytes (the experts the
    router picks; they are distinct within a layer);
  - the KV cache at depth D: per layer 2 (K and V) x head_count_kv x key_length x 2 bytes (f16,
    bmoe-cli's default) x D positions.
The byte counts come from the GGUF's tensor table and metadata, not from a run. Each depth is
then run with bmoe-cli (the same random-word prompt ids as bench_decode_depth.py, resident, f16
KV, default flags, -t --threads) and its "generation:" time per token (the prompt not in it)
gives the achieved bytes/s, set against STREAM's triad on all cores (bench_kernels triad/all),
measured before each round of depths. "bound" = bytes / triad: the time a decode limited only by
memory traffic would take; the issue's target is measured time <= 1.4 x bound.

    bench/roofline_decode.py --model M.gguf [--depths 512,2048,8192] [--tokens 32] [--threads 2]
                             [--repeats 1] [--json out.json]
"""
import argparse
import json
import os
import re
import statistics
import struct
import subprocess

from bench_prompt import prompt_ids
from common import BUILD, log, machine, resident_unless_streamed, tool

GEN_RE = re.compile(r"generation: (\d+) tokens, ([\d.]+) s/token, ([\d.]+) tok/s")
# The process's CPU time (all threads) per generated token: on a shared machine it moves less
# with the load than the wall time does (a thread waiting for a core is not charged).
CPU_RE = re.compile(r"process: cpu ([\d.]+) s/tok")

# ggml type id -> (elements per block, bytes per block), for the types bmoe reads.
TYPE_BLOCKS = {0: (1, 4), 1: (1, 2), 2: (32, 18), 3: (32, 20), 6: (32, 22), 7: (32, 24), 8: (32, 34),
               10: (256, 84), 11: (256, 110), 12: (256, 144), 13: (256, 176), 14: (256, 210), 30: (1, 2),
               39: (32, 17)}
SCALAR_FMT = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}


class Reader:
    def __init__(self, f):
        self.f = f

    def scalar(self, fmt):
        return struct.unpack(fmt, self.f.read(struct.calcsize(fmt)))[0]

    def string(self):
        return self.f.read(self.scalar("<Q")).decode("utf-8", "replace")

    def value(self, vtype):
        if vtype == 8:
            return self.string()
        if vtype == 9:
            item_type, count = self.scalar("<I"), self.scalar("<Q")
            if item_type in SCALAR_FMT and item_type != 8:  # skip numeric arrays in one read
                self.f.seek(count * struct.calcsize(SCALAR_FMT[item_type]), os.SEEK_CUR)
                return None
            for _ in range(count):
                self.value(item_type)
            return None
        return self.scalar(SCALAR_FMT[vtype])


def read_gguf(path):
    """(metadata dict without arrays, [(name, n_elements, type id)])."""
    with open(path, "rb") as f:
        r = Reader(f)
        if f.read(4) != b"GGUF":
            raise SystemExit(f"{path}: not a GGUF file")
        r.scalar("<I")
        n_tensors, n_kv = r.scalar("<Q"), r.scalar("<Q")
        meta = {}
        for _ in range(n_kv):
            key = r.string()
            meta[key] = r.value(r.scalar("<I"))
        tensors = []
        for _ in range(n_tensors):
            name = r.string()
            dims = [r.scalar("<Q") for _ in range(r.scalar("<I"))]
            ttype = r.scalar("<I")
            r.scalar("<Q")  # offset
            tensors.append((name, dims, ttype))
        return meta, tensors


def tensor_bytes(dims, ttype):
    if ttype not in TYPE_BLOCKS:
        raise SystemExit(f"tensor type {ttype} not in TYPE_BLOCKS")
    per_block, block_bytes = TYPE_BLOCKS[ttype]
    n = 1
    for d in dims:
        n *= d
    return n // per_block * block_bytes


def bytes_per_token(path):
    """(weight bytes read per decode token, KV bytes per position of depth, description)."""
    meta, tensors = read_gguf(path)
    arch = meta["general.architecture"]
    used, experts = meta.get(f"{arch}.expert_used_count", 0), meta.get(f"{arch}.expert_count", 0)
    layers, kv_heads = meta[f"{arch}.block_count"], meta[f"{arch}.attention.head_count_kv"]
    key_len = meta.get(f"{arch}.attention.key_length") or meta[f"{arch}.embedding_length"] // meta[f"{arch}.attention.head_count"]
    value_len = meta.get(f"{arch}.attention.value_length", key_len)
    dense = expert = embd_row = 0
    for name, dims, ttype in tensors:
        size = tensor_bytes(dims, ttype)
        if name == "token_embd.weight":
            embd_row = size // dims[-1]
        elif "_exps." in name:
            expert += size * used // experts
        else:
            dense += size
    kv_per_pos = layers * kv_heads * (key_len + value_len) * 2
    desc = (f"{arch}, {layers} layers: {dense / 1e6:.0f} MB dense (attention, norms, router, output head) + "
            f"{expert / 1e6:.0f} MB of routed experts ({used} of {experts}) + {embd_row / 1e3:.1f} KB embedding row "
            f"per token; f16 KV {kv_per_pos / 1e3:.1f} KB per position")
    return dense + expert + embd_row, kv_per_pos, desc


def triad_all():
    p = subprocess.run([os.path.join(BUILD, "bench", "bench_kernels"), "--benchmark_filter=^triad/all",
                        "--benchmark_format=json", "--benchmark_min_time=0.5"], capture_output=True, text=True, check=True)
    return json.loads(p.stdout)["benchmarks"][0]["bytes_per_second"] / 1e9


def decode_s_per_token(model, ids, tokens, threads):
    p = subprocess.run([tool("bmoe-cli"), "-m", model, "--prompt-ids", ",".join(map(str, ids)), "-n", str(tokens),
                        "-t", str(threads), "-c", str(max(4096, len(ids) + tokens + 64)), "--ignore-eos",
                        *resident_unless_streamed([])], capture_output=True, text=True)
    m, c = GEN_RE.search(p.stderr), CPU_RE.search(p.stderr)
    if p.returncode != 0 or not m:
        log(p.stderr[-2000:])
        return None, None
    return float(m.group(2)), float(c.group(1)) if c else None


def load():
    with open("/proc/loadavg") as f:
        return float(f.read().split()[0])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True)
    ap.add_argument("--depths", default="512,2048,8192")
    ap.add_argument("--tokens", type=int, default=32)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    weights, kv_per_pos, desc = bytes_per_token(args.model)
    depths = [int(x) for x in args.depths.split(",")]
    decode_s_per_token(args.model, prompt_ids(args.model, 64), 4, args.threads)  # untimed: page the file in
    runs, cpus, triads, loads = {d: [] for d in depths}, {d: [] for d in depths}, [], []
    for r in range(args.repeats):
        loads.append(load())
        triads.append(triad_all())
        log(f"round {r + 1}: triad/all {triads[-1]:.1f} GB/s (load {loads[-1]:.1f})")
        for d in depths:
            loads.append(load())
            s, cpu = decode_s_per_token(args.model, prompt_ids(args.model, d), args.tokens, args.threads)
            runs[d].append(s)
            cpus[d].append(cpu)
            log(f"round {r + 1}: depth {d}: {s} s/token, process cpu {cpu} s/token (load {loads[-1]:.1f})")
    triad = statistics.median(triads)
    print(f"Decode roofline: {os.path.basename(args.model)}, {args.tokens} tokens, -t {args.threads}, resident, f16 KV; "
          f"{machine()}; triad/all {', '.join(f'{t:.1f}' for t in triads)} GB/s (median {triad:.1f}); "
          f"load average at run starts {min(loads):.1f}-{max(loads):.1f}\n\n{desc}\n")
    print("| depth | weights MB/token | KV MB/token | total MB/token | decode ms/token (runs) | tok/s | achieved GB/s "
          "| % of triad | bound ms (bytes / triad) | measured / bound | process CPU ms/token (runs) |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    rows = []
    for d in depths:
        kv = kv_per_pos * d
        total = weights + kv
        times = [t for t in runs[d] if t]
        if not times:
            print(f"| {d} | {weights / 1e6:.0f} | {kv / 1e6:.0f} | {total / 1e6:.0f} | failed | | | | | | |")
            continue
        t = statistics.median(times)
        bound = total / (triad * 1e9)
        cpu = [x for x in cpus[d] if x]
        rows.append({"depth": d, "weights": weights, "kv": kv, "s_per_token": times, "cpu_s_per_token": cpu,
                     "triad_gbs": triads})
        print(f"| {d} | {weights / 1e6:.0f} | {kv / 1e6:.0f} | {total / 1e6:.0f} | {1e3 * t:.1f} "
              f"({' / '.join(f'{1e3 * x:.1f}' for x in times)}) | {1 / t:.1f} | {total / t / 1e9:.1f} "
              f"| {100 * total / t / 1e9 / triad:.0f} % | {1e3 * bound:.1f} | {t / bound:.1f}x "
              f"| {' / '.join(f'{1e3 * x:.1f}' for x in cpu)} |")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"model": args.model, "desc": desc, "loads": loads, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
