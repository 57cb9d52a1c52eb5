#include "model/attention.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "core/fp16.h"
#include "quant/quant.h"

namespace bmoe {

void KvCache::init(int n_ctx, const std::vector<int>& k_widths, const std::vector<int>& v_widths, KvType type) {
  n_ctx_ = n_ctx;
  type_ = type;
  k_width_ = k_widths;
  v_width_ = v_widths;
  k_.clear();
  v_.clear();
  for (size_t l = 0; l < k_widths.size(); ++l) {
    k_.emplace_back(static_cast<size_t>(n_ctx) * k_widths[l] * element_bytes());
    v_.emplace_back(static_cast<size_t>(n_ctx) * v_widths[l] * element_bytes());
  }
}

void KvCache::store(int layer, int pos, const float* k, const float* v) {
  auto* kd = const_cast<void*>(k_row(layer, pos));
  auto* vd = const_cast<void*>(v_row(layer, pos));
  const int kw = k_width_[static_cast<size_t>(layer)], vw = v_width_[static_cast<size_t>(layer)];
  if (type_ == KvType::F16) {
    quantize_activations(TensorType::F16, k, kd, kw);
    quantize_activations(TensorType::F16, v, vd, vw);
  } else {
    std::memcpy(kd, k, static_cast<size_t>(kw) * sizeof(float));
    std::memcpy(vd, v, static_cast<size_t>(vw) * sizeof(float));
  }
}

size_t KvCache::bytes() const {
  size_t total = 0;
  for (const auto& k : k_) total += k.size();
  for (const auto& v : v_) total += v.size();
  return total;
}

namespace {

float dot_f16_f16(const void* k, const void* q, int64_t n) {
  return dot_f16_pair(static_cast<const uint16_t*>(k), static_cast<const uint16_t*>(q), n);
}

// Queries in a batch of at least this many rows use f32 accumulation (ggml's tiled path).
constexpr int kTiledBatch = 64;

// Running state of one query's online softmax: sum of weights, max score, and the weighted V
// sum, kept in f16 (ggml's decode path on an f16 cache) or in f32.
class OnlineSoftmax {
 public:
  OnlineSoftmax(int dv, bool f16) : dv_(dv), f16_(f16) {
    acc32_.assign(static_cast<size_t>(dv), 0.0f);
    if (f16_) acc16_.assign(static_cast<size_t>(dv), 0);
  }

  // Adds value row v (f16 or f32 per `v_f16`) with score s.
  void add(float s, const void* v, bool v_f16) {
    float ms = 1.0f, vs = 1.0f;
    if (s > max_) {
      const float old = max_;
      max_ = s;
      ms = std::exp(old - max_);
      scale_accumulator(ms);
    } else {
      vs = std::exp(s - max_);
    }
    if (f16_) {
      f16_fma_into(acc16_.data(), static_cast<const uint16_t*>(v), vs, dv_);
    } else if (v_f16) {
      const auto* v16 = static_cast<const uint16_t*>(v);
      for (int d = 0; d < dv_; ++d) acc32_[d] += fp16_to_fp32(v16[d]) * vs;
    } else {
      const auto* v32 = static_cast<const float*>(v);
      for (int d = 0; d < dv_; ++d) acc32_[d] += v32[d] * vs;
    }
    sum_ = sum_ * ms + vs;
  }

  // Attention sinks (gpt-oss): an extra logit that takes weight but has no value.
  void add_sink(float s) {
    to_f32();
    float ms = 1.0f, vs = 1.0f;
    if (s > max_) {
      ms = std::exp(max_ - s);
      max_ = s;
      for (float& a : acc32_) a *= ms;
    } else {
      vs = std::exp(s - max_);
    }
    sum_ = sum_ * ms + vs;
  }

  void finish(float* out) {
    to_f32();
    const float inv = sum_ == 0.0f ? 0.0f : 1.0f / sum_;
    for (int d = 0; d < dv_; ++d) out[d] = acc32_[d] * inv;
  }

 private:
  void scale_accumulator(float ms) {
    if (f16_) {
      f16_scale(acc16_.data(), ms, dv_);
    } else {
      for (float& a : acc32_) a *= ms;
    }
  }
  void to_f32() {
    if (!f16_) return;
    for (int d = 0; d < dv_; ++d) acc32_[d] = fp16_to_fp32(acc16_[d]);
    f16_ = false;
  }

