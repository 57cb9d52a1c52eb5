// bmoe-server's decoding side: a job (one completion request's prompt, parameters and output)
// and the one worker thread that runs jobs from a bounded queue on the server's single
// session, whose KV prefix later requests reuse. HTTP threads submit jobs and wait for (or
// stream) their events; the worker keeps the counters /metrics and /stats report.
#pragma once

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "core/thread_pool.h"
#include "core/timer.h"
#include "engine/batch_slots.h"
#include "engine/generate.h"
#include "engine/run.h"
#include "engine/session.h"
#include "text/sampler.h"

namespace bmoe {

inline constexpr const char* kShuttingDown =
    "the server is shutting down (SIGTERM or SIGINT): the request was not completed";

// llama-server's prompt_progress (return_progress): the prompt's tokens, those kept from the
// KV cache, those done so far (kept ones included) and the milliseconds since it started.
struct PromptProgress {
  int total = 0, cache = 0, processed = 0;
  double time_ms = 0;
};

// llama-server's timings so far (timings_per_token), as timings_of counts them for a whole choice.
struct LiveTimings {
  int cache_n = 0, prompt_n = 0, predicted_n = 0;
  double prompt_ms = 0, predicted_ms = 0;
};

// One step of a job's output, in order: a piece of a choice's text, a token's
// log-probabilities, the prompt's progress, or the end of a choice other than the last (the
// last ends with the job).
struct JobEvent {
  int choice = 0;
  std::string text;
  std::optional<TokenLogprob> logprob;
  std::string finish;  // GenerateResult::finish_reason of the choice that ended
  std::optional<PromptProgress> progress;  // Job::return_progress: an event of its own
  std::optional<LiveTimings> timings;      // Job::timings_per_token: with each piece
};

// llama-server's reasoning_budget_tokens > 0: after `tokens` tokens inside the think block (the
// prompt's, or one the answer opens with `open`), the answer is made to write `close` and goes
// on from there (with --parallel 1; the server refuses a budget with more slots).
struct ReasoningBudget {
  int tokens = -1;  // <= 0: no budget
  std::string open, close;
  bool opened_by_prompt = false;
};

struct Job {
  std::vector<int32_t> prompt;
  GenerateParams params;
  int n = 1;  // choices, generated one after the other; choice i is seeded params.sampler.seed + i
  std::vector<std::vector<int32_t>> choice_prompts;  // when set, choice i answers choice_prompts[i]
  int64_t t_max_predict_ms = 0;  // > 0: past this, a choice ends at its first line break
  // llama-server's return_progress and timings_per_token: progress events while the prompt is
  // read (a slot: when it starts, then after each chunk), timings with each piece.
  bool return_progress = false, timings_per_token = false;
  ReasoningBudget reasoning_budget;
  // An embeddings job (set instead of a prompt): each input's pooled vector goes to `embeddings`.
  std::vector<std::vector<int32_t>> embed_inputs;
  Pooling pooling = Pooling::Mean;
  std::vector<std::vector<float>> embeddings;
  std::atomic<bool> cancel{false};
  int slot = 0;  // the slot that runs it (--parallel), set before its first event

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
  // A stream writer's next batch: the events pushed so far (waiting up to a second for one, so
  // a writer also notices a client gone), moved into `out`; returns whether the job had finished
  // when they were taken, so none can follow.
  bool take_events(std::deque<JobEvent>& out) {
    std::unique_lock<std::mutex> lock(mutex);
    changed.wait_for(lock, std::chrono::seconds(1), [&] { return done || !events.empty(); });
    out.swap(events);
    return done;
  }
};

// A Prometheus histogram of durations in seconds (cumulative buckets when written), with the
// largest value seen.
struct DurationHistogram {
  static constexpr double kBounds[] = {0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 10};
  static constexpr size_t kBuckets = sizeof(kBounds) / sizeof(kBounds[0]);
  uint64_t counts[kBuckets + 1] = {};  // per bucket (not cumulative); the last is +Inf
  uint64_t n = 0;
  double sum = 0, max = 0;
  void add(double seconds);
};

// llama-server's generation and prompt rates (llamacpp:predicted_tokens_seconds): decode steps
// (tokens, less the draft tokens verification kept for free) over their seconds, summed over the
// requests that finished since the last /metrics scrape.
struct RateWindow {
  double steps = 0, seconds = 0;
  void add(double n, double s) {
    steps += n;
    seconds += s;
  }
  double per_second() const { return seconds > 0 ? steps / seconds : 0.0; }
};

struct Counters {
  uint64_t ok = 0, rejected_busy = 0, bad_request = 0, cancelled = 0, failed = 0, unauthorized = 0;
  uint64_t prompt_tokens = 0, reused_tokens = 0, generated_tokens = 0;
  double decode_seconds = 0, prefill_seconds = 0;
  uint64_t drafted_tokens = 0, accepted_tokens = 0, verify_steps = 0;  // speculative decoding (--draft)
  double last_decode_tps = 0;
  double last_prompt_tps = 0;
  ExpertStats experts;  // latest snapshot: after each piece and each job (the worker owns the live counters)
  uint64_t live_pieces = 0;  // pieces of the running job so far (~ its tokens; exact counts come at its end)
  // llama-server's llamacpp:* figures: forward passes (prompt batches or chunks and decode steps;
  // drafters' passes left out) and the busy slots each saw, the longest sequence (prompt +
  // answer), and the rates since the last scrape.
  uint64_t passes = 0, busy_slots_in_passes = 0, n_tokens_max = 0;
  RateWindow prompt_window, predict_window;
  BatchShare batch;  // --parallel > 1 (engine/batch_slots.h)
  // --parallel > 1, timed on the worker: each decode step of the batch, each prompt chunk (read
  // in a step's pass while answers run: its rows' share of that pass, SessionBatch; else its own
  // pass), and the time between
  // two tokens of one running answer (a step, plus a chunk when one was read alone in between),
  // and of that gap the part neither took (admission, bookkeeping).
  DurationHistogram step_seconds, chunk_seconds, token_gap_seconds, token_gap_overhead_seconds;
};

// What /slots and /metrics show of a slot (llama-server's -np): idle, reading a prompt or
// decoding, with its counts.
// llama-server's live telemetry of one choice: prompt_progress events while its prompt is read
// (return_progress) and the timings so far with each piece (timings_per_token), per choice
// whether it runs alone (--parallel 1) or in a slot.
class ChoiceTelemetry {
 public:
  // cache: the prompt tokens kept from the KV cache (Session::kept_prefix).
  ChoiceTelemetry(Job& job, int index, int total, int cache) : job_(job), index_(index), total_(total), cache_(cache) {}

