#include "moe/cache_policy.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <optional>
#include <unordered_set>

#include "core/error.h"
#include "moe/learned_policy.h"
#include "moe/optgen_policy.h"

namespace bmoe {

bool ResidentSet::pinned(ExpertKey k) const {
  const auto it = entries_.find(k);
  return it != entries_.end() && it->second.pinned;
}

uint64_t ResidentSet::bytes_of(ExpertKey k) const {
  const auto it = entries_.find(k);
  return it == entries_.end() ? 0 : it->second.bytes;
}

ExpertCache::ExpertCache(uint64_t budget_bytes, std::unique_ptr<CachePolicy> policy)
    : budget_(budget_bytes), policy_(std::move(policy)) {}

void ExpertCache::insert(const Access& a) {
  residents_.entries_[a.key] = {a.bytes, true};
  pinned_.push_back(a.key);
  used_ += a.bytes;
  policy_->on_insert(a);
}

void ExpertCache::evict(ExpertKey k) {
  const auto it = residents_.entries_.find(k);
  used_ -= it->second.bytes;
  residents_.entries_.erase(it);
  ++evictions_;
  policy_->on_evict(k);
}

VisitPlan ExpertCache::begin_visit(std::span<const Access> accesses) {
  VisitPlan plan;
  plan.hit.resize(accesses.size());
  plan.cache.resize(accesses.size());
  // Lookups first: hits are pinned so the misses below cannot evict them.
  for (size_t i = 0; i < accesses.size(); ++i) {
    const Access& a = accesses[i];
    const auto it = residents_.entries_.find(a.key);
    plan.hit[i] = it != residents_.entries_.end();
    if (plan.hit[i]) {
      it->second.pinned = true;
      pinned_.push_back(a.key);
    }
    policy_->on_access(a, plan.hit[i]);
  }
  std::vector<size_t> misses;
  for (size_t i = 0; i < accesses.size(); ++i) {
    if (!plan.hit[i]) misses.push_back(i);
  }
  std::stable_sort(misses.begin(), misses.end(), [&](size_t x, size_t y) { return accesses[x].share > accesses[y].share; });
  for (size_t i : misses) {
    const Access& a = accesses[i];
    if (a.bytes > budget_) continue;
    // Evict until it fits; the policy may decline, and the miss is then read without caching.
    bool admit = true;
    while (policy_->needs_room(a, used_, budget_)) {
      ExpertKey victim = 0;
      if (!policy_->choose_victim(a, residents_, victim) || !residents_.contains(victim) || residents_.pinned(victim)) {
        admit = false;
        break;
      }
      evict(victim);
      plan.evicted.push_back(victim);
    }
    if (!admit) continue;
    insert(a);
    plan.cache[i] = true;
  }
  return plan;
}

void ExpertCache::end_visit() {
  for (ExpertKey k : pinned_) {
    const auto it = residents_.entries_.find(k);
    if (it != residents_.entries_.end()) it->second.pinned = false;
  }
  pinned_.clear();
}

void ExpertCache::remove(ExpertKey k) {
  if (!residents_.contains(k)) return;
  evict(k);
  --evictions_;  // not a policy eviction
}

std::vector<ExpertKey> ExpertCache::residents() const {
  std::vector<ExpertKey> keys;
  for (const auto& [k, e] : residents_.entries_) keys.push_back(k);
  std::sort(keys.begin(), keys.end());
  return keys;
}

bool ExpertCache::preload(const Access& a) {
  // No eviction for a preload: it only fills room the budget (and the policy's partition) has.
  if (residents_.contains(a.key) || policy_->needs_room(a, used_, budget_)) return false;
  insert(a);
  end_visit();
  return true;
}

namespace {

// Least recently used, over all layers.
class LruPolicy : public CachePolicy {
 public:
  std::string name() const override { return "lru"; }
  void on_access(const Access& a, bool) override { last_[a.key] = a.time; }
  void on_evict(ExpertKey k) override {}
  bool choose_victim(const Access&, const ResidentSet& residents, ExpertKey& victim) override {
    uint64_t oldest = std::numeric_limits<uint64_t>::max();
    bool found = false;
    residents.for_each_evictable([&](ExpertKey k) {
      const uint64_t t = last_[k];
      if (t < oldest || (t == oldest && k < victim)) {
        oldest = t;
        victim = k;
        found = true;
      }
    });
    return found;
  }

