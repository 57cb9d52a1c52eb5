#!/usr/bin/env python3
"""How many distinct experts a verification pass of n consecutive tokens routes to, per layer,
from a real routing trace (shared/data/route-traces), against n one-token passes and against
routing that shares nothing by design (uniform random top-k, the synthetic models' own).

A pass over n rows reads the union of their experts once per layer, so union(n) / (n * k) is the
share of the n one-token passes' expert reads that the pass still makes; n * k / union(n) is how
many tokens share each read. With drafts accepted at rate a (chained, k drafts), a pass keeps
E[tokens] = (1 - a^(k+1)) / (1 - a) tokens, so expert bytes per generated token against plain
decoding are union(k+1) / (k * E[tokens]) (k the top-k here: the cold cache's worst case; a
cache that hits makes both sides smaller).

    bench/route_overlap.py /work/shared/data/route-traces/qwen3-30b-a3b-k6.route.csv
"""
import argparse
import collections
import sys


def load_decode(path):
    """{step: {layer: set(experts)}} for the decode phase, and the header's n_expert, top-k."""
    steps = collections.defaultdict(lambda: collections.defaultdict(set))
    header = {}
    with open(path) as f:
        for line in f:
            if line.startswith("#"):
                for part in line[1:].split():
                    if "=" in part:
                        k, v = part.split("=", 1)
                        header.setdefault(k, v)
                continue
            if line.startswith("turn"):
                continue
            turn, phase, step, layer, slot, expert = line.split(",")[:6]
            if phase == "1":
                steps[int(step)][int(layer)].add(int(expert))
    if not steps:
        sys.exit(f"{path}: no decode steps")
    return steps, int(header["n_expert"]), int(header["n_expert_used"])


def mean_union(steps, n):
    """Mean over windows of n consecutive decode steps and layers of the union's size."""
    order = sorted(steps)
    total, count = 0, 0
    for i in range(len(order) - n + 1):
        window = order[i:i + n]
        if window[-1] - window[0] != n - 1:
            continue  # a gap in the trace: not consecutive tokens
        for layer in steps[window[0]]:
            union = set().union(*(steps[s][layer] for s in window))
            total += len(union)
            count += 1
    return total / count


def random_union(n_expert, k, n):
    """Expected union of n independent uniform top-k draws."""
    return n_expert * (1 - (1 - k / n_expert) ** n)


def tokens_per_pass(a, drafts):
    return sum(a ** i for i in range(drafts + 1))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("trace")
    ap.add_argument("--max-rows", type=int, default=5)
    ap.add_argument("--accept", default="0,0.5,0.7,0.9")
    args = ap.parse_args()
    steps, n_expert, k = load_decode(args.trace)
    print(f"Trace: {args.trace}: {len(steps)} decode steps, {n_expert} experts, top-{k}.\n")
    print("| rows n | union (trace) | n*k | union / (n*k) (trace) | union / (n*k) (random routing, same shape) |"
          " union / (n*k) (random, 256 experts top-8) |")
    print("|---|---|---|---|---|---|")
    unions = {}
    for n in range(1, args.max_rows + 1):
        u = unions[n] = mean_union(steps, n)
        r = random_union(n_expert, k, n)
        q = random_union(256, 8, n)
        print(f"| {n} | {u:.2f} | {n * k} | {u / (n * k):.3f} | {r / (n * k):.3f} | {q / (n * 8):.3f} |")
    print("\nExpert reads per generated token vs plain decoding (cold cache), drafts chained, k drafts:\n")
    accepts = [float(a) for a in args.accept.split(",")]
    print("| drafts | " + " | ".join(f"{a:.0%}: tokens/pass, trace, random" for a in accepts) + " |")
    print("|---|" + "---|" * len(accepts))
    for d in range(1, args.max_rows):
        cells = []
        for a in accepts:
            t = tokens_per_pass(a, d)
            cells.append(f"{t:.2f}, {unions[d + 1] / (k * t):.2f}x, {random_union(n_expert, k, d + 1) / (k * t):.2f}x")
        print(f"| {d} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
