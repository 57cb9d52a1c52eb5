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

// Decode rows (batches of fewer than kAttentionBatchRows rows) attend one KV group at a time:
// the query heads that share a KV head are computed together over one pass of its keys and
// values, so each K and V row comes from memory once per row and group and the group's other
// heads find it in L1. Per head the arithmetic is that of one head alone, key by key in
// position order, so grouping changes no bit.

int first_visible(const AttentionParams& p, int pos) {
  return p.sliding_window > 0 ? std::max(0, pos - p.sliding_window + 1) : 0;
}

// Start of head `kv_head`'s K (or V) row of position `pos`.
const uint8_t* head_row(const KvCache& cache, bool keys, int layer, int pos, int kv_head, int width) {
  const void* stored = keys ? cache.k_row(layer, pos) : cache.v_row(layer, pos);
  return static_cast<const uint8_t*>(stored) + static_cast<size_t>(kv_head) * width * cache.element_bytes();
}

// The group's queries of one row in the format the cache's dot takes (f16 for an f16 cache,
// as ggml converts the query once), head_dim_k elements apart.
const void* group_queries(const KvCache& cache, const AttentionParams& p, const float* q_row, int kv_head,
                          std::vector<uint16_t>& q16) {
  const int group = p.n_head / p.n_head_kv, dk = p.head_dim_k;
  const float* q = q_row + static_cast<size_t>(kv_head) * group * dk;
  if (cache.type() != KvType::F16) return q;
  q16.resize(static_cast<size_t>(group) * dk);
  for (int h = 0; h < group; ++h) {
    quantize_activations(TensorType::F16, q + static_cast<size_t>(h) * dk, q16.data() + static_cast<size_t>(h) * dk, dk);
  }
  return q16.data();
}

DotFn cache_dot(const KvCache& cache) {
  return cache.type() == KvType::F16 ? &dot_f16_f16 : kernels(TensorType::F32).dot;
}

// Flash numerics: the visible positions are cut into blocks of kAttentionDecodeBlock positions
// at multiples of it (so the cut depends neither on the thread count nor on the batch), each
// block runs ggml's online softmax on its own, and the blocks' partial results are merged in
// position order the way ggml's split-KV decode path merges its chunks. A partial is the
// running max, the sum of weights, then the dv weighted V sums in f32.
constexpr size_t kPartialHeader = 2;

// flash_block on an f16 cache: the group's steps by f16_flash_keys (quant.h), which converts
// each key and value row once for all the group's heads; the partials' headers are set.
void flash_block_f16(const KvCache& cache, int layer, const AttentionParams& p, int kv_head, const uint16_t* queries,
                     int j0, int j1, float* partials, size_t head_stride, uint16_t* acc16) {
  const int group = p.n_head / p.n_head_kv, dv = p.head_dim_v;
  F16FlashArgs a;
  a.q = queries;
  a.heads = group;
  a.dk = p.head_dim_k;
  a.dv = dv;
  a.k = reinterpret_cast<const uint16_t*>(head_row(cache, true, layer, j0, kv_head, a.dk));
  a.v = reinterpret_cast<const uint16_t*>(head_row(cache, false, layer, j0, kv_head, dv));
  a.k_stride = static_cast<size_t>(cache.k_width(layer));
  a.v_stride = static_cast<size_t>(cache.v_width(layer));
  a.scale = p.softcap != 0.0f ? p.scale / p.softcap : p.scale;
  a.softcap = p.softcap;
  thread_local std::vector<float> max, sum;
  max.assign(static_cast<size_t>(group), -INFINITY);
  sum.assign(static_cast<size_t>(group), 0.0f);
  f16_flash_keys(a, j1 - j0 + 1, max.data(), sum.data(), acc16);
  for (int h = 0; h < group; ++h) {
    float* part = partials + static_cast<size_t>(h) * head_stride;
    part[0] = max[static_cast<size_t>(h)];
    part[1] = sum[static_cast<size_t>(h)];
    const uint16_t* acc = acc16 + static_cast<size_t>(h) * dv;
    for (int d = 0; d < dv; ++d) part[kPartialHeader + d] = fp16_to_fp32(acc[d]);
  }
}

