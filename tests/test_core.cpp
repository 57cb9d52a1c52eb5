// Core: half and bfloat16 conversions (every half, ties, the F16C instruction where there is
// one) and the thread pool every step runs on.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <thread>
#include <vector>

#include "core/cpu_features.h"
#include "core/fp16.h"
#include "core/rng.h"
#include "core/thread_pool.h"

#if defined(__x86_64__)
#include <immintrin.h>
#endif

namespace bmoe {
namespace {

TEST(Fp16, RoundTripsEveryHalf) {
  for (uint32_t h = 0; h < 65536; ++h) {
    const float f = fp16_to_fp32(static_cast<uint16_t>(h));
    if (std::isnan(f)) continue;
    EXPECT_EQ(fp32_to_fp16(f), h) << "half 0x" << std::hex << h;
  }
}

TEST(Fp16, RoundsToNearestEven) {
  EXPECT_EQ(fp32_to_fp16(1.0f), 0x3C00);
  EXPECT_EQ(fp32_to_fp16(65504.0f), 0x7BFF);
  EXPECT_EQ(fp32_to_fp16(65520.0f), 0x7C00);  // halfway to the next: rounds to inf
  EXPECT_EQ(fp32_to_fp16(1.0f + 0x1p-11f), 0x3C00);  // exact tie, even stays
  EXPECT_EQ(fp32_to_fp16(1.0f + 3 * 0x1p-11f), 0x3C02);  // tie rounds up to even
  EXPECT_EQ(fp32_to_fp16(0x1p-25f), 0x0000);  // half the smallest subnormal: ties to 0
  EXPECT_EQ(fp32_to_fp16(0x1.8p-25f), 0x0001);
  EXPECT_EQ(fp32_to_fp16(-0.0f), 0x8000);
}

#if defined(__x86_64__)
__attribute__((target("f16c"))) uint16_t hardware_fp16(float f) {
  return static_cast<uint16_t>(_cvtss_sh(f, 0));
}

TEST(Fp16, MatchesF16cOnRandomBits) {
  if (!cpu_features().avx2) GTEST_SKIP() << "no F16C";  // detected with AVX2 and FMA
  Rng rng(7);
  for (int i = 0; i < 2000000; ++i) {
    const float f = bits_float(static_cast<uint32_t>(rng.next()));
    if (std::isnan(f)) continue;
    ASSERT_EQ(fp32_to_fp16(f), hardware_fp16(f)) << f;
  }
}
#endif

TEST(Bf16, RoundsToNearestEven) {
  EXPECT_EQ(fp32_to_bf16(1.0f), 0x3F80);
  EXPECT_EQ(bf16_to_fp32(0x3F80), 1.0f);
  EXPECT_EQ(fp32_to_bf16(bits_float(0x3F808000u)), 0x3F80);  // tie, even
  EXPECT_EQ(fp32_to_bf16(bits_float(0x3F818000u)), 0x3F82);  // tie, odd -> up
}

// Every task of every job runs exactly once, whether the workers are spinning (jobs back to back)
// or asleep (a pause longer than their spin between jobs), and a job never returns before all of
// its tasks finished.
TEST(ThreadPoolTest, EveryTaskRunsOnceWithSpinningOrSleepingWorkers) {
  for (const int threads : {2, 4}) {
    ThreadPool pool(threads);
    for (int job = 0; job < 300; ++job) {
      const int64_t n = 1 + job % 37;
      std::vector<std::atomic<int>> runs(static_cast<size_t>(n));
      std::atomic<int64_t> finished{0};
      pool.run(n, [&](int64_t task, int thread) {
        EXPECT_GE(thread, 0);
        EXPECT_LT(thread, threads);
        if (task % 5 == 0) std::this_thread::sleep_for(std::chrono::microseconds(50));
        runs[static_cast<size_t>(task)].fetch_add(1);
        finished.fetch_add(1);
      });
      ASSERT_EQ(finished.load(), n) << "job " << job << " returned before its tasks finished";
      for (int64_t t = 0; t < n; ++t) ASSERT_EQ(runs[static_cast<size_t>(t)].load(), 1);
      // Every tenth job waits long enough for the workers to fall asleep.
      if (job % 10 == 9) std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
  }
}

// Workers still help: a job runs on more than one thread. The calling thread's tasks wait
// until a worker has run one, so a job whose tasks were all taken by the caller (workers that
// never wake) fails, however slowly a loaded machine wakes them (a fixed 1 ms per task did
// not say that under load). The deadline only keeps a broken pool from hanging the test.
TEST(ThreadPoolTest, WorkersShareALongJob) {
  ThreadPool pool(2);
  std::atomic<int> by_worker{0};
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  pool.run(64, [&](int64_t, int thread) {
    if (thread != 0) {
      by_worker.fetch_add(1);
      return;
    }
    while (by_worker.load() == 0 && std::chrono::steady_clock::now() < deadline) {
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
  });
  EXPECT_GT(by_worker.load(), 0);
}

}  // namespace
}  // namespace bmoe
