// Lossless speculative decoding: a drafter guesses a few tokens, one batched forward pass verifies
// them, and only the prefix greedy decoding would have produced is kept. A batch reads each routed
// expert once for all its tokens, so an accepted draft saves the per-token expert reads; a
// rejected one costs a wider routed set, which is why the draft length adapts and switches itself
// off when acceptance is low (DraftController, the decode loop's). Who guesses is a Drafter:
// n-gram matches in the sequence (the default), an oracle (benchmarks), or the model's own
// multi-token-prediction head.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <utility>
#include <vector>

namespace bmoe {

struct DraftConfig {
  int max_draft = 0;   // tokens drafted per step; 0: off
  int ngram_max = 4;   // longest suffix looked up in the history
  int ngram_min = 1;   // shortest suffix that may propose a draft
  // Benchmark-only drafter (--draft-oracle): a known token sequence (prompt + output of an
  // earlier greedy run); drafts continue it while the sequence so far is its prefix. Output
  // stays lossless (verification keeps only what greedy decoding gives); the point is to
  // measure batched verification with drafts that are right.
  std::vector<int32_t> oracle;
  // The oracle's share of right tokens: each position's token is replaced by a wrong one with
  // probability 1 - oracle_accept, decided by (oracle_seed, position), so that verification can
  // be measured at the acceptance rates trained drafters reach.
  double oracle_accept = 1.0;
  uint64_t oracle_seed = 1;
  // Draft with the model's multi-token-prediction head (--mtp; the session's MtpHead).
  bool mtp = false;
};

// Guesses the tokens that follow a sequence; the decode loop verifies the guesses.
//
// The sequence handed to propose() is the truth: a drafter that keeps state (an MTP head's or a
// draft model's own cache rows) brings it in line with the sequence at each call. That one rule
// covers a rejected draft (the sequence grew by fewer tokens than were proposed), a pause of
// drafting (it grew by many) and a new prompt that reuses only part of the last one.
class Drafter {
 public:
  virtual ~Drafter() = default;
  // Up to `max_tokens` (> 0) tokens to follow `sequence`: the tokens the session holds, then the
  // token about to be fed. Empty: no guess, the step is decoded plainly.
  virtual std::vector<int32_t> propose(const std::vector<int32_t>& sequence, int max_tokens) = 0;
};

// Prompt lookup decoding: the continuation of the latest earlier occurrence of the sequence's
// longest matching suffix (ngram_draft).
class NgramDrafter : public Drafter {
 public:
  NgramDrafter(int ngram_max, int ngram_min) : ngram_max_(ngram_max), ngram_min_(ngram_min) {}
  std::vector<int32_t> propose(const std::vector<int32_t>& sequence, int max_tokens) override;

 private:
  int ngram_max_;
  int ngram_min_;
};

// Continues a known sequence while the sequence so far is its prefix (oracle_draft), each token
// right with probability `accept` (corrupt_draft).
class OracleDrafter : public Drafter {
 public:
  explicit OracleDrafter(std::vector<int32_t> oracle, double accept = 1.0, uint64_t seed = 1)
      : oracle_(std::move(oracle)), accept_(accept), seed_(seed) {}
  std::vector<int32_t> propose(const std::vector<int32_t>& sequence, int max_tokens) override;

