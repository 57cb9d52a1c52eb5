#!/usr/bin/env python3
"""Writes the small GGUF seed inputs of corpus/gguf (standard library only; rerun to refresh).

GGUF layout (v2/v3): magic, version, tensor count, metadata count, metadata (key, type,
value), tensor infos (name, dims, type, offset), padding to general.alignment, tensor data."""
import os
import struct

U8, I8, U16, I16, U32, I32, F32, BOOL, STR, ARR, U64, I64, F64 = range(13)
HERE = os.path.dirname(os.path.abspath(__file__))


def s(text):
    b = text.encode()
    return struct.pack("<Q", len(b)) + b


def value(t, v):
    fmt = {U8: "B", I8: "b", U16: "H", I16: "h", U32: "I", I32: "i", F32: "f", BOOL: "?", U64: "Q", I64: "q", F64: "d"}
    if t == STR:
        return s(v)
    if t == ARR:
        et, items = v
        return struct.pack("<IQ", et, len(items)) + b"".join(value(et, x) for x in items)
    return struct.pack("<" + fmt[t], v)


def gguf(version, kvs, tensors):
    out = b"GGUF" + struct.pack("<I", version) + struct.pack("<QQ", len(tensors), len(kvs))
    for k, t, v in kvs:
        out += s(k) + struct.pack("<I", t) + value(t, v)
    offset, data = 0, b""
    for name, dims, ttype, payload in tensors:
        out += s(name) + struct.pack("<I", len(dims)) + b"".join(struct.pack("<q", d) for d in dims)
        out += struct.pack("<IQ", ttype, offset)
        data += payload + b"\0" * (-len(payload) % 32)
        offset = len(data)
    out += b"\0" * (-len(out) % 32)
    return out + data


KVS = [("general.architecture", STR, "qwen3moe"), ("general.alignment", U32, 32),
       ("qwen3moe.block_count", U32, 1), ("qwen3moe.embedding_length", U32, 8),
       ("qwen3moe.expert_count", U32, 2), ("qwen3moe.expert_used_count", U32, 1),
       ("test.u8", U8, 7), ("test.i8", I8, -7), ("test.u16", U16, 700), ("test.i16", I16, -700),
       ("test.i32", I32, -70000), ("test.f32", F32, 0.5), ("test.bool", BOOL, True), ("test.u64", U64, 1 << 40),
       ("test.i64", I64, -(1 << 40)), ("test.f64", F64, 0.25),
       ("test.nested", ARR, (ARR, [(I32, [1, 2]), (I32, [3])])),
       ("tokenizer.ggml.tokens", ARR, (STR, ["a", "b", "ab", "<|endoftext|>"])),
       ("tokenizer.ggml.merges", ARR, (STR, ["a b"]))]
F32_TENSOR = ("token_embd.weight", [8, 4], 0, struct.pack("<32f", *[i / 32 for i in range(32)]))
Q8_0_TENSOR = ("output.weight", [32, 1], 8, struct.pack("<e", 0.01) + bytes(range(32)))

# The hybrid families' own keys, so the fuzzer starts inside their hyperparameter readers.
QWEN35_KVS = [("general.architecture", STR, "qwen35moe"), ("qwen35moe.block_count", U32, 2),
              ("qwen35moe.embedding_length", U32, 32), ("qwen35moe.attention.head_count", U32, 2),
              ("qwen35moe.attention.head_count_kv", U32, 1), ("qwen35moe.attention.key_length", U32, 16),
              ("qwen35moe.rope.dimension_count", U32, 4), ("qwen35moe.expert_count", U32, 2),
              ("qwen35moe.expert_used_count", U32, 1), ("qwen35moe.expert_feed_forward_length", U32, 32),
              ("qwen35moe.rope.dimension_sections", ARR, (I32, [1, 1, 0, 0])),
              ("qwen35moe.full_attention_interval", U32, 2), ("qwen35moe.ssm.conv_kernel", U32, 4),
              ("qwen35moe.expert_shared_feed_forward_length", U32, 32),
              ("qwen35moe.ssm.state_size", U32, 16), ("qwen35moe.ssm.group_count", U32, 1),
              ("qwen35moe.ssm.time_step_rank", U32, 2), ("qwen35moe.ssm.inner_size", U32, 32),
              ("tokenizer.ggml.tokens", ARR, (STR, ["a", "b"]))]
