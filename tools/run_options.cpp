#include "run_options.h"

#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>
#include <thread>

#include "core/cpu_features.h"
#include "core/error.h"
#include "io/mapped_file.h"
#include "core/progress.h"
#include "core/timer.h"
#include "moe/cache_file.h"
#include "moe/cache_policy.h"
#include "moe/overlap_chooser.h"
#include "telemetry/system.h"
#include "text/json_schema.h"

namespace bmoe {

int RunOptions::thread_count() const {
  return threads > 0 ? threads : static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
}

CLI::Validator finite_number() {
  return CLI::Validator(
      [](std::string& value) -> std::string {
        try {
          size_t used = 0;
          const double v = std::stod(value, &used);
          if (used == value.size() && std::isfinite(v)) return {};
        } catch (const std::exception&) {
        }
        return "must be a finite number, got " + value;
      },
      "FINITE");
}

uint64_t random_seed() {
  std::random_device device;
  return (static_cast<uint64_t>(device()) << 32 | device()) & 0x7fffffffffffffffull;  // -s takes it back
}

void check_output_path(const std::string& path, const std::string& flag) {
  if (path.empty()) return;
  namespace fs = std::filesystem;
  const fs::path p(path);
  const fs::path dir = p.has_parent_path() ? p.parent_path() : fs::path(".");
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) fail("{} {}: folder {} does not exist", flag, path, dir.string());
  if (fs::exists(p, ec)) {
    if (!fs::is_regular_file(p, ec)) fail("{} {}: exists and is not a regular file", flag, path);
    if (::access(path.c_str(), W_OK) != 0) fail("{} {}: not writable", flag, path);
  } else if (::access(dir.c_str(), W_OK) != 0) {
    fail("{} {}: folder {} is not writable", flag, path, dir.string());
  }
}

ChatTemplate chat_template_for(const RunOptions& o, const LoadedModel& model) {
  const Vocabulary& v = model.tokenizer->vocab();
  const auto token_text = [&](int32_t id) { return id >= 0 && id < static_cast<int32_t>(v.tokens.size()) ? v.tokens[static_cast<size_t>(id)] : std::string(); };
  std::string warning;
  ChatTemplate t = ChatTemplate::for_model(model.transformer->config().arch, v.chat_template, o.chat_template,
                                           token_text(v.bos), token_text(v.eos), v.add_bos, &warning);
  if (!warning.empty()) fmt::print(stderr, "warning: {}\n", warning);
  return t;
}

void add_sampling_flags(CLI::App& app, SamplerConfig& c, double max_temperature) {
  app.add_option("--temp", c.temperature, "temperature (0 = greedy)")->capture_default_str()->check(finite_number() & CLI::Range(0.0, max_temperature));
  app.add_option("--top-k", c.top_k, "top-k sampling (0 = off)")->capture_default_str()->check(CLI::Range(0, 1 << 24));
  app.add_option("--top-p", c.top_p, "top-p (nucleus) sampling (1 = off)")->capture_default_str()->check(finite_number() & CLI::Range(0.0, 1.0));
  app.add_option("--min-p", c.min_p, "min-p sampling: keep tokens at least this times as likely as the best (0 = off)")
      ->capture_default_str()->check(finite_number() & CLI::Range(0.0, 1.0));
  app.add_option("--presence-penalty", c.presence_penalty, "subtract from the logit of each token already in the answer")
      ->capture_default_str()->check(finite_number() & CLI::Range(-2.0, 2.0));
  app.add_option("--frequency-penalty", c.frequency_penalty, "subtract this times the count of each token in the answer")
      ->capture_default_str()->check(finite_number() & CLI::Range(-2.0, 2.0));
  app.add_option("--repeat-penalty", c.repeat_penalty, "penalize the tokens of the last --repeat-last-n (1 = off)")
      ->capture_default_str()->check(finite_number() & CLI::Range(0.01, 10.0));
  app.add_option("--repeat-last-n", c.repeat_last_n, "tokens --repeat-penalty looks back over, prompt included (-1: all, 0: off)")
      ->capture_default_str()->check(CLI::Range(-1, 1 << 24));
}

