#include "engine/batch_slots.h"

#include <algorithm>
#include <exception>

#include "core/error.h"
#include "core/timer.h"

namespace bmoe {

BatchShare& BatchShare::operator+=(const BatchShare& o) {
  steps += o.steps;
  chunk_steps += o.chunk_steps;
  rows += o.rows;
  routed_slots += o.routed_slots;
  distinct_experts += o.distinct_experts;
  decode_part += o.decode_part;
  prompt_part += o.prompt_part;
  return *this;
}

namespace {

BatchShare share_of(const SessionBatch& b) {
  return {b.steps(), b.rows(), b.routed_slots(), b.distinct_experts(), b.chunk_steps(), b.decode_part(), b.prompt_part()};
}

}  // namespace

struct BatchSlots::Slot {
  enum class State { Free, Reading, OwnTurns, Decoding } state = State::Free;
  Session* session = nullptr;
  std::vector<int32_t> prompt;
  size_t fed = 0;
  Answer answer;
  int decode_id = -1;  // in decode_ while decoding
  bool ended = false;  // its answer ended and waits for answer()
};

BatchSlots::BatchSlots(LoadedModel& model, ThreadPool& pool, const RoutingOptions& routing, int slots)
    : model_(model), pool_(pool), routing_(routing), decode_(std::make_unique<ParallelDecode>(model, pool)),
      slots_(static_cast<size_t>(std::max(slots, 1))) {
  decode_->set_routing_options(routing_);
}

BatchSlots::~BatchSlots() = default;

void BatchSlots::read(int slot, Session& session, std::vector<int32_t> prompt, size_t fed, Answer answer) {
  Slot& s = slots_.at(static_cast<size_t>(slot));
  if (s.state != Slot::State::Free || s.ended) fail("internal: slot {} is busy", slot);
  if (prompt.empty()) fail("the prompt is empty");
  if (fed >= prompt.size()) fail("internal: slot {} keeps its whole prompt", slot);
  s = Slot{Slot::State::Reading, &session, std::move(prompt), fed, std::move(answer)};
}

void BatchSlots::take_turns(int slot) {
  Slot& s = slots_.at(static_cast<size_t>(slot));
  if (s.state != Slot::State::Free || s.ended) fail("internal: slot {} is busy", slot);
  s = Slot{};
  s.state = Slot::State::OwnTurns;
}

void BatchSlots::release(int slot) {
  Slot& s = slots_.at(static_cast<size_t>(slot));
  if (s.state == Slot::State::Decoding) fail("internal: slot {} is decoding", slot);
  s = Slot{};
}

bool BatchSlots::free(int slot) const {
  const Slot& s = slots_.at(static_cast<size_t>(slot));
  return s.state == Slot::State::Free && !s.ended;
}
bool BatchSlots::reading(int slot) const { return slots_.at(static_cast<size_t>(slot)).state == Slot::State::Reading; }
bool BatchSlots::decoding(int slot) const { return slots_.at(static_cast<size_t>(slot)).state == Slot::State::Decoding; }
size_t BatchSlots::fed(int slot) const { return slots_.at(static_cast<size_t>(slot)).fed; }

BatchShare BatchSlots::share() const {
  BatchShare s = before_;
  s += share_of(decode_->batch());
  return s;
}

// The next slot reading a prompt (or taking its own turns), round robin; -1 when none.
int BatchSlots::next_reader() {
  for (size_t k = 0; k < slots_.size(); ++k) {
    const size_t i = (next_ + k) % slots_.size();
    const Slot::State state = slots_[i].state;
    if (state != Slot::State::Reading && state != Slot::State::OwnTurns) continue;
    next_ = (i + 1) % slots_.size();
    return static_cast<int>(i);
  }
  return -1;
}

// Whether the slot's chunk rides in the step's pass: answers are running, its session can read a
// chunk in a batch (no MTP head), and no lossy routing option is set (route-ahead and drop-cold
// act on one-row passes, which a chunk would widen).
bool BatchSlots::rides_in_step(const Slot& slot) const {
  return slot.state == Slot::State::Reading && running() > 0 && SessionBatch::reads_prompts(*slot.session) &&
         routing_.route_ahead == 0 && routing_.drop_cold == 0.0f;
}

// The slot's next chunk: up to the next multiple of n_batch, where a fresh read of the whole
// prompt cuts (Session::prefill), so the rows equal that read's.
std::vector<int32_t> BatchSlots::next_chunk(const Slot& slot) const {
  const size_t n_batch = static_cast<size_t>(slot.session->n_batch());
  const size_t n = std::min(n_batch - slot.fed % n_batch, slot.prompt.size() - slot.fed);
  const auto from = slot.prompt.begin() + static_cast<std::ptrdiff_t>(slot.fed);
  return {from, from + static_cast<std::ptrdiff_t>(n)};
}

BatchSlots::Turn BatchSlots::turn(const TurnHooks& hooks) {
  Turn t;
  t.reader = next_reader();
  std::vector<int32_t> chunk;
  if (t.reader >= 0) {
    Slot& r = slots_[static_cast<size_t>(t.reader)];
    if (r.state == Slot::State::Reading) chunk = next_chunk(r);
    if (r.state == Slot::State::OwnTurns || !rides_in_step(r)) {
      Stopwatch alone;
      t.own_turn = r.state == Slot::State::OwnTurns;
      try {
        if (t.own_turn) {
          if (hooks.own_turn) hooks.own_turn(t.reader);
        } else {
          r.session->prefill(chunk, {}, static_cast<int>(r.prompt.size()));
        }
        t.chunk_seconds = alone.seconds();
        if (!t.own_turn) chunk_read(t.reader, chunk.size(), t, hooks);
      } catch (const std::exception& e) {
        t.reader_error = e.what();
        r = Slot{};
      }
      chunk.clear();
      if (running() > 0) step(-1, chunk, t, hooks);
      return t;
    }
  }
  if (running() > 0) step(t.reader, chunk, t, hooks);
  return t;
}

// After a chunk of n tokens was read: the last one hands the slot to the decode steps.
void BatchSlots::chunk_read(int slot, size_t n, Turn& t, const TurnHooks& hooks) {
  Slot& s = slots_[static_cast<size_t>(slot)];
  s.fed += n;
  t.chunk_tokens = n;
  if (s.fed >= s.prompt.size()) {
    s.decode_id = decode_->add(*s.session, s.answer.limit, std::move(s.answer.params), std::move(s.answer.hooks));
    s.state = Slot::State::Decoding;
    t.prompt_done = true;
  }
  if (hooks.chunk_read) hooks.chunk_read(slot, n, t.chunk_seconds, t.rode);
}

// One step of every decoding slot; with a reader (>= 0), its chunk read in the same pass.
void BatchSlots::step(int reader, const std::vector<int32_t>& chunk, Turn& t, const TurnHooks& hooks) {
  for (size_t i = 0; i < slots_.size(); ++i) {
    if (slots_[i].state == Slot::State::Decoding) t.decoded.push_back(static_cast<int>(i));
  }
  PromptChunk prompt;
  if (reader >= 0) {
    const Slot& r = slots_[static_cast<size_t>(reader)];
    prompt = {r.session, chunk, static_cast<int>(r.prompt.size())};
  }
  std::vector<int> ended;
  try {
    const uint64_t passes = decode_->batch().steps();
    Stopwatch timer;
    ended = decode_->step(reader >= 0 ? &prompt : nullptr);
    t.step_seconds = timer.seconds();
    t.stepped = decode_->batch().steps() > passes;
  } catch (const std::exception& e) {
    return step_failed(reader, e.what(), t);
  }
  if (reader >= 0) {
    t.rode = true;
    t.chunk_seconds = decode_->batch().last_chunk().seconds;
    chunk_read(reader, chunk.size(), t, hooks);
  }
  for (int id : ended) {
    for (Slot& s : slots_) {
      if (s.state == Slot::State::Decoding && s.decode_id == id) s.ended = true;
    }
  }
  for (size_t i = 0; i < slots_.size(); ++i) {
    if (slots_[i].ended && slots_[i].state == Slot::State::Decoding) t.ended.push_back(static_cast<int>(i));
  }
}

// A failed pass leaves every decoding session (and a riding reader's) unusable: their slots are
// free, and the batch starts again.
void BatchSlots::step_failed(int reader, const std::string& error, Turn& t) {
  t.step_error = error;
  before_ += share_of(decode_->batch());
  decode_ = std::make_unique<ParallelDecode>(model_, pool_);
  decode_->set_routing_options(routing_);
  for (int i : t.decoded) slots_[static_cast<size_t>(i)] = Slot{};
  if (reader >= 0) {
    t.reader_error = error;
    slots_[static_cast<size_t>(reader)] = Slot{};
  }
}

GenerateResult BatchSlots::answer(int slot) {
  Slot& s = slots_.at(static_cast<size_t>(slot));
  if (!s.ended || s.state != Slot::State::Decoding) fail("internal: slot {} has no answer to take", slot);
  GenerateResult r = decode_->take(s.decode_id);
  s = Slot{};
  return r;
}

}  // namespace bmoe
