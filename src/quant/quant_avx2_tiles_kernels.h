// AVX2 tile kernels for prompt batches (DotTileFn): one weight row against eight activation
// rows at a time. Each weight block is unpacked once for the eight rows, and the per-block
// float work of the eight (row, activation) pairs runs in the eight lanes of one vector.
//
// Every output equals the one-row AVX2 kernel's (quant_avx2.cpp) bit for bit: integer block
// sums are exact whatever their grouping, and each pair's float operations are the one-row
// kernel's, in its order: a scalar fused multiply-add chain becomes a vector lane of the same
// chain, a vector accumulator stays that pair's own vector accumulator.
//
// Compiled twice (internal to src/quant): quant_avx2_tiles.cpp includes this file as namespace
// avx2 with BMOE_X86_VNNI 0 (maddubs + madd), quant_avx2_vnni_tiles.cpp as namespace avx2_vnni
// with BMOE_X86_VNNI 1 (AVX-VNNI's vpdpbusd / vpdpwssd: the same int32 lanes). Include it after
// the file's target pragma, x86_shared.h and x86_tiles.h, with BMOE_AVX2_TILES_NS naming the
// namespace; one-row kernels named here are avx2's.
#pragma once

namespace bmoe::BMOE_AVX2_TILES_NS {
using namespace bmoe::x86;
namespace {


// Q4_K (dot_q4_K): per block one exact integer sum for the scaled quants and one for the mins,
// each pair's two scalar multiply-add chains in one lane of `acc` and `acc_min`.
template <int kUsed>
void q4_K_row(const void* w, const Q8KGroup& g, int64_t n, float* out) {
  const auto* x = static_cast<const BlockQ4_K*>(w);
  const __m256i low_mask = _mm256_set1_epi8(0x0F);
  __m256 acc = _mm256_setzero_ps(), acc_min = _mm256_setzero_ps();
  for (int64_t b = 0; b < n / kQK_K; ++b) {
    __m128i scales16, mins16;
    k_scales_mins(x[b].scales, scales16, mins16);
    alignas(16) int16_t sc[8];
    _mm_store_si128(reinterpret_cast<__m128i*>(sc), scales16);
    __m256i isum[kActs];
#pragma GCC unroll 8
    for (auto& s : isum) s = _mm256_setzero_si256();
    for (int chunk = 0; chunk < 4; ++chunk) {
      const __m256i q = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x[b].qs + 32 * chunk));
      const __m256i lo = _mm256_and_si256(q, low_mask);
      const __m256i hi = _mm256_and_si256(_mm256_srli_epi16(q, 4), low_mask);
#pragma GCC unroll 8
      for (int t = 0; t < kUsed; ++t) {
        isum[t] = k_pair_add(isum[t], lo, hi, g.y[t][b].qs + 64 * chunk, sc[2 * chunk], sc[2 * chunk + 1]);
      }
    }
    q4_K_block_step(g, b, x[b], hsum8_i32(isum), mins16, acc, acc_min);
  }
  _mm256_storeu_ps(out, _mm256_sub_ps(acc, acc_min));
}

// Q5_K (dot_q5_K): each pair keeps its own vector accumulator; the min terms' scalar chain
// (a product, then an unfused add) runs in the lanes of `acc_min`.
template <int kUsed>
void q5_K_row(const void* w, const Q8KGroup& g, int64_t n, float* out) {
  const auto* x = static_cast<const BlockQ5_K*>(w);
  const __m256i low_mask = _mm256_set1_epi8(0x0F);
  const __m256i sixteen = _mm256_set1_epi8(16);
  __m256 acc[kActs];
#pragma GCC unroll 8
  for (auto& a : acc) a = _mm256_setzero_ps();
  __m256 acc_min = _mm256_setzero_ps();
  for (int64_t b = 0; b < n / kQK_K; ++b) {
    __m128i scales16, mins16;
    k_scales_mins(x[b].scales, scales16, mins16);
    alignas(16) int16_t sc[8];
    _mm_store_si128(reinterpret_cast<__m128i*>(sc), scales16);
    const __m256i qh = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x[b].qh));
    __m256i isum[kActs];
#pragma GCC unroll 8
    for (auto& s : isum) s = _mm256_setzero_si256();
    for (int chunk = 0; chunk < 4; ++chunk) {
      const __m256i q = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x[b].qs + 32 * chunk));
      const __m256i bit0 = _mm256_set1_epi8(static_cast<char>(1u << (2 * chunk)));
      const __m256i bit1 = _mm256_set1_epi8(static_cast<char>(2u << (2 * chunk)));
      const __m256i h0 = _mm256_and_si256(_mm256_cmpeq_epi8(_mm256_and_si256(qh, bit0), bit0), sixteen);
      const __m256i h1 = _mm256_and_si256(_mm256_cmpeq_epi8(_mm256_and_si256(qh, bit1), bit1), sixteen);
      const __m256i lo = _mm256_or_si256(_mm256_and_si256(q, low_mask), h0);
      const __m256i hi = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(q, 4), low_mask), h1);
