// What the mixer units of model/mixers.cpp, mixer_kimi_delta.cpp and mixer_latent.cpp share:
// the pre-norm, the per-layer recurrent states, and the factories of the kinds that live in
// their own files. Internal to the model layer.
#pragma once

#include <memory>
#include <vector>

#include "model/attention.h"
#include "model/config.h"
#include "model/layer_pass.h"
#include "model/mixers.h"
#include "model/weights.h"

namespace bmoe::mixer_units {

// The layer's pre-norm of every row of the residual into h.
void pre_norm(const LayerPass& pass, const Vector& weight, std::vector<float>& h);

// One float array per layer of a recurrent kind (empty for the other layers), and the copy
// save() took.
class LayerStates {
 public:
  LayerStates(const ModelConfig& c, MixerKind kind);
  float* at(int layer) { return live_[static_cast<size_t>(layer)].data(); }
  uint64_t bytes() const;
  void save() { saved_ = live_; }
  void restore() { live_ = saved_; }
  void clear();
  // Per-row copies of the next pass (Mixer::keep_row_states): the kind writes layer l's state
  // after row r into row_copy(l, r) for r < kept_rows().
  void keep_rows(int rows);
  int kept_rows() const { return kept_rows_; }
  float* row_copy(int layer, int row) {
    std::vector<float>& rows = rows_[static_cast<size_t>(layer)];
    return rows.data() + static_cast<size_t>(row) * live_[static_cast<size_t>(layer)].size();
  }
  void restore_row(int row);
  uint64_t row_bytes() const;  // what the copies hold
  void append(std::vector<float>& out) const;

 private:
  std::vector<std::vector<float>> live_, saved_;
  std::vector<std::vector<float>> rows_;  // per layer, kept_rows_ copies of its state (capacity kept)
  int kept_rows_ = 0;
};

std::unique_ptr<Mixer> make_kimi_delta(const ModelConfig& c);
std::unique_ptr<Mixer> make_latent_attention(const ModelConfig& c, int n_ctx, KvType kv_type);
std::unique_ptr<Mixer> make_compressed_attention(const ModelConfig& c, int n_ctx, KvType kv_type, int rewind_slack);

}  // namespace bmoe::mixer_units
