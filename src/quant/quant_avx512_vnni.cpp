// AVX-512 VNNI kernels: the bodies in quant_avx512_kernels.h, with the int8 multiply-adds as
// vpdpbusd / vpdpwssd (one instruction for maddubs + madd + add); equal bit for bit to the
// plain AVX-512 ones, since every int32 lane holds the same exact sum.
#if defined(__x86_64__)

#include <immintrin.h>

#include <cmath>
#include <cstring>
#include <vector>

#include "quant/blocks.h"
#include "quant/quant.h"
#include "quant/simd_kernels.h"

#if defined(__clang__)
#pragma clang attribute push(__attribute__((target("avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni"))), apply_to = function)
#else
#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")
// GCC 12's AVX-512 intrinsics fill their unused merge operand with _mm512_undefined_*(), which
// its own -Wmaybe-uninitialized then reports at each use (a known false positive).
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"  // the same placeholder, where GCC is sure
#endif

#define BMOE_X86_VNNI 2
#include "quant/x86_shared.h"  // after the target pragma: compiled for AVX-512 VNNI here
#include "quant/x86_tiles.h"
#define BMOE_AVX512_NS avx512_vnni
#include "quant/quant_avx512_kernels.h"
#define BMOE_X86_ROWS_NS avx512vl_vnni
#include "quant/quant_x86_rows_kernels.h"  // the 256-bit one-row and eight-row kernels, EVEX VNNI

#if defined(__clang__)
#pragma clang attribute pop
#else
#pragma GCC pop_options
#endif

#endif  // __x86_64__
