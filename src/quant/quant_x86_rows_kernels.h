// The x86 integer one-row and eight-row kernels of decode (DotFn, DotRowsFn): Q8_0, Q4_0,
// MXFP4, Q4_K, Q5_K, Q6_K, on 256-bit vectors.
//
// Compiled three times (internal to src/quant), each after its file's target pragma and
// x86_shared.h, with BMOE_X86_ROWS_NS naming the namespace: quant_avx2.cpp as avx2 with
// BMOE_X86_VNNI 0 (maddubs + madd), quant_avx2_vnni_tiles.cpp as avx2_vnni with BMOE_X86_VNNI 1
// (AVX-VNNI's VEX vpdpbusd / vpdpwssd), quant_avx512_vnni.cpp as avx512vl_vnni with
// BMOE_X86_VNNI 2 (the EVEX forms on ymm, for CPUs with AVX-512 VNNI but no AVX-VNNI). Every
// int32 lane holds the same exact sum in each form, and the float work around it is the same
// code, so the three return the same bits (tests/test_quant.cpp checks it).
#pragma once

namespace bmoe::BMOE_X86_ROWS_NS {
using namespace bmoe::x86;
namespace {
constexpr int kRows8 = kDotRows;
static_assert(kRows8 == 8, "the AVX2 row kernels reduce eight rows per 256-bit vector");
}  // namespace

float dot_q8_0(const void* w, const void* a, int64_t n) {
  const auto* x = static_cast<const BlockQ8_0*>(w);
  const auto* y = static_cast<const BlockQ8_0*>(a);
  __m256 acc = _mm256_setzero_ps();
  for (int64_t b = 0; b < n / kQK; ++b) {
    prefetch_ahead(x + b);
    const __m256i qx = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x[b].qs));
    const __m256i qy = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(y[b].qs));
    const __m256 d = _mm256_set1_ps(f16(x[b].d) * f16(y[b].d));
    acc = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(dot_i8_pairs(qx, qy)), acc);
  }
  return hsum(acc);
}

// Q4_0 and MXFP4 rows accumulate block by block with one fused multiply-add each (the order of
// llama.cpp's interleaved 8-row kernels, which is what it runs for these types on AVX2).
float dot_q4_0(const void* w, const void* a, int64_t n) {
  const auto* x = static_cast<const BlockQ4_0*>(w);
  const auto* y = static_cast<const BlockQ8_0*>(a);
  const __m256i eight = _mm256_set1_epi8(8);
  float acc = 0.0f;
  for (int64_t b = 0; b < n / kQK; ++b) {
    prefetch_ahead(x + b);
    const __m256i qx = _mm256_sub_epi8(unpack_nibbles(x[b].qs), eight);
    const __m256i qy = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(y[b].qs));
    acc = std::fma(static_cast<float>(hsum_i32(dot_i8_pairs(qx, qy))), f16(x[b].d) * f16(y[b].d), acc);
  }
  return acc;
}

float dot_mxfp4(const void* w, const void* a, int64_t n) {
  const auto* x = static_cast<const BlockMXFP4*>(w);
  const auto* y = static_cast<const BlockQ8_0*>(a);
  const __m128i table128 = _mm_loadu_si128(reinterpret_cast<const __m128i*>(kMxfp4Values));
  const __m256i table = _mm256_set_m128i(table128, table128);
  float acc = 0.0f;
  for (int64_t b = 0; b < n / kQK; ++b) {
    prefetch_ahead(x + b);
    const __m256i qx = _mm256_shuffle_epi8(table, unpack_nibbles(x[b].qs));
    const __m256i qy = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(y[b].qs));
    acc = std::fma(static_cast<float>(hsum_i32(dot_i8_pairs(qx, qy))), e8m0_to_fp32_half(x[b].e) * f16(y[b].d), acc);
  }
  return acc;
}

