// bmoe-server: an OpenAI-compatible HTTP server for one model (llama-server's endpoints).
//
// One worker thread decodes requests one at a time from a bounded queue; HTTP threads parse and
// validate requests, tokenize, and wait for (or stream) their job's output. The model, its KV
// cache and its expert cache stay loaded; each request reuses the KV rows of the prefix it
// shares with the previous one. A full queue answers 503; a client that goes away cancels its
// job (streaming: the next write fails; non-streaming: its socket is polled for a hang-up while
// nothing is written, so that an error still gets its own HTTP status; see whole_response).
#include <CLI/CLI.hpp>
#include <fmt/format.h>
#include <httplib.h>
#include <netdb.h>
#include <poll.h>
#include <pthread.h>
#include <sys/socket.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <csignal>
#include <ctime>
#include <deque>
#include <filesystem>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <thread>

#include "chat/chat.h"
#include "core/error.h"
#include "engine/generate.h"
#include "engine/run.h"
#include "engine/session.h"
#include "llama_flags.h"
#include "run_options.h"
#include "server_request.h"
#include "telemetry/system.h"
#include "text/utf8.h"
#include "web_index.h"  // kWebIndexHtml: tools/web/index.html, embedded at build time

using namespace bmoe;
using json = nlohmann::ordered_json;  // keys in the order OpenAI writes them

namespace {

struct ServerOptions {
  RunOptions run;
  std::string host = "127.0.0.1";
  int port = 8080;
  std::string api_key;
  std::string alias;
  int queue = 8;
  int http_threads = 0;
  int n_predict = -1;
  SamplerConfig sampling = server_sampling_defaults();  // each request's defaults (no seed)
  bool no_think = false;
  bool ignore_eos = false;
  std::string reasoning_format = "deepseek";  // chat: a <think> block goes to reasoning_content
  DraftConfig draft;  // resolved from run after load
};

// ------------------------------------------------------------------ errors

json error_body(const std::string& type, const std::string& message, const std::string& param = {},
                const std::string& code = {}) {
  json e = {{"message", message}, {"type", type}, {"param", nullptr}, {"code", nullptr}};
  if (!param.empty()) e["param"] = param;
  if (!code.empty()) e["code"] = code;
  return {{"error", e}};
}

void send_json(httplib::Response& res, int status, const json& body) {
  res.status = status;
  res.set_content(body.dump(), "application/json");
}

// ------------------------------------------------------------------ jobs and the worker

constexpr const char* kShuttingDown = "the server is shutting down (SIGTERM or SIGINT): the request was not completed";

// One step of a job's output, in order: a piece of a choice's text, a token's
// log-probabilities, or the end of a choice other than the last (the last ends with the job).
struct JobEvent {
  int choice = 0;
  std::string text;
  std::optional<TokenLogprob> logprob;
  std::string finish;  // GenerateResult::finish_reason of the choice that ended
};

struct Job {
  std::vector<int32_t> prompt;
  GenerateParams params;
  int n = 1;  // choices, generated one after the other; choice i is seeded params.sampler.seed + i
  std::atomic<bool> cancel{false};

  std::mutex mutex;
  std::condition_variable changed;
  std::deque<JobEvent> events;  // streamed output not yet sent
  bool done = false;
  std::vector<GenerateResult> results;  // one per choice generated
  std::string error;       // set when generation failed
  int error_status = 500;  // 503 when the server is shutting down

  void push(JobEvent e) {
    std::lock_guard<std::mutex> lock(mutex);
    events.push_back(std::move(e));
    changed.notify_all();
  }
};

struct Counters {
  uint64_t ok = 0, rejected_busy = 0, bad_request = 0, cancelled = 0, failed = 0, unauthorized = 0;
  uint64_t prompt_tokens = 0, reused_tokens = 0, generated_tokens = 0;
  double decode_seconds = 0, prefill_seconds = 0;
  double last_decode_tps = 0;
  double last_prompt_tps = 0;
  ExpertStats experts;  // latest snapshot: after each piece and each job (the worker owns the live counters)
  uint64_t live_pieces = 0;  // pieces of the running job so far (~ its tokens; exact counts come at its end)
};

// The one decoding thread: a bounded queue of jobs, each run to completion on the server's
// single session (whose KV prefix later requests reuse), with the counters /metrics reports.
class DecodeWorker {
 public:
  DecodeWorker(LoadedRun run, const ServerOptions& o)
      : run_(std::move(run)),
        pool_(run_.config.thread_count()),
        session_(open_session(run_, pool_)),
        capacity_(static_cast<size_t>(o.queue)) {
    counters_.experts = run_.model->experts->stats();
    worker_ = std::thread([this] { work(); });
  }
  ~DecodeWorker() {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      stopping_ = true;
    }
    wake_.notify_all();
    worker_.join();
  }

  LoadedRun& run() { return run_; }
  LoadedModel& model() { return *run_.model; }
  int n_ctx() { return session_->state().n_ctx(); }

  // Stops taking jobs (SIGTERM): the running one is cancelled and ends with an error, the
  // queued ones end with an error at once, and later submits are refused.
  void shutdown() {
    std::lock_guard<std::mutex> lock(mutex_);
    if (shutting_down_) return;
    shutting_down_ = true;
    if (current_) current_->cancel.store(true);
    for (auto& job : queue_) finish(*job, {}, kShuttingDown, 503);
    queue_.clear();
  }
  bool shutting_down() {
    std::lock_guard<std::mutex> lock(mutex_);
    return shutting_down_;
  }

  // Queues a job; false when the queue is full or the server is shutting down.
  bool submit(const std::shared_ptr<Job>& job) {
    std::lock_guard<std::mutex> lock(mutex_);
    if (shutting_down_) return false;
    if (queue_.size() >= capacity_) {
      ++counters_.rejected_busy;
      return false;
    }
    queue_.push_back(job);
    wake_.notify_one();
    return true;
  }

  void count(uint64_t Counters::*field) {
    std::lock_guard<std::mutex> lock(mutex_);
    ++(counters_.*field);
  }

