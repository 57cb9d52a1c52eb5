// llama.cpp's side of bench/bench_kld_spread.py: KL divergence between saved next-token
// distributions, in llama-perplexity's base-logits format (the file bmoe-perplexity
// --kl-divergence-base writes; format: src/engine/kl_divergence.h).
//
//   llama_kld eval MODEL BASE UBATCH THREADS OUT [ROWS]
//     scores BASE's tokens with llama.cpp as llama-perplexity does (each chunk from an empty
//     context, one batch of n_ctx split into micro-batches of UBATCH, the second half scored),
//     writes its own distributions to OUT (same format) and prints one JSON line: its mean NLL
//     and the KL divergence of its full-precision distributions against BASE's.
//   llama_kld compare BASE OTHER [ROWS]
//     the KL divergence of OTHER's saved distributions against BASE's (no model; nll_mean 0:
//     a saved row clamps log-probs more than 16 below its top, as most next tokens are here).
// ROWS (optional) gets one line per scored row: index, KLD, base top id, other top id.
// LLAMA_KLD_ROUTES=FILE (eval) writes each token's routed experts, a line per chunk, layer and
// position: "chunk layer pos e1 .. ek gap" (the router's top k, best first, and the router
// probability of the k-th less the (k+1)-th's), to find where two runs' expert choices part
// (UBATCH = n_ctx: the positions are counted per micro-batch).
// The JSON: {count, nll_mean, kld_mean, kld_p99, kld_p999, kld_median, kld_max, same_top}.
//
// Built against node-llama-cpp's prebuilt libraries (tests/conformance/common.py
// build_llama_program); LLAMA_BACKEND_DIR names a folder holding the one CPU level to load.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "ggml-backend.h"
#include "llama.h"

namespace {

constexpr float kLogRange = 16.0f;

[[noreturn]] void die(const std::string& why) {
  std::fprintf(stderr, "llama_kld: %s\n", why.c_str());
  std::exit(1);
}

size_t row_words(int n_vocab) { return static_cast<size_t>(2 * ((n_vocab + 1) / 2) + 4); }

struct SavedLogits {
  uint32_t n_ctx = 0;
  int32_t n_vocab = 0, n_chunk = 0;
  std::vector<int32_t> tokens;
  std::vector<uint16_t> rows;  // every scored row, row_words(n_vocab) u16 each

  size_t n_rows() const { return rows.size() / row_words(n_vocab); }
  const uint16_t* row(size_t r) const { return rows.data() + r * row_words(n_vocab); }
  // The log-probability of token i in saved row r (scale * q + floor).
  float log_p(const uint16_t* row, int i) const {
    float head[2];
    std::memcpy(head, row, sizeof(head));
    return head[0] * static_cast<float>(row[4 + i]) + head[1];
  }
};

SavedLogits read_saved(const char* path) {
  FILE* f = std::fopen(path, "rb");
  if (!f) die(std::string("cannot read ") + path);
  char magic[8];
  SavedLogits s;
  bool ok = std::fread(magic, 1, 8, f) == 8 && std::memcmp(magic, "_logits_", 8) == 0 &&
            std::fread(&s.n_ctx, 4, 1, f) == 1 && std::fread(&s.n_vocab, 4, 1, f) == 1 &&
            std::fread(&s.n_chunk, 4, 1, f) == 1 && s.n_ctx >= 4 && s.n_vocab > 0 && s.n_chunk > 0;
  if (!ok) die(std::string(path) + " is not a base-logits file");
  s.tokens.resize(static_cast<size_t>(s.n_ctx) * static_cast<size_t>(s.n_chunk));
  ok = std::fread(s.tokens.data(), 4, s.tokens.size(), f) == s.tokens.size();
  const size_t scored = static_cast<size_t>(s.n_chunk) * (s.n_ctx - 1 - s.n_ctx / 2);
  s.rows.resize(scored * row_words(s.n_vocab));
  ok = ok && std::fread(s.rows.data(), 2, s.rows.size(), f) == s.rows.size();
  std::fclose(f);
  if (!ok) die(std::string(path) + ": cut short");
  return s;
}

// One saved row of `logits`, as llama-perplexity writes it.
void quantize_row(const float* logits, int n_vocab, uint16_t* out) {
  const auto [lo, hi] = std::minmax_element(logits, logits + n_vocab);
  const float max_logit = *hi;
  const float min_logit = std::max(*lo, max_logit - kLogRange);
  double sum_exp = 0;
  for (int i = 0; i < n_vocab; ++i) sum_exp += std::exp(logits[i] - max_logit);
  const float head[2] = {(max_logit - min_logit) / 65535.0f, min_logit - max_logit - static_cast<float>(std::log(sum_exp))};
  std::memcpy(out, head, sizeof(head));
  std::fill(out + 4, out + row_words(n_vocab), uint16_t{0});
  if (head[0] <= 0) return;
  for (int i = 0; i < n_vocab; ++i) {
    if (logits[i] > min_logit) out[4 + i] = static_cast<uint16_t>(std::lrintf((logits[i] - min_logit) / head[0]));
  }
}

struct KldStats {
  std::vector<double> kld;
  std::vector<int> top_base, top_other;
  double nll = 0;

