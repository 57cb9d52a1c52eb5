// A run: the typed settings of one model run (RunConfig) and what turns them into a running
// model: load, streaming options, the automatic cache budget, the warm start from a cache file
// and its save, and the end-of-run prefetch report. bmoe-cli and bmoe-server parse their flags
// into a RunConfig (tools/run_options.h) and hand it here; anything else that embeds the engine
// does the same without flags.
//
// The lines this file prints on stderr ("mode:", "load:", "moe-cache:", "prefetch:", warnings)
// name the command-line flags a setting comes from, because bmoe's tools are its users; the
// spellings are the same in every tool.
#pragma once

#include <algorithm>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "core/thread_pool.h"
#include "engine/loader.h"
#include "engine/session.h"
#include "engine/speculative.h"
#include "io/read_lanes.h"
#include "model/attention.h"
#include "model/transformer.h"
#include "chat/chat.h"
#include "telemetry/system.h"
#include "text/sampler.h"

namespace bmoe {

// What --prefetch predicts with (see StreamingOptions and RoutingOptions).
enum class Predictor {
  Router,    // the next layers' routers on the current residual (in the model)
  Affinity,  // which experts followed these in earlier tokens (AffinityPredictor, in moe)
  Both,
};

// Where the routed experts live: streamed from the file into a bounded cache (--moe-stream),
// mapped with the whole file (--no-moe-stream), or Auto: streamed when the model does not fit
// in memory, mapped when it does (choose_moe_mode).
enum class MoeMode { Auto, Stream, Resident };

// Everything a run of one model is asked to be, as numbers and enums. Fields marked
// "streaming" apply only when the run streams and are ignored otherwise. Defaults are the tools'.
struct RunConfig {
  std::string model;  // GGUF path (any shard of a split model)
  int threads = 0;    // compute threads; 0: every core
  int ctx_size = 4096;
  // Sequences decoded at once (--parallel, llama-server's -np): they share ctx_size, each
  // sequence's context being ctx_size / parallel as llama-server's slots.
  int parallel = 1;
  int batch_size = 0;     // prompt tokens per forward pass; 0: batch() picks the mode's default
  int n_expert_used = 0;  // override the model's top-k (lossy); 0: the model's
  KvType kv_type = KvType::F16;
  std::string chat_template;  // a built-in format's name, a file or Jinja text; empty: the model's

  // As asked; in LoadedRun::config, the mode load_run chose (Stream or Resident, never Auto).
  MoeMode moe_mode = MoeMode::Auto;
  DenseWeights dense_weights = DenseWeights::Anon;                // streaming
  std::optional<uint64_t> cache_bytes;          // streaming: the expert cache; nullopt: automatic
  std::optional<uint64_t> cache_ceiling_bytes;  // streaming: upper bound of the automatic budget
  std::string cache_policy;                     // streaming: empty: default_cache_policy()
  int io_threads = 4;                           // streaming: read lanes
  IoEngine io_engine = IoEngine::Threads;       // streaming
  int read_chunk_kb = 1024;                     // streaming: target size of one read, a multiple of 4
  bool odirect = true;                          // streaming: false: buffered reads
  bool overlap = false;         // streaming: compute cached experts while the missing ones are read
  bool overlap_always = false;  // streaming: overlap every pass (no probing)
  int prefetch = 0;             // streaming: layers predicted and read ahead (lossless)
  Predictor predictor = Predictor::Both;  // streaming: what `prefetch` predicts with
  std::string predict_log;  // streaming: CSV of the checked predictions (needs prefetch or route_ahead)
  std::string cache_file;   // streaming: warm start from this file, and save the hot set there
  // streaming: the hash-routed layers' experts (known from the token ids) are read at the start
  // of each pass, into a staging area beside the prefetch one (lossless; see loader.h)
  bool early_reads = true;

  // Lossy knobs (off by default).
  int route_ahead = 0;
  float drop_cold = 0.0f;

  // Speculative decoding (lossless); draft_config() resolves these.
  int draft = 0;
  bool ngram = false;
  int ngram_max = 4;
  bool mtp = false;
  std::string draft_oracle;  // benchmark only: draft from an earlier run's `bmoe-cli --json` output
  float draft_accept = 1.0f;  // benchmark only: --draft-oracle's share of right draft tokens
  uint64_t draft_seed = 1;    // which oracle tokens are corrupted

