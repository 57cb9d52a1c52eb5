// The mixer kinds (what mixes tokens in a layer) as units. A unit runs one kind's layers: it
// reads the residual stream, adds its output to it, and owns its scratch and its per-sequence
// state: the KV rows of the attention kinds (the layout is the kind's own), the recurrent state
// of Gated DeltaNet and short convolution. A sequence holds one unit per kind its plan uses,
// shared by that kind's layers, so scratch is sized once per kind, not per layer.
#pragma once

#include <climits>

#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "model/attention.h"
#include "model/config.h"
#include "model/layer_pass.h"
#include "model/matmul.h"
#include "model/weights.h"

namespace bmoe {

class Mixer {
 public:
  virtual ~Mixer() = default;
  // Runs `layer` (of this unit's kind) on the pass's rows.
  virtual void forward(const LayerWeights& L, int layer, const LayerPass& pass) = 0;
  // Several sequences' rows in one pass (continuous batching): seqs[j] is a run of consecutive
  // rows of the pass that belong to one sequence, whose unit of this kind is seqs[j].unit (one
  // decode row, or a chunk of its prompt). A kind whose dense work does not depend on a
  // sequence's state runs it on all rows at once (one pass over its weights, in this unit's
  // scratch) and each sequence's state-bound work in its own unit, on the attention path that
  // sequence's rows would take alone (SequenceRows::batch_path), and returns true; the others
  // return false, and the caller then runs each sequence's rows in its own unit with forward().
  struct SequenceRows {
    Mixer* unit;
    int first;        // its first row in the pass
    int n;            // its rows
    bool batch_path;  // as LayerPass::batch_path of the sequence's own pass
  };
  virtual bool forward_sequences(std::span<const SequenceRows> seqs, const LayerWeights& L, int layer,
                                 const LayerPass& pass) {
    return false;
  }
  virtual uint64_t kv_bytes() const { return 0; }
  // The recurrent kinds: bytes of their state, a copy of it (save), back to that copy
  // (restore), the empty state of a new sequence (clear).
  virtual uint64_t recurrent_bytes() const { return 0; }
  virtual void save_state() {}
  virtual void restore_state() {}
  virtual void clear_state() {}
  // How many of the newest positions a rewind may forget by moving the sequence length back
  // alone; a longer rewind restores the saved copy and replays (InferenceState::truncate). The
  // recurrent kinds cannot forget in place, a full KV cache can forget anything.
  virtual int rewind_reach() const { return recurrent_bytes() > 0 ? 0 : INT_MAX; }
  // Per-row copies: during the next eval, keep a copy of the state after each of its first
  // `rows` rows (0: none), so that a rewind into that eval (a partly rejected draft) restores
  // one (restore_row_state) instead of replaying the kept rows through the model. Returns
  // whether this kind can: one without recurrent state needs none, a recurrent kind that keeps
  // no copies returns false (the rewind then replays).
  virtual bool keep_row_states(int rows) { return recurrent_bytes() == 0; }
  virtual void restore_row_state(int row) {}
  // Bytes the per-row copies hold (their capacity stays for the next pass).
  virtual uint64_t row_state_bytes() const { return 0; }
  // Appends the live recurrent state (tests compare it bit for bit with plain decoding's).
  virtual void append_state(std::vector<float>& out) const {}
};

// Positions beyond its sliding window that a bounded state (deepseek4's raw ring) keeps, so a
// rewind of up to this many tokens (a rejected draft, a re-rendered turn end) needs no replay.
inline constexpr int kRewindSlack = 32;

// f32 floats of one sequence's recurrent state in `layer` (0 for the attention kinds).
int64_t recurrent_state_floats(const ModelConfig& c, int layer);
// f32 floats of one per-row copy of a sequence's recurrent state (Mixer::keep_row_states): the
// Gated DeltaNet and short-convolution layers'; 0 where another layer's state keeps no copies
// (then no unit keeps any: Mixers::keep_row_states).
int64_t row_copy_floats(const ModelConfig& c);
// Bytes per token of the KV rows of `layer` (f16; 0 for the recurrent kinds).
int64_t kv_bytes_per_token(const ModelConfig& c, int layer);

// The units of one sequence, and which runs each layer.
class Mixers {
 public:
  // rewind_slack: see kRewindSlack (at least n_ctx: bounded states keep every position).
  Mixers(const ModelConfig& c, int n_ctx, KvType kv_type, int rewind_slack = kRewindSlack);
  Mixer& at(int layer) { return *by_layer_[static_cast<size_t>(layer)]; }
  uint64_t kv_bytes() const;
  uint64_t recurrent_bytes() const;
  void save_state();
  void restore_state();
  void clear_state();
  int rewind_reach() const;  // the least of the units'
  // Every unit keeps per-row copies during the next eval (Mixer::keep_row_states); false if
  // some unit cannot (then none keeps any).
  bool keep_row_states(int rows);
  void restore_row_state(int row);
  uint64_t row_state_bytes() const;
  std::vector<float> recurrent_state() const;  // every unit's live state, concatenated

 private:
  std::vector<std::unique_ptr<Mixer>> units_;
  std::vector<Mixer*> by_layer_;
};

}  // namespace bmoe
