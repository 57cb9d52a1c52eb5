// The bodies of the AVX-512 (F + BW) versions of the dot products that dominate decode: Q6_K (output heads, down
// projections), Q4_K (most expert and attention matrices of a Q4_K_M file) and the eight-row
// MXFP4 kernel (gpt-oss's experts).
// They are installed in the AVX2 kernel table where the CPU has AVX-512 (dispatch.cpp), and
// they return exactly what the AVX2 kernels return: every 512-bit integer sum is folded to the
// same int32 lanes (or the same single int32) the AVX2 kernel forms, before the same float
// operations in the same order. Integer sums are exact, so only which products land in which
// lane matters, not the order they were added in.
//
// Why: the AVX2 Q6_K kernel is compute-bound (19.7 GB/s of weights in L2 on one AMD EPYC core),
// and on CPUs with full-width 512-bit units (AMD Zen 5, Intel server cores) a 512-bit multiply-
// add costs the same as a 256-bit one: half the instructions for the same bytes.
//
// Compiled twice (internal to src/quant): quant_avx512.cpp includes this file as namespace
// avx512 with BMOE_X86_VNNI 0 (maddubs + madd), quant_avx512_vnni.cpp as namespace avx512_vnni
// with BMOE_X86_VNNI 2 (vpdpbusd, vpdpwssd). Include it after the file's target pragma,
// x86_shared.h and x86_tiles.h, with BMOE_AVX512_NS naming the namespace.
#pragma once

namespace bmoe::BMOE_AVX512_NS {
using namespace bmoe::x86;
namespace {

// The 512-bit forms of x86_shared.h's dot4_u8s8 and madd16_add (the same int32 lanes either way).
inline __m512i dot4_u8s8_512(__m512i u, __m512i s) {
#if BMOE_X86_VNNI == 2
  return _mm512_dpbusd_epi32(_mm512_setzero_si512(), u, s);
#else
  return _mm512_madd_epi16(_mm512_maddubs_epi16(u, s), _mm512_set1_epi16(1));
#endif
}

inline __m512i madd16_add_512(__m512i acc, __m512i a, __m512i b) {
#if BMOE_X86_VNNI == 2
  return _mm512_dpwssd_epi32(acc, a, b);
#else
  return _mm512_add_epi32(acc, _mm512_madd_epi16(a, b));
#endif
}

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

// vphaddd within each 128-bit lane of a 512-bit vector: [a0+a1, a2+a3, b0+b1, b2+b3] per lane.
inline __m512i hadd_lanes(__m512i a, __m512i b) {
  const __m512 fa = _mm512_castsi512_ps(a), fb = _mm512_castsi512_ps(b);
  return _mm512_add_epi32(_mm512_castps_si512(_mm512_shuffle_ps(fa, fb, 0x88)),
                          _mm512_castps_si512(_mm512_shuffle_ps(fa, fb, 0xDD)));
}

// Eight rows' sums for two blocks: s[k] holds row k's int32 lanes of block b in its low 256
// bits and of block b + 1 in its high ones. Returns row k's total for block b in lane k and for
// block b + 1 in lane 8 + k.
inline __m512i hsum8_i32_x2(const __m512i s[8]) {
  const __m512i r0123 = hadd_lanes(hadd_lanes(s[0], s[1]), hadd_lanes(s[2], s[3]));
  const __m512i r4567 = hadd_lanes(hadd_lanes(s[4], s[5]), hadd_lanes(s[6], s[7]));
  // Each 128-bit lane holds four rows' partial sums: lanes 0-1 block b, lanes 2-3 block b + 1.
  const __m512i sum = _mm512_add_epi32(_mm512_shuffle_i32x4(r0123, r4567, 0x88), _mm512_shuffle_i32x4(r0123, r4567, 0xDD));
  return _mm512_shuffle_i32x4(sum, sum, 0xD8);  // (b: 0-3, b+1: 0-3, b: 4-7, b+1: 4-7) -> in order
}

// e8m0_to_fp32_half on sixteen exponents, bit for bit.
inline __m512 e8m0_half_x16(__m512i e) {
  const __m512i tiny = _mm512_sllv_epi32(_mm512_set1_epi32(0x00200000), e);  // e = 0 or 1
  const __m512i normal = _mm512_slli_epi32(_mm512_sub_epi32(e, _mm512_set1_epi32(1)), 23);
  return _mm512_castsi512_ps(_mm512_mask_blend_epi32(_mm512_cmpgt_epi32_mask(_mm512_set1_epi32(2), e), normal, tiny));
}

inline __m256 high_half(__m512 v) { return _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1)); }

// Two 32-byte halves from two places.
inline __m512i join(__m256i low, __m256i high) { return _mm512_inserti64x4(_mm512_castsi256_si512(low), high, 1); }

// A block's 16 bytes of quants in both 128-bit lanes.
inline __m256i block_bytes(const BlockMXFP4& blk) {
  return _mm256_broadcastsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(blk.qs)));
}

