"""Measures the rounding spread behind a conformance class's single-token bound (not a test).

For each class named on the command line: the top-2 probability ratio after "Hello" from bmoe's
SIMD kernels, bmoe's scalar kernels (BMOE_ISA=scalar), llama.cpp's default CPU build (the test's
peer) and llama.cpp without its AVX-512 builds, each relative to the test's peer. Two correct
implementations differ by their own summation order only; a family's fixed bound
(Conformance.single_token_tolerance, docs/fidelity.md) must sit above their spread.

  BMOE_BUILD=build python3 tests/conformance/spread.py Gemma4_26B_Cut2 TinyGemma4
"""
import math
import os
import sys

sys.path.insert(0, os.path.dirname(__file__))
import test_llama_conformance as suite  # noqa: E402
from common import PEER_AVX512, bmoe_logits, oracle_jobs, release, synth  # noqa: E402

SINGLE = {"single": {"op": "greedy", "texts": ["Hello"], "n": 1}}


def peer_ratio(model, exclude, best, second):
    """llama.cpp's top-2 ratio for (best, second), or None where its top two are other ids."""
    b, p1, s, p2 = oracle_jobs(model, SINGLE, exclude)["single"][0]["top2"][0]
    return p1 / p2 if (b, s) == (best, second) else None


def measure(cls):
    model = synth(cls.name, cls.preset, *cls.model_args)
    try:
        best, p1, second, p2 = oracle_jobs(model, SINGLE, cls.peer_exclude)["single"][0]["top2"][0]
        ref = p1 / p2
        simd = bmoe_logits(model, "Hello")
        scalar = bmoe_logits(model, "Hello", {"BMOE_ISA": "scalar"})
        avx2 = peer_ratio(model, sorted(set(cls.peer_exclude) | set(PEER_AVX512)), best, second)
        rel = lambda r: "other top-2" if r is None else f"{r / ref - 1:+.2e}"  # noqa: E731
        ratio = lambda lg: math.exp(lg[best] - lg[second])  # noqa: E731
        print(f"{cls.__name__}: relative to llama.cpp's default build: bmoe SIMD {rel(ratio(simd))}, "
              f"bmoe scalar {rel(ratio(scalar))}, llama.cpp AVX2 {rel(avx2)}; "
              f"bound {cls.single_token_tolerance:.0e}")
    finally:
        release(model)


if __name__ == "__main__":
    if len(sys.argv) < 2:
        sys.exit("usage: spread.py CLASS... (classes of test_llama_conformance.py)")
    for name in sys.argv[1:]:
        cls = getattr(suite, name, None)
        if not isinstance(cls, type) or not issubclass(cls, suite.Conformance):
            sys.exit(f"spread.py: no conformance class {name!r}")
        measure(cls)
