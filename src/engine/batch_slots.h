// Continuous batching over N slots, the scheduling bmoe-server --parallel N and bmoe-cli
// --parallel N share: a slot reads its prompt in chunks cut where a fresh read cuts it (multiples
// of its session's n_batch, after any kept prefix) and then decodes in the shared ParallelDecode.
// Each turn reads one chunk of one reading slot, round robin, inside the pass of the running
// answers' step (llama-server's mixed batches: SessionBatch::accept) when it can ride there, else
// in a pass of its own before the step; then the step runs. So a running answer waits about one
// chunk's pass between two tokens, and a prompt starts decoding at the step after its last chunk,
// while later prompts are still being read.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "engine/generate.h"

namespace bmoe {

// The sharing of a batch's steps, summed over the batches a failed pass replaced: steps, the
// decode rows they fed, the steps that also read a prompt chunk, the (row, expert) choices routed
// against the distinct experts looked up, and the passes' cost split by rows (PassPart).
struct BatchShare {
  uint64_t steps = 0, rows = 0, routed_slots = 0, distinct_experts = 0;
  uint64_t chunk_steps = 0;
  PassPart decode_part, prompt_part;
  BatchShare& operator+=(const BatchShare& o);
};

class BatchSlots {
 public:
  BatchSlots(LoadedModel& model, ThreadPool& pool, const RoutingOptions& routing, int slots);
  ~BatchSlots();

  // What a slot decodes once its prompt is read: decode_tokens' limit, parameters and hooks.
  struct Answer {
    int limit = 0;
    GenerateParams params;
    DecodeHooks hooks;
  };
  // Free slot `slot` reads `prompt` into `session` (which outlives the slot's use of it), whose KV
  // cache holds its first `fed` tokens already (Session::keep_prefix), then decodes `answer`.
  void read(int slot, Session& session, std::vector<int32_t> prompt, size_t fed, Answer answer);
  // Free slot `slot` takes turns the caller runs (turn's own_turn: bmoe-server's embeddings
  // inputs, one per turn), each alone before the step.
  void take_turns(int slot);
  // A reading slot (or one taking its own turns) is free again: cancelled, failed or done.
  void release(int slot);
  bool free(int slot) const;
  bool reading(int slot) const;
  bool decoding(int slot) const;
  size_t fed(int slot) const;  // a reading slot's prompt tokens in its KV cache
  int running() const { return decode_->running(); }

  struct Turn {
    int reader = -1;            // the slot whose chunk this turn read (or own turn it ran); -1: none
    bool own_turn = false;      // the reader's turn was the caller's (take_turns)
    size_t chunk_tokens = 0;
    double chunk_seconds = 0;   // its own pass, or its rows' share of the step's (SessionBatch)
    bool rode = false;          // the chunk was read in the step's pass
    bool prompt_done = false;   // the reader's prompt is read: it decodes from the next step
    std::vector<int> decoded;   // the slots that were decoding when the step began
    bool stepped = false;       // the step ran a pass (false when every answer in it ended first)
    double step_seconds = 0;    // the whole step, its pass included
    std::vector<int> ended;     // the slots whose answers ended in the step: take their answer()
    // A failed pass. reader_error: the reader's chunk (the slot is free; its session must be
    // reset). step_error: the step's (every slot of `decoded` is free and its session must be
    // reset; a chunk that rode in it failed too, with reader_error).
    std::string reader_error, step_error;
  };
  // What a caller sees inside a turn: own_turn runs a take_turns slot's turn; chunk_read follows
  // each chunk read (before the step when it was read alone, after it when it rode), the slot
  // decoding already when the chunk ended its prompt.
  struct TurnHooks {
    std::function<void(int slot)> own_turn;
    std::function<void(int slot, size_t tokens, double seconds, bool rode)> chunk_read;
  };
  // One turn (nothing when no slot reads or decodes).
  Turn turn(const TurnHooks& hooks = {});
  // The answer of a slot whose answer ended (Turn::ended); the slot is then free.
  GenerateResult answer(int slot);
  BatchShare share() const;

 private:
  struct Slot;
  int next_reader();
  bool rides_in_step(const Slot& slot) const;
  std::vector<int32_t> next_chunk(const Slot& slot) const;
  void chunk_read(int slot, size_t n, Turn& t, const TurnHooks& hooks);
  void step(int reader, const std::vector<int32_t>& chunk, Turn& t, const TurnHooks& hooks);
  void step_failed(int reader, const std::string& error, Turn& t);
  LoadedModel& model_;
  ThreadPool& pool_;
  RoutingOptions routing_;
  std::unique_ptr<ParallelDecode> decode_;
  std::vector<Slot> slots_;
  size_t next_ = 0;  // round robin over the reading slots
  BatchShare before_;  // the sharing of batches a failed pass replaced
};

}  // namespace bmoe