// ggml's online softmax for the heads of `kv_head` over positions [j0, j1] of one row. Per head
// and key: the score from the dot, times the scale (then the softcap); a new maximum rescales
// the V sum by exp(old - new) and the key weighs 1, otherwise it weighs exp(s - max); the V sum
// takes v * weight, rounded to f16 after every step on an f16 cache (ggml's f16 running sum,
// flash_block_f16). Head h's partial goes to partials + h * head_stride.
void flash_block(const KvCache& cache, int layer, const AttentionParams& p, int kv_head, const void* queries,
                 int j0, int j1, float* partials, size_t head_stride) {
  const int group = p.n_head / p.n_head_kv, dk = p.head_dim_k, dv = p.head_dim_v;
  for (int h = 0; h < group; ++h) {
    float* part = partials + static_cast<size_t>(h) * head_stride;
    part[0] = -INFINITY;
    part[1] = 0.0f;
    std::fill(part + kPartialHeader, part + kPartialHeader + dv, 0.0f);
  }
  if (cache.type() == KvType::F16) {
    thread_local std::vector<uint16_t> acc16;
    acc16.assign(static_cast<size_t>(group) * dv, 0);
    return flash_block_f16(cache, layer, p, kv_head, static_cast<const uint16_t*>(queries), j0, j1, partials,
                           head_stride, acc16.data());
  }
  const DotFn dot = cache_dot(cache);
  const float scale = p.softcap != 0.0f ? p.scale / p.softcap : p.scale;
  for (int j = j0; j <= j1; ++j) {
    const uint8_t* k = head_row(cache, true, layer, j, kv_head, dk);
    const auto* v = reinterpret_cast<const float*>(head_row(cache, false, layer, j, kv_head, dv));
    for (int h = 0; h < group; ++h) {
      float* part = partials + static_cast<size_t>(h) * head_stride;
      float* acc = part + kPartialHeader;
      float s = dot(k, static_cast<const float*>(queries) + static_cast<size_t>(h) * dk, dk) * scale;
      if (p.softcap != 0.0f) s = p.softcap * std::tanh(s);
      float ms = 1.0f, vs = 1.0f;
      if (s > part[0]) {
        ms = std::exp(part[0] - s);
        part[0] = s;
        ops::scale(acc, ms, dv);
      } else {
        vs = std::exp(s - part[0]);
      }
      for (int d = 0; d < dv; ++d) acc[d] += v[d] * vs;
      part[1] = part[1] * ms + vs;
    }
  }
}

// Attention sinks (gpt-oss): an extra logit with weight and no value, taken into the row's
// first block as ggml takes it into its first chunk.
void add_sink(float* part, int dv, float sink) {
  float ms = 1.0f, vs = 1.0f;
  if (sink > part[0]) {
    ms = std::exp(part[0] - sink);
    part[0] = sink;
    ops::scale(part + kPartialHeader, ms, dv);
  } else {
    vs = std::exp(sink - part[0]);
  }
  part[1] = part[1] * ms + vs;
}

// Merges one head's block partials in position order and writes the normalised result. A step
// is ggml's: m = max(m, m_b), acc = acc * exp(m_old - m) + acc_b * exp(m_b - m) (the first
// product fused, as GCC contracts ggml's line), likewise the sum. The first block is taken as
// it is, which is what that step gives from the empty start (exp(-inf) = 0).
void merge_blocks(const float* first, int n_blocks, size_t block_stride, int dv, float* out) {
  thread_local std::vector<float> acc;
  acc.assign(first + kPartialHeader, first + kPartialHeader + dv);
  float max = first[0], sum = first[1];
  for (int b = 1; b < n_blocks; ++b) {
    const float* part = first + static_cast<size_t>(b) * block_stride;
    if (part[1] == 0.0f) continue;
    const float merged = std::max(max, part[0]);
    const float old_scale = std::exp(max - merged), new_scale = std::exp(part[0] - merged);
    for (int d = 0; d < dv; ++d) acc[d] = std::fma(acc[d], old_scale, part[kPartialHeader + d] * new_scale);
    sum = std::fma(sum, old_scale, part[1] * new_scale);
    max = merged;
  }
  const float inv = sum == 0.0f ? 0.0f : 1.0f / sum;
  for (int d = 0; d < dv; ++d) out[d] = acc[d] * inv;
}

