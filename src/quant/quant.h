// Quantized kernels: dequantize rows, convert activations, and dot products, for every
// weight type bmoe computes with. One scalar reference implementation is always built; an
// AVX2/FMA/F16C one (x86-64) and a NEON one (arm64) are selected at runtime.
//
// Dot products follow llama.cpp's scheme so the results match it: the activation vector is
// converted once into the weight type's "activation format" (Q8_K for K-quants, Q8_0 for
// Q4_0/Q8_0/MXFP4, F32 for F16 and F32, BF16 for BF16), then each weight row is dotted
// with it using integer arithmetic inside blocks and f32 across blocks.
#pragma once

#include <cstddef>
#include <cstdint>

#include "quant/types.h"

namespace bmoe {

using DequantizeFn = void (*)(const void* src, float* dst, int64_t n);
using QuantizeFn = void (*)(const float* src, void* dst, int64_t n);
using DotFn = float (*)(const void* weights, const void* activations, int64_t n);
// Dots `kDotRows` consecutive weight rows (row_stride bytes apart) with one activation row:
// out[k] is bit-identical to dot(row k), it only shares the activation loads and the
// horizontal sums between rows.
using DotRowsFn = void (*)(const void* weights, size_t row_stride, const void* activations, int64_t n,
                           float* out);
constexpr int kDotRows = 8;
// Dots two consecutive weight rows with two activation rows: out = {row0.a0, row0.a1,
// row1.a0, row1.a1}, each bit-identical to dot(). For batches (arm64 i8mm).
using DotPairsFn = void (*)(const void* weights, size_t row_stride, const void* a0, const void* a1, int64_t n,
                            float* out);
// Dots `rows` consecutive weight rows (row_stride bytes apart) with `n_act` activation rows:
// out[a * out_stride + r] is bit-identical to dot(row r, acts[a]). For prompt batches: each
// weight block is unpacked once for several activation rows and their per-block float work
// shares vector lanes, so a row's result does not depend on the batch it is in.
using DotTileFn = void (*)(const void* weights, size_t row_stride, int64_t rows, const void* const* acts,
                           int64_t n_act, int64_t n, float* out, int64_t out_stride);

// The kernel set for one weight type on one ISA.
struct TypeKernels {
  TensorType activation_type = TensorType::F32;  // format the activations must be in
  DequantizeFn dequantize = nullptr;
  DotFn dot = nullptr;
  DotRowsFn dot_rows = nullptr;    // optional kDotRows-row form of `dot`
  DotPairsFn dot_2x2 = nullptr;    // optional two rows x two inputs form of `dot`
  DotTileFn dot_tile = nullptr;    // optional rows x inputs form of `dot` for batches
};

enum class Isa { Scalar, Avx2, Neon };

// Kernels for `weights` on the best ISA this CPU supports (or the forced one).
const TypeKernels& kernels(TensorType weights);
// Kernels for a specific ISA; nullptr when that ISA is not compiled in or lacks the type.
const TypeKernels* kernels_for_isa(TensorType weights, Isa isa);
Isa active_isa();

// Dot product of two f16 vectors (attention scores against an f16 KV cache).
float dot_f16_pair(const uint16_t* x, const uint16_t* y, int64_t n);
// f16 running sums of flash attention, rounded after every step as ggml does:
// acc = f16(acc * s), and acc = f16(fma(v, s, acc)).
void f16_scale(uint16_t* acc, float s, int64_t n);
void f16_fma_into(uint16_t* acc, const uint16_t* v, float s, int64_t n);

// Flash attention's decode step for `heads` query heads sharing one KV head of an f16 cache:
// ggml's online softmax over keys k, k + k_stride, ... (elements) in order. Per head and key:
// s = dot_f16_pair(k, q_h) * scale, then s = softcap * tanh(s) if softcap != 0; if s > max[h]
// the running sum is rescaled (f16_scale by exp(max - s)), max[h] = s and the key weighs 1,
// otherwise it weighs exp(s - max[h]); acc_h takes f16_fma_into(v, weight) and
// sum[h] = sum[h] * rescale + weight. Bit for bit that composition of the kernels above; the
// SIMD paths convert each key and value row once for all the heads instead of once per head.
struct F16FlashArgs {
  const uint16_t* q = nullptr;  // heads x dk query elements (f16)
  int heads = 0;
  int dk = 0, dv = 0;
  const uint16_t* k = nullptr;  // the first key's head row
  const uint16_t* v = nullptr;
  size_t k_stride = 0, v_stride = 0;  // elements from one position's row to the next
  float scale = 1.0f, softcap = 0.0f;
};
// max, sum: heads values; acc: heads x dv f16 running V sums, updated in place.
void f16_flash_keys(const F16FlashArgs& args, int n_keys, float* max, float* sum, uint16_t* acc);

// Converts n floats into activation format `format` (F32, F16, BF16, Q8_0 or Q8_K).
void quantize_activations(TensorType format, const float* src, void* dst, int64_t n);
size_t activation_bytes(TensorType format, int64_t n);

// Weight quantizers (float -> blocks) for the model writer and tests. Not tuned for quality
// like llama.cpp's, but they produce valid blocks whose error is bounded by the format.
void quantize_weights(TensorType type, const float* src, void* dst, int64_t n);
bool can_quantize_weights(TensorType type);

// Dequantizes with the scalar reference (used where speed does not matter).
void dequantize_row(TensorType type, const void* src, float* dst, int64_t n);

// Scalar references, exposed for the SIMD implementations' tests.
namespace ref {
void quantize_q8_0(const float* src, void* dst, int64_t n);
void quantize_q8_K(const float* src, void* dst, int64_t n);
void quantize_f16(const float* src, void* dst, int64_t n);
void quantize_bf16(const float* src, void* dst, int64_t n);
}  // namespace ref

}  // namespace bmoe

namespace bmoe {
class Rng;
// Fills n elements of random, valid blocks of `type` whose values have roughly zero mean and
// standard deviation `stddev`: fast enough to write tens of GB of synthetic weights.
// Float types get Gaussian values.
void fill_random_weights(TensorType type, Rng& rng, void* dst, int64_t n, float stddev);
}  // namespace bmoe
