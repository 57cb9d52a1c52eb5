// Helpers shared by the x86 kernel files (quant_avx2.cpp, quant_avx512.cpp). Include it after
// the file's target pragma: every function here is compiled with that file's ISA. Internal
// linkage on purpose: an inline function with external linkage compiled once for AVX2 and once
// for AVX-512 would be merged by the linker, and the AVX2 path could end up with the AVX-512
// copy (an illegal instruction on CPUs without it).
#pragma once

#if defined(__x86_64__)

#include <immintrin.h>

#include <cstdint>
#include <cstring>

#include "quant/blocks.h"

// How the including file's kernels do their int8 multiply-adds: 0 maddubs + madd (+ add), 1
// AVX-VNNI (VEX vpdpbusd / vpdpwssd on ymm), 2 AVX-512 VNNI (EVEX, with VL for ymm). The int32
// lanes are the same in every form: vpdpbusd sums the four u8 x s8 products that maddubs + madd
// sum, and maddubs never saturates on what the kernels pass it (|pair| <= 2 x 128 x 128 only
// at -32768, which fits: quants are unsigned <= 63, or |x| <= 128 against a signed byte).
#ifndef BMOE_X86_VNNI
#define BMOE_X86_VNNI 0
#endif

namespace bmoe::x86 {
namespace {

// Per int32 lane, the sum of its four u8 x s8 products.
inline __m256i dot4_u8s8(__m256i u, __m256i s) {
#if BMOE_X86_VNNI == 1
  return _mm256_dpbusd_avx_epi32(_mm256_setzero_si256(), u, s);
#elif BMOE_X86_VNNI == 2
  return _mm256_dpbusd_epi32(_mm256_setzero_si256(), u, s);
#else
  return _mm256_madd_epi16(_mm256_maddubs_epi16(u, s), _mm256_set1_epi16(1));
#endif
}

// acc + madd(a, b): int16 products summed in pairs into the int32 lanes.
inline __m256i madd16_add(__m256i acc, __m256i a, __m256i b) {
#if BMOE_X86_VNNI == 1
  return _mm256_dpwssd_avx_epi32(acc, a, b);
#elif BMOE_X86_VNNI == 2
  return _mm256_dpwssd_epi32(acc, a, b);
#else
  return _mm256_add_epi32(acc, _mm256_madd_epi16(a, b));
#endif
}

// Horizontal sum in the association ggml uses: (a0+a4 + a2+a6) + (a1+a5 + a3+a7), so that sums
// of the same lanes round identically.
inline float hsum(__m256 v) {
  __m128 r = _mm_add_ps(_mm256_extractf128_ps(v, 1), _mm256_castps256_ps128(v));
  r = _mm_add_ps(r, _mm_movehl_ps(r, r));
  r = _mm_add_ss(r, _mm_movehdup_ps(r));
  return _mm_cvtss_f32(r);
}

inline int hsum_i32(__m256i v) {
  __m128i s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
  s = _mm_add_epi32(s, _mm_shuffle_epi32(s, _MM_SHUFFLE(1, 0, 3, 2)));
  s = _mm_add_epi32(s, _mm_shuffle_epi32(s, _MM_SHUFFLE(2, 3, 0, 1)));
  return _mm_cvtsi128_si32(s);
}

inline float f16(uint16_t h) { return _cvtsh_ss(h); }

// Weight rows stream from DRAM once per token, and the hardware prefetcher alone keeps too few
// lines in flight: measured here, the Q4_K kernel read a 150 MB matrix at 3.9 GB/s on one core,
// 10.8 GB/s with these prefetches 4 KiB ahead (1-2 KiB gave 7-8 GB/s, 16 KiB 7.4 GB/s).
constexpr int kPrefetchAhead = 4096;
template <size_t kBytes = 64, int kAhead = kPrefetchAhead>
inline void prefetch_ahead(const void* p) {
  const char* c = static_cast<const char*>(p) + kAhead;
  for (size_t off = 0; off < kBytes; off += 64) _mm_prefetch(c + off, _MM_HINT_T0);
}

// Unpacks a K-quant block's eight 6-bit scales and mins into two 8 x int16 vectors, with word
// arithmetic on the 12 packed bytes (scales 0-3 and mins 0-3 are the low 6 bits of bytes 0-7;
// scales/mins 4-7 take their low nibbles from bytes 8-11 and their top bits from bytes 0-7).
inline void k_scales_mins(const uint8_t* packed, __m128i& scales16, __m128i& mins16) {
  uint32_t w[3];
  std::memcpy(w, packed, 12);
  const uint32_t sc_lo = w[0] & 0x3F3F3F3Fu;
  const uint32_t m_lo = w[1] & 0x3F3F3F3Fu;
  const uint32_t sc_hi = (w[2] & 0x0F0F0F0Fu) | (((w[0] >> 6) & 0x03030303u) << 4);
  const uint32_t m_hi = ((w[2] >> 4) & 0x0F0F0F0Fu) | (((w[1] >> 6) & 0x03030303u) << 4);
  const __m128i bytes = _mm_set_epi32(static_cast<int>(m_hi), static_cast<int>(m_lo), static_cast<int>(sc_hi), static_cast<int>(sc_lo));
  scales16 = _mm_cvtepu8_epi16(bytes);
  mins16 = _mm_cvtepu8_epi16(_mm_srli_si128(bytes, 8));
}

// sum_j min_j * (bsums[2j] + bsums[2j+1])
inline int k_min_term(__m128i mins16, const int16_t* bsums) {
  const __m256i b = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(bsums));
  const __m256i pair_sums = _mm256_madd_epi16(b, _mm256_set1_epi16(1));  // 8 x int32
  const __m128i packed = _mm_packs_epi32(_mm256_castsi256_si128(pair_sums),
                                         _mm256_extracti128_si256(pair_sums, 1));
  const __m128i prod = _mm_madd_epi16(packed, mins16);
  __m128i s = _mm_add_epi32(prod, _mm_shuffle_epi32(prod, _MM_SHUFFLE(1, 0, 3, 2)));
  s = _mm_add_epi32(s, _mm_shuffle_epi32(s, _MM_SHUFFLE(2, 3, 0, 1)));
  return _mm_cvtsi128_si32(s);
}

// Sum of products of 32 signed bytes, as 8 int32 lanes. maddubs needs an unsigned left
// operand, so move x's sign onto y: |x| * (y * sign(x)).
inline __m256i dot_i8_pairs(__m256i x, __m256i y) {
  const __m256i ax = _mm256_sign_epi8(x, x);
  const __m256i sy = _mm256_sign_epi8(y, x);
  return dot4_u8s8(ax, sy);
}

// 32 nibbles of 16 bytes: low nibbles in the first 16 lanes, high nibbles in the last 16.
inline __m256i unpack_nibbles(const uint8_t* p) {
  const __m128i bytes = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  const __m256i both = _mm256_set_m128i(_mm_srli_epi16(bytes, 4), bytes);
  return _mm256_and_si256(both, _mm256_set1_epi8(0x0F));
}

inline __m256 load_f16x8(const uint16_t* p) {
  return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
}

inline __m256 load_bf16x8(const uint16_t* p) {
  const __m256i wide = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  return _mm256_castsi256_ps(_mm256_slli_epi32(wide, 16));
}

// The eight int32-lane sums of eight rows, each reduced to one int32: out lane k = sum of s[k].
// Integer sums are exact, so the association does not matter. (Adding the maddubs outputs in
// int16 first, exact for these ranges, takes fewer instructions but was not faster on Zen.)
inline __m256i hsum8_i32(const __m256i s[8]) {
  const __m256i r0123 = _mm256_hadd_epi32(_mm256_hadd_epi32(s[0], s[1]), _mm256_hadd_epi32(s[2], s[3]));
  const __m256i r4567 = _mm256_hadd_epi32(_mm256_hadd_epi32(s[4], s[5]), _mm256_hadd_epi32(s[6], s[7]));
  // Each 128-bit half now holds rows 0-3 (or 4-7) of that half's lanes: add the halves.
  return _mm256_add_epi32(_mm256_permute2x128_si256(r0123, r4567, 0x20),
                          _mm256_permute2x128_si256(r0123, r4567, 0x31));
}

// e8m0_to_fp32_half on eight exponents (int32 lanes), bit for bit.
inline __m256 e8m0_half_x8(__m256i e) {
  const __m256i tiny = _mm256_sllv_epi32(_mm256_set1_epi32(0x00200000), e);  // e = 0 or 1
  const __m256i normal = _mm256_slli_epi32(_mm256_sub_epi32(e, _mm256_set1_epi32(1)), 23);
  const __m256i is_tiny = _mm256_cmpgt_epi32(_mm256_set1_epi32(2), e);
  return _mm256_castsi256_ps(_mm256_blendv_epi8(normal, tiny, is_tiny));
}

// 32 nibbles of 16 bytes as dot_rows_blocks wants them: the 16 bytes loaded into both halves,
// the high half shifted right by 4 (one variable shift instead of a lane insert).
inline __m256i unpack_nibbles_broadcast(const uint8_t* p) {
  const __m256i both = _mm256_broadcastsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  const __m256i shifted = _mm256_srlv_epi64(both, _mm256_setr_epi64x(0, 0, 4, 4));
  return _mm256_and_si256(shifted, _mm256_set1_epi8(0x0F));
}

// acc + the weighted sum of two 32-element sub-blocks: scale0 * <lo, q8a> + scale1 * <hi, q8b>,
// where lo/hi hold unsigned quants (< 128).
inline __m256i k_pair_add(__m256i acc, __m256i lo, __m256i hi, const int8_t* q8, int16_t scale0, int16_t scale1) {
  const __m256i y0 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(q8));
  const __m256i y1 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(q8 + 32));
  acc = madd16_add(acc, _mm256_maddubs_epi16(lo, y0), _mm256_set1_epi16(scale0));
  return madd16_add(acc, _mm256_maddubs_epi16(hi, y1), _mm256_set1_epi16(scale1));
}

