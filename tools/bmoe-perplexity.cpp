// bmoe-perplexity: a model's perplexity on a text, as llama-perplexity computes and prints it
// (engine/perplexity.h holds the method), resident or streamed, so a lossy knob
// (--n-expert-used, --drop-cold-experts, a quantization) can be weighed against what it saves.
//   bmoe-perplexity -m MODEL -f TEXT [-c 512] [--chunks N] [run flags]
#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include "core/error.h"
#include "core/thread_pool.h"
#include "core/timer.h"
#include "core/version.h"
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

int run(const PerplexityCli& o) {
  const std::string text = read_whole_file(o.text_file, "text file");
  LoadedRun loaded = load_run(run_config(o.run));
  ThreadPool pool(loaded.config.thread_count());
  const std::unique_ptr<Session> session = open_session(loaded, pool);
  const Tokenizer& tok = *loaded.model->tokenizer;
  const std::vector<int32_t> tokens = tok.encode(text, true, tok.vocab().add_bos);
  PerplexityOptions p;
  p.n_ctx = loaded.config.ctx_size;
  p.n_batch = std::min(loaded.config.batch(), p.n_ctx);
  p.max_chunks = o.chunks;
  p.bos = tok.vocab().add_bos ? tok.vocab().bos : -1;
  const int chunks = std::min<int>(static_cast<int>(tokens.size() / static_cast<size_t>(p.n_ctx)),
                                   o.chunks < 0 ? INT32_MAX : o.chunks);
  fmt::print(stderr, "perplexity: {} tokens; calculating perplexity over {} chunks, n_ctx={}, batch_size={}\n",
             tokens.size(), chunks, p.n_ctx, p.n_batch);
  Stopwatch clock;
  const PerplexityResult r = perplexity(*session, tokens, p, [](const PerplexityResult& so_far) {
    fmt::print("[{}]{:.4f},", so_far.chunks, so_far.running_ppl.back());
    std::fflush(stdout);
  });
  fmt::print("\n");
  fmt::print("Final estimate: PPL = {:.4f} +/- {:.5f}\n", r.ppl(), r.ppl_error());
  print_expert_telemetry(loaded, static_cast<int64_t>(r.chunks) * p.n_ctx, clock.seconds());
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"bmoe-perplexity: perplexity of a MoE GGUF model on a text (llama-perplexity's method)"};
  app.set_version_flag("--version", version_text());
  PerplexityCli o;
  o.run.config.ctx_size = 512;  // llama-perplexity's customary chunk (-c)
  add_run_flags(app, o.run);
  app.add_option("-f,--file", o.text_file, "the text to score")->required();
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
