#define PCRE2_CODE_UNIT_WIDTH 8
#include "text/tokenizer.h"

#include <fmt/format.h>
#include <pcre2.h>

#include <algorithm>
#include <climits>
#include <initializer_list>
#include <queue>
#include <string_view>

#include "core/error.h"
#include "text/utf8.h"

namespace bmoe {

// ------------------------------------------------------------------ pre-tokenizers and models

namespace {

// The patterns as the models' tokenizer.json files define them.
constexpr std::string_view kGpt2 =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S))";
constexpr std::string_view kQwen2 =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
// Qwen3.5: as Qwen2, with combining marks (\p{M}) joining letter runs instead of punctuation.
constexpr std::string_view kQwen35 =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
constexpr std::string_view kLlama3 =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
constexpr std::string_view kGpt4o =
    R"([^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
// Ling (llama.cpp's bailingmoe split, without the file's possessive quantifiers, as llama.cpp
// runs it): Qwen2's with its contractions spelled out and `\s*[\r\n]` closing a whitespace run
// at its last newline (the same splits as Qwen2's `\s*[\r\n]+` once \s* backtracks).
constexpr std::string_view kBailing =
    R"('(?:[sSdDmMtT]|[lL][lL]|[vV][eE]|[rR][eE])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]|\s+(?!\S)|\s+)";
// SPM-style BPE merges whole lines; only newlines split the text.
constexpr std::string_view kLines = R"([^\n]+|[\n]+)";
// DeepSeek-V3 (and V4, which keeps its tokenizer): three splits in turn, as its tokenizer.json's
// Split sequence and llama.cpp's deepseek-v3 type hold them: runs of up to three digits, runs of
// CJK ideographs and kana, then words (a punctuation mark may lead an ASCII word), punctuation
// and whitespace.
constexpr std::string_view kDeepseek3Digits = R"(\p{N}{1,3})";
constexpr std::string_view kDeepseek3Cjk = "[\u4E00-\u9FA5\u3040-\u309F\u30A0-\u30FF]+";
constexpr std::string_view kDeepseek3Words =
    R"([!"#$%&'()*+,\-./:;<=>?@\[\\\]^_`{|}~][A-Za-z]+|[^\r\n\p{L}\p{P}\p{S}]?[\p{L}\p{M}]+| ?[\p{P}\p{S}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";

// A pre-tokenizer as a file names it (tokenizer.ggml.pre): its split patterns (applied in turn,
// each to the pieces the one before left; unused slots empty), and whether a
// pre-token that is itself a token is taken whole, without merges (llama.cpp's llama3-style
// vocabularies, which also add BOS unless the file says otherwise).
struct PreTokenizerKind {
  std::string_view name;
  std::string_view regexes[3];
  bool ignores_merges;
};

constexpr PreTokenizerKind kPreTokenizers[] = {
    {"qwen2", {kQwen2}, false},   {"deepseek-r1-qwen", {kQwen2}, false}, {"qwen35", {kQwen35}, false},
    {"llama3", {kLlama3}, true},  {"llama-bpe", {kLlama3}, true},        {"smaug-bpe", {kLlama3}, false},
    {"lfm2", {kLlama3}, true},    {"gpt-4o", {kGpt4o}, false},           {"default", {kGpt2}, false},
    {"gpt2", {kGpt2}, false},     {"olmo", {kGpt2}, false},              {"mpt", {kGpt2}, false},
    {"gemma4", {kLines}, false},
    {"glm4", {kLlama3}, false},   {"chatglm-bpe", {kLlama3}, false},
    {"bailingmoe", {kBailing}, false}, {"bailingmoe2", {kBailing}, false}, {"llada-moe", {kBailing}, false},
    {"deepseek-v3", {kDeepseek3Digits, kDeepseek3Cjk, kDeepseek3Words}, false},
};

