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

namespace bmoe::x86 {
namespace {

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

}  // namespace
}  // namespace bmoe::x86

#endif  // __x86_64__
