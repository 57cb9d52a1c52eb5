#include "serve/worker.h"

#include <fmt/format.h>

#include <algorithm>
#include <exception>

#include "core/timer.h"
#include "telemetry/system.h"

namespace bmoe {
namespace {

// Prometheus' text format, one metric after the other (HELP, TYPE, samples).
class MetricsText {
 public:
  void add(const char* name, const char* type, const char* help, const std::string& samples) {
    out_ += fmt::format("# HELP {} {}\n# TYPE {} {}\n{}", name, help, name, type, samples);
  }
  // A metric with one sample and no labels.
  void add_value(const char* name, const char* type, const char* help, double v) {
    add(name, type, help, fmt::format("{} {}\n", name, v));
  }
  std::string take() { return std::move(out_); }

 private:
  std::string out_;
};

// llama-server's live telemetry of one choice: prompt_progress events while its prompt is read
// (return_progress) and the timings so far with each piece (timings_per_token).
class ChoiceTelemetry {
 public:
  ChoiceTelemetry(Job& job, int index, const std::vector<int32_t>& prompt, const std::vector<int32_t>& history)
      : job_(job), index_(index), total_(static_cast<int>(prompt.size())) {
    // What prefill_reusing keeps: the common prefix, less the last prompt token (evaluated again).
    const auto diff = std::mismatch(prompt.begin(), prompt.end(), history.begin(), history.end());
    cache_ = std::min(static_cast<int>(diff.first - prompt.begin()), std::max(total_ - 1, 0));
  }

  // Session::prefill_reusing's progress: one event per whole token more done.
  void prompt_read(double done) {
    const int processed = std::min(static_cast<int>(done), total_);
    if (!job_.return_progress || processed <= last_processed_) return;
    last_processed_ = processed;
    job_.push({index_, {}, std::nullopt, {}, PromptProgress{total_, cache_, processed, clock_.seconds() * 1e3}, std::nullopt});
  }

  // A piece of text; `fed` is the session's history length (the sampled tokens before this one).
  std::optional<LiveTimings> piece(size_t fed) {
    if (!job_.timings_per_token) return std::nullopt;
    if (!prompt_ms_) prompt_ms_ = clock_.seconds() * 1e3;
    const int predicted = static_cast<int>(fed) - total_ + 1;
    return LiveTimings{cache_, total_ - cache_, std::max(predicted, 1), *prompt_ms_, clock_.seconds() * 1e3 - *prompt_ms_};
  }

 private:
  Job& job_;
  int index_, total_, cache_ = 0, last_processed_ = -1;
  Stopwatch clock_;
  std::optional<double> prompt_ms_;
};

// reasoning_budget_tokens > 0: counts the answer's tokens inside its think block; spent once
// the budget is reached before the block closed (the piece callback then stops the answer).
class BudgetWatch {
 public:
  BudgetWatch(const ReasoningBudget& b, size_t prompt_size) : b_(b) {
    if (b_.tokens > 0 && b_.opened_by_prompt) start_ = prompt_size;
  }

  // A piece; `fed` is the session's history length (this piece's token not yet in it). False:
  // the budget is spent now.
  bool piece(const std::string& piece, size_t fed) {
    if (b_.tokens <= 0 || spent_ || closed_) return true;
    text_ += piece;
    if (!start_) {
      const size_t at = text_.find(b_.open);
      if (at == std::string::npos) return true;
      start_ = fed;
      text_.erase(0, at + b_.open.size());
    }
    if (text_.find(b_.close) != std::string::npos) {
      closed_ = true;
      return true;
    }
    spent_ = fed + 1 - *start_ >= static_cast<size_t>(b_.tokens);
    return !spent_;
  }
  bool spent() const { return spent_; }

