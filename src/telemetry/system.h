// What the system can spare: available memory (also inside a cgroup-v1/v2 limit), this
// process's resident set, thermal zones. Everything degrades to "unknown" (nullopt / empty)
// where the files are not readable, as on some phones.
#pragma once

#include <atomic>
#include <cstdint>
#include <optional>
#include <string>
#include <thread>
#include <vector>

namespace bmoe {

struct MemorySnapshot {
  std::optional<uint64_t> mem_available;     // /proc/meminfo MemAvailable
  std::optional<uint64_t> cgroup_limit;      // memory limit of our cgroup, when one is set
  std::optional<uint64_t> cgroup_available;  // limit minus non-reclaimable usage
  uint64_t rss = 0;                          // VmRSS
  uint64_t peak_rss = 0;                     // VmHWM
  // The tighter of the two availabilities.
  std::optional<uint64_t> available() const;
};

MemorySnapshot read_memory();

struct ThermalReading {
  std::string zone;  // e.g. "thermal_zone0 (cpu-0-0)"
  double celsius = 0;
};
std::vector<ThermalReading> read_thermal();

// Samples memory every `period_ms` in the background, remembering the lowest availability.
class MemoryWatcher {
 public:
  explicit MemoryWatcher(int period_ms = 100);
  ~MemoryWatcher();
  std::optional<uint64_t> available_floor() const;
  std::optional<uint64_t> mem_available_floor() const;
  double max_celsius() const { return max_celsius_.load(); }

 private:
  void loop(int period_ms);
  std::atomic<bool> stop_{false};
  std::atomic<uint64_t> floor_{UINT64_MAX};
  std::atomic<uint64_t> mem_floor_{UINT64_MAX};
  std::atomic<double> max_celsius_{0.0};
  std::thread thread_;
};

}  // namespace bmoe
