"""bmoe-perplexity against llama.cpp: the same model and the same token ids scored by
llama-perplexity's method (chunks of -c from an empty context, BOS first where the model adds
one, the second half of each chunk scored). The peer's sums come from llama.cpp's own
next-token probabilities through node-llama-cpp (tests/oracle/oracle.mjs, mode "nll"): its
library evaluates the ids, the oracle adds -log p as llama-perplexity does. Random weights give
a perplexity near the vocabulary size; it still must agree."""
import json
import math
import os
import re
import struct
import subprocess
import tempfile
import unittest

from common import REPO, THREADS, oracle, oracle_command, run, synth, tool

TEXT = ("The quick brown fox jumps over the lazy dog. " * 3 + "Perplexity weighs a lossy knob against what it saves; "
        "a model that predicts the next token well has a low one. 0123456789 ") * 6


class PerplexityTinyQwen3Moe(unittest.TestCase):
    N_CTX = 64

    @classmethod
    def setUpClass(cls):
        cls.model = synth("tiny-qwen3moe", "tiny-qwen3moe")
        cls.tmp = tempfile.TemporaryDirectory()
        cls.text = os.path.join(cls.tmp.name, "text.txt")
        with open(cls.text, "w") as f:
            f.write(TEXT)
        texts = os.path.join(cls.tmp.name, "texts.json")
        with open(texts, "w") as f:
            json.dump([TEXT], f)
        cls.ids = json.loads(run([tool("bmoe-tokenize"), "-m", cls.model, "--json", texts]))[0]

    @classmethod
    def tearDownClass(cls):
        cls.tmp.cleanup()

    def bmoe(self, *flags):
        out = run([tool("bmoe-perplexity"), "-m", self.model, "-f", self.text, "-c", str(self.N_CTX), "-t", THREADS,
                   *flags], stdin=subprocess.DEVNULL)
        running = [float(x) for x in re.findall(r"\[\d+\]([0-9.]+),", out)]
        final = re.search(r"Final estimate: PPL = ([0-9.]+) \+/- ([0-9.]+)", out)
        self.assertIsNotNone(final, out)
        return running, float(final.group(1)), float(final.group(2))

    def test_perplexity_equals_llama_cpp(self):
        chunks = len(self.ids) // self.N_CTX
        self.assertGreaterEqual(chunks, 3, "the text must make several chunks")
        peer = oracle("nll", self.model, self.ids, n=self.N_CTX)
        self.assertEqual(peer["count"], chunks * (self.N_CTX - self.N_CTX // 2 - 1))
        running, ppl, err = self.bmoe()
        self.assertEqual(len(running), chunks)
        peer_ppl = math.exp(peer["nll"] / peer["count"])
        self.assertGreater(peer_ppl, 10)  # random weights: far from a trained model's
        # The mean NLL (log PPL) within 1e-3 of itself, overall and after each chunk. Random
        # weights give logits far larger than a trained model's (mean NLL ~24 nats here), and the
        # two engines' rounding differs in proportion (measured: at most 4e-4 relative).
        self.assertAlmostEqual(math.log(ppl), math.log(peer_ppl), delta=1e-3 * math.log(peer_ppl), msg=(ppl, peer_ppl))
        for ours, theirs in zip(running, peer["running_ppl"]):
            self.assertAlmostEqual(math.log(ours), math.log(theirs), delta=1e-3 * math.log(theirs))
        print(f"\nperplexity: bmoe {ppl:.6g}, llama.cpp {peer_ppl:.6g}; mean NLL {math.log(ppl):.5f} vs "
              f"{math.log(peer_ppl):.5f}; per chunk bmoe {running} llama.cpp {peer['running_ppl']}")
        mean = peer["nll"] / peer["count"]
        sd = math.sqrt(max(peer["nll2"] / peer["count"] - mean * mean, 0) / (peer["count"] - 1))
        self.assertAlmostEqual(err, peer_ppl * sd, delta=0.05 * peer_ppl * sd + 1e-4)
        # --chunks limits the chunks scored; streamed gives the same numbers and reports its reads.
        running2, _, _ = self.bmoe("--chunks", "2")
        self.assertEqual(running2, running[:2])
        p = run_with_stderr([tool("bmoe-perplexity"), "-m", self.model, "-f", self.text, "-c", str(self.N_CTX),
                             "-t", THREADS, "--moe-stream"])
        self.assertIn(f"Final estimate: PPL = {ppl:.4f}", p.stdout)
        self.assertRegex(p.stderr, r"experts: \d+ lookups, .* MiB read \([0-9.]+ MiB per token\)")

    def test_kl_divergence_against_saved_base_logits(self):
        base = os.path.join(self.tmp.name, "base.logits")
        common = [tool("bmoe-perplexity"), "-m", self.model, "-c", str(self.N_CTX), "-t", THREADS]
        p = run_with_stderr([*common, "-f", self.text, "--kl-divergence-base", base])
        _, ppl, _ = self.bmoe()
        self.assertIn(f"Final estimate: PPL = {ppl:.4f}", p.stdout)  # saving changes nothing
        # llama-perplexity's layout: header, the chunks' tokens, then per scored row
        # 2 * ((n_vocab + 1) / 2) + 4 u16.
        with open(base, "rb") as f:
            data = f.read()
        self.assertEqual(data[:8], b"_logits_")
        n_ctx, n_vocab, n_chunk = struct.unpack("<Iii", data[8:20])
        self.assertEqual((n_ctx, n_chunk), (self.N_CTX, len(self.ids) // self.N_CTX))
        self.assertEqual(list(struct.unpack(f"<{n_ctx * n_chunk}i", data[20:20 + 4 * n_ctx * n_chunk])),
                         self.ids[:n_ctx * n_chunk])
        rows = n_chunk * (n_ctx - n_ctx // 2 - 1)
        self.assertEqual(len(data), 20 + 4 * n_ctx * n_chunk + rows * (2 * ((n_vocab + 1) // 2) + 4) * 2)

        def kld(*flags):
            out = run_with_stderr([*common, "--kl-divergence-base", base, "--kl-divergence", *flags]).stdout
            mean = float(re.search(r"Mean    KLD: +([0-9.]+)", out).group(1))
            top = float(re.search(r"Same top p: +([0-9.]+)", out).group(1))
            self.assertEqual(len(re.findall(r"^ +\d+ +[0-9.]+ ± ", out, re.M)), n_chunk)  # a line per chunk
            return mean, top
        # llama.cpp's own distributions against the file bmoe saved: the format reads as
        # llama-perplexity's, and the two engines' distributions agree (measured: KLD 5e-4,
        # same top 99.6 %; the random model's huge logits magnify rounding; one expert instead
        # of two gives ~1).
        peer = oracle_kld(self.model, base)
        self.assertEqual(peer["count"], rows)
        self.assertLess(peer["kld"], 2e-3, peer)
        self.assertGreater(peer["same_top"], 0.97, peer)
        print(f"\nkl-divergence: llama.cpp against bmoe's base file: mean KLD {peer['kld']:.2e}, "
              f"same top {100 * peer['same_top']:.1f} %")
        # The same model against itself: nothing lost (only the saved log-probs' rounding).
        same, top = kld()
        self.assertLess(same, 1e-4)
        self.assertEqual(top, 100.0)
        # One expert instead of two: a lossy knob, and the divergence says so.
        lossy, top = kld("--n-expert-used", "1")
        self.assertGreater(lossy, 100 * max(same, 1e-6))
        self.assertLess(top, 100.0)
        # A file that is not one: one error line.
        junk = os.path.join(self.tmp.name, "junk.logits")
        with open(junk, "wb") as f:
            f.write(b"not logits at all")
        p = run_with_stderr([*common, "--kl-divergence-base", junk, "--kl-divergence"], check=False)
        self.assertEqual(p.returncode, 1)
        self.assertEqual(len([l for l in p.stderr.splitlines() if l.startswith("error:")]), 1, p.stderr)
        self.assertIn("not a file of saved logits", p.stderr)

    def test_too_short_a_text_is_one_error(self):
        short = os.path.join(self.tmp.name, "short.txt")
        with open(short, "w") as f:
            f.write("too short")
        p = run_with_stderr([tool("bmoe-perplexity"), "-m", self.model, "-f", short, "-c", "64"], check=False)
        self.assertEqual(p.returncode, 1)
        self.assertRegex(p.stderr, r"error: the text has \d+ tokens; perplexity with a context of 64 needs at least 128")


def oracle_kld(model, base):
    """llama.cpp's mean KLD against a base-logits file (tests/oracle/oracle.mjs, mode "kld")."""
    return json.loads(run([*oracle_command(), "kld", model, base, "0", THREADS], cwd=REPO))


def run_with_stderr(args, check=True):
    p = subprocess.run(args, capture_output=True, text=True, stdin=subprocess.DEVNULL, timeout=300)
    if check and p.returncode != 0:
        raise RuntimeError(f"{' '.join(args)} failed ({p.returncode}):\n{p.stderr[-3000:]}")
    return p


if __name__ == "__main__":
    unittest.main()
