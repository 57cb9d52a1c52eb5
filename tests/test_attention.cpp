// Attention: the tiled path of prompt batches against a double-precision reference, its
// independence from how a prompt is split into batches, and the decode path beside it: bit for
// bit against a one-head-at-a-time reference of its order, and independent of threads and batch.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "core/fp16.h"
#include "core/rng.h"
#include "core/thread_pool.h"
#include "model/attention.h"
#include "quant/quant.h"

namespace bmoe {
namespace {

struct Case {
  int n_head = 8, n_head_kv = 2, dk = 64, dv = 64;
  int positions = 200;
  int sliding_window = 0;
  float softcap = 0.0f;
  bool sinks = false;
  KvType kv = KvType::F16;
};

struct Filled {
  KvCache cache;
  std::vector<float> q;  // positions x n_head x dk
  std::vector<int> pos;
  std::vector<float> sinks;
  AttentionParams params;
};

Filled fill(const Case& c, uint64_t seed) {
  Filled f;
  Rng rng(seed);
  const int kw = c.n_head_kv * c.dk, vw = c.n_head_kv * c.dv;
  f.cache.init(c.positions + 16, {kw}, {vw}, c.kv);
  std::vector<float> k(static_cast<size_t>(kw)), v(static_cast<size_t>(vw));
  for (int p = 0; p < c.positions; ++p) {
    for (float& x : k) x = static_cast<float>(rng.normal());
    for (float& x : v) x = static_cast<float>(rng.normal());
    f.cache.store(0, p, k.data(), v.data());
  }
  f.q.resize(static_cast<size_t>(c.positions) * c.n_head * c.dk);
  for (float& x : f.q) x = static_cast<float>(rng.normal());
  for (int p = 0; p < c.positions; ++p) f.pos.push_back(p);
  for (int h = 0; h < c.n_head; ++h) f.sinks.push_back(static_cast<float>(rng.normal()));
  AttentionParams& a = f.params;
  a.n_head = c.n_head;
  a.n_head_kv = c.n_head_kv;
  a.head_dim_k = c.dk;
  a.head_dim_v = c.dv;
  a.scale = 1.0f / std::sqrt(static_cast<float>(c.dk));
  a.softcap = c.softcap;
  a.sliding_window = c.sliding_window;
  a.sinks = c.sinks ? f.sinks.data() : nullptr;
  return f;
}

float cache_value(const KvCache& cache, const void* row, int i) {
  return cache.type() == KvType::F16 ? fp16_to_fp32(static_cast<const uint16_t*>(row)[i])
                                     : static_cast<const float*>(row)[i];
}

// Softmax attention in double over the stored (already rounded) keys and values.
std::vector<double> reference(const Case& c, const Filled& f, int row) {
  const AttentionParams& p = f.params;
  std::vector<double> out(static_cast<size_t>(c.n_head) * c.dv, 0.0);
  const int pos = f.pos[static_cast<size_t>(row)];
  const int first = c.sliding_window > 0 ? std::max(0, pos - c.sliding_window + 1) : 0;
  for (int h = 0; h < c.n_head; ++h) {
    const int g = h / (c.n_head / c.n_head_kv);
    const float* q = f.q.data() + (static_cast<size_t>(row) * c.n_head + h) * c.dk;
    std::vector<double> w;
    double max = -INFINITY;
    for (int j = first; j <= pos; ++j) {
      double s = 0.0;
      for (int d = 0; d < c.dk; ++d) s += q[d] * static_cast<double>(cache_value(f.cache, f.cache.k_row(0, j), g * c.dk + d));
      s *= p.scale;
      if (c.softcap != 0.0f) s = c.softcap * std::tanh(s / c.softcap);
      w.push_back(s);
      max = std::max(max, s);
    }
    if (p.sinks) max = std::max(max, static_cast<double>(p.sinks[h]));
    double sum = p.sinks ? std::exp(p.sinks[h] - max) : 0.0;
    for (double& x : w) sum += (x = std::exp(x - max));
    for (int j = first; j <= pos; ++j) {
      for (int d = 0; d < c.dv; ++d) {
        out[static_cast<size_t>(h) * c.dv + d] +=
            w[static_cast<size_t>(j - first)] / sum * cache_value(f.cache, f.cache.v_row(0, j), g * c.dv + d);
      }
    }
  }
  return out;
}

std::vector<float> run_rows(ThreadPool& pool, const Case& c, const Filled& f, int row0, int n) {
  std::vector<float> out(static_cast<size_t>(n) * c.n_head * c.dv);
  attention(pool, f.cache, 0, f.params, f.q.data() + static_cast<size_t>(row0) * c.n_head * c.dk,
            f.pos.data() + row0, n, out.data());
  return out;
}

void expect_close_to_reference(const Case& c, double tolerance) {
  ThreadPool pool(3);
  const Filled f = fill(c, 7);
  const auto got = run_rows(pool, c, f, 0, c.positions);
  for (int row : {0, 1, 63, 64, 65, 127, c.positions - 1}) {
    const auto want = reference(c, f, row);
    for (size_t i = 0; i < want.size(); ++i) {
      ASSERT_NEAR(got[static_cast<size_t>(row) * want.size() + i], want[i], tolerance) << "row " << row << " element " << i;
    }
  }
}

TEST(TiledAttention, MatchesDoubleReference) { expect_close_to_reference(Case{}, 2e-5); }

TEST(TiledAttention, GroupedHeadsSlidingWindowSinksSoftcap) {
  Case c;
  c.n_head = 12;
  c.n_head_kv = 3;
  c.dk = 48;
  c.dv = 80;
  c.sliding_window = 70;  // windows that start inside a tile and skip whole tiles
  c.softcap = 5.0f;
  c.sinks = true;
  c.positions = 230;
  expect_close_to_reference(c, 2e-5);
}

TEST(TiledAttention, OneHeadPerKvHeadAndF32Cache) {
  Case c;
  c.n_head = 4;
  c.n_head_kv = 4;
  c.kv = KvType::F32;
  expect_close_to_reference(c, 2e-5);
}

// A row's result depends only on its own query and the cache, not on which rows share its
// batch: a prompt split into batches of 64 or more gives the same bits as one batch.
TEST(TiledAttention, BatchSplitDoesNotChangeResults) {
  Case c;
  c.sliding_window = 100;
  c.sinks = true;
  const Filled f = fill(c, 8);
  ThreadPool pool(2);
  const auto whole = run_rows(pool, c, f, 0, c.positions);
  std::vector<float> split;
  for (int row0 = 0; row0 < c.positions;) {
    const int n = row0 == 0 ? 64 : c.positions - row0 >= 2 * 70 ? 70 : c.positions - row0;
    const auto part = run_rows(pool, c, f, row0, n);
    split.insert(split.end(), part.begin(), part.end());
    row0 += n;
  }
  ASSERT_EQ(split.size(), whole.size());
  for (size_t i = 0; i < whole.size(); ++i) ASSERT_EQ(split[i], whole[i]) << i;
}

// Decode rows (small batches, f16 running sums on an f16 cache) stay close to the tiled rows.
TEST(TiledAttention, AgreesWithTheDecodePath) {
  Case c;
  c.positions = 130;
  const Filled f = fill(c, 9);
  ThreadPool pool(2);
  const auto tiled = run_rows(pool, c, f, 0, c.positions);
  for (int row : {5, 64, 129}) {
    const auto one = run_rows(pool, c, f, row, 1);
    for (size_t i = 0; i < one.size(); ++i) {
      EXPECT_NEAR(one[i], tiled[static_cast<size_t>(row) * one.size() + i], 5e-3) << "row " << row;
    }
  }
}

// The decode path's order written one head and one key at a time: the scalar reference the
// grouped, block-split kernel must equal bit for bit. Flash numerics: blocks of
// kAttentionDecodeBlock positions, each an online softmax (f16 running V sum on an f16 cache),
// the sink in the first block, merged in position order.
struct Partial {
  float max = -INFINITY, sum = 0.0f;
  std::vector<float> acc;
};

Partial flash_reference_block(const Case& c, const Filled& f, int h, const float* q, int j0, int j1) {
  const AttentionParams& p = f.params;
  const int g = h / (c.n_head / c.n_head_kv);
  const bool f16 = c.kv == KvType::F16;
  std::vector<uint16_t> q16(static_cast<size_t>(c.dk)), acc16(static_cast<size_t>(c.dv), 0);
  quantize_activations(TensorType::F16, q, q16.data(), c.dk);
  Partial r;
  r.acc.assign(static_cast<size_t>(c.dv), 0.0f);
  const float scale = p.softcap != 0.0f ? p.scale / p.softcap : p.scale;
  for (int j = j0; j <= j1; ++j) {
    const size_t el = f.cache.element_bytes();
    const auto* k = static_cast<const uint8_t*>(f.cache.k_row(0, j)) + static_cast<size_t>(g) * c.dk * el;
    const auto* v = static_cast<const uint8_t*>(f.cache.v_row(0, j)) + static_cast<size_t>(g) * c.dv * el;
    float s = f16 ? dot_f16_pair(reinterpret_cast<const uint16_t*>(k), q16.data(), c.dk)
                  : kernels(TensorType::F32).dot(k, q, c.dk);
    s *= scale;
    if (p.softcap != 0.0f) s = p.softcap * std::tanh(s);
    float ms = 1.0f, vs = 1.0f;
    if (s > r.max) {
      ms = std::exp(r.max - s);
      r.max = s;
      if (f16) f16_scale(acc16.data(), ms, c.dv);
      for (float& a : r.acc) a *= ms;
    } else {
      vs = std::exp(s - r.max);
    }
    if (f16) f16_fma_into(acc16.data(), reinterpret_cast<const uint16_t*>(v), vs, c.dv);
    for (int d = 0; d < c.dv && !f16; ++d) r.acc[static_cast<size_t>(d)] += reinterpret_cast<const float*>(v)[d] * vs;
    r.sum = r.sum * ms + vs;
  }
  for (int d = 0; d < c.dv && f16; ++d) r.acc[static_cast<size_t>(d)] = fp16_to_fp32(acc16[static_cast<size_t>(d)]);
  return r;
}

std::vector<float> flash_reference(const Case& c, const Filled& f, int row, int h) {
  const int pos = f.pos[static_cast<size_t>(row)], B = kAttentionDecodeBlock;
  const int first = c.sliding_window > 0 ? std::max(0, pos - c.sliding_window + 1) : 0;
  const float* q = f.q.data() + (static_cast<size_t>(row) * c.n_head + h) * c.dk;
  Partial m;
  for (int b = first / B; b <= pos / B; ++b) {
    Partial r = flash_reference_block(c, f, h, q, std::max(first, b * B), std::min(pos, b * B + B - 1));
    if (b == first / B && f.params.sinks != nullptr) {
      const float sink = f.params.sinks[h];
      float ms = 1.0f, vs = 1.0f;
      if (sink > r.max) {
        ms = std::exp(r.max - sink);
        r.max = sink;
        for (float& a : r.acc) a *= ms;
      } else {
        vs = std::exp(sink - r.max);
      }
      r.sum = r.sum * ms + vs;
    }
    if (b == first / B) {
      m = r;
      continue;
    }
    const float merged = std::max(m.max, r.max);
    const float so = std::exp(m.max - merged), sn = std::exp(r.max - merged);
    for (size_t d = 0; d < m.acc.size(); ++d) m.acc[d] = std::fma(m.acc[d], so, r.acc[d] * sn);
    m.sum = std::fma(m.sum, so, r.sum * sn);
    m.max = merged;
  }
  for (float& a : m.acc) a *= 1.0f / m.sum;
  return m.acc;
}

// Classic numerics, one head: every score, ggml's f32 softmax (sum in double), the weights
// rounded to the cache type, V summed in f32 in position order.
std::vector<float> classic_reference(const Case& c, const Filled& f, int row, int h) {
  const AttentionParams& p = f.params;
  const int g = h / (c.n_head / c.n_head_kv), pos = f.pos[static_cast<size_t>(row)];
  const int first = c.sliding_window > 0 ? std::max(0, pos - c.sliding_window + 1) : 0;
  const bool f16 = c.kv == KvType::F16;
  const float* q = f.q.data() + (static_cast<size_t>(row) * c.n_head + h) * c.dk;
  std::vector<uint16_t> q16(static_cast<size_t>(c.dk));
  quantize_activations(TensorType::F16, q, q16.data(), c.dk);
  const size_t el = f.cache.element_bytes();
  std::vector<float> w;
  for (int j = first; j <= pos; ++j) {
    const auto* k = static_cast<const uint8_t*>(f.cache.k_row(0, j)) + static_cast<size_t>(g) * c.dk * el;
    float s = f16 ? dot_f16_pair(reinterpret_cast<const uint16_t*>(k), q16.data(), c.dk)
                  : kernels(TensorType::F32).dot(k, q, c.dk);
    if (p.softcap != 0.0f) s = p.softcap * std::tanh(s / p.softcap);
    w.push_back(s * p.scale);
  }
  float max = *std::max_element(w.begin(), w.end());
  if (p.sinks != nullptr) max = std::max(max, p.sinks[h]);
  double sum = 0.0;
  for (float& x : w) sum += static_cast<double>(x = std::exp(x - max));
  if (p.sinks != nullptr) sum += static_cast<double>(std::exp(p.sinks[h] - max));
  std::vector<float> out(static_cast<size_t>(c.dv), 0.0f);
  for (int j = first; j <= pos; ++j) {
    float x = w[static_cast<size_t>(j - first)] * static_cast<float>(1.0 / sum);
    if (f16) x = fp16_to_fp32(fp32_to_fp16(x));
    const auto* v = static_cast<const uint8_t*>(f.cache.v_row(0, j)) + static_cast<size_t>(g) * c.dv * el;
    for (int d = 0; d < c.dv; ++d) out[static_cast<size_t>(d)] += cache_value(f.cache, v, d) * x;
  }
  return out;
}

// Decode rows [row0, row0 + n) in one batch on `threads` threads equal the one-head reference
// bit for bit, and stay near the double-precision softmax.
void expect_decode_exact(const Case& c, AttentionNumerics numerics, int row0, int n, int threads) {
  Filled f = fill(c, 11);
  f.params.numerics = numerics;
  ThreadPool pool(threads);
  const auto got = run_rows(pool, c, f, row0, n);
  const double near = c.kv == KvType::F16 ? 5e-3 : 2e-5;
  for (int i = 0; i < n; ++i) {
    const auto exact = reference(c, f, row0 + i);
    for (int h = 0; h < c.n_head; ++h) {
      const auto want = numerics == AttentionNumerics::Flash ? flash_reference(c, f, row0 + i, h)
                                                            : classic_reference(c, f, row0 + i, h);
      for (int d = 0; d < c.dv; ++d) {
        const size_t at = (static_cast<size_t>(i) * c.n_head + h) * c.dv + d;
        ASSERT_EQ(got[at], want[static_cast<size_t>(d)]) << "row " << row0 + i << " head " << h << " element " << d;
        ASSERT_NEAR(got[at], exact[static_cast<size_t>(h) * c.dv + d], near) << "row " << row0 + i << " head " << h;
      }
    }
  }
}

Case long_case() {
  Case c;
  c.positions = 3 * kAttentionDecodeBlock + 40;  // rows that span one to four blocks
  return c;
}

TEST(DecodeAttention, FlashMatchesOneHeadReferenceBitForBit) {
  const Case c = long_case();
  for (int threads : {1, 2, 3}) {
    expect_decode_exact(c, AttentionNumerics::Flash, 100, 2, threads);                       // one block
    expect_decode_exact(c, AttentionNumerics::Flash, kAttentionDecodeBlock - 2, 4, threads);  // across a block edge
    expect_decode_exact(c, AttentionNumerics::Flash, c.positions - 3, 3, threads);          // four blocks
  }
}

TEST(DecodeAttention, FlashSlidingWindowSinksSoftcapAndF32Cache) {
  Case c = long_case();
  c.n_head = 12;
  c.n_head_kv = 3;
  c.dk = 48;
  c.dv = 80;
  c.sliding_window = 300;  // windows that start inside a block and skip whole blocks
  c.softcap = 5.0f;
  c.sinks = true;
  expect_decode_exact(c, AttentionNumerics::Flash, 200, 3, 2);
  expect_decode_exact(c, AttentionNumerics::Flash, c.positions - 5, 5, 3);
  c.kv = KvType::F32;
  c.n_head_kv = 1;  // one group: only the position blocks split the work
  expect_decode_exact(c, AttentionNumerics::Flash, c.positions - 2, 2, 2);
}

// The f16 kernel's shapes: Qwen3-30B-A3B's heads (a group of 8, 128 dims: two dot products of
// four heads per key), and odd sizes whose dot and V sum take the 8-lane and scalar tails with
// a group of 5 (four heads, then one).
TEST(DecodeAttention, FlashF16KernelShapesMatchReferenceBitForBit) {
  Case c = long_case();
  c.n_head = 16;
  c.n_head_kv = 2;
  c.dk = 128;
  c.dv = 128;
  expect_decode_exact(c, AttentionNumerics::Flash, c.positions - 2, 2, 2);
  c.n_head = 10;
  c.dk = 44;  // 16 + 16 + 8 + 4
  c.dv = 36;  // 8 x 4 + 4
  c.softcap = 5.0f;
  c.sinks = true;
  expect_decode_exact(c, AttentionNumerics::Flash, c.positions - 3, 3, 2);
}

TEST(DecodeAttention, ClassicMatchesOneHeadReferenceBitForBit) {
  Case c = long_case();
  c.sliding_window = 300;
  c.sinks = true;
  expect_decode_exact(c, AttentionNumerics::Classic, c.positions - 4, 4, 2);
  c.kv = KvType::F32;
  c.n_head_kv = 1;
  expect_decode_exact(c, AttentionNumerics::Classic, 500, 3, 3);
}

// A decode row's bits depend neither on the thread count nor on the rows beside it.
TEST(DecodeAttention, ThreadsAndBatchDoNotChangeResults) {
  const Case c = long_case();
  const Filled f = fill(c, 12);
  ThreadPool one(1), three(3);
  const int row0 = c.positions - 7;
  const auto batch = run_rows(three, c, f, row0, 7);
  for (int i = 0; i < 7; ++i) {
    const auto alone = run_rows(one, c, f, row0 + i, 1);
    for (size_t e = 0; e < alone.size(); ++e) ASSERT_EQ(alone[e], batch[static_cast<size_t>(i) * alone.size() + e]) << i;
  }
}

}  // namespace
}  // namespace bmoe
