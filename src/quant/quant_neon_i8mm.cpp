// NEON + i8mm kernels for batches (arm64; this file is compiled for armv8.2-a+dotprod+i8mm and
// the dispatcher only installs it where HWCAP2 reports i8mm).
//
// SMMLA multiplies a 2x8 int8 matrix by the transpose of another, accumulating a 2x2 int32
// tile: with two weight rows as one operand and two activation rows as the other, one
// instruction does the work of four 8-element dot products. A decode step has a single
// activation row, so this only pays where a matmul has several (prefill, speculative
// verification, experts shared by several tokens of a batch).
//
// Each of the four outputs keeps the one-row kernel's arithmetic: the block's integer sum is
// exact in any order, and the float accumulation across blocks is the same fused multiply-add
// per block, now in one vector lane per (row, input) pair. So out[k] equals neon::dot_* (and
// the scalar reference) bit for bit; tests/test_quant.cpp checks it.
#if defined(__aarch64__)

#include <arm_neon.h>

#include "quant/blocks.h"
#include "quant/simd_kernels.h"

namespace bmoe::neon_i8mm {
namespace {

// [a.low 8 bytes, b.low 8 bytes] and [a.high, b.high]: two rows' 8-element slices stacked into
// one SMMLA operand.
inline int8x16_t low_pair(int8x16_t a, int8x16_t b) {
  return vreinterpretq_s8_s64(vzip1q_s64(vreinterpretq_s64_s8(a), vreinterpretq_s64_s8(b)));
}
inline int8x16_t high_pair(int8x16_t a, int8x16_t b) {
  return vreinterpretq_s8_s64(vzip2q_s64(vreinterpretq_s64_s8(a), vreinterpretq_s64_s8(b)));
}

// 16 weights of row 0 and row 1 against 16 activations of input 0 and input 1, added to the
// tile [r0.i0, r0.i1, r1.i0, r1.i1].
inline int32x4_t tile16(int32x4_t acc, int8x16_t w0, int8x16_t w1, int8x16_t y0, int8x16_t y1) {
  acc = vmmlaq_s32(acc, low_pair(w0, w1), low_pair(y0, y1));
  return vmmlaq_s32(acc, high_pair(w0, w1), high_pair(y0, y1));
}

// 32 elements (two halves of 16) of two rows against two inputs.
inline int32x4_t tile32(const int8x16_t w0[2], const int8x16_t w1[2], const int8_t* y0, const int8_t* y1) {
  int32x4_t acc = tile16(vdupq_n_s32(0), w0[0], w1[0], vld1q_s8(y0), vld1q_s8(y1));
  return tile16(acc, w0[1], w1[1], vld1q_s8(y0 + 16), vld1q_s8(y1 + 16));
}

// Per-lane products x[row] * y[input] in the tile's lane order.
inline float32x4_t tile_scales(float x0, float x1, float y0, float y1) {
  const float xs[4] = {x0, x0, x1, x1};
  const float ys[4] = {y0, y1, y0, y1};
  return vmulq_f32(vld1q_f32(xs), vld1q_f32(ys));
}

inline const uint8_t* row_at(const void* w, size_t stride, int r) { return static_cast<const uint8_t*>(w) + r * stride; }

// Elements 0-15 and 16-31 of a 32-element block as signed bytes, per format.
struct Q8_0Quants {
  using Block = BlockQ8_0;
  static constexpr bool kFused = false;  // dot_q8_0: sum += isum * d, a product then an add
  static void unpack(const Block& b, int8x16_t out[2]) {
    out[0] = vld1q_s8(b.qs);
    out[1] = vld1q_s8(b.qs + 16);
  }
  static float scale(const Block& b) { return fp16_to_fp32(b.d); }
};

struct Q4_0Quants {
  using Block = BlockQ4_0;
  static constexpr bool kFused = true;  // dot_q4_0: std::fma
  static void unpack(const Block& b, int8x16_t out[2]) {
    const uint8x16_t q = vld1q_u8(b.qs);
    const int8x16_t eight = vdupq_n_s8(8);
    out[0] = vsubq_s8(vreinterpretq_s8_u8(vandq_u8(q, vdupq_n_u8(0x0F))), eight);
    out[1] = vsubq_s8(vreinterpretq_s8_u8(vshrq_n_u8(q, 4)), eight);
  }
  static float scale(const Block& b) { return fp16_to_fp32(b.d); }
};

struct Mxfp4Quants {
  using Block = BlockMXFP4;
  static constexpr bool kFused = true;  // dot_mxfp4: std::fma
  static void unpack(const Block& b, int8x16_t out[2]) {
    const int8x16_t values = vld1q_s8(kMxfp4Values);
    const uint8x16_t q = vld1q_u8(b.qs);
    out[0] = vqtbl1q_s8(values, vandq_u8(q, vdupq_n_u8(0x0F)));
    out[1] = vqtbl1q_s8(values, vshrq_n_u8(q, 4));
  }
  static float scale(const Block& b) { return e8m0_to_fp32_half(b.e); }
};

// The 32-element block formats with Q8_0 activations: per block and (row, input) pair, the
// one-row kernel's step: one fused multiply-add (neon::dot_q4_0 / dot_mxfp4, std::fma) or a
// product then an add (dot_q8_0; the build never contracts them, -ffp-contract=off).
template <typename Quants>
void dot_2x2_blocks(const void* w, size_t stride, const void* a0, const void* a1, int64_t n, float* out) {
  using Block = typename Quants::Block;
  const auto* x0 = reinterpret_cast<const Block*>(row_at(w, stride, 0));
  const auto* x1 = reinterpret_cast<const Block*>(row_at(w, stride, 1));
  const auto* y0 = static_cast<const BlockQ8_0*>(a0);
  const auto* y1 = static_cast<const BlockQ8_0*>(a1);
  float32x4_t acc = vdupq_n_f32(0.0f);
  for (int64_t b = 0; b < n / kQK; ++b) {
    int8x16_t w0[2], w1[2];
    Quants::unpack(x0[b], w0);
    Quants::unpack(x1[b], w1);
    const int32x4_t isum = tile32(w0, w1, y0[b].qs, y1[b].qs);
    const float32x4_t d = tile_scales(Quants::scale(x0[b]), Quants::scale(x1[b]), fp16_to_fp32(y0[b].d),
                                      fp16_to_fp32(y1[b].d));
    acc = Quants::kFused ? vfmaq_f32(acc, vcvtq_f32_s32(isum), d) : vaddq_f32(acc, vmulq_f32(vcvtq_f32_s32(isum), d));
  }
  vst1q_f32(out, acc);
}

}  // namespace

void dot_2x2_q8_0(const void* w, size_t stride, const void* a0, const void* a1, int64_t n, float* out) {
  dot_2x2_blocks<Q8_0Quants>(w, stride, a0, a1, n, out);
}

void dot_2x2_q4_0(const void* w, size_t stride, const void* a0, const void* a1, int64_t n, float* out) {
  dot_2x2_blocks<Q4_0Quants>(w, stride, a0, a1, n, out);
}

void dot_2x2_mxfp4(const void* w, size_t stride, const void* a0, const void* a1, int64_t n, float* out) {
  dot_2x2_blocks<Mxfp4Quants>(w, stride, a0, a1, n, out);
}

// Q4_K: per super-block, each 32-element sub-block's tile is scaled by its row's 6-bit scale
// (integer, exact); then one fused multiply-add for the scaled sum and one for the min term
// per (row, input), as neon::dot_q4_K.
void dot_2x2_q4_K(const void* w, size_t stride, const void* a0, const void* a1, int64_t n, float* out) {
  const auto* x0 = reinterpret_cast<const BlockQ4_K*>(row_at(w, stride, 0));
  const auto* x1 = reinterpret_cast<const BlockQ4_K*>(row_at(w, stride, 1));
  const auto* y0 = static_cast<const BlockQ8_K*>(a0);
  const auto* y1 = static_cast<const BlockQ8_K*>(a1);
  const uint8x16_t low_mask = vdupq_n_u8(0x0F);
  float32x4_t sum = vdupq_n_f32(0.0f), sum_min = vdupq_n_f32(0.0f);
  for (int64_t b = 0; b < n / kQK_K; ++b) {
    int32x4_t isum = vdupq_n_s32(0);
    for (int chunk = 0; chunk < 4; ++chunk) {  // 32 bytes of each row: sub-blocks 2c and 2c+1
      const uint8_t* q0 = x0[b].qs + 32 * chunk;
      const uint8_t* q1 = x1[b].qs + 32 * chunk;
      const uint8x16_t r0a = vld1q_u8(q0), r0b = vld1q_u8(q0 + 16);
      const uint8x16_t r1a = vld1q_u8(q1), r1b = vld1q_u8(q1 + 16);
      const int8x16_t lo0[2] = {vreinterpretq_s8_u8(vandq_u8(r0a, low_mask)), vreinterpretq_s8_u8(vandq_u8(r0b, low_mask))};
      const int8x16_t lo1[2] = {vreinterpretq_s8_u8(vandq_u8(r1a, low_mask)), vreinterpretq_s8_u8(vandq_u8(r1b, low_mask))};
      const int8x16_t hi0[2] = {vreinterpretq_s8_u8(vshrq_n_u8(r0a, 4)), vreinterpretq_s8_u8(vshrq_n_u8(r0b, 4))};
      const int8x16_t hi1[2] = {vreinterpretq_s8_u8(vshrq_n_u8(r1a, 4)), vreinterpretq_s8_u8(vshrq_n_u8(r1b, 4))};
      const int8_t* q8_0 = y0[b].qs + 64 * chunk;
      const int8_t* q8_1 = y1[b].qs + 64 * chunk;
      uint8_t sc00, m00, sc01, m01, sc10, m10, sc11, m11;  // sc<row><sub-block>
      k_scale_min(2 * chunk, x0[b].scales, sc00, m00);
      k_scale_min(2 * chunk + 1, x0[b].scales, sc01, m01);
      k_scale_min(2 * chunk, x1[b].scales, sc10, m10);
      k_scale_min(2 * chunk + 1, x1[b].scales, sc11, m11);
      const int32_t s_lo[4] = {sc00, sc00, sc10, sc10};
      const int32_t s_hi[4] = {sc01, sc01, sc11, sc11};
      isum = vmlaq_s32(isum, tile32(lo0, lo1, q8_0, q8_1), vld1q_s32(s_lo));
      isum = vmlaq_s32(isum, tile32(hi0, hi1, q8_0 + 32, q8_1 + 32), vld1q_s32(s_hi));
    }
    const int32_t mins[4] = {k_min_sum(x0[b].scales, y0[b].bsums), k_min_sum(x0[b].scales, y1[b].bsums),
                             k_min_sum(x1[b].scales, y0[b].bsums), k_min_sum(x1[b].scales, y1[b].bsums)};
    const float32x4_t d = tile_scales(fp16_to_fp32(x0[b].d), fp16_to_fp32(x1[b].d), y0[b].d, y1[b].d);
    const float32x4_t dmin = tile_scales(fp16_to_fp32(x0[b].dmin), fp16_to_fp32(x1[b].dmin), y0[b].d, y1[b].d);
    sum = vfmaq_f32(sum, vcvtq_f32_s32(isum), d);
    sum_min = vfmaq_f32(sum_min, vcvtq_f32_s32(vld1q_s32(mins)), dmin);
  }
  vst1q_f32(out, vsubq_f32(sum, sum_min));
}

namespace {

// The Q5_K / Q6_K float step per (row, input) lane, written as the one-row kernels write it so
// the compiler rounds (and contracts) it the same way; SMMLA only does the integer part.
struct Lane {
  int row, input;
};
constexpr Lane kLanes[4] = {{0, 0}, {0, 1}, {1, 0}, {1, 1}};

inline int8x16_t with_fifth_bit(uint8x16_t nibbles, uint8x16_t qh, uint8x16_t bit) {
  return vreinterpretq_s8_u8(vaddq_u8(nibbles, vandq_u8(vtstq_u8(qh, bit), vdupq_n_u8(16))));
}

inline int32x4_t scale_lanes(int s0, int s1) {
  const int32_t v[4] = {s0, s0, s1, s1};
  return vld1q_s32(v);
}

// Part p (elements 32p..32p+31) of half h of a Q6_K block: two groups of 16, minus 32.
inline void q6_part(const BlockQ6_K& x, int half, int part, int8x16_t out[2]) {
  const uint8_t* ql = x.ql + 64 * half;
  const uint8_t* qh = x.qh + 32 * half;
  const uint8x16_t m4 = vdupq_n_u8(0x0F), m2 = vdupq_n_u8(0x03);
  for (int g = 0; g < 2; ++g) {
    const uint8x16_t lo = vld1q_u8(ql + 16 * g + (part & 1 ? 32 : 0));
    const uint8x16_t nib = part < 2 ? vandq_u8(lo, m4) : vshrq_n_u8(lo, 4);
    const uint8x16_t hi = vandq_u8(vshlq_u8(vld1q_u8(qh + 16 * g), vdupq_n_s8(static_cast<int8_t>(-2 * part))), m2);
    out[g] = vsubq_s8(vreinterpretq_s8_u8(vorrq_u8(nib, vshlq_n_u8(hi, 4))), vdupq_n_s8(32));
  }
}

}  // namespace

void dot_2x2_q5_K(const void* w, size_t stride, const void* a0, const void* a1, int64_t n, float* out) {
  const BlockQ5_K* x[2] = {reinterpret_cast<const BlockQ5_K*>(row_at(w, stride, 0)),
                           reinterpret_cast<const BlockQ5_K*>(row_at(w, stride, 1))};
  const BlockQ8_K* y[2] = {static_cast<const BlockQ8_K*>(a0), static_cast<const BlockQ8_K*>(a1)};
  const uint8x16_t low_mask = vdupq_n_u8(0x0F);
  float sum[4] = {0.0f, 0.0f, 0.0f, 0.0f};
  for (int64_t b = 0; b < n / kQK_K; ++b) {
    int32x4_t isum = vdupq_n_s32(0);
    for (int chunk = 0; chunk < 4; ++chunk) {
      const uint8x16_t bit0 = vdupq_n_u8(static_cast<uint8_t>(1u << (2 * chunk)));
      const uint8x16_t bit1 = vdupq_n_u8(static_cast<uint8_t>(2u << (2 * chunk)));
      int8x16_t lo[2][2], hi[2][2];  // [row][16-element half]
      uint8_t sc[2][2], m[2][2];     // [row][sub-block 2c, 2c+1]
      for (int r = 0; r < 2; ++r) {
        const BlockQ5_K& blk = x[r][b];
        for (int g = 0; g < 2; ++g) {
          const uint8x16_t q = vld1q_u8(blk.qs + 32 * chunk + 16 * g);
          const uint8x16_t qh = vld1q_u8(blk.qh + 16 * g);
          lo[r][g] = with_fifth_bit(vandq_u8(q, low_mask), qh, bit0);
          hi[r][g] = with_fifth_bit(vshrq_n_u8(q, 4), qh, bit1);
        }
        k_scale_min(2 * chunk, blk.scales, sc[r][0], m[r][0]);
        k_scale_min(2 * chunk + 1, blk.scales, sc[r][1], m[r][1]);
      }
      const int8_t* q8_0 = y[0][b].qs + 64 * chunk;
      const int8_t* q8_1 = y[1][b].qs + 64 * chunk;
      isum = vmlaq_s32(isum, tile32(lo[0], lo[1], q8_0, q8_1), scale_lanes(sc[0][0], sc[1][0]));
      isum = vmlaq_s32(isum, tile32(hi[0], hi[1], q8_0 + 32, q8_1 + 32), scale_lanes(sc[0][1], sc[1][1]));
    }
    int32_t is[4];
    vst1q_s32(is, isum);
    for (int k = 0; k < 4; ++k) {
      const BlockQ5_K& xb = x[kLanes[k].row][b];
      const BlockQ8_K& yb = y[kLanes[k].input][b];
      const float d = yb.d * fp16_to_fp32(xb.d);
      const float dmin = yb.d * fp16_to_fp32(xb.dmin);
      sum[k] += d * static_cast<float>(is[k]) - dmin * static_cast<float>(k_min_sum(xb.scales, yb.bsums));
    }
  }
  for (int k = 0; k < 4; ++k) out[k] = sum[k];
}

void dot_2x2_q6_K(const void* w, size_t stride, const void* a0, const void* a1, int64_t n, float* out) {
  const BlockQ6_K* x[2] = {reinterpret_cast<const BlockQ6_K*>(row_at(w, stride, 0)),
                           reinterpret_cast<const BlockQ6_K*>(row_at(w, stride, 1))};
  const BlockQ8_K* y[2] = {static_cast<const BlockQ8_K*>(a0), static_cast<const BlockQ8_K*>(a1)};
  float sum[4] = {0.0f, 0.0f, 0.0f, 0.0f};
  for (int64_t b = 0; b < n / kQK_K; ++b) {
    int32x4_t isum = vdupq_n_s32(0);
    for (int half = 0; half < 2; ++half) {
      const int8_t* sc0 = x[0][b].scales + 8 * half;
      const int8_t* sc1 = x[1][b].scales + 8 * half;
      for (int part = 0; part < 4; ++part) {
        int8x16_t v0[2], v1[2];
        q6_part(x[0][b], half, part, v0);
        q6_part(x[1][b], half, part, v1);
        const int8_t* q8_0 = y[0][b].qs + 128 * half + 32 * part;
        const int8_t* q8_1 = y[1][b].qs + 128 * half + 32 * part;
        // Each group of 16 has its own scale.
        for (int g = 0; g < 2; ++g) {
          const int32x4_t t = tile16(vdupq_n_s32(0), v0[g], v1[g], vld1q_s8(q8_0 + 16 * g), vld1q_s8(q8_1 + 16 * g));
          isum = vmlaq_s32(isum, t, scale_lanes(sc0[2 * part + g], sc1[2 * part + g]));
        }
      }
    }
    int32_t is[4];
    vst1q_s32(is, isum);
    for (int k = 0; k < 4; ++k) {
      const BlockQ6_K& xb = x[kLanes[k].row][b];
      const BlockQ8_K& yb = y[kLanes[k].input][b];
      sum[k] += fp16_to_fp32(xb.d) * yb.d * static_cast<float>(is[k]);
    }
  }
  for (int k = 0; k < 4; ++k) out[k] = sum[k];
}

}  // namespace bmoe::neon_i8mm

#endif  // __aarch64__
