// f16_flash_keys (quant.h) with AVX-512 F: the body in flash_x86_kernels.h, on 16 lanes.
#if defined(__x86_64__)

#include "quant/simd_kernels.h"

#include "quant/isa_target.h"
BMOE_ISA512_BEGIN("avx2,fma,f16c,avx512f,avx512bw")

#include "quant/x86_shared.h"  // after the target pragma
#define BMOE_FLASH_NS avx512
#define BMOE_FLASH_WIDE 1
#include "quant/flash_x86_kernels.h"

BMOE_ISA_END()

#endif  // __x86_64__
