// Random blocks for synthetic models. Quantized types are generated directly in block form
// (uniform quants, scales chosen for the requested spread) rather than by quantizing floats,
// which would be far too slow for a 60 GB model.
#include <cmath>
#include <cstring>

#include "core/error.h"
#include "core/rng.h"
#include "quant/blocks.h"
#include "quant/quant.h"

namespace bmoe {
namespace {

void random_bytes(Rng& rng, uint8_t* dst, size_t n) {
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const uint64_t r = rng.next();
    std::memcpy(dst + i, &r, 8);
  }
  if (i < n) {
    const uint64_t r = rng.next();
    std::memcpy(dst + i, &r, n - i);
  }
}

void pack_scales(const uint8_t* sc, const uint8_t* m, uint8_t* out) {
  for (int j = 0; j < 4; ++j) {
    out[j] = static_cast<uint8_t>((sc[j] & 63) | ((sc[j + 4] >> 4) << 6));
    out[j + 4] = static_cast<uint8_t>((m[j] & 63) | ((m[j + 4] >> 4) << 6));
    out[j + 8] = static_cast<uint8_t>((sc[j + 4] & 0xF) | ((m[j + 4] & 0xF) << 4));
  }
}

// K-quant with `levels` + 1 quant values: scale s in [32, 63], min m = s/2, dmin = levels * d so
// that d*s*q - dmin*m is centred on zero.
template <typename Block>
void random_k_affine(Rng& rng, Block* blocks, int64_t n_blocks, float stddev, int levels) {
  const float q_std = static_cast<float>(std::sqrt(((levels + 1.0) * (levels + 1.0) - 1.0) / 12.0));
  const float d = stddev / (47.5f * q_std);
  const uint16_t d16 = fp32_to_fp16(d);
  const uint16_t dmin16 = fp32_to_fp16(d * static_cast<float>(levels));
  for (int64_t b = 0; b < n_blocks; ++b) {
    Block& x = blocks[b];
    random_bytes(rng, reinterpret_cast<uint8_t*>(&x), sizeof x);
    x.d = d16;
    x.dmin = dmin16;
    uint8_t sc[8], m[8];
    const uint64_t r = rng.next();
    for (int j = 0; j < 8; ++j) {
      sc[j] = static_cast<uint8_t>(32 + ((r >> (5 * j)) & 31));
      m[j] = static_cast<uint8_t>(sc[j] / 2);
    }
    pack_scales(sc, m, x.scales);
  }
}

// Floats drawn from N(0, stddev), stored as f32, f16 or bf16.
void random_floats(TensorType type, Rng& rng, void* dst, int64_t n, float stddev) {
  if (type == TensorType::F32) {
    auto* f = static_cast<float*>(dst);
    for (int64_t i = 0; i < n; ++i) f[i] = static_cast<float>(rng.normal()) * stddev;
    return;
  }
  auto* h = static_cast<uint16_t*>(dst);
  for (int64_t i = 0; i < n; ++i) {
    const float v = static_cast<float>(rng.normal()) * stddev;
    h[i] = type == TensorType::F16 ? fp32_to_fp16(v) : fp32_to_bf16(v);
  }
}

// Uniform int8 quants in [-127, 127] (std 73.6), one scale for all blocks.
void random_q8_0(Rng& rng, BlockQ8_0* blocks, int64_t n_blocks, float stddev) {
  const uint16_t d = fp32_to_fp16(stddev / 73.6f);
  for (int64_t b = 0; b < n_blocks; ++b) {
    random_bytes(rng, reinterpret_cast<uint8_t*>(blocks[b].qs), 32);
    for (int8_t& q : blocks[b].qs) {
      if (q == -128) q = -127;
    }
    blocks[b].d = d;
  }
}

// Uniform nibbles, q - 8 in [-8, 7] (std 4.61).
void random_q4_0(Rng& rng, BlockQ4_0* blocks, int64_t n_blocks, float stddev) {
  const uint16_t d = fp32_to_fp16(stddev / 4.61f);
  for (int64_t b = 0; b < n_blocks; ++b) {
    random_bytes(rng, blocks[b].qs, 16);
    blocks[b].d = d;
  }
}

void random_mxfp4(Rng& rng, BlockMXFP4* blocks, int64_t n_blocks, float stddev) {
  // Uniform codes have RMS 5.85 (doubled values); pick the exponent nearest the target.
  const int e = std::max(1, std::min(254, 128 + static_cast<int>(std::lround(std::log2(stddev / 5.85f)))));
  for (int64_t b = 0; b < n_blocks; ++b) {
    random_bytes(rng, blocks[b].qs, 16);
    blocks[b].e = static_cast<uint8_t>(e);
  }
}

void random_q6_k(Rng& rng, BlockQ6_K* blocks, int64_t n_blocks, float stddev) {
  // q - 32 uniform in [-32, 31] (std 18.47); scales in [64, 127].
  const uint16_t d = fp32_to_fp16(stddev / (95.5f * 18.47f));
  for (int64_t b = 0; b < n_blocks; ++b) {
    random_bytes(rng, reinterpret_cast<uint8_t*>(&blocks[b]), sizeof(BlockQ6_K));
    for (int8_t& s : blocks[b].scales) s = static_cast<int8_t>(64 + (static_cast<uint8_t>(s) & 63));
    blocks[b].d = d;
  }
}

}  // namespace

void fill_random_weights(TensorType type, Rng& rng, void* dst, int64_t n, float stddev) {
  const int64_t n_blocks = n / type_info(type).block_size;
  switch (type) {
    case TensorType::F32:
    case TensorType::F16:
    case TensorType::BF16: random_floats(type, rng, dst, n, stddev); return;
    case TensorType::Q8_0: random_q8_0(rng, static_cast<BlockQ8_0*>(dst), n_blocks, stddev); return;
    case TensorType::Q4_0: random_q4_0(rng, static_cast<BlockQ4_0*>(dst), n_blocks, stddev); return;
    case TensorType::MXFP4: random_mxfp4(rng, static_cast<BlockMXFP4*>(dst), n_blocks, stddev); return;
    case TensorType::Q4_K: random_k_affine(rng, static_cast<BlockQ4_K*>(dst), n_blocks, stddev, 15); return;
    case TensorType::Q5_K: random_k_affine(rng, static_cast<BlockQ5_K*>(dst), n_blocks, stddev, 31); return;
    case TensorType::Q6_K: random_q6_k(rng, static_cast<BlockQ6_K*>(dst), n_blocks, stddev); return;
    default: break;
  }
  fail("cannot generate random weights of type {}", type_name(type));
}

}  // namespace bmoe