// Q6_K parts of one half-block as the 512-bit kernels take them: q01 holds parts 0 and 1 (ql's
// 64 bytes as they lie in memory, low nibbles) and q23 parts 2 and 3 (high nibbles), each with
// its two qh bits on top (qh's 32 bytes in both 256-bit halves; a 64-bit shift is fine, the two
// bits kept are the byte's own). Unsigned, 0..63.
inline void q6_K_parts(const BlockQ6_K& blk, int half, __m512i& q01, __m512i& q23) {
  const __m512i low_mask = _mm512_set1_epi8(0x0F), two_bits = _mm512_set1_epi8(0x03);
  const __m512i shift_01 = _mm512_setr_epi64(0, 0, 0, 0, 2, 2, 2, 2);
  const __m512i shift_23 = _mm512_setr_epi64(4, 4, 4, 4, 6, 6, 6, 6);
  const __m512i ql = _mm512_loadu_si512(blk.ql + 64 * half);
  const __m512i qh = _mm512_broadcast_i64x4(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk.qh + 32 * half)));
  q01 = _mm512_or_si512(_mm512_and_si512(ql, low_mask), _mm512_slli_epi16(_mm512_and_si512(_mm512_srlv_epi64(qh, shift_01), two_bits), 4));
  q23 = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16(ql, 4), low_mask),
                        _mm512_slli_epi16(_mm512_and_si512(_mm512_srlv_epi64(qh, shift_23), two_bits), 4));
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
      __m512i q01, q23;
      q6_K_parts(x[b], half, q01, q23);
      const int8_t* q8 = y[b].qs + 128 * half;
      const __m512i y01 = _mm512_loadu_si512(q8);
      const __m512i y23 = _mm512_loadu_si512(q8 + 64);
      const __m512i s01 = _mm512_permutexvar_epi16(scale_pick[2 * half], scales);
      const __m512i s23 = _mm512_permutexvar_epi16(scale_pick[2 * half + 1], scales);
      isum = madd16_add_512(madd16_add_512(isum, s01, _mm512_maddubs_epi16(q01, y01)), s23, _mm512_maddubs_epi16(q23, y23));
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
      isum = madd16_add_512(isum, s, _mm512_maddubs_epi16(nibbles, qy));
    }
    acc = std::fma(static_cast<float>(_mm512_reduce_add_epi32(isum)), f16(x[b].d) * y[b].d, acc);
    acc_min = std::fma(static_cast<float>(k_min_term(mins16, y[b].bsums)), f16(x[b].dmin) * y[b].d, acc_min);
  }
  return acc - acc_min;
}

// Eight MXFP4 rows, two blocks at a time: the AVX2 kernel's per-block work (each row's exact
// integer block sum, less 12 x the activation sum; then one multiply-add per block into lane k of
// one accumulator) done for blocks b and b + 1 side by side in the two halves of each 512-bit
// vector, then applied to the accumulator block b first. Equal to avx2::dot_rows_mxfp4 bit for
// bit, which also takes an odd block count (one block at a time would gain nothing here).
void dot_rows_mxfp4(const void* w, size_t stride, const void* a, int64_t n, float* out) {
  const int64_t blocks = n / kQK;
  if (blocks % 2 != 0) {
    avx2::dot_rows_mxfp4(w, stride, a, n, out);
    return;
  }
  constexpr int kRows = kDotRows;
  const auto* base = static_cast<const uint8_t*>(w);
  const auto* y = static_cast<const BlockQ8_0*>(a);
  const BlockMXFP4* x[kRows];
  for (int k = 0; k < kRows; ++k) x[k] = reinterpret_cast<const BlockMXFP4*>(base + k * stride);
  constexpr int kOffset = 12;  // doubled E2M1 values are -12..12: table entries value + 12
  alignas(16) uint8_t shifted[16];
  for (int i = 0; i < 16; ++i) shifted[i] = static_cast<uint8_t>(kMxfp4Values[i] + kOffset);
  const __m512i table = _mm512_broadcast_i32x4(_mm_load_si128(reinterpret_cast<const __m128i*>(shifted)));
  const __m512i ones8 = _mm512_set1_epi8(1), low_mask = _mm512_set1_epi8(0x0F);
  // A block's 16 bytes sit in both 128-bit lanes of its half; the upper lane takes the high nibbles.
  const __m512i nibble_shift = _mm512_setr_epi64(0, 0, 4, 4, 0, 0, 4, 4);
  __m256 acc = _mm256_setzero_ps();
  for (int64_t b = 0; b < blocks; b += 2) {
    // The next group of rows, as the AVX2 kernel prefetches (68 bytes per row per step here).
#pragma GCC unroll 8
    for (int k = 0; k < kRows; ++k) prefetch_ahead<64, 0>(reinterpret_cast<const char*>(x[k] + b) + kRows * stride);
    const __m512i qy = join(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(y[b].qs)),
                            _mm256_loadu_si256(reinterpret_cast<const __m256i*>(y[b + 1].qs)));
    __m512i sums[kRows];
#pragma GCC unroll 8  // keeps the eight sums in registers
    for (int k = 0; k < kRows; ++k) {
      const __m512i nibbles = _mm512_and_si512(_mm512_srlv_epi64(join(block_bytes(x[k][b]), block_bytes(x[k][b + 1])), nibble_shift), low_mask);
      sums[k] = dot4_u8s8_512(_mm512_shuffle_epi8(table, nibbles), qy);
    }
    const __m512i y_sums = dot4_u8s8_512(ones8, qy);
    const int y0 = hsum_i32(_mm512_castsi512_si256(y_sums)), y1 = hsum_i32(_mm512_extracti64x4_epi64(y_sums, 1));
    const __m512i offset = join(_mm256_set1_epi32(kOffset * y0), _mm256_set1_epi32(kOffset * y1));
    const __m512 isum = _mm512_cvtepi32_ps(_mm512_sub_epi32(hsum8_i32_x2(sums), offset));
    const __m512 scales = e8m0_half_x16(_mm512_setr_epi32(x[0][b].e, x[1][b].e, x[2][b].e, x[3][b].e, x[4][b].e, x[5][b].e, x[6][b].e, x[7][b].e,
                                                          x[0][b + 1].e, x[1][b + 1].e, x[2][b + 1].e, x[3][b + 1].e, x[4][b + 1].e,
                                                          x[5][b + 1].e, x[6][b + 1].e, x[7][b + 1].e));
    const __m256 d0 = _mm256_mul_ps(_mm512_castps512_ps256(scales), _mm256_set1_ps(f16(y[b].d)));
    const __m256 d1 = _mm256_mul_ps(high_half(scales), _mm256_set1_ps(f16(y[b + 1].d)));
    acc = _mm256_fmadd_ps(_mm512_castps512_ps256(isum), d0, acc);
    acc = _mm256_fmadd_ps(high_half(isum), d1, acc);
  }
  _mm256_storeu_ps(out, acc);
}

