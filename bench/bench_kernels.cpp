// Kernel micro-benchmarks (Google Benchmark): one weight matrix x one activation row, per
// format and per ISA path, reported as weight bytes per second; prompt batches (gemm32: one
// core, one matmul task's 64 rows; gemm-all: every core through matmul's thread pool) in
// GFLOP/s beside the machine's peak for the same instruction mix (peak/*).
#include <benchmark/benchmark.h>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

#include <thread>
#include <vector>

#include "core/cpu_features.h"
#include "core/rng.h"
#include "core/thread_pool.h"
#include "model/matmul.h"
#include "quant/quant.h"

namespace bmoe {
namespace {

struct Matrix {
  TensorType type;
  int64_t rows, cols;
  std::vector<uint8_t> weights;
  std::vector<uint8_t> activations;
};

Matrix make_matrix(TensorType type, int64_t rows, int64_t cols) {
  Matrix m{type, rows, cols, {}, {}};
  m.weights.resize(row_bytes(type, cols) * static_cast<size_t>(rows));
  Rng rng(1);
  fill_random_weights(type, rng, m.weights.data(), rows * cols, 0.02f);
  std::vector<float> x(static_cast<size_t>(cols));
  for (float& v : x) v = static_cast<float>(rng.normal());
  const TensorType act = kernels(type).activation_type;
  m.activations.resize(activation_bytes(act, cols));
  quantize_activations(act, x.data(), m.activations.data(), cols);
  return m;
}

// rows_at_once: use the type's kDotRows-row kernel (what matmul runs) instead of one row at a time.
// rows: 768 x 2048 fits in L2 (kernel speed); 65536 rows stream from DRAM (memory speed).
void run(benchmark::State& state, TensorType type, Isa isa, bool rows_at_once, int64_t rows = 768) {
  const TypeKernels* k = kernels_for_isa(type, isa);
  if (k == nullptr || (rows_at_once && k->dot_rows == nullptr)) {
    state.SkipWithError("not available");
    return;
  }
  const Matrix m = make_matrix(type, rows, 2048);
  std::vector<float> out(static_cast<size_t>(m.rows));
  const size_t stride = row_bytes(type, m.cols);
  for (auto _ : state) {
    if (rows_at_once) {
      for (int64_t r = 0; r < m.rows; r += kDotRows) {
        k->dot_rows(m.weights.data() + r * stride, stride, m.activations.data(), m.cols, out.data() + r);
      }
    } else {
      for (int64_t r = 0; r < m.rows; ++r) out[static_cast<size_t>(r)] = k->dot(m.weights.data() + r * stride, m.activations.data(), m.cols);
    }
    benchmark::DoNotOptimize(out.data());
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations()) * static_cast<int64_t>(m.weights.size()));
  state.counters["GFLOP/s"] = benchmark::Counter(2.0 * static_cast<double>(m.rows * m.cols) * static_cast<double>(state.iterations()),
                                                 benchmark::Counter::kIsRate, benchmark::Counter::kIs1000);
}

// Two activation rows (a batch of 2): with the pair kernel (arm64 i8mm) or one row at a time.
void run_batch2(benchmark::State& state, TensorType type, Isa isa, bool pairs) {
  const TypeKernels* k = kernels_for_isa(type, isa);
  if (k == nullptr || (pairs && k->dot_2x2 == nullptr)) {
    state.SkipWithError("not available");
    return;
  }
  const Matrix m = make_matrix(type, 768, 2048);
  const std::vector<uint8_t> second = make_matrix(type, 2, 2048).activations;
  std::vector<float> out(static_cast<size_t>(m.rows) * 2);
  const size_t stride = row_bytes(type, m.cols);
  for (auto _ : state) {
    for (int64_t r = 0; r < m.rows; r += 2) {
      const uint8_t* w = m.weights.data() + r * stride;
      if (pairs) {
        k->dot_2x2(w, stride, m.activations.data(), second.data(), m.cols, out.data() + 2 * r);
      } else {
        for (int j = 0; j < 2; ++j) {
          out[2 * r + 2 * j] = k->dot(w + j * stride, m.activations.data(), m.cols);
          out[2 * r + 2 * j + 1] = k->dot(w + j * stride, second.data(), m.cols);
        }
      }
    }
    benchmark::DoNotOptimize(out.data());
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations()) * static_cast<int64_t>(m.weights.size()));
}

