// DeepSeek-V4's attention (MixerKind::CompressedAttention), as llama.cpp computes it:
//  - query: q_b(rms(q_a x) * q_a_norm), each head RMS-normed without a weight; key = value: one
//    head kv = rms(kv x) * kv_norm. Only the last n_rot dims of a head rotate (adjacent pairs),
//    with plain RoPE on window-only layers and the compressed set (YaRN frequencies) elsewhere;
//  - every layer attends to a raw window (the last sliding_window tokens, itself included); a
//    ratio-128 layer also to every completed 128-token block's compressed row, a ratio-4 layer
//    to the completed 4-token blocks' rows its lightning indexer ranks highest (top_k);
//  - a compressor keeps, per token, values a = comp_kv x and scores g = comp_gate x + ape[pos %
//    ratio]; a completed block's row is per feature the softmax-over-tokens weighted sum of a
//    (ratio 4 overlaps: the previous block's first halves and the block's second halves), then
//    RMS-normed and roped at the block's first position. The indexer's keys are built the same
//    way (ratio 4, its own widths) and Hadamard-rotated, as llama.cpp stores them;
//  - the output is de-roped at the query's position (V carries RoPE), then the grouped low-rank
//    projection: group g of consecutive heads through its slab of wo_a, concatenated, wo_b.
// The per-sequence state keeps every completed block's rows, and the raw rows and compressor
// inputs of the newest positions only, in rings keyed by position: the window (or the blocks
// still pending) plus a slack. A row depends only on tokens up to its own position, so a rewind
// of up to the slack only moves the sequence length back; a longer one restores the copy saved
// at the last multi-token pass and replays (InferenceState::truncate). Passes longer than the
// slack store and attend in chunks of the slack, so a pass never overwrites a ring row one of
// its own rows still reads (docs/families/deepseek4.md, section 4).
#include <algorithm>
#include <climits>
#include <cmath>
#include <cstring>
#include <numeric>

#include "core/error.h"
#include "core/fp16.h"
#include "model/mixer_units.h"
#include "model/ops.h"
#include "quant/isa_target.h"
#include "quant/quant.h"

namespace bmoe::mixer_units {

namespace {

// Rows of `width` values stored in the cache type (f16 rounds them, as llama.cpp's caches do).
class Rows {
 public:
  void init(int64_t n, int width, KvType type) {
    width_ = width;
    f16_ = type == KvType::F16;
    data_.assign(static_cast<size_t>(n) * width * (f16_ ? 2 : 4), 0);
  }
  void store(int64_t i, const float* v) {
    uint8_t* dst = data_.data() + static_cast<size_t>(i) * row_bytes();
    if (f16_) quantize_activations(TensorType::F16, v, dst, width_);
    else std::memcpy(dst, v, static_cast<size_t>(width_) * 4);
  }
  const void* row(int64_t i) const { return data_.data() + static_cast<size_t>(i) * row_bytes(); }
  bool f16() const { return f16_; }
  size_t row_bytes() const { return static_cast<size_t>(width_) * (f16_ ? 2 : 4); }
  size_t bytes() const { return data_.size(); }

