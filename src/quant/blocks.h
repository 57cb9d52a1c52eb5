// GGUF block layouts (byte-exact with the file format) and their shared helpers.
#pragma once

#include <cstdint>

#include "core/fp16.h"

namespace bmoe {

constexpr int kQK = 32;     // elements per Q4_0 / Q8_0 / MXFP4 block
constexpr int kQK_K = 256;  // elements per K-quant super-block

struct BlockQ4_0 {
  uint16_t d;        // f16 scale
  uint8_t qs[16];    // element j in the low nibble of qs[j], element j+16 in the high nibble
};
struct BlockQ8_0 {
  uint16_t d;        // f16 scale
  int8_t qs[32];
};
struct BlockQ4_K {
  uint16_t d;           // f16 scale of the 6-bit sub-block scales
  uint16_t dmin;        // f16 scale of the 6-bit sub-block mins
  uint8_t scales[12];   // 8 scales + 8 mins, 6 bits each, packed
  uint8_t qs[128];      // 4-bit quants; each 32 bytes hold two 32-element sub-blocks
};
struct BlockQ5_K {
  uint16_t d;
  uint16_t dmin;
  uint8_t scales[12];
  uint8_t qh[32];       // fifth bit: bit 2j / 2j+1 of qh[l] for sub-blocks 2j / 2j+1
  uint8_t qs[128];
};
struct BlockQ6_K {
  uint8_t ql[128];      // low 4 bits
  uint8_t qh[64];       // high 2 bits
  int8_t scales[16];    // one per 16 elements
  uint16_t d;           // f16 super-block scale
};
struct BlockQ8_K {      // activation format for K-quant dot products
  float d;
  int8_t qs[256];
  int16_t bsums[16];    // sum of each 16 quants, used for the K-quant min terms
};
struct BlockMXFP4 {
  uint8_t e;            // E8M0 shared exponent
  uint8_t qs[16];       // 4-bit E2M1 codes, same nibble order as Q4_0
};

static_assert(sizeof(BlockQ4_0) == 18);
static_assert(sizeof(BlockQ8_0) == 34);
static_assert(sizeof(BlockQ4_K) == 144);
static_assert(sizeof(BlockQ5_K) == 176);
static_assert(sizeof(BlockQ6_K) == 210);
static_assert(sizeof(BlockQ8_K) == 292);
static_assert(sizeof(BlockMXFP4) == 17);

// E2M1 code -> value, doubled (so it is an integer); pair with e8m0_to_fp32_half.
inline constexpr int8_t kMxfp4Values[16] = {0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12};

// 2^(e-127) / 2, computed bit-exactly (including the two denormal cases).
inline float e8m0_to_fp32_half(uint8_t e) {
  const uint32_t bits = e < 2 ? (0x00200000u << e) : (static_cast<uint32_t>(e - 1) << 23);
  return bits_float(bits);
}

// Unpacks sub-block j's 6-bit scale and min from the 12-byte K-quant scale array.
inline void k_scale_min(int j, const uint8_t* q, uint8_t& scale, uint8_t& min) {
  if (j < 4) {
    scale = q[j] & 63;
    min = q[j + 4] & 63;
  } else {
    scale = static_cast<uint8_t>((q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4));
    min = static_cast<uint8_t>((q[j + 4] >> 4) | ((q[j] >> 6) << 4));
  }
}

// The K-quant min term: sum over sub-blocks j of min_j * (sum of sub-block j's activations),
// from the Q8_K block sums of 16 (integer, exact).
inline int k_min_sum(const uint8_t* scales, const int16_t* bsums) {
  int sum = 0;
  for (int j = 0; j < 8; ++j) {
    uint8_t sc, m;
    k_scale_min(j, scales, sc, m);
    sum += m * (bsums[2 * j] + bsums[2 * j + 1]);
  }
  return sum;
}

// Round to nearest, ties to even: the rounding ggml's nearest_int and _mm256_round_ps use.
inline int round_even(float x) {
  return static_cast<int>(__builtin_rintf(x));
}

}  // namespace bmoe