  int dv_;
  bool f16_;
  float sum_ = 0.0f;
  float max_ = -INFINITY;
  std::vector<float> acc32_;
  std::vector<uint16_t> acc16_;
};

// One query row of one head, ggml's flash-attention way: online softmax, V summed in f16
// for small batches on an f16 cache.
void attend_online(const KvCache& cache, int layer, const AttentionParams& p, int kv_head, const void* qd, int pos,
                   bool small_batch, DotFn dot, int head, float* out) {
  const int dk = p.head_dim_k, dv = p.head_dim_v;
  const bool f16_cache = cache.type() == KvType::F16;
  const size_t el = cache.element_bytes();
  OnlineSoftmax softmax(dv, f16_cache && small_batch);
  float scale = p.scale;
  if (p.softcap != 0.0f) scale /= p.softcap;
  const int first = p.sliding_window > 0 ? std::max(0, pos - p.sliding_window + 1) : 0;
  for (int j = first; j <= pos; ++j) {
    const auto* k = static_cast<const uint8_t*>(cache.k_row(layer, j)) + static_cast<size_t>(kv_head) * dk * el;
    const auto* v = static_cast<const uint8_t*>(cache.v_row(layer, j)) + static_cast<size_t>(kv_head) * dv * el;
    float s = dot(k, qd, dk) * scale;
    if (p.softcap != 0.0f) s = p.softcap * std::tanh(s);
    softmax.add(s, v, f16_cache);
  }
  if (p.sinks != nullptr) softmax.add_sink(p.sinks[head]);
  softmax.finish(out);
}

// One query row of one head, ggml's classic (non-flash) way: all scores, a softmax in f32
// (sum in double), the weights rounded to the cache type, then V summed in f32.
void attend_classic(const KvCache& cache, int layer, const AttentionParams& p, int kv_head, const void* qd, int pos,
                    DotFn dot, int head, float* out) {
  const int dk = p.head_dim_k, dv = p.head_dim_v;
  const bool f16_cache = cache.type() == KvType::F16;
  const size_t el = cache.element_bytes();
  const int first = p.sliding_window > 0 ? std::max(0, pos - p.sliding_window + 1) : 0;
  const int n = pos - first + 1;
  thread_local std::vector<float> w;
  w.resize(static_cast<size_t>(n));
  float max = -INFINITY;
  for (int j = 0; j < n; ++j) {
    const auto* k = static_cast<const uint8_t*>(cache.k_row(layer, first + j)) + static_cast<size_t>(kv_head) * dk * el;
    float s = dot(k, qd, dk);
    if (p.softcap != 0.0f) s = p.softcap * std::tanh(s / p.softcap);
    w[static_cast<size_t>(j)] = s * p.scale;
    max = std::max(max, w[static_cast<size_t>(j)]);
  }
  if (p.sinks != nullptr) max = std::max(max, p.sinks[head]);
  double sum = 0.0;
  for (float& x : w) {
    x = std::exp(x - max);
    sum += static_cast<double>(x);
  }
  if (p.sinks != nullptr) sum += static_cast<double>(std::exp(p.sinks[head] - max));
  const float inv = static_cast<float>(1.0 / sum);
  for (float& x : w) {
    x *= inv;
    if (f16_cache) x = fp16_to_fp32(fp32_to_fp16(x));  // the weights meet V in its type
  }
  for (int d = 0; d < dv; ++d) out[d] = 0.0f;
  for (int j = 0; j < n; ++j) {
    const auto* v = static_cast<const uint8_t*>(cache.v_row(layer, first + j)) + static_cast<size_t>(kv_head) * dv * el;
    const float wj = w[static_cast<size_t>(j)];
    if (f16_cache) {
      const auto* v16 = reinterpret_cast<const uint16_t*>(v);
      for (int d = 0; d < dv; ++d) out[d] += fp16_to_fp32(v16[d]) * wj;
    } else {
      const auto* v32 = reinterpret_cast<const float*>(v);
      for (int d = 0; d < dv; ++d) out[d] += v32[d] * wj;
    }
  }
}

void attend_one(const KvCache& cache, int layer, const AttentionParams& p, int head, const float* q, int pos,
                bool small_batch, float* out) {
  const int kv_head = head / (p.n_head / p.n_head_kv);
  const bool f16_cache = cache.type() == KvType::F16;
  // The query is converted to the cache's dot format once (f16 for an f16 cache).
  thread_local std::vector<uint16_t> q16;
  const DotFn dot = f16_cache ? &dot_f16_f16 : kernels(TensorType::F32).dot;
  const void* qd = q;
  if (f16_cache) {
    q16.resize(static_cast<size_t>(p.head_dim_k));
    quantize_activations(TensorType::F16, q, q16.data(), p.head_dim_k);
    qd = q16.data();
  }
  if (p.numerics == AttentionNumerics::Flash) {
    attend_online(cache, layer, p, kv_head, qd, pos, small_batch, dot, head, out);
  } else {
    attend_classic(cache, layer, p, kv_head, qd, pos, dot, head, out);
  }
}

}  // namespace

void attention(ThreadPool& pool, const KvCache& cache, int layer, const AttentionParams& p,
               const float* q, const int* pos, int n, float* out) {
  const bool small_batch = n < kTiledBatch;
  const int64_t tasks = static_cast<int64_t>(n) * p.n_head;
  pool.run(tasks, [&](int64_t t, int) {
    const int row = static_cast<int>(t / p.n_head);
    const int head = static_cast<int>(t % p.n_head);
    attend_one(cache, layer, p, head,
               q + static_cast<size_t>(row) * p.n_head * p.head_dim_k + static_cast<size_t>(head) * p.head_dim_k,
               pos[row], small_batch,
               out + static_cast<size_t>(row) * p.n_head * p.head_dim_v + static_cast<size_t>(head) * p.head_dim_v);
  });
}

}  // namespace bmoe