// A prompt batch: `acts` activation rows against a chunk of 64 weight rows of 2048 columns (the
// rows one matmul task takes), with the tile kernel or one dot product at a time. Reports
// GFLOP/s (two per weight x activation element).
void run_gemm(benchmark::State& state, TensorType type, Isa isa, bool tiles, int acts) {
  const TypeKernels* k = kernels_for_isa(type, isa);
  if (k == nullptr || (tiles && k->dot_tile == nullptr)) {
    state.SkipWithError("not available");
    return;
  }
  const Matrix m = make_matrix(type, 64, 2048);
  std::vector<std::vector<uint8_t>> inputs;
  std::vector<const void*> ptrs;
  for (int a = 0; a < acts; ++a) inputs.push_back(make_matrix(type, 1, 2048).activations);
  for (const auto& in : inputs) ptrs.push_back(in.data());
  std::vector<float> out(static_cast<size_t>(m.rows) * acts);
  const size_t stride = row_bytes(type, m.cols);
  for (auto _ : state) {
    if (tiles) {
      k->dot_tile(m.weights.data(), stride, m.rows, ptrs.data(), acts, m.cols, out.data(), m.rows);
    } else {
      for (int64_t r = 0; r < m.rows; ++r) {
        for (int a = 0; a < acts; ++a) out[static_cast<size_t>(a * m.rows + r)] = k->dot(m.weights.data() + r * stride, ptrs[static_cast<size_t>(a)], m.cols);
      }
    }
    benchmark::DoNotOptimize(out.data());
  }
  state.counters["GFLOP/s"] = benchmark::Counter(2.0 * static_cast<double>(m.rows * m.cols * acts) * static_cast<double>(state.iterations()),
                                                 benchmark::Counter::kIsRate, benchmark::Counter::kIs1000);
}

// A whole prompt batch through matmul on every core: 768 x 2048 rows (an expert's gate or up
// projection, or a chunk of attention) against 128 activation rows.
void run_gemm_all_cores(benchmark::State& state, TensorType type) {
  const int threads = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  ThreadPool pool(threads);
  Matrix m = make_matrix(type, 768, 2048);
  Weight w;
  w.type = type;
  w.rows = m.rows;
  w.cols = m.cols;
  w.row_stride = row_bytes(type, m.cols);
  w.data = m.weights.data();
  constexpr int kActs = 128;
  std::vector<float> x(static_cast<size_t>(kActs) * m.cols);
  Rng rng(3);
  for (float& v : x) v = static_cast<float>(rng.normal());
  ActivationBuffer in;
  in.convert(type, x.data(), kActs, m.cols, m.cols, &pool);
  std::vector<float> out(static_cast<size_t>(kActs) * m.rows);
  const MatmulJob job{&w, &in, kActs, nullptr, out.data(), m.rows};
  for (auto _ : state) {
    run_matmuls(pool, std::span<const MatmulJob>(&job, 1));
    benchmark::DoNotOptimize(out.data());
  }
  state.counters["threads"] = threads;
  state.counters["GFLOP/s"] = benchmark::Counter(2.0 * static_cast<double>(m.rows * m.cols * kActs) * static_cast<double>(state.iterations()),
                                                 benchmark::Counter::kIsRate, benchmark::Counter::kIs1000);
}