 private:
  std::unordered_map<ExpertKey, uint64_t> last_;
};

// Least frequently used (counts kept across evictions), least recent on ties.
class LfuPolicy : public CachePolicy {
 public:
  std::string name() const override { return "lfu"; }
  void on_access(const Access& a, bool) override {
    ++count_[a.key];
    last_[a.key] = a.time;
  }
  bool choose_victim(const Access&, const ResidentSet& residents, ExpertKey& victim) override {
    bool found = false;
    uint64_t best_count = 0, best_time = 0;
    residents.for_each_evictable([&](ExpertKey k) {
      const uint64_t c = count_[k], t = last_[k];
      if (!found || c < best_count || (c == best_count && t < best_time)) {
        found = true;
        best_count = c;
        best_time = t;
        victim = k;
      }
    });
    return found;
  }

 protected:
  std::unordered_map<ExpertKey, uint64_t> count_;
  std::unordered_map<ExpertKey, uint64_t> last_;
};

// The budget split evenly between layers: each layer's bytes and whether a newcomer fits its
// share (used by the partitioned policies).
class LayerShares {
 public:
  LayerShares(int n_layers, uint64_t budget) : share_(budget / static_cast<uint64_t>(std::max(1, n_layers))) {}
  void inserted(const Access& a) {
    layer_used_[key_layer(a.key)] += a.bytes;
    bytes_[a.key] = a.bytes;
  }
  void evicted(ExpertKey k) { layer_used_[key_layer(k)] -= bytes_[k]; }
  bool full_for(const Access& incoming) const {
    const auto it = layer_used_.find(key_layer(incoming.key));
    const uint64_t layer_used = it == layer_used_.end() ? 0 : it->second;
    return layer_used + incoming.bytes > share_;
  }

 private:
  uint64_t share_;
  std::unordered_map<int, uint64_t> layer_used_;
  std::unordered_map<ExpertKey, uint64_t> bytes_;
};

// The reference engine's policy: the budget split evenly between layers, LFU inside each.
class LayerLfuPolicy : public LfuPolicy {
 public:
  LayerLfuPolicy(int n_layers, uint64_t budget) : shares_(n_layers, budget) {}
  std::string name() const override { return "layer-lfu"; }
  void on_insert(const Access& a) override { shares_.inserted(a); }
  void on_evict(ExpertKey k) override { shares_.evicted(k); }
  bool needs_room(const Access& incoming, uint64_t used, uint64_t budget) const override {
    return shares_.full_for(incoming) || used + incoming.bytes > budget;
  }
  bool choose_victim(const Access& incoming, const ResidentSet& residents, ExpertKey& victim) override {
    const int layer = key_layer(incoming.key);
    bool found = false;
    uint64_t best_count = 0, best_time = 0;
    residents.for_each_evictable([&](ExpertKey k) {
      if (key_layer(k) != layer) return;
      const uint64_t c = count_[k], t = last_[k];
      if (!found || c < best_count || (c == best_count && t < best_time)) {
        found = true;
        best_count = c;
        best_time = t;
        victim = k;
      }
    });
    return found;
  }

