// bmoe-server --parallel N > 1: N slots, each a session with its own KV cache (and prefix), fed
// by the worker's one thread. Each turn of the loop admits queued jobs into free slots, then runs
// one turn of the engine's slot scheduling (engine/batch_slots.h, which bmoe-cli --parallel
// shares): one decode step of every decoding slot that also reads one chunk of one waiting prompt
// (round robin), one pass for the decode rows and the chunk's rows, each routed expert read once
// for all. A running answer therefore waits about one chunk's pass between two of its tokens, and
// a queued job, when a slot is free, at most one step before its prompt starts. A chunk that
// cannot ride in a step (no answer running, a session with an MTP head, lossy routing options
// that act on one-row passes) is read in its own pass before the step, and so is an embeddings
// job's input (one per turn).
#include <fmt/format.h>

#include <algorithm>
#include <exception>

#include "core/error.h"
#include "core/timer.h"
#include "serve/worker.h"

namespace bmoe {

void DecodeWorker::start_slots() {
  const int n = std::max(1, run_.config.parallel);
  for (int i = 0; i < n; ++i) slot_views_.push_back(SlotView{i});
  if (n == 1) return;
  batch_ = std::make_unique<BatchSlots>(*run_.model, pool_, run_.config.routing(), n);
  for (int i = 0; i < n; ++i) {
    auto slot = std::make_unique<Slot>();
    slot->id = i;
    // Slot 0 keeps the session the worker opened (the one --parallel 1 uses).
    slot->session = i == 0 ? std::move(session_) : open_session(run_, pool_);
    slots_.push_back(std::move(slot));
  }
}

void DecodeWorker::work_slots() {
  for (;;) {
    turn_prompt_seconds_ = 0;
    bool any_busy = false;
    for (auto& slot : slots_) any_busy = admit(*slot) || any_busy;
    if (!any_busy) {
      std::unique_lock<std::mutex> lock(mutex_);
      busy_ = false;
      wake_.wait(lock, [&] { return stopping_ || !queue_.empty(); });
      if (stopping_) break;
      continue;
    }
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (stopping_) {  // the running answers end at their next step
        for (auto& job : active_) job->cancel.store(true);
      }
    }
    drop_cancelled_readers();
    take_turn();
  }
  std::lock_guard<std::mutex> lock(mutex_);
  for (auto& job : queue_) finish(*job, {}, kShuttingDown, 503);
}

// A busy slot stays busy; a free one takes the queued job whose prompt it holds the longest
// prefix of (the first queued job otherwise). Returns whether the slot is busy.
bool DecodeWorker::admit(Slot& slot) {
  if (slot.job) return true;
  std::shared_ptr<Job> job;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (queue_.empty() || stopping_) return false;
    if (free_slot_for(*queue_.front()) != &slot) return false;
    job = queue_.front();
    queue_.pop_front();
    busy_ = true;
    active_.push_back(job);
  }
  slot.job = job;
  job->slot = slot.id;
  slot.choice = 0;
  slot.results.clear();
  if (!job->embed_inputs.empty()) {  // one input per turn, as a prompt chunk is read
    slot.embedding.emplace();
    batch_->take_turns(slot.id);
    publish_slot(slot);
    return true;
  }
  start_choice(slot);
  return true;
}

// The free slot whose history shares the longest prefix with the job's prompt.
DecodeWorker::Slot* DecodeWorker::free_slot_for(const Job& job) {
  Slot* best = nullptr;
  size_t best_common = 0;
  for (auto& s : slots_) {
    if (s->job) continue;
    const std::vector<int32_t>& h = s->session->history();
    size_t common = 0;
    while (common < h.size() && common < job.prompt.size() && h[common] == job.prompt[common]) ++common;
    if (!best || common > best_common) {
      best = s.get();
      best_common = common;
    }
  }
  return best;
}

void DecodeWorker::start_choice(Slot& slot) {
  Job& job = *slot.job;
  slot.prompt = job.choice_prompts.empty() ? job.prompt : job.choice_prompts[static_cast<size_t>(slot.choice)];
  slot.prefill_seconds = 0;
  slot.pieces = 0;
  slot.since_first_piece.reset();
  slot.line_break = slot.timed_out = false;
  try {
    if (static_cast<int>(slot.prompt.size()) >= n_ctx()) {
      fail("the prompt has {} tokens, more than the context of {}", slot.prompt.size(), n_ctx());
    }
    GenerateParams params = job.params;
    params.sampler.seed += static_cast<uint64_t>(slot.choice);
    slot.session->set_sampler(params.sampler);
    slot.reused = slot.session->keep_prefix(slot.prompt);
    slot.fed = static_cast<size_t>(slot.reused);
    slot.telemetry.emplace(job, slot.choice, static_cast<int>(slot.prompt.size()), slot.reused);
    slot.telemetry->prompt_read(static_cast<double>(slot.fed));  // llama-server's first event: the kept part
    const int limit = std::min(params.max_tokens, n_ctx() - static_cast<int>(slot.prompt.size()));
    batch_->read(slot.id, *slot.session, slot.prompt, slot.fed, {limit, std::move(params), answer_hooks(slot)});
  } catch (const std::exception& e) {
    slot.session->reset();
    return end_choice(slot, {}, e.what());
  }
  publish_slot(slot);
}

