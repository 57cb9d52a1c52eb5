"""--cache-mb auto inside a cgroup-v1 memory cap smaller than the model: a long streamed run is
never OOM-killed, stays under the cap, and the budget it chose is printed. Needs root and a
writable cgroup-v1 memory controller; skipped elsewhere."""
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

CAP = 2048 << 20


@unittest.skipUnless(available(), "needs root and the cgroup-v1 memory controller")
class AutoBudgetUnderCap(unittest.TestCase):
    def test_long_run_is_never_oom_killed(self):
        with tempfile.TemporaryDirectory() as tmp:
            model = os.path.join(tmp, "qwen3-6l.gguf")
            # 6 layers of the real Qwen3-30B shape: 2.8 GB, larger than the 2 GiB cap.
            w = subprocess.run([os.path.join(BUILD, "tools", "bmoe-synth"), "--preset", "qwen3-30b-a3b",
                                "--layers", "6", "-o", model], capture_output=True, text=True)
            if "not enough free disk" in w.stderr:  # the machine is short, not the code under test
                self.skipTest(f"skipped: {w.stderr.strip().splitlines()[-1]}")
            self.assertEqual(w.returncode, 0, w.stderr[-2000:])
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
        m = re.search(r"moe-cache: auto budget (\d+) MiB = available (\d+) MiB \(cgroup limit (\d+) MiB\)", p.stderr)
        self.assertIsNotNone(m, p.stderr[-2000:])
        budget, limit = int(m.group(1)), int(m.group(3))
        self.assertEqual(limit, CAP >> 20)
        self.assertGreater(budget, 0)
        self.assertLess(peak, CAP)
        self.assertRegex(p.stderr, r"generation: 29[89] tokens")  # decode steps after the first token


if __name__ == "__main__":
    unittest.main()
