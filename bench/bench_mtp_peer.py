#!/usr/bin/env python3
"""bmoe's --mtp drafting against llama.cpp's draft-mtp on the same resident model, same threads,
same prompt ids, greedy, same number of tokens; each engine's plain decoding beside it.

llama.cpp runs as llama-server built from the tree node-llama-cpp bundles (one server process
per run, one /completion request; its `timings` give tok/s and the draft counts). Configurations
alternate within each round (bmoe plain, llama plain, bmoe MTP, llama MTP, then each set
acceptance), so a drifting machine load moves both engines; the 1-minute load average is
recorded before every run.

Acceptance. Random weights make both heads' guesses almost always wrong, so the "own head" rows
show the acceptance each engine really got. Set acceptance: bmoe `--draft-oracle plain.json
--draft-accept P` (the head runs and is paid for; each proposal is the plain run's token, right
with probability P, independently) against llama-server `--spec-synth-rates P,P^2,..,P^k` (the
head runs and is paid for; draft token i is accepted with probability P given that the ones before
it were: the same per-token law). Differences that remain: llama.cpp always drafts k tokens
(--spec-draft-p-min 0); bmoe adapts the length (1..k) and pauses drafting below 25 %
acceptance. llama.cpp's synthetic mode keeps draft tokens it was told to accept even where the
target disagrees ("generated output is not valid"), so its tokens are not compared there.

--trace J: the heads' proposals for the first J generation steps. llama-server at -lv 5 logs
each draft step's candidates; bmoe-cli --mtp --dump-logits after the prompt plus the first j
plain tokens writes the head's first two draft steps (argmax = its proposals for the same step).

--heads MTP_ORACLE: tests/oracle/mtp_oracle.cpp (built against node-llama-cpp's prebuilt library)
against bmoe-cli --mtp --dump-logits on the bench prompt and test_mtp.py's prompts: the trunks'
greedy tokens and both heads' two draft steps, where the trunks agree.

--llama-env OMP_WAIT_POLICY=passive: llama.cpp's OpenMP threads busy-wait by default; on a shared
2-core machine that stalled some of its tokens for about a second (1.2-1.8 tok/s vs 31.6 passive).

    bench/bench_mtp_peer.py --model /work/models/qwen3.6-35b-a3b-l4.gguf \\
        --llama-bin /work/llama-build/bin --out bench/results/DATE/mtp-peer --llama-env OMP_WAIT_POLICY=passive
"""
import argparse
import array
import datetime
import json
import math
import os
import re
import signal
import subprocess
import sys
import time
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import REPO, PROMPT, log, machine, tool  # noqa: E402

GEN_RE = re.compile(r"generation: (\d+) tokens, ([\d.]+) s/token, ([\d.]+) tok/s")
SPEC_RE = re.compile(r"speculative: drafted (\d+), accepted (\d+) \([\d.]+ %\), (\d+) verify passes")
# common/speculative.cpp's draft-mtp, at debug verbosity: " - seq_id 0, draft candidate   0, pos   1:   1234 ..."
CAND_RE = re.compile(r"draft candidate +0, pos +(\d+): +(-?\d+)")


def loadavg():
    with open("/proc/loadavg") as f:
        return float(f.read().split()[0])


SEQ = [0]


def record(out, tag, engine, config, load, tok_s, tokens, drafted=None, accepted=None):
    SEQ[0] += 1
    r = {"seq": SEQ[0], "tag": tag, "engine": engine, "config": config, "load": load, "tok_s": tok_s,
         "tokens": tokens, "drafted": drafted, "accepted": accepted}
    acc = f", drafted {drafted}, accepted {accepted}" if drafted is not None else ""
    log(f"  {tag}: {tok_s:.2f} tok/s{acc}, load {load:.2f}")
    return r