 private:
  const ReasoningBudget& b_;
  std::optional<size_t> start_;  // history length where the reasoning began
  std::string text_;             // the answer's text since then
  bool spent_ = false, closed_ = false;
};

// A choice cut by its reasoning budget, with the close tag written: its tokens and text.
void append_forced(GenerateResult& r, const std::vector<int32_t>& tokens, const std::string& text) {
  r.tokens.insert(r.tokens.end(), tokens.begin(), tokens.end());
  r.text += text;
}

// The answer after the forced close tag, appended to the part before it.
void append_rest(GenerateResult& r, const GenerateResult& rest) {
  append_forced(r, rest.tokens, rest.text);
  r.finish_reason = rest.finish_reason;
  r.decode_seconds += rest.prefill_seconds + rest.decode_seconds;
  r.drafted += rest.drafted;
  r.accepted += rest.accepted;
}

void add_request_metrics(MetricsText& m, const Counters& c, size_t depth, size_t capacity, bool busy) {
  m.add("bmoe_requests_total", "counter", "Completion requests by outcome.",
        fmt::format("bmoe_requests_total{{outcome=\"ok\"}} {}\nbmoe_requests_total{{outcome=\"rejected_busy\"}} {}\n"
                    "bmoe_requests_total{{outcome=\"bad_request\"}} {}\nbmoe_requests_total{{outcome=\"cancelled\"}} {}\n"
                    "bmoe_requests_total{{outcome=\"error\"}} {}\nbmoe_requests_total{{outcome=\"unauthorized\"}} {}\n",
                    c.ok, c.rejected_busy, c.bad_request, c.cancelled, c.failed, c.unauthorized));
  m.add_value("bmoe_queue_depth", "gauge", "Requests waiting to be decoded.", static_cast<double>(depth));
  m.add_value("bmoe_queue_capacity", "gauge", "Waiting requests accepted before 503.", static_cast<double>(capacity));
  m.add_value("bmoe_busy", "gauge", "1 while a request is being decoded.", busy ? 1 : 0);
}

void add_token_metrics(MetricsText& m, const Counters& c) {
  m.add_value("bmoe_prompt_tokens_total", "counter", "Prompt tokens received.", static_cast<double>(c.prompt_tokens));
  m.add_value("bmoe_prompt_tokens_reused_total", "counter", "Prompt tokens served from the kept KV prefix.",
              static_cast<double>(c.reused_tokens));
  m.add_value("bmoe_generated_tokens_total", "counter", "Tokens generated.", static_cast<double>(c.generated_tokens));
  m.add_value("bmoe_decode_seconds_total", "counter", "Time spent generating tokens.", c.decode_seconds);
  m.add_value("bmoe_draft_tokens_total", "counter", "Draft tokens verified (--draft).", static_cast<double>(c.drafted_tokens));
  m.add_value("bmoe_draft_tokens_accepted_total", "counter", "Draft tokens kept by verification.",
              static_cast<double>(c.accepted_tokens));
  m.add_value("bmoe_prefill_seconds_total", "counter", "Time spent evaluating prompts.", c.prefill_seconds);
  m.add_value("bmoe_decode_tokens_per_second", "gauge", "Decode speed of the last request.", c.last_decode_tps);
  m.add_value("bmoe_prompt_tokens_per_second", "gauge", "Prompt speed of the last request that evaluated prompt tokens.",
              c.last_prompt_tps);
}

void add_expert_metrics(MetricsText& m, const ExpertStats& e) {
  m.add_value("bmoe_expert_lookups_total", "counter", "Routed-expert lookups.", static_cast<double>(e.requests));
  m.add_value("bmoe_expert_cache_hits_total", "counter", "Lookups served from the expert cache.", static_cast<double>(e.hits));
  m.add_value("bmoe_expert_cache_hit_ratio", "gauge", "Expert cache hits / lookups since start.",
              e.requests ? static_cast<double>(e.hits) / static_cast<double>(e.requests) : 0.0);
  m.add_value("bmoe_flash_read_bytes_total", "counter", "Bytes of experts read from the model file.",
              static_cast<double>(e.bytes_read));
  m.add_value("bmoe_flash_read_mib_total", "counter", "The same in MiB.", static_cast<double>(e.bytes_read) / 1048576.0);
  m.add_value("bmoe_expert_cache_used_bytes", "gauge", "Bytes held by the expert cache.", static_cast<double>(e.cache_used_bytes));
}

// Per slot (--parallel): busy or not, and its requests and generated pieces since start.
void add_slot_metrics(MetricsText& m, const std::vector<SlotView>& slots, bool single_busy) {
  std::string busy, requests, generated;
  for (const SlotView& v : slots) {
    const bool is_busy = v.state != "idle" || single_busy;
    busy += fmt::format("bmoe_slot_busy{{slot=\"{}\",state=\"{}\"}} {}\n", v.id, single_busy ? "decoding" : v.state, is_busy ? 1 : 0);
    requests += fmt::format("bmoe_slot_requests_total{{slot=\"{}\"}} {}\n", v.id, v.requests);
    generated += fmt::format("bmoe_slot_generated_pieces_total{{slot=\"{}\"}} {}\n", v.id, v.generated_tokens);
  }
  m.add("bmoe_slot_busy", "gauge", "1 while the slot reads a prompt or decodes (--parallel).", busy);
  m.add("bmoe_slot_requests_total", "counter", "Requests the slot finished (--parallel > 1).", requests);
  m.add("bmoe_slot_generated_pieces_total", "counter", "Text pieces the slot streamed (--parallel > 1).", generated);
}

}  // namespace

DecodeWorker::DecodeWorker(LoadedRun run, size_t queue_capacity)
    : run_(std::move(run)), pool_(run_.config.thread_count()), session_(open_session(run_, pool_)),
      capacity_(queue_capacity) {
  counters_.experts = run_.model->experts->stats();
  start_slots();
  worker_ = std::thread([this] { run_.config.parallel > 1 ? work_slots() : work(); });
}

DecodeWorker::~DecodeWorker() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
  }
  wake_.notify_all();
  worker_.join();
}

