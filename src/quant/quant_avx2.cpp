// AVX2 + FMA + F16C dot products (x86-64). Compiled for that target function by function, so
// the rest of the binary stays baseline x86-64 and the dispatcher picks these at runtime.
// Integer sums inside blocks are exact, so results equal the scalar reference up to f32
// summation order across blocks.
#if defined(__x86_64__)

#include <immintrin.h>

#include <cmath>
#include <cstring>

#include "quant/blocks.h"
#include "quant/quant.h"
#include "quant/simd_kernels.h"

#include "quant/isa_target.h"
BMOE_ISA_BEGIN("avx2,fma,f16c")

#include "quant/x86_shared.h"  // after the target pragma: compiled for AVX2

// The integer one-row and eight-row kernels (maddubs + madd here).
#define BMOE_X86_ROWS_NS avx2
#include "quant/quant_x86_rows_kernels.h"

namespace bmoe::avx2 {
using namespace bmoe::x86;

// F32: 16 lanes of fused multiply-adds (two 8-lane halves) reduced pairwise, the order of
// llama.cpp's AVX-512 f32 GEMM kernel.
float dot_f32(const void* w, const void* a, int64_t n) {
  const auto* x = static_cast<const float*>(w);
  const auto* y = static_cast<const float*>(a);
  __m256 lo = _mm256_setzero_ps(), hi = _mm256_setzero_ps();
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    prefetch_ahead(x + i);
    lo = _mm256_fmadd_ps(_mm256_loadu_ps(x + i), _mm256_loadu_ps(y + i), lo);
    hi = _mm256_fmadd_ps(_mm256_loadu_ps(x + i + 8), _mm256_loadu_ps(y + i + 8), hi);
  }
  const __m256 t8 = _mm256_add_ps(hi, lo);
  const __m128 t4 = _mm_add_ps(_mm256_extractf128_ps(t8, 1), _mm256_castps256_ps128(t8));
  const __m128 t2 = _mm_add_ps(t4, _mm_shuffle_ps(t4, t4, _MM_SHUFFLE(1, 0, 3, 2)));
  float sum = _mm_cvtss_f32(t2) + _mm_cvtss_f32(_mm_shuffle_ps(t2, t2, _MM_SHUFFLE(1, 1, 1, 1)));
  for (; i < n; ++i) sum = std::fma(x[i], y[i], sum);
  return sum;
}

float dot_f16(const void* w, const void* a, int64_t n) {
  const auto* x = static_cast<const uint16_t*>(w);
  const auto* y = static_cast<const uint16_t*>(a);
  __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    prefetch_ahead(x + i);
    acc0 = _mm256_fmadd_ps(load_f16x8(x + i), load_f16x8(y + i), acc0);
    acc1 = _mm256_fmadd_ps(load_f16x8(x + i + 8), load_f16x8(y + i + 8), acc1);
  }
  for (; i + 8 <= n; i += 8) acc0 = _mm256_fmadd_ps(load_f16x8(x + i), load_f16x8(y + i), acc0);
  float sum = hsum(_mm256_add_ps(acc0, acc1));
  for (; i < n; ++i) sum += f16(x[i]) * f16(y[i]);
  return sum;
}

// F16 weights against f32 activations (llama.cpp's f16 x f32 GEMM keeps the activations in
// f32): 16 lanes of fused multiply-adds reduced pairwise, like dot_f32.
float dot_f16_f32(const void* w, const void* a, int64_t n) {
  const auto* x = static_cast<const uint16_t*>(w);
  const auto* y = static_cast<const float*>(a);
  __m256 lo = _mm256_setzero_ps(), hi = _mm256_setzero_ps();
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    prefetch_ahead(x + i);
    lo = _mm256_fmadd_ps(load_f16x8(x + i), _mm256_loadu_ps(y + i), lo);
    hi = _mm256_fmadd_ps(load_f16x8(x + i + 8), _mm256_loadu_ps(y + i + 8), hi);
  }
  const __m256 t8 = _mm256_add_ps(hi, lo);
  const __m128 t4 = _mm_add_ps(_mm256_extractf128_ps(t8, 1), _mm256_castps256_ps128(t8));
  const __m128 t2 = _mm_add_ps(t4, _mm_shuffle_ps(t4, t4, _MM_SHUFFLE(1, 0, 3, 2)));
  float sum = _mm_cvtss_f32(t2) + _mm_cvtss_f32(_mm_shuffle_ps(t2, t2, _MM_SHUFFLE(1, 1, 1, 1)));
  for (; i < n; ++i) sum = std::fma(f16(x[i]), y[i], sum);
  return sum;
}

