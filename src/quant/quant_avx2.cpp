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

#if defined(__clang__)
#pragma clang attribute push(__attribute__((target("avx2,fma,f16c"))), apply_to = function)
#else
#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c")
#endif

#include "quant/x86_shared.h"  // after the target pragma: compiled for AVX2

namespace bmoe::avx2 {
using namespace bmoe::x86;
namespace {
constexpr int kRows8 = kDotRows;
static_assert(kRows8 == 8, "the AVX2 row kernels reduce eight rows per 256-bit vector");
}  // namespace

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
  const __m256i ones8 = _mm256_set1_epi8(1), ones16 = _mm256_set1_epi16(1);
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
      sums[k] = _mm256_madd_epi16(_mm256_maddubs_epi16(xu, qy), ones16);
    }
    const int y_sum = hsum_i32(_mm256_madd_epi16(_mm256_maddubs_epi16(ones8, qy), ones16));
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
      __m256i p[4];
      for (int part = 0; part < 4; ++part) {
        const __m256i qy = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(q8 + 32 * part));
        const __m256i s = _mm256_shuffle_epi8(half_scales, q6_scale_pick(part));
        p[part] = _mm256_madd_epi16(s, _mm256_maddubs_epi16(parts[part], qy));
      }
      isum = _mm256_add_epi32(isum, _mm256_add_epi32(p[0], p[1]));
      isum = _mm256_add_epi32(isum, _mm256_add_epi32(p[2], p[3]));
    }
    isum = _mm256_sub_epi32(isum, offset);
    const float d = y[b].d * f16(x[b].d);
    acc = _mm256_fmadd_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(isum), acc);
  }
  return hsum(acc);
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

#if defined(__clang__)
#pragma clang attribute pop
#else
#pragma GCC pop_options
#endif

#endif  // __x86_64__