namespace {

// The shape shared by the Q4_0 and MXFP4 row kernels. Per 32-element block, each of the eight
// rows gets its exact integer block sum and every row's accumulator takes one fused
// multiply-add per block in a vector lane: the same operations, in the same order, as the
// one-row kernels' scalar chain, so the results are equal bit for bit.
// The quants are taken unsigned (value + Rows::kOffset, so maddubs needs no sign fix-up) and
// the offset is removed from the integer sum once per block: sum((q + o) * y) - o * sum(y).
template <typename Rows>
void dot_rows_blocks(const void* w, size_t stride, const void* a, int64_t n, float* out) {
  using Block = typename Rows::Block;
  const auto* base = static_cast<const uint8_t*>(w);
  const auto* y = static_cast<const BlockQ8_0*>(a);
  const Block* x[kRows8];
  for (int k = 0; k < kRows8; ++k) x[k] = reinterpret_cast<const Block*>(base + k * stride);
  const __m256i ones8 = _mm256_set1_epi8(1);
  const __m256i table = Rows::table();
  __m256 acc = _mm256_setzero_ps();
  for (int64_t b = 0; b < n / kQK; ++b) {
    // Prefetch the same place in the next group of rows (matmul hands a thread consecutive
    // groups). Eight streams prefetched a few KiB ahead within their own rows stayed at
    // 3.5-4.3 GB/s from DRAM here; one group ahead reads at 7.4 GB/s (in cache: 8.6).
    if ((b & 1) == 0) {  // every 34 bytes, so every cache line is touched
#pragma GCC unroll 8
      for (int k = 0; k < kRows8; ++k) prefetch_ahead<64, 0>(reinterpret_cast<const char*>(x[k] + b) + kRows8 * stride);
    }
    const __m256i qy = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(y[b].qs));
    __m256i sums[kRows8];
#pragma GCC unroll 8  // keeps the eight sums in registers (not unrolled, GCC spilled them)
    for (int k = 0; k < kRows8; ++k) {
      const __m256i xu = Rows::unsigned_quants(table, unpack_nibbles_broadcast(x[k][b].qs));
      sums[k] = dot4_u8s8(xu, qy);
    }
    const int y_sum = hsum_i32(dot4_u8s8(ones8, qy));
    const __m256i isum = _mm256_sub_epi32(hsum8_i32(sums), _mm256_set1_epi32(Rows::kOffset * y_sum));
    const __m256 d = _mm256_mul_ps(Rows::scales(x, b), _mm256_set1_ps(f16(y[b].d)));
    acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum), d, acc);
  }
  _mm256_storeu_ps(out, acc);
}

}  // namespace

namespace {

// The per-type parts of dot_rows_blocks (structs, not lambdas: the target pragma above covers
// namespace-scope functions only). The eight rows' block scales are loaded one by one into a
// vector: one AVX2 gather was a third slower on AMD Zen (MXFP4 rows 11.1 -> 15.5 GB/s in L2
// without it), and storing them to the stack to load as a vector stalls on store forwarding.
struct Q4_0Rows {
  using Block = BlockQ4_0;
  static constexpr int kOffset = 8;  // a Q4_0 nibble is value + 8 already
  static __m256i table() { return _mm256_setzero_si256(); }
  static __m256i unsigned_quants(__m256i, __m256i nibbles) { return nibbles; }
  static __m256 scales(const Block* const* x, int64_t b) {
    const __m128i d = _mm_setr_epi16(static_cast<short>(x[0][b].d), static_cast<short>(x[1][b].d), static_cast<short>(x[2][b].d),
                                     static_cast<short>(x[3][b].d), static_cast<short>(x[4][b].d), static_cast<short>(x[5][b].d),
                                     static_cast<short>(x[6][b].d), static_cast<short>(x[7][b].d));
    return _mm256_cvtph_ps(d);
  }
};

struct Mxfp4Rows {
  using Block = BlockMXFP4;
  static constexpr int kOffset = 12;  // doubled E2M1 values are -12..12
  static __m256i table() {
    alignas(16) uint8_t shifted[16];
    for (int i = 0; i < 16; ++i) shifted[i] = static_cast<uint8_t>(kMxfp4Values[i] + kOffset);
    return _mm256_broadcastsi128_si256(_mm_load_si128(reinterpret_cast<const __m128i*>(shifted)));
  }
  static __m256i unsigned_quants(__m256i table, __m256i nibbles) { return _mm256_shuffle_epi8(table, nibbles); }
  static __m256 scales(const Block* const* x, int64_t b) {
    return e8m0_half_x8(_mm256_setr_epi32(x[0][b].e, x[1][b].e, x[2][b].e, x[3][b].e, x[4][b].e, x[5][b].e, x[6][b].e, x[7][b].e));
  }
};

}  // namespace

