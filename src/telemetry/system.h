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

// The environment variable BMOE_FAKE_MEM_AVAILABLE_MB (for tests only) replaces the machine's
// figures: that many MiB available and no cgroup.
MemorySnapshot read_memory();

// What this process (all its threads) has cost the system so far: CPU time, page faults and
// context switches (getrusage). Differences of two readings give a step's cost.
struct ProcessCounters {
  double cpu_seconds = 0;          // user + system
  uint64_t minor_faults = 0;       // page faults served without I/O (incl. fresh zeroed pages)
  uint64_t major_faults = 0;       // page faults that read from storage
  uint64_t voluntary_switches = 0;    // a thread blocked (a read, a lock, a sleep)
  uint64_t involuntary_switches = 0;  // a thread was preempted
  uint64_t context_switches() const { return voluntary_switches + involuntary_switches; }
};
ProcessCounters read_process_counters();

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
