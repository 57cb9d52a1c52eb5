// Declarations of the SIMD kernel sets (internal to src/quant). Each mirrors the scalar
// reference in ref_kernels.h.
#pragma once

#include <cstddef>
#include <cstdint>

namespace bmoe {
struct F16FlashArgs;  // quant.h
}

// Declares a tile kernel (DotTileFn).
#define BMOE_DOT_TILE(name)                                                                                       \
  void name(const void* w, size_t stride, int64_t rows, const void* const* acts, int64_t n_act, int64_t n, float* out, \
            int64_t out_stride)

// The integer one-row and eight-row kernels of quant_x86_rows_kernels.h, declared for each
// namespace that compiles them (avx2, avx2_vnni, avx512vl_vnni).
#define BMOE_X86_INT_ROW_KERNELS                                                            \
  float dot_q4_0(const void* w, const void* a, int64_t n);                                  \
  float dot_q8_0(const void* w, const void* a, int64_t n);                                  \
  float dot_mxfp4(const void* w, const void* a, int64_t n);                                 \
  float dot_q4_K(const void* w, const void* a, int64_t n);                                  \
  float dot_q5_K(const void* w, const void* a, int64_t n);                                  \
  float dot_q6_K(const void* w, const void* a, int64_t n);                                  \
  /* kDotRows (8) rows at once; see DotRowsFn. */                                           \
  void dot_rows_q8_0(const void* w, size_t stride, const void* a, int64_t n, float* out);   \
  void dot_rows_q4_0(const void* w, size_t stride, const void* a, int64_t n, float* out);   \
  void dot_rows_mxfp4(const void* w, size_t stride, const void* a, int64_t n, float* out);

namespace bmoe::avx2 {
BMOE_X86_INT_ROW_KERNELS
float dot_f32(const void* w, const void* a, int64_t n);
float dot_f16(const void* w, const void* a, int64_t n);
float dot_f16_f32(const void* w, const void* a, int64_t n);
float dot_bf16(const void* w, const void* a, int64_t n);
void dot_rows_bf16(const void* w, size_t stride, const void* a, int64_t n, float* out);
void quantize_f16(const float* src, void* dst, int64_t n);
void dequantize_f16(const void* src, float* dst, int64_t n);
void f16_scale(uint16_t* acc, float s, int64_t n);
void f16_fma_into(uint16_t* acc, const uint16_t* v, float s, int64_t n);
void f16_flash_keys(const F16FlashArgs& args, int n_keys, float* max, float* sum, uint16_t* acc);  // flash_avx2.cpp
// float_kernels.h
void gemm_f32(float* c, int64_t ldc, const float* a, int64_t lda, const float* b, int64_t ldb, int64_t m,
              int64_t k, int64_t n);
double exp_sum(float* x, int64_t n, float max);
void swiglu(const float* gate, const float* up, float* out, int64_t n);
void silu(const float* x, float* out, int64_t n);
void delta_step(float* state, int s, const float* q, const float* k, const float* v, float decay, float beta,
                float scale, float* out);
void quantize_q8_K(const float* src, void* dst, int64_t n);
// Tile kernels (quant_avx2_tiles.cpp); see DotTileFn.
BMOE_DOT_TILE(dot_tile_q4_K);
BMOE_DOT_TILE(dot_tile_q5_K);
BMOE_DOT_TILE(dot_tile_q6_K);
BMOE_DOT_TILE(dot_tile_q8_0);
BMOE_DOT_TILE(dot_tile_q4_0);
BMOE_DOT_TILE(dot_tile_mxfp4);
BMOE_DOT_TILE(dot_tile_f32);
BMOE_DOT_TILE(dot_tile_f16);
BMOE_DOT_TILE(dot_tile_bf16);
}  // namespace bmoe::avx2

// The AVX2 integer tile, one-row and eight-row kernels with AVX-VNNI (quant_avx2_vnni_tiles.cpp),
// equal to avx2's bit for bit; the AVX2 table uses them where cpu_features().avx_vnni and no
// AVX-512 kernel stands in.
namespace bmoe::avx2_vnni {
BMOE_X86_INT_ROW_KERNELS
BMOE_DOT_TILE(dot_tile_q4_K);
BMOE_DOT_TILE(dot_tile_q5_K);
BMOE_DOT_TILE(dot_tile_q6_K);
BMOE_DOT_TILE(dot_tile_q8_0);
BMOE_DOT_TILE(dot_tile_q4_0);
BMOE_DOT_TILE(dot_tile_mxfp4);
}  // namespace bmoe::avx2_vnni