#pragma GCC unroll 8
      for (int t = 0; t < kUsed; ++t) {
        isum[t] = k_pair_add(isum[t], lo, hi, g.y[t][b].qs + 64 * chunk, sc[2 * chunk], sc[2 * chunk + 1]);
      }
    }
    const float dx = f16(x[b].d);
#pragma GCC unroll 8
    for (int t = 0; t < kUsed; ++t) {
      acc[t] = _mm256_fmadd_ps(_mm256_set1_ps(g.y[t][b].d * dx), _mm256_cvtepi32_ps(isum[t]), acc[t]);
    }
    const __m256 dmin = _mm256_mul_ps(g.scales(b), _mm256_set1_ps(f16(x[b].dmin)));
    acc_min = _mm256_add_ps(acc_min, _mm256_mul_ps(dmin, _mm256_cvtepi32_ps(g.min_terms(b, mins16))));
  }
  alignas(32) float mins[kActs];
  _mm256_store_ps(mins, acc_min);
#pragma GCC unroll 8
  for (int t = 0; t < kUsed; ++t) out[t] = hsum(acc[t]) - mins[t];
}

// Q6_K (dot_q6_K): unsigned quants, the -32 offset removed per block through the activation
// block sums; each pair keeps its own vector accumulator.
template <int kUsed>
void q6_K_row(const void* w, const Q8KGroup& g, int64_t n, float* out) {
  const auto* x = static_cast<const BlockQ6_K*>(w);
  __m256 acc[kActs];
#pragma GCC unroll 8
  for (auto& a : acc) a = _mm256_setzero_ps();
  for (int64_t b = 0; b < n / kQK_K; ++b) {
    const __m256i scales16 = _mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(x[b].scales)));
    __m256i isum[kActs];
#pragma GCC unroll 8
    for (auto& s : isum) s = _mm256_setzero_si256();
    for (int half = 0; half < 2; ++half) {
      const __m256i half_scales = half == 0 ? _mm256_permute2x128_si256(scales16, scales16, 0x00)
                                             : _mm256_permute2x128_si256(scales16, scales16, 0x11);
      __m256i parts[4];
      q6_K_parts(x[b], half, parts);
      // Part by part over the rows: eight sums, one part and its scales live (AVX2 has sixteen
      // vector registers; all four parts' scales at once spilled).
#pragma GCC unroll 4
      for (int part = 0; part < 4; ++part) {
        const __m256i s = _mm256_shuffle_epi8(half_scales, q6_scale_pick(part));
#pragma GCC unroll 8
        for (int t = 0; t < kUsed; ++t) {
          const __m256i qy = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(g.y[t][b].qs + 128 * half + 32 * part));
          isum[t] = madd16_add(isum[t], s, _mm256_maddubs_epi16(parts[part], qy));
        }
      }
    }
    const float dx = f16(x[b].d);
    const __m256i neg32_scales = q6_neg32_scales(scales16);
    alignas(32) float d[kActs];  // each pair's dy * dx (as the one-row kernel, commuted)
    _mm256_store_ps(d, _mm256_mul_ps(g.scales(b), _mm256_set1_ps(dx)));
#pragma GCC unroll 8
    for (int t = 0; t < kUsed; ++t) {
      const __m256i bsums = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(g.y[t][b].bsums));
      const __m256i isum8 = madd16_add(isum[t], bsums, neg32_scales);
      acc[t] = _mm256_fmadd_ps(_mm256_broadcast_ss(&d[t]), _mm256_cvtepi32_ps(isum8), acc[t]);
    }
  }
#pragma GCC unroll 8
  for (int t = 0; t < kUsed; ++t) out[t] = hsum(acc[t]);
}

// Q8_0 (dot_q8_0): each pair keeps its own vector accumulator.
template <int kUsed>
void q8_0_row(const void* w, const Q8_0Group& g, int64_t n, float* out) {
  const auto* x = static_cast<const BlockQ8_0*>(w);
  __m256 acc[kActs];
#pragma GCC unroll 8
  for (auto& a : acc) a = _mm256_setzero_ps();
  alignas(32) float d[kActs];
  for (int64_t b = 0; b < n / kQK; ++b) {
    const __m256i qx = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x[b].qs));
    // The eight pairs' scale products in one multiply (each the one-row kernel's dx * dy),
    // each then broadcast from memory: a load, not a scalar multiply and a shuffle per pair.
    _mm256_store_ps(d, _mm256_mul_ps(_mm256_set1_ps(f16(x[b].d)), g.scales(b)));
