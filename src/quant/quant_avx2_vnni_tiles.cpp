// AVX2 tile, one-row and eight-row kernels with AVX-VNNI (VEX vpdpbusd / vpdpwssd, for CPUs with
// AVX2 and AVX-VNNI): the bodies in quant_avx2_tiles_kernels.h and quant_x86_rows_kernels.h;
// equal bit for bit to the plain AVX2 ones.
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
BMOE_ISA_BEGIN("avx2,fma,f16c,avxvnni")

#define BMOE_X86_VNNI 1
#include "quant/x86_shared.h"  // after the target pragma: compiled for AVX2 + AVX-VNNI
#include "quant/x86_tiles.h"
#define BMOE_AVX2_TILES_NS avx2_vnni
#include "quant/quant_avx2_tiles_kernels.h"
#define BMOE_X86_ROWS_NS avx2_vnni
#include "quant/quant_x86_rows_kernels.h"  // the one-row and eight-row kernels of decode

BMOE_ISA_END()

#endif  // __x86_64__