#if defined(__x86_64__)
// The machine's peak for the tile kernels' instruction mix, one core: int8 multiply-adds as
// maddubs + madd + add (64 per 512-bit step, 32 per 256-bit one) on twelve independent
// accumulators, and f32 fused multiply-adds (attention's GEMM). No loads: an upper bound no
// kernel reaches. One operand "changes" every step (an empty asm), so nothing is hoisted.
// A macro: each body must be compiled for its own target.
#define BMOE_PEAK(NAME, TARGET, V, MACS, A0, B0, STEP)                                                          \
  __attribute__((target(TARGET))) void NAME(benchmark::State& state) {                                       \
    constexpr int kChains = 12;                                                                              \
    V acc[kChains], a[kChains], b = B0;                                                                      \
    for (int k = 0; k < kChains; ++k) {                                                                      \
      acc[k] = V{};                                                                                          \
      a[k] = A0;                                                                                             \
    }                                                                                                        \
    for (auto _ : state) {                                                                                   \
      for (int i = 0; i < 1024; ++i) {                                                                       \
        _Pragma("GCC unroll 12") for (int k = 0; k < kChains; ++k) acc[k] = STEP;                             \
        asm volatile("" : "+v"(b));                                                                          \
      }                                                                                                      \
      benchmark::DoNotOptimize(acc);                                                                         \
    }                                                                                                        \
    state.counters["GFLOP/s"] = benchmark::Counter(2.0 * (MACS) * kChains * 1024 * static_cast<double>(state.iterations()), \
                                                   benchmark::Counter::kIsRate, benchmark::Counter::kIs1000); \
  }

BMOE_PEAK(peak_int8_avx512, "avx2,fma,avx512f,avx512bw", __m512i, 64, _mm512_set1_epi8(3), _mm512_set1_epi8(5),
          _mm512_add_epi32(acc[k], _mm512_madd_epi16(_mm512_maddubs_epi16(a[k], b), _mm512_set1_epi16(1))))
BMOE_PEAK(peak_int8_avx2, "avx2,fma", __m256i, 32, _mm256_set1_epi8(3), _mm256_set1_epi8(5),
          _mm256_add_epi32(acc[k], _mm256_madd_epi16(_mm256_maddubs_epi16(a[k], b), _mm256_set1_epi16(1))))
BMOE_PEAK(peak_f32_avx512, "avx2,fma,avx512f", __m512, 16, _mm512_set1_ps(1.0001f), _mm512_set1_ps(0.9999f),
          _mm512_fmadd_ps(a[k], b, acc[k]))
BMOE_PEAK(peak_f32_avx2, "avx2,fma", __m256, 8, _mm256_set1_ps(1.0001f), _mm256_set1_ps(0.9999f),
          _mm256_fmadd_ps(a[k], b, acc[k]))
// VNNI: one vpdpbusd does the maddubs + madd + add above (and vpdpwssd the scaled madd + add).
BMOE_PEAK(peak_int8_avx512_vnni, "avx2,fma,avx512f,avx512bw,avx512vnni", __m512i, 64, _mm512_set1_epi8(3),
          _mm512_set1_epi8(5), _mm512_dpbusd_epi32(acc[k], a[k], b))
BMOE_PEAK(peak_int8_avx_vnni, "avx2,fma,avxvnni", __m256i, 32, _mm256_set1_epi8(3), _mm256_set1_epi8(5),
          _mm256_dpbusd_avx_epi32(acc[k], a[k], b))
#endif

// Memory bandwidth, STREAM's triad a = b + s * c on f32 arrays far larger than the caches
// (3 x 64 MiB), on `threads` threads each taking its own slice; 12 bytes counted per element
// (the write-allocate read of `a` is not counted, as STREAM does not).
void triad(benchmark::State& state, int threads) {
  constexpr size_t kElems = size_t{16} << 20;
  std::vector<float> a(kElems, 0.0f), b(kElems, 1.0f), c(kElems, 2.0f);
  ThreadPool pool(threads);
  for (auto _ : state) {
    pool.run(threads, [&](int64_t task, int) {
      const size_t begin = kElems * static_cast<size_t>(task) / static_cast<size_t>(threads);
      const size_t end = kElems * static_cast<size_t>(task + 1) / static_cast<size_t>(threads);
      for (size_t i = begin; i < end; ++i) a[i] = b[i] + 3.0f * c[i];
    });
    benchmark::DoNotOptimize(a.data());
    benchmark::ClobberMemory();
  }
  state.counters["threads"] = threads;
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations()) * static_cast<int64_t>(3 * kElems * sizeof(float)));
}

