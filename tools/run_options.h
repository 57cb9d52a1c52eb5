// Flags that load and run a model, shared by bmoe-cli and bmoe-server so both accept the same
// spelling (llama.cpp's where it has one): model, threads, context, KV type, top-k override,
// and the expert-streaming knobs.
#pragma once

#include <CLI/CLI.hpp>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "engine/loader.h"
#include "engine/speculative.h"
#include "model/attention.h"
#include "text/chat.h"
#include "text/grammar.h"
#include "text/sampler.h"

namespace bmoe {

struct RunOptions {
  std::string model;
  int threads = 0;
  int ctx_size = 4096;
  int batch_size = 0;  // -b; 0: batch() picks the mode's default
  int n_expert_used = 0;
  std::string kv_type = "f16";
  bool moe_stream = false;
  std::string dense_weights = "anon";
  std::string cache_mb = "auto";
  int64_t cache_ceil_mb = -1;
  std::string cache_policy;
  int io_threads = 4;
  std::string io_engine = "threads";
  int read_chunk_kb = 1024;
  bool no_odirect = false;
  bool overlap = false;
  bool overlap_always = false;  // --overlap-always: no probing, overlap every pass
  int prefetch = 0;
  std::string predictor = "both";  // --predictor: router, affinity or both
  std::string predict_log;
  std::string cache_file;  // --cache-file: warm start from / save the hot set to this file
  std::string chat_template;  // --chat-template: a built-in format's name, a file or Jinja text; empty: the model's
  // Lossy knobs (off by default).
  int route_ahead = 0;
  float drop_cold = 0.0f;
  // Speculative decoding (lossless, greedy only).
  int draft = 0;
  bool ngram = false;
  int ngram_max = 4;
  bool mtp = false;
  std::string draft_oracle;  // benchmark-only: draft from an earlier run's --json output

  int thread_count() const;
  // Prompt tokens per forward pass: -b, else 512 resident and 2048 streamed (each expert read
  // then serves four times the tokens; measured in docs/benchmarks.md).
  int batch() const { return batch_size > 0 ? batch_size : moe_stream ? 2048 : 512; }
  // The draft settings; fails where the model cannot draft as asked (--mtp without an MTP head).
  DraftConfig draft_config(const ModelConfig& config) const;
  KvType kv() const { return kv_type == "f32" ? KvType::F32 : KvType::F16; }
  // The routers predict (in the model) only where --predictor asks for them.
  RoutingOptions routing() const { return {router_prefetch(), route_ahead, drop_cold}; }
  int router_prefetch() const { return predictor == "affinity" ? 0 : prefetch; }
  int affinity_prefetch() const { return predictor == "router" ? 0 : prefetch; }
  bool overlapping() const { return overlap || overlap_always; }
  bool adaptive_overlap() const { return overlap && !overlap_always; }
  bool lossy() const { return route_ahead > 0 || drop_cold > 0.0f || n_expert_used > 0; }
};

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

// The prompt and output token ids of an earlier `bmoe-cli --json` run (for --draft-oracle and
// --teacher-force); `flag` names the option in errors.
struct JsonRun {
  std::vector<int32_t> prompt;
  std::vector<int32_t> tokens;
};
JsonRun read_json_run(const std::string& path, const char* flag);

struct LoadedRun {
  std::unique_ptr<LoadedModel> model;
  uint64_t cache_budget = 0;  // streaming expert cache, bytes
  double load_seconds = 0;
};

// Writes --predict-log (one row per checked prediction) when asked; prints the prefetch line.
void report_prefetch(const RunOptions& o, LoadedModel& model);

// The chat template a run uses (--chat-template, else the model's own); says on stderr when
// it falls back to a built-in format.
ChatTemplate chat_template_for(const RunOptions& o, const LoadedModel& model);

// --cache-file: saves the streaming cache's residents (at the end of a run or a server's life).
void save_cache_file(const RunOptions& o, LoadedModel& model);

// Loads the model, sizes and attaches the expert cache when streaming, and prints the "load:"
// line (and any warnings) on stderr.
LoadedRun load_run(const RunOptions& o);

}  // namespace bmoe