 private:
  LayerShares shares_;
};

// Exponentially decayed frequency: each access adds 1, the score halves every `half_life`
// tokens. Frequency protects the experts a layer keeps coming back to (no LRU cliff), the decay
// lets the set follow the topic. Evicts the lowest score over all layers, so layers with
// spread-out routing get more room than layers with a small hot set.
class EwmaPolicy : public CachePolicy {
 public:
  EwmaPolicy(double half_life_tokens, bool admission_filter)
      : decay_(std::pow(0.5, 1.0 / half_life_tokens)), filter_(admission_filter) {}
  std::string name() const override { return filter_ ? "tinylfu-ewma" : "ewma"; }
  void on_access(const Access& a, bool) override {
    now_ = a.token;
    Score& s = score_[a.key];
    s.value = value_at(s, now_) + a.share;
    s.token = now_;
  }
  bool choose_victim(const Access& incoming, const ResidentSet& residents, ExpertKey& victim) override {
    bool found = false;
    double lowest = 0.0;
    residents.for_each_evictable([&](ExpertKey k) {
      const double v = value_at(score_[k], now_);
      if (!found || v < lowest || (v == lowest && k < victim)) {
        found = true;
        lowest = v;
        victim = k;
      }
    });
    // Admission: a newcomer must be used more than what it would displace (TinyLFU's rule);
    // one-off experts are then read without churning the cache.
    if (found && filter_ && value_at(score_[incoming.key], now_) <= lowest) return false;
    return found;
  }

 private:
  struct Score {
    double value = 0.0;
    uint64_t token = 0;
  };
  double value_at(const Score& s, uint64_t token) const {
    return s.value * std::pow(decay_, static_cast<double>(token - s.token));
  }
  double decay_;
  bool filter_;
  uint64_t now_ = 0;
  std::unordered_map<ExpertKey, Score> score_;
};

// Belady's offline optimum: evicts the resident needed farthest in the future, and caches a
// newcomer only if it is needed sooner than that. With `shares`, the same rule inside an even
// per-layer split of the budget ("layer-belady"): the best any per-layer partition with equal
// shares can do, which separates what partitioning costs from what not knowing the future costs.
class BeladyPolicy : public CachePolicy {
 public:
  BeladyPolicy(std::span<const Access> future, std::optional<LayerShares> shares) : shares_(std::move(shares)) {
    for (const Access& a : future) uses_[a.key].push_back(a.time);
  }
  std::string name() const override { return shares_ ? "layer-belady" : "belady"; }
  void on_access(const Access& a, bool) override { now_ = a.time; }
  void on_insert(const Access& a) override {
    if (shares_) shares_->inserted(a);
  }
  void on_evict(ExpertKey k) override {
    if (shares_) shares_->evicted(k);
  }
  bool needs_room(const Access& incoming, uint64_t used, uint64_t budget) const override {
    return (shares_ && shares_->full_for(incoming)) || used + incoming.bytes > budget;
  }
  bool choose_victim(const Access& incoming, const ResidentSet& residents, ExpertKey& victim) override {
    bool found = false;
    uint64_t farthest = 0;
    residents.for_each_evictable([&](ExpertKey k) {
      if (shares_ && key_layer(k) != key_layer(incoming.key)) return;
      const uint64_t t = next_use(k);
      if (!found || t > farthest || (t == farthest && k < victim)) {
        found = true;
        farthest = t;
        victim = k;
      }
    });
    if (found && next_use(incoming.key) >= farthest) return false;
    return found;
  }

 private:
  uint64_t next_use(ExpertKey k) const {
    const auto it = uses_.find(k);
    if (it == uses_.end()) return std::numeric_limits<uint64_t>::max();
    const auto next = std::upper_bound(it->second.begin(), it->second.end(), now_);
    return next == it->second.end() ? std::numeric_limits<uint64_t>::max() : *next;
  }
  uint64_t now_ = 0;
  std::unordered_map<ExpertKey, std::vector<uint64_t>> uses_;
  std::optional<LayerShares> shares_;
};

// Expected reuse distance: Belady's rule (evict what is needed farthest ahead) with the future
// estimated. Layers are visited in a fixed cycle, so an expert of layer L' is next needed at
// the next visit of L' (d visits away, known exactly) if the next token routes to it, else a
// whole cycle later, and so on. With p the expert's per-token routing probability (an
// exponentially decayed frequency), the expected wait is d + n_layers * (1 - p) / p visits.
// This keeps experts of layers just ahead (the LRU cliff is evicting exactly those), keeps
// popular experts, and lets each layer hold as many experts as its routing spread warrants.
class ReuseDistancePolicy : public WaitEstimator {
 public:
  ReuseDistancePolicy(int n_layers, int n_expert_used_hint, double half_life_tokens, bool admission)
      : n_layers_(std::max(1, n_layers)),
        decay_(std::pow(0.5, 1.0 / half_life_tokens)),
        admission_(admission),
        prior_p_(n_expert_used_hint > 0 ? 0.05 : 0.05) {}
  std::string name() const override { return admission_ ? "reuse" : "reuse-noadmit"; }