void register_all() {
  const TensorType types[] = {TensorType::Q4_K, TensorType::Q6_K, TensorType::Q5_K, TensorType::Q8_0,
                              TensorType::Q4_0, TensorType::MXFP4, TensorType::F16, TensorType::BF16, TensorType::F32};
  for (TensorType t : types) {
    const std::string name(type_name(t));
    auto add = [&](const std::string& isa_name, Isa isa) {
      benchmark::RegisterBenchmark(("dot/" + name + "/" + isa_name).c_str(),
                                   [t, isa](benchmark::State& s) { run(s, t, isa, false); });
      const TypeKernels* k = kernels_for_isa(t, isa);
      if (k != nullptr && k->dot_2x2 != nullptr) {
        benchmark::RegisterBenchmark(("batch2/" + name + "/" + isa_name).c_str(),
                                     [t, isa](benchmark::State& s) { run_batch2(s, t, isa, false); });
        benchmark::RegisterBenchmark(("batch2/" + name + "/" + isa_name + "-pairs").c_str(),
                                     [t, isa](benchmark::State& s) { run_batch2(s, t, isa, true); });
      }
      if (k != nullptr && k->dot_rows != nullptr) {
        benchmark::RegisterBenchmark(("dot/" + name + "/" + isa_name + "-rows").c_str(),
                                     [t, isa](benchmark::State& s) { run(s, t, isa, true); });
      }
    };
    add("scalar", Isa::Scalar);
    if (t == TensorType::Q4_K || t == TensorType::Q6_K || t == TensorType::Q8_0 || t == TensorType::MXFP4) {
      benchmark::RegisterBenchmark(("dot-dram/" + name).c_str(), [t](benchmark::State& s) {
        run(s, t, active_isa(), false, 65536);
      });
      if (kernels(t).dot_rows != nullptr) {
        benchmark::RegisterBenchmark(("dot-dram/" + name + "-rows").c_str(),
                                     [t](benchmark::State& s) { run(s, t, active_isa(), true, 65536); });
      }
    }
#if defined(__x86_64__)
    add("avx2", Isa::Avx2);
#endif
    benchmark::RegisterBenchmark(("gemm32/" + name + "/one-row").c_str(),
                                 [t](benchmark::State& s) { run_gemm(s, t, active_isa(), false, 32); });
    benchmark::RegisterBenchmark(("gemm32/" + name + "/tile").c_str(),
                                 [t](benchmark::State& s) { run_gemm(s, t, active_isa(), true, 32); });
    benchmark::RegisterBenchmark(("gemm-all/" + name).c_str(), [t](benchmark::State& s) { run_gemm_all_cores(s, t); })
        ->UseRealTime();
#if defined(__aarch64__)
    add("neon", Isa::Neon);
#endif
  }
}

}  // namespace
}  // namespace bmoe

int main(int argc, char** argv) {
  bmoe::register_all();
#if defined(__x86_64__)
  if (bmoe::cpu_features().avx2) benchmark::RegisterBenchmark("peak/int8-avx2", bmoe::peak_int8_avx2);
  if (bmoe::cpu_features().avx512bw) {
    benchmark::RegisterBenchmark("peak/int8-avx512", bmoe::peak_int8_avx512);
    benchmark::RegisterBenchmark("peak/f32-avx512", bmoe::peak_f32_avx512);
  }
  if (bmoe::cpu_features().avx2) benchmark::RegisterBenchmark("peak/f32-avx2", bmoe::peak_f32_avx2);
  if (bmoe::cpu_features().avx512vnni) benchmark::RegisterBenchmark("peak/int8-avx512-vnni", bmoe::peak_int8_avx512_vnni);
  if (bmoe::cpu_features().avx_vnni) benchmark::RegisterBenchmark("peak/int8-avx-vnni", bmoe::peak_int8_avx_vnni);
#endif
  const int cores = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  benchmark::RegisterBenchmark("triad/1", [](benchmark::State& s) { bmoe::triad(s, 1); })->UseRealTime();
  if (cores > 1) benchmark::RegisterBenchmark("triad/all", [cores](benchmark::State& s) { bmoe::triad(s, cores); })->UseRealTime();
  benchmark::Initialize(&argc, argv);
  benchmark::RunSpecifiedBenchmarks();
  return 0;
}
