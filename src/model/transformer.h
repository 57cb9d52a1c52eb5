// The decoder shared by every MoE family: attention with a KV cache, then a routed-expert FFN
// (optionally with a shared expert or dense FFN layers). Architecture files fill the weights
// and the config; this file holds the forward pass.
#pragma once

#include <algorithm>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <span>
#include <vector>

#include "core/thread_pool.h"
#include "model/attention.h"
#include "model/config.h"
#include "model/ffn.h"
#include "model/matmul.h"
#include "model/mixers.h"
#include "model/residual.h"
#include "model/routed_experts.h"
#include "model/weights.h"
#include "expert_source/expert_source.h"
#include "expert_source/router_hook.h"  // RoutingOptions, RouterHook
#include "quant/weight.h"

namespace bmoe {

class Transformer {
 public:
  Transformer(ModelConfig config, ModelWeights weights, ExpertSource* experts);

  const ModelConfig& config() const { return config_; }
  ExpertSource& experts() { return *experts_; }
  void set_experts(ExpertSource* experts) { experts_ = experts; }
  const ModelWeights& weights() const { return weights_; }

 private:
  friend class InferenceState;
  ModelConfig config_;
  ModelWeights weights_;
  ExpertSource* experts_;
};

// The output head's scratch: normed rows, logits (row by row), the activations.
struct HeadScratch {
  std::vector<float> h, logits;
  ActivationBuffer act;
};
// The output norm, head and final softcap on residual rows [first, n) into scratch.logits (with
// several residual streams, their head mix first, which writes the rows' mixed row).
void output_logits(ThreadPool& pool, const Transformer& model, ResidualStream& residual, int first, int n,
                   HeadScratch& scratch);

// Per-sequence state: KV cache, position, scratch buffers. Routing-time decisions beyond the
// model's own gating (prefetch, route-ahead, drop-cold) are its RouterHook's; the state offers
// the hook its routers (ResidualRouter).
class InferenceState : private ResidualRouter {
 public:
  friend class BatchPass;  // runs several states' rows in one pass (batch_pass.h)
  // rewind_slack: positions a bounded state keeps beyond its window (kRewindSlack; n_ctx or
  // more keeps every position, as a full KV cache does).
  InferenceState(Transformer& model, ThreadPool& pool, int n_ctx, KvType kv_type = KvType::F16,
                 int rewind_slack = kRewindSlack);

  // Runs tokens at positions [n_past, n_past + n). Returns logits of the last token, or of
  // every token when all_logits (row i = token i).
  const std::vector<float>& eval(const int32_t* tokens, int n, bool all_logits = false);
  // Runs tokens as eval() does but returns every row's final hidden state (after the output
  // norm; n_embd floats per row) instead of logits: what embeddings pool.
  const std::vector<float>& eval_hidden(const int32_t* tokens, int n);

  // The logits the last eval() (or BatchPass::run) returned.
  const std::vector<float>& logits() const { return head_.logits; }
  // Keeps the hidden state of every row an eval() runs (not a rewind's replay) until
  // take_hidden_states(): what an MTP head reads (llama.cpp's h_nextn): the output-normed row
  // (n_embd floats), or with hyper-connections the row's streams unmixed (hidden_width()).
  int hidden_width() const;
  void keep_hidden_states(bool keep) { keep_hidden_ = keep; }
  // The kept rows, oldest first, and the position of the first; truncate() drops those it
  // forgets. Afterwards none is kept.
  std::vector<std::vector<float>> take_hidden_states(int* first_position = nullptr);

  int n_past() const { return n_past_; }
  int n_ctx() const { return n_ctx_; }
  // The two attention paths round differently (model/attention.h): rows of an eval of
  // kAttentionBatchRows or more take the batch path, smaller evals the decode path, or the batch
  // path too while set_batch_path(true) (a prompt's rows read in pieces, each on the path a
  // fresh read of the whole prompt gives it; a row's bits then equal that read's).
  void set_batch_path(bool on) { force_batch_path_ = on; }
  // Whether the row at `pos` (< n_past()) took the batch path.
  bool row_took_batch_path(int pos) const { return token_batch_path_[static_cast<size_t>(pos)] != 0; }
  // Forgets positions >= n (prefix reuse keeps the cache rows below n). A recurrent state
  // cannot forget, nor a bounded one (deepseek4's rings) further back than its slack: it goes
  // back to the state saved at the start of the last multi-token eval() (or to the empty
  // state) and runs the tokens from there to n again, each row on the attention path it first
  // took, which gives the state those tokens gave the first time.
  // truncate(n_past()) also repairs a state that a failed eval() left half updated.
  void truncate(int n);
  size_t recurrent_bytes() const { return mixers_.recurrent_bytes(); }
  // The live recurrent state of every layer, concatenated (tests compare it bit for bit).
  std::vector<float> recurrent_state() const { return mixers_.recurrent_state(); }
  // Truncates that restored a per-row copy instead of replaying (a rejected draft's rewind).
  int64_t row_state_rewinds() const { return row_state_rewinds_; }
  // The most per-row copies of the recurrent state a short eval (a verification pass of 1 + k
  // rows) keeps: it keeps one per row but the last when that is at most `rows`, else none (a
  // rewind then replays). Each copy costs the state of the units that keep copies
  // (row_copy_floats), so a memory budget counts `rows` of them (engine/run.cpp's context_memory
  // and open_session set both from the draft length).
  static constexpr int kMaxRowStates = 8;
  void set_row_state_limit(int rows) { row_state_limit_ = std::clamp(rows, 0, kMaxRowStates); }
  int row_state_limit() const { return row_state_limit_; }
  // Bytes the per-row copies hold now (at most row_state_limit() * row_copy_floats * 4).
  uint64_t row_state_bytes() const { return mixers_.row_state_bytes(); }
  void set_route_hook(RouteHook hook) { hooks_.route = std::move(hook); }
  // Called after each layer of each eval() with the layer just done (progress of long batches).
  void set_layer_hook(std::function<void(int layer)> hook) { layer_hook_ = std::move(hook); }
  // Whether the next eval() calls process prompt tokens (reported to the route hook).
  void set_prefill(bool prefill) { hooks_.prefill = prefill; }
  size_t kv_bytes() const { return mixers_.kv_bytes(); }
  // The hook that makes the routing-time decisions (Session installs a RoutingPolicy); without
  // one the model routes by its gating alone.
  void set_router_hook(std::unique_ptr<RouterHook> hook) { hooks_.router = std::move(hook); }
  // The router hook's options; setting any but the defaults needs a hook.
  void set_routing_options(const RoutingOptions& options);
  const RoutingOptions& routing_options() const;
  // Experts skipped by drop_cold so far.
  uint64_t dropped_experts() const { return hooks_.router ? hooks_.router->dropped_experts() : 0; }

