#!/usr/bin/env python3
"""A roofline of this machine for the integer kernels, one core: measured peaks and bandwidth,
then every tile and one-row kernel in GOP/s against them.

Runs bench_kernels (Google Benchmark) for
  - the peaks (peak/*): int8 multiply-adds as maddubs + madd + add (AVX2, AVX-512) and as one
    vpdpbusd (AVX-VNNI, AVX-512 VNNI), f32 fused multiply-adds; no loads, an upper bound;
  - memory bandwidth: STREAM's triad on one core and on all (triad/*);
  - per integer type: the tile kernel (gemm32/<type>/tile: 32 activation rows x 64 weight rows of
    2048 columns, in L1/L2), 32 one-row dot products instead (gemm32/<type>/one-row), and decode's
    one-row kernel over 768 rows in L2 (dot/<type>/avx2: the dispatched AVX2-table kernel) and
    over 65536 rows from DRAM (dot-dram/<type>, weight GB/s beside the triad).
Rates are per CPU second (Google Benchmark's default), so a busy machine shows less noise than in
wall time; the kernels run on one core. Each kernel path is run under BMOE_ISA values given by
--isas ("" = everything the CPU has; "avx512" = AVX-512 without VNNI; "avx2", "avx2-vnni").
Prints a markdown table; --json keeps the raw numbers, --svg draws the tile kernels' bars.
Decode's bytes per token (weights + KV) against the bandwidth at each context depth: the
sibling bench/roofline_decode.py.

    bench/roofline.py [--isas avx512,] [--min-time 0.5] [--json out.json] [--svg out.svg]
"""
import argparse
import json
import os
import subprocess
import sys

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))
BUILD = os.environ.get("BMOE_BUILD", os.path.join(REPO, "build"))
TYPES = ["Q4_K", "Q5_K", "Q6_K", "Q8_0", "Q4_0", "MXFP4"]


def run_bench(filter_re, isa, min_time):
    env = dict(os.environ)
    if isa:
        env["BMOE_ISA"] = isa
    else:
        env.pop("BMOE_ISA", None)
    p = subprocess.run([os.path.join(BUILD, "bench", "bench_kernels"), f"--benchmark_filter={filter_re}",
                        "--benchmark_format=json", f"--benchmark_min_time={min_time}"],
                       capture_output=True, text=True, env=env, check=True)
    out = {}
    for b in json.loads(p.stdout)["benchmarks"]:
        if b.get("error_occurred"):
            continue
        name = b["name"].replace("/real_time", "")
        out[name] = {"gops": b.get("GFLOP/s", 0.0) / 1e9, "gbs": b.get("bytes_per_second", 0.0) / 1e9}
    return out


def pct(x, peak):
    return f"{100.0 * x / peak:.0f} %" if peak else "-"


def table(peaks, kernels, isas):
    int8 = peaks.get("peak/int8-avx512", {}).get("gops") or peaks.get("peak/int8-avx2", {}).get("gops", 0)
    vnni = peaks.get("peak/int8-avx512-vnni", {}).get("gops") or peaks.get("peak/int8-avx-vnni", {}).get("gops", 0)
    triad = peaks.get("triad/1", {}).get("gbs", 0)
    lines = ["| peak (one core unless said) | measured |", "|---|---|"]
    for name, v in sorted(peaks.items()):
        unit = f"{v['gbs']:.1f} GB/s" if name.startswith("triad") else f"{v['gops']:.0f} GOP/s"
        lines.append(f"| {name} | {unit} |")
    lines += ["", f"int8 peak = {int8:.0f} GOP/s (maddubs + madd + add), VNNI peak = {vnni:.0f} GOP/s (vpdpbusd), "
              f"one-core triad = {triad:.1f} GB/s", "",
              "| type | BMOE_ISA | tile GOP/s | % int8 peak | % VNNI peak | 32 x one-row GOP/s | decode one-row GOP/s (L2) "
              "| decode from DRAM GB/s | % triad/1 |",
              "|---|---|---|---|---|---|---|---|---|"]
    for t in TYPES:
        for isa in isas:
            k = kernels[isa]
            tile = k.get(f"gemm32/{t}/tile", {}).get("gops", 0)
            one = k.get(f"gemm32/{t}/one-row", {}).get("gops", 0)
            dec = k.get(f"dot/{t}/avx2", {}).get("gops", 0)
            dram = k.get(f"dot-dram/{t}", {}).get("gbs", 0)
            dram_s = f"{dram:.1f}" if dram else "-"
            lines.append(f"| {t} | {isa or 'default'} | {tile:.0f} | {pct(tile, int8)} | {pct(tile, vnni)} | {one:.0f} "
                         f"| {dec:.0f} | {dram_s} | {pct(dram, triad) if dram else '-'} |")
    return "\n".join(lines)


