#include "telemetry/system.h"

#include <dirent.h>
#include <sys/resource.h>

#include <algorithm>
#include <cstdlib>
#include <chrono>
#include <fstream>
#include <sstream>

namespace bmoe {
namespace {

std::optional<uint64_t> read_number(const std::string& path) {
  std::ifstream in(path);
  std::string s;
  if (!(in >> s) || s == "max") return std::nullopt;
  try {
    return std::stoull(s);
  } catch (const std::exception&) {
    return std::nullopt;
  }
}

// "Key:   123 kB" lines of /proc files.
std::optional<uint64_t> read_kb_field(const std::string& path, const std::string& key) {
  std::ifstream in(path);
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind(key + ":", 0) == 0) {
      std::istringstream ss(line.substr(key.size() + 1));
      uint64_t kb = 0;
      if (ss >> kb) return kb * 1024;
    }
  }
  return std::nullopt;
}

std::optional<uint64_t> read_stat_field(const std::string& path, const std::string& key) {
  std::ifstream in(path);
  std::string k;
  uint64_t v = 0;
  while (in >> k >> v) {
    if (k == key) return v;
  }
  return std::nullopt;
}

}  // namespace

std::optional<uint64_t> MemorySnapshot::available() const {
  if (mem_available && cgroup_available) return std::min(*mem_available, *cgroup_available);
  return mem_available ? mem_available : cgroup_available;
}

ProcessCounters read_process_counters() {
  ProcessCounters c;
  rusage u{};
  if (::getrusage(RUSAGE_SELF, &u) != 0) return c;
  auto seconds = [](const timeval& t) { return static_cast<double>(t.tv_sec) + static_cast<double>(t.tv_usec) * 1e-6; };
  c.cpu_seconds = seconds(u.ru_utime) + seconds(u.ru_stime);
  c.minor_faults = static_cast<uint64_t>(u.ru_minflt);
  c.major_faults = static_cast<uint64_t>(u.ru_majflt);
  c.voluntary_switches = static_cast<uint64_t>(u.ru_nvcsw);
  c.involuntary_switches = static_cast<uint64_t>(u.ru_nivcsw);
  return c;
}

namespace {

// Tests only: BMOE_FAKE_MEM_AVAILABLE_MB=N stands for the machine's figures (N MiB available, no
// cgroup), so that a test shows a memory-dependent choice (streaming or resident) on any machine.
std::optional<uint64_t> fake_available() {
  const char* text = std::getenv("BMOE_FAKE_MEM_AVAILABLE_MB");
  if (text == nullptr || *text == '\0') return std::nullopt;
  char* end = nullptr;
  const unsigned long long mib = std::strtoull(text, &end, 10);
  if (*end != '\0') return std::nullopt;
  return static_cast<uint64_t>(mib) << 20;
}

}  // namespace

MemorySnapshot read_memory() {
  MemorySnapshot m;
  m.rss = read_kb_field("/proc/self/status", "VmRSS").value_or(0);
  m.peak_rss = read_kb_field("/proc/self/status", "VmHWM").value_or(0);
  if (const auto fake = fake_available()) {
    m.mem_available = fake;
    return m;
  }
  m.mem_available = read_kb_field("/proc/meminfo", "MemAvailable");
  // cgroup v1: the memory controller of our own cgroup.
  std::string v1_dir = "/sys/fs/cgroup/memory";
  {
    std::ifstream cg("/proc/self/cgroup");
    std::string line;
    while (std::getline(cg, line)) {
      const auto pos = line.find(":memory:");
      if (pos != std::string::npos) v1_dir += line.substr(pos + 8);
    }
  }
  if (auto limit = read_number(v1_dir + "/memory.limit_in_bytes"); limit && *limit < (1ull << 60)) {
    m.cgroup_limit = limit;
    const uint64_t usage = read_number(v1_dir + "/memory.usage_in_bytes").value_or(0);
    const uint64_t inactive = read_stat_field(v1_dir + "/memory.stat", "total_inactive_file").value_or(0);
    const uint64_t working = usage > inactive ? usage - inactive : 0;
    m.cgroup_available = *limit > working ? *limit - working : 0;
    return m;
  }
  // cgroup v2.
  if (auto limit = read_number("/sys/fs/cgroup/memory.max")) {
    m.cgroup_limit = limit;
    const uint64_t usage = read_number("/sys/fs/cgroup/memory.current").value_or(0);
    const uint64_t inactive = read_stat_field("/sys/fs/cgroup/memory.stat", "inactive_file").value_or(0);
    const uint64_t working = usage > inactive ? usage - inactive : 0;
    m.cgroup_available = *limit > working ? *limit - working : 0;
  }
  return m;
}

std::vector<ThermalReading> read_thermal() {
  std::vector<ThermalReading> out;
  DIR* dir = ::opendir("/sys/class/thermal");
  if (dir == nullptr) return out;
  while (dirent* e = ::readdir(dir)) {
    const std::string name = e->d_name;
    if (name.rfind("thermal_zone", 0) != 0) continue;
    const auto milli = read_number("/sys/class/thermal/" + name + "/temp");
    if (!milli) continue;
    std::ifstream type_file("/sys/class/thermal/" + name + "/type");
    std::string type;
    type_file >> type;
    out.push_back({name + (type.empty() ? "" : " (" + type + ")"), static_cast<double>(*milli) / 1000.0});
  }
  ::closedir(dir);
  std::sort(out.begin(), out.end(), [](const auto& a, const auto& b) { return a.zone < b.zone; });
  return out;
}

MemoryWatcher::MemoryWatcher(int period_ms) : thread_([this, period_ms] { loop(period_ms); }) {}

MemoryWatcher::~MemoryWatcher() {
  stop_.store(true);
  thread_.join();
}

void MemoryWatcher::loop(int period_ms) {
  while (!stop_.load()) {
    const MemorySnapshot m = read_memory();
    if (auto a = m.available()) floor_.store(std::min(floor_.load(), *a));
    if (m.mem_available) mem_floor_.store(std::min(mem_floor_.load(), *m.mem_available));
    for (const auto& t : read_thermal()) max_celsius_.store(std::max(max_celsius_.load(), t.celsius));
    for (int waited = 0; waited < period_ms && !stop_.load(); waited += 10) {
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
  }
}

std::optional<uint64_t> MemoryWatcher::available_floor() const {
  const uint64_t f = floor_.load();
  return f == UINT64_MAX ? std::nullopt : std::optional<uint64_t>(f);
}

std::optional<uint64_t> MemoryWatcher::mem_available_floor() const {
  const uint64_t f = mem_floor_.load();
  return f == UINT64_MAX ? std::nullopt : std::optional<uint64_t>(f);
}

}  // namespace bmoe