void add_grammar_flags(CLI::App& app, GrammarOptions& o) {
  app.add_option("--grammar", o.grammar, "constrain the output to this GBNF grammar (llama.cpp's format)");
  app.add_option("--grammar-file", o.grammar_file, "read the --grammar from a file");
  app.add_option("-j,--json-schema", o.json_schema, "constrain the output to JSON valid against this schema");
  app.add_option("--json-schema-file", o.json_schema_file, "read the --json-schema from a file");
}

std::shared_ptr<const Grammar> grammar_from_flags(const GrammarOptions& o) {
  std::vector<std::pair<std::string, std::string>> given;  // flag -> GBNF
  auto schema_gbnf = [](const std::string& text, const char* flag) {
    const auto schema = nlohmann::ordered_json::parse(text, nullptr, false);
    if (schema.is_discarded() || !schema.is_object()) fail("{}: not a JSON schema object", flag);
    try {
      return json_schema_to_gbnf(schema);
    } catch (const Error& e) {
      fail("{}: {}", flag, e.what());
    }
  };
  if (!o.grammar.empty()) given.emplace_back("--grammar", o.grammar);
  if (!o.grammar_file.empty()) given.emplace_back("--grammar-file", read_whole_file(o.grammar_file, "--grammar-file"));
  if (!o.json_schema.empty()) given.emplace_back("--json-schema", schema_gbnf(o.json_schema, "--json-schema"));
  if (!o.json_schema_file.empty()) {
    given.emplace_back("--json-schema-file",
                       schema_gbnf(read_whole_file(o.json_schema_file, "--json-schema-file"), "--json-schema-file"));
  }
  if (given.empty()) return nullptr;
  if (given.size() > 1) fail("{} and {} cannot be combined", given[0].first, given[1].first);
  try {
    return Grammar::parse(given[0].second);
  } catch (const Error& e) {
    fail("{}: {}", given[0].first, e.what());
  }
}

