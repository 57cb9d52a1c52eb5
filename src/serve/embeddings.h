// OpenAI's /v1/embeddings on bmoe-server (as llama-server's with --embeddings): each input's
// final hidden states pooled (Session::embed) and L2-normalised, as floats or base64.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "engine/session.h"
#include "text/tokenizer.h"

namespace bmoe {

struct EmbeddingsRequest {
  std::vector<std::vector<int32_t>> inputs;  // tokenized, one per input
  bool base64 = false;                       // encoding_format "base64": little-endian float32
};

// input: a string, a list of strings, token ids, or a list of token-id lists (up to 2048
// inputs, each shorter than the context); throws RequestError.
EmbeddingsRequest parse_embeddings_request(const std::string& body, const Tokenizer& tok, int n_ctx);

// {"object": "list", "data": [{"object": "embedding", "index", "embedding"}], "model", "usage"}.
nlohmann::ordered_json embeddings_response(const std::vector<std::vector<float>>& vectors, bool base64,
                                           const std::string& model, int prompt_tokens);

// The pooling a GGUF's `<arch>.pooling_type` names (1 mean, 2 cls, 3 last), or `fallback`.
Pooling pooling_of(int64_t gguf_pooling_type, Pooling fallback);
const char* pooling_name(Pooling p);

}  // namespace bmoe
