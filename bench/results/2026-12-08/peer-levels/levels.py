"""Single-token top-2 ratio after "Hello" for a conformance class: bmoe (SIMD, scalar) and
llama.cpp's prebuilt CPU levels that run on this CPU, each relative to llama.cpp's haswell level."""
import math, os, sys
sys.path.insert(0, "tests/conformance")
import test_llama_conformance as suite
from common import PEER_AVX512, bmoe_logits, oracle_jobs, synth
SINGLE = {"single": {"op": "greedy", "texts": ["Hello"], "n": 1}}
ALL = ["sapphirerapids", *PEER_AVX512, "alderlake", "haswell", "ivybridge", "sandybridge", "piledriver", "sse42", "x64"]
for name in sys.argv[1:]:
    cls = getattr(suite, name)
    model = synth(cls.name, cls.preset, *cls.model_args)
    ref = oracle_jobs(model, SINGLE, [v for v in ALL if v != "haswell"])["single"][0]["top2"][0]
    b, p1, s, p2 = ref
    base = p1 / p2
    print(f"{name}: haswell top-2 {b} {p1:.6f} / {s} {p2:.6f}")
    for level in ["ivybridge", "sandybridge", "sse42", "x64"]:
        try:
            bb, q1, ss, q2 = oracle_jobs(model, SINGLE, [v for v in ALL if v != level])["single"][0]["top2"][0]
            print(f"  llama.cpp {level:12s} {((q1 / q2) / base - 1) if (bb, ss) == (b, s) else float('nan'):+.3e}")
        except Exception as e:
            print(f"  llama.cpp {level}: {str(e)[:80]}")
    for isa in (None, "scalar"):
        lg = bmoe_logits(model, "Hello", {"BMOE_ISA": isa} if isa else None)
        print(f"  bmoe {isa or 'simd':17s} {math.exp(lg[b] - lg[s]) / base - 1:+.3e}")
