// bmoe-cli: run a MoE GGUF model from the command line (llama.cpp-style flags).
#include <CLI/CLI.hpp>
#include <fmt/format.h>
#include <unistd.h>

#include <csignal>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <sstream>
#include <thread>

#include "core/cpu_features.h"
#include "core/error.h"
#include "core/timer.h"
#include "engine/loader.h"
#include "engine/session.h"
#include "model/arch.h"
#include "text/chat.h"
#include "text/utf8.h"

using namespace bmoe;

namespace {

struct CliOptions {
  std::string model;
  std::string prompt;
  std::string prompt_file;
  std::string system;
  int n_predict = 128;
  int threads = 0;
  int ctx_size = 4096;
  int batch_size = 512;
  uint64_t seed = 0xB30E;
  float temperature = 0.0f;
  int top_k = 40;
  float top_p = 0.95f;
  bool chatml = false;
  bool chat = false;
  bool no_think = false;
  bool ignore_eos = false;
  bool json = false;
  bool tokenize_only = false;
  bool show_special = false;
  bool list_archs = false;
  int n_expert_used = 0;
  std::string dump_logits;
  std::string kv_type = "f16";
  std::string prompt_ids;
};

void add_flags(CLI::App& app, CliOptions& o) {
  app.add_option("-m,--model", o.model, "GGUF model file (first shard of a split model)");
  app.add_option("-p,--prompt", o.prompt, "prompt text");
  app.add_option("-f,--file", o.prompt_file, "read the prompt from a file");
  app.add_option("-n,--n-predict", o.n_predict, "tokens to generate (-1: until end of text or context)")->capture_default_str();
  app.add_option("-t,--threads", o.threads, "compute threads (default: all cores)");
  app.add_option("-c,--ctx-size", o.ctx_size, "context size in tokens")->capture_default_str()->check(CLI::Range(16, 1 << 20));
  app.add_option("-b,--batch-size", o.batch_size, "prompt tokens evaluated per batch")->capture_default_str()->check(CLI::Range(1, 8192));
  app.add_option("-s,--seed", o.seed, "sampling seed")->capture_default_str();
  app.add_option("--temp", o.temperature, "temperature (0 = greedy)")->capture_default_str()->check(CLI::Range(0.0, 100.0));
  app.add_option("--top-k", o.top_k, "top-k sampling (0 = off)")->capture_default_str()->check(CLI::Range(0, 1 << 24));
  app.add_option("--top-p", o.top_p, "top-p (nucleus) sampling (1 = off)")->capture_default_str()->check(CLI::Range(0.0, 1.0));
  app.add_flag("--chatml", o.chatml, "wrap the prompt in the ChatML template (<|im_start|>user ...)");
  app.add_flag("--chat", o.chat, "wrap the prompt in the model's own chat format (ChatML, harmony, Gemma)");
  app.add_option("--system", o.system, "system message for --chat/--chatml");
  app.add_flag("--no-think", o.no_think,
               "answer without reasoning: Qwen3 gets an empty think block; gpt-oss is primed into its final "
               "channel (faster, but costs quality on multi-step tasks such as arithmetic)");
  app.add_flag("--ignore-eos", o.ignore_eos, "keep generating past end-of-text tokens");
  app.add_flag("--special", o.show_special, "print special/control tokens in the output");
  app.add_flag("--json", o.json, "print a JSON result (prompt ids, generated ids, text) instead of streaming text");
  app.add_flag("--tokenize", o.tokenize_only, "print the prompt's token ids as JSON and exit");
  app.add_option("--n-expert-used", o.n_expert_used, "override the model's top-k experts per token (lossy)")->check(CLI::Range(1, 1024));
  app.add_option("--prompt-ids", o.prompt_ids, "the prompt as comma-separated token ids (instead of -p)");
  app.add_option("--kv-type", o.kv_type, "KV cache element type: f16 or f32")->capture_default_str()->check(CLI::IsMember({"f16", "f32"}));
  app.add_option("--dump-logits", o.dump_logits, "write the logits after the prompt (f32, binary) to a file");
  app.add_flag("--list-archs", o.list_archs, "list the architectures compiled in and exit");
}

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) fail("cannot read prompt file {}", path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

std::string json_ids(const std::vector<int32_t>& ids) {
  std::string s = "[";
  for (size_t i = 0; i < ids.size(); ++i) s += (i ? "," : "") + std::to_string(ids[i]);
  return s + "]";
}

std::string json_string(const std::string& text) {
  std::string out = "\"";
  for (unsigned char c : utf8_sanitize(text)) {
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\r': out += "\\r"; break;
      case '\t': out += "\\t"; break;
      default:
        if (c < 0x20) out += fmt::format("\\u{:04x}", c);
        else out += static_cast<char>(c);
    }
  }
  return out + "\"";
}