void add_run_flags(CLI::App& app, RunOptions& o) {
  app.add_option("-m,--model", o.model, "GGUF model file (any shard of a split model)");
  app.add_option("-t,--threads", o.threads, "compute threads (default: all cores)")->check(CLI::Range(0, 512));
  app.add_option("-c,--ctx-size", o.ctx_size, "context size in tokens")->capture_default_str()->check(CLI::Range(16, 1 << 20));
  app.add_option("-b,--batch-size", o.batch_size, "prompt tokens per forward pass (default 512; 2048 with --moe-stream)")
      ->check(CLI::Range(1, 8192));
  app.add_option("--n-expert-used", o.n_expert_used, "override the model's top-k experts per token (lossy)")->check(CLI::Range(1, 1024));
  app.add_option("--kv-type", o.kv_type, "KV cache element type: f16 or f32")->capture_default_str()->check(CLI::IsMember({"f16", "f32"}));
  const auto template_choice = [](const std::string& v) {
    return chat_template_choice(v) == ChatTemplateChoice::Invalid ? chat_template_choice_error(v) : std::string();
  };
  app.add_option("--chat-template", o.chat_template,
                 "chat template: a built-in format (chatml, harmony, gemma, gemma4, llama3), a Jinja file or Jinja "
                 "text (default: the model's own tokenizer.chat_template)")->check(template_choice);
  app.add_option("--chat-template-file", o.chat_template, "a Jinja chat template file (as llama.cpp's flag)")
      ->check(CLI::ExistingFile);
  app.add_flag("--jinja")->description("accepted for llama.cpp compatibility: chat templates are always rendered with Jinja");
  app.add_flag("--moe-stream", o.moe_stream, "read routed experts from flash on demand instead of mapping the whole model");
  app.add_option("--dense-weights", o.dense_weights, "streaming: dense weights in anonymous memory (anon) or mapped (mmap)")
      ->capture_default_str()->check(CLI::IsMember({"anon", "mmap"}));
  app.add_option("--cache-mb", o.cache_mb, "streaming: expert cache budget in MiB, or auto (from free memory / cgroup limit)")
      ->capture_default_str();
  app.add_option("--cache-ceil-mb", o.cache_ceil_mb, "streaming: upper bound for --cache-mb auto")->check(CLI::Range(int64_t{0}, int64_t{1} << 40));
  app.add_option("--cache-policy", o.cache_policy,
                 fmt::format("streaming: expert cache policy ({}; default {})", [] {
                   std::string s;
                   for (const auto& n : cache_policy_names()) s += (s.empty() ? "" : ", ") + n;
                   return s;
                 }(), default_cache_policy()));
  app.add_option("--io-threads", o.io_threads, "streaming: parallel read lanes")->capture_default_str()->check(CLI::Range(1, 32));
  app.add_option("--io-engine", o.io_engine,
                 "streaming: who runs the reads: threads (one reader thread per lane) or uring (io_uring, no threads: "
                 "--io-threads then caps only reads ahead; falls back to threads where the kernel refuses it)")
      ->capture_default_str()
      ->check(CLI::IsMember({"threads", "uring"}));
  app.add_option("--read-chunk-kb", o.read_chunk_kb,
                 "streaming: target size of one read in KiB (a multiple of 4); an expert's matrices are split into "
                 "equal reads of about this size so that several lanes share one expert")
      ->capture_default_str()->check(CLI::Range(4, 65536))->check(CLI::Validator(
          [](const std::string& v) { return std::stoi(v) % 4 == 0 ? std::string() : v + " is not a multiple of 4"; },
          "MULTIPLE OF 4"));
  app.add_flag("--no-odirect", o.no_odirect, "streaming: buffered reads instead of O_DIRECT");
  app.add_flag("--overlap", o.overlap,
               fmt::format("streaming: compute resident experts while the missing ones are read; every {} passes a "
                           "probe alternates {} overlapped and {} serial passes and the faster mode is kept (output is "
                           "the same either way)",
                           OverlapChooser::kPeriod, OverlapChooser::kProbe, OverlapChooser::kProbe));
  app.add_flag("--overlap-always", o.overlap_always, "streaming: --overlap on every pass, without probing");
  app.add_option("--prefetch", o.prefetch,
                 "streaming: after each layer routes, predict the next N layers' experts and read them ahead on idle "
                 "lanes into a small staging area (lossless)")
      ->capture_default_str()->check(CLI::Range(0, 8));
  app.add_option("--predictor", o.predictor,
                 "streaming: what --prefetch predicts with: router (the next layers' routers applied to the current "
                 "hidden state), affinity (which experts followed this token's experts in earlier tokens, learned as "
                 "it runs), or both; each pauses itself while mostly wrong")
      ->capture_default_str()->check(CLI::IsMember({"router", "affinity", "both"}));
  app.add_option("--predict-log", o.predict_log, "streaming: write the prefetch predictions checked against the real routing (CSV)");
  app.add_option("--cache-file", o.cache_file,
                 "streaming: start with the experts listed in FILE read into the cache (if it exists and was saved for "
                 "this model), and save the cache's experts there at exit");
  app.add_option("--route-ahead", o.route_ahead,
                 "LOSSY: route each layer from the residual N layers earlier so its reads start early (decode only)")
      ->capture_default_str()->check(CLI::Range(0, 8));
  app.add_option("--drop-cold-experts", o.drop_cold,
                 "LOSSY: skip a routed expert that is not in memory when its router weight is below F x an even split "
                 "(1/k); the others are rescaled (decode only; the top expert is always kept)")
      ->capture_default_str()->check(finite_number() & CLI::Range(0.0f, 1.0f));
  app.add_option("--draft", o.draft,
                 "speculative decoding: verify up to N drafted tokens per forward pass (lossless; greedy sampling "
                 "only; the length adapts and drafting pauses itself when few drafts are accepted)")
      ->capture_default_str()->check(CLI::Range(0, 32));
  app.add_flag("--ngram", o.ngram, "draft from n-gram matches in the prompt and the output so far (the default drafter)");
  app.add_option("--draft-ngram-max", o.ngram_max, "longest n-gram suffix looked up for a draft")
      ->capture_default_str()->check(CLI::Range(1, 64));
  app.add_option("--draft-oracle", o.draft_oracle,
                 "benchmark only: draft from the --json output of an earlier greedy run of the same prompt (still "
                 "lossless; measures verification with drafts that are right)");
  app.add_flag("--mtp", o.mtp, "draft with the model's multi-token-prediction head (needs a GGUF that has one)");
}