float dot_bf16(const void* w, const void* a, int64_t n) {
  const auto* x = static_cast<const uint16_t*>(w);
  const auto* y = static_cast<const uint16_t*>(a);
  __m256 acc = _mm256_setzero_ps();
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) acc = _mm256_fmadd_ps(load_bf16x8(x + i), load_bf16x8(y + i), acc);
  float sum = hsum(acc);
  for (; i < n; ++i) sum += bf16_to_fp32(x[i]) * bf16_to_fp32(y[i]);
  return sum;
}

// dot_bf16 on eight rows at once: each row's own accumulator takes dot_bf16's chain of fused
// multiply-adds (the same bits), the activation is widened once for the eight, and the eight
// chains hide each other's latency (one chain waits for every fma: 10.6 GB/s in cache on one
// AMD EPYC core). The same place in the next group of rows is prefetched, as dot_rows_blocks does.
void dot_rows_bf16(const void* w, size_t stride, const void* a, int64_t n, float* out) {
  const auto* base = static_cast<const uint8_t*>(w);
  const auto* y = static_cast<const uint16_t*>(a);
  const uint16_t* x[kDotRows];
  for (int k = 0; k < kDotRows; ++k) x[k] = reinterpret_cast<const uint16_t*>(base + k * stride);
  __m256 acc[kDotRows];
#pragma GCC unroll 8
  for (auto& v : acc) v = _mm256_setzero_ps();
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    if ((i & 31) == 0) {  // every 64 bytes of each row
#pragma GCC unroll 8
      for (int k = 0; k < kDotRows; ++k) prefetch_ahead<64, 0>(reinterpret_cast<const char*>(x[k] + i) + kDotRows * stride);
    }
    const __m256 yv = load_bf16x8(y + i);
#pragma GCC unroll 8
    for (int k = 0; k < kDotRows; ++k) acc[k] = _mm256_fmadd_ps(load_bf16x8(x[k] + i), yv, acc[k]);
  }
  for (int k = 0; k < kDotRows; ++k) {
    float sum = hsum(acc[k]);
    for (int64_t j = i; j < n; ++j) sum += bf16_to_fp32(x[k][j]) * bf16_to_fp32(y[j]);
    out[k] = sum;
  }
}

void f16_scale(uint16_t* acc, float s, int64_t n) {
  const __m256 vs = _mm256_set1_ps(s);
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256 a = _mm256_mul_ps(load_f16x8(acc + i), vs);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(acc + i), _mm256_cvtps_ph(a, _MM_FROUND_TO_NEAREST_INT));
  }
  for (; i < n; ++i) acc[i] = fp32_to_fp16(f16(acc[i]) * s);
}

void f16_fma_into(uint16_t* acc, const uint16_t* v, float s, int64_t n) {
  const __m256 vs = _mm256_set1_ps(s);
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256 a = _mm256_fmadd_ps(load_f16x8(v + i), vs, load_f16x8(acc + i));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(acc + i), _mm256_cvtps_ph(a, _MM_FROUND_TO_NEAREST_INT));
  }
  for (; i < n; ++i) acc[i] = fp32_to_fp16(std::fma(f16(v[i]), s, f16(acc[i])));
}