  // The prompt's tokens done so far (kept ones included): one event per whole token more.
  void prompt_read(double done) {
    const int processed = std::min(static_cast<int>(done), total_);
    if (!job_.return_progress || processed <= last_processed_) return;
    last_processed_ = processed;
    job_.push({index_, {}, std::nullopt, {}, PromptProgress{total_, cache_, processed, clock_.seconds() * 1e3}, std::nullopt});
  }

  // A piece of text; `fed` is the session's history length (the sampled tokens before this one).
  std::optional<LiveTimings> piece(size_t fed) { return timings(static_cast<int>(fed) - total_ + 1); }
  // The timings after `predicted` tokens (the first piece ends the prompt's time).
  std::optional<LiveTimings> timings(int predicted) {
    if (!job_.timings_per_token) return std::nullopt;
    if (!prompt_ms_) prompt_ms_ = clock_.seconds() * 1e3;
    return LiveTimings{cache_, total_ - cache_, std::max(predicted, 1), *prompt_ms_, clock_.seconds() * 1e3 - *prompt_ms_};
  }

 private:
  Job& job_;
  int index_, total_, cache_, last_processed_ = -1;
  Stopwatch clock_;
  std::optional<double> prompt_ms_;
};

struct SlotView {
  int id = 0;
  std::string state = "idle";  // "idle", "prompt", "decoding"
  int n_prompt = 0, n_prompt_done = 0, n_decoded = 0;  // of its current request
  uint64_t requests = 0, generated_tokens = 0;        // since start (generated: pieces streamed)
  // Since start, counted as each request ends: prompt tokens evaluated and kept from the KV
  // cache, and tokens generated.
  uint64_t prompt_tokens = 0, cached_tokens = 0, predicted_tokens = 0;
};

// The one decoding thread: a bounded queue of jobs, each run on one of the server's sessions
// (its slots; their KV prefixes later requests reuse), with the counters /metrics reports.
// With --parallel 1 a job runs to completion on the single session; with N > 1 a job takes a
// free slot between two steps, its prompt is read one chunk (-b tokens) at a time inside the
// decode steps of the other slots, and every step decodes all decoding slots in one pass (the
// engine's BatchSlots schedules both, as for bmoe-cli --parallel).
class DecodeWorker {
 public:
  // queue_capacity: jobs that may wait while one decodes; submit refuses more.
  DecodeWorker(LoadedRun run, size_t queue_capacity);
  ~DecodeWorker();

  LoadedRun& run() { return run_; }
  LoadedModel& model() { return *run_.model; }
  int n_ctx() const { return run_.config.sequence_ctx(); }

  // Stops taking jobs (SIGTERM): the running one is cancelled and ends with an error, the
  // queued ones end with an error at once, and later submits are refused.
  void shutdown();
  bool shutting_down();