namespace {

// Tile kernels (DotTileFn, see quant_avx2_tiles.cpp): one weight row against eight activation
// rows, with the one-row kernels above for each (row, activation) pair's integer work and the
// AVX2 tile kernels' float work, so every output equals avx2::dot_* bit for bit.

// Q4_K: each activation's 512-bit block sum is folded and reduced to one int32 (lane t), then
// each pair's two scalar multiply-add chains run in lane t of `acc` and `acc_min`.
template <int kUsed>
void q4_K_row(const void* w, const Q8KGroup& g, int64_t n, float* out) {
  const auto* x = static_cast<const BlockQ4_K*>(w);
  const __m512i low_mask = _mm512_set1_epi8(0x0F);
  const __m512i nibble_shift = _mm512_setr_epi64(0, 0, 0, 0, 4, 4, 4, 4);
  const __m512i scale_pick[4] = {repeat_scales(0, 16), repeat_scales(2, 16), repeat_scales(4, 16), repeat_scales(6, 16)};
  __m256 acc = _mm256_setzero_ps(), acc_min = _mm256_setzero_ps();
  for (int64_t b = 0; b < n / kQK_K; ++b) {
    __m128i scales16, mins16;
    k_scales_mins(x[b].scales, scales16, mins16);
    const __m512i scales = _mm512_castsi128_si512(scales16);
    __m512i isum[kActs];
#pragma GCC unroll 8
    for (auto& v : isum) v = _mm512_setzero_si512();
#pragma GCC unroll 4  // whole: the eight sums stay in registers (GCC otherwise moves and spills them)
    for (int chunk = 0; chunk < 4; ++chunk) {
      const __m512i q = _mm512_broadcast_i64x4(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(x[b].qs + 32 * chunk)));
      const __m512i nibbles = _mm512_and_si512(_mm512_srlv_epi64(q, nibble_shift), low_mask);
      const __m512i s = _mm512_permutexvar_epi16(scale_pick[chunk], scales);
#pragma GCC unroll 8
      for (int t = 0; t < kUsed; ++t) {
        const __m512i qy = _mm512_loadu_si512(g.y[t][b].qs + 64 * chunk);
        isum[t] = madd16_add_512(isum[t], s, _mm512_maddubs_epi16(nibbles, qy));
      }
    }
    // Both 256-bit halves of each activation's sums reduced side by side, then added.
    q4_K_block_step(g, b, x[b], fold_halves(hsum8_i32_x2(isum)), mins16, acc, acc_min);
  }
  _mm256_storeu_ps(out, _mm256_sub_ps(acc, acc_min));
}

