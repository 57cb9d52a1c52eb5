// ASan/UBSan check of the two x86 f16_flash_keys bodies on exact-size buffers; AVX2 == AVX-512 bit for bit.
// Built and run (2026-12-07, 2401 shapes, clean, 0 differ):
//   g++ -std=c++20 -O1 -g -fsanitize=address,undefined -fno-sanitize-recover=all -ffp-contract=off -Isrc \
//       asan_flash_kernels.cpp src/quant/flash_avx2.cpp src/quant/flash_avx512.cpp -o harness && ./harness
#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <vector>
#include "core/fp16.h"
#include "quant/quant.h"
#include "quant/simd_kernels.h"
using namespace bmoe;
int main() {
  std::mt19937 rng(7);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  int shapes = 0, bad = 0;
  for (int heads : {1, 3, 5, 8, 9, 12, 16})
    for (int dk : {4, 8, 16, 44, 64, 128, 136})
      for (int dv : {4, 12, 36, 64, 80, 128, 144})
        for (int n_keys : {1, 2, 31, 32, 33, 65, 256}) {
          const int ks = dk + (heads % 3) * 8, vs = dv + (heads % 2) * 24;  // row strides >= widths
          std::vector<uint16_t> q(heads * dk), k((n_keys - 1) * ks + dk), v((n_keys - 1) * vs + dv);
          for (auto& x : q) x = fp32_to_fp16(nd(rng));
          for (auto& x : k) x = fp32_to_fp16(nd(rng));
          for (auto& x : v) x = fp32_to_fp16(nd(rng));
          F16FlashArgs a;
          a.q = q.data(); a.heads = heads; a.dk = dk; a.dv = dv; a.k = k.data(); a.v = v.data();
          a.k_stride = ks; a.v_stride = vs; a.scale = 1.0f / std::sqrt((float)dk); a.softcap = (n_keys % 2) ? 0.0f : 5.0f;
          std::vector<float> m1(heads, -INFINITY), s1(heads, 0.0f), m2(heads, -INFINITY), s2(heads, 0.0f);
          std::vector<uint16_t> acc1(heads * dv, 0), acc2(heads * dv, 0);
          avx2::f16_flash_keys(a, n_keys, m1.data(), s1.data(), acc1.data());
          avx512::f16_flash_keys(a, n_keys, m2.data(), s2.data(), acc2.data());
          ++shapes;
          if (memcmp(m1.data(), m2.data(), heads * 4) || memcmp(s1.data(), s2.data(), heads * 4) ||
              memcmp(acc1.data(), acc2.data(), heads * dv * 2)) {
            ++bad;
            printf("differ: heads %d dk %d dv %d keys %d\n", heads, dk, dv, n_keys);
          }
        }
  printf("%d shapes, %d differ\n", shapes, bad);
  return bad != 0;
}