 private:
  std::vector<uint8_t> data_;
  int width_ = 0;
  bool f16_ = true;
};

// A query in a cache's format and its dot with a stored row (f16 x f16 or f32 x f32, f32 sums).
struct Query {
  std::vector<uint16_t> q16;
  const float* q32 = nullptr;
  void set(const float* q, int n, bool f16) {
    q32 = q;
    if (!f16) return;
    q16.resize(static_cast<size_t>(n));
    quantize_activations(TensorType::F16, q, q16.data(), n);
  }
  float dot(const Rows& rows, int64_t i, int n) const {
    if (rows.f16()) return dot_f16_pair(static_cast<const uint16_t*>(rows.row(i)), q16.data(), n);
    return kernels(TensorType::F32).dot(rows.row(i), q32, n);
  }
};

// A compressor's per-token inputs (f32 values and position-biased scores) in a ring of `slots`
// positions, slot pos % slots.
struct CompressorRing {
  int slots = 0, width = 0;
  std::vector<float> kv, score;
  void init(int n, int w) {
    slots = n;
    width = w;
    kv.assign(static_cast<size_t>(n) * w, 0.0f);
    score.assign(static_cast<size_t>(n) * w, 0.0f);
  }
  size_t at(int pos) const { return static_cast<size_t>(pos % slots) * width; }
  uint64_t bytes() const { return (kv.size() + score.size()) * sizeof(float); }
};

// The part of a layer's state a rewind beyond the slack restores: the rings.
struct Rings {
  Rows raw;                    // [window + slack]: the roped kv of the newest positions
  CompressorRing comp, index;  // the compressor's and (ratio 4) the indexer compressor's inputs
};

// One layer's per-sequence state.
struct LayerState {
  int ratio = 0;
  int raw_slots = 0;  // raw row of position p: slot p % raw_slots
  Rings live, saved;
  Rows comp;  // [n_ctx / ratio][head_dim]: completed blocks
  Rows idx;   // [n_ctx / 4][indexer head size], Hadamard-rotated
};

// Ring sizes: positions a pass or rewind may still read, plus the slack (or the whole context
// when that is less: such a ring never wraps).
int ring_slots(int needed, int slack, int n_ctx) { return static_cast<int>(std::min<int64_t>(int64_t{needed} + slack, n_ctx)); }

// The orthonormal Sylvester-Hadamard matrix of size n (n a power of two), row-major.
std::vector<float> hadamard(int n) {
  std::vector<float> h(static_cast<size_t>(n) * n);
  h[0] = 1.0f / std::sqrt(static_cast<float>(n));
  for (int s = 1; s < n; s *= 2) {
    for (int i = 0; i < s; ++i) {
      for (int j = 0; j < s; ++j) {
        const float v = h[static_cast<size_t>(i) * n + j];
        h[static_cast<size_t>(i + s) * n + j] = v;
        h[static_cast<size_t>(i) * n + j + s] = v;
        h[static_cast<size_t>(i + s) * n + j + s] = -v;
      }
    }
  }
  return h;
}

// x (heads of n) = H x per head.
void rotate_heads(const std::vector<float>& h, float* x, int heads, int n) {
  std::vector<float> tmp(static_cast<size_t>(n));
  for (int k = 0; k < heads; ++k) {
    float* v = x + static_cast<size_t>(k) * n;
    for (int i = 0; i < n; ++i) {
      const float* r = h.data() + static_cast<size_t>(i) * n;
      float sum = 0.0f;
      for (int j = 0; j < n; ++j) sum += r[j] * v[j];
      tmp[static_cast<size_t>(i)] = sum;
    }
    std::copy(tmp.begin(), tmp.end(), v);
  }
}

// What one query row attends to: its position, the raw window's first position, the
// compressed rows it sees (ascending), and its query heads.
struct AttendRow {
  int pos = 0;
  int first_raw = 0;
  std::vector<int> comp_rows;
  const float* q = nullptr;
};

// The keys the rows of one attend() chunk read on the classic path, as f32: an f16 cache's rows
// are converted once for all the heads of all the chunk's rows (f16 -> f32 is exact, so every
// head reads the values a conversion of its own would give); an f32 cache's are read in place.
class KeysF32 {
 public:
  void load(const LayerState& s, const std::vector<AttendRow>& rows, int first, int end, int D, ThreadPool& pool);
  const float* raw(const LayerState& s, int64_t slot) const {
    if (!s.live.raw.f16()) return static_cast<const float*>(s.live.raw.row(slot));
    return raw_.data() + static_cast<size_t>(slot) * D_;
  }
  const float* comp(const LayerState& s, int64_t row) const {
    if (!s.comp.f16()) return static_cast<const float*>(s.comp.row(row));
    return comp_.data() + static_cast<size_t>(comp_at_[static_cast<size_t>(row)]) * D_;
  }

