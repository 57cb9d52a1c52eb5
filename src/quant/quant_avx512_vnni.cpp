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

#include "quant/isa_target.h"
BMOE_ISA512_BEGIN("avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")

#define BMOE_X86_VNNI 2
#include "quant/x86_shared.h"  // after the target pragma: compiled for AVX-512 VNNI here
#include "quant/x86_tiles.h"
#define BMOE_AVX512_NS avx512_vnni
#include "quant/quant_avx512_kernels.h"
#define BMOE_X86_ROWS_NS avx512vl_vnni
#include "quant/quant_x86_rows_kernels.h"  // the 256-bit one-row and eight-row kernels, EVEX VNNI

BMOE_ISA_END()

#endif  // __x86_64__
