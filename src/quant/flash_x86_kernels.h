// The body of f16_flash_keys (quant.h) for x86, included by flash_avx2.cpp (BMOE_FLASH_WIDE 0:
// 8-lane AVX2 + FMA + F16C) and flash_avx512.cpp (1: the dot products and the f16 running sums
// on 16 lanes) after their target pragmas. Both are bit for bit the composition of
// avx2::dot_f16, std::exp, avx2::f16_scale and avx2::f16_fma_into that the generic path calls
// once per key and head: per head and key the same operations in the same order, only grouped
// differently. What they save: the queries go to f32 once per call, each key and value row once
// per key for all the heads that share it; the keys go in chunks of kChunkKeys through three
// passes (scores, softmax steps, V sums; see below), so each pass keeps its state in registers;
// on 16 lanes two keys' dot products for 8 heads share their loads and are reduced together. f16
// -> f32 is exact, so an f32 copy multiplies and adds exactly as the converted row did; a
// 16-lane step is two 8-lane steps.
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

// A head's rows lie a whole position's row apart, a stride the hardware prefetcher follows
// late, so the next chunk's rows are requested (into L2) while this chunk's scores are worked
// on: by the time its conversion reads them, the whole chunk's work has covered the latency.
// An asm statement because GCC 12 dropped every _mm_prefetch / __builtin_prefetch of this file
// (the built kernel had none; seen 2026-12-07, not understood).
void prefetch_row(const uint16_t* row, int64_t n) {
  const auto* c = reinterpret_cast<const char*>(row);
  for (int64_t off = 0; off < n * 2; off += 64) asm volatile("prefetcht1 %0" : : "m"(c[off]));
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

// The keys are taken kChunkKeys at a time in three passes, each the same steps in the same order
// per head and key as ggml's loop (see quant.h): the chunk's scores for every head, then per
// head its softmax steps (the maxima, the exp arguments, libm expf, the weight sums), then per
// head and V element its running f16 sum over the chunk's keys. A pass on its own keeps its
// state in registers: the V sums, the f16 value rounded after every key, stay in f32 registers
// for a whole chunk instead of going through memory once per key and head, and the expf calls
// come one after another instead of between vector work that they would clobber.
constexpr int kChunkKeys = 32;

// Per head (kChunkKeys apart) and key of a chunk.
struct ChunkSteps {
  std::vector<float> s;   // scores, then exp arguments
  std::vector<float> ms;  // rescale of the V sum before the key (1: none)
  std::vector<float> vs;  // the key's weight
  std::vector<uint8_t> rescale;
  void resize(int heads) {
    const size_t n = static_cast<size_t>(heads) * kChunkKeys;
    s.resize(n);
    ms.resize(n);
    vs.resize(n);
    rescale.resize(n);
  }
  float* scores(int h) { return s.data() + static_cast<size_t>(h) * kChunkKeys; }
  size_t at(int h, int j) const { return static_cast<size_t>(h) * kChunkKeys + j; }
};

#if BMOE_FLASH_WIDE
using VecF = __m512;
constexpr int kLanes = 16;
inline VecF vload_f16(const uint16_t* p) { return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p))); }
inline void vstore_f16(uint16_t* p, VecF a) {
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), _mm512_cvtps_ph(a, _MM_FROUND_TO_NEAREST_INT));
}
inline VecF vround_f16(VecF a) { return _mm512_cvtph_ps(_mm512_cvtps_ph(a, _MM_FROUND_TO_NEAREST_INT)); }
inline VecF vload(const float* p) { return _mm512_loadu_ps(p); }
inline VecF vset1(float x) { return _mm512_set1_ps(x); }
inline VecF vmul(VecF a, VecF b) { return _mm512_mul_ps(a, b); }
inline VecF vfma(VecF a, VecF b, VecF c) { return _mm512_fmadd_ps(a, b, c); }
constexpr int kVHeads = 4;  // heads per V pass: 4 x 4 sums + 4 values + 4 weights of 32 registers
#else
using VecF = __m256;
constexpr int kLanes = 8;
inline VecF vload_f16(const uint16_t* p) { return load_f16x8(p); }
inline void vstore_f16(uint16_t* p, VecF a) {
  _mm_storeu_si128(reinterpret_cast<__m128i*>(p), _mm256_cvtps_ph(a, _MM_FROUND_TO_NEAREST_INT));
}
inline VecF vround_f16(VecF a) { return _mm256_cvtph_ps(_mm256_cvtps_ph(a, _MM_FROUND_TO_NEAREST_INT)); }
inline VecF vload(const float* p) { return _mm256_loadu_ps(p); }
inline VecF vset1(float x) { return _mm256_set1_ps(x); }
inline VecF vmul(VecF a, VecF b) { return _mm256_mul_ps(a, b); }
inline VecF vfma(VecF a, VecF b, VecF c) { return _mm256_fmadd_ps(a, b, c); }
constexpr int kVHeads = 2;  // 2 x 4 sums + 4 values + 2 weights of 16 registers
#endif
constexpr int kVVecs = 4;  // vectors of V elements per pass: 4 independent sums per head

