#include "serve/embeddings.h"

#include <cstring>

#include "serve/json_fields.h"

namespace bmoe {

using namespace json_fields;

namespace {

std::vector<int32_t> token_ids(const json& ids, int vocab) {
  std::vector<int32_t> out;
  for (const json& e : ids) {
    if (!e.is_number_integer() || e.get<int64_t>() < 0 || e.get<int64_t>() >= vocab) {
      bad_request("'input' token ids must be integers inside the vocabulary", "input");
    }
    out.push_back(static_cast<int32_t>(e.get<int64_t>()));
  }
  return out;
}

std::vector<int32_t> one_input(const json& v, const Tokenizer& tok) {
  if (v.is_string()) return tok.encode(v.get<std::string>(), true, tok.vocab().add_bos);
  if (v.is_array() && !v.empty() && v[0].is_number_integer()) return token_ids(v, tok.vocab_size());
  bad_request("'input' must be a string, a list of strings, token ids or a list of token-id lists", "input");
}

// Base64 of the vector's float32 bytes, little-endian (as OpenAI's encoding_format).
std::string base64_of(const std::vector<float>& v) {
  static const char* kDigits = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  std::string bytes(v.size() * sizeof(float), '\0');
  std::memcpy(bytes.data(), v.data(), bytes.size());
  std::string out;
  for (size_t i = 0; i < bytes.size(); i += 3) {
    uint32_t n = static_cast<uint32_t>(static_cast<unsigned char>(bytes[i])) << 16;
    if (i + 1 < bytes.size()) n |= static_cast<uint32_t>(static_cast<unsigned char>(bytes[i + 1])) << 8;
    if (i + 2 < bytes.size()) n |= static_cast<unsigned char>(bytes[i + 2]);
    out += kDigits[(n >> 18) & 63];
    out += kDigits[(n >> 12) & 63];
    out += i + 1 < bytes.size() ? kDigits[(n >> 6) & 63] : '=';
    out += i + 2 < bytes.size() ? kDigits[n & 63] : '=';
  }
  return out;
}

}  // namespace

EmbeddingsRequest parse_embeddings_request(const std::string& text, const Tokenizer& tok, int n_ctx) {
  const json body = parse_body(text);
  reject_unknown_fields(body, {"input", "model", "encoding_format", "dimensions", "user"});
  if (body.contains("dimensions") && !body["dimensions"].is_null()) bad_request("'dimensions' is not supported", "dimensions");
  EmbeddingsRequest r;
  const std::string format = body.contains("encoding_format") && !body["encoding_format"].is_null() ? string_member(body, "encoding_format") : "float";
  if (format != "float" && format != "base64") bad_request("'encoding_format' must be \"float\" or \"base64\"", "encoding_format");
  r.base64 = format == "base64";
  if (!body.contains("input")) bad_request("'input' is required", "input");
  const json& input = body["input"];
  const bool several = input.is_array() && !input.empty() && (input[0].is_string() || input[0].is_array());
  if (!several) {
    r.inputs.push_back(one_input(input, tok));
  } else {
    if (input.size() > 2048) bad_request("'input' holds more than 2048 inputs", "input");
    for (const json& e : input) r.inputs.push_back(one_input(e, tok));
  }
  for (const auto& ids : r.inputs) {
    if (ids.empty()) bad_request("an input is empty", "input");
    if (static_cast<int>(ids.size()) > n_ctx) {
      throw RequestError(400, "invalid_request_error", fmt::format("an input has {} tokens; this server's context is {} tokens",
                                                                   ids.size(), n_ctx), "input", "context_length_exceeded");
    }
  }
  return r;
}

json embeddings_response(const std::vector<std::vector<float>>& vectors, bool base64, const std::string& model, int prompt_tokens) {
  json data = json::array();
  for (size_t i = 0; i < vectors.size(); ++i) {
    data.push_back({{"object", "embedding"}, {"index", i}, {"embedding", base64 ? json(base64_of(vectors[i])) : json(vectors[i])}});
  }
  return {{"object", "list"}, {"data", data}, {"model", model},
          {"usage", {{"prompt_tokens", prompt_tokens}, {"total_tokens", prompt_tokens}}}};
}

Pooling pooling_of(int64_t gguf_pooling_type, Pooling fallback) {
  if (gguf_pooling_type == 1) return Pooling::Mean;
  if (gguf_pooling_type == 2) return Pooling::Cls;
  if (gguf_pooling_type == 3) return Pooling::Last;
  return fallback;
}

const char* pooling_name(Pooling p) {
  switch (p) {
    case Pooling::Mean: return "mean";
    case Pooling::Cls: return "cls";
    case Pooling::Last: return "last";
  }
  return "mean";
}

}  // namespace bmoe