  int thread_count() const;
  int sequence_ctx() const { return ctx_size / std::max(1, parallel); }
  // Streams the experts (a resolved mode: Auto answers false until load_run has chosen).
  bool streaming() const { return moe_mode == MoeMode::Stream; }
  // Prompt tokens per forward pass: batch_size, else 512 resident and 2048 streamed (each expert
  // read then serves four times the tokens; measured in docs/benchmarks.md).
  int batch() const { return batch_size > 0 ? batch_size : streaming() ? 2048 : 512; }
  // The routers predict (in the model) only where `predictor` asks for them.
  RoutingOptions routing() const { return {router_prefetch(), route_ahead, drop_cold}; }
  int router_prefetch() const { return predictor == Predictor::Affinity ? 0 : prefetch; }
  int affinity_prefetch() const { return predictor == Predictor::Router ? 0 : prefetch; }
  bool overlapping() const { return overlap || overlap_always; }
  bool adaptive_overlap() const { return overlap && !overlap_always; }
  bool lossy() const { return route_ahead > 0 || drop_cold > 0.0f || n_expert_used > 0; }
};

// The mode a run takes and why: the "mode:" line's words, which the server reports too.
struct ModeChoice {
  bool stream = false;
  std::string reason;  // e.g. "--moe-stream", or the sizes compared
  std::string line() const;  // "mode: streaming (reason)"
};

// What the automatic choice and the automatic budget keep free beside the model: working
// buffers, and a margin of a tenth of the available memory (at least 512 MiB) for everything
// else the system runs.
constexpr uint64_t kWorkingBufferBytes = 256ull << 20;
uint64_t memory_margin(uint64_t available);

// Chooses the mode `asked` leaves open: streaming when the model's files (all shards) and the
// context's KV cache, plus the working buffers and margin, exceed the available memory (the
// tighter of MemAvailable and the cgroup's room, see MemorySnapshot::available()); resident
// when they fit or when the available memory is unknown. A forced mode is kept, and a forced
// resident model that does not fit says so. Pure: `memory` is read by the caller.
ModeChoice choose_moe_mode(MoeMode asked, uint64_t model_bytes, uint64_t context_bytes, const MemorySnapshot& memory);

// What a run's contexts hold beside the weights, per the settings: what the mode choice and the
// automatic cache budget reserve, and no more than its sessions allocate.
struct ContextMemory {
  uint64_t kv = 0;         // every sequence's KV rows (--parallel: ctx_size rows in all)
  uint64_t recurrent = 0;  // per sequence a hybrid model's recurrent state twice: live, and the copy a rewind restores
  uint64_t row_copies = 0;  // per sequence the per-row copies of it a verification pass keeps (drafting)
  uint64_t mtp_head = 0;    // per sequence the MTP head's own KV rows and state, twice as the trunk's (--mtp)
  uint64_t total() const { return kv + recurrent + row_copies + mtp_head; }
};
ContextMemory context_memory(const RunConfig& c, const ModelConfig& cfg);
// Per-row copies of the recurrent state a session of the run keeps during a verification pass
// (InferenceState::set_row_state_limit): one per draft token up to kMaxRowStates when drafting
// (--draft N), none otherwise (a rewind then replays from the saved state).
int row_state_copies(const RunConfig& c);
// The most rows one decode step of the run feeds each layer: every sequence's next token and its
// drafts (--parallel x (1 + --draft)).
int step_rows(const RunConfig& c);
// The experts one layer's visit of such a step may route to (top-k per row, at most the layer's
// experts). The streaming store keeps buffers for them beyond its cache, so that a wide step
// recycles buffers instead of mapping fresh pages each layer.
int visit_experts(const RunConfig& c, const ModelConfig& cfg);
// The most experts one layer's visit holds at once: a decode step's (visit_experts) or a prompt
// chunk's (top-k per row of a --batch-size chunk, at most the layer's experts), whichever is
// wider. A visit's misses take buffers beside the cache until the layer is done, so the
// automatic budget leaves room for them.
int widest_visit_experts(const RunConfig& c, const ModelConfig& cfg);

// A model loaded as a RunConfig asks, with the settings it was loaded with.
struct LoadedRun {
  RunConfig config;
  ModeChoice mode;  // the mode config.moe_mode now holds, and why
  std::unique_ptr<LoadedModel> model;
  uint64_t cache_budget = 0;  // streaming expert cache, bytes (0 when resident)
  double load_seconds = 0;
};

// Chooses the mode (choose_moe_mode, from the model's header and read_memory()) and loads the
// model; when streaming, sizes the expert cache (the automatic budget: available memory, or the
// cgroup limit, minus the KV cache, working buffers, a margin and the prefetch staging area, and
// never more than holding every expert takes), attaches the streaming store and warm-starts it from
// config.cache_file. Prints the "mode:" and "load:" lines and any warnings on stderr. Throws Error
// on a model that does not load, on unreadable available memory under an automatic budget, and on a
// cache file that exists but is not one (it would be overwritten at the end).
LoadedRun load_run(const RunConfig& config);

// A session on the run's model with its context, batch, KV type, routing options and the
// row-state copies drafting needs (row_state_copies). `pool` must outlive it.
std::unique_ptr<Session> open_session(LoadedRun& run, ThreadPool& pool, const SamplerConfig& sampler = {});

// The draft settings. Throws Error where the model cannot draft as asked (--mtp), where a
// drafter is chosen without a draft length, or where the oracle file is unreadable.
DraftConfig draft_config(const LoadedRun& run);

// The chat template the run uses (config.chat_template, else the model's own); says on stderr
// when it falls back to a built-in format.
ChatTemplate chat_template_for(const LoadedRun& run);

// Prints the prefetch lines on stderr (streaming with prefetch or route-ahead only) and writes
// config.predict_log when asked.
void report_prefetch(LoadedRun& run);

// Saves the streaming cache's residents to config.cache_file (at the end of a run or a server's
// life); nothing when resident or without a cache file.
void save_cache_file(LoadedRun& run);

// The prompt and output token ids of an earlier `bmoe-cli --json` run (for --draft-oracle and
// --teacher-force); `flag` names the option in errors.
struct JsonRun {
  std::vector<int32_t> prompt;
  std::vector<int32_t> tokens;
};
JsonRun read_json_run(const std::string& path, const char* flag);
// Every run of a file of them: one object, or one per line (`bmoe-cli --parallel --json`'s
// output); read_json_run is the first.
std::vector<JsonRun> read_json_runs(const std::string& path, const char* flag);

}  // namespace bmoe