const PreTokenizerKind* pre_tokenizer_kind(std::string_view pre) {
  for (const PreTokenizerKind& kind : kPreTokenizers) {
    if (kind.name == pre) return &kind;
  }
  return nullptr;
}

bool ignores_merges(const std::string& pre) {
  const PreTokenizerKind* kind = pre_tokenizer_kind(pre);
  return kind && kind->ignores_merges;
}

// A tokenizer model as a file names it (tokenizer.ggml.model).
struct TokenizerModelKind {
  std::string_view name;
  bool spm_style;                // raw UTF-8, spaces as U+2581, <0xXX> byte tokens (else GPT-2 bytes)
  std::string_view implied_pre;  // the pre-tokenizer the model implies ("": the file's)
  bool forces_bos;               // BOS whatever the file says (as llama.cpp does for Gemma 4)
};

constexpr TokenizerModelKind kTokenizerModels[] = {
    {"gpt2", false, "", false},
    {"gemma4", true, "gemma4", true},
};

const TokenizerModelKind* tokenizer_model_kind(std::string_view model) {
  for (const TokenizerModelKind& kind : kTokenizerModels) {
    if (kind.name == model) return &kind;
  }
  return nullptr;
}

}  // namespace

std::vector<std::string> pre_tokenizer_regexes(const std::string& pre) {
  const PreTokenizerKind* kind = pre_tokenizer_kind(pre);
  if (!kind) return {};
  std::vector<std::string> out;
  for (std::string_view regex : kind->regexes) {
    if (!regex.empty()) out.emplace_back(regex);
  }
  return out;
}

struct Tokenizer::Regex {
  pcre2_code* code = nullptr;
  explicit Regex(const std::string& pattern) {
    int error = 0;
    PCRE2_SIZE offset = 0;
    code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.c_str()), pattern.size(),
                         PCRE2_UTF | PCRE2_UCP | PCRE2_NO_UTF_CHECK, &error, &offset, nullptr);
    if (code == nullptr) {
      PCRE2_UCHAR message[256];
      pcre2_get_error_message(error, message, sizeof message);
      fail("pre-tokenizer regex does not compile at {}: {}", offset, reinterpret_cast<char*>(message));
    }
    pcre2_jit_compile(code, PCRE2_JIT_COMPLETE);  // optional speed-up; falls back silently
  }
  ~Regex() { pcre2_code_free(code); }
  Regex(const Regex&) = delete;
  Regex& operator=(const Regex&) = delete;

  // Splits `text` into matches and the unmatched gaps between them ("isolated" behaviour).
  void split(std::string_view text, std::vector<std::string_view>& out) const {
    pcre2_match_data* match = pcre2_match_data_create_from_pattern(code, nullptr);
    size_t start = 0, last_end = 0;
    while (start < text.size()) {
      const int rc = pcre2_match(code, reinterpret_cast<PCRE2_SPTR>(text.data()), text.size(), start,
                                 PCRE2_NO_UTF_CHECK, match, nullptr);
      if (rc < 0) break;
      const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(match);
      size_t begin = ov[0], end = ov[1];
      if (end == begin) {  // empty match: step one codepoint
        start = begin + static_cast<size_t>(utf8_sequence_length(static_cast<uint8_t>(text[begin])));
        continue;
      }
      if (begin > last_end) out.push_back(text.substr(last_end, begin - last_end));
      out.push_back(text.substr(begin, end - begin));
      last_end = start = end;
    }
    if (last_end < text.size()) out.push_back(text.substr(last_end));
    pcre2_match_data_free(match);
  }
};

// ------------------------------------------------------------------ vocabulary

void settle_vocabulary(Vocabulary& v, std::optional<bool> add_bos_key) {
  v.add_bos = add_bos_key.value_or(ignores_merges(v.pre));
  const TokenizerModelKind* kind = tokenizer_model_kind(v.model);
  if (!kind) return;  // the tokenizer refuses it
  if (!kind->implied_pre.empty()) v.pre = kind->implied_pre;
  if (kind->forces_bos) v.add_bos = true;
}

