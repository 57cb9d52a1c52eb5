// Whether this test binary is built with AddressSanitizer. Its allocator's quarantine hands out
// fresh memory (page faults a plain build does not take), and it runs this code 10-20x slower,
// so randomized and long-running tests take fewer samples there: the Release suite runs the
// full counts on the same code, the sanitizer run looks for memory and UB errors on every path.
#pragma once

namespace bmoe {

#if defined(__SANITIZE_ADDRESS__)
inline constexpr bool kAddressSanitized = true;
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
inline constexpr bool kAddressSanitized = true;
#else
inline constexpr bool kAddressSanitized = false;
#endif
#else
inline constexpr bool kAddressSanitized = false;
#endif

// `full` in a plain build, `sanitized` under AddressSanitizer.
constexpr int full_or_sanitized(int full, int sanitized) { return kAddressSanitized ? sanitized : full; }

}  // namespace bmoe