DraftConfig RunOptions::draft_config(const ModelConfig& config) const {
  if (mtp) {
    fail("--mtp: bmoe does not run multi-token-prediction (nextn) heads (a {} GGUF's are skipped when present); "
         "use --draft N --ngram", config.arch);
  }
  if ((ngram || mtp || !draft_oracle.empty()) && draft == 0) {
    fail("--ngram/--mtp/--draft-oracle choose a drafter for --draft N; give --draft N too");
  }
  DraftConfig d;
  d.max_draft = draft;
  d.ngram_max = ngram_max;
  if (!draft_oracle.empty()) {
    const JsonRun run = read_json_run(draft_oracle, "--draft-oracle");
    d.oracle = run.prompt;
    d.oracle.insert(d.oracle.end(), run.tokens.begin(), run.tokens.end());
  }
  return d;
}

JsonRun read_json_run(const std::string& path, const char* flag) {
  std::ifstream in(path);
  if (!in) fail("{}: cannot read {}", flag, path);
  try {
    const nlohmann::json j = nlohmann::json::parse(in);
    return {j.at("prompt").get<std::vector<int32_t>>(), j.at("tokens").get<std::vector<int32_t>>()};
  } catch (const nlohmann::json::exception& e) {
    fail("{}: {} is not bmoe-cli --json output ({})", flag, path, e.what());
  }
}

namespace {

uint64_t parse_mib(const std::string& text, const char* flag) {
  try {
    size_t used = 0;
    const long long v = std::stoll(text, &used);
    if (used != text.size() || v < 0) throw std::invalid_argument(text);
    return static_cast<uint64_t>(v) << 20;
  } catch (const std::exception&) {
    fail("{} expects a number of MiB or 'auto', got '{}'", flag, text);
  }
}

// --cache-mb auto: what memory (and the cgroup limit) allows after the dense weights, minus
// the KV cache, working buffers and a safety margin.
uint64_t auto_cache_budget(const RunOptions& o, uint64_t kv_bytes, uint64_t staging_bytes) {
  const MemorySnapshot m = read_memory();
  const auto available = m.available();
  if (!available) fail("--cache-mb auto: cannot read available memory (/proc/meminfo); give --cache-mb N");
  const uint64_t scratch = 256ull << 20;
  const uint64_t margin = std::max<uint64_t>(512ull << 20, *available / 10);
  const uint64_t reserve = kv_bytes + scratch + margin + staging_bytes;
  uint64_t budget = *available > reserve ? *available - reserve : 0;
  if (o.cache_ceil_mb >= 0) budget = std::min<uint64_t>(budget, static_cast<uint64_t>(o.cache_ceil_mb) << 20);
  fmt::print(stderr, "moe-cache: auto budget {} MiB = available {} MiB{} - KV {} MiB - buffers {} MiB - margin {} MiB{}{}\n",
             budget >> 20, *available >> 20,
             m.cgroup_limit ? fmt::format(" (cgroup limit {} MiB)", *m.cgroup_limit >> 20) : "", kv_bytes >> 20,
             scratch >> 20, margin >> 20,
             staging_bytes ? fmt::format(" - prefetch staging {} MiB", staging_bytes >> 20) : "", o.cache_ceil_mb >= 0 ? fmt::format(", ceiling {} MiB", o.cache_ceil_mb) : "");
  return budget;
}

}  // namespace