  std::string prometheus() {
    std::lock_guard<std::mutex> lock(mutex_);
    const Counters& c = counters_;
    std::string out;
    auto metric = [&](const char* name, const char* type, const char* help, const std::string& body) {
      out += fmt::format("# HELP {} {}\n# TYPE {} {}\n{}", name, help, name, type, body);
    };
    auto value = [](const char* name, double v) { return fmt::format("{} {}\n", name, v); };
    metric("bmoe_requests_total", "counter", "Completion requests by outcome.",
           fmt::format("bmoe_requests_total{{outcome=\"ok\"}} {}\nbmoe_requests_total{{outcome=\"rejected_busy\"}} {}\n"
                       "bmoe_requests_total{{outcome=\"bad_request\"}} {}\nbmoe_requests_total{{outcome=\"cancelled\"}} {}\n"
                       "bmoe_requests_total{{outcome=\"error\"}} {}\nbmoe_requests_total{{outcome=\"unauthorized\"}} {}\n",
                       c.ok, c.rejected_busy, c.bad_request, c.cancelled, c.failed, c.unauthorized));
    metric("bmoe_queue_depth", "gauge", "Requests waiting to be decoded.", value("bmoe_queue_depth", static_cast<double>(queue_.size())));
    metric("bmoe_queue_capacity", "gauge", "Waiting requests accepted before 503.", value("bmoe_queue_capacity", static_cast<double>(capacity_)));
    metric("bmoe_busy", "gauge", "1 while a request is being decoded.", value("bmoe_busy", busy_ ? 1 : 0));
    metric("bmoe_prompt_tokens_total", "counter", "Prompt tokens received.", value("bmoe_prompt_tokens_total", static_cast<double>(c.prompt_tokens)));
    metric("bmoe_prompt_tokens_reused_total", "counter", "Prompt tokens served from the kept KV prefix.",
           value("bmoe_prompt_tokens_reused_total", static_cast<double>(c.reused_tokens)));
    metric("bmoe_generated_tokens_total", "counter", "Tokens generated.", value("bmoe_generated_tokens_total", static_cast<double>(c.generated_tokens)));
    metric("bmoe_decode_seconds_total", "counter", "Time spent generating tokens.", value("bmoe_decode_seconds_total", c.decode_seconds));
    metric("bmoe_prefill_seconds_total", "counter", "Time spent evaluating prompts.", value("bmoe_prefill_seconds_total", c.prefill_seconds));
    metric("bmoe_decode_tokens_per_second", "gauge", "Decode speed of the last request.",
           value("bmoe_decode_tokens_per_second", c.last_decode_tps));
    metric("bmoe_prompt_tokens_per_second", "gauge", "Prompt speed of the last request that evaluated prompt tokens.",
           value("bmoe_prompt_tokens_per_second", c.last_prompt_tps));
    const ExpertStats& e = c.experts;
    metric("bmoe_expert_lookups_total", "counter", "Routed-expert lookups.", value("bmoe_expert_lookups_total", static_cast<double>(e.requests)));
    metric("bmoe_expert_cache_hits_total", "counter", "Lookups served from the expert cache.", value("bmoe_expert_cache_hits_total", static_cast<double>(e.hits)));
    metric("bmoe_expert_cache_hit_ratio", "gauge", "Expert cache hits / lookups since start.",
           value("bmoe_expert_cache_hit_ratio", e.requests ? static_cast<double>(e.hits) / static_cast<double>(e.requests) : 0.0));
    metric("bmoe_flash_read_bytes_total", "counter", "Bytes of experts read from the model file.",
           value("bmoe_flash_read_bytes_total", static_cast<double>(e.bytes_read)));
    metric("bmoe_flash_read_mib_total", "counter", "The same in MiB.", value("bmoe_flash_read_mib_total", static_cast<double>(e.bytes_read) / 1048576.0));
    metric("bmoe_expert_cache_used_bytes", "gauge", "Bytes held by the expert cache.", value("bmoe_expert_cache_used_bytes", static_cast<double>(e.cache_used_bytes)));
    const MemorySnapshot m = read_memory();
    metric("bmoe_rss_bytes", "gauge", "Resident set size of the server.", value("bmoe_rss_bytes", static_cast<double>(m.rss)));
    return out;
  }

  // GET /stats: the same counters as JSON, for the web page. generated_tokens includes the
  // running job's pieces so far, so a client can take differences while an answer streams
  // (cache hit rate and flash MiB per token of that answer).
  json stats() {
    std::lock_guard<std::mutex> lock(mutex_);
    const Counters& c = counters_;
    const ExpertStats& e = c.experts;
    const MemorySnapshot m = read_memory();
    json memory = {{"rss_bytes", m.rss}, {"peak_rss_bytes", m.peak_rss}};
    if (const std::optional<uint64_t> available = m.available()) memory["available_bytes"] = *available;
    return {{"busy", busy_},
            {"queue_depth", queue_.size()},
            {"prompt_tokens", c.prompt_tokens},
            {"generated_tokens", c.generated_tokens + c.live_pieces},
            {"last_decode_tokens_per_second", c.last_decode_tps},
            {"last_prompt_tokens_per_second", c.last_prompt_tps},
            {"experts", {{"streamed", run_.model->streamer() != nullptr},  // false: all mapped, no cache
                         {"lookups", e.requests}, {"hits", e.hits}, {"flash_read_bytes", e.bytes_read},
                         {"cache_used_bytes", e.cache_used_bytes}, {"cache_budget_bytes", e.cache_budget_bytes}}},
            {"memory", memory}};
  }

 private:
  void work() {
    for (;;) {
      std::shared_ptr<Job> job;
      {
        std::unique_lock<std::mutex> lock(mutex_);
        wake_.wait(lock, [&] { return stopping_ || !queue_.empty(); });
        if (stopping_) break;
        job = queue_.front();
        queue_.pop_front();
        busy_ = true;
        current_ = job;
      }
      run_job(*job);
      std::lock_guard<std::mutex> lock(mutex_);
      busy_ = false;
      current_.reset();
    }
    // Release anyone still waiting.
    std::lock_guard<std::mutex> lock(mutex_);
    for (auto& job : queue_) finish(*job, {}, kShuttingDown, 503);
  }

