// AVX2 tile kernels for prompt batches without VNNI: the bodies in quant_avx2_tiles_kernels.h,
// with int8 multiply-adds as maddubs + madd (see there for what they are).
#if defined(__x86_64__)

#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <type_traits>
#include <vector>

#include "quant/blocks.h"
#include "quant/quant.h"
#include "quant/simd_kernels.h"

#include "quant/isa_target.h"
BMOE_ISA_BEGIN("avx2,fma,f16c")

#define BMOE_X86_VNNI 0
#include "quant/x86_shared.h"  // after the target pragma: compiled for AVX2
#include "quant/x86_tiles.h"
#define BMOE_AVX2_TILES_NS avx2
#include "quant/quant_avx2_tiles_kernels.h"

BMOE_ISA_END()

#endif  // __x86_64__
