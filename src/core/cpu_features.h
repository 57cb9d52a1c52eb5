// Which SIMD paths this CPU can run, detected once at runtime, so one binary runs anywhere.
#pragma once

#include <string>

namespace bmoe {

struct CpuFeatures {
  bool avx2 = false;  // x86: AVX2 + FMA + F16C together (the "haswell" level our kernels need)
  bool avx512bw = false;  // x86: AVX-512 F + BW with the OS saving the 512-bit state (and avx2)
  bool avx512vnni = false;  // x86: AVX-512 VNNI (vpdpbusd, vpdpwssd on zmm), with avx512bw
  bool avx_vnni = false;    // x86: AVX-VNNI, the VEX-encoded ymm forms (Alder Lake, Zen 5), with avx2
  bool neon = false;  // arm64: Advanced SIMD (always present on arm64)
  bool dotprod = false;
  bool i8mm = false;
  bool fp16 = false;
  bool amd = false;   // x86 vendor "AuthenticAMD": some kernel choices differ per vendor (dispatch.cpp)
};

// Detected features, possibly narrowed by the BMOE_ISA environment variable
// (BMOE_ISA=scalar forces the reference kernels, BMOE_ISA=avx2 turns AVX-512 and both VNNI
// forms off, avx2-vnni keeps AVX-VNNI on top of AVX2, avx512 turns the VNNI forms off; useful
// for tests, A/B benchmarks and debugging).
const CpuFeatures& cpu_features();

// Name of the kernel path in use: "avx2", "avx2+avx512", "avx2+avx512+vnni", "neon-dotprod", ...
std::string active_isa_name();

}  // namespace bmoe
