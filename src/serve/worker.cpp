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

// Per slot (--parallel; one slot without it): busy or not, and its counts since start. The
// per-slot counters sum to the totals (llamacpp:prompt_tokens_total, ...).
void add_slot_metrics(MetricsText& m, const std::vector<SlotView>& slots, bool single_busy) {
  std::string busy;
  for (const SlotView& v : slots) {
    const bool is_busy = v.state != "idle" || single_busy;
    busy += fmt::format("bmoe_slot_busy{{slot=\"{}\",state=\"{}\"}} {}\n", v.id, single_busy ? "decoding" : v.state, is_busy ? 1 : 0);
  }
  m.add("bmoe_slot_busy", "gauge", "1 while the slot reads a prompt or decodes (--parallel).", busy);
  const auto per_slot = [&](const char* name, const char* help, uint64_t SlotView::*field) {
    std::string samples;
    for (const SlotView& v : slots) samples += fmt::format("{}{{slot=\"{}\"}} {}\n", name, v.id, v.*field);
    m.add(name, "counter", help, samples);
  };
  per_slot("bmoe_slot_requests_total", "Requests the slot finished.", &SlotView::requests);
  per_slot("bmoe_slot_generated_pieces_total", "Text pieces the slot streamed (--parallel > 1).", &SlotView::generated_tokens);
  per_slot("bmoe_slot_prompt_tokens_total", "Prompt tokens the slot evaluated (kept ones left out).", &SlotView::prompt_tokens);
  per_slot("bmoe_slot_prompt_tokens_cached_total", "Prompt tokens the slot kept from its KV cache.", &SlotView::cached_tokens);
  per_slot("bmoe_slot_tokens_predicted_total", "Tokens the slot generated.", &SlotView::predicted_tokens);
}

// llama-server's own /metrics names and meanings (llamacpp:*), so that its dashboards read ours.
void add_llama_metrics(MetricsText& m, const Counters& c, size_t processing, size_t deferred) {
  const auto counter = [&](const char* name, const char* help, double v) { m.add_value(name, "counter", help, v); };
  counter("llamacpp:prompt_tokens_total", "Number of prompt tokens processed, excluding cached tokens",
          static_cast<double>(c.prompt_tokens - c.reused_tokens));
  counter("llamacpp:prompt_tokens_cached_total", "Number of prompt tokens reused from the cache", static_cast<double>(c.reused_tokens));
  counter("llamacpp:prompt_seconds_total", "Total time spent processing prompts", c.prefill_seconds);
  counter("llamacpp:tokens_predicted_total", "Number of generation tokens processed", static_cast<double>(c.generated_tokens));
  counter("llamacpp:tokens_predicted_seconds_total", "Total time spent generating tokens", c.decode_seconds);
  counter("llamacpp:n_decode_total", "Total number of forward passes (prompt batches and decode steps), drafters' left out",
          static_cast<double>(c.passes));
  counter("llamacpp:n_tokens_max", "Largest observed sequence length (prompt + generation)", static_cast<double>(c.n_tokens_max));
  counter("llamacpp:spec_decode_num_draft_tokens_total", "Speculative: Total draft tokens generated", static_cast<double>(c.drafted_tokens));
  counter("llamacpp:spec_decode_num_accepted_tokens_total", "Speculative: Total draft tokens accepted by the target model",
          static_cast<double>(c.accepted_tokens));
  counter("llamacpp:spec_decode_num_drafts_total", "Speculative: Total speculative decoding verification steps",
          static_cast<double>(c.verify_steps));
  const auto gauge = [&](const char* name, const char* help, double v) { m.add_value(name, "gauge", help, v); };
  gauge("llamacpp:prompt_tokens_seconds", "Average prompt throughput in tokens/s", c.prompt_window.per_second());
  gauge("llamacpp:predicted_tokens_seconds", "Average generation throughput in tokens/s", c.predict_window.per_second());
  gauge("llamacpp:requests_processing", "Number of requests processing", static_cast<double>(processing));
  gauge("llamacpp:requests_deferred", "Number of requests deferred", static_cast<double>(deferred));
  gauge("llamacpp:n_busy_slots_per_decode", "Average number of busy slots per forward pass",
        static_cast<double>(c.busy_slots_in_passes) / static_cast<double>(std::max<uint64_t>(c.passes, 1)));
}

void add_histogram(MetricsText& m, const char* name, const char* help, const DurationHistogram& h) {
  std::string samples;
  uint64_t below = 0;
  for (size_t i = 0; i < DurationHistogram::kBuckets; ++i) {
    below += h.counts[i];
    samples += fmt::format("{}_bucket{{le=\"{}\"}} {}\n", name, DurationHistogram::kBounds[i], below);
  }
  samples += fmt::format("{0}_bucket{{le=\"+Inf\"}} {1}\n{0}_sum {2}\n{0}_count {1}\n", name, h.n, h.sum);
  m.add(name, "histogram", help, samples);
  const std::string max = std::string(name) + "_max";
  m.add_value(max.c_str(), "gauge", "The largest of them since start.", h.max);
}

