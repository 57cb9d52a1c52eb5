#include "moe/streaming_experts.h"

#include <algorithm>
#include <map>

#include "core/error.h"
#include "core/timer.h"

namespace bmoe {
namespace {

PrefetchOptions prefetch_options(const StreamingOptions& o) {
  PrefetchOptions p;
  p.staging_bytes = o.prefetch_bytes;
  p.top_k = o.top_k;
  p.keep_log = o.predict_log;
  p.early_reads = o.early_reads;
  p.affinity_window = o.affinity_window;
  p.affinity_reads = o.affinity_reads;
  p.affinity_min_score = o.affinity_min_score;
  return p;
}

}  // namespace

StreamingExperts::StreamingExperts(ExpertLayout layout, const StreamingOptions& options)
    : options_(options),
      lanes_(options.io_threads, options.io_engine),
      planner_(std::move(layout), options.odirect, options.read_chunk_bytes, lanes_, stats_),
      cache_(options.cache_bytes,
             make_cache_policy(options.policy.empty() ? default_cache_policy() : options.policy, planner_.n_layers(),
                               options.cache_bytes)),
      prefetcher_(prefetch_options(options), planner_, lanes_, pool_, cache_, stats_),
      overlap_chooser_(options.overlap, options.overlap_adapt) {
  notes_ = planner_.notes();
  if (!lanes_.note().empty()) notes_.push_back(lanes_.note());
  stats_.cache_budget_bytes = options.cache_bytes;
  reserve_buffers();
  update_fill_stats();
}

StreamingExperts::~StreamingExperts() {
  // Reads may still be in flight into the visit's buffers after a failure: let them land first
  // (the prefetcher waits for its own).
  for (auto& t : visit_.tickets) {
    if (t) lanes_.wait(*t);
  }
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
  const int per_visit = std::max(options_.visit_experts > 0 ? options_.visit_experts : options_.top_k, 1) + 4;
  for (const auto& [size, layers] : layers_of_size) {
    const double share = static_cast<double>(layers) / streamed;
    const auto cached = static_cast<int>(static_cast<double>(options_.cache_bytes) * share / static_cast<double>(size));
    pool_.reserve(size, cached + per_visit);
  }
  const uint64_t largest = planner_.largest_slot();
  pool_.reserve(largest, static_cast<int>(options_.prefetch_bytes / largest));
  // A prompt batch can read most of a layer's experts at once: buffers beyond the reservation
  // serve it and are released after, keeping a few for the mix's swings.
  pool_.set_resident_limit(pool_.reserved_bytes() + 16 * largest);
}

void StreamingExperts::update_fill_stats() {
  stats_.cache_used_bytes = cache_.used_bytes();
  stats_.cache_full = cache_.used_bytes() + planner_.largest_slot() > cache_.budget_bytes();
  stats_.buffer_allocations = pool_.allocations();
}

StreamingExperts::WarmStart StreamingExperts::warm(std::span<const ExpertKey> keys) {
  if (visit_.layer >= 0) fail("internal: warm start while layer {} is open", visit_.layer);
  const uint64_t counted = stats_.bytes_read;
  WarmStart result = keep_landed(read_into_cache(keys));
  result.bytes = stats_.bytes_read - counted;
  stats_.copied_bytes -= std::min(stats_.copied_bytes, result.bytes);
  stats_.bytes_read = counted;
  update_fill_stats();
  check_at_boundary();
  return result;
}

std::vector<StreamingExperts::WarmRead> StreamingExperts::read_into_cache(std::span<const ExpertKey> keys) {
  std::vector<WarmRead> reads;
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
    reads.push_back({k, std::move(ticket)});
  }
  return reads;
}

StreamingExperts::WarmStart StreamingExperts::keep_landed(std::vector<WarmRead> reads) {
  WarmStart result;
  for (WarmRead& r : reads) {
    if (lanes_.wait(*r.ticket)) {
      ++result.experts;
      continue;
    }
    ++result.failed;
    pool_.give(std::move(cached_.at(r.key)));
    cached_.erase(r.key);
    cache_.remove(r.key);
  }
  return result;
}

bool StreamingExperts::resident(int layer, int expert) const {
  const ExpertKey key = make_expert_key(layer, expert);
  return cache_.contains(key) || prefetcher_.staged(key);
}

