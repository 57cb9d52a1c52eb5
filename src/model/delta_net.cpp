#include "model/delta_net.h"

#include <algorithm>
#include <cmath>

#include "quant/float_kernels.h"

namespace bmoe {

namespace delta_net {

std::vector<float> transpose_conv(const std::vector<float>& weight, int channels, int kernel) {
  std::vector<float> t(weight.size());
  for (int c = 0; c < channels; ++c) {
    for (int j = 0; j < kernel; ++j) t[static_cast<size_t>(j) * channels + c] = weight[static_cast<size_t>(c) * kernel + j];
  }
  return t;
}

float softplus(float x) { return x > 20.0f ? x : std::log(1.0f + std::exp(x)); }

void l2_norm(float* x, int n, float eps) {
  double sum = 0.0;
  for (int i = 0; i < n; ++i) sum += static_cast<double>(x[i] * x[i]);
  const float scale = 1.0f / std::fmax(std::sqrt(static_cast<float>(sum)), eps);
  for (int i = 0; i < n; ++i) x[i] *= scale;
}

void causal_conv(const float* in, int n, int channels, int kernel, const float* weight, float* state, float* out,
               int first_channel, int end_channel) {
  const int keep = kernel - 1;
  const size_t C = static_cast<size_t>(channels);
  for (int t = 0; t < n; ++t) {
    float* o = out + t * C;
    std::fill(o + first_channel, o + end_channel, 0.0f);
    for (int j = 0; j < kernel; ++j) {  // window position t + j: the state, then the new inputs
      const float* w = weight + j * C;
      const int pos = t + j;
      if (pos < keep) {
        for (int c = first_channel; c < end_channel; ++c) o[c] += state[static_cast<size_t>(c) * keep + pos] * w[c];
      } else {
        const float* x = in + static_cast<size_t>(pos - keep) * C;
        for (int c = first_channel; c < end_channel; ++c) o[c] += x[c] * w[c];
      }
    }
  }
  for (int c = first_channel; c < end_channel; ++c) {
    float* hist = state + static_cast<size_t>(c) * keep;
    float last[kMaxConvKernel];
    for (int j = 0; j < keep; ++j) {
      const int pos = n + j;
      last[j] = pos < keep ? hist[pos] : in[static_cast<size_t>(pos - keep) * C + c];
    }
    std::copy(last, last + keep, hist);
  }
}

void conv_history_after(const float* in, int rows, int channels, int kernel, const float* state, float* out,
                        int first_channel, int end_channel) {
  const int keep = kernel - 1;
  const size_t C = static_cast<size_t>(channels);
  for (int c = first_channel; c < end_channel; ++c) {
    const float* hist = state + static_cast<size_t>(c) * keep;
    float* to = out + static_cast<size_t>(c) * keep;
    for (int j = 0; j < keep; ++j) {
      const int pos = rows + j;  // in the window: the old history, then the inputs
      to[j] = pos < keep ? hist[pos] : in[static_cast<size_t>(pos - keep) * C + c];
    }
  }
}

void step(float* state, int head_dim, const float* q, const float* k, const float* v, float decay, float beta,
          float scale, float* out) {
  float_kernels().delta_step(state, head_dim, q, k, v, decay, beta, scale, out);
}

}  // namespace delta_net
}  // namespace bmoe