// --parallel > 1: what the shared batch did, and what sharing its experts saved.
void add_batch_metrics(MetricsText& m, const Counters& c) {
  const BatchShare& b = c.batch;
  m.add_value("bmoe_batch_steps_total", "counter", "Decode steps of the shared batch (--parallel > 1).", static_cast<double>(b.steps));
  m.add_value("bmoe_batch_rows_total", "counter", "Rows those steps fed: each running answer's token and its draft tokens (--draft).",
              static_cast<double>(b.rows));
  m.add_value("bmoe_batch_routed_expert_slots_total", "counter", "Routed (row, expert) choices of those rows, all layers.",
              static_cast<double>(b.routed_slots));
  m.add_value("bmoe_batch_expert_lookups_total", "counter", "Distinct experts looked up for them: one per expert, layer and step.",
              static_cast<double>(b.distinct_experts));
  m.add_value("bmoe_batch_expert_lookups_saved_total", "counter",
              "Lookups (reads, on a cache miss) saved by rows sharing an expert: routed choices less distinct experts.",
              static_cast<double>(b.routed_slots - b.distinct_experts));
  m.add_value("bmoe_batch_expert_sharing_ratio", "gauge", "Distinct experts / routed choices of the batch's steps (1: no sharing).",
              b.routed_slots ? static_cast<double>(b.distinct_experts) / static_cast<double>(b.routed_slots) : 1.0);
  m.add_value("bmoe_batch_rows_per_step", "gauge", "Average rows per decode step of the batch.",
              b.steps ? static_cast<double>(b.rows) / static_cast<double>(b.steps) : 0.0);
  add_histogram(m, "bmoe_batch_step_seconds", "One decode step of the batch (--parallel > 1).", c.step_seconds);
  m.add_value("bmoe_batch_decode_seconds_total", "counter",
              "The decode rows' share of the steps' passes (a pass that also read a prompt chunk is split by rows).",
              b.decode_part.seconds);
  m.add_value("bmoe_batch_prompt_seconds_total", "counter",
              "The prompt chunks' rows' share of the steps' passes; with the decode rows' share, the passes' time.",
              b.prompt_part.seconds);
  m.add_value("bmoe_batch_chunk_steps_total", "counter",
              "Decode steps whose pass also read a prompt chunk (one pass for both, each expert read once).",
              static_cast<double>(b.chunk_steps));
  add_histogram(m, "bmoe_prompt_chunk_seconds",
                "One prompt chunk (-b tokens): its rows' share of the step's pass that read it, or its own pass (--parallel > 1).",
                c.chunk_seconds);
  add_histogram(m, "bmoe_token_gap_seconds",
                "Between two tokens of one running answer, on the worker (--parallel > 1): a step, and a chunk when one was read.",
                c.token_gap_seconds);
  add_histogram(m, "bmoe_token_gap_overhead_seconds",
                "Of each such gap, the time neither its step nor the turn's one prompt chunk (or embeddings input) took.",
                c.token_gap_overhead_seconds);
}

}  // namespace

