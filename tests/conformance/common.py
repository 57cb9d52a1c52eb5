"""Shared helpers for the tests that drive bmoe's tools and llama.cpp (node-llama-cpp)."""
import json
import os
import subprocess
import tempfile

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
BUILD = os.environ.get("BMOE_BUILD", os.path.join(REPO, "build"))
MODELS = os.environ.get("BMOE_TEST_MODELS", os.path.join(BUILD, "test-models"))
ORACLE = os.path.join(REPO, "tests", "oracle", "oracle.mjs")
THREADS = os.environ.get("BMOE_TEST_THREADS", "2")


def tool(name):
    return os.path.join(BUILD, "tools", name)


def run(args, **kw):
    """Runs a command, returns stdout; raises with its stderr on failure."""
    p = subprocess.run(args, capture_output=True, text=True, **kw)
    if p.returncode != 0:
        raise RuntimeError(f"{' '.join(args)} failed ({p.returncode}):\n{p.stderr[-3000:]}")
    return p.stdout


def synth(name, preset, *extra):
    """Writes (once) a synthetic model into the test model folder and returns its path."""
    os.makedirs(MODELS, exist_ok=True)
    path = os.path.join(MODELS, name + ".gguf")
    stamp = path + ".args"
    args = [tool("bmoe-synth"), "--preset", preset, "-o", path, *extra]
    key = json.dumps([args, os.path.getmtime(tool("bmoe-synth"))])  # rewrite when the generator changes
    if not (os.path.exists(path) and os.path.exists(stamp) and open(stamp).read() == key):
        run(args)
        with open(stamp, "w") as f:
            f.write(key)
    return path


def oracle(mode, model, payload, n=32, env=None):
    """Runs tests/oracle/oracle.mjs (llama.cpp) on a JSON payload, returns its JSON answer.
    env: extra ORACLE_* settings (ORACLE_KV=f32, ORACLE_FA=0, ORACLE_BATCH=1)."""
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
        json.dump(payload, f)
        name = f.name
    try:
        out = run(["node", ORACLE, mode, model, name, str(n), THREADS], cwd=REPO,
                  env={**os.environ, **(env or {})})
    finally:
        os.unlink(name)
    return json.loads(out)


def bmoe_tokenize(model, texts):
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
        json.dump(texts, f)
        name = f.name
    try:
        return json.loads(run([tool("bmoe-tokenize"), "-m", model, "--json", name]))
    finally:
        os.unlink(name)


def bmoe_greedy(model, prompt, n=32, *extra):
    out = run([tool("bmoe-cli"), "-m", model, "-p", prompt, "-n", str(n), "--json", "--ignore-eos",
               "-t", THREADS, *extra])
    return json.loads(out.strip().splitlines()[-1])


def first_divergence(a, b):
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


NEAR_TIE = 1e-3


def hard_divergence(ours, ref):
    """First step where `ours` leaves llama.cpp's greedy path although llama.cpp's own top-2
    probabilities there are not a near-tie (gap >= 1e-3); None when there is no such step.
    Returns (step, gap)."""
    i = first_divergence(ours["tokens"], ref["tokens"])
    if i is None or i >= len(ref["top2"]):
        return None
    _, p1, _, p2 = ref["top2"][i]
    return None if p1 - p2 < NEAR_TIE else (i, p1 - p2)
