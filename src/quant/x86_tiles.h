// The frame of the x86 tile kernels (quant_avx2_tiles.cpp, the tiles in quant_avx512.cpp): activation
// groups of eight rows and the loop over weight rows. Include it after the file's target pragma
// and x86_shared.h; internal linkage, compiled per file's ISA (see x86_shared.h).
#pragma once

#if defined(__x86_64__)

#include <immintrin.h>

#include <algorithm>
#include <cstdint>
#include <type_traits>
#include <vector>

#include "quant/blocks.h"
#include "quant/quant.h"
#include "quant/tile_frame.h"

namespace bmoe::x86 {
namespace {

constexpr int kActs = 8;  // activation rows per tile: one per float lane

// What the N (eight unless said) activation rows of a tile share across every weight row:
// pointers and, per block, their scales; with `sums`, for K-quants the sums of each sub-block pair (the min
// terms), for Q8_0 each block's sum (kernels that take quants with an offset).
template <typename ActBlock, int N = kActs>
struct ActGroup {
  const ActBlock* y[N];
  std::vector<float> d;          // [block][act]
  // [block][i][act]: an int16 pair, the act's activation sums of sub-blocks 2i and 2i + 1
  // (Q8_K bsums[4i] + bsums[4i + 1] and bsums[4i + 2] + bsums[4i + 3]).
  std::vector<int32_t> pair_sums;
  std::vector<int32_t> block_sums;  // [block][act]: sum of a Q8_0 block's 32 quants

  ActGroup(const void* const* acts, int64_t blocks, bool sums) {
    for (int t = 0; t < N; ++t) y[t] = static_cast<const ActBlock*>(acts[t]);
    d.resize(static_cast<size_t>(blocks) * N);
    for (int64_t b = 0; b < blocks; ++b) {
      for (int t = 0; t < N; ++t) d[static_cast<size_t>(b * N + t)] = scale_of(y[t][b]);
    }
    if (!sums) return;
    if constexpr (std::is_same_v<ActBlock, BlockQ8_K>) {
      fill_pair_sums(blocks);
    } else {
      block_sums.resize(static_cast<size_t>(blocks) * N);
      for (int64_t b = 0; b < blocks; ++b) {
        for (int t = 0; t < N; ++t) {
          int sum = 0;
          for (int8_t q : y[t][b].qs) sum += q;
          block_sums[static_cast<size_t>(b * N + t)] = sum;
        }
      }
    }
  }
  // Lanes 0-7: the eight activations' sums of block b; lanes 8-15 of block b + 1.
  const int32_t* sums_at(int64_t b) const { return &block_sums[static_cast<size_t>(b * N)]; }
  void fill_pair_sums(int64_t blocks) {
    pair_sums.resize(static_cast<size_t>(blocks) * 4 * N);
    for (int64_t b = 0; b < blocks; ++b) {
      for (int t = 0; t < N; ++t) {
        const __m256i bsums = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(y[t][b].bsums));
        const __m256i sums = _mm256_madd_epi16(bsums, _mm256_set1_epi16(1));
        const __m128i packed = _mm_packs_epi32(_mm256_castsi256_si128(sums), _mm256_extracti128_si256(sums, 1));
        alignas(16) int32_t pairs[4];
        _mm_store_si128(reinterpret_cast<__m128i*>(pairs), packed);
        for (int i = 0; i < 4; ++i) pair_sums[static_cast<size_t>((b * 4 + i) * N + t)] = pairs[i];
      }
    }
  }
  // scales() and min_terms(): eight rows (N = 8) in one 256-bit vector.
  __m256 scales(int64_t b) const { return _mm256_loadu_ps(&d[static_cast<size_t>(b * N)]); }
  // Lane t: sum over sub-blocks j of mins[j] * (act t's activation sum of sub-block j): the
  // integer k_min_term of each pair. Four multiply-adds of int16 pairs, one per two sub-blocks.
  __m256i min_terms(int64_t b, __m128i mins16) const {
    const auto* sums = reinterpret_cast<const __m256i*>(&pair_sums[static_cast<size_t>(b * 4 * N)]);
    const __m256i m01 = _mm256_broadcastd_epi32(mins16);
    const __m256i m23 = _mm256_broadcastd_epi32(_mm_shuffle_epi32(mins16, 0x55));
    const __m256i m45 = _mm256_broadcastd_epi32(_mm_shuffle_epi32(mins16, 0xAA));
    const __m256i m67 = _mm256_broadcastd_epi32(_mm_shuffle_epi32(mins16, 0xFF));
    const __m256i lo = _mm256_add_epi32(_mm256_madd_epi16(_mm256_loadu_si256(sums), m01),
                                        _mm256_madd_epi16(_mm256_loadu_si256(sums + 1), m23));
    const __m256i hi = _mm256_add_epi32(_mm256_madd_epi16(_mm256_loadu_si256(sums + 2), m45),
                                        _mm256_madd_epi16(_mm256_loadu_si256(sums + 3), m67));
    return _mm256_add_epi32(lo, hi);
  }