#pragma GCC unroll 8
    for (int t = 0; t < kUsed; ++t) {
      const __m256i qy = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(g.y[t][b].qs));
      acc[t] = _mm256_fmadd_ps(_mm256_broadcast_ss(&d[t]), _mm256_cvtepi32_ps(dot_i8_pairs(qx, qy)), acc[t]);
    }
  }
#pragma GCC unroll 8
  for (int t = 0; t < kUsed; ++t) out[t] = hsum(acc[t]);
}

// Q4_0 and MXFP4 (dot_q4_0, dot_mxfp4): each pair's scalar chain of one fused multiply-add per
// block, in the lanes of one accumulator.
struct Q4_0Quants {
  using Block = BlockQ4_0;
  static __m256i quants(const Block& blk) { return _mm256_sub_epi8(unpack_nibbles(blk.qs), _mm256_set1_epi8(8)); }
  static float scale(const Block& blk) { return f16(blk.d); }
};
struct Mxfp4Quants {
  using Block = BlockMXFP4;
  static __m256i quants(const Block& blk) {
    const __m256i table = _mm256_broadcastsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(kMxfp4Values)));
    return _mm256_shuffle_epi8(table, unpack_nibbles(blk.qs));
  }
  static float scale(const Block& blk) { return e8m0_to_fp32_half(blk.e); }
};

template <typename Quants, int kUsed>
void small_blocks_row(const void* w, const Q8_0Group& g, int64_t n, float* out) {
  const auto* x = static_cast<const typename Quants::Block*>(w);
  __m256 acc = _mm256_setzero_ps();
  for (int64_t b = 0; b < n / kQK; ++b) {
    const __m256i qx = Quants::quants(x[b]);
    __m256i sums[kActs] = {};  // lanes past kUsed stay 0
#pragma GCC unroll 8
    for (int t = 0; t < kUsed; ++t) {
      sums[t] = dot_i8_pairs(qx, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(g.y[t][b].qs)));
    }
    const __m256 d = _mm256_mul_ps(_mm256_set1_ps(Quants::scale(x[b])), g.scales(b));
    acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(hsum8_i32(sums)), d, acc);
  }
  _mm256_storeu_ps(out, acc);
}

// Float weights. F32 and F16 rows meet f32 activations, BF16 rows BF16 activations.
// Weight elements of the two-accumulator float kernels: eight-lane and one-element loads.
struct F32Weights {
  using T = float;
  static __m256 load8(const float* p) { return _mm256_loadu_ps(p); }
  static float one(float v) { return v; }
};
struct F16Weights {
  using T = uint16_t;
  static __m256 load8(const uint16_t* p) { return load_f16x8(p); }
  static float one(uint16_t v) { return f16(v); }
};

// dot_f32 / dot_f16_f32: f32 activations, two eight-lane accumulators per pair, their reduction.
template <typename W, int kUsed>
void float_row(const void* w, const FloatGroup& g, int64_t n, float* out) {
  const auto* x = static_cast<const typename W::T*>(w);
  const float* y[kActs];
  for (int t = 0; t < kUsed; ++t) y[t] = static_cast<const float*>(g.y[t]);
  __m256 lo[kActs], hi[kActs];
#pragma GCC unroll 8
  for (int t = 0; t < kUsed; ++t) lo[t] = hi[t] = _mm256_setzero_ps();
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m256 x0 = W::load8(x + i), x1 = W::load8(x + i + 8);
#pragma GCC unroll 8
    for (int t = 0; t < kUsed; ++t) {
      lo[t] = _mm256_fmadd_ps(x0, _mm256_loadu_ps(y[t] + i), lo[t]);
      hi[t] = _mm256_fmadd_ps(x1, _mm256_loadu_ps(y[t] + i + 8), hi[t]);
    }
  }
  for (int t = 0; t < kUsed; ++t) {
    const __m256 t8 = _mm256_add_ps(hi[t], lo[t]);
    const __m128 t4 = _mm_add_ps(_mm256_extractf128_ps(t8, 1), _mm256_castps256_ps128(t8));
    const __m128 t2 = _mm_add_ps(t4, _mm_shuffle_ps(t4, t4, _MM_SHUFFLE(1, 0, 3, 2)));
    float sum = _mm_cvtss_f32(t2) + _mm_cvtss_f32(_mm_shuffle_ps(t2, t2, _MM_SHUFFLE(1, 1, 1, 1)));
    for (int64_t j = i; j < n; ++j) sum = std::fma(W::one(x[j]), y[t][j], sum);
    out[t] = sum;
  }
}