// ------------------------------------------------------------------ tokenizer

namespace {

// GPT-2's reversible byte -> printable codepoint table.
void build_byte_table(uint32_t table[256]) {
  bool direct[256] = {};
  for (int b = '!'; b <= '~'; ++b) direct[b] = true;
  for (int b = 0xA1; b <= 0xAC; ++b) direct[b] = true;
  for (int b = 0xAE; b <= 0xFF; ++b) direct[b] = true;
  uint32_t next = 256;
  for (int b = 0; b < 256; ++b) table[b] = direct[b] ? static_cast<uint32_t>(b) : next++;
}

bool is_one_of(std::string_view text, std::initializer_list<std::string_view> names) {
  return std::find(names.begin(), names.end(), text) != names.end();
}

bool is_end_marker(const std::string& text) {
  return is_one_of(text, {"<|eot_id|>", "<|im_end|>", "<|end|>", "<|return|>", "<|call|>", "<end_of_turn>",
                          "<|endoftext|>", "<|end_of_text|>", "<turn|>"});
}

// Control tokens that write a tool call (Mistral's, LFM2's, Gemma 4's, GLM's): printed like text, as
// llama-server keeps a format's markers, so the reply parser sees the call and a grammar can
// use the token.
bool is_tool_call_marker(const std::string& text) {
  return is_one_of(text, {"[TOOL_CALLS]", "[ARGS]", "[CALL_ID]", "<|tool_call_start|>", "<|tool_call_end|>",
                          "<|tool_call>", "<tool_call|>", "<|\"|>", "<tool_call>", "</tool_call>", "<arg_key>",
                          "</arg_key>", "<arg_value>", "</arg_value>"});
}

bool has_control_token(const Vocabulary& vocab, std::string_view text) {
  for (size_t i = 0; i < vocab.tokens.size(); ++i) {
    if (vocab.types[i] == TokenType::Control && vocab.tokens[i] == text) return true;
  }
  return false;
}

// The harmony format (gpt-oss) writes its channel structure with control tokens that a reply
// parser must see, and ends a message, not the turn, with <|end|>. As llama.cpp does, those
// markers become user-defined tokens (always printed, always recognised in text) and <|end|>
// stops being an end of generation when the vocabulary has <|return|> and <|call|> for that.
void render_harmony_markers(Vocabulary& vocab) {
  const bool harmony_ends = has_control_token(vocab, "<|return|>") && has_control_token(vocab, "<|call|>");
  for (size_t i = 0; i < vocab.tokens.size(); ++i) {
    const std::string& t = vocab.tokens[i];
    const bool marker = is_one_of(t, {"<|channel|>", "<|message|>", "<|start|>", "<|constrain|>"});
    if (marker || (harmony_ends && t == "<|end|>")) vocab.types[i] = TokenType::UserDefined;
  }
}

}  // namespace

