// The residual stream a layer's units read and add to. Every family today carries one stream of
// n_embd floats per token; a family that keeps several (hyper-connections) widens this class,
// and the units keep reading a row and adding their output through it.
#pragma once

#include <cstddef>
#include <vector>

#include "model/ops.h"

namespace bmoe {

class ResidualStream {
 public:
  // n rows of `width` floats; the contents are overwritten by the caller.
  void resize(int n, int width) {
    width_ = width;
    rows_ = n;
    x_.resize(static_cast<size_t>(n) * width);
  }
  int rows() const { return rows_; }
  int width() const { return width_; }
  float* row(int i) { return x_.data() + static_cast<size_t>(i) * width_; }
  const float* row(int i) const { return x_.data() + static_cast<size_t>(i) * width_; }
  // The stream's row i += delta (a unit's output for token i).
  void add(int i, const float* delta) { ops::add(row(i), delta, width_); }

 private:
  std::vector<float> x_;
  int rows_ = 0;
  int width_ = 0;
};

}  // namespace bmoe
