// AVX-512 (F + BW) versions of the K-quant dot products that dominate decode: Q6_K (output
// heads, down projections) and Q4_K (most expert and attention matrices of a Q4_K_M file).
// They are installed in the AVX2 kernel table where the CPU has AVX-512 (dispatch.cpp), and
// they return exactly what the AVX2 kernels return: every 512-bit integer sum is folded to the
// same int32 lanes (or the same single int32) the AVX2 kernel forms, before the same float
// operations in the same order. Integer sums are exact, so only which products land in which
// lane matters, not the order they were added in.
//
// Why: the AVX2 Q6_K kernel is compute-bound (19.7 GB/s of weights in L2 on one AMD EPYC core),
// and on CPUs with full-width 512-bit units (AMD Zen 5, Intel server cores) a 512-bit multiply-
// add costs the same as a 256-bit one: half the instructions for the same bytes.
#if defined(__x86_64__)

#include <immintrin.h>

#include <cmath>
#include <cstring>

#include "quant/blocks.h"
#include "quant/quant.h"
#include "quant/simd_kernels.h"

#if defined(__clang__)
#pragma clang attribute push(__attribute__((target("avx2,fma,f16c,avx512f,avx512bw"))), apply_to = function)
#else
#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c,avx512f,avx512bw")
// GCC 12's AVX-512 intrinsics fill their unused merge operand with _mm512_undefined_*(), which
// its own -Wmaybe-uninitialized then reports at each use (a known false positive).
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif

#include "quant/x86_shared.h"  // after the target pragma: compiled for AVX-512 here

namespace bmoe::avx512 {
using namespace bmoe::x86;
namespace {

// vpermw indices: int16 lane i takes scale first + i / lanes_per_scale.
inline __m512i repeat_scales(int first, int lanes_per_scale) {
  alignas(64) int16_t idx[32];
  for (int i = 0; i < 32; ++i) idx[i] = static_cast<int16_t>(first + i / lanes_per_scale);
  return _mm512_load_si512(idx);
}

// The low 256 bits plus the high 256 bits: lane j of the result sums lanes j and j + 8.
inline __m256i fold_halves(__m512i v) {
  return _mm256_add_epi32(_mm512_castsi512_si256(v), _mm512_extracti64x4_epi64(v, 1));
}

}  // namespace

// Q6_K. The AVX2 kernel handles a half-block (128 quants) as four 32-quant parts: part p takes
// ql's low nibbles (p = 0, 1) or high nibbles (p = 2, 3) of the half's 64 ql bytes, and qh's
// bits 2p..2p+1. Here one 512-bit vector holds parts 0 and 1 (ql bytes 0-63 as they lie in
// memory) and another parts 2 and 3, so fold_halves() adds part 0's lane j to part 1's lane j
// (and 2's to 3's): the same eight int32 lanes the AVX2 kernel accumulates.
float dot_q6_K(const void* w, const void* a, int64_t n) {
  const auto* x = static_cast<const BlockQ6_K*>(w);
  const auto* y = static_cast<const BlockQ8_K*>(a);
  const __m512i low_mask = _mm512_set1_epi8(0x0F);
  const __m512i two_bits = _mm512_set1_epi8(0x03);
  // qh bits 0-1 for part 0 and 2-3 for part 1 (qh sits in both 256-bit halves), 4-5 and 6-7
  // for parts 2 and 3. A 64-bit shift is fine: the two bits kept are the byte's own.
  const __m512i shift_01 = _mm512_setr_epi64(0, 0, 0, 0, 2, 2, 2, 2);
  const __m512i shift_23 = _mm512_setr_epi64(4, 4, 4, 4, 6, 6, 6, 6);
  // Sixteen quants share a scale: eight int16 lanes after maddubs. Half h, parts 2q and 2q+1
  // use scales 8h + 4q .. 8h + 4q + 3.
  const __m512i scale_pick[4] = {repeat_scales(0, 8), repeat_scales(4, 8), repeat_scales(8, 8), repeat_scales(12, 8)};
  __m256 acc = _mm256_setzero_ps();
  for (int64_t b = 0; b < n / kQK_K; ++b) {
    prefetch_ahead<sizeof(BlockQ6_K)>(x + b);
    const __m256i scales16 = _mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(x[b].scales)));
    const __m512i scales = _mm512_castsi256_si512(scales16);
    const __m256i bsums = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(y[b].bsums));
    const __m256i offset = _mm256_slli_epi32(_mm256_madd_epi16(bsums, scales16), 5);  // 32 * sum(sc * q8)
    __m512i isum = _mm512_setzero_si512();
    for (int half = 0; half < 2; ++half) {
      const __m512i ql = _mm512_loadu_si512(x[b].ql + 64 * half);
      const __m512i qh = _mm512_broadcast_i64x4(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(x[b].qh + 32 * half)));
      const __m512i q01 = _mm512_or_si512(_mm512_and_si512(ql, low_mask),
                                          _mm512_slli_epi16(_mm512_and_si512(_mm512_srlv_epi64(qh, shift_01), two_bits), 4));
      const __m512i q23 = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16(ql, 4), low_mask),
                                          _mm512_slli_epi16(_mm512_and_si512(_mm512_srlv_epi64(qh, shift_23), two_bits), 4));
      const int8_t* q8 = y[b].qs + 128 * half;
      const __m512i y01 = _mm512_loadu_si512(q8);
      const __m512i y23 = _mm512_loadu_si512(q8 + 64);
      const __m512i s01 = _mm512_permutexvar_epi16(scale_pick[2 * half], scales);
      const __m512i s23 = _mm512_permutexvar_epi16(scale_pick[2 * half + 1], scales);
      isum = _mm512_add_epi32(isum, _mm512_add_epi32(_mm512_madd_epi16(s01, _mm512_maddubs_epi16(q01, y01)),
                                                     _mm512_madd_epi16(s23, _mm512_maddubs_epi16(q23, y23))));
    }
    const __m256i isum8 = _mm256_sub_epi32(fold_halves(isum), offset);
    const float d = y[b].d * f16(x[b].d);
    acc = _mm256_fmadd_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(isum8), acc);
  }
  return hsum(acc);
}