  void on_access(const Access& a, bool) override {
    if (a.token != token_) {
      // A new token: decay the normaliser (the decayed number of tokens seen).
      norm_ = norm_ * std::pow(decay_, static_cast<double>(a.token - token_)) + 1.0;
      token_ = a.token;
    }
    layer_ = key_layer(a.key);
    Score& s = score_[a.key];
    if (s.token != token_) {
      s.value = decayed(s) + a.share;
      s.token = token_;
    }
  }

  void hint(std::span<const ExpertKey> predicted, int window) override {
    predicted_.clear();
    predicted_.insert(predicted.begin(), predicted.end());
    window_ = window;
  }

  bool choose_victim(const Access& incoming, const ResidentSet& residents, ExpertKey& victim) override {
    return pick_farthest(incoming, residents, admission_, [&](ExpertKey k) { return expected_wait(k); }, victim);
  }

  // Visits until `k` is expected to be needed again (public: horizon Belady falls back on it).
  double expected_wait(ExpertKey k) const override {
    const auto it = score_.find(k);
    const double count = it == score_.end() ? 0.0 : decayed(it->second);
    const double p = std::min(1.0, (count + kPriorWeight * prior_p_) / (norm_ + kPriorWeight));
    const int d = ((key_layer(k) - layer_ - 1) % n_layers_ + n_layers_) % n_layers_ + 1;
    if (d <= window_) {
      // Inside the predicted window: needed by this very token, or not before the next one.
      if (predicted_.count(k)) return static_cast<double>(d);
      return static_cast<double>(d) + static_cast<double>(n_layers_) / p;
    }
    return static_cast<double>(d) + static_cast<double>(n_layers_) * (1.0 - p) / p;
  }

 private:
  struct Score {
    double value = 0.0;
    uint64_t token = 0;
  };
  double decayed(const Score& s) const { return s.value * std::pow(decay_, static_cast<double>(token_ - s.token)); }
  static constexpr double kPriorWeight = 1.0;

  int n_layers_;
  double decay_;
  bool admission_;
  double prior_p_;
  uint64_t token_ = 0;
  int layer_ = 0;
  double norm_ = 0.0;
  std::unordered_map<ExpertKey, Score> score_;
  std::unordered_set<ExpertKey> predicted_;
  int window_ = 0;
};

constexpr double kEwmaHalfLifeTokens = 24.0;
constexpr double kReuseHalfLifeTokens = 8.0;

// Belady with a horizon: the routing of the current token and of the next `horizon` tokens is
// known, nothing beyond. A resident needed inside the horizon waits exactly until that use;
// one that is not waits longer than any of those, and among themselves they are ranked by an
// online estimate (the default policy's expected wait). It measures what knowing a little of the
// future would be worth to a cache: a next-token routing predictor can do at most this well.
class HorizonBeladyPolicy : public CachePolicy {
 public:
  HorizonBeladyPolicy(std::span<const Access> future, int horizon, std::unique_ptr<ReuseDistancePolicy> fallback)
      : horizon_(static_cast<uint64_t>(horizon)), fallback_(std::move(fallback)) {
    for (const Access& a : future) {
      uses_[a.key].push_back(a.time);
      if (token_at_.size() <= a.time) token_at_.resize(a.time + 1, 0);
      token_at_[a.time] = a.token;
    }
  }
  std::string name() const override { return "belady-h" + std::to_string(horizon_); }
  void on_access(const Access& a, bool hit) override {
    now_ = a.time;
    token_ = a.token;
    fallback_->on_access(a, hit);
  }
  bool choose_victim(const Access& incoming, const ResidentSet& residents, ExpertKey& victim) override {
    return pick_farthest(incoming, residents, true, [&](ExpertKey k) { return wait(k); }, victim);
  }

