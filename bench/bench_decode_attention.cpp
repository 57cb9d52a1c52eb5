// Decode attention alone (issue 35): the thread CPU time of one decode row at each depth given
// on the command line, over 12 layers of the Qwen3-30B-A3B attention shape (32 query heads, 4 KV
// heads, 128 dims, f16 cache, random rows), on one thread, best of 5. CPU time rather than wall
// time because the machine is shared: a run that waits for a core does not count. To compare
// with an earlier attention.cpp, build this file against it (see bench/results/2026-12-06).
// By default the 12 layers share one layer's cache (it may stay in the last-level cache);
// with --own-kv each layer reads its own, as a model's decode does (the whole KV from DRAM).
#include <time.h>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>
#include "core/rng.h"
#include "core/thread_pool.h"
#include "model/attention.h"
using namespace bmoe;
static double cpu_s() { timespec t; clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t); return t.tv_sec + t.tv_nsec * 1e-9; }
int main(int argc, char** argv) {
  const int H = 32, HKV = 4, D = 128, layers = 12;
  ThreadPool pool(1);
  bool own_kv = false;
  for (int i = 1; i < argc; ++i) {
    if (std::string(argv[i]) == "--own-kv") {
      own_kv = true;
      continue;
    }
    const int depth = atoi(argv[i]);
    const int cache_layers = own_kv ? layers : 1;
    KvCache cache;
    cache.init(depth + 1, std::vector<int>(cache_layers, HKV * D), std::vector<int>(cache_layers, HKV * D), KvType::F16);
    Rng rng(1);
    std::vector<float> k(HKV * D), v(HKV * D), q(H * D), out(H * D);
    for (int p = 0; p <= depth; ++p) {
      for (float& x : k) x = static_cast<float>(rng.normal());
      for (float& x : v) x = static_cast<float>(rng.normal());
      for (int l = 0; l < cache_layers; ++l) cache.store(l, p, k.data(), v.data());
    }
    for (float& x : q) x = static_cast<float>(rng.normal());
    AttentionParams a; a.n_head = H; a.n_head_kv = HKV; a.head_dim_k = D; a.head_dim_v = D; a.scale = 1.0f / std::sqrt(128.0f);
    int pos = depth;
    attention(pool, cache, 0, a, q.data(), &pos, 1, out.data());
    double best = 1e9;
    for (int rep = 0; rep < 5; ++rep) {
      const double t0 = cpu_s();
      for (int l = 0; l < layers; ++l) attention(pool, cache, own_kv ? l : 0, a, q.data(), &pos, 1, out.data());
      best = std::min(best, cpu_s() - t0);
    }
    const double kv_bytes = 2.0 * (depth + 1) * HKV * D * 2 * layers;
    printf("depth %d%s: %.2f ms per token (12 layers, 1 thread CPU time), KV %.0f MB, %.2f GB/s of KV\n", depth,
           own_kv ? " (own KV per layer)" : "", best * 1e3, kv_bytes / 1e6, kv_bytes / best / 1e9);
  }
}