void DecodeWorker::shutdown() {
  std::lock_guard<std::mutex> lock(mutex_);
  if (shutting_down_) return;
  shutting_down_ = true;
  if (current_) current_->cancel.store(true);
  for (auto& job : active_) job->cancel.store(true);
  for (auto& job : queue_) finish(*job, {}, kShuttingDown, 503);
  queue_.clear();
}

bool DecodeWorker::shutting_down() {
  std::lock_guard<std::mutex> lock(mutex_);
  return shutting_down_;
}

bool DecodeWorker::submit(const std::shared_ptr<Job>& job) {
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

void DecodeWorker::count(uint64_t Counters::*field) {
  std::lock_guard<std::mutex> lock(mutex_);
  ++(counters_.*field);
}

std::string DecodeWorker::prometheus() {
  std::lock_guard<std::mutex> lock(mutex_);
  MetricsText m;
  add_request_metrics(m, counters_, queue_.size(), capacity_, busy_);
  add_token_metrics(m, counters_);
  add_expert_metrics(m, counters_.experts);
  add_slot_metrics(m, slot_views_, slots_.empty() && busy_);
  m.add_value("bmoe_rss_bytes", "gauge", "Resident set size of the server.", static_cast<double>(read_memory().rss));
  return m.take();
}

nlohmann::ordered_json DecodeWorker::stats() {
  std::lock_guard<std::mutex> lock(mutex_);
  const Counters& c = counters_;
  const ExpertStats& e = c.experts;
  const MemorySnapshot m = read_memory();
  nlohmann::ordered_json memory = {{"rss_bytes", m.rss}, {"peak_rss_bytes", m.peak_rss}};
  if (const std::optional<uint64_t> available = m.available()) memory["available_bytes"] = *available;
  return {{"busy", busy_},
          {"queue_depth", queue_.size()},
          {"prompt", {{"done", prompt_done_}, {"total", prompt_total_}}},
          {"prompt_tokens", c.prompt_tokens},
          {"generated_tokens", c.generated_tokens + c.live_pieces},
          {"last_decode_tokens_per_second", c.last_decode_tps},
          {"last_prompt_tokens_per_second", c.last_prompt_tps},
          {"experts", {{"streamed", run_.model->streamer() != nullptr},  // false: all mapped, no cache
                       {"lookups", e.requests}, {"hits", e.hits}, {"flash_read_bytes", e.bytes_read},
                       {"cache_used_bytes", e.cache_used_bytes}, {"cache_budget_bytes", e.cache_budget_bytes}}},
          {"memory", memory}};
}

void DecodeWorker::work() {
  while (const std::shared_ptr<Job> job = next_job()) {
    run_job(*job);
    std::lock_guard<std::mutex> lock(mutex_);
    busy_ = false;
    current_.reset();
  }
  // Release anyone still waiting.
  std::lock_guard<std::mutex> lock(mutex_);
  for (auto& job : queue_) finish(*job, {}, kShuttingDown, 503);
}

std::shared_ptr<Job> DecodeWorker::next_job() {
  std::unique_lock<std::mutex> lock(mutex_);
  wake_.wait(lock, [&] { return stopping_ || !queue_.empty(); });
  if (stopping_) return nullptr;
  std::shared_ptr<Job> job = queue_.front();
  queue_.pop_front();
  busy_ = true;
  current_ = job;
  return job;
}

// Embeds each input in turn (cancelled between inputs); one result per input carries its
// token count for usage and the counters.
void DecodeWorker::run_embeddings(Job& job, Session& session) {
  std::vector<GenerateResult> results;
  std::vector<std::vector<float>> vectors;
  std::string error;
  for (const std::vector<int32_t>& input : job.embed_inputs) {
    if (job.cancel.load()) break;
    GenerateResult r;
    r.prompt_tokens = static_cast<int>(input.size());
    r.finish_reason = "stop";
    try {
      Stopwatch timer;
      vectors.push_back(session.embed(input, job.pooling));
      r.prefill_seconds = timer.seconds();
    } catch (const std::exception& e) {
      error = e.what();
      session.reset();
      break;
    }
    results.push_back(r);
  }
  const bool cancelled = vectors.size() < job.embed_inputs.size() && error.empty();
  if (cancelled) error = shutting_down() ? kShuttingDown : "cancelled";
  record(results, !error.empty() && !cancelled, cancelled);
  {
    std::lock_guard<std::mutex> lock(job.mutex);
    job.embeddings = std::move(vectors);
  }
  finish(job, std::move(results), error, cancelled && shutting_down() ? 503 : 500);
}

void DecodeWorker::run_job(Job& job) {
  if (!job.embed_inputs.empty()) return run_embeddings(job, *session_);
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
  record(results, !error.empty(), cancelled);
  finish(job, std::move(results), error, status);
}

// A finished job's outcome and token counts, into the counters.
void DecodeWorker::record(const std::vector<GenerateResult>& results, bool failed, bool cancelled) {
  std::lock_guard<std::mutex> lock(mutex_);
  Counters& c = counters_;
  if (failed) ++c.failed;
  else if (cancelled) ++c.cancelled;
  else ++c.ok;
  for (const GenerateResult& result : results) {
    c.prompt_tokens += static_cast<uint64_t>(result.prompt_tokens);
    c.reused_tokens += static_cast<uint64_t>(result.reused_tokens);
    c.generated_tokens += result.tokens.size();
    c.decode_seconds += result.decode_seconds;
    c.drafted_tokens += static_cast<uint64_t>(result.drafted);
    c.accepted_tokens += static_cast<uint64_t>(result.accepted);
    c.prefill_seconds += result.prefill_seconds;
    if (!result.tokens.empty()) c.last_decode_tps = static_cast<double>(result.tokens.size()) / std::max(result.decode_seconds, 1e-9);
    if (result.prompt_tokens > result.reused_tokens) {
      c.last_prompt_tps = (result.prompt_tokens - result.reused_tokens) / std::max(result.prefill_seconds, 1e-9);
    }
  }
  c.live_pieces = 0;
  c.experts = run_.model->experts->stats();
}

// Generates choice `index` of the job, streaming its pieces and log-probabilities as events.
GenerateResult DecodeWorker::run_choice(Job& job, int index, std::string& error) {
  GenerateResult result;
  if (job.cancel.load()) {
    result.finish_reason = "cancelled";
    return result;
  }
  GenerateParams params = job.params;
  params.sampler.seed += static_cast<uint64_t>(index);
  // llama-server's t_max_predict_ms: past the limit, the answer ends at its first line break
  // (timed from the first piece, as llama.cpp times the generation phase).
  std::optional<Stopwatch> since_first_piece;
  bool line_break = false, timed_out = false;
  const auto in_time = [&](const std::string& piece) {
    if (!since_first_piece) since_first_piece.emplace();
    line_break = line_break || piece.find('\n') != std::string::npos;
    timed_out = job.t_max_predict_ms > 0 && line_break && since_first_piece->seconds() * 1e3 > static_cast<double>(job.t_max_predict_ms);
    return !timed_out;
  };
  try {
    const std::vector<int32_t>& prompt = job.choice_prompts.empty() ? job.prompt : job.choice_prompts[static_cast<size_t>(index)];
    result = generate_choice(job, index, prompt, params, in_time);
  } catch (const std::exception& e) {
    error = e.what();
    session_->reset();  // the KV cache may be half-written
  }
  if (timed_out && result.finish_reason == "cancelled" && !job.cancel.load()) result.finish_reason = "stop";
  std::lock_guard<std::mutex> lock(mutex_);
  prompt_done_ = prompt_total_ = 0;
  return result;
}

// One choice's answer, its pieces and log-probabilities streamed as events; with a reasoning
// budget spent, the close tag is written and the answer goes on from there (the kept prefix
// makes that second call read only the tag).
GenerateResult DecodeWorker::generate_choice(Job& job, int index, const std::vector<int32_t>& prompt, GenerateParams params,
                                             const std::function<bool(const std::string&)>& in_time) {
  ChoiceTelemetry telemetry(job, index, prompt, session_->history());
  BudgetWatch budget(job.reasoning_budget, prompt.size());
  const auto on_piece = [&](const std::string& piece) {
    publish_progress();
    const size_t fed = session_->history().size();
    job.push({index, piece, std::nullopt, {}, std::nullopt, telemetry.piece(fed)});
    return budget.piece(piece, fed) && in_time(piece);
  };
  const auto on_logprob = [&job, index](const TokenLogprob& lp) { job.push({index, {}, lp, {}}); };
  GenerateResult result = generate(*session_, prompt, params, on_piece, &job.cancel, on_logprob,
                                   [this, &telemetry](double done, int total, double) {  // the web chat's "reading prompt n/N"
                                     telemetry.prompt_read(done);
                                     std::lock_guard<std::mutex> lock(mutex_);
                                     prompt_done_ = static_cast<int>(done);
                                     prompt_total_ = total;
                                   });
  if (!budget.spent() || result.finish_reason != "cancelled" || job.cancel.load()) return result;
  const std::string& close = job.reasoning_budget.close;
  append_forced(result, session_->tokenize(close, true), close);
  job.push({index, close, std::nullopt, {}, std::nullopt, telemetry.piece(session_->history().size())});
  params.max_tokens -= static_cast<int>(result.tokens.size());
  result.finish_reason = "length";
  if (params.max_tokens <= 0) return result;
  std::vector<int32_t> next = prompt;
  next.insert(next.end(), result.tokens.begin(), result.tokens.end());
  params.grammar_after.clear();  // the tag is written: a grammar holds from here
  append_rest(result, generate(*session_, next, params, on_piece, &job.cancel, on_logprob));
  return result;
}

// Between tokens, on the worker (the expert counters are only written by it): the live
// figures /stats reports while an answer streams. A copy under the lock costs ~1 us a token.
void DecodeWorker::publish_progress() {
  const ExpertStats e = run_.model->experts->stats();
  std::lock_guard<std::mutex> lock(mutex_);
  counters_.experts = e;
  ++counters_.live_pieces;
}

void DecodeWorker::finish(Job& job, std::vector<GenerateResult> results, const std::string& error, int status) {
  std::lock_guard<std::mutex> lock(job.mutex);
  job.results = std::move(results);
  job.error = error;
  job.error_status = status;
  job.done = true;
  job.changed.notify_all();
}

}  // namespace bmoe