template <int kUsed>
void bf16_row(const void* w, const Bf16Group& g, int64_t n, float* out) {
  const auto* x = static_cast<const uint16_t*>(w);
  __m256 acc[kActs];
#pragma GCC unroll 8
  for (auto& a : acc) a = _mm256_setzero_ps();
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256 xv = load_bf16x8(x + i);
#pragma GCC unroll 8
    for (int t = 0; t < kUsed; ++t) acc[t] = _mm256_fmadd_ps(xv, _mm256_loadu_ps(g.y[t] + i), acc[t]);
  }
#pragma GCC unroll 8
  for (int t = 0; t < kUsed; ++t) {
    float sum = hsum(acc[t]);
    for (int64_t j = i; j < n; ++j) sum += bf16_to_fp32(x[j]) * g.y[t][j];
    out[t] = sum;
  }
}

}  // namespace

void dot_tile_q4_K(const void* w, size_t stride, int64_t rows, const void* const* acts, int64_t n_act, int64_t n,
                   float* out, int64_t out_stride) {
  tile<Q8KGroup, q4_K_row<kActs>, q4_K_row<kActs / 2>>(w, stride, rows, acts, n_act, n, out, out_stride, avx2::dot_q4_K, kQK_K, true);
}
void dot_tile_q5_K(const void* w, size_t stride, int64_t rows, const void* const* acts, int64_t n_act, int64_t n,
                   float* out, int64_t out_stride) {
  tile<Q8KGroup, q5_K_row<kActs>, q5_K_row<kActs / 2>>(w, stride, rows, acts, n_act, n, out, out_stride, avx2::dot_q5_K, kQK_K, true);
}
void dot_tile_q6_K(const void* w, size_t stride, int64_t rows, const void* const* acts, int64_t n_act, int64_t n,
                   float* out, int64_t out_stride) {
  tile<Q8KGroup, q6_K_row<kActs>, q6_K_row<kActs / 2>>(w, stride, rows, acts, n_act, n, out, out_stride, avx2::dot_q6_K, kQK_K, false);
}
void dot_tile_q8_0(const void* w, size_t stride, int64_t rows, const void* const* acts, int64_t n_act, int64_t n,
                   float* out, int64_t out_stride) {
  tile<Q8_0Group, q8_0_row<kActs>, q8_0_row<kActs / 2>>(w, stride, rows, acts, n_act, n, out, out_stride, avx2::dot_q8_0, kQK, false);
}
void dot_tile_q4_0(const void* w, size_t stride, int64_t rows, const void* const* acts, int64_t n_act, int64_t n,
                   float* out, int64_t out_stride) {
  tile<Q8_0Group, small_blocks_row<Q4_0Quants, kActs>, small_blocks_row<Q4_0Quants, kActs / 2>>(w, stride, rows, acts, n_act, n, out, out_stride, avx2::dot_q4_0, kQK, false);
}
void dot_tile_mxfp4(const void* w, size_t stride, int64_t rows, const void* const* acts, int64_t n_act, int64_t n,
                    float* out, int64_t out_stride) {
  tile<Q8_0Group, small_blocks_row<Mxfp4Quants, kActs>, small_blocks_row<Mxfp4Quants, kActs / 2>>(w, stride, rows, acts, n_act, n, out, out_stride, avx2::dot_mxfp4, kQK, false);
}
void dot_tile_f32(const void* w, size_t stride, int64_t rows, const void* const* acts, int64_t n_act, int64_t n,
                  float* out, int64_t out_stride) {
  tile<FloatGroup, float_row<F32Weights, kActs>, float_row<F32Weights, kActs / 2>>(w, stride, rows, acts, n_act, n, out, out_stride, avx2::dot_f32, 1, false);
}
void dot_tile_f16(const void* w, size_t stride, int64_t rows, const void* const* acts, int64_t n_act, int64_t n,
                  float* out, int64_t out_stride) {
  tile<FloatGroup, float_row<F16Weights, kActs>, float_row<F16Weights, kActs / 2>>(w, stride, rows, acts, n_act, n, out, out_stride, avx2::dot_f16_f32, 1, false);
}
void dot_tile_bf16(const void* w, size_t stride, int64_t rows, const void* const* acts, int64_t n_act, int64_t n,
                   float* out, int64_t out_stride) {
  tile<Bf16Group, bf16_row<kActs>, bf16_row<kActs / 2>>(w, stride, rows, acts, n_act, n, out, out_stride, avx2::dot_bf16, 1, false);
}

}  // namespace bmoe::BMOE_AVX2_TILES_NS