// Eight Q8_0 rows: each row keeps dot_q8_0's vector accumulator and horizontal sum, so every
// output equals the one-row kernel's bit for bit; the rows share the activation loads and
// prefetch the next group of rows like dot_rows_blocks (the output heads of gpt-oss and others
// are Q8_0 and stream from DRAM every token).
void dot_rows_q8_0(const void* w, size_t stride, const void* a, int64_t n, float* out) {
  const auto* base = static_cast<const uint8_t*>(w);
  const auto* y = static_cast<const BlockQ8_0*>(a);
  const BlockQ8_0* x[kRows8];
  for (int k = 0; k < kRows8; ++k) x[k] = reinterpret_cast<const BlockQ8_0*>(base + k * stride);
  __m256 acc[kRows8];
  for (int k = 0; k < kRows8; ++k) acc[k] = _mm256_setzero_ps();
  for (int64_t b = 0; b < n / kQK; ++b) {
    if ((b & 1) == 0) {  // every 68 bytes: each cache line is touched at least once
#pragma GCC unroll 8
      for (int k = 0; k < kRows8; ++k) prefetch_ahead<64, 0>(reinterpret_cast<const char*>(x[k] + b) + kRows8 * stride);
    }
    const __m256i qy = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(y[b].qs));
    const float dy = f16(y[b].d);
#pragma GCC unroll 8
    for (int k = 0; k < kRows8; ++k) {
      const __m256i qx = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x[k][b].qs));
      const __m256 d = _mm256_set1_ps(f16(x[k][b].d) * dy);
      acc[k] = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(dot_i8_pairs(qx, qy)), acc[k]);
    }
  }
  for (int k = 0; k < kRows8; ++k) out[k] = hsum(acc[k]);
}

void dot_rows_q4_0(const void* w, size_t stride, const void* a, int64_t n, float* out) {
  dot_rows_blocks<Q4_0Rows>(w, stride, a, n, out);
}

void dot_rows_mxfp4(const void* w, size_t stride, const void* a, int64_t n, float* out) {
  dot_rows_blocks<Mxfp4Rows>(w, stride, a, n, out);
}


// Q4_K: one exact integer sum per super-block for the scaled quants and one for the mins, each
// accumulated with a fused multiply-add (the order of llama.cpp's interleaved AVX2 kernel).
float dot_q4_K(const void* w, const void* a, int64_t n) {
  const auto* x = static_cast<const BlockQ4_K*>(w);
  const auto* y = static_cast<const BlockQ8_K*>(a);
  const __m256i low_mask = _mm256_set1_epi8(0x0F);
  float acc = 0.0f, acc_min = 0.0f;
  for (int64_t b = 0; b < n / kQK_K; ++b) {
    prefetch_ahead<sizeof(BlockQ4_K)>(x + b);
    __m128i scales16, mins16;
    k_scales_mins(x[b].scales, scales16, mins16);
    alignas(16) int16_t sc[8];
    _mm_store_si128(reinterpret_cast<__m128i*>(sc), scales16);
    __m256i isum = _mm256_setzero_si256();
    for (int chunk = 0; chunk < 4; ++chunk) {
      const __m256i q = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x[b].qs + 32 * chunk));
      const __m256i lo = _mm256_and_si256(q, low_mask);
      const __m256i hi = _mm256_and_si256(_mm256_srli_epi16(q, 4), low_mask);
      isum = k_pair_add(isum, lo, hi, y[b].qs + 64 * chunk, sc[2 * chunk], sc[2 * chunk + 1]);
    }
    acc = std::fma(static_cast<float>(hsum_i32(isum)), f16(x[b].d) * y[b].d, acc);
    acc_min = std::fma(static_cast<float>(k_min_term(mins16, y[b].bsums)), f16(x[b].dmin) * y[b].d, acc_min);
  }
  return acc - acc_min;
}