def svg(kernels, isas, peaks, path):
    int8 = peaks.get("peak/int8-avx512", {}).get("gops") or peaks.get("peak/int8-avx2", {}).get("gops", 1)
    vnni = peaks.get("peak/int8-avx512-vnni", {}).get("gops", 0)
    top = max([int8, vnni] + [kernels[i].get(f"gemm32/{t}/tile", {}).get("gops", 0) for i in isas for t in TYPES])
    w, h, left, bottom = 720, 360, 60, 40
    scale = (h - bottom - 20) / top
    colors = ["#1b6ca8", "#d1495b", "#66a182", "#edae49"]
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" font-family="sans-serif" font-size="11">']
    slot = (w - left - 20) / len(TYPES)
    bar = slot / (len(isas) + 1)
    for i, t in enumerate(TYPES):
        x0 = left + i * slot
        parts.append(f'<text x="{x0 + slot / 2 - 15}" y="{h - bottom + 15}">{t}</text>')
        for j, isa in enumerate(isas):
            v = kernels[isa].get(f"gemm32/{t}/tile", {}).get("gops", 0)
            y = h - bottom - v * scale
            parts.append(f'<rect x="{x0 + j * bar}" y="{y}" width="{bar - 2}" height="{v * scale}" fill="{colors[j % 4]}"/>')
    for name, v, dash in (("int8 peak (maddubs)", int8, "4,2"), ("VNNI peak", vnni, "1,2")):
        if v:
            y = h - bottom - v * scale
            parts.append(f'<line x1="{left}" x2="{w - 20}" y1="{y}" y2="{y}" stroke="black" stroke-dasharray="{dash}"/>')
            parts.append(f'<text x="{left + 4}" y="{y - 3}">{name} {v:.0f} GOP/s</text>')
    for j, isa in enumerate(isas):
        parts.append(f'<rect x="{w - 170}" y="{20 + 14 * j}" width="10" height="10" fill="{colors[j % 4]}"/>'
                     f'<text x="{w - 155}" y="{29 + 14 * j}">tile, BMOE_ISA={isa or "default"}</text>')
    parts.append(f'<text x="6" y="16">GOP/s, one core</text></svg>')
    with open(path, "w") as f:
        f.write("\n".join(parts) + "\n")


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--isas", default="avx512,", help="comma-separated BMOE_ISA values ('' = default)")
    ap.add_argument("--min-time", default="0.5")
    ap.add_argument("--json")
    ap.add_argument("--svg")
    args = ap.parse_args()
    isas = args.isas.split(",")
    peaks = run_bench("^(peak/|triad/)", "", args.min_time)
    kernel_re = "^(gemm32/({0})/(tile|one-row)|dot/({0})/avx2$|dot-dram/({0})$)".format("|".join(TYPES))
    kernels = {isa: run_bench(kernel_re, isa, args.min_time) for isa in isas}
    print(table(peaks, kernels, isas))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"peaks": peaks, "kernels": kernels}, f, indent=1)
    if args.svg:
        svg(kernels, isas, peaks, args.svg)


if __name__ == "__main__":
    sys.exit(main())