  // Adds one row: log_q(i) is the other side's log-probability of token i.
  template <class LogQ>
  void add(const SavedLogits& base, const uint16_t* row, int n_vocab, LogQ log_q) {
    double sum = 0;
    int tb = 0, tq = 0;
    float best_b = -INFINITY, best_q = -INFINITY;
    for (int i = 0; i < n_vocab; ++i) {
      const float lb = base.log_p(row, i), lq = log_q(i);
      if (lb > best_b) best_b = lb, tb = i;
      if (lq > best_q) best_q = lq, tq = i;
      if (lb > -kLogRange) sum += std::exp(lb) * (lb - lq);
    }
    kld.push_back(sum);
    top_base.push_back(tb);
    top_other.push_back(tq);
  }

  void print(const char* rows_path) const {
    std::vector<double> sorted = kld;
    std::sort(sorted.begin(), sorted.end());
    const size_t n = sorted.size();
    auto pct = [&](double p) { return sorted[std::min(n - 1, static_cast<size_t>(p * static_cast<double>(n)))]; };
    double mean = 0;
    size_t same = 0;
    for (size_t r = 0; r < n; ++r) mean += kld[r], same += top_base[r] == top_other[r];
    std::printf("{\"count\": %zu, \"nll_mean\": %.6f, \"kld_mean\": %.6g, \"kld_median\": %.6g, \"kld_p99\": %.6g, "
                "\"kld_p999\": %.6g, \"kld_max\": %.6g, \"same_top\": %.6f}\n",
                n, nll / static_cast<double>(n), mean / static_cast<double>(n), pct(0.5), pct(0.99), pct(0.999),
                sorted[n - 1], static_cast<double>(same) / static_cast<double>(n));
    if (!rows_path) return;
    FILE* f = std::fopen(rows_path, "w");
    if (!f) die(std::string("cannot write ") + rows_path);
    for (size_t r = 0; r < n; ++r) std::fprintf(f, "%zu %.6g %d %d\n", r, kld[r], top_base[r], top_other[r]);
    std::fclose(f);
  }
};

int compare(const char* base_path, const char* other_path, const char* rows_path) {
  const SavedLogits base = read_saved(base_path), other = read_saved(other_path);
  if (base.n_vocab != other.n_vocab || base.n_rows() != other.n_rows() || base.tokens != other.tokens) {
    die("the two files score different tokens or vocabularies");
  }
  KldStats st;
  for (size_t r = 0; r < base.n_rows(); ++r) {
    const uint16_t* o = other.row(r);
    st.add(base, base.row(r), base.n_vocab, [&](int i) { return other.log_p(o, i); });
  }
  st.print(rows_path);
  return 0;
}

// A new base-logits file with `base`'s header and tokens, for this run's rows.
FILE* open_saved(const char* path, const SavedLogits& base) {
  FILE* out = std::fopen(path, "wb");
  if (!out) die(std::string("cannot write ") + path);
  std::fwrite("_logits_", 1, 8, out);
  std::fwrite(&base.n_ctx, 4, 1, out);
  std::fwrite(&base.n_vocab, 4, 1, out);
  std::fwrite(&base.n_chunk, 4, 1, out);
  std::fwrite(base.tokens.data(), 4, base.tokens.size(), out);
  return out;
}

// LLAMA_KLD_ROUTES: the graph callback keeps each layer's expert ranking (ffn_moe_argsort-<il>,
// n_expert x n_tokens of the micro-batch) and writes its first k per token.
struct RouteDump {
  FILE* out = nullptr;
  int chunk = 0, k = 0;
  int first_scored = 0, n_scored = 0;  // the rows with logits: first_scored .. + n_scored - 1
  std::vector<int> seen;  // tokens written per layer in this chunk (micro-batches arrive in order)
  std::vector<float> probs;  // the layer's router probabilities (ffn_moe_probs-<il>), computed before the ranking
};
RouteDump g_routes;

bool dump_routes(struct ggml_tensor* t, bool ask, void*) {
  static const char kName[] = "ffn_moe_argsort-", kProbs[] = "ffn_moe_probs-";
  const bool is_probs = std::strncmp(t->name, kProbs, sizeof(kProbs) - 1) == 0;
  if (!is_probs && std::strncmp(t->name, kName, sizeof(kName) - 1) != 0) return false;
  if (ask) return true;
  if (is_probs) {
    if (t->type != GGML_TYPE_F32) die("router probabilities are not f32");
    g_routes.probs.resize(static_cast<size_t>(ggml_nelements(t)));
    ggml_backend_tensor_get(t, g_routes.probs.data(), 0, g_routes.probs.size() * sizeof(float));
    return true;
  }
  const int layer = std::atoi(t->name + sizeof(kName) - 1);
  if (static_cast<int>(g_routes.seen.size()) <= layer) g_routes.seen.resize(layer + 1, 0);
  const int64_t n_expert = t->ne[0], n_tokens = t->ne[1];
  std::vector<int32_t> order(static_cast<size_t>(n_expert * n_tokens));
  ggml_backend_tensor_get(t, order.data(), 0, order.size() * sizeof(int32_t));
  for (int64_t j = 0; j < n_tokens; ++j) {
    // The last layer runs only the rows whose logits are asked for (the scored half).
    if (g_routes.seen[layer] == 0 && n_tokens == g_routes.n_scored) g_routes.seen[layer] = g_routes.first_scored;
    std::fprintf(g_routes.out, "%d %d %d", g_routes.chunk, layer, g_routes.seen[layer]++);
    const int32_t* rank = order.data() + j * n_expert;
    for (int e = 0; e < g_routes.k; ++e) std::fprintf(g_routes.out, " %d", rank[e]);
    const bool have_probs = g_routes.probs.size() == order.size() && g_routes.k < n_expert;
    const float* p = g_routes.probs.data() + j * n_expert;
    std::fprintf(g_routes.out, " %.6g\n", have_probs ? p[rank[g_routes.k - 1]] - p[rank[g_routes.k]] : -1.0f);
  }
  return true;
}

// The router's k, from the GGUF's "<arch>.expert_used_count".
int experts_used(const llama_model* model) {
  char arch[64], value[32];
  if (llama_model_meta_val_str(model, "general.architecture", arch, sizeof(arch)) < 0) die("no general.architecture");
  const std::string key = std::string(arch) + ".expert_used_count";
  if (llama_model_meta_val_str(model, key.c_str(), value, sizeof(value)) < 0) die("not a MoE model (no " + key + ")");
  return std::atoi(value);
}

llama_context* open_context(llama_model* model, uint32_t n_ctx, int ubatch, int threads) {
  llama_context_params cp = llama_context_default_params();
  cp.n_ctx = n_ctx;
  cp.n_batch = n_ctx;
  cp.n_ubatch = static_cast<uint32_t>(ubatch);
  cp.n_seq_max = 1;
  cp.n_threads = cp.n_threads_batch = threads;
  cp.type_k = cp.type_v = GGML_TYPE_F16;
  cp.flash_attn_type = LLAMA_FLASH_ATTN_TYPE_AUTO;  // llama-perplexity's defaults
  if (const char* path = std::getenv("LLAMA_KLD_ROUTES")) {
    g_routes.out = std::fopen(path, "w");
    if (!g_routes.out) die(std::string("cannot write ") + path);
    g_routes.k = experts_used(model);
    cp.cb_eval = dump_routes;
    cp.cb_eval_user_data = nullptr;
  }
  llama_context* ctx = llama_init_from_model(model, cp);
  if (!ctx) die("cannot create a context");
  return ctx;
}

int eval(char** argv, const char* rows_path) {
  const SavedLogits base = read_saved(argv[3]);
  llama_backend_init();
  const char* dir = std::getenv("LLAMA_BACKEND_DIR");
  if (!dir) die("LLAMA_BACKEND_DIR must name a folder with one libggml-cpu-*.so");
  ggml_backend_load_all_from_path(dir);
  llama_log_set([](ggml_log_level, const char*, void*) {}, nullptr);
  llama_model* model = llama_model_load_from_file(argv[2], llama_model_default_params());
  if (!model) die(std::string("cannot load ") + argv[2]);
  const int n_vocab = llama_vocab_n_tokens(llama_model_get_vocab(model));
  if (n_vocab != base.n_vocab) die("the model's vocabulary differs from the base file's");
  llama_context* ctx = open_context(model, base.n_ctx, std::atoi(argv[4]), std::atoi(argv[5]));
  FILE* out = open_saved(argv[6], base);
  const int n_ctx = static_cast<int>(base.n_ctx), first = n_ctx / 2;
  g_routes.first_scored = first;
  g_routes.n_scored = n_ctx - 1 - first;
  std::vector<uint16_t> saved(row_words(n_vocab));
  std::vector<float> log_q(n_vocab);
  KldStats st;
  size_t r = 0;
  for (int c = 0; c < base.n_chunk; ++c) {
    llama_memory_clear(llama_get_memory(ctx), true);
    g_routes.chunk = c;
    g_routes.seen.assign(g_routes.seen.size(), 0);
    llama_batch b = llama_batch_init(n_ctx, 0, 1);
    for (int i = 0; i < n_ctx; ++i) {
      b.token[i] = base.tokens[static_cast<size_t>(c) * n_ctx + i];
      b.pos[i] = i;
      b.n_seq_id[i] = 1;
      b.seq_id[i][0] = 0;
      b.logits[i] = i >= first && i < n_ctx - 1;
    }
    b.n_tokens = n_ctx;
    if (llama_decode(ctx, b) != 0) die("llama_decode failed");
    for (int j = first; j < n_ctx - 1; ++j, ++r) {
      const float* logits = llama_get_logits_ith(ctx, j);
      const float top = *std::max_element(logits, logits + n_vocab);
      double sum_exp = 0;
      for (int i = 0; i < n_vocab; ++i) sum_exp += std::exp(logits[i] - top);
      const float norm = top + static_cast<float>(std::log(sum_exp));
      for (int i = 0; i < n_vocab; ++i) log_q[i] = logits[i] - norm;
      st.nll -= log_q[b.token[j + 1]];
      st.add(base, base.row(r), n_vocab, [&](int i) { return log_q[i]; });
      quantize_row(logits, n_vocab, saved.data());
      std::fwrite(saved.data(), 2, saved.size(), out);
    }
    llama_batch_free(b);
  }
  if (std::fclose(out) != 0) die(std::string("writing ") + argv[6] + " failed");
  if (g_routes.out) std::fclose(g_routes.out);
  st.print(rows_path);
  llama_free(ctx);
  llama_model_free(model);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc >= 4 && std::strcmp(argv[1], "compare") == 0) return compare(argv[2], argv[3], argc > 4 ? argv[4] : nullptr);
  if (argc >= 7 && std::strcmp(argv[1], "eval") == 0) return eval(argv, argc > 7 ? argv[7] : nullptr);
  std::fprintf(stderr, "usage: llama_kld eval MODEL BASE UBATCH THREADS OUT [ROWS] | compare BASE OTHER [ROWS]\n");
  return 2;
}