 private:
  void replay(int start, int end);
  bool restore_row_state(int n);
  void keep_row_states(int n);
  // Whether some unit cannot forget every position in place (recurrent or bounded state): then
  // evals book their tokens and save the state for truncate's replay.
  bool rewinds_by_replay() const { return rewind_reach_ < n_ctx_; }
  // The path forced on the rows of this eval: a replay's rows keep the one they first took.
  bool batch_path() const { return replaying_ ? replay_batch_path_ : force_batch_path_; }
  void embed(const int32_t* tokens, int n);
  void advance(const int32_t* tokens, int n);  // eval() up to the output norm
  void begin_rows(const int32_t* tokens, int n);
  void abandon_rows(int n);
  void run_layers(int n);
  void normalize_rows(int first, int n);  // rows [first, n) of the residual stream, normed, into h_
  // Rows [first, first + n) of `rows` (this eval's, or a BatchPass's), normed, after the kept ones.
  void keep_hidden_rows(const ResidualStream& rows, int first, int n);
  void forget_hidden_rows(int from);      // kept rows at positions >= from
  const std::vector<float>& output_head(int first, int n);
  // ResidualRouter: the router hook scores later layers' routers on the residual stream.
  int layers() const override { return cfg_.n_layer; }
  bool has_router(int layer) const override;
  void route_residual(int layer, std::span<TokenRoute> rows) override;

  Transformer& model_;
  const ModelConfig& cfg_;
  ThreadPool& pool_;
  const int n_ctx_;
  int n_past_ = 0;
  int rewind_reach_ = 0;  // positions a truncate may drop without a replay (Mixers::rewind_reach)
  std::function<void(int)> layer_hook_;

  // The layer kinds' units: mixers with their per-sequence state (KV rows, recurrent state),
  // FFNs, the routed experts those with experts share.
  Mixers mixers_;
  Ffns ffns_;
  RoutedExperts experts_;
  ResidualStream residual_;
  // The attention path each row at positions [0, n_past) took (1: batch).
  std::vector<uint8_t> token_batch_path_;
  bool force_batch_path_ = false;
  // Recurrent layers (Gated DeltaNet, short convolutions): the mixers save their state at the
  // start of each multi-token eval (at checkpoint_pos_; -1: none); the tokens at positions
  // [0, n_past), to run again after a rewind (each on its row's path); dirty after an eval that
  // failed part-way without a copy to go back to.
  int checkpoint_pos_ = -1;
  std::vector<int32_t> tokens_;
  bool recurrent_dirty_ = false;
  bool replay_batch_path_ = false;  // set while replay() runs rows that first took the batch path
  bool replaying_ = false;
  // Short multi-token evals (a draft's verification) also keep a copy of the recurrent state
  // after each of their rows but the last: copies for positions (row_states_from_,
  // row_states_from_ + row_states_n_], valid until the next eval. A rewind to one of them
  // restores it instead of replaying.
  int row_states_from_ = 0;
  int row_states_n_ = 0;
  int row_state_limit_ = kMaxRowStates;
  int64_t row_state_rewinds_ = 0;

  // Hidden states kept for an MTP head: rows of hidden_width() from position hidden_first_.
  bool keep_hidden_ = false;
  int hidden_first_ = 0;
  std::vector<float> hidden_rows_;

  HeadScratch head_;  // the output head's scratch: its logits are the last eval's
  std::vector<int> positions_;
  std::vector<int32_t> batch_tokens_;  // the current eval's token ids (hash-routed layers route by them)

  RoutingHooks hooks_;  // last: destroyed first, as the router hook always was
};

}  // namespace bmoe
