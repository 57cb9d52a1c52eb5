#include "engine/report.h"

#include <fmt/format.h>

#include <cstdio>
#include <nlohmann/json.hpp>

#include "core/error.h"

namespace bmoe {

StepCosts step_costs(std::span<const TokenRecord> records) {
  StepCosts c;
  c.tokens = records.size();
  if (records.empty()) return c;
  double wall = 0, compute = 0, stall = 0, bytes = 0, copied = 0, cpu = 0, switches = 0, faults = 0;
  uint64_t hits = 0, lookups = 0;
  for (const TokenRecord& r : records) {
    wall += r.wall_ms / 1e3;
    compute += r.compute_ms / 1e3;
    stall += r.stall_ms / 1e3;
    bytes += static_cast<double>(r.bytes_read);
    copied += static_cast<double>(r.copied_bytes);
    cpu += r.cpu_ms / 1e3;
    switches += static_cast<double>(r.context_switches);
    faults += static_cast<double>(r.minor_faults);
    hits += r.hits;
    lookups += r.routed;
    c.buffer_allocations += r.buffer_allocations;
  }
  const double n = static_cast<double>(c.tokens);
  c.seconds_per_token = wall / n;
  c.compute_s_per_token = compute / n;
  c.stall_s_per_token = stall / n;
  c.read_mib_per_token = bytes / n / 1048576.0;
  c.copied_mib_per_token = copied / n / 1048576.0;
  c.hit_rate = lookups ? static_cast<double>(hits) / static_cast<double>(lookups) : 0.0;
  c.cpu_s_per_token = cpu / n;
  c.switches_per_token = switches / n;
  c.faults_per_token = faults / n;
  return c;
}

RunSummary summarize(const std::vector<TokenRecord>& records, const ExpertStats& final_stats) {
  RunSummary s;
  s.whole = step_costs(records);
  s.tokens = records.size();
  double io = 0;
  for (const TokenRecord& r : records) {
    s.decode_seconds += r.wall_ms / 1e3;
    io += (r.overlapped ? r.io_ms : r.stall_ms) / 1e3;
    s.overlapped_tokens += r.overlapped ? 1 : 0;
    s.lookups += r.routed;
  }
  s.seconds_per_token = s.whole.seconds_per_token;
  s.compute_s_per_token = s.whole.compute_s_per_token;
  s.io_s_per_token = s.tokens ? io / static_cast<double>(s.tokens) : 0.0;
  s.stall_s_per_token = s.whole.stall_s_per_token;
  s.read_mib_per_token = s.whole.read_mib_per_token;
  s.hit_rate = s.whole.hit_rate;
  s.evictions = final_stats.evictions;
  s.probe_overlap_s = final_stats.probe_overlap_seconds;
  s.probe_serial_s = final_stats.probe_serial_seconds;
  s.early_reads = final_stats.early_reads;
  s.early_used = final_stats.early_used;
  s.early_wasted_bytes = final_stats.early_wasted_bytes;
  s.steady_from = records.size();
  for (size_t i = 0; i < records.size(); ++i) {
    if (records[i].steady) {
      s.steady_from = i;
      break;
    }
  }
  s.steady = step_costs(std::span<const TokenRecord>(records).subspan(s.steady_from));
  return s;
}

void write_token_csv(const std::string& path, const std::vector<TokenRecord>& records) {
  FILE* f = std::fopen(path.c_str(), "w");
  if (!f) fail_errno("cannot create " + path);
  std::fprintf(f,
               "index,token,wall_ms,compute_ms,io_ms,stall_ms,experts_routed,cache_hits,cache_misses,bytes_read,cache_used_bytes,batch,"
               "overlapped,steady,cpu_ms,minor_faults,context_switches,involuntary_switches,buffer_allocations,copied_bytes\n");
  using ull = unsigned long long;
  for (const TokenRecord& r : records) {
    std::fprintf(f, "%d,%d,%.3f,%.3f,%.3f,%.3f,%llu,%llu,%llu,%llu,%llu,%d,%d,%d,%.3f,%llu,%llu,%llu,%llu,%llu\n", r.index, r.token, r.wall_ms,
                 r.compute_ms, r.io_ms, r.stall_ms, static_cast<ull>(r.routed), static_cast<ull>(r.hits), static_cast<ull>(r.misses),
                 static_cast<ull>(r.bytes_read), static_cast<ull>(r.cache_used), r.batch, r.overlapped ? 1 : 0, r.steady ? 1 : 0,
                 r.cpu_ms, static_cast<ull>(r.minor_faults), static_cast<ull>(r.context_switches),
                 static_cast<ull>(r.involuntary_switches), static_cast<ull>(r.buffer_allocations), static_cast<ull>(r.copied_bytes));
  }
  if (std::fclose(f) != 0) fail_errno("cannot write " + path);
}

std::string summary_lines(const RunSummary& s, bool streaming, int lanes, uint64_t budget_bytes) {
  std::string out;
  if (streaming) {
    out += fmt::format(
        "moe-stream: compute {:.3f} + I/O {:.3f} s/tok, stall {:.3f} s/tok, flash read {:.1f} MiB/tok, lanes {}, copied {:.1f} MiB/tok\n",
        s.compute_s_per_token, s.io_s_per_token, s.stall_s_per_token, s.read_mib_per_token, lanes, s.whole.copied_mib_per_token);
    out += fmt::format("moe-cache: budget {} MiB, hit {:.1f} %, evictions {}\n", budget_bytes >> 20, 100.0 * s.hit_rate,
                       s.evictions);
    if (s.probe_overlap_s > 0 || s.overlapped_tokens > 0) {
      out += fmt::format("moe-overlap: {} of {} tokens overlapped", s.overlapped_tokens, s.tokens);
      if (s.probe_overlap_s > 0) {
        out += fmt::format("; latest probe {:.3f} s/pass overlapped vs {:.3f} serial", s.probe_overlap_s, s.probe_serial_s);
      }
      out += "\n";
    }
    if (s.early_reads > 0) {
      out += fmt::format("moe-early: {} experts of hash-routed layers read before their layer ran, {} used ({:.1f} %), "
                         "wasted {:.1f} MiB\n",
                         s.early_reads, s.early_used, 100.0 * static_cast<double>(s.early_used) / static_cast<double>(s.early_reads),
                         static_cast<double>(s.early_wasted_bytes) / 1048576.0);
    }
    if (s.steady.tokens == 0) {
      out += fmt::format("moe-steady: none of {} tokens (the cache never filled)\n", s.tokens);
    } else {
      const StepCosts& w = s.steady;
      out += fmt::format(
          "moe-steady: {} tokens from token {}, {:.2f} tok/s, compute {:.3f} + stall {:.3f} s/tok, hit {:.1f} %, "
          "flash read {:.1f} MiB/tok, buffer allocations {}\n",
          w.tokens, s.steady_from, w.seconds_per_token > 0 ? 1.0 / w.seconds_per_token : 0.0, w.compute_s_per_token,
          w.stall_s_per_token, 100.0 * w.hit_rate, w.read_mib_per_token, w.buffer_allocations);
    }
  }
  out += fmt::format("process: cpu {:.3f} s/tok, context switches {:.1f}/tok, page faults {:.1f}/tok", s.whole.cpu_s_per_token,
                     s.whole.switches_per_token, s.whole.faults_per_token);
  if (streaming && s.steady.tokens > 0 && s.steady.tokens < s.tokens) {
    out += fmt::format(" (steady: cpu {:.3f} s/tok, {:.1f} switches/tok, {:.1f} faults/tok)", s.steady.cpu_s_per_token,
                       s.steady.switches_per_token, s.steady.faults_per_token);
  }
  out += "\n";
  out += fmt::format("generation: {} tokens, {:.4f} s/token, {:.2f} tok/s\n", s.tokens, s.seconds_per_token,
                     s.seconds_per_token > 0 ? 1.0 / s.seconds_per_token : 0.0);
  return out;
}

void write_metrics(const std::string& path, const MetricsInput& m) {
  nlohmann::json j;
  j["version"] = m.version;
  j["config"] = nlohmann::json::parse(m.config_json);
  j["load_seconds"] = m.load_seconds;
  j["prompt"] = {{"tokens", m.prompt_tokens},
                 {"seconds", m.prompt_seconds},
                 {"tok_per_s", m.prompt_seconds > 0 ? m.prompt_tokens / m.prompt_seconds : 0.0}};
  const RunSummary& s = m.summary;
  j["decode"] = {{"tokens", s.tokens},
                 {"seconds", s.decode_seconds},
                 {"tok_per_s", s.seconds_per_token > 0 ? 1.0 / s.seconds_per_token : 0.0},
                 {"compute_s_per_token", s.compute_s_per_token},
                 {"io_s_per_token", s.io_s_per_token},
                 {"stall_s_per_token", s.stall_s_per_token},
                 {"flash_read_mib_per_token", s.read_mib_per_token},
                 {"cache_hit_rate", s.hit_rate},
                 {"cache_evictions", s.evictions},
                 {"overlapped_tokens", s.overlapped_tokens},
                 {"probe_overlap_s_per_pass", s.probe_overlap_s},
                 {"probe_serial_s_per_pass", s.probe_serial_s},
                 {"early_reads", s.early_reads},
                 {"early_reads_used", s.early_used},
                 {"early_wasted_bytes", s.early_wasted_bytes}};
  auto costs = [](const StepCosts& c) {
    return nlohmann::json{{"tokens", c.tokens},
                          {"tok_per_s", c.seconds_per_token > 0 ? 1.0 / c.seconds_per_token : 0.0},
                          {"compute_s_per_token", c.compute_s_per_token},
                          {"stall_s_per_token", c.stall_s_per_token},
                          {"cache_hit_rate", c.hit_rate},
                          {"flash_read_mib_per_token", c.read_mib_per_token},
                          {"copied_mib_per_token", c.copied_mib_per_token},
                          {"cpu_s_per_token", c.cpu_s_per_token},
                          {"context_switches_per_token", c.switches_per_token},
                          {"page_faults_per_token", c.faults_per_token},
                          {"buffer_allocations", c.buffer_allocations}};
  };
  j["decode"]["process"] = costs(s.whole);
  j["decode"]["steady"] = costs(s.steady);
  j["decode"]["steady"]["from_token"] = s.steady_from;
  nlohmann::json mem;
  mem["peak_rss_bytes"] = m.end_memory.peak_rss;
  mem["rss_bytes"] = m.end_memory.rss;
  if (m.mem_available_floor) mem["mem_available_floor_bytes"] = *m.mem_available_floor;
  if (m.available_floor) mem["available_floor_bytes"] = *m.available_floor;
  if (m.end_memory.cgroup_limit) mem["cgroup_limit_bytes"] = *m.end_memory.cgroup_limit;
  j["memory"] = mem;
  nlohmann::json thermal = nlohmann::json::object();
  for (const auto& t : m.thermal_start) thermal[t.zone]["start_c"] = t.celsius;
  for (const auto& t : m.thermal_end) thermal[t.zone]["end_c"] = t.celsius;
  j["thermal"] = thermal;
  j["thermal_max_c"] = m.max_celsius;
  FILE* f = std::fopen(path.c_str(), "w");
  if (!f) fail_errno("cannot create " + path);
  const std::string text = j.dump(2) + "\n";
  std::fwrite(text.data(), 1, text.size(), f);
  if (std::fclose(f) != 0) fail_errno("cannot write " + path);
}

}  // namespace bmoe