float dot_q5_K(const void* w, const void* a, int64_t n) {
  const auto* x = static_cast<const BlockQ5_K*>(w);
  const auto* y = static_cast<const BlockQ8_K*>(a);
  const __m256i low_mask = _mm256_set1_epi8(0x0F);
  const __m256i sixteen = _mm256_set1_epi8(16);
  __m256 acc = _mm256_setzero_ps();
  float acc_min = 0.0f;
  for (int64_t b = 0; b < n / kQK_K; ++b) {
    prefetch_ahead<sizeof(BlockQ5_K)>(x + b);
    __m128i scales16, mins16;
    k_scales_mins(x[b].scales, scales16, mins16);
    alignas(16) int16_t sc[8];
    _mm_store_si128(reinterpret_cast<__m128i*>(sc), scales16);
    const __m256i qh = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x[b].qh));
    __m256i isum = _mm256_setzero_si256();
    for (int chunk = 0; chunk < 4; ++chunk) {
      const __m256i q = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x[b].qs + 32 * chunk));
      const __m256i bit0 = _mm256_set1_epi8(static_cast<char>(1u << (2 * chunk)));
      const __m256i bit1 = _mm256_set1_epi8(static_cast<char>(2u << (2 * chunk)));
      // 16 where the fifth bit is set: compare the masked bit against itself.
      const __m256i h0 = _mm256_and_si256(_mm256_cmpeq_epi8(_mm256_and_si256(qh, bit0), bit0), sixteen);
      const __m256i h1 = _mm256_and_si256(_mm256_cmpeq_epi8(_mm256_and_si256(qh, bit1), bit1), sixteen);
      const __m256i lo = _mm256_or_si256(_mm256_and_si256(q, low_mask), h0);
      const __m256i hi = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(q, 4), low_mask), h1);
      isum = k_pair_add(isum, lo, hi, y[b].qs + 64 * chunk, sc[2 * chunk], sc[2 * chunk + 1]);
    }
    const float d = y[b].d * f16(x[b].d);
    const float dmin = y[b].d * f16(x[b].dmin);
    acc = _mm256_fmadd_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(isum), acc);
    acc_min += dmin * static_cast<float>(k_min_term(mins16, y[b].bsums));
  }
  return hsum(acc) - acc_min;
}


// Q6_K: the quants are summed unsigned (0..63) and the -32 offset is removed once per block
// through the activation block sums, which is also how the int32 lanes are grouped in ggml.
float dot_q6_K(const void* w, const void* a, int64_t n) {
  const auto* x = static_cast<const BlockQ6_K*>(w);
  const auto* y = static_cast<const BlockQ8_K*>(a);
  __m256 acc = _mm256_setzero_ps();
  for (int64_t b = 0; b < n / kQK_K; ++b) {
    prefetch_ahead<sizeof(BlockQ6_K)>(x + b);
    const __m128i scales8 = _mm_loadu_si128(reinterpret_cast<const __m128i*>(x[b].scales));
    const __m256i scales16 = _mm256_cvtepi8_epi16(scales8);
    const __m256i bsums = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(y[b].bsums));
    const __m256i offset = _mm256_slli_epi32(_mm256_madd_epi16(bsums, scales16), 5);  // 32 * sum(sc * q8)
    __m256i isum = _mm256_setzero_si256();
    for (int half = 0; half < 2; ++half) {
      // This half's eight int16 scales in both 128-bit lanes; each part picks its two below.
      const __m256i half_scales = half == 0 ? _mm256_permute2x128_si256(scales16, scales16, 0x00)
                                             : _mm256_permute2x128_si256(scales16, scales16, 0x11);
      const int8_t* q8 = y[b].qs + 128 * half;
      __m256i parts[4];
      q6_K_parts(x[b], half, parts);
      for (int part = 0; part < 4; ++part) {  // int32 sums: exact in any grouping
        const __m256i qy = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(q8 + 32 * part));
        const __m256i s = _mm256_shuffle_epi8(half_scales, q6_scale_pick(part));
        isum = madd16_add(isum, _mm256_maddubs_epi16(parts[part], qy), s);
      }
    }
    isum = _mm256_sub_epi32(isum, offset);
    const float d = y[b].d * f16(x[b].d);
    acc = _mm256_fmadd_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(isum), acc);
  }
  return hsum(acc);
}

}  // namespace bmoe::BMOE_X86_ROWS_NS
