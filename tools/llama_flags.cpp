#include "llama_flags.h"

#include <fmt/format.h>

#include <algorithm>
#include <cctype>

namespace bmoe {
namespace {

bool is_on_off(const std::string& s) {
  return s == "on" || s == "off" || s == "auto" || s == "1" || s == "0" || s == "true" || s == "false";
}

// A single-dash word of two or more letters: what CLI11 would split into bundled short flags.
bool looks_bundled(const std::string& a) {
  return a.size() > 2 && a[0] == '-' && a[1] != '-' && std::isalpha(static_cast<unsigned char>(a[1])) &&
         a.find('=') == std::string::npos;
}

// Whether `a` names one of the app's options that takes a value (so the next word is a value).
bool takes_value(const CLI::App& app, const std::string& a) {
  if (a.size() < 2 || a[0] != '-' || a.find('=') != std::string::npos) return false;
  const CLI::Option* opt = app.get_option_no_throw(a);
  return opt != nullptr && opt->get_items_expected_min() > 0;
}

// llama.cpp flags that are bmoe flags under another name; each takes a value.
struct RenamedFlag {
  const char* llama;
  const char* bmoe;
};
constexpr RenamedFlag kRenamedFlags[] = {
    {"-sys", "--system"}, {"--system-prompt", "--system"}, {"-hf", "--hf-repo"},
    {"-hfr", "--hf-repo"}, {"-np", "--parallel"},          {"-hff", "--hf-file"},
};

const char* bmoe_name_of(const std::string& a) {
  for (const RenamedFlag& r : kRenamedFlags) {
    if (a == r.llama) return r.bmoe;
  }
  return nullptr;
}

// -ctk / -ctv TYPE: bmoe keeps keys and values in one type, f16 or f32 (--kv-type), so both
// must name the same one. Returns false where the translation stops (t.error says why, or the
// value was missing).
bool translate_kv_type(const std::string& a, const std::string& type, std::string& kv_type, TranslatedArgs& t) {
  if (type.empty()) return false;
  if (type != "f16" && type != "f32") {
    t.error = fmt::format("{} {}: bmoe's KV cache holds f16 or f32 (--kv-type f16|f32), not quantized types", a, type);
    return false;
  }
  if (!kv_type.empty() && kv_type != type) {
    t.error = "-ctk and -ctv must name the same type: bmoe keeps keys and values in one type (--kv-type)";
    return false;
  }
  if (kv_type.empty()) t.args.insert(t.args.end(), {"--kv-type", type});
  kv_type = type;
  return true;
}

}  // namespace

TranslatedArgs translate_llama_flags(const CLI::App& app, int argc, const char* const* argv) {
  TranslatedArgs t;
  std::string kv_type;  // from -ctk / -ctv, which must agree
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    const auto next = [&]() -> std::string {
      if (i + 1 >= argc) {
        t.error = fmt::format("{} needs a value", a);
        return {};
      }
      return argv[++i];
    };
    if (!t.args.empty() && takes_value(app, t.args.back())) {
      t.args.push_back(a);  // a value, whatever it looks like
    } else if (a == "-fa" || a == "--flash-attn") {
      if (i + 1 < argc && is_on_off(argv[i + 1])) ++i;
      t.notes.push_back(fmt::format("note: {} ignored: bmoe's CPU attention has a single path (no flash-attention switch)", a));
    } else if (a == "-ngl" || a == "--n-gpu-layers" || a == "--gpu-layers") {
      const std::string n = next();
      if (!n.empty() && n != "0") t.notes.push_back(fmt::format("note: {} {} ignored: bmoe runs on the CPU only", a, n));
    } else if (const char* renamed = bmoe_name_of(a)) {
      const std::string value = next();
      t.args.insert(t.args.end(), {renamed, value});
    } else if (a == "-cnv" || a == "--conversation") {
      t.args.push_back("-i");
    } else if (a == "-no-cnv" || a == "--no-conversation") {
      // bmoe-cli runs one prompt unless asked for -i: nothing to switch off.
    } else if (a == "--color") {
      t.notes.push_back("note: --color ignored: bmoe prints plain text");
    } else if (a == "-ctk" || a == "--cache-type-k" || a == "-ctv" || a == "--cache-type-v") {
      if (!translate_kv_type(a, next(), kv_type, t)) break;
    } else if (a == "-r" || a == "--reverse-prompt") {
      t.error = fmt::format("{}: bmoe has no reverse prompt; in -i chat each answer ends at the model's end-of-turn token", a);
      break;
    } else if (looks_bundled(a) && app.get_option_no_throw(a) == nullptr) {
      t.error = fmt::format("unknown option {} (bmoe does not bundle short flags; see --help)", a);
      break;
    } else {
      t.args.push_back(a);
    }
    if (!t.error.empty()) break;
  }
  return t;
}

std::optional<int> parse_command_line(CLI::App& app, int argc, const char* const* argv) {
  try {
    const TranslatedArgs translated = translate_llama_flags(app, argc, argv);
    if (!translated.error.empty()) {
      fmt::print(stderr, "error: {}\n", translated.error);
      return 2;
    }
    for (const std::string& note : translated.notes) fmt::print(stderr, "{}\n", note);
    std::vector<std::string> reversed(translated.args.rbegin(), translated.args.rend());  // CLI11 wants them so
    app.parse(reversed);
  } catch (const CLI::ParseError& e) {
    if (e.get_exit_code() == 0) return app.exit(e);
    fmt::print(stderr, "error: {}\n", e.what());
    return 2;
  }
  return std::nullopt;
}

}  // namespace bmoe