// Q6_K's -32 per quant comes back through the activation sums: 32 * madd(bsums, scales16) is
// taken off each lane. This is -32 * scale as int16 (|scale| <= 128: fits), so that
// madd16_add(lanes, bsums, it) does the subtraction in one multiply-add (the same integers).
inline __m256i q6_neg32_scales(__m256i scales16) {
  return _mm256_sub_epi16(_mm256_setzero_si256(), _mm256_slli_epi16(scales16, 5));
}

// pshufb indices that fill the low 128-bit lane with int16 scale 2 * part of a lane's eight
// and the high lane with scale 2 * part + 1: one shuffle per 32 quants instead of two scalar
// broadcasts and an insert (Q6_K 15.5-17.5 -> 19.7 GB/s in L2 on AMD EPYC, same results).
inline __m256i q6_scale_pick(int part) {
  const __m256i first = _mm256_setr_epi8(0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1,
                                         2, 3, 2, 3, 2, 3, 2, 3, 2, 3, 2, 3, 2, 3, 2, 3);
  return _mm256_add_epi8(first, _mm256_set1_epi8(static_cast<char>(4 * part)));
}

// The four 32-quant parts of one half (128 quants) of a Q6_K block, unsigned (0..63): part p
// takes the low (p < 2) or high (p >= 2) nibbles of the half's first (p even) or second 32 ql
// bytes, and bits 2p..2p+1 of its 32 qh bytes on top.
inline void q6_K_parts(const BlockQ6_K& blk, int half, __m256i parts[4]) {
  const __m256i low_mask = _mm256_set1_epi8(0x0F), two_bits = _mm256_set1_epi8(0x03);
  const uint8_t* ql = blk.ql + 64 * half;
  const __m256i l0 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(ql));
  const __m256i l1 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(ql + 32));
  const __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk.qh + 32 * half));
  auto high = [&](int shift) { return _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(h, shift), two_bits), 4); };
  parts[0] = _mm256_or_si256(_mm256_and_si256(l0, low_mask), high(0));
  parts[1] = _mm256_or_si256(_mm256_and_si256(l1, low_mask), high(2));
  parts[2] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l0, 4), low_mask), high(4));
  parts[3] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l1, 4), low_mask), high(6));
}

}  // namespace
}  // namespace bmoe::x86

#endif  // __x86_64__
