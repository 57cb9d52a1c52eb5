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

#include "quant/isa_target.h"
BMOE_ISA512_BEGIN("avx2,fma,f16c,avx512f,avx512bw")

#define BMOE_X86_VNNI 0
#include "quant/x86_shared.h"  // after the target pragma: compiled for AVX-512 here
#include "quant/x86_tiles.h"
#define BMOE_AVX512_NS avx512
#include "quant/quant_avx512_kernels.h"

BMOE_ISA_END()

#endif  // __x86_64__
