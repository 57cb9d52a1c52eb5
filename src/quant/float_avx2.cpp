// AVX2 + FMA versions of the f32 kernels (float_kernels.h), equal to the scalar reference bit
// for bit: eight (or sixteen) elements side by side, each with the reference's own chain of
// fused operations.
#if defined(__x86_64__)

#include <immintrin.h>

#include <cmath>

#include "quant/float_kernels.h"
#include "quant/simd_kernels.h"

#include "quant/isa_target.h"
BMOE_ISA_BEGIN("avx2,fma,f16c")

#include "quant/x86_shared.h"  // after the target pragma: compiled for AVX2

namespace bmoe::avx2 {
using namespace bmoe::x86;
namespace {

constexpr int kLanes = 8;

// C[RM rows][RN x 8 columns] += A[RM x k] B[k x RN*8]: RM x RN accumulators stay in registers
// (6 x 2 + 2 loads + 1 broadcast fit the 16 ymm registers).
template <int RM, int RN>
void gemm_block(float* c, int64_t ldc, const float* a, int64_t lda, const float* b, int64_t ldb, int64_t k) {
  __m256 acc[RM][RN];
  for (int i = 0; i < RM; ++i) {
    for (int r = 0; r < RN; ++r) acc[i][r] = _mm256_loadu_ps(c + i * ldc + r * kLanes);
  }
  for (int64_t p = 0; p < k; ++p) {
    __m256 bv[RN];
    for (int r = 0; r < RN; ++r) bv[r] = _mm256_loadu_ps(b + p * ldb + r * kLanes);
    for (int i = 0; i < RM; ++i) {
      const __m256 av = _mm256_broadcast_ss(a + i * lda + p);
      for (int r = 0; r < RN; ++r) acc[i][r] = _mm256_fmadd_ps(av, bv[r], acc[i][r]);
    }
  }
  for (int i = 0; i < RM; ++i) {
    for (int r = 0; r < RN; ++r) _mm256_storeu_ps(c + i * ldc + r * kLanes, acc[i][r]);
  }
}

// C[RM rows][cols < 8 columns] += A B: gemm_block<RM, 1> on the first `cols` lanes (masked loads
// and stores), each column the reference's chain of fused multiply-adds. The reference itself
// calls libm's fmaf per product (it is built without FMA), which took 5-8 % of a prompt where
// attention tiles end in ragged columns.
template <int RM>
void gemm_block_last(float* c, int64_t ldc, const float* a, int64_t lda, const float* b, int64_t ldb, int64_t k,
                     int64_t cols) {
  const __m256i mask = _mm256_cmpgt_epi32(_mm256_set1_epi32(static_cast<int>(cols)),
                                          _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
  __m256 acc[RM];
  for (int i = 0; i < RM; ++i) acc[i] = _mm256_maskload_ps(c + i * ldc, mask);
  for (int64_t p = 0; p < k; ++p) {
    const __m256 bv = _mm256_maskload_ps(b + p * ldb, mask);
    for (int i = 0; i < RM; ++i) acc[i] = _mm256_fmadd_ps(_mm256_broadcast_ss(a + i * lda + p), bv, acc[i]);
  }
  for (int i = 0; i < RM; ++i) _mm256_maskstore_ps(c + i * ldc, mask, acc[i]);
}

// All columns of RM rows: 16 at a time, then 8, then the last ones under a mask.
template <int RM>
void gemm_rows(float* c, int64_t ldc, const float* a, int64_t lda, const float* b, int64_t ldb, int64_t k,
               int64_t n) {
  int64_t j = 0;
  for (; j + 2 * kLanes <= n; j += 2 * kLanes) gemm_block<RM, 2>(c + j, ldc, a, lda, b + j, ldb, k);
  for (; j + kLanes <= n; j += kLanes) gemm_block<RM, 1>(c + j, ldc, a, lda, b + j, ldb, k);
  if (j < n) gemm_block_last<RM>(c + j, ldc, a, lda, b + j, ldb, k, n - j);
}

// fast_expf on eight lanes. Lanes far below the range (n < -192, including -inf) are 0 as in
// the reference; where a lane needs the reference's rare paths (a denormal or infinite result),
// all eight take the scalar function.
inline __m256 exp8(__m256 x) {
  const __m256 shift = _mm256_set1_ps(0x1.8p23f);
  const __m256 z = _mm256_fmadd_ps(x, _mm256_set1_ps(0x1.715476p+0f), shift);
  const __m256 n = _mm256_sub_ps(z, shift);
  const __m256 b = _mm256_fnmadd_ps(n, _mm256_set1_ps(0x1.7f7d1cp-20f), _mm256_fnmadd_ps(n, _mm256_set1_ps(0x1.62e4p-1f), x));
  const __m256 underflow = _mm256_cmp_ps(n, _mm256_set1_ps(-192.0f), _CMP_LT_OQ);
  const __m256 abs_n = _mm256_andnot_ps(_mm256_set1_ps(-0.0f), n);
  const __m256 rare = _mm256_andnot_ps(underflow, _mm256_cmp_ps(abs_n, _mm256_set1_ps(125.0f), _CMP_GT_OQ));
  if (_mm256_movemask_ps(rare) != 0) {
    alignas(32) float v[kLanes];
    _mm256_store_ps(v, x);
    for (float& e : v) e = fast_expf(e);
    return _mm256_load_ps(v);
  }
  const __m256 u = _mm256_mul_ps(b, b);
  const __m256 j = _mm256_fmadd_ps(
      _mm256_fmadd_ps(_mm256_fmadd_ps(_mm256_set1_ps(0x1.0e4020p-7f), b, _mm256_set1_ps(0x1.573e2ep-5f)), u,
                      _mm256_fmadd_ps(_mm256_set1_ps(0x1.555e66p-3f), b, _mm256_set1_ps(0x1.fffdb6p-2f))),
      u, _mm256_fmadd_ps(_mm256_set1_ps(0x1.ffffecp-1f), b, _mm256_set1_ps(1.0f)));
  // 2^n for |n| <= 125 is a normal float, so the product rounds once, as ldexp does.
  const __m256i exponent = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
  return _mm256_andnot_ps(underflow, _mm256_mul_ps(j, _mm256_castsi256_ps(exponent)));
}

}  // namespace

void gemm_f32(float* c, int64_t ldc, const float* a, int64_t lda, const float* b, int64_t ldb, int64_t m,
              int64_t k, int64_t n) {
  constexpr int kRows = 6;
  int64_t i = 0;
  for (; i + kRows <= m; i += kRows) gemm_rows<kRows>(c + i * ldc, ldc, a + i * lda, lda, b, ldb, k, n);
  for (; i < m; ++i) gemm_rows<1>(c + i * ldc, ldc, a + i * lda, lda, b, ldb, k, n);
}

double exp_sum(float* x, int64_t n, float max) {
  const __m256 vmax = _mm256_set1_ps(max);
  double sum = 0.0;
  for (int64_t i = 0; i + kExpSumBlock <= n; i += kExpSumBlock) {
    const __m256 lo = exp8(_mm256_sub_ps(_mm256_loadu_ps(x + i), vmax));
    const __m256 hi = exp8(_mm256_sub_ps(_mm256_loadu_ps(x + i + kLanes), vmax));
    _mm256_storeu_ps(x + i, lo);
    _mm256_storeu_ps(x + i + kLanes, hi);
    // ref::reduce16: lanes j and j + 8 first, then hsum's pairwise order.
    sum += static_cast<double>(hsum(_mm256_add_ps(hi, lo)));
  }
  return sum;
}

void swiglu(const float* gate, const float* up, float* out, int64_t n) {
  const __m256 one = _mm256_set1_ps(1.0f);
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes) {
    const __m256 g = _mm256_loadu_ps(gate + i);
    const __m256 silu = _mm256_div_ps(g, _mm256_add_ps(one, exp8(_mm256_sub_ps(_mm256_setzero_ps(), g))));
    _mm256_storeu_ps(out + i, _mm256_mul_ps(silu, _mm256_loadu_ps(up + i)));
  }
  for (; i < n; ++i) out[i] = gate[i] / (1.0f + fast_expf(0.0f - gate[i])) * up[i];
}

void silu(const float* x, float* out, int64_t n) {
  const __m256 one = _mm256_set1_ps(1.0f);
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes) {
    const __m256 g = _mm256_loadu_ps(x + i);
    _mm256_storeu_ps(out + i, _mm256_div_ps(g, _mm256_add_ps(one, exp8(_mm256_sub_ps(_mm256_setzero_ps(), g)))));
  }
  for (; i < n; ++i) out[i] = x[i] / (1.0f + fast_expf(0.0f - x[i]));
}

