// Scalar reference of the f32 kernels (float_kernels.h).
#include <cmath>

#include "quant/float_kernels.h"

namespace bmoe {

float fast_expf(float x) {
  const float shift = 0x1.8p23f;
  const float z = std::fma(x, 0x1.715476p+0f, shift);
  const float n = z - shift;  // round(x / ln 2)
  const float b = std::fma(-n, 0x1.7f7d1cp-20f, std::fma(-n, 0x1.62e4p-1f, x));
  if (std::fabs(n) > 192.0f) return n <= 0.0f ? 0.0f : INFINITY;
  const float u = b * b;
  const float j = std::fma(std::fma(std::fma(0x1.0e4020p-7f, b, 0x1.573e2ep-5f), u, std::fma(0x1.555e66p-3f, b, 0x1.fffdb6p-2f)),
                           u, std::fma(0x1.ffffecp-1f, b, 1.0f));
  return std::ldexp(j, static_cast<int>(n));
}

namespace ref {

void gemm_f32(float* c, int64_t ldc, const float* a, int64_t lda, const float* b, int64_t ldb, int64_t m,
              int64_t k, int64_t n) {
  for (int64_t i = 0; i < m; ++i) {
    for (int64_t j = 0; j < n; ++j) {
      float acc = c[i * ldc + j];
      for (int64_t p = 0; p < k; ++p) acc = std::fma(a[i * lda + p], b[p * ldb + j], acc);
      c[i * ldc + j] = acc;
    }
  }
}

float reduce16(const float* v) {
  float t8[8], t4[4];
  for (int i = 0; i < 8; ++i) t8[i] = v[i + 8] + v[i];
  for (int i = 0; i < 4; ++i) t4[i] = t8[i + 4] + t8[i];
  return (t4[0] + t4[2]) + (t4[1] + t4[3]);
}

double exp_sum(float* x, int64_t n, float max) {
  double sum = 0.0;
  for (int64_t i = 0; i + kExpSumBlock <= n; i += kExpSumBlock) {
    for (int64_t k = i; k < i + kExpSumBlock; ++k) x[k] = fast_expf(x[k] - max);
    sum += static_cast<double>(reduce16(x + i));
  }
  return sum;
}

void swiglu(const float* gate, const float* up, float* out, int64_t n) {
  for (int64_t i = 0; i < n; ++i) out[i] = gate[i] / (1.0f + fast_expf(0.0f - gate[i])) * up[i];
}

void silu(const float* x, float* out, int64_t n) {
  for (int64_t i = 0; i < n; ++i) out[i] = x[i] / (1.0f + fast_expf(0.0f - x[i]));
}

namespace {
float dot16(const float* x, const float* y, int n) {
  float lanes[16] = {};
  for (int i = 0; i < n; i += 16) {
    for (int l = 0; l < 16; ++l) lanes[l] += x[i + l] * y[i + l];
  }
  return reduce16(lanes);
}
}  // namespace

void delta_step(float* state, int s, const float* q, const float* k, const float* v, float decay, float beta,
                float scale, float* out) {
  for (int i = 0; i < s * s; ++i) state[i] *= decay;
  for (int j = 0; j < s; ++j) {
    float* row = state + static_cast<size_t>(j) * s;
    const float delta = (v[j] - dot16(row, k, s)) * beta;
    for (int i = 0; i < s; ++i) row[i] += delta * k[i];
  }
  for (int j = 0; j < s; ++j) out[j] = dot16(state + static_cast<size_t>(j) * s, q, s) * scale;
}

}  // namespace ref
}  // namespace bmoe
