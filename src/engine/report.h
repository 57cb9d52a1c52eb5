// What a run reports: the per-token CSV (--csv), the end-of-run summary lines on stderr
// (moe-stream:, moe-cache:, generation:) and the metrics file (--metrics).
#pragma once

#include <string>
#include <vector>

#include "engine/session.h"
#include "moe/expert_source.h"
#include "telemetry/system.h"

namespace bmoe {

struct RunSummary {
  size_t tokens = 0;
  double decode_seconds = 0;
  double seconds_per_token = 0;
  double compute_s_per_token = 0;
  double io_s_per_token = 0;     // serial: wall time waiting on reads; overlap: lane busy time
  double stall_s_per_token = 0;
  double read_mib_per_token = 0;
  double hit_rate = 0;           // cache hits / expert lookups over decode
  uint64_t evictions = 0;
  uint64_t lookups = 0;
  // --overlap: decode tokens whose pass overlapped, and the latest probe (0: none ran).
  size_t overlapped_tokens = 0;
  double probe_overlap_s = 0;
  double probe_serial_s = 0;
};

RunSummary summarize(const std::vector<TokenRecord>& records, const ExpertStats& final_stats);

void write_token_csv(const std::string& path, const std::vector<TokenRecord>& records);

// The three summary lines (moe-stream and moe-cache only when streaming).
std::string summary_lines(const RunSummary& s, bool streaming, int lanes, uint64_t budget_bytes);

struct MetricsInput {
  std::string version;
  std::string config_json;  // the resolved configuration, as a JSON object
  RunSummary summary;
  MemorySnapshot end_memory;
  std::optional<uint64_t> available_floor;
  std::optional<uint64_t> mem_available_floor;
  std::vector<ThermalReading> thermal_start;
  std::vector<ThermalReading> thermal_end;
  double max_celsius = 0;
  double load_seconds = 0;
  double prompt_seconds = 0;
  int prompt_tokens = 0;
};
void write_metrics(const std::string& path, const MetricsInput& m);

}  // namespace bmoe
