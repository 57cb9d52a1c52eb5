"""--cache-mb auto inside a cgroup-v1 memory cap smaller than the model: a long streamed run is
never OOM-killed, stays under the cap, and the budget it chose is printed; with MTP drafting
(--mtp --draft 8 on a hybrid trunk) the budget also leaves room for the recurrent-state copies
verification keeps and the head's own rows, and the output is plain decoding's. Needs root and
a writable cgroup-v1 memory controller; skipped elsewhere."""
import os
import re
import subprocess
import sys
import tempfile
import unittest

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
BUILD = os.environ.get("BMOE_BUILD", os.path.join(REPO, "build"))
sys.path.insert(0, os.path.join(REPO, "bench"))
from cgroup import MemoryCap, available  # noqa: E402

# Below the 2.9 GB (2772 MiB) model, above its dense weights, KV, working buffers, margin and
# the room a prompt chunk's visit of all 256 experts of a layer takes beside the cache (488 MiB):
# the automatic budget is then > 0.
CAP = 2700 << 20
BUDGET = re.compile(r"moe-cache: auto budget (\d+) MiB = available (\d+) MiB \(cgroup limit (\d+) MiB\) - KV (\d+) MiB( - drafting (\d+) MiB)?")


def synth_or_skip(test, preset, layers, path):
    w = subprocess.run([os.path.join(BUILD, "tools", "bmoe-synth"), "--preset", preset, "--layers", str(layers), "-o", path],
                       capture_output=True, text=True)
    if "not enough free disk" in w.stderr:  # the machine is short, not the code under test
        test.skipTest(f"skipped: {w.stderr.strip().splitlines()[-1]}")
    test.assertEqual(w.returncode, 0, w.stderr[-2000:])


class SharedModel:
    """3 layers of the real Qwen3.6-35B-A3B shape with its MTP block (2.9 GB, larger than the cap;
    Gated DeltaNet layers hold the recurrent state that verification copies), written once
    for both tests: writing it is most of their time."""
    tmp = None
    path = None

    @classmethod
    def get(cls, test):
        if cls.path is None:
            cls.tmp = tempfile.TemporaryDirectory()
            path = os.path.join(cls.tmp.name, "qwen3.6-3l.gguf")
            synth_or_skip(test, "qwen3.6-35b-a3b", 3, path)
            cls.path = path
        return cls.path


def tearDownModule():
    if SharedModel.tmp is not None:
        SharedModel.tmp.cleanup()


@unittest.skipUnless(available(), "needs root and the cgroup-v1 memory controller")
class AutoBudgetUnderCap(unittest.TestCase):
    def test_long_run_is_never_oom_killed(self):
        model = SharedModel.get(self)
        self.assertGreater(os.path.getsize(model), CAP)
        with MemoryCap(f"bmoe-test-auto-{os.getpid()}", CAP) as cap:
            cmd = cap.prefix() + [os.path.join(BUILD, "tools", "bmoe-cli"), "-m", model, "-p", "Once upon a time",
                                  "-n", "300", "--ignore-eos", "-t", "2", "-c", "1024", "--moe-stream",
                                  "--cache-mb", "auto"]
            p = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
            oom = cap.oom_kills()
            peak = cap.max_usage()
        self.assertEqual(oom, 0, p.stderr[-2000:])
        self.assertEqual(p.returncode, 0, p.stderr[-2000:])
        m = BUDGET.search(p.stderr)
        self.assertIsNotNone(m, p.stderr[-2000:])
        budget, limit = int(m.group(1)), int(m.group(3))
        self.assertEqual(limit, CAP >> 20)
        self.assertGreater(budget, 0)
        self.assertLess(peak, CAP)
        self.assertRegex(p.stderr, r"generation: 29[89] tokens")  # decode steps after the first token


@unittest.skipUnless(available(), "needs root and the cgroup-v1 memory controller")
class MtpUnderCap(unittest.TestCase):
    def run_capped(self, model, extra):
        with MemoryCap(f"bmoe-test-mtp-{os.getpid()}", CAP) as cap:
            cmd = cap.prefix() + [os.path.join(BUILD, "tools", "bmoe-cli"), "-m", model, "-p", "Once upon a time", "-n", "40",
                                  "--ignore-eos", "-t", "2", "-c", "1024", "--temp", "0", "--moe-stream", "--cache-mb", "auto", *extra]
            p = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
            self.assertEqual(cap.oom_kills(), 0, p.stderr[-2000:])
            self.assertLess(cap.max_usage(), CAP)
        self.assertEqual(p.returncode, 0, p.stderr[-2000:])
        m = BUDGET.search(p.stderr)
        self.assertIsNotNone(m, p.stderr[-2000:])
        return p, m

    def test_drafting_is_budgeted_and_lossless(self):
        model = SharedModel.get(self)
        self.assertGreater(os.path.getsize(model), CAP)
        plain, pm = self.run_capped(model, [])
        drafted, dm = self.run_capped(model, ["--mtp", "--draft", "8"])
        self.assertIsNone(pm.group(5), "a run that does not draft reserves nothing for drafting")
        self.assertIsNotNone(dm.group(5), drafted.stderr[-2000:])
        self.assertGreater(int(dm.group(6)), 0)
        self.assertEqual(dm.group(4), pm.group(4), "the trunk's own KV and state are the same")
        self.assertRegex(drafted.stderr, r"speculative: drafted [1-9]")
        self.assertEqual(drafted.stdout, plain.stdout)


if __name__ == "__main__":
    unittest.main()
