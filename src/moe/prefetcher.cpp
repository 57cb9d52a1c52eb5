#include "moe/prefetcher.h"

#include <algorithm>

#include "core/error.h"

namespace bmoe {

Prefetcher::Prefetcher(const PrefetchOptions& options, ReadPlanner& planner, ReadLanes& lanes, BufferPool& pool,
                       const ExpertCache& cache, ExpertStats& counters)
    : options_(options), planner_(planner), lanes_(lanes), pool_(pool), cache_(cache), counters_(counters) {
  if (options_.affinity_window <= 0 || !enabled()) return;
  if (options_.top_k <= 0) fail("internal: affinity prefetch needs the model's top-k");
  std::vector<int> experts_per_layer;
  for (int l = 0; l < planner_.n_layers(); ++l) experts_per_layer.push_back(planner_.streams(l) ? planner_.n_expert(l) : 0);
  AffinityOptions a;
  a.window = options_.affinity_window;
  a.min_score = options_.affinity_min_score;
  affinity_ = std::make_unique<AffinityPredictor>(std::move(experts_per_layer), a);
  if (options_.affinity_reads <= 0) options_.affinity_reads = std::max(1, options_.top_k / 2);
}

Prefetcher::~Prefetcher() {
  for (auto& [key, staged] : staged_) {
    lanes_.cancel(staged.ticket.get());
    lanes_.wait(*staged.ticket);
  }
  reap(true);
}

void Prefetcher::hint(std::span<const LayerPrediction> predictions) {
  if (!enabled()) return;
  reap(false);
  for (const LayerPrediction& p : predictions) take(p);
}

void Prefetcher::take(const LayerPrediction& p) {
  if (!planner_.streams(p.layer)) return;
  if (p.exact) {  // known routing: nothing to score, no accuracy to pause on
    if (options_.early_reads) read_ahead(p);
    return;
  }
  auto& pending = predictions_[p.layer];
  const auto same = std::find_if(pending.begin(), pending.end(), [&](const LayerPrediction& q) {
    return q.distance == p.distance && q.source == p.source;
  });
  if (same != pending.end()) *same = p;
  else pending.push_back(p);
  if (!paused(p.source)) read_ahead(p);
}

void Prefetcher::read_ahead(const LayerPrediction& p) {
  // An affinity prediction ranks many candidates: only its best few that are not cached are
  // worth a read (the rest would mostly be wasted bytes).
  int reads_left = p.source == PredictionSource::Affinity ? options_.affinity_reads : 1 << 30;
  for (int32_t e : p.experts) {
    if (reads_left == 0) break;
    if (e < 0 || e >= planner_.n_expert(p.layer)) continue;
    if (cache_.contains(make_expert_key(p.layer, e))) continue;
    stage(p.layer, e, p.distance, p.source, p.exact);
    --reads_left;
  }
}

void Prefetcher::stage(int layer, int expert, int distance, PredictionSource source, bool exact) {
  const ExpertKey key = make_expert_key(layer, expert);
  if (cache_.contains(key) || staged(key)) return;
  const uint64_t bytes = planner_.slot_bytes(layer, expert);
  if (staged_bytes_ + bytes > options_.staging_bytes) return;  // staging full: skip, never evict
  Staged s;
  s.layer = layer;
  s.bytes = bytes;
  s.source = source;
  s.exact = exact;
  s.buffer = pool_.take(planner_.cached_bytes(layer));
  s.ticket = std::make_unique<ReadTicket>();
  planner_.queue(layer, expert, *s.buffer, *s.ticket, distance);
  staged_bytes_ += bytes;
  if (exact) {
    ++counters_.early_reads;
  } else {
    ++counters_.prefetch_reads;
    ++counters_.prefetch_reads_by[static_cast<int>(source)];
  }
  staged_.emplace(key, std::move(s));
}

void Prefetcher::settle(int layer, std::span<const int32_t> routed, uint64_t token) {
  const auto it = predictions_.find(layer);
  if (it == predictions_.end()) return;
  for (const LayerPrediction& p : it->second) {
    PredictionRecord r = score(p, routed);
    r.token = token;
    r.layer = layer;
    if (options_.keep_log) log_.push_back(r);
    if (r.predicted > 0) judge(p, r.predicted, routed);
  }
  predictions_.erase(it);
}

PredictionRecord Prefetcher::score(const LayerPrediction& p, std::span<const int32_t> routed) {
  PredictionRecord r;
  r.distance = p.distance;
  r.predicted = static_cast<int>(p.experts.size());
  r.source = p.source;
  for (int32_t e : p.experts) {
    if (std::find(routed.begin(), routed.end(), e) == routed.end()) continue;
    ++r.correct;
    if (staged(make_expert_key(p.layer, e))) ++r.prefetched;
  }
  counters_.predicted += static_cast<uint64_t>(r.predicted);
  counters_.predicted_correct += static_cast<uint64_t>(r.correct);
  const int d = std::clamp(p.distance, 0, ExpertStats::kMaxDistance);
  counters_.predicted_at[d] += static_cast<uint64_t>(r.predicted);
  counters_.correct_at[d] += static_cast<uint64_t>(r.correct);
  const int source = static_cast<int>(p.source);
  counters_.predicted_by[source] += static_cast<uint64_t>(r.predicted);
  counters_.correct_by[source] += static_cast<uint64_t>(r.correct);
  return r;
}

void Prefetcher::judge(const LayerPrediction& p, int predicted, std::span<const int32_t> routed) {
  // An affinity prediction lists every candidate above its score threshold but reads only the
  // best few: judge it by those, the ones that cost reads.
  const int judged = p.source == PredictionSource::Affinity ? std::min(predicted, options_.affinity_reads) : predicted;
  int right = 0;
  for (int i = 0; i < judged; ++i) {
    right += std::find(routed.begin(), routed.end(), p.experts[static_cast<size_t>(i)]) != routed.end();
  }
  constexpr double kSmoothing = 0.1;  // about the last 10 layers predicted
  constexpr double kPauseBelow = 0.3, kResumeAbove = 0.45;
  const int source = static_cast<int>(p.source);
  double& accuracy = accuracy_[source];
  accuracy += kSmoothing * (static_cast<double>(right) / judged - accuracy);
  if (accuracy < kPauseBelow) paused_[source] = true;
  else if (accuracy > kResumeAbove) paused_[source] = false;
}

// Only router predictions: they guess a layer's whole routing, so a policy may take an expert
// they leave out as not needed by this token; an affinity guess names only a few likely ones.
std::vector<ExpertKey> Prefetcher::router_guesses_after(int layer, int& window) const {
  std::vector<ExpertKey> keys;
  window = 0;
  for (int l = layer + 1; l < planner_.n_layers(); ++l) {
    const auto it = predictions_.find(l);
    if (it == predictions_.end()) break;
    // The latest prediction (the smallest distance) is the best informed.
    const LayerPrediction* best = nullptr;
    for (const LayerPrediction& p : it->second) {
      if (p.source == PredictionSource::Router && (!best || p.distance < best->distance)) best = &p;
    }
    if (!best) break;
    for (int32_t e : best->experts) keys.push_back(make_expert_key(l, e));
    ++window;
  }
  return keys;
}

Prefetcher::Adopted Prefetcher::adopt(ExpertKey key) {
  const auto it = staged_.find(key);
  if (it == staged_.end()) return {};
  Staged s = std::move(it->second);
  staged_.erase(it);
  staged_bytes_ -= s.bytes;
  lanes_.promote(s.ticket.get());
  if (s.exact) {
    ++counters_.early_used;
  } else {
    ++counters_.prefetch_used;
    ++counters_.prefetch_used_by[static_cast<int>(s.source)];
  }
  return {std::move(s.buffer), std::move(s.ticket)};
}

void Prefetcher::discard_layer(int layer) {
  for (auto it = staged_.begin(); it != staged_.end();) {
    if (it->second.layer == layer) {
      discard(std::move(it->second));
      it = staged_.erase(it);
    } else {
      ++it;
    }
  }
}

void Prefetcher::discard(Staged staged) {
  lanes_.cancel(staged.ticket.get());
  lanes_.poll();
  staged_bytes_ -= staged.bytes;
  (staged.exact ? counters_.early_wasted_bytes : counters_.prefetch_wasted_bytes) += staged.bytes;
  if (staged.ticket->done()) {
    pool_.give(std::move(staged.buffer));
  } else {
    draining_.push_back(std::move(staged));  // a lane is still writing into it
  }
}

void Prefetcher::reap(bool wait) {
  lanes_.poll();
  for (auto it = draining_.begin(); it != draining_.end();) {
    if (wait) lanes_.wait(*it->ticket);
    if (it->ticket->done()) {
      pool_.give(std::move(it->buffer));
      it = draining_.erase(it);
    } else {
      ++it;
    }
  }
  pool_.trim();
}

void Prefetcher::learn(int layer, std::span<const int32_t> routed) {
  if (!affinity_) return;
  if (static_cast<int>(routed.size()) > options_.top_k) {
    affinity_->break_token();  // several tokens in one visit (a prompt batch): nothing to learn
    return;
  }
  affinity_->observe(layer, routed);
  reap(false);  // buffers of cancelled reads come back for reuse (hint() does the same)
  for (int distance = 1; distance <= options_.affinity_window && layer + distance < planner_.n_layers(); ++distance) {
    LayerPrediction p;
    p.layer = layer + distance;
    p.distance = distance;
    p.source = PredictionSource::Affinity;
    p.experts = affinity_->predict(layer, distance);
    // A layer routes top_k experts: more guesses than that cannot all be right.
    if (static_cast<int>(p.experts.size()) > options_.top_k) p.experts.resize(static_cast<size_t>(options_.top_k));
    if (!p.experts.empty()) take(p);
  }
}

void Prefetcher::held_buffers(std::vector<const Buffer*>& out) const {
  for (const auto& [key, s] : staged_) out.push_back(s.buffer.get());
  for (const Staged& s : draining_) out.push_back(s.buffer.get());
}

}  // namespace bmoe
