#include "model/matmul.h"

#include <algorithm>
#include <vector>

#include "core/error.h"
#include "quant/quant.h"

namespace bmoe {

void ActivationBuffer::convert(TensorType weight_type, const float* x, int64_t n, int64_t cols,
                               int64_t stride, ThreadPool* pool) {
  format_ = kernels(weight_type).activation_type;
  row_bytes_ = activation_bytes(format_, cols);
  rows_ = n;
  const size_t needed = row_bytes_ * static_cast<size_t>(n);
  if (data_.size() < needed) data_.resize(needed);
  auto convert_rows = [&](int64_t begin, int64_t end, int) {
    for (int64_t i = begin; i < end; ++i) {
      quantize_activations(format_, x + i * stride, data_.data() + static_cast<size_t>(i) * row_bytes_, cols);
    }
  };
  if (pool != nullptr && n >= 8) pool->parallel_for(n, std::max<int64_t>(1, n / (pool->size() * 4)), convert_rows);
  else convert_rows(0, n, 0);
}

namespace {

struct Chunk {
  const MatmulJob* job;
  int64_t row_begin;
  int64_t row_end;
};

// Rows per chunk: enough chunks to balance the pool, few enough to keep overhead low.
int64_t rows_per_chunk(int64_t total_rows, int threads, int64_t n) {
  const int64_t target_chunks = static_cast<int64_t>(threads) * 8;
  int64_t rows = std::max<int64_t>(1, total_rows / target_chunks);
  if (n > 1) rows = std::min<int64_t>(rows, 64);  // batches: keep a chunk's rows hot in cache
  // Whole groups for the multi-row kernels.
  return std::max<int64_t>((rows + kDotRows - 1) / kDotRows * kDotRows, kDotRows);
}

// Activation row of the job's i-th input.
const uint8_t* input_of(const MatmulJob& job, int64_t i) {
  return job.input->row(job.input_rows ? job.input_rows[i] : i);
}

// Rows [r, end) one dot product at a time.
void run_rows_one_by_one(const MatmulJob& job, DotFn dot, int64_t r, int64_t end) {
  const Weight& w = *job.weight;
  for (; r < end; ++r) {
    for (int64_t i = 0; i < job.n; ++i) job.output[i * job.output_stride + r] = dot(w.row(r), input_of(job, i), w.cols);
  }
}

// Rows [r, end) in whole groups of kDotRows (each output equals dot()'s); returns the first
// row not done.
int64_t run_row_groups(const MatmulJob& job, const TypeKernels& k, int64_t r, int64_t end) {
  const Weight& w = *job.weight;
  float group[kDotRows];
  for (; r + kDotRows <= end; r += kDotRows) {
    for (int64_t i = 0; i < job.n; ++i) {
      k.dot_rows(w.row(r), w.row_stride, input_of(job, i), w.cols, group);
      std::copy(group, group + kDotRows, job.output + i * job.output_stride + r);
    }
  }
  return r;
}

// Rows [r, end) two at a time against inputs two at a time (an odd last input one by one);
// returns the first row not done.
int64_t run_row_pairs(const MatmulJob& job, const TypeKernels& k, int64_t r, int64_t end) {
  const Weight& w = *job.weight;
  float tile[4];
  for (; r + 2 <= end; r += 2) {
    int64_t i = 0;
    for (; i + 2 <= job.n; i += 2) {
      k.dot_2x2(w.row(r), w.row_stride, input_of(job, i), input_of(job, i + 1), w.cols, tile);
      float* out0 = job.output + i * job.output_stride + r;
      float* out1 = out0 + job.output_stride;
      out0[0] = tile[0];
      out1[0] = tile[1];
      out0[1] = tile[2];
      out1[1] = tile[3];
    }
    for (; i < job.n; ++i) {
      job.output[i * job.output_stride + r] = k.dot(w.row(r), input_of(job, i), w.cols);
      job.output[i * job.output_stride + r + 1] = k.dot(w.row(r + 1), input_of(job, i), w.cols);
    }
  }
  return r;
}

// Rows [r, end) against every input with the tile kernel.
void run_tile(const MatmulJob& job, const TypeKernels& k, int64_t r, int64_t end) {
  const Weight& w = *job.weight;
  thread_local std::vector<const void*> inputs;
  inputs.resize(static_cast<size_t>(job.n));
  for (int64_t i = 0; i < job.n; ++i) inputs[static_cast<size_t>(i)] = input_of(job, i);
  k.dot_tile(w.row(r), w.row_stride, end - r, inputs.data(), job.n, w.cols, job.output + r, job.output_stride);
}

void run_chunk(const Chunk& c) {
  const MatmulJob& job = *c.job;
  const TypeKernels& k = kernels(job.weight->type);
  int64_t r = c.row_begin;
  if (k.dot_2x2 != nullptr && job.n >= 2) {
    // SMMLA's two rows x two inputs (arm64 i8mm) do twice the multiply-adds of a dot-product
    // instruction: the pairs before the tiles.
    r = run_row_pairs(job, k, r, c.row_end);
  } else if (k.dot_tile != nullptr && job.n >= 2) {
    run_tile(job, k, r, c.row_end);
    return;
  } else if (k.dot_rows != nullptr) {
    r = run_row_groups(job, k, r, c.row_end);
  }
  run_rows_one_by_one(job, k.dot, r, c.row_end);
}

}  // namespace

void run_matmuls(ThreadPool& pool, std::span<const MatmulJob> jobs) {
  int64_t total_rows = 0;
  int64_t max_n = 1;
  for (const MatmulJob& j : jobs) {
    if (j.input->format() != kernels(j.weight->type).activation_type) {
      fail("internal: matmul input is {} but {} weights need {}", type_name(j.input->format()),
           type_name(j.weight->type), type_name(kernels(j.weight->type).activation_type));
    }
    total_rows += j.weight->rows;
    max_n = std::max(max_n, j.n);
  }
  const int64_t step = rows_per_chunk(total_rows, pool.size(), max_n);
  thread_local std::vector<Chunk> chunks;
  chunks.clear();
  for (const MatmulJob& j : jobs) {
    for (int64_t r = 0; r < j.weight->rows; r += step) chunks.push_back({&j, r, std::min(j.weight->rows, r + step)});
  }
  const std::vector<Chunk>& work = chunks;
  pool.run(static_cast<int64_t>(work.size()), [&](int64_t t, int) { run_chunk(work[static_cast<size_t>(t)]); });
}

void matmul(ThreadPool& pool, const Weight& w, const float* x, int64_t n, float* y,
            ActivationBuffer& scratch) {
  scratch.convert(w.type, x, n, w.cols, w.cols, &pool);
  const MatmulJob job{&w, &scratch, n, nullptr, y, w.rows};
  run_matmuls(pool, std::span<const MatmulJob>(&job, 1));
}

const ActivationBuffer& Activations::get(ThreadPool& pool, TensorType weight_type, const float* x, int64_t n,
                                         int64_t cols) {
  const TensorType format = kernels(weight_type).activation_type;
  for (size_t i = 0; i < used_; ++i) {
    Entry& e = entries_[i];
    if (e.source == x && e.buffer.format() == format && e.buffer.rows() == n) return e.buffer;
  }
  if (used_ == entries_.size()) entries_.emplace_back();
  Entry& e = entries_[used_++];
  e.source = x;
  e.buffer.convert(weight_type, x, n, cols, cols, &pool);
  return e.buffer;
}

}  // namespace bmoe
