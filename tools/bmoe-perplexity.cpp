// bmoe-perplexity: a model's perplexity on a text, as llama-perplexity computes and prints it
// (engine/perplexity.h holds the method), resident or streamed, so a lossy knob
// (--n-expert-used, --drop-cold-experts, a quantization) can be weighed against what it saves.
//   bmoe-perplexity -m MODEL -f TEXT [-c 512] [--chunks N] [run flags]
//   bmoe-perplexity -m BASE -f TEXT --kl-divergence-base LOGITS    saves the base model's logits
//   bmoe-perplexity -m MODEL --kl-divergence-base LOGITS --kl-divergence   KL divergence against them
#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include "core/error.h"
#include "core/thread_pool.h"
#include "core/timer.h"
#include "core/version.h"
#include "engine/kl_divergence.h"
#include "engine/perplexity.h"
#include "engine/run.h"
#include "io/mapped_file.h"
#include "llama_flags.h"
#include "run_options.h"

using namespace bmoe;

namespace {

struct PerplexityCli {
  RunOptions run;
  std::string text_file;
  int chunks = -1;
  std::string kl_base;  // --kl-divergence-base
  bool kl = false;      // --kl-divergence
};

// What the expert source did over the whole run: what streaming cost per scored token.
void print_expert_telemetry(const LoadedRun& loaded, int64_t tokens_evaluated, double seconds) {
  const ExpertStats s = loaded.model->experts->stats();
  constexpr double kMiB = 1024.0 * 1024.0;
  fmt::print(stderr, "experts: {} lookups, {:.1f} % hits, {:.1f} MiB read ({:.3f} MiB per token), stall {:.2f} s; "
                     "{} tokens evaluated in {:.2f} s ({:.1f} tok/s)\n",
             s.requests, s.requests ? 100.0 * static_cast<double>(s.hits) / static_cast<double>(s.requests) : 0.0,
             static_cast<double>(s.bytes_read) / kMiB,
             tokens_evaluated ? static_cast<double>(s.bytes_read) / kMiB / static_cast<double>(tokens_evaluated) : 0.0,
             s.stall_seconds, tokens_evaluated, seconds, static_cast<double>(tokens_evaluated) / std::max(seconds, 1e-9));
}

// The perplexity options of a loaded run (-c, the batch, --chunks, BOS).
PerplexityOptions perplexity_options(const PerplexityCli& o, const LoadedRun& loaded) {
  const Tokenizer& tok = *loaded.model->tokenizer;
  PerplexityOptions p;
  p.n_ctx = loaded.config.ctx_size;
  p.n_batch = std::min(loaded.config.batch(), p.n_ctx);
  p.max_chunks = o.chunks;
  p.bos = tok.vocab().add_bos ? tok.vocab().bos : -1;
  return p;
}

// Perplexity of -f's text; with --kl-divergence-base, the scored rows are saved there.
int score_text(const PerplexityCli& o) {
  const std::string text = read_whole_file(o.text_file, "text file");
  LoadedRun loaded = load_run(run_config(o.run));
  ThreadPool pool(loaded.config.thread_count());
  const std::unique_ptr<Session> session = open_session(loaded, pool);
  const Tokenizer& tok = *loaded.model->tokenizer;
  const std::vector<int32_t> tokens = tok.encode(text, true, tok.vocab().add_bos);
  PerplexityOptions p = perplexity_options(o, loaded);
  const int available = static_cast<int>(tokens.size() / static_cast<size_t>(p.n_ctx));
  const int chunks = o.chunks < 0 ? available : std::min(o.chunks, available);
  std::unique_ptr<BaseLogitsWriter> base;
  if (!o.kl_base.empty() && chunks >= 2) {
    base = std::make_unique<BaseLogitsWriter>(o.kl_base, p.n_ctx, tok.vocab_size(), chunks, tokens);
    p.on_row = [&base](const float* logits, int32_t) { base->add_row(logits); };
  }
  fmt::print(stderr, "perplexity: {} tokens; calculating perplexity over {} chunks, n_ctx={}, batch_size={}\n",
             tokens.size(), chunks, p.n_ctx, p.n_batch);
  Stopwatch clock;
  const PerplexityResult r = perplexity(*session, tokens, p, [](const PerplexityResult& so_far) {
    fmt::print("[{}]{:.4f},", so_far.chunks, so_far.running_ppl.back());
    std::fflush(stdout);
  });
  fmt::print("\n");
  fmt::print("Final estimate: PPL = {:.4f} +/- {:.5f}\n", r.ppl(), r.ppl_error());
  if (base) {
    base->finish();
    fmt::print(stderr, "perplexity: saved the scored logits to {}\n", o.kl_base);
  }
  print_expert_telemetry(loaded, static_cast<int64_t>(r.chunks) * p.n_ctx, clock.seconds());
  return 0;
}

// --kl-divergence: the saved base's tokens scored again, each row compared with the base's.
int kl_divergence(PerplexityCli o) {
  BaseLogitsReader base(o.kl_base);
  o.run.config.ctx_size = std::max(o.run.config.ctx_size, base.n_ctx());
  LoadedRun loaded = load_run(run_config(o.run));
  const int n_vocab = loaded.model->transformer->config().n_vocab;
  if (base.n_vocab() != n_vocab) fail("{} was saved with a vocabulary of {} tokens; this model has {}", o.kl_base, base.n_vocab(), n_vocab);
  ThreadPool pool(loaded.config.thread_count());
  const std::unique_ptr<Session> session = open_session(loaded, pool);
  PerplexityOptions p = perplexity_options(o, loaded);
  p.n_ctx = base.n_ctx();
  p.n_batch = std::min(loaded.config.batch(), p.n_ctx);
  KlDivergence kl;
  p.on_row = [&](const float* logits, int32_t next) { kl.add(logits, n_vocab, base.next_row(), next); };
  fmt::print(stderr, "kl-divergence: computing over {} chunks, n_ctx={}, batch_size={}\n", base.n_chunk(), p.n_ctx, p.n_batch);
  fmt::print("chunk             PPL               ln(PPL(Q)/PPL(base))          KL Divergence              Δp RMS            Same top p\n");
  Stopwatch clock;
  const PerplexityResult r = perplexity(*session, base.tokens(), p, [&kl](const PerplexityResult& so_far) {
    fmt::print("{}", kl.chunk_line(so_far.chunks));
    std::fflush(stdout);
  });
  fmt::print("\n{}", kl.summary());
  print_expert_telemetry(loaded, static_cast<int64_t>(r.chunks) * p.n_ctx, clock.seconds());
  return 0;
}

int run(const PerplexityCli& o) {
  if (o.kl && o.kl_base.empty()) fail("--kl-divergence needs --kl-divergence-base FILE (the saved base logits)");
  if (o.kl) return kl_divergence(o);
  if (o.text_file.empty()) fail("-f TEXT is required (the text to score)");
  return score_text(o);
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"bmoe-perplexity: perplexity of a MoE GGUF model on a text (llama-perplexity's method)"};
  app.set_version_flag("--version", version_text());
  PerplexityCli o;
  o.run.config.ctx_size = 512;  // llama-perplexity's customary chunk (-c)
  add_run_flags(app, o.run);
  app.add_option("-f,--file", o.text_file, "the text to score (not with --kl-divergence: the base file holds the tokens)");
  app.add_option("--kl-divergence-base", o.kl_base, "file of saved base logits: written by a plain run, read with --kl-divergence");
  app.add_flag("--kl-divergence", o.kl, "KL divergence of this model against --kl-divergence-base's logits");
  app.add_option("--chunks", o.chunks, "score at most this many chunks of -c tokens (default: all)")
      ->check(CLI::Range(1, INT32_MAX));
  if (const std::optional<int> status = parse_command_line(app, argc, argv)) return *status;
  try {
    return run(o);
  } catch (const std::exception& e) {
    fmt::print(stderr, "error: {}\n", e.what());
    return 1;
  }
}