void report_prefetch(const RunOptions& o, LoadedModel& model) {
  StreamingExperts* s = model.streamer();
  if (!s || (o.prefetch == 0 && o.route_ahead == 0)) return;
  const ExpertStats st = s->stats();
  const auto percent = [](uint64_t part, uint64_t whole) {
    return whole ? 100.0 * static_cast<double>(part) / static_cast<double>(whole) : 0.0;
  };
  fmt::print(stderr,
             "prefetch: predicted {} experts, {:.1f} % right; read ahead {}, used {} ({:.1f} %), wasted {:.1f} MiB\n",
             st.predicted, percent(st.predicted_correct, st.predicted), st.prefetch_reads, st.prefetch_used,
             percent(st.prefetch_used, st.prefetch_reads), static_cast<double>(st.prefetch_wasted_bytes) / (1 << 20));
  std::string by_source;
  for (int i = 0; i < kPredictionSources; ++i) {
    if (st.predicted_by[i] == 0) continue;
    const auto source = static_cast<PredictionSource>(i);
    by_source += fmt::format("{}{}: predicted {}, {:.1f} % right, read ahead {}, used {} ({:.1f} %){}",
                             by_source.empty() ? "" : "; ", prediction_source_name(source), st.predicted_by[i],
                             percent(st.correct_by[i], st.predicted_by[i]), st.prefetch_reads_by[i], st.prefetch_used_by[i],
                             percent(st.prefetch_used_by[i], st.prefetch_reads_by[i]),
                             s->prefetch_paused(source) ? ", paused at the end" : "");
  }
  if (!by_source.empty()) fmt::print(stderr, "prefetch: by predictor {}\n", by_source);
  std::string by_distance;
  for (int d = 1; d <= ExpertStats::kMaxDistance; ++d) {
    if (st.predicted_at[d] == 0) continue;
    by_distance += fmt::format("{}{} layer{} ahead {:.1f} %", by_distance.empty() ? "" : ", ", d, d > 1 ? "s" : "",
                               100.0 * static_cast<double>(st.correct_at[d]) / static_cast<double>(st.predicted_at[d]));
  }
  if (!by_distance.empty()) fmt::print(stderr, "prefetch: prediction accuracy {}\n", by_distance);
  if (s->prefetch_paused(PredictionSource::Router) || s->prefetch_paused(PredictionSource::Affinity)) {
    fmt::print(stderr, "prefetch: a predictor paused at the end (predictions below 30 % right read only waste; it resumes above 45 %)\n");
  }
  if (o.predict_log.empty()) return;
  FILE* f = std::fopen(o.predict_log.c_str(), "w");
  if (!f) fail("--predict-log: cannot write {}", o.predict_log);
  std::fprintf(f, "token,layer,distance,predicted,correct,prefetched,predictor\n");
  for (const PredictionRecord& r : s->prediction_log()) {
    std::fprintf(f, "%llu,%d,%d,%d,%d,%d,%s\n", static_cast<unsigned long long>(r.token), r.layer, r.distance, r.predicted,
                 r.correct, r.prefetched, prediction_source_name(r.source));
  }
  if (std::fclose(f) != 0) fail("--predict-log: cannot write {}", o.predict_log);
}

namespace {

// --cache-file at start: read the saved experts (budget permitting) before the first token.
void warm_start(const RunOptions& o, LoadedModel& model) {
  std::vector<ExpertKey> keys;
  std::string why;
  if (!read_cache_file(o.cache_file, model.expert_layout, keys, why)) {
    // It is overwritten at exit: never clobber something else (a model file given by mistake).
    if (why == kNotACacheFile) fail("--cache-file: {} exists and is not a bmoe expert-cache file; refusing to overwrite it", o.cache_file);
    fmt::print(stderr, "moe-cache: cold start ({}: {})\n", o.cache_file, why);
    return;
  }
  Stopwatch timer;
  const StreamingExperts::WarmStart w = model.streamer()->warm(keys);
  fmt::print(stderr, "moe-cache: warm start from {}: {} of {} experts, {} in {:.2f} s{}\n", o.cache_file, w.experts,
             keys.size(), format_bytes(w.bytes), timer.seconds(), w.failed ? fmt::format(" ({} reads failed)", w.failed) : "");
}

}  // namespace

void save_cache_file(const RunOptions& o, LoadedModel& model) {
  StreamingExperts* s = model.streamer();
  if (o.cache_file.empty() || s == nullptr) return;
  const std::vector<ExpertKey> keys = s->cache().residents();
  write_cache_file(o.cache_file, model.expert_layout, keys);
  fmt::print(stderr, "moe-cache: saved {} experts to {}\n", keys.size(), o.cache_file);
}