 private:
  std::vector<float> raw_, comp_;
  std::vector<int> comp_at_;  // compressed row -> its index in comp_ (-1: not read by the chunk)
  int D_ = 0;
};

// Converts the raw slots of positions [lowest first_raw, highest pos] of rows [first, end) and
// every compressed row one of them selected.
void KeysF32::load(const LayerState& s, const std::vector<AttendRow>& rows, int first, int end, int D,
                   ThreadPool& pool) {
  D_ = D;
  if (!s.live.raw.f16()) return;
  int lo = INT_MAX, hi = -1, n_comp = 0;
  for (int i = first; i < end; ++i) {
    const AttendRow& row = rows[static_cast<size_t>(i)];
    lo = std::min(lo, row.first_raw);
    hi = std::max(hi, row.pos);
    if (!row.comp_rows.empty()) n_comp = std::max(n_comp, row.comp_rows.back() + 1);
  }
  comp_at_.assign(static_cast<size_t>(n_comp), -1);
  std::vector<int> comp_list;
  for (int i = first; i < end; ++i) {
    for (int r : rows[static_cast<size_t>(i)].comp_rows) {
      int& at = comp_at_[static_cast<size_t>(r)];
      if (at >= 0) continue;
      at = static_cast<int>(comp_list.size());
      comp_list.push_back(r);
    }
  }
  raw_.resize(static_cast<size_t>(s.raw_slots) * D);
  comp_.resize(comp_list.size() * static_cast<size_t>(D));
  const int n_raw = hi - lo + 1;
  pool.run(int64_t{n_raw} + static_cast<int64_t>(comp_list.size()), [&](int64_t job, int) {
    if (job < n_raw) {
      const int64_t slot = (lo + job) % s.raw_slots;
      dequantize_row(TensorType::F16, s.live.raw.row(slot), raw_.data() + slot * D, D);
    } else {
      const size_t at = static_cast<size_t>(job - n_raw);
      dequantize_row(TensorType::F16, s.comp.row(comp_list[at]), comp_.data() + at * D, D);
    }
  });
}

// The keys of one attending row: its raw window in position order, then its compressed rows.
struct RowKeys {
  const LayerState& s;
  const AttendRow& row;
  const KeysF32* f32 = nullptr;  // the chunk's keys as f32 (classic path only)
  int n_raw() const { return row.pos - row.first_raw + 1; }
  int size() const { return n_raw() + static_cast<int>(row.comp_rows.size()); }
  std::pair<const Rows*, int64_t> operator[](int k) const {
    if (k < n_raw()) return {&s.live.raw, (row.first_raw + k) % s.raw_slots};
    return {&s.comp, row.comp_rows[static_cast<size_t>(k - n_raw())]};
  }
  const float* key32(int k) const {
    if (k < n_raw()) return f32->raw(s, (row.first_raw + k) % s.raw_slots);
    return f32->comp(s, row.comp_rows[static_cast<size_t>(k - n_raw())]);
  }
};

// One query head's attention over a row's keys (K = V), with its sink.
struct HeadAttention {
  RowKeys keys;
  const float* q;
  int D;
  float scale, sink;
};

// ggml's flash attention: f16 query, online softmax, V summed in f16, the sink folded in last.
void attend_flash(const HeadAttention& a, float* out) {
  const int D = a.D;
  Query query;
  query.set(a.q, D, true);
  std::vector<uint16_t> acc(static_cast<size_t>(D), 0);
  float M = -INFINITY, S = 0.0f;
  for (int k = 0; k < a.keys.size(); ++k) {
    const auto [rows, r] = a.keys[k];
    const float sc = query.dot(*rows, r, D) * a.scale;
    float ms = 1.0f, vs = 1.0f;
    if (sc > M) {
      ms = std::exp(M - sc);
      M = sc;
      f16_scale(acc.data(), ms, D);
    } else {
      vs = std::exp(sc - M);
    }
    f16_fma_into(acc.data(), static_cast<const uint16_t*>(rows->row(r)), vs, D);
    S = S * ms + vs;
  }
  for (int d = 0; d < D; ++d) out[d] = fp16_to_fp32(acc[static_cast<size_t>(d)]);
  float ms = 1.0f, vs = 1.0f;
  if (a.sink > M) {
    ms = std::exp(M - a.sink);
    ops::scale(out, ms, D);
  } else {
    vs = std::exp(a.sink - M);
  }
  S = S * ms + vs;
  ops::scale(out, S == 0.0f ? 0.0f : 1.0f / S, D);
}

// out[d] += v[d] * w, the product rounded before the add (no fma), as ggml's f32 V sum: eight
// lanes at a time in the compiler's generic vectors (each lane the scalar loop's two roundings),
// in AVX2 registers where the CPU has them (a clone picked at load time).
BMOE_CLONES_FOR("avx2") void add_scaled(float* out, const float* v, float w, int n) {
  typedef float F8 __attribute__((vector_size(32)));
  const F8 wv = {w, w, w, w, w, w, w, w};
  int d = 0;
  for (; d + 8 <= n; d += 8) {
    F8 o, x;
    std::memcpy(&o, out + d, sizeof o);
    std::memcpy(&x, v + d, sizeof x);
    const F8 product = x * wv;
    o += product;
    std::memcpy(out + d, &o, sizeof o);
  }
  for (; d < n; ++d) out[d] += v[d] * w;
}

// ggml's classic and tiled paths: f32 query, a two-pass f32 softmax with the sink, an f32 V sum.
void attend_classic(const HeadAttention& a, float* out) {
  const int D = a.D, n_keys = a.keys.size();
  std::vector<float> w(static_cast<size_t>(n_keys));
  float max = a.sink;
  for (int k = 0; k < n_keys; ++k) {
    w[static_cast<size_t>(k)] = kernels(TensorType::F32).dot(a.keys.key32(k), a.q, D) * a.scale;
    max = std::max(max, w[static_cast<size_t>(k)]);
  }
  double sum = std::exp(a.sink - max);
  for (float& v : w) {
    v = std::exp(v - max);
    sum += v;
  }
  const float inv = static_cast<float>(1.0 / sum);
  std::fill(out, out + D, 0.0f);
  for (int k = 0; k < n_keys; ++k) {
    add_scaled(out, a.keys.key32(k), w[static_cast<size_t>(k)] * inv, D);
  }
}

class CompressedAttentionMixer final : public Mixer {
 public:
  CompressedAttentionMixer(const ModelConfig& c, int n_ctx, KvType kv_type, int rewind_slack)
      : n_ctx_(n_ctx), chunk_(std::max(1, rewind_slack)), hadamard_(hadamard(std::max(1, c.csa.indexer_head_dim))) {
    const int D = c.head_dim, ID = c.csa.indexer_head_dim;
    layers_.resize(static_cast<size_t>(c.n_layer));
    for (int l = 0; l < c.n_layer; ++l) {
      if (c.mixer_at(l) != MixerKind::CompressedAttention) continue;
      LayerState& s = layers_[static_cast<size_t>(l)];
      s.ratio = c.csa.ratio_at(l);
      s.raw_slots = ring_slots(c.sliding_at(l), chunk_, n_ctx);
      s.live.raw.init(s.raw_slots, D, kv_type);
      wraps_ = wraps_ || s.raw_slots < n_ctx;
      if (s.ratio != 0) {
        // A block completing at p reads the inputs of p - pending + 1 .. p (ratio 4 overlaps the
        // previous block).
        const int pending = s.ratio == 4 ? 2 * s.ratio : s.ratio;
        s.live.comp.init(ring_slots(pending, chunk_, n_ctx), (s.ratio == 4 ? 2 : 1) * D);
        s.comp.init(n_ctx / s.ratio + 1, D, kv_type);
        wraps_ = wraps_ || s.live.comp.slots < n_ctx;
      }
      if (s.ratio == 4) {
        s.live.index.init(s.live.comp.slots, 2 * ID);
        s.idx.init(n_ctx / 4 + 1, ID, kv_type);
      }
      s.saved = s.live;
    }
  }

