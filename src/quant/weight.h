// A view of one weight matrix in memory: `rows` rows of `cols` elements, each row a run of
// quantized blocks. The model code only ever sees these views, never files; expert sources
// (src/moe) hand them out, so the view sits below both, beside the block types it describes.
#pragma once

#include <cstddef>
#include <cstdint>

#include "quant/types.h"

namespace bmoe {

struct Weight {
  TensorType type = TensorType::F32;
  int64_t cols = 0;  // elements per row (ggml ne0)
  int64_t rows = 0;
  const uint8_t* data = nullptr;
  size_t row_stride = 0;  // bytes between rows

  bool present() const { return data != nullptr; }
  const uint8_t* row(int64_t r) const { return data + static_cast<size_t>(r) * row_stride; }
  // Rows [first, first+count) as their own matrix (e.g. one expert of a stacked tensor).
  Weight slice_rows(int64_t first, int64_t count) const {
    Weight w = *this;
    w.data = row(first);
    w.rows = count;
    return w;
  }
};

}  // namespace bmoe
