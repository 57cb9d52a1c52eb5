#include "model/attention.h"

#include <algorithm>
#include <cmath>

#include "core/fp16.h"
#include "quant/quant.h"

namespace bmoe {

void KvCache::init(int n_layer, int n_ctx, int n_head_kv, int head_dim_k, int head_dim_v) {
  n_ctx_ = n_ctx;
  k_width_ = n_head_kv * head_dim_k;
  v_width_ = n_head_kv * head_dim_v;
  k_.assign(static_cast<size_t>(n_layer), std::vector<uint16_t>(static_cast<size_t>(n_ctx) * k_width_));
  v_.assign(static_cast<size_t>(n_layer), std::vector<uint16_t>(static_cast<size_t>(n_ctx) * v_width_));
}

void KvCache::store(int layer, int pos, const float* k, const float* v) {
  quantize_activations(TensorType::F16, k, k_[static_cast<size_t>(layer)].data() + static_cast<size_t>(pos) * k_width_, k_width_);
  quantize_activations(TensorType::F16, v, v_[static_cast<size_t>(layer)].data() + static_cast<size_t>(pos) * v_width_, v_width_);
}

size_t KvCache::bytes() const {
  size_t total = 0;
  for (const auto& k : k_) total += k.size() * 2;
  for (const auto& v : v_) total += v.size() * 2;
  return total;
}

namespace {

// Queries in a batch of at least this many rows use f32 accumulation (ggml's tiled path).
constexpr int kTiledBatch = 64;

// One query row of one head: online softmax over the visible cache positions.
void attend_one(const KvCache& cache, int layer, const AttentionParams& p, int head, const float* q,
                int pos, bool f16_accumulate, float* out) {
  const int kv_head = head / (p.n_head / p.n_head_kv);
  const int dk = p.head_dim_k, dv = p.head_dim_v;
  const TypeKernels& f16 = kernels(TensorType::F16);
  thread_local std::vector<uint16_t> q16, acc16;
  thread_local std::vector<float> acc32, v32;
  q16.resize(static_cast<size_t>(dk));
  quantize_activations(TensorType::F16, q, q16.data(), dk);
  acc32.assign(static_cast<size_t>(dv), 0.0f);
  acc16.assign(static_cast<size_t>(dv), 0);
  v32.resize(static_cast<size_t>(dv));

  float scale = p.scale;
  if (p.softcap != 0.0f) scale /= p.softcap;
  float sum = 0.0f, max = -INFINITY;
  const int first = p.sliding_window > 0 ? std::max(0, pos - p.sliding_window + 1) : 0;
  for (int j = first; j <= pos; ++j) {
    const uint16_t* k = cache.k_row(layer, j) + static_cast<size_t>(kv_head) * dk;
    const uint16_t* v = cache.v_row(layer, j) + static_cast<size_t>(kv_head) * dv;
    float s = f16.dot(k, q16.data(), dk) * scale;
    if (p.softcap != 0.0f) s = p.softcap * std::tanh(s);
    float ms = 1.0f, vs = 1.0f;
    if (s > max) {
      const float old = max;
      max = s;
      ms = std::exp(old - max);
      if (f16_accumulate) {
        for (int d = 0; d < dv; ++d) acc16[d] = fp32_to_fp16(fp16_to_fp32(acc16[d]) * ms);
      } else {
        for (int d = 0; d < dv; ++d) acc32[d] *= ms;
      }
    } else {
      vs = std::exp(s - max);
    }
    if (f16_accumulate) {
      for (int d = 0; d < dv; ++d) acc16[d] = fp32_to_fp16(std::fma(fp16_to_fp32(v[d]), vs, fp16_to_fp32(acc16[d])));
    } else {
      for (int d = 0; d < dv; ++d) acc32[d] += fp16_to_fp32(v[d]) * vs;
    }
    sum = sum * ms + vs;
  }
  if (f16_accumulate) {
    for (int d = 0; d < dv; ++d) acc32[d] = fp16_to_fp32(acc16[d]);
  }
  if (p.sinks != nullptr) {
    const float s = p.sinks[head];
    float ms = 1.0f, vs = 1.0f;
    if (s > max) {
      ms = std::exp(max - s);
      for (int d = 0; d < dv; ++d) acc32[d] *= ms;
    } else {
      vs = std::exp(s - max);
    }
    sum = sum * ms + vs;
  }
  const float inv = sum == 0.0f ? 0.0f : 1.0f / sum;
  for (int d = 0; d < dv; ++d) out[d] = acc32[d] * inv;
}

}  // namespace

void attention(ThreadPool& pool, const KvCache& cache, int layer, const AttentionParams& p,
               const float* q, const int* pos, int n, float* out) {
  const bool f16_accumulate = n < kTiledBatch;
  const int64_t tasks = static_cast<int64_t>(n) * p.n_head;
  pool.run(tasks, [&](int64_t t, int) {
    const int row = static_cast<int>(t / p.n_head);
    const int head = static_cast<int>(t % p.n_head);
    attend_one(cache, layer, p, head,
               q + static_cast<size_t>(row) * p.n_head * p.head_dim_k + static_cast<size_t>(head) * p.head_dim_k,
               pos[row], f16_accumulate,
               out + static_cast<size_t>(row) * p.n_head * p.head_dim_v + static_cast<size_t>(head) * p.head_dim_v);
  });
}

}  // namespace bmoe
