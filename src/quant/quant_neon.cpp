// NEON + dotprod dot products (arm64; this file is compiled for armv8.2-a+dotprod and the
// dispatcher only selects it where HWCAP reports dotprod).
//
// The quantized kernels compute each block's integer sum with SDOT (exact) and then
// accumulate across blocks with exactly the scalar reference's float operations, so their
// results equal the reference bit for bit. The float kernels (F32, F16) keep four vector
// accumulators like ggml's NEON path; they agree with the reference to float rounding.
#if defined(__aarch64__)

#include <arm_neon.h>

#include <cmath>

#include "quant/blocks.h"
#include "quant/neon_shared.h"
#include "quant/simd_kernels.h"

namespace bmoe::neon {
namespace {

inline int32x4_t dot16(int32x4_t acc, int8x16_t a, const int8_t* b) { return vdotq_s32(acc, a, vld1q_s8(b)); }

inline int sum_i32(int32x4_t v) { return vaddvq_s32(v); }

inline float reduce4(float32x4_t a, float32x4_t b, float32x4_t c, float32x4_t d) {
  return vaddvq_f32(vaddq_f32(vaddq_f32(a, c), vaddq_f32(b, d)));
}

}  // namespace

namespace {

// Four vector accumulators of fused multiply-adds over 16 elements a step, reduced like ggml's
// NEON path; the tail is summed in double.
template <typename X, typename Y>
float dot_float(const void* w, const void* a, int64_t n) {
  const auto* x = static_cast<const typename X::T*>(w);
  const auto* y = static_cast<const typename Y::T*>(a);
  float32x4_t s0 = vdupq_n_f32(0), s1 = s0, s2 = s0, s3 = s0;
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    s0 = vfmaq_f32(s0, X::load4(x + i), Y::load4(y + i));
    s1 = vfmaq_f32(s1, X::load4(x + i + 4), Y::load4(y + i + 4));
    s2 = vfmaq_f32(s2, X::load4(x + i + 8), Y::load4(y + i + 8));
    s3 = vfmaq_f32(s3, X::load4(x + i + 12), Y::load4(y + i + 12));
  }
  double sum = reduce4(s0, s1, s2, s3);
  for (; i < n; ++i) sum += static_cast<double>(X::one(x[i]) * Y::one(y[i]));
  return static_cast<float>(sum);
}

}  // namespace

float dot_f32(const void* w, const void* a, int64_t n) { return dot_float<F32Elements, F32Elements>(w, a, n); }

void dequantize_f16(const void* src, float* dst, int64_t n) {
  const auto* h = static_cast<const uint16_t*>(src);
  int64_t i = 0;
  for (; i + 4 <= n; i += 4) vst1q_f32(dst + i, F16Elements::load4(h + i));
  for (; i < n; ++i) dst[i] = fp16_to_fp32(h[i]);
}
float dot_f16_f32(const void* w, const void* a, int64_t n) { return dot_float<F16Elements, F32Elements>(w, a, n); }
float dot_f16(const void* w, const void* a, int64_t n) { return dot_float<F16Elements, F16Elements>(w, a, n); }
float dot_bf16(const void* w, const void* a, int64_t n) { return dot_float<BF16Elements, BF16Elements>(w, a, n); }

float dot_q8_0(const void* w, const void* a, int64_t n) {
  const auto* x = static_cast<const BlockQ8_0*>(w);
  const auto* y = static_cast<const BlockQ8_0*>(a);
  float sum = 0.0f;
  for (int64_t b = 0; b < n / kQK; ++b) {
    int32x4_t acc = dot16(vdupq_n_s32(0), vld1q_s8(x[b].qs), y[b].qs);
    acc = dot16(acc, vld1q_s8(x[b].qs + 16), y[b].qs + 16);
    sum += static_cast<float>(sum_i32(acc)) * (fp16_to_fp32(x[b].d) * fp16_to_fp32(y[b].d));
  }
  return sum;
}

float dot_q4_0(const void* w, const void* a, int64_t n) {
  const auto* x = static_cast<const BlockQ4_0*>(w);
  const auto* y = static_cast<const BlockQ8_0*>(a);
  const int8x16_t eight = vdupq_n_s8(8);
  float sum = 0.0f;
  for (int64_t b = 0; b < n / kQK; ++b) {
    const uint8x16_t q = vld1q_u8(x[b].qs);
    int32x4_t acc = dot16(vdupq_n_s32(0), vsubq_s8(low_nibbles(q), eight), y[b].qs);
    acc = dot16(acc, vsubq_s8(high_nibbles(q), eight), y[b].qs + 16);
    sum = std::fma(static_cast<float>(sum_i32(acc)), fp16_to_fp32(x[b].d) * fp16_to_fp32(y[b].d), sum);
  }
  return sum;
}

float dot_mxfp4(const void* w, const void* a, int64_t n) {
  const auto* x = static_cast<const BlockMXFP4*>(w);
  const auto* y = static_cast<const BlockQ8_0*>(a);
  const int8x16_t values = vld1q_s8(kMxfp4Values);
  float sum = 0.0f;
  for (int64_t b = 0; b < n / kQK; ++b) {
    const uint8x16_t q = vld1q_u8(x[b].qs);
    const int8x16_t lo = vqtbl1q_s8(values, vandq_u8(q, vdupq_n_u8(0x0F)));
    const int8x16_t hi = vqtbl1q_s8(values, vshrq_n_u8(q, 4));
    int32x4_t acc = dot16(vdupq_n_s32(0), lo, y[b].qs);
    acc = dot16(acc, hi, y[b].qs + 16);
    sum = std::fma(static_cast<float>(sum_i32(acc)), e8m0_to_fp32_half(x[b].e) * fp16_to_fp32(y[b].d), sum);
  }
  return sum;
}

