// The expert cache's bookkeeping and its eviction policies, shared by the streaming engine and
// the bmoe-replay simulator (one implementation, so a replayed hit rate is the engine's).
//
// Time advances in layer visits: each visit asks for a set of unique experts of one layer.
// Hits are looked up first; then each miss may be admitted, evicting victims that this visit
// does not need ("eviction after the layer's batch"), or be read without caching. Misses are
// considered in order of their share of the visit's tokens, so a prompt batch, which asks for
// most experts of a layer, offers the cache the ones most of its tokens used first; frequency
// policies count a visit's access as its share of a token, so such a batch does not make every
// expert look as hot as a decode step's few.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <unordered_map>
#include <vector>

namespace bmoe {

using ExpertKey = uint32_t;
inline ExpertKey make_expert_key(int layer, int expert) {
  return (static_cast<uint32_t>(layer) << 16) | static_cast<uint32_t>(expert);
}
inline int key_layer(ExpertKey k) { return static_cast<int>(k >> 16); }
inline int key_expert(ExpertKey k) { return static_cast<int>(k & 0xFFFF); }

struct Access {
  ExpertKey key = 0;
  uint64_t bytes = 0;
  float weight = 0.0f;  // router weight (summed over the batch's tokens)
  uint64_t time = 0;    // layer-visit counter
  uint64_t token = 0;   // token counter (a token visits every layer)
  float share = 1.0f;   // fraction of the visit's tokens that chose it (1 for a single token)
};

class ResidentSet;

// Decides what stays. Policies see every access, insertion and eviction.
class CachePolicy {
 public:
  virtual ~CachePolicy() = default;
  virtual std::string name() const = 0;
  virtual void on_access(const Access& a, bool hit) = 0;
  virtual void on_insert(const Access& a) {}
  virtual void on_evict(ExpertKey key) {}
  // Whether storing `incoming` needs an eviction first (default: the budget would overflow;
  // partitioned policies also enforce their partition).
  virtual bool needs_room(const Access& incoming, uint64_t used, uint64_t budget) const {
    return used + incoming.bytes > budget;
  }
  // Experts predicted for the current token's next `window` layers (after the layer about to be
  // visited); replaces the previous hint. Policies that do not look ahead ignore it.
  virtual void hint(std::span<const ExpertKey> predicted, int window) {}
  // Picks a resident to evict so `incoming` can be stored, or returns false to store nothing
  // (the miss is then read but not cached). `residents` skips pinned keys for you.
  virtual bool choose_victim(const Access& incoming, const ResidentSet& residents, ExpertKey& victim) = 0;
};

// A policy that also estimates, for any expert, how many layer visits remain until its next use
// (`reuse` is one; policies that learn which experts to keep build on its estimate).
class WaitEstimator : public CachePolicy {
 public:
  virtual double expected_wait(ExpertKey k) const = 0;
};

// Residents and their sizes, with pins for the current visit.
class ResidentSet {
 public:
  bool contains(ExpertKey k) const { return entries_.count(k) != 0; }
  bool pinned(ExpertKey k) const;
  uint64_t bytes_of(ExpertKey k) const;
  size_t size() const { return entries_.size(); }
  // Calls fn(key) for every resident that may be evicted now.
  template <typename Fn>
  void for_each_evictable(Fn&& fn) const {
    for (const auto& [k, e] : entries_) {
      if (!e.pinned) fn(k);
    }
  }

 private:
  friend class ExpertCache;
  struct Entry {
    uint64_t bytes = 0;
    bool pinned = false;
  };
  std::unordered_map<ExpertKey, Entry> entries_;
};

// Belady's rule over estimated waits: the evictable resident with the longest wait (lowest key on
// ties) is the victim; with `admission`, a newcomer that would wait as long is not cached at all.
template <typename Wait>
inline bool pick_farthest(const Access& incoming, const ResidentSet& residents, bool admission, Wait&& wait, ExpertKey& victim) {
  bool found = false;
  double farthest = 0.0;
  residents.for_each_evictable([&](ExpertKey k) {
    const double t = wait(k);
    if (!found || t > farthest || (t == farthest && k < victim)) {
      found = true;
      farthest = t;
      victim = k;
    }
  });
  if (found && admission && wait(incoming.key) >= farthest) return false;
  return found;
}

// What to do for one layer visit.
struct VisitPlan {
  std::vector<bool> hit;          // per requested expert
  std::vector<bool> cache;        // misses that will be stored (false: read transiently)
  std::vector<ExpertKey> evicted; // residents to drop before the reads
};

class ExpertCache {
 public:
  ExpertCache(uint64_t budget_bytes, std::unique_ptr<CachePolicy> policy);

  // Plans a visit: `accesses` are the visit's unique experts. Pins them until end_visit().
  VisitPlan begin_visit(std::span<const Access> accesses);
  void end_visit();

  bool contains(ExpertKey k) const { return residents_.contains(k); }
  uint64_t used_bytes() const { return used_; }
  uint64_t budget_bytes() const { return budget_; }
  uint64_t evictions() const { return evictions_; }
  CachePolicy& policy() { return *policy_; }
  std::string policy_name() const { return policy_->name(); }
  // Restores a resident without an access (a warm start from a saved cache file).
  bool preload(const Access& a);
  // Forgets a resident (its data was lost, e.g. a failed read).
  void remove(ExpertKey k);
  // Every resident key (for saving the hot set).
  std::vector<ExpertKey> residents() const;

 private:
  void insert(const Access& a);
  void evict(ExpertKey k);

  uint64_t budget_;
  uint64_t used_ = 0;
  uint64_t evictions_ = 0;
  std::unique_ptr<CachePolicy> policy_;
  ResidentSet residents_;
  std::vector<ExpertKey> pinned_;
};

// The online policies, by name: "lru", "lfu", "layer-lfu" (per-layer partition + LFU, as the
// reference engine), "ewma", "tinylfu-ewma", "reuse-noadmit" and "reuse" (bmoe's, the default;
// see cache_policy.cpp), "learned" (learned_policy.h) and "optgen" (optgen_policy.h; options as
// "optgen:w16:m4", see parse_optgen_options). n_layers is needed by partitioned policies.
std::unique_ptr<CachePolicy> make_cache_policy(const std::string& name, int n_layers, uint64_t budget_bytes);
std::vector<std::string> cache_policy_names();
// The `reuse` policy as a wait estimator (for policies that refine its ranking).
std::unique_ptr<WaitEstimator> make_reuse_estimator(int n_layers);
// The default: the best online policy measured with bmoe-replay on the real trace.
const char* default_cache_policy();

// Belady's offline optimum: evicts the resident used farthest in the future. `future` is the
// whole access sequence (by time) the simulation will replay.
std::unique_ptr<CachePolicy> make_belady_policy(std::span<const Access> future);
// Belady with a horizon: knows the routing of the current token and the next `horizon_tokens`
// tokens, nothing beyond (residents needed later are ranked by the default policy's estimate).
// What a perfect next-token routing predictor would be worth ("belady-hN" in bmoe-replay).
std::unique_ptr<CachePolicy> make_horizon_belady_policy(std::span<const Access> future, int horizon_tokens, int n_layers);
// Belady inside an even per-layer split of the budget (offline, for comparison: what the best
// equal-share partition reaches).
std::unique_ptr<CachePolicy> make_layer_belady_policy(std::span<const Access> future, int n_layers, uint64_t budget_bytes);

}  // namespace bmoe
