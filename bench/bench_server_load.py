#!/usr/bin/env python3
"""bmoe-server under load with continuous batching (issue 32's server proof): `--parallel 4`,
8 clients each sending 20 streamed completions one after another, prompts of mixed lengths, one
of them 2000 tokens.

Checks and reports:
  - nothing lost: every request answers 200 and its stream ends with [DONE];
  - every answer equals the same request run alone (greedy, on a --parallel 1 server with the
    same flags; each distinct request once);
  - while the 2000-token prompt is read (from its send to its first token), the longest pause
    between two token events of any other running stream, against that prompt's mean chunk time
    (its prompt_ms over its chunks of -b tokens, both from the server's own timings) under load
    and read alone (the --parallel 1 run): a chunk read while answers run rides in their decode
    step's pass, so a pause should stay within about one chunk's pass;
  - p50/p95 time to first token, each client's tok/s (its tokens over its 20 requests' wall
    time) and the aggregate;
  - the same pauses on the server's own clock (its /metrics histograms: every gap between two
    tokens of a running answer, each decode step, each prompt chunk), free of the client threads'
    waits for a core, and the batch's rows per step and expert sharing.

Each request asks for logprobs, so that the server sends an event for every token (a token whose
text is an incomplete UTF-8 sequence would otherwise ride with the next one and look like a pause).
Prints a markdown summary; with --out, a CSV of every request and the table.

    bench/bench_server_load.py [--model M] [--parallel 4] [--clients 8] [--requests 20] [-b 256]
"""
import argparse
import csv
import http.client
import json
import math
import os
import socket
import statistics
import subprocess
import tempfile
import threading
import time

from common import REPO, ensure_model, log, machine, tool

WORDS = ("the harbour town woke slowly while fishing boats drifted past the old stone pier and gulls argued "
         "over nets drying in the morning sun").split()
SHORT = ["The capital of France is", "Once upon a time", "hi", "1 2 3 4 5 6 7 8", "Tell me a story",
         "Write a haiku about rain", "List three colours"]


def medium(i):
    """A prompt of a few hundred characters, different per i."""
    return " ".join(WORDS[(i * 7 + k) % len(WORDS)] for k in range(20 + 15 * (i % 6)))


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def loadavg():
    with open("/proc/loadavg") as f:
        return f.read().split()[0]


class Server:
    def __init__(self, model, flags):
        self.port = free_port()
        self.log = tempfile.TemporaryFile("w+")
        self.proc = subprocess.Popen([tool("bmoe-server"), "-m", model, "--port", str(self.port), *flags],
                                     stdout=subprocess.DEVNULL, stderr=self.log, text=True)
        deadline = time.time() + 600
        while time.time() < deadline:
            if self.proc.poll() is not None:
                self.log.seek(0)
                raise SystemExit(f"bmoe-server exited: {self.log.read()[-2000:]}")
            try:
                if self.post("/tokenize", {"content": "x"})[0] == 200:
                    return
            except OSError:
                time.sleep(0.2)
        raise SystemExit("bmoe-server did not start")

    def post(self, path, body):
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=1200)
        conn.request("POST", path, body=json.dumps(body), headers={"Content-Type": "application/json"})
        resp = conn.getresponse()
        text = resp.read().decode()
        conn.close()
        return resp.status, text

    def metrics(self):
        """One /metrics scrape: {'name' or 'name{labels}': value}."""
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=60)
        conn.request("GET", "/metrics")
        text = conn.getresponse().read().decode()
        conn.close()
        return {k: float(v) for k, v in (line.rsplit(" ", 1) for line in text.splitlines() if line and line[0] != "#")}

    def stream(self, body):
        """One streamed completion: status, text, token event times, final timings, [DONE] seen."""
        out = {"sent": time.monotonic(), "events": [], "text": "", "tokens": 0, "timings": None, "done": False}
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=1200)
        conn.request("POST", "/v1/completions", body=json.dumps({**body, "stream": True}),
                     headers={"Content-Type": "application/json"})
        resp = conn.getresponse()
        out["status"] = resp.status
        if resp.status != 200:
            out["error"] = resp.read().decode()[:300]
            conn.close()
            return out
        for raw in resp:
            line = raw.decode().strip()
            if not line.startswith("data: "):
                continue
            if line == "data: [DONE]":
                out["done"] = True
                break
            event = json.loads(line[6:])
            if event.get("timings") and event["choices"] and event["choices"][0].get("finish_reason"):
                out["timings"] = event["timings"]
            for choice in event.get("choices", []):
                lp = choice.get("logprobs") or {}
                n = len(lp.get("tokens") or [])
                if n:
                    out["events"].append(time.monotonic())
                    out["tokens"] += n
                out["text"] += choice.get("text") or ""
        conn.close()
        return out

    def stop(self):
        self.proc.terminate()
        self.proc.wait(timeout=60)


