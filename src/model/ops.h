// Elementwise and row operations of the decoder, written to round like ggml's CPU backend
// (so results match llama.cpp): RMSNorm sums squares in double, RoPE angles are built by
// repeated multiplication in float, softmax sums in double.
#pragma once

#include <cstdint>

#include "model/config.h"
#include "quant/float_kernels.h"

namespace bmoe::ops {

// y = x / rms(x) (* weight when given). x and y may alias.
void rms_norm(const float* x, const float* weight, float* y, int64_t n, float eps);

// Rotates `n_heads` heads of `head_dim` floats in place for position `pos`. freq_factors
// (n_rot / 2 values, or null) divide each pair's angle.
void rope(float* x, int n_heads, int head_dim, int pos, const RopeConfig& rope, const float* freq_factors = nullptr);
// The inverse rotation (ggml_rope_ext_back: the sine's sign flipped), same layout.
void rope_inverse(float* x, int n_heads, int head_dim, int pos, const RopeConfig& rope);

// In-place softmax over n values.
void softmax(float* x, int64_t n);

inline float silu(float x) { return x / (1.0f + fast_expf(0.0f - x)); }

// out[i] = silu(gate[i]) * up[i]
void swiglu(const float* gate, const float* up, float* out, int64_t n);
// out[i] = min(silu(gate[i]), limit) * clamp(up[i], -limit, limit) (bailingmoe3's limited SwiGLU);
// a limit <= 1e-6 means none: plain swiglu.
void swiglu_limited(const float* gate, const float* up, float* out, int64_t n, float limit);
// out[i] = silu(min(gate[i], limit)) * clamp(up[i], -limit, limit) (deepseek4: the gate is clamped
// before the SiLU); a limit <= 1e-6 means none.
void swiglu_gate_clamped(const float* gate, const float* up, float* out, int64_t n, float limit);
// Either limited SwiGLU, as the FFN kind's clamp says (ModelConfig::SwigluClamp).
void swiglu_clamped(const ModelConfig::SwigluClamp& clamp, const float* gate, const float* up, float* out, int64_t n, float limit);
// gpt-oss variant: clamped gate/up, x * sigmoid(alpha x) * (up + 1)
void swiglu_oai(const float* gate, const float* up, float* out, int64_t n, float alpha, float limit);
// out[i] = gelu(gate[i]) * up[i], GELU (tanh form) through an f16 table as ggml computes it.
void geglu(const float* gate, const float* up, float* out, int64_t n);
float gelu_tanh(float x);

void add(float* y, const float* x, int64_t n);  // y += x
void scale(float* y, float s, int64_t n);       // y *= s

// YaRN correction dimensions (ggml_rope_yarn_corr_dims).
void yarn_corr_dims(int n_dims, int n_ctx_orig, float freq_base, float beta_fast, float beta_slow,
                    float dims[2]);

}  // namespace bmoe::ops
