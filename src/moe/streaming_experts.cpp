#include "moe/streaming_experts.h"

#include <algorithm>
#include <chrono>
#include <map>

#include "core/error.h"
#include "core/timer.h"

namespace bmoe {

StreamingExperts::StreamingExperts(ExpertLayout layout, const StreamingOptions& options)
    : options_(options),
      lanes_(options.io_threads, options.io_engine),
      planner_(std::move(layout), options.odirect, options.read_chunk_bytes, lanes_, stats_),
      cache_(options.cache_bytes,
             make_cache_policy(options.policy.empty() ? default_cache_policy() : options.policy, planner_.n_layers(),
                               options.cache_bytes)),
      overlap_chooser_(options.overlap, options.overlap_adapt) {
  notes_ = planner_.notes();
  if (!lanes_.note().empty()) notes_.push_back(lanes_.note());
  stats_.cache_budget_bytes = options.cache_bytes;
  if (options_.affinity_window > 0 && options_.prefetch_bytes > 0) {
    if (options_.top_k <= 0) fail("internal: affinity prefetch needs the model's top-k");
    std::vector<int> experts_per_layer;
    for (int l = 0; l < planner_.n_layers(); ++l) experts_per_layer.push_back(planner_.streams(l) ? planner_.n_expert(l) : 0);
    AffinityOptions a;
    a.window = options_.affinity_window;
    a.min_score = options_.affinity_min_score;
    affinity_ = std::make_unique<AffinityPredictor>(std::move(experts_per_layer), a);
    if (options_.affinity_reads <= 0) options_.affinity_reads = std::max(1, options_.top_k / 2);
  }
  reserve_buffers();
  update_fill_stats();
}

void StreamingExperts::reserve_buffers() {
  // Streamed layers by buffer size (a Q4_K_M file has two: layers with Q4_K and with Q6_K down
  // projections). The cache's share of each size follows its share of the layers; an uneven
  // mix later borrows larger buffers, and only beyond those allocates (counted).
  std::map<uint64_t, int> layers_of_size;
  int streamed = 0;
  for (int l = 0; l < planner_.n_layers(); ++l) {
    if (!planner_.streams(l)) continue;
    ++layers_of_size[cached_bytes(l)];
    ++streamed;
  }
  if (streamed == 0) return;
  // One visit's misses that the cache does not keep, and a few for the evictions of the next
  // visit (two small experts evicted for one large one leave one over).
  const int per_visit = std::max(options_.top_k, 1) + 4;
  for (const auto& [size, layers] : layers_of_size) {
    const double share = static_cast<double>(layers) / streamed;
    const auto cached = static_cast<int>(static_cast<double>(options_.cache_bytes) * share / static_cast<double>(size));
    pool_.reserve(size, cached + per_visit);
  }
  const uint64_t largest = planner_.largest_slot();
  pool_.reserve(largest, static_cast<int>(options_.prefetch_bytes / largest));
  // A prompt batch can read most of a layer's experts at once: buffers beyond the reservation
  // serve it and are released after, keeping a few for the mix's swings.
  pool_limit_bytes_ = pool_.reserved_bytes() + 16 * largest;
}

void StreamingExperts::update_fill_stats() {
  stats_.cache_used_bytes = cache_.used_bytes();
  stats_.cache_full = cache_.used_bytes() + planner_.largest_slot() > cache_.budget_bytes();
  stats_.buffer_allocations = pool_.allocations();
}

StreamingExperts::~StreamingExperts() {
  // Reads may still be in flight into our buffers after a failure: let them land first.
  for (auto& t : tickets_) {
    if (t) lanes_.wait(*t);
  }
  for (auto& [key, staged] : staged_) {
    lanes_.cancel(staged.ticket.get());
    lanes_.wait(*staged.ticket);
  }
  reap_draining(true);
}

StreamingExperts::WarmStart StreamingExperts::warm(std::span<const ExpertKey> keys) {
  if (layer_ >= 0) fail("internal: warm start while layer {} is open", layer_);
  struct Pending {
    ExpertKey key;
    std::unique_ptr<ReadTicket> ticket;
  };
  std::vector<Pending> pending;
  const uint64_t counted = stats_.bytes_read;
  for (ExpertKey k : keys) {
    const int layer = key_layer(k), expert = key_expert(k);
    Access a;
    a.key = k;
    a.bytes = cached_bytes(layer);
    if (!cache_.preload(a)) continue;  // already there, or no room left for it
    auto buffer = take_buffer(layer);
    auto ticket = std::make_unique<ReadTicket>();
    planner_.queue(layer, expert, *buffer, *ticket, 0);
    cached_[k] = std::move(buffer);
    pending.push_back({k, std::move(ticket)});
  }
  WarmStart result;
  for (Pending& p : pending) {
    if (lanes_.wait(*p.ticket)) {
      ++result.experts;
      continue;
    }
    ++result.failed;
    pool_.give(std::move(cached_.at(p.key)));
    cached_.erase(p.key);
    cache_.remove(p.key);
  }
  result.bytes = stats_.bytes_read - counted;
  stats_.copied_bytes -= std::min(stats_.copied_bytes, result.bytes);
  stats_.bytes_read = counted;
  update_fill_stats();
  return result;
}

bool StreamingExperts::resident(int layer, int expert) const {
  const ExpertKey key = make_expert_key(layer, expert);
  return cache_.contains(key) || staged_.count(key) != 0;
}

void StreamingExperts::trim_free() { pool_.trim(pool_limit_bytes_); }

void StreamingExperts::stage(int layer, int expert, int distance, PredictionSource source) {
  if (resident(layer, expert)) return;  // cached, or already being read ahead
  const ExpertKey key = make_expert_key(layer, expert);
  const uint64_t bytes = slot_bytes(layer, expert);
  if (staged_bytes_ + bytes > options_.prefetch_bytes) return;  // staging full: skip, never evict
  Staged s;
  s.layer = layer;
  s.bytes = bytes;
  s.source = source;
  s.buffer = take_buffer(layer);
  s.ticket = std::make_unique<ReadTicket>();
  planner_.queue(layer, expert, *s.buffer, *s.ticket, distance);
  staged_bytes_ += bytes;
  ++stats_.prefetch_reads;
  ++stats_.prefetch_reads_by[static_cast<int>(source)];
  staged_.emplace(key, std::move(s));
}

void StreamingExperts::hint(std::span<const LayerPrediction> predictions) {
  if (options_.prefetch_bytes == 0) return;
  reap_draining(false);
  for (const LayerPrediction& p : predictions) take_prediction(p);
}

void StreamingExperts::take_prediction(const LayerPrediction& p) {
  if (!planner_.streams(p.layer)) return;
  auto& pending = predictions_[p.layer];
  const auto same = std::find_if(pending.begin(), pending.end(), [&](const LayerPrediction& q) {
    return q.distance == p.distance && q.source == p.source;
  });
  if (same != pending.end()) *same = p;
  else pending.push_back(p);
  if (prefetch_paused_[static_cast<int>(p.source)]) return;
  // An affinity prediction ranks many candidates: only its best few that are not cached are
  // worth a read (the rest would mostly be wasted bytes).
  int reads_left = p.source == PredictionSource::Affinity ? options_.affinity_reads : 1 << 30;
  for (int32_t e : p.experts) {
    if (reads_left == 0) break;
    if (e < 0 || e >= planner_.n_expert(p.layer)) continue;
    if (cache_.contains(make_expert_key(p.layer, e))) continue;
    stage(p.layer, e, p.distance, p.source);
    --reads_left;
  }
}

void StreamingExperts::predict_from_history(int layer) {
  if (static_cast<int>(experts_.size()) > options_.top_k) {
    affinity_->break_token();  // several tokens in one visit (a prompt batch): nothing to learn
    return;
  }
  affinity_->observe(layer, experts_);
  reap_draining(false);  // buffers of cancelled reads come back for reuse (hint() does the same)
  for (int distance = 1; distance <= options_.affinity_window && layer + distance < planner_.n_layers(); ++distance) {
    LayerPrediction p;
    p.layer = layer + distance;
    p.distance = distance;
    p.source = PredictionSource::Affinity;
    p.experts = affinity_->predict(layer, distance);
    // A layer routes top_k experts: more guesses than that cannot all be right.
    if (static_cast<int>(p.experts.size()) > options_.top_k) p.experts.resize(static_cast<size_t>(options_.top_k));
    if (!p.experts.empty()) take_prediction(p);
  }
}

void StreamingExperts::discard(Staged staged) {
  lanes_.cancel(staged.ticket.get());
  lanes_.poll();
  staged_bytes_ -= staged.bytes;
  stats_.prefetch_wasted_bytes += staged.bytes;
  if (staged.ticket->done()) {
    pool_.give(std::move(staged.buffer));
  } else {
    draining_.push_back(std::move(staged));  // a lane is still writing into it
  }
}

void StreamingExperts::reap_draining(bool wait) {
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
  trim_free();
}

void StreamingExperts::check_predictions(int layer) {
  const auto it = predictions_.find(layer);
  if (it == predictions_.end()) return;
  for (const LayerPrediction& p : it->second) {
    PredictionRecord r;
    r.token = token_;
    r.layer = layer;
    r.distance = p.distance;
    r.predicted = static_cast<int>(p.experts.size());
    r.source = p.source;
    for (int32_t e : p.experts) {
      if (std::find(experts_.begin(), experts_.end(), e) == experts_.end()) continue;
      ++r.correct;
      if (staged_.count(make_expert_key(layer, e))) ++r.prefetched;
    }
    stats_.predicted += static_cast<uint64_t>(r.predicted);
    stats_.predicted_correct += static_cast<uint64_t>(r.correct);
    const int d = std::clamp(p.distance, 0, ExpertStats::kMaxDistance);
    stats_.predicted_at[d] += static_cast<uint64_t>(r.predicted);
    stats_.correct_at[d] += static_cast<uint64_t>(r.correct);
    const int source = static_cast<int>(p.source);
    stats_.predicted_by[source] += static_cast<uint64_t>(r.predicted);
    stats_.correct_by[source] += static_cast<uint64_t>(r.correct);
    if (options_.predict_log) prediction_log_.push_back(r);
    if (r.predicted > 0) {
      // An affinity prediction lists every candidate above its score threshold but reads only
      // the best few: judge it by those, the ones that cost reads.
      const int judged = p.source == PredictionSource::Affinity ? std::min(r.predicted, options_.affinity_reads) : r.predicted;
      int right = 0;
      for (int i = 0; i < judged; ++i) {
        right += std::find(experts_.begin(), experts_.end(), p.experts[static_cast<size_t>(i)]) != experts_.end();
      }
      constexpr double kSmoothing = 0.1;  // about the last 10 layers predicted
      constexpr double kPauseBelow = 0.3, kResumeAbove = 0.45;
      double& accuracy = prediction_accuracy_[source];
      accuracy += kSmoothing * (static_cast<double>(right) / judged - accuracy);
      if (accuracy < kPauseBelow) prefetch_paused_[source] = true;
      else if (accuracy > kResumeAbove) prefetch_paused_[source] = false;
    }
  }
  predictions_.erase(it);
}

// Prefetch's view for the cache policy: the experts the routers predicted for the layers right
// after `layer`, for as many consecutive layers as predictions exist (bmoe-replay --predict).
// Only router predictions: they guess a layer's whole routing, so a policy may take an expert
// they leave out as not needed by this token; an affinity guess names only a few likely ones.
static std::vector<ExpertKey> policy_hint(const std::unordered_map<int, std::vector<LayerPrediction>>& predictions, int layer,
                                          int n_layers, int& window) {
  std::vector<ExpertKey> keys;
  window = 0;
  for (int l = layer + 1; l < n_layers; ++l) {
    const auto it = predictions.find(l);
    if (it == predictions.end()) break;
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

void StreamingExperts::begin_layer(const LayerRouting& routing) {
  const int layer = routing.layer;
  if (!planner_.streams(layer)) fail("internal: layer {} has no streamed experts", layer);
  if (layer_ >= 0) fail("internal: begin_layer({}) while layer {} is open", layer, layer_);
  if (layer <= last_layer_) {  // layers restart: a new token (or batch)
    ++token_;
    overlap_now_ = overlap_chooser_.start_pass(now_seconds());
  }
  last_layer_ = layer;
  layer_ = layer;
  prompt_batch_ = routing.tokens >= kPromptBatchTokens;
  experts_.assign(routing.experts.begin(), routing.experts.end());
  check_predictions(layer);
  const size_t n = experts_.size();
  std::vector<Access> accesses(n);
  for (size_t i = 0; i < n; ++i) {
    accesses[i].key = make_expert_key(layer, experts_[i]);
    accesses[i].bytes = cached_bytes(layer);
    accesses[i].weight = i < routing.weights.size() ? routing.weights[i] : 0.0f;
    if (i < routing.uses.size() && routing.tokens > 0) {
      accesses[i].share = static_cast<float>(routing.uses[i]) / static_cast<float>(routing.tokens);
    }
    accesses[i].time = time_;
    accesses[i].token = token_;
  }
  ++time_;
  if (options_.prefetch_bytes > 0) {
    int window = 0;
    const std::vector<ExpertKey> keys = policy_hint(predictions_, layer, planner_.n_layers(), window);
    cache_.policy().hint(keys, window);
  }
  const VisitPlan plan = cache_.begin_visit(accesses);
  for (ExpertKey k : plan.evicted) {
    const auto it = cached_.find(k);
    if (it == cached_.end()) continue;
    pool_.give(std::move(it->second));
    cached_.erase(it);
  }

  buffer_of_.assign(n, nullptr);
  tickets_.clear();
  tickets_.resize(n);
  handed_.assign(n, false);
  handed_count_ = 0;
  stats_.requests += n;
  for (size_t i = 0; i < n; ++i) {
    const ExpertKey key = accesses[i].key;
    if (plan.hit[i]) {
      buffer_of_[i] = cached_.at(key).get();
      ++stats_.hits;
      continue;
    }
    ++stats_.misses;
    if (const auto st = staged_.find(key); st != staged_.end()) {
      // Read ahead by the prefetcher: adopt its buffer and reads (now urgent if still queued).
      Staged staged = std::move(st->second);
      staged_.erase(st);
      staged_bytes_ -= staged.bytes;
      lanes_.promote(staged.ticket.get());
      ++stats_.prefetch_used;
      ++stats_.prefetch_used_by[static_cast<int>(staged.source)];
      if (plan.cache[i]) {
        cached_[key] = std::move(staged.buffer);
        buffer_of_[i] = cached_[key].get();
      } else {
        visit_buffers_.push_back(std::move(staged.buffer));
        buffer_of_[i] = visit_buffers_.back().get();
      }
      tickets_[i] = std::move(staged.ticket);
      continue;
    }
    Buffer* buffer;
    if (plan.cache[i]) {
      auto& slot = cached_[key];
      slot = take_buffer(layer);
      buffer = slot.get();
    } else {
      visit_buffers_.push_back(take_buffer(layer));
      buffer = visit_buffers_.back().get();
    }
    buffer_of_[i] = buffer;
    tickets_[i] = std::make_unique<ReadTicket>();
    planner_.queue(layer, experts_[i], *buffer, *tickets_[i], 0);
  }
  // Read-ahead experts of this layer that the routing did not pick: cancel them.
  for (auto it = staged_.begin(); it != staged_.end();) {
    if (it->second.layer == layer) {
      discard(std::move(it->second));
      it = staged_.erase(it);
    } else {
      ++it;
    }
  }
  if (affinity_) predict_from_history(layer);
  stats_.evictions = cache_.evictions();
  update_fill_stats();
}

void StreamingExperts::fail_layer(const std::string& error) {
  // Nothing may compute on partial data: drain every read of the layer, drop what it was
  // filling from the cache, and report.
  for (size_t i = 0; i < tickets_.size(); ++i) {
    if (!tickets_[i]) continue;
    lanes_.wait(*tickets_[i]);
    const ExpertKey key = make_expert_key(layer_, experts_[i]);
    if (const auto it = cached_.find(key); it != cached_.end()) {
      pool_.give(std::move(it->second));
      cached_.erase(it);
    }
    cache_.remove(key);
    tickets_[i].reset();
  }
  cache_.end_visit();
  layer_ = -1;
  for (auto& b : visit_buffers_) pool_.give(std::move(b));
  visit_buffers_.clear();
  update_fill_stats();
  throw Error("expert read failed: " + error);
}

int StreamingExperts::take_ready(std::vector<int>& ready) {
  const size_t n = experts_.size();
  if (handed_count_ == n) return 0;
  auto hand_out = [&](size_t i) {
    handed_[i] = true;
    ++handed_count_;
    ready.push_back(static_cast<int>(i));
  };
  // Everything already in memory goes first (in serial mode only once all reads landed). A
  // prompt batch always overlaps: it reads most of a layer's experts and each is many tokens'
  // work, so computing one while the next lands always pays.
  const Stopwatch wait;
  if (!overlap_now_ && !prompt_batch_) {
    std::vector<ReadTicket*> all;
    bool blocks = false;
    for (const auto& t : tickets_) {
      all.push_back(t.get());
      blocks = blocks || (t && !t->done());
    }
    if (blocks) before_wait();
    if (!lanes_.wait_all(all)) {
      for (size_t i = 0; i < n; ++i) {
        if (tickets_[i] && tickets_[i]->failed()) fail_layer(tickets_[i]->error());
      }
    }
  }
  for (;;) {
    lanes_.poll();
    const size_t before = ready.size();
    for (size_t i = 0; i < n; ++i) {
      if (handed_[i]) continue;
      if (tickets_[i]) {
        if (!tickets_[i]->done()) continue;
        if (tickets_[i]->failed()) fail_layer(tickets_[i]->error());
      }
      hand_out(i);
    }
    if (ready.size() > before) break;
    std::vector<ReadTicket*> pending;
    for (size_t i = 0; i < n; ++i) pending.push_back(handed_[i] ? nullptr : tickets_[i].get());
    before_wait();
    lanes_.wait_any(pending);
  }
  stats_.stall_seconds += wait.seconds();
  return static_cast<int>(ready.size());
}

std::span<const Weight> StreamingExperts::matrices(int index) {
  return buffer_of_.at(static_cast<size_t>(index))->views;
}

void StreamingExperts::end_layer() {
  tickets_.clear();
  for (auto& b : visit_buffers_) pool_.give(std::move(b));
  visit_buffers_.clear();
  trim_free();
  cache_.end_visit();
  layer_ = -1;
}

ExpertStats StreamingExperts::stats() const {
  ExpertStats s = stats_;
  s.io_busy_seconds = lanes_.busy_seconds();
  s.overlapped_passes = overlap_chooser_.overlapped_passes();
  s.serial_passes = overlap_chooser_.serial_passes();
  s.probe_overlap_seconds = overlap_chooser_.probe_overlap_seconds();
  s.probe_serial_seconds = overlap_chooser_.probe_serial_seconds();
  return s;
}

std::string StreamingExperts::describe() const {
  return fmt::format("streamed ({} lanes{}, {}, cache {} MiB in {} MiB of touched buffers, policy {}{}{})", options_.io_threads,
                     lanes_.uring() ? " io_uring" : "", planner_.direct() ? "O_DIRECT" : "buffered",
                     options_.cache_bytes >> 20, pool_.reserved_bytes() >> 20, cache_.policy_name(), options_.overlap ? (options_.overlap_adapt ? ", overlap (adaptive)" : ", overlap") : "",
                     options_.prefetch_bytes ? fmt::format(", prefetch staging {} MiB", options_.prefetch_bytes >> 20) : "");
}

}  // namespace bmoe
