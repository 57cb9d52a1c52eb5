// A generation session: one model, one sequence, its KV cache and per-token telemetry.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "core/thread_pool.h"
#include "core/timer.h"
#include "engine/loader.h"
#include "engine/mtp_head.h"
#include "model/transformer.h"
#include "telemetry/system.h"
#include "text/sampler.h"

namespace bmoe {

// What one decode step cost (the --csv row).
struct TokenRecord {
  int index = 0;
  int32_t token = -1;
  double wall_ms = 0;
  double compute_ms = 0;
  double io_ms = 0;     // lane busy time spent reading for this token
  double stall_ms = 0;  // time compute waited on reads
  uint64_t routed = 0;  // expert lookups
  uint64_t hits = 0;
  uint64_t misses = 0;
  uint64_t bytes_read = 0;
  uint64_t copied_bytes = 0;  // of bytes_read, copied by the kernel (buffered reads)
  uint64_t cache_used = 0;
  int batch = 1;        // tokens in the forward pass that produced this one (speculative: 1 + draft)
  bool overlapped = false;  // that pass overlapped reads with compute (--overlap)
  // The expert cache was already full when the step began (ExpertStats::cache_full): the step
  // belongs to the run's steady state. Always true without an expert cache to fill.
  bool steady = true;
  // What the step cost the process (all threads: compute, read lanes), see ProcessCounters.
  double cpu_ms = 0;
  uint64_t minor_faults = 0;
  uint64_t context_switches = 0;  // voluntary + involuntary
  uint64_t involuntary_switches = 0;
  uint64_t buffer_allocations = 0;  // expert buffers allocated during the step
};

struct PrefillRecord {
  int tokens = 0;
  double seconds = 0;
};

// Progress of a prompt: tokens done so far (a batch counts in proportion to its layers done)
// out of `total`, and the seconds since the prompt started.
using PrefillProgress = std::function<void(double done, int total, double seconds)>;

// How an embedding pools a text's final hidden states (llama.cpp's pooling types and numbers:
// 1 mean, 2 cls = the first token's, 3 last = the last token's).
enum class Pooling { Mean = 1, Cls = 2, Last = 3 };

class Session {
 public:
  Session(LoadedModel& model, ThreadPool& pool, int n_ctx, int n_batch, SamplerConfig sampler,
          KvType kv_type = KvType::F16);

  std::vector<int32_t> tokenize(const std::string& text, bool parse_special) const;
  // Feeds tokens as the rows at positions [n_past, n_past + size) of a prompt of
  // `prompt_length` tokens (0: the tokens end it), each row as a fresh read of that whole prompt
  // evaluates it: in batches of at most n_batch cut at multiples of n_batch, each row on the
  // attention path of its chunk in that read (fresh_batch_path). A prompt fed in any pieces, after
  // any kept prefix, thus gives the bits it gives read at once. Afterwards next_token() samples
  // from the last logits.
  PrefillRecord prefill(const std::vector<int32_t>& tokens, const PrefillProgress& progress = {},
                        int prompt_length = 0);
  // Makes the sequence equal `prompt`, keeping the longest prefix of what the KV cache already
  // holds that kept_prefix allows. Returns how many tokens were reused.
  int prefill_reusing(const std::vector<int32_t>& prompt, PrefillRecord* record = nullptr,
                      const PrefillProgress& progress = {});  // progress counts the kept prefix as done
  // The rows a prompt can keep: the longest common prefix of the history and `prompt`, less at
  // least its last token (evaluated again, for fresh logits), cut before the first row that took
  // another attention path than a fresh read of `prompt` gives it (model/attention.h: the paths
  // round differently; a generated token's row, or the last chunk of an earlier prompt shorter
  // than kAttentionBatchRows, took the decode path where the fresh read reads a batch).
  int kept_prefix(const std::vector<int32_t>& prompt) const;
  // prefill_reusing's first half: drops what follows kept_prefix(prompt) and returns it. The
  // rest of the prompt is then fed with prefill(..., prompt.size()), in one call or in pieces.
  int keep_prefix(const std::vector<int32_t>& prompt);
  // Whether a fresh read of a prompt of `length` tokens (chunks of n_batch from position 0)
  // takes the batch attention path for the row at `pos`: its chunk has kAttentionBatchRows rows
  // or more.
  bool fresh_batch_path(int pos, int length) const;
  int n_batch() const { return n_batch_; }
  const Sampler& sampler() const { return sampler_; }
  void set_sampler(const SamplerConfig& config) {
    sampler_ = Sampler(config);
    sampled_ = config.temperature > 0.0f;
    pending_sample_.reset();
  }
  // The tokens whose keys and values the cache holds, in order.
  const std::vector<int32_t>& history() const { return history_; }
  // Samples the next token from the current logits (does not feed it), among the tokens
  // `filter` allows when there is one. After a sampled verification (accept_draft) it is the
  // token that verification drew at the first refused row.
  int32_t sample(const TokenFilter* filter = nullptr);
  // Feeds one generated token and records its cost.
  const TokenRecord& accept(int32_t token);
  // Speculative step: feeds `token` and the draft in one batched pass and keeps the longest
  // draft prefix that decoding would have produced: greedy, each row's argmax; sampling (no
  // penalties), the sampler draws from each row in order, as it would one token at a time, and a
  // draft token is kept when it is the draw; the first other draw is kept for sample(). Returns
  // how many draft tokens were kept; they are in the history and the logits are those after the
  // last kept token, exactly as if each had been accepted one at a time (the kernels' per-row
  // results do not depend on the batch size). The pass's cost is split over the kept tokens'
  // records.
  int accept_draft(int32_t token, const std::vector<int32_t>& draft);
  // accept_draft with the draft made by `propose` inside the step, so that the drafter's compute
  // and expert reads (an MTP head's) count in the kept tokens' records as the pass's do; an
  // empty draft is a plain step (accept) that still carries the drafter's cost.
  int draft_and_accept(int32_t token, const std::function<std::vector<int32_t>()>& propose);
  const std::vector<float>& logits() const { return *logits_; }

