#include "model/delta_net.h"

#include <cmath>

#include "model/ops.h"
#include "quant/float_kernels.h"

namespace bmoe {

void RecurrentState::init(const ModelConfig& c) {
  const ModelConfig::DeltaNet& d = c.delta_net;
  conv.assign(static_cast<size_t>(c.n_layer), {});
  delta.assign(static_cast<size_t>(c.n_layer), {});
  for (int l = 0; l < c.n_layer; ++l) {
    if (!c.is_recurrent(l)) continue;
    conv[static_cast<size_t>(l)].assign(static_cast<size_t>(d.conv_channels()) * (d.conv_kernel - 1), 0.0f);
    delta[static_cast<size_t>(l)].assign(static_cast<size_t>(d.v_heads) * d.head_dim * d.head_dim, 0.0f);
  }
}

void RecurrentState::clear() {
  for (auto& v : conv) std::fill(v.begin(), v.end(), 0.0f);
  for (auto& v : delta) std::fill(v.begin(), v.end(), 0.0f);
}

uint64_t RecurrentState::bytes() const {
  uint64_t total = 0;
  for (const auto& v : conv) total += v.size() * sizeof(float);
  for (const auto& v : delta) total += v.size() * sizeof(float);
  return total;
}

namespace delta_net {

float softplus(float x) { return x > 20.0f ? x : std::log(1.0f + std::exp(x)); }

void l2_norm(float* x, int n, float eps) {
  double sum = 0.0;
  for (int i = 0; i < n; ++i) sum += static_cast<double>(x[i] * x[i]);
  const float scale = 1.0f / std::fmax(std::sqrt(static_cast<float>(sum)), eps);
  for (int i = 0; i < n; ++i) x[i] *= scale;
}

float dot(const float* x, const float* y, int n) {
  float lanes[16] = {};
  for (int i = 0; i < n; i += 16) {
    for (int l = 0; l < 16; ++l) lanes[l] += x[i + l] * y[i + l];
  }
  return ref::reduce16(lanes);
}

void conv_silu(const float* in, int n, int channels, int kernel, const float* weight, float* state, float* out,
               int first_channel, int end_channel) {
  const int keep = kernel - 1;
  for (int c = first_channel; c < end_channel; ++c) {
    float* hist = state + static_cast<size_t>(c) * keep;
    const float* w = weight + static_cast<size_t>(c) * kernel;
    auto at = [&](int pos) {  // window position: the state, then the new inputs
      return pos < keep ? hist[pos] : in[static_cast<size_t>(pos - keep) * channels + c];
    };
    for (int t = 0; t < n; ++t) {
      float sum = 0.0f;
      for (int j = 0; j < kernel; ++j) sum += at(t + j) * w[j];
      out[static_cast<size_t>(t) * channels + c] = ops::silu(sum);
    }
    float last[16];
    for (int j = 0; j < keep; ++j) last[j] = at(n + j);
    for (int j = 0; j < keep; ++j) hist[j] = last[j];
  }
}

void step(float* state, int head_dim, const float* q, const float* k, const float* v, float decay, float beta,
          float scale, float* out) {
  const int S = head_dim;
  for (int i = 0; i < S * S; ++i) state[i] *= decay;
  float delta[512];
  for (int j = 0; j < S; ++j) delta[j] = (v[j] - dot(state + static_cast<size_t>(j) * S, k, S)) * beta;
  for (int j = 0; j < S; ++j) {
    float* row = state + static_cast<size_t>(j) * S;
    for (int i = 0; i < S; ++i) row[i] += delta[j] * k[i];
  }
  for (int j = 0; j < S; ++j) out[j] = dot(state + static_cast<size_t>(j) * S, q, S) * scale;
}

}  // namespace delta_net
}  // namespace bmoe