 private:
  static float scale_of(const BlockQ8_K& blk) { return blk.d; }
  static float scale_of(const BlockQ8_0& blk) { return f16(blk.d); }
};

using Q8KGroup = ActGroup<BlockQ8_K>;
using Q8_0Group = ActGroup<BlockQ8_0>;

// dot_q4_K's two per-block scalar chains for the eight pairs, one lane each: the block's
// scaled integer sums (`totals`) and its min terms, each times its scale product.
inline void q4_K_block_step(const Q8KGroup& g, int64_t b, const BlockQ4_K& blk, __m256i totals, __m128i mins16,
                            __m256& acc, __m256& acc_min) {
  const __m256 dy = g.scales(b);
  acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(totals), _mm256_mul_ps(_mm256_set1_ps(f16(blk.d)), dy), acc);
  acc_min = _mm256_fmadd_ps(_mm256_cvtepi32_ps(g.min_terms(b, mins16)), _mm256_mul_ps(_mm256_set1_ps(f16(blk.dmin)), dy),
                            acc_min);
}

struct FloatGroup {
  const void* y[kActs];
  FloatGroup(const void* const* acts, int64_t, bool) { std::copy(acts, acts + kActs, y); }
};

// BF16 activation rows widened to f32 once per tile (exact: a shift), so that each weight row
// reads them as they are instead of converting every activation again. The widened rows live in
// the thread's own buffer (one group is alive per thread), not in a fresh zero-filled allocation
// per tile.
struct Bf16Group {
  const float* y[kActs];
  Bf16Group(const void* const* acts, int64_t n, bool) {
    thread_local std::vector<float> values;  // [act][n]
    if (values.size() < static_cast<size_t>(n) * kActs) values.resize(static_cast<size_t>(n) * kActs);
    for (int t = 0; t < kActs; ++t) {
      const auto* src = static_cast<const uint16_t*>(acts[t]);
      float* dst = values.data() + static_cast<size_t>(t) * static_cast<size_t>(n);
      int64_t i = 0;
      for (; i + 8 <= n; i += 8) _mm256_storeu_ps(dst + i, load_bf16x8(src + i));
      for (; i < n; ++i) dst[i] = bf16_to_fp32(src[i]);
      y[t] = dst;
    }
  }
};


// The row loop, kActs activation rows per tile (Half: a kernel that computes only the first
// kActs / 2 lanes, for tiles of that many rows or fewer).
template <typename Group, void (*Full)(const void*, const Group&, int64_t, float*),
          void (*Half)(const void*, const Group&, int64_t, float*)>
void tile(const void* w, size_t stride, int64_t rows, const void* const* acts, int64_t n_act, int64_t n, float* out,
          int64_t out_stride, DotFn one, int64_t block, bool sums) {
  tile_rows<kActs, Group, Full, Half>(w, stride, rows, acts, n_act, n, out, out_stride, one, block, sums);
}

}  // namespace
}  // namespace bmoe::x86

#endif  // __x86_64__
