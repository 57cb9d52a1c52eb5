"""Shared helpers for the tests that drive bmoe's tools and llama.cpp (node-llama-cpp)."""
import fcntl
import json
import os
import shutil
import struct
import subprocess
import tempfile
import unittest

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
BUILD = os.environ.get("BMOE_BUILD", os.path.join(REPO, "build"))
MODELS = os.environ.get("BMOE_TEST_MODELS", os.path.join(BUILD, "test-models"))
ORACLE = os.path.join(REPO, "tests", "oracle", "oracle.mjs")
THREADS = os.environ.get("BMOE_TEST_THREADS", "2")

# llama.cpp's prebuilt CPU backend comes in one library per x86 level and loads the best the
# CPU supports. The AMX build ("sapphirerapids") runs its own tile kernels, which round
# differently from every other level and are several times slower on these tiny shapes
# (measured: tiny-qwen3moe leaves the greedy path on 2/8 prompts with it, 0/8 without; 180 s
# vs 12 s per test). Conformance leaves that one out, so the peer picks its best non-AMX path;
# benchmarks keep the peer at its best.
PEER_EXCLUDED_CPU = [v for v in os.environ.get("BMOE_PEER_CPU_EXCLUDE", "sapphirerapids").split(",") if v]
# Every AVX-512 level of llama.cpp's CPU backend. On the OLMoE shape they disagree with llama.cpp's
# own AVX2 builds (haswell, alderlake): one prompt's next-token log-probabilities move by up to
# 0.08 in a 2-layer cut, and the difference goes away when the expert down projections are Q8_0
# instead of Q6_K. bmoe equals the AVX2 builds there to 8e-6 (measured 2026-12-03).
PEER_AVX512 = ["skylakex", "cannonlake", "cascadelake", "cooperlake", "icelake", "zen4"]
NODE_MODULES = os.path.join(REPO, "node_modules")
PEER_PACKAGE = os.path.join("@node-llama-cpp", "linux-x64")


def read_stamp(path):
    """The text of a stamp file, or None when there is none."""
    if not os.path.exists(path):
        return None
    with open(path) as f:
        return f.read()


def pinned_peer_root(extra_exclude=()):
    """A node_modules mirror (under the build folder) without the excluded llama.cpp CPU
    backends: every package is a symlink except the prebuilt-binary package, whose files are
    hard links minus the excluded libggml-cpu-* variants. Node runs with --preserve-symlinks so
    node-llama-cpp resolves its binaries inside the mirror. Returns the mirror root, or None
    where there is nothing to leave out."""
    bins = os.path.join(NODE_MODULES, PEER_PACKAGE, "bins", "linux-x64")
    excluded = sorted(set(PEER_EXCLUDED_CPU) | set(extra_exclude))
    dropped = {f"libggml-cpu-{v}.so" for v in excluded}
    if not os.path.isdir(bins) or not dropped & set(os.listdir(bins)):
        return None
    root = os.path.join(BUILD, "peer-" + "-".join(excluded))
    stamp = os.path.join(root, ".stamp")
    key = f"{os.path.getmtime(bins)} {sorted(dropped)}"
    if read_stamp(stamp) == key:
        return root
    # Tests run in parallel: build in a private folder, then rename it into place.
    tmp = tempfile.mkdtemp(prefix="peer-", dir=BUILD)
    mirror = os.path.join(tmp, "node_modules")
    os.makedirs(os.path.join(mirror, "@node-llama-cpp"))
    for entry in os.listdir(NODE_MODULES):
        if entry != "@node-llama-cpp":
            os.symlink(os.path.join(NODE_MODULES, entry), os.path.join(mirror, entry))

    def link_or_copy(src, dst):
        if os.path.basename(src) in dropped:
            return
        try:
            os.link(src, dst)
        except OSError:
            shutil.copy2(src, dst)

    shutil.copytree(os.path.join(NODE_MODULES, PEER_PACKAGE), os.path.join(mirror, PEER_PACKAGE),
                    copy_function=link_or_copy)
    os.symlink(os.path.join(REPO, "tests", "oracle"), os.path.join(tmp, "oracle"))
    with open(os.path.join(tmp, ".stamp"), "w") as f:
        f.write(key)
    shutil.rmtree(root, ignore_errors=True)
    try:
        os.rename(tmp, root)
    except OSError:  # another test won the race; its mirror is the same
        shutil.rmtree(tmp, ignore_errors=True)
    return root


