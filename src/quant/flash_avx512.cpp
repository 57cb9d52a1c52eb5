// f16_flash_keys (quant.h) with AVX-512 F: the body in flash_x86_kernels.h, on 16 lanes.
#if defined(__x86_64__)

#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <vector>

// Every header with inline or template code the kernels use (std::vector, fp16, blocks) comes
// before the target pragma: compiled after it, those shared definitions would carry AVX-512 (or
// AVX2) instructions, and the linker may keep that copy for the whole program.
#include "core/fp16.h"
#include "quant/blocks.h"
#include "quant/quant.h"
#include "quant/simd_kernels.h"

#include "quant/isa_target.h"
BMOE_ISA512_BEGIN("avx2,fma,f16c,avx512f,avx512bw")

#include "quant/x86_shared.h"  // after the target pragma
#define BMOE_FLASH_NS avx512
#define BMOE_FLASH_WIDE 1
#include "quant/flash_x86_kernels.h"

BMOE_ISA_END()

#endif  // __x86_64__
