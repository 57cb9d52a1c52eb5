"""tiny-deepseek4 (DeepSeek vocabulary; or the model given), one token after "Hello": the top-2 probability ratio in
the default mode (f16 cache, flash attention) for bmoe (SIMD and scalar kernels) and for llama.cpp
(haswell level) batched and token by token; each against llama.cpp batched."""
import json, math, os, subprocess, sys, tempfile
sys.path.insert(0, "tests/conformance")
from common import bmoe_tokenize, synth, tool, run
from deepseek4_logits import floats, peer_env
from test_deepseek4 import MODEL, MODE_FLAGS

driver = sys.argv[1]
model = sys.argv[2] if len(sys.argv) > 2 else synth(*MODEL)  # default: tiny-deepseek4 on DeepSeek's vocabulary
hello = bmoe_tokenize(model, ["Hello"])[0]
print("prompt ids", hello)

def top2(row):
    best = max(range(len(row)), key=row.__getitem__)
    second = max((i for i in range(len(row)) if i != best), key=row.__getitem__)
    return best, second

with tempfile.TemporaryDirectory() as tmp:
    env = peer_env(tmp)
    path = os.path.join(tmp, "l.bin")
    for mode in ("f16", "f32"):
        rows = {}
        for batch in (0, 1):
            subprocess.run([driver, model, ",".join(map(str, hello)), "0", mode, str(batch), path],
                           check=True, capture_output=True, text=True, env=env)
            lg = floats(path)
            n = len(lg) // len(hello)
            rows[f"llama.cpp batch={batch}"] = lg[(len(hello) - 1) * n:]
        for isa in (None, "scalar"):
            e = dict(os.environ, **({"BMOE_ISA": isa} if isa else {}))
            run([tool("bmoe-cli"), "-m", model, "--prompt-ids", ",".join(map(str, hello)), "-n", "1", "-t", "2",
                 "--json", "--ignore-eos", "--dump-logits", path, *MODE_FLAGS[mode]], env=e)
            rows[f"bmoe {isa or 'simd'}"] = floats(path)[:n]
        ref = rows["llama.cpp batch=0"]
        b, s = top2(ref)
        for name, row in rows.items():
            ratio = math.exp((row[b] - row[s]) - (ref[b] - ref[s]))
            worst = max(abs(x - y) for x, y in zip(row, ref))
            print(f"[{mode}] {name:22s} top-2 ratio vs llama.cpp batched {ratio - 1:+.3e}, max |dlogit| {worst:.3e}, argmax {top2(row)[0] == b}")
