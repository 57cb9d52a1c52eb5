// NEON versions of the f32 kernels (float_kernels.h), equal to the scalar reference bit for bit:
// four elements side by side, each with the reference's own chain of fused operations
// (vfmaq_f32 is fused).
#if defined(__aarch64__)

#include <arm_neon.h>

#include <cmath>

#include "quant/float_kernels.h"
#include "quant/simd_kernels.h"

namespace bmoe::neon {
namespace {

constexpr int kLanes = 4;

// C[RM rows][RN x 4 columns] += A[RM x k] B[k x RN*4], accumulators in registers.
template <int RM, int RN>
void gemm_block(float* c, int64_t ldc, const float* a, int64_t lda, const float* b, int64_t ldb, int64_t k) {
  float32x4_t acc[RM][RN];
  for (int i = 0; i < RM; ++i) {
    for (int r = 0; r < RN; ++r) acc[i][r] = vld1q_f32(c + i * ldc + r * kLanes);
  }
  for (int64_t p = 0; p < k; ++p) {
    float32x4_t bv[RN];
    for (int r = 0; r < RN; ++r) bv[r] = vld1q_f32(b + p * ldb + r * kLanes);
    for (int i = 0; i < RM; ++i) {
      const float32x4_t av = vdupq_n_f32(a[i * lda + p]);
      for (int r = 0; r < RN; ++r) acc[i][r] = vfmaq_f32(acc[i][r], av, bv[r]);
    }
  }
  for (int i = 0; i < RM; ++i) {
    for (int r = 0; r < RN; ++r) vst1q_f32(c + i * ldc + r * kLanes, acc[i][r]);
  }
}

template <int RM>
void gemm_rows(float* c, int64_t ldc, const float* a, int64_t lda, const float* b, int64_t ldb, int64_t k,
               int64_t n) {
  int64_t j = 0;
  for (; j + 4 * kLanes <= n; j += 4 * kLanes) gemm_block<RM, 4>(c + j, ldc, a, lda, b + j, ldb, k);
  for (; j + kLanes <= n; j += kLanes) gemm_block<RM, 1>(c + j, ldc, a, lda, b + j, ldb, k);
  if (j < n) ref::gemm_f32(c + j, ldc, a, lda, b + j, ldb, RM, k, n - j);  // the last columns
}

// fast_expf on four lanes; see avx2::exp8 for the lanes that leave the fast path.
inline float32x4_t exp4(float32x4_t x) {
  const float32x4_t shift = vdupq_n_f32(0x1.8p23f);
  const float32x4_t z = vfmaq_f32(shift, x, vdupq_n_f32(0x1.715476p+0f));
  const float32x4_t n = vsubq_f32(z, shift);
  const float32x4_t b = vfmsq_f32(vfmsq_f32(x, n, vdupq_n_f32(0x1.62e4p-1f)), n, vdupq_n_f32(0x1.7f7d1cp-20f));
  const uint32x4_t underflow = vcltq_f32(n, vdupq_n_f32(-192.0f));
  const uint32x4_t rare = vbicq_u32(vcagtq_f32(n, vdupq_n_f32(125.0f)), underflow);
  if (vmaxvq_u32(rare) != 0) {
    float v[kLanes];
    vst1q_f32(v, x);
    for (float& e : v) e = fast_expf(e);
    return vld1q_f32(v);
  }
  const float32x4_t u = vmulq_f32(b, b);
  const float32x4_t p = vfmaq_f32(vfmaq_f32(vdupq_n_f32(0x1.fffdb6p-2f), vdupq_n_f32(0x1.555e66p-3f), b),
                                  vfmaq_f32(vdupq_n_f32(0x1.573e2ep-5f), vdupq_n_f32(0x1.0e4020p-7f), b), u);
  const float32x4_t j = vfmaq_f32(vfmaq_f32(vdupq_n_f32(1.0f), vdupq_n_f32(0x1.ffffecp-1f), b), p, u);
  const int32x4_t exponent = vshlq_n_s32(vaddq_s32(vcvtq_s32_f32(n), vdupq_n_s32(127)), 23);
  const float32x4_t r = vmulq_f32(j, vreinterpretq_f32_s32(exponent));
  return vreinterpretq_f32_u32(vbicq_u32(vreinterpretq_u32_f32(r), underflow));
}

}  // namespace

void gemm_f32(float* c, int64_t ldc, const float* a, int64_t lda, const float* b, int64_t ldb, int64_t m,
              int64_t k, int64_t n) {
  constexpr int kRows = 4;
  int64_t i = 0;
  for (; i + kRows <= m; i += kRows) gemm_rows<kRows>(c + i * ldc, ldc, a + i * lda, lda, b, ldb, k, n);
  for (; i < m; ++i) gemm_rows<1>(c + i * ldc, ldc, a + i * lda, lda, b, ldb, k, n);
}

// ref::reduce16 of lanes e[0..3]: t8 = v[8..15] + v[0..7], t4 = t8[4..7] + t8[0..3], then
// (t0 + t2) + (t1 + t3).
float reduce16(const float32x4_t e[4]) {
  const float32x4_t t4 = vaddq_f32(vaddq_f32(e[3], e[1]), vaddq_f32(e[2], e[0]));
  const float a = vgetq_lane_f32(t4, 0) + vgetq_lane_f32(t4, 2);
  const float b = vgetq_lane_f32(t4, 1) + vgetq_lane_f32(t4, 3);
  return a + b;
}

double exp_sum(float* x, int64_t n, float max) {
  const float32x4_t vmax = vdupq_n_f32(max);
  double sum = 0.0;
  for (int64_t i = 0; i + kExpSumBlock <= n; i += kExpSumBlock) {
    float32x4_t e[4];
    for (int q = 0; q < 4; ++q) {
      e[q] = exp4(vsubq_f32(vld1q_f32(x + i + q * kLanes), vmax));
      vst1q_f32(x + i + q * kLanes, e[q]);
    }
    sum += static_cast<double>(reduce16(e));
  }
  return sum;
}

void swiglu(const float* gate, const float* up, float* out, int64_t n) {
  const float32x4_t one = vdupq_n_f32(1.0f);
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes) {
    const float32x4_t g = vld1q_f32(gate + i);
    const float32x4_t silu = vdivq_f32(g, vaddq_f32(one, exp4(vsubq_f32(vdupq_n_f32(0.0f), g))));
    vst1q_f32(out + i, vmulq_f32(silu, vld1q_f32(up + i)));
  }
  for (; i < n; ++i) out[i] = gate[i] / (1.0f + fast_expf(0.0f - gate[i])) * up[i];
}

