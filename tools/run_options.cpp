#include "run_options.h"

#include <fmt/format.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <random>

#include "core/error.h"
#include "hf_download.h"
#include "io/mapped_file.h"
#include "moe/cache_policy.h"
#include "moe/overlap_chooser.h"
#include "chat/chat.h"
#include "chat/json_schema.h"

namespace bmoe {

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

namespace {

// The model, its threads, context and chat template.
void add_model_flags(CLI::App& app, RunOptions& o) {
  app.add_option("-m,--model", o.config.model, "GGUF model file (any shard of a split model)");
  app.add_option("--hf-repo", o.hf_repo, "-hf: download user/model[:quant] from Hugging Face into llama.cpp's cache and run it");
  app.add_option("--hf-file", o.hf_file, "with --hf-repo: the repository's file to use (default: by the quant tag)");
  app.add_option("-t,--threads", o.config.threads, "compute threads (default: all cores)")->check(CLI::Range(0, 512));
  app.add_option("-c,--ctx-size", o.config.ctx_size, "context size in tokens")->capture_default_str()->check(CLI::Range(16, 1 << 20));
  app.add_option("--parallel", o.config.parallel,
                 "sequences decoded at once, sharing each step's expert reads (-np; the context -c is split among them)")
      ->capture_default_str()->check(CLI::Range(1, 256));
  app.add_option("-b,--batch-size", o.config.batch_size, "prompt tokens per forward pass (default 512; 2048 streamed)")
      ->check(CLI::Range(1, 8192));
  app.add_option("--n-expert-used", o.config.n_expert_used, "override the model's top-k experts per token (lossy)")->check(CLI::Range(1, 1024));
  app.add_option("--kv-type", o.kv_type, "KV cache element type: f16 or f32")->capture_default_str()->check(CLI::IsMember({"f16", "f32"}));
  const auto template_choice = [](const std::string& v) {
    return chat_template_choice(v) == ChatTemplateChoice::Invalid ? chat_template_choice_error(v) : std::string();
  };
  app.add_option("--chat-template", o.config.chat_template,
                 "chat template: a built-in format (chatml, harmony, gemma, gemma4, llama3), a Jinja file or Jinja "
                 "text (default: the model's own tokenizer.chat_template)")->check(template_choice);
  app.add_option("--chat-template-file", o.config.chat_template, "a Jinja chat template file (as llama.cpp's flag)")
      ->check(CLI::ExistingFile);
  app.add_flag("--jinja")->description("accepted for llama.cpp compatibility: chat templates are always rendered with Jinja");
}

// Streaming: the mode, the expert cache, the reads and what is read ahead.
void add_streaming_flags(CLI::App& app, RunOptions& o) {
  auto* stream = app.add_flag("--moe-stream", o.moe_stream,
                              "read routed experts from flash on demand into a bounded cache (default: when the model "
                              "does not fit in available memory)");
  app.add_flag("--no-moe-stream", o.no_moe_stream,
               "map the whole model, experts included, even when it does not fit in available memory")
      ->excludes(stream);
  app.add_option("--dense-weights", o.dense_weights, "streaming: dense weights in anonymous memory (anon) or mapped (mmap)")
      ->capture_default_str()->check(CLI::IsMember({"anon", "mmap"}));
  app.add_option("--cache-mb", o.cache_mb, "streaming: expert cache budget in MiB, or auto (from free memory / cgroup limit)")
      ->capture_default_str();
  app.add_option("--cache-ceil-mb", o.cache_ceil_mb, "streaming: upper bound for --cache-mb auto")->check(CLI::Range(int64_t{0}, int64_t{1} << 40));
  app.add_option("--cache-policy", o.config.cache_policy,
                 fmt::format("streaming: expert cache policy ({}; default {})", [] {
                   std::string s;
                   for (const auto& n : cache_policy_names()) s += (s.empty() ? "" : ", ") + n;
                   return s;
                 }(), default_cache_policy()));
  app.add_option("--io-threads", o.config.io_threads, "streaming: parallel read lanes")->capture_default_str()->check(CLI::Range(1, 32));
  app.add_option("--io-engine", o.io_engine,
                 "streaming: who runs the reads: threads (one reader thread per lane) or uring (io_uring, no threads: "
                 "--io-threads then caps only reads ahead; falls back to threads where the kernel refuses it)")
      ->capture_default_str()
      ->check(CLI::IsMember({"threads", "uring"}));
  app.add_option("--read-chunk-kb", o.config.read_chunk_kb,
                 "streaming: target size of one read in KiB (a multiple of 4); an expert's matrices are split into "
                 "equal reads of about this size so that several lanes share one expert")
      ->capture_default_str()->check(CLI::Range(4, 65536))->check(CLI::Validator(
          [](const std::string& v) { return std::stoi(v) % 4 == 0 ? std::string() : v + " is not a multiple of 4"; },
          "MULTIPLE OF 4"));
  app.add_flag("--no-odirect", o.no_odirect, "streaming: buffered reads instead of O_DIRECT");
  app.add_flag("--overlap", o.config.overlap,
               fmt::format("streaming: compute resident experts while the missing ones are read; every {} passes a "
                           "probe alternates {} overlapped and {} serial passes and the faster mode is kept (output is "
                           "the same either way)",
                           OverlapChooser::kPeriod, OverlapChooser::kProbe, OverlapChooser::kProbe));
  app.add_flag("--overlap-always", o.config.overlap_always, "streaming: --overlap on every pass, without probing");
  app.add_option("--prefetch", o.config.prefetch,
                 "streaming: after each layer routes, predict the next N layers' experts and read them ahead on idle "
                 "lanes into a small staging area (lossless)")
      ->capture_default_str()->check(CLI::Range(0, 8));
  app.add_option("--predictor", o.predictor,
                 "streaming: what --prefetch predicts with: router (the next layers' routers applied to the current "
                 "hidden state), affinity (which experts followed this token's experts in earlier tokens, learned as "
                 "it runs), or both; each pauses itself while mostly wrong")
      ->capture_default_str()->check(CLI::IsMember({"router", "affinity", "both"}));
  app.add_flag("--no-early-reads", o.no_early_reads,
               "streaming: do not read the hash-routed layers' experts (deepseek4: known from the token ids) at "
               "the start of each pass; they are then read when their layer runs (output is the same either way)");
  app.add_option("--predict-log", o.config.predict_log, "streaming: write the prefetch predictions checked against the real routing (CSV)");
  app.add_option("--cache-file", o.config.cache_file,
                 "streaming: start with the experts listed in FILE read into the cache (if it exists and was saved for "
                 "this model), and save the cache's experts there at exit");
}

// The lossy knobs and speculative decoding.
void add_lossy_and_draft_flags(CLI::App& app, RunOptions& o) {
  app.add_option("--route-ahead", o.config.route_ahead,
                 "LOSSY: route each layer from the residual N layers earlier so its reads start early (decode only)")
      ->capture_default_str()->check(CLI::Range(0, 8));
  app.add_option("--drop-cold-experts", o.config.drop_cold,
                 "LOSSY: skip a routed expert that is not in memory when its router weight is below F x an even split "
                 "(1/k); the others are rescaled (decode only; the top expert is always kept)")
      ->capture_default_str()->check(finite_number() & CLI::Range(0.0f, 1.0f));
  app.add_option("--draft", o.config.draft,
                 "speculative decoding: verify up to N drafted tokens per forward pass (lossless, greedy or "
                 "seeded sampling; the length adapts and drafting pauses itself when few drafts are accepted)")
      ->capture_default_str()->check(CLI::Range(0, 32));
  app.add_flag("--ngram", o.config.ngram, "draft from n-gram matches in the prompt and the output so far (the default drafter)");
  app.add_option("--draft-ngram-max", o.config.ngram_max, "longest n-gram suffix looked up for a draft")
      ->capture_default_str()->check(CLI::Range(1, 64));
  app.add_option("--draft-oracle", o.config.draft_oracle,
                 "benchmark only: draft from the --json output of an earlier greedy run of the same prompt (still "
                 "lossless; measures verification with drafts that are right)");
  app.add_option("--draft-accept", o.config.draft_accept,
                 "benchmark only: with --draft-oracle, each oracle draft token is right with this probability (the "
                 "others are replaced by a wrong one, seeded by --draft-seed); with --mtp the head still runs and "
                 "is paid for, only its proposals are replaced")
      ->capture_default_str()->check(CLI::Range(0.0f, 1.0f));
  app.add_option("--draft-seed", o.config.draft_seed, "benchmark only: seed of --draft-accept's corruption")->capture_default_str();
  app.add_flag("--mtp", o.config.mtp,
               "draft with the model's multi-token-prediction (nextn) block: Qwen3.5/3.6 MoE, GLM-4.5/4.6, DeepSeek-V4 (needs --draft N)");
}

}  // namespace

void add_run_flags(CLI::App& app, RunOptions& o) {
  add_model_flags(app, o);
  add_streaming_flags(app, o);
  add_lossy_and_draft_flags(app, o);
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

// The combinations CLI11 cannot check: knobs that act only on a streamed model.
void check_combinations(const RunConfig& c) {
  if (c.model.empty()) fail("no model given (-m FILE)");
  // Asked for, not left to the automatic choice: a knob must not turn silent when the model fits.
  if ((c.prefetch > 0 || !c.predict_log.empty()) && !c.streaming()) fail("--prefetch/--predict-log need --moe-stream");
  if (!c.predict_log.empty() && c.prefetch == 0 && c.route_ahead == 0) fail("--predict-log needs --prefetch N (or --route-ahead N)");
  if (!c.cache_file.empty() && !c.streaming()) fail("--cache-file needs --moe-stream");
  if (c.sequence_ctx() < 16) fail("--parallel {}: a context of {} leaves {} tokens per sequence (raise -c)", c.parallel, c.ctx_size, c.sequence_ctx());
}

Predictor predictor_named(const std::string& name) {
  return name == "router" ? Predictor::Router : name == "affinity" ? Predictor::Affinity : Predictor::Both;
}

}  // namespace

// -hf / --hf-repo / --hf-file: the model's local path, downloaded when missing.
std::string hf_model(const RunOptions& o) {
  if (!o.hf_file.empty() && o.hf_repo.empty()) fail("--hf-file needs --hf-repo (or -hf) to name the repository");
  if (!o.config.model.empty()) fail("-m and -hf both name a model: give one");
#ifdef BMOE_HAVE_HTTPLIB
  return hf_fetch_model({o.hf_repo, o.hf_file});
#else
  fail("-hf: this build has no HTTP client (cpp-httplib was missing); download the file and pass -m");
#endif
}

RunConfig run_config(const RunOptions& o) {
  RunConfig c = o.config;
  if (!o.hf_repo.empty() || !o.hf_file.empty()) c.model = hf_model(o);
  c.moe_mode = o.moe_stream ? MoeMode::Stream : o.no_moe_stream ? MoeMode::Resident : MoeMode::Auto;
  check_combinations(c);
  if (o.cache_mb != "auto") c.cache_bytes = parse_mib(o.cache_mb, "--cache-mb");
  if (o.cache_ceil_mb >= 0) c.cache_ceiling_bytes = static_cast<uint64_t>(o.cache_ceil_mb) << 20;
  c.kv_type = o.kv_type == "f32" ? KvType::F32 : KvType::F16;
  c.dense_weights = o.dense_weights == "mmap" ? DenseWeights::Mmap : DenseWeights::Anon;
  c.io_engine = o.io_engine == "uring" ? IoEngine::Uring : IoEngine::Threads;
  c.odirect = !o.no_odirect;
  c.early_reads = !o.no_early_reads;
  c.predictor = predictor_named(o.predictor);
  return c;
}

}  // namespace bmoe