LFM2_KVS = [("general.architecture", STR, "lfm2moe"), ("lfm2moe.block_count", U32, 2),
            ("lfm2moe.embedding_length", U32, 32), ("lfm2moe.attention.head_count", U32, 2),
            ("lfm2moe.attention.head_count_kv", ARR, (I32, [0, 1])), ("lfm2moe.expert_count", U32, 2),
            ("lfm2moe.expert_used_count", U32, 1), ("lfm2moe.expert_feed_forward_length", U32, 32),
            ("lfm2moe.feed_forward_length", U32, 64), ("lfm2moe.leading_dense_block_count", U32, 1),
            ("lfm2moe.expert_gating_func", U32, 2), ("lfm2moe.shortconv.l_cache", U32, 3),
            ("tokenizer.ggml.tokens", ARR, (STR, ["a", "b"]))]
# glm4moe: block_count counts the nextn block after the one trunk layer.
GLM4_KVS = [("general.architecture", STR, "glm4moe"), ("glm4moe.block_count", U32, 2),
            ("glm4moe.nextn_predict_layers", U32, 1), ("glm4moe.embedding_length", U32, 32),
            ("glm4moe.attention.head_count", U32, 2), ("glm4moe.attention.head_count_kv", U32, 1),
            ("glm4moe.attention.key_length", U32, 16), ("glm4moe.attention.value_length", U32, 16),
            ("glm4moe.attention.layer_norm_rms_epsilon", F32, 1e-5), ("glm4moe.rope.dimension_count", U32, 8),
            ("glm4moe.expert_count", U32, 2), ("glm4moe.expert_used_count", U32, 1),
            ("glm4moe.expert_feed_forward_length", U32, 32), ("glm4moe.expert_shared_count", U32, 1),
            ("glm4moe.leading_dense_block_count", U32, 0), ("glm4moe.expert_weights_scale", F32, 2.5),
            ("glm4moe.expert_weights_norm", BOOL, True), ("glm4moe.expert_gating_func", U32, 2),
            ("tokenizer.ggml.tokens", ARR, (STR, ["a", "b"]))]
B = "bailingmoe3."
BAILING_KVS = [("general.architecture", STR, "bailingmoe3"), (B + "block_count", U32, 2),
               (B + "embedding_length", U32, 32), (B + "attention.head_count", U32, 2),
               (B + "attention.head_count_kv", ARR, (I32, [0, 1])), (B + "attention.key_length", U32, 20),
               (B + "attention.key_length_mla", U32, 12), (B + "attention.value_length_mla", U32, 8),
               (B + "attention.kv_lora_rank", U32, 16), (B + "attention.q_lora_rank", U32, 8),
               (B + "rope.dimension_count", U32, 4), (B + "ssm.conv_kernel", U32, 4), (B + "kda.head_dim", U32, 16),
               (B + "kda.safe_gate", BOOL, True), (B + "kda.gate_lower_bound", F32, -5.0),
               (B + "expert_count", U32, 4), (B + "expert_used_count", U32, 2),
               (B + "expert_feed_forward_length", U32, 32), (B + "expert_shared_count", U32, 1),
               (B + "leading_dense_block_count", U32, 1), (B + "feed_forward_length", U32, 64),
               (B + "expert_gating_func", U32, 2), (B + "expert_group_count", U32, 2),
               (B + "expert_group_used_count", U32, 1), ("tokenizer.ggml.tokens", ARR, (STR, ["a", "b"]))]
QWEN35_EMBD = ("token_embd.weight", [32, 2], 0, bytes(256))

seeds = {
    "qwen35moe-keys.bin": gguf(3, QWEN35_KVS, [QWEN35_EMBD]),
    "lfm2moe-keys.bin": gguf(3, LFM2_KVS, [QWEN35_EMBD]),
    "glm4moe-keys.bin": gguf(3, GLM4_KVS, [QWEN35_EMBD]),
    "bailingmoe3-keys.bin": gguf(3, BAILING_KVS, [QWEN35_EMBD]),
    "metadata-v3.bin": gguf(3, KVS, []),
    "metadata-v2.bin": gguf(2, KVS[:8], []),
    "tensors-v3.bin": gguf(3, KVS, [F32_TENSOR, Q8_0_TENSOR]),
    "tensor-only.bin": gguf(3, [], [F32_TENSOR]),
}
for name, data in seeds.items():
    with open(os.path.join(HERE, "corpus", "gguf", name), "wb") as f:
        f.write(data)
