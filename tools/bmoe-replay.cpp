// bmoe-replay: replay a routing trace through the expert cache policies and print hit rates.
//   bmoe-replay TRACE --budgets 1000,2000,3000,4000 [--policies lru,lfu,...] [--prefetch N]
// One row per budget (MiB): the budget, then for each policy the decode-phase hit %, the MiB
// read per decoded token and the distance to Belady's hit % (points); with --prefetch also the
// % of lookups found in memory (cached or read ahead) and, with --bytes, how much of the MiB
// per token was read ahead for nothing. --count-from 0.5 scores the second half only. --timing
// adds each replay's wall time per decode lookup (the whole simulation: compare policies, e.g.
// against lru, run in one process).
#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include <chrono>
#include <sstream>

#include "core/error.h"
#include "core/version.h"
#include "moe/route_trace.h"

using namespace bmoe;

namespace {
std::vector<std::string> split(const std::string& s) {
  std::vector<std::string> out;
  std::stringstream ss(s);
  for (std::string item; std::getline(ss, item, ',');) {
    if (!item.empty()) out.push_back(item);
  }
  return out;
}

struct ReplayFlags {
  std::string trace_path, budgets = "1000,2000,3000,4000", policies;
  bool bytes = false, timing = false;
  ReplayOptions options;
};

void add_replay_flags(CLI::App& app, ReplayFlags& f) {
  ReplayOptions& options = f.options;
  app.add_option("trace", f.trace_path, "route trace CSV (shared/data/route-traces format)")->required();
  app.add_option("--budgets", f.budgets, "comma-separated cache budgets in MiB")->capture_default_str();
  app.add_option("--policies", f.policies, "comma-separated policies (default: belady, layer-belady + every online policy); belady-hN: Belady knowing only the next N tokens");
  app.add_flag("--bytes", f.bytes, "with --prefetch, also print the MiB per token read ahead for nothing");
  app.add_flag("--timing", f.timing, "also print each replay's wall ns per decode lookup");
  app.add_option("--count-from", options.count_from,
                 "score only the decode tokens from this fraction of them on (0.5: the second half)")
      ->check(CLI::Range(0.0, 0.99))->capture_default_str();
  app.add_option("--predict", options.predict_window, "hint the policies with the current token's next N layers' experts (simulated router prediction)")->check(CLI::Range(0, 64));
  app.add_option("--predict-accuracy", options.predict_accuracy, "fraction of predicted experts that are right")->check(CLI::Range(0.0, 1.0))->capture_default_str();
  app.add_option("--prefetch", options.prefetch_window,
                 "read ahead as bmoe-cli --prefetch N --predictor affinity: guess each token's next N layers from "
                 "routing history and read the best uncached guesses into a staging area outside the budget")
      ->check(CLI::Range(0, 8));
  app.add_option("--prefetch-reads", options.prefetch_reads, "reads ahead per predicted layer (default: top-k / 2)")->check(CLI::Range(0, 64));
  app.add_option("--min-score", options.min_score, "affinity score a guess needs (mean pair probability)")
      ->check(CLI::Range(0.0, 1.0))->capture_default_str();
}

// The policies to replay: --policies, or the two Belady bounds and every online policy.
std::vector<std::string> policy_names(const std::string& policies) {
  std::vector<std::string> names = policies.empty() ? std::vector<std::string>{"belady", "layer-belady"} : split(policies);
  if (policies.empty()) {
    for (const auto& n : cache_policy_names()) names.push_back(n);
  }
  return names;
}

std::vector<double> budgets_mib(const std::string& budgets) {
  std::vector<double> mib;
  for (const auto& b : split(budgets)) {
    try {
      mib.push_back(std::stod(b));
    } catch (const std::exception&) {
      fail("--budgets: '{}' is not a number", b);
    }
    if (mib.back() < 0) fail("--budgets: negative budget");
  }
  return mib;
}

uint64_t decode_token_count(const RouteTrace& trace) {
  uint64_t decode_tokens = 0;
  std::vector<bool> decode;
  const auto visits = trace_visits(trace, &decode);
  for (size_t i = 0; i < decode.size(); ++i) decode_tokens += decode[i] ? 1 : 0;
  return decode_tokens / static_cast<uint64_t>(trace.n_layer);
}

void print_header(const std::vector<std::string>& names, bool prefetch, bool bytes, bool timing) {
  fmt::print("{:>10}", "budget_mib");
  for (const auto& n : names) fmt::print(" {:>13}", n + "_hit%");
  if (prefetch) for (const auto& n : names) fmt::print(" {:>15}", n + "_inmem%");
  for (const auto& n : names) fmt::print(" {:>16}", n + "_MiB/tok");
  for (const auto& n : names) fmt::print(" {:>16}", n + "_toBelady");
  if (bytes && prefetch) for (const auto& n : names) fmt::print(" {:>18}", n + "_wasteMiB/tok");
  if (timing) for (const auto& n : names) fmt::print(" {:>16}", n + "_ns/lookup");
  fmt::print("\n");
}

// Each policy's replay at one budget, with its wall time per lookup (ns) beside it.
std::vector<ReplayResult> timed_replays(const RouteTrace& trace, const std::vector<std::string>& names, uint64_t budget,
                                        const ReplayOptions& options, std::vector<double>& ns) {
  std::vector<ReplayResult> results;
  for (const auto& n : names) {
    const auto start = std::chrono::steady_clock::now();
    results.push_back(replay_trace(trace, n, budget, options));
    const std::chrono::duration<double, std::nano> took = std::chrono::steady_clock::now() - start;
    ns.push_back(took.count() / static_cast<double>(std::max<uint64_t>(1, results.back().lookups)));
  }
  return results;
}

// One budget's row: every policy's replay beside Belady's hit rate without read-ahead.
void print_row(const RouteTrace& trace, const std::vector<std::string>& names, double mib, const ReplayFlags& f,
               uint64_t decode_tokens) {
  const ReplayOptions& options = f.options;
  const bool prefetch = options.prefetch_window > 0;
  const auto per_token = [&](uint64_t b) {
    return static_cast<double>(b) / 1048576.0 / std::max(1.0, static_cast<double>(decode_tokens) * (1.0 - options.count_from));
  };
  const uint64_t budget = static_cast<uint64_t>(mib * 1024.0 * 1024.0);
  std::vector<double> ns;
  const std::vector<ReplayResult> results = timed_replays(trace, names, budget, options, ns);
  ReplayOptions plain = options;
  plain.prefetch_window = 0;
  const double belady = 100.0 * replay_trace(trace, "belady", budget, plain).hit_rate();
  fmt::print("{:>10.0f}", mib);
  for (const auto& r : results) fmt::print(" {:>13.1f}", 100.0 * r.hit_rate());
  if (prefetch) for (const auto& r : results) fmt::print(" {:>15.1f}", 100.0 * r.in_memory_rate());
  for (const auto& r : results) fmt::print(" {:>16.1f}", per_token(r.bytes_read));
  for (const auto& r : results) fmt::print(" {:>16.1f}", belady - 100.0 * r.hit_rate());
  if (f.bytes && prefetch) for (const auto& r : results) fmt::print(" {:>18.1f}", per_token(r.prefetch_wasted_bytes));
  if (f.timing) for (double t : ns) fmt::print(" {:>16.0f}", t);
  fmt::print("\n");
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"bmoe-replay: expert cache hit rates of each policy on a routing trace"};
  app.set_version_flag("--version", bmoe::version_text());
  ReplayFlags f;
  add_replay_flags(app, f);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    if (e.get_exit_code() == 0) return app.exit(e);
    fmt::print(stderr, "error: {}\n", e.what());
    return 2;
  }
  try {
    const RouteTrace trace = RouteTrace::load(f.trace_path);
    const std::vector<std::string> names = policy_names(f.policies);
    const std::vector<double> mib = budgets_mib(f.budgets);
    const uint64_t decode_tokens = decode_token_count(trace);
    print_header(names, f.options.prefetch_window > 0, f.bytes, f.timing);
    for (double m : mib) print_row(trace, names, m, f, decode_tokens);
    return 0;
  } catch (const std::exception& e) {
    fmt::print(stderr, "error: {}\n", e.what());
    return 1;
  }
}