 private:
  std::vector<int32_t> oracle_;
  double accept_;
  uint64_t seed_;
};

// Replaces draft tokens by wrong ones (the id next to it) where a draw from (seed, position)
// falls at or above `accept`; `first_position` is draft[0]'s position.
void corrupt_draft(std::vector<int32_t>& draft, int first_position, double accept, uint64_t seed);

// One forward step of an MTP head.
struct MtpStep {
  std::vector<float> logits;  // n_vocab: the token after the step's position
  std::vector<float> hidden;  // n_embd: the head's output, the input of a chained step
};

// What a model with a multi-token-prediction head (Qwen3.5/3.6's MTP block, GLM-4.5's nextn
// block; model/nextn_head.h) offers an MtpDrafter; the session implements it over the trunk's
// state (engine/mtp_head.h).
class MtpHead {
 public:
  virtual ~MtpHead() = default;
  // The trunk's last hidden states (n_embd floats each, after the output norm, as llama.cpp's
  // h_nextn) of the positions it evaluated since the previous call and still holds, oldest
  // first, ending at the latest position: a prompt's rows, then the fed token's and every kept
  // draft token's.
  virtual std::vector<std::vector<float>> take_hidden_states() = 0;
  // The head's forward pass over positions position .. position + tokens.size() - 1: row i
  // pairs hidden row i (the hidden state of the position before it: the trunk's, the head's own
  // output for a chained guess, zeros for position 0) with tokens[i]. Returns the last row's
  // step: the logits of the token after it and the head's output. Writes the head's own cache
  // rows there and drops those after. A position past the rows the head holds starts its cache
  // afresh there (the positions between are never seen; mtp_steps' capped catch-up).
  virtual MtpStep draft(int position, std::span<const float> hidden, std::span<const int32_t> tokens) = 0;
};

// The head's steps after `sequence` (its tokens, then the one about to be fed): the head run
// over the trunk's new hidden states (the last row's step guesses the token after the sequence),
// then chained on its own greedy picks and outputs, `max_tokens` steps in all (none without new
// trunk rows). Fails (bmoe::Error) on more hidden states than the sequence has positions.
// With max_catch_up > 0, the head is run over at most that many of the newest trunk rows: it
// restarts after the gap (MtpHead::draft), so a long pause of drafting is not paid for by one
// wide head pass whose experts a streamed model reads; the skipped rows' context is lost to its
// guesses, never to the output (verification decides).
std::vector<MtpStep> mtp_steps(MtpHead& head, const std::vector<int32_t>& sequence, int max_tokens,
                               int max_catch_up = 0);
// mtp_steps over trunk rows already taken from the head (take_hidden_states' order).
std::vector<MtpStep> mtp_steps_over(MtpHead& head, std::vector<std::vector<float>> rows,
                                    const std::vector<int32_t>& sequence, int max_tokens, int max_catch_up = 0);

// The most trunk rows MtpDrafter catches its head up on after its first proposal.
constexpr int kMtpMaxCatchUp = 4;

// Drafts with an MtpHead: runs the head over the trunk's new hidden states in one pass (its
// cache follows the sequence, and the last row gives the first guess), then chains the head on
// its own output for the further guesses. Greedy guesses: verification decides anyway.
class MtpDrafter : public Drafter {
 public:
  explicit MtpDrafter(MtpHead& head) : head_(head) {}
  // The greedy picks of mtp_steps.
  std::vector<int32_t> propose(const std::vector<int32_t>& sequence, int max_tokens) override;

 private:
  MtpHead& head_;
  bool caught_up_ = false;  // the head has seen the prompt: later catch-ups are capped
};

// Benchmark drafter (--mtp with --draft-oracle): runs the MTP drafter, so the head's compute and
// expert reads are paid as in a real run, then proposes the oracle's tokens instead, as many as
// the head proposed.
class OracleOverMtpDrafter : public Drafter {
 public:
  OracleOverMtpDrafter(MtpHead& head, OracleDrafter oracle) : mtp_(head), oracle_(std::move(oracle)) {}
  std::vector<int32_t> propose(const std::vector<int32_t>& sequence, int max_tokens) override;

 private:
  MtpDrafter mtp_;
  OracleDrafter oracle_;
};

// The drafter a configuration chooses: the MTP head's with `mtp` (its proposals replaced by the
// oracle's when there is one), else the oracle's when there is one, else n-grams. Fails
// (bmoe::Error) on `mtp` without a head.
std::unique_ptr<Drafter> make_drafter(const DraftConfig& config, MtpHead* mtp_head = nullptr);

// The oracle's continuation of `sequence` (empty when the sequence left the oracle).
std::vector<int32_t> oracle_draft(const std::vector<int32_t>& oracle, const std::vector<int32_t>& sequence, int max_tokens);

// Proposes the continuation of the most recent earlier occurrence of the sequence's longest
// matching suffix (prompt lookup decoding).
std::vector<int32_t> ngram_draft(const std::vector<int32_t>& sequence, int max_tokens, int ngram_max, int ngram_min);

// Adapts the draft length to the measured acceptance: grows while drafts are accepted whole,
// shrinks on rejection, and pauses drafting for a while when acceptance stays low (an average
// over the draft tokens verification judged, quick to judge on probation after a start or a
// pause, slow once a drafter has been right for a while, so a good one is not paused by a few
// misses in a row); each pause
// that follows another without a kept draft between them is twice as long (up to a limit), so
// a drafter that is never right costs a vanishing share of the steps.
class DraftController {
 public:
  explicit DraftController(DraftConfig config);
  // Tokens to draft now (0: decode one token plainly).
  int length() const;
  // Reports a verification: `drafted` proposed, `accepted` kept. Also call with drafted 0 on
  // plain steps so that pauses run out.
  void report(int drafted, int accepted);

  const DraftConfig& config() const { return config_; }
  int64_t drafted_total() const { return drafted_total_; }
  int64_t accepted_total() const { return accepted_total_; }
  int64_t verify_steps() const { return verify_steps_; }

 private:
  DraftConfig config_;
  int length_;
  double acceptance_;        // moving average over draft tokens tried (1: kept, 0: rejected)
  int64_t tried_since_resume_ = 0;  // draft tokens judged since the start or the last pause
  int pause_ = 0;            // plain steps left before drafting again
  int next_pause_;           // the next pause's length: doubles while pauses follow each other
  int64_t drafted_total_ = 0;
  int64_t accepted_total_ = 0;
  int64_t verify_steps_ = 0;
};

}  // namespace bmoe
