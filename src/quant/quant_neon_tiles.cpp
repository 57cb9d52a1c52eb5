// NEON + dotprod tile kernels for prompt batches (DotTileFn): one weight row against four
// activation rows, one per float lane. Each weight block is unpacked once for the four rows;
// their integer block sums come from SDOT (exact), and each pair's float operations, the one-row
// kernel's in its order (quant_neon.cpp, itself equal to the scalar reference), run in one lane:
// every output equals neon::dot_* and ref::dot_* bit for bit.
#if defined(__aarch64__)

#include <arm_neon.h>

#include <cmath>

#include "core/fp16.h"
#include "quant/blocks.h"
#include "quant/neon_shared.h"
#include "quant/quant.h"
#include "quant/simd_kernels.h"
#include "quant/tile_frame.h"

namespace bmoe::neon {
namespace {

constexpr int kActs = 4;

// Two SDOTs over 32 quants (a: the first 16, b: the next 16) against 32 activations.
inline int32x4_t dot32(int8x16_t a, int8x16_t b, const int8_t* y) {
  return vdotq_s32(vdotq_s32(vdupq_n_s32(0), a, vld1q_s8(y)), b, vld1q_s8(y + 16));
}

// Lane t: the total of acc[t]'s four lanes (exact).
inline int32x4_t totals(const int32x4_t acc[kActs]) {
  return vpaddq_s32(vpaddq_s32(acc[0], acc[1]), vpaddq_s32(acc[2], acc[3]));
}

// The activation rows of a tile and, per block, their scales.
template <typename ActBlock>
struct ActGroup {
  const ActBlock* y[kActs];
  ActGroup(const void* const* acts, int64_t, bool) {
    for (int t = 0; t < kActs; ++t) y[t] = static_cast<const ActBlock*>(acts[t]);
  }
  float32x4_t scales(int64_t b) const {
    const float d[kActs] = {scale_of(y[0][b]), scale_of(y[1][b]), scale_of(y[2][b]), scale_of(y[3][b])};
    return vld1q_f32(d);
  }
  // Lane t: the K-quant min term sum_j mins[j] * (bsums[2j] + bsums[2j+1]) of activation t.
  int32x4_t min_terms(int64_t b, int16x8_t mins) const {
    int32x4_t m[kActs];
    for (int t = 0; t < kActs; ++t) {
      const int16x8_t pairs = vpaddq_s16(vld1q_s16(y[t][b].bsums), vld1q_s16(y[t][b].bsums + 8));
      m[t] = vmlal_high_s16(vmull_s16(vget_low_s16(pairs), vget_low_s16(mins)), pairs, mins);
    }
    return totals(m);
  }

