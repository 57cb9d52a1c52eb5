#include "model/hyper_connections.h"

#include <cmath>
#include <vector>

#include "model/ops.h"
#include "quant/isa_target.h"

namespace bmoe {

namespace {

float sigmoid(float x) { return 1.0f / (1.0f + std::exp(-x)); }

// The loops below are chains of fmas over rows of 4 x n_embd. The x86-64 baseline has no FMA
// instruction, so there std::fma is a libm call per element; a clone for CPUs with FMA runs it
// inline. An fma rounds once either way: both clones give the same bits.
#define BMOE_FMA_CLONES BMOE_CLONES_FOR("fma")

// fn rows [j, j + kRows) . normed, each its own fma chain in element order; the rows run side by
// side so the chains overlap (one chain waits on the fma before it).
template <int kRows>
BMOE_FMA_CLONES void dot_rows(const float* fn, int64_t width, const float* normed, float* out) {
  float sum[kRows] = {};
  for (int64_t e = 0; e < width; ++e) {
    for (int r = 0; r < kRows; ++r) sum[r] = std::fma(fn[r * width + e], normed[e], sum[r]);
  }
  for (int r = 0; r < kRows; ++r) out[r] = sum[r];
}

// mix[j] = fn[j] . rmsnorm(all streams), for `mix` rows of fn.
void mixes(const float* streams, int64_t width, const Vector& fn, int n_mix, float eps, float* mix,
           std::vector<float>& normed) {
  normed.resize(static_cast<size_t>(width));
  ops::rms_norm(streams, nullptr, normed.data(), width, eps);
  constexpr int kRows = 4;
  int j = 0;
  for (; j + kRows <= n_mix; j += kRows) dot_rows<kRows>(fn.data() + j * width, width, normed.data(), mix + j);
  for (; j < n_mix; ++j) dot_rows<1>(fn.data() + j * width, width, normed.data(), mix + j);
}

// The mixed row: sum over streams of pre[m] * stream m.
BMOE_FMA_CLONES void fold(const float* streams, const float* pre, int m, int width, float* out) {
  for (int e = 0; e < width; ++e) {
    float sum = 0.0f;
    for (int s = 0; s < m; ++s) sum = std::fma(streams[static_cast<size_t>(s) * width + e], pre[s], sum);
    out[e] = sum;
  }
}

// One destination stream of post_mix: delta * post + the streams mixed by comb's column.
BMOE_FMA_CLONES void post_mix_stream(const float* old, const float* delta, float post, const float* comb_d, int m,
                                     int width, float* out) {
  for (int e = 0; e < width; ++e) {
    float sum = delta[e] * post;
    for (int s = 0; s < m; ++s) sum = std::fma(old[static_cast<size_t>(s) * width + e], comb_d[m * s], sum);
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
  for (int d = 0; d < m; ++d) post_mix_stream(old, delta, p[d], c + d, m, width, x + static_cast<size_t>(d) * width);
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
