// The MTP (nextn) block of a model, run as a draft head as llama.cpp's graph_mtp runs it
// (glm4moe, qwen35moe and deepseek4 alike): the block's input is eh_proj([enorm(embed(token)) |
// hnorm(hidden)]), where `hidden` is the hidden state of the position before (the trunk's
// output-normed row; with deepseek4's hyper-connections its residual streams, each projected
// beside the same embedding into one stream of the block); then one decoder block of the
// family's kinds (ModelConfig::nextn_plan) with its own attention KV rows (deepseek4: its window
// ring) and its routed experts read through the model's ExpertSource as layer n_layer (they
// stream as the trunk's do); then shared_head_norm (else output_norm), after the model's fold of
// the streams where there are several, and the shared output head give the logits. The head's
// own hidden state, the input of a chained guess, is the normed row, or the streams unmixed.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "core/thread_pool.h"
#include "model/attention.h"
#include "model/ffn.h"
#include "model/mixers.h"
#include "model/routed_experts.h"
#include "model/transformer.h"

namespace bmoe {

class NextnHead : private ResidualRouter {
 public:
  // The model must hold its bound MTP block (has_nextn_head).
  NextnHead(Transformer& model, ThreadPool& pool, int n_ctx, KvType kv_type = KvType::F16);
  ~NextnHead();

  // Runs the head over positions [first_position, first_position + n): row i pairs hidden row i
  // (n_embd floats) with tokens[i], writes the head's KV row at its position and forgets the
  // rows after the last one (a later call at an earlier position rewinds the head exactly).
  // Afterwards logits() and hidden() are the last row's.
  void forward(int first_position, std::span<const float> hidden, std::span<const int32_t> tokens);
  const std::vector<float>& logits() const { return logits_; }
  const std::vector<float>& hidden() const { return hidden_; }
  // Floats per hidden row, in and out: n_embd, or with hyper-connections (deepseek4) n_embd per
  // stream, the streams unmixed (llama.cpp's h_nextn of that family).
  int hidden_width() const;
  int n_past() const { return n_past_; }
  // How far back from n_past() a forward() may start and still see every row it attends to:
  // any distance with a full KV cache; deepseek4's window ring keeps a slack (kRewindSlack)
  // beyond its window.
  int rewind_reach() const { return mixers_.rewind_reach(); }
  uint64_t kv_bytes() const { return mixers_.kv_bytes(); }
  uint64_t recurrent_bytes() const { return mixers_.recurrent_bytes(); }  // deepseek4: its window ring

 private:
  class LayerShiftedSource;
  int streams() const;
  void embed_inputs(std::span<const float> hidden, std::span<const int32_t> tokens);
  void output_head(int n);
  int layers() const override { return 1; }
  bool has_router(int layer) const override { return cfg_.has_experts_at(layer); }
  void route_residual(int layer, std::span<TokenRoute> rows) override;

  Transformer& model_;
  ThreadPool& pool_;
  const int n_ctx_;
  const ModelConfig cfg_;  // one layer: the MTP block
  const ModelWeights weights_;
  std::unique_ptr<LayerShiftedSource> source_;
  Mixers mixers_;
  Ffns ffns_;
  RoutingHooks hooks_;
  RoutedExperts experts_;
  ResidualStream residual_;
  std::vector<int> positions_;
  std::vector<float> input_, projected_, normed_, logits_, hidden_;
  ActivationBuffer proj_act_, head_act_;
  int n_past_ = 0;
};

// The MTP block as a one-layer model (what a NextnHead runs): its plan, and the per-layer
// settings of the last trunk layer, whose shapes the block has, except where the file gives
// the block its own (deepseek4's compress ratio and SwiGLU limits); no hash routing. Its kv_bytes_per_token() and
// recurrent_state_bytes() are the head's per sequence (memory budgets count them).
ModelConfig nextn_block_config(const ModelConfig& c);

// Whether the model's MTP block is bound (the loader was asked for it and the file has it).
bool has_nextn_head(const Transformer& model);

}  // namespace bmoe