// Q4_K. The AVX2 kernel reduces each block to one int32 before its float multiply-add, so any
// lane layout works here. Each 32-byte chunk c of qs holds sub-block 2c in its low nibbles and
// 2c+1 in its high ones: broadcast to both halves and shift the upper half by 4, and the vector
// holds 64 consecutive quants that meet 64 consecutive activations.
float dot_q4_K(const void* w, const void* a, int64_t n) {
  const auto* x = static_cast<const BlockQ4_K*>(w);
  const auto* y = static_cast<const BlockQ8_K*>(a);
  const __m512i low_mask = _mm512_set1_epi8(0x0F);
  const __m512i nibble_shift = _mm512_setr_epi64(0, 0, 0, 0, 4, 4, 4, 4);
  // Thirty-two quants share a scale: sixteen int16 lanes after maddubs.
  const __m512i scale_pick[4] = {repeat_scales(0, 16), repeat_scales(2, 16), repeat_scales(4, 16), repeat_scales(6, 16)};
  float acc = 0.0f, acc_min = 0.0f;
  for (int64_t b = 0; b < n / kQK_K; ++b) {
    prefetch_ahead<sizeof(BlockQ4_K)>(x + b);
    __m128i scales16, mins16;
    k_scales_mins(x[b].scales, scales16, mins16);
    const __m512i scales = _mm512_castsi128_si512(scales16);
    __m512i isum = _mm512_setzero_si512();
    for (int chunk = 0; chunk < 4; ++chunk) {
      const __m512i q = _mm512_broadcast_i64x4(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(x[b].qs + 32 * chunk)));
      const __m512i nibbles = _mm512_and_si512(_mm512_srlv_epi64(q, nibble_shift), low_mask);
      const __m512i qy = _mm512_loadu_si512(y[b].qs + 64 * chunk);
      const __m512i s = _mm512_permutexvar_epi16(scale_pick[chunk], scales);
      isum = _mm512_add_epi32(isum, _mm512_madd_epi16(s, _mm512_maddubs_epi16(nibbles, qy)));
    }
    acc = std::fma(static_cast<float>(_mm512_reduce_add_epi32(isum)), f16(x[b].d) * y[b].d, acc);
    acc_min = std::fma(static_cast<float>(k_min_term(mins16, y[b].bsums)), f16(x[b].dmin) * y[b].d, acc_min);
  }
  return acc - acc_min;
}

}  // namespace bmoe::avx512

#if defined(__clang__)
#pragma clang attribute pop
#else
#pragma GCC pop_options
#endif

#endif  // __x86_64__