Tokenizer::Tokenizer(Vocabulary vocab) : vocab_(std::move(vocab)) {
  const TokenizerModelKind* kind = tokenizer_model_kind(vocab_.model);
  if (!kind) {
    fail("tokenizer model '{}' is not supported (bmoe supports byte-level BPE 'gpt2' and SPM-style BPE 'gemma4')",
         vocab_.model);
  }
  spm_style_ = kind->spm_style;
  if (!kind->implied_pre.empty()) vocab_.pre = kind->implied_pre;
  ignore_merges_ = ignores_merges(vocab_.pre);
  const auto regexes = pre_tokenizer_regexes(vocab_.pre);
  if (regexes.empty()) fail("pre-tokenizer '{}' is not supported", vocab_.pre);
  for (const auto& r : regexes) pre_tokenizers_.push_back(std::make_unique<Regex>(r));

  token_ids_.reserve(vocab_.tokens.size());
  for (size_t i = 0; i < vocab_.tokens.size(); ++i) token_ids_.emplace(vocab_.tokens[i], static_cast<int32_t>(i));
  merge_ranks_.reserve(vocab_.merges.size());
  for (size_t i = 0; i < vocab_.merges.size(); ++i) merge_ranks_.emplace(vocab_.merges[i], static_cast<int32_t>(i));

  build_byte_table(byte_to_unicode_);
  for (int b = 0; b < 256; ++b) {
    unicode_to_byte_[byte_to_unicode_[b]] = static_cast<uint8_t>(b);
    std::string s;
    append_utf8(s, byte_to_unicode_[b]);
    if (spm_style_) s = fmt::format("<0x{:02X}>", b);  // byte-fallback tokens
    const auto it = token_ids_.find(s);
    byte_tokens_[b] = it == token_ids_.end() ? -1 : it->second;
  }

  render_harmony_markers(vocab_);
  for (size_t i = 0; i < vocab_.tokens.size(); ++i) {
    const TokenType t = vocab_.types[i];
    if (t == TokenType::Control && is_tool_call_marker(vocab_.tokens[i])) printed_controls_.push_back(static_cast<int32_t>(i));
    if ((t == TokenType::Control || t == TokenType::UserDefined || t == TokenType::Unknown) &&
        !vocab_.tokens[i].empty()) {
      special_tokens_.push_back(static_cast<int32_t>(i));
    }
    if (t == TokenType::Control && is_end_marker(vocab_.tokens[i])) end_of_generation_.push_back(static_cast<int32_t>(i));
  }
  std::stable_sort(special_tokens_.begin(), special_tokens_.end(), [&](int32_t a, int32_t b) {
    return vocab_.tokens[static_cast<size_t>(a)].size() > vocab_.tokens[static_cast<size_t>(b)].size();
  });
  for (int32_t id : {vocab_.eos, vocab_.eot, vocab_.eom}) {
    if (id >= 0) end_of_generation_.push_back(id);
  }
}

Tokenizer::~Tokenizer() = default;

int32_t Tokenizer::find_token(std::string_view text) const {
  const auto it = token_ids_.find(std::string(text));
  return it == token_ids_.end() ? -1 : it->second;
}

std::shared_ptr<const std::vector<std::string>> Tokenizer::token_texts() const {
  std::call_once(token_texts_once_, [this] {
    auto texts = std::make_shared<std::vector<std::string>>();
    texts->reserve(vocab_.tokens.size());
    for (int32_t id = 0; id < vocab_size(); ++id) texts->push_back(token_bytes(id, false));
    token_texts_ = std::move(texts);
  });
  return token_texts_;
}

size_t Tokenizer::longest_token_bytes() const {
  size_t longest = 1;
  for (const std::string& text : vocab_.tokens) longest = std::max(longest, text.size());
  return longest;
}

bool Tokenizer::is_end_of_generation(int32_t id) const {
  return std::find(end_of_generation_.begin(), end_of_generation_.end(), id) != end_of_generation_.end();
}

std::vector<int32_t> Tokenizer::encode(std::string_view text, bool parse_special, bool add_bos) const {
  // Fragments are either raw text or an already-decided token id.
  struct Fragment {
    int32_t token;  // -1 for raw text
    std::string_view text;
  };
  std::vector<Fragment> fragments = {{-1, text}};
  for (int32_t id : special_tokens_) {
    if (!parse_special && vocab_.types[static_cast<size_t>(id)] != TokenType::UserDefined) continue;
    const std::string& needle = vocab_.tokens[static_cast<size_t>(id)];
    std::vector<Fragment> next;
    next.reserve(fragments.size());
    for (const Fragment& f : fragments) {
      if (f.token >= 0) {
        next.push_back(f);
        continue;
      }
      std::string_view rest = f.text;
      for (size_t pos; (pos = rest.find(needle)) != std::string_view::npos;) {
        if (pos > 0) next.push_back({-1, rest.substr(0, pos)});
        next.push_back({id, {}});
        rest = rest.substr(pos + needle.size());
      }
      if (!rest.empty()) next.push_back({-1, rest});
    }
    fragments = std::move(next);
  }

  std::vector<int32_t> out;
  // A text that starts with the BOS token itself (a rendered chat template) gets no second one,
  // as llama-cli and node-llama-cpp do.
  const bool starts_with_bos = !fragments.empty() && fragments.front().token == vocab_.bos;
  if (add_bos && vocab_.bos >= 0 && !starts_with_bos) out.push_back(vocab_.bos);
  for (const Fragment& f : fragments) {
    if (f.token >= 0) out.push_back(f.token);
    else encode_text(f.text, out);
  }
  return out;
}

