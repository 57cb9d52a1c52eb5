#include "model/attention.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "core/fp16.h"
#include "model/ops.h"
#include "quant/float_kernels.h"
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
constexpr int kTiledBatch = kAttentionBatchRows;

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

// Prompt batches: ggml's tiled flash-attention path, with several query rows at once. The
// queries stay f32; keys and values are converted to f32 one tile of kKvTile positions at a
// time (tiles start at multiples of kKvTile, as ggml's do), scores come from an f32 GEMM, each
// row keeps an online softmax updated once per tile, and V is accumulated in f32. A query tile
// holds every head of one KV group for a few consecutive rows, so the group shares each
// converted K and V tile. Memory is per thread and independent of the prompt length.
constexpr int kKvTile = 64;
constexpr int kQueryTileRows = 64;
static_assert(kKvTile % kExpSumBlock == 0, "a score row is exponentiated in whole blocks");

struct TileScratch {
  std::vector<float> qt, k, v, scores_t, scores, acc, max, sum;
  std::vector<int> first, last;  // visible key positions of each row
};

// Rows [0, valid) of `dst` (width floats each, zero beyond) from cache rows c.. of `layer`.
void load_tile(const KvCache& cache, bool keys, int layer, int c, int valid, int head, int width, float* dst) {
  const size_t el = cache.element_bytes();
  for (int j = 0; j < kKvTile; ++j) {
    float* row = dst + static_cast<size_t>(j) * width;
    if (j >= valid) {
      std::fill(row, row + width, 0.0f);
      continue;
    }
    const void* stored = keys ? cache.k_row(layer, c + j) : cache.v_row(layer, c + j);
    const auto* src = static_cast<const uint8_t*>(stored) + static_cast<size_t>(head) * width * el;
    if (cache.type() == KvType::F16) kernels(TensorType::F16).dequantize(src, row, width);
    else std::memcpy(row, src, static_cast<size_t>(width) * sizeof(float));
  }
}

