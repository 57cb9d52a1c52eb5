// f16_flash_keys (quant.h) with AVX-512 F: the body in flash_x86_kernels.h, on 16 lanes.
#if defined(__x86_64__)

#include "quant/simd_kernels.h"

#if defined(__clang__)
#pragma clang attribute push(__attribute__((target("avx2,fma,f16c,avx512f,avx512bw"))), apply_to = function)
#else
#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c,avx512f,avx512bw")
// GCC 12's AVX-512 intrinsics fill their unused merge operand with _mm512_undefined_*(), which
// its own -Wmaybe-uninitialized then reports at each use (a known false positive).
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#endif

#include "quant/x86_shared.h"  // after the target pragma
#define BMOE_FLASH_NS avx512
#define BMOE_FLASH_WIDE 1
#include "quant/flash_x86_kernels.h"

#if defined(__clang__)
#pragma clang attribute pop
#else
#pragma GCC pop_options
#endif

#endif  // __x86_64__
