"""Conformance against llama.cpp (node-llama-cpp 3.21.1): tokenizer ids and greedy continuations.

Each model is a synthetic GGUF written by bmoe-synth; llama.cpp loads the same file.
"""
import os
import sys
import unittest

sys.path.insert(0, os.path.dirname(__file__))
from common import bmoe_greedy, bmoe_tokenize, check_greedy, oracle, synth  # noqa: E402

TOKENIZER_CORPUS = [
    "Hello world",
    "The quick brown fox jumps over the lazy dog.",
    "  leading spaces and trailing   ",
    "tabs\tand\nnewlines\n\n\nand\r\nwindows line ends",
    "long whitespace run:" + " " * 37 + "end" + "\n" * 5 + "x",
    "digits 0 1 12 123 1234 12345678901234567890 3.14159 -42 1e10",
    "你好，世界！这是一个测试。",
    "日本語のテキストと한국어 텍스트",
    "emoji: 🚀🔥👍🏽 👨‍👩‍👧‍👦 ❤️ 🇫🇷",
    "code: def f(x):\n    return x * 2  # comment\nint main() { return 0; }",
    "{\"json\": [1, 2, 3], \"key\": null}",
    "contractions: I'm you're he'll we've they'd it's DON'T",
    "mixed Ünïcödé àccents and ß, Ωmega, Привет мир",
    "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n",
    "special tokens inline<|endoftext|>after <think>\nreasoning\n</think> done",
    "URL https://example.com/path?q=1&x=%20 and e-mail a.b@c.de",
    "",
]

PROMPTS = [
    "The capital of France is",
    "def fibonacci(n):",
    "Once upon a time, in a land far away,",
    "1, 2, 3, 4, 5,",
    "你好，请介绍一下你自己。",
]


def chatml(prompt):
    return f"<|im_start|>user\n{prompt}<|im_end|>\n<|im_start|>assistant\n"


class Conformance:
    """Mixed into one TestCase per model."""
    model_args = ()
    name = ""
    preset = ""

    @classmethod
    def setUpClass(cls):
        cls.model = synth(cls.name, cls.preset, *cls.model_args)

    def test_tokenizer_ids_match(self):
        ours = bmoe_tokenize(self.model, TOKENIZER_CORPUS)
        theirs = oracle("tokenize", self.model, TOKENIZER_CORPUS)
        for text, a, b in zip(TOKENIZER_CORPUS, ours, theirs):
            self.assertEqual(a, b, f"tokenization differs for {text!r}")

    def test_greedy_continuations_match(self):
        theirs = oracle("greedy", self.model, PROMPTS, 32)
        for prompt, ref in zip(PROMPTS, theirs):
            check_greedy(self, bmoe_greedy(self.model, prompt, 32), ref, f"{self.name} {prompt!r}")

    def test_greedy_chatml_matches(self):
        prompts = PROMPTS[:3]
        theirs = oracle("greedy", self.model, [chatml(p) for p in prompts], 32)
        for prompt, ref in zip(prompts, theirs):
            check_greedy(self, bmoe_greedy(self.model, prompt, 32, "--chatml"), ref, f"{self.name} chatml {prompt!r}")


class TinyQwen3Moe(Conformance, unittest.TestCase):
    name = "tiny-qwen3moe"
    preset = "tiny-qwen3moe"


class TinyQwen3MoeQ5K(Conformance, unittest.TestCase):
    name = "tiny-qwen3moe-q5k"
    preset = "tiny-qwen3moe"
    model_args = ("--type", "all=Q5_K")


class TinyQwen3MoeQ4_0(Conformance, unittest.TestCase):
    name = "tiny-qwen3moe-q4_0"
    preset = "tiny-qwen3moe"
    model_args = ("--type", "all=Q4_0")


class TinyQwen3MoeQ8_0(Conformance, unittest.TestCase):
    name = "tiny-qwen3moe-q8_0"
    preset = "tiny-qwen3moe"
    model_args = ("--type", "all=Q8_0")


class TinyQwen3MoeF16(Conformance, unittest.TestCase):
    name = "tiny-qwen3moe-f16"
    preset = "tiny-qwen3moe"
    model_args = ("--type", "all=F16", "--type", "router=F16")


class TinyQwen3MoeBF16(Conformance, unittest.TestCase):
    name = "tiny-qwen3moe-bf16"
    preset = "tiny-qwen3moe"
    model_args = ("--type", "all=BF16")


class Qwen3_30B_Cut4(Conformance, unittest.TestCase):
    """A 4-layer cut of the real Qwen3-30B-A3B shape, Q4_K experts, real Qwen3 vocabulary."""
    name = "qwen3-30b-a3b-4l-q4k"
    preset = "qwen3-30b-a3b"
    model_args = ("--layers", "4", "--type", "all=Q4_K")


if __name__ == "__main__":
    unittest.main(verbosity=2)