  void run_job(Job& job) {
    std::vector<GenerateResult> results;
    std::string error;
    // n choices one after the other: each re-evaluates only the prompt's last token (the KV
    // prefix is kept), and is seeded apart so that sampled choices differ.
    for (int i = 0; i < job.n && error.empty(); ++i) {
      results.push_back(run_choice(job, i, error));
      const std::string& reason = results.back().finish_reason;
      if (reason == "cancelled") break;
      if (i + 1 < job.n && error.empty()) job.push({i, {}, std::nullopt, reason});
    }
    const bool cancelled = !results.empty() && results.back().finish_reason == "cancelled";
    int status = 500;
    if (error.empty() && cancelled && shutting_down()) {
      error = kShuttingDown;
      status = 503;
    }
    {
      std::lock_guard<std::mutex> lock(mutex_);
      Counters& c = counters_;
      if (!error.empty()) ++c.failed;
      else if (cancelled) ++c.cancelled;
      else ++c.ok;
      for (const GenerateResult& result : results) {
        c.prompt_tokens += static_cast<uint64_t>(result.prompt_tokens);
        c.reused_tokens += static_cast<uint64_t>(result.reused_tokens);
        c.generated_tokens += result.tokens.size();
        c.decode_seconds += result.decode_seconds;
        c.prefill_seconds += result.prefill_seconds;
        if (!result.tokens.empty()) c.last_decode_tps = static_cast<double>(result.tokens.size()) / std::max(result.decode_seconds, 1e-9);
        if (result.prompt_tokens > result.reused_tokens) {
          c.last_prompt_tps = (result.prompt_tokens - result.reused_tokens) / std::max(result.prefill_seconds, 1e-9);
        }
      }
      c.live_pieces = 0;
      c.experts = run_.model->experts->stats();
    }
    finish(job, std::move(results), error, status);
  }

  // Generates choice `index` of the job, streaming its pieces and log-probabilities as events.
  GenerateResult run_choice(Job& job, int index, std::string& error) {
    GenerateResult result;
    if (job.cancel.load()) {
      result.finish_reason = "cancelled";
      return result;
    }
    GenerateParams params = job.params;
    params.sampler.seed += static_cast<uint64_t>(index);
    try {
      result = generate(*session_, job.prompt, params, [this, &job, index](const std::string& piece) {
        publish_progress();
        job.push({index, piece, std::nullopt, {}});
        return true;
      }, &job.cancel, [&job, index](const TokenLogprob& lp) { job.push({index, {}, lp, {}}); });
    } catch (const std::exception& e) {
      error = e.what();
      session_->reset();  // the KV cache may be half-written
    }
    return result;
  }

  // Between tokens, on the worker (the expert counters are only written by it): the live
  // figures /stats reports while an answer streams. A copy under the lock costs ~1 us a token.
  void publish_progress() {
    const ExpertStats e = run_.model->experts->stats();
    std::lock_guard<std::mutex> lock(mutex_);
    counters_.experts = e;
    ++counters_.live_pieces;
  }

  static void finish(Job& job, std::vector<GenerateResult> results, const std::string& error, int status = 500) {
    std::lock_guard<std::mutex> lock(job.mutex);
    job.results = std::move(results);
    job.error = error;
    job.error_status = status;
    job.done = true;
    job.changed.notify_all();
  }

  std::shared_ptr<Job> current_;  // the job being decoded
  bool shutting_down_ = false;
  LoadedRun run_;
  bmoe::ThreadPool pool_;
  std::unique_ptr<Session> session_;
  size_t capacity_;
  std::mutex mutex_;
  std::condition_variable wake_;
  std::deque<std::shared_ptr<Job>> queue_;
  bool busy_ = false;
  bool stopping_ = false;
  Counters counters_;
  std::thread worker_;
};

// ------------------------------------------------------------------ responses

struct Completion {
  bool chat = false;
  ReplyOptions reply;  // chat: reasoning, harmony channels and tool calls (server_request.h)
  bool include_usage = false;    // stream_options.include_usage
  std::string id;
  int64_t created = 0;
  std::string model;
  int n = 1;                           // choices
  bool logprobs = false;               // report log-probabilities
  const Tokenizer* tokenizer = nullptr;  // for the tokens' text in logprobs
};

// Usage over all choices: the prompt once (as OpenAI), the completion tokens of every choice.
json usage_of(const std::vector<GenerateResult>& rs) {
  const int prompt = rs.empty() ? 0 : rs.front().prompt_tokens;
  const int cached = rs.empty() ? 0 : rs.front().reused_tokens;
  int completion = 0;
  for (const GenerateResult& r : rs) completion += static_cast<int>(r.tokens.size());
  return {{"prompt_tokens", prompt}, {"completion_tokens", completion}, {"total_tokens", prompt + completion},
          {"prompt_tokens_details", {{"cached_tokens", cached}}}};
}

// llama-server's "timings": prompt tokens evaluated (cache_n came from the kept prefix) and
// generated, with their times and rates; summed over the choices (each after the first
// evaluates the prompt's last token again).
json timings_of(const std::vector<GenerateResult>& rs) {
  int reused = 0, evaluated = 0, generated = 0;
  double prompt_ms = 0, predicted_ms = 0;
  for (const GenerateResult& r : rs) {
    reused += r.reused_tokens;
    evaluated += r.prompt_tokens - r.reused_tokens;
    generated += static_cast<int>(r.tokens.size());
    prompt_ms += r.prefill_seconds * 1e3;
    predicted_ms += r.decode_seconds * 1e3;
  }
  return {{"cache_n", reused},
          {"prompt_n", evaluated},
          {"prompt_ms", prompt_ms},
          {"prompt_per_token_ms", evaluated > 0 ? prompt_ms / evaluated : 0.0},
          {"prompt_per_second", prompt_ms > 0 ? evaluated * 1e3 / prompt_ms : 0.0},
          {"predicted_n", generated},
          {"predicted_ms", predicted_ms},
          {"predicted_per_token_ms", generated > 0 ? predicted_ms / generated : 0.0},
          {"predicted_per_second", predicted_ms > 0 ? generated * 1e3 / predicted_ms : 0.0}};
}

std::string finish_reason(const std::string& reason) { return reason == "length" ? "length" : "stop"; }

