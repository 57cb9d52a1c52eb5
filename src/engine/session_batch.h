// Several sessions of one model fed together, one token each per step (continuous batching),
// and with them, in the same pass, the next chunk of a prompt being read (llama-server's mixed
// batches): one forward pass (model/batch_pass.h) in which the routed experts that several
// sequences chose are asked of the expert source once. Each decoding session moves on exactly as
// Session::accept would move it (logits, history, sampler, a record), the reading session exactly
// as Session::prefill of that chunk would. The pass's cost is split among its rows (PassPart):
// each decode row's record holds one row's share, the chunk its rows' shares, so the parts sum to
// the pass and no second is counted twice.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "engine/session.h"
#include "model/batch_pass.h"

namespace bmoe {

// Prompt rows to read in a step's pass: `tokens` are the rows at positions [n_past, n_past +
// size) of `session`'s prompt of `prompt_length` tokens (0: they end it), all within one chunk
// of a fresh read of it (Session::prefill's cuts at multiples of n_batch).
struct PromptChunk {
  Session* session = nullptr;
  std::span<const int32_t> tokens;
  int prompt_length = 0;
};

// A part of one or more passes: its rows' share of their wall time and expert counters.
struct PassPart {
  uint64_t passes = 0, rows = 0;
  double seconds = 0;
  uint64_t lookups = 0, hits = 0, bytes_read = 0, buffer_allocations = 0;
  PassPart& operator+=(const PassPart& o);
};

// A decoding session's rows in a step: its next token, and the draft tokens verified with it
// (speculative decoding in a batch; empty: one row), the drafter's cost paid before the pass (its
// first record of the step holds it), and after accept() the draft tokens kept.
struct DecodeRows {
  Session* session = nullptr;
  int32_t token = -1;
  std::vector<int32_t> draft;
  PassPart drafter;
  int kept = 0;
};

class SessionBatch {
 public:
  SessionBatch(LoadedModel& model, ThreadPool& pool);
  // The lossless options act as in a session; the lossy ones act on batches of one only.
  void set_routing_options(const RoutingOptions& options) { pass_.set_routing_options(options); }
  // Feeds tokens[i] to sessions[i], and the chunk's tokens to its session when there is one
  // (as Session::prefill(chunk tokens, {}, prompt_length) would), in one pass; every session must
  // be of this batch's model, and the chunk's not among `sessions`.
  void accept(std::span<Session* const> sessions, std::span<const int32_t> tokens, const PromptChunk* chunk = nullptr);
  // accept with drafts: a session with a draft is fed its token and draft tokens in the pass and
  // keeps what Session::accept_draft keeps of them (greedy: the rows' argmax; sampling: the
  // sampler's draws, in order), its rejected rows' KV and recurrent state dropped; rows[i].kept
  // says how many. Its records are the kept tokens' (the session's rows' share of the pass split
  // among them, the drafter's cost added to the first).
  void accept(std::span<DecodeRows> rows, const PromptChunk* chunk = nullptr);
  // Whether `session` can read a prompt chunk in a batch's pass: not with an MTP head (its pass
  // over the prompt keeps the trunk's hidden rows, which a batch does not).
  static bool reads_prompts(const Session& session) { return session.mtp_head_ == nullptr; }
  // Steps run, the decode rows they fed (a session's token and draft tokens), and how much the rows
  // shared experts (BatchPass::routed_slots).
  uint64_t steps() const { return steps_; }
  uint64_t rows() const { return rows_; }
  // Of those passes, the ones that carried a prompt chunk, and the prompt rows they read.
  uint64_t chunk_steps() const { return chunk_steps_; }
  uint64_t prompt_rows() const { return prompt_rows_; }
  uint64_t routed_slots() const { return pass_.routed_slots(); }
  // The passes' cost split by rows: the decode rows' share (the sum of their records) and the
  // prompt chunks' share, summed over the steps; and the last step's chunk's share (its prompt
  // time), zero when it carried none. decode_part() + prompt_part() = the passes.
  const PassPart& decode_part() const { return decode_part_; }
  const PassPart& prompt_part() const { return prompt_part_; }
  const PassPart& last_chunk() const { return last_chunk_; }
  uint64_t distinct_experts() const { return pass_.distinct_experts(); }

 private:
  LoadedModel& model_;
  BatchPass pass_;
  void begin_chunk(const PromptChunk& chunk, std::span<const DecodeRows> rows);
  void end_chunk(const PromptChunk& chunk);
  void split_cost(std::span<const DecodeRows> rows, size_t chunk_rows, double wall, const Session::StepStart& before);
  void took(DecodeRows& rows, int first_row);
  std::vector<InferenceState*> states_;
  std::vector<int32_t> tokens_;
  std::vector<int> counts_;
  std::vector<uint8_t> all_logits_;
  std::vector<DecodeRows> plain_;  // the rows of accept(sessions, tokens)
  uint64_t steps_ = 0;
  uint64_t rows_ = 0;
  uint64_t chunk_steps_ = 0;
  uint64_t prompt_rows_ = 0;
  PassPart decode_part_, prompt_part_, last_chunk_;
};

}  // namespace bmoe
