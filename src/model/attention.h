// KV cache (f16) and causal attention computed the way ggml's CPU flash-attention does:
// the query is rounded to f16, scores are f16 dot products in f32, the softmax is online, and
// for small query batches (< 64 rows, i.e. decode) the weighted V sum is accumulated in f16.
// Matching those rounding points keeps our logits within float noise of llama.cpp's.
#pragma once

#include <cstdint>
#include <vector>

#include "core/thread_pool.h"

namespace bmoe {

class KvCache {
 public:
  void init(int n_layer, int n_ctx, int n_head_kv, int head_dim_k, int head_dim_v);
  int capacity() const { return n_ctx_; }
  // Stores token `pos`'s K and V rows (all kv heads, f32 in) of `layer`.
  void store(int layer, int pos, const float* k, const float* v);
  const uint16_t* k_row(int layer, int pos) const { return k_[static_cast<size_t>(layer)].data() + static_cast<size_t>(pos) * k_width_; }
  const uint16_t* v_row(int layer, int pos) const { return v_[static_cast<size_t>(layer)].data() + static_cast<size_t>(pos) * v_width_; }
  int k_width() const { return k_width_; }
  int v_width() const { return v_width_; }
  size_t bytes() const;

 private:
  int n_ctx_ = 0;
  int k_width_ = 0;
  int v_width_ = 0;
  std::vector<std::vector<uint16_t>> k_;
  std::vector<std::vector<uint16_t>> v_;
};

struct AttentionParams {
  int n_head = 0;
  int n_head_kv = 0;
  int head_dim_k = 0;
  int head_dim_v = 0;
  float scale = 1.0f;
  float softcap = 0.0f;
  int sliding_window = 0;        // 0: full causal attention
  const float* sinks = nullptr;  // per-head sink logits (gpt-oss), or null
};

// Attention for queries q[i] (n_head * head_dim_k floats each) at positions pos[i], over the
// cache of `layer` (positions <= pos[i] must be stored). Writes n_head * head_dim_v per row.
void attention(ThreadPool& pool, const KvCache& cache, int layer, const AttentionParams& p,
               const float* q, const int* pos, int n, float* out);

}  // namespace bmoe