// OpenAI's tool_calls list, each call with a new id (`index` for stream deltas). Calls appear
// only when the request gave tools (a harmony answer may call a function unasked: dropped).
json tool_calls_json(const Completion& c, const std::vector<ToolCall>& calls, bool with_index = false) {
  json out = json::array();
  if (c.reply.tools == ToolFormat::None) return out;
  for (size_t i = 0; i < calls.size(); ++i) {
    json call = with_index ? json{{"index", i}} : json::object();
    call["id"] = calls[i].id.empty() ? new_tool_call_id(c.reply.tools, random_seed()) : calls[i].id;  // Mistral's own
    call["type"] = "function";
    call["function"] = {{"name", utf8_sanitize(calls[i].name)}, {"arguments", utf8_sanitize(calls[i].arguments)}};
    out.push_back(std::move(call));
  }
  return out;
}

// ---- log-probabilities

// A masked token's logprob is -inf, which JSON cannot carry: OpenAI reports -9999 for those.
double finite_logprob(float lp) { return std::max(static_cast<double>(lp), -9999.0); }

// Chat: {token, logprob, bytes} (bytes: the token's raw bytes, which may be part of a character).
json chat_token(const Tokenizer& tok, int32_t id, float logprob) {
  const std::string bytes = tok.token_bytes(id, true);
  json raw = json::array();
  for (char b : bytes) raw.push_back(static_cast<unsigned char>(b));
  return {{"token", utf8_sanitize(bytes)}, {"logprob", finite_logprob(logprob)}, {"bytes", raw}};
}

// Chat's choices[].logprobs: {"content": [{token, logprob, bytes, top_logprobs: [...]}]}.
json chat_logprobs(const Tokenizer& tok, const std::vector<TokenLogprob>& lps) {
  json content = json::array();
  for (const TokenLogprob& lp : lps) {
    json entry = chat_token(tok, lp.token, lp.logprob);
    entry["top_logprobs"] = json::array();
    for (const auto& [id, logprob] : lp.top) entry["top_logprobs"].push_back(chat_token(tok, id, logprob));
    content.push_back(std::move(entry));
  }
  return {{"content", content}, {"refusal", nullptr}};
}

// Completions' legacy object: tokens, token_logprobs, top_logprobs ({text: logprob}) and
// text_offset, the character offset of each token in the choice's text. `offset` carries the
// count on from one streamed chunk to the next.
json completion_logprobs(const Tokenizer& tok, const std::vector<TokenLogprob>& lps, int64_t& offset) {
  json tokens = json::array(), logprobs = json::array(), tops = json::array(), offsets = json::array();
  for (const TokenLogprob& lp : lps) {
    const std::string bytes = tok.token_bytes(lp.token, true);
    tokens.push_back(utf8_sanitize(bytes));
    logprobs.push_back(finite_logprob(lp.logprob));
    json top = json::object();
    for (const auto& [id, logprob] : lp.top) top[utf8_sanitize(tok.token_bytes(id, true))] = finite_logprob(logprob);
    tops.push_back(std::move(top));
    offsets.push_back(offset);
    // Characters begin at bytes that are not UTF-8 continuation bytes (10xxxxxx).
    for (char b : bytes) offset += (static_cast<unsigned char>(b) & 0xC0) != 0x80;
  }
  return {{"tokens", tokens}, {"token_logprobs", logprobs}, {"top_logprobs", tops}, {"text_offset", offsets}};
}

json logprobs_of(const Completion& c, const std::vector<TokenLogprob>& lps, int64_t& offset) {
  if (!c.logprobs) return nullptr;
  return c.chat ? chat_logprobs(*c.tokenizer, lps) : completion_logprobs(*c.tokenizer, lps, offset);
}

// ---- whole responses and stream chunks

json full_choice(const Completion& c, const GenerateResult& r, int index) {
  json choice = {{"index", index}, {"finish_reason", finish_reason(r.finish_reason)}};
  int64_t offset = 0;
  choice["logprobs"] = logprobs_of(c, r.logprobs, offset);
  if (!c.chat) {
    choice["text"] = utf8_sanitize(r.text);
    return choice;
  }
  ReplyParser parser(c.reply);
  ReplyDelta d = parser.feed(r.text);
  d.append(parser.finish());
  const json calls = tool_calls_json(c, parser.tool_calls());
  choice["message"] = {{"role", "assistant"}, {"content", d.content.empty() && !calls.empty() ? json(nullptr) : json(utf8_sanitize(d.content))}};
  if (!d.reasoning.empty()) choice["message"]["reasoning_content"] = utf8_sanitize(d.reasoning);
  if (!calls.empty()) {
    choice["message"]["tool_calls"] = calls;
    // An answer cut by max_tokens says so, even after a complete call (a later one was lost).
    if (r.finish_reason != "length") choice["finish_reason"] = "tool_calls";
  }
  return choice;
}

json full_response(const Completion& c, const std::vector<GenerateResult>& rs) {
  json choices = json::array();
  for (size_t i = 0; i < rs.size(); ++i) choices.push_back(full_choice(c, rs[i], static_cast<int>(i)));
  return {{"id", c.id}, {"object", c.chat ? "chat.completion" : "text_completion"}, {"created", c.created},
          {"model", c.model}, {"choices", choices}, {"usage", usage_of(rs)}, {"timings", timings_of(rs)}};
}

std::string sse(const json& j) { return "data: " + j.dump() + "\n\n"; }

json chunk(const Completion& c, int index, const std::string* text, const std::string* finish) {
  json choice = {{"index", index}, {"finish_reason", finish ? json(*finish) : json(nullptr)}};
  if (c.chat) {
    choice["delta"] = text ? json{{"content", *text}} : json::object();
  } else {
    choice["text"] = text ? *text : "";
    choice["logprobs"] = nullptr;
  }
  return {{"id", c.id}, {"object", c.chat ? "chat.completion.chunk" : "text_completion"}, {"created", c.created},
          {"model", c.model}, {"choices", json::array({choice})}};
}

// The OpenAI error object for a job that failed (type by status: 503 is the shutdown).
json job_error(const Job& job) {
  return error_body(job.error_status == 503 ? "server_shutting_down" : "server_error", job.error);
}

