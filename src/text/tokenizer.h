// Tokenizers built from a GGUF's tokenizer.ggml.* keys.
//
// Byte-level BPE ("gpt2" model): special and user-defined tokens are split out first (longest
// first, as llama.cpp does), the rest is pre-tokenized with the model's regex (PCRE2, UTF+UCP)
// and each piece is mapped to byte-level unicode and merged by rank.
// SPM-style BPE ("gemma4" model): the same merging over raw UTF-8 with spaces written as
// U+2581, split only at newlines, and characters outside the vocabulary as <0xXX> tokens.
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace bmoe {

// GGUF token types.
enum class TokenType : int32_t {
  Undefined = 0,
  Normal = 1,
  Unknown = 2,
  Control = 3,
  UserDefined = 4,
  Unused = 5,
  Byte = 6,
};

struct Vocabulary {
  std::string model = "gpt2";  // tokenizer.ggml.model
  std::string pre = "default";  // tokenizer.ggml.pre
  std::vector<std::string> tokens;
  std::vector<TokenType> types;
  std::vector<std::string> merges;  // "left right"
  int32_t bos = -1;
  int32_t eos = -1;
  int32_t eot = -1;
  int32_t eom = -1;  // end of message: the turn waits for a tool's answer (GLM's <|observation|>)
  int32_t pad = -1;
  bool add_bos = false;
  std::string chat_template;
};

// Fills in what a model file leaves to the tokenizer's kind: whether BOS is added (the file's
// tokenizer.ggml.add_bos_token when it has one, else the pre-tokenizer's default) and what the
// tokenizer model implies (Gemma 4's SPM-style model: its pre-tokenizer and BOS). The kinds are
// rows of two tables in tokenizer.cpp, by the names the file gives (tokenizer.ggml.model and
// .pre), so no family is named in code. Reading the file is the loader's job
// (engine/gguf_vocabulary.h).
void settle_vocabulary(Vocabulary& v, std::optional<bool> add_bos_key);

class Tokenizer {
 public:
  explicit Tokenizer(Vocabulary vocab);
  ~Tokenizer();
  Tokenizer(const Tokenizer&) = delete;
  Tokenizer& operator=(const Tokenizer&) = delete;

  // Tokenizes text. With parse_special, control tokens written in the text ("<|im_start|>")
  // become their ids; user-defined tokens are always recognised (as llama.cpp does). add_bos
  // puts BOS first unless the text already starts with it.
  std::vector<int32_t> encode(std::string_view text, bool parse_special, bool add_bos) const;

  // The bytes a token stands for. Control tokens give "" unless with_special, except the
  // markers of tool calls ([TOOL_CALLS], <|tool_call_start|>, ...), which print as text.
  std::string token_bytes(int32_t id, bool with_special = false) const;
  std::string decode(const std::vector<int32_t>& ids, bool with_special = false) const;

  // End-of-generation tokens: eos, eot, eom, and control tokens named like an end marker.
  bool is_end_of_generation(int32_t id) const;
  const std::vector<int32_t>& end_of_generation_tokens() const { return end_of_generation_; }
  // Every token's printed bytes (token_bytes without specials; "" for control tokens), built
  // once and shared: what a grammar constraint matches tokens by.
  std::shared_ptr<const std::vector<std::string>> token_texts() const;
  int32_t find_token(std::string_view text) const;  // -1 when absent
  // The longest token's text in bytes. A token never stands for more input bytes than its text
  // holds (byte-level BPE and SentencePiece write each input byte as one or more), so a text of
  // more than n * this many bytes has more than n tokens: a prompt that cannot fit a context is
  // known before it is tokenized.
  size_t longest_token_bytes() const;
  int32_t vocab_size() const { return static_cast<int32_t>(vocab_.tokens.size()); }
  const Vocabulary& vocab() const { return vocab_; }

 private:
  struct Regex;
  void encode_text(std::string_view text, std::vector<int32_t>& out) const;
  void bpe_word(const std::string& word, std::vector<int32_t>& out) const;
  std::vector<std::string> merged_symbols(const std::string& word) const;
  void append_byte_tokens(const std::string& symbol, std::vector<int32_t>& out) const;

  Vocabulary vocab_;
  bool spm_style_ = false;  // raw UTF-8, spaces as U+2581, <0xXX> byte tokens (the model kind says)
  std::unordered_map<std::string, int32_t> token_ids_;
  std::unordered_map<std::string, int32_t> merge_ranks_;
  bool ignore_merges_ = false;
  std::vector<int32_t> special_tokens_;  // split out before pre-tokenizing, longest first
  std::vector<int32_t> end_of_generation_;
  std::vector<int32_t> printed_controls_;  // control tokens printed without specials (sorted)
  mutable std::once_flag token_texts_once_;
  mutable std::shared_ptr<const std::vector<std::string>> token_texts_;
  std::vector<std::unique_ptr<Regex>> pre_tokenizers_;
  int32_t byte_tokens_[256];
  uint32_t byte_to_unicode_[256];
  std::unordered_map<uint32_t, uint8_t> unicode_to_byte_;
};

// The pre-tokenizer regexes for a tokenizer.ggml.pre name (empty list when unknown).
std::vector<std::string> pre_tokenizer_regexes(const std::string& pre);

}  // namespace bmoe