 private:
  static float scale_of(const BlockQ8_K& blk) { return blk.d; }
  static float scale_of(const BlockQ8_0& blk) { return fp16_to_fp32(blk.d); }
};
using Q8KGroup = ActGroup<BlockQ8_K>;
using Q8_0Group = ActGroup<BlockQ8_0>;

// The eight 6-bit scales and mins of a K-quant block.
inline void scales_mins(const uint8_t* packed, int32_t sc[8], int16x8_t& mins) {
  int16_t m[8];
  for (int j = 0; j < 8; ++j) {
    uint8_t s, mm;
    k_scale_min(j, packed, s, mm);
    sc[j] = s;
    m[j] = mm;
  }
  mins = vld1q_s16(m);
}

// Q4_K (dot_q4_K): sum = fma(isum, dx * dy, sum) and the same for the mins, per lane.
void q4_K_row(const void* w, const Q8KGroup& g, int64_t n, float* out) {
  const auto* x = static_cast<const BlockQ4_K*>(w);
  float32x4_t sum = vdupq_n_f32(0.0f), sum_min = vdupq_n_f32(0.0f);
  for (int64_t b = 0; b < n / kQK_K; ++b) {
    int32_t sc[8];
    int16x8_t mins;
    scales_mins(x[b].scales, sc, mins);
    int32x4_t acc[kActs];
    for (auto& a : acc) a = vdupq_n_s32(0);
    for (int chunk = 0; chunk < 4; ++chunk) {
      const uint8x16_t qa = vld1q_u8(x[b].qs + 32 * chunk), qb = vld1q_u8(x[b].qs + 32 * chunk + 16);
      const int8x16_t la = low_nibbles(qa), lb = low_nibbles(qb), ha = high_nibbles(qa), hb = high_nibbles(qb);
      for (int t = 0; t < kActs; ++t) {
        const int8_t* q8 = g.y[t][b].qs + 64 * chunk;
        acc[t] = vmlaq_n_s32(acc[t], dot32(la, lb, q8), sc[2 * chunk]);
        acc[t] = vmlaq_n_s32(acc[t], dot32(ha, hb, q8 + 32), sc[2 * chunk + 1]);
      }
    }
    const float32x4_t dy = g.scales(b);
    sum = vfmaq_f32(sum, vcvtq_f32_s32(totals(acc)), vmulq_f32(vdupq_n_f32(fp16_to_fp32(x[b].d)), dy));
    sum_min = vfmaq_f32(sum_min, vcvtq_f32_s32(g.min_terms(b, mins)), vmulq_f32(vdupq_n_f32(fp16_to_fp32(x[b].dmin)), dy));
  }
  vst1q_f32(out, vsubq_f32(sum, sum_min));
}

// Q5_K (dot_q5_K): sum += d * isum - dmin * mins, unfused, per lane.
void q5_K_row(const void* w, const Q8KGroup& g, int64_t n, float* out) {
  const auto* x = static_cast<const BlockQ5_K*>(w);
  float32x4_t sum = vdupq_n_f32(0.0f);
  for (int64_t b = 0; b < n / kQK_K; ++b) {
    int32_t sc[8];
    int16x8_t mins;
    scales_mins(x[b].scales, sc, mins);
    const uint8x16_t qh_a = vld1q_u8(x[b].qh), qh_b = vld1q_u8(x[b].qh + 16);
    int32x4_t acc[kActs];
    for (auto& a : acc) a = vdupq_n_s32(0);
    for (int chunk = 0; chunk < 4; ++chunk) {
      const uint8x16_t bit0 = vdupq_n_u8(static_cast<uint8_t>(1u << (2 * chunk)));
      const uint8x16_t bit1 = vdupq_n_u8(static_cast<uint8_t>(2u << (2 * chunk)));
      const uint8x16_t qa = vld1q_u8(x[b].qs + 32 * chunk), qb = vld1q_u8(x[b].qs + 32 * chunk + 16);
      const int8x16_t la = with_fifth_bit(low_nibbles(qa), qh_a, bit0), lb = with_fifth_bit(low_nibbles(qb), qh_b, bit0);
      const int8x16_t ha = with_fifth_bit(high_nibbles(qa), qh_a, bit1), hb = with_fifth_bit(high_nibbles(qb), qh_b, bit1);
      for (int t = 0; t < kActs; ++t) {
        const int8_t* q8 = g.y[t][b].qs + 64 * chunk;
        acc[t] = vmlaq_n_s32(acc[t], dot32(la, lb, q8), sc[2 * chunk]);
        acc[t] = vmlaq_n_s32(acc[t], dot32(ha, hb, q8 + 32), sc[2 * chunk + 1]);
      }
    }
    const float32x4_t dy = g.scales(b);
    const float32x4_t d = vmulq_f32(dy, vdupq_n_f32(fp16_to_fp32(x[b].d)));
    const float32x4_t dmin = vmulq_f32(dy, vdupq_n_f32(fp16_to_fp32(x[b].dmin)));
    const float32x4_t term = vsubq_f32(vmulq_f32(d, vcvtq_f32_s32(totals(acc))), vmulq_f32(dmin, vcvtq_f32_s32(g.min_terms(b, mins))));
    sum = vaddq_f32(sum, term);
  }
  vst1q_f32(out, sum);
}

// Q6_K (dot_q6_K): sum += (dx * dy) * isum, unfused, per lane.
void q6_K_row(const void* w, const Q8KGroup& g, int64_t n, float* out) {
  const auto* x = static_cast<const BlockQ6_K*>(w);
  float32x4_t sum = vdupq_n_f32(0.0f);
  for (int64_t b = 0; b < n / kQK_K; ++b) {
    int32x4_t acc[kActs];
    for (auto& a : acc) a = vdupq_n_s32(0);
    for (int half = 0; half < 2; ++half) {
      const uint8_t* ql = x[b].ql + 64 * half;
      const uint8_t* qh = x[b].qh + 32 * half;
      const int8_t* sc = x[b].scales + 8 * half;
      const uint8x16_t l[4] = {vld1q_u8(ql), vld1q_u8(ql + 16), vld1q_u8(ql + 32), vld1q_u8(ql + 48)};
      const uint8x16_t h[2] = {vld1q_u8(qh), vld1q_u8(qh + 16)};
      for (int part = 0; part < 4; ++part) {
        int8x16_t va, vb;
        q6_K_part(l, h, part, va, vb);
        for (int t = 0; t < kActs; ++t) {
          const int8_t* q8 = g.y[t][b].qs + 128 * half + 32 * part;
          acc[t] = vmlaq_n_s32(acc[t], vdotq_s32(vdupq_n_s32(0), va, vld1q_s8(q8)), sc[2 * part]);
          acc[t] = vmlaq_n_s32(acc[t], vdotq_s32(vdupq_n_s32(0), vb, vld1q_s8(q8 + 16)), sc[2 * part + 1]);
        }
      }
    }
    const float32x4_t d = vmulq_f32(vdupq_n_f32(fp16_to_fp32(x[b].d)), g.scales(b));
    sum = vaddq_f32(sum, vmulq_f32(d, vcvtq_f32_s32(totals(acc))));
  }
  vst1q_f32(out, sum);
}

// Q8_0 (dot_q8_0): sum += isum * (dx * dy), unfused, per lane.
void q8_0_row(const void* w, const Q8_0Group& g, int64_t n, float* out) {
  const auto* x = static_cast<const BlockQ8_0*>(w);
  float32x4_t sum = vdupq_n_f32(0.0f);
  for (int64_t b = 0; b < n / kQK; ++b) {
    const int8x16_t a = vld1q_s8(x[b].qs), c = vld1q_s8(x[b].qs + 16);
    int32x4_t acc[kActs];
    for (int t = 0; t < kActs; ++t) acc[t] = dot32(a, c, g.y[t][b].qs);
    const float32x4_t d = vmulq_f32(vdupq_n_f32(fp16_to_fp32(x[b].d)), g.scales(b));
    sum = vaddq_f32(sum, vmulq_f32(vcvtq_f32_s32(totals(acc)), d));
  }
  vst1q_f32(out, sum);
}

// Q4_0 and MXFP4 (dot_q4_0, dot_mxfp4): sum = fma(isum, scale * dy, sum) per lane.
struct Q4_0Quants {
  using Block = BlockQ4_0;
  static void quants(const Block& blk, int8x16_t& lo, int8x16_t& hi) {
    const uint8x16_t q = vld1q_u8(blk.qs);
    lo = vsubq_s8(low_nibbles(q), vdupq_n_s8(8));
    hi = vsubq_s8(high_nibbles(q), vdupq_n_s8(8));
  }
  static float scale(const Block& blk) { return fp16_to_fp32(blk.d); }
};
struct Mxfp4Quants {
  using Block = BlockMXFP4;
  static void quants(const Block& blk, int8x16_t& lo, int8x16_t& hi) {
    const int8x16_t values = vld1q_s8(kMxfp4Values);
    const uint8x16_t q = vld1q_u8(blk.qs);
    lo = vqtbl1q_s8(values, vandq_u8(q, vdupq_n_u8(0x0F)));
    hi = vqtbl1q_s8(values, vshrq_n_u8(q, 4));
  }
  static float scale(const Block& blk) { return e8m0_to_fp32_half(blk.e); }
};

template <typename Quants>
void small_blocks_row(const void* w, const Q8_0Group& g, int64_t n, float* out) {
  const auto* x = static_cast<const typename Quants::Block*>(w);
  float32x4_t sum = vdupq_n_f32(0.0f);
  for (int64_t b = 0; b < n / kQK; ++b) {
    int8x16_t lo, hi;
    Quants::quants(x[b], lo, hi);
    int32x4_t acc[kActs];
    for (int t = 0; t < kActs; ++t) acc[t] = dot32(lo, hi, g.y[t][b].qs);
    const float32x4_t d = vmulq_f32(vdupq_n_f32(Quants::scale(x[b])), g.scales(b));
    sum = vfmaq_f32(sum, vcvtq_f32_s32(totals(acc)), d);
  }
  vst1q_f32(out, sum);
}

// Float weights (dot_float in quant_neon.cpp): four vector accumulators per pair over 16
// elements a step, reduced as (s0 + s2) + (s1 + s3), the tail summed in double.
struct FloatGroup {
  const void* y[kActs];
  FloatGroup(const void* const* acts, int64_t, bool) {
    for (int t = 0; t < kActs; ++t) y[t] = acts[t];
  }
};

template <typename X, typename Y>
void float_row(const void* w, const FloatGroup& g, int64_t n, float* out) {
  const auto* x = static_cast<const typename X::T*>(w);
  const typename Y::T* y[kActs];
  for (int t = 0; t < kActs; ++t) y[t] = static_cast<const typename Y::T*>(g.y[t]);
  float32x4_t s[kActs][4];
  for (auto& row : s) {
    for (auto& v : row) v = vdupq_n_f32(0.0f);
  }
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const float32x4_t x0 = X::load4(x + i), x1 = X::load4(x + i + 4), x2 = X::load4(x + i + 8), x3 = X::load4(x + i + 12);
    for (int t = 0; t < kActs; ++t) {
      s[t][0] = vfmaq_f32(s[t][0], x0, Y::load4(y[t] + i));
      s[t][1] = vfmaq_f32(s[t][1], x1, Y::load4(y[t] + i + 4));
      s[t][2] = vfmaq_f32(s[t][2], x2, Y::load4(y[t] + i + 8));
      s[t][3] = vfmaq_f32(s[t][3], x3, Y::load4(y[t] + i + 12));
    }
  }
  for (int t = 0; t < kActs; ++t) {
    double sum = vaddvq_f32(vaddq_f32(vaddq_f32(s[t][0], s[t][2]), vaddq_f32(s[t][1], s[t][3])));
    for (int64_t j = i; j < n; ++j) sum += static_cast<double>(X::one(x[j]) * Y::one(y[t][j]));
    out[t] = static_cast<float>(sum);
  }
}

template <typename Group, void (*Row)(const void*, const Group&, int64_t, float*)>
void tile(const void* w, size_t stride, int64_t rows, const void* const* acts, int64_t n_act, int64_t n, float* out,
          int64_t out_stride, DotFn one, int64_t block) {
  tile_rows<kActs, Group, Row, Row>(w, stride, rows, acts, n_act, n, out, out_stride, one, block, false);
}

}  // namespace

