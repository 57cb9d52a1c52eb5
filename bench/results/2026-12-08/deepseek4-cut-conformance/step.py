"""Where bmoe's strict-mode greedy leaves llama.cpp's on the real-shape cut's short prompt: llama.cpp's
top-2 probabilities there (batched and token by token), and bmoe's own (SIMD and scalar)."""
import json, math, os, subprocess, sys, tempfile
sys.path.insert(0, "tests/conformance")
from common import tool, run
from deepseek4_logits import floats, peer_env, CLI
from test_llama_conformance import PROMPTS
model, driver = sys.argv[1], sys.argv[2]
ids = json.loads(subprocess.run([CLI, "-m", model, "-p", PROMPTS[0], "--tokenize"], check=True, capture_output=True, text=True).stdout.strip().splitlines()[-1])
print("prompt", repr(PROMPTS[0]), ids)
def probs(row):
    m = max(row); e = [math.exp(x - m) for x in row]; s = sum(e)
    o = sorted(range(len(row)), key=lambda i: -row[i])[:2]
    return [(i, e[i] / s) for i in o]
with tempfile.TemporaryDirectory() as tmp:
    env = peer_env(tmp); path = os.path.join(tmp, "l.bin")
    ref = json.loads(subprocess.run([driver, model, ",".join(map(str, ids)), "16", "f32", "0", path], check=True, capture_output=True, text=True, env=env).stdout.strip())
    ours = json.loads(run([CLI, "-m", model, "--prompt-ids", ",".join(map(str, ids)), "-n", "16", "-t", "2", "--json", "--ignore-eos", "--kv-type", "f32"]).strip().splitlines()[-1])["tokens"]
    scal = json.loads(run([CLI, "-m", model, "--prompt-ids", ",".join(map(str, ids)), "-n", "16", "-t", "2", "--json", "--ignore-eos", "--kv-type", "f32"], env={**os.environ, "BMOE_ISA": "scalar"}).strip().splitlines()[-1])["tokens"]
    print("llama", ref); print("bmoe ", ours); print("scal ", scal)
    i = next((k for k, (a, b) in enumerate(zip(ours, ref)) if a != b), None)
    print("first divergence", i)
    if i is not None:
        pre = ids + ref[:i]
        for batch in (0, 1):
            subprocess.run([driver, model, ",".join(map(str, pre)), "0", "f32", str(batch), path], check=True, capture_output=True, text=True, env=env)
            lg = floats(path); n = len(lg) // len(pre)
            print(f"llama.cpp batch={batch} top-2 at step {i}:", probs(lg[(len(pre) - 1) * n:]))
        for isa in (None, "scalar"):
            run([CLI, "-m", model, "--prompt-ids", ",".join(map(str, pre)), "-n", "1", "-t", "2", "--json", "--ignore-eos", "--kv-type", "f32", "--dump-logits", path], env={**os.environ, **({"BMOE_ISA": isa} if isa else {})})
            print(f"bmoe {isa or 'simd'} top-2 at step {i}:", probs(floats(path)))