// AVX-512 F + BW versions of the heaviest AVX2 kernels (and the Q5_K tile), equal to them bit for bit; the AVX2
// table uses them where cpu_features().avx512bw, the avx512_vnni ones (the same bodies with
// vpdpbusd / vpdpwssd, quant_avx512_kernels.h) where also cpu_features().avx512vnni.
#define BMOE_AVX512_INT_KERNELS                                                         \
  float dot_q4_K(const void* w, const void* a, int64_t n);                             \
  float dot_q6_K(const void* w, const void* a, int64_t n);                             \
  void dot_rows_mxfp4(const void* w, size_t stride, const void* a, int64_t n, float* out); \
  BMOE_DOT_TILE(dot_tile_q4_K);                                                        \
  BMOE_DOT_TILE(dot_tile_q5_K);                                                        \
  BMOE_DOT_TILE(dot_tile_q6_K);                                                        \
  BMOE_DOT_TILE(dot_tile_q8_0);                                                        \
  BMOE_DOT_TILE(dot_tile_q4_0);                                                        \
  BMOE_DOT_TILE(dot_tile_mxfp4);
namespace bmoe::avx512_vnni {
BMOE_AVX512_INT_KERNELS
}  // namespace bmoe::avx512_vnni
// The 256-bit integer one-row and eight-row kernels with AVX-512 VNNI's EVEX vpdpbusd / vpdpwssd
// on ymm (quant_avx512_vnni.cpp), for CPUs with AVX-512 VNNI; equal to avx2's bit for bit.
namespace bmoe::avx512vl_vnni {
BMOE_X86_INT_ROW_KERNELS
}  // namespace bmoe::avx512vl_vnni
namespace bmoe::avx512 {
BMOE_AVX512_INT_KERNELS
void gemm_f32(float* c, int64_t ldc, const float* a, int64_t lda, const float* b, int64_t ldb, int64_t m,
              int64_t k, int64_t n);
void f16_flash_keys(const F16FlashArgs& args, int n_keys, float* max, float* sum, uint16_t* acc);  // flash_avx512.cpp
BMOE_DOT_TILE(dot_tile_bf16);  // bf16_avx512.cpp: 4 x 4 register blocks on ymm (VL)
}  // namespace bmoe::avx512

namespace bmoe::neon {
float dot_f32(const void* w, const void* a, int64_t n);
float dot_f16(const void* w, const void* a, int64_t n);
float dot_f16_f32(const void* w, const void* a, int64_t n);
float dot_bf16(const void* w, const void* a, int64_t n);
float dot_q4_0(const void* w, const void* a, int64_t n);
float dot_q8_0(const void* w, const void* a, int64_t n);
float dot_mxfp4(const void* w, const void* a, int64_t n);
float dot_q4_K(const void* w, const void* a, int64_t n);
float dot_q5_K(const void* w, const void* a, int64_t n);
float dot_q6_K(const void* w, const void* a, int64_t n);
void dequantize_f16(const void* src, float* dst, int64_t n);
// float_kernels.h
void gemm_f32(float* c, int64_t ldc, const float* a, int64_t lda, const float* b, int64_t ldb, int64_t m,
              int64_t k, int64_t n);
double exp_sum(float* x, int64_t n, float max);
void swiglu(const float* gate, const float* up, float* out, int64_t n);
void silu(const float* x, float* out, int64_t n);
void delta_step(float* state, int s, const float* q, const float* k, const float* v, float decay, float beta,
                float scale, float* out);
// Tile kernels (quant_neon_tiles.cpp); see DotTileFn.
BMOE_DOT_TILE(dot_tile_q4_K);
BMOE_DOT_TILE(dot_tile_q5_K);
BMOE_DOT_TILE(dot_tile_q6_K);
BMOE_DOT_TILE(dot_tile_q8_0);
BMOE_DOT_TILE(dot_tile_q4_0);
BMOE_DOT_TILE(dot_tile_mxfp4);
BMOE_DOT_TILE(dot_tile_f32);
BMOE_DOT_TILE(dot_tile_f16);
BMOE_DOT_TILE(dot_tile_bf16);
}  // namespace bmoe::neon

// arm64 with i8mm: two rows x two activation rows (see DotPairsFn).
namespace bmoe::neon_i8mm {
void dot_2x2_q8_0(const void* w, size_t stride, const void* a0, const void* a1, int64_t n, float* out);
void dot_2x2_q4_0(const void* w, size_t stride, const void* a0, const void* a1, int64_t n, float* out);
void dot_2x2_mxfp4(const void* w, size_t stride, const void* a0, const void* a1, int64_t n, float* out);
void dot_2x2_q4_K(const void* w, size_t stride, const void* a0, const void* a1, int64_t n, float* out);
void dot_2x2_q5_K(const void* w, size_t stride, const void* a0, const void* a1, int64_t n, float* out);
void dot_2x2_q6_K(const void* w, size_t stride, const void* a0, const void* a1, int64_t n, float* out);
}  // namespace bmoe::neon_i8mm
