// bmoe-cli: run a MoE GGUF model from the command line (llama.cpp-style flags), optionally
// streaming the routed experts from flash through a bounded cache.
#include <CLI/CLI.hpp>
#include <fmt/format.h>
#include <unistd.h>

#include <csignal>
#include <cstdio>
#include <atomic>
#include <algorithm>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>
#include <thread>

#include "core/cpu_features.h"
#include "core/error.h"
#include "core/progress.h"
#include "core/timer.h"
#include "core/version.h"
#include "engine/batch_slots.h"
#include "engine/generate.h"
#include "engine/report.h"
#include "engine/routing.h"
#include "engine/run.h"
#include "engine/session.h"
#include "model/arch.h"
#include "chat/chat.h"
#include "chat/jinja.h"
#include "text/utf8.h"
#include "llama_flags.h"
#include "run_options.h"

using namespace bmoe;

namespace {

struct CliOptions {
  RunOptions run;
  std::string prompt;
  std::string prompt_file;
  std::string prompt_ids;
  std::string system;
  int n_predict = 128;
  int64_t seed_option = -1;  // -s; -1: a random seed, printed so the run can be repeated
  uint64_t seed = 0;         // resolved
  SamplerConfig sampling;  // from the flags; the seed is resolved apart
  GrammarOptions grammar;  // --grammar, --json-schema and their files
  std::shared_ptr<const Grammar> constraint;  // resolved from `grammar` before the model loads
  bool chatml = false;
  bool chat = false;
  bool no_think = false;
  bool ignore_eos = false;
  bool json = false;
  bool tokenize_only = false;
  bool show_special = false;
  bool list_archs = false;
  std::string dump_logits;
  // Telemetry and routing traces.
  std::string csv;
  std::string teacher_force;
  std::string metrics;
  std::string route_trace;
  std::string route_replay;
  int route_replay_stride = 16;  // --parallel: sequence i replays the trace from step i x this
  bool progress = false;
  bool interactive = false;
  bool parallel = false;  // --parallel given (even 1): the prompts of -f, one per line
};

void add_flags(CLI::App& app, CliOptions& o) {
  add_run_flags(app, o.run);
  app.add_option("-p,--prompt", o.prompt, "prompt text");
  app.add_option("-f,--file", o.prompt_file, "read the prompt from a file");
  app.add_option("--prompt-ids", o.prompt_ids, "the prompt as comma-separated token ids (instead of -p)");
  app.add_option("-n,--n-predict", o.n_predict, "tokens to generate (-1: until end of text or context)")->capture_default_str();
  app.add_option("-s,--seed", o.seed_option, "sampling seed (-1: random, printed when sampling)")->capture_default_str()
      ->check(CLI::Range(int64_t{-1}, INT64_MAX));
  add_sampling_flags(app, o.sampling);
  add_grammar_flags(app, o.grammar);
  app.add_flag("--chatml", o.chatml, "wrap the prompt in the ChatML template (<|im_start|>user ...)");
  app.add_flag("--chat", o.chat, "wrap the prompt in the model's own chat format (ChatML, harmony, Gemma)");
  app.add_option("--system", o.system, "system message (implies --chat unless --chatml or -i)");
  app.add_flag("--no-think", o.no_think,
               "answer without reasoning: Qwen3 gets an empty think block, GLM /nothink and a closed one; "
               "gpt-oss is primed into its final channel (faster, but costs quality on multi-step tasks such "
               "as arithmetic)");
  app.add_flag("--ignore-eos", o.ignore_eos, "keep generating past end-of-text tokens");
  app.add_flag("--special", o.show_special, "print special/control tokens in the output");
  app.add_flag("--json", o.json, "print a JSON result (prompt ids, generated ids, text) instead of streaming text");
  app.add_flag("--tokenize", o.tokenize_only, "print the prompt's token ids as JSON and exit");
  app.add_option("--dump-logits", o.dump_logits,
                 "write the logits after the prompt (f32, binary) to a file; with --mtp, then the MTP head's first two draft steps'");
  app.add_flag("--list-archs", o.list_archs, "list the architectures compiled in, each with its tensor table, and exit");

  app.add_option("--teacher-force", o.teacher_force,
                 "quality check for lossy knobs: feed the tokens of an earlier --json run of the same prompt instead of "
                 "the model's picks, and report how often the model's own greedy pick equals them");
  app.add_option("--csv", o.csv, "write one CSV row per decoded token (timings, experts, cache, bytes read)");
  app.add_option("--metrics", o.metrics, "write run metrics (peak RSS, MemAvailable floor, temperatures, config) as JSON");
  app.add_option("--route-trace", o.route_trace, "record every routing decision to a CSV trace");
  app.add_option("--route-replay", o.route_replay,
                 "BENCHMARK ONLY, LOSSY: force each step's routing from a recorded trace (changes the output)");
  app.add_option("--route-replay-stride", o.route_replay_stride,
                 "with --parallel and --route-replay: sequence i (line i of -f, from 0) replays the trace from its "
                 "step i x N (default 16)")
      ->check(CLI::NonNegativeNumber);
  app.add_flag("--progress", o.progress, "print a live per-token status line on stderr");
  app.add_flag("-i,--interactive", o.interactive,
               "chat in the terminal with the model's chat format; the model, KV cache and expert cache stay "
               "loaded across turns (/reset clears the conversation, Ctrl-C stops an answer, Ctrl-D quits)");
}

SamplerConfig sampler_config(const CliOptions& o) {
  SamplerConfig c = o.sampling;
  c.seed = o.seed;
  return c;
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

std::string config_json(const CliOptions& c, const LoadedRun& run) {
  const RunConfig& o = run.config;
  const RunOptions& flags = c.run;  // the words as given
  nlohmann::json j;
  j["model"] = o.model;
  j["arch"] = run.model->arch;
  j["threads"] = o.thread_count();
  j["isa"] = active_isa_name();
  j["ctx_size"] = o.ctx_size;
  j["batch_size"] = o.batch();
  j["n_predict"] = c.n_predict;
  j["temperature"] = c.sampling.temperature;
  j["seed"] = c.seed;
  j["kv_type"] = flags.kv_type;
  j["n_expert_used"] = run.model->transformer->config().n_expert_used;
  j["moe_stream"] = o.streaming();
  if (o.streaming()) {
    j["dense_weights"] = flags.dense_weights;
    j["cache_mb_requested"] = flags.cache_mb;
    j["cache_budget_mib"] = run.cache_budget >> 20;
    j["cache_policy"] = o.cache_policy.empty() ? default_cache_policy() : o.cache_policy;
    j["io_threads"] = o.io_threads;
    j["odirect"] = o.odirect;
    j["overlap"] = o.overlapping();
    j["overlap_adaptive"] = o.adaptive_overlap();
    j["prefetch"] = o.prefetch;
    j["early_reads"] = o.early_reads;
    j["predictor"] = flags.predictor;
  }
  j["route_ahead"] = o.route_ahead;
  j["drop_cold_experts"] = o.drop_cold;
  j["draft"] = o.draft;
  j["route_replay"] = c.route_replay;
  j["chatml"] = c.chatml || c.chat;
  j["no_think"] = c.no_think;
  return j.dump();
}

std::atomic<bool> g_interrupted{false};

extern "C" void on_interrupt(int) { g_interrupted.store(true); }

// Ctrl-C sets a flag instead of killing the process; no SA_RESTART, so a blocked read of the
// next line returns and the prompt can be shown again.
void catch_interrupts() {
  struct sigaction sa {};
  sa.sa_handler = on_interrupt;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = 0;
  sigaction(SIGINT, &sa, nullptr);
}

// Reads one line from stdin; false at end of input, or when Ctrl-C interrupts the read: at an
// idle prompt Ctrl-C quits, as in llama-cli (during an answer it only stops the answer).
bool read_line(std::string& line) {
  line.clear();
  for (;;) {
    const int c = std::fgetc(stdin);
    if (c == EOF) {
      if (g_interrupted.exchange(false)) {
        std::clearerr(stdin);
        line.clear();
        return false;
      }
      return !line.empty();
    }
    if (c == '\n') return true;
    line += static_cast<char>(c);
  }
}

// Prints a piece of the answer on stdout as it comes.
bool print_piece(const std::string& piece) {
  std::fwrite(piece.data(), 1, piece.size(), stdout);
  std::fflush(stdout);
  return true;
}

// One turn of -i: the user's line answered and both kept in `messages`, or an error said and
// the turn dropped.
void chat_turn(const CliOptions& o, const ChatTemplate& chat, Session& session, const GenerateParams& params,
               std::vector<ChatMessage>& messages, const std::string& line) {
  messages.push_back({"user", line});
  std::vector<int32_t> ids;
  try {
    ids = session.tokenize(chat.apply(messages, o.no_think), true);
  } catch (const jinja::JinjaError& e) {
    messages.pop_back();
    fmt::print(stderr, "error: {}\n", e.what());
    return;
  }
  g_interrupted.store(false);
  GenerateResult r;
  try {
    r = generate(session, ids, params, print_piece, &g_interrupted);
  } catch (const Error& e) {
    messages.pop_back();
    fmt::print(stderr, "error: {} (/reset starts a new conversation)\n", e.what());
    return;
  }
  fmt::print("\n");
  if (r.finish_reason == "cancelled") fmt::print(stderr, "[stopped]\n");
  messages.push_back({"assistant", r.text});
  fmt::print(stderr, "[{} tokens, {:.2f} tok/s; prompt {} tokens, {} reused from the last turn, {:.2f} tok/s]\n",
             r.tokens.size(), static_cast<double>(r.tokens.size()) / std::max(r.decode_seconds, 1e-9), r.prompt_tokens,
             r.reused_tokens, (r.prompt_tokens - r.reused_tokens) / std::max(r.prefill_seconds, 1e-9));
  g_interrupted.store(false);
}

// The run's configuration from the flags. --route-replay forces the hash-routed layers' routing
// too, so their experts known from the token ids are not the ones read: no early reads then.
RunConfig cli_run_config(const CliOptions& o) {
  RunConfig c = run_config(o.run);
  if (!o.route_replay.empty()) c.early_reads = false;
  return c;
}

// -i: a chat loop. The conversation is re-rendered each turn with the model's chat format and
// the session keeps the KV rows of the common prefix, so only the new turn is evaluated.
int interactive(const CliOptions& o) {
  LoadedRun loaded = load_run(cli_run_config(o));
  const ChatTemplate chat = o.chatml ? ChatTemplate::builtin(ChatFormat::ChatML) : chat_template_for(loaded);
  ThreadPool pool(loaded.config.thread_count());
  const std::unique_ptr<Session> session = open_session(loaded, pool);
  std::vector<ChatMessage> messages;
  if (!o.system.empty()) messages.push_back({"system", o.system});
  GenerateParams params;
  params.max_tokens = o.n_predict < 0 ? loaded.config.ctx_size : o.n_predict;
  params.sampler = sampler_config(o);
  params.show_special = o.show_special;
  params.draft = draft_config(loaded);
  params.grammar = o.constraint;
  catch_interrupts();
  fmt::print(stderr, "interactive chat ({}): /reset clears the conversation, Ctrl-C stops an answer, "
                     "Ctrl-C at the prompt, Ctrl-D or /exit quits\n", chat.description());
  std::string line;
  for (;;) {
    fmt::print("> ");
    std::fflush(stdout);
    if (!read_line(line) || line == "/exit" || line == "/quit") break;
    if (line == "/reset") {
      messages.resize(o.system.empty() ? 0 : 1);
      session->reset();
      fmt::print(stderr, "(conversation cleared)\n");
    } else if (!line.empty()) {
      chat_turn(o, chat, *session, params, messages, line);
    }
  }
  fmt::print("\n");
  save_cache_file(loaded);
  return 0;
}

// The --progress line after a decode step (records from `first` on are the step's tokens).
void print_progress(const std::vector<TokenRecord>& recs, size_t first, int limit, bool tty) {
  double wall = 0, stall = 0, step_ms = 0;
  uint64_t hits = 0, routed = 0, bytes = 0;
  for (size_t i = 0; i < recs.size(); ++i) {
    const TokenRecord& x = recs[i];
    wall += x.wall_ms;
    hits += x.hits;
    routed += x.routed;
    bytes += x.bytes_read;
    stall += x.stall_ms;
    if (i >= first) step_ms += x.wall_ms;
  }
  const double n = static_cast<double>(recs.size());
  fmt::print(stderr, "{}[{}/{}] {:.2f} tok/s (this {:.0f} ms), hit {:.1f} %, read {:.1f} MiB/tok, stall {:.0f} ms/tok{}",
             tty ? "\r" : "", recs.size(), limit, 1000.0 * n / std::max(wall, 1e-9), step_ms,
             routed ? 100.0 * static_cast<double>(hits) / static_cast<double>(routed) : 0.0,
             static_cast<double>(bytes) / n / 1048576.0, stall / n, tty ? "   " : "\n");
}

// The --progress line while a prompt is read: redrawn on a terminal, else a line a second.
PrefillProgress prompt_progress(bool tty) {
  return [tty, last = -1.0](double done, int total, double seconds) mutable {
    const bool finished = done >= total;
    if (!finished && seconds - last < (tty ? 0.2 : 1.0)) return;
    last = seconds;
    fmt::print(stderr, "{}prompt: [{:.0f}/{}] {:.2f} tok/s, {:.1f} s{}", tty ? "\r" : "", done, total,
               done / std::max(seconds, 1e-9), seconds, tty ? "   " : "\n");
  };
}

// --chat/--chatml: the prompt as the user's turn of a conversation in the chat format.
std::string chat_prompt(const CliOptions& o, const LoadedRun& loaded, const std::string& prompt) {
  if (!o.chatml && !o.chat) return prompt;
  const ChatTemplate chat = o.chatml ? ChatTemplate::builtin(ChatFormat::ChatML) : chat_template_for(loaded);
  std::vector<ChatMessage> messages;
  if (!o.system.empty()) messages.push_back({"system", o.system});
  messages.push_back({"user", prompt});
  return chat.apply(messages, o.no_think);
}

// --route-replay and --route-trace: the hooks that force or record each step's routing.
struct RouteTools {
  std::unique_ptr<RouteReplayer> replayer;
  std::unique_ptr<RouteRecorder> recorder;
};

void attach_route_tools(const CliOptions& o, LoadedRun& loaded, Session& session, RouteTools& tools) {
  if (!o.route_replay.empty()) {
    tools.replayer = std::make_unique<RouteReplayer>(o.route_replay, loaded.model->transformer->config());
    fmt::print(stderr, "route-replay: forcing routing from {} ({} prompt, {} decode steps; lossy, benchmark only)\n",
               o.route_replay, tools.replayer->prompt_steps(), tools.replayer->decode_steps());
  }
  if (!o.route_trace.empty()) tools.recorder = std::make_unique<RouteRecorder>(o.route_trace, *loaded.model);
  if (!tools.replayer && !tools.recorder) return;
  session.state().set_route_hook([&tools](RouteEvent& e) {
    if (tools.replayer) tools.replayer->on_route(e);
    if (tools.recorder) tools.recorder->on_route(e);
  });
}

// Feeds the prompt (with the --progress line), prints the "prompt:" line and --dump-logits.
PrefillRecord read_prompt(const CliOptions& o, Session& session, const std::vector<int32_t>& prompt_ids, bool tty) {
  const PrefillRecord pre = session.prefill(prompt_ids, o.progress ? prompt_progress(tty) : PrefillProgress{});
  if (o.progress && tty) fmt::print(stderr, "\n");
  fmt::print(stderr, "prompt: {} tokens, {:.3f} s, {:.2f} tok/s\n", pre.tokens, pre.seconds, pre.tokens / std::max(pre.seconds, 1e-9));
  if (!o.dump_logits.empty()) {
    std::ofstream dump(o.dump_logits, std::ios::binary);
    const int n_vocab = session.model().transformer->config().n_vocab;
    dump.write(reinterpret_cast<const char*>(session.logits().data()), static_cast<std::streamsize>(n_vocab * sizeof(float)));
    // With --mtp, then the MTP head's first two draft steps after the prompt and its greedy next
    // token (what conformance compares with llama.cpp's draft-mtp).
    if (MtpHead* head = session.mtp_head()) {
      std::vector<int32_t> sequence = prompt_ids;
      sequence.push_back(Sampler::argmax(session.logits().data(), n_vocab));
      for (const MtpStep& step : mtp_steps(*head, sequence, 2)) {
        dump.write(reinterpret_cast<const char*>(step.logits.data()), static_cast<std::streamsize>(n_vocab * sizeof(float)));
      }
    }
    if (!dump) fail("cannot write {}", o.dump_logits);
  }
  return pre;
}

// What the decode loop is asked for: sampling, grammar, drafting (with a warning where it cannot
// run) and --teacher-force's reference tokens.
GenerateParams decode_params(const CliOptions& o, const LoadedRun& loaded, const std::vector<int32_t>& prompt_ids) {
  GenerateParams params;
  params.sampler = sampler_config(o);
  params.ignore_eos = o.ignore_eos;
  params.show_special = o.show_special;
  params.draft = draft_config(loaded);
  params.grammar = o.constraint;
  const bool drafting = drafts_with(params);
  if (!drafting && params.draft.max_draft > 0) {
    fmt::print(stderr, "warning: --draft needs sampling without penalties, grammar or log-probabilities; drafting is off\n");
  }
  if (o.teacher_force.empty()) return params;
  if (drafting) fail("--teacher-force and --draft do not mix");
  if (params.grammar) fail("--teacher-force and a grammar (--grammar, --json-schema) do not mix");
  JsonRun reference = read_json_run(o.teacher_force, "--teacher-force");
  if (reference.prompt != prompt_ids) fail("--teacher-force: {} was run on another prompt", o.teacher_force);
  params.forced = std::move(reference.tokens);
  return params;
}

// The answer on stdout: streamed as it comes, or (--json) prompt ids, tokens and text at the end.
GenerateResult decode_answer(const CliOptions& o, Session& session, const GenerateParams& params, int limit, bool tty) {
  DecodeHooks hooks;
  if (!o.json) hooks.on_piece = print_piece;
  if (o.progress) {
    hooks.on_step = [&session, limit, tty](size_t first) { print_progress(session.records(), first, limit, tty); };
  }
  const GenerateResult r = decode_tokens(session, limit, params, hooks);
  if (o.progress && tty) fmt::print(stderr, "\n");
  return r;
}

void print_answer(const CliOptions& o, const Tokenizer& tok, const std::vector<int32_t>& prompt_ids, const GenerateResult& r) {
  if (!o.json) {
    std::fputc('\n', stdout);
    std::fflush(stdout);
    return;
  }
  nlohmann::json j;
  j["prompt"] = prompt_ids;
  j["tokens"] = r.tokens;
  j["text"] = utf8_sanitize(tok.decode(r.tokens, o.show_special));
  fmt::print("{}\n", j.dump());
}

// Where a drafting run's decode time and expert reads went, per kind of step (each kind's mean).
void print_draft_profile(const DraftProfile& p) {
  auto line = [](const char* name, const StepCost& c, const char* rows) {
    const double n = c.steps > 0 ? static_cast<double>(c.steps) : 1.0;
    // Resident experts are never read, so a hit share is only said where something streamed.
    const bool streamed = c.hits > 0 || c.bytes_read > 0;
    const std::string hits =
        streamed && c.lookups > 0
            ? fmt::format(" ({:.0f} % hits)", 100.0 * static_cast<double>(c.hits) / static_cast<double>(c.lookups))
            : "";
    fmt::print(stderr, "  {}: {} steps, {:.2f} {} each, {:.1f} ms, {:.1f} expert lookups{}, {:.1f} MiB read\n", name,
               c.steps, static_cast<double>(c.rows) / n, rows, 1e3 * c.seconds / n, static_cast<double>(c.lookups) / n,
               hits, static_cast<double>(c.bytes_read) / n / 1048576.0);
  };
  line("plain", p.plain, "rows");
  line("verify", p.verify, "rows");
  line("drafter", p.drafter, "tokens proposed");
}

// The end-of-run lines on stderr (summary, drafting, prefetch, teacher forcing, dropped experts).
void print_run_report(LoadedRun& loaded, Session& session, const GenerateParams& params, const GenerateResult& r,
                      const RunSummary& summary) {
  const RunConfig& c = loaded.config;
  fmt::print(stderr, "{}", summary_lines(summary, c.streaming(), c.io_threads, loaded.cache_budget));
  if (drafts_with(params)) {
    fmt::print(stderr, "speculative: drafted {}, accepted {} ({:.1f} %), {} verify passes, max draft {}\n", r.drafted,
               r.accepted, r.drafted ? 100.0 * static_cast<double>(r.accepted) / static_cast<double>(r.drafted) : 0.0,
               r.verify_steps, params.draft.max_draft);
    print_draft_profile(r.draft_profile);
  }
  report_prefetch(loaded);
  save_cache_file(loaded);
  if (r.forced_steps) {
    fmt::print(stderr, "teacher-forced: {} of {} next tokens equal the reference ({:.1f} %)\n", r.forced_equal,
               r.forced_steps, 100.0 * r.forced_equal / r.forced_steps);
  }
  if (session.state().dropped_experts()) {
    fmt::print(stderr, "drop-cold-experts: skipped {} routed experts (lossy)\n", session.state().dropped_experts());
  }
}

// --metrics: the run's configuration, summary, memory floor and temperatures as JSON.
void write_run_metrics(const CliOptions& o, const LoadedRun& loaded, const RunSummary& summary, const PrefillRecord& pre,
                       const MemoryWatcher& watcher, const std::vector<ThermalReading>& thermal_start) {
  MetricsInput mi;
  mi.version = BMOE_VERSION;
  mi.config_json = config_json(o, loaded);
  mi.summary = summary;
  mi.end_memory = read_memory();
  mi.available_floor = watcher.available_floor();
  mi.mem_available_floor = watcher.mem_available_floor();
  mi.thermal_start = thermal_start;
  mi.thermal_end = read_thermal();
  mi.max_celsius = watcher.max_celsius();
  mi.load_seconds = loaded.load_seconds;
  mi.prompt_seconds = pre.seconds;
  mi.prompt_tokens = pre.tokens;
  write_metrics(o.metrics, mi);
}

// --parallel N: the lines of -f as prompts, N decoded at once, scheduled as bmoe-server's slots
// are (engine/batch_slots.h): a free slot takes the next prompt, whose chunks ride in the running
// sequences' decode steps, and it decodes from the step after its last chunk.
std::vector<std::string> prompt_lines(const CliOptions& o) {
  if (o.prompt_file.empty()) fail("--parallel {} needs -f FILE with one prompt per line", o.run.config.parallel);
  std::istringstream in(read_whole_file(o.prompt_file, "prompt file"));
  std::vector<std::string> prompts;
  for (std::string line; std::getline(in, line);) {
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (!line.empty()) prompts.push_back(line);
  }
  if (prompts.empty()) fail("{}: no prompts (one per line)", o.prompt_file);
  return prompts;
}

double percentile(std::vector<double> v, double p) {
  if (v.empty()) return 0.0;
  std::sort(v.begin(), v.end());
  return v[std::min(v.size() - 1, static_cast<size_t>(p * static_cast<double>(v.size() - 1) + 0.5))];
}

// One sequence of a --parallel run: its session (alive while it decodes) and its prompt.
struct ParallelSequence {
  size_t index = 0;
  std::unique_ptr<Session> session;
  std::vector<int32_t> prompt;
  std::unique_ptr<RouteReplayer> replay;  // --route-replay: this sequence's stretch of the trace
};

class ParallelCliRun {
 public:
  ParallelCliRun(const CliOptions& o, LoadedRun& loaded, ThreadPool& pool)
      : o_(o), loaded_(loaded), pool_(pool), slots_(*loaded.model, pool, loaded.config.routing(), loaded.config.parallel),
        held_(static_cast<size_t>(loaded.config.parallel)), prompts_(prompt_lines(o)) {
    if (!loaded.config.draft_oracle.empty()) {
      for (JsonRun& r : read_json_runs(loaded.config.draft_oracle, "--draft-oracle")) {
        std::vector<int32_t> whole = r.prompt;
        whole.insert(whole.end(), r.tokens.begin(), r.tokens.end());
        oracles_.emplace(std::move(r.prompt), std::move(whole));
      }
    }
    if (!o.route_replay.empty()) {
      trace_ = std::make_unique<RouteReplayer>(o.route_replay, loaded.model->transformer->config());
      fmt::print(stderr, "route-replay: forcing routing from {} ({} prompt, {} decode steps), sequence i from step i x {} "
                 "(lossy, benchmark only)\n", o.route_replay, trace_->prompt_steps(), trace_->decode_steps(), o.route_replay_stride);
    }
  }
  void run();

 private:
  bool admit();
  GenerateParams sequence_params(const ParallelSequence& q);
  void count(const BatchSlots::Turn& t);
  void finish(int slot);
  void report(double seconds) const;

  const CliOptions& o_;
  LoadedRun& loaded_;
  ThreadPool& pool_;
  BatchSlots slots_;
  std::vector<ParallelSequence> held_;  // by slot: the sequence it reads or decodes
  std::unique_ptr<RouteReplayer> trace_;  // --route-replay, shared by the sequences' replays
  // --draft-oracle: each prompt's oracle (prompt + output of an earlier --parallel --json run).
  std::map<std::vector<int32_t>, std::vector<int32_t>> oracles_;
  bool drafting_ = false;  // the sequences' parameters draft (drafts_with)
  int64_t drafted_ = 0, accepted_ = 0, verify_steps_ = 0;
  DraftProfile profile_;  // the sequences' profiles, summed
  std::vector<std::string> prompts_;
  size_t next_ = 0;
  std::vector<double> step_seconds_;
  int generated_ = 0, turns_ = 0;
  double prompt_seconds_ = 0;  // chunks read alone, and the chunks' share of the steps that read them
  uint64_t chunks_ = 0, chunks_in_steps_ = 0;
  size_t prompts_read_ = 0;
  int first_decode_turn_ = 0, last_prompt_turn_ = 0;  // 1-based turns; 0: none yet
};

void ParallelCliRun::run() {
  Stopwatch clock;
  while (admit()) {
    ++turns_;
    const BatchSlots::Turn t = slots_.turn();
    if (!t.reader_error.empty()) fail("prompt {}: {}", held_[static_cast<size_t>(t.reader)].index + 1, t.reader_error);
    if (!t.step_error.empty()) fail("{}", t.step_error);
    count(t);
    for (int slot : t.ended) finish(slot);
  }
  report(clock.seconds() - prompt_seconds_);
}

// Free slots take the next prompts; false once every prompt is answered.
bool ParallelCliRun::admit() {
  const RunConfig& c = loaded_.config;
  bool busy = false;
  for (int slot = 0; slot < c.parallel; ++slot) {
    if (!slots_.free(slot)) {
      busy = true;
      continue;
    }
    if (next_ >= prompts_.size()) continue;
    ParallelSequence& q = held_[static_cast<size_t>(slot)];
    q = ParallelSequence{};
    q.index = next_++;
    q.session = open_session(loaded_, pool_, sampler_config(o_));
    if (trace_) {
      q.replay = std::make_unique<RouteReplayer>(trace_->starting_at(static_cast<int>(q.index) * o_.route_replay_stride));
      q.session->state().set_route_hook([replay = q.replay.get()](RouteEvent& e) { replay->on_route(e); });
    }
    q.prompt = q.session->tokenize(chat_prompt(o_, loaded_, prompts_[q.index]), true);
    if (static_cast<int>(q.prompt.size()) >= c.sequence_ctx()) {
      fail("prompt {} has {} tokens, more than a sequence's context of {} (raise -c)", q.index + 1, q.prompt.size(), c.sequence_ctx());
    }
    const int limit = o_.n_predict < 0 ? c.sequence_ctx() - static_cast<int>(q.prompt.size()) : o_.n_predict;
    slots_.read(slot, *q.session, q.prompt, 0, {limit, sequence_params(q), {}});
    busy = true;
  }
  return busy;
}

// A sequence's decode parameters: with --draft-oracle, the oracle of its own prompt.
GenerateParams ParallelCliRun::sequence_params(const ParallelSequence& q) {
  GenerateParams params = decode_params(o_, loaded_, q.prompt);
  drafting_ = drafting_ || drafts_with(params);
  if (oracles_.empty()) return params;
  const auto it = oracles_.find(q.prompt);
  if (it == oracles_.end()) {
    fail("--draft-oracle: {} has no run of prompt {} (give the --json output of a --parallel run on the same -f)",
         loaded_.config.draft_oracle, q.index + 1);
  }
  params.draft.oracle = it->second;
  return params;
}

// A turn's prompt chunk and step, into the report's figures.
void ParallelCliRun::count(const BatchSlots::Turn& t) {
  if (t.reader >= 0 && t.chunk_tokens > 0) {
    ++chunks_;
    chunks_in_steps_ += t.rode;
    prompt_seconds_ += t.chunk_seconds;
  }
  prompts_read_ += t.prompt_done;
  if (t.prompt_done && prompts_read_ == prompts_.size()) last_prompt_turn_ = turns_;
  if (t.stepped) step_seconds_.push_back(t.step_seconds);
  if (!t.decoded.empty() && first_decode_turn_ == 0) first_decode_turn_ = turns_;
}

// A finished answer: on stdout (text, or --json one object per line), its line on stderr.
void ParallelCliRun::finish(int slot) {
  const GenerateResult r = slots_.answer(slot);
  ParallelSequence& q = held_[static_cast<size_t>(slot)];
  generated_ += static_cast<int>(r.tokens.size());
  const Tokenizer& tok = *loaded_.model->tokenizer;
  if (o_.json) {
    nlohmann::json j;
    j["index"] = q.index;
    j["prompt"] = q.prompt;
    j["tokens"] = r.tokens;
    j["text"] = utf8_sanitize(tok.decode(r.tokens, o_.show_special));
    if (drafting_) {
      j["drafted"] = r.drafted;
      j["accepted"] = r.accepted;
    }
    fmt::print("{}\n", j.dump());
  } else {
    fmt::print("[{}] {}\n", q.index + 1, r.text);
  }
  std::fflush(stdout);
  std::string drafts;
  if (drafting_) {
    drafts = fmt::format(", drafted {}, accepted {} ({:.1f} %) in {} verify passes", r.drafted, r.accepted,
                         r.drafted ? 100.0 * static_cast<double>(r.accepted) / static_cast<double>(r.drafted) : 0.0,
                         r.verify_steps);
    drafted_ += r.drafted;
    accepted_ += r.accepted;
    verify_steps_ += r.verify_steps;
    profile_ += r.draft_profile;
  }
  fmt::print(stderr, "sequence {}: prompt {} tokens, {} tokens in {:.3f} s, {:.2f} tok/s ({}{})\n", q.index + 1, q.prompt.size(),
             r.tokens.size(), r.decode_seconds, static_cast<double>(r.tokens.size()) / std::max(r.decode_seconds, 1e-9),
             r.finish_reason, drafts);
  q = ParallelSequence{};
}

// The decode figures are the decode rows' share of the steps' passes (SessionBatch splits a pass
// that also read a prompt chunk by rows), so the flash MiB per generated token leave the prompt's
// reads out; `seconds` is the run less the prompts' time, so the two sum to the run.
void ParallelCliRun::report(double seconds) const {
  const BatchShare b = slots_.share();
  const PassPart& d = b.decode_part;
  const double mib = static_cast<double>(d.bytes_read) / (1 << 20);
  fmt::print(stderr, "parallel: {} sequences, {} at once: {} tokens in {:.3f} s of decode steps, {:.2f} tok/s aggregate\n",
             prompts_.size(), loaded_.config.parallel, generated_, seconds, generated_ / std::max(seconds, 1e-9));
  fmt::print(stderr, "parallel: token latency p50 {:.1f} ms, p95 {:.1f} ms over {} steps; prompts read in {:.3f} s\n",
             percentile(step_seconds_, 0.5) * 1e3, percentile(step_seconds_, 0.95) * 1e3, step_seconds_.size(), prompt_seconds_);
  fmt::print(stderr, "parallel: {} prompt chunks, {} of them inside decode steps; decoding began at turn {}, the last prompt "
             "was read at turn {}\n", chunks_, chunks_in_steps_, first_decode_turn_, last_prompt_turn_);
  fmt::print(stderr, "parallel: flash {:.2f} MiB per generated token ({:.1f} MiB in decode steps, hit {:.1f} %); "
             "experts {} distinct of {} routed ({:.2f}); {} expert buffers allocated\n",
             generated_ ? mib / generated_ : 0.0, mib,
             d.lookups ? 100.0 * static_cast<double>(d.hits) / static_cast<double>(d.lookups) : 0.0,
             b.distinct_experts, b.routed_slots,
             b.routed_slots ? static_cast<double>(b.distinct_experts) / static_cast<double>(b.routed_slots) : 1.0,
             d.buffer_allocations);
  if (!drafting_) return;
  // Every sequence's drafts were verified in the shared steps: tokens per sequence and step say
  // what the drafts saved (1 without drafting), rows fed what they cost the passes.
  const int64_t fed = profile_.plain.steps + profile_.verify.steps;
  fmt::print(stderr, "speculative: drafted {}, accepted {} ({:.1f} %), {} verify passes, max draft {}; {:.2f} tokens per "
             "sequence and step, {} decode rows fed for {} tokens\n", drafted_, accepted_,
             drafted_ ? 100.0 * static_cast<double>(accepted_) / static_cast<double>(drafted_) : 0.0, verify_steps_,
             loaded_.config.draft, fed ? static_cast<double>(generated_) / static_cast<double>(fed) : 0.0, b.rows, generated_);
  print_draft_profile(profile_);
}

int run_parallel(const CliOptions& o) {
  if (!o.prompt.empty() || !o.prompt_ids.empty()) fail("--parallel reads its prompts from -f FILE, one per line (not -p/--prompt-ids)");
  if (!o.teacher_force.empty() || !o.csv.empty() || !o.route_trace.empty() || !o.dump_logits.empty()) {
    fail("--parallel runs without --teacher-force, --csv, --route-trace and --dump-logits");
  }
  LoadedRun loaded = load_run(cli_run_config(o));
  ThreadPool pool(loaded.config.thread_count());
  ParallelCliRun(o, loaded, pool).run();
  report_prefetch(loaded);
  save_cache_file(loaded);
  return 0;
}

int run(const CliOptions& o) {
  if (o.list_archs) {
    for (const Architecture& a : architectures()) fmt::print("{:<10} {}\n{}", a.name, a.description, describe_tensors(a));
    return 0;
  }
  if (o.interactive) return interactive(o);
  if (o.parallel) return run_parallel(o);
  const std::string prompt = o.prompt_file.empty() ? o.prompt : read_whole_file(o.prompt_file, "prompt file");

  MemoryWatcher watcher;
  const auto thermal_start = read_thermal();
  LoadedRun loaded = load_run(cli_run_config(o));
  const RunConfig& config = loaded.config;
  const std::string text = chat_prompt(o, loaded, prompt);
  ThreadPool pool(config.thread_count());
  const std::unique_ptr<Session> owned = open_session(loaded, pool, sampler_config(o));
  Session& session = *owned;
  RouteTools route_tools;
  attach_route_tools(o, loaded, session, route_tools);

  const Tokenizer& tok = *loaded.model->tokenizer;
  // A prompt too long for the context whatever its tokens is refused before tokenizing it (a
  // 12 MB prompt took a gigabyte to tokenize only to be refused after).
  if (o.prompt_ids.empty() && !o.tokenize_only && text.size() > static_cast<size_t>(config.ctx_size) * tok.longest_token_bytes()) {
    fail("the prompt has {} bytes, more than a context of {} tokens can hold (a token is at most {} bytes; raise -c)",
         text.size(), config.ctx_size, tok.longest_token_bytes());
  }
  const std::vector<int32_t> prompt_ids = o.prompt_ids.empty() ? session.tokenize(text, true) : parse_ids(o.prompt_ids, tok.vocab_size());
  if (o.tokenize_only) {
    fmt::print("{}\n", nlohmann::json(prompt_ids).dump());
    return 0;
  }
  if (static_cast<int>(prompt_ids.size()) >= config.ctx_size) {
    fail("the prompt has {} tokens, more than the context of {} (raise -c)", prompt_ids.size(), config.ctx_size);
  }
  const bool tty = ::isatty(STDERR_FILENO) != 0;
  const PrefillRecord pre = read_prompt(o, session, prompt_ids, tty);
  const int limit = o.n_predict < 0 ? config.ctx_size - static_cast<int>(prompt_ids.size()) : o.n_predict;
  const GenerateParams params = decode_params(o, loaded, prompt_ids);
  const GenerateResult answer = decode_answer(o, session, params, limit, tty);
  print_answer(o, tok, prompt_ids, answer);

  const RunSummary summary = summarize(session.records(), loaded.model->experts->stats());
  print_run_report(loaded, session, params, answer, summary);
  if (!o.csv.empty()) write_token_csv(o.csv, session.records());
  if (!o.metrics.empty()) write_run_metrics(o, loaded, summary, pre, watcher, thermal_start);
  return 0;
}

}  // namespace

// -sys / --system without --chat would be dropped unseen (only the chat formats have a system
// turn): as llama-cli's -sys starts a conversation, it wraps the prompt in the model's chat
// format, and says so. Token ids cannot be wrapped: refused. False: the error was printed.
static bool apply_system_prompt(CliOptions& o) {
  if (o.system.empty() || o.chat || o.chatml || o.interactive) return true;
  if (!o.prompt_ids.empty()) {
    fmt::print(stderr, "error: --system needs a text prompt (-p or -f): --prompt-ids are not wrapped in a chat format\n");
    return false;
  }
  o.chat = true;
  fmt::print(stderr, "note: --system wraps the prompt in the model's chat format (as --chat)\n");
  return true;
}

int main(int argc, char** argv) {
  CLI::App app{"bmoe-cli: run Mixture-of-Experts GGUF models, streaming experts from flash"};
  app.set_version_flag("--version", bmoe::version_text());
  CliOptions options;
  add_flags(app, options);
  if (const std::optional<int> status = parse_command_line(app, argc, argv)) return *status;
  if (!apply_system_prompt(options)) return 2;
  options.parallel = app.count("--parallel") > 0;
  options.seed = options.seed_option >= 0 ? static_cast<uint64_t>(options.seed_option) : random_seed();
  if (options.sampling.temperature > 0 && options.seed_option < 0) fmt::print(stderr, "seed: {} (-s {} repeats this run)\n", options.seed, options.seed);
  try {
    for (const auto& [path, flag] : {std::pair{options.csv, "--csv"}, {options.metrics, "--metrics"},
                                     {options.dump_logits, "--dump-logits"}, {options.run.config.cache_file, "--cache-file"}}) {
      check_output_path(path, flag);
    }
    options.constraint = grammar_from_flags(options.grammar);
  } catch (const std::exception& e) {
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
