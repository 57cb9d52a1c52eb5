#include "model/routed_experts.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <numeric>

#include "core/error.h"
#include "model/layer_pass.h"
#include "model/ops.h"

namespace bmoe {

namespace {

// Indices of the k largest values, largest first (ties: lower index first).
void top_k(const float* values, int n, int k, std::vector<int32_t>& out) {
  out.resize(static_cast<size_t>(n));
  std::iota(out.begin(), out.end(), 0);
  std::partial_sort(out.begin(), out.begin() + k, out.end(), [&](int32_t a, int32_t b) {
    return values[a] > values[b] || (values[a] == values[b] && a < b);
  });
  out.resize(static_cast<size_t>(k));
}

// Group-limited routing: scores of the experts outside the `keep` groups whose two best scores
// sum highest become -inf (llama.cpp's rule; the loader checks groups of at least two).
void mask_expert_groups(float* scores, int n_expert, int groups, int keep) {
  const int size = n_expert / groups;
  std::vector<float> group_scores(static_cast<size_t>(groups));
  std::vector<int32_t> best;
  for (int g = 0; g < groups; ++g) {
    top_k(scores + g * size, size, 2, best);
    group_scores[static_cast<size_t>(g)] = scores[g * size + best[0]] + scores[g * size + best[1]];
  }
  top_k(group_scores.data(), groups, keep, best);
  for (int g = 0; g < groups; ++g) {
    if (std::find(best.begin(), best.end(), g) != best.end()) continue;
    std::fill(scores + g * size, scores + (g + 1) * size, -INFINITY);
  }
}

}  // namespace

// A hash-routed layer's experts: the table's row of the token id (llama.cpp's tid2eid).
void RoutedExperts::hashed_experts(const RoutedExpertWeights& L, int32_t token, std::vector<int32_t>& ids) const {
  const size_t k = static_cast<size_t>(cfg_.n_expert_used);
  if (static_cast<size_t>(token) * k >= L.hash_experts.size()) fail("token id {} is outside the hash routing table", token);
  ids.resize(k);
  for (size_t s = 0; s < k; ++s) ids[s] = static_cast<int32_t>(L.hash_experts[static_cast<size_t>(token) * k + s]);
}

// Each hash-routed layer's experts for the pass's tokens, in order of first use (the order the
// layer will ask for them), as one exact hint. A route hook may still replace the routing: the
// reads are then wasted, never wrong, since the source computes what the layer routes.
void RoutedExperts::hint_hashed_layers(int n, ExpertSource& source) {
  if (!tokens_ || cfg_.moe.n_hash_layers == 0) return;
  std::vector<LayerPrediction> known;
  std::vector<int32_t> ids;
  for (int l = 0; l < cfg_.n_layer; ++l) {
    const auto& experts = weights_.layers[static_cast<size_t>(l)].experts;
    const RoutedExpertWeights* L = experts ? &*experts : nullptr;
    if (!L || L->hash_experts.empty()) continue;
    LayerPrediction p;
    p.layer = l;
    p.distance = l + 1;  // layers ahead of the pass's start: the nearest read first
    p.exact = true;
    std::vector<bool> seen(static_cast<size_t>(cfg_.n_expert), false);
    for (int i = 0; i < n; ++i) {
      hashed_experts(*L, tokens_[i], ids);
      for (int32_t e : ids) {
        if (e < 0 || e >= cfg_.n_expert || seen[static_cast<size_t>(e)]) continue;
        seen[static_cast<size_t>(e)] = true;
        p.experts.push_back(e);
      }
    }
    known.push_back(std::move(p));
  }
  if (!known.empty()) source.hint(known);
}

void RoutedExperts::gate(const RoutedExpertWeights& L, float* logits, std::vector<int32_t>& ids,
                          std::vector<float>& wts, int32_t token) const {
  const int NE = cfg_.n_expert;
  const int k = cfg_.n_expert_used;
  if (!L.router_bias.empty()) ops::add(logits, L.router_bias.data(), NE);
  switch (cfg_.moe.gating) {
    case Gating::SoftmaxTopK:
    case Gating::SigmoidTopK:
    case Gating::SqrtSoftplusTopK: {
      std::vector<float> probs(logits, logits + NE);
      if (cfg_.moe.gating == Gating::SoftmaxTopK) ops::softmax(probs.data(), NE);
      else if (cfg_.moe.gating == Gating::SigmoidTopK) for (float& p : probs) p = 1.0f / (1.0f + std::exp(-p));
      else for (float& p : probs) p = std::sqrt(p > 20.0f ? p : std::log(1.0f + std::exp(p)));  // ggml's softplus
      const bool grouped = cfg_.moe.n_groups > 1;
      if (!L.hash_experts.empty() && token >= 0) {
        hashed_experts(L, token, ids);
      } else if (L.expert_select_bias.empty() && !grouped) {
        top_k(probs.data(), NE, k, ids);
      } else {  // the bias and the groups steer the choice; the weights stay the unbiased probabilities
        std::vector<float> scores(probs);
        if (!L.expert_select_bias.empty()) ops::add(scores.data(), L.expert_select_bias.data(), NE);
        if (grouped) mask_expert_groups(scores.data(), NE, cfg_.moe.n_groups, cfg_.moe.n_group_used);
        top_k(scores.data(), NE, k, ids);
      }
      wts.resize(static_cast<size_t>(k));
      for (int s = 0; s < k; ++s) wts[static_cast<size_t>(s)] = probs[static_cast<size_t>(ids[static_cast<size_t>(s)])];
      break;
    }
    case Gating::TopKSoftmax: {
      top_k(logits, NE, k, ids);
      wts.resize(static_cast<size_t>(k));
      for (int s = 0; s < k; ++s) wts[static_cast<size_t>(s)] = logits[ids[static_cast<size_t>(s)]];
      ops::softmax(wts.data(), k);
      break;
    }
  }
  if (cfg_.moe.norm_topk) {
    double total = 0.0;  // summed in double, as ggml's row sum does
    for (float v : wts) total += v;
    const float sum = std::max(static_cast<float>(total), 6.103515625e-5f);  // llama.cpp's clamp
    for (float& v : wts) v /= sum;
  }
  if (cfg_.moe.weights_scale != 0.0f && cfg_.moe.weights_scale != 1.0f) {
    for (float& v : wts) v *= cfg_.moe.weights_scale;
  }
}

// The router's logits, then per token the model's gating, unless the router hook decided the
// routing layers earlier (route-ahead); the route hook sees each token's routing and may
// replace it; the router hook settles it last (drop-cold), so what it drops is what is computed.
void RoutedExperts::route_tokens(int layer, int n, const float* router_in, const int* positions,
                                 ExpertSource& source) {
  const RoutedExpertWeights& L = *weights_.layers[static_cast<size_t>(layer)].experts;
  const int NE = cfg_.n_expert;
  router_logits_.resize(static_cast<size_t>(n) * NE);
  matmul(pool_, L.router, router_in, n, router_logits_.data(), router_act_);
  routes_.resize(static_cast<size_t>(n));
  const std::span<TokenRoute> routes(routes_);
  const bool decided_early = hooks_.router && hooks_.router->take_early_routes(layer, routes);
  for (int i = 0; i < n; ++i) {
    float* logits = router_logits_.data() + static_cast<size_t>(i) * NE;
    TokenRoute& route = routes_[static_cast<size_t>(i)];
    if (!decided_early) gate(L, logits, route.experts, route.weights, tokens_ ? tokens_[i] : -1);
    report_route(layer, i, logits, positions);
  }
  if (hooks_.router) hooks_.router->finish_routes(layer, routes, source);
}

void RoutedExperts::report_route(int layer, int token, const float* logits, const int* positions) {
  if (!hooks_.route) return;
  TokenRoute& route = routes_[static_cast<size_t>(token)];
  RouteEvent ev;
  ev.layer = layer;
  ev.position = positions[token];
  ev.row = token;
  ev.prefill = hooks_.prefill;
  ev.replay = hooks_.replay;
  ev.logits = logits;
  ev.n_expert = cfg_.n_expert;
  ev.experts = &route.experts;
  ev.weights = &route.weights;
  hooks_.route(ev);
}

void RoutedExperts::router_input(int layer, const float* x, float* out) const {
  const LayerWeights& L = weights_.layers[static_cast<size_t>(layer)];
  const int E = cfg_.n_embd;
  if (cfg_.ffn_at(layer) == FfnKind::ParallelDenseMoe) {
    // Gemma 4: plain RMS norm, scaled by router_in_scale / sqrt(n_embd).
    ops::rms_norm(x, nullptr, out, E, cfg_.norm_eps);
    const float inv_sqrt_e = 1.0f / std::sqrt(static_cast<float>(E));
    for (int d = 0; d < E; ++d) out[d] = out[d] * inv_sqrt_e * L.experts->router_in_scale[static_cast<size_t>(d)];
  } else {
    ops::rms_norm(x, L.ffn_norm.data(), out, E, cfg_.norm_eps);
  }
}

// A later layer's router on the residual rows as they stand when the router hook asks (after the
// current layer's attention, before its FFN): the prediction the hook hints, and with
// route-ahead the routing that layer then takes.
void RoutedExperts::route_residual(int layer, std::span<TokenRoute> rows, const ResidualStream& residual) {
  const RoutedExpertWeights& L = *weights_.layers[static_cast<size_t>(layer)].experts;
  const int E = cfg_.n_embd, NE = cfg_.n_expert;
  const int n = static_cast<int>(rows.size());
  float* in = scratch(residual_router_in_, static_cast<size_t>(n) * E);
  float* logits = scratch(residual_router_logits_, static_cast<size_t>(n) * NE);
  for (int i = 0; i < n; ++i) router_input(layer, residual.row(i), in + static_cast<size_t>(i) * E);
  matmul(pool_, L.router, in, n, logits, residual_router_act_);
  for (int i = 0; i < n; ++i) {
    TokenRoute& row = rows[static_cast<size_t>(i)];
    gate(L, logits + static_cast<size_t>(i) * NE, row.experts, row.weights);
  }
}

// The (token, slot) pairs of a layer's routing grouped by expert, experts in order of first use:
// what the source is asked for (experts, weight sums, use counts) and which rows each computes.
struct RoutedExperts::ExpertUses {
  struct Use {
    int32_t token;
    int32_t slot;
  };
  std::vector<int32_t> experts;
  std::vector<float> weight_sums;
  std::vector<int32_t> use_counts;
  std::vector<std::vector<Use>> uses;  // per expert, same order
  int max_slots = 0;                   // the most experts one token routes to

