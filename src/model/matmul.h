// Matrix-vector and matrix-matrix products on quantized weights, spread over the thread pool.
//
// Inputs are converted once into the weight type's activation format (ActivationBuffer); a
// batch of MatmulJobs (e.g. q, k and v, or the gate and up projections of several experts)
// then runs as one parallel pass, so a decode step pays one barrier per stage, not per matrix.
// Each output row is one dot product whose value does not depend on the batch size or on how
// rows are split between threads, so results are deterministic.
#pragma once

#include <cstdint>
#include <deque>
#include <span>
#include <vector>

#include "core/thread_pool.h"
#include "quant/weight.h"

namespace bmoe {

// Activations of n rows converted into one activation format.
class ActivationBuffer {
 public:
  // Converts rows x[0..n) of `cols` floats (row stride `stride` floats) for weights of `type`.
  void convert(TensorType weight_type, const float* x, int64_t n, int64_t cols, int64_t stride,
               ThreadPool* pool = nullptr);
  const uint8_t* row(int64_t i) const { return data_.data() + static_cast<size_t>(i) * row_bytes_; }
  size_t row_bytes() const { return row_bytes_; }
  TensorType format() const { return format_; }
  int64_t rows() const { return rows_; }

 private:
  std::vector<uint8_t> data_;
  size_t row_bytes_ = 0;
  int64_t rows_ = 0;
  TensorType format_ = TensorType::F32;
};

struct MatmulJob {
  const Weight* weight = nullptr;
  const ActivationBuffer* input = nullptr;  // must match weight->type's activation format
  // Which input rows to use: input rows [0, n) or the listed ones.
  int64_t n = 1;
  const int32_t* input_rows = nullptr;
  float* output = nullptr;  // output row i (for input i) at output + i * output_stride
  int64_t output_stride = 0;
};

// Runs all jobs; rows of every job are split into chunks shared by the pool.
void run_matmuls(ThreadPool& pool, std::span<const MatmulJob> jobs);

// Activations converted once per activation format for a block of matmuls that read the same
// rows (q, k and v; the gate and up projections of many experts). reset() forgets the
// conversions but keeps their buffers for the next block.
class Activations {
 public:
  const ActivationBuffer& get(ThreadPool& pool, TensorType weight_type, const float* x, int64_t n, int64_t cols);
  void reset() { used_ = 0; }

 private:
  struct Entry {
    const float* source = nullptr;
    ActivationBuffer buffer;
  };
  std::deque<Entry> entries_;  // a deque: get() hands out references that must survive later gets
  size_t used_ = 0;
};

// Convenience for one weight and a dense batch: y[i] = W x[i].
void matmul(ThreadPool& pool, const Weight& w, const float* x, int64_t n, float* y,
            ActivationBuffer& scratch);

}  // namespace bmoe
