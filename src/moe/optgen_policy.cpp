#include "moe/optgen_policy.h"

#include <algorithm>
#include <bit>
#include <cmath>

#include "core/error.h"

namespace bmoe {
namespace {

constexpr double kAverseWait = 1e12;  // ranks every averse resident before every friendly one

double option_value(const std::string& item, const std::string& name) {
  try {
    size_t used = 0;
    const double v = std::stod(item.substr(1), &used);
    if (used + 1 == item.size() && v >= 0.0) return v;
  } catch (const std::exception&) {
  }
  fail("cache policy '{}': bad option '{}' (w<tokens>, k<prior>, c<prior>, h<tokens>, t<rate>, r<power>)", name, item);
}

}  // namespace

OptgenOptions parse_optgen_options(const std::string& name) {
  OptgenOptions o;
  if (name.rfind("optgen", 0) != 0) fail("'{}' is not an optgen policy", name);
  size_t pos = 6;
  while (pos < name.size()) {
    if (name[pos] != ':') fail("cache policy '{}': options follow ':'", name);
    const size_t end = std::min(name.find(':', pos + 1), name.size());
    const std::string item = name.substr(pos + 1, end - pos - 1);
    if (item.size() < 2) fail("cache policy '{}': empty option", name);
    const double v = option_value(item, name);
    switch (item[0]) {
      case 'w': o.window_tokens = std::clamp(static_cast<int>(v), 1, 1024); break;
      case 'k': o.key_prior = v; break;
      case 'c': o.cell_prior = v; break;
      case 'h': o.half_life_tokens = std::max(1.0, v); break;
      case 't': o.averse_below = v; break;
      case 'r': o.rank_power = v; break;
      default: fail("cache policy '{}': unknown option '{}'", name, item);
    }
    pos = end;
  }
  return o;
}

OptgenPolicy::OptgenPolicy(int n_layers, uint64_t budget_bytes, const OptgenOptions& options, std::unique_ptr<WaitEstimator> base)
    : n_layers_(std::max(1, n_layers)),
      budget_(budget_bytes),
      options_(options),
      base_(std::move(base)),
      token_decay_(std::pow(0.5, 1.0 / std::max(1.0, options.half_life_tokens))),
      layers_(static_cast<size_t>(n_layers_)),
      occupancy_(static_cast<size_t>(std::max(1, options.window_tokens)) * static_cast<size_t>(n_layers_), 0) {}

// Cell of an access: whether the previous token used the expert, and how many of the 8 tokens
// before did (its short-run frequency); bit 0 (this access) is not a feature.
int OptgenPolicy::cell_of(uint32_t token_uses) {
  const uint32_t before = token_uses >> 1;
  return static_cast<int>(before & 1u) * 9 + std::popcount(before & 0xFFu);
}

OptgenPolicy::Expert& OptgenPolicy::expert(ExpertKey k) {
  const size_t l = static_cast<size_t>(key_layer(k)), e = static_cast<size_t>(key_expert(k));
  if (l >= layers_.size()) layers_.resize(l + 1);
  auto& experts = layers_[l].experts;
  if (e >= experts.size()) experts.resize(e + 1);
  return experts[e];
}

const OptgenPolicy::Expert* OptgenPolicy::find(ExpertKey k) const {
  const size_t l = static_cast<size_t>(key_layer(k)), e = static_cast<size_t>(key_expert(k));
  if (l >= layers_.size() || e >= layers_[l].experts.size() || !layers_[l].experts[e].seen) return nullptr;
  return &layers_[l].experts[e];
}

// A new visit clears its occupancy slot (the one that left the window); a new token ages the
// cell rates (an expert's own rate ages lazily, by the tokens since it was last touched).
void OptgenPolicy::advance(uint64_t time, uint64_t token) {
  const uint64_t window = occupancy_.size();
  if (!started_ || time >= time_ + window) {
    std::fill(occupancy_.begin(), occupancy_.end(), 0);
  } else {
    for (uint64_t t = time_ + 1; t <= time; ++t) occupancy_[t % window] = 0;
  }
  if (started_ && token > token_) {
    const float d = static_cast<float>(std::pow(token_decay_, static_cast<double>(token - token_)));
    for (Layer& l : layers_) {
      for (Rate& r : l.cells) r.friendly *= d, r.seen *= d;
    }
    for (Rate& r : pooled_) r.friendly *= d, r.seen *= d;
  }
  started_ = true;
  time_ = std::max(time_, time);
  token_ = std::max(token_, token);
}

// OPTgen: Belady (with bypass) keeps a line from `from` to `to` iff every visit in between has
// room for it beside the intervals it already kept; keeping it then takes that room.
bool OptgenPolicy::opt_would_hit(uint64_t from, uint64_t to, uint64_t bytes) {
  const uint64_t window = occupancy_.size();
  if (to <= from || to - from >= window) return false;
  for (uint64_t t = from; t < to; ++t) {
    if (occupancy_[t % window] + bytes > budget_) return false;
  }
  for (uint64_t t = from; t < to; ++t) occupancy_[t % window] += bytes;
  return true;
}

void OptgenPolicy::learn(ExpertKey k, Expert& e, bool label) {
  const float d = static_cast<float>(std::pow(token_decay_, static_cast<double>(token_ - e.rate_token)));
  e.rate.friendly = e.rate.friendly * d + (label ? 1.0f : 0.0f);
  e.rate.seen = e.rate.seen * d + 1.0f;
  e.rate_token = token_;
  Rate& c = layers_[static_cast<size_t>(key_layer(k))].cells[e.cell];
  Rate& p = pooled_[e.cell];
  c.seen += 1.0f, p.seen += 1.0f;
  if (label) c.friendly += 1.0f, p.friendly += 1.0f;
}

void OptgenPolicy::on_access(const Access& a, bool hit) {
  base_->on_access(a, hit);
  advance(a.time, a.token);
  Expert& e = expert(a.key);
  if (e.seen) {
    // The previous access's label: would Belady have kept the expert until now?
    const bool label = opt_would_hit(e.last_time, a.time, a.bytes);
    ++judged_;
    opt_hits_ += label ? 1 : 0;
    learn(a.key, e, label);
    const uint64_t gap = a.token - e.last_token;
    e.token_uses = gap >= 32 ? 0u : e.token_uses << gap;
  }
  e.token_uses |= 1u;
  e.cell = static_cast<uint8_t>(cell_of(e.token_uses));
  e.last_time = a.time;
  e.last_token = a.token;
  e.seen = true;
}

double OptgenPolicy::cell_rate(int layer, int cell) const {
  const Rate& p = pooled_[cell];
  const double pooled = (p.friendly + 0.5) / (p.seen + 1.0);
  if (layer < 0 || layer >= static_cast<int>(layers_.size())) return pooled;
  const Rate& c = layers_[static_cast<size_t>(layer)].cells[cell];
  return (c.friendly + options_.cell_prior * pooled) / (c.seen + options_.cell_prior);
}

double OptgenPolicy::friendly(ExpertKey k) const {
  const Expert* e = find(k);
  const double prior = cell_rate(key_layer(k), e ? e->cell : 0);
  if (!e) return prior;
  const double d = std::pow(token_decay_, static_cast<double>(token_ - e->rate_token));
  const double m = options_.key_prior;
  if (e->rate.seen * d + m <= 0.0) return prior;
  return (e->rate.friendly * d + m * prior) / (e->rate.seen * d + m);
}

int OptgenPolicy::cell(ExpertKey k) const {
  const Expert* e = find(k);
  return e ? e->cell : 0;
}

bool OptgenPolicy::choose_victim(const Access& incoming, const ResidentSet& residents, ExpertKey& victim) {
  const auto wait = [&](ExpertKey k) {
    const double p = friendly(k);
    const double w = base_->expected_wait(k) * (options_.rank_power > 0.0 ? std::pow(std::max(p, 1e-3), -options_.rank_power) : 1.0);
    return w + (p < options_.averse_below ? kAverseWait : 0.0);
  };
  return pick_farthest(incoming, residents, true, wait, victim);
}

size_t OptgenPolicy::state_bytes() const {
  size_t bytes = sizeof(*this) + occupancy_.capacity() * sizeof(uint64_t) + layers_.capacity() * sizeof(Layer);
  for (const Layer& l : layers_) bytes += l.experts.capacity() * sizeof(Expert);
  return bytes;
}

size_t OptgenPolicy::state_bound(int n_layers, int n_experts_per_layer, int window_tokens) {
  const size_t n = static_cast<size_t>(std::max(1, n_layers)), e = static_cast<size_t>(std::max(1, n_experts_per_layer));
  // Vectors may grow to twice what they hold.
  return sizeof(OptgenPolicy) + n * static_cast<size_t>(std::max(1, window_tokens)) * sizeof(uint64_t) +
         2 * n * (sizeof(Layer) + 2 * e * sizeof(Expert));
}

}  // namespace bmoe