// What a slot's answer streams: its pieces (with t_max_predict_ms' cut), log-probabilities, and
// the job's cancel flag.
DecodeHooks DecodeWorker::answer_hooks(Slot& slot) {
  Job& job = *slot.job;
  const int index = slot.choice;
  DecodeHooks hooks;
  hooks.on_piece = [this, &slot, &job, index](const std::string& piece) {
    publish_progress();
    ++slot.pieces;
    job.push({index, piece, std::nullopt, {}, std::nullopt, slot.telemetry->timings(slot.pieces)});
    if (!slot.since_first_piece) slot.since_first_piece.emplace();
    slot.line_break = slot.line_break || piece.find('\n') != std::string::npos;
    slot.timed_out = job.t_max_predict_ms > 0 && slot.line_break &&
                     slot.since_first_piece->seconds() * 1e3 > static_cast<double>(job.t_max_predict_ms);
    return !slot.timed_out;
  };
  hooks.on_logprob = [&job, index](const TokenLogprob& lp) { job.push({index, {}, lp, {}}); };
  hooks.cancel = &job.cancel;
  return hooks;
}

// A reading slot whose job was cancelled ends its choice before its next chunk.
void DecodeWorker::drop_cancelled_readers() {
  for (auto& slot : slots_) {
    if (!slot->job || !batch_->reading(slot->id) || !slot->job->cancel.load()) continue;
    GenerateResult r;
    r.finish_reason = "cancelled";
    end_choice(*slot, r, "");
  }
}

// One turn of the slots' scheduling: a prompt chunk (or embeddings input) and the decode step,
// then the counters and the answers that ended.
void DecodeWorker::take_turn() {
  BatchSlots::TurnHooks hooks;
  hooks.own_turn = [this](int id) { embed_turn(*slots_[static_cast<size_t>(id)]); };
  hooks.chunk_read = [this](int id, size_t n, double seconds, bool rode) {
    if (!rode) count_pass(busy_slots());
    chunk_read(*slots_[static_cast<size_t>(id)], n, seconds);
  };
  const BatchSlots::Turn t = batch_->turn(hooks);
  if (t.reader >= 0 && !t.rode) turn_prompt_seconds_ = t.chunk_seconds;
  if (!t.reader_error.empty()) prompt_failed(*slots_[static_cast<size_t>(t.reader)], t.reader_error);
  if (!t.step_error.empty()) return step_failed(t);
  if (!t.decoded.empty()) after_step(t.step_seconds, t.stepped, t.decoded);
  for (auto& slot : slots_) {
    if (batch_->decoding(slot->id)) publish_slot(*slot);
  }
  answers_ended(t.ended);
}

// The step's pass failed: every answer in it fails, its session reset (a chunk that rode in
// it failed with it: take_turn).
void DecodeWorker::step_failed(const BatchSlots::Turn& t) {
  for (int id : t.decoded) {
    Slot& slot = *slots_[static_cast<size_t>(id)];
    slot.last_token_at = 0;
    slot.session->reset();
    end_choice(slot, {}, t.step_error);
  }
}

void DecodeWorker::prompt_failed(Slot& slot, const std::string& error) {
  slot.session->reset();
  end_choice(slot, {}, error);
}

// After a chunk of n tokens was read in `seconds` (its own pass, or its rows' share of the step's
// that carried it): the slot's prompt time, progress and counters.
void DecodeWorker::chunk_read(Slot& slot, size_t n, double seconds) {
  slot.prefill_seconds += seconds;
  slot.fed += n;
  slot.telemetry->prompt_read(static_cast<double>(slot.fed));
  {
    std::lock_guard<std::mutex> lock(mutex_);
    counters_.chunk_seconds.add(seconds);
    counters_.n_tokens_max = std::max<uint64_t>(counters_.n_tokens_max, slot.fed);
  }
  publish_slot(slot);
}

// The slots whose answers ended in the step: each choice ends (the next one starts, or the job).
void DecodeWorker::answers_ended(const std::vector<int>& ended) {
  for (int id : ended) {
    Slot& slot = *slots_[static_cast<size_t>(id)];
    slot.last_token_at = 0;
    GenerateResult r = batch_->answer(id);
    if (slot.timed_out && r.finish_reason == "cancelled" && !slot.job->cancel.load()) r.finish_reason = "stop";
    end_choice(slot, std::move(r), "");
  }
}