def requests(args, long_ids):
    """Client c's requests in order: (key, body); the long prompt once, as client 2's 4th."""
    plan = []
    for c in range(args.clients):
        mine = []
        for r in range(args.requests):
            i = c * args.requests + r
            if c == 2 and r == 3:
                prompt, key = long_ids, "long"
            elif i % 3 == 0:
                prompt, key = medium(i), f"medium{i}"
            else:
                prompt, key = SHORT[i % len(SHORT)], f"short{i % len(SHORT)}"
            n = 8 + 4 * (i % 5)
            # The key names the request exactly (prompt and length): the run alone is per key.
            mine.append((f"{key}/{n}", {"prompt": prompt, "max_tokens": n, "temperature": 0, "ignore_eos": True,
                                        "logprobs": 1}))
        plan.append(mine)
    return plan


def long_prompt(server, length):
    text = " ".join(f"{WORDS[k % len(WORDS)]}{k}" for k in range(length))
    ids = json.loads(server.post("/tokenize", {"content": text})[1])["tokens"]
    if len(ids) < length:
        raise SystemExit(f"the long prompt tokenized to {len(ids)} tokens, fewer than {length}")
    return ids[:length]


def pct(values, p):
    v = sorted(values)
    return v[min(len(v) - 1, int(round(p * (len(v) - 1))))] if v else float("nan")


def under_load(model, args, plan):
    flags = [*args.flags.split(), "-t", str(args.threads), "-b", str(args.batch), "-c", str(args.ctx * args.parallel),
             "--parallel", str(args.parallel), "--queue", str(args.clients * 2)]
    server = Server(model, flags)
    results = [[None] * len(p) for p in plan]
    spans = [None] * len(plan)

    def client(c):
        t0 = time.monotonic()
        for r, (_, body) in enumerate(plan[c]):
            results[c][r] = server.stream(body)
        spans[c] = time.monotonic() - t0
    try:
        load = loadavg()
        threads = [threading.Thread(target=client, args=(c,)) for c in range(len(plan))]
        t0 = time.monotonic()
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        wall = time.monotonic() - t0
        metrics = server.metrics()
    finally:
        server.stop()
    return results, spans, wall, load, metrics


def alone(model, args, plan):
    flags = [*args.flags.split(), "-t", str(args.threads), "-b", str(args.batch), "-c", str(args.ctx)]
    server = Server(model, flags)
    want, timings = {}, {}
    try:
        for mine in plan:
            for key, body in mine:
                if key not in want:
                    r = server.stream(body)
                    want[key] = r["text"] if r["status"] == 200 and r["done"] else None
                    timings[key] = r["timings"] or {}
    finally:
        server.stop()
    return want, timings


def pauses_during_long(results, plan):
    """The longest gap between two token events of another stream inside the long prompt's read
    window, and that prompt's mean chunk time and chunk count."""
    long_r = next(results[c][r] for c, mine in enumerate(plan) for r, (k, _) in enumerate(mine) if k.startswith("long/"))
    start, end = long_r["sent"], long_r["events"][0] if long_r["events"] else long_r["sent"]
    gaps = []
    for row in results:
        for r in row:
            if r is long_r or not r["events"]:
                continue
            ev = r["events"]
            gaps += [b - a for a, b in zip(ev, ev[1:]) if a >= start and b <= end]
    return long_r, start, end, gaps


def hist_pct(m, name, p):
    """The upper bound of the bucket holding the p-quantile of a /metrics histogram."""
    buckets = sorted((float(k.split('"')[1]), v) for k, v in m.items()
                     if k.startswith(name + "_bucket{") and '"+Inf"' not in k)
    n = m.get(name + "_count", 0)
    for bound, below in buckets:
        if below >= p * n:
            return bound * 1e3
    return float("inf")


