// f16_flash_keys (quant.h) with AVX2 + FMA + F16C: the body in flash_x86_kernels.h.
#if defined(__x86_64__)

#include "quant/simd_kernels.h"

#include "quant/isa_target.h"
BMOE_ISA_BEGIN("avx2,fma,f16c")

#include "quant/x86_shared.h"  // after the target pragma
#define BMOE_FLASH_NS avx2
#define BMOE_FLASH_WIDE 0
#include "quant/flash_x86_kernels.h"

BMOE_ISA_END()

#endif  // __x86_64__