void DurationHistogram::add(double seconds) {
  size_t i = 0;
  while (i < kBuckets && seconds > kBounds[i]) ++i;
  ++counts[i];
  ++n;
  sum += seconds;
  max = std::max(max, seconds);
}

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
  // With slots, a request that a free slot takes at the worker's next turn is not waiting: the
  // bound is on the requests beyond the free slots (else a burst that arrives before the worker's
  // next turn would be refused with slots free).
  const size_t free_slots = slots_.size() - std::min(active_.size(), slots_.size());
  if (queue_.size() >= capacity_ + free_slots) {
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
  add_batch_metrics(m, counters_);
  add_llama_metrics(m, counters_, slots_.empty() ? (busy_ ? 1 : 0) : active_.size(), queue_.size());
  m.add_value("bmoe_rss_bytes", "gauge", "Resident set size of the server.", static_cast<double>(read_memory().rss));
  // As llama-server: the rates are averaged over the window between two scrapes.
  counters_.prompt_window = counters_.predict_window = RateWindow{};
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
void DecodeWorker::run_embeddings(Job& job, Session& session, int slot_id) {
  EmbeddingsDone done;
  while (embed_next(job, session, done)) {
  }
  finish_embeddings(job, done, slot_id);
}

// The job's next input embedded (the slots run one between two decode steps); false once the
// job is over: every input done, cancelled before this one, or failed.
bool DecodeWorker::embed_next(Job& job, Session& session, EmbeddingsDone& done) {
  if (job.cancel.load() || done.vectors.size() >= job.embed_inputs.size()) return false;
  const std::vector<int32_t>& input = job.embed_inputs[done.vectors.size()];
  GenerateResult r;
  r.prompt_tokens = static_cast<int>(input.size());
  r.finish_reason = "stop";
  try {
    Stopwatch timer;
    done.vectors.push_back(session.embed(input, job.pooling));
    r.prefill_seconds = timer.seconds();
  } catch (const std::exception& e) {
    done.error = e.what();
    session.reset();
    return false;
  }
  done.results.push_back(r);
  return done.vectors.size() < job.embed_inputs.size();
}

void DecodeWorker::finish_embeddings(Job& job, EmbeddingsDone& done, int slot_id) {
  const bool cancelled = done.vectors.size() < job.embed_inputs.size() && done.error.empty();
  if (cancelled) done.error = shutting_down() ? kShuttingDown : "cancelled";
  record(done.results, !done.error.empty() && !cancelled, cancelled, slot_id);
  {
    std::lock_guard<std::mutex> lock(job.mutex);
    job.embeddings = std::move(done.vectors);
  }
  finish(job, std::move(done.results), done.error, cancelled && shutting_down() ? 503 : 500);
}

void DecodeWorker::run_job(Job& job) {
  if (!job.embed_inputs.empty()) return run_embeddings(job, *session_, 0);
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
  record(results, !error.empty(), cancelled, 0);
  finish(job, std::move(results), error, status);
}

// A finished job's outcome and token counts, into the counters and those of the slot it ran on.
void DecodeWorker::record(const std::vector<GenerateResult>& results, bool failed, bool cancelled, int slot_id) {
  std::lock_guard<std::mutex> lock(mutex_);
  Counters& c = counters_;
  if (failed) ++c.failed;
  else if (cancelled) ++c.cancelled;
  else ++c.ok;
  SlotView& slot = slot_views_[static_cast<size_t>(slot_id)];
  ++slot.requests;
  for (const GenerateResult& result : results) {
    const uint64_t evaluated = static_cast<uint64_t>(std::max(result.prompt_tokens - result.reused_tokens, 0));
    c.prompt_tokens += static_cast<uint64_t>(result.prompt_tokens);
    c.reused_tokens += static_cast<uint64_t>(result.reused_tokens);
    c.generated_tokens += result.tokens.size();
    c.decode_seconds += result.decode_seconds;
    c.drafted_tokens += static_cast<uint64_t>(result.drafted);
    c.accepted_tokens += static_cast<uint64_t>(result.accepted);
    c.verify_steps += static_cast<uint64_t>(result.verify_steps);
    c.prefill_seconds += result.prefill_seconds;
    c.n_tokens_max = std::max(c.n_tokens_max, static_cast<uint64_t>(result.prompt_tokens) + result.tokens.size());
    slot.prompt_tokens += evaluated;
    slot.cached_tokens += static_cast<uint64_t>(result.reused_tokens);
    slot.predicted_tokens += result.tokens.size();
    if (!result.tokens.empty()) {
      c.last_decode_tps = static_cast<double>(result.tokens.size()) / std::max(result.decode_seconds, 1e-9);
      // Kept draft tokens came without a step of their own (llama-server's rate counts steps).
      c.predict_window.add(static_cast<double>(result.tokens.size()) - static_cast<double>(result.accepted), result.decode_seconds);
    }
    if (evaluated > 0) {
      c.last_prompt_tps = static_cast<double>(evaluated) / std::max(result.prefill_seconds, 1e-9);
      c.prompt_window.add(static_cast<double>(evaluated), result.prefill_seconds);
    }
  }
  c.live_pieces = 0;
  c.experts = run_.model->experts->stats();
}

void DecodeWorker::count_pass(int busy_slots) {
  std::lock_guard<std::mutex> lock(mutex_);
  ++counters_.passes;
  counters_.busy_slots_in_passes += static_cast<uint64_t>(busy_slots);
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
  ChoiceTelemetry telemetry(job, index, static_cast<int>(prompt.size()), session_->kept_prefix(prompt));
  BudgetWatch budget(job.reasoning_budget, prompt.size());
  const auto on_piece = [&](const std::string& piece) {
    publish_progress();
    const size_t fed = session_->history().size();
    job.push({index, piece, std::nullopt, {}, std::nullopt, telemetry.piece(fed)});
    return budget.piece(piece, fed) && in_time(piece);
  };
  const auto on_logprob = [&job, index](const TokenLogprob& lp) { job.push({index, {}, lp, {}}); };
  const auto on_step = [this](size_t) { count_pass(1); };
  // The prompt's passes: the tokens it evaluated (at least its last), batched by -b.
  const auto count_prompt_passes = [this](const GenerateResult& r) {
    const int evaluated = r.prompt_tokens - r.reused_tokens, n_batch = std::max(session_->n_batch(), 1);
    for (int i = 0; i < (evaluated + n_batch - 1) / n_batch; ++i) count_pass(1);
  };
  GenerateResult result = generate(*session_, prompt, params, on_piece, &job.cancel, on_logprob,
                                   [this, &telemetry](double done, int total, double) {  // the web chat's "reading prompt n/N"
                                     telemetry.prompt_read(done);
                                     std::lock_guard<std::mutex> lock(mutex_);
                                     prompt_done_ = static_cast<int>(done);
                                     prompt_total_ = total;
                                   }, on_step);
  count_prompt_passes(result);
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
  GenerateResult rest = generate(*session_, next, params, on_piece, &job.cancel, on_logprob, {}, on_step);
  count_prompt_passes(rest);
  append_rest(result, rest);
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
