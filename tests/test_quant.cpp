// Kernel tests: block layouts, activation quantization, and every dot product against a
// double-precision reference computed from the dequantized operands, on the scalar and the
// SIMD paths, including edge values (zeros, extremes, random raw bytes).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <iterator>
#include <string>
#include <vector>

#include "core/cpu_features.h"
#include "core/fp16.h"
#include "core/rng.h"
#include "quant/blocks.h"
#include "quant/float_kernels.h"
#include "quant/quant.h"
#include "quant/ref_kernels.h"
#include "quant/simd_kernels.h"

#if defined(__x86_64__)
#include <immintrin.h>
#endif

namespace bmoe {
namespace {

const TensorType kWeightTypes[] = {TensorType::F32,  TensorType::F16,  TensorType::BF16,
                                   TensorType::Q4_0, TensorType::Q8_0, TensorType::MXFP4,
                                   TensorType::Q4_K, TensorType::Q5_K, TensorType::Q6_K};

std::vector<float> random_floats(Rng& rng, int64_t n, double scale) {
  std::vector<float> v(static_cast<size_t>(n));
  for (float& x : v) x = static_cast<float>(rng.normal() * scale);
  return v;
}

std::vector<uint8_t> quantize(TensorType t, const std::vector<float>& x) {
  std::vector<uint8_t> out(row_bytes(t, static_cast<int64_t>(x.size())));
  quantize_weights(t, x.data(), out.data(), static_cast<int64_t>(x.size()));
  return out;
}

std::vector<float> dequantize(TensorType t, const void* data, int64_t n) {
  std::vector<float> out(static_cast<size_t>(n));
  dequantize_row(t, data, out.data(), n);
  return out;
}

// Random raw bytes are valid blocks for every format once the f16 scales are finite.
std::vector<uint8_t> random_raw_blocks(Rng& rng, TensorType t, int64_t n) {
  std::vector<uint8_t> bytes(row_bytes(t, n));
  for (uint8_t& b : bytes) b = static_cast<uint8_t>(rng.next());
  const TypeInfo& info = type_info(t);
  auto set_f16 = [&](size_t offset) {
    const uint16_t h = fp32_to_fp16(static_cast<float>(rng.uniform() * 0.01));
    std::memcpy(&bytes[offset], &h, 2);
  };
  for (size_t b = 0; b < bytes.size() / info.block_bytes; ++b) {
    const size_t base = b * info.block_bytes;
    switch (t) {
      case TensorType::Q4_0:
      case TensorType::Q8_0: set_f16(base); break;
      case TensorType::Q4_K:
      case TensorType::Q5_K: set_f16(base); set_f16(base + 2); break;
      case TensorType::Q6_K: set_f16(base + 208); break;
      case TensorType::MXFP4: bytes[base] = static_cast<uint8_t>(110 + rng.below(20)); break;
      default: break;
    }
  }
  if (t == TensorType::F32) {
    for (int64_t i = 0; i < n; ++i) {
      const float v = static_cast<float>(rng.normal());
      std::memcpy(&bytes[static_cast<size_t>(i) * 4], &v, 4);
    }
  } else if (t == TensorType::F16 || t == TensorType::BF16) {
    for (int64_t i = 0; i < n; ++i) {
      const float v = static_cast<float>(rng.normal());
      const uint16_t h = t == TensorType::F16 ? fp32_to_fp16(v) : fp32_to_bf16(v);
      std::memcpy(&bytes[static_cast<size_t>(i) * 2], &h, 2);
    }
  }
  return bytes;
}

double reference_dot(TensorType w_type, const void* w, const std::vector<float>& act, int64_t n) {
  const TensorType a_type = kernels(w_type).activation_type;
  std::vector<uint8_t> qa(activation_bytes(a_type, n));
  quantize_activations(a_type, act.data(), qa.data(), n);
  std::vector<float> a_deq(static_cast<size_t>(n));
  if (a_type == TensorType::Q8_K) {
    const auto* blocks = reinterpret_cast<const BlockQ8_K*>(qa.data());
    for (int64_t i = 0; i < n; ++i) a_deq[i] = blocks[i / 256].d * blocks[i / 256].qs[i % 256];
  } else {
    a_deq = dequantize(a_type, qa.data(), n);
  }
  const std::vector<float> w_deq = dequantize(w_type, w, n);
  double sum = 0.0;
  for (int64_t i = 0; i < n; ++i) sum += static_cast<double>(w_deq[i]) * a_deq[i];
  return sum;
}

double dot_with(const TypeKernels& k, const void* w, const std::vector<float>& act, int64_t n) {
  std::vector<uint8_t> qa(activation_bytes(k.activation_type, n));
  quantize_activations(k.activation_type, act.data(), qa.data(), n);
  return k.dot(w, qa.data(), n);
}

double magnitude(TensorType w_type, const void* w, const std::vector<float>& act, int64_t n) {
  const std::vector<float> w_deq = dequantize(w_type, w, n);
  double m = 0.0;
  for (int64_t i = 0; i < n; ++i) m += std::fabs(static_cast<double>(w_deq[i]) * act[i]);
  return m;
}

std::vector<Isa> available_isas() {
  std::vector<Isa> isas = {Isa::Scalar};
  if (active_isa() != Isa::Scalar) isas.push_back(active_isa());
  return isas;
}

TEST(Layout, BlockSizesMatchTypeTable) {
  EXPECT_EQ(type_info(TensorType::Q4_K).block_bytes, sizeof(BlockQ4_K));
  EXPECT_EQ(type_info(TensorType::Q5_K).block_bytes, sizeof(BlockQ5_K));
  EXPECT_EQ(type_info(TensorType::Q6_K).block_bytes, sizeof(BlockQ6_K));
  EXPECT_EQ(type_info(TensorType::Q8_0).block_bytes, sizeof(BlockQ8_0));
  EXPECT_EQ(type_info(TensorType::Q4_0).block_bytes, sizeof(BlockQ4_0));
  EXPECT_EQ(type_info(TensorType::MXFP4).block_bytes, sizeof(BlockMXFP4));
}

TEST(Layout, Q4_0KnownBlock) {
  BlockQ4_0 b{};
  b.d = fp32_to_fp16(0.5f);
  for (int j = 0; j < 16; ++j) b.qs[j] = static_cast<uint8_t>(j | ((15 - j) << 4));
  const auto y = dequantize(TensorType::Q4_0, &b, 32);
  for (int j = 0; j < 16; ++j) {
    EXPECT_FLOAT_EQ(y[j], (j - 8) * 0.5f);
    EXPECT_FLOAT_EQ(y[j + 16], (7 - j) * 0.5f);
  }
}

TEST(Layout, Q4_KScaleUnpacking) {
  // Sub-block j's scale = j + 1, min = 2j; element value = d*sc*q - dmin*m with q = 3.
  uint8_t sc[8], m[8];
  for (int j = 0; j < 8; ++j) {
    sc[j] = static_cast<uint8_t>(j + 1 + 40 * (j >= 4));
    m[j] = static_cast<uint8_t>(2 * j + 20 * (j >= 4));
  }
  BlockQ4_K b{};
  b.d = fp32_to_fp16(1.0f);
  b.dmin = fp32_to_fp16(0.25f);
  for (int j = 0; j < 4; ++j) {
    b.scales[j] = static_cast<uint8_t>((sc[j] & 63) | ((sc[j + 4] >> 4) << 6));
    b.scales[j + 4] = static_cast<uint8_t>((m[j] & 63) | ((m[j + 4] >> 4) << 6));
    b.scales[j + 8] = static_cast<uint8_t>((sc[j + 4] & 0xF) | ((m[j + 4] & 0xF) << 4));
  }
  std::memset(b.qs, 0x33, sizeof b.qs);
  const auto y = dequantize(TensorType::Q4_K, &b, 256);
  for (int j = 0; j < 8; ++j) {
    EXPECT_FLOAT_EQ(y[32 * j + 5], sc[j] * 3.0f - 0.25f * m[j]) << "sub-block " << j;
  }
}

TEST(Layout, Mxfp4ExponentScale) {
  EXPECT_FLOAT_EQ(e8m0_to_fp32_half(127), 0.5f);
  EXPECT_FLOAT_EQ(e8m0_to_fp32_half(128), 1.0f);
  EXPECT_FLOAT_EQ(e8m0_to_fp32_half(1), std::ldexp(1.0f, -127));
  EXPECT_FLOAT_EQ(e8m0_to_fp32_half(0), std::ldexp(1.0f, -128));
}

TEST(Activations, Q8_KMatchesDefinition) {
  Rng rng(3);
  auto x = random_floats(rng, 512, 2.0);
  x[17] = -9.0f;  // the largest magnitude is negative: scale comes from the signed max
  BlockQ8_K q[2];
  ref::quantize_q8_K(x.data(), q, 512);
  EXPECT_FLOAT_EQ(q[0].d, 1.0f / (-127.0f / -9.0f));
  EXPECT_EQ(q[0].qs[17], -127);
  for (int g = 0; g < 16; ++g) {
    int sum = 0;
    for (int i = 0; i < 16; ++i) sum += q[1].qs[16 * g + i];
    EXPECT_EQ(q[1].bsums[g], sum);
  }
  for (int i = 0; i < 256; ++i) EXPECT_NEAR(q[0].qs[i] * q[0].d, x[i], std::fabs(q[0].d) * 0.5001);
}

// The active path's Q8_K quantizer (SIMD where there is one) writes the reference's bytes,
// including ties for the largest magnitude, zero blocks, NaN elements and tiny scales.
TEST(Activations, Q8_KActivePathEqualsReference) {
  Rng rng(31);
  for (int trial = 0; trial < 50; ++trial) {
    auto x = random_floats(rng, 1024, trial % 3 == 0 ? 1e-30 : 3.0);
    if (trial % 5 == 1) x[200] = -(x[300] = 1e3f);  // two elements share the largest magnitude
    if (trial % 7 == 2) std::fill(x.begin() + 256, x.begin() + 512, 0.0f);
    if (trial % 11 == 3) x[700] = std::nanf("");
    std::vector<uint8_t> want(activation_bytes(TensorType::Q8_K, 1024)), got(want.size());
    ref::quantize_q8_K(x.data(), want.data(), 1024);
    quantize_activations(TensorType::Q8_K, x.data(), got.data(), 1024);
    ASSERT_EQ(got, want) << "trial " << trial;
  }
}

TEST(Activations, Q8_KAllZeroBlock) {
  std::vector<float> x(256, 0.0f);
  BlockQ8_K q;
  std::memset(&q, 0x55, sizeof q);
  ref::quantize_q8_K(x.data(), &q, 256);
  EXPECT_EQ(q.d, 0.0f);
  for (int i = 0; i < 256; ++i) EXPECT_EQ(q.qs[i], 0);
  for (int g = 0; g < 16; ++g) EXPECT_EQ(q.bsums[g], 0);
}

TEST(Activations, Q8_0RoundsHalfToEven) {
  std::vector<float> x(32, 0.0f);
  x[0] = 127.0f;  // multiplier 1.0 exactly
  x[1] = 2.5f;
  x[2] = 3.5f;
  x[3] = -2.5f;
  BlockQ8_0 q;
  ref::quantize_q8_0(x.data(), &q, 32);
  EXPECT_EQ(q.qs[0], 127);
  EXPECT_EQ(q.qs[1], 2);
  EXPECT_EQ(q.qs[2], 4);
  EXPECT_EQ(q.qs[3], -2);
  EXPECT_EQ(fp16_to_fp32(q.d), fp16_to_fp32(fp32_to_fp16(1.0f)));
}

TEST(WeightQuantizers, ErrorIsBoundedByFormat) {
  Rng rng(11);
  const auto x = random_floats(rng, 4096, 1.0);
  struct Bound {
    TensorType type;
    double rms;
  } bounds[] = {{TensorType::F16, 1e-3}, {TensorType::BF16, 5e-3}, {TensorType::Q8_0, 0.01},
                {TensorType::Q6_K, 0.04}, {TensorType::Q5_K, 0.08}, {TensorType::Q4_K, 0.16},
                {TensorType::Q4_0, 0.16}, {TensorType::MXFP4, 0.3}};
  for (const Bound& b : bounds) {
    const auto q = quantize(b.type, x);
    const auto y = dequantize(b.type, q.data(), 4096);
    double err = 0.0;
    for (size_t i = 0; i < x.size(); ++i) err += (x[i] - y[i]) * (x[i] - y[i]);
    const double rms = std::sqrt(err / x.size());
    EXPECT_LT(rms, b.rms) << type_name(b.type);
    EXPECT_GT(rms, 0.0) << type_name(b.type) << " should be lossy";
  }
}

class DotTest : public ::testing::TestWithParam<TensorType> {};

TEST_P(DotTest, QuantizedWeightsMatchDoubleReference) {
  const TensorType t = GetParam();
  Rng rng(static_cast<uint64_t>(t) + 100);
  for (int64_t n : {256, 1024, 2048, 4096}) {
    const auto w = quantize(t, random_floats(rng, n, 0.05));
    const auto act = random_floats(rng, n, 1.0);
    const double want = reference_dot(t, w.data(), act, n);
    const double tol = 1e-5 * magnitude(t, w.data(), act, n) + 1e-6;
    for (Isa isa : available_isas()) {
      const TypeKernels* k = kernels_for_isa(t, isa);
      ASSERT_NE(k, nullptr);
      EXPECT_NEAR(dot_with(*k, w.data(), act, n), want, tol)
          << type_name(t) << " n=" << n << " isa=" << static_cast<int>(isa);
    }
  }
}

TEST_P(DotTest, RandomRawBlocksAndSimdAgree) {
  const TensorType t = GetParam();
  Rng rng(static_cast<uint64_t>(t) + 200);
  for (int trial = 0; trial < 50; ++trial) {
    const int64_t n = 256 * (1 + static_cast<int64_t>(rng.below(8)));
    const auto w = random_raw_blocks(rng, t, n);
    auto act = random_floats(rng, n, trial % 2 ? 1.0 : 100.0);
    if (trial % 7 == 0) std::fill(act.begin(), act.begin() + 256, 0.0f);  // all-zero block
    if (trial % 5 == 0) act[3] = -1e4f;                                   // one huge outlier
    const double want = reference_dot(t, w.data(), act, n);
    const double tol = 1e-5 * magnitude(t, w.data(), act, n) + 1e-6;
    for (Isa isa : available_isas()) {
      EXPECT_NEAR(dot_with(*kernels_for_isa(t, isa), w.data(), act, n), want, tol)
          << type_name(t) << " trial " << trial << " isa=" << static_cast<int>(isa);
    }
  }
}

TEST_P(DotTest, ExtremeQuantsDoNotOverflow) {
  // All quants at their maximum and activations at +-127: the largest integer sums possible.
  const TensorType t = GetParam();
  const int64_t n = 256;
  std::vector<uint8_t> w(row_bytes(t, n), 0xFF);
  Rng rng(5);
  if (t == TensorType::F32 || t == TensorType::F16 || t == TensorType::BF16) {
    w = quantize(t, std::vector<float>(n, 3.0f));
  }
  // Keep the scales finite and small.
  const TypeInfo& info = type_info(t);
  for (size_t b = 0; b < w.size() / info.block_bytes && info.block_size > 1; ++b) {
    const uint16_t h = fp32_to_fp16(0.001f);
    const size_t base = b * info.block_bytes;
    if (t == TensorType::Q6_K) std::memcpy(&w[base + 208], &h, 2);
    else if (t == TensorType::MXFP4) w[base] = 120;
    else {
      std::memcpy(&w[base], &h, 2);
      if (t == TensorType::Q4_K || t == TensorType::Q5_K) std::memcpy(&w[base + 2], &h, 2);
    }
  }
  for (float sign : {1.0f, -1.0f}) {
    std::vector<float> act(n, 127.0f * sign);
    const double want = reference_dot(t, w.data(), act, n);
    for (Isa isa : available_isas()) {
      EXPECT_NEAR(dot_with(*kernels_for_isa(t, isa), w.data(), act, n), want, 1e-4 * std::fabs(want) + 1e-4)
          << type_name(t);
    }
  }
}

TEST(Dot, F16PairMatchesReference) {
  Rng rng(21);
  for (int64_t n : {64, 128, 100}) {
    std::vector<uint16_t> x(static_cast<size_t>(n)), y(static_cast<size_t>(n));
    double want = 0.0;
    for (int64_t i = 0; i < n; ++i) {
      x[i] = fp32_to_fp16(static_cast<float>(rng.normal()));
      y[i] = fp32_to_fp16(static_cast<float>(rng.normal()));
      want += static_cast<double>(fp16_to_fp32(x[i])) * fp16_to_fp32(y[i]);
    }
    EXPECT_NEAR(dot_f16_pair(x.data(), y.data(), n), want, 1e-4);
  }
}

INSTANTIATE_TEST_SUITE_P(AllTypes, DotTest, ::testing::ValuesIn(kWeightTypes),
                         [](const auto& info) { return std::string(type_name(info.param)); });

// The NEON quantized kernels accumulate exactly as the reference does: equal bit for bit.
TEST(Dispatch, NeonQuantKernelsEqualTheReferenceBitForBit) {
  if (active_isa() != Isa::Neon) GTEST_SKIP() << "not an arm64 CPU with dotprod";
  Rng rng(77);
  for (TensorType t : {TensorType::Q4_0, TensorType::Q8_0, TensorType::MXFP4, TensorType::Q4_K, TensorType::Q5_K,
                       TensorType::Q6_K}) {
    for (int trial = 0; trial < 20; ++trial) {
      const int64_t n = 256 * (1 + static_cast<int64_t>(rng.below(8)));
      const auto w = random_raw_blocks(rng, t, n);
      const auto act = random_floats(rng, n, trial % 2 ? 1.0 : 50.0);
      const float simd = static_cast<float>(dot_with(kernels(t), w.data(), act, n));
      const float scalar = static_cast<float>(dot_with(*kernels_for_isa(t, Isa::Scalar), w.data(), act, n));
      EXPECT_EQ(float_bits(simd), float_bits(scalar)) << type_name(t) << " n=" << n;
    }
  }
}

// `count` rows of random raw blocks of `t` with `n` elements each, `stride` bytes apart.
std::vector<uint8_t> random_rows(Rng& rng, TensorType t, int64_t n, int count, size_t stride) {
  std::vector<uint8_t> rows(stride * static_cast<size_t>(count));
  for (int r = 0; r < count; ++r) {
    const auto one = random_raw_blocks(rng, t, n);
    std::copy(one.begin(), one.end(), rows.begin() + static_cast<std::ptrdiff_t>(r * stride));
  }
  return rows;
}

// A random activation row in the activation format of kernels `k`.
std::vector<uint8_t> random_activations(Rng& rng, const TypeKernels& k, int64_t n, double stddev) {
  const auto act = random_floats(rng, n, stddev);
  std::vector<uint8_t> qa(activation_bytes(k.activation_type, n));
  quantize_activations(k.activation_type, act.data(), qa.data(), n);
  return qa;
}

// One trial of a multi-row kernel: random rows of `t` (with gaps between them on some trials)
// and a random activation row; each of the kDotRows outputs must equal k.dot on its row bit for
// bit (and the scalar reference's, for the types whose one-row SIMD kernel keeps its order).
void expect_rows_equal_one_row(Rng& rng, TensorType t, const TypeKernels& k, DotRowsFn rows_kernel, int trial) {
  const int64_t n = 256 * (1 + static_cast<int64_t>(rng.below(12)));
  const size_t stride = row_bytes(t, n) + type_info(t).block_bytes * static_cast<size_t>(trial % 3);
  const std::vector<uint8_t> rows = random_rows(rng, t, n, kDotRows, stride);
  const std::vector<uint8_t> qa = random_activations(rng, k, n, trial % 2 ? 1.0 : 50.0);
  float got[kDotRows];
  rows_kernel(rows.data(), stride, qa.data(), n, got);
  for (int r = 0; r < kDotRows; ++r) {
    const void* row = rows.data() + r * stride;
    EXPECT_EQ(float_bits(got[r]), float_bits(k.dot(row, qa.data(), n))) << type_name(t) << " row " << r;
    if (t == TensorType::Q4_0 || t == TensorType::MXFP4) {
      const float scalar = kernels_for_isa(t, Isa::Scalar)->dot(row, qa.data(), n);
      EXPECT_EQ(float_bits(got[r]), float_bits(scalar)) << type_name(t) << " row " << r;
    }
  }
}

// The multi-row kernels return, for each of their rows, exactly what the one-row kernel of the
// same ISA returns (and the scalar reference, for the types whose one-row SIMD kernel keeps the
// reference's order): matmul uses them wherever a whole group of rows fits.
TEST(Dispatch, MultiRowKernelsEqualOneRowBitForBit) {
  Rng rng(78);
  int checked = 0;
  for (TensorType t : kWeightTypes) {
    for (Isa isa : available_isas()) {
      const TypeKernels* k = kernels_for_isa(t, isa);
      if (k == nullptr || k->dot_rows == nullptr) continue;
      for (int trial = 0; trial < 10; ++trial) {
        expect_rows_equal_one_row(rng, t, *k, k->dot_rows, trial);
        ++checked;
      }
    }
  }
#if defined(__x86_64__)
  if (active_isa() == Isa::Avx2) {
    EXPECT_GE(checked, 20);  // Q4_0 and MXFP4 have AVX2 row kernels
  }
#endif
  if (active_isa() == Isa::Scalar) GTEST_SKIP() << "no multi-row kernels on the scalar path";
}

#if defined(__x86_64__)
// The eight-row Q8_0 kernel is in matmul's table on Intel only (dispatch.cpp), so the test
// above skips it on AMD: check it directly, on every x86 machine with AVX2.
TEST(Dispatch, EightRowQ8_0KernelEqualsOneRowOnEveryVendor) {
  if (active_isa() != Isa::Avx2) GTEST_SKIP() << "no AVX2";
  Rng rng(80);
  const TypeKernels& k = kernels(TensorType::Q8_0);
  const DotRowsFn rows = cpu_features().avx512vnni ? avx512vl_vnni::dot_rows_q8_0
                         : cpu_features().avx_vnni ? avx2_vnni::dot_rows_q8_0 : avx2::dot_rows_q8_0;
  for (int trial = 0; trial < 10; ++trial) expect_rows_equal_one_row(rng, TensorType::Q8_0, k, rows, trial);
  EXPECT_EQ(k.dot_rows, cpu_features().amd ? nullptr : rows);
}

// Every build of the 256-bit integer one-row and eight-row kernels (quant_x86_rows_kernels.h)
// this CPU can run, the plain AVX2 one first (the one the VNNI builds must equal).
struct RowVariant {
  const char* name;
  bool runs;
  DotFn q4_0, q8_0, mxfp4, q4_K, q5_K, q6_K;
  DotRowsFn rows_q8_0, rows_q4_0, rows_mxfp4;
  DotFn dot(TensorType t) const {
    switch (t) {
      case TensorType::Q4_0: return q4_0;
      case TensorType::Q8_0: return q8_0;
      case TensorType::MXFP4: return mxfp4;
      case TensorType::Q4_K: return q4_K;
      case TensorType::Q5_K: return q5_K;
      case TensorType::Q6_K: return q6_K;
      default: return nullptr;
    }
  }
  DotRowsFn rows(TensorType t) const {
    return t == TensorType::Q8_0 ? rows_q8_0 : t == TensorType::Q4_0 ? rows_q4_0 : t == TensorType::MXFP4 ? rows_mxfp4 : nullptr;
  }
};
#define BMOE_ROW_VARIANT(label, runs, ns)                                                                        \
  RowVariant{label, runs, ns::dot_q4_0, ns::dot_q8_0, ns::dot_mxfp4, ns::dot_q4_K, ns::dot_q5_K, ns::dot_q6_K, \
             ns::dot_rows_q8_0, ns::dot_rows_q4_0, ns::dot_rows_mxfp4}

std::vector<RowVariant> x86_row_variants() {
  const CpuFeatures& f = cpu_features();
  return {BMOE_ROW_VARIANT("avx2", f.avx2, avx2), BMOE_ROW_VARIANT("avx2-vnni", f.avx_vnni, avx2_vnni),
          BMOE_ROW_VARIANT("avx512-vnni (ymm)", f.avx512vnni, avx512vl_vnni)};
}

// The VNNI one-row and eight-row kernels of decode (vpdpbusd / vpdpwssd, VEX and EVEX) return
// exactly what the AVX2 maddubs ones return (and the scalar reference, for Q4_0 and MXFP4, whose
// AVX2 kernels keep its order), on random raw blocks (every quant value, scales of any
// exponent), several row lengths, padded strides, small and large activations; and the
// dispatcher installs the widest the (possibly BMOE_ISA-narrowed) CPU runs.
TEST(Dispatch, VnniRowKernelsEqualAvx2BitForBit) {
  if (!cpu_features().avx2) GTEST_SKIP() << "no AVX2";
  Rng rng(94);
  const TensorType types[] = {TensorType::Q4_0, TensorType::Q8_0, TensorType::MXFP4, TensorType::Q4_K, TensorType::Q5_K, TensorType::Q6_K};
  const std::vector<RowVariant> variants = x86_row_variants();
  int checked = 0;
  for (TensorType t : types) {
    for (int trial = 0; trial < 20; ++trial) {
      const int64_t n = 256 * (1 + static_cast<int64_t>(rng.below(12)));
      const size_t stride = row_bytes(t, n) + type_info(t).block_bytes * static_cast<size_t>(trial % 3);
      const std::vector<uint8_t> w = random_rows(rng, t, n, kDotRows, stride);
      const std::vector<uint8_t> qa = random_activations(rng, kernels(t), n, trial % 2 ? 1.0 : 50.0);
      const float want = variants[0].dot(t)(w.data(), qa.data(), n);
      if (t == TensorType::Q4_0 || t == TensorType::MXFP4) {
        ASSERT_EQ(float_bits(want), float_bits(kernels_for_isa(t, Isa::Scalar)->dot(w.data(), qa.data(), n)));
      }
      float want_rows[kDotRows], got_rows[kDotRows];
      if (variants[0].rows(t) != nullptr) variants[0].rows(t)(w.data(), stride, qa.data(), n, want_rows);
      for (const RowVariant& v : variants) {
        if (!v.runs) continue;
        ASSERT_EQ(float_bits(v.dot(t)(w.data(), qa.data(), n)), float_bits(want)) << v.name << " " << type_name(t) << " n=" << n;
        ++checked;
        if (v.rows(t) == nullptr) continue;
        std::fill(std::begin(got_rows), std::end(got_rows), -1.0f);
        v.rows(t)(w.data(), stride, qa.data(), n, got_rows);
        for (int r = 0; r < kDotRows; ++r) {
          ASSERT_EQ(float_bits(got_rows[r]), float_bits(want_rows[r])) << v.name << " " << type_name(t) << " rows, row " << r;
        }
      }
    }
  }
  if (active_isa() == Isa::Avx2) {
    for (TensorType t : types) {
      if ((t == TensorType::Q4_K || t == TensorType::Q6_K) && cpu_features().avx512bw) continue;  // 512-bit ones
      DotFn pick = nullptr;
      for (const RowVariant& v : variants) {
        if (v.runs) pick = v.dot(t);
      }
      EXPECT_EQ(kernels(t).dot, pick) << type_name(t) << ": the dispatcher's pick";
    }
  }
  if (!cpu_features().avx_vnni && !cpu_features().avx512vnni) GTEST_SKIP() << "no VNNI on this CPU (or BMOE_ISA narrowed it)";
  EXPECT_GE(checked, 240);  // two builds or more on 120 shapes
}

// The AVX-512 Q4_K, Q6_K and MXFP4 eight-row kernels return exactly what the AVX2 ones return (dispatch installs
// them in the AVX2 table), on random blocks, several row lengths, small and large activations.
TEST(Dispatch, Avx512KernelsEqualAvx2BitForBit) {
  if (!cpu_features().avx512bw) GTEST_SKIP() << "no AVX-512 BW on this CPU (or BMOE_ISA narrowed it)";
  struct Pair {
    TensorType type;
    DotFn avx2, avx512;
  };
  const bool vnni = cpu_features().avx512vnni;
  const Pair pairs[] = {{TensorType::Q4_K, avx2::dot_q4_K, avx512::dot_q4_K},
                        {TensorType::Q6_K, avx2::dot_q6_K, avx512::dot_q6_K},
                        {TensorType::Q4_K, avx2::dot_q4_K, avx512_vnni::dot_q4_K},
                        {TensorType::Q6_K, avx2::dot_q6_K, avx512_vnni::dot_q6_K}};
  Rng rng(81);
  for (const Pair& p : pairs) {
    const bool is_vnni = p.avx512 == avx512_vnni::dot_q4_K || p.avx512 == avx512_vnni::dot_q6_K;
    if (is_vnni && !vnni) continue;  // not on this CPU (or BMOE_ISA=avx512 narrowed it)
    if (is_vnni == vnni) {
      EXPECT_EQ(kernels(p.type).dot, p.avx512) << type_name(p.type) << ": the dispatcher's pick";
    }
    for (int trial = 0; trial < 40; ++trial) {
      const int64_t n = 256 * (1 + static_cast<int64_t>(rng.below(12)));
      const auto w = random_raw_blocks(rng, p.type, n);
      const std::vector<uint8_t> qa = random_activations(rng, kernels(p.type), n, trial % 2 ? 1.0 : 50.0);
      const float want = p.avx2(w.data(), qa.data(), n);
      EXPECT_EQ(float_bits(p.avx512(w.data(), qa.data(), n)), float_bits(want)) << type_name(p.type) << " n=" << n;
      EXPECT_TRUE(std::isfinite(want));
    }
  }
  // The eight-row MXFP4 kernels, odd block counts (the AVX2 fallback) included.
  EXPECT_EQ(kernels(TensorType::MXFP4).dot_rows, vnni ? &avx512_vnni::dot_rows_mxfp4 : &avx512::dot_rows_mxfp4);
  for (int trial = 0; trial < 20; ++trial) {
    const int64_t n = 32 * (1 + static_cast<int64_t>(rng.below(40)));
    const size_t stride = row_bytes(TensorType::MXFP4, n) + type_info(TensorType::MXFP4).block_bytes * static_cast<size_t>(trial % 3);
    const std::vector<uint8_t> rows = random_rows(rng, TensorType::MXFP4, n, kDotRows, stride);
    const std::vector<uint8_t> qa = random_activations(rng, kernels(TensorType::MXFP4), n, trial % 2 ? 1.0 : 50.0);
    float want[kDotRows], got[kDotRows];
    avx2::dot_rows_mxfp4(rows.data(), stride, qa.data(), n, want);
    avx512::dot_rows_mxfp4(rows.data(), stride, qa.data(), n, got);
    for (int r = 0; r < kDotRows; ++r) EXPECT_EQ(float_bits(got[r]), float_bits(want[r])) << "MXFP4 rows, n=" << n << " row " << r;
    if (!vnni) continue;
    avx512_vnni::dot_rows_mxfp4(rows.data(), stride, qa.data(), n, got);
    for (int r = 0; r < kDotRows; ++r) EXPECT_EQ(float_bits(got[r]), float_bits(want[r])) << "MXFP4 VNNI rows, n=" << n << " row " << r;
  }
  EXPECT_EQ(active_isa_name(), cpu_features().avx512vnni || cpu_features().avx_vnni ? "avx2+avx512+vnni" : "avx2+avx512");
}
#endif

#if defined(__x86_64__)
// Every x86 tile kernel of an integer type that this CPU can run, with the instruction set it
// needs: the plain AVX2 one first (the one the others must equal).
struct TileVariant {
  const char* name;
  bool runs;
  DotTileFn q4_K, q5_K, q6_K, q8_0, q4_0, mxfp4;
  DotTileFn of(TensorType t) const {
    switch (t) {
      case TensorType::Q4_K: return q4_K;
      case TensorType::Q5_K: return q5_K;
      case TensorType::Q6_K: return q6_K;
      case TensorType::Q8_0: return q8_0;
      case TensorType::Q4_0: return q4_0;
      case TensorType::MXFP4: return mxfp4;
      default: return nullptr;
    }
  }
};

std::vector<TileVariant> x86_tile_variants() {
  const CpuFeatures& f = cpu_features();
  return {{"avx2", f.avx2, avx2::dot_tile_q4_K, avx2::dot_tile_q5_K, avx2::dot_tile_q6_K, avx2::dot_tile_q8_0,
           avx2::dot_tile_q4_0, avx2::dot_tile_mxfp4},
          {"avx2-vnni", f.avx_vnni, avx2_vnni::dot_tile_q4_K, avx2_vnni::dot_tile_q5_K, avx2_vnni::dot_tile_q6_K,
           avx2_vnni::dot_tile_q8_0, avx2_vnni::dot_tile_q4_0, avx2_vnni::dot_tile_mxfp4},
          {"avx512", f.avx512bw, avx512::dot_tile_q4_K, avx512::dot_tile_q5_K, avx512::dot_tile_q6_K, avx512::dot_tile_q8_0,
           avx512::dot_tile_q4_0, avx512::dot_tile_mxfp4},
          {"avx512-vnni", f.avx512vnni, avx512_vnni::dot_tile_q4_K, avx512_vnni::dot_tile_q5_K, avx512_vnni::dot_tile_q6_K,
           avx512_vnni::dot_tile_q8_0, avx512_vnni::dot_tile_q4_0, avx512_vnni::dot_tile_mxfp4}};
}

// The VNNI tile kernels (vpdpbusd / vpdpwssd) and the AVX-512 ones return exactly what the
// AVX2 maddubs ones return, for every (row, activation) pair: whole, half and partial tiles
// (the sixteen-row Q4_K tiles too), lone activations, padded strides, small and large
// activations (the latter reaching +-127 in every block).
TEST(Dispatch, VnniAndAvx512TileKernelsEqualAvx2TilesBitForBit) {
  if (!cpu_features().avx2) GTEST_SKIP() << "no AVX2";
  Rng rng(93);
  int checked = 0;
  const TensorType types[] = {TensorType::Q4_K, TensorType::Q5_K, TensorType::Q6_K, TensorType::Q8_0, TensorType::Q4_0, TensorType::MXFP4};
  const std::vector<TileVariant> variants = x86_tile_variants();
  for (TensorType t : types) {
    for (int trial = 0; trial < 10; ++trial) {
      const int64_t n = 256 * (1 + static_cast<int64_t>(rng.below(6))) + (trial % 4 == 3 ? 32 : 0);
      if (n % type_info(t).block_size != 0) continue;
      const int rows = 1 + static_cast<int>(rng.below(9));
      const int n_act = 1 + static_cast<int>(rng.below(40));  // AVX-512 Q4_K: tiles of 16, then of 8
      const size_t stride = row_bytes(t, n) + type_info(t).block_bytes * static_cast<size_t>(trial % 3);
      const std::vector<uint8_t> w = random_rows(rng, t, n, rows, stride);
      std::vector<std::vector<uint8_t>> acts;
      std::vector<const void*> ptrs;
      for (int a = 0; a < n_act; ++a) acts.push_back(random_activations(rng, kernels(t), n, trial % 2 ? 1.0 : 50.0));
      for (const auto& a : acts) ptrs.push_back(a.data());
      std::vector<float> want(static_cast<size_t>(n_act * rows)), got(want.size());
      variants[0].of(t)(w.data(), stride, rows, ptrs.data(), n_act, n, want.data(), rows);
      for (const TileVariant& v : variants) {
        if (!v.runs || v.of(t) == nullptr) continue;
        std::fill(got.begin(), got.end(), -1.0f);
        v.of(t)(w.data(), stride, rows, ptrs.data(), n_act, n, got.data(), rows);
        for (size_t i = 0; i < want.size(); ++i) {
          ASSERT_EQ(float_bits(got[i]), float_bits(want[i])) << v.name << " " << type_name(t) << " n=" << n << " out " << i;
        }
        ++checked;
      }
    }
  }
  if (!cpu_features().avx_vnni && !cpu_features().avx512bw) GTEST_SKIP() << "no VNNI or AVX-512 on this CPU (or BMOE_ISA narrowed it)";
  EXPECT_GE(checked, 90);  // at least two variants (AVX2 and a wider or VNNI form) on 45+ shapes
}

// The dispatcher installs the widest tile kernel the (possibly BMOE_ISA-narrowed) CPU runs: the
// ctest runs of this binary under BMOE_ISA=avx512, avx2-vnni and avx2 check each choice.
TEST(Dispatch, TileKernelFollowsCpuFeatures) {
  if (active_isa() != Isa::Avx2) GTEST_SKIP() << "not the x86 SIMD path";
  const std::vector<TileVariant> variants = x86_tile_variants();
  const TensorType types[] = {TensorType::Q4_K, TensorType::Q5_K, TensorType::Q6_K, TensorType::Q8_0, TensorType::Q4_0, TensorType::MXFP4};
  for (TensorType t : types) {
    DotTileFn want = nullptr;
    for (const TileVariant& v : variants) {
      if (v.runs && v.of(t) != nullptr) want = v.of(t);
    }
    EXPECT_EQ(kernels(t).dot_tile, want) << type_name(t);
  }
  const char* force = std::getenv("BMOE_ISA");
  const std::string forced = force != nullptr ? force : "";
  EXPECT_FALSE(forced == "avx512" && (cpu_features().avx512vnni || cpu_features().avx_vnni));
  EXPECT_FALSE(forced == "avx2-vnni" && cpu_features().avx512bw);
}
#endif

// The tile kernels (prompt batches) return, for each (row, activation) pair, exactly what the
// one-row kernel of the same ISA returns: a row's result does not depend on the batch it is in.
// Row and activation counts cover whole tiles, partial tiles and lone activations.
TEST(Dispatch, TileKernelsEqualOneRowBitForBit) {
  Rng rng(92);
  int checked = 0;
  for (TensorType t : kWeightTypes) {
    for (Isa isa : available_isas()) {
      const TypeKernels* k = kernels_for_isa(t, isa);
      if (k == nullptr || k->dot_tile == nullptr) continue;
      for (int trial = 0; trial < 12; ++trial) {
        const int64_t n = 256 * (1 + static_cast<int64_t>(rng.below(6))) + (trial % 4 == 3 ? 32 : 0);
        if (n % type_info(t).block_size != 0) continue;
        const int rows = 1 + static_cast<int>(rng.below(13));
        const int n_act = 1 + trial;  // 1 (one-row), 2-4 (half tiles), 5-8 (whole), 9-12 (both)
        const size_t stride = row_bytes(t, n) + type_info(t).block_bytes * static_cast<size_t>(trial % 3);
        const std::vector<uint8_t> w = random_rows(rng, t, n, rows, stride);
        std::vector<std::vector<uint8_t>> acts;
        std::vector<const void*> act_ptrs;
        for (int a = 0; a < n_act; ++a) acts.push_back(random_activations(rng, *k, n, trial % 2 ? 1.0 : 50.0));
        for (const auto& a : acts) act_ptrs.push_back(a.data());
        const int64_t out_stride = rows + static_cast<int64_t>(rng.below(3));
        std::vector<float> out(static_cast<size_t>(n_act * out_stride), -1.0f);
        k->dot_tile(w.data(), stride, rows, act_ptrs.data(), n_act, n, out.data(), out_stride);
        for (int a = 0; a < n_act; ++a) {
          for (int r = 0; r < rows; ++r) {
            const float one = k->dot(w.data() + r * stride, acts[static_cast<size_t>(a)].data(), n);
            ASSERT_EQ(float_bits(out[static_cast<size_t>(a * out_stride + r)]), float_bits(one))
                << type_name(t) << " n=" << n << " row " << r << " act " << a << " of " << n_act;
          }
        }
        ++checked;
      }
    }
  }
#if defined(__x86_64__)
  if (active_isa() == Isa::Avx2) {
    EXPECT_GE(checked, 80);  // every quantized and 16-bit type has an AVX2 tile kernel
  }
#endif
  if (checked == 0) GTEST_SKIP() << "no tile kernels on this path";
}

// The float tiles (BF16's 4 x 4 AVX-512 blocks among them) on lengths that are not a multiple
// of the vector width: the scalar tail after the lane chains, whole and partial blocks of rows
// and activations. Each output equals the one-row kernel's bit for bit.
TEST(Dispatch, FloatTilesEqualOneRowOnRaggedLengths) {
  Rng rng(94);
  int checked = 0;
  for (TensorType t : {TensorType::F32, TensorType::F16, TensorType::BF16}) {
    for (Isa isa : available_isas()) {
      const TypeKernels* k = kernels_for_isa(t, isa);
      if (k == nullptr || k->dot_tile == nullptr) continue;
      for (int trial = 0; trial < 6; ++trial) {
        const int64_t n = 8 * (1 + static_cast<int64_t>(rng.below(40))) + 1 + trial;  // tails of 1..6
        const int rows = 1 + static_cast<int>(rng.below(11));
        const int n_act = 2 + static_cast<int>(rng.below(11));
        const size_t stride = row_bytes(t, n) + 4 * static_cast<size_t>(trial % 3);
        const std::vector<uint8_t> w = random_rows(rng, t, n, rows, stride);
        std::vector<std::vector<uint8_t>> acts;
        std::vector<const void*> ptrs;
        for (int a = 0; a < n_act; ++a) acts.push_back(random_activations(rng, *k, n, 1.0));
        for (const auto& a : acts) ptrs.push_back(a.data());
        std::vector<float> out(static_cast<size_t>(n_act * rows), -1.0f);
        k->dot_tile(w.data(), stride, rows, ptrs.data(), n_act, n, out.data(), rows);
        for (int a = 0; a < n_act; ++a) {
          for (int r = 0; r < rows; ++r) {
            const float one = k->dot(w.data() + r * stride, acts[static_cast<size_t>(a)].data(), n);
            ASSERT_EQ(float_bits(out[static_cast<size_t>(a * rows + r)]), float_bits(one))
                << type_name(t) << " n=" << n << " row " << r << " act " << a << " of " << n_act;
          }
        }
        ++checked;
      }
    }
  }
  if (checked == 0) GTEST_SKIP() << "no float tile kernels on this path";
}

// The two-rows-by-two-inputs kernels (arm64 i8mm) return, for each (row, input) pair, exactly
// what the one-row kernel returns: batched matmuls use them.
TEST(Dispatch, PairKernelsEqualOneRowBitForBit) {
  Rng rng(79);
  int checked = 0;
  for (TensorType t : kWeightTypes) {
    for (Isa isa : available_isas()) {
      const TypeKernels* k = kernels_for_isa(t, isa);
      if (k == nullptr || k->dot_2x2 == nullptr) continue;
      for (int trial = 0; trial < 10; ++trial) {
        const int64_t n = 256 * (1 + static_cast<int64_t>(rng.below(12)));
        const size_t stride = row_bytes(t, n) + type_info(t).block_bytes * static_cast<size_t>(trial % 3);
        const std::vector<uint8_t> rows = random_rows(rng, t, n, 2, stride);
        const double stddev = trial % 2 ? 1.0 : 50.0;
        const std::vector<uint8_t> qa[2] = {random_activations(rng, *k, n, stddev), random_activations(rng, *k, n, stddev)};
        float got[4];
        k->dot_2x2(rows.data(), stride, qa[0].data(), qa[1].data(), n, got);
        for (int r = 0; r < 2; ++r) {
          for (int i = 0; i < 2; ++i) {
            const float one = k->dot(rows.data() + r * stride, qa[i].data(), n);
            EXPECT_EQ(float_bits(got[2 * r + i]), float_bits(one)) << type_name(t) << " row " << r << " input " << i;
          }
        }
        ++checked;
      }
    }
  }
#if defined(__aarch64__)
  if (cpu_features().i8mm) {
    EXPECT_GE(checked, 60);  // Q8_0, Q4_0, MXFP4, Q4_K, Q5_K and Q6_K have i8mm pair kernels
  }
#endif
  if (checked == 0) GTEST_SKIP() << "no pair kernels on this CPU (arm64 i8mm only)";
}

// The f32 kernels of tiled attention: every ISA's gemm equals the scalar reference bit for bit,
// for shapes with and without whole register blocks (row, column and depth tails).
TEST(FloatKernels, GemmEqualsReferenceBitForBit) {
  Rng rng(90);
  const FloatKernels& ref_k = *float_kernels_for_isa(Isa::Scalar);
  for (Isa isa : available_isas()) {
    const FloatKernels* k = float_kernels_for_isa(isa);
    ASSERT_NE(k, nullptr);
    for (int trial = 0; trial < 30; ++trial) {
      const int64_t m = 1 + rng.below(20), kk = 1 + rng.below(140), n = 1 + rng.below(80);
      const int64_t lda = kk + rng.below(3), ldb = n + rng.below(3), ldc = n + rng.below(3);
      const auto a = random_floats(rng, m * lda, 1.0);
      const auto b = random_floats(rng, kk * ldb, 1.0);
      const auto c0 = random_floats(rng, m * ldc, 1.0);
      auto want = c0, got = c0;
      ref_k.gemm(want.data(), ldc, a.data(), lda, b.data(), ldb, m, kk, n);
      k->gemm(got.data(), ldc, a.data(), lda, b.data(), ldb, m, kk, n);
      for (size_t i = 0; i < want.size(); ++i) ASSERT_EQ(float_bits(got[i]), float_bits(want[i])) << "m=" << m << " k=" << kk << " n=" << n << " at " << i;
      // And it is the product: compare one element with a double-precision sum.
      double exact = c0[0];
      for (int64_t p = 0; p < kk; ++p) exact += static_cast<double>(a[static_cast<size_t>(p)]) * b[static_cast<size_t>(p * ldb)];
      EXPECT_NEAR(want[0], exact, 1e-4 * (1.0 + std::fabs(exact)) * kk);
    }
  }
}

// exp_sum: same values and the same sum on every ISA, including masked scores (-inf), values
// whose exponential is denormal or zero, and large ones; and close to std::exp.
TEST(FloatKernels, ExpSumEqualsReferenceBitForBit) {
  Rng rng(91);
  const FloatKernels& ref_k = *float_kernels_for_isa(Isa::Scalar);
  for (Isa isa : available_isas()) {
    const FloatKernels* k = float_kernels_for_isa(isa);
    for (int trial = 0; trial < 40; ++trial) {
      const int64_t n = kExpSumBlock * (1 + rng.below(6));
      std::vector<float> x = random_floats(rng, n, trial % 4 == 0 ? 60.0 : 4.0);
      for (float& v : x) {
        if (rng.below(8) == 0) v = -INFINITY;
        if (trial % 5 == 0 && rng.below(8) == 0) v = -100.0f - static_cast<float>(rng.below(60));  // denormal results
      }
      const float max = trial % 3 == 0 ? 0.0f : *std::max_element(x.begin(), x.end());
      auto want = x, got = x;
      const double sum_want = ref_k.exp_sum(want.data(), n, max);
      const double sum_got = k->exp_sum(got.data(), n, max);
      EXPECT_EQ(sum_got, sum_want);
      for (int64_t i = 0; i < n; ++i) {
        ASSERT_EQ(float_bits(got[i]), float_bits(want[i])) << "x=" << x[i] << " max=" << max;
        const double e = std::exp(static_cast<double>(x[i] - max));  // of the argument the kernel sees
        if (e > 1e-30 && e < 1e30) {
          EXPECT_NEAR(want[i] / e, 1.0, 1e-6) << x[i];
        }
      }
    }
  }
  EXPECT_EQ(fast_expf(-INFINITY), 0.0f);
  EXPECT_EQ(fast_expf(0.0f), 1.0f);
}

// swiglu: the same bits on every ISA, and silu's value.
TEST(FloatKernels, SwigluEqualsReferenceBitForBit) {
  Rng rng(93);
  const FloatKernels& ref_k = *float_kernels_for_isa(Isa::Scalar);
  for (Isa isa : available_isas()) {
    for (int trial = 0; trial < 10; ++trial) {
      const int64_t n = 1 + rng.below(300);
      const auto g = random_floats(rng, n, trial % 2 ? 30.0 : 2.0), u = random_floats(rng, n, 1.0);
      std::vector<float> want(static_cast<size_t>(n)), got(static_cast<size_t>(n));
      ref_k.swiglu(g.data(), u.data(), want.data(), n);
      float_kernels_for_isa(isa)->swiglu(g.data(), u.data(), got.data(), n);
      for (int64_t i = 0; i < n; ++i) {
        ASSERT_EQ(float_bits(got[i]), float_bits(want[i])) << g[i];
        const double silu = g[i] / (1.0 + std::exp(-static_cast<double>(g[i])));
        EXPECT_NEAR(want[i], silu * u[i], 1e-5 * (1.0 + std::fabs(silu * u[i])));
      }
    }
  }
}

// silu and the gated delta rule's step: the same bits on every ISA (the step over 30 tokens, so
// a difference in any product or sum would have compounded).
TEST(FloatKernels, SiluAndDeltaStepEqualReferenceBitForBit) {
  Rng rng(95);
  const FloatKernels& ref_k = *float_kernels_for_isa(Isa::Scalar);
  for (Isa isa : available_isas()) {
    const FloatKernels& k = *float_kernels_for_isa(isa);
    const int64_t n = 1 + rng.below(300);
    const auto x = random_floats(rng, n, 8.0);
    std::vector<float> want(static_cast<size_t>(n)), got(static_cast<size_t>(n));
    ref_k.silu(x.data(), want.data(), n);
    k.silu(x.data(), got.data(), n);
    for (int64_t i = 0; i < n; ++i) ASSERT_EQ(float_bits(got[i]), float_bits(want[i])) << x[i];
    for (int s : {16, 64, 128}) {
      std::vector<float> state_want(static_cast<size_t>(s * s), 0.0f), state_got = state_want;
      std::vector<float> out_want(static_cast<size_t>(s)), out_got(static_cast<size_t>(s));
      for (int t = 0; t < 30; ++t) {
        const auto q = random_floats(rng, s, 0.2), kk = random_floats(rng, s, 0.2), v = random_floats(rng, s, 1.0);
        const float decay = 0.6f + 0.01f * static_cast<float>(t), beta = 0.2f + 0.02f * static_cast<float>(t);
        ref_k.delta_step(state_want.data(), s, q.data(), kk.data(), v.data(), decay, beta, 0.125f, out_want.data());
        k.delta_step(state_got.data(), s, q.data(), kk.data(), v.data(), decay, beta, 0.125f, out_got.data());
        for (int j = 0; j < s; ++j) ASSERT_EQ(float_bits(out_got[j]), float_bits(out_want[j])) << "s " << s << " t " << t;
      }
      for (int i = 0; i < s * s; ++i) ASSERT_EQ(float_bits(state_got[i]), float_bits(state_want[i]));
    }
  }
}

TEST(Dispatch, UsesSimdWhenAvailable) {
#if defined(__x86_64__)
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && !std::getenv("BMOE_ISA")) {
    EXPECT_EQ(active_isa(), Isa::Avx2);
    EXPECT_NE(kernels(TensorType::Q4_K).dot, kernels_for_isa(TensorType::Q4_K, Isa::Scalar)->dot);
  }
#endif
#if defined(__aarch64__)
  // Under qemu-aarch64 -cpu max (CI) and on every phone we target, dotprod is there.
  if (cpu_features().dotprod && !std::getenv("BMOE_ISA")) {
    EXPECT_EQ(active_isa(), Isa::Neon);
    EXPECT_NE(kernels(TensorType::Q4_K).dot, kernels_for_isa(TensorType::Q4_K, Isa::Scalar)->dot);
    EXPECT_EQ(active_isa_name().rfind("neon", 0), 0u);
    // i8mm (qemu -cpu max has it): the batch kernels are installed, not the one-row fallback.
    if (cpu_features().i8mm) {
      EXPECT_NE(kernels(TensorType::Q4_K).dot_2x2, nullptr);
      EXPECT_EQ(active_isa_name(), "neon-i8mm");
    }
  }
#endif
  EXPECT_EQ(kernels(TensorType::Q4_K).activation_type, TensorType::Q8_K);
  EXPECT_EQ(kernels(TensorType::Q4_0).activation_type, TensorType::Q8_0);
  EXPECT_EQ(kernels(TensorType::MXFP4).activation_type, TensorType::Q8_0);
  EXPECT_EQ(kernels(TensorType::F16).activation_type, TensorType::F32);  // f16 weights x f32 activations
}

}  // namespace
}  // namespace bmoe
