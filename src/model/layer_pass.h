// What a layer's units (mixers.h, ffn.h) work on in one pass besides their own weights, scratch
// and per-sequence state.
#pragma once

#include <cstddef>
#include <vector>

#include "core/thread_pool.h"
#include "model/config.h"
#include "model/residual.h"

namespace bmoe {

struct LayerPass {
  ThreadPool& pool;
  const ModelConfig& cfg;
  ResidualStream& residual;
  const int* positions;  // per row, its position in the sequence
  int n;                 // rows (tokens) of the pass
  bool batch_path;       // rows take the batch attention path whatever n (a replay, see truncate)
};

// Scratch of at least n floats; its contents are not kept (buffers only grow, so a steady run
// neither allocates nor faults in fresh pages).
inline float* scratch(std::vector<float>& buffer, size_t n) {
  if (buffer.size() < n) buffer.resize(n);
  return buffer.data();
}

}  // namespace bmoe
