// The frame every tile kernel (DotTileFn) shares, whatever its ISA: weight rows one at a time
// against activation rows kActs at a time (one per float lane of the ISA's vectors). Internal
// linkage: each kernel file compiles it for its own target (see x86_shared.h for why).
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>

#include "quant/quant.h"

namespace bmoe {
namespace {

// Every weight row against activation rows taken kActs at a time. `Group` is what the kActs
// activation rows of a tile share across all weight rows (built once per tile from the rows and
// their block count, `extra` being the group's own option); Full(row, group, n, out) fills
// out[0..kActs), Half only out[0..kActs / 2) (the integer work of the other lanes skipped) and
// serves tiles of at most that many rows. A tile of fewer rows repeats its last row to fill the
// group (the extra lanes' results are dropped); a lone row takes the one-row kernel.
template <int kActs, typename Group, void (*Full)(const void*, const Group&, int64_t, float*),
          void (*Half)(const void*, const Group&, int64_t, float*)>
void tile_rows(const void* w, size_t stride, int64_t rows, const void* const* acts, int64_t n_act, int64_t n,
               float* out, int64_t out_stride, DotFn one, int64_t block, bool extra) {
  const auto* base = static_cast<const uint8_t*>(w);
  for (int64_t a0 = 0; a0 < n_act; a0 += kActs) {
    const int valid = static_cast<int>(std::min<int64_t>(kActs, n_act - a0));
    if (valid == 1) {
      for (int64_t r = 0; r < rows; ++r) out[a0 * out_stride + r] = one(base + r * stride, acts[a0], n);
      continue;
    }
    const void* group_acts[kActs];
    for (int t = 0; t < kActs; ++t) group_acts[t] = acts[a0 + std::min(t, valid - 1)];
    const Group group(group_acts, n / block, extra);
    float result[kActs];
    const auto row_kernel = valid <= kActs / 2 ? Half : Full;
    for (int64_t r = 0; r < rows; ++r) {
      row_kernel(base + r * stride, group, n, result);
      for (int t = 0; t < valid; ++t) out[(a0 + t) * out_stride + r] = result[t];
    }
  }
}

}  // namespace
}  // namespace bmoe