// An embeddings job's next input, in the prompt turn: the running answers wait at most one
// input between two tokens.
void DecodeWorker::embed_turn(Slot& slot) {
  Job& job = *slot.job;
  if (embed_next(job, *slot.session, *slot.embedding)) return;
  release(slot);
  finish_embeddings(job, *slot.embedding, slot.id);
  slot.embedding.reset();
  end_choice(slot, {}, "embeddings");
}

// The counters of a step of the slots `decoding` (ids), `seconds` long: its pass (`ran`: false
// when every answer in it ended without one), the batch's sharing so far, and each running
// answer's time since its last token, with the part of it neither the step nor this turn's
// prompt chunk (or embeddings input) took.
void DecodeWorker::after_step(double seconds, bool ran, const std::vector<int>& decoding) {
  const double now = now_seconds();
  if (ran) count_pass(busy_slots());
  std::lock_guard<std::mutex> lock(mutex_);
  Counters& c = counters_;
  c.batch = batch_->share();
  if (ran) c.step_seconds.add(seconds);
  for (int id : decoding) {
    Slot& slot = *slots_[static_cast<size_t>(id)];
    if (slot.last_token_at > 0) {
      const double gap = now - slot.last_token_at;
      c.token_gap_seconds.add(gap);
      c.token_gap_overhead_seconds.add(std::max(gap - seconds - turn_prompt_seconds_, 0.0));
    }
    slot.last_token_at = now;
    c.n_tokens_max = std::max<uint64_t>(c.n_tokens_max, slot.session->history().size());
  }
}

int DecodeWorker::busy_slots() const {
  int n = 0;
  for (const auto& slot : slots_) n += slot->job != nullptr;
  return n;
}

// A choice ended (error empty) or failed: the next choice starts, or the job ends and the slot
// is free.
void DecodeWorker::end_choice(Slot& slot, GenerateResult result, const std::string& error) {
  Job& job = *slot.job;
  batch_->release(slot.id);
  const bool embeddings = error == "embeddings";
  if (!embeddings) {
    result.prompt_tokens = static_cast<int>(slot.prompt.size());
    result.reused_tokens = slot.reused;
    result.prefill_seconds = slot.prefill_seconds;
    slot.results.push_back(std::move(result));
    const std::string& reason = slot.results.back().finish_reason;
    if (error.empty() && reason != "cancelled" && slot.choice + 1 < job.n) {
      job.push({slot.choice, {}, std::nullopt, reason});
      ++slot.choice;
      return start_choice(slot);
    }
    const bool cancelled = reason == "cancelled";
    std::string message = error;
    int status = 500;
    if (message.empty() && cancelled && shutting_down()) {
      message = kShuttingDown;
      status = 503;
    }
    record(slot.results, !message.empty(), cancelled, slot.id);
    release(slot);
    finish(job, std::move(slot.results), message, status);
  }
  release(slot);
  slot.job.reset();
  slot.results.clear();
}

// The slot shows idle and its job no longer processing, before the job's client is answered
// (so that what it reads of /slots and /metrics next agrees with its answer).
void DecodeWorker::release(const Slot& slot) {
  std::lock_guard<std::mutex> lock(mutex_);
  active_.erase(std::remove(active_.begin(), active_.end(), slot.job), active_.end());
  slot_views_[static_cast<size_t>(slot.id)].state = "idle";
}

// The slot's figures for /slots and /metrics.
void DecodeWorker::publish_slot(const Slot& slot) {
  std::lock_guard<std::mutex> lock(mutex_);
  SlotView& v = slot_views_[static_cast<size_t>(slot.id)];
  const bool decoding = batch_->decoding(slot.id);
  v.state = !slot.job ? "idle" : decoding ? "decoding" : "prompt";
  v.n_prompt = static_cast<int>(slot.prompt.size());
  v.n_prompt_done = static_cast<int>(slot.fed);
  if (decoding && v.n_decoded < slot.pieces) v.generated_tokens += static_cast<uint64_t>(slot.pieces - v.n_decoded);
  v.n_decoded = slot.pieces;
}

nlohmann::ordered_json DecodeWorker::slots() {
  std::lock_guard<std::mutex> lock(mutex_);
  nlohmann::ordered_json out = nlohmann::ordered_json::array();
  for (const SlotView& v : slot_views_) {
    // --parallel 1: the single slot is busy while the worker decodes.
    const std::string state = slots_.empty() ? (busy_ ? "decoding" : "idle") : v.state;
    out.push_back({{"id", v.id},
                   {"n_ctx", n_ctx()},
                   {"is_processing", state != "idle"},
                   {"state", state},
                   {"n_prompt_tokens", v.n_prompt},
                   {"n_prompt_tokens_processed", v.n_prompt_done},
                   {"n_decoded", v.n_decoded},
                   {"requests", v.requests}});
  }
  return out;
}

}  // namespace bmoe