// Q4_K, sixteen activation rows per tile (batches of 16 and more). Per (row, activation) pair
// the integer work of q4_K_row, but the work a weight block shares (unpacking, the per-block
// reduction to one int32, the min terms and the two multiply-add chains) runs on sixteen lanes
// of 512-bit vectors: twice the pairs for it. Each lane does q4_K_block_step's float operations
// in its order, so every output is the same bits. (Measured here: the eight-row tile spent about
// half its time on that shared work.)
constexpr int kWideActs = 16;

// The sixteen rows' quants copied side by side, [block][chunk][row][64 bytes], 64-byte aligned:
// the inner loop reads them from one pointer (sixteen row pointers would not fit the general
// registers, and GCC spilled and reloaded them at every step). Built once per tile.
struct Q8KWideGroup : ActGroup<BlockQ8_K, kWideActs> {
  static constexpr size_t kChunk = 64;
  std::vector<int8_t> storage;
  int8_t* qs;
  Q8KWideGroup(const void* const* acts, int64_t blocks, bool sums)
      : ActGroup(acts, blocks, sums), storage(static_cast<size_t>(blocks) * 4 * kWideActs * kChunk + kChunk) {
    const auto address = reinterpret_cast<uintptr_t>(storage.data());
    qs = storage.data() + ((kChunk - address % kChunk) % kChunk);
    for (int64_t b = 0; b < blocks; ++b) {
      for (int chunk = 0; chunk < 4; ++chunk) {
        for (int t = 0; t < kWideActs; ++t) std::memcpy(chunk_at(b, chunk) + kChunk * t, y[t][b].qs + kChunk * chunk, kChunk);
      }
    }
  }
  int8_t* chunk_at(int64_t b, int chunk) const { return qs + static_cast<size_t>((b * 4 + chunk) * kWideActs) * kChunk; }
};

// Lane t: the total of s[t]'s sixteen int32 lanes (integers: any association).
inline __m512i hsum16_i32(const __m512i s[kWideActs]) {
  // 128-bit lane j of r[g] holds rows 4g..4g+3's sums over lane j of theirs. Spelled out: GCC
  // kept a loop here, and with it the sixteen sums, in memory.
  const __m512i r[4] = {hadd_lanes(hadd_lanes(s[0], s[1]), hadd_lanes(s[2], s[3])),
                        hadd_lanes(hadd_lanes(s[4], s[5]), hadd_lanes(s[6], s[7])),
                        hadd_lanes(hadd_lanes(s[8], s[9]), hadd_lanes(s[10], s[11])),
                        hadd_lanes(hadd_lanes(s[12], s[13]), hadd_lanes(s[14], s[15]))};
  const __m512i r01 = _mm512_add_epi32(_mm512_shuffle_i32x4(r[0], r[1], 0x88), _mm512_shuffle_i32x4(r[0], r[1], 0xDD));
  const __m512i r23 = _mm512_add_epi32(_mm512_shuffle_i32x4(r[2], r[3], 0x88), _mm512_shuffle_i32x4(r[2], r[3], 0xDD));
  return _mm512_add_epi32(_mm512_shuffle_i32x4(r01, r23, 0x88), _mm512_shuffle_i32x4(r01, r23, 0xDD));
}

// ActGroup::min_terms on sixteen lanes.
inline __m512i min_terms_wide(const Q8KWideGroup& g, int64_t b, __m128i mins16) {
  const int32_t* sums = &g.pair_sums[static_cast<size_t>(b * 4 * kWideActs)];
  const __m512i m01 = _mm512_broadcastd_epi32(mins16);  // the int16 pair (min 0, min 1) in every lane
  const __m512i m23 = _mm512_broadcastd_epi32(_mm_shuffle_epi32(mins16, 0x55));
  const __m512i m45 = _mm512_broadcastd_epi32(_mm_shuffle_epi32(mins16, 0xAA));
  const __m512i m67 = _mm512_broadcastd_epi32(_mm_shuffle_epi32(mins16, 0xFF));
  const __m512i lo = madd16_add_512(_mm512_madd_epi16(_mm512_loadu_si512(sums), m01), _mm512_loadu_si512(sums + kWideActs), m23);
  const __m512i hi = madd16_add_512(_mm512_madd_epi16(_mm512_loadu_si512(sums + 2 * kWideActs), m45),
                                    _mm512_loadu_si512(sums + 3 * kWideActs), m67);
  return _mm512_add_epi32(lo, hi);
}

