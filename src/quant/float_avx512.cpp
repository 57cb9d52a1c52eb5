// AVX-512 f32 GEMM (float_kernels.h), equal to the scalar reference bit for bit: sixteen
// output elements per vector, each its own fused multiply-add chain in k order. On CPUs with
// full-width 512-bit units (AMD Zen 5, Intel server cores) twice the AVX2 kernel's work per
// instruction; the dispatcher installs it beside the AVX2 kernels where AVX-512 is present.
#if defined(__x86_64__)

#include <immintrin.h>

#include <cmath>

#include "quant/float_kernels.h"
#include "quant/simd_kernels.h"

#include "quant/isa_target.h"
BMOE_ISA512_BEGIN("avx2,fma,f16c,avx512f,avx512bw")

namespace bmoe::avx512 {
namespace {

constexpr int kLanes = 16;

// C[RM rows][RN x 16 columns] += A[RM x k] B[k x RN*16] with the accumulators in registers.
template <int RM, int RN>
void gemm_block(float* c, int64_t ldc, const float* a, int64_t lda, const float* b, int64_t ldb, int64_t k) {
  __m512 acc[RM][RN];
#pragma GCC unroll 8
  for (int i = 0; i < RM; ++i) {
#pragma GCC unroll 4
    for (int r = 0; r < RN; ++r) acc[i][r] = _mm512_loadu_ps(c + i * ldc + r * kLanes);
  }
  for (int64_t p = 0; p < k; ++p) {
    __m512 bv[RN];
#pragma GCC unroll 4
    for (int r = 0; r < RN; ++r) bv[r] = _mm512_loadu_ps(b + p * ldb + r * kLanes);
#pragma GCC unroll 8
    for (int i = 0; i < RM; ++i) {
      const __m512 av = _mm512_set1_ps(a[i * lda + p]);
#pragma GCC unroll 4
      for (int r = 0; r < RN; ++r) acc[i][r] = _mm512_fmadd_ps(av, bv[r], acc[i][r]);
    }
  }
#pragma GCC unroll 8
  for (int i = 0; i < RM; ++i) {
#pragma GCC unroll 4
    for (int r = 0; r < RN; ++r) _mm512_storeu_ps(c + i * ldc + r * kLanes, acc[i][r]);
  }
}

// All columns of RM rows: 32 at a time, then 16; the rest (fewer than 16) by the AVX2 kernel.
template <int RM>
void gemm_rows(float* c, int64_t ldc, const float* a, int64_t lda, const float* b, int64_t ldb, int64_t k,
               int64_t n) {
  int64_t j = 0;
  for (; j + 2 * kLanes <= n; j += 2 * kLanes) gemm_block<RM, 2>(c + j, ldc, a, lda, b + j, ldb, k);
  for (; j + kLanes <= n; j += kLanes) gemm_block<RM, 1>(c + j, ldc, a, lda, b + j, ldb, k);
  if (j < n) avx2::gemm_f32(c + j, ldc, a, lda, b + j, ldb, RM, k, n - j);
}

}  // namespace

void gemm_f32(float* c, int64_t ldc, const float* a, int64_t lda, const float* b, int64_t ldb, int64_t m,
              int64_t k, int64_t n) {
  constexpr int kRows = 8;  // 8 x 2 accumulators + 2 loads + 1 broadcast of the 32 registers
  int64_t i = 0;
  for (; i + kRows <= m; i += kRows) gemm_rows<kRows>(c + i * ldc, ldc, a + i * lda, lda, b, ldb, k, n);
  for (; i < m; ++i) gemm_rows<1>(c + i * ldc, ldc, a + i * lda, lda, b, ldb, k, n);
}

}  // namespace bmoe::avx512

BMOE_ISA_END()

#endif  // __x86_64__