LoadedRun load_run(const RunOptions& o) {
  if (o.model.empty()) fail("no model given (-m FILE)");
  if ((o.prefetch > 0 || !o.predict_log.empty()) && !o.moe_stream) fail("--prefetch/--predict-log need --moe-stream");
  if (!o.predict_log.empty() && o.prefetch == 0 && o.route_ahead == 0) fail("--predict-log needs --prefetch N (or --route-ahead N)");
  if (!o.cache_file.empty() && !o.moe_stream) fail("--cache-file needs --moe-stream");
  const uint64_t fixed_budget = o.cache_mb == "auto" ? 0 : parse_mib(o.cache_mb, "--cache-mb");
  LoadedRun run;
  Stopwatch timer;
  LoadOptions load;
  load.n_expert_used = o.n_expert_used;
  load.stream_experts = o.moe_stream;
  load.dense = o.dense_weights == "mmap" ? DenseWeights::Mmap : DenseWeights::Anon;
  load.odirect = !o.no_odirect;
  run.model = load_model(o.model, load);
  LoadedModel& model = *run.model;
  const ModelConfig& cfg = model.transformer->config();
  if (o.moe_stream) {
    // The KV cache, and a hybrid model's recurrent state twice (the live one and the copy a
    // rewind restores).
    const uint64_t kv_bytes = static_cast<uint64_t>(cfg.kv_bytes_per_token()) * static_cast<uint64_t>(o.ctx_size) *
                                  (o.kv_type == "f32" ? 2 : 1) +
                              2 * static_cast<uint64_t>(cfg.recurrent_state_bytes());
    // Room for what may be read ahead per predicted layer: the routers' whole guess, the
    // affinity predictor's few best (top-k / 2).
    const int affinity_reads = o.affinity_prefetch() > 0 ? std::max(1, cfg.n_expert_used / 2) : 0;
    const int ahead_per_layer = (o.router_prefetch() > 0 || o.route_ahead > 0 ? cfg.n_expert_used : 0) + affinity_reads;
    const uint64_t staging =
        prefetch_staging_bytes(model.expert_layout, ahead_per_layer, std::max(o.prefetch, o.route_ahead));
    run.cache_budget = o.cache_mb == "auto" ? auto_cache_budget(o, kv_bytes, staging) : fixed_budget;
    StreamingOptions so;
    so.prefetch_bytes = staging;
    so.predict_log = !o.predict_log.empty();
    so.affinity_window = o.affinity_prefetch();
    so.affinity_reads = affinity_reads;
    so.top_k = cfg.n_expert_used;
    so.cache_bytes = run.cache_budget;
    so.policy = o.cache_policy;
    so.io_threads = o.io_threads;
    so.io_engine = o.io_engine == "uring" ? IoEngine::Uring : IoEngine::Threads;
    so.read_chunk_bytes = static_cast<uint64_t>(o.read_chunk_kb) << 10;
    so.odirect = !o.no_odirect;
    so.overlap = o.overlapping();
    so.overlap_adapt = o.adaptive_overlap();
    attach_streaming(model, so);
    for (const auto& note : model.streamer()->io_notes()) fmt::print(stderr, "warning: {}\n", note);
    if (!o.cache_file.empty()) warm_start(o, model);
    const uint64_t cycle = model.expert_layout.token_cycle_bytes(cfg.n_expert_used);
    if (so.policy == "lru" && run.cache_budget > 0 && run.cache_budget < cycle) {
      fmt::print(stderr,
                 "warning: a global-LRU cache below one token cycle ({} MiB) evicts every expert just before its "
                 "reuse (about 0 % hits); use the default policy ({}) or a larger --cache-mb\n",
                 cycle >> 20, default_cache_policy());
    }
  }
  run.load_seconds = timer.seconds();
  fmt::print(stderr, "load: {} ({}), {} layers, {} experts top-{}, {} threads, isa {}, experts {}, dense {}, {:.2f} s\n",
             o.model, cfg.arch, cfg.n_layer, cfg.n_expert, cfg.n_expert_used, o.thread_count(), active_isa_name(),
             model.experts->describe(), format_bytes(model.dense_bytes), run.load_seconds);
  if (o.route_ahead > 0 || o.drop_cold > 0.0f) {
    fmt::print(stderr, "warning: lossy knobs on ({}{}): output may differ from plain greedy decoding\n",
               o.route_ahead > 0 ? fmt::format("--route-ahead {}", o.route_ahead) : "",
               o.drop_cold > 0.0f ? fmt::format("{}--drop-cold-experts {}", o.route_ahead > 0 ? ", " : "", o.drop_cold) : "");
  }
  return run;
}

}  // namespace bmoe