template <int kUsed>
void q4_K_row_wide(const void* w, const Q8KWideGroup& g, int64_t n, float* out) {
  const auto* x = static_cast<const BlockQ4_K*>(w);
  const __m512i low_mask = _mm512_set1_epi8(0x0F);
  const __m512i nibble_shift = _mm512_setr_epi64(0, 0, 0, 0, 4, 4, 4, 4);
  const __m512i scale_pick[4] = {repeat_scales(0, 16), repeat_scales(2, 16), repeat_scales(4, 16), repeat_scales(6, 16)};
  __m512 acc = _mm512_setzero_ps(), acc_min = _mm512_setzero_ps();
  for (int64_t b = 0; b < n / kQK_K; ++b) {
    __m128i scales16, mins16;
    k_scales_mins(x[b].scales, scales16, mins16);
    const __m512i scales = _mm512_castsi128_si512(scales16);
    __m512i isum[kWideActs];
#pragma GCC unroll 16
    for (auto& v : isum) v = _mm512_setzero_si512();
#pragma GCC unroll 4
    for (int chunk = 0; chunk < 4; ++chunk) {
      const __m512i q = _mm512_broadcast_i64x4(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(x[b].qs + 32 * chunk)));
      const __m512i nibbles = _mm512_and_si512(_mm512_srlv_epi64(q, nibble_shift), low_mask);
      const __m512i s = _mm512_permutexvar_epi16(scale_pick[chunk], scales);
      const int8_t* q8 = g.chunk_at(b, chunk);
#pragma GCC unroll 16
      for (int t = 0; t < kUsed; ++t) {
        const __m512i qy = _mm512_load_si512(q8 + Q8KWideGroup::kChunk * t);
        isum[t] = madd16_add_512(isum[t], s, _mm512_maddubs_epi16(nibbles, qy));
      }
    }
    const __m512 dy = _mm512_loadu_ps(&g.d[static_cast<size_t>(b * kWideActs)]);
    acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(hsum16_i32(isum)), _mm512_mul_ps(_mm512_set1_ps(f16(x[b].d)), dy), acc);
    acc_min = _mm512_fmadd_ps(_mm512_cvtepi32_ps(min_terms_wide(g, b, mins16)), _mm512_mul_ps(_mm512_set1_ps(f16(x[b].dmin)), dy),
                              acc_min);
  }
  _mm512_storeu_ps(out, _mm512_sub_ps(acc, acc_min));
}

// Q5_K (avx2::dot_q5_K): as q4_K_row, a chunk's two 32-quant sub-blocks side by side in one
// 512-bit vector (low nibbles in the low half, high nibbles in the high half, each with its fifth
// bit from qh), folded to the AVX2 kernel's eight int32 lanes; each pair keeps its own vector
// accumulator, and the min terms' scalar chain (a product, then an unfused add) runs in the
// lanes of `acc_min`, as in the AVX2 tile.
template <int kUsed>
void q5_K_row(const void* w, const Q8KGroup& g, int64_t n, float* out) {
  const auto* x = static_cast<const BlockQ5_K*>(w);
  const __m512i low_mask = _mm512_set1_epi8(0x0F), sixteen = _mm512_set1_epi8(16), one = _mm512_set1_epi8(1);
  const __m512i nibble_shift = _mm512_setr_epi64(0, 0, 0, 0, 4, 4, 4, 4);
  const __m512i scale_pick[4] = {repeat_scales(0, 16), repeat_scales(2, 16), repeat_scales(4, 16), repeat_scales(6, 16)};
  __m256 acc[kActs];
#pragma GCC unroll 8
  for (auto& a : acc) a = _mm256_setzero_ps();
  __m256 acc_min = _mm256_setzero_ps();
  for (int64_t b = 0; b < n / kQK_K; ++b) {
    __m128i scales16, mins16;
    k_scales_mins(x[b].scales, scales16, mins16);
    const __m512i scales = _mm512_castsi128_si512(scales16);
    const __m512i qh = _mm512_broadcast_i64x4(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(x[b].qh)));
    __m512i isum[kActs];
#pragma GCC unroll 8
    for (auto& v : isum) v = _mm512_setzero_si512();
#pragma GCC unroll 4  // whole, as in q4_K_row
    for (int chunk = 0; chunk < 4; ++chunk) {
      const __m512i q = _mm512_broadcast_i64x4(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(x[b].qs + 32 * chunk)));
      const __m512i nibbles = _mm512_and_si512(_mm512_srlv_epi64(q, nibble_shift), low_mask);
      // Bit 2 * chunk of qh is the low half's fifth bit, bit 2 * chunk + 1 the high half's (a
      // 64-bit shift is fine: only each byte's own bit 0 is tested).
      const __m512i bit_shift = _mm512_setr_epi64(2 * chunk, 2 * chunk, 2 * chunk, 2 * chunk, 2 * chunk + 1, 2 * chunk + 1,
                                                  2 * chunk + 1, 2 * chunk + 1);
      const __mmask64 fifth = _mm512_test_epi8_mask(_mm512_srlv_epi64(qh, bit_shift), one);
      const __m512i q5 = _mm512_or_si512(nibbles, _mm512_maskz_mov_epi8(fifth, sixteen));
      const __m512i s = _mm512_permutexvar_epi16(scale_pick[chunk], scales);
#pragma GCC unroll 8
      for (int t = 0; t < kUsed; ++t) {
        const __m512i qy = _mm512_loadu_si512(g.y[t][b].qs + 64 * chunk);
        isum[t] = madd16_add_512(isum[t], s, _mm512_maddubs_epi16(q5, qy));
      }
    }
    const float dx = f16(x[b].d);
