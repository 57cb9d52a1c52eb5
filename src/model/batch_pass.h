// One forward pass for several sequences at once (continuous batching): a decode row of each
// running sequence, and with them the next chunk of a prompt being read (llama-server's mixed
// batches). Each sequence keeps its own state in its InferenceState (KV rows or recurrent state,
// position, logits); the attention mixers project every row at once and attend each sequence's
// rows over its own KV rows, on the path its own eval() of those rows takes (the recurrent
// mixers run each sequence's rows alone); the FFNs then run on every row together, so a routed
// expert that several sequences chose is asked of the ExpertSource once (read once when
// streamed) and computed for all their rows in one pass. The kernels give a row the same bits in
// any batch (design.md, section 3), so each sequence's logits and state equal those of an eval()
// of its rows alone.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "core/thread_pool.h"
#include "model/ffn.h"
#include "model/matmul.h"
#include "model/mixers.h"
#include "model/residual.h"
#include "model/routed_experts.h"
#include "model/transformer.h"

namespace bmoe {

class BatchPass : private ResidualRouter {
 public:
  BatchPass(Transformer& model, ThreadPool& pool);

  // Feeds tokens[i] to states[i], one position each, in one forward pass; afterwards each
  // state's logits() are those of its row. A failure leaves every state as a failed one-token
  // eval() would (no position added). Each state's route hook sees its own rows.
  void decode(std::span<InferenceState* const> states, std::span<const int32_t> tokens);
  // Feeds states[i] its counts[i] tokens (tokens holds them one sequence after the other) in
  // one forward pass: afterwards each state is as an eval() of its tokens alone leaves it (its
  // logits: its last row's; the rows take the attention path that eval() gives them, so a
  // prompt chunk with the state's set_batch_path as a fresh read sets it). A failure leaves
  // every state as its failed eval() would. A state that keeps hidden states (an MTP head's
  // trunk) keeps its rows' as its eval() would. With all_logits (empty, or one flag per state), a
  // flagged state's logits() are every row's, as eval(..., all_logits = true) gives them (a
  // speculative verification's rows).
  void run(std::span<InferenceState* const> states, std::span<const int32_t> tokens, std::span<const int> counts,
           std::span<const uint8_t> all_logits = {});

  // The hook that makes the batch's routing-time decisions (as InferenceState's). Route-ahead
  // and drop-cold act on one-token passes only, so a batch of two or more takes neither.
  void set_router_hook(std::unique_ptr<RouterHook> hook) { hooks_.router = std::move(hook); }
  void set_routing_options(const RoutingOptions& options);
  // What sharing the experts saved so far: (token, slot) pairs routed, and the distinct experts
  // asked of the source for them (one lookup per expert per layer and step).
  uint64_t routed_slots() const { return experts_.routed_slots(); }
  uint64_t distinct_experts() const { return experts_.distinct_experts(); }

 private:
  void check(std::span<InferenceState* const> states, std::span<const int32_t> tokens, std::span<const int> counts);
  void begin(std::span<InferenceState* const> states, std::span<const int32_t> tokens);
  void run_layers(std::span<InferenceState* const> states);
  void mix_alone(InferenceState& s, Mixer& unit, const LayerWeights& L, int layer, const Mixer::SequenceRows& rows);
  void keep_hidden_rows(std::span<InferenceState* const> states);
  void output_head(std::span<InferenceState* const> states);
  // ResidualRouter over the batch's rows.
  int layers() const override { return cfg_.n_layer; }
  bool has_router(int layer) const override { return cfg_.has_experts_at(layer); }
  void route_residual(int layer, std::span<TokenRoute> rows) override;

  Transformer& model_;
  const ModelConfig& cfg_;
  ThreadPool& pool_;
  std::span<InferenceState* const> states_;  // during run(): the route hook's dispatch
  std::vector<int> first_, count_;            // during run(): each state's first row, and rows
  std::vector<uint8_t> all_logits_;           // during run(): each state's flag (every row's logits)
  std::vector<int> row_state_;                // during run(): each row's state
  Ffns ffns_;
  RoutedExperts experts_;
  ResidualStream residual_;
  std::vector<int> positions_;
  std::vector<int32_t> tokens_;  // during run(): each row's token (hash-routed layers)
  std::vector<Mixer::SequenceRows> units_;  // during a layer: each sequence's rows and mixer unit
  std::vector<int> ones_;                   // decode(): a row per state
  ResidualStream last_rows_;                // the rows the output head runs on
  std::vector<int> head_rows_;              // their indices in the batch
  HeadScratch head_;
  RoutingHooks hooks_;  // last: destroyed first, as in InferenceState
};

}  // namespace bmoe