#if BMOE_FLASH_WIDE
// Two keys' dot products with 8 heads, straight from the f16 rows (f16 -> f32 is exact): the
// same 16-lane steps as dot_heads<8>, then the 16 reductions hsum(lo + hi) at once, each sum as
// hsum adds it: (lo + hi), its two 128-bit halves, lanes 0,1 + 2,3, then lane 0 + lane 1.
// dk is a multiple of 16. out[j * 8 + h]: key j, head h.
void dot_two_keys_8_heads(const uint16_t* k0, const uint16_t* k1, const float* q, int64_t dk, float* out) {
  __m512 a[16];
#pragma GCC unroll 16
  for (int i = 0; i < 16; ++i) a[i] = _mm512_setzero_ps();
  for (int64_t i = 0; i < dk; i += 16) {
    const __m512 x0 = vload_f16(k0 + i), x1 = vload_f16(k1 + i);
#pragma GCC unroll 8
    for (int h = 0; h < 8; ++h) {
      const __m512 qh = _mm512_loadu_ps(q + h * dk + i);
      a[h] = _mm512_fmadd_ps(x0, qh, a[h]);
      a[8 + h] = _mm512_fmadd_ps(x1, qh, a[8 + h]);
    }
  }
  __m512 t[8], u[4], w[2];
#pragma GCC unroll 8
  for (int m = 0; m < 8; ++m)  // lanes 0-7: lo + hi of a[2m]; 8-15: of a[2m + 1]
    t[m] = _mm512_add_ps(_mm512_shuffle_f32x4(a[2 * m], a[2 * m + 1], 0x44), _mm512_shuffle_f32x4(a[2 * m], a[2 * m + 1], 0xEE));
#pragma GCC unroll 4
  for (int m = 0; m < 4; ++m)  // 128-bit lane q: the two halves of a[4m + q] added
    u[m] = _mm512_add_ps(_mm512_shuffle_f32x4(t[2 * m], t[2 * m + 1], 0x88), _mm512_shuffle_f32x4(t[2 * m], t[2 * m + 1], 0xDD));
#pragma GCC unroll 2
  for (int m = 0; m < 2; ++m)  // lanes 0,1 + lanes 2,3 of each
    w[m] = _mm512_add_ps(_mm512_shuffle_ps(u[2 * m], u[2 * m + 1], 0x44), _mm512_shuffle_ps(u[2 * m], u[2 * m + 1], 0xEE));
  // lane 0 + lane 1: lane 4q + k of r holds the sum of a[4k + q]
  const __m512 r = _mm512_add_ps(_mm512_shuffle_ps(w[0], w[1], 0x88), _mm512_shuffle_ps(w[0], w[1], 0xDD));
  alignas(64) float lanes[16];
  _mm512_store_ps(lanes, r);
#pragma GCC unroll 16
  for (int i = 0; i < 16; ++i) out[i] = lanes[(i % 4) * 4 + i / 4];
}
#endif

// The heads the two-key dot covers (a multiple of 8 on 16 lanes with whole 16-element steps);
// the others take dot_heads on an f32 copy of the key.
int paired_heads(const F16FlashArgs& a) {
#if BMOE_FLASH_WIDE
  if (a.dk % 16 == 0) return a.heads / 8 * 8;
#endif
  (void)a;
  return 0;
}

// Requests the K and V rows of key j when it exists.
void prefetch_key(const F16FlashArgs& a, int j, int n_keys) {
  if (j >= n_keys) return;
  prefetch_row(a.k + static_cast<size_t>(j) * a.k_stride, a.dk);
  prefetch_row(a.v + static_cast<size_t>(j) * a.v_stride, a.dv);
}

