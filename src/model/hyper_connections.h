// Hyper-connections (deepseek4): several residual streams per token. Around each sublayer the
// streams are RMS-normed together (no weight), a small f32 matrix turns them into mixing
// weights: `pre` folds the streams into the sublayer's input, `post` and the Sinkhorn-normalised
// `comb` mix its output and the old streams into the new ones (ResidualStream::add). The head
// folds them with pre weights only. Rounds as ggml's fused CPU kernels do.
#pragma once

#include "core/thread_pool.h"
#include "model/config.h"
#include "model/residual.h"
#include "model/weights.h"

namespace bmoe::hyper {

// Every row's streams -> its mixed row, post and comb (ResidualStream::row, post, comb).
void pre_mix(ThreadPool& pool, ResidualStream& r, const HyperMixWeights& w, const ModelConfig& c);
// Rows [first, n): the output head's fold of the streams into row().
void head_mix(ThreadPool& pool, ResidualStream& r, const HyperMixWeights& w, const ModelConfig& c, int first, int n);

}  // namespace bmoe::hyper
