#include "text/sampler_steps.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <map>
#include <numeric>

namespace bmoe {
namespace {

size_t floor_of(int min_keep) { return static_cast<size_t>(std::max(1, min_keep)); }

// Renormalises `p` over its first n entries.
void renormalise(std::vector<double>& p, size_t n) {
  p.resize(n);
  const double sum = std::accumulate(p.begin(), p.end(), 0.0);
  for (double& x : p) x /= sum;
}

// Draws an index from probabilities that sum to 1.
size_t draw_index(const std::vector<double>& p, Rng& rng) {
  double r = rng.uniform();
  for (size_t i = 0; i < p.size(); ++i) {
    r -= p[i];
    if (r <= 0.0) return i;
  }
  return p.size() - 1;
}

}  // namespace

bool sampler_step_named(const std::string& raw, SamplerStep* step, std::string* penalty) {
  std::string name;
  for (char ch : raw) {
    if (ch != '_' && ch != '-') name += static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
  }
  static const std::map<std::string, SamplerStep> kSteps = {
      {"topnsigma", SamplerStep::TopNSigma}, {"s", SamplerStep::TopNSigma},  {"topk", SamplerStep::TopK},
      {"k", SamplerStep::TopK},              {"typp", SamplerStep::Typical}, {"typicalp", SamplerStep::Typical},
      {"typ", SamplerStep::Typical},         {"y", SamplerStep::Typical},    {"topp", SamplerStep::TopP},
      {"nucleus", SamplerStep::TopP},        {"p", SamplerStep::TopP},       {"minp", SamplerStep::MinP},
      {"m", SamplerStep::MinP},              {"xtc", SamplerStep::Xtc},      {"x", SamplerStep::Xtc},
      {"temperature", SamplerStep::Temperature}, {"temp", SamplerStep::Temperature}, {"t", SamplerStep::Temperature}};
  if (name == "penalties" || name == "e") {
    *penalty = "penalties";
    return true;
  }
  if (name == "dry" || name == "d") {
    *penalty = "dry";
    return true;
  }
  const auto it = kSteps.find(name);
  if (it == kSteps.end()) return false;
  *step = it->second;
  penalty->clear();
  return true;
}

void CandidateList::weights(std::vector<float>& w, double& total) const {
  const float best = items.front().first;
  w.resize(items.size());
  total = 0.0;
  for (size_t i = 0; i < items.size(); ++i) {
    w[i] = std::exp((items[i].first - best) / temperature);
    total += w[i];
  }
}

std::vector<double> CandidateList::probabilities() const {
  std::vector<float> w;
  double total = 0.0;
  weights(w, total);
  std::vector<double> p(w.size());
  for (size_t i = 0; i < w.size(); ++i) p[i] = w[i] / total;
  return p;
}

void fill_candidates(CandidateList& c, const float* logits, int n_vocab, int k) {
  auto& items = c.items;
  items.resize(static_cast<size_t>(n_vocab));
  for (int32_t i = 0; i < n_vocab; ++i) items[static_cast<size_t>(i)] = {logits[i], i};
  const auto by_logit = [](const auto& a, const auto& b) { return a.first > b.first || (a.first == b.first && a.second < b.second); };
  if (k > 0 && k < n_vocab) {
    std::partial_sort(items.begin(), items.begin() + k, items.end(), by_logit);
    items.resize(static_cast<size_t>(k));
  } else {
    std::sort(items.begin(), items.end(), by_logit);
  }
}

void keep_top_k(CandidateList& c, int k) {
  if (k > 0) c.keep_first(static_cast<size_t>(k));
}

void keep_min_p(CandidateList& c, float p, int min_keep) {
  if (p <= 0.0f) return;
  // p_i >= p * p_best  <=>  logit_i >= best + temperature * ln(p).
  const float floor = c.items.front().first + c.temperature * std::log(p);
  size_t cut = 1;
  while (cut < c.items.size() && (c.items[cut].first >= floor || cut < floor_of(min_keep))) ++cut;
  c.keep_first(cut);
}

void keep_top_p(CandidateList& c, float p, int min_keep) {
  if (p >= 1.0f) return;
  std::vector<float> w;
  double total = 0.0;
  c.weights(w, total);
  double cumulative = 0.0;
  for (size_t i = 0; i < w.size(); ++i) {
    cumulative += w[i] / total;
    if (cumulative >= p && i + 1 >= floor_of(min_keep)) return c.keep_first(i + 1);
  }
}

void keep_typical(CandidateList& c, float p, int min_keep) {
  if (p >= 1.0f || c.items.size() < 2) return;
  const std::vector<double> prob = c.probabilities();
  double entropy = 0.0;
  for (double x : prob) entropy -= x > 0.0 ? x * std::log(x) : 0.0;
  std::vector<size_t> order(prob.size());
  std::iota(order.begin(), order.end(), size_t{0});
  const auto distance = [&](size_t i) { return std::fabs(-std::log(prob[i]) - entropy); };
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) { return distance(a) < distance(b); });
  size_t keep = order.size();
  double cumulative = 0.0;
  for (size_t i = 0; i < order.size(); ++i) {
    cumulative += prob[order[i]];
    if (cumulative > p && i + 1 >= floor_of(min_keep)) {
      keep = i + 1;
      break;
    }
  }
  order.resize(keep);
  std::sort(order.begin(), order.end());  // back to logit order
  std::vector<std::pair<float, int32_t>> kept;
  for (size_t i : order) kept.push_back(c.items[i]);
  c.items = std::move(kept);
}