// The f32 copies of the chunk's V rows, and of the K rows if some heads need them (exact).
void convert_rows(const F16FlashArgs& a, int j0, int n, bool keys, float* kf, float* vf) {
  for (int j = 0; j < n; ++j) {
    if (keys) f16_to_f32(a.k + static_cast<size_t>(j0 + j) * a.k_stride, kf + static_cast<size_t>(j) * a.dk, a.dk);
    f16_to_f32(a.v + static_cast<size_t>(j0 + j) * a.v_stride, vf + static_cast<size_t>(j) * a.dv, a.dv);
  }
}

float capped(const F16FlashArgs& a, float dot) {
  const float x = dot * a.scale;
  return a.softcap != 0.0f ? a.softcap * std::tanh(x) : x;
}

// Pass 1: the scaled (and capped) score of every head and key of the chunk from key j0 on; the
// next chunk's rows are requested on the way.
void chunk_scores(const F16FlashArgs& a, const float* qf, const float* kf, int j0, int n, int n_keys, ChunkSteps& st) {
  constexpr int kHeadsPerDot = BMOE_FLASH_WIDE ? 8 : 4;
  const int paired = paired_heads(a);
  int j = 0;
#if BMOE_FLASH_WIDE
  for (; paired > 0 && j + 2 <= n; j += 2) {
    const uint16_t* k0 = a.k + static_cast<size_t>(j0 + j) * a.k_stride;
    prefetch_key(a, j0 + kChunkKeys + j, n_keys);
    prefetch_key(a, j0 + kChunkKeys + j + 1, n_keys);
    for (int h0 = 0; h0 < paired; h0 += 8) {
      float s[16];
      dot_two_keys_8_heads(k0, k0 + a.k_stride, qf + h0 * a.dk, a.dk, s);
      for (int h = 0; h < 8; ++h) {
        st.s[st.at(h0 + h, j)] = capped(a, s[h]);
        st.s[st.at(h0 + h, j + 1)] = capped(a, s[8 + h]);
      }
    }
  }
#endif
  for (int jj = 0; jj < n; ++jj) {  // the heads and keys the pairs did not cover
    if (jj >= j) prefetch_key(a, j0 + kChunkKeys + jj, n_keys);
    const int h_from = jj < j ? paired : 0;
    for (int h0 = h_from; h0 < a.heads; h0 += kHeadsPerDot) {
      const int hn = std::min(kHeadsPerDot, a.heads - h0);
      float s[kHeadsPerDot];
      dot_heads(kf + static_cast<size_t>(jj) * a.dk, qf + h0 * a.dk, a.dk, hn, s);
      for (int h = h0; h < h0 + hn; ++h) st.s[st.at(h, jj)] = capped(a, s[h - h0]);
    }
  }
}

// Pass 2: per head and key, a new maximum rescales the sum by exp(old - new) and the key weighs
// 1, otherwise the key weighs exp(s - max); the weight sum becomes sum * ms + vs. The loops run
// over the heads inside the keys, so the heads' chains of dependent steps overlap.
void chunk_softmax(int heads, int n, float* max, float* sum, ChunkSteps& st) {
  for (int j = 0; j < n; ++j) {
    for (int h = 0; h < heads; ++h) {
      const size_t at = st.at(h, j);
      const float s = st.s[at];
      st.rescale[at] = s > max[h];
      if (s > max[h]) {
        st.s[at] = max[h] - s;
        max[h] = s;
      } else {
        st.s[at] = s - max[h];
      }
    }
  }
  for (int h = 0; h < heads; ++h) {
    for (int j = 0; j < n; ++j) {
      const size_t at = st.at(h, j);
      const float e = std::exp(st.s[at]);
      st.ms[at] = st.rescale[at] ? e : 1.0f;
      st.vs[at] = st.rescale[at] ? 1.0f : e;
    }
  }
  for (int j = 0; j < n; ++j) {
    for (int h = 0; h < heads; ++h) sum[h] = sum[h] * st.ms[st.at(h, j)] + st.vs[st.at(h, j)];
  }
}