  InferenceState& state() { return state_; }
  // The model's MTP head over this sequence, or nullptr where the model's MTP block is not
  // bound (the run was loaded without --mtp, or the file has none).
  MtpHead* mtp_head() { return mtp_head_.get(); }
  const std::vector<TokenRecord>& records() const { return records_; }
  LoadedModel& model() { return model_; }
  void reset();
  // Embeds `tokens` from an empty context: their final hidden states pooled, then scaled to unit
  // length (L2), as llama-server's /v1/embeddings. Afterwards the cache holds these tokens (a
  // prompt that starts with them reuses their rows).
  std::vector<float> embed(const std::vector<int32_t>& tokens, Pooling pooling);

 private:
  friend class SessionBatch;  // feeds several sessions in one pass (session_batch.h)
  // The counters at the start of a decode step, for its record.
  struct StepStart {
    ExpertStats experts;
    ProcessCounters process;
  };
  StepStart step_start() const;
  // Appends a record of parts [share, share + parts) of `of` equal parts of a pass (the integer
  // counters' remainder on part 0).
  void record(int32_t token, double wall_seconds, const StepStart& before, int share, int of, int batch, int parts = 1);
  // The verification pass of accept_draft, its step begun at `before` / `timer`.
  int verify(int32_t token, const std::vector<int32_t>& draft, const StepStart& before, const Stopwatch& timer);
  // How many draft tokens the verification rows keep (`rows`: the logits after the fed token and
  // after each draft token, n_vocab each); a sampled one leaves its first other draw pending.
  int judge_draft(std::span<const int32_t> draft, const float* rows);
  // After a pass fed `batch` (the token, then its draft) from position `start`, with its rows'
  // logits `rows`: keeps the judged prefix (logits, KV and recurrent state, history, sampler) and
  // returns how many draft tokens it holds. Records are the caller's.
  int keep_verified(std::span<const int32_t> batch, const float* rows, int start);
  // After `token` was fed (alone or in a batch): the logits, history and sampler move on.
  void took(int32_t token);
  // After prompt tokens were fed (prefill, or a chunk in a batch's pass): the history, the MTP
  // head and the sampler's look-back move on.
  void prompt_read(std::span<const int32_t> tokens);
  LoadedModel& model_;
  ThreadPool& pool_;
  InferenceState state_;
  int n_batch_;
  Sampler sampler_;
  const std::vector<float>* logits_ = nullptr;
  std::vector<TokenRecord> records_;
  std::vector<int32_t> history_;
  std::vector<float> draft_logits_;  // the kept row of a speculative pass
  std::unique_ptr<SessionMtpHead> mtp_head_;
  bool sampled_ = false;                 // the sampler draws (temperature > 0)
  std::optional<int32_t> pending_sample_;  // drawn by a sampled verification, not yet emitted
};

}  // namespace bmoe
