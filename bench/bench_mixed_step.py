#!/usr/bin/env python3
"""What a running answer waits while a long prompt is read (issue 32, "no running stream pauses
longer than one prompt chunk's time"), measured on one --parallel 2 server, A/B within the run:

  A: the long prompt read with nothing else running: its chunks' time (server prompt_ms / chunks);
  B: the same length of prompt (other words, so no prefix is kept) read while one answer streams:
     its chunks' time, and the running answer's gaps between two token events inside the long
     prompt's read window (its longest, and the mean of its `chunks` longest: the steps that
     carried a chunk).

A and B alternate `--reps` times. With mixed steps a chunk rides in the running answer's step, so
its gaps should be about one chunk's pass; with separate passes, a chunk plus a step. Prints a
markdown table; with --out, a CSV of every rep.

    bench/bench_mixed_step.py --model M [--reps 5] [-b 256] [--long 2000] [--flags "..."]
"""
import argparse
import csv
import json
import math
import os
import statistics
import threading
import time

from bench_server_load import WORDS, Server, loadavg
from common import machine


def long_prompt(server, rep, length):
    """`length` token ids, different from the first one on for each rep (no prefix is kept)."""
    text = f"{rep} " + " ".join(f"{WORDS[(k + rep) % len(WORDS)]}{k + 7 * rep}" for k in range(length))
    ids = json.loads(server.post("/tokenize", {"content": text})[1])["tokens"]
    return ids[:length]


def chunk_ms(result, batch):
    t = result["timings"] or {}
    return t.get("prompt_ms", float("nan")) / math.ceil(t.get("prompt_n", 1) / batch)


def read_beside_an_answer(server, body, answer_body):
    """The long prompt sent once the running answer has streamed a few tokens."""
    background = {}

    def run():
        background.update(server.stream(answer_body))
    t = threading.Thread(target=run)
    t.start()
    time.sleep(0.3)  # the answer is decoding by then
    long_r = server.stream(body)
    t.join()
    return long_r, background


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--long", type=int, default=2000)
    ap.add_argument("-b", "--batch", type=int, default=256)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--answer", type=int, default=600, help="tokens of the running answer")
    ap.add_argument("--flags", default="--moe-stream --cache-mb 0")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    ctx = args.long + args.answer + 64
    server = Server(args.model, [*args.flags.split(), "-t", str(args.threads), "-b", str(args.batch),
                                 "-c", str(2 * ctx), "--parallel", "2"])
    rows = []
    load_before = loadavg()
    try:
        for rep in range(args.reps):
            a = server.stream({"prompt": long_prompt(server, 2 * rep, args.long), "max_tokens": 1, "temperature": 0, "logprobs": 1})
            body = {"prompt": long_prompt(server, 2 * rep + 1, args.long), "max_tokens": 1, "temperature": 0, "logprobs": 1}
            answer = {"prompt": f"Once upon a time {rep}", "max_tokens": args.answer, "temperature": 0,
                      "ignore_eos": True, "logprobs": 1}
            b, running = read_beside_an_answer(server, body, answer)
            chunks = math.ceil((b["timings"] or {}).get("prompt_n", args.long) / args.batch)
            start, end = b["sent"], b["events"][0] if b["events"] else b["sent"]
            ev = running.get("events", [])
            gaps = sorted((y - x for x, y in zip(ev, ev[1:]) if x >= start and y <= end), reverse=True)
            rows.append({"rep": rep, "chunk_alone_ms": chunk_ms(a, args.batch), "chunk_beside_ms": chunk_ms(b, args.batch),
                         "gaps_in_window": len(gaps), "longest_gap_ms": gaps[0] * 1e3 if gaps else float("nan"),
                         "top_gaps_mean_ms": statistics.mean(gaps[:chunks]) * 1e3 if gaps else float("nan"),
                         "chunks": chunks})
        metrics = server.metrics()
    finally:
        server.stop()
    load_after = loadavg()
    if args.out:
        os.makedirs(args.out, exist_ok=True)
        with open(os.path.join(args.out, "mixed_step.csv"), "w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=list(rows[0]))
            w.writeheader()
            w.writerows(rows)
    med = lambda k: statistics.median(r[k] for r in rows)
    print(f"{os.path.basename(args.model)}, bmoe-server --parallel 2 -b {args.batch} -t {args.threads} {args.flags}, "
          f"a {args.long}-token prompt read alone and beside one running answer, {args.reps} reps alternating, "
          f"load average {load_before} before, {load_after} after, {machine()}\n")
    print("| rep | chunk alone ms | chunk beside the answer ms | answer's gaps in the window | longest gap ms | "
          "mean of the `chunks` longest gaps ms | longest / chunk alone |")
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['rep']} | {r['chunk_alone_ms']:.1f} | {r['chunk_beside_ms']:.1f} | {r['gaps_in_window']} | "
              f"{r['longest_gap_ms']:.1f} | {r['top_gaps_mean_ms']:.1f} | {r['longest_gap_ms'] / r['chunk_alone_ms']:.2f} |")
    print(f"| median | {med('chunk_alone_ms'):.1f} | {med('chunk_beside_ms'):.1f} | | {med('longest_gap_ms'):.1f} | "
          f"{med('top_gaps_mean_ms'):.1f} | {med('longest_gap_ms') / med('chunk_alone_ms'):.2f} |")
    print(f"\nserver: {metrics.get('bmoe_batch_chunk_steps_total', 0):.0f} of "
          f"{metrics.get('bmoe_prompt_chunk_seconds_count', 0):.0f} prompt chunks read inside a decode step")


if __name__ == "__main__":
    main()
