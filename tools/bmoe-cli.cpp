// bmoe-cli: run a MoE GGUF model from the command line (llama.cpp-style flags), optionally
// streaming the routed experts from flash through a bounded cache.
#include <CLI/CLI.hpp>
#include <fmt/format.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <thread>

#include "core/cpu_features.h"
#include "core/error.h"
#include "core/progress.h"
#include "core/timer.h"
#include "engine/loader.h"
#include "engine/report.h"
#include "engine/routing.h"
#include "engine/session.h"
#include "model/arch.h"
#include "text/chat.h"
#include "text/utf8.h"

using namespace bmoe;

namespace {

struct CliOptions {
  std::string model;
  std::string prompt;
  std::string prompt_file;
  std::string prompt_ids;
  std::string system;
  int n_predict = 128;
  int threads = 0;
  int ctx_size = 4096;
  int batch_size = 512;
  uint64_t seed = 0xB30E;
  float temperature = 0.0f;
  int top_k = 40;
  float top_p = 0.95f;
  bool chatml = false;
  bool chat = false;
  bool no_think = false;
  bool ignore_eos = false;
  bool json = false;
  bool tokenize_only = false;
  bool show_special = false;
  bool list_archs = false;
  int n_expert_used = 0;
  std::string dump_logits;
  std::string kv_type = "f16";
  // Streaming.
  bool moe_stream = false;
  std::string dense_weights = "anon";
  std::string cache_mb = "auto";
  int64_t cache_ceil_mb = -1;
  std::string cache_policy;
  int io_threads = 4;
  bool no_odirect = false;
  bool overlap = false;
  // Telemetry and routing traces.
  std::string csv;
  std::string metrics;
  std::string route_trace;
  std::string route_replay;
  bool progress = false;
};

void add_flags(CLI::App& app, CliOptions& o) {
  app.add_option("-m,--model", o.model, "GGUF model file (any shard of a split model)");
  app.add_option("-p,--prompt", o.prompt, "prompt text");
  app.add_option("-f,--file", o.prompt_file, "read the prompt from a file");
  app.add_option("--prompt-ids", o.prompt_ids, "the prompt as comma-separated token ids (instead of -p)");
  app.add_option("-n,--n-predict", o.n_predict, "tokens to generate (-1: until end of text or context)")->capture_default_str();
  app.add_option("-t,--threads", o.threads, "compute threads (default: all cores)")->check(CLI::Range(0, 512));
  app.add_option("-c,--ctx-size", o.ctx_size, "context size in tokens")->capture_default_str()->check(CLI::Range(16, 1 << 20));
  app.add_option("-b,--batch-size", o.batch_size, "prompt tokens evaluated per batch")->capture_default_str()->check(CLI::Range(1, 8192));
  app.add_option("-s,--seed", o.seed, "sampling seed")->capture_default_str();
  app.add_option("--temp", o.temperature, "temperature (0 = greedy)")->capture_default_str()->check(CLI::Range(0.0, 100.0));
  app.add_option("--top-k", o.top_k, "top-k sampling (0 = off)")->capture_default_str()->check(CLI::Range(0, 1 << 24));
  app.add_option("--top-p", o.top_p, "top-p (nucleus) sampling (1 = off)")->capture_default_str()->check(CLI::Range(0.0, 1.0));
  app.add_flag("--chatml", o.chatml, "wrap the prompt in the ChatML template (<|im_start|>user ...)");
  app.add_flag("--chat", o.chat, "wrap the prompt in the model's own chat format (ChatML, harmony, Gemma)");
  app.add_option("--system", o.system, "system message for --chat/--chatml");
  app.add_flag("--no-think", o.no_think,
               "answer without reasoning: Qwen3 gets an empty think block; gpt-oss is primed into its final "
               "channel (faster, but costs quality on multi-step tasks such as arithmetic)");
  app.add_flag("--ignore-eos", o.ignore_eos, "keep generating past end-of-text tokens");
  app.add_flag("--special", o.show_special, "print special/control tokens in the output");
  app.add_flag("--json", o.json, "print a JSON result (prompt ids, generated ids, text) instead of streaming text");
  app.add_flag("--tokenize", o.tokenize_only, "print the prompt's token ids as JSON and exit");
  app.add_option("--n-expert-used", o.n_expert_used, "override the model's top-k experts per token (lossy)")->check(CLI::Range(1, 1024));
  app.add_option("--kv-type", o.kv_type, "KV cache element type: f16 or f32")->capture_default_str()->check(CLI::IsMember({"f16", "f32"}));
  app.add_option("--dump-logits", o.dump_logits, "write the logits after the prompt (f32, binary) to a file");
  app.add_flag("--list-archs", o.list_archs, "list the architectures compiled in and exit");

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
  app.add_flag("--no-odirect", o.no_odirect, "streaming: buffered reads instead of O_DIRECT");
  app.add_flag("--overlap", o.overlap, "streaming: compute resident experts while the missing ones are read");
  app.add_option("--csv", o.csv, "write one CSV row per decoded token (timings, experts, cache, bytes read)");
  app.add_option("--metrics", o.metrics, "write run metrics (peak RSS, MemAvailable floor, temperatures, config) as JSON");
  app.add_option("--route-trace", o.route_trace, "record every routing decision to a CSV trace");
  app.add_option("--route-replay", o.route_replay,
                 "BENCHMARK ONLY, LOSSY: force each step's routing from a recorded trace (changes the output)");
  app.add_flag("--progress", o.progress, "print a live per-token status line on stderr");
}

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) fail("cannot read prompt file {}", path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

std::vector<int32_t> parse_ids(const std::string& text, int vocab_size) {
  std::vector<int32_t> ids;
  std::stringstream ss(text);
  for (std::string item; std::getline(ss, item, ',');) {
    try {
      size_t used = 0;
      const long id = std::stol(item, &used);
      if (used != item.size() || id < 0 || id >= vocab_size) throw std::invalid_argument(item);
      ids.push_back(static_cast<int32_t>(id));
    } catch (const std::exception&) {
      fail("--prompt-ids: '{}' is not a token id of this model", item);
    }
  }
  return ids;
}

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
uint64_t auto_cache_budget(const CliOptions& o, LoadedModel& model, uint64_t kv_bytes) {
  const MemorySnapshot m = read_memory();
  const auto available = m.available();
  if (!available) fail("--cache-mb auto: cannot read available memory (/proc/meminfo); give --cache-mb N");
  const uint64_t scratch = 256ull << 20;
  const uint64_t margin = std::max<uint64_t>(512ull << 20, *available / 10);
  const uint64_t reserve = kv_bytes + scratch + margin;
  uint64_t budget = *available > reserve ? *available - reserve : 0;
  if (o.cache_ceil_mb >= 0) budget = std::min<uint64_t>(budget, static_cast<uint64_t>(o.cache_ceil_mb) << 20);
  fmt::print(stderr, "moe-cache: auto budget {} MiB = available {} MiB{} - KV {} MiB - buffers {} MiB - margin {} MiB{}\n",
             budget >> 20, *available >> 20,
             m.cgroup_limit ? fmt::format(" (cgroup limit {} MiB)", *m.cgroup_limit >> 20) : "", kv_bytes >> 20,
             scratch >> 20, margin >> 20, o.cache_ceil_mb >= 0 ? fmt::format(", ceiling {} MiB", o.cache_ceil_mb) : "");
  (void)model;
  return budget;
}

std::string config_json(const CliOptions& o, int threads, const LoadedModel& model, uint64_t budget) {
  nlohmann::json j;
  j["model"] = o.model;
  j["arch"] = model.arch;
  j["threads"] = threads;
  j["isa"] = active_isa_name();
  j["ctx_size"] = o.ctx_size;
  j["batch_size"] = o.batch_size;
  j["n_predict"] = o.n_predict;
  j["temperature"] = o.temperature;
  j["seed"] = o.seed;
  j["kv_type"] = o.kv_type;
  j["n_expert_used"] = model.transformer->config().n_expert_used;
  j["moe_stream"] = o.moe_stream;
  if (o.moe_stream) {
    j["dense_weights"] = o.dense_weights;
    j["cache_mb_requested"] = o.cache_mb;
    j["cache_budget_mib"] = budget >> 20;
    j["cache_policy"] = o.cache_policy.empty() ? default_cache_policy() : o.cache_policy;
    j["io_threads"] = o.io_threads;
    j["odirect"] = !o.no_odirect;
    j["overlap"] = o.overlap;
  }
  j["route_replay"] = o.route_replay;
  j["chatml"] = o.chatml || o.chat;
  j["no_think"] = o.no_think;
  return j.dump();
}

int run(const CliOptions& o) {
  if (o.list_archs) {
    for (const Architecture& a : architectures()) fmt::print("{:<10} {}\n", a.name, a.description);
    return 0;
  }
  if (o.model.empty()) fail("no model given (-m FILE)");
  std::string prompt = o.prompt;
  if (!o.prompt_file.empty()) prompt = read_file(o.prompt_file);
  const uint64_t fixed_budget = o.cache_mb == "auto" ? 0 : parse_mib(o.cache_mb, "--cache-mb");

  MemoryWatcher watcher;
  const auto thermal_start = read_thermal();
  const int threads = o.threads > 0 ? o.threads : static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  Stopwatch load_timer;
  LoadOptions load;
  load.n_expert_used = o.n_expert_used;
  load.stream_experts = o.moe_stream;
  load.dense = o.dense_weights == "mmap" ? DenseWeights::Mmap : DenseWeights::Anon;
  load.odirect = !o.no_odirect;
  auto model = load_model(o.model, load);
  const ModelConfig& cfg = model->transformer->config();

  uint64_t budget = 0;
  if (o.moe_stream) {
    const uint64_t kv_bytes = static_cast<uint64_t>(cfg.kv_bytes_per_token()) * static_cast<uint64_t>(o.ctx_size) *
                              (o.kv_type == "f32" ? 2 : 1);
    budget = o.cache_mb == "auto" ? auto_cache_budget(o, *model, kv_bytes) : fixed_budget;
    StreamingOptions so;
    so.cache_bytes = budget;
    so.policy = o.cache_policy;
    so.io_threads = o.io_threads;
    so.odirect = !o.no_odirect;
    so.overlap = o.overlap;
    attach_streaming(*model, so);
    for (const auto& note : model->streamer()->io_notes()) fmt::print(stderr, "warning: {}\n", note);
    const uint64_t cycle = model->expert_layout.token_cycle_bytes(cfg.n_expert_used);
    if (so.policy == "lru" && budget > 0 && budget < cycle) {
      fmt::print(stderr,
                 "warning: a global-LRU cache below one token cycle ({} MiB) evicts every expert just before its "
                 "reuse (about 0 % hits); use the default policy ({}) or a larger --cache-mb\n",
                 cycle >> 20, default_cache_policy());
    }
  }
  fmt::print(stderr, "load: {} ({}), {} layers, {} experts top-{}, {} threads, isa {}, experts {}, dense {}, {:.2f} s\n",
             o.model, cfg.arch, cfg.n_layer, cfg.n_expert, cfg.n_expert_used, threads, active_isa_name(),
             model->experts->describe(), format_bytes(model->dense_bytes), load_timer.seconds());
  const double load_seconds = load_timer.seconds();

  if (o.chatml || o.chat) {
    const ChatFormat format = o.chatml ? ChatFormat::ChatML
                                       : detect_chat_format(cfg.arch, model->tokenizer->vocab().chat_template);
    std::vector<ChatMessage> messages;
    if (!o.system.empty()) messages.push_back({"system", o.system});
    messages.push_back({"user", prompt});
    prompt = render_chat(format, messages, o.no_think);
  }

  ThreadPool pool(threads);
  SamplerConfig sampler{o.temperature, o.top_k, o.top_p, o.seed};
  Session session(*model, pool, o.ctx_size, o.batch_size, sampler, o.kv_type == "f32" ? KvType::F32 : KvType::F16);
  std::unique_ptr<RouteReplayer> replayer;
  std::unique_ptr<RouteRecorder> recorder;
  if (!o.route_replay.empty()) {
    replayer = std::make_unique<RouteReplayer>(o.route_replay, cfg);
    fmt::print(stderr, "route-replay: forcing routing from {} ({} prompt, {} decode steps; lossy, benchmark only)\n",
               o.route_replay, replayer->prompt_steps(), replayer->decode_steps());
  }
  if (!o.route_trace.empty()) recorder = std::make_unique<RouteRecorder>(o.route_trace, *model);
  if (replayer || recorder) {
    session.state().set_route_hook([&](RouteEvent& e) {
      if (replayer) replayer->on_route(e);
      if (recorder) recorder->on_route(e);
    });
  }

  const std::vector<int32_t> prompt_ids =
      o.prompt_ids.empty() ? session.tokenize(prompt, true) : parse_ids(o.prompt_ids, model->tokenizer->vocab_size());
  if (o.tokenize_only) {
    fmt::print("{}\n", nlohmann::json(prompt_ids).dump());
    return 0;
  }
  if (static_cast<int>(prompt_ids.size()) >= o.ctx_size) {
    fail("the prompt has {} tokens, more than the context of {} (raise -c)", prompt_ids.size(), o.ctx_size);
  }

  const PrefillRecord pre = session.prefill(prompt_ids);
  fmt::print(stderr, "prompt: {} tokens, {:.3f} s, {:.2f} tok/s\n", pre.tokens, pre.seconds, pre.tokens / std::max(pre.seconds, 1e-9));
  if (!o.dump_logits.empty()) {
    std::ofstream dump(o.dump_logits, std::ios::binary);
    dump.write(reinterpret_cast<const char*>(session.logits().data()), static_cast<std::streamsize>(cfg.n_vocab * sizeof(float)));
    if (!dump) fail("cannot write {}", o.dump_logits);
  }

  std::vector<int32_t> generated;
  Utf8Stream out;
  const int limit = o.n_predict < 0 ? o.ctx_size - static_cast<int>(prompt_ids.size()) : o.n_predict;
  const bool tty = ::isatty(STDERR_FILENO) != 0;
  for (int i = 0; i < limit; ++i) {
    const int32_t token = session.sample();
    if (!o.ignore_eos && model->tokenizer->is_end_of_generation(token)) break;
    generated.push_back(token);
    if (!o.json) {
      const std::string text = out.push(model->tokenizer->token_bytes(token, o.show_special));
      if (!text.empty()) {
        std::fwrite(text.data(), 1, text.size(), stdout);
        std::fflush(stdout);
      }
    }
    if (i + 1 >= limit || session.state().n_past() >= o.ctx_size) break;
    const TokenRecord& r = session.accept(token);
    if (o.progress) {
      const auto& recs = session.records();
      double wall = 0;
      uint64_t hits = 0, routed = 0, bytes = 0;
      double stall = 0;
      for (const auto& x : recs) {
        wall += x.wall_ms;
        hits += x.hits;
        routed += x.routed;
        bytes += x.bytes_read;
        stall += x.stall_ms;
      }
      const double n = static_cast<double>(recs.size());
      fmt::print(stderr, "{}[{}/{}] {:.2f} tok/s (this {:.0f} ms), hit {:.1f} %, read {:.1f} MiB/tok, stall {:.0f} ms/tok{}",
                 tty ? "\r" : "", recs.size(), limit, 1000.0 * n / std::max(wall, 1e-9), r.wall_ms,
                 routed ? 100.0 * static_cast<double>(hits) / static_cast<double>(routed) : 0.0,
                 static_cast<double>(bytes) / n / 1048576.0, stall / n, tty ? "   " : "\n");
    }
  }
  if (o.progress && tty) fmt::print(stderr, "\n");
  if (o.json) {
    nlohmann::json j;
    j["prompt"] = prompt_ids;
    j["tokens"] = generated;
    j["text"] = utf8_sanitize(model->tokenizer->decode(generated, o.show_special));
    fmt::print("{}\n", j.dump());
  } else {
    const std::string tail = out.flush();
    std::fwrite(tail.data(), 1, tail.size(), stdout);
    std::fputc('\n', stdout);
    std::fflush(stdout);
  }

  const ExpertStats final_stats = model->experts->stats();
  const RunSummary summary = summarize(session.records(), o.overlap, final_stats);
  fmt::print(stderr, "{}", summary_lines(summary, o.moe_stream, o.io_threads, budget));
  if (!o.csv.empty()) write_token_csv(o.csv, session.records());
  if (!o.metrics.empty()) {
    MetricsInput mi;
    mi.version = BMOE_VERSION;
    mi.config_json = config_json(o, threads, *model, budget);
    mi.summary = summary;
    mi.end_memory = read_memory();
    mi.available_floor = watcher.available_floor();
    mi.mem_available_floor = watcher.mem_available_floor();
    mi.thermal_start = thermal_start;
    mi.thermal_end = read_thermal();
    mi.max_celsius = watcher.max_celsius();
    mi.load_seconds = load_seconds;
    mi.prompt_seconds = pre.seconds;
    mi.prompt_tokens = pre.tokens;
    write_metrics(o.metrics, mi);
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"bmoe-cli: run Mixture-of-Experts GGUF models, streaming experts from flash"};
  CliOptions options;
  add_flags(app, options);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    if (e.get_exit_code() == 0) return app.exit(e);
    fmt::print(stderr, "error: {}\n", e.what());
    return 2;
  }
  try {
    return run(options);
  } catch (const std::exception& e) {
    fmt::print(stderr, "error: {}\n", e.what());
    return 1;
  }
}