// Writes a job's events as server-sent events, one provider call at a time. Consecutive events
// of one choice go out as one chunk (text and the log-probabilities of its tokens).
class StreamWriter {
 public:
  explicit StreamWriter(const Completion& c)
      : c_(c), opened_(static_cast<size_t>(c.n), false), called_(static_cast<size_t>(c.n), false),
        offsets_(static_cast<size_t>(c.n), 0) {
    for (int i = 0; i < c.n; ++i) parsers_.emplace_back(c.reply);
  }

  // One provider call: waits up to a second for output; false when the client is gone.
  bool step(Job& job, httplib::DataSink& sink) {
    sink_ = &sink;
    if (!opened_[0]) return open(0);  // at once: the client sees the stream start
    std::unique_lock<std::mutex> lock(job.mutex);
    job.changed.wait_for(lock, std::chrono::seconds(1), [&] { return job.done || !job.events.empty(); });
    std::deque<JobEvent> events;
    events.swap(job.events);
    const bool done = job.done;
    lock.unlock();
    if (!write_events(events)) return false;
    if (!done) return events.empty() ? send(": keep-alive\n\n") : true;
    if (!finish_stream(job)) return false;
    sink.done();
    return true;
  }

 private:
  bool send(const std::string& text) { return sink_->write(text.data(), text.size()); }

  // The chat role chunk that starts a choice.
  bool open(int choice) {
    opened_[static_cast<size_t>(choice)] = true;
    if (!c_.chat) return true;
    json first = chunk(c_, choice, nullptr, nullptr);
    first["choices"][0]["delta"] = {{"role", "assistant"}, {"content", ""}};
    return send(sse(first));
  }

  bool write_events(const std::deque<JobEvent>& events) {
    std::string text;
    std::vector<TokenLogprob> lps;
    for (size_t i = 0; i < events.size(); ++i) {
      const JobEvent& e = events[i];
      text += e.text;
      if (e.logprob) lps.push_back(*e.logprob);
      const bool last_of_run = i + 1 == events.size() || events[i + 1].choice != e.choice || !e.finish.empty();
      if (!last_of_run) continue;
      if (!write_piece(e.choice, text, lps, !e.finish.empty())) return false;
      if (!e.finish.empty() && !send(sse(finish_chunk(e.choice, e.finish)))) return false;
      text.clear();
      lps.clear();
    }
    return true;
  }

  // A choice's text (chat: split into reasoning, content and tool calls) with its tokens'
  // log-probabilities; `ending` flushes what the parser held and sends the tool calls.
  bool write_piece(int choice, const std::string& text, const std::vector<TokenLogprob>& lps, bool ending) {
    const size_t k = static_cast<size_t>(choice);
    if (!opened_[k] && !open(choice)) return false;
    ReplyDelta d{std::string(), text};
    if (c_.chat) {
      d = parsers_[k].feed(text);
      if (ending) d.append(parsers_[k].finish());
    }
    // The text first (what the parser released at the end included), then the calls.
    if (!write_delta(choice, d, lps)) return false;
    return !ending || !c_.chat || write_tool_calls(choice);
  }

  bool write_delta(int choice, const ReplyDelta& d, const std::vector<TokenLogprob>& lps) {
    const size_t k = static_cast<size_t>(choice);
    if (d.empty() && lps.empty()) return true;
    json out = chunk(c_, choice, c_.chat ? nullptr : &d.content, nullptr);
    json& choice_json = out["choices"][0];
    if (c_.chat) {
      if (!d.reasoning.empty()) choice_json["delta"]["reasoning_content"] = d.reasoning;
      if (!d.content.empty()) choice_json["delta"]["content"] = d.content;
    }
    if (c_.logprobs) choice_json["logprobs"] = logprobs_of(c_, lps, offsets_[k]);
    return send(sse(out));
  }

  // The calls of a finished chat choice, in one delta (each call whole: id, name, arguments).
  bool write_tool_calls(int choice) {
    const json calls = tool_calls_json(c_, parsers_[static_cast<size_t>(choice)].tool_calls(), true);
    if (calls.empty()) return true;
    called_[static_cast<size_t>(choice)] = true;
    json out = chunk(c_, choice, nullptr, nullptr);
    out["choices"][0]["delta"]["tool_calls"] = calls;
    return send(sse(out));
  }

  json finish_chunk(int choice, const std::string& reason) {
    const bool called = called_[static_cast<size_t>(choice)] && reason != "length";
    const std::string r = called ? "tool_calls" : finish_reason(reason);
    return chunk(c_, choice, nullptr, &r);
  }

  // The job is done: the last choice's end, with usage and timings, or the error event.
  bool finish_stream(Job& job) {
    if (!job.error.empty()) return send(sse(job_error(job))) && send("data: [DONE]\n\n");
    const int last = static_cast<int>(job.results.size()) - 1;
    if (last >= 0 && !write_piece(last, {}, {}, true)) return false;
    json end = finish_chunk(std::max(last, 0), last >= 0 ? job.results.back().finish_reason : "stop");
    end["usage"] = usage_of(job.results);
    end["timings"] = timings_of(job.results);
    if (!send(sse(end))) return false;
    if (c_.include_usage) {  // as OpenAI: one more chunk, with usage and no choices
      json usage = chunk(c_, 0, nullptr, nullptr);
      usage["choices"] = json::array();
      usage["usage"] = usage_of(job.results);
      if (!send(sse(usage))) return false;
    }
    return send("data: [DONE]\n\n");
  }

  Completion c_;
  std::vector<ReplyParser> parsers_;  // chat: one per choice
  std::vector<bool> opened_;
  std::vector<bool> called_;  // the choice ended in tool calls
  std::vector<int64_t> offsets_;  // completions' text_offset, per choice
  httplib::DataSink* sink_ = nullptr;
};

// ---- the client's connection

