"""Bad input to the tools: every case must end with a non-zero exit (not a signal), within a few
seconds, and one clear `error:` line on stderr that names the problem."""
import hashlib
import http.server
import json
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import unittest

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
BUILD = os.environ.get("BMOE_BUILD", os.path.join(REPO, "build"))
TRACE = os.path.join(REPO, "..", "shared", "data", "route-traces", "qwen3-30b-a3b-k6.route.csv")


def tool(name):
    return os.path.join(BUILD, "tools", name)


def write(path, data):
    with open(path, "wb") as f:
        f.write(data)


class BadInputGetsOneClearError(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.TemporaryDirectory()
        d = cls.tmp.name
        cls.model = os.path.join(d, "tiny.gguf")
        subprocess.run([tool("bmoe-synth"), "--preset", "tiny-qwen3moe", "-o", cls.model], check=True,
                       capture_output=True)
        with open(cls.model, "rb") as f:
            data = f.read()
        cls.truncated = os.path.join(d, "truncated.gguf")
        write(cls.truncated, data[:5000])
        cls.junk = os.path.join(d, "junk.gguf")
        write(cls.junk, b"not a gguf file at all\n")
        cls.unknown_arch = os.path.join(d, "arch.gguf")
        i = data.find(b"qwen3moe")
        write(cls.unknown_arch, data[:i] + b"qwen9moe" + data[i + 8:])
        cls.missing = os.path.join(d, "missing.gguf")
        cls.bad_trace = os.path.join(d, "bad.route.csv")
        write(cls.bad_trace, b"# route_trace v1\nturn,phase\n1,2\n")

    @classmethod
    def tearDownClass(cls):
        cls.tmp.cleanup()

    def check(self, args, *needles):
        p = subprocess.run(args, capture_output=True, text=True, timeout=60)
        self.assertGreater(p.returncode, 0, f"{args}: exit {p.returncode}\n{p.stderr[-1500:]}")
        errors = [line for line in p.stderr.splitlines() if line.startswith("error:")]
        self.assertEqual(len(errors), 1, f"{args}: expected one error line\n{p.stderr[-1500:]}")
        for n in needles:
            self.assertIn(n, errors[0], f"{args}")

    def test_cli_flags(self):
        m = self.model
        self.check([tool("bmoe-cli"), "-m", m, "--bogus"], "--bogus")
        self.check([tool("bmoe-cli"), "-m", m, "--io-threads", "0"], "--io-threads")
        self.check([tool("bmoe-cli"), "-m", m, "--read-chunk-kb", "6", "--moe-stream"], "--read-chunk-kb", "multiple of 4")
        self.check([tool("bmoe-cli"), "-m", m, "--temp", "abc"], "--temp")
        self.check([tool("bmoe-cli"), "-m", m, "--cache-mb", "lots", "--moe-stream", "-p", "x"], "--cache-mb")
        self.check([tool("bmoe-cli"), "-m", m, "--cache-file", "x.cache", "-p", "x"], "--cache-file")
        self.check([tool("bmoe-cli"), "-m", m, "--moe-stream", "--no-moe-stream", "-p", "x"], "--no-moe-stream")
        self.check([tool("bmoe-cli"), "-m", m, "--no-moe-stream", "--prefetch", "2", "-p", "x"], "--prefetch")
        self.check([tool("bmoe-cli"), "-m", m, "-p", "x", "--grammar", "root ::= nope"], "--grammar", "nope")
        self.check([tool("bmoe-cli"), "-m", m, "-p", "x", "-j", '{"type": "string", "pattern": "(?!a)b"}'],
                   "--json-schema", "pattern")
        self.check([tool("bmoe-cli"), "-m", m, "-p", "x", "-j", "{}", "--grammar", 'root ::= "a"'], "cannot be combined")
        self.check([tool("bmoe-cli"), "-m", m, "-p", "x", "--grammar-file", os.path.join(self.tmp.name, "none.gbnf")],
                   "none.gbnf")
        self.check([tool("bmoe-cli"), "-m", m, "--parallel", "0"], "--parallel")
        self.check([tool("bmoe-cli"), "-m", m, "--parallel", "2", "-p", "x"], "--parallel", "-f")
        self.check([tool("bmoe-cli"), "-m", m, "--parallel", "64", "-c", "512", "-f", m], "--parallel", "-c")
        empty = os.path.join(self.tmp.name, "empty.txt")
        write(empty, b"\n\n")
        self.check([tool("bmoe-cli"), "-m", m, "--parallel", "2", "-f", empty], "empty.txt", "no prompts")

    def test_huge_prompt_is_refused_before_tokenizing(self):
        big = os.path.join(self.tmp.name, "big.txt")
        with open(big, "w") as f:
            f.write("hello " * (2 << 20))  # 12 MB
        self.check([tool("bmoe-cli"), "-m", self.model, "-f", big, "-c", "512"], "12582912 bytes", "-c")
        # Bounded memory: the child's peak stays far below what tokenizing it whole took (~1 GB).
        peak_kib = subprocess.run(
            [sys.executable, "-c", "import resource, subprocess, sys; subprocess.run(sys.argv[1:], capture_output=True);"
             " print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)",
             tool("bmoe-cli"), "-m", self.model, "-f", big, "-c", "512"], capture_output=True, text=True, timeout=60)
        self.assertLess(int(peak_kib.stdout), 300 * 1024)

    def test_cli_bad_model_files(self):
        self.check([tool("bmoe-cli"), "-m", self.missing, "-p", "x"], "missing.gguf")
        self.check([tool("bmoe-cli"), "-m", self.truncated, "-p", "x"], "truncated.gguf")
        self.check([tool("bmoe-cli"), "-m", self.junk, "-p", "x"], "not a GGUF file")
        self.check([tool("bmoe-cli"), "-m", self.unknown_arch, "-p", "x"], "unsupported architecture", "qwen9moe")
        self.check([tool("bmoe-cli"), "-m", self.tmp.name, "-p", "x"], "not a regular file")
        self.check([tool("bmoe-tokenize"), "-m", self.truncated, "-p", "x"], "truncated.gguf")

    def test_other_tools(self):
        self.check([tool("bmoe-synth"), "--preset", "nope", "-o", os.path.join(self.tmp.name, "x.gguf")], "unknown preset")
        self.check([tool("bmoe-synth"), "--preset", "tiny-qwen3moe", "--attention-interval", "2", "--dry-run"],
                   "--attention-interval")
        self.check([tool("bmoe-iobench"), self.missing], "missing.gguf")
        self.check([tool("bmoe-replay"), self.missing], "missing.gguf")
        self.check([tool("bmoe-replay"), self.bad_trace], "bad.route.csv")
        self.check([tool("bmoe-server"), "-m", self.missing, "--port", "0"], "missing.gguf")
        self.check([tool("bmoe-server"), "-m", self.model, "--port", "abc"], "--port")
        if os.path.exists(TRACE):
            self.check([tool("bmoe-replay"), TRACE, "--budgets", "1000,abc"], "--budgets")
            self.check([tool("bmoe-replay"), TRACE, "--policies", "nope"], "nope")


class TinyModelCase(unittest.TestCase):
    """A class of tests on one tiny-qwen3moe file, written once for the class."""

    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.TemporaryDirectory()
        cls.model = os.path.join(cls.tmp.name, "tiny.gguf")
        subprocess.run([tool("bmoe-synth"), "--preset", "tiny-qwen3moe", "-o", cls.model], check=True,
                       capture_output=True)

    @classmethod
    def tearDownClass(cls):
        cls.tmp.cleanup()


class LlamaCppConventions(TinyModelCase):
    """llama.cpp's spellings are translated, accepted with a note, or refused with what bmoe does
    instead; never split into bundled short flags (-fa once became "-f a")."""

    def run_cli(self, *args):
        return subprocess.run([tool("bmoe-cli"), "-m", self.model, "-n", "4", *args], capture_output=True, text=True,
                              timeout=60, stdin=subprocess.DEVNULL)

    def refused(self, args, *needles):
        p = self.run_cli(*args)
        self.assertEqual(p.returncode, 2, f"{args}: {p.stderr[-800:]}")
        errors = [line for line in p.stderr.splitlines() if line.startswith("error:")]
        self.assertEqual(len(errors), 1, p.stderr[-800:])
        for n in needles:
            self.assertIn(n, errors[0])
        self.assertNotIn("load:", p.stderr)  # refused before the model was loaded

    def test_accepted_with_a_note_or_translated(self):
        base = self.run_cli("-p", "hello", "--temp", "0")
        self.assertEqual(base.returncode, 0, base.stderr[-800:])
        for args, note in ((["-fa"], "-fa ignored"), (["-fa", "on"], "-fa ignored"), (["--flash-attn", "auto"], "ignored"),
                           (["-ngl", "99"], "CPU only"), (["--color"], "--color ignored"), (["-no-cnv"], None),
                           (["-ngl", "0"], None), (["-ctk", "f16", "-ctv", "f16"], None)):
            p = self.run_cli("-p", "hello", "--temp", "0", *args)
            self.assertEqual(p.returncode, 0, f"{args}: {p.stderr[-800:]}")
            self.assertEqual(p.stdout, base.stdout, f"{args} changed the output (the prompt was replaced?)")
            if note:
                self.assertIn(note, p.stderr, args)
        p = self.run_cli("-p", "hello", "--temp", "0", "-ctk", "f32", "-ctv", "f32", "--json")
        self.assertEqual(p.returncode, 0, p.stderr[-800:])
        p = self.run_cli("--chat", "-sys", "You are terse.", "-p", "hello", "--temp", "0", "--tokenize")
        self.assertEqual(p.returncode, 0, p.stderr[-800:])
        q = self.run_cli("--chat", "--system", "You are terse.", "-p", "hello", "--temp", "0", "--tokenize")
        self.assertEqual(p.stdout, q.stdout)  # -sys is --system
        # -sys without --chat is not dropped: it wraps the prompt as --chat does, and says so.
        r = self.run_cli("-sys", "You are terse.", "-p", "hello", "--temp", "0", "--tokenize")
        self.assertEqual(r.returncode, 0, r.stderr[-800:])
        self.assertEqual(r.stdout, p.stdout)
        self.assertIn("--system wraps the prompt", r.stderr)
        # A value that looks like a llama.cpp flag stays a value.
        p = self.run_cli("-p", "-fa", "--temp", "0", "--tokenize")
        self.assertEqual(p.returncode, 0, p.stderr[-800:])
        self.assertNotIn("ignored", p.stderr)

    def test_refused_with_what_bmoe_does_instead(self):
        self.refused(["-p", "x", "-ctk", "q8_0"], "-ctk q8_0", "--kv-type")
        self.refused(["-p", "x", "-ctk", "f16", "-ctv", "f32"], "--kv-type")
        self.refused(["-p", "x", "-r", "User:"], "reverse prompt")
        self.refused(["--prompt-ids", "1,2", "-sys", "Be brief."], "--system", "--prompt-ids")
        self.refused(["-p", "x", "-tb", "2"], "-tb", "bundle")
        self.refused(["-p", "x", "--temp", "nan"], "--temp")
        self.refused(["-p", "x", "--top-p", "nan"], "--top-p")
        self.refused(["-p", "x", "--min-p", "nan"], "--min-p")
        self.refused(["-p", "x", "--presence-penalty", "3"], "--presence-penalty")
        self.refused(["-p", "x", "--frequency-penalty", "nan"], "--frequency-penalty")
        self.refused(["-p", "x", "--repeat-penalty", "0"], "--repeat-penalty")
        self.refused(["-p", "x", "--repeat-last-n", "-2"], "--repeat-last-n")
        self.refused(["-p", "x", "--csv", os.path.join(self.tmp.name, "no", "such", "dir", "x.csv")], "--csv")
        self.refused(["-p", "x", "--metrics", self.tmp.name], "--metrics", "not a regular file")
        self.refused(["-p", "x", "--dump-logits", os.path.join(self.tmp.name, "nodir", "l.bin")], "--dump-logits")
        self.refused(["-p", "x", "--moe-stream", "--cache-file", os.path.join(self.tmp.name, "none", "c.bin")], "--cache-file")

    def test_ctrl_c_at_an_idle_chat_prompt_quits(self):
        p = subprocess.Popen([tool("bmoe-cli"), "-m", self.model, "-i"], stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            banner = ""
            while "interactive chat" not in banner:  # the model is loaded, the prompt is waiting
                line = p.stderr.readline()
                self.assertTrue(line, "bmoe-cli -i exited before its prompt")
                banner += line
            time.sleep(0.3)  # into the blocking read
            p.send_signal(signal.SIGINT)
            self.assertEqual(p.wait(timeout=20), 0)  # stdin is still open: only Ctrl-C ended it
        finally:
            if p.poll() is None:
                p.kill()
                p.wait()
            p.stdin.close()
            p.stdout.close()
            p.stderr.close()

    def test_penalties_change_a_greedy_answer(self):
        def text(*flags):
            p = subprocess.run([tool("bmoe-cli"), "-m", self.model, "-p", "Once upon a time", "-n", "32", "--temp", "0",
                                "--json", *flags], capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL)
            self.assertEqual(p.returncode, 0, p.stderr[-800:])
            return json.loads(p.stdout)["tokens"]
        plain = text()
        self.assertLess(len(set(plain)), len(plain), "the plain answer repeats a token (the test needs one)")
        self.assertNotEqual(text("--frequency-penalty", "2", "--presence-penalty", "2"), plain)
        self.assertNotEqual(text("--repeat-penalty", "1.5", "--repeat-last-n", "-1"), plain)
        self.assertEqual(text("--repeat-penalty", "1.5", "--repeat-last-n", "0"), plain)  # no window: off
        self.assertEqual(text("--min-p", "0.5"), plain)  # min-p does not move greedy's pick

    def test_grammar_and_json_schema_constrain_the_output(self):
        def cli(*args):
            return subprocess.run([tool("bmoe-cli"), "-m", self.model, *args], capture_output=True, text=True,
                                  timeout=60, stdin=subprocess.DEVNULL)
        for seed in range(1, 5):
            p = cli("-p", "Answer:", "-n", "16", "--temp", "1", "-s", str(seed), "--json",
                             "--grammar", 'root ::= ("yes" | "no") "."')
            self.assertEqual(p.returncode, 0, p.stderr[-800:])
            self.assertIn(json.loads(p.stdout)["text"], ("yes.", "no."))
        schema = {"type": "object", "properties": {"n": {"type": "integer", "minimum": 0, "maximum": 99},
                                                   "ok": {"type": "boolean"}},
                  "required": ["n", "ok"], "additionalProperties": False}
        p = cli("-p", "JSON:", "-n", "200", "--temp", "1", "-s", "3", "--json", "-j", json.dumps(schema))
        self.assertEqual(p.returncode, 0, p.stderr[-800:])
        value = json.loads(json.loads(p.stdout)["text"])
        self.assertEqual(set(value), {"n", "ok"})
        self.assertTrue(0 <= value["n"] <= 99)

    def test_version_on_every_tool(self):
        for name in ("bmoe-cli", "bmoe-server", "bmoe-synth", "bmoe-replay", "bmoe-tokenize", "bmoe-iobench",
                     "bmoe-perplexity"):
            p = subprocess.run([tool(name), "--version"], capture_output=True, text=True, timeout=30)
            self.assertEqual(p.returncode, 0, name)
            # What a bug report needs: release, commit, build type and the kernel path in use.
            self.assertRegex(p.stdout.strip(),
                             r"^bmoe \d+\.\d+\.\d+ \(commit ([0-9a-f]{12}(-dirty)?|unknown), \w+ build, isa [\w+-]+\)$", name)

    def test_random_seed_is_printed_and_repeatable(self):
        runs = [self.run_cli("-p", "hello", "--temp", "1.5") for _ in range(2)]
        seeds = []
        for p in runs:
            self.assertEqual(p.returncode, 0, p.stderr[-800:])
            m = re.search(r"^seed: (\d+)", p.stderr, re.M)
            self.assertIsNotNone(m, p.stderr[-800:])
            seeds.append(m.group(1))
        self.assertNotEqual(seeds[0], seeds[1])
        again = self.run_cli("-p", "hello", "--temp", "1.5", "-s", seeds[0])
        self.assertEqual(again.stdout, runs[0].stdout)  # the printed seed repeats the run
        self.assertNotIn("seed:", again.stderr)
        greedy = self.run_cli("-p", "hello", "--temp", "0")
        self.assertNotIn("seed:", greedy.stderr)  # nothing is sampled



class ParallelCli(TinyModelCase):
    """bmoe-cli --parallel N: the lines of -f decoded N at once (-np is llama.cpp's spelling), each
    answer exactly the one the prompt gets alone, greedy and seeded sampling, streamed; the report
    says how many experts the rows shared."""

    def cli(self, *args):
        p = subprocess.run([tool("bmoe-cli"), "-m", self.model, "--moe-stream", "--cache-mb", "0", "-n", "24",
                            "--ignore-eos", "--json", *args], capture_output=True, text=True, timeout=120,
                           stdin=subprocess.DEVNULL)
        self.assertEqual(p.returncode, 0, p.stderr[-1500:])
        return p

    def test_each_answer_equals_its_prompt_alone(self):
        prompts = ["the quick brown fox", "once upon a time", "hello", "a b c d e f g", "the end of it all"]
        path = os.path.join(self.tmp.name, "prompts.txt")
        write(path, ("\n".join(prompts) + "\n").encode())
        for sampling in (["--temp", "0"], ["--temp", "0.9", "-s", "7"]):
            p = self.cli("-f", path, "-np", "3", *sampling)
            answers = {}
            for line in p.stdout.splitlines():
                j = json.loads(line)
                answers[j["index"]] = j["tokens"]
            self.assertEqual(sorted(answers), list(range(len(prompts))))
            for i, prompt in enumerate(prompts):
                alone = json.loads(self.cli("-p", prompt, *sampling).stdout)
                self.assertEqual(answers[i], alone["tokens"], f"prompt {i} {sampling}")
            self.assertIn("3 at once: 120 tokens", p.stderr)
            m = re.search(r"experts (\d+) distinct of (\d+) routed", p.stderr)
            self.assertIsNotNone(m, p.stderr)
            self.assertLess(int(m.group(1)), int(m.group(2)))
            self.assertRegex(p.stderr, r"flash [0-9.]+ MiB per generated token")

    def test_drafts_per_sequence_keep_every_answer(self):
        """--draft in a batch: each sequence drafts from its own line of an earlier --parallel
        --json run (--draft-oracle, two tokens in three right), all verified in the shared steps;
        every answer equals the plain batch's, and the report gives each sequence's and the total
        acceptance. A prompt missing from the oracle's file is refused with one line."""
        prompts = ["the quick brown fox", "once upon a time", "hello"]
        path = os.path.join(self.tmp.name, "drafts.txt")
        write(path, ("\n".join(prompts) + "\n").encode())
        plain = self.cli("-f", path, "-np", "2", "--temp", "0")
        oracle = os.path.join(self.tmp.name, "oracle.jsonl")
        write(oracle, plain.stdout.encode())
        p = self.cli("-f", path, "-np", "2", "--temp", "0", "--draft", "3", "--draft-oracle", oracle, "--draft-accept", "0.7")
        answers = lambda out: {j["index"]: j["tokens"] for j in map(json.loads, out.splitlines())}
        self.assertEqual(answers(p.stdout), answers(plain.stdout))
        self.assertEqual(len(re.findall(r"sequence \d: .*drafted \d+, accepted \d+", p.stderr)), 3, p.stderr[-1500:])
        m = re.search(r"speculative: drafted (\d+), accepted (\d+) .* ([\d.]+) tokens per sequence and step", p.stderr)
        self.assertIsNotNone(m, p.stderr[-1500:])
        self.assertGreater(int(m.group(2)), 0)
        self.assertGreater(float(m.group(3)), 1.0)
        write(oracle, plain.stdout.splitlines()[0].encode())
        bad = subprocess.run([tool("bmoe-cli"), "-m", self.model, "-f", path, "-np", "2", "-n", "4", "--draft", "2",
                              "--draft-oracle", oracle], capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL)
        self.assertNotEqual(bad.returncode, 0)
        self.assertIn("--draft-oracle", bad.stderr.strip().splitlines()[-1])

    def test_prompts_ride_in_the_running_steps(self):
        """As bmoe-server's slots: the first prompt is read alone, the others in chunks of -b inside
        the running answers' decode steps, so decoding begins before the last prompt is read; the
        long prompt's answer (read in four chunks beside two answers) equals its answer alone."""
        long_prompt = " ".join(["the quick brown fox jumps over the lazy dog"] * 6)
        prompts = ["hello", "once upon a time", long_prompt]
        path = os.path.join(self.tmp.name, "ride.txt")
        write(path, ("\n".join(prompts) + "\n").encode())
        p = self.cli("-f", path, "-np", "3", "-b", "16", "--temp", "0")
        m = re.search(r"parallel: (\d+) prompt chunks, (\d+) of them inside decode steps; decoding began at turn (\d+), "
                      r"the last prompt was read at turn (\d+)", p.stderr)
        self.assertIsNotNone(m, p.stderr[-1500:])
        chunks, inside, began, last = (int(g) for g in m.groups())
        self.assertGreaterEqual(chunks, 4)
        self.assertEqual(inside, chunks - 1, "only the first prompt's chunk had a pass of its own")
        self.assertLess(began, last, "every prompt was read before decoding began")
        answers = {j["index"]: j["tokens"] for j in map(json.loads, p.stdout.splitlines())}
        alone = json.loads(self.cli("-p", long_prompt, "-b", "16", "--temp", "0").stdout)
        self.assertEqual(answers[2], alone["tokens"])


class TheModeChoosesItself(TinyModelCase):
    """Without --moe-stream / --no-moe-stream the run streams when the model does not fit in the
    available memory (here BMOE_FAKE_MEM_AVAILABLE_MB, the tests' stand-in for the machine's
    figures) and stays resident when it fits; one `mode:` line says which and why."""

    def mode_lines(self, available_mb, *args):
        env = dict(os.environ, BMOE_FAKE_MEM_AVAILABLE_MB=str(available_mb))
        p = subprocess.run([tool("bmoe-cli"), "-m", self.model, "-p", "hello", "-n", "4", "-t", "2", "--json", *args],
                           capture_output=True, text=True, timeout=60, env=env, stdin=subprocess.DEVNULL)
        self.assertEqual(p.returncode, 0, p.stderr[-800:])
        streamed = json.loads(p.stdout.strip().splitlines()[-1])
        return [line for line in p.stderr.splitlines() if line.startswith("mode:")], p.stderr, streamed

    def test_a_model_that_does_not_fit_streams_and_says_why(self):
        lines, err, _ = self.mode_lines(700)  # under the 256 MiB buffers + 512 MiB margin
        self.assertEqual(len(lines), 1, err[-800:])
        self.assertRegex(lines[0], r"^mode: streaming \(model [\d.]+ MiB \+ KV [\d.]+ \w+ > available 700\.00 MiB")
        self.assertIn("experts streamed", err)

    def test_a_model_that_fits_stays_resident(self):
        lines, err, _ = self.mode_lines(64 << 10)
        self.assertEqual(len(lines), 1, err[-800:])
        self.assertRegex(lines[0], r"^mode: resident \(model [\d.]+ MiB \+ KV [\d.]+ \w+ <= available 64\.00 GiB")
        self.assertIn("experts resident", err)

    def test_the_flags_force_either(self):
        lines, err, _ = self.mode_lines(64 << 10, "--moe-stream", "--cache-mb", "1")
        self.assertEqual(lines, ["mode: streaming (--moe-stream)"], err[-800:])
        lines, err, _ = self.mode_lines(700, "--no-moe-stream")
        self.assertEqual(len(lines), 1, err[-800:])
        self.assertTrue(lines[0].startswith("mode: resident (--no-moe-stream, though it does not fit"), lines[0])
        self.assertIn("experts resident", err)

    def test_the_answer_is_the_same_either_way(self):
        _, _, streamed = self.mode_lines(700)
        _, _, resident = self.mode_lines(64 << 10)
        self.assertEqual(streamed["tokens"], resident["tokens"])


class HubHandler(http.server.BaseHTTPRequestHandler):
    """Answers the Hugging Face paths -hf reads (api/models/REPO/refs, .../tree/COMMIT, REPO/resolve/
    COMMIT/PATH with byte ranges) from `files`; the first transfer of `cut` breaks off halfway."""
    files, commit, token, cut, log = {}, "c0ffee" * 6 + "c0ff", "secret", None, []

    def log_message(self, *args):
        pass

    def send(self, status, body, headers=()):
        self.send_response(status)
        for k, v in headers:
            self.send_header(k, v)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self):
        cls = type(self)
        cls.log.append((self.path, self.headers.get("Range")))
        if self.headers.get("Authorization") != f"Bearer {cls.token}":
            return self.send(401, b'{"error": "unauthorized"}')
        if self.path == "/api/models/test/tiny/refs":
            return self.send(200, json.dumps({"branches": [{"name": "main", "targetCommit": cls.commit}]}).encode())
        if self.path == f"/api/models/test/tiny/tree/{cls.commit}?recursive=true":
            tree = [{"type": "file", "path": name, "oid": "0" * 40, "lfs": {"oid": hashlib.sha256(data).hexdigest()}}
                    for name, data in cls.files.items()]
            return self.send(200, json.dumps(tree).encode())
        prefix = f"/test/tiny/resolve/{cls.commit}/"
        name = self.path[len(prefix):] if self.path.startswith(prefix) else None
        if name not in cls.files:
            return self.send(404, b"{}")
        data = cls.files[name]
        start = int(re.match(r"bytes=(\d+)-", self.headers["Range"]).group(1)) if self.headers.get("Range") else 0
        self.send_response(206 if start else 200)
        self.send_header("Content-Length", str(len(data) - start))
        self.end_headers()
        if name == cls.cut:  # the connection drops halfway through
            cls.cut = None
            self.wfile.write(data[start:len(data) // 2])
            self.wfile.flush()
            self.close_connection = True
            return
        self.wfile.write(data[start:])


class HfDownload(unittest.TestCase):
    """-hf against a local server answering the hub's paths: a two-shard model downloaded,
    interrupted and resumed into llama.cpp's cache layout, then run; offline, the cache serves."""

    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.TemporaryDirectory()
        d = cls.tmp.name
        subprocess.run([tool("bmoe-synth"), "--preset", "tiny-qwen3moe", "--shards", "2", "-o",
                        os.path.join(d, "tiny-Q8_0.gguf")], check=True, capture_output=True)
        cls.shards = [f"tiny-Q8_0-0000{i}-of-00002.gguf" for i in (1, 2)]
        HubHandler.files = {}
        for name in cls.shards:
            with open(os.path.join(d, name), "rb") as f:
                HubHandler.files[name] = f.read()
        HubHandler.files["tiny-F16.gguf"] = b"not this one"
        HubHandler.files["README.md"] = b"# tiny"
        cls.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), HubHandler)
        threading.Thread(target=cls.server.serve_forever, daemon=True).start()

    @classmethod
    def tearDownClass(cls):
        cls.server.shutdown()
        cls.server.server_close()
        cls.tmp.cleanup()

    def cli(self, cache, *args, port=None):
        env = {**os.environ, "MODEL_ENDPOINT": f"http://127.0.0.1:{port or self.server.server_port}/",
               "LLAMA_CACHE": cache, "HF_TOKEN": "secret"}
        return subprocess.run([tool("bmoe-cli"), *args, "-n", "4", "--temp", "0", "--json"], capture_output=True,
                              text=True, timeout=120, env=env, stdin=subprocess.DEVNULL)

    def test_download_interrupted_resumed_then_run(self):
        cache = os.path.join(self.tmp.name, "cache")
        HubHandler.cut = self.shards[1]
        HubHandler.log.clear()
        p = self.cli(cache, "-hf", "test/tiny:Q8_0", "-p", "hello")
        self.assertEqual(p.returncode, 1, p.stderr[-800:])
        errors = [line for line in p.stderr.splitlines() if line.startswith("error:")]
        self.assertEqual(len(errors), 1, p.stderr[-800:])
        self.assertIn("run again to resume", errors[0])
        broken = p
        p = self.cli(cache, "-hf", "test/tiny:Q8_0", "-p", "hello")
        self.assertEqual(p.returncode, 0, p.stderr[-800:])
        self.assertIn("resuming", p.stderr)
        # A progress line (by quarters when stderr is not a terminal) reaches 100 % for each
        # shard: the first in the broken run, the second in the resumed one.
        for out, name in ((broken, self.shards[0]), (p, self.shards[1])):
            self.assertRegex(out.stderr, rf"download: {re.escape(name)} 100 % \([0-9.]+ / [0-9.]+ MiB\)\n")
        size = len(HubHandler.files[self.shards[1]])
        self.assertIn((f"/test/tiny/resolve/{HubHandler.commit}/{self.shards[1]}", f"bytes={size // 2}-"), HubHandler.log)
        local = subprocess.run([tool("bmoe-cli"), "-m", os.path.join(self.tmp.name, self.shards[0]), "-p", "hello",
                                "-n", "4", "--temp", "0", "--json"], capture_output=True, text=True, timeout=120)
        self.assertEqual(json.loads(p.stdout)["tokens"], json.loads(local.stdout)["tokens"])
        # llama.cpp's cache layout: refs/main, blobs by sha256, snapshot links to them.
        repo = os.path.join(cache, "models--test--tiny")
        with open(os.path.join(repo, "refs", "main")) as f:
            self.assertEqual(f.read().strip(), HubHandler.commit)
        for name in self.shards:
            link = os.path.join(repo, "snapshots", HubHandler.commit, name)
            self.assertTrue(os.path.islink(link))
            blob = os.path.realpath(link)
            self.assertEqual(os.path.basename(blob), hashlib.sha256(HubHandler.files[name]).hexdigest())
            with open(blob, "rb") as f:
                self.assertEqual(f.read(), HubHandler.files[name])
        # --hf-file names the file; a second run downloads nothing.
        HubHandler.log.clear()
        p = self.cli(cache, "--hf-repo", "test/tiny", "--hf-file", self.shards[0], "-p", "hello")
        self.assertEqual(p.returncode, 0, p.stderr[-800:])
        self.assertFalse([path for path, _ in HubHandler.log if "/resolve/" in path])
        # Offline: the cached copy runs, with a note; an empty cache is one clear error.
        closed = socket.socket()
        closed.bind(("127.0.0.1", 0))
        port = closed.getsockname()[1]
        closed.close()
        p = self.cli(cache, "-hf", "test/tiny:Q8_0", "-p", "hello", port=port)
        self.assertEqual(p.returncode, 0, p.stderr[-800:])
        self.assertIn("using the cached", p.stderr)
        p = self.cli(os.path.join(self.tmp.name, "empty"), "-hf", "test/tiny:Q8_0", "-p", "hello", port=port)
        self.assertEqual(p.returncode, 1)
        errors = [line for line in p.stderr.splitlines() if line.startswith("error:")]
        self.assertEqual(len(errors), 1, p.stderr[-800:])
        self.assertIn("cannot reach", errors[0])

    def test_bad_names_and_tokens_are_one_error(self):
        cache = os.path.join(self.tmp.name, "cache-bad")
        for args, needle in ((["-hf", "not-a-repo"], "user/model"), (["-hf", "test/tiny:Q2_K"], "no Q2_K GGUF"),
                             (["--hf-file", "x.gguf"], "--hf-repo"), (["-hf", "test/tiny", "-m", "x.gguf"], "both")):
            p = self.cli(cache, *args, "-p", "hello")
            self.assertEqual(p.returncode, 1, (args, p.stderr[-800:]))
            errors = [line for line in p.stderr.splitlines() if line.startswith("error:")]
            self.assertEqual(len(errors), 1, (args, p.stderr[-800:]))
            self.assertIn(needle, errors[0], args)
        env_token = HubHandler.token
        HubHandler.token = "other"
        try:
            p = self.cli(cache, "-hf", "test/tiny", "-p", "hello")
        finally:
            HubHandler.token = env_token
        self.assertEqual(p.returncode, 1)
        self.assertIn("HF_TOKEN", p.stderr)


if __name__ == "__main__":
    unittest.main()
