// Token sampling: greedy by default; temperature, top-k and top-p with a seeded generator.
#pragma once

#include <cstdint>
#include <vector>

#include "core/rng.h"

namespace bmoe {

struct SamplerConfig {
  float temperature = 0.0f;  // <= 0: greedy
  int top_k = 40;            // <= 0: all
  float top_p = 0.95f;       // >= 1: off
  uint64_t seed = 0xB30E;
};

class Sampler {
 public:
  explicit Sampler(SamplerConfig config) : config_(config), rng_(config.seed) {}
  int32_t sample(const float* logits, int n_vocab);
  void reseed(uint64_t seed) { rng_ = Rng(seed); }

  // Index of the largest logit (lowest index on ties).
  static int32_t argmax(const float* logits, int n_vocab);

 private:
  SamplerConfig config_;
  Rng rng_;
  std::vector<std::pair<float, int32_t>> candidates_;
};

}  // namespace bmoe
