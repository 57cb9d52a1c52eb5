// Helpers shared by the NEON kernel files (quant_neon.cpp, quant_neon_tiles.cpp): nibble and
// element unpacking as the one-row kernels and the tile kernels both take them. Internal linkage:
// each file compiles them with its own -march flags (see x86_shared.h for why).
#pragma once

#if defined(__aarch64__)

#include <arm_neon.h>

#include <cstdint>

#include "core/fp16.h"
#include "quant/blocks.h"

namespace bmoe::neon {
namespace {

// Low and high nibbles of 16 bytes, as signed bytes 0..15.
inline int8x16_t low_nibbles(uint8x16_t q) { return vreinterpretq_s8_u8(vandq_u8(q, vdupq_n_u8(0x0F))); }
inline int8x16_t high_nibbles(uint8x16_t q) { return vreinterpretq_s8_u8(vshrq_n_u8(q, 4)); }

// Q5_K's fifth bit: adds 16 to the nibbles where qh has `bit` set.
inline int8x16_t with_fifth_bit(int8x16_t nibbles, uint8x16_t qh, uint8x16_t bit) {
  return vaddq_s8(nibbles, vreinterpretq_s8_u8(vandq_u8(vtstq_u8(qh, bit), vdupq_n_u8(16))));
}

// Part p (elements 32p..32p+31) of a Q6_K half-block as signed quants (-32..31), in two groups
// of 16 with their own scales: ql's low (p < 2) or high nibbles of its first (p even) or second
// 32 bytes (l[0..3], 16 bytes each), bits 2p..2p+1 of qh (h[0..1]) on top, less 32.
inline void q6_K_part(const uint8x16_t l[4], const uint8x16_t h[2], int part, int8x16_t& a, int8x16_t& b) {
  const uint8x16_t m4 = vdupq_n_u8(0x0F), m2 = vdupq_n_u8(0x03);
  const uint8x16_t lo_a = part & 1 ? l[2] : l[0], lo_b = part & 1 ? l[3] : l[1];
  const uint8x16_t nib_a = part < 2 ? vandq_u8(lo_a, m4) : vshrq_n_u8(lo_a, 4);
  const uint8x16_t nib_b = part < 2 ? vandq_u8(lo_b, m4) : vshrq_n_u8(lo_b, 4);
  const int8x16_t shift = vdupq_n_s8(static_cast<int8_t>(-2 * part));
  const uint8x16_t hi_a = vandq_u8(vshlq_u8(h[0], shift), m2), hi_b = vandq_u8(vshlq_u8(h[1], shift), m2);
  a = vsubq_s8(vreinterpretq_s8_u8(vorrq_u8(nib_a, vshlq_n_u8(hi_a, 4))), vdupq_n_s8(32));
  b = vsubq_s8(vreinterpretq_s8_u8(vorrq_u8(nib_b, vshlq_n_u8(hi_b, 4))), vdupq_n_s8(32));
}

// Element formats of the float kernels: a four-lane load and a one-element conversion.
struct F32Elements {
  using T = float;
  static float32x4_t load4(const float* p) { return vld1q_f32(p); }
  static float one(float v) { return v; }
};
struct F16Elements {
  using T = uint16_t;
  static float32x4_t load4(const uint16_t* p) { return vcvt_f32_f16(vreinterpret_f16_u16(vld1_u16(p))); }
  static float one(uint16_t v) { return fp16_to_fp32(v); }
};
struct BF16Elements {  // bf16 is the top half of an f32: widen by shifting into the high 16 bits
  using T = uint16_t;
  static float32x4_t load4(const uint16_t* p) { return vreinterpretq_f32_u32(vshll_n_u16(vld1_u16(p), 16)); }
  static float one(uint16_t v) { return bf16_to_fp32(v); }
};

}  // namespace
}  // namespace bmoe::neon

#endif  // __aarch64__