void StreamingExperts::begin_layer(const LayerRouting& routing) {
  open_visit(routing);
  const int layer = visit_.layer;
  prefetcher_.settle(layer, visit_.experts, token_);
  const std::vector<Access> accesses = accesses_of(routing);
  ++time_;
  if (prefetcher_.enabled()) hint_policy(layer);
  const VisitPlan plan = cache_.begin_visit(accesses);
  drop_evicted(plan.evicted);
  stats_.requests += accesses.size();
  for (size_t i = 0; i < accesses.size(); ++i) fetch(i, accesses[i].key, plan.hit[i], plan.cache[i]);
  // Read-ahead experts of this layer that the routing did not pick.
  prefetcher_.discard_layer(layer);
  prefetcher_.learn(layer, visit_.experts);
  stats_.evictions = cache_.evictions();
  update_fill_stats();
  check_at_boundary();
}

void StreamingExperts::open_visit(const LayerRouting& routing) {
  const int layer = routing.layer;
  if (!planner_.streams(layer)) fail("internal: layer {} has no streamed experts", layer);
  if (visit_.layer >= 0) fail("internal: begin_layer({}) while layer {} is open", layer, visit_.layer);
  if (layer <= last_layer_) {  // layers restart: a new token (or batch)
    ++token_;
    overlap_now_ = overlap_chooser_.start_pass(now_seconds());
  }
  last_layer_ = layer;
  visit_.layer = layer;
  visit_.prompt_batch = routing.tokens >= kPromptBatchTokens;
  visit_.experts.assign(routing.experts.begin(), routing.experts.end());
  const size_t n = visit_.experts.size();
  visit_.buffer_of.assign(n, nullptr);
  visit_.tickets.clear();
  visit_.tickets.resize(n);
  visit_.handed.assign(n, false);
  visit_.handed_count = 0;
}

std::vector<Access> StreamingExperts::accesses_of(const LayerRouting& routing) const {
  const size_t n = visit_.experts.size();
  std::vector<Access> accesses(n);
  for (size_t i = 0; i < n; ++i) {
    accesses[i].key = make_expert_key(visit_.layer, visit_.experts[i]);
    accesses[i].bytes = cached_bytes(visit_.layer);
    accesses[i].weight = i < routing.weights.size() ? routing.weights[i] : 0.0f;
    if (i < routing.uses.size() && routing.tokens > 0) {
      accesses[i].share = static_cast<float>(routing.uses[i]) / static_cast<float>(routing.tokens);
    }
    accesses[i].time = time_;
    accesses[i].token = token_;
  }
  return accesses;
}

// The routers' guesses for the next layers tell the policy what is about to be needed
// (bmoe-replay --predict simulates the same).
void StreamingExperts::hint_policy(int layer) {
  int window = 0;
  const std::vector<ExpertKey> keys = prefetcher_.router_guesses_after(layer, window);
  cache_.policy().hint(keys, window);
}

void StreamingExperts::drop_evicted(const std::vector<ExpertKey>& evicted) {
  for (ExpertKey k : evicted) {
    const auto it = cached_.find(k);
    if (it == cached_.end()) continue;
    pool_.give(std::move(it->second));
    cached_.erase(it);
  }
}

void StreamingExperts::fetch(size_t i, ExpertKey key, bool hit, bool admit) {
  if (hit) {
    visit_.buffer_of[i] = cached_.at(key).get();
    ++stats_.hits;
    return;
  }
  ++stats_.misses;
  if (Prefetcher::Adopted ahead = prefetcher_.adopt(key); ahead.buffer) {
    // Read ahead: its reads, now urgent, may still be landing.
    visit_.buffer_of[i] = hold(key, admit, std::move(ahead.buffer));
    visit_.tickets[i] = std::move(ahead.ticket);
    return;
  }
  Buffer* buffer = hold(key, admit, take_buffer(visit_.layer));
  visit_.buffer_of[i] = buffer;
  visit_.tickets[i] = std::make_unique<ReadTicket>();
  planner_.queue(visit_.layer, visit_.experts[i], *buffer, *visit_.tickets[i], 0);
}

StreamingExperts::Buffer* StreamingExperts::hold(ExpertKey key, bool admit, std::unique_ptr<Buffer> buffer) {
  Buffer* held = buffer.get();
  if (admit) cached_[key] = std::move(buffer);
  else visit_.buffers.push_back(std::move(buffer));
  return held;
}

int StreamingExperts::take_ready(std::vector<int>& ready) {
  if (visit_.handed_count == visit_.experts.size()) return 0;
  // Everything already in memory goes first (in serial mode only once all reads landed). A
  // prompt batch always overlaps: it reads most of a layer's experts and each is many tokens'
  // work, so computing one while the next lands always pays.
  const Stopwatch wait;
  if (!overlap_now_ && !visit_.prompt_batch) wait_for_every_read();
  while (hand_out_landed(ready) == 0) wait_for_any_read();
  stats_.stall_seconds += wait.seconds();
  return static_cast<int>(ready.size());
}