  void forward(const LayerWeights& weights, int layer, const LayerPass& pass) override {
    const CompressedAttentionWeights& L = *weights.compressed;
    LayerState& s = layers_[static_cast<size_t>(layer)];
    if (pass.positions[pass.n - 1] >= n_ctx_) fail("internal: position {} beyond the context of {}", pass.positions[pass.n - 1], n_ctx_);
    sinks_ = &L.sinks;
    pre_norm(pass, weights.attn_norm, h_);
    project(L, s, pass);
    prepare_rows(L, layer, pass);
    attn_.resize(static_cast<size_t>(pass.n) * pass.cfg.n_head * pass.cfg.head_dim);
    for (int first = 0; first < pass.n; first += chunk_) {
      const int end = std::min(pass.n, first + chunk_);
      store_rows(L, s, pass, first, end);
      if (s.ratio != 0) compress(L, s, pass, first, end);
      attend(L, layer, s, pass, first, end);
    }
    output(L, layer, pass);
  }

  // The completed blocks' rows: what grows with the context.
  uint64_t kv_bytes() const override {
    uint64_t total = 0;
    for (const LayerState& s : layers_) total += s.comp.bytes() + s.idx.bytes();
    return total;
  }
  // The rings (live; the saved copy is as large).
  uint64_t recurrent_bytes() const override {
    uint64_t total = 0;
    for (const LayerState& s : layers_) total += s.live.raw.bytes() + s.live.comp.bytes() + s.live.index.bytes();
    return total;
  }
  void save_state() override {
    for (LayerState& s : layers_) s.saved = s.live;
  }
  void restore_state() override {
    for (LayerState& s : layers_) s.live = s.saved;
  }
  // A new sequence reads no ring row nor block row before writing it: nothing to reset.
  void clear_state() override {}
  int rewind_reach() const override { return wraps_ ? chunk_ : INT_MAX; }

