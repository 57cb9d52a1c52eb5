"""Smoke test of the benchmark suite on a tiny model: bench/run-matrix runs llama.cpp and
several bmoe configurations (inside a cgroup cap when the machine allows one), bench/analyze
turns the folder into summary.md and plots, and the numbers are consistent with each other."""
import csv
import glob
import json
import os
import re
import subprocess
import sys
import tempfile
import unittest

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
BUILD = os.environ.get("BMOE_BUILD", os.path.join(REPO, "build"))
sys.path.insert(0, os.path.join(REPO, "bench"))
from cgroup import available as cgroup_available  # noqa: E402

CONFIGS = ["llama-mmap", "mmap", "c0-l2", "c1-l2-overlap", "c1-l2-overlap-pf1", "c1-l2-uring-overlap", "c1-l2-draft2"]


class BenchSmoke(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.TemporaryDirectory()
        cls.out = os.path.join(cls.tmp.name, "results")
        cls.model = os.path.join(cls.tmp.name, "tiny.gguf")
        subprocess.run([os.path.join(BUILD, "tools", "bmoe-synth"), "--preset", "tiny-qwen3moe", "--layers", "4",
                        "-o", cls.model], check=True, capture_output=True)
        cap = "1" if cgroup_available() else "0"
        subprocess.run([sys.executable, os.path.join(REPO, "bench", "run-matrix"), "--model", cls.model,
                        "--ram-gib", cap, "--tokens", "16", "--cooldown", "0", "--no-route-replay",
                        "--configs", ",".join(CONFIGS), "--out", cls.out],
                       check=True, capture_output=True, env={**os.environ, "BMOE_BUILD": BUILD})
        subprocess.run([sys.executable, os.path.join(REPO, "bench", "analyze"), cls.out], check=True, capture_output=True)

    @classmethod
    def tearDownClass(cls):
        cls.tmp.cleanup()

    def test_every_run_left_its_files(self):
        for c in CONFIGS:
            run = json.load(open(os.path.join(self.out, f"{c}-r1.run.json")))
            self.assertEqual(run["exit"], 0, c)
            self.assertTrue(os.path.exists(os.path.join(self.out, f"{c}-r1.csv")), c)
            if c != "llama-mmap":
                # 16 tokens: the prompt's pass gives the first, 15 decode steps the rest.
                metrics = json.load(open(os.path.join(self.out, f"{c}-r1.metrics.json")))
                self.assertGreater(metrics["prompt"]["tokens"], 0, c)
                self.assertEqual(metrics["decode"]["tokens"], 15, c)
                self.assertGreater(metrics["decode"]["tok_per_s"], 0, c)
                self.assertEqual(metrics["config"]["moe_stream"], c.startswith("c"), c)

    def test_uring_config_read_through_io_uring(self):
        # Where the kernel refuses io_uring bmoe-cli falls back to threads and warns: then this
        # says so by name instead of passing on threads.
        with open(os.path.join(self.out, "c1-l2-uring-overlap-r1.log")) as f:
            log = f.read()
        refused = re.search(r"warning: ((io_uring unavailable|built without liburing).*)", log)
        if refused:
            self.skipTest(f"io_uring did not run: {refused.group(1)}")
        self.assertRegex(log, r"experts streamed \(2 lanes io_uring,")

    def test_summary_table_parses_and_covers_every_config(self):
        text = open(os.path.join(self.out, "summary.md")).read()
        rows = [line for line in text.splitlines() if line.startswith("| ") and not line.startswith("| config")]
        names = {r.split("|")[1].strip() for r in rows}
        for c in CONFIGS:
            self.assertIn(c, names)
        for r in rows:
            cells = [x.strip() for x in r.strip("|").split("|")]
            self.assertEqual(cells[-1], "ok", r)
            mean = float(cells[1].strip("*"))
            self.assertGreater(mean, 0, r)
        for plot in ("tok_s.svg", "timeline.svg", "hit_warmup.svg"):
            svg = open(os.path.join(self.out, plot)).read()
            self.assertIn("<svg", svg)

    def test_hits_and_misses_add_up_to_routed_experts(self):
        for c in CONFIGS:
            if not c.startswith("c"):
                continue
            with open(os.path.join(self.out, f"{c}-r1.csv")) as f:
                rows = list(csv.DictReader(f))
            self.assertGreaterEqual(len(rows), 10, c)
            for row in rows:
                routed = int(row["experts_routed"])
                self.assertGreater(routed, 0, c)
                self.assertEqual(int(row["cache_hits"]) + int(row["cache_misses"]), routed, (c, row))
            if c == "c0-l2":
                self.assertTrue(all(int(r["cache_hits"]) == 0 for r in rows))

    def test_every_bmoe_run_logged_its_progress(self):
        # One --progress line per decode step (the first of the 16 tokens comes from the prompt's
        # pass): what a timed-out run is judged by.
        for c in CONFIGS:
            if c == "llama-mmap":
                continue
            with open(os.path.join(self.out, f"{c}-r1.log")) as f:
                lines = [line for line in f if line.startswith("[")]
            self.assertGreaterEqual(len(lines), 15, c)
            self.assertTrue(lines[-1].startswith("[15/16] "), (c, lines[-1]))


class PartialProgress(unittest.TestCase):
    """How far a run stopped by run-matrix's timeout got, from either engine's stderr."""

    @classmethod
    def setUpClass(cls):
        import importlib.util
        from importlib.machinery import SourceFileLoader
        path = os.path.join(REPO, "bench", "run-matrix")
        spec = importlib.util.spec_from_loader("run_matrix", SourceFileLoader("run_matrix", path))
        cls.matrix = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(cls.matrix)

    def test_bmoe_progress_lines(self):
        log = "load: m.gguf\nprompt: 9 tokens\n[1/256] 0.10 tok/s (this 9800 ms), hit 0.0 %\n" \
              "[2/256] 0.14 tok/s (this 4500 ms), hit 0.0 %, read 0.0 MiB/tok, stall 0 ms/tok\n"
        self.assertEqual(self.matrix.partial_progress(log), {"tokens": 2, "decode_tok_s": 0.14, "loaded": True})

    def test_llama_token_lines(self):
        p = self.matrix.partial_progress("llama.cpp: model loaded\nllama.cpp: token 1 at 10.0 s\n"
                                         "llama.cpp: token 5 at 30.0 s\n")
        self.assertEqual((p["tokens"], p["decode_tok_s"]), (5, 0.2))

    def test_nothing_decoded(self):
        self.assertEqual(self.matrix.partial_progress("load: m.gguf\n"), {"tokens": 0, "loaded": True})
        self.assertEqual(self.matrix.partial_progress(""), {"tokens": 0, "loaded": False})


if __name__ == "__main__":
    unittest.main()