// Tasks: (row, KV group, block); rows whose visible positions fit one block are finished in
// their task, the others merged in a second pass. The split lets threads share a group when
// there are fewer groups than threads, and keeps each task's V sums in L1.
void attention_decode_flash(ThreadPool& pool, const KvCache& cache, int layer, const AttentionParams& p,
                            const float* q, const int* pos, int n, float* out) {
  const int group = p.n_head / p.n_head_kv, dv = p.head_dim_v, B = kAttentionDecodeBlock;
  const int n_blocks = *std::max_element(pos, pos + n) / B + 1;
  const size_t block_stride = kPartialHeader + static_cast<size_t>(dv);
  const size_t head_stride = block_stride * n_blocks;
  thread_local std::vector<float> partials;
  partials.resize(static_cast<size_t>(n) * p.n_head * head_stride);
  float* const base = partials.data();
  auto one_block = [&](int row) { return first_visible(p, pos[row]) / B == pos[row] / B; };
  pool.run(static_cast<int64_t>(n) * p.n_head_kv * n_blocks, [&](int64_t t, int) {
    const int b = static_cast<int>(t % n_blocks), kv_head = static_cast<int>(t / n_blocks % p.n_head_kv);
    const int row = static_cast<int>(t / n_blocks / p.n_head_kv);
    const int first = first_visible(p, pos[row]);
    if (b > pos[row] / B || b < first / B) return;
    thread_local std::vector<uint16_t> q16;
    const void* queries = group_queries(cache, p, q + static_cast<size_t>(row) * p.n_head * p.head_dim_k, kv_head, q16);
    const int head0 = kv_head * group;
    float* parts = base + (static_cast<size_t>(row) * p.n_head + head0) * head_stride + b * block_stride;
    flash_block(cache, layer, p, kv_head, queries, std::max(first, b * B), std::min(pos[row], b * B + B - 1), parts,
                head_stride);
    for (int h = 0; h < group; ++h) {
      float* part = parts + static_cast<size_t>(h) * head_stride;
      if (p.sinks != nullptr && b == first / B) add_sink(part, dv, p.sinks[head0 + h]);
      if (one_block(row)) merge_blocks(part, 1, block_stride, dv, out + (static_cast<size_t>(row) * p.n_head + head0 + h) * dv);
    }
  });
  bool any_split = false;
  for (int row = 0; row < n; ++row) any_split = any_split || !one_block(row);
  if (!any_split) return;
  pool.run(static_cast<int64_t>(n) * p.n_head, [&](int64_t t, int) {
    const int row = static_cast<int>(t / p.n_head), head = static_cast<int>(t % p.n_head);
    if (one_block(row)) return;
    const int b0 = first_visible(p, pos[row]) / B, b1 = pos[row] / B;
    merge_blocks(base + (static_cast<size_t>(row) * p.n_head + head) * head_stride + b0 * block_stride, b1 - b0 + 1,
                 block_stride, dv, out + static_cast<size_t>(t) * dv);
  });
}

