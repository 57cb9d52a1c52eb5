// The body of f16_flash_keys (quant.h) for x86, included by flash_avx2.cpp (BMOE_FLASH_WIDE 0:
// 8-lane AVX2 + FMA + F16C) and flash_avx512.cpp (1: the dot products and the f16 running sums
// on 16 lanes) after their target pragmas. Both are bit for bit the composition of
// avx2::dot_f16, std::exp, avx2::f16_scale and avx2::f16_fma_into that the generic path calls
// once per key and head. What they save is conversions: the queries go to f32 once per call,
// each key and value row once per key for all the heads that share it (the generic path
// converts the query, the key and the value again for every head), and up to four (eight)
// heads take their dot products from one load of the key. f16 -> f32 is exact, so an f32 copy
// multiplies and adds exactly as the converted row did; a 16-lane step is two 8-lane steps.
#pragma once

#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "core/fp16.h"
#include "quant/quant.h"

namespace bmoe::BMOE_FLASH_NS {
using namespace bmoe::x86;
namespace {

void f16_to_f32(const uint16_t* h, float* out, int64_t n) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) _mm256_storeu_ps(out + i, load_f16x8(h + i));
  for (; i < n; ++i) out[i] = f16(h[i]);
}

// The rows of a key this many positions ahead are requested while this one is worked on: a
// head's rows lie a whole position's row apart, a stride the hardware prefetcher follows late.
constexpr int kPrefetchKeys = 8;

void prefetch_row(const uint16_t* row, int64_t n) {
  const auto* c = reinterpret_cast<const char*>(row);
  for (int64_t off = 0; off < n * 2; off += 64) _mm_prefetch(c + off, _MM_HINT_T0);
}

// avx2::dot_f16(k, q_h) for H heads whose queries lie dk apart: two 8-lane accumulators over
// 16-element steps, an 8-element step into the first, hsum(first + second), then the scalar
// tail, in that order. The wide form keeps the two accumulators as the halves of one 16-lane
// register: lane for lane the same fused multiply-adds.
template <int H>
void dot_heads(const float* k, const float* q, int64_t dk, float* out) {
  __m256 a0[H], a1[H];
  int64_t i = 0;
#if BMOE_FLASH_WIDE
  __m512 a[H];
#pragma GCC unroll 8  // every loop over the heads unrolled: the accumulators stay in registers
  for (int h = 0; h < H; ++h) a[h] = _mm512_setzero_ps();
  for (; i + 16 <= dk; i += 16) {
    const __m512 kz = _mm512_loadu_ps(k + i);
#pragma GCC unroll 8
    for (int h = 0; h < H; ++h) a[h] = _mm512_fmadd_ps(kz, _mm512_loadu_ps(q + h * dk + i), a[h]);
  }
#pragma GCC unroll 8
  for (int h = 0; h < H; ++h) {
    a0[h] = _mm512_castps512_ps256(a[h]);
    a1[h] = _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(a[h]), 1));
  }
#else
#pragma GCC unroll 4  // every loop over the heads unrolled: the accumulators stay in registers
  for (int h = 0; h < H; ++h) a0[h] = a1[h] = _mm256_setzero_ps();
  for (; i + 16 <= dk; i += 16) {
    const __m256 k0 = _mm256_loadu_ps(k + i), k1 = _mm256_loadu_ps(k + i + 8);
#pragma GCC unroll 4
    for (int h = 0; h < H; ++h) {
      a0[h] = _mm256_fmadd_ps(k0, _mm256_loadu_ps(q + h * dk + i), a0[h]);
      a1[h] = _mm256_fmadd_ps(k1, _mm256_loadu_ps(q + h * dk + i + 8), a1[h]);
    }
  }
#endif
  for (; i + 8 <= dk; i += 8) {
    const __m256 k0 = _mm256_loadu_ps(k + i);
#pragma GCC unroll 8
    for (int h = 0; h < H; ++h) a0[h] = _mm256_fmadd_ps(k0, _mm256_loadu_ps(q + h * dk + i), a0[h]);
  }
#pragma GCC unroll 8
  for (int h = 0; h < H; ++h) {
    float sum = hsum(_mm256_add_ps(a0[h], a1[h]));
    for (int64_t j = i; j < dk; ++j) sum += k[j] * q[h * dk + j];
    out[h] = sum;
  }
}

