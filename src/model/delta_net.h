// The Gated DeltaNet (linear attention) of hybrid models (qwen35moe), as llama.cpp's CPU backend
// computes it: a causal depthwise convolution over q | k | v, L2-normed q and k, and per value
// head a head_dim x head_dim state updated token by token by the gated delta rule.
//
// The recurrence runs token by token also for prompts (as llama.cpp's fused CPU kernel does): a
// token's result then does not depend on how tokens are batched, which keeps prefix reuse and
// speculative decoding exact, and it costs ~3 * v_heads * head_dim^2 multiply-adds per token and
// layer, about 1 % of a Qwen3.6-35B-A3B token's matrix work. The projections around it are batched.
#pragma once

#include <cstdint>
#include <vector>

#include "model/config.h"

namespace bmoe {

namespace delta_net {

// Bounds the loaders enforce and the fixed-size buffers below rely on.
constexpr int kMaxHeadDim = 512;     // Gated DeltaNet head size
constexpr int kMaxConvKernel = 16;   // convolution taps
constexpr int kMaxHeads = 4096;      // Gated DeltaNet key or value heads

// The convolution kernel as causal_conv reads it: [kernel][channels] from the GGUF's
// [channels][kernel].
std::vector<float> transpose_conv(const std::vector<float>& weight, int channels, int kernel);

// softplus(x) = log(1 + e^x), linear above 20 (ggml's form).
float softplus(float x);

// x /= max(||x||, eps), the sum of squares in double (ggml_l2_norm).
void l2_norm(float* x, int n, float eps);

// The causal depthwise convolution of Gated DeltaNet and short-convolution layers:
// out[t][c] = sum_j w[j][c] * window[c][t + j] for t < n and channels [first, end), where
// window[c] is state[c] followed by in[.][c], summed in j order from 0; state then holds the
// last kernel - 1 inputs of each channel.
void causal_conv(const float* in, int n, int channels, int kernel, const float* weight, float* state, float* out,
               int first_channel, int end_channel);
// The history causal_conv leaves in `out` (same layout as its state) after only the first
// `rows` of the n inputs, for channels [first, end): what a rewind to that row restores.
void conv_history_after(const float* in, int rows, int channels, int kernel, const float* state, float* out,
                        int first_channel, int end_channel);

// One token of the gated delta rule on one value head (FloatKernels::delta_step of the active
// ISA): S *= decay; then for each value index j, delta_j = (v_j - S[:, j] . k) * beta,
// S[:, j] += delta_j k; out_j = S[:, j] . q * scale.
void step(float* state, int head_dim, const float* q, const float* k, const float* v, float decay, float beta,
          float scale, float* out);

}  // namespace delta_net
}  // namespace bmoe