#pragma GCC unroll 8
    for (int t = 0; t < kUsed; ++t) {
      acc[t] = _mm256_fmadd_ps(_mm256_set1_ps(g.y[t][b].d * dx), _mm256_cvtepi32_ps(fold_halves(isum[t])), acc[t]);
    }
    const __m256 dmin = _mm256_mul_ps(g.scales(b), _mm256_set1_ps(f16(x[b].dmin)));
    acc_min = _mm256_add_ps(acc_min, _mm256_mul_ps(dmin, _mm256_cvtepi32_ps(g.min_terms(b, mins16))));
  }
  alignas(32) float mins[kActs];
  _mm256_store_ps(mins, acc_min);
#pragma GCC unroll 8
  for (int t = 0; t < kUsed; ++t) out[t] = hsum(acc[t]) - mins[t];
}

// Q6_K: the one-row kernel's two 512-bit part pairs per half-block, folded to the AVX2 kernel's
// eight int32 lanes; each pair keeps its own vector accumulator.
template <int kUsed>
void q6_K_row(const void* w, const Q8KGroup& g, int64_t n, float* out) {
  const auto* x = static_cast<const BlockQ6_K*>(w);
  const __m512i scale_pick[4] = {repeat_scales(0, 8), repeat_scales(4, 8), repeat_scales(8, 8), repeat_scales(12, 8)};
  __m256 acc[kActs];
#pragma GCC unroll 8
  for (auto& a : acc) a = _mm256_setzero_ps();
  for (int64_t b = 0; b < n / kQK_K; ++b) {
    const __m256i scales16 = _mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(x[b].scales)));
    const __m512i scales = _mm512_castsi256_si512(scales16);
    __m512i isum[kActs];
#pragma GCC unroll 8
    for (auto& v : isum) v = _mm512_setzero_si512();
#pragma GCC unroll 2  // whole, as in q4_K_row
    for (int half = 0; half < 2; ++half) {
      __m512i q01, q23;
      q6_K_parts(x[b], half, q01, q23);
      const __m512i s01 = _mm512_permutexvar_epi16(scale_pick[2 * half], scales);
      const __m512i s23 = _mm512_permutexvar_epi16(scale_pick[2 * half + 1], scales);
#pragma GCC unroll 8
      for (int t = 0; t < kUsed; ++t) {
        const int8_t* q8 = g.y[t][b].qs + 128 * half;
        const __m512i y01 = _mm512_loadu_si512(q8);
        const __m512i y23 = _mm512_loadu_si512(q8 + 64);
        isum[t] = madd16_add_512(madd16_add_512(isum[t], s01, _mm512_maddubs_epi16(q01, y01)), s23, _mm512_maddubs_epi16(q23, y23));
      }
    }
    const __m256i neg32_scales = q6_neg32_scales(scales16);
    alignas(32) float d[kActs];  // each pair's dy * dx (as the one-row kernel, commuted)
    _mm256_store_ps(d, _mm256_mul_ps(g.scales(b), _mm256_set1_ps(f16(x[b].d))));
#pragma GCC unroll 8
    for (int t = 0; t < kUsed; ++t) {
      const __m256i bsums = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(g.y[t][b].bsums));
      const __m256i isum8 = madd16_add(fold_halves(isum[t]), bsums, neg32_scales);
      acc[t] = _mm256_fmadd_ps(_mm256_broadcast_ss(&d[t]), _mm256_cvtepi32_ps(isum8), acc[t]);
    }
  }
#pragma GCC unroll 8
  for (int t = 0; t < kUsed; ++t) out[t] = hsum(acc[t]);
}

// Q8_0 (avx2::dot_q8_0): two blocks per 512-bit vector for the integer work (the sign of x
// moved onto y by a masked negation: AVX-512 has no vpsignb), then each block's eight int32
// lanes meet that pair's own vector accumulator, block b first.
template <int kUsed>
void q8_0_row(const void* w, const Q8_0Group& g, int64_t n, float* out) {
  const auto* x = static_cast<const BlockQ8_0*>(w);
  const int64_t blocks = n / kQK;
  __m256 acc[kActs];
#pragma GCC unroll 8
  for (auto& a : acc) a = _mm256_setzero_ps();
  int64_t b = 0;
  for (; b + 2 <= blocks; b += 2) {
    const __m512i qx = join(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(x[b].qs)),
                            _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x[b + 1].qs)));
    const __m512i ax = _mm512_abs_epi8(qx);
    const __mmask64 negative = _mm512_movepi8_mask(qx);
    // Each pair's scale dx * dy for both blocks, stored so each is one broadcast load below.
    alignas(64) float d[2 * kActs];
    const __m512 dy = _mm512_loadu_ps(&g.d[static_cast<size_t>(b * kActs)]);
    const __m512 dx = _mm512_mask_blend_ps(0xFF00, _mm512_set1_ps(f16(x[b].d)), _mm512_set1_ps(f16(x[b + 1].d)));
    _mm512_store_ps(d, _mm512_mul_ps(dx, dy));
