// libFuzzer target: bmoe-server's request parsers (JSON body -> prompt tokens and sampling
// parameters) for both completion endpoints, Anthropic's /v1/messages, OpenAI's /v1/responses,
// /v1/embeddings, and /tokenize and /detokenize. Every input must
// parse or be refused with RequestError (an HTTP 4xx with an OpenAI-style body); anything else
// is a bug.
#include <cstdint>
#include <cstdlib>
#include <string>

#include "fuzz_common.h"
#include "serve/anthropic_messages.h"
#include "serve/embeddings.h"
#include "serve/request.h"
#include "serve/responses_api.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  bmoe::RequestContext context;
  context.tokenizer = &bmoe::fuzz_tokenizer();
  context.n_ctx = 256;
  context.tool_format = bmoe::ToolFormat::Hermes;  // so tools, tool_choice and their grammars are parsed too
  const std::string body(reinterpret_cast<const char*>(data), size);
  for (bool chat : {true, false}) {
    try {
      const bmoe::CompletionRequest r = bmoe::parse_completion_request(body, chat, context);
      if (r.prompt.empty() || static_cast<int>(r.prompt.size()) >= context.n_ctx || r.params.max_tokens < 1) std::abort();
    } catch (const bmoe::RequestError& e) {
      if (e.status < 400 || e.status > 499) std::abort();
    }
  }
  // The other APIs' bodies, translated into chat requests.
  for (bool count_only : {true, false}) {
    try {
      const bmoe::MessagesRequest r = bmoe::parse_messages_request(body, context, count_only);
      if (r.chat.prompt.empty()) std::abort();
    } catch (const bmoe::RequestError& e) {
      if (e.status < 400 || e.status > 499) std::abort();
    }
  }
  try {
    static bmoe::ResponseStore store;
    const bmoe::ResponsesRequest r = bmoe::parse_responses_request(body, context, store);
    if (r.chat.prompt.empty() || !r.echo.is_object()) std::abort();
  } catch (const bmoe::RequestError& e) {
    if (e.status < 400 || e.status > 499) std::abort();
  }
  try {
    for (const auto& input : bmoe::parse_embeddings_request(body, *context.tokenizer, context.n_ctx).inputs) {
      if (input.empty() || static_cast<int>(input.size()) > context.n_ctx) std::abort();
    }
  } catch (const bmoe::RequestError& e) {
    if (e.status < 400 || e.status > 499) std::abort();
  }
  // The tokenizer endpoints' bodies (/tokenize, /detokenize).
  try {
    bmoe::parse_tokenize_request(body);
  } catch (const bmoe::RequestError& e) {
    if (e.status < 400 || e.status > 499) std::abort();
  }
  try {
    const int vocab = context.tokenizer->vocab_size();
    for (int32_t id : bmoe::parse_detokenize_request(body, vocab)) {
      if (id < 0 || id >= vocab) std::abort();
    }
  } catch (const bmoe::RequestError& e) {
    if (e.status < 400 || e.status > 499) std::abort();
  }
  return 0;
}