void keep_top_n_sigma(CandidateList& c, float n) {
  if (n <= 0.0f) return;
  double sum = 0.0, squares = 0.0;
  size_t count = 0;
  for (const auto& [logit, id] : c.items) {
    if (!std::isfinite(logit)) continue;
    sum += logit;
    squares += static_cast<double>(logit) * logit;
    ++count;
  }
  if (count == 0) return;
  const double mean = sum / static_cast<double>(count);
  const double sigma = std::sqrt(std::max(0.0, squares / static_cast<double>(count) - mean * mean));
  const double floor = c.items.front().first - n * sigma;
  size_t cut = 1;
  while (cut < c.items.size() && c.items[cut].first >= floor) ++cut;
  c.keep_first(cut);
}

void exclude_top_choices(CandidateList& c, float threshold, int min_keep) {
  const std::vector<double> prob = c.probabilities();
  size_t above = 0;
  while (above < prob.size() && prob[above] >= threshold) ++above;
  if (above < 2) return;
  const size_t dropped = above - 1;  // all but the least likely of them
  if (c.items.size() - dropped < floor_of(min_keep)) return;
  c.items.erase(c.items.begin(), c.items.begin() + static_cast<std::ptrdiff_t>(dropped));
}

float dynamic_temperature(const CandidateList& c, float t, float range, float exponent) {
  if (range <= 0.0f || c.items.size() < 2) return t;
  CandidateList plain = c;
  plain.temperature = 1.0f;
  double entropy = 0.0;
  for (double x : plain.probabilities()) entropy -= x > 0.0 ? x * std::log(x) : 0.0;
  const double most = std::log(static_cast<double>(c.items.size()));
  const double normalised = std::clamp(entropy / most, 0.0, 1.0);
  const float low = std::max(0.0f, t - range), high = t + range;
  return low + (high - low) * static_cast<float>(std::pow(normalised, exponent));
}

int32_t draw_candidate(const CandidateList& c, Rng& rng) {
  std::vector<float> w;
  double total = 0.0;
  c.weights(w, total);
  double r = rng.uniform() * total;
  for (size_t i = 0; i < w.size(); ++i) {
    r -= w[i];
    if (r <= 0.0) return c.items[i].second;
  }
  return c.items.back().second;
}

int32_t mirostat_v1(CandidateList& c, float tau, float eta, int m, int n_vocab, float& mu, Rng& rng) {
  std::vector<double> p = c.probabilities();
  // Zipf's exponent s from the slope of log p against log rank over the top m tokens.
  double sum_tb = 0.0, sum_tt = 0.0;
  for (size_t i = 0; i + 1 < std::min(p.size(), static_cast<size_t>(m)); ++i) {
    const double t = std::log((static_cast<double>(i) + 2.0) / (static_cast<double>(i) + 1.0));
    const double b = std::log(p[i] / p[i + 1]);
    sum_tb += t * b;
    sum_tt += t * t;
  }
  size_t k = 1;
  if (sum_tt > 0.0) {
    const double s = sum_tb / sum_tt, eps = s - 1.0;
    const double kf = std::pow(eps * std::pow(2.0, mu) / (1.0 - std::pow(static_cast<double>(n_vocab), -eps)), 1.0 / s);
    if (std::isfinite(kf) && kf > 1.0) k = static_cast<size_t>(std::min(kf, static_cast<double>(p.size())));
  }
  c.keep_first(k);
  renormalise(p, c.items.size());
  const size_t i = draw_index(p, rng);
  mu -= eta * (static_cast<float>(-std::log2(p[i])) - tau);
  return c.items[i].second;
}

int32_t mirostat_v2(CandidateList& c, float tau, float eta, float& mu, Rng& rng) {
  std::vector<double> p = c.probabilities();
  size_t keep = 1;
  while (keep < p.size() && -std::log2(p[keep]) <= mu) ++keep;
  c.keep_first(keep);
  renormalise(p, c.items.size());
  const size_t i = draw_index(p, rng);
  mu -= eta * (static_cast<float>(-std::log2(p[i])) - tau);
  return c.items[i].second;
}

void dry_penalize(const std::vector<int32_t>& history, const std::vector<int32_t>& breakers, float multiplier, float base,
                  int allowed_length, float* logits, int n_vocab) {
  const size_t n = history.size();
  if (n < 2 || multiplier == 0.0f) return;
  const auto is_breaker = [&](int32_t t) { return std::find(breakers.begin(), breakers.end(), t) != breakers.end(); };
  // A repeat cannot reach past the last breaker of the text's end.
  size_t tail = 0;
  while (tail < n && !is_breaker(history[n - 1 - tail])) ++tail;
  if (tail == 0) return;
  // z[j]: how many tokens of the text ending at n-1-j equal those ending at n-1, backwards.
  std::vector<int32_t> rev(history.rbegin(), history.rend());
  std::vector<size_t> z(n, 0);
  for (size_t j = 1, l = 0, r = 0; j < n; ++j) {
    if (j < r) z[j] = std::min(r - j, z[j - l]);
    while (j + z[j] < n && rev[z[j]] == rev[j + z[j]]) ++z[j];
    if (j + z[j] > r) l = j, r = j + z[j];
  }
  std::map<int32_t, size_t> longest;  // token that would continue a repeat -> its length
  for (size_t j = 1; j < n; ++j) {
    const size_t length = std::min(z[j], tail);
    if (length < static_cast<size_t>(std::max(allowed_length, 1))) continue;
    const int32_t next = history[n - j];  // what followed the earlier occurrence
    longest[next] = std::max(longest[next], length);
  }
  for (const auto& [token, length] : longest) {
    if (token < 0 || token >= n_vocab) continue;
    logits[token] -= multiplier * std::pow(base, static_cast<float>(length) - static_cast<float>(allowed_length));
  }
}

}  // namespace bmoe