void StreamingExperts::wait_for_every_read() {
  std::vector<ReadTicket*> all;
  bool blocks = false;
  for (const auto& t : visit_.tickets) {
    all.push_back(t.get());
    blocks = blocks || (t && !t->done());
  }
  if (blocks) before_wait();
  if (lanes_.wait_all(all)) return;
  for (const auto& t : visit_.tickets) {
    if (t && t->failed()) fail_layer(t->error());
  }
}

size_t StreamingExperts::hand_out_landed(std::vector<int>& ready) {
  lanes_.poll();
  size_t handed = 0;
  for (size_t i = 0; i < visit_.experts.size(); ++i) {
    if (visit_.handed[i]) continue;
    if (const ReadTicket* t = visit_.tickets[i].get()) {
      if (!t->done()) continue;
      if (t->failed()) fail_layer(t->error());
    }
    visit_.handed[i] = true;
    ++visit_.handed_count;
    ready.push_back(static_cast<int>(i));
    ++handed;
  }
  return handed;
}

void StreamingExperts::wait_for_any_read() {
  std::vector<ReadTicket*> pending;
  for (size_t i = 0; i < visit_.experts.size(); ++i) {
    pending.push_back(visit_.handed[i] ? nullptr : visit_.tickets[i].get());
  }
  before_wait();
  lanes_.wait_any(pending);
}

std::span<const Weight> StreamingExperts::matrices(int index) {
  return visit_.buffer_of.at(static_cast<size_t>(index))->views;
}

void StreamingExperts::end_layer() {
  visit_.tickets.clear();
  give_visit_buffers();
  pool_.trim();
  cache_.end_visit();
  visit_.layer = -1;
  check_at_boundary();
}

void StreamingExperts::give_visit_buffers() {
  for (auto& b : visit_.buffers) pool_.give(std::move(b));
  visit_.buffers.clear();
}

void StreamingExperts::fail_layer(const std::string& error) {
  // Nothing may compute on partial data: drain every read of the layer, drop what it was
  // filling from the cache, and report.
  for (size_t i = 0; i < visit_.tickets.size(); ++i) {
    if (!visit_.tickets[i]) continue;
    lanes_.wait(*visit_.tickets[i]);
    const ExpertKey key = make_expert_key(visit_.layer, visit_.experts[i]);
    if (const auto it = cached_.find(key); it != cached_.end()) {
      pool_.give(std::move(it->second));
      cached_.erase(it);
    }
    cache_.remove(key);
    visit_.tickets[i].reset();
  }
  cache_.end_visit();
  visit_.layer = -1;
  give_visit_buffers();
  update_fill_stats();
  check_at_boundary();
  throw Error("expert read failed: " + error);
}

void StreamingExperts::check_buffers() const {
  std::vector<const Buffer*> held;
  for (const auto& [key, buffer] : cached_) {
    if (!cache_.contains(key)) fail("internal: buffer invariant: a buffer for an expert the cache does not hold");
    held.push_back(buffer.get());
  }
  if (cached_.size() != cache_.residents().size()) fail("internal: buffer invariant: a cached expert without a buffer");
  prefetcher_.held_buffers(held);
  for (const auto& b : visit_.buffers) held.push_back(b.get());
  if (visit_.layer >= 0) {
    // What the open visit hands out must be held by the cache or by the visit itself.
    for (const Buffer* b : visit_.buffer_of) {
      if (std::find(held.begin(), held.end(), b) == held.end()) fail("internal: buffer invariant: the visit uses a buffer nobody holds");
    }
  }
  pool_.check_held(std::move(held));
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
  return fmt::format("streamed ({} lanes{}, {}, cache {} MiB in {} MiB of buffers ({} MiB touched), policy {}{}{})", options_.io_threads,
                     lanes_.uring() ? " io_uring" : "", planner_.direct() ? "O_DIRECT" : "buffered",
                     options_.cache_bytes >> 20, pool_.reserved_bytes() >> 20, pool_.touched_bytes() >> 20, cache_.policy_name(), options_.overlap ? (options_.overlap_adapt ? ", overlap (adaptive)" : ", overlap") : "",
                     options_.prefetch_bytes ? fmt::format(", prefetch staging {} MiB", options_.prefetch_bytes >> 20) : "");
}

}  // namespace bmoe
