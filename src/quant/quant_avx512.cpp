// AVX-512 F + BW kernels without VNNI: the bodies in quant_avx512_kernels.h, with int8
// multiply-adds as maddubs + madd (see there for what they are and why).
#if defined(__x86_64__)

#include <immintrin.h>

#include <cmath>
#include <cstring>
#include <vector>

#include "quant/blocks.h"
#include "quant/quant.h"
#include "quant/simd_kernels.h"

#if defined(__clang__)
#pragma clang attribute push(__attribute__((target("avx2,fma,f16c,avx512f,avx512bw"))), apply_to = function)
#else
#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c,avx512f,avx512bw")
// GCC 12's AVX-512 intrinsics fill their unused merge operand with _mm512_undefined_*(), which
// its own -Wmaybe-uninitialized then reports at each use (a known false positive).
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"  // the same placeholder, where GCC is sure
#endif

#define BMOE_X86_VNNI 0
#include "quant/x86_shared.h"  // after the target pragma: compiled for AVX-512 here
#include "quant/x86_tiles.h"
#define BMOE_AVX512_NS avx512
#include "quant/quant_avx512_kernels.h"

#if defined(__clang__)
#pragma clang attribute pop
#else
#pragma GCC pop_options
#endif

#endif  // __x86_64__
