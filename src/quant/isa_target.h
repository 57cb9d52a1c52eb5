// Compiles the functions between BMOE_ISA_BEGIN("avx2,fma,...") and BMOE_ISA_END() for that
// instruction set whatever the file's flags: each SIMD kernel file is built for the baseline and
// only called after the dispatcher has checked the CPU (dispatch.cpp). clang and GCC spell the
// push/pop differently; one macro pair keeps every kernel file to the same two lines.
#pragma once

#define BMOE_PRAGMA(text) _Pragma(#text)

#if defined(__clang__)
#define BMOE_ISA_BEGIN(isa) BMOE_PRAGMA(clang attribute push(__attribute__((target(isa))), apply_to = function))
#define BMOE_ISA_END() BMOE_PRAGMA(clang attribute pop)
#else
#define BMOE_ISA_BEGIN(isa) BMOE_PRAGMA(GCC push_options) BMOE_PRAGMA(GCC target(isa))
#define BMOE_ISA_END() BMOE_PRAGMA(GCC pop_options)
#endif

// The same for AVX-512 code. GCC 12's AVX-512 intrinsics fill their unused merge operand with
// _mm512_undefined_*(), which its own -W(maybe-)uninitialized then reports at each use (a known
// false positive), so those two warnings are off from here to the end of the file (GCC's
// pop_options does not restore diagnostics; each AVX-512 file ends with its kernels).
#if defined(__clang__)
#define BMOE_ISA512_BEGIN(isa) BMOE_ISA_BEGIN(isa)
#else
#define BMOE_ISA512_BEGIN(isa)                              \
  BMOE_ISA_BEGIN(isa)                                       \
  BMOE_PRAGMA(GCC diagnostic ignored "-Wmaybe-uninitialized") \
  BMOE_PRAGMA(GCC diagnostic ignored "-Wuninitialized")
#endif

// Outside the kernel files: a plain loop built twice, for the baseline and for `isa` (e.g.
// "fma"), the loader's ifunc resolver picking the one the CPU runs. Where the loop's operations
// round the same in both builds (an fma is one rounding either way; vector lanes round as the
// scalar code), both clones give the same bits. GCC on x86-64 only; elsewhere one build.
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define BMOE_CLONES_FOR(isa) __attribute__((target_clones(isa, "default")))
#else
#define BMOE_CLONES_FOR(isa)
#endif