// Rows [row0, row0 + n_rows) of the batch, all heads of KV head `kv_head`: query tile row t is
// batch row row0 + t / group, head kv_head * group + t % group. The scores are computed
// transposed (keys x queries: K as stored times the transposed query tile, so no key tile
// needs transposing) and turned around while they are scaled and masked.
void attend_tile(const KvCache& cache, int layer, const AttentionParams& p, int kv_head, const float* q,
                 const int* pos, int row0, int n_rows, float* out) {
  const FloatKernels& fk = float_kernels();
  const int dk = p.head_dim_k, dv = p.head_dim_v;
  const int group = p.n_head / p.n_head_kv;
  const int rows = n_rows * group;
  thread_local TileScratch s;
  s.qt.resize(static_cast<size_t>(dk) * rows);
  s.k.resize(static_cast<size_t>(kKvTile) * dk);
  s.v.resize(static_cast<size_t>(kKvTile) * dv);
  s.scores_t.resize(static_cast<size_t>(kKvTile) * rows);
  s.scores.resize(static_cast<size_t>(rows) * kKvTile);
  s.acc.assign(static_cast<size_t>(rows) * dv, 0.0f);
  s.max.assign(static_cast<size_t>(rows), -INFINITY);
  s.sum.assign(static_cast<size_t>(rows), 0.0f);
  s.first.resize(static_cast<size_t>(rows));
  s.last.resize(static_cast<size_t>(rows));
  int lo = pos[row0], hi = pos[row0];
  for (int t = 0; t < rows; ++t) {
    const int row = row0 + t / group, head = kv_head * group + t % group;
    const float* qrow = q + (static_cast<size_t>(row) * p.n_head + head) * dk;
    for (int d = 0; d < dk; ++d) s.qt[static_cast<size_t>(d) * rows + t] = qrow[d];
    s.last[t] = pos[row];
    s.first[t] = p.sliding_window > 0 ? std::max(0, pos[row] - p.sliding_window + 1) : 0;
    lo = std::min(lo, s.first[t]);
    hi = std::max(hi, s.last[t]);
  }
  float scale = p.scale;
  if (p.softcap != 0.0f) scale /= p.softcap;

  for (int c = lo / kKvTile * kKvTile; c <= hi; c += kKvTile) {
    const int valid = std::min(kKvTile, hi + 1 - c);  // positions of this tile that are stored
    load_tile(cache, true, layer, c, valid, kv_head, dk, s.k.data());
    load_tile(cache, false, layer, c, valid, kv_head, dv, s.v.data());
    std::fill(s.scores_t.begin(), s.scores_t.end(), 0.0f);
    fk.gemm(s.scores_t.data(), rows, s.k.data(), dk, s.qt.data(), rows, kKvTile, dk, rows);
    for (int t = 0; t < rows; ++t) {
      float* row = s.scores.data() + static_cast<size_t>(t) * kKvTile;
      for (int j = 0; j < kKvTile; ++j) {
        float x = s.scores_t[static_cast<size_t>(j) * rows + t] * scale;
        if (p.softcap != 0.0f) x = std::tanh(x) * p.softcap;
        const int key = c + j;
        row[j] = key < s.first[t] || key > s.last[t] ? -INFINITY : x;
      }
      const float tile_max = *std::max_element(row, row + kKvTile);
      if (tile_max == -INFINITY) {  // nothing visible in this tile: the row takes no weight
        std::fill(row, row + kKvTile, 0.0f);
        continue;
      }
      const float old = s.max[t];
      const float m = std::max(old, tile_max);
      if (m > old) {
        const float ms = std::exp(old - m);
        ops::scale(s.acc.data() + static_cast<size_t>(t) * dv, ms, dv);
        s.sum[t] *= ms;
      }
      s.max[t] = m;
      s.sum[t] = static_cast<float>(static_cast<double>(s.sum[t]) + fk.exp_sum(row, kKvTile, m));
    }
    fk.gemm(s.acc.data(), dv, s.scores.data(), kKvTile, s.v.data(), dv, rows, kKvTile, dv);
  }

  for (int t = 0; t < rows; ++t) {
    const int row = row0 + t / group, head = kv_head * group + t % group;
    float* acc = s.acc.data() + static_cast<size_t>(t) * dv;
    if (p.sinks != nullptr) {  // an extra logit with weight and no value
      const float sink = p.sinks[head];
      float ms = 1.0f, vs = 1.0f;
      if (sink > s.max[t]) {
        ms = std::exp(s.max[t] - sink);
        ops::scale(acc, ms, dv);
      } else {
        vs = std::exp(sink - s.max[t]);
      }
      s.sum[t] = s.sum[t] * ms + vs;
    }
    const float inv = s.sum[t] == 0.0f ? 0.0f : 1.0f / s.sum[t];
    float* dst = out + (static_cast<size_t>(row) * p.n_head + head) * dv;
    for (int d = 0; d < dv; ++d) dst[d] = acc[d] * inv;
  }
}

void attention_tiled(ThreadPool& pool, const KvCache& cache, int layer, const AttentionParams& p, const float* q,
                     const int* pos, int n, float* out) {
  const int group = p.n_head / p.n_head_kv;
  const int rows_per_tile = std::max(1, kQueryTileRows / group);
  const int tiles_per_head = (n + rows_per_tile - 1) / rows_per_tile;
  const int64_t tasks = static_cast<int64_t>(tiles_per_head) * p.n_head_kv;
  // Later rows see more keys: hand out the last tiles first so the pool ends evenly.
  pool.run(tasks, [&](int64_t t, int) {
    const int64_t task = tasks - 1 - t;
    const int kv_head = static_cast<int>(task % p.n_head_kv);
    const int row0 = static_cast<int>(task / p.n_head_kv) * rows_per_tile;
    attend_tile(cache, layer, p, kv_head, q, pos, row0, std::min(rows_per_tile, n - row0), out);
  });
}

}  // namespace

void attention(ThreadPool& pool, const KvCache& cache, int layer, const AttentionParams& p,
               const float* q, const int* pos, int n, float* out) {
  const bool batch_path = n >= kTiledBatch || p.batch_path;
  if (batch_path && p.numerics == AttentionNumerics::Flash) {
    attention_tiled(pool, cache, layer, p, q, pos, n, out);
    return;
  }
  const bool small_batch = !batch_path;
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