namespace {
// ref::delta_step's dot: lanes 0-7 and 8-15 in two registers, products and sums rounded apart.
float dot16(const float* x, const float* y, int n) {
  __m256 lo = _mm256_setzero_ps(), hi = _mm256_setzero_ps();
  for (int i = 0; i < n; i += 16) {
    lo = _mm256_add_ps(lo, _mm256_mul_ps(_mm256_loadu_ps(x + i), _mm256_loadu_ps(y + i)));
    hi = _mm256_add_ps(hi, _mm256_mul_ps(_mm256_loadu_ps(x + i + kLanes), _mm256_loadu_ps(y + i + kLanes)));
  }
  return hsum(_mm256_add_ps(hi, lo));  // ref::reduce16's order
}
}  // namespace

void delta_step(float* state, int s, const float* q, const float* k, const float* v, float decay, float beta,
                float scale, float* out) {
  const __m256 vdecay = _mm256_set1_ps(decay);
  for (int i = 0; i < s * s; i += kLanes) _mm256_storeu_ps(state + i, _mm256_mul_ps(_mm256_loadu_ps(state + i), vdecay));
  for (int j = 0; j < s; ++j) {
    float* row = state + static_cast<size_t>(j) * s;
    const __m256 delta = _mm256_set1_ps((v[j] - dot16(row, k, s)) * beta);
    for (int i = 0; i < s; i += kLanes) {
      _mm256_storeu_ps(row + i, _mm256_add_ps(_mm256_loadu_ps(row + i), _mm256_mul_ps(delta, _mm256_loadu_ps(k + i))));
    }
  }
  for (int j = 0; j < s; ++j) out[j] = dot16(state + static_cast<size_t>(j) * s, q, s) * scale;
}

}  // namespace bmoe::avx2

BMOE_ISA_END()

#endif  // __x86_64__
