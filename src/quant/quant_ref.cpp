// Scalar reference kernels: the definition every SIMD path is tested against.
#include <cmath>
#include <cstring>

#include "quant/blocks.h"
#include "quant/quant.h"
#include "quant/ref_kernels.h"

namespace bmoe::ref {

// ---------------------------------------------------------------- dequantize

void dequantize_f32(const void* src, float* dst, int64_t n) {
  std::memcpy(dst, src, static_cast<size_t>(n) * sizeof(float));
}

void dequantize_f16(const void* src, float* dst, int64_t n) {
  const auto* h = static_cast<const uint16_t*>(src);
  for (int64_t i = 0; i < n; ++i) dst[i] = fp16_to_fp32(h[i]);
}

void dequantize_bf16(const void* src, float* dst, int64_t n) {
  const auto* h = static_cast<const uint16_t*>(src);
  for (int64_t i = 0; i < n; ++i) dst[i] = bf16_to_fp32(h[i]);
}

void dequantize_q4_0(const void* src, float* dst, int64_t n) {
  const auto* blocks = static_cast<const BlockQ4_0*>(src);
  for (int64_t b = 0; b < n / kQK; ++b) {
    const float d = fp16_to_fp32(blocks[b].d);
    float* y = dst + b * kQK;
    for (int j = 0; j < 16; ++j) {
      y[j] = static_cast<float>((blocks[b].qs[j] & 0xF) - 8) * d;
      y[j + 16] = static_cast<float>((blocks[b].qs[j] >> 4) - 8) * d;
    }
  }
}

void dequantize_q8_0(const void* src, float* dst, int64_t n) {
  const auto* blocks = static_cast<const BlockQ8_0*>(src);
  for (int64_t b = 0; b < n / kQK; ++b) {
    const float d = fp16_to_fp32(blocks[b].d);
    for (int j = 0; j < kQK; ++j) dst[b * kQK + j] = static_cast<float>(blocks[b].qs[j]) * d;
  }
}

void dequantize_mxfp4(const void* src, float* dst, int64_t n) {
  const auto* blocks = static_cast<const BlockMXFP4*>(src);
  for (int64_t b = 0; b < n / kQK; ++b) {
    const float d = e8m0_to_fp32_half(blocks[b].e);
    float* y = dst + b * kQK;
    for (int j = 0; j < 16; ++j) {
      y[j] = static_cast<float>(kMxfp4Values[blocks[b].qs[j] & 0xF]) * d;
      y[j + 16] = static_cast<float>(kMxfp4Values[blocks[b].qs[j] >> 4]) * d;
    }
  }
}

void dequantize_q4_K(const void* src, float* dst, int64_t n) {
  const auto* blocks = static_cast<const BlockQ4_K*>(src);
  for (int64_t b = 0; b < n / kQK_K; ++b) {
    const BlockQ4_K& x = blocks[b];
    const float d = fp16_to_fp32(x.d);
    const float dmin = fp16_to_fp32(x.dmin);
    float* y = dst + b * kQK_K;
    const uint8_t* q = x.qs;
    for (int chunk = 0; chunk < 4; ++chunk) {  // 64 elements: two sub-blocks share 32 bytes
      uint8_t sc0, m0, sc1, m1;
      k_scale_min(2 * chunk, x.scales, sc0, m0);
      k_scale_min(2 * chunk + 1, x.scales, sc1, m1);
      const float d0 = d * sc0, min0 = dmin * m0, d1 = d * sc1, min1 = dmin * m1;
      for (int l = 0; l < 32; ++l) {
        y[l] = d0 * static_cast<float>(q[l] & 0xF) - min0;
        y[l + 32] = d1 * static_cast<float>(q[l] >> 4) - min1;
      }
      y += 64;
      q += 32;
    }
  }
}

void dequantize_q5_K(const void* src, float* dst, int64_t n) {
  const auto* blocks = static_cast<const BlockQ5_K*>(src);
  for (int64_t b = 0; b < n / kQK_K; ++b) {
    const BlockQ5_K& x = blocks[b];
    const float d = fp16_to_fp32(x.d);
    const float dmin = fp16_to_fp32(x.dmin);
    float* y = dst + b * kQK_K;
    const uint8_t* q = x.qs;
    for (int chunk = 0; chunk < 4; ++chunk) {
      uint8_t sc0, m0, sc1, m1;
      k_scale_min(2 * chunk, x.scales, sc0, m0);
      k_scale_min(2 * chunk + 1, x.scales, sc1, m1);
      const float d0 = d * sc0, min0 = dmin * m0, d1 = d * sc1, min1 = dmin * m1;
      const uint8_t bit0 = static_cast<uint8_t>(1u << (2 * chunk));
      const uint8_t bit1 = static_cast<uint8_t>(2u << (2 * chunk));
      for (int l = 0; l < 32; ++l) {
        y[l] = d0 * static_cast<float>((q[l] & 0xF) + ((x.qh[l] & bit0) ? 16 : 0)) - min0;
        y[l + 32] = d1 * static_cast<float>((q[l] >> 4) + ((x.qh[l] & bit1) ? 16 : 0)) - min1;
      }
      y += 64;
      q += 32;
    }
  }
}

// Q6_K element i of a 128-element half: low nibble from ql, two high bits from qh.
static inline int q6_value(const uint8_t* ql, const uint8_t* qh, int l, int part) {
  // part 0..3 selects the four 32-element runs of a 128-element half.
  const int low = part & 1 ? ql[l + 32] : ql[l];
  const int nibble = part < 2 ? (low & 0xF) : (low >> 4);
  const int high = (qh[l] >> (2 * part)) & 3;
  return (nibble | (high << 4)) - 32;
}

void dequantize_q6_K(const void* src, float* dst, int64_t n) {
  const auto* blocks = static_cast<const BlockQ6_K*>(src);
  for (int64_t b = 0; b < n / kQK_K; ++b) {
    const BlockQ6_K& x = blocks[b];
    const float d = fp16_to_fp32(x.d);
    for (int half = 0; half < 2; ++half) {
      const uint8_t* ql = x.ql + 64 * half;
      const uint8_t* qh = x.qh + 32 * half;
      const int8_t* sc = x.scales + 8 * half;
      float* y = dst + b * kQK_K + 128 * half;
      for (int part = 0; part < 4; ++part) {
        for (int l = 0; l < 32; ++l) {
          y[32 * part + l] = d * static_cast<float>(sc[2 * part + l / 16]) *
                             static_cast<float>(q6_value(ql, qh, l, part));
        }
      }
    }
  }
}

// ---------------------------------------------------------------- activations

void quantize_f32(const float* src, void* dst, int64_t n) {
  std::memcpy(dst, src, static_cast<size_t>(n) * sizeof(float));
}

void quantize_f16(const float* src, void* dst, int64_t n) {
  auto* h = static_cast<uint16_t*>(dst);
  for (int64_t i = 0; i < n; ++i) h[i] = fp32_to_fp16(src[i]);
}

void quantize_bf16(const float* src, void* dst, int64_t n) {
  auto* h = static_cast<uint16_t*>(dst);
  for (int64_t i = 0; i < n; ++i) h[i] = fp32_to_bf16(src[i]);
}

// Q8_0 as llama.cpp's x86 path computes it: multiplier 127/amax, round half to even.
void quantize_q8_0(const float* src, void* dst, int64_t n) {
  auto* blocks = static_cast<BlockQ8_0*>(dst);
  for (int64_t b = 0; b < n / kQK; ++b) {
    const float* x = src + b * kQK;
    float amax = 0.0f;
    for (int j = 0; j < kQK; ++j) amax = std::fmax(amax, std::fabs(x[j]));
    blocks[b].d = fp32_to_fp16(amax / 127.0f);
    const float id = amax != 0.0f ? 127.0f / amax : 0.0f;
    for (int j = 0; j < kQK; ++j) blocks[b].qs[j] = static_cast<int8_t>(round_even(x[j] * id));
  }
}

// Q8_K: scale from the signed value of largest magnitude (-127/max), ties to even.
void quantize_q8_K(const float* src, void* dst, int64_t n) {
  auto* blocks = static_cast<BlockQ8_K*>(dst);
  for (int64_t b = 0; b < n / kQK_K; ++b) {
    const float* x = src + b * kQK_K;
    BlockQ8_K& y = blocks[b];
    float max = 0.0f, amax = 0.0f;
    for (int j = 0; j < kQK_K; ++j) {
      const float ax = std::fabs(x[j]);
      if (ax > amax) {
        amax = ax;
        max = x[j];
      }
    }
    if (amax == 0.0f) {
      std::memset(&y, 0, sizeof y);
      continue;
    }
    const float iscale = -127.0f / max;
    for (int j = 0; j < kQK_K; ++j) {
      const float scaled = iscale * x[j];
      const int v = std::isnan(scaled) ? 0 : round_even(scaled);  // a NaN quantizes to 0 on every path
      y.qs[j] = static_cast<int8_t>(v < 127 ? v : 127);
    }
    for (int g = 0; g < kQK_K / 16; ++g) {
      int sum = 0;
      for (int i = 0; i < 16; ++i) sum += y.qs[16 * g + i];
      y.bsums[g] = static_cast<int16_t>(sum);
    }
    y.d = 1.0f / iscale;
  }
}

// ---------------------------------------------------------------- dot products

float dot_f32(const void* w, const void* a, int64_t n) {
  const auto* x = static_cast<const float*>(w);
  const auto* y = static_cast<const float*>(a);
  double sum = 0.0;  // ggml's scalar path accumulates in double
  for (int64_t i = 0; i < n; ++i) sum += static_cast<double>(x[i] * y[i]);
  return static_cast<float>(sum);
}

float dot_f16(const void* w, const void* a, int64_t n) {
  const auto* x = static_cast<const uint16_t*>(w);
  const auto* y = static_cast<const uint16_t*>(a);
  double sum = 0.0;
  for (int64_t i = 0; i < n; ++i) sum += static_cast<double>(fp16_to_fp32(x[i]) * fp16_to_fp32(y[i]));
  return static_cast<float>(sum);
}

float dot_f16_f32(const void* w, const void* a, int64_t n) {
  const auto* x = static_cast<const uint16_t*>(w);
  const auto* y = static_cast<const float*>(a);
  double sum = 0.0;
  for (int64_t i = 0; i < n; ++i) sum += static_cast<double>(fp16_to_fp32(x[i]) * y[i]);
  return static_cast<float>(sum);
}

float dot_bf16(const void* w, const void* a, int64_t n) {
  const auto* x = static_cast<const uint16_t*>(w);
  const auto* y = static_cast<const uint16_t*>(a);
  double sum = 0.0;
  for (int64_t i = 0; i < n; ++i) sum += static_cast<double>(bf16_to_fp32(x[i]) * bf16_to_fp32(y[i]));
  return static_cast<float>(sum);
}

float dot_q4_0(const void* w, const void* a, int64_t n) {
  const auto* x = static_cast<const BlockQ4_0*>(w);
  const auto* y = static_cast<const BlockQ8_0*>(a);
  float sum = 0.0f;
  for (int64_t b = 0; b < n / kQK; ++b) {
    int isum = 0;
    for (int j = 0; j < 16; ++j) {
      isum += ((x[b].qs[j] & 0xF) - 8) * y[b].qs[j];
      isum += ((x[b].qs[j] >> 4) - 8) * y[b].qs[j + 16];
    }
    sum = std::fma(static_cast<float>(isum), fp16_to_fp32(x[b].d) * fp16_to_fp32(y[b].d), sum);
  }
  return sum;
}

float dot_q8_0(const void* w, const void* a, int64_t n) {
  const auto* x = static_cast<const BlockQ8_0*>(w);
  const auto* y = static_cast<const BlockQ8_0*>(a);
  float sum = 0.0f;
  for (int64_t b = 0; b < n / kQK; ++b) {
    int isum = 0;
    for (int j = 0; j < kQK; ++j) isum += x[b].qs[j] * y[b].qs[j];
    sum += static_cast<float>(isum) * (fp16_to_fp32(x[b].d) * fp16_to_fp32(y[b].d));
  }
  return sum;
}

float dot_mxfp4(const void* w, const void* a, int64_t n) {
  const auto* x = static_cast<const BlockMXFP4*>(w);
  const auto* y = static_cast<const BlockQ8_0*>(a);
  float sum = 0.0f;
  for (int64_t b = 0; b < n / kQK; ++b) {
    int isum = 0;
    for (int j = 0; j < 16; ++j) {
      isum += kMxfp4Values[x[b].qs[j] & 0xF] * y[b].qs[j];
      isum += kMxfp4Values[x[b].qs[j] >> 4] * y[b].qs[j + 16];
    }
    sum = std::fma(static_cast<float>(isum), e8m0_to_fp32_half(x[b].e) * fp16_to_fp32(y[b].d), sum);
  }
  return sum;
}

// Q4_0, MXFP4 and Q4_K accumulate one fused multiply-add per block, like llama.cpp's
// interleaved kernels (so the scalar and AVX2 paths agree bit for bit).
float dot_q4_K(const void* w, const void* a, int64_t n) {
  const auto* x = static_cast<const BlockQ4_K*>(w);
  const auto* y = static_cast<const BlockQ8_K*>(a);
  float sum = 0.0f, sum_min = 0.0f;
  for (int64_t b = 0; b < n / kQK_K; ++b) {
    int isum = 0;
    const uint8_t* q = x[b].qs;
    const int8_t* q8 = y[b].qs;
    for (int chunk = 0; chunk < 4; ++chunk) {
      uint8_t sc0, m0, sc1, m1;
      k_scale_min(2 * chunk, x[b].scales, sc0, m0);
      k_scale_min(2 * chunk + 1, x[b].scales, sc1, m1);
      int s0 = 0, s1 = 0;
      for (int l = 0; l < 32; ++l) {
        s0 += (q[l] & 0xF) * q8[l];
        s1 += (q[l] >> 4) * q8[l + 32];
      }
      isum += sc0 * s0 + sc1 * s1;
      q += 32;
      q8 += 64;
    }
    sum = std::fma(static_cast<float>(isum), fp16_to_fp32(x[b].d) * y[b].d, sum);
    sum_min = std::fma(static_cast<float>(k_min_sum(x[b].scales, y[b].bsums)), fp16_to_fp32(x[b].dmin) * y[b].d, sum_min);
  }
  return sum - sum_min;
}

float dot_q5_K(const void* w, const void* a, int64_t n) {
  const auto* x = static_cast<const BlockQ5_K*>(w);
  const auto* y = static_cast<const BlockQ8_K*>(a);
  float sum = 0.0f;
  for (int64_t b = 0; b < n / kQK_K; ++b) {
    int isum = 0;
    const uint8_t* q = x[b].qs;
    const int8_t* q8 = y[b].qs;
    for (int chunk = 0; chunk < 4; ++chunk) {
      uint8_t sc0, m0, sc1, m1;
      k_scale_min(2 * chunk, x[b].scales, sc0, m0);
      k_scale_min(2 * chunk + 1, x[b].scales, sc1, m1);
      const uint8_t bit0 = static_cast<uint8_t>(1u << (2 * chunk));
      const uint8_t bit1 = static_cast<uint8_t>(2u << (2 * chunk));
      int s0 = 0, s1 = 0;
      for (int l = 0; l < 32; ++l) {
        s0 += ((q[l] & 0xF) + ((x[b].qh[l] & bit0) ? 16 : 0)) * q8[l];
        s1 += ((q[l] >> 4) + ((x[b].qh[l] & bit1) ? 16 : 0)) * q8[l + 32];
      }
      isum += sc0 * s0 + sc1 * s1;
      q += 32;
      q8 += 64;
    }
    const float d = y[b].d * fp16_to_fp32(x[b].d);
    const float dmin = y[b].d * fp16_to_fp32(x[b].dmin);
    sum += d * static_cast<float>(isum) - dmin * static_cast<float>(k_min_sum(x[b].scales, y[b].bsums));
  }
  return sum;
}

float dot_q6_K(const void* w, const void* a, int64_t n) {
  const auto* x = static_cast<const BlockQ6_K*>(w);
  const auto* y = static_cast<const BlockQ8_K*>(a);
  float sum = 0.0f;
  for (int64_t b = 0; b < n / kQK_K; ++b) {
    int isum = 0;
    for (int half = 0; half < 2; ++half) {
      const uint8_t* ql = x[b].ql + 64 * half;
      const uint8_t* qh = x[b].qh + 32 * half;
      const int8_t* sc = x[b].scales + 8 * half;
      const int8_t* q8 = y[b].qs + 128 * half;
      for (int part = 0; part < 4; ++part) {
        for (int g = 0; g < 2; ++g) {
          int s = 0;
          for (int l = 16 * g; l < 16 * g + 16; ++l) s += q6_value(ql, qh, l, part) * q8[32 * part + l];
          isum += sc[2 * part + g] * s;
        }
      }
    }
    sum += fp16_to_fp32(x[b].d) * y[b].d * static_cast<float>(isum);
  }
  return sum;
}

}  // namespace bmoe::ref
