#include "moe/route_trace.h"

#include <algorithm>
#include <fstream>
#include <map>
#include <set>
#include <sstream>

#include "core/error.h"
#include "core/rng.h"

namespace bmoe {
namespace {

std::string header_value(const std::string& line, const std::string& key) {
  const std::string needle = key + "=";
  size_t pos = 0;
  while ((pos = line.find(needle, pos)) != std::string::npos) {
    if (pos == 0 || line[pos - 1] == ' ' || line[pos - 1] == '#') {
      const size_t begin = pos + needle.size();
      const size_t end = line.find(' ', begin);
      return line.substr(begin, end == std::string::npos ? std::string::npos : end - begin);
    }
    pos += needle.size();
  }
  return {};
}

long long to_int(const std::string& s, const std::string& path, size_t line_no) {
  try {
    size_t used = 0;
    const long long v = std::stoll(s, &used);
    if (used != s.size()) throw std::invalid_argument(s);
    return v;
  } catch (const std::exception&) {
    fail("{}:{}: '{}' is not an integer", path, line_no, s);
  }
}

// A '#' line: the model's header (model, arch, n_layer, n_expert, n_expert_used) or a layer's
// sizes (layer, expert_bytes, dense_bytes); other comments are ignored.
void read_header_line(const std::string& line, RouteTrace& t, const std::string& path, size_t line_no) {
  if (const auto v = header_value(line, "n_layer"); !v.empty()) {
    t.model = header_value(line, "model");
    t.arch = header_value(line, "arch");
    t.n_layer = static_cast<int>(to_int(v, path, line_no));
    t.n_expert = static_cast<int>(to_int(header_value(line, "n_expert"), path, line_no));
    t.n_expert_used = static_cast<int>(to_int(header_value(line, "n_expert_used"), path, line_no));
    if (t.n_layer <= 0 || t.n_layer > 4096) fail("{}:{}: invalid n_layer", path, line_no);
    t.expert_bytes.assign(static_cast<size_t>(t.n_layer), 0);
    t.dense_bytes.assign(static_cast<size_t>(t.n_layer), 0);
  } else if (const auto l = header_value(line, "layer"); !l.empty()) {
    const long long layer = to_int(l, path, line_no);
    if (layer < 0 || layer >= t.n_layer) fail("{}:{}: layer {} out of range", path, line_no, layer);
    t.expert_bytes[static_cast<size_t>(layer)] = static_cast<uint64_t>(to_int(header_value(line, "expert_bytes"), path, line_no));
    const auto dense = header_value(line, "dense_bytes");
    if (!dense.empty()) t.dense_bytes[static_cast<size_t>(layer)] = static_cast<uint64_t>(to_int(dense, path, line_no));
  }
}

// One CSV row: turn,phase,step,layer,slot,expert,weight[,residency[,expert_bytes]], checked
// against the header's layer and expert counts.
RouteRecord read_record(const std::string& line, const RouteTrace& t, const std::string& path, size_t line_no) {
  std::vector<std::string> f;
  std::stringstream ss(line);
  for (std::string cell; std::getline(ss, cell, ',');) f.push_back(cell);
  if (f.size() < 7) fail("{}:{}: expected at least 7 columns, got {}", path, line_no, f.size());
  RouteRecord r;
  r.turn = static_cast<int>(to_int(f[0], path, line_no));
  r.phase = static_cast<int>(to_int(f[1], path, line_no));
  r.step = static_cast<int>(to_int(f[2], path, line_no));
  r.layer = static_cast<int>(to_int(f[3], path, line_no));
  r.slot = static_cast<int>(to_int(f[4], path, line_no));
  r.expert = static_cast<int>(to_int(f[5], path, line_no));
  try {
    r.weight = std::stof(f[6]);
  } catch (const std::exception&) {
    fail("{}:{}: '{}' is not a number", path, line_no, f[6]);
  }
  if (f.size() > 7) r.residency = static_cast<int>(to_int(f[7], path, line_no));
  if (f.size() > 8) r.expert_bytes = static_cast<uint64_t>(to_int(f[8], path, line_no));
  if (r.layer < 0 || r.layer >= t.n_layer || r.expert < 0 || r.expert >= t.n_expert || (r.phase != 0 && r.phase != 1)) {
    fail("{}:{}: record out of range (layer {}, expert {}, phase {})", path, line_no, r.layer, r.expert, r.phase);
  }
  return r;
}

}  // namespace

RouteTrace RouteTrace::load(const std::string& path) {
  std::ifstream in(path);
  if (!in) fail("cannot read route trace {}", path);
  RouteTrace t;
  std::string line;
  size_t line_no = 0;
  bool have_columns = false;
  while (std::getline(in, line)) {
    ++line_no;
    if (line.empty()) continue;
    if (line[0] == '#') {
      read_header_line(line, t, path, line_no);
    } else if (!have_columns) {
      if (line.rfind("turn,phase,step,layer,slot,expert,weight", 0) != 0) {
        fail("{}:{}: expected the column header 'turn,phase,step,layer,slot,expert,weight,...'", path, line_no);
      }
      have_columns = true;
    } else {
      t.records.push_back(read_record(line, t, path, line_no));
    }
  }
  if (t.n_layer == 0) fail("{}: missing the '# model=... n_layer=...' header", path);
  if (t.records.empty()) fail("{}: no routing records", path);
  // Layers whose header gave no expert size take the one their records carry.
  for (size_t l = 0; l < t.expert_bytes.size(); ++l) {
    if (t.expert_bytes[l] == 0) {
      for (const RouteRecord& r : t.records) {
        if (r.layer == static_cast<int>(l) && r.expert_bytes) t.expert_bytes[l] = r.expert_bytes;
      }
    }
  }
  return t;
}

RouteTraceWriter::RouteTraceWriter(const std::string& path, const std::string& model, const std::string& arch,
                                   int n_layer, int n_expert, int n_expert_used,
                                   const std::vector<uint64_t>& expert_bytes, const std::vector<uint64_t>& dense_bytes) {
  file_ = std::fopen(path.c_str(), "w");
  if (!file_) fail_errno("cannot create route trace " + path);
  std::fprintf(file_, "# route_trace v1\n# model=%s arch=%s n_layer=%d n_expert=%d n_expert_used=%d\n", model.c_str(),
               arch.c_str(), n_layer, n_expert, n_expert_used);
  for (int l = 0; l < n_layer; ++l) {
    std::fprintf(file_, "# layer=%d expert_bytes=%llu dense_bytes=%llu\n", l,
                 static_cast<unsigned long long>(l < static_cast<int>(expert_bytes.size()) ? expert_bytes[static_cast<size_t>(l)] : 0),
                 static_cast<unsigned long long>(l < static_cast<int>(dense_bytes.size()) ? dense_bytes[static_cast<size_t>(l)] : 0));
  }
  std::fprintf(file_, "turn,phase,step,layer,slot,expert,weight,residency,expert_bytes\n");
}

RouteTraceWriter::~RouteTraceWriter() {
  if (file_) std::fclose(file_);
}

void RouteTraceWriter::write(const RouteRecord& r) {
  std::fprintf(file_, "%d,%d,%d,%d,%d,%d,%.6f,%d,%llu\n", r.turn, r.phase, r.step, r.layer, r.slot, r.expert, r.weight,
               r.residency, static_cast<unsigned long long>(r.expert_bytes));
}

void RouteTraceWriter::flush() { std::fflush(file_); }

std::vector<std::vector<Access>> trace_visits(const RouteTrace& trace, std::vector<bool>* decode_visit) {
  // Group records: (turn, phase-0 prompt | each decode step) x layer -> unique experts.
  struct Group {
    int turn, phase, step, layer;
    bool operator<(const Group& o) const {
      return std::tie(turn, phase, step, layer) < std::tie(o.turn, o.phase, o.step, o.layer);
    }
  };
  // Each visit's experts in order of first use, as the engine asks for them, with how many of
  // the visit's tokens chose each (the engine's LayerRouting::uses).
  struct Used {
    int expert;
    float weight;
    int uses;
  };
  struct Visit {
    std::vector<Used> used;
    std::set<int> positions;  // the visit's tokens
  };
  std::map<Group, Visit> groups;
  for (const RouteRecord& r : trace.records) {
    const Group g{r.turn, r.phase, r.phase == 0 ? 0 : r.step, r.layer};
    Visit& visit = groups[g];
    visit.positions.insert(r.step);
    std::vector<Used>& used = visit.used;
    const auto it = std::find_if(used.begin(), used.end(), [&](const Used& u) { return u.expert == r.expert; });
    if (it != used.end()) {
      it->weight += r.weight;
      ++it->uses;
    } else {
      used.push_back({r.expert, r.weight, 1});
    }
  }
  std::vector<std::vector<Access>> visits;
  if (decode_visit) decode_visit->clear();
  uint64_t time = 0, token = 0;
  int last_turn = -1, last_step = -1, last_phase = -1;
  for (const auto& [g, visit] : groups) {
    if (g.turn != last_turn || g.phase != last_phase || g.step != last_step) ++token;
    last_turn = g.turn;
    last_phase = g.phase;
    last_step = g.step;
    std::vector<Access> v;
    for (const Used& u : visit.used) {
      Access a;
      a.key = make_expert_key(g.layer, u.expert);
      a.bytes = trace.expert_bytes[static_cast<size_t>(g.layer)];
      a.weight = u.weight;
      a.time = time;
      a.token = token;
      a.share = static_cast<float>(u.uses) / static_cast<float>(visit.positions.size());
      v.push_back(a);
    }
    ++time;
    visits.push_back(std::move(v));
    if (decode_visit) decode_visit->push_back(g.phase == 1);
  }
  return visits;
}

namespace {

// The engine's affinity prefetch, without timing: what it would read ahead and what of that the
// routing then uses.
class ReplayPrefetch {
 public:
  ReplayPrefetch(const RouteTrace& trace, const ReplayOptions& options) : trace_(trace), options_(options) {
    if (options.prefetch_window <= 0) return;
    AffinityOptions a;
    a.window = options.prefetch_window;
    a.min_score = options.min_score;
    predictor_ = std::make_unique<AffinityPredictor>(std::vector<int>(static_cast<size_t>(trace.n_layer), trace.n_expert), a);
    top_k_ = std::max(1, trace.n_expert_used);
    reads_ = options.prefetch_reads > 0 ? options.prefetch_reads : std::max(1, top_k_ / 2);
    const uint64_t largest = *std::max_element(trace.expert_bytes.begin(), trace.expert_bytes.end());
    staging_limit_ = static_cast<uint64_t>(options.prefetch_window + 1) * static_cast<uint64_t>(top_k_) * largest;
  }