def run_bmoe(args, flags, tag, config, prompt=None):
    load = loadavg()
    source = ["--prompt-ids", ",".join(map(str, prompt))] if prompt else ["-p", PROMPT]
    cmd = [tool("bmoe-cli"), "-m", args.model, *source, "-n", str(args.tokens), "-t", str(args.threads),
           "-c", str(args.ctx), "--no-moe-stream", "--ignore-eos", "--json", *flags]
    p = subprocess.run(cmd, capture_output=True, text=True, cwd=REPO, timeout=args.timeout)
    with open(os.path.join(args.out, "logs", tag + ".log"), "w") as f:
        f.write(" ".join(cmd) + "\n" + p.stderr)
    m = GEN_RE.search(p.stderr)
    if p.returncode != 0 or not m:
        sys.exit(f"{tag}: bmoe-cli failed (exit {p.returncode}): {p.stderr.strip().splitlines()[-1:]}")
    out = json.loads(p.stdout.strip().splitlines()[-1])
    s = SPEC_RE.search(p.stderr)
    r = record(args.out, tag, "bmoe", config, load, float(m.group(3)), out["tokens"],
               int(s.group(1)) if s else None, int(s.group(2)) if s else None)
    r["prompt"] = out["prompt"]
    return r


class LlamaServer:
    """One llama-server process for one request (started and stopped by this script only)."""

    def __init__(self, args, flags, log_path):
        self.port = args.port
        cmd = [os.path.join(args.llama_bin, "llama-server"), "-m", args.model, "-t", str(args.threads),
               "-tb", str(args.threads), "-c", str(args.ctx), "-np", "1", "--host", "127.0.0.1",
               "--port", str(self.port), "--no-webui", "--cache-ram", "0", "-fit", "off", *flags]
        self.cmd = cmd
        self.log = open(log_path, "w")
        self.log.write(" ".join(args.llama_env + cmd) + "\n")
        self.log.flush()
        env = dict(os.environ, **dict(kv.split("=", 1) for kv in args.llama_env))
        self.proc = subprocess.Popen(cmd, stdout=self.log, stderr=subprocess.STDOUT, env=env)

    def wait_ready(self, timeout):
        end = time.time() + timeout
        while time.time() < end:
            if self.proc.poll() is not None:
                raise RuntimeError(f"llama-server exited {self.proc.returncode} (see {self.log.name})")
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/health", timeout=5) as r:
                    if r.status == 200:
                        return
            except Exception:
                pass
            time.sleep(0.5)
        raise RuntimeError("llama-server did not become ready")

    def complete(self, prompt, n, timeout):
        body = {"prompt": prompt, "n_predict": n, "temperature": 0.0, "ignore_eos": True, "cache_prompt": False,
                "return_tokens": True, "seed": 1, "stream": False}
        req = urllib.request.Request(f"http://127.0.0.1:{self.port}/completion", data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return json.loads(r.read())

    def stop(self):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log.close()


def run_llama(args, flags, tag, config, prompt):
    server = LlamaServer(args, flags, os.path.join(args.out, "logs", tag + ".log"))
    try:
        server.wait_ready(args.timeout)
        load = loadavg()
        res = server.complete(prompt, args.tokens, args.timeout)
    finally:
        server.stop()
    t = res["timings"]
    return record(args.out, tag, "llama.cpp", config, load, float(t["predicted_per_second"]), res.get("tokens", []),
                  t.get("draft_n", 0 if "mtp" in config else None), t.get("draft_n_accepted", 0 if "mtp" in config else None))


def configs(args, oracle):
    """(name, bmoe flags, llama-server flags) in the order one round runs them."""
    k = str(args.draft)
    mtp = ["--spec-type", "draft-mtp", "--spec-draft-n-max", k, "--spec-draft-p-min", "0"]
    out = [("plain", [], []), (f"mtp k={k}, own head", ["--mtp", "--draft", k], mtp)]
    for p in [float(x) for x in args.accept.split(",") if x]:
        rates = ",".join(f"{p ** (i + 1):.6g}" for i in range(args.draft))
        out.append((f"mtp k={k}, set {p:.0%}", ["--mtp", "--draft", k, "--draft-oracle", oracle, "--draft-accept", str(p)],
                    mtp + ["--spec-synth-rates", rates]))
    return out


def trace(args, prompt, plain_tokens):
    """The heads' proposals for the first args.trace generation steps, both engines."""
    bmoe = []
    for j in range(args.trace):
        rows = bmoe_head_dump(args, prompt + plain_tokens[:j], f"head-{j}")
        bmoe.append([argmax(row) for row in rows])  # trunk, step 0, step 1
    # llama.cpp: the real head (no synthetic acceptance), k = 2 drafts per step, debug logging.
    tag = "trace-llama"
    server = LlamaServer(args, ["--spec-type", "draft-mtp", "--spec-draft-n-max", "2", "--spec-draft-p-min", "0",
                                "-lv", "5"], os.path.join(args.out, "logs", tag + ".log"))
    try:
        server.wait_ready(args.timeout)
        res = server.complete(prompt, args.trace + 2, args.timeout)
    finally:
        server.stop()
    with open(os.path.join(args.out, "logs", tag + ".log")) as f:
        text = f.read()
    steps, cur = [], []
    for pos, tok in CAND_RE.findall(text):
        if int(pos) == 0 and cur:
            steps.append(cur)
            cur = []
        cur.append(int(tok))
    if cur:
        steps.append(cur)
    return bmoe, steps, res.get("tokens", [])


def softmax(v):
    m = max(v)
    e = [math.exp(x - m) for x in v]
    t = sum(e)
    return [x / t for x in e]


def argmax(v):
    return max(range(len(v)), key=v.__getitem__)


def bmoe_head_dump(args, ids, tag):
    """bmoe-cli --mtp --dump-logits after the prompt `ids`: (trunk logits, head step 0, head step 1)."""
    dump = os.path.join(args.out, "logs", tag + ".f32")
    p = subprocess.run([tool("bmoe-cli"), "-m", args.model, "--prompt-ids", ",".join(map(str, ids)), "-n", "1",
                        "-t", str(args.threads), "--no-moe-stream", "--mtp", "--draft", "2", "--dump-logits", dump],
                       capture_output=True, text=True, cwd=REPO, timeout=args.timeout)
    if p.returncode != 0:
        sys.exit(f"{tag}: bmoe-cli failed: {p.stderr.strip().splitlines()[-1:]}")
    a = array.array("f")
    with open(dump, "rb") as f:
        a.frombytes(f.read())
    os.remove(dump)
    n = len(a) // 3
    return [a[i * n:(i + 1) * n] for i in range(3)]


def compare_heads(args, prompts):
    """The MTP heads on the same prompts: llama.cpp's draft path (tests/oracle/mtp_oracle.cpp: the
    trunk over the prompt, the MTP context over it, two draft steps from the trunk's greedy token)
    against bmoe-cli --mtp --dump-logits. A prompt whose trunks pick different tokens feeds the
    heads different inputs and is reported as such."""
    text = ";".join(",".join(map(str, ids)) for ids in prompts)
    p = subprocess.run([args.heads, args.model, text, args.peer_bins, args.peer_exclude], capture_output=True,
                       text=True, timeout=args.timeout)
    if p.returncode != 0:
        sys.exit(f"mtp_oracle failed: {p.stderr.strip().splitlines()[-1:]}")
    refs = [json.loads(line) for line in p.stdout.splitlines() if line.strip()]
    lines = ["| prompt (tokens) | trunk's greedy token: bmoe / llama.cpp | head step 0: bmoe / llama.cpp "
             "| head step 1: bmoe / llama.cpp | max abs. probability difference, steps 0 and 1 |",
             "|---|---|---|---|---|"]
    for i, (ids, ref) in enumerate(zip(prompts, refs)):
        trunk, s0, s1 = bmoe_head_dump(args, ids, f"heads-{i}")
        b_next = argmax(trunk)
        picks = [argmax(s0), argmax(s1)]
        l_picks = [argmax(ref["steps"][0]), argmax(ref["steps"][1])]
        if b_next != ref["next"]:
            gap = trunk[b_next] - trunk[ref["next"]]
            lines.append(f"| {i} ({len(ids)}) | {b_next} / {ref['next']} (bmoe's logit gap {gap:.3g}) | "
                         f"{picks[0]} / {l_picks[0]} | {picks[1]} / {l_picks[1]} | different inputs |")
            continue
        diffs = [max(abs(a - b) for a, b in zip(softmax(list(x)), softmax(y))) for x, y in zip((s0, s1), ref["steps"])]
        lines.append(f"| {i} ({len(ids)}) | {b_next} / {ref['next']} | {picks[0]} / {l_picks[0]} "
                     f"{'(same)' if picks[0] == l_picks[0] else '**(differ)**'} | {picks[1]} / {l_picks[1]} "
                     f"{'(same)' if picks[1] == l_picks[1] else '**(differ)**'} | {diffs[0]:.2g}, {diffs[1]:.2g} |")
    with open(os.path.join(args.out, "heads.md"), "w") as f:
        f.write("\n".join(lines) + "\n")
    return lines


def write_trace(path, bmoe, llama, llama_tokens, plain):
    lines = ["| step j (after prompt + j plain tokens) | trunk's token (bmoe / plain run) | bmoe head: draft 0, 1 "
             "| llama.cpp draft-mtp: draft 0, 1 | same |", "|---|---|---|---|---|"]
    same = 0
    for j, b in enumerate(bmoe):
        l = llama[j] if j < len(llama) else []
        ok = l[:2] == b[1:3]
        same += ok
        lines.append(f"| {j} | {b[0]} / {plain[j]} | {b[1]}, {b[2]} | {', '.join(map(str, l[:2])) or '—'} | "
                     f"{'yes' if ok else '**no**'} |")
    lines.append("")
    lines.append(f"{same} of {len(bmoe)} steps propose the same two tokens; llama.cpp's trace run generated "
                 f"{llama_tokens[:len(bmoe)]} (plain: {plain[:len(bmoe)]}).")
    with open(path, "w") as f:
        f.write("\n".join(lines) + "\n")
    return lines


def summarize(args, rows, plain_tokens):
    by = {}
    for r in rows:
        by.setdefault((r["config"], r["engine"]), []).append(r)
    names = list(dict.fromkeys(r["config"] for r in rows))
    mean = lambda rs: sum(r["tok_s"] for r in rs) / len(rs)  # noqa: E731
    plain = {e: mean(by[("plain", e)]) for e in ("bmoe", "llama.cpp")}
    loads = [r["load"] for r in rows]
    t = [f"{datetime.date.today()}, {machine()}; {os.path.basename(args.model)} resident, {args.tokens} tokens, "
         f"{args.threads} threads, greedy, {len(by[('plain', 'bmoe')])} round(s) alternating every configuration; 1-minute load "
         f"average {min(loads):.2f}-{max(loads):.2f}.", "",
         "| configuration | bmoe tok/s (runs) | bmoe vs its plain | bmoe acceptance (accepted/drafted) "
         "| llama.cpp tok/s (runs) | llama.cpp vs its plain | llama.cpp acceptance (accepted/drafted) "
         "| bmoe / llama.cpp | tokens = the engine's own plain run (bmoe, llama.cpp) |", "|---|---|---|---|---|---|---|---|---|"]
    for name in names:
        cells = []
        for e in ("bmoe", "llama.cpp"):
            rs = by.get((name, e), [])
            d = sum(r["drafted"] or 0 for r in rs)
            a = sum(r["accepted"] or 0 for r in rs)
            acc = "—" if name == "plain" else (f"{100 * a / d:.1f} % ({a}/{d})" if d else "none drafted")
            runs = ", ".join(f"{r['tok_s']:.2f}" for r in rs)
            cells += [f"{mean(rs):.2f} ({runs})",
                      f"{mean(rs) / plain[e]:.2f}x", acc]
        eq = []
        for e in ("bmoe", "llama.cpp"):
            rs = by.get((name, e), [])
            own_plain = by[("plain", e)][0]["tokens"]  # each engine against its own plain decoding
            if e == "llama.cpp" and "set" in name:
                eq.append("n/a (synthetic)")
            else:
                eq.append("yes" if all(r["tokens"] == own_plain for r in rs) else "**NO**")
        ratio = mean(by[(name, "bmoe")]) / mean(by[(name, "llama.cpp")])
        t.append(f"| {name} | {cells[0]} | {cells[1]} | {cells[2]} | {cells[3]} | {cells[4]} | {cells[5]} | "
                 f"{ratio:.2f}x | {', '.join(eq)} |")
    b, l = by[("plain", "bmoe")][0]["tokens"], by[("plain", "llama.cpp")][0]["tokens"]
    first = next((i for i, (x, y) in enumerate(zip(b, l)) if x != y), None)
    t += ["", f"bmoe's plain tokens == the first bmoe run's (the oracle): "
          f"{'yes' if all(r['tokens'] == plain_tokens for r in by[('plain', 'bmoe')]) else '**NO**'}; "
          "llama.cpp's plain tokens vs bmoe's: " + ("identical" if first is None else f"first differ at token {first}")]
    return t


def write_csv(path, rows):
    cols = ["seq", "tag", "engine", "config", "load", "tok_s", "drafted", "accepted"]
    with open(path, "w") as f:
        f.write(",".join(cols) + "\n")
        for r in sorted(rows, key=lambda r: r["seq"]):
            f.write(",".join("" if r[c] is None else (f"{r[c]:.3f}" if isinstance(r[c], float) else str(r[c]))
                             for c in cols) + "\n")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", required=True)
    ap.add_argument("--llama-bin", required=True, help="folder with llama-server")
    ap.add_argument("--out", required=True)
    ap.add_argument("--tokens", type=int, default=96)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--ctx", type=int, default=4096)
    ap.add_argument("--draft", type=int, default=3, help="k: tokens drafted per step (llama.cpp: always k)")
    ap.add_argument("--accept", default="0.7", help="set acceptance rates, comma-separated")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--trace", type=int, default=0, help="compare the heads' proposals for this many steps")
    ap.add_argument("--heads", default="", help="mtp_oracle binary: compare the heads' logits on the same prompts")
    ap.add_argument("--heads-only", action="store_true", help="with --heads: only that comparison")
    ap.add_argument("--peer-bins", default=os.path.join(REPO, "node_modules", "@node-llama-cpp", "linux-x64", "bins",
                                                        "linux-x64"), help="mtp_oracle's CPU backends")
    ap.add_argument("--peer-exclude", default="sapphirerapids", help="CPU backend variants mtp_oracle skips")
    ap.add_argument("--llama-env", action="append", default=[], metavar="KEY=VALUE",
                    help="environment for llama-server, e.g. OMP_WAIT_POLICY=passive (its OpenMP threads then "
                         "sleep instead of spinning at barriers: on a shared 2-core machine the spinning "
                         "stalled some tokens for a second)")
    ap.add_argument("--port", type=int, default=18436)
    ap.add_argument("--timeout", type=int, default=900)
    args = ap.parse_args()
    os.makedirs(os.path.join(args.out, "logs"), exist_ok=True)
    first = run_bmoe(args, [], "bmoe-plain-oracle", "oracle")
    prompt, plain_tokens = first["prompt"], first["tokens"]
    oracle = os.path.join(args.out, "plain.json")
    with open(oracle, "w") as f:
        json.dump({"prompt": prompt, "tokens": plain_tokens}, f)
    if args.heads:
        # the bench prompt, then tests/conformance/test_mtp.py's token-id prompts
        extra = [[569, 573, 100, 200, 300, 17, 40, 41], list(range(1, 13)), [300, 301, 302], [7, 77, 177, 277, 377],
                 [50, 60, 70, 80, 90, 100, 110], [400, 12, 400, 12, 400, 12]]
        print("\n".join(compare_heads(args, [prompt] + extra)), flush=True)
        if args.heads_only:
            return
    if args.trace:
        bmoe, llama, llama_tokens = trace(args, prompt, plain_tokens)
        print("\n".join(write_trace(os.path.join(args.out, "trace.md"), bmoe, llama, llama_tokens, plain_tokens)))
    rows = []
    for rnd in range(args.rounds):
        for i, (name, bflags, lflags) in enumerate(configs(args, oracle)):
            rows.append(run_bmoe(args, bflags, f"r{rnd}-c{i}-bmoe", name, prompt))
            rows.append(run_llama(args, lflags, f"r{rnd}-c{i}-llama", name, prompt))
        write_results(args, rows, plain_tokens)  # after every round: a cut-short sweep keeps what it measured


def write_results(args, rows, plain_tokens):
    table = summarize(args, rows, plain_tokens)
    write_csv(os.path.join(args.out, "results.csv"), rows)
    with open(os.path.join(args.out, "results.json"), "w") as f:
        json.dump([{k: v for k, v in r.items() if k != "prompt"} for r in rows], f)
    with open(os.path.join(args.out, "results.md"), "w") as f:
        f.write("\n".join(table) + "\n")
    print("\n".join(table), flush=True)

if __name__ == "__main__":
    main()