// Q8_K activations (ref::quantize_q8_K): the scale from the first element of largest magnitude,
// quants rounded to nearest even and capped at 127, sums of sixteen. Same bytes as the reference.
void quantize_q8_K(const float* src, void* dst, int64_t n) {
  auto* blocks = static_cast<BlockQ8_K*>(dst);
  const __m256 sign_bit = _mm256_set1_ps(-0.0f);
  for (int64_t b = 0; b < n / kQK_K; ++b) {
    const float* x = src + b * kQK_K;
    BlockQ8_K& y = blocks[b];
    __m256 vmax = _mm256_setzero_ps();
    // max(|x|, running): a NaN element loses, as `ax > amax` ignores it in the reference.
    for (int j = 0; j < kQK_K; j += 8) vmax = _mm256_max_ps(_mm256_andnot_ps(sign_bit, _mm256_loadu_ps(x + j)), vmax);
    __m128 m4 = _mm_max_ps(_mm256_extractf128_ps(vmax, 1), _mm256_castps256_ps128(vmax));
    m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
    const float amax = _mm_cvtss_f32(_mm_max_ss(m4, _mm_movehdup_ps(m4)));
    if (amax == 0.0f) {
      std::memset(&y, 0, sizeof y);
      continue;
    }
    float max = 0.0f;  // the first element whose magnitude is amax, with its sign
    for (int j = 0;; j += 8) {
      const __m256 v = _mm256_loadu_ps(x + j);
      const int hits = _mm256_movemask_ps(_mm256_cmp_ps(_mm256_andnot_ps(sign_bit, v), _mm256_set1_ps(amax), _CMP_EQ_OQ));
      if (hits != 0) {
        max = x[j + __builtin_ctz(static_cast<unsigned>(hits))];
        break;
      }
    }
    const float iscale = -127.0f / max;
    const __m256 vscale = _mm256_set1_ps(iscale);
    const __m256i cap = _mm256_set1_epi32(127);
    for (int j = 0; j < kQK_K; j += 32) {
      __m256i q[4];
      for (int k = 0; k < 4; ++k) {
        const __m256 scaled = _mm256_mul_ps(vscale, _mm256_loadu_ps(x + j + 8 * k));
        const __m256 ordered = _mm256_and_ps(scaled, _mm256_cmp_ps(scaled, scaled, _CMP_ORD_Q));  // NaN -> 0
        q[k] = _mm256_min_epi32(_mm256_cvtps_epi32(ordered), cap);
      }
      // packs interleaves 128-bit lanes; the permute puts the 32 bytes back in order.
      const __m256i q16a = _mm256_packs_epi32(q[0], q[1]), q16b = _mm256_packs_epi32(q[2], q[3]);
      const __m256i q8 = _mm256_permutevar8x32_epi32(_mm256_packs_epi16(q16a, q16b), _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(y.qs + j), q8);
    }
    for (int g = 0; g < kQK_K / 16; g += 2) {
      // Sixteen int8 -> int16 pairs summed: madd with ones gives int32 lanes of four; add up.
      const __m256i v = _mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(y.qs + 16 * g)));
      const __m256i w = _mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(y.qs + 16 * g + 16)));
      y.bsums[g] = static_cast<int16_t>(hsum_i32(_mm256_madd_epi16(v, _mm256_set1_epi16(1))));
      y.bsums[g + 1] = static_cast<int16_t>(hsum_i32(_mm256_madd_epi16(w, _mm256_set1_epi16(1))));
    }
    y.d = 1.0f / iscale;
  }
}

void dequantize_f16(const void* src, float* dst, int64_t n) {
  const auto* h = static_cast<const uint16_t*>(src);
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) _mm256_storeu_ps(dst + i, load_f16x8(h + i));
  for (; i < n; ++i) dst[i] = f16(h[i]);
}

void quantize_f16(const float* src, void* dst, int64_t n) {
  auto* h = static_cast<uint16_t*>(dst);
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m128i packed = _mm256_cvtps_ph(_mm256_loadu_ps(src + i), _MM_FROUND_TO_NEAREST_INT);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(h + i), packed);
  }
  for (; i < n; ++i) h[i] = fp32_to_fp16(src[i]);
}

}  // namespace bmoe::avx2

BMOE_ISA_END()

#endif  // __x86_64__