// The socket of the request's connection, found among the process's descriptors by its peer
// and local ports and peer address (cpp-httplib 0.11 does not give it to handlers); -1 if none.
int client_socket(const httplib::Request& req) {
  std::error_code ec;
  for (const auto& entry : std::filesystem::directory_iterator("/proc/self/fd", ec)) {
    const std::string name = entry.path().filename().string();
    char* end = nullptr;
    const long fd = std::strtol(name.c_str(), &end, 10);
    if (end == name.c_str() || *end != '\0') continue;
    sockaddr_storage peer{}, local{};
    socklen_t peer_len = sizeof(peer), local_len = sizeof(local);
    if (::getpeername(static_cast<int>(fd), reinterpret_cast<sockaddr*>(&peer), &peer_len) != 0) continue;
    if (::getsockname(static_cast<int>(fd), reinterpret_cast<sockaddr*>(&local), &local_len) != 0) continue;
    char host[NI_MAXHOST], peer_port[NI_MAXSERV], local_port[NI_MAXSERV];
    if (::getnameinfo(reinterpret_cast<sockaddr*>(&peer), peer_len, host, sizeof(host), peer_port, sizeof(peer_port),
                      NI_NUMERICHOST | NI_NUMERICSERV) != 0 ||
        ::getnameinfo(reinterpret_cast<sockaddr*>(&local), local_len, nullptr, 0, local_port, sizeof(local_port),
                      NI_NUMERICSERV) != 0) {
      continue;
    }
    if (req.remote_addr == host && std::to_string(req.remote_port) == peer_port &&
        (req.local_port < 0 || std::to_string(req.local_port) == local_port)) {
      return static_cast<int>(fd);
    }
  }
  return -1;
}

// Whether the client closed its side (or the connection broke). Pipelined bytes waiting to
// be read are no hang-up.
bool client_hung_up(int sock) {
  pollfd p{sock, POLLRDHUP, 0};
  return ::poll(&p, 1, 0) > 0 && (p.revents & (POLLRDHUP | POLLHUP | POLLERR | POLLNVAL)) != 0;
}

std::string random_id(const char* prefix) {
  static std::atomic<uint64_t> counter{0};
  const auto now = std::chrono::system_clock::now().time_since_epoch().count();
  return fmt::format("{}-{:x}{:04x}", prefix, static_cast<uint64_t>(now) & 0xffffffffffull, counter.fetch_add(1) & 0xffff);
}

// ------------------------------------------------------------------ the server

class Server {
 public:
  Server(DecodeWorker& worker, const ServerOptions& o) : worker_(worker), o_(o) {
    model_name_ = utf8_sanitize(o.alias.empty() ? std::filesystem::path(o.run.config.model).filename().string() : o.alias);
    chat_template_ = chat_template_for(worker.run());
    tool_format_ = tool_format_of(chat_template_.source());
  }

  const std::string& chat_template_description() const { return chat_template_.description(); }

  void install(httplib::Server& http) {
    http.Get("/health", [](const httplib::Request&, httplib::Response& res) { send_json(res, 200, {{"status", "ok"}}); });
    // The web chat page: open without the API key (it holds no data; the page asks for the
    // key and sends it with its own requests).
    http.Get("/", [](const httplib::Request&, httplib::Response& res) {
      res.set_header("Cache-Control", "no-cache");
      res.set_content(kWebIndexHtml.data(), kWebIndexHtml.size(), "text/html; charset=utf-8");
    });
    http.Get("/stats", guarded([this](const httplib::Request&, httplib::Response& res) { send_json(res, 200, worker_.stats()); }));
    http.Get("/v1/models", guarded([this](const httplib::Request&, httplib::Response& res) {
      send_json(res, 200, {{"object", "list"},
                           {"data", json::array({{{"id", model_name_}, {"object", "model"}, {"created", 0},
                                                  {"owned_by", "bmoe"}}})}});
    }));
    http.Get(R"(/v1/models/(.+))", guarded([this](const httplib::Request& req, httplib::Response& res) {
      const std::string id = req.matches[1];
      if (id != model_name_) {
        send_json(res, 404, error_body("invalid_request_error", fmt::format("The model '{}' does not exist", utf8_sanitize(id)),
                                       "model", "model_not_found"));
        return;
      }
      send_json(res, 200, {{"id", model_name_}, {"object", "model"}, {"created", 0}, {"owned_by", "bmoe"}});
    }));
    http.Post("/tokenize", guarded([this](const httplib::Request& req, httplib::Response& res) {
      const TokenizeRequest r = parse_tokenize_request(req.body);
      const Tokenizer& tok = *worker_.model().tokenizer;
      const std::vector<int32_t> ids = tok.encode(r.content, true, r.add_special && tok.vocab().add_bos);
      json tokens = json::array();
      for (int32_t id : ids) {
        if (r.with_pieces) tokens.push_back({{"id", id}, {"piece", utf8_sanitize(tok.decode({id}, true))}});
        else tokens.push_back(id);
      }
      send_json(res, 200, {{"tokens", tokens}});
    }));
    http.Post("/detokenize", guarded([this](const httplib::Request& req, httplib::Response& res) {
      const Tokenizer& tok = *worker_.model().tokenizer;
      const std::vector<int32_t> ids = parse_detokenize_request(req.body, tok.vocab_size());
      send_json(res, 200, {{"content", utf8_sanitize(tok.decode(ids, true))}});
    }));
    http.Get("/props", guarded([this](const httplib::Request&, httplib::Response& res) {
      const ModelConfig& cfg = worker_.model().transformer->config();
      const SamplerConfig& d = o_.sampling;
      json settings = {{"n_ctx", worker_.n_ctx()}, {"n_predict", o_.n_predict}, {"temperature", d.temperature},
                       {"top_k", d.top_k}, {"top_p", d.top_p}, {"min_p", d.min_p},
                       {"presence_penalty", d.presence_penalty}, {"frequency_penalty", d.frequency_penalty},
                       {"repeat_penalty", d.repeat_penalty}, {"repeat_last_n", d.repeat_last_n},
                       {"ignore_eos", o_.ignore_eos}};
      send_json(res, 200, {{"default_generation_settings", settings},
                           {"total_slots", 1},
                           {"model_alias", model_name_},
                           {"model_path", utf8_sanitize(o_.run.config.model)},
                           {"chat_format", chat_format_name(chat_template_.format())},
                           {"chat_template_source", chat_template_.description()},
                           {"tool_call_format", tool_format_name(tool_format_)},
                           {"chat_template", utf8_sanitize(worker_.model().tokenizer->vocab().chat_template)},
                           {"architecture", cfg.arch},
                           {"reasoning_format", o_.reasoning_format},
                           {"build_info", fmt::format("bmoe {}", BMOE_VERSION)}});
    }));
    http.Get("/metrics", guarded([this](const httplib::Request&, httplib::Response& res) {
      res.set_content(worker_.prometheus(), "text/plain; version=0.0.4");
    }));
    http.Post("/v1/chat/completions", guarded([this](const httplib::Request& req, httplib::Response& res) {
      complete(req, res, true);
    }));
    http.Post("/v1/completions", guarded([this](const httplib::Request& req, httplib::Response& res) {
      complete(req, res, false);
    }));
    http.set_error_handler([](const httplib::Request&, httplib::Response& res) {
      if (!res.body.empty()) return;
      const std::string message = res.status == 404   ? "no such endpoint"
                                  : res.status == 405 ? "method not allowed"
                                  : res.status == 413 ? "request body too large"
                                                      : fmt::format("HTTP error {}", res.status);
      send_json(res, res.status, error_body(res.status == 404 ? "not_found_error" : "invalid_request_error", message));
    });
    http.set_exception_handler([](const httplib::Request&, httplib::Response& res, std::exception_ptr ep) {
      std::string message = "internal error";
      try {
        if (ep) std::rethrow_exception(ep);
      } catch (const std::exception& e) {
        message = e.what();
      } catch (...) {
      }
      send_json(res, 500, error_body("server_error", message));
    });
  }

