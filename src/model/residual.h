// The residual stream a layer's units read and add to. Most families carry one stream of n_embd
// floats per token. With hyper-connections (deepseek4) a token carries `streams` of them: before
// each sublayer hyper::pre_mix folds them into one row (what row() then returns) and keeps the
// mixing weights, and add() mixes the sublayer's output back into every stream, so the units
// read a row and add their output the same way for both.
#pragma once

#include <cstddef>
#include <vector>

#include "model/ops.h"

namespace bmoe {

class ResidualStream {
 public:
  // n rows of `width` floats per stream; the contents are overwritten by the caller.
  void resize(int n, int width, int streams = 1) {
    width_ = width;
    rows_ = n;
    streams_ = streams;
    x_.resize(static_cast<size_t>(n) * width * streams);
    if (streams > 1) {
      mixed_.resize(static_cast<size_t>(n) * width);
      post_.resize(static_cast<size_t>(n) * streams);
      comb_.resize(static_cast<size_t>(n) * streams * streams);
    }
  }
  int rows() const { return rows_; }
  int width() const { return width_; }
  int streams() const { return streams_; }
  // The row a unit reads: the token's stream, or with several streams their last pre-mix.
  float* row(int i) { return (streams_ > 1 ? mixed_.data() : x_.data()) + static_cast<size_t>(i) * width_; }
  const float* row(int i) const { return (streams_ > 1 ? mixed_.data() : x_.data()) + static_cast<size_t>(i) * width_; }
  // Token i's streams, stream 0 first (streams * width floats).
  float* streams_of(int i) { return x_.data() + static_cast<size_t>(i) * width_ * streams_; }
  const float* streams_of(int i) const { return x_.data() + static_cast<size_t>(i) * width_ * streams_; }
  // Token i's post weights (streams) and comb matrix (comb[d + streams * s]: source s into destination d).
  float* post(int i) { return post_.data() + static_cast<size_t>(i) * streams_; }
  float* comb(int i) { return comb_.data() + static_cast<size_t>(i) * streams_ * streams_; }
  // The stream's row i += delta (a unit's output for token i); with several streams the post-mix.
  void add(int i, const float* delta) {
    if (streams_ > 1) post_mix(i, delta);
    else ops::add(row(i), delta, width_);
  }

 private:
  void post_mix(int i, const float* delta);  // model/hyper_connections.cpp

  std::vector<float> x_, mixed_, post_, comb_, scratch_;
  int rows_ = 0;
  int width_ = 0;
  int streams_ = 1;
};

}  // namespace bmoe