void silu(const float* x, float* out, int64_t n) {
  const float32x4_t one = vdupq_n_f32(1.0f);
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes) {
    const float32x4_t g = vld1q_f32(x + i);
    vst1q_f32(out + i, vdivq_f32(g, vaddq_f32(one, exp4(vsubq_f32(vdupq_n_f32(0.0f), g)))));
  }
  for (; i < n; ++i) out[i] = x[i] / (1.0f + fast_expf(0.0f - x[i]));
}

namespace {
// ref::delta_step's dot: lanes 0-15 in four registers, products and sums rounded apart.
float dot16(const float* x, const float* y, int n) {
  float32x4_t e[4] = {vdupq_n_f32(0.0f), vdupq_n_f32(0.0f), vdupq_n_f32(0.0f), vdupq_n_f32(0.0f)};
  for (int i = 0; i < n; i += 16) {
    for (int q = 0; q < 4; ++q) e[q] = vaddq_f32(e[q], vmulq_f32(vld1q_f32(x + i + q * kLanes), vld1q_f32(y + i + q * kLanes)));
  }
  return reduce16(e);
}
}  // namespace

void delta_step(float* state, int s, const float* q, const float* k, const float* v, float decay, float beta,
                float scale, float* out) {
  for (int i = 0; i < s * s; i += kLanes) vst1q_f32(state + i, vmulq_n_f32(vld1q_f32(state + i), decay));
  for (int j = 0; j < s; ++j) {
    float* row = state + static_cast<size_t>(j) * s;
    const float delta = (v[j] - dot16(row, k, s)) * beta;
    for (int i = 0; i < s; i += kLanes) vst1q_f32(row + i, vaddq_f32(vld1q_f32(row + i), vmulq_n_f32(vld1q_f32(k + i), delta)));
  }
  for (int j = 0; j < s; ++j) out[j] = dot16(state + static_cast<size_t>(j) * s, q, s) * scale;
}

}  // namespace bmoe::neon

#endif  // __aarch64__