def server_side(m):
    """The worker's own clock (bmoe-server /metrics): every gap between two tokens of one running
    answer against the steps and prompt chunks it is made of, and the batch's sharing."""
    gap, step, chunk = (m.get(f"bmoe_{n}_seconds_max", float("nan")) * 1e3 for n in ("token_gap", "batch_step", "prompt_chunk"))
    print(f"| server side: token gaps (all streams, whole run) | {m.get('bmoe_token_gap_seconds_count', 0):.0f}, "
          f"p50 <= {hist_pct(m, 'bmoe_token_gap_seconds', 0.5):.0f} ms, p95 <= {hist_pct(m, 'bmoe_token_gap_seconds', 0.95):.0f} ms, "
          f"max {gap:.0f} ms |")
    print(f"| server side: decode steps / prompt chunks | {m.get('bmoe_batch_step_seconds_count', 0):.0f} steps, "
          f"max {step:.0f} ms / {m.get('bmoe_prompt_chunk_seconds_count', 0):.0f} chunks, max {chunk:.0f} ms |")
    print(f"| server side: longest gap <= longest chunk + longest step ({chunk + step:.0f} ms) | "
          f"{'yes' if gap <= chunk + step else 'no'} |")
    print(f"| server side: longest gap <= longest chunk ({chunk:.0f} ms) | {'yes' if gap <= chunk else 'no'} |")
    print(f"| server side: decode steps that read a prompt chunk in their pass | "
          f"{m.get('bmoe_batch_chunk_steps_total', 0):.0f} of {m.get('bmoe_prompt_chunk_seconds_count', 0):.0f} chunks |")
    over = m.get("bmoe_token_gap_overhead_seconds_max", float("nan")) * 1e3
    print(f"| server side: of each gap, the most that was neither its step nor its turn's one chunk | {over:.1f} ms "
          f"(p95 <= {hist_pct(m, 'bmoe_token_gap_overhead_seconds', 0.95):.1f} ms) |")
    print(f"| batch: rows per step, experts looked up / routed | {m.get('bmoe_batch_rows_per_step', 0):.2f}, "
          f"{m.get('bmoe_batch_expert_sharing_ratio', 1):.3f} ({m.get('bmoe_batch_expert_lookups_saved_total', 0):.0f} lookups saved) |")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default=None, help="default: /work/models/qwen3-30b-a3b-l<layers>.gguf, written once")
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--parallel", type=int, default=4)
    ap.add_argument("--clients", type=int, default=8)
    ap.add_argument("--requests", type=int, default=20)
    ap.add_argument("--long", type=int, default=2000, help="tokens of the one long prompt")
    ap.add_argument("-b", "--batch", type=int, default=256, help="prompt chunk (bmoe-server -b)")
    ap.add_argument("--ctx", type=int, default=2304, help="context per slot")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--flags", default="--no-moe-stream", help="more bmoe-server flags (both servers)")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    model = args.model or f"/work/models/qwen3-30b-a3b-l{args.layers}.gguf"
    ensure_model(model, "qwen3-30b-a3b", "--layers", str(args.layers))

    probe = Server(model, ["-t", "1", "-c", str(args.ctx), *args.flags.split()])
    try:
        long_ids = long_prompt(probe, args.long)
    finally:
        probe.stop()
    plan = requests(args, long_ids)
    log(f"alone: the distinct requests on a --parallel 1 server (load {loadavg()})")
    want, alone_timings = alone(model, args, plan)
    log(f"under load: --parallel {args.parallel}, {args.clients} clients x {args.requests} requests (load {loadavg()})")
    results, spans, wall, load_before, metrics = under_load(model, args, plan)
    load_after = loadavg()

    flat = [(c, r, plan[c][r][0], results[c][r]) for c in range(len(plan)) for r in range(len(plan[c]))]
    lost = [(c, r) for c, r, _, x in flat if x["status"] != 200 or not x["done"]]
    differ = [(c, r, k) for c, r, k, x in flat if x["status"] == 200 and x["text"] != want.get(k)]
    ttft = [x["events"][0] - x["sent"] for _, _, _, x in flat if x["events"]]
    per_client = [sum(x["tokens"] for x in results[c]) / spans[c] for c in range(len(plan))]
    total_tokens = sum(x["tokens"] for _, _, _, x in flat)
    long_r, start, end, gaps = pauses_during_long(results, plan)
    timings = long_r["timings"] or {}
    chunks = math.ceil(timings.get("prompt_n", args.long) / args.batch)
    chunk_ms = timings.get("prompt_ms", float("nan")) / chunks
    long_alone = next((t for k, t in alone_timings.items() if k.startswith("long/")), {})
    alone_chunk_ms = long_alone.get("prompt_ms", float("nan")) / math.ceil(long_alone.get("prompt_n", args.long) / args.batch)
    step_ms = statistics.median([b - a for _, _, _, x in flat for a, b in zip(x["events"], x["events"][1:])]) * 1e3
    worst = max(gaps) * 1e3 if gaps else float("nan")

    if args.out:
        os.makedirs(args.out, exist_ok=True)
        with open(os.path.join(args.out, "requests.csv"), "w", newline="") as f:
            w = csv.writer(f)
            w.writerow(["client", "request", "key", "status", "done", "tokens", "ttft_s", "seconds", "same_as_alone"])
            for c, r, k, x in flat:
                w.writerow([c, r, k, x["status"], x["done"], x["tokens"],
                            f"{x['events'][0] - x['sent']:.3f}" if x["events"] else "",
                            f"{x['events'][-1] - x['sent']:.3f}" if x["events"] else "", x["text"] == want.get(k)])
    print(f"{os.path.basename(model)}, bmoe-server --parallel {args.parallel} -b {args.batch} -t {args.threads} "
          f"{args.flags}, {args.clients} clients x {args.requests} streamed greedy requests (prompts of 2-"
          f"{max(len(medium(i).split()) for i in range(6))} words and one of {args.long} tokens, 8-24 tokens each), "
          f"load average {load_before} before, {load_after} after, {machine()}\n")
    print("| measure | value |\n|---|---|")
    print(f"| requests answered 200 with [DONE] | {len(flat) - len(lost)} of {len(flat)} |")
    print(f"| answers identical to the request alone (--parallel 1) | {len(flat) - len(differ) - len(lost)} of {len(flat)} |")
    print(f"| time to first token p50 / p95 | {pct(ttft, 0.5):.2f} s / {pct(ttft, 0.95):.2f} s |")
    print(f"| per-client tok/s min / median / max | {min(per_client):.2f} / {statistics.median(per_client):.2f} / "
          f"{max(per_client):.2f} |")
    print(f"| aggregate tok/s | {total_tokens / wall:.2f} ({total_tokens} tokens in {wall:.1f} s) |")
    print(f"| long prompt: read in | {(end - start):.2f} s from send to first token; {chunks} chunks, "
          f"{chunk_ms:.0f} ms each (server prompt_ms / chunks) |")
    print(f"| other streams' longest pause in that window | {worst:.0f} ms over {len(gaps)} gaps "
          f"(median token gap of the whole run {step_ms:.0f} ms) |")
    print(f"| other streams' gaps in that window: median / p90 | {pct(gaps, 0.5) * 1e3:.0f} / {pct(gaps, 0.9) * 1e3:.0f} ms |")
    over = sum(g * 1e3 > chunk_ms + step_ms for g in gaps)
    print(f"| gaps in that window longer than one chunk + one median step | {over} of {len(gaps)} |")
    verdict = "yes" if gaps and worst <= chunk_ms + step_ms else "no"
    print(f"| longest pause <= one chunk + one median step ({chunk_ms + step_ms:.0f} ms) | {verdict} |")
    print(f"| longest pause <= one chunk alone ({chunk_ms:.0f} ms) | {'yes' if gaps and worst <= chunk_ms else 'no'} |")
    print(f"| the long prompt's chunk read alone (--parallel 1 run: prompt_ms / chunks) | {alone_chunk_ms:.0f} ms; "
          f"longest pause {worst / alone_chunk_ms:.2f}x it |")
    server_side(metrics)
    if differ:
        print(f"\ndiffering: {differ[:10]}")
    if lost:
        print(f"\nlost: {lost[:10]}")


if __name__ == "__main__":
    main()