  // Ready experts are computed in groups of at most kGroupRows token rows (at least one expert
  // each), so the group buffers stay bounded however large a prompt batch is. Returns the end
  // of the group that starts at ready[first].
  static constexpr size_t kGroupRows = 4096;
  size_t group_end(std::span<const int> ready, size_t first) const {
    size_t last = first, rows = 0;
    do {
      rows += uses[static_cast<size_t>(ready[last])].size();
      ++last;
    } while (last < ready.size() && rows + uses[static_cast<size_t>(ready[last])].size() <= kGroupRows);
    return last;
  }
};

// Ready experts computed together: each one's matrices and token rows, its rows' place in the
// group buffers, and those buffers once filled.
struct RoutedExperts::ExpertGroup {
  struct Member {
    int index;  // into ExpertUses
    std::vector<Weight> m;
    std::vector<int32_t> rows;  // token rows of h
    size_t offset;              // first row in the group buffers
  };
  std::vector<Member> members;
  size_t rows = 0;
  int64_t width = 0;  // the experts' hidden width (F)
  float* gate = nullptr;
  float* up = nullptr;
  float* act = nullptr;
};

RoutedExperts::ExpertUses RoutedExperts::group_by_expert(int n) const {
  ExpertUses u;
  std::map<int32_t, size_t> index_of;
  for (int i = 0; i < n; ++i) {
    const TokenRoute& route = routes_[static_cast<size_t>(i)];
    u.max_slots = std::max(u.max_slots, static_cast<int>(route.experts.size()));
    for (size_t s = 0; s < route.experts.size(); ++s) {
      auto [it, inserted] = index_of.emplace(route.experts[s], u.experts.size());
      if (inserted) {
        u.experts.push_back(route.experts[s]);
        u.weight_sums.push_back(0.0f);
        u.use_counts.push_back(0);
        u.uses.emplace_back();
      }
      u.uses[it->second].push_back({i, static_cast<int32_t>(s)});
      u.weight_sums[it->second] += route.weights[s];
      ++u.use_counts[it->second];
    }
  }
  return u;
}

void RoutedExperts::run(int layer, int n, const float* h, const float* router_in, const int* positions,
                        ExpertSource& source, float* out) {
  route_tokens(layer, n, router_in, positions, source);
  const ExpertUses uses = group_by_expert(n);
  distinct_experts_ += uses.experts.size();
  for (int32_t count : uses.use_counts) routed_slots_ += static_cast<uint64_t>(count);
  // Every (token, slot) row is written once below, and only those rows are summed.
  float* slot_out = scratch(slot_out_, static_cast<size_t>(n) * uses.max_slots * cfg_.n_embd);
  source.begin_layer(LayerRouting{layer, uses.experts, uses.weight_sums, uses.use_counts, n});
  // After begin_layer, so this layer's reads are queued before any read ahead for later ones.
  if (hooks_.router) hooks_.router->after_request(layer, n, owner_, source);
  compute_ready_experts(layer, n, h, uses, source, slot_out);
  sum_slots(n, uses.max_slots, slot_out, out);
}

void RoutedExperts::compute_ready_experts(int layer, int n, const float* h, const ExpertUses& uses,
                                          ExpertSource& source, float* slot_out) {
  acts_.reset();
  // While the source waits on reads, this pass's idle workers sleep instead of spinning on the
  // cores the reads' kernel work needs (on 2 cores, spinning through waits slowed decode).
  ThreadPool& pool = pool_;
  source.set_wait_hook([&pool] { pool.park(); });
  std::vector<int> ready;
  while (true) {
    ready.clear();
    if (source.take_ready(ready) == 0) break;
    for (size_t first = 0; first < ready.size();) {
      const size_t last = uses.group_end(ready, first);
      compute_group(layer, n, h, uses, std::span<const int>(ready).subspan(first, last - first), source, slot_out);
      first = last;
    }
  }
  source.end_layer();
  source.set_wait_hook({});
}

// Gate, up and down projections of a group of ready experts, each stage one parallel pass.
void RoutedExperts::compute_group(int layer, int n, const float* h, const ExpertUses& uses,
                                  std::span<const int> ready, ExpertSource& source, float* slot_out) {
  const RoutedExpertWeights& L = *weights_.layers[static_cast<size_t>(layer)].experts;
  ExpertGroup group;
  for (int idx : ready) {
    ExpertGroup::Member member{idx, {}, {}, group.rows};
    const auto mats = source.matrices(idx);
    member.m.assign(mats.begin(), mats.end());
    for (const ExpertUses::Use& u : uses.uses[static_cast<size_t>(idx)]) member.rows.push_back(u.token);
    group.rows += member.rows.size();
    group.members.push_back(std::move(member));
  }
  expert_gate_up(L, n, h, group);
  expert_activation(L, layer, uses, group);
  expert_down(L, uses, group, slot_out);
}

// Gate and up projections (or the fused gate_up rows) of every expert of the group in one pass.
void RoutedExperts::expert_gate_up(const RoutedExpertWeights& L, int n, const float* h, ExpertGroup& group) {
  const int E = cfg_.n_embd;
  const ExpertRoles& R = L.roles;
  const bool fused_rows = R.gate_up >= 0;
  const Weight& first_up = group.members[0].m[static_cast<size_t>(fused_rows ? R.gate_up : R.up)];
  const int64_t F = fused_rows ? first_up.rows / 2 : first_up.rows;
  group.width = F;
  group.gate = scratch(expert_gate_, group.rows * F);
  group.up = scratch(expert_up_, group.rows * F);
  group.act = scratch(expert_act_, group.rows * F);
  float* fused = fused_rows ? scratch(expert_fused_, group.rows * 2 * F) : nullptr;
  std::vector<MatmulJob> jobs;
  for (const ExpertGroup::Member& mb : group.members) {
    const int64_t m = static_cast<int64_t>(mb.rows.size());
    if (fused_rows) {
      // Fused rows: the first F outputs are the gate, the next F the up projection.
      const Weight& gu = mb.m[static_cast<size_t>(R.gate_up)];
      jobs.push_back({&gu, &acts_.get(pool_, gu.type, h, n, E), m, mb.rows.data(), fused + mb.offset * 2 * F, 2 * F});
    } else {
      const Weight& g = mb.m[static_cast<size_t>(R.gate)];
      const Weight& u = mb.m[static_cast<size_t>(R.up)];
      jobs.push_back({&g, &acts_.get(pool_, g.type, h, n, E), m, mb.rows.data(), group.gate + mb.offset * F, F});
      jobs.push_back({&u, &acts_.get(pool_, u.type, h, n, E), m, mb.rows.data(), group.up + mb.offset * F, F});
    }
  }
  run_matmuls(pool_, jobs);
  if (!fused_rows) return;
  for (size_t r = 0; r < group.rows; ++r) {
    std::copy_n(fused + r * 2 * F, F, group.gate + r * F);
    std::copy_n(fused + r * 2 * F + F, F, group.up + r * F);
  }
}

// Per-expert biases (gpt-oss), then the activation into group.act.
void RoutedExperts::expert_activation(const RoutedExpertWeights& L, int layer, const ExpertUses& uses, ExpertGroup& group) {
  const int64_t F = group.width;
  const float limit = cfg_.moe.clamp.at(layer);
  for (const ExpertGroup::Member& mb : group.members) {
    const int32_t expert = uses.experts[static_cast<size_t>(mb.index)];
    for (size_t j = 0; j < mb.rows.size(); ++j) {
      float* g = group.gate + (mb.offset + j) * F;
      float* u = group.up + (mb.offset + j) * F;
      if (!L.exp_gate_bias.empty()) ops::add(g, L.exp_gate_bias.data() + static_cast<size_t>(expert) * F, F);
      if (!L.exp_up_bias.empty()) ops::add(u, L.exp_up_bias.data() + static_cast<size_t>(expert) * F, F);
      float* a = group.act + (mb.offset + j) * F;
      switch (cfg_.moe.activation) {
        case ExpertActivation::SwiGLU: ops::swiglu_clamped(cfg_.moe.clamp, g, u, a, F, limit); break;
        case ExpertActivation::SwiGLU_OAI: ops::swiglu_oai(g, u, a, F, 1.702f, 7.0f); break;
        case ExpertActivation::GeGLU: ops::geglu(g, u, a, F); break;
      }
    }
  }
}

// Down projections of the group in one pass, then each (token, slot) result, with the expert's
// down bias and scale, times its routing weight into its own row of slot_out.
void RoutedExperts::expert_down(const RoutedExpertWeights& L, const ExpertUses& uses, const ExpertGroup& group,
                                 float* slot_out) {
  const int E = cfg_.n_embd;
  const int64_t F = group.width;
  const size_t down = static_cast<size_t>(L.roles.down);
  const Weight& first_down = group.members[0].m[down];
  ActivationBuffer& down_in = down_act_;
  down_in.convert(first_down.type, group.act, static_cast<int64_t>(group.rows), F, F, &pool_);
  float* down_buf = scratch(expert_down_, group.rows * E);
  std::vector<std::vector<int32_t>> down_rows(group.members.size());
  std::vector<MatmulJob> jobs;
  for (size_t gi = 0; gi < group.members.size(); ++gi) {
    const ExpertGroup::Member& mb = group.members[gi];
    const Weight& d = mb.m[down];
    if (d.type != first_down.type) fail("internal: experts of one layer use different down types");
    down_rows[gi].resize(mb.rows.size());
    std::iota(down_rows[gi].begin(), down_rows[gi].end(), static_cast<int32_t>(mb.offset));
    jobs.push_back({&d, &down_in, static_cast<int64_t>(mb.rows.size()), down_rows[gi].data(), down_buf + mb.offset * E, E});
  }
  run_matmuls(pool_, jobs);
  for (const ExpertGroup::Member& mb : group.members) {
    const int32_t expert = uses.experts[static_cast<size_t>(mb.index)];
    const auto& u = uses.uses[static_cast<size_t>(mb.index)];
    for (size_t j = 0; j < u.size(); ++j) {
      float* d = down_buf + (mb.offset + j) * E;
      if (!L.exp_down_bias.empty()) ops::add(d, L.exp_down_bias.data() + static_cast<size_t>(expert) * E, E);
      if (!L.exp_down_scale.empty()) ops::scale(d, L.exp_down_scale[static_cast<size_t>(expert)], E);
      const float wt = routes_[static_cast<size_t>(u[j].token)].weights[static_cast<size_t>(u[j].slot)];
      float* dst = slot_out + (static_cast<size_t>(u[j].token) * uses.max_slots + u[j].slot) * E;
      for (int e = 0; e < E; ++e) dst[e] = d[e] * wt;
    }
  }
}

// The slots summed in slot order, as llama.cpp adds them (after every expert is done, so the
// order experts arrive in cannot change the sum).
void RoutedExperts::sum_slots(int n, int max_slots, const float* slot_out, float* out) const {
  const int E = cfg_.n_embd;
  for (int i = 0; i < n; ++i) {
    float* dst = out + static_cast<size_t>(i) * E;
    const size_t k = routes_[static_cast<size_t>(i)].experts.size();
    const float* first = slot_out + static_cast<size_t>(i) * max_slots * E;
    std::copy_n(first, E, dst);
    for (size_t s = 1; s < k; ++s) ops::add(dst, first + s * E, E);
  }
}

}  // namespace bmoe
