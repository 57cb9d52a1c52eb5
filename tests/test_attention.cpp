// Attention: the tiled path of prompt batches against a double-precision reference, its
// independence from how a prompt is split into batches, and the decode path beside it.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "core/fp16.h"
#include "core/rng.h"
#include "core/thread_pool.h"
#include "model/attention.h"

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

}  // namespace
}  // namespace bmoe