 private:
  void project(const CompressedAttentionWeights& L, const LayerState& s, const LayerPass& pass);
  void prepare_rows(const CompressedAttentionWeights& L, int layer, const LayerPass& pass);
  void store_rows(const CompressedAttentionWeights& L, LayerState& s, const LayerPass& pass, int first, int end);
  void compress(const CompressedAttentionWeights& L, LayerState& s, const LayerPass& pass, int first, int end);
  void compress_block(const CompressorRing& ring, int ratio, int width, int first, const Vector& norm, int64_t block,
                      bool rotate, const LayerPass& pass, Rows& out);
  void select_rows(const CompressedAttentionWeights& L, const LayerState& s, const LayerPass& pass, int i,
                   std::vector<int>& rows);
  void attend(const CompressedAttentionWeights& L, int layer, const LayerState& s, const LayerPass& pass, int first,
              int end);
  static bool flash_path(const LayerState& s, const LayerPass& pass) {
    return s.live.raw.f16() && pass.n < kAttentionBatchRows && !pass.batch_path;
  }
  void attend_head(const LayerState& s, const LayerPass& pass, const AttendRow& row, int head, float* out) const;
  void output(const CompressedAttentionWeights& L, int layer, const LayerPass& pass);

  const RopeConfig& rope_of(const ModelConfig& c, int layer) const { return c.csa.ratio_at(layer) != 0 ? c.csa.rope : c.rope; }