// Pass 3 for NH heads from h0 and NV vectors of V elements from d: per key, acc = f16(acc * ms)
// on a rescale, then acc = f16(fma(v, vs, acc)); the sums stay in registers for the chunk.
template <int NH, int NV>
void chunk_values(const ChunkSteps& st, int h0, int64_t d, const float* vf, int64_t dv, int n, uint16_t* acc) {
  VecF sums[NH][NV];
#pragma GCC unroll 4
  for (int h = 0; h < NH; ++h)
#pragma GCC unroll 4
    for (int i = 0; i < NV; ++i) sums[h][i] = vload_f16(acc + (h0 + h) * dv + d + i * kLanes);
  for (int j = 0; j < n; ++j) {
    const float* v = vf + static_cast<size_t>(j) * dv + d;
    VecF vv[NV];
#pragma GCC unroll 4
    for (int i = 0; i < NV; ++i) vv[i] = vload(v + i * kLanes);
#pragma GCC unroll 4
    for (int h = 0; h < NH; ++h) {
      if (st.rescale[st.at(h0 + h, j)]) {
        const VecF ms = vset1(st.ms[st.at(h0 + h, j)]);
#pragma GCC unroll 4
        for (int i = 0; i < NV; ++i) sums[h][i] = vround_f16(vmul(sums[h][i], ms));
      }
      const VecF vs = vset1(st.vs[st.at(h0 + h, j)]);
#pragma GCC unroll 4
      for (int i = 0; i < NV; ++i) sums[h][i] = vround_f16(vfma(vv[i], vs, sums[h][i]));
    }
  }
#pragma GCC unroll 4
  for (int h = 0; h < NH; ++h)
#pragma GCC unroll 4
    for (int i = 0; i < NV; ++i) vstore_f16(acc + (h0 + h) * dv + d + i * kLanes, sums[h][i]);
}

// The elements past the whole vectors, one at a time with the same roundings.
void chunk_values_tail(const ChunkSteps& st, int h, int64_t d0, const float* vf, int64_t dv, int n, uint16_t* acc) {
  for (int64_t d = d0; d < dv; ++d) {
    uint16_t* a = acc + h * dv + d;
    for (int j = 0; j < n; ++j) {
      if (st.rescale[st.at(h, j)]) *a = fp32_to_fp16(f16(*a) * st.ms[st.at(h, j)]);
      *a = fp32_to_fp16(std::fma(vf[static_cast<size_t>(j) * dv + d], st.vs[st.at(h, j)], f16(*a)));
    }
  }
}

template <int NV>
void chunk_values_heads(const ChunkSteps& st, int heads, int64_t d, const float* vf, int64_t dv, int n, uint16_t* acc) {
  int h = 0;
  for (; h + kVHeads <= heads; h += kVHeads) chunk_values<kVHeads, NV>(st, h, d, vf, dv, n, acc);
  for (; h < heads; ++h) chunk_values<1, NV>(st, h, d, vf, dv, n, acc);
}

void chunk_all_values(const ChunkSteps& st, int heads, const float* vf, int64_t dv, int n, uint16_t* acc) {
  int64_t d = 0;
  for (; d + kVVecs * kLanes <= dv; d += kVVecs * kLanes) chunk_values_heads<kVVecs>(st, heads, d, vf, dv, n, acc);
  for (; d + kLanes <= dv; d += kLanes) chunk_values_heads<1>(st, heads, d, vf, dv, n, acc);
  for (int h = 0; h < heads; ++h) chunk_values_tail(st, h, d, vf, dv, n, acc);
}

}  // namespace

void f16_flash_keys(const F16FlashArgs& a, int n_keys, float* max, float* sum, uint16_t* acc) {
  const int64_t dk = a.dk, dv = a.dv;
  thread_local std::vector<float> buf;
  thread_local ChunkSteps st;
  buf.resize(static_cast<size_t>(a.heads * dk + kChunkKeys * (dk + dv)));
  float* const qf = buf.data();
  float* const kf = qf + a.heads * dk;
  float* const vf = kf + kChunkKeys * dk;
  st.resize(a.heads);
  f16_to_f32(a.q, qf, a.heads * dk);
  for (int j = 0; j < std::min(kChunkKeys, n_keys); ++j) prefetch_key(a, j, n_keys);
  for (int j0 = 0; j0 < n_keys; j0 += kChunkKeys) {
    const int n = std::min(kChunkKeys, n_keys - j0);
    convert_rows(a, j0, n, paired_heads(a) < a.heads || n % 2 != 0, kf, vf);
    chunk_scores(a, qf, kf, j0, n, n_keys, st);
    chunk_softmax(a.heads, n, max, sum, st);
    chunk_all_values(st, a.heads, vf, dv, n, acc);
  }
}

}  // namespace bmoe::BMOE_FLASH_NS
