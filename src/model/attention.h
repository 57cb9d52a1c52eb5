// KV cache and causal attention, rounded like one of ggml's two CPU attention paths so
// results stay within float noise of llama.cpp's:
//  - Classic (llama.cpp without flash attention): the query is rounded to the cache
//    type, all scores are computed, softmax in f32, the weights are rounded to the cache type
//    and V is summed in f32.
//  - Flash (llama.cpp's flash attention): online softmax; on an f16 cache and for small query
//    batches (< 64 rows, i.e. decode) the weighted V sum is accumulated in f16. That running
//    f16 sum turns float noise into ulp-sized steps, so it agrees less well with any other
//    implementation (llama.cpp's own two paths included). Decode cuts the positions into
//    blocks of kAttentionDecodeBlock, each its own online softmax, merged in position order
//    as ggml's split-KV decode merges its chunks (ggml cuts where its thread count says; bmoe
//    at fixed multiples, so its bits do not depend on threads). Batches of 64 rows or more take
//    ggml's tiled path: f32 queries, keys and values converted a 64-position tile at a time,
//    scores and the V sum by f32 GEMM (quant/float_kernels.h), the softmax updated per tile.
//    Its tiles start at multiples of 64 positions, so a row's result there does not depend on
//    which rows share its batch, and its memory does not grow with the prompt.
#pragma once

#include <cstdint>
#include <vector>

#include "core/thread_pool.h"

namespace bmoe {

enum class KvType { F16, F32 };
enum class AttentionNumerics { Classic, Flash };

class KvCache {
 public:
  // Row widths (kv heads x head size) of K and V, one entry per layer.
  void init(int n_ctx, const std::vector<int>& k_widths, const std::vector<int>& v_widths, KvType type);
  int capacity() const { return n_ctx_; }
  KvType type() const { return type_; }
  // Stores token `pos`'s K and V rows (all kv heads, f32 in) of `layer`.
  void store(int layer, int pos, const float* k, const float* v);
  // Row of position `pos`: uint16_t (f16) or float elements depending on type().
  const void* k_row(int layer, int pos) const { return row(k_, layer, pos, k_width_[static_cast<size_t>(layer)]); }
  const void* v_row(int layer, int pos) const { return row(v_, layer, pos, v_width_[static_cast<size_t>(layer)]); }
  int k_width(int layer) const { return k_width_[static_cast<size_t>(layer)]; }
  int v_width(int layer) const { return v_width_[static_cast<size_t>(layer)]; }
  size_t element_bytes() const { return type_ == KvType::F16 ? 2 : 4; }
  size_t bytes() const;

 private:
  const void* row(const std::vector<std::vector<uint8_t>>& data, int layer, int pos, int width) const {
    return data[static_cast<size_t>(layer)].data() + static_cast<size_t>(pos) * width * element_bytes();
  }
  int n_ctx_ = 0;
  std::vector<int> k_width_;
  std::vector<int> v_width_;
  KvType type_ = KvType::F16;
  std::vector<std::vector<uint8_t>> k_;
  std::vector<std::vector<uint8_t>> v_;
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
  AttentionNumerics numerics = AttentionNumerics::Flash;
  // Rows take the path of a batch of >= kAttentionBatchRows rows whatever their number (a
  // rewind replays rows on the path they first took).
  bool batch_path = false;
};

// Batches of this many rows or more take the batch (tiled) attention path; a row's result does
// not depend on its batch within a path, but the paths round differently.
constexpr int kAttentionBatchRows = 64;

// Smaller batches (decode) with flash numerics cut the visible positions into blocks of this
// many, at multiples of it; each block is softmaxed on its own and the blocks are merged in
// position order (ggml's split-KV decode), so threads can share a KV group's positions.
constexpr int kAttentionDecodeBlock = 256;

// Attention for queries q[i] (n_head * head_dim_k floats each) at positions pos[i], over the
// cache of `layer` (positions <= pos[i] must be stored). Writes n_head * head_dim_v per row.
// Decode rows compute the query heads of a KV group together over one pass of its keys and
// values (each K/V row read once per row and group); threads split rows, groups and blocks.
void attention(ThreadPool& pool, const KvCache& cache, int layer, const AttentionParams& p,
               const float* q, const int* pos, int n, float* out);

}  // namespace bmoe
