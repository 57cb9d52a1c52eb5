"""Helpers shared by the benchmark drivers (Python standard library only)."""
import json
import os
import re
import statistics
import subprocess
import sys
import time

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))
BUILD = os.environ.get("BMOE_BUILD", os.path.join(REPO, "build"))
ORACLE = os.path.join(REPO, "tests", "oracle", "oracle.mjs")
PROMPT = ("Write a detailed essay about the history of computing, from the abacus and the "
          "Antikythera mechanism to modern processors, covering the key inventions and people.")


def tool(name):
    return os.path.join(BUILD, "tools", name)


def log(msg):
    print(msg, file=sys.stderr, flush=True)


def ensure_model(path, preset, *args):
    """Writes a synthetic model once (bmoe-synth prints its own progress)."""
    if os.path.exists(path):
        return path
    os.makedirs(os.path.dirname(path), exist_ok=True)
    subprocess.run([tool("bmoe-synth"), "--preset", preset, "-o", path, *args], check=True)
    return path


GEN_RE = re.compile(r"generation: (\d+) tokens, ([\d.]+) s/token, ([\d.]+) tok/s")


def resident_unless_streamed(flags):
    """bmoe-cli's mode flags for `flags`: resident unless they stream, since a run with neither
    flag streams a model that does not fit."""
    return [*([] if "--moe-stream" in flags else ["--no-moe-stream"]), *flags]


def run_bmoe(model, n, threads, *flags, prefix=()):
    """Runs bmoe-cli; returns (tok/s, stderr). prefix: a command to wrap it in (cgroup runner)."""
    cmd = [*prefix, tool("bmoe-cli"), "-m", model, "-p", PROMPT, "-n", str(n), "-t", str(threads),
           "--ignore-eos", *resident_unless_streamed(flags)]
    p = subprocess.run(cmd, capture_output=True, text=True)
    m = GEN_RE.search(p.stderr)
    if p.returncode != 0 or not m:
        return None, p.stderr
    return float(m.group(3)), p.stderr


def run_llama(model, n, threads, prefix=()):
    """Runs llama.cpp (node-llama-cpp) decode; returns (tok/s, output)."""
    cmd = [*prefix, "node", ORACLE, "bench", model, PROMPT, str(n), str(threads)]
    p = subprocess.run(cmd, capture_output=True, text=True, cwd=REPO)
    try:
        return json.loads(p.stdout.strip().splitlines()[-1])["tok_s"], p.stderr
    except Exception:
        return None, (p.stderr or "")[-2000:] + f" (exit {p.returncode})"


def describe(values):
    v = [x for x in values if x is not None]
    if not v:
        return "n/a"
    return f"{statistics.mean(v):.2f} (median {statistics.median(v):.2f}, n={len(v)})"


def machine():
    cpu = "unknown"
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return f"{cpu}, {os.cpu_count()} cores"