 private:
  using Handler = std::function<void(const httplib::Request&, httplib::Response&)>;

  // API key check and RequestError -> OpenAI error body.
  Handler guarded(Handler h) {
    return [this, h](const httplib::Request& req, httplib::Response& res) {
      if (!o_.api_key.empty() && req.get_header_value("Authorization") != "Bearer " + o_.api_key) {
        worker_.count(&Counters::unauthorized);
        send_json(res, 401, error_body("authentication_error", "invalid or missing API key (Authorization: Bearer KEY)"));
        return;
      }
      try {
        h(req, res);
      } catch (const RequestError& e) {
        if (e.status == 400) worker_.count(&Counters::bad_request);
        send_json(res, e.status, error_body(e.type, e.what(), e.param, e.code));
      } catch (const Error& e) {
        worker_.count(&Counters::bad_request);
        send_json(res, 400, error_body("invalid_request_error", e.what()));
      }
    };
  }

  void complete(const httplib::Request& req, httplib::Response& res, bool chat) {
    CompletionRequest request = parse_completion_request(req.body, chat, request_context());
    auto job = std::make_shared<Job>();
    job->params = std::move(request.params);
    job->prompt = std::move(request.prompt);
    job->n = request.n;
    const bool stream = request.stream;
    if (!worker_.submit(job)) {
      res.set_header("Retry-After", "1");
      if (worker_.shutting_down()) {
        send_json(res, 503, error_body("server_shutting_down", kShuttingDown));
        return;
      }
      send_json(res, 503, error_body("server_busy", fmt::format("the server is busy: {} requests are already waiting; "
                                                                "retry later", o_.queue)));
      return;
    }
    Completion c{chat, std::move(request.reply), request.include_usage, random_id(chat ? "chatcmpl" : "cmpl"),
                 static_cast<int64_t>(std::time(nullptr)), model_name_, request.n, request.logprobs(),
                 worker_.model().tokenizer.get()};
    // Counted until the library is done with the response (it destroys the provider then).
    ++responding_;
    const auto responding = std::shared_ptr<void>(nullptr, [this](void*) { --responding_; });
    if (stream) stream_response(res, job, c, responding);
    else whole_response(req, res, job, c, responding);
  }

 public:
  // Waits (up to `limit`) until every accepted completion has been answered: at shutdown the
  // library stops writing responses once stopped, which would cut their error off.
  void wait_answered(std::chrono::seconds limit) const {
    const auto deadline = std::chrono::steady_clock::now() + limit;
    while (responding_.load() > 0 && std::chrono::steady_clock::now() < deadline) {
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
  }

 private:
  std::atomic<int> responding_{0};

  // Non-streaming: the answer, or the error with its own HTTP status (500, 503 at shutdown),
  // once the job is done. Nothing may be written before: the first byte commits the status line.
  // A vanished client must still cancel its job, so the wait polls the connection's socket for
  // a hang-up. Where that socket cannot be found, the old way is kept: a space each second
  // (JSON allows leading whitespace), whose failed write notices the client, at the price of
  // a 200 for a late error.
  void whole_response(const httplib::Request& req, httplib::Response& res, const std::shared_ptr<Job>& job,
                      const Completion& c, const std::shared_ptr<void>& responding) {
    const int sock = client_socket(req);
    if (sock < 0) return whitespace_response(res, job, c, responding);
    std::unique_lock<std::mutex> lock(job->mutex);
    while (!job->changed.wait_for(lock, std::chrono::milliseconds(250), [&] { return job->done; })) {
      if (client_hung_up(sock)) {
        job->cancel.store(true);  // the worker skips it, or stops it at the next token
        return;
      }
    }
    // A plain body (not a provider): the library writes it even once stopping at shutdown.
    if (job->error.empty()) return send_json(res, 200, full_response(c, job->results));
    if (job->error_status == 503) res.set_header("Retry-After", "1");
    send_json(res, job->error_status, job_error(*job));
  }

  void whitespace_response(httplib::Response& res, const std::shared_ptr<Job>& job, const Completion& c,
                           const std::shared_ptr<void>& responding) {
    res.set_chunked_content_provider("application/json", [job, c](size_t, httplib::DataSink& sink) {
      std::unique_lock<std::mutex> lock(job->mutex);
      if (!job->changed.wait_for(lock, std::chrono::seconds(1), [&] { return job->done; })) {
        lock.unlock();
        if (!sink.write(" ", 1)) {
          job->cancel.store(true);
          return false;
        }
        return true;
      }
      const std::string text = (job->error.empty() ? full_response(c, job->results) : job_error(*job)).dump();
      sink.write(text.data(), text.size());
      sink.done();
      return true;
    }, [job, responding](bool) { job->cancel.store(true); });
  }

  // Server-sent events: per choice a role chunk (chat), its pieces, a finish chunk; the last
  // finish chunk carries usage and timings; then the usage chunk if asked for, and [DONE].
  void stream_response(httplib::Response& res, const std::shared_ptr<Job>& job, const Completion& c,
                       const std::shared_ptr<void>& responding) {
    res.set_header("Cache-Control", "no-cache");
    auto writer = std::make_shared<StreamWriter>(c);
    res.set_chunked_content_provider("text/event-stream", [job, writer](size_t, httplib::DataSink& sink) {
      const bool ok = writer->step(*job, sink);
      if (!ok) job->cancel.store(true);  // the client is gone
      return ok;
    }, [job, responding](bool) { job->cancel.store(true); });
  }

  DecodeWorker& worker_;
  RequestContext request_context() const {
    RequestContext c;
    c.tokenizer = worker_.model().tokenizer.get();
    c.chat_template = &chat_template_;
    c.n_ctx = worker_.n_ctx();
    c.n_predict = o_.n_predict;
    c.sampling = o_.sampling;
    c.no_think = o_.no_think;
    c.split_reasoning = o_.reasoning_format == "deepseek";
    c.tool_format = tool_format_;
    c.ignore_eos = o_.ignore_eos;
    c.draft = o_.draft;
    return c;
  }

  const ServerOptions& o_;
  std::string model_name_;
  ChatTemplate chat_template_;
  ToolFormat tool_format_ = ToolFormat::None;  // how the template writes tool calls
};

constexpr int kListenBacklog = 512;

int serve(const ServerOptions& o) {
  // Signals go to one waiting thread (blocked everywhere else), which stops the server.
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGINT);
  sigaddset(&signals, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);
  std::signal(SIGPIPE, SIG_IGN);

