#include "core/cpu_features.h"

#include <cstdlib>
#include <cstring>

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#endif
#if defined(__aarch64__) && defined(__linux__)
#include <asm/hwcap.h>
#include <sys/auxv.h>
#endif

namespace bmoe {
namespace {

#if defined(__x86_64__) || defined(__i386__)
// F16C from CPUID leaf 1 (ECX bit 29): clang's __builtin_cpu_supports does not know "f16c".
bool has_f16c() {
  unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
  return __get_cpuid(1, &eax, &ebx, &ecx, &edx) && (ecx & (1u << 29)) != 0;
}

// CPUID leaf 0 spells the vendor in EBX, EDX, ECX.
bool is_amd() {
  unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
  if (!__get_cpuid(0, &eax, &ebx, &ecx, &edx)) return false;
  char vendor[12];
  std::memcpy(vendor, &ebx, 4);
  std::memcpy(vendor + 4, &edx, 4);
  std::memcpy(vendor + 8, &ecx, 4);
  return std::memcmp(vendor, "AuthenticAMD", 12) == 0;
}

// AVX-512 F + BW (CPUID leaf 7, EBX bits 16 and 30), usable only where the OS saves the opmask
// and 512-bit register state: XCR0 bits 1-2 (SSE, AVX) and 5-7 (opmask, ZMM0-15 upper halves,
// ZMM16-31).
bool has_avx512bw() {
  unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
  if (!__get_cpuid(1, &eax, &ebx, &ecx, &edx) || (ecx & (1u << 27)) == 0) return false;  // OSXSAVE
  if (!__get_cpuid_count(7, 0, &eax, &ebx, &ecx, &edx)) return false;
  if ((ebx & (1u << 16)) == 0 || (ebx & (1u << 30)) == 0) return false;
  unsigned xcr0_lo = 0, xcr0_hi = 0;
  __asm__("xgetbv" : "=a"(xcr0_lo), "=d"(xcr0_hi) : "c"(0));
  return (xcr0_lo & 0xE6u) == 0xE6u;
}

// AVX-512 VNNI: CPUID leaf 7 subleaf 0, ECX bit 11 (usable with avx512bw's OS state).
bool has_avx512vnni() {
  unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
  return __get_cpuid_count(7, 0, &eax, &ebx, &ecx, &edx) && (ecx & (1u << 11)) != 0;
}

// AVX-VNNI (VEX): CPUID leaf 7 subleaf 1, EAX bit 4 (ymm state, as avx2 needs).
bool has_avx_vnni() {
  unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
  return __get_cpuid_count(7, 1, &eax, &ebx, &ecx, &edx) && (eax & (1u << 4)) != 0;
}

// BMOE_ISA narrows the detected set (see cpu_features.h); an unknown value changes nothing.
void narrow(CpuFeatures& f, const char* force) {
  if (force == nullptr) return;
  const bool avx2_only = std::strcmp(force, "avx2") == 0, avx2_vnni = std::strcmp(force, "avx2-vnni") == 0;
  if (std::strcmp(force, "scalar") == 0) f = CpuFeatures{};
  if (avx2_only || avx2_vnni) f.avx512bw = f.avx512vnni = false;
  if (avx2_only || std::strcmp(force, "avx512") == 0) f.avx512vnni = f.avx_vnni = false;
}
#else
void narrow(CpuFeatures& f, const char* force) {
  if (force != nullptr && std::strcmp(force, "scalar") == 0) f = CpuFeatures{};
}
#endif

CpuFeatures detect() {
  CpuFeatures f;
#if defined(__x86_64__) || defined(__i386__)
  __builtin_cpu_init();
  f.avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && has_f16c();
  f.avx512bw = f.avx2 && has_avx512bw();
  f.avx512vnni = f.avx512bw && has_avx512vnni();
  f.avx_vnni = f.avx2 && has_avx_vnni();
  f.amd = is_amd();
#elif defined(__aarch64__)
  f.neon = true;
#if defined(__linux__)
  const unsigned long hw = getauxval(AT_HWCAP);
  const unsigned long hw2 = getauxval(AT_HWCAP2);
  f.dotprod = (hw & HWCAP_ASIMDDP) != 0;
  f.fp16 = (hw & HWCAP_FPHP) != 0 && (hw & HWCAP_ASIMDHP) != 0;
#ifdef HWCAP2_I8MM
  f.i8mm = (hw2 & HWCAP2_I8MM) != 0;
#endif
  (void)hw2;
#endif
#endif
  narrow(f, std::getenv("BMOE_ISA"));
  return f;
}

}  // namespace

const CpuFeatures& cpu_features() {
  static const CpuFeatures features = detect();
  return features;
}

std::string active_isa_name() {
  const CpuFeatures& f = cpu_features();
  if (f.avx2) {
    const std::string base = f.avx512bw ? "avx2+avx512" : "avx2";
    return base + (f.avx512vnni || f.avx_vnni ? "+vnni" : "");
  }
  if (f.neon) return f.dotprod ? (f.i8mm ? "neon-i8mm" : "neon-dotprod") : "neon";
  return "scalar";
}

}  // namespace bmoe
