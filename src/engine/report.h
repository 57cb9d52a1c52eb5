// What a run reports: the per-token CSV (--csv), the end-of-run summary lines on stderr
// (moe-stream:, moe-cache:, generation:) and the metrics file (--metrics).
#pragma once

#include <span>
#include <string>
#include <vector>

#include "engine/session.h"
#include "expert_source/expert_source.h"
#include "telemetry/system.h"

namespace bmoe {

// What the decode steps of a stretch of a run cost, per token.
struct StepCosts {
  size_t tokens = 0;
  double seconds_per_token = 0;
  double compute_s_per_token = 0;
  double stall_s_per_token = 0;
  double hit_rate = 0;
  double read_mib_per_token = 0;
  double copied_mib_per_token = 0;   // of the bytes read, copied by the kernel (buffered reads)
  double cpu_s_per_token = 0;        // the whole process: compute and read lanes
  double switches_per_token = 0;     // context switches, voluntary + involuntary
  double faults_per_token = 0;       // minor page faults
  uint64_t buffer_allocations = 0;   // expert buffers allocated (total over the stretch)
};
StepCosts step_costs(std::span<const TokenRecord> records);

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
  // Early reads of the hash-routed layers' experts (deepseek4), over the whole run (prompt
  // included): read at the start of a pass, used by their layer, and bytes nobody used.
  uint64_t early_reads = 0;
  uint64_t early_used = 0;
  uint64_t early_wasted_bytes = 0;
  StepCosts whole;
  // The steady state: the tokens from the first whose step began with the expert cache full
  // (every token of a run without a cache to fill, or warm-started full from --cache-file).
  size_t steady_from = 0;
  StepCosts steady;
};

RunSummary summarize(const std::vector<TokenRecord>& records, const ExpertStats& final_stats);

void write_token_csv(const std::string& path, const std::vector<TokenRecord>& records);

// The summary lines: moe-stream, moe-cache and moe-steady only when streaming, then process
// and generation.
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