def oracle_command(extra_exclude=()):
    """The node command line that runs the oracle script (pinned peer where possible), leaving
    out the llama.cpp CPU levels in extra_exclude as well as the default ones."""
    root = pinned_peer_root(extra_exclude)
    if root is None:
        return ["node", ORACLE]
    return ["node", "--preserve-symlinks", "--preserve-symlinks-main", os.path.join(root, "oracle", "oracle.mjs")]


def tool(name):
    return os.path.join(BUILD, "tools", name)


def run(args, **kw):
    """Runs a command, returns stdout; raises with its stderr on failure."""
    p = subprocess.run(args, capture_output=True, text=True, **kw)
    if p.returncode != 0:
        raise RuntimeError(f"{' '.join(args)} failed ({p.returncode}):\n{p.stderr[-3000:]}")
    return p.stdout



PEER_BINS = os.path.join(NODE_MODULES, PEER_PACKAGE, "bins", "linux-x64")
PEER_BUNDLE = os.path.join(NODE_MODULES, "node-llama-cpp", "llama", "gitRelease.bundle")


def build_llama_program(name, extra_flags=()):
    """Builds tests/oracle/<name>.cpp against node-llama-cpp's prebuilt library, once per build
    folder (again when the source is newer). The headers come from the peer's own source bundle,
    cloned once; a lock keeps two conformance tests started together from cloning into the same
    folder at once."""
    exe = os.path.join(BUILD, name)
    src = os.path.join(REPO, "tests", "oracle", name + ".cpp")
    if not os.path.exists(PEER_BUNDLE) or not os.path.isdir(PEER_BINS):
        raise unittest.SkipTest("skipped: node-llama-cpp's bundled llama.cpp or its prebuilt library is missing")
    with open(os.path.join(BUILD, "llama-release.lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if os.path.exists(exe) and os.path.getmtime(exe) > os.path.getmtime(src):
            return exe
        headers = os.path.join(BUILD, "llama-release")
        if not os.path.isdir(headers):
            run(["git", "clone", "-q", "--depth", "1", PEER_BUNDLE, headers])
        includes = [f"-I{os.path.join(headers, d)}" for d in ("include", os.path.join("ggml", "include"), "src")]
        run(["g++", "-std=c++17", "-O1", *includes, *extra_flags, src, "-o", exe, "-L" + PEER_BINS,
             "-l:libllama.v0.4.0.so", "-l:libggml.v0.4.0.so", "-l:libggml-base.so", "-ldl",
             "-Wl,-rpath," + PEER_BINS])
    return exe

# Models above this size are deleted when their test class ends (unless BMOE_KEEP_TEST_MODELS=1):
# CI machines have seen as little as 1.5 GiB of free disk, and the real-shape cuts are 0.6-2.0 GiB.
LARGE_MODEL_BYTES = 256 << 20
DISK_SHORT = "not enough free disk"


def synth(name, preset, *extra):
    """Writes (once) a synthetic model into the test model folder and returns its path.
    Raises unittest.SkipTest when bmoe-synth's up-front disk check says the file cannot fit:
    the machine's disk, not the code under test, is what is short."""
    os.makedirs(MODELS, exist_ok=True)
    path = os.path.join(MODELS, name + ".gguf")
    stamp = path + ".args"
    args = [tool("bmoe-synth"), "--preset", preset, "-o", path, *extra]
    key = json.dumps([args, os.path.getmtime(tool("bmoe-synth"))])  # rewrite when the generator changes
    if not (os.path.exists(path) and read_stamp(stamp) == key):
        try:
            run(args)
        except RuntimeError as e:
            if DISK_SHORT in str(e):
                raise unittest.SkipTest(f"skipped: {str(e).strip().splitlines()[-1]}") from None
            raise
        with open(stamp, "w") as f:
            f.write(key)
    return path


def release(path):
    """Deletes a large test model once its tests are done, so the next real-shape cut has room."""
    if os.environ.get("BMOE_KEEP_TEST_MODELS") == "1" or not os.path.exists(path):
        return
    if os.path.getsize(path) > LARGE_MODEL_BYTES:
        os.unlink(path)
        if os.path.exists(path + ".args"):
            os.unlink(path + ".args")


def oracle(mode, model, payload, n=32, env=None, exclude=()):
    """Runs tests/oracle/oracle.mjs (llama.cpp) on a JSON payload, returns its JSON answer.
    env: extra ORACLE_* settings (ORACLE_KV=f32, ORACLE_FA=0, ORACLE_BATCH=1); exclude: llama.cpp
    CPU levels to leave out besides the default ones."""
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
        json.dump(payload, f)
        name = f.name
    try:
        out = run([*oracle_command(exclude), mode, model, name, str(n), THREADS], cwd=REPO,
                  env={**os.environ, **(env or {})})
    finally:
        os.unlink(name)
    return json.loads(out)


def oracle_jobs(model, jobs, exclude=()):
    """One llama.cpp process (one model load) answers every job: jobs is a dict name -> job
    (tests/oracle/oracle.mjs, mode "jobs"); returns a dict name -> answer."""
    names = list(jobs)
    answers = oracle("jobs", model, [jobs[k] for k in names], exclude=exclude)
    return dict(zip(names, answers))


def bmoe_tokenize(model, texts):
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
        json.dump(texts, f)
        name = f.name
    try:
        return json.loads(run([tool("bmoe-tokenize"), "-m", model, "--json", name]))
    finally:
        os.unlink(name)


def bmoe_greedy(model, prompt, n=32, *extra, env=None):
    """bmoe-cli's greedy answer to `prompt` (env: extra environment, e.g. BMOE_ISA)."""
    out = run([tool("bmoe-cli"), "-m", model, "-p", prompt, "-n", str(n), "--json", "--ignore-eos",
               "-t", THREADS, *extra], env={**os.environ, **(env or {})})
    return json.loads(out.strip().splitlines()[-1])


def bmoe_greedy_all(model, prompts, n=32, *extra):
    """bmoe_greedy of each prompt, from one bmoe-cli process (a real-shape cut's load is most of
    a short run): `--parallel 1 -f` reads the prompts one after another into its single slot, and
    each answer is exactly that prompt's own run (BatchSlotsTest, Families/BatchIdentity). Prompts
    with a line break cannot be lines of -f: those run one process each."""
    if len(prompts) < 2 or any("\n" in p or "\r" in p for p in prompts):
        return [bmoe_greedy(model, p, n, *extra) for p in prompts]
    with tempfile.NamedTemporaryFile("w", suffix=".txt", encoding="utf-8") as f:
        f.write("".join(p + "\n" for p in prompts))
        f.flush()
        out = run([tool("bmoe-cli"), "-m", model, "-f", f.name, "--parallel", "1", "-n", str(n), "--json",
                   "--ignore-eos", "-t", THREADS, *extra])
    answers = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
    answers.sort(key=lambda a: a["index"])
    if [a["index"] for a in answers] != list(range(len(prompts))):
        raise RuntimeError(f"bmoe-cli --parallel 1 answered {len(answers)} of {len(prompts)} prompts:\n{out[-2000:]}")
    return answers


def bmoe_logits(model, prompt, env=None):
    """The logits bmoe-cli computes after `prompt` (env: extra environment, e.g. BMOE_ISA)."""
    with tempfile.NamedTemporaryFile(suffix=".bin") as f:
        run([tool("bmoe-cli"), "-m", model, "-p", prompt, "-n", "1", "-t", THREADS, "--dump-logits", f.name],
            env={**os.environ, **(env or {})})
        raw = f.read()  # bmoe-cli wrote the file through its own handle; this one is still at 0
    return struct.unpack(f"{len(raw) // 4}f", raw)


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
    if i is None or i >= len(ref["tokens"]):
        return None
    if i >= len(ref["top2"]) or ref["top2"][i] is None:  # a compare job asks them only where needed
        raise AssertionError(f"llama.cpp's top-2 probabilities at step {i} were not asked for")
    _, p1, _, p2 = ref["top2"][i]
    return None if p1 - p2 < NEAR_TIE else (i, p1 - p2)
