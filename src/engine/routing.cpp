#include "engine/routing.h"

#include <algorithm>

#include "core/error.h"

namespace bmoe {

RouteRecorder::RouteRecorder(const std::string& path, LoadedModel& model) : model_(model) {
  const ModelConfig& c = model.transformer->config();
  std::vector<uint64_t> dense(static_cast<size_t>(c.n_layer), 0);
  for (int l = 0; l < c.n_layer; ++l) {
    const auto& layers = model.expert_layout.layers;
    expert_bytes_.push_back(static_cast<size_t>(l) < layers.size() ? layers[static_cast<size_t>(l)].expert_bytes() : 0);
  }
  writer_ = std::make_unique<RouteTraceWriter>(path, model.gguf->primary().path, c.arch, c.n_layer, c.n_expert,
                                               c.n_expert_used, expert_bytes_, dense);
}

void RouteRecorder::on_route(const RouteEvent& e) {
  if (e.replay) return;  // recorded when the rows first ran
  StreamingExperts* streamer = model_.streamer();
  for (size_t s = 0; s < e.experts->size(); ++s) {
    RouteRecord r;
    r.phase = e.prefill ? 0 : 1;
    r.step = e.position;
    r.layer = e.layer;
    r.slot = static_cast<int>(s);
    r.expert = (*e.experts)[s];
    r.weight = (*e.weights)[s];
    r.residency = streamer && streamer->resident(e.layer, r.expert) ? 1 : 0;
    r.expert_bytes = r.residency ? 0 : expert_bytes_[static_cast<size_t>(e.layer)];
    writer_->write(r);
  }
  if (e.layer + 1 == static_cast<int>(expert_bytes_.size())) writer_->flush();
}

RouteReplayer::RouteReplayer(const std::string& path, const ModelConfig& config) {
  const RouteTrace trace = RouteTrace::load(path);
  if (trace.n_layer < config.n_layer) {
    fail("{}: the trace has {} layers, the model {}", path, trace.n_layer, config.n_layer);
  }
  if (trace.n_expert > config.n_expert) {
    fail("{}: the trace routes over {} experts, the model has {}", path, trace.n_expert, config.n_expert);
  }
  auto replay = std::make_shared<Steps>();
  std::map<std::pair<int, int>, Step> steps;  // (phase, step) -> per-layer choices
  for (const RouteRecord& r : trace.records) {
    if (r.turn != trace.records.front().turn || r.layer >= config.n_layer) continue;
    Step& s = steps[{r.phase, r.step}];
    s.resize(static_cast<size_t>(config.n_layer));
    auto& slots = s[static_cast<size_t>(r.layer)];
    if (static_cast<int>(slots.size()) <= r.slot) slots.resize(static_cast<size_t>(r.slot) + 1, {-1, 0.0f});
    slots[static_cast<size_t>(r.slot)] = {r.expert, r.weight};
  }
  for (auto& [key, step] : steps) {
    for (auto& slots : step) {
      slots.erase(std::remove_if(slots.begin(), slots.end(), [](const auto& p) { return p.first < 0; }), slots.end());
    }
    (key.first == 0 ? replay->prompt : replay->decode).push_back(std::move(step));
  }
  if (replay->decode.empty()) fail("{}: the trace has no decode steps to replay", path);
  steps_ = std::move(replay);
}

RouteReplayer RouteReplayer::starting_at(int offset) const {
  if (offset < 0) fail("internal: a route replay from step {}", offset);
  RouteReplayer r;
  r.steps_ = steps_;
  r.offset_ = offset;
  return r;
}

void RouteReplayer::on_route(RouteEvent& e) {
  const std::vector<Step>& prompt = steps_->prompt;
  const std::vector<Step>& decode = steps_->decode;
  const Step* step;
  if (e.prefill) {
    const size_t i = static_cast<size_t>(offset_) + static_cast<size_t>(e.position);
    step = prompt.empty() ? &decode[i % decode.size()] : &prompt[i % prompt.size()];
  } else {
    if (first_decode_position_ < 0 || e.position < first_decode_position_) first_decode_position_ = e.position;
    step = &decode[(static_cast<size_t>(offset_) + static_cast<size_t>(e.position - first_decode_position_)) % decode.size()];
  }
  const auto& slots = (*step)[static_cast<size_t>(e.layer)];
  if (slots.empty()) return;  // the trace skipped this layer: keep the model's own routing
  e.experts->clear();
  e.weights->clear();
  float total = 0.0f;
  for (const auto& [expert, weight] : slots) total += weight;
  for (const auto& [expert, weight] : slots) {
    e.experts->push_back(expert);
    e.weights->push_back(total > 0.0f ? weight / total : 1.0f / static_cast<float>(slots.size()));
  }
}

}  // namespace bmoe
