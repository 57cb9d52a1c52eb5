"""Bad input to the tools: every case must end with a non-zero exit (not a signal), within a few
seconds, and one clear `error:` line on stderr that names the problem."""
import os
import subprocess
import tempfile
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

    def test_cli_bad_model_files(self):
        self.check([tool("bmoe-cli"), "-m", self.missing, "-p", "x"], "missing.gguf")
        self.check([tool("bmoe-cli"), "-m", self.truncated, "-p", "x"], "truncated.gguf")
        self.check([tool("bmoe-cli"), "-m", self.junk, "-p", "x"], "not a GGUF file")
        self.check([tool("bmoe-cli"), "-m", self.unknown_arch, "-p", "x"], "unsupported architecture", "qwen9moe")
        self.check([tool("bmoe-cli"), "-m", self.tmp.name, "-p", "x"], "not a regular file")
        self.check([tool("bmoe-tokenize"), "-m", self.truncated, "-p", "x"], "truncated.gguf")

    def test_other_tools(self):
        self.check([tool("bmoe-synth"), "--preset", "nope", "-o", os.path.join(self.tmp.name, "x.gguf")], "unknown preset")
        self.check([tool("bmoe-iobench"), self.missing], "missing.gguf")
        self.check([tool("bmoe-replay"), self.missing], "missing.gguf")
        self.check([tool("bmoe-replay"), self.bad_trace], "bad.route.csv")
        self.check([tool("bmoe-server"), "-m", self.missing, "--port", "0"], "missing.gguf")
        self.check([tool("bmoe-server"), "-m", self.model, "--port", "abc"], "--port")
        if os.path.exists(TRACE):
            self.check([tool("bmoe-replay"), TRACE, "--budgets", "1000,abc"], "--budgets")
            self.check([tool("bmoe-replay"), TRACE, "--policies", "nope"], "nope")


if __name__ == "__main__":
    unittest.main()