  // A prompt visit (many tokens at once): nothing is learned or predicted from it.
  void skip_visit() {
    if (predictor_) predictor_->break_token();
  }

  // Whether `key` was read ahead (it is then consumed).
  bool take(ExpertKey key) {
    const auto it = staged_.find(key);
    if (it == staged_.end()) return false;
    staged_bytes_ -= it->second;
    staged_.erase(it);
    return true;
  }

  // After a decode visit: unused reads ahead of its layer are waste; learn, then read ahead.
  void after_visit(const std::vector<Access>& visit, const ExpertCache& cache, ReplayResult& r) {
    if (!predictor_ || visit.empty()) return;
    const int layer = key_layer(visit.front().key);
    for (auto it = staged_.begin(); it != staged_.end();) {
      if (key_layer(it->first) != layer) {
        ++it;
        continue;
      }
      r.prefetch_wasted_bytes += it->second;
      staged_bytes_ -= it->second;
      it = staged_.erase(it);
    }
    std::vector<int32_t> experts;
    for (const Access& a : visit) experts.push_back(key_expert(a.key));
    if (static_cast<int>(experts.size()) > top_k_) {
      predictor_->break_token();
      return;
    }
    predictor_->observe(layer, experts);
    for (int d = 1; d <= options_.prefetch_window && layer + d < trace_.n_layer; ++d) {
      std::vector<int32_t> guess = predictor_->predict(layer, d);
      if (static_cast<int>(guess.size()) > top_k_) guess.resize(static_cast<size_t>(top_k_));
      int reads_left = reads_;
      for (int32_t e : guess) {
        if (reads_left == 0) break;
        const ExpertKey key = make_expert_key(layer + d, e);
        if (cache.contains(key)) continue;
        --reads_left;
        const uint64_t bytes = trace_.expert_bytes[static_cast<size_t>(layer + d)];
        if (staged_.count(key) || staged_bytes_ + bytes > staging_limit_) continue;
        staged_[key] = bytes;
        staged_bytes_ += bytes;
        ++r.prefetch_reads;
        r.bytes_read += bytes;
      }
    }
  }