int run(const CliOptions& o) {
  if (o.list_archs) {
    for (const Architecture& a : architectures()) fmt::print("{:<10} {}\n", a.name, a.description);
    return 0;
  }
  if (o.model.empty()) fail("no model given (-m FILE)");
  std::string prompt = o.prompt;
  if (!o.prompt_file.empty()) prompt = read_file(o.prompt_file);

  const int threads = o.threads > 0 ? o.threads : static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  Stopwatch load_timer;
  LoadOptions load;
  load.n_expert_used = o.n_expert_used;
  auto model = load_model(o.model, load);
  const ModelConfig& cfg = model->transformer->config();
  fmt::print(stderr, "load: {} ({}), {} layers, {} experts top-{}, {} threads, isa {}, {:.2f} s\n", o.model, cfg.arch,
             cfg.n_layer, cfg.n_expert, cfg.n_expert_used, threads, active_isa_name(), load_timer.seconds());

  if (o.chatml || o.chat) {
    const ChatFormat format = o.chatml ? ChatFormat::ChatML
                                       : detect_chat_format(cfg.arch, model->tokenizer->vocab().chat_template);
    std::vector<ChatMessage> messages;
    if (!o.system.empty()) messages.push_back({"system", o.system});
    messages.push_back({"user", prompt});
    prompt = render_chat(format, messages, o.no_think);
  }

  ThreadPool pool(threads);
  SamplerConfig sampler{o.temperature, o.top_k, o.top_p, o.seed};
  Session session(*model, pool, o.ctx_size, o.batch_size, sampler, o.kv_type == "f32" ? KvType::F32 : KvType::F16);
  std::vector<int32_t> prompt_ids;
  if (!o.prompt_ids.empty()) {
    std::stringstream ss(o.prompt_ids);
    for (std::string item; std::getline(ss, item, ',');) {
      try {
        size_t used = 0;
        const long id = std::stol(item, &used);
        if (used != item.size() || id < 0 || id >= model->tokenizer->vocab_size()) throw std::invalid_argument(item);
        prompt_ids.push_back(static_cast<int32_t>(id));
      } catch (const std::exception&) {
        fail("--prompt-ids: '{}' is not a token id of this model", item);
      }
    }
  } else {
    prompt_ids = session.tokenize(prompt, true);
  }
  if (o.tokenize_only) {
    fmt::print("{}\n", json_ids(prompt_ids));
    return 0;
  }
  if (static_cast<int>(prompt_ids.size()) >= o.ctx_size) {
    fail("the prompt has {} tokens, more than the context of {} (raise -c)", prompt_ids.size(), o.ctx_size);
  }

  const PrefillRecord pre = session.prefill(prompt_ids);
  fmt::print(stderr, "prompt: {} tokens, {:.3f} s, {:.2f} tok/s\n", pre.tokens, pre.seconds, pre.tokens / std::max(pre.seconds, 1e-9));

  if (!o.dump_logits.empty()) {
    std::ofstream dump(o.dump_logits, std::ios::binary);
    dump.write(reinterpret_cast<const char*>(session.logits().data()),
               static_cast<std::streamsize>(cfg.n_vocab * sizeof(float)));
    if (!dump) fail("cannot write {}", o.dump_logits);
  }
  std::vector<int32_t> generated;
  Utf8Stream out;
  const int limit = o.n_predict < 0 ? o.ctx_size - static_cast<int>(prompt_ids.size()) : o.n_predict;
  double decode_seconds = 0.0;
  for (int i = 0; i < limit; ++i) {
    const int32_t token = session.sample();
    if (!o.ignore_eos && model->tokenizer->is_end_of_generation(token)) break;
    generated.push_back(token);
    if (!o.json) {
      const std::string text = out.push(model->tokenizer->token_bytes(token, o.show_special));
      if (!text.empty()) {
        std::fwrite(text.data(), 1, text.size(), stdout);
        std::fflush(stdout);
      }
    }
    if (session.state().n_past() >= o.ctx_size) break;
    if (i + 1 < limit) decode_seconds += session.accept(token).wall_ms / 1e3;
  }
  if (o.json) {
    fmt::print("{{\"prompt\":{},\"tokens\":{},\"text\":{}}}\n", json_ids(prompt_ids), json_ids(generated),
               json_string(model->tokenizer->decode(generated, o.show_special)));
  } else {
    const std::string tail = out.flush();
    std::fwrite(tail.data(), 1, tail.size(), stdout);
    std::fputc('\n', stdout);
  }
  const size_t n_decoded = session.records().size();
  const double per_token = n_decoded ? decode_seconds / static_cast<double>(n_decoded) : 0.0;
  fmt::print(stderr, "generation: {} tokens, {:.4f} s/token, {:.2f} tok/s\n", n_decoded, per_token,
             per_token > 0 ? 1.0 / per_token : 0.0);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"bmoe-cli: run Mixture-of-Experts GGUF models, streaming experts from flash"};
  CliOptions options;
  add_flags(app, options);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    if (e.get_exit_code() == 0) return app.exit(e);
    fmt::print(stderr, "error: {}\n", e.what());
    return 2;
  }
  try {
    return run(options);
  } catch (const Error& e) {
    fmt::print(stderr, "error: {}\n", e.what());
    return 1;
  } catch (const std::exception& e) {
    fmt::print(stderr, "error: {}\n", e.what());
    return 1;
  }
}