void dot_tile_q4_K(const void* w, size_t stride, int64_t rows, const void* const* acts, int64_t n_act, int64_t n,
                   float* out, int64_t out_stride) {
  tile<Q8KGroup, q4_K_row>(w, stride, rows, acts, n_act, n, out, out_stride, dot_q4_K, kQK_K);
}
void dot_tile_q5_K(const void* w, size_t stride, int64_t rows, const void* const* acts, int64_t n_act, int64_t n,
                   float* out, int64_t out_stride) {
  tile<Q8KGroup, q5_K_row>(w, stride, rows, acts, n_act, n, out, out_stride, dot_q5_K, kQK_K);
}
void dot_tile_q6_K(const void* w, size_t stride, int64_t rows, const void* const* acts, int64_t n_act, int64_t n,
                   float* out, int64_t out_stride) {
  tile<Q8KGroup, q6_K_row>(w, stride, rows, acts, n_act, n, out, out_stride, dot_q6_K, kQK_K);
}
void dot_tile_q8_0(const void* w, size_t stride, int64_t rows, const void* const* acts, int64_t n_act, int64_t n,
                   float* out, int64_t out_stride) {
  tile<Q8_0Group, q8_0_row>(w, stride, rows, acts, n_act, n, out, out_stride, dot_q8_0, kQK);
}
void dot_tile_q4_0(const void* w, size_t stride, int64_t rows, const void* const* acts, int64_t n_act, int64_t n,
                   float* out, int64_t out_stride) {
  tile<Q8_0Group, small_blocks_row<Q4_0Quants>>(w, stride, rows, acts, n_act, n, out, out_stride, dot_q4_0, kQK);
}
void dot_tile_mxfp4(const void* w, size_t stride, int64_t rows, const void* const* acts, int64_t n_act, int64_t n,
                    float* out, int64_t out_stride) {
  tile<Q8_0Group, small_blocks_row<Mxfp4Quants>>(w, stride, rows, acts, n_act, n, out, out_stride, dot_mxfp4, kQK);
}
void dot_tile_f32(const void* w, size_t stride, int64_t rows, const void* const* acts, int64_t n_act, int64_t n,
                  float* out, int64_t out_stride) {
  tile<FloatGroup, float_row<F32Elements, F32Elements>>(w, stride, rows, acts, n_act, n, out, out_stride, dot_f32, 1);
}
void dot_tile_f16(const void* w, size_t stride, int64_t rows, const void* const* acts, int64_t n_act, int64_t n,
                  float* out, int64_t out_stride) {
  tile<FloatGroup, float_row<F16Elements, F32Elements>>(w, stride, rows, acts, n_act, n, out, out_stride, dot_f16_f32, 1);
}
void dot_tile_bf16(const void* w, size_t stride, int64_t rows, const void* const* acts, int64_t n_act, int64_t n,
                   float* out, int64_t out_stride) {
  tile<FloatGroup, float_row<BF16Elements, BF16Elements>>(w, stride, rows, acts, n_act, n, out, out_stride, dot_bf16, 1);
}

}  // namespace bmoe::neon

#endif  // __aarch64__
