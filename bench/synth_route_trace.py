#!/usr/bin/env python3
"""Writes a synthetic routing trace with reuse structure (route-trace CSV, as bmoe-replay reads).

Real routing is neither uniform nor stationary: each layer favours some experts (a skewed
popularity that differs by topic), the topic drifts, and consecutive tokens reuse some of the
experts recent tokens chose. This draws such a trace from a seed, with the shape and the
strength of each effect drawn from wide ranges (chosen a priori, not fitted to any real trace),
so cache policies can be tuned on some seeds and checked on others they never saw.

  bench/synth_route_trace.py --seed 3 --out /tmp/s3.route.csv [--decode 512]
"""
import argparse
import random


def draw_shape(rng):
    shapes = [  # (layers, experts, top-k, bytes of one expert)
        (48, 128, 8, 3_059_712),
        (48, 128, 6, 3_059_712),
        (40, 256, 8, 1_572_864),
        (32, 64, 4, 6_291_456),
        (24, 128, 8, 4_718_592),
    ]
    return rng.choice(shapes)


def zipf_weights(rng, n, s):
    order = list(range(n))
    rng.shuffle(order)
    w = [0.0] * n
    for rank, e in enumerate(order):
        w[e] = 1.0 / (rank + 1) ** s
    return w


def pick(rng, weights, taken):
    total = sum(w for e, w in enumerate(weights) if e not in taken)
    x = rng.random() * total
    for e, w in enumerate(weights):
        if e in taken:
            continue
        x -= w
        if x <= 0:
            return e
    return max(e for e in range(len(weights)) if e not in taken)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--seed", type=int, required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--prompt", type=int, default=48)
    ap.add_argument("--decode", type=int, default=384)
    args = ap.parse_args()
    rng = random.Random(args.seed)
    n_layer, n_expert, k, ebytes = draw_shape(rng)
    skew = rng.uniform(0.6, 1.4)          # Zipf exponent of a topic's popularity
    n_topics = rng.randint(2, 6)
    switch = rng.uniform(0.01, 0.1)       # per-token chance the topic changes
    persist = rng.uniform(0.1, 0.5)       # per-slot chance to reuse a recent token's expert
    recent = rng.randint(1, 6)            # how many tokens back "recent" reaches
    topics = [[zipf_weights(rng, n_expert, skew) for _ in range(n_layer)] for _ in range(n_topics)]
    topic = 0
    history = [[] for _ in range(n_layer)]  # per layer: the last tokens' expert sets
    with open(args.out, "w") as f:
        f.write("# route_trace v1\n")
        f.write(f"# model=synthetic-seed{args.seed} arch=synthetic n_layer={n_layer} n_expert={n_expert} "
                f"n_expert_used={k}\n")
        f.write(f"# synth skew={skew:.3f} topics={n_topics} switch={switch:.3f} persist={persist:.3f} "
                f"recent={recent}\n")
        for layer in range(n_layer):
            f.write(f"# layer={layer} expert_bytes={ebytes} dense_bytes={ebytes * 4}\n")
        f.write("turn,phase,step,layer,slot,expert,weight,residency,expert_bytes\n")
        for step in range(args.prompt + args.decode):
            phase = 0 if step < args.prompt else 1
            if rng.random() < switch:
                topic = rng.randrange(n_topics)
            for layer in range(n_layer):
                pool = sorted({e for s in history[layer][-recent:] for e in s})
                chosen = []
                for _ in range(k):
                    fresh = [e for e in pool if e not in chosen]
                    if fresh and rng.random() < persist:
                        chosen.append(rng.choice(fresh))
                    else:
                        chosen.append(pick(rng, topics[topic][layer], set(chosen)))
                history[layer].append(chosen)
                del history[layer][:-8]
                for slot, e in enumerate(chosen):
                    f.write(f"0,{phase},{step},{layer},{slot},{e},{1.0 / k:.6f},0,{ebytes}\n")


if __name__ == "__main__":
    main()