// Classic numerics for one row and KV group: the scores of all the group's heads from one pass
// over the keys, then per head ggml's softmax (f32, the sum in double, the weights rounded to
// the cache type), then one pass over the values adding v * weight per head in f32.
void classic_softmax(const AttentionParams& p, bool f16_cache, int head, float* w, int n) {
  float max = -INFINITY;
  for (int j = 0; j < n; ++j) max = std::max(max, w[j]);
  if (p.sinks != nullptr) max = std::max(max, p.sinks[head]);
  double sum = 0.0;
  for (int j = 0; j < n; ++j) {
    w[j] = std::exp(w[j] - max);
    sum += static_cast<double>(w[j]);
  }
  if (p.sinks != nullptr) sum += static_cast<double>(std::exp(p.sinks[head] - max));
  const float inv = static_cast<float>(1.0 / sum);
  for (int j = 0; j < n; ++j) {
    w[j] *= inv;
    if (f16_cache) w[j] = fp16_to_fp32(fp32_to_fp16(w[j]));  // the weights meet V in its type
  }
}

void classic_group(const KvCache& cache, int layer, const AttentionParams& p, int kv_head, const void* queries,
                   int pos, float* out_row) {
  const int group = p.n_head / p.n_head_kv, dk = p.head_dim_k, dv = p.head_dim_v;
  const bool f16_cache = cache.type() == KvType::F16;
  const DotFn dot = cache_dot(cache);
  const size_t q_bytes = static_cast<size_t>(dk) * cache.element_bytes();
  const int first = first_visible(p, pos), n = pos - first + 1;
  thread_local std::vector<float> w;  // group x n weights
  w.resize(static_cast<size_t>(group) * n);
  for (int j = 0; j < n; ++j) {
    const uint8_t* k = head_row(cache, true, layer, first + j, kv_head, dk);
    for (int h = 0; h < group; ++h) {
      float s = dot(k, static_cast<const uint8_t*>(queries) + h * q_bytes, dk);
      if (p.softcap != 0.0f) s = p.softcap * std::tanh(s / p.softcap);
      w[static_cast<size_t>(h) * n + j] = s * p.scale;
    }
  }
  const int head0 = kv_head * group;
  for (int h = 0; h < group; ++h) classic_softmax(p, f16_cache, head0 + h, w.data() + static_cast<size_t>(h) * n, n);
  float* out = out_row + static_cast<size_t>(head0) * dv;
  std::fill(out, out + static_cast<size_t>(group) * dv, 0.0f);
  for (int j = 0; j < n; ++j) {
    const uint8_t* v = head_row(cache, false, layer, first + j, kv_head, dv);
    for (int h = 0; h < group; ++h) {
      const float wj = w[static_cast<size_t>(h) * n + j];
      float* o = out + static_cast<size_t>(h) * dv;
      if (f16_cache) {
        const auto* v16 = reinterpret_cast<const uint16_t*>(v);
        for (int d = 0; d < dv; ++d) o[d] += fp16_to_fp32(v16[d]) * wj;
      } else {
        const auto* v32 = reinterpret_cast<const float*>(v);
        for (int d = 0; d < dv; ++d) o[d] += v32[d] * wj;
      }
    }
  }
}

void attention_decode_classic(ThreadPool& pool, const KvCache& cache, int layer, const AttentionParams& p,
                              const float* q, const int* pos, int n, float* out) {
  pool.run(static_cast<int64_t>(n) * p.n_head_kv, [&](int64_t t, int) {
    const int row = static_cast<int>(t / p.n_head_kv), kv_head = static_cast<int>(t % p.n_head_kv);
    thread_local std::vector<uint16_t> q16;
    const void* queries = group_queries(cache, p, q + static_cast<size_t>(row) * p.n_head * p.head_dim_k, kv_head, q16);
    classic_group(cache, layer, p, kv_head, queries, pos[row], out + static_cast<size_t>(row) * p.n_head * p.head_dim_v);
  });
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
  if (p.numerics == AttentionNumerics::Flash) {
    attention_decode_flash(pool, cache, layer, p, q, pos, n, out);
  } else {
    attention_decode_classic(pool, cache, layer, p, q, pos, n, out);
  }
}

}  // namespace bmoe
