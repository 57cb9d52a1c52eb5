#include "engine/gguf_vocabulary.h"

#include "core/error.h"

namespace bmoe {

namespace {

// A special token id key (-1 when absent), checked against the vocabulary's size.
int32_t special_id(const GgufModel& model, const char* key, int64_t n_tokens) {
  const int64_t value = model.get_int_or(key, -1);
  if (value >= n_tokens) fail("{}: {} = {} is outside the vocabulary", model.primary().path, key, value);
  return static_cast<int32_t>(value);
}

std::vector<TokenType> token_types(const GgufModel& model, size_t n_tokens) {
  std::vector<TokenType> types;
  if (model.find("tokenizer.ggml.token_type")) {
    for (int64_t t : model.get_int_array("tokenizer.ggml.token_type")) types.push_back(static_cast<TokenType>(t));
  }
  if (types.empty()) types.assign(n_tokens, TokenType::Normal);
  if (types.size() != n_tokens) {
    fail("{}: tokenizer.ggml.token_type has {} entries for {} tokens", model.primary().path, types.size(), n_tokens);
  }
  return types;
}

}  // namespace

Vocabulary read_vocabulary(const GgufModel& model) {
  Vocabulary v;
  v.model = model.get_string("tokenizer.ggml.model");
  v.pre = model.get_string_or("tokenizer.ggml.pre", "default");
  v.tokens = model.get_string_array("tokenizer.ggml.tokens");
  v.types = token_types(model, v.tokens.size());
  if (model.find("tokenizer.ggml.merges")) v.merges = model.get_string_array("tokenizer.ggml.merges");
  const auto n = static_cast<int64_t>(v.tokens.size());
  v.bos = special_id(model, "tokenizer.ggml.bos_token_id", n);
  v.eos = special_id(model, "tokenizer.ggml.eos_token_id", n);
  v.eot = special_id(model, "tokenizer.ggml.eot_token_id", n);
  v.eom = special_id(model, "tokenizer.ggml.eom_token_id", n);
  v.pad = special_id(model, "tokenizer.ggml.padding_token_id", n);
  std::optional<bool> add_bos;
  if (model.find("tokenizer.ggml.add_bos_token")) add_bos = model.get_bool_or("tokenizer.ggml.add_bos_token", false);
  settle_vocabulary(v, add_bos);
  v.chat_template = model.get_string_or("tokenizer.chat_template", "");
  return v;
}

}  // namespace bmoe
