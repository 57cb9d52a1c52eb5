#include "engine/run.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <iterator>
#include <optional>
#include <sstream>
#include <thread>

#include "core/cpu_features.h"
#include "core/error.h"
#include "core/progress.h"
#include "core/timer.h"
#include "io/mapped_file.h"
#include "model/arch.h"
#include "model/nextn_head.h"
#include "moe/cache_file.h"
#include "moe/cache_policy.h"
#include "moe/read_planner.h"
#include "telemetry/system.h"

namespace bmoe {

int RunConfig::thread_count() const {
  return threads > 0 ? threads : static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
}

namespace {

// Experts the predictors may read ahead for one layer: the routers' whole guess, the affinity
// predictor's few best (top-k / 2).
int affinity_reads(const RunConfig& c, const ModelConfig& cfg) {
  return c.affinity_prefetch() > 0 ? std::max(1, cfg.n_expert_used / 2) : 0;
}
int reads_ahead_per_layer(const RunConfig& c, const ModelConfig& cfg) {
  return (c.router_prefetch() > 0 || c.route_ahead > 0 ? cfg.n_expert_used : 0) + affinity_reads(c, cfg);
}

// The automatic budget: what memory (and the cgroup limit) allows after the dense weights,
// minus the KV cache, working buffers and a safety margin; and no more than holding every
// expert takes (`every_expert`), so that a model with memory to spare reserves only its experts.
// `visit_bytes`: the buffers the widest visit (a prompt chunk's, or a wide decode step's) holds
// beyond one row's (whose few the working buffers hold).
uint64_t auto_cache_budget(const RunConfig& c, const ContextMemory& context, uint64_t staging_bytes, uint64_t visit_bytes,
                           uint64_t every_expert) {
  const MemorySnapshot m = read_memory();
  const auto available = m.available();
  if (!available) fail("--cache-mb auto: cannot read available memory (/proc/meminfo); give --cache-mb N");
  const uint64_t margin = memory_margin(*available);
  const uint64_t kv_bytes = context.kv + context.recurrent, drafting = context.row_copies + context.mtp_head;
  const uint64_t reserve = kv_bytes + drafting + kWorkingBufferBytes + visit_bytes + margin + staging_bytes;
  uint64_t budget = *available > reserve ? *available - reserve : 0;
  if (c.cache_ceiling_bytes) budget = std::min(budget, *c.cache_ceiling_bytes);
  const bool capped = budget > every_expert;
  budget = std::min(budget, every_expert);
  fmt::print(stderr, "moe-cache: auto budget {} MiB = available {} MiB{} - KV {} MiB{} - buffers {} MiB - margin {} MiB{}{}{}\n",
             budget >> 20, *available >> 20,
             m.cgroup_limit ? fmt::format(" (cgroup limit {} MiB)", *m.cgroup_limit >> 20) : "", kv_bytes >> 20,
             drafting ? fmt::format(" - drafting {} MiB", (drafting + (1 << 20) - 1) >> 20) : "",
             (kWorkingBufferBytes + visit_bytes) >> 20, margin >> 20,
             staging_bytes ? fmt::format(" - prefetch staging {} MiB", staging_bytes >> 20) : "",
             c.cache_ceiling_bytes ? fmt::format(", ceiling {} MiB", *c.cache_ceiling_bytes >> 20) : "",
             capped ? fmt::format(", capped at all experts' {} MiB", every_expert >> 20) : "");
  return budget;
}

StreamingOptions streaming_options(const RunConfig& c, const ModelConfig& cfg, uint64_t cache_bytes, uint64_t staging) {
  StreamingOptions so;
  so.prefetch_bytes = staging;
  so.predict_log = !c.predict_log.empty();
  so.early_reads = c.early_reads;
  so.affinity_window = c.affinity_prefetch();
  so.affinity_reads = affinity_reads(c, cfg);
  so.top_k = cfg.n_expert_used;
  so.visit_experts = visit_experts(c, cfg);
  so.cache_bytes = cache_bytes;
  so.policy = c.cache_policy;
  so.io_threads = c.io_threads;
  so.io_engine = c.io_engine;
  so.read_chunk_bytes = static_cast<uint64_t>(c.read_chunk_kb) << 10;
  so.odirect = c.odirect;
  so.overlap = c.overlapping();
  so.overlap_adapt = c.adaptive_overlap();
  return so;
}

// The cache file at start: read the saved experts (budget permitting) before the first token.
void warm_start(const RunConfig& c, LoadedModel& model) {
  std::vector<ExpertKey> keys;
  std::string why;
  if (!read_cache_file(c.cache_file, model.expert_layout, keys, why)) {
    // It is overwritten at exit: never clobber something else (a model file given by mistake).
    if (why == kNotACacheFile) fail("--cache-file: {} exists and is not a bmoe expert-cache file; refusing to overwrite it", c.cache_file);
    fmt::print(stderr, "moe-cache: cold start ({}: {})\n", c.cache_file, why);
    return;
  }
  Stopwatch timer;
  const StreamingExperts::WarmStart w = model.streamer()->warm(keys);
  fmt::print(stderr, "moe-cache: warm start from {}: {} of {} experts, {} in {:.2f} s{}\n", c.cache_file, w.experts,
             keys.size(), format_bytes(w.bytes), timer.seconds(), w.failed ? fmt::format(" ({} reads failed)", w.failed) : "");
}

// A global LRU below one token cycle evicts each expert just before its reuse: say so.
void warn_lru_below_cycle(const StreamingOptions& so, const LoadedModel& model, int top_k) {
  const uint64_t cycle = model.expert_layout.token_cycle_bytes(top_k);
  if (so.policy == "lru" && so.cache_bytes > 0 && so.cache_bytes < cycle) {
    fmt::print(stderr,
               "warning: a global-LRU cache below one token cycle ({} MiB) evicts every expert just before its "
               "reuse (about 0 % hits); use the default policy ({}) or a larger --cache-mb\n",
               cycle >> 20, default_cache_policy());
  }
}

// Sizes the cache, attaches the streaming store and warm-starts it; returns the cache budget.
uint64_t stream_experts(const RunConfig& c, LoadedModel& model) {
  const ModelConfig& cfg = model.transformer->config();
  const uint64_t staging =
      prefetch_staging_bytes(model.expert_layout, reads_ahead_per_layer(c, cfg), std::max(c.prefetch, c.route_ahead)) +
      (c.early_reads ? early_read_staging_bytes(model.expert_layout, cfg, step_rows(c)) : 0);
  const uint64_t visit = expert_buffer_bytes(model.expert_layout, widest_visit_experts(c, cfg) - cfg.n_expert_used);
  const uint64_t budget = c.cache_bytes ? *c.cache_bytes
                                        : auto_cache_budget(c, context_memory(c, cfg), staging, visit,
                                                            ReadPlanner::every_expert_bytes(model.expert_layout));
  const StreamingOptions so = streaming_options(c, cfg, budget, staging);
  attach_streaming(model, so);
  for (const auto& note : model.streamer()->io_notes()) fmt::print(stderr, "warning: {}\n", note);
  if (!c.cache_file.empty()) warm_start(c, model);
  warn_lru_below_cycle(so, model, cfg.n_expert_used);
  return budget;
}

void print_load_line(const LoadedRun& run) {
  const RunConfig& c = run.config;
  const LoadedModel& model = *run.model;
  const ModelConfig& cfg = model.transformer->config();
  fmt::print(stderr, "load: {} ({}), {} layers, {} experts top-{}, {} threads, isa {}, experts {}, dense {}, {:.2f} s\n",
             c.model, cfg.arch, cfg.n_layer, cfg.n_expert, cfg.n_expert_used, c.thread_count(), active_isa_name(),
             model.experts->describe(), format_bytes(model.dense_bytes), run.load_seconds);
  if (c.route_ahead > 0 || c.drop_cold > 0.0f) {
    fmt::print(stderr, "warning: lossy knobs on ({}{}): output may differ from plain greedy decoding\n",
               c.route_ahead > 0 ? fmt::format("--route-ahead {}", c.route_ahead) : "",
               c.drop_cold > 0.0f ? fmt::format("{}--drop-cold-experts {}", c.route_ahead > 0 ? ", " : "", c.drop_cold) : "");
  }
}

// "model 18.5 GiB + KV 384 MiB > available 10.2 GiB (cgroup limit 11.0 GiB) - buffers 256 MiB -
// margin 1.0 GiB": the comparison choose_moe_mode made.
std::string fit_text(uint64_t model_bytes, uint64_t context_bytes, const MemorySnapshot& memory, bool fits) {
  const uint64_t available = *memory.available();
  return fmt::format("model {} + KV {} {} available {}{} - buffers {} - margin {}", format_bytes(model_bytes),
                     format_bytes(context_bytes), fits ? "<=" : ">", format_bytes(available),
                     memory.cgroup_limit ? fmt::format(" (cgroup limit {})", format_bytes(*memory.cgroup_limit)) : "",
                     format_bytes(kWorkingBufferBytes), format_bytes(memory_margin(available)));
}

// Chooses the mode from the model's header before loading it; prints the "mode:" line.
ModeChoice choose_mode_for(const RunConfig& c) {
  ModeChoice choice;
  if (c.moe_mode == MoeMode::Stream) {
    choice = choose_moe_mode(c.moe_mode, 0, 0, MemorySnapshot{});  // forced: no sizes to compare, no header read twice
  } else {
    const ModelPreview preview = preview_model(c.model);
    choice = choose_moe_mode(c.moe_mode, preview.file_bytes, context_memory(c, preview.config).total(), read_memory());
  }
  fmt::print(stderr, "{}\n", choice.line());
  return choice;
}

}  // namespace

int row_state_copies(const RunConfig& c) { return std::clamp(c.draft, 0, InferenceState::kMaxRowStates); }

int step_rows(const RunConfig& c) { return std::max(1, c.parallel) * (1 + std::max(0, c.draft)); }

int visit_experts(const RunConfig& c, const ModelConfig& cfg) {
  return static_cast<int>(std::min<int64_t>(cfg.n_expert, static_cast<int64_t>(cfg.n_expert_used) * step_rows(c)));
}

int widest_visit_experts(const RunConfig& c, const ModelConfig& cfg) {
  const int64_t chunk_rows = std::max(1, std::min(c.batch(), c.sequence_ctx()));
  const auto prompt = static_cast<int>(std::min<int64_t>(cfg.n_expert, cfg.n_expert_used * chunk_rows));
  return std::max(visit_experts(c, cfg), prompt);
}

ContextMemory context_memory(const RunConfig& c, const ModelConfig& cfg) {
  const uint64_t sequences = static_cast<uint64_t>(std::max(1, c.parallel));
  const uint64_t rows = static_cast<uint64_t>(c.sequence_ctx()) * sequences;
  const uint64_t kv_scale = c.kv_type == KvType::F32 ? 2 : 1;
  const uint64_t state = static_cast<uint64_t>(cfg.recurrent_state_bytes());
  ContextMemory m;
  m.kv = static_cast<uint64_t>(cfg.kv_bytes_per_token()) * rows * kv_scale;
  m.recurrent = 2 * state * sequences;
  m.row_copies = static_cast<uint64_t>(row_state_copies(c)) * static_cast<uint64_t>(row_copy_floats(cfg)) * 4 * sequences;
  if (c.mtp && cfg.n_nextn_layer > 0) {
    const ModelConfig head = nextn_block_config(cfg);
    m.mtp_head = static_cast<uint64_t>(head.kv_bytes_per_token()) * rows * kv_scale +
                 2 * static_cast<uint64_t>(head.recurrent_state_bytes()) * sequences;  // live, and the copy a ring keeps
  }
  return m;
}

uint64_t memory_margin(uint64_t available) { return std::max<uint64_t>(512ull << 20, available / 10); }

std::string ModeChoice::line() const { return fmt::format("mode: {} ({})", stream ? "streaming" : "resident", reason); }

ModeChoice choose_moe_mode(MoeMode asked, uint64_t model_bytes, uint64_t context_bytes, const MemorySnapshot& memory) {
  if (asked == MoeMode::Stream) return {true, "--moe-stream"};
  const std::optional<uint64_t> available = memory.available();
  if (!available) {
    return {false, asked == MoeMode::Resident ? "--no-moe-stream" : "available memory unknown; --moe-stream streams the experts"};
  }
  const uint64_t need = model_bytes + context_bytes + kWorkingBufferBytes + memory_margin(*available);
  const bool fits = need <= *available;
  const std::string sizes = fit_text(model_bytes, context_bytes, memory, fits);
  if (asked == MoeMode::Resident) {
    return {false, fits ? "--no-moe-stream" : "--no-moe-stream, though it does not fit: " + sizes + "; expect page faults"};
  }
  if (fits) return {false, sizes + "; --moe-stream streams anyway"};
  return {true, sizes + "; --no-moe-stream maps it whole"};
}

LoadedRun load_run(const RunConfig& config) {
  LoadedRun run;
  run.config = config;
  Stopwatch timer;
  run.mode = choose_mode_for(config);
  run.config.moe_mode = run.mode.stream ? MoeMode::Stream : MoeMode::Resident;
  LoadOptions load;
  load.n_expert_used = config.n_expert_used;
  load.nextn = config.mtp;
  load.stream_experts = run.mode.stream;
  load.dense = config.dense_weights;
  load.odirect = config.odirect;
  run.model = load_model(config.model, load);
  if (run.mode.stream) run.cache_budget = stream_experts(run.config, *run.model);
  run.load_seconds = timer.seconds();
  print_load_line(run);
  return run;
}

std::unique_ptr<Session> open_session(LoadedRun& run, ThreadPool& pool, const SamplerConfig& sampler) {
  const RunConfig& c = run.config;
  auto session = std::make_unique<Session>(*run.model, pool, c.sequence_ctx(), c.batch(), sampler, c.kv_type);
  session->state().set_routing_options(c.routing());
  session->state().set_row_state_limit(row_state_copies(c));
  return session;
}

DraftConfig draft_config(const LoadedRun& run) {
  const RunConfig& c = run.config;
  DraftConfig d;
  d.mtp = c.mtp;
  // The drafter is chosen once here, so that one the model cannot serve fails while the run is
  // prepared rather than inside the decode loop: --mtp on a model without a bound MTP block.
  if (c.mtp && !has_nextn_head(*run.model->transformer)) make_drafter(d, nullptr);
  if ((c.ngram || c.mtp || !c.draft_oracle.empty()) && c.draft == 0) {
    fail("--ngram/--mtp/--draft-oracle choose a drafter for --draft N; give --draft N too");
  }
  d.max_draft = c.draft;
  d.ngram_max = c.ngram_max;
  if (!c.draft_oracle.empty()) {
    const JsonRun oracle = read_json_run(c.draft_oracle, "--draft-oracle");
    d.oracle = oracle.prompt;
    d.oracle.insert(d.oracle.end(), oracle.tokens.begin(), oracle.tokens.end());
  }
  if (c.draft_accept < 1.0f && c.draft_oracle.empty()) fail("--draft-accept sets --draft-oracle's acceptance; give --draft-oracle FILE too");
  d.oracle_accept = c.draft_accept;
  d.oracle_seed = c.draft_seed;
  return d;
}

ChatTemplate chat_template_for(const LoadedRun& run) {
  const LoadedModel& model = *run.model;
  const Vocabulary& v = model.tokenizer->vocab();
  const auto token_text = [&](int32_t id) { return id >= 0 && id < static_cast<int32_t>(v.tokens.size()) ? v.tokens[static_cast<size_t>(id)] : std::string(); };
  const std::string& choice = run.config.chat_template;
  std::optional<std::string> file_text;
  if (chat_template_choice(choice) == ChatTemplateChoice::File) file_text = read_whole_file(choice, "chat template");
  std::string warning;
  const Architecture* family = find_architecture(model.transformer->config().arch);
  const std::string_view family_format = family && family->chat_format ? family->chat_format : "";
  ChatTemplate t = ChatTemplate::for_model(family_format, v.chat_template, choice,
                                           token_text(v.bos), token_text(v.eos), v.add_bos, &warning, file_text);
  if (!warning.empty()) fmt::print(stderr, "warning: {}\n", warning);
  return t;
}

namespace {

double percent(uint64_t part, uint64_t whole) {
  return whole ? 100.0 * static_cast<double>(part) / static_cast<double>(whole) : 0.0;
}

// "predicted N, X % right, read ahead R, used U (Y %)" for each predictor that predicted.
std::string prefetch_by_source(const StreamingExperts& s, const ExpertStats& st) {
  std::string out;
  for (int i = 0; i < kPredictionSources; ++i) {
    if (st.predicted_by[i] == 0) continue;
    const auto source = static_cast<PredictionSource>(i);
    out += fmt::format("{}{}: predicted {}, {:.1f} % right, read ahead {}, used {} ({:.1f} %){}", out.empty() ? "" : "; ",
                       prediction_source_name(source), st.predicted_by[i], percent(st.correct_by[i], st.predicted_by[i]),
                       st.prefetch_reads_by[i], st.prefetch_used_by[i],
                       percent(st.prefetch_used_by[i], st.prefetch_reads_by[i]),
                       s.prefetch_paused(source) ? ", paused at the end" : "");
  }
  return out;
}

// "1 layer ahead X %, 2 layers ahead Y %": accuracy by how far ahead the prediction was made.
std::string prefetch_by_distance(const ExpertStats& st) {
  std::string out;
  for (int d = 1; d <= ExpertStats::kMaxDistance; ++d) {
    if (st.predicted_at[d] == 0) continue;
    out += fmt::format("{}{} layer{} ahead {:.1f} %", out.empty() ? "" : ", ", d, d > 1 ? "s" : "",
                       100.0 * static_cast<double>(st.correct_at[d]) / static_cast<double>(st.predicted_at[d]));
  }
  return out;
}

void write_predict_log(const std::string& path, const StreamingExperts& s) {
  FILE* f = std::fopen(path.c_str(), "w");
  if (!f) fail("--predict-log: cannot write {}", path);
  std::fprintf(f, "token,layer,distance,predicted,correct,prefetched,predictor\n");
  for (const PredictionRecord& r : s.prediction_log()) {
    std::fprintf(f, "%llu,%d,%d,%d,%d,%d,%s\n", static_cast<unsigned long long>(r.token), r.layer, r.distance, r.predicted,
                 r.correct, r.prefetched, prediction_source_name(r.source));
  }
  if (std::fclose(f) != 0) fail("--predict-log: cannot write {}", path);
}

}  // namespace

void report_prefetch(LoadedRun& run) {
  const RunConfig& c = run.config;
  StreamingExperts* s = run.model->streamer();
  if (!s || (c.prefetch == 0 && c.route_ahead == 0)) return;
  const ExpertStats st = s->stats();
  fmt::print(stderr,
             "prefetch: predicted {} experts, {:.1f} % right; read ahead {}, used {} ({:.1f} %), wasted {:.1f} MiB\n",
             st.predicted, percent(st.predicted_correct, st.predicted), st.prefetch_reads, st.prefetch_used,
             percent(st.prefetch_used, st.prefetch_reads), static_cast<double>(st.prefetch_wasted_bytes) / (1 << 20));
  const std::string by_source = prefetch_by_source(*s, st);
  if (!by_source.empty()) fmt::print(stderr, "prefetch: by predictor {}\n", by_source);
  const std::string by_distance = prefetch_by_distance(st);
  if (!by_distance.empty()) fmt::print(stderr, "prefetch: prediction accuracy {}\n", by_distance);
  if (s->prefetch_paused(PredictionSource::Router) || s->prefetch_paused(PredictionSource::Affinity)) {
    fmt::print(stderr, "prefetch: a predictor paused at the end (predictions below 30 % right read only waste; it resumes above 45 %)\n");
  }
  if (!c.predict_log.empty()) write_predict_log(c.predict_log, *s);
}

void save_cache_file(LoadedRun& run) {
  StreamingExperts* s = run.model->streamer();
  const std::string& path = run.config.cache_file;
  if (path.empty() || s == nullptr) return;
  const std::vector<ExpertKey> keys = s->cache().residents();
  write_cache_file(path, run.model->expert_layout, keys);
  fmt::print(stderr, "moe-cache: saved {} experts to {}\n", keys.size(), path);
}

JsonRun read_json_run(const std::string& path, const char* flag) { return read_json_runs(path, flag).front(); }

std::vector<JsonRun> read_json_runs(const std::string& path, const char* flag) {
  std::ifstream in(path);
  if (!in) fail("{}: cannot read {}", flag, path);
  std::vector<JsonRun> runs;
  try {
    // One object (perhaps over several lines), else one per line.
    const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    std::vector<nlohmann::json> objects;
    if (nlohmann::json::accept(text)) {
      objects.push_back(nlohmann::json::parse(text));
    } else {
      std::istringstream lines(text);
      for (std::string line; std::getline(lines, line);) {
        if (line.find_first_not_of(" \t\r") != std::string::npos) objects.push_back(nlohmann::json::parse(line));
      }
    }
    for (const nlohmann::json& j : objects) {
      runs.push_back({j.at("prompt").get<std::vector<int32_t>>(), j.at("tokens").get<std::vector<int32_t>>()});
    }
  } catch (const nlohmann::json::exception& e) {
    fail("{}: {} is not bmoe-cli --json output ({})", flag, path, e.what());
  }
  if (runs.empty()) fail("{}: {} is not bmoe-cli --json output (empty)", flag, path);
  return runs;
}

}  // namespace bmoe