void Tokenizer::encode_text(std::string_view text, std::vector<int32_t>& out) const {
  // The pre-tokenizer regexes run in UTF mode without re-checking (PCRE2_NO_UTF_CHECK), which
  // is undefined on malformed input: replace each invalid byte with U+FFFD first, as
  // llama.cpp does before it pre-tokenizes.
  std::string clean;
  if (!utf8_valid(text)) {
    clean = utf8_sanitize(text);
    text = clean;
  }
  std::vector<std::string_view> pieces = {text};
  for (const auto& regex : pre_tokenizers_) {
    std::vector<std::string_view> split;
    for (std::string_view p : pieces) regex->split(p, split);
    pieces = std::move(split);
  }
  std::string word;
  for (std::string_view piece : pieces) {
    word.clear();
    if (spm_style_) {
      // Raw UTF-8 with spaces written as U+2581; a run of newlines that is itself a token
      // stays whole (llama.cpp's Gemma 4 rule).
      for (char c : piece) {
        if (c == ' ') word += "\xE2\x96\x81";
        else word += c;
      }
      if (word.find_first_not_of('\n') == std::string::npos) {
        const auto it = token_ids_.find(word);
        if (it != token_ids_.end()) {
          out.push_back(it->second);
          continue;
        }
      }
    } else {
      for (unsigned char c : piece) append_utf8(word, byte_to_unicode_[c]);
      if (ignore_merges_) {  // a pre-token that is itself a token is taken whole
        const auto it = token_ids_.find(word);
        if (it != token_ids_.end()) {
          out.push_back(it->second);
          continue;
        }
      }
    }
    bpe_word(word, out);
  }
}

void Tokenizer::bpe_word(const std::string& word, std::vector<int32_t>& out) const {
  for (const std::string& s : merged_symbols(word)) {
    const auto it = token_ids_.find(s);
    if (it != token_ids_.end()) {
      out.push_back(it->second);
    } else {
      append_byte_tokens(s, out);
    }
  }
}

