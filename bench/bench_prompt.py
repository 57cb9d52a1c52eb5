#!/usr/bin/env python3
"""Prompt processing, bmoe vs llama.cpp, resident, on the same file with the same threads.

For each model (cuts of real shapes, written once) and each prompt length, the same token ids
(bench/prompts/one-page.txt tokenized with the model's vocabulary, repeated to length) are fed to
bmoe-cli (--prompt-ids, its "prompt:" line) and to llama.cpp through node-llama-cpp (the time
from feeding the ids to the first generated token). After one untimed warm-up of each engine,
runs alternate (bmoe, llama.cpp, bmoe, ...). Prints a markdown table with medians and the ratio.
--isa-ab avx512 adds a bmoe run under BMOE_ISA=avx512 to each round (A/B of a kernel path, same
alternation; its own column).

    bench/bench_prompt.py [--lengths 128,512,2048] [--threads 2] [--repeats 2] [--models qwen,gpt-oss] [--isa-ab avx512]
    bench/bench_prompt.py --model PATH.gguf [...]   (a model already written, e.g. a deepseek4 cut)
"""
import argparse
import json
import os
import re
import statistics
import subprocess
import tempfile

from common import ORACLE, REPO, ensure_model, log, machine, resident_unless_streamed, tool

MODELS = {
    "qwen": ("qwen3-30b-a3b", 12),  # Q4_K_M-like mix: Q4_K / Q6_K
    "gpt-oss": ("gpt-oss-20b", 8),  # MXFP4 experts, Q8_0 attention, sliding window, sinks
    "qwen35": ("qwen3.6-35b-a3b", 8),  # hybrid: 6 Gated DeltaNet + 2 gated attention layers
    "lfm2": ("lfm2-8b-a1b", 8),  # 6 short-convolution + 2 attention layers, 2 dense + 6 MoE
    "glm-air": ("glm-4.5-air", 4),  # 1 dense + 3 MoE layers, q/k/v biases, partial RoPE, Q8_0 downs
    "ling": ("ling-v3-mini", 8),  # 6 Kimi Delta + 2 latent attention layers, grouped routing
}
PROMPT_RE = re.compile(r"prompt: (\d+) tokens, ([\d.]+) s, ([\d.]+) tok/s")


def prompt_ids(model, length):
    text = open(os.path.join(REPO, "bench", "prompts", "one-page.txt")).read()
    ids = json.loads(subprocess.run([tool("bmoe-tokenize"), "-m", model, "-p", text], capture_output=True, text=True,
                                    check=True).stdout)
    return (ids * (length // len(ids) + 1))[:length]


def run_bmoe_prompt(model, ids, threads, extra=(), isa=None):
    env = dict(os.environ, **({"BMOE_ISA": isa} if isa else {}))
    p = subprocess.run([tool("bmoe-cli"), "-m", model, "--prompt-ids", ",".join(map(str, ids)), "-n", "1",
                        "-t", str(threads), "-c", str(max(4096, len(ids) + 64)),
                        *resident_unless_streamed(extra)], capture_output=True, text=True, env=env)
    m = PROMPT_RE.search(p.stderr)
    if p.returncode != 0 or not m:
        log(p.stderr[-2000:])
        return None
    return float(m.group(3))


def run_llama_prompt(model, ids, threads):
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
        json.dump(ids, f)
        name = f.name
    try:
        p = subprocess.run(["node", ORACLE, "prefill", model, name, "0", str(threads)], capture_output=True, text=True,
                           cwd=REPO)
        return json.loads(p.stdout.strip().splitlines()[-1])["tok_s"]
    except Exception:
        log((p.stderr or "")[-2000:])
        return None
    finally:
        os.unlink(name)


def median(values):
    v = [x for x in values if x]
    return statistics.median(v) if v else float("nan")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--lengths", default="128,512,2048")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--models", default="qwen,gpt-oss")
    ap.add_argument("--isa-ab", help="also run bmoe under this BMOE_ISA value in each round")
    ap.add_argument("--model", help="run this model file instead of --models' cuts")
    args = ap.parse_args()
    lengths = [int(x) for x in args.lengths.split(",")]
    rows = []
    for key in ([args.model] if args.model else args.models.split(",")):
        if args.model:
            model, preset, layers = key, os.path.basename(key), 0
        else:
            preset, layers = MODELS[key]
            model = os.path.join(REPO, "bench", "out", "models", f"{preset}-{layers}l.gguf")
            ensure_model(model, preset, "--layers", str(layers))
        warm = prompt_ids(model, 64)
        run_bmoe_prompt(model, warm, args.threads)
        run_llama_prompt(model, warm, args.threads)
        for n in lengths:
            ids = prompt_ids(model, n)
            ours, theirs, alt = [], [], []
            for r in range(args.repeats):
                ours.append(run_bmoe_prompt(model, ids, args.threads))
                theirs.append(run_llama_prompt(model, ids, args.threads))
                if args.isa_ab:
                    alt.append(run_bmoe_prompt(model, ids, args.threads, isa=args.isa_ab))
                log(f"{preset}{f' {layers}l' if layers else ''}, {n} tokens, repeat {r + 1}: bmoe {ours[-1]} tok/s, llama.cpp {theirs[-1]} tok/s"
                    + (f", bmoe BMOE_ISA={args.isa_ab} {alt[-1]} tok/s" if args.isa_ab else ""))
            a, b = median(ours), median(theirs)
            rows.append((f"{preset}, {layers} layers" if layers else preset, n, ours, theirs, a / b, alt))
    ab = f" bmoe BMOE_ISA={args.isa_ab} tok/s | ratio |" if args.isa_ab else ""
    print(f"| model | prompt tokens | bmoe tok/s | llama.cpp tok/s | ratio |{ab}\n|---|---|---|---|---|"
          + ("---|---|" if args.isa_ab else ""))
    for name, n, ours, theirs, ratio, alt in rows:
        fmt = lambda v: " / ".join(f"{x:.1f}" if x else "n/a" for x in v)
        extra = f" {fmt(alt)} | {median(alt) / median(theirs):.2f}x |" if alt else ""
        print(f"| {name} | {n} | {fmt(ours)} | {fmt(theirs)} | **{ratio:.2f}x** |{extra}")
    print(f"\nresident, -t {args.threads}, {args.repeats} alternated runs each (ratio of medians), "
          f"llama.cpp = node-llama-cpp 3.21.1 (mmap, flash attention auto, its default batch), {machine()}")


if __name__ == "__main__":
    main()