float dot_q4_K(const void* w, const void* a, int64_t n) {
  const auto* x = static_cast<const BlockQ4_K*>(w);
  const auto* y = static_cast<const BlockQ8_K*>(a);
  float sum = 0.0f, sum_min = 0.0f;
  for (int64_t b = 0; b < n / kQK_K; ++b) {
    int isum = 0;
    const uint8_t* q = x[b].qs;
    const int8_t* q8 = y[b].qs;
    for (int chunk = 0; chunk < 4; ++chunk) {  // 32 bytes: two 32-element sub-blocks
      uint8_t sc0, m0, sc1, m1;
      k_scale_min(2 * chunk, x[b].scales, sc0, m0);
      k_scale_min(2 * chunk + 1, x[b].scales, sc1, m1);
      const uint8x16_t qa = vld1q_u8(q), qb = vld1q_u8(q + 16);
      const int32x4_t zero = vdupq_n_s32(0);
      const int s0 = sum_i32(dot16(dot16(zero, low_nibbles(qa), q8), low_nibbles(qb), q8 + 16));
      const int s1 = sum_i32(dot16(dot16(zero, high_nibbles(qa), q8 + 32), high_nibbles(qb), q8 + 48));
      isum += sc0 * s0 + sc1 * s1;
      q += 32;
      q8 += 64;
    }
    sum = std::fma(static_cast<float>(isum), fp16_to_fp32(x[b].d) * y[b].d, sum);
    sum_min = std::fma(static_cast<float>(k_min_sum(x[b].scales, y[b].bsums)), fp16_to_fp32(x[b].dmin) * y[b].d, sum_min);
  }
  return sum - sum_min;
}

float dot_q5_K(const void* w, const void* a, int64_t n) {
  const auto* x = static_cast<const BlockQ5_K*>(w);
  const auto* y = static_cast<const BlockQ8_K*>(a);
  float sum = 0.0f;
  for (int64_t b = 0; b < n / kQK_K; ++b) {
    int isum = 0;
    const uint8_t* q = x[b].qs;
    const int8_t* q8 = y[b].qs;
    const uint8x16_t qh_a = vld1q_u8(x[b].qh), qh_b = vld1q_u8(x[b].qh + 16);
    for (int chunk = 0; chunk < 4; ++chunk) {
      uint8_t sc0, m0, sc1, m1;
      k_scale_min(2 * chunk, x[b].scales, sc0, m0);
      k_scale_min(2 * chunk + 1, x[b].scales, sc1, m1);
      const uint8x16_t bit0 = vdupq_n_u8(static_cast<uint8_t>(1u << (2 * chunk)));
      const uint8x16_t bit1 = vdupq_n_u8(static_cast<uint8_t>(2u << (2 * chunk)));
      const uint8x16_t qa = vld1q_u8(q), qb = vld1q_u8(q + 16);
      const int32x4_t zero = vdupq_n_s32(0);
      const int s0 = sum_i32(dot16(dot16(zero, with_fifth_bit(low_nibbles(qa), qh_a, bit0), q8),
                                   with_fifth_bit(low_nibbles(qb), qh_b, bit0), q8 + 16));
      const int s1 = sum_i32(dot16(dot16(zero, with_fifth_bit(high_nibbles(qa), qh_a, bit1), q8 + 32),
                                   with_fifth_bit(high_nibbles(qb), qh_b, bit1), q8 + 48));
      isum += sc0 * s0 + sc1 * s1;
      q += 32;
      q8 += 64;
    }
    const float d = y[b].d * fp16_to_fp32(x[b].d);
    const float dmin = y[b].d * fp16_to_fp32(x[b].dmin);
    sum += d * static_cast<float>(isum) - dmin * static_cast<float>(k_min_sum(x[b].scales, y[b].bsums));
  }
  return sum;
}

float dot_q6_K(const void* w, const void* a, int64_t n) {
  const auto* x = static_cast<const BlockQ6_K*>(w);
  const auto* y = static_cast<const BlockQ8_K*>(a);
  float sum = 0.0f;
  for (int64_t b = 0; b < n / kQK_K; ++b) {
    int isum = 0;
    for (int half = 0; half < 2; ++half) {
      const uint8_t* ql = x[b].ql + 64 * half;
      const uint8_t* qh = x[b].qh + 32 * half;
      const int8_t* sc = x[b].scales + 8 * half;
      const int8_t* q8 = y[b].qs + 128 * half;
      const uint8x16_t l[4] = {vld1q_u8(ql), vld1q_u8(ql + 16), vld1q_u8(ql + 32), vld1q_u8(ql + 48)};
      const uint8x16_t h[2] = {vld1q_u8(qh), vld1q_u8(qh + 16)};
      for (int part = 0; part < 4; ++part) {
        int8x16_t va, vb;
        q6_K_part(l, h, part, va, vb);
        const int s0 = sum_i32(dot16(vdupq_n_s32(0), va, q8 + 32 * part));
        const int s1 = sum_i32(dot16(vdupq_n_s32(0), vb, q8 + 32 * part + 16));
        isum += sc[2 * part] * s0 + sc[2 * part + 1] * s1;
      }
    }
    sum += fp16_to_fp32(x[b].d) * y[b].d * static_cast<float>(isum);
  }
  return sum;
}

}  // namespace bmoe::neon

#endif  // __aarch64__