// Merges adjacent symbols by rank, lowest first, leftmost on ties. Candidate pairs wait in a
// min-heap; a pair whose symbols changed since it was queued is skipped when popped, so a long
// word (Gemma merges whole lines) costs O(n log n), not O(n^2).
std::vector<std::string> Tokenizer::merged_symbols(const std::string& word) const {
  struct Symbol {
    size_t begin, length;
    int prev, next;
  };
  std::vector<Symbol> sym;
  for (size_t i = 0; i < word.size();) {
    const size_t n = std::min(word.size() - i, static_cast<size_t>(utf8_sequence_length(static_cast<uint8_t>(word[i]))));
    const int index = static_cast<int>(sym.size());
    sym.push_back({i, n, index - 1, -1});
    if (index > 0) sym[static_cast<size_t>(index) - 1].next = index;
    i += n;
  }
  struct Pair {
    int32_t rank;
    int left;
    size_t length;  // combined length when queued; a mismatch means the pair is stale
    bool operator>(const Pair& o) const { return rank != o.rank ? rank > o.rank : left > o.left; }
  };
  std::priority_queue<Pair, std::vector<Pair>, std::greater<Pair>> queue;
  std::string key;
  auto consider = [&](int left) {
    if (left < 0) return;
    const int right = sym[static_cast<size_t>(left)].next;
    if (right < 0) return;
    const Symbol& a = sym[static_cast<size_t>(left)];
    const Symbol& b = sym[static_cast<size_t>(right)];
    key.assign(word, a.begin, a.length).append(" ").append(word, b.begin, b.length);
    const auto it = merge_ranks_.find(key);
    if (it != merge_ranks_.end()) queue.push({it->second, left, a.length + b.length});
  };
  for (int i = 0; i + 1 < static_cast<int>(sym.size()); ++i) consider(i);
  while (!queue.empty()) {
    const Pair p = queue.top();
    queue.pop();
    Symbol& a = sym[static_cast<size_t>(p.left)];
    if (a.length == 0 || a.next < 0) continue;
    Symbol& b = sym[static_cast<size_t>(a.next)];
    if (a.length + b.length != p.length) continue;  // stale: one side has grown since
    a.length += b.length;
    b.length = 0;
    a.next = b.next;
    if (a.next >= 0) sym[static_cast<size_t>(a.next)].prev = p.left;
    consider(a.prev);
    consider(p.left);
  }
  std::vector<std::string> symbols;
  for (int i = sym.empty() ? -1 : 0; i >= 0; i = sym[static_cast<size_t>(i)].next) {
    symbols.push_back(word.substr(sym[static_cast<size_t>(i)].begin, sym[static_cast<size_t>(i)].length));
  }
  return symbols;
}

// A symbol not in the vocabulary: one token per byte (SPM's <0xXX> tokens, or the GPT-2 byte
// characters it is written in).
void Tokenizer::append_byte_tokens(const std::string& s, std::vector<int32_t>& out) const {
  if (spm_style_) {
    for (unsigned char c : s) {
      if (byte_tokens_[c] >= 0) out.push_back(byte_tokens_[c]);
    }
    return;
  }
  for (uint32_t cp : utf8_codepoints(s)) {
    const auto byte = unicode_to_byte_.find(cp);
    if (byte != unicode_to_byte_.end() && byte_tokens_[byte->second] >= 0) out.push_back(byte_tokens_[byte->second]);
  }
}

std::string Tokenizer::token_bytes(int32_t id, bool with_special) const {
  if (id < 0 || id >= vocab_size()) return {};
  const std::string& text = vocab_.tokens[static_cast<size_t>(id)];
  switch (vocab_.types[static_cast<size_t>(id)]) {
    case TokenType::Control:
      return with_special || std::binary_search(printed_controls_.begin(), printed_controls_.end(), id) ? text : std::string();
    case TokenType::Unknown:
    case TokenType::Unused: return with_special ? text : std::string();
    case TokenType::UserDefined: return text;
    case TokenType::Byte:
      if (spm_style_ && text.size() == 6 && text.starts_with("<0x")) {
        return std::string(1, static_cast<char>(std::stoi(text.substr(3, 2), nullptr, 16)));
      }
      break;
    default: break;
  }
  if (spm_style_) {
    std::string bytes;
    for (size_t i = 0; i < text.size();) {
      if (text.compare(i, 3, "\xE2\x96\x81") == 0) {
        bytes += ' ';
        i += 3;
      } else {
        bytes += text[i++];
      }
    }
    return bytes;
  }
  std::string bytes;
  for (uint32_t cp : utf8_codepoints(text)) {
    const auto it = unicode_to_byte_.find(cp);
    if (it != unicode_to_byte_.end()) bytes += static_cast<char>(it->second);
    else append_utf8(bytes, cp);
  }
  return bytes;
}

std::string Tokenizer::decode(const std::vector<int32_t>& ids, bool with_special) const {
  std::string out;
  for (int32_t id : ids) out += token_bytes(id, with_special);
  return out;
}

}  // namespace bmoe
