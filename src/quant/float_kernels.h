// f32 kernels for attention over prompt batches (model/attention.cpp's tiled path) and the
// vectorised softmax: a scalar reference and SIMD versions that return the same bits.
//
// Every output element of gemm() is one chain of fused multiply-adds in k order, and exp_sum()
// evaluates fast_expf() with the same fused operations and sums in a fixed order, so the SIMD
// versions only change how many elements run side by side, never the rounding.
#pragma once

#include <cstdint>

#include "quant/quant.h"

namespace bmoe {

// exp(x) by the polynomial ggml's vectorised softmax and SiLU use (ARM optimized-routines
// coefficients, about 1.5 ulp). 0 below about -87 x ln 2 ... and +inf above 192 x ln 2.
float fast_expf(float x);

// C[i][j] = fma(A[i][k], B[k][j], C[i][j]) for k = 0, 1, ..., K-1 in that order, for i < M,
// j < N. Row strides are in floats. C, A and B must not overlap.
using GemmF32Fn = void (*)(float* c, int64_t ldc, const float* a, int64_t lda, const float* b, int64_t ldb,
                           int64_t m, int64_t k, int64_t n);

// x[j] = fast_expf(x[j] - max) for j < n, n a multiple of kExpSumBlock; returns their sum,
// each block of 16 summed pairwise (as _mm512_reduce_add_ps does) and the blocks added in a
// double, as ggml's vectorised softmax does.
using ExpSumFn = double (*)(float* x, int64_t n, float max);
constexpr int kExpSumBlock = 16;

// out[i] = silu(gate[i]) * up[i], silu(x) = x / (1 + fast_expf(0 - x)).
using SwigluFn = void (*)(const float* gate, const float* up, float* out, int64_t n);

// out[i] = silu(x[i]) = x / (1 + fast_expf(0 - x)); out may be x.
using SiluFn = void (*)(const float* x, float* out, int64_t n);
// One token of the gated delta rule on one value head (model/delta_net.h): state holds s rows
// (value index j) of s keys (s a multiple of 16); state *= decay, then for each j
// delta_j = (v_j - row_j . k) * beta, row_j += delta_j k; then out_j = row_j . q * scale.
// Each dot product sums 16 lanes (lane l takes elements l, l + 16, ...) and then the lanes as
// ref::reduce16 does, every product and sum rounded on its own (no fused multiply-add): every
// ISA returns the same bits.
using DeltaStepFn = void (*)(float* state, int s, const float* q, const float* k, const float* v, float decay,
                             float beta, float scale, float* out);
struct FloatKernels {
  GemmF32Fn gemm = nullptr;
  ExpSumFn exp_sum = nullptr;
  SwigluFn swiglu = nullptr;
  SiluFn silu = nullptr;
  DeltaStepFn delta_step = nullptr;
};

// The kernels of the active ISA, and of a given one (nullptr where it is not compiled in).
const FloatKernels& float_kernels();
const FloatKernels* float_kernels_for_isa(Isa isa);

namespace ref {
void gemm_f32(float* c, int64_t ldc, const float* a, int64_t lda, const float* b, int64_t ldb, int64_t m,
              int64_t k, int64_t n);
double exp_sum(float* x, int64_t n, float max);
void swiglu(const float* gate, const float* up, float* out, int64_t n);
void silu(const float* x, float* out, int64_t n);
void delta_step(float* state, int s, const float* q, const float* k, const float* v, float decay, float beta,
                float scale, float* out);
// Sum of 16 floats in the pairwise order of _mm512_reduce_add_ps.
float reduce16(const float* v);
}  // namespace ref

}  // namespace bmoe
