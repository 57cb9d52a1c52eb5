// Float -> block quantizers for weights (model writer, tests). Simple per-block min/max fits:
// valid blocks with error bounded by each format's step size, not llama.cpp's tuned search.
#include <algorithm>
#include <cmath>
#include <cstring>

#include "core/error.h"
#include "quant/blocks.h"
#include "quant/quant.h"
#include "quant/ref_kernels.h"

namespace bmoe {
namespace {

int clamp_int(int v, int lo, int hi) { return std::min(hi, std::max(lo, v)); }

void quantize_q4_0(const float* src, void* dst, int64_t n) {
  auto* blocks = static_cast<BlockQ4_0*>(dst);
  for (int64_t b = 0; b < n / kQK; ++b) {
    const float* x = src + b * kQK;
    float max = 0.0f, amax = 0.0f;
    for (int j = 0; j < kQK; ++j) {
      if (std::fabs(x[j]) > amax) {
        amax = std::fabs(x[j]);
        max = x[j];
      }
    }
    const float d = max / -8.0f;  // the extreme value maps to code 0 (-8)
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    blocks[b].d = fp32_to_fp16(d);
    for (int j = 0; j < 16; ++j) {
      const int lo = clamp_int(static_cast<int>(x[j] * id + 8.5f), 0, 15);
      const int hi = clamp_int(static_cast<int>(x[j + 16] * id + 8.5f), 0, 15);
      blocks[b].qs[j] = static_cast<uint8_t>(lo | (hi << 4));
    }
  }
}

void quantize_mxfp4(const float* src, void* dst, int64_t n) {
  auto* blocks = static_cast<BlockMXFP4*>(dst);
  for (int64_t b = 0; b < n / kQK; ++b) {
    const float* x = src + b * kQK;
    float amax = 0.0f;
    for (int j = 0; j < kQK; ++j) amax = std::max(amax, std::fabs(x[j]));
    // Smallest exponent whose scale lets the largest code (12, doubled 6.0) cover amax.
    int e = 1;
    if (amax > 0.0f) e = clamp_int(static_cast<int>(std::ceil(std::log2(amax / 12.0f))) + 128, 1, 254);
    blocks[b].e = static_cast<uint8_t>(e);
    const float d = e8m0_to_fp32_half(static_cast<uint8_t>(e));
    auto code_of = [&](float v) {
      int best = 0;
      float best_err = INFINITY;
      for (int c = 0; c < 16; ++c) {
        const float err = std::fabs(v - static_cast<float>(kMxfp4Values[c]) * d);
        if (err < best_err) {
          best_err = err;
          best = c;
        }
      }
      return best;
    };
    for (int j = 0; j < 16; ++j) {
      blocks[b].qs[j] = static_cast<uint8_t>(code_of(x[j]) | (code_of(x[j + 16]) << 4));
    }
  }
}

// Packs eight 6-bit scales and mins into the 12-byte K-quant layout (inverse of k_scale_min).
void pack_k_scales(const uint8_t* sc, const uint8_t* m, uint8_t* out) {
  for (int j = 0; j < 4; ++j) {
    out[j] = static_cast<uint8_t>((sc[j] & 63) | ((sc[j + 4] >> 4) << 6));
    out[j + 4] = static_cast<uint8_t>((m[j] & 63) | ((m[j + 4] >> 4) << 6));
    out[j + 8] = static_cast<uint8_t>((sc[j + 4] & 0xF) | ((m[j + 4] & 0xF) << 4));
  }
}

// Shared by Q4_K (levels = 15) and Q5_K (levels = 31): per 32-element sub-block an affine
// fit x ~ scale*q - min with min >= 0, then the scales and mins quantized to 6 bits.
void fit_k_affine(const float* x, int levels, uint16_t& d_out, uint16_t& dmin_out,
                  uint8_t* scales_out, uint8_t* q_out) {
  float scale[8], min[8];
  float max_scale = 0.0f, max_min = 0.0f;
  for (int j = 0; j < 8; ++j) {
    const float* s = x + 32 * j;
    float lo = s[0], hi = s[0];
    for (int l = 1; l < 32; ++l) {
      lo = std::min(lo, s[l]);
      hi = std::max(hi, s[l]);
    }
    lo = std::min(lo, 0.0f);
    scale[j] = (hi - lo) / static_cast<float>(levels);
    min[j] = -lo;
    max_scale = std::max(max_scale, scale[j]);
    max_min = std::max(max_min, min[j]);
  }
  const float d = max_scale / 63.0f;
  const float dmin = max_min / 63.0f;
  d_out = fp32_to_fp16(d);
  dmin_out = fp32_to_fp16(dmin);
  const float d_stored = fp16_to_fp32(d_out);
  const float dmin_stored = fp16_to_fp32(dmin_out);
  uint8_t sc[8], m[8];
  for (int j = 0; j < 8; ++j) {
    sc[j] = static_cast<uint8_t>(d_stored > 0 ? clamp_int(static_cast<int>(std::lround(scale[j] / d_stored)), 0, 63) : 0);
    m[j] = static_cast<uint8_t>(dmin_stored > 0 ? clamp_int(static_cast<int>(std::lround(min[j] / dmin_stored)), 0, 63) : 0);
  }
  pack_k_scales(sc, m, scales_out);
  for (int j = 0; j < 8; ++j) {
    const float step = d_stored * sc[j];
    const float offset = dmin_stored * m[j];
    for (int l = 0; l < 32; ++l) {
      const int q = step > 0 ? clamp_int(static_cast<int>(std::lround((x[32 * j + l] + offset) / step)), 0, levels) : 0;
      q_out[32 * j + l] = static_cast<uint8_t>(q);
    }
  }
}

void quantize_q4_K(const float* src, void* dst, int64_t n) {
  auto* blocks = static_cast<BlockQ4_K*>(dst);
  for (int64_t b = 0; b < n / kQK_K; ++b) {
    uint8_t q[kQK_K];
    BlockQ4_K& y = blocks[b];
    fit_k_affine(src + b * kQK_K, 15, y.d, y.dmin, y.scales, q);
    for (int chunk = 0; chunk < 4; ++chunk) {
      for (int l = 0; l < 32; ++l) {
        y.qs[32 * chunk + l] = static_cast<uint8_t>(q[64 * chunk + l] | (q[64 * chunk + 32 + l] << 4));
      }
    }
  }
}

void quantize_q5_K(const float* src, void* dst, int64_t n) {
  auto* blocks = static_cast<BlockQ5_K*>(dst);
  for (int64_t b = 0; b < n / kQK_K; ++b) {
    uint8_t q[kQK_K];
    BlockQ5_K& y = blocks[b];
    fit_k_affine(src + b * kQK_K, 31, y.d, y.dmin, y.scales, q);
    std::memset(y.qh, 0, sizeof y.qh);
    for (int chunk = 0; chunk < 4; ++chunk) {
      for (int l = 0; l < 32; ++l) {
        const int lo = q[64 * chunk + l], hi = q[64 * chunk + 32 + l];
        y.qs[32 * chunk + l] = static_cast<uint8_t>((lo & 0xF) | ((hi & 0xF) << 4));
        if (lo & 16) y.qh[l] |= static_cast<uint8_t>(1u << (2 * chunk));
        if (hi & 16) y.qh[l] |= static_cast<uint8_t>(2u << (2 * chunk));
      }
    }
  }
}

void quantize_q6_K(const float* src, void* dst, int64_t n) {
  auto* blocks = static_cast<BlockQ6_K*>(dst);
  for (int64_t b = 0; b < n / kQK_K; ++b) {
    const float* x = src + b * kQK_K;
    BlockQ6_K& y = blocks[b];
    float group_scale[16];
    float max_abs_scale = 0.0f;
    for (int g = 0; g < 16; ++g) {
      float max = 0.0f, amax = 0.0f;
      for (int l = 0; l < 16; ++l) {
        if (std::fabs(x[16 * g + l]) > amax) {
          amax = std::fabs(x[16 * g + l]);
          max = x[16 * g + l];
        }
      }
      group_scale[g] = max / -32.0f;  // the extreme maps to -32, the full negative range
      max_abs_scale = std::max(max_abs_scale, std::fabs(group_scale[g]));
    }
    const float d = max_abs_scale / 127.0f;
    y.d = fp32_to_fp16(d);
    const float d_stored = fp16_to_fp32(y.d);
    int q[kQK_K];
    for (int g = 0; g < 16; ++g) {
      const int sc = d_stored > 0 ? clamp_int(static_cast<int>(std::lround(group_scale[g] / d_stored)), -128, 127) : 0;
      y.scales[g] = static_cast<int8_t>(sc);
      const float step = d_stored * static_cast<float>(sc);
      for (int l = 0; l < 16; ++l) {
        const int v = step != 0.0f ? static_cast<int>(std::lround(x[16 * g + l] / step)) : 0;
        q[16 * g + l] = clamp_int(v, -32, 31) + 32;
      }
    }
    // Scatter into the ql/qh layout: 128-element halves, four 32-element runs each.
    for (int half = 0; half < 2; ++half) {
      uint8_t* ql = y.ql + 64 * half;
      uint8_t* qh = y.qh + 32 * half;
      const int* v = q + 128 * half;
      for (int l = 0; l < 32; ++l) {
        ql[l] = static_cast<uint8_t>((v[l] & 0xF) | ((v[l + 64] & 0xF) << 4));
        ql[l + 32] = static_cast<uint8_t>((v[l + 32] & 0xF) | ((v[l + 96] & 0xF) << 4));
        qh[l] = static_cast<uint8_t>((v[l] >> 4) | ((v[l + 32] >> 4) << 2) | ((v[l + 64] >> 4) << 4) |
                                     ((v[l + 96] >> 4) << 6));
      }
    }
  }
}

}  // namespace

bool can_quantize_weights(TensorType type) {
  switch (type) {
    case TensorType::F32:
    case TensorType::F16:
    case TensorType::BF16:
    case TensorType::Q4_0:
    case TensorType::Q8_0:
    case TensorType::Q4_K:
    case TensorType::Q5_K:
    case TensorType::Q6_K:
    case TensorType::MXFP4: return true;
    default: return false;
  }
}

void quantize_weights(TensorType type, const float* src, void* dst, int64_t n) {
  switch (type) {
    case TensorType::F32: ref::quantize_f32(src, dst, n); return;
    case TensorType::F16: ref::quantize_f16(src, dst, n); return;
    case TensorType::BF16: ref::quantize_bf16(src, dst, n); return;
    case TensorType::Q4_0: quantize_q4_0(src, dst, n); return;
    case TensorType::Q8_0: ref::quantize_q8_0(src, dst, n); return;
    case TensorType::Q4_K: quantize_q4_K(src, dst, n); return;
    case TensorType::Q5_K: quantize_q5_K(src, dst, n); return;
    case TensorType::Q6_K: quantize_q6_K(src, dst, n); return;
    case TensorType::MXFP4: quantize_mxfp4(src, dst, n); return;
    default: fail("cannot quantize weights to {}", type_name(type));
  }
}

}  // namespace bmoe
