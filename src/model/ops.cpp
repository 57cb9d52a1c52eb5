#include "model/ops.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "core/fp16.h"

namespace bmoe::ops {

void rms_norm(const float* x, const float* weight, float* y, int64_t n, float eps) {
  double sum = 0.0;
  for (int64_t i = 0; i < n; ++i) sum += static_cast<double>(x[i] * x[i]);
  const float mean = static_cast<float>(sum / static_cast<double>(n));
  const float s = 1.0f / std::sqrt(mean + eps);
  if (weight) {
    for (int64_t i = 0; i < n; ++i) y[i] = x[i] * s * weight[i];
  } else {
    for (int64_t i = 0; i < n; ++i) y[i] = x[i] * s;
  }
}

void yarn_corr_dims(int n_dims, int n_ctx_orig, float freq_base, float beta_fast, float beta_slow,
                    float dims[2]) {
  auto corr_dim = [&](float n_rot) {
    return static_cast<float>(n_dims) * std::log(static_cast<float>(n_ctx_orig) / (n_rot * 2.0f * static_cast<float>(M_PI))) /
           (2.0f * std::log(freq_base));
  };
  const float start = std::floor(corr_dim(beta_fast));
  const float end = std::ceil(corr_dim(beta_slow));
  dims[0] = std::max(0.0f, start);
  dims[1] = std::min(static_cast<float>(n_dims - 1), end);
}

namespace {

// cos/sin for each rotated pair, as ggml builds them: theta multiplied step by step in float.
void rope_angles(int pos, int head_dim, const RopeConfig& rope, const float* freq_factors, std::vector<float>& cache) {
  const int n_dims = rope.n_rot;
  const float theta_scale = std::pow(rope.freq_base, -2.0f / static_cast<float>(n_dims));
  float corr[2] = {0.0f, 0.0f};
  if (rope.ext_factor != 0.0f) {
    yarn_corr_dims(n_dims, rope.n_ctx_orig, rope.freq_base, rope.beta_fast, rope.beta_slow, corr);
  }
  cache.resize(static_cast<size_t>(head_dim));
  float theta = static_cast<float>(pos);
  for (int i0 = 0; i0 < head_dim; i0 += 2) {
    // Frequency factors divide the angle (a huge factor leaves the pair unrotated).
    const float theta_extrap = freq_factors ? theta / freq_factors[i0 / 2] : theta;
    const float theta_interp = rope.freq_scale * theta_extrap;
    float t = theta_interp;
    float mscale = rope.attn_factor;
    if (rope.ext_factor != 0.0f) {
      const float y = (static_cast<float>(i0 / 2) - corr[0]) / std::max(0.001f, corr[1] - corr[0]);
      const float ramp = (1.0f - std::min(1.0f, std::max(0.0f, y))) * rope.ext_factor;
      t = theta_interp * (1 - ramp) + theta_extrap * ramp;
      mscale *= 1.0f + 0.1f * std::log(1.0f / rope.freq_scale);
    }
    cache[static_cast<size_t>(i0)] = std::cos(t) * mscale;
    cache[static_cast<size_t>(i0) + 1] = std::sin(t) * mscale;
    theta *= theta_scale;
  }
}

// sin_sign -1: the inverse rotation, as ggml's rope_back flips the sine.
void rotate(float* x, int n_heads, int head_dim, int pos, const RopeConfig& rope, const float* freq_factors, float sin_sign) {
  thread_local std::vector<float> cache;
  rope_angles(pos, head_dim, rope, freq_factors, cache);
  const int n_dims = rope.n_rot;
  for (int h = 0; h < n_heads; ++h) {
    float* v = x + static_cast<size_t>(h) * head_dim;
    for (int i0 = 0; i0 < n_dims; i0 += 2) {
      const float c = cache[static_cast<size_t>(i0)];
      const float s = sin_sign * cache[static_cast<size_t>(i0) + 1];
      // NeoX pairs element i with i + n_dims/2; Normal pairs adjacent elements.
      const int a = rope.style == RopeStyle::NeoX ? i0 / 2 : i0;
      const int b = rope.style == RopeStyle::NeoX ? i0 / 2 + n_dims / 2 : i0 + 1;
      const float x0 = v[a], x1 = v[b];
      // llama.cpp's prebuilt CPU libraries fuse the first product (measured on its zen4,
      // alderlake and haswell builds: every value equal); rounding both would differ by an ulp.
      v[a] = std::fma(x0, c, -(x1 * s));
      v[b] = std::fma(x0, s, x1 * c);
    }
  }
}

}  // namespace

void rope(float* x, int n_heads, int head_dim, int pos, const RopeConfig& rope, const float* freq_factors) {
  rotate(x, n_heads, head_dim, pos, rope, freq_factors, 1.0f);
}

void rope_inverse(float* x, int n_heads, int head_dim, int pos, const RopeConfig& rope) {
  rotate(x, n_heads, head_dim, pos, rope, nullptr, -1.0f);
}

void softmax(float* x, int64_t n) {
  float max = -INFINITY;
  for (int64_t i = 0; i < n; ++i) max = std::max(max, x[i]);
  // Exponentials summed 16 at a time into a double, as ggml's vectorised softmax does.
  int64_t i = n / kExpSumBlock * kExpSumBlock;
  double sum = float_kernels().exp_sum(x, i, max);
  for (; i < n; ++i) {
    x[i] = std::exp(x[i] - max);
    sum += static_cast<double>(x[i]);
  }
  const float inv = static_cast<float>(1.0 / sum);
  for (int64_t k = 0; k < n; ++k) x[k] *= inv;
}

void swiglu(const float* gate, const float* up, float* out, int64_t n) { float_kernels().swiglu(gate, up, out, n); }

void swiglu_limited(const float* gate, const float* up, float* out, int64_t n, float limit) {
  if (!(limit > 1e-6f)) {
    swiglu(gate, up, out, n);
    return;
  }
  float_kernels().silu(gate, out, n);  // as llama.cpp: silu, then the clamps, then the product
  for (int64_t i = 0; i < n; ++i) out[i] = std::min(out[i], limit) * std::clamp(up[i], -limit, limit);
}

void swiglu_gate_clamped(const float* gate, const float* up, float* out, int64_t n, float limit) {
  if (!(limit > 1e-6f)) {
    swiglu(gate, up, out, n);
    return;
  }
  for (int64_t i = 0; i < n; ++i) {  // ggml's swiglu_clamp: expf, not the SiLU table
    const float g = std::min(gate[i], limit);
    out[i] = g / (1.0f + std::exp(-g)) * std::clamp(up[i], -limit, limit);
  }
}

void swiglu_clamped(const ModelConfig::SwigluClamp& clamp, const float* gate, const float* up, float* out, int64_t n, float limit) {
  if (clamp.gate_before_silu) swiglu_gate_clamped(gate, up, out, n, limit);
  else swiglu_limited(gate, up, out, n, limit);
}

void swiglu_oai(const float* gate, const float* up, float* out, int64_t n, float alpha, float limit) {
  for (int64_t i = 0; i < n; ++i) {
    const float x = std::min(gate[i], limit);
    const float y = std::clamp(up[i], -limit, limit);
    const float glu = x / (1.0f + std::exp(alpha * (-x)));
    out[i] = glu * (y + 1.0f);
  }
}

float gelu_tanh(float x) {
  constexpr float kSqrt2OverPi = 0.79788456080286535587989211986876f;
  constexpr float kCoef = 0.044715f;
  return 0.5f * x * (1.0f + std::tanh(kSqrt2OverPi * x * (1.0f + kCoef * x * x)));
}

namespace {
// GELU of every f16 value, rounded to f16: ggml's CPU backend looks GELU up in such a table.
const std::vector<uint16_t>& gelu_f16_table() {
  static const std::vector<uint16_t> table = [] {
    std::vector<uint16_t> t(1 << 16);
    for (uint32_t i = 0; i < t.size(); ++i) t[i] = fp32_to_fp16(gelu_tanh(fp16_to_fp32(static_cast<uint16_t>(i))));
    return t;
  }();
  return table;
}
}  // namespace

void geglu(const float* gate, const float* up, float* out, int64_t n) {
  const std::vector<uint16_t>& table = gelu_f16_table();
  for (int64_t i = 0; i < n; ++i) {
    const float x = gate[i];
    // The input is rounded to f16 for the lookup, except where GELU is 0 or the identity.
    const float g = x <= -10.0f ? 0.0f : x >= 10.0f ? x : fp16_to_fp32(table[fp32_to_fp16(x)]);
    out[i] = g * up[i];
  }
}

void add(float* y, const float* x, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] += x[i];
}

void scale(float* y, float s, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] *= s;
}

}  // namespace bmoe::ops
