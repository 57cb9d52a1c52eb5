// Flags that load and run a model, shared by bmoe-cli and bmoe-server so both accept the same
// spelling (llama.cpp's where it has one): model, threads, context, KV type, top-k override,
// and the expert-streaming knobs. They are parsed into a RunConfig (engine/run.h), which the
// engine turns into a running model; this file only parses, checks and converts.
#pragma once

#include <CLI/CLI.hpp>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "engine/run.h"
#include "text/grammar.h"
#include "text/sampler.h"

namespace bmoe {

// The flags of a run as given: the numbers bind straight into `config`; the words (and the
// MiB counts) are kept as typed until run_config() converts them.
struct RunOptions {
  RunConfig config;
  std::string kv_type = "f16";
  std::string dense_weights = "anon";
  std::string cache_mb = "auto";
  int64_t cache_ceil_mb = -1;  // -1: no ceiling
  std::string io_engine = "threads";
  bool no_odirect = false;
  bool no_early_reads = false;
  std::string predictor = "both";  // router, affinity or both
  bool moe_stream = false;     // --moe-stream
  bool no_moe_stream = false;  // --no-moe-stream (neither: the mode chooses itself)
  std::string hf_repo;  // --hf-repo / -hf user/model[:quant] (instead of -m; hf_download.h)
  std::string hf_file;  // --hf-file: that file of the repository
};

// The RunConfig the flags ask for (-hf: the model downloaded first). Fails (bmoe::Error naming
// the flags) without a model, on a
// combination that needs --moe-stream or --prefetch, and on a --cache-mb that is neither a
// number of MiB nor auto.
RunConfig run_config(const RunOptions& o);

// CLI11 validator: the value parses as a finite number (CLI::Range lets NaN through).
CLI::Validator finite_number();
// A seed from the system's entropy source.
uint64_t random_seed();
// Fails (bmoe::Error naming `flag`) unless `path` can be written: its folder exists and is
// writable, and an existing file there is a writable regular file. Empty: nothing to check.
void check_output_path(const std::string& path, const std::string& flag);

void add_run_flags(CLI::App& app, RunOptions& o);
// The sampling flags (--temp --top-k --top-p --min-p and the penalties) into `c`, whose values
// are the defaults shown; bmoe-cli's are its settings, bmoe-server's each request's defaults.
void add_sampling_flags(CLI::App& app, SamplerConfig& c, double max_temperature = 100.0);

// llama.cpp's output constraints: --grammar, --grammar-file, -j/--json-schema, --json-schema-file.
struct GrammarOptions {
  std::string grammar, grammar_file, json_schema, json_schema_file;
};
void add_grammar_flags(CLI::App& app, GrammarOptions& o);
// The grammar the flags ask for (nullptr: none). Fails (bmoe::Error naming the flag) on a bad
// file, schema or grammar, or when more than one is given.
std::shared_ptr<const Grammar> grammar_from_flags(const GrammarOptions& o);

}  // namespace bmoe
