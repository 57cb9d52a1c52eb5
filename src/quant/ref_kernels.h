// Declarations of the scalar reference kernels (internal to src/quant).
#pragma once

#include <cstdint>

namespace bmoe::ref {

void dequantize_f32(const void* src, float* dst, int64_t n);
void dequantize_f16(const void* src, float* dst, int64_t n);
void dequantize_bf16(const void* src, float* dst, int64_t n);
void dequantize_q4_0(const void* src, float* dst, int64_t n);
void dequantize_q8_0(const void* src, float* dst, int64_t n);
void dequantize_mxfp4(const void* src, float* dst, int64_t n);
void dequantize_q4_K(const void* src, float* dst, int64_t n);
void dequantize_q5_K(const void* src, float* dst, int64_t n);
void dequantize_q6_K(const void* src, float* dst, int64_t n);

void quantize_f32(const float* src, void* dst, int64_t n);
void quantize_f16(const float* src, void* dst, int64_t n);
void quantize_bf16(const float* src, void* dst, int64_t n);
void quantize_q8_0(const float* src, void* dst, int64_t n);
void quantize_q8_K(const float* src, void* dst, int64_t n);

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

}  // namespace bmoe::ref
