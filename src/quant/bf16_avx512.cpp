// BF16 tile kernel for prompt batches on CPUs with AVX-512 (VL): four weight rows against four
// activation rows per register block, on ymm. Each output is avx2::dot_bf16's computation
// exactly (eight f32 lanes, each a fused multiply-add chain over the elements i = lane mod 8 in
// order, the same horizontal sum, the same scalar tail), so the results equal the AVX2 tile's
// and the one-row kernel's bit for bit. What changes is the reuse: AVX2's sixteen registers fit
// one weight row against eight activation rows, converting nine bf16 vectors per eight fmas;
// AVX-512's thirty-two ymm registers hold a 4 x 4 block, eight conversions per sixteen fmas,
// and four activation rows (32 KiB at 4096 columns) stay in L1 while the chunk's weight rows
// come from L2. (DeepSeek-V4's BF16 attention and shared expert are most of its prompt time.)
#if defined(__x86_64__)

#include <immintrin.h>

#include <algorithm>

#include "core/fp16.h"
#include "quant/simd_kernels.h"

#include "quant/isa_target.h"
BMOE_ISA512_BEGIN("avx2,fma,f16c,avx512f,avx512bw,avx512vl")

#include "quant/x86_shared.h"  // after the target pragma: compiled for AVX-512 here

namespace bmoe::avx512 {
namespace {

using x86::hsum;
using x86::load_bf16x8;

constexpr int kBlock = 4;  // weight rows and activation rows per register block

// out[r * A + t] = dot(weight row r, activation row t) for R rows and A activations.
template <int R, int A>
void bf16_block(const uint16_t* const* x, const uint16_t* const* y, int64_t n, float* out) {
  __m256 acc[R][A];
#pragma GCC unroll 4
  for (int r = 0; r < R; ++r) {
#pragma GCC unroll 4
    for (int t = 0; t < A; ++t) acc[r][t] = _mm256_setzero_ps();
  }
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    __m256 yv[A];
#pragma GCC unroll 4
    for (int t = 0; t < A; ++t) yv[t] = load_bf16x8(y[t] + i);
#pragma GCC unroll 4
    for (int r = 0; r < R; ++r) {
      const __m256 xv = load_bf16x8(x[r] + i);
#pragma GCC unroll 4
      for (int t = 0; t < A; ++t) acc[r][t] = _mm256_fmadd_ps(xv, yv[t], acc[r][t]);
    }
  }
  for (int r = 0; r < R; ++r) {
    for (int t = 0; t < A; ++t) {
      float sum = hsum(acc[r][t]);
      for (int64_t j = i; j < n; ++j) sum += bf16_to_fp32(x[r][j]) * bf16_to_fp32(y[t][j]);
      out[r * A + t] = sum;
    }
  }
}

}  // namespace

void dot_tile_bf16(const void* w, size_t stride, int64_t rows, const void* const* acts, int64_t n_act, int64_t n,
                   float* out, int64_t out_stride) {
  const auto* base = static_cast<const uint8_t*>(w);
  const int64_t whole = n_act / kBlock * kBlock;
  for (int64_t a0 = 0; a0 < whole; a0 += kBlock) {
    const uint16_t* y[kBlock];
    for (int t = 0; t < kBlock; ++t) y[t] = static_cast<const uint16_t*>(acts[a0 + t]);
    float result[kBlock * kBlock];
    int64_t r = 0;
    for (; r + kBlock <= rows; r += kBlock) {
      const uint16_t* x[kBlock];
      for (int k = 0; k < kBlock; ++k) x[k] = reinterpret_cast<const uint16_t*>(base + (r + k) * stride);
      bf16_block<kBlock, kBlock>(x, y, n, result);
      for (int k = 0; k < kBlock; ++k) {
        for (int t = 0; t < kBlock; ++t) out[(a0 + t) * out_stride + r + k] = result[k * kBlock + t];
      }
    }
    for (; r < rows; ++r) {
      const uint16_t* x[1] = {reinterpret_cast<const uint16_t*>(base + r * stride)};
      bf16_block<1, kBlock>(x, y, n, result);
      for (int t = 0; t < kBlock; ++t) out[(a0 + t) * out_stride + r] = result[t];
    }
  }
  // The last n_act % 4 activation rows: the AVX2 tile (the same results).
  if (whole < n_act) avx2::dot_tile_bf16(w, stride, rows, acts + whole, n_act - whole, n, out + whole * out_stride, out_stride);
}

}  // namespace bmoe::avx512

BMOE_ISA_END()

#endif  // __x86_64__