#pragma GCC unroll 8
    for (int t = 0; t < kUsed; ++t) {
      const __m512i qy = join(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(g.y[t][b].qs)),
                              _mm256_loadu_si256(reinterpret_cast<const __m256i*>(g.y[t][b + 1].qs)));
      const __m512i sy = _mm512_mask_sub_epi8(qy, negative, _mm512_setzero_si512(), qy);
      const __m512 sums = _mm512_cvtepi32_ps(dot4_u8s8_512(ax, sy));
      acc[t] = _mm256_fmadd_ps(_mm256_broadcast_ss(&d[t]), _mm512_castps512_ps256(sums), acc[t]);
      acc[t] = _mm256_fmadd_ps(_mm256_broadcast_ss(&d[kActs + t]), high_half(sums), acc[t]);
    }
  }
  float result[kActs];
#pragma GCC unroll 8
  for (int t = 0; t < kUsed; ++t) {
    result[t] = hsum(acc[t]);  // an odd last block: the AVX2 kernel's step on it, then its sum
    if (b < blocks) {
      const __m256i qx = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x[b].qs));
      const __m256i qy = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(g.y[t][b].qs));
      const __m256i ax = _mm256_sign_epi8(qx, qx), sy = _mm256_sign_epi8(qy, qx);
      const __m256i sums = dot4_u8s8(ax, sy);
      const __m256 a = _mm256_fmadd_ps(_mm256_set1_ps(f16(x[b].d) * g.d[static_cast<size_t>(b * kActs + t)]),
                                       _mm256_cvtepi32_ps(sums), acc[t]);
      result[t] = hsum(a);
    }
  }
  std::copy(result, result + kUsed, out);
}

// Q4_0 and MXFP4 (avx2::dot_q4_0, dot_mxfp4): two blocks per 512-bit vector, quants taken
// unsigned (value + kOffset, as dot_rows_mxfp4 does) with the offset removed through each
// block's activation sum; each pair's scalar fused multiply-add chain in lane t, block b first.
struct Q4_0Unsigned {
  using Block = BlockQ4_0;
  static constexpr int kOffset = 8;  // a Q4_0 nibble is value + 8 already
  static __m512i quants(__m512i, __m512i nibbles) { return nibbles; }
  static __m512i table() { return _mm512_setzero_si512(); }
  static float scale(const Block& blk) { return f16(blk.d); }
};
struct Mxfp4Unsigned {
  using Block = BlockMXFP4;
  static constexpr int kOffset = 12;  // doubled E2M1 values are -12..12
  static __m512i quants(__m512i table, __m512i nibbles) { return _mm512_shuffle_epi8(table, nibbles); }
  static __m512i table() {
    alignas(16) uint8_t shifted[16];
    for (int i = 0; i < 16; ++i) shifted[i] = static_cast<uint8_t>(kMxfp4Values[i] + kOffset);
    return _mm512_broadcast_i32x4(_mm_load_si128(reinterpret_cast<const __m128i*>(shifted)));
  }
  static float scale(const Block& blk) { return e8m0_to_fp32_half(blk.e); }
};

template <typename Quants, int kUsed>
void small_blocks_row(const void* w, const Q8_0Group& g, int64_t n, float* out) {
  const auto* x = static_cast<const typename Quants::Block*>(w);
  const int64_t blocks = n / kQK;
  const __m512i table = Quants::table();
  const __m512i low_mask = _mm512_set1_epi8(0x0F);
  const __m512i nibble_shift = _mm512_setr_epi64(0, 0, 4, 4, 0, 0, 4, 4);
  const __m512i offset = _mm512_set1_epi32(Quants::kOffset);
  __m256 acc = _mm256_setzero_ps();
  int64_t b = 0;
  for (; b + 2 <= blocks; b += 2) {
    const __m512i bytes = join(_mm256_broadcastsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(x[b].qs))),
                               _mm256_broadcastsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(x[b + 1].qs))));
    const __m512i xu = Quants::quants(table, _mm512_and_si512(_mm512_srlv_epi64(bytes, nibble_shift), low_mask));
    __m512i sums[kActs] = {};  // lanes past kUsed stay 0