  const Vector* sinks_ = nullptr;  // the layer's, during forward()
  int n_ctx_;
  int chunk_;           // rows a pass stores and attends at a time: the rewind slack
  bool wraps_ = false;  // some ring is shorter than the context
  std::vector<float> hadamard_;
  std::vector<LayerState> layers_;
  std::vector<float> h_, qa_, qr_, q_, kv_, ckv_, cgate_, ikv_, igate_, iq_, iw_, attn_, z_, proj_;
  std::vector<AttendRow> rows_;
  KeysF32 keys32_;  // the attending chunk's keys in f32 (classic path)
  Activations acts_, qr_acts_;
  std::vector<ActivationBuffer> group_acts_;
  ActivationBuffer out_act_;
};

// Every projection of the pass's rows: those of the normed input, then those of the normed
// low-rank query.
void CompressedAttentionMixer::project(const CompressedAttentionWeights& L, const LayerState& s, const LayerPass& pass) {
  const ModelConfig& c = pass.cfg;
  const int n = pass.n, E = c.n_embd, QL = c.csa.q_lora_rank, D = c.head_dim;
  const size_t rows = static_cast<size_t>(n);
  acts_.reset();
  auto job = [&](const Weight& w, std::vector<float>& out) {
    out.resize(rows * static_cast<size_t>(w.rows));
    return MatmulJob{&w, &acts_.get(pass.pool, w.type, h_.data(), n, E), n, nullptr, out.data(), w.rows};
  };
  std::vector<MatmulJob> jobs = {job(L.wq_a, qa_), job(L.wkv, kv_)};
  if (s.ratio != 0) {
    jobs.push_back(job(L.comp_kv, ckv_));
    jobs.push_back(job(L.comp_gate, cgate_));
  }
  if (s.ratio == 4) {
    jobs.push_back(job(L.idx_comp_kv, ikv_));
    jobs.push_back(job(L.idx_comp_gate, igate_));
    jobs.push_back(job(L.idx_proj, iw_));
  }
  run_matmuls(pass.pool, jobs);
  qr_.resize(rows * QL);
  for (size_t i = 0; i < rows; ++i) ops::rms_norm(qa_.data() + i * QL, L.q_a_norm.data(), qr_.data() + i * QL, QL, c.norm_eps);
  qr_acts_.reset();
  q_.resize(rows * static_cast<size_t>(c.n_head) * D);
  std::vector<MatmulJob> q_jobs = {{&L.wq_b, &qr_acts_.get(pass.pool, L.wq_b.type, qr_.data(), n, QL), n, nullptr, q_.data(), L.wq_b.rows}};
  if (s.ratio == 4) {
    iq_.resize(rows * static_cast<size_t>(L.idx_q_b.rows));
    q_jobs.push_back({&L.idx_q_b, &qr_acts_.get(pass.pool, L.idx_q_b.type, qr_.data(), n, QL), n, nullptr, iq_.data(), L.idx_q_b.rows});
  }
  run_matmuls(pass.pool, q_jobs);
}

// Per row: the weightless per-head q norm, the kv norm, RoPE on the last n_rot dims.
void CompressedAttentionMixer::prepare_rows(const CompressedAttentionWeights& L, int layer, const LayerPass& pass) {
  const ModelConfig& c = pass.cfg;
  const int H = c.n_head, D = c.head_dim, R = c.rope.n_rot;
  const RopeConfig& rope = rope_of(c, layer);
  for (int i = 0; i < pass.n; ++i) {
    const int pos = pass.positions[i];
    float* q = q_.data() + static_cast<size_t>(i) * H * D;
    for (int h = 0; h < H; ++h) ops::rms_norm(q + h * D, nullptr, q + h * D, D, c.norm_eps);
    ops::rope(q + (D - R), H, D, pos, rope);
    float* kv = kv_.data() + static_cast<size_t>(i) * D;
    ops::rms_norm(kv, L.kv_norm.data(), kv, D, c.norm_eps);
    ops::rope(kv + (D - R), 1, D, pos, rope);
  }
}

// Rows [first, end) into the rings: the raw row, the compressors' per-token inputs (scores
// biased by position in the block).
void CompressedAttentionMixer::store_rows(const CompressedAttentionWeights& L, LayerState& s, const LayerPass& pass,
                                          int first, int end) {
  const int D = pass.cfg.head_dim;
  auto keep = [&](int i, const std::vector<float>& a, const std::vector<float>& g, const Vector& ape, CompressorRing& ring) {
    const int pos = pass.positions[i], width = ring.width;
    const size_t at = ring.at(pos), from = static_cast<size_t>(i) * width;
    const float* bias = ape.data() + static_cast<size_t>(pos % s.ratio) * width;
    for (int j = 0; j < width; ++j) {
      ring.kv[at + j] = a[from + j];
      ring.score[at + j] = g[from + j] + bias[j];
    }
  };
  for (int i = first; i < end; ++i) {
    s.live.raw.store(pass.positions[i] % s.raw_slots, kv_.data() + static_cast<size_t>(i) * D);
    if (s.ratio != 0) keep(i, ckv_, cgate_, L.comp_ape, s.live.comp);
    if (s.ratio == 4) keep(i, ikv_, igate_, L.idx_comp_ape, s.live.index);
  }
}

// The blocks rows [first, end) complete, in order, before any of them attends (a block is
// visible to the token that completes it and to later tokens of the same pass).
void CompressedAttentionMixer::compress(const CompressedAttentionWeights& L, LayerState& s, const LayerPass& pass,
                                        int first, int end) {
  const ModelConfig& c = pass.cfg;
  for (int i = first; i < end; ++i) {
    const int pos = pass.positions[i];
    if ((pos + 1) % s.ratio != 0) continue;
    const int block_first = pos + 1 - s.ratio;
    const int64_t block = pos / s.ratio;
    compress_block(s.live.comp, s.ratio, c.head_dim, block_first, L.comp_norm, block, false, pass, s.comp);
    if (s.ratio == 4) {
      compress_block(s.live.index, 4, c.csa.indexer_head_dim, block_first, L.idx_comp_norm, block, true, pass, s.idx);
    }
  }
}

// One block's row: per feature a softmax over its candidate tokens' scores weighting their
// values (ratio 4: the previous block's first halves, then this block's second halves; before
// the first block, weight 0), RMS-normed, roped at the block's first position, stored.
void CompressedAttentionMixer::compress_block(const CompressorRing& ring, int ratio, int width, int first,
                                              const Vector& norm, int64_t block, bool rotate, const LayerPass& pass,
                                              Rows& out) {
  const ModelConfig& c = pass.cfg;
  const bool overlap = ratio == 4;
  const int candidates = overlap ? 2 * ratio : ratio;
  std::vector<float> row(static_cast<size_t>(width)), w(static_cast<size_t>(candidates)), v(static_cast<size_t>(candidates));
  for (int j = 0; j < width; ++j) {
    for (int t = 0; t < candidates; ++t) {
      const bool prev = overlap && t < ratio;
      const int p = prev ? first - ratio + t : first + (overlap ? t - ratio : t);
      const int col = overlap && !prev ? width + j : j;
      const bool missing = p < 0;
      w[static_cast<size_t>(t)] = missing ? -INFINITY : ring.score[ring.at(p) + col];
      v[static_cast<size_t>(t)] = missing ? 0.0f : ring.kv[ring.at(p) + col];
    }
    ops::softmax(w.data(), candidates);
    double sum = 0.0;  // ggml's row sum accumulates in double
    for (int t = 0; t < candidates; ++t) sum += static_cast<double>(v[static_cast<size_t>(t)] * w[static_cast<size_t>(t)]);
    row[static_cast<size_t>(j)] = static_cast<float>(sum);
  }
  const int R = c.rope.n_rot;
  ops::rms_norm(row.data(), norm.data(), row.data(), width, c.norm_eps);
  ops::rope(row.data() + (width - R), 1, width, first, c.csa.rope);
  if (rotate) rotate_heads(hadamard_, row.data(), 1, width);
  out.store(block, row.data());
}

// The compressed rows a ratio-4 layer's query row attends to: every visible one while they are
// at most top_k, else the top_k its lightning indexer scores highest (ascending).
void CompressedAttentionMixer::select_rows(const CompressedAttentionWeights& L, const LayerState& s, const LayerPass& pass,
                                           int i, std::vector<int>& rows) {
  const ModelConfig& c = pass.cfg;
  const int pos = pass.positions[i];
  const int visible = (pos + 1) / 4, top_k = c.csa.indexer_top_k;
  rows.resize(static_cast<size_t>(visible));
  std::iota(rows.begin(), rows.end(), 0);
  if (visible <= top_k) return;
  const int IH = c.csa.indexer_heads, ID = c.csa.indexer_head_dim, R = c.rope.n_rot;
  std::vector<float> q(iq_.begin() + static_cast<ptrdiff_t>(i) * IH * ID, iq_.begin() + static_cast<ptrdiff_t>(i + 1) * IH * ID);
  ops::rope(q.data() + (ID - R), IH, ID, pos, c.csa.rope);
  rotate_heads(hadamard_, q.data(), IH, ID);
  Query query;
  query.set(q.data(), IH * ID, s.idx.f16());
  const float inv = 1.0f / std::sqrt(static_cast<float>(ID * IH));
  std::vector<float> score(static_cast<size_t>(visible));
  for (int r = 0; r < visible; ++r) {
    double sum = 0.0;
    for (int h = 0; h < IH; ++h) {
      const float* qh = query.q32 + static_cast<size_t>(h) * ID;
      const float d = s.idx.f16() ? dot_f16_pair(static_cast<const uint16_t*>(s.idx.row(r)), query.q16.data() + static_cast<size_t>(h) * ID, ID)
                                  : kernels(TensorType::F32).dot(s.idx.row(r), qh, ID);
      sum += static_cast<double>(std::max(d, 0.0f) * (iw_[static_cast<size_t>(i) * IH + h] * inv));
    }
    score[static_cast<size_t>(r)] = static_cast<float>(sum);
  }
  // Ties are common (a row whose every head's dot is negative scores exactly 0), and which tied
  // rows llama.cpp keeps is whatever std::partial_sort on the score alone leaves first, over
  // its graph's width: the visible rows, then -inf up to a multiple of 256 (at least 256; the
  // widest query of its batch sets it, here the row's own). The same call picks the same rows.
  const int width = std::max(256, (visible + 255) / 256 * 256), keep = std::min(width, top_k);
  score.resize(static_cast<size_t>(width), -INFINITY);
  std::vector<int> order(static_cast<size_t>(width));
  std::iota(order.begin(), order.end(), 0);
  std::partial_sort(order.begin(), order.begin() + keep, order.end(),
                    [&](int a, int b) { return score[static_cast<size_t>(a)] > score[static_cast<size_t>(b)]; });
  rows.clear();
  for (int j = 0; j < keep; ++j) {
    if (order[static_cast<size_t>(j)] < visible) rows.push_back(order[static_cast<size_t>(j)]);
  }
  std::sort(rows.begin(), rows.end());
}

// Rows [first, end) of the pass attend (their attention into attn_).
void CompressedAttentionMixer::attend(const CompressedAttentionWeights& L, int layer, const LayerState& s,
                                      const LayerPass& pass, int first, int end) {
  const ModelConfig& c = pass.cfg;
  const int H = c.n_head, D = c.head_dim;
  rows_.resize(static_cast<size_t>(pass.n));
  for (int i = first; i < end; ++i) {
    AttendRow& row = rows_[static_cast<size_t>(i)];
    row.pos = pass.positions[i];
    row.first_raw = std::max(0, row.pos - c.sliding_at(layer) + 1);
    row.q = q_.data() + static_cast<size_t>(i) * H * D;
    row.comp_rows.clear();
    if (s.ratio == 128) {
      row.comp_rows.resize(static_cast<size_t>((row.pos + 1) / 128));
      std::iota(row.comp_rows.begin(), row.comp_rows.end(), 0);
    } else if (s.ratio == 4) {
      select_rows(L, s, pass, i, row.comp_rows);
    }
  }
  if (!flash_path(s, pass)) keys32_.load(s, rows_, first, end, D, pass.pool);
  pass.pool.run(int64_t{end - first} * H, [&](int64_t job, int) {
    const int i = first + static_cast<int>(job / H), h = static_cast<int>(job % H);
    attend_head(s, pass, rows_[static_cast<size_t>(i)], h, attn_.data() + (static_cast<size_t>(i) * H + h) * D);
  });
  (void)L;
}

// One query head over the row's keys (raw window in position order, then compressed rows), K =
// V, with the head's sink. An f16 cache in decode-sized passes follows ggml's flash attention
// (f16 query, online softmax, V summed in f16); otherwise f32 queries, a two-pass f32 softmax
// and an f32 V sum (ggml's classic and tiled paths).
void CompressedAttentionMixer::attend_head(const LayerState& s, const LayerPass& pass, const AttendRow& row, int head,
                                           float* out) const {
  const int D = pass.cfg.head_dim;
  const HeadAttention a{RowKeys{s, row, &keys32_}, row.q + static_cast<size_t>(head) * D, D,
                        1.0f / std::sqrt(static_cast<float>(D)), (*sinks_)[static_cast<size_t>(head)]};
  if (flash_path(s, pass)) attend_flash(a, out);
  else attend_classic(a, out);
}

// De-rope each head at its row's position, then the grouped low-rank output: group g's heads
// through rows g*o_lora_rank.. of wo_a, the groups' results side by side through wo_b.
void CompressedAttentionMixer::output(const CompressedAttentionWeights& L, int layer, const LayerPass& pass) {
  const ModelConfig& c = pass.cfg;
  const int n = pass.n, H = c.n_head, D = c.head_dim, R = c.rope.n_rot, E = c.n_embd;
  const int G = c.csa.o_groups, OL = c.csa.o_lora_rank, in = H * D / G;
  for (int i = 0; i < n; ++i) ops::rope_inverse(attn_.data() + static_cast<size_t>(i) * H * D + (D - R), H, D, pass.positions[i], rope_of(c, layer));
  z_.resize(static_cast<size_t>(n) * G * OL);
  group_acts_.resize(static_cast<size_t>(G));
  std::vector<Weight> slabs(static_cast<size_t>(G));
  std::vector<MatmulJob> jobs;
  for (int g = 0; g < G; ++g) {
    slabs[static_cast<size_t>(g)] = L.wo_a.slice_rows(int64_t{g} * OL, OL);
    ActivationBuffer& act = group_acts_[static_cast<size_t>(g)];
    act.convert(L.wo_a.type, attn_.data() + static_cast<size_t>(g) * in, n, in, int64_t{H} * D, &pass.pool);
    jobs.push_back({&slabs[static_cast<size_t>(g)], &act, n, nullptr, z_.data() + static_cast<size_t>(g) * OL, int64_t{G} * OL});
  }
  run_matmuls(pass.pool, jobs);
  proj_.resize(static_cast<size_t>(n) * E);
  matmul(pass.pool, L.wo_b, z_.data(), n, proj_.data(), out_act_);
  for (int i = 0; i < n; ++i) pass.residual.add(i, proj_.data() + static_cast<size_t>(i) * E);
}

}  // namespace

std::unique_ptr<Mixer> make_compressed_attention(const ModelConfig& c, int n_ctx, KvType kv_type, int rewind_slack) {
  return std::make_unique<CompressedAttentionMixer>(c, n_ctx, kv_type, rewind_slack);
}

}  // namespace bmoe::mixer_units
