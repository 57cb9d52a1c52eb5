// f16_flash_keys (quant.h) with AVX2 + FMA + F16C: the body in flash_x86_kernels.h.
#if defined(__x86_64__)

#include "quant/simd_kernels.h"

#if defined(__clang__)
#pragma clang attribute push(__attribute__((target("avx2,fma,f16c"))), apply_to = function)
#else
#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c")
#endif

#include "quant/x86_shared.h"  // after the target pragma
#define BMOE_FLASH_NS avx2
#define BMOE_FLASH_WIDE 0
#include "quant/flash_x86_kernels.h"

#if defined(__clang__)
#pragma clang attribute pop
#else
#pragma GCC pop_options
#endif

#endif  // __x86_64__