  LoadedRun loaded = load_run(run_config(o.run));
  ServerOptions resolved = o;
  resolved.draft = draft_config(loaded);
  DecodeWorker worker(std::move(loaded), resolved);
  Server api(worker, resolved);
  httplib::Server http;
  // Each connection holds an HTTP thread while it is open (the library has no event loop), so
  // slow or idle clients must not be able to take them all: many threads (cheap while they
  // wait), and reads that stall for 10 s close the connection.
  const int threads = o.http_threads > 0 ? o.http_threads : std::max(64, o.queue + 16);
  http.new_task_queue = [threads] { return new httplib::ThreadPool(static_cast<size_t>(threads)); };
  http.set_payload_max_length(16u << 20);
  http.set_read_timeout(10, 0);
  http.set_keep_alive_timeout(5);
  // The library's default sets SO_REUSEPORT, which let a second server bind the same busy port
  // and the kernel split connections between the two: address reuse only. The listening
  // socket's descriptor is kept to raise its backlog after bind (the library listens with 5).
  int listening = -1;
  http.set_socket_options([&listening](int sock) {
    const int yes = 1;
    ::setsockopt(sock, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof(yes));
    if (listening < 0) listening = sock;
  });
  api.install(http);
  if (!http.bind_to_port(o.host, o.port)) fail("cannot listen on {}:{} (in use, or not permitted)", o.host, o.port);
  if (listening >= 0) ::listen(listening, kListenBacklog);
  std::thread stopper([&] {
    int sig = 0;
    sigwait(&signals, &sig);
    fmt::print(stderr, "server: stopping (signal {}): the running request is cancelled, queued ones are answered\n", sig);
    worker.shutdown();
    api.wait_answered(std::chrono::seconds(10));
    http.stop();
  });
  fmt::print(stderr, "server: listening on http://{}:{} (chat: {}, queue {}, {} HTTP threads{})\n", o.host, o.port,
             api.chat_template_description(),
             o.queue, threads, o.api_key.empty() ? "" : ", API key required");
  http.listen_after_bind();
  pthread_kill(stopper.native_handle(), SIGTERM);  // if the server stopped by itself
  stopper.join();
  save_cache_file(worker.run());
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"bmoe-server: OpenAI-compatible HTTP server for a MoE GGUF model"};
  app.set_version_flag("--version", BMOE_VERSION);
  ServerOptions o;
  add_run_flags(app, o.run);
  app.add_option("--host", o.host, "address to bind (default loopback only)")->capture_default_str();
  app.add_option("--port", o.port, "port")->capture_default_str()->check(CLI::Range(0, 65535));
  app.add_option("--api-key", o.api_key, "require 'Authorization: Bearer KEY' on every endpoint but /health");
  app.add_option("--alias", o.alias, "model name reported by /v1/models (default: the file name)");
  app.add_option("--queue", o.queue, "requests that may wait while one decodes; more get 503")->capture_default_str()->check(CLI::Range(0, 4096));
  app.add_option("--http-threads", o.http_threads, "HTTP worker threads (default: queue + 8, at least 16)")->check(CLI::Range(1, 4096));
  app.add_option("-n,--n-predict", o.n_predict, "default max_tokens (-1: up to the context for chat, 16 for completions)")->capture_default_str();
  add_sampling_flags(app, o.sampling, 2.0);  // a request's temperature goes up to 2 (OpenAI)
  app.add_flag("--ignore-eos", o.ignore_eos, "keep generating past end-of-text tokens by default (as llama-server; the request's ignore_eos overrides)");
  app.add_flag("--no-think", o.no_think, "answer without reasoning by default (chat_template_kwargs.enable_thinking overrides)");
  app.add_option("--reasoning-format", o.reasoning_format,
                 "chat: deepseek puts an answer's leading <think> block in message.reasoning_content "
                 "(delta.reasoning_content when streaming); none leaves it in content")
      ->capture_default_str()->check(CLI::IsMember({"deepseek", "none"}));
  if (const std::optional<int> status = parse_command_line(app, argc, argv)) return *status;
  if (!utf8_valid(o.alias)) {
    fmt::print(stderr, "error: --alias must be valid UTF-8\n");
    return 2;
  }
  try {
    check_output_path(o.run.config.cache_file, "--cache-file");
    return serve(o);
  } catch (const std::exception& e) {
    fmt::print(stderr, "error: {}\n", e.what());
    return 1;
  }
}