void dot_heads(const float* k, const float* q, int64_t dk, int heads, float* out) {
  switch (heads) {
    case 1: return dot_heads<1>(k, q, dk, out);
    case 2: return dot_heads<2>(k, q, dk, out);
    case 3: return dot_heads<3>(k, q, dk, out);
#if BMOE_FLASH_WIDE
    case 4: return dot_heads<4>(k, q, dk, out);
    case 5: return dot_heads<5>(k, q, dk, out);
    case 6: return dot_heads<6>(k, q, dk, out);
    case 7: return dot_heads<7>(k, q, dk, out);
    default: return dot_heads<8>(k, q, dk, out);
#else
    default: return dot_heads<4>(k, q, dk, out);
#endif
  }
}

// acc = f16(acc * ms) when ms != 1 (a new maximum), then acc = f16(fma(v, vs, acc)): the two
// passes of f16_scale and f16_fma_into in one, each step rounded to f16 as they round it.
void update_acc(uint16_t* acc, const float* v, bool rescale, float ms, float vs, int64_t dv) {
  const __m256 vms = _mm256_set1_ps(ms), vvs = _mm256_set1_ps(vs);
  int64_t i = 0;
#if BMOE_FLASH_WIDE
  const __m512 wms = _mm512_set1_ps(ms), wvs = _mm512_set1_ps(vs);
  for (; i + 16 <= dv; i += 16) {
    __m512 a = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(acc + i)));
    if (rescale) a = _mm512_cvtph_ps(_mm512_cvtps_ph(_mm512_mul_ps(a, wms), _MM_FROUND_TO_NEAREST_INT));
    a = _mm512_fmadd_ps(_mm512_loadu_ps(v + i), wvs, a);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(acc + i), _mm512_cvtps_ph(a, _MM_FROUND_TO_NEAREST_INT));
  }
#endif
  for (; i + 8 <= dv; i += 8) {
    __m256 a = load_f16x8(acc + i);
    if (rescale) a = _mm256_cvtph_ps(_mm256_cvtps_ph(_mm256_mul_ps(a, vms), _MM_FROUND_TO_NEAREST_INT));
    a = _mm256_fmadd_ps(_mm256_loadu_ps(v + i), vvs, a);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(acc + i), _mm256_cvtps_ph(a, _MM_FROUND_TO_NEAREST_INT));
  }
  for (; i < dv; ++i) {
    if (rescale) acc[i] = fp32_to_fp16(f16(acc[i]) * ms);
    acc[i] = fp32_to_fp16(std::fma(v[i], vs, f16(acc[i])));
  }
}

// One key of one head: ggml's online softmax step (see quant.h).
void softmax_step(float s, const float* v, int64_t dv, float& max, float& sum, uint16_t* acc) {
  float ms = 1.0f, vs = 1.0f;
  const bool rescale = s > max;
  if (rescale) {
    ms = std::exp(max - s);
    max = s;
  } else {
    vs = std::exp(s - max);
  }
  update_acc(acc, v, rescale, ms, vs, dv);
  sum = sum * ms + vs;
}

}  // namespace

void f16_flash_keys(const F16FlashArgs& a, int n_keys, float* max, float* sum, uint16_t* acc) {
  const int64_t dk = a.dk, dv = a.dv;
  thread_local std::vector<float> buf;
  buf.resize(static_cast<size_t>(a.heads * dk + dk + dv));
  float* const qf = buf.data();
  float* const kf = qf + a.heads * dk;
  float* const vf = kf + dk;
  f16_to_f32(a.q, qf, a.heads * dk);
  // AVX2: 8 accumulators and the key's two halves in 16 registers; AVX-512: 8 + 1 of 32.
  constexpr int kHeadsPerDot = BMOE_FLASH_WIDE ? 8 : 4;
  for (int j = 0; j < n_keys; ++j) {
    if (j + kPrefetchKeys < n_keys) {
      prefetch_row(a.k + static_cast<size_t>(j + kPrefetchKeys) * a.k_stride, dk);
      prefetch_row(a.v + static_cast<size_t>(j + kPrefetchKeys) * a.v_stride, dv);
    }
    f16_to_f32(a.k + static_cast<size_t>(j) * a.k_stride, kf, dk);
    f16_to_f32(a.v + static_cast<size_t>(j) * a.v_stride, vf, dv);
    for (int h0 = 0; h0 < a.heads; h0 += kHeadsPerDot) {
      const int hn = std::min(kHeadsPerDot, a.heads - h0);
      float s[kHeadsPerDot];
      dot_heads(kf, qf + h0 * dk, dk, hn, s);
      for (int h = h0; h < h0 + hn; ++h) {
        float x = s[h - h0] * a.scale;
        if (a.softcap != 0.0f) x = a.softcap * std::tanh(x);
        softmax_step(x, vf, dv, max[h], sum[h], acc + h * dv);
      }
    }
  }
}

}  // namespace bmoe::BMOE_FLASH_NS