  // Queues a job; false when the queue is full (with slots: more than --queue requests beyond the
  // free slots wait) or the server is shutting down.
  bool submit(const std::shared_ptr<Job>& job);

  void count(uint64_t Counters::*field);

  // GET /metrics: the counters in Prometheus' text format.
  std::string prometheus();
  // GET /stats: the same counters as JSON, for the web page. generated_tokens includes the
  // running job's pieces so far, so a client can take differences while an answer streams
  // (cache hit rate and flash MiB per token of that answer).
  nlohmann::ordered_json stats();
  // GET /slots: each slot as llama-server lists them (id, n_ctx, is_processing) with its state.
  nlohmann::ordered_json slots();

 private:
  void work();
  std::shared_ptr<Job> next_job();  // nullptr once stopping
  void run_job(Job& job);
  void run_embeddings(Job& job, Session& session, int slot_id);
  // An embeddings job's inputs embedded so far.
  struct EmbeddingsDone {
    std::vector<GenerateResult> results;  // one per input: its token count and time
    std::vector<std::vector<float>> vectors;
    std::string error;
  };
  bool embed_next(Job& job, Session& session, EmbeddingsDone& done);
  void finish_embeddings(Job& job, EmbeddingsDone& done, int slot_id);
  // --parallel N > 1 (worker_slots.cpp).
  // A slot: its session, and the job choice it serves (no job: idle).
  struct Slot {
    int id = 0;
    std::unique_ptr<Session> session;
    std::shared_ptr<Job> job;
    int choice = 0;
    std::vector<GenerateResult> results;  // the job's choices so far
    std::vector<int32_t> prompt;           // the choice's prompt
    size_t fed = 0;                        // prompt tokens in the KV cache (kept prefix included)
    int reused = 0;
    double prefill_seconds = 0;
    int pieces = 0;
    // llama-server's t_max_predict_ms, as in run_choice.
    std::optional<Stopwatch> since_first_piece;
    bool line_break = false, timed_out = false;
    double last_token_at = 0;  // now_seconds() after the step that gave its last token (0: none yet)
    std::optional<EmbeddingsDone> embedding;  // an embeddings job: one input per turn
    std::optional<ChoiceTelemetry> telemetry;  // the running choice's
  };
  void start_slots();
  void work_slots();
  bool admit(Slot& slot);
  void start_choice(Slot& slot);
  DecodeHooks answer_hooks(Slot& slot);
  void drop_cancelled_readers();
  void take_turn();
  void step_failed(const BatchSlots::Turn& t);
  void chunk_read(Slot& slot, size_t n, double seconds);
  void prompt_failed(Slot& slot, const std::string& error);
  void embed_turn(Slot& slot);
  void release(const Slot& slot);
  void answers_ended(const std::vector<int>& ended);
  void end_choice(Slot& slot, GenerateResult result, const std::string& error);
  void publish_slot(const Slot& slot);
  Slot* free_slot_for(const Job& job);
  void record(const std::vector<GenerateResult>& results, bool failed, bool cancelled, int slot_id);
  // A forward pass run while `busy_slots` slots held a request (llamacpp:n_busy_slots_per_decode).
  void count_pass(int busy_slots);
  int busy_slots() const;
  void after_step(double seconds, bool ran, const std::vector<int>& decoding);
  GenerateResult run_choice(Job& job, int index, std::string& error);
  GenerateResult generate_choice(Job& job, int index, const std::vector<int32_t>& prompt, GenerateParams params,
                                 const std::function<bool(const std::string&)>& in_time);
  void publish_progress();
  static void finish(Job& job, std::vector<GenerateResult> results, const std::string& error, int status = 500);

  std::shared_ptr<Job> current_;  // the job being decoded
  bool shutting_down_ = false;
  LoadedRun run_;
  ThreadPool pool_;
  std::unique_ptr<Session> session_;
  size_t capacity_;
  std::mutex mutex_;
  std::condition_variable wake_;
  std::deque<std::shared_ptr<Job>> queue_;
  bool busy_ = false;
  bool stopping_ = false;
  int prompt_done_ = 0, prompt_total_ = 0;  // the prompt being read (total 0: none), for /stats
  Counters counters_;
  std::vector<std::unique_ptr<Slot>> slots_;     // --parallel N > 1
  std::unique_ptr<BatchSlots> batch_;  // the slots' scheduling: prompt chunks and decode steps
  double turn_prompt_seconds_ = 0;  // the loop's turn: the prompt chunk or embeddings input it ran
  std::vector<SlotView> slot_views_;            // under mutex_
  std::vector<std::shared_ptr<Job>> active_;    // the slots' jobs, under mutex_ (shutdown cancels them)
  std::thread worker_;
};

}  // namespace bmoe
