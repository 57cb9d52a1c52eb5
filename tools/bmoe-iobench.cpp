// bmoe-iobench: the drive's ceiling for expert streaming — random O_DIRECT reads on the model
// file itself, for each lane count and read size: MiB/s and latency percentiles.
//   bmoe-iobench FILE [--lanes 1,2,4,8] [--sizes 1M,3M] [--seconds 5] [--buffered]
#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <sstream>
#include <thread>
#include <vector>

#include "core/error.h"
#include "core/rng.h"
#include "core/version.h"
#include "io/direct_io.h"

using namespace bmoe;

namespace {

std::vector<uint64_t> parse_sizes(const std::string& s) {
  std::vector<uint64_t> out;
  std::stringstream ss(s);
  for (std::string item; std::getline(ss, item, ',');) {
    if (item.empty()) continue;
    uint64_t mult = 1;
    const char unit = static_cast<char>(std::toupper(static_cast<unsigned char>(item.back())));
    if (unit == 'K' || unit == 'M' || unit == 'G') {
      mult = unit == 'K' ? 1024 : unit == 'M' ? 1 << 20 : 1ull << 30;
      item.pop_back();
    }
    try {
      out.push_back(static_cast<uint64_t>(std::stod(item) * static_cast<double>(mult)));
    } catch (const std::exception&) {
      fail("--sizes: '{}' is not a size", item);
    }
  }
  return out;
}

std::vector<int> parse_ints(const std::string& s) {
  std::vector<int> out;
  std::stringstream ss(s);
  for (std::string item; std::getline(ss, item, ',');) {
    try {
      out.push_back(std::stoi(item));
    } catch (const std::exception&) {
      fail("--lanes: '{}' is not a number", item);
    }
    if (out.back() < 1 || out.back() > 64) fail("--lanes must be 1..64");
  }
  return out;
}

struct Result {
  double mib_per_s = 0;
  double p50_ms = 0, p99_ms = 0;
  uint64_t reads = 0;
};

Result measure(const DirectFile& file, int lanes, uint64_t size, double seconds, uint64_t seed) {
  const uint64_t window = align_up(size, kDirectAlignment);
  if (file.size() < window * 2) fail("{} is too small for {} byte reads", file.path(), size);
  std::vector<std::vector<double>> latencies(static_cast<size_t>(lanes));
  std::atomic<uint64_t> bytes{0};
  std::atomic<bool> stop{false};
  std::vector<std::thread> threads;
  const auto start = std::chrono::steady_clock::now();
  for (int l = 0; l < lanes; ++l) {
    threads.emplace_back([&, l] {
      AlignedBuffer buf = allocate_aligned(window);
      Rng rng(seed * 131 + static_cast<uint64_t>(l));
      const uint64_t slots = (file.size() - window) / kDirectAlignment;
      while (!stop.load(std::memory_order_relaxed)) {
        const uint64_t offset = rng.below(slots) * kDirectAlignment;
        const auto t0 = std::chrono::steady_clock::now();
        file.read_window(offset, window, buf.get(), window);
        latencies[static_cast<size_t>(l)].push_back(
            std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
        bytes.fetch_add(window, std::memory_order_relaxed);
      }
    });
  }
  std::this_thread::sleep_for(std::chrono::duration<double>(seconds));
  stop.store(true);
  for (auto& t : threads) t.join();
  const double elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::vector<double> all;
  for (auto& v : latencies) all.insert(all.end(), v.begin(), v.end());
  std::sort(all.begin(), all.end());
  Result r;
  r.reads = all.size();
  r.mib_per_s = static_cast<double>(bytes.load()) / 1048576.0 / elapsed;
  if (!all.empty()) {
    r.p50_ms = all[all.size() / 2];
    r.p99_ms = all[std::min(all.size() - 1, all.size() * 99 / 100)];
  }
  return r;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"bmoe-iobench: random-read bandwidth and latency of the model file (the streaming ceiling)"};
  app.set_version_flag("--version", bmoe::version_text());
  std::string path, lanes = "1,2,4,8", sizes = "1M,3M";
  double seconds = 5.0;
  bool buffered = false;
  app.add_option("file", path, "file to read (the model)")->required();
  app.add_option("--lanes", lanes, "comma-separated parallel reader counts")->capture_default_str();
  app.add_option("--sizes", sizes, "comma-separated read sizes (K/M/G suffixes)")->capture_default_str();
  app.add_option("--seconds", seconds, "seconds per measurement")->capture_default_str()->check(CLI::Range(0.1, 600.0));
  app.add_flag("--buffered", buffered, "buffered reads instead of O_DIRECT");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    if (e.get_exit_code() == 0) return app.exit(e);
    fmt::print(stderr, "error: {}\n", e.what());
    return 2;
  }
  try {
    const DirectFile file(path, !buffered);
    if (!file.direct_note().empty()) fmt::print(stderr, "warning: {}\n", file.direct_note());
    fmt::print("{:>6} {:>10} {:>10} {:>9} {:>9} {:>8}\n", "lanes", "read_kib", "MiB/s", "p50_ms", "p99_ms", "reads");
    uint64_t seed = 1;
    for (uint64_t size : parse_sizes(sizes)) {
      for (int l : parse_ints(lanes)) {
        const Result r = measure(file, l, size, seconds, seed++);
        fmt::print("{:>6} {:>10} {:>10.1f} {:>9.2f} {:>9.2f} {:>8}\n", l, size / 1024, r.mib_per_s, r.p50_ms, r.p99_ms, r.reads);
        std::fflush(stdout);
      }
    }
    return 0;
  } catch (const std::exception& e) {
    fmt::print(stderr, "error: {}\n", e.what());
    return 1;
  }
}
