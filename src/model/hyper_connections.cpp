#include "model/hyper_connections.h"

#include <cmath>
#include <vector>

#include "model/ops.h"

namespace bmoe {

namespace {

float sigmoid(float x) { return 1.0f / (1.0f + std::exp(-x)); }

// mix[j] = fn[j] . rmsnorm(all streams), for `mix` rows of fn.
void mixes(const float* streams, int64_t width, const Vector& fn, int n_mix, float eps, float* mix,
           std::vector<float>& normed) {
  normed.resize(static_cast<size_t>(width));
  ops::rms_norm(streams, nullptr, normed.data(), width, eps);
  for (int j = 0; j < n_mix; ++j) {
    const float* f = fn.data() + static_cast<size_t>(j) * width;
    float sum = 0.0f;
    for (int64_t e = 0; e < width; ++e) sum = std::fma(f[e], normed[static_cast<size_t>(e)], sum);
    mix[j] = sum;
  }
}

// The mixed row: sum over streams of pre[m] * stream m.
void fold(const float* streams, const float* pre, int m, int width, float* out) {
  for (int e = 0; e < width; ++e) {
    float sum = 0.0f;
    for (int s = 0; s < m; ++s) sum = std::fma(streams[static_cast<size_t>(s) * width + e], pre[s], sum);
    out[e] = sum;
  }
}

// Sinkhorn on comb[d + m*s]: softmax over destinations per source (+eps), then alternate
// normalising over sources (per destination) and over destinations (per source), eps added to
// every sum; as ggml's fused dsv4_hc_comb.
void sinkhorn(float* comb, int m, int iters, float eps) {
  for (int s = 0; s < m; ++s) {
    float* col = comb + static_cast<size_t>(s) * m;
    float max = -INFINITY;
    for (int d = 0; d < m; ++d) max = std::max(max, col[d]);
    float sum = 0.0f;
    for (int d = 0; d < m; ++d) {
      col[d] = std::exp(col[d] - max);
      sum += col[d];
    }
    const float inv = 1.0f / sum;
    for (int d = 0; d < m; ++d) col[d] = std::fma(col[d], inv, eps);
  }
  auto over_sources = [&] {
    for (int d = 0; d < m; ++d) {
      float sum = eps;
      for (int s = 0; s < m; ++s) sum += comb[d + m * s];
      const float inv = 1.0f / sum;
      for (int s = 0; s < m; ++s) comb[d + m * s] *= inv;
    }
  };
  auto over_destinations = [&] {
    for (int s = 0; s < m; ++s) {
      float sum = eps;
      for (int d = 0; d < m; ++d) sum += comb[d + m * s];
      const float inv = 1.0f / sum;
      for (int d = 0; d < m; ++d) comb[d + m * s] *= inv;
    }
  };
  over_sources();
  for (int i = 1; i < iters; ++i) {
    over_destinations();
    over_sources();
  }
}

}  // namespace

void ResidualStream::post_mix(int i, const float* delta) {
  const int m = streams_, width = width_;
  float* x = streams_of(i);
  scratch_.assign(x, x + static_cast<size_t>(m) * width);
  const float* old = scratch_.data();
  const float* p = post(i);
  const float* c = comb(i);
  for (int d = 0; d < m; ++d) {
    float* out = x + static_cast<size_t>(d) * width;
    for (int e = 0; e < width; ++e) {
      float sum = delta[e] * p[d];
      for (int s = 0; s < m; ++s) sum = std::fma(old[static_cast<size_t>(s) * width + e], c[d + m * s], sum);
      out[e] = sum;
    }
  }
}

namespace hyper {

void pre_mix(ThreadPool& pool, ResidualStream& r, const HyperMixWeights& w, const ModelConfig& c) {
  const int m = r.streams(), width = r.width();
  const int n_mix = (2 + m) * m;
  const float eps = c.hc.eps;
  const float* scale = w.scale->data();
  const float* base = w.base->data();
  pool.run(r.rows(), [&](int64_t row, int) {
    const int i = static_cast<int>(row);
    thread_local std::vector<float> normed, mix;
    mix.resize(static_cast<size_t>(n_mix));
    mixes(r.streams_of(i), int64_t{m} * width, *w.fn, n_mix, c.norm_eps, mix.data(), normed);
    float pre[16];
    float* post = r.post(i);
    float* comb = r.comb(i);
    for (int k = 0; k < m; ++k) {
      pre[k] = sigmoid(mix[static_cast<size_t>(k)] * scale[0] + base[k]) + eps;
      post[k] = 2.0f * sigmoid(mix[static_cast<size_t>(m + k)] * scale[1] + base[m + k]);
    }
    for (int k = 0; k < m * m; ++k) comb[k] = std::fma(mix[static_cast<size_t>(2 * m + k)], scale[2], base[2 * m + k]);
    sinkhorn(comb, m, c.hc.sinkhorn_iters, eps);
    fold(r.streams_of(i), pre, m, width, r.row(i));
  });
}

void head_mix(ThreadPool& pool, ResidualStream& r, const HyperMixWeights& w, const ModelConfig& c, int first, int n) {
  const int m = r.streams(), width = r.width();
  pool.run(n - first, [&](int64_t row, int) {
    const int i = first + static_cast<int>(row);
    thread_local std::vector<float> normed;
    float mix[16], pre[16];
    mixes(r.streams_of(i), int64_t{m} * width, *w.fn, m, c.norm_eps, mix, normed);
    for (int k = 0; k < m; ++k) pre[k] = sigmoid(mix[k] * (*w.scale)[0] + (*w.base)[static_cast<size_t>(k)]) + c.hc.eps;
    fold(r.streams_of(i), pre, m, width, r.row(i));
  });
}

}  // namespace hyper

}  // namespace bmoe