#pragma GCC unroll 8
    for (int t = 0; t < kUsed; ++t) {
      const __m512i qy = join(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(g.y[t][b].qs)),
                              _mm256_loadu_si256(reinterpret_cast<const __m256i*>(g.y[t][b + 1].qs)));
      sums[t] = dot4_u8s8_512(xu, qy);
    }
    const __m512i y_sums = _mm512_loadu_si512(g.sums_at(b));
    const __m512 isum = _mm512_cvtepi32_ps(_mm512_sub_epi32(hsum8_i32_x2(sums), _mm512_mullo_epi32(offset, y_sums)));
    const __m512 dy = _mm512_loadu_ps(&g.d[static_cast<size_t>(b * kActs)]);
    const __m256 d0 = _mm256_mul_ps(_mm256_set1_ps(Quants::scale(x[b])), _mm512_castps512_ps256(dy));
    const __m256 d1 = _mm256_mul_ps(_mm256_set1_ps(Quants::scale(x[b + 1])), high_half(dy));
    acc = _mm256_fmadd_ps(_mm512_castps512_ps256(isum), d0, acc);
    acc = _mm256_fmadd_ps(high_half(isum), d1, acc);
  }
  if (b < blocks) {  // an odd last block, on its own
    const __m256i bytes = _mm256_broadcastsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(x[b].qs)));
    const __m256i nibbles = _mm256_and_si256(_mm256_srlv_epi64(bytes, _mm256_setr_epi64x(0, 0, 4, 4)), _mm256_set1_epi8(0x0F));
    const __m256i xu = _mm512_castsi512_si256(Quants::quants(table, _mm512_castsi256_si512(nibbles)));
    __m256i sums[kActs] = {};  // lanes past kUsed stay 0
#pragma GCC unroll 8
    for (int t = 0; t < kUsed; ++t) {
      const __m256i qy = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(g.y[t][b].qs));
      sums[t] = dot4_u8s8(xu, qy);
    }
    const __m256i y_sums = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(g.sums_at(b)));
    const __m256i isum = _mm256_sub_epi32(hsum8_i32(sums), _mm256_mullo_epi32(_mm256_set1_epi32(Quants::kOffset), y_sums));
    const __m256 d = _mm256_mul_ps(_mm256_set1_ps(Quants::scale(x[b])), g.scales(b));
    acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum), d, acc);
  }
  _mm256_storeu_ps(out, acc);
}

}  // namespace

void dot_tile_q8_0(const void* w, size_t stride, int64_t rows, const void* const* acts, int64_t n_act, int64_t n,
                   float* out, int64_t out_stride) {
  tile<Q8_0Group, q8_0_row<kActs>, q8_0_row<kActs / 2>>(w, stride, rows, acts, n_act, n, out, out_stride, avx2::dot_q8_0, kQK, false);
}
void dot_tile_q4_0(const void* w, size_t stride, int64_t rows, const void* const* acts, int64_t n_act, int64_t n,
                   float* out, int64_t out_stride) {
  tile<Q8_0Group, small_blocks_row<Q4_0Unsigned, kActs>, small_blocks_row<Q4_0Unsigned, kActs / 2>>(w, stride, rows, acts, n_act, n, out, out_stride, avx2::dot_q4_0, kQK, true);
}
void dot_tile_mxfp4(const void* w, size_t stride, int64_t rows, const void* const* acts, int64_t n_act, int64_t n,
                    float* out, int64_t out_stride) {
  tile<Q8_0Group, small_blocks_row<Mxfp4Unsigned, kActs>, small_blocks_row<Mxfp4Unsigned, kActs / 2>>(w, stride, rows, acts, n_act, n, out, out_stride, avx2::dot_mxfp4, kQK, true);
}

// Whole groups of sixteen activations take the wide kernel, the rest the eight-row one.
void dot_tile_q4_K(const void* w, size_t stride, int64_t rows, const void* const* acts, int64_t n_act, int64_t n,
                   float* out, int64_t out_stride) {
  const int64_t wide = n_act / kWideActs * kWideActs;
  if (wide > 0) {
    tile_rows<kWideActs, Q8KWideGroup, q4_K_row_wide<kWideActs>, q4_K_row_wide<kWideActs>>(w, stride, rows, acts, wide, n, out,
                                                                                          out_stride, dot_q4_K, kQK_K, true);
  }
  if (wide == n_act) return;
  tile<Q8KGroup, q4_K_row<kActs>, q4_K_row<kActs / 2>>(w, stride, rows, acts + wide, n_act - wide, n, out + wide * out_stride,
                                                       out_stride, dot_q4_K, kQK_K, true);
}
void dot_tile_q5_K(const void* w, size_t stride, int64_t rows, const void* const* acts, int64_t n_act, int64_t n,
                   float* out, int64_t out_stride) {
  tile<Q8KGroup, q5_K_row<kActs>, q5_K_row<kActs / 2>>(w, stride, rows, acts, n_act, n, out, out_stride, avx2::dot_q5_K, kQK_K, true);
}

void dot_tile_q6_K(const void* w, size_t stride, int64_t rows, const void* const* acts, int64_t n_act, int64_t n,
                   float* out, int64_t out_stride) {
  tile<Q8KGroup, q6_K_row<kActs>, q6_K_row<kActs / 2>>(w, stride, rows, acts, n_act, n, out, out_stride, dot_q6_K, kQK_K, false);
}

}  // namespace bmoe::BMOE_AVX512_NS