 private:
  static constexpr double kBeyondHorizon = 1e15;
  double wait(ExpertKey k) const {
    const auto it = uses_.find(k);
    if (it != uses_.end()) {
      const auto next = std::upper_bound(it->second.begin(), it->second.end(), now_);
      if (next != it->second.end() && token_at_[*next] <= token_ + horizon_) return static_cast<double>(*next - now_);
    }
    return kBeyondHorizon + fallback_->expected_wait(k);
  }
  uint64_t horizon_;
  std::unique_ptr<ReuseDistancePolicy> fallback_;
  uint64_t now_ = 0;
  uint64_t token_ = 0;
  std::unordered_map<ExpertKey, std::vector<uint64_t>> uses_;
  std::vector<uint64_t> token_at_;  // by visit time
};


}  // namespace

std::vector<std::string> cache_policy_names() {
  return {"lru", "lfu", "layer-lfu", "ewma", "tinylfu-ewma", "reuse-noadmit", "reuse", "learned", "optgen"};
}

const char* default_cache_policy() { return "reuse"; }

std::unique_ptr<CachePolicy> make_cache_policy(const std::string& name, int n_layers, uint64_t budget_bytes) {
  if (name == "lru") return std::make_unique<LruPolicy>();
  if (name == "lfu") return std::make_unique<LfuPolicy>();
  if (name == "layer-lfu") return std::make_unique<LayerLfuPolicy>(n_layers, budget_bytes);
  if (name == "ewma") return std::make_unique<EwmaPolicy>(kEwmaHalfLifeTokens, false);
  if (name == "tinylfu-ewma") return std::make_unique<EwmaPolicy>(kEwmaHalfLifeTokens, true);
  if (name == "reuse") return std::make_unique<ReuseDistancePolicy>(n_layers, 0, kReuseHalfLifeTokens, true);
  if (name == "learned") return std::make_unique<LearnedReusePolicy>(n_layers);
  if (name == "optgen" || name.rfind("optgen:", 0) == 0) {
    return std::make_unique<OptgenPolicy>(n_layers, budget_bytes, parse_optgen_options(name), make_reuse_estimator(n_layers));
  }
  if (name == "reuse-noadmit") return std::make_unique<ReuseDistancePolicy>(n_layers, 0, kReuseHalfLifeTokens, false);
  std::string names;
  for (const auto& n : cache_policy_names()) names += (names.empty() ? "" : ", ") + n;
  fail("unknown cache policy '{}' (choices: {})", name, names);
}

std::unique_ptr<WaitEstimator> make_reuse_estimator(int n_layers) {
  return std::make_unique<ReuseDistancePolicy>(n_layers, 0, kReuseHalfLifeTokens, true);
}

std::unique_ptr<CachePolicy> make_belady_policy(std::span<const Access> future) {
  return std::make_unique<BeladyPolicy>(future, std::nullopt);
}

std::unique_ptr<CachePolicy> make_horizon_belady_policy(std::span<const Access> future, int horizon_tokens, int n_layers) {
  if (horizon_tokens < 0) fail("belady horizon must be >= 0 tokens, got {}", horizon_tokens);
  return std::make_unique<HorizonBeladyPolicy>(
      future, horizon_tokens, std::make_unique<ReuseDistancePolicy>(n_layers, 0, kReuseHalfLifeTokens, true));
}

std::unique_ptr<CachePolicy> make_layer_belady_policy(std::span<const Access> future, int n_layers, uint64_t budget_bytes) {
  return std::make_unique<BeladyPolicy>(future, LayerShares(n_layers, budget_bytes));
}

}  // namespace bmoe