 private:
  const RouteTrace& trace_;
  const ReplayOptions& options_;
  std::unique_ptr<AffinityPredictor> predictor_;
  int top_k_ = 1;
  int reads_ = 1;
  uint64_t staging_limit_ = 0;
  uint64_t staged_bytes_ = 0;
  std::map<ExpertKey, uint64_t> staged_;
};

// "belady-hN": Belady knowing N tokens ahead; -1 for any other name.
int horizon_of(const std::string& policy) {
  const std::string prefix = "belady-h";
  if (policy.rfind(prefix, 0) != 0 || policy.size() == prefix.size() || policy.size() > prefix.size() + 4) return -1;
  int n = 0;
  for (size_t i = prefix.size(); i < policy.size(); ++i) {
    if (policy[i] < '0' || policy[i] > '9') return -1;
    n = n * 10 + (policy[i] - '0');
  }
  return n;
}

}  // namespace

bool is_offline_policy(const std::string& policy) {
  return policy == "belady" || policy == "layer-belady" || horizon_of(policy) >= 0;
}

ReplayResult replay_trace(const RouteTrace& trace, const std::string& policy, uint64_t budget_bytes,
                          const ReplayOptions& options) {
  std::vector<bool> decode;
  const auto visits = trace_visits(trace, &decode);
  Rng rng(options.seed);
  std::unique_ptr<CachePolicy> p;
  if (is_offline_policy(policy)) {
    std::vector<Access> all;
    for (const auto& v : visits) all.insert(all.end(), v.begin(), v.end());
    if (policy == "belady") p = make_belady_policy(all);
    else if (policy == "layer-belady") p = make_layer_belady_policy(all, trace.n_layer, budget_bytes);
    else p = make_horizon_belady_policy(all, horizon_of(policy), trace.n_layer);
  } else {
    p = make_cache_policy(policy, trace.n_layer, budget_bytes);
  }
  ExpertCache cache(budget_bytes, std::move(p));
  ReplayResult r;
  ReplayPrefetch prefetch(trace, options);
  std::vector<ExpertKey> predicted;
  uint64_t first_decode = 0, last_decode = 0;
  for (size_t i = 0; i < visits.size(); ++i) {
    if (!decode[i] || visits[i].empty()) continue;
    if (first_decode == 0) first_decode = visits[i].front().token;
    last_decode = visits[i].front().token;
  }
  const double counted_from = static_cast<double>(first_decode) + options.count_from * static_cast<double>(last_decode + 1 - first_decode);
  for (size_t i = 0; i < visits.size(); ++i) {
    if (options.predict_window > 0 && decode[i]) {
      // Visits of one decode token are consecutive, one per layer.
      predicted.clear();
      const int layer = key_layer(visits[i].front().key);
      for (int d = 1; d <= options.predict_window && layer + d < trace.n_layer && i + static_cast<size_t>(d) < visits.size(); ++d) {
        for (const Access& a : visits[i + static_cast<size_t>(d)]) {
          int expert = key_expert(a.key);
          if (rng.uniform() >= options.predict_accuracy) expert = static_cast<int>((expert + 1 + rng.below(static_cast<uint64_t>(trace.n_expert - 1))) % trace.n_expert);
          predicted.push_back(make_expert_key(layer + d, expert));
        }
      }
      cache.policy().hint(predicted, std::min(options.predict_window, trace.n_layer - 1 - layer));
    }
    const VisitPlan plan = cache.begin_visit(visits[i]);
    cache.end_visit();
    if (!decode[i]) {
      prefetch.skip_visit();
      continue;
    }
    const bool counted = visits[i].empty() || static_cast<double>(visits[i].front().token) >= counted_from;
    for (size_t j = 0; j < visits[i].size() && counted; ++j) {
      ++r.lookups;
      if (plan.hit[j]) ++r.hits;
      else if (prefetch.take(visits[i][j].key)) ++r.covered;
      else r.bytes_read += visits[i][j].bytes;
    }
    prefetch.after_visit(visits[i], cache, r);
  }
  r.evictions = cache.evictions();
  return r;
}

}  // namespace bmoe
