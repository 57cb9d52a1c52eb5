// Runtime selection of kernel sets per weight type.
#include <array>
#include <cmath>

#include "core/cpu_features.h"
#include "core/error.h"
#include "quant/blocks.h"
#include "quant/float_kernels.h"
#include "quant/quant.h"
#include "quant/ref_kernels.h"
#include "quant/simd_kernels.h"

namespace bmoe {
namespace {

constexpr size_t kTypeSlots = 64;  // type ids are < 64

struct KernelTable {
  std::array<TypeKernels, kTypeSlots> by_type{};
  std::array<bool, kTypeSlots> present{};
  void add(TensorType t, TensorType act, DequantizeFn dq, DotFn dot) {
    by_type[static_cast<size_t>(t)] = {act, dq, dot};
    present[static_cast<size_t>(t)] = true;
  }
  void add_rows(TensorType t, DotRowsFn rows) { by_type[static_cast<size_t>(t)].dot_rows = rows; }
  void add_pairs(TensorType t, DotPairsFn pairs) { by_type[static_cast<size_t>(t)].dot_2x2 = pairs; }
  void add_tile(TensorType t, DotTileFn tile) { by_type[static_cast<size_t>(t)].dot_tile = tile; }
  const TypeKernels* find(TensorType t) const {
    const auto i = static_cast<size_t>(t);
    return i < kTypeSlots && present[i] ? &by_type[i] : nullptr;
  }
};

KernelTable scalar_table() {
  KernelTable t;
  t.add(TensorType::F32, TensorType::F32, ref::dequantize_f32, ref::dot_f32);
  t.add(TensorType::F16, TensorType::F32, ref::dequantize_f16, ref::dot_f16_f32);
  t.add(TensorType::BF16, TensorType::BF16, ref::dequantize_bf16, ref::dot_bf16);
  t.add(TensorType::Q4_0, TensorType::Q8_0, ref::dequantize_q4_0, ref::dot_q4_0);
  t.add(TensorType::Q8_0, TensorType::Q8_0, ref::dequantize_q8_0, ref::dot_q8_0);
  t.add(TensorType::MXFP4, TensorType::Q8_0, ref::dequantize_mxfp4, ref::dot_mxfp4);
  t.add(TensorType::Q4_K, TensorType::Q8_K, ref::dequantize_q4_K, ref::dot_q4_K);
  t.add(TensorType::Q5_K, TensorType::Q8_K, ref::dequantize_q5_K, ref::dot_q5_K);
  t.add(TensorType::Q6_K, TensorType::Q8_K, ref::dequantize_q6_K, ref::dot_q6_K);
  return t;
}

#if defined(__x86_64__)
// One build of quant_x86_rows_kernels.h: the 256-bit integer one-row and eight-row kernels.
struct X86IntRows {
  DotFn q4_0, q8_0, mxfp4, q4_K, q5_K, q6_K;
  DotRowsFn rows_q8_0, rows_q4_0, rows_mxfp4;
};
#define BMOE_X86_INT_ROWS(ns)                                                                           \
  X86IntRows{ns::dot_q4_0, ns::dot_q8_0, ns::dot_mxfp4, ns::dot_q4_K, ns::dot_q5_K, ns::dot_q6_K, \
             ns::dot_rows_q8_0, ns::dot_rows_q4_0, ns::dot_rows_mxfp4}

// VNNI where the CPU has it: one vpdpbusd / vpdpwssd for each maddubs + madd (+ add), the same
// int32 lanes, so the same results. The EVEX form where AVX-512 VNNI is there (it has no VEX
// form on CPUs without AVX-VNNI), else AVX-VNNI's VEX form (AVX2-only CPUs that have it).
X86IntRows x86_int_rows() {
  if (cpu_features().avx512vnni) return BMOE_X86_INT_ROWS(avx512vl_vnni);
  if (cpu_features().avx_vnni) return BMOE_X86_INT_ROWS(avx2_vnni);
  return BMOE_X86_INT_ROWS(avx2);
}

KernelTable avx2_table() {
  KernelTable t = scalar_table();
  const X86IntRows rows = x86_int_rows();
  t.add(TensorType::F32, TensorType::F32, ref::dequantize_f32, avx2::dot_f32);
  t.add(TensorType::F16, TensorType::F32, avx2::dequantize_f16, avx2::dot_f16_f32);
  t.add(TensorType::BF16, TensorType::BF16, ref::dequantize_bf16, avx2::dot_bf16);
  t.add(TensorType::Q4_0, TensorType::Q8_0, ref::dequantize_q4_0, rows.q4_0);
  t.add(TensorType::Q8_0, TensorType::Q8_0, ref::dequantize_q8_0, rows.q8_0);
  t.add(TensorType::MXFP4, TensorType::Q8_0, ref::dequantize_mxfp4, rows.mxfp4);
  t.add(TensorType::Q4_K, TensorType::Q8_K, ref::dequantize_q4_K, rows.q4_K);
  t.add(TensorType::Q5_K, TensorType::Q8_K, ref::dequantize_q5_K, rows.q5_K);
  t.add(TensorType::Q6_K, TensorType::Q8_K, ref::dequantize_q6_K, rows.q6_K);
  // AVX-512: the same results, faster on AMD Zen 5 (Q6_K 2.6x, Q4_K 1.3x, MXFP4 rows 1.5x in L2;
  // not measured on Intel cores that lower their clock for 512-bit work: BMOE_ISA=avx2 there).
  if (cpu_features().avx512bw) {
    t.add(TensorType::Q4_K, TensorType::Q8_K, ref::dequantize_q4_K, avx512::dot_q4_K);
    t.add(TensorType::Q6_K, TensorType::Q8_K, ref::dequantize_q6_K, avx512::dot_q6_K);
  }
  if (cpu_features().avx512vnni) {
    t.add(TensorType::Q4_K, TensorType::Q8_K, ref::dequantize_q4_K, avx512_vnni::dot_q4_K);
    t.add(TensorType::Q6_K, TensorType::Q8_K, ref::dequantize_q6_K, avx512_vnni::dot_q6_K);
  }
  // Eight Q8_0 rows at once read a matrix from DRAM faster on the Intel Xeon we measured
  // (12.7 vs 9.7 GB/s, one core) and slower on AMD EPYC (20-22 vs 28-30 GB/s; gpt-oss-20b cut
  // 22.3 -> 26.7 tok/s without it): eight concurrent row streams against one sequential one.
  // The results are the same either way.
  if (!cpu_features().amd) t.add_rows(TensorType::Q8_0, rows.rows_q8_0);
  t.add_rows(TensorType::Q4_0, rows.rows_q4_0);
  t.add_rows(TensorType::BF16, avx2::dot_rows_bf16);
  t.add_rows(TensorType::MXFP4, cpu_features().avx512vnni ? avx512_vnni::dot_rows_mxfp4
                                 : cpu_features().avx512bw ? avx512::dot_rows_mxfp4 : rows.rows_mxfp4);
  // Batches: one weight row against eight activation rows (same results as the kernels above).
  t.add_tile(TensorType::F32, avx2::dot_tile_f32);
  t.add_tile(TensorType::F16, avx2::dot_tile_f16);
  t.add_tile(TensorType::BF16, avx2::dot_tile_bf16);
  t.add_tile(TensorType::Q4_0, avx2::dot_tile_q4_0);
  t.add_tile(TensorType::Q8_0, avx2::dot_tile_q8_0);
  t.add_tile(TensorType::MXFP4, avx2::dot_tile_mxfp4);
  t.add_tile(TensorType::Q4_K, avx2::dot_tile_q4_K);
  t.add_tile(TensorType::Q5_K, avx2::dot_tile_q5_K);
  t.add_tile(TensorType::Q6_K, avx2::dot_tile_q6_K);
  if (cpu_features().avx_vnni) {
    t.add_tile(TensorType::Q4_0, avx2_vnni::dot_tile_q4_0);
    t.add_tile(TensorType::Q8_0, avx2_vnni::dot_tile_q8_0);
    t.add_tile(TensorType::MXFP4, avx2_vnni::dot_tile_mxfp4);
    t.add_tile(TensorType::Q4_K, avx2_vnni::dot_tile_q4_K);
    t.add_tile(TensorType::Q5_K, avx2_vnni::dot_tile_q5_K);
    t.add_tile(TensorType::Q6_K, avx2_vnni::dot_tile_q6_K);
  }
  if (cpu_features().avx512bw) {
    t.add_tile(TensorType::Q4_K, avx512::dot_tile_q4_K);
    t.add_tile(TensorType::Q5_K, avx512::dot_tile_q5_K);
    t.add_tile(TensorType::Q6_K, avx512::dot_tile_q6_K);
    t.add_tile(TensorType::Q8_0, avx512::dot_tile_q8_0);
    t.add_tile(TensorType::Q4_0, avx512::dot_tile_q4_0);
    t.add_tile(TensorType::MXFP4, avx512::dot_tile_mxfp4);
    t.add_tile(TensorType::BF16, avx512::dot_tile_bf16);  // AVX-512 VL's 32 ymm: 4 x 4 blocks
  }
  // VNNI: one vpdpbusd / vpdpwssd for each maddubs + madd (+ add); the same int32 lanes. The
  // AVX-VNNI tiles above serve AVX2-only CPUs that have it.
  if (cpu_features().avx512vnni) {
    t.add_tile(TensorType::Q4_K, avx512_vnni::dot_tile_q4_K);
    t.add_tile(TensorType::Q5_K, avx512_vnni::dot_tile_q5_K);
    t.add_tile(TensorType::Q6_K, avx512_vnni::dot_tile_q6_K);
    t.add_tile(TensorType::Q8_0, avx512_vnni::dot_tile_q8_0);
    t.add_tile(TensorType::Q4_0, avx512_vnni::dot_tile_q4_0);
    t.add_tile(TensorType::MXFP4, avx512_vnni::dot_tile_mxfp4);
  }
  return t;
}
#endif

#if defined(__aarch64__)
KernelTable neon_table() {
  KernelTable t = scalar_table();
  t.add(TensorType::F32, TensorType::F32, ref::dequantize_f32, neon::dot_f32);
  t.add(TensorType::F16, TensorType::F32, neon::dequantize_f16, neon::dot_f16_f32);
  t.add(TensorType::BF16, TensorType::BF16, ref::dequantize_bf16, neon::dot_bf16);
  t.add(TensorType::Q4_0, TensorType::Q8_0, ref::dequantize_q4_0, neon::dot_q4_0);
  t.add(TensorType::Q8_0, TensorType::Q8_0, ref::dequantize_q8_0, neon::dot_q8_0);
  t.add(TensorType::MXFP4, TensorType::Q8_0, ref::dequantize_mxfp4, neon::dot_mxfp4);
  t.add(TensorType::Q4_K, TensorType::Q8_K, ref::dequantize_q4_K, neon::dot_q4_K);
  t.add(TensorType::Q5_K, TensorType::Q8_K, ref::dequantize_q5_K, neon::dot_q5_K);
  t.add(TensorType::Q6_K, TensorType::Q8_K, ref::dequantize_q6_K, neon::dot_q6_K);
  // Batches: one weight row against four activation rows (same results as the kernels above).
  t.add_tile(TensorType::F32, neon::dot_tile_f32);
  t.add_tile(TensorType::F16, neon::dot_tile_f16);
  t.add_tile(TensorType::BF16, neon::dot_tile_bf16);
  t.add_tile(TensorType::Q4_0, neon::dot_tile_q4_0);
  t.add_tile(TensorType::Q8_0, neon::dot_tile_q8_0);
  t.add_tile(TensorType::MXFP4, neon::dot_tile_mxfp4);
  t.add_tile(TensorType::Q4_K, neon::dot_tile_q4_K);
  t.add_tile(TensorType::Q5_K, neon::dot_tile_q5_K);
  t.add_tile(TensorType::Q6_K, neon::dot_tile_q6_K);
  if (cpu_features().i8mm) {  // SMMLA for batches (matmul prefers these pairs to the tiles); same results
    t.add_pairs(TensorType::Q8_0, neon_i8mm::dot_2x2_q8_0);
    t.add_pairs(TensorType::Q4_0, neon_i8mm::dot_2x2_q4_0);
    t.add_pairs(TensorType::MXFP4, neon_i8mm::dot_2x2_mxfp4);
    t.add_pairs(TensorType::Q4_K, neon_i8mm::dot_2x2_q4_K);
    t.add_pairs(TensorType::Q5_K, neon_i8mm::dot_2x2_q5_K);
    t.add_pairs(TensorType::Q6_K, neon_i8mm::dot_2x2_q6_K);
  }
  return t;
}
#endif

const KernelTable* table_for(Isa isa) {
  static const KernelTable scalar = scalar_table();
#if defined(__x86_64__)
  static const KernelTable avx2 = avx2_table();
  if (isa == Isa::Avx2) return &avx2;
#endif
#if defined(__aarch64__)
  static const KernelTable neon = neon_table();
  if (isa == Isa::Neon) return &neon;
#endif
  return isa == Isa::Scalar ? &scalar : nullptr;
}

}  // namespace

Isa active_isa() {
  static const Isa isa = [] {
    const CpuFeatures& f = cpu_features();
    if (f.avx2) return Isa::Avx2;
    if (f.neon && f.dotprod) return Isa::Neon;
    return Isa::Scalar;
  }();
  return isa;
}

const TypeKernels* kernels_for_isa(TensorType weights, Isa isa) {
  const KernelTable* table = table_for(isa);
  return table ? table->find(weights) : nullptr;
}

const TypeKernels& kernels(TensorType weights) {
  const TypeKernels* k = kernels_for_isa(weights, active_isa());
  if (k == nullptr) fail("tensor type {} is not supported for computation", type_name(weights));
  return *k;
}

const FloatKernels* float_kernels_for_isa(Isa isa) {
  static const FloatKernels scalar{ref::gemm_f32, ref::exp_sum, ref::swiglu, ref::silu, ref::delta_step};
#if defined(__x86_64__)
  static const FloatKernels avx2{cpu_features().avx512bw ? avx512::gemm_f32 : avx2::gemm_f32, avx2::exp_sum,
                                 avx2::swiglu, avx2::silu, avx2::delta_step};
  if (isa == Isa::Avx2) return cpu_features().avx2 ? &avx2 : nullptr;
#endif
#if defined(__aarch64__)
  static const FloatKernels neon{neon::gemm_f32, neon::exp_sum, neon::swiglu, neon::silu, neon::delta_step};
  if (isa == Isa::Neon) return cpu_features().neon ? &neon : nullptr;
#endif
  return isa == Isa::Scalar ? &scalar : nullptr;
}

const FloatKernels& float_kernels() {
  static const FloatKernels& active = *float_kernels_for_isa(active_isa());
  return active;
}

size_t activation_bytes(TensorType format, int64_t n) { return row_bytes(format, n); }

void f16_scale(uint16_t* acc, float s, int64_t n) {
#if defined(__x86_64__)
  if (active_isa() == Isa::Avx2) return avx2::f16_scale(acc, s, n);
#endif
  for (int64_t i = 0; i < n; ++i) acc[i] = fp32_to_fp16(fp16_to_fp32(acc[i]) * s);
}

void f16_fma_into(uint16_t* acc, const uint16_t* v, float s, int64_t n) {
#if defined(__x86_64__)
  if (active_isa() == Isa::Avx2) return avx2::f16_fma_into(acc, v, s, n);
#endif
  for (int64_t i = 0; i < n; ++i) acc[i] = fp32_to_fp16(std::fma(fp16_to_fp32(v[i]), s, fp16_to_fp32(acc[i])));
}

void f16_flash_keys(const F16FlashArgs& a, int n_keys, float* max, float* sum, uint16_t* acc) {
#if defined(__x86_64__)
  if (active_isa() == Isa::Avx2 && cpu_features().avx512bw) return avx512::f16_flash_keys(a, n_keys, max, sum, acc);
  if (active_isa() == Isa::Avx2) return avx2::f16_flash_keys(a, n_keys, max, sum, acc);
#endif
  for (int j = 0; j < n_keys; ++j) {
    const uint16_t* k = a.k + static_cast<size_t>(j) * a.k_stride;
    const uint16_t* v = a.v + static_cast<size_t>(j) * a.v_stride;
    for (int h = 0; h < a.heads; ++h) {
      uint16_t* acc_h = acc + static_cast<size_t>(h) * a.dv;
      float s = dot_f16_pair(k, a.q + static_cast<size_t>(h) * a.dk, a.dk) * a.scale;
      if (a.softcap != 0.0f) s = a.softcap * std::tanh(s);
      float ms = 1.0f, vs = 1.0f;
      if (s > max[h]) {
        ms = std::exp(max[h] - s);
        max[h] = s;
        f16_scale(acc_h, ms, a.dv);
      } else {
        vs = std::exp(s - max[h]);
      }
      f16_fma_into(acc_h, v, vs, a.dv);
      sum[h] = sum[h] * ms + vs;
    }
  }
}

float dot_f16_pair(const uint16_t* x, const uint16_t* y, int64_t n) {
#if defined(__x86_64__)
  if (active_isa() == Isa::Avx2) return avx2::dot_f16(x, y, n);
#endif
#if defined(__aarch64__)
  if (active_isa() == Isa::Neon) return neon::dot_f16(x, y, n);
#endif
  return ref::dot_f16(x, y, n);
}

void quantize_activations(TensorType format, const float* src, void* dst, int64_t n) {
  switch (format) {
    case TensorType::F32: ref::quantize_f32(src, dst, n); return;
    case TensorType::F16:
#if defined(__x86_64__)
      if (active_isa() == Isa::Avx2) {
        avx2::quantize_f16(src, dst, n);
        return;
      }
#endif
      ref::quantize_f16(src, dst, n);
      return;
    case TensorType::BF16: ref::quantize_bf16(src, dst, n); return;
    case TensorType::Q8_0: ref::quantize_q8_0(src, dst, n); return;
    case TensorType::Q8_K:
#if defined(__x86_64__)
      if (active_isa() == Isa::Avx2) {
        avx2::quantize_q8_K(src, dst, n);
        return;
      }
#endif
      ref::quantize_q8_K(src, dst, n);
      return;
    default: fail("internal: {} is not an activation format", type_name(format));
  }
}

void dequantize_row(TensorType type, const void* src, float* dst, int64_t n) {
  const TypeKernels* k = kernels_for_isa(type, Isa::Scalar);
  if (k == nullptr) fail("cannot dequantize tensor type {}", type_name(type));
  k->dequantize(src, dst, n);
}

}  // namespace bmoe
